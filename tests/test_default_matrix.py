"""A default matrix for any GPU count: the hand-written ones where they exist (examples/matrices),
else DDP, ZeRO-3 and the TP x PP layouts that divide the count (runner.default_matrix)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from runner.default_matrix import compute_default_layouts, compute_default_world_size, render_default_matrix
from runner.matrix import resolve_matrix

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib


@pytest.mark.parametrize("num_gpus, layouts", [
    (1, []), (3, []), (4, [(2, 2), (4, 1)]), (6, [(2, 1)]), (12, [(2, 2), (4, 1)]), (32, [(2, 2), (4, 1), (4, 2)]),
])
def test_layouts_divide_the_gpu_count(num_gpus, layouts):
    assert compute_default_layouts(num_gpus) == layouts
    assert all(num_gpus % (tp * pp) == 0 for tp, pp in layouts)


@pytest.mark.parametrize("num_gpus, world", [(3, 2), (4, 4), (5, 4), (6, 4), (12, 8), (24, 16), (32, 32), (64, 64),
                                             (200, 128)])
def test_generated_matrix_keeps_the_global_batch(num_gpus, world):
    assert compute_default_world_size(num_gpus) == world
    campaign = resolve_matrix(tomllib.loads(render_default_matrix(num_gpus)), source="gen", num_gpus=num_gpus)
    names = [r.name for r in campaign.runs]
    assert names[:2] == ["ddp", "zero3"] and all(r.world_size == world for r in campaign.runs)
    assert campaign.fixed.global_batch_size == 128
    for r in campaign.runs:
        assert r.micro_batch_size * r.num_microbatches * r.dp_degree == 128, r


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_runner_all_dry_run_on_four_gpus(tmp_path):
    res = _cli("all", "--dry-run", "--gpus", "4", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for run in ("ddp: strategy=ddp", "zero3: strategy=zero3", "megatron-tp2-pp2-dp1: strategy=tp_pp",
                "megatron-tp4-pp1-dp1: strategy=tp_pp"):
        assert f"- {run}" in res.stdout
    assert "generated runs/matrices/4gpu-default.toml" in res.stderr


def test_runner_all_dry_run_on_three_gpus_says_how_the_batch_was_split(tmp_path):
    res = _cli("all", "--dry-run", "--gpus", "3", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "global batch 128 x seq 1024" in res.stdout.splitlines()[0]
    assert "every layout on 2 of the 3 GPUs: the global batch (128 sequences) splits evenly only over a power-of-two" \
        in res.stderr
    assert "- ddp: strategy=ddp engine=torch-ddp world_size=2 tp=1 pp=1 dp=2 micro_batch_size=16 num_microbatches=4" \
        in res.stdout


def test_runner_slurm_dry_run_on_two_nodes_of_eight(tmp_path):
    res = _cli("slurm", "--nodes", "2", "--gpus-per-node", "8", "--dry-run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("#!/bin/bash") and "2x8gpu.toml" in res.stdout
