"""Full activation recomputation (``options.recompute = "full"``) with the real engines on CPU
(gloo, tiny preset): each block is recomputed in backward (its forward runs twice per step), the
engines train exactly as without it, the memory model keeps only each layer's input, and the
knob refuses other values."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from core.perfmodel import build_run_layout, build_shape, compute_layout_memory
from core.records import run_spec_from_dict, to_dict
from runner.knobs import resolve_knobs
from runner.model import GPT, lm_loss
from runner.presets import PRESETS, build_model_config
from runner.strategies.common import apply_recompute

REPO = Path(__file__).resolve().parents[1]
RUNS = ("ddp", "zero3", "zero3-fsdp2", "tp2-pp2")  # the demo campaign's: DDP, DeepSpeed, FSDP2, torch TP2 x PP2
NUM_STEPS = 3
RTOL = 1e-5  # tests/test_engines_cpu.py: same seed and weights, fp32; only summation order may differ


def _forward_calls(recompute: str) -> tuple[int, float]:
    """(forward calls of the first block in one forward + backward, the loss) of the tiny GPT."""
    torch.manual_seed(0)
    model = GPT(build_model_config(PRESETS["tiny"], max_tp_degree=1))
    mlp = model.blocks[0].mlp
    calls, forward = [], mlp.forward  # counted in the call itself: module hooks do not fire in the recompute

    def counted(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return forward(x)

    mlp.forward = counted
    spec = type("Spec", (), {"options": {"recompute": recompute}})()
    apply_recompute(model.blocks, spec)
    tokens = torch.randint(0, 100, (2, 16))
    loss = lm_loss(model(tokens), tokens)
    loss.backward()
    return len(calls), float(loss)


def test_full_recompute_runs_each_block_twice_and_changes_nothing_else():
    assert _forward_calls("none")[0] == 1
    calls, loss = _forward_calls("full")
    assert calls == 2  # forward, then again in backward
    assert loss == _forward_calls("none")[1]


def test_knob_accepts_none_and_full_only():
    for value in ("none", "full"):
        assert resolve_knobs("ddp", "torch-ddp", {"recompute": value}, device="cpu", dp_degree=2, where="run x")[1] == []
    problems = resolve_knobs("ddp", "torch-ddp", {"recompute": "selective"}, device="cpu", dp_degree=2, where="run x")[1]
    assert problems and "'recompute' must be one of none, full" in problems[0]


def test_memory_model_keeps_each_layers_input_only(demo_campaign):
    spec = run_spec_from_dict(json.loads((demo_campaign / "ddp" / "spec.json").read_text()))
    full = dataclasses.replace(spec, options={**spec.options, "recompute": "full"})
    shape = build_shape(spec.fixed.model, name="tiny")
    seq = spec.fixed.model.seq_length
    assert build_run_layout(full, compiled=False).recompute == "full"
    assert build_run_layout(spec, compiled=False).recompute == "selective"
    act_full = compute_layout_memory(shape, build_run_layout(full, compiled=False), seq_length=seq)[1]
    act_none = compute_layout_memory(shape, build_run_layout(spec, compiled=False), seq_length=seq)[1]
    assert act_full < act_none


@pytest.fixture(scope="module")
def recomputed(demo_campaign, tmp_path_factory) -> Path:
    """The demo campaign's four engines with recompute = "full", NUM_STEPS steps, no profiler."""
    out = tmp_path_factory.mktemp("recompute")
    for name in RUNS:
        spec = run_spec_from_dict(json.loads((demo_campaign / name / "spec.json").read_text()))
        spec = dataclasses.replace(spec, options={**spec.options, "recompute": "full"}, checkpoint_step=None,
                                   checkpoint_verify_steps=0,
                                   fixed=dataclasses.replace(spec.fixed, steps=NUM_STEPS, profile_num_steps=0,
                                                             profile_start_step=0))
        run_dir = out / name
        run_dir.mkdir()
        (run_dir / "spec.json").write_text(json.dumps(to_dict(spec)), encoding="utf-8")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               str(spec.world_size), "-m", "runner.train", "--run-dir", str(run_dir)]
        proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
                              capture_output=True, text=True, timeout=300)
        logs = "\n".join(p.read_text()[-2000:] for p in sorted((run_dir / "logs").glob("*.log")))
        assert proc.returncode == 0, name + proc.stderr[-2000:] + logs
    return out


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for p in sorted((run_dir / "metrics").glob("rank*.jsonl"))
            for line in p.read_text().splitlines()]
    return [float(np.mean([r["loss"] for r in rows if r["step"] == s and r["loss"] is not None]))
            for s in range(NUM_STEPS)]


@pytest.mark.parametrize("name", RUNS)
def test_every_engine_trains_the_same_losses_with_full_recompute(recomputed, demo_campaign, name):
    assert json.loads((recomputed / name / "spec.json").read_text())["options"]["recompute"] == "full"
    assert _losses(recomputed / name) == pytest.approx(_losses(demo_campaign / name)[:NUM_STEPS], rel=RTOL)
