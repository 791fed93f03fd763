"""End-to-end tests of the torch-native TP+PP engine against the DDP baseline.

Real torchrun launches on CPU/gloo with the tiny preset (no mocks): DDP on 2 processes and TP+PP
as (tp=2, pp=2) on 4 are the demo campaign's runs (conftest.demo_campaign, shared); (tp=2, pp=1)
and (tp=1, pp=2) on 2 processes are launched here from the demo's TP2 x PP2 spec (the same fixed
variables and micro-batch split, no profiler window), all dp=1.

Tolerance. Every run starts from the same weights (same seed, whole GPT built then cut) and
sees the same tokens, so in fp32 the only differences are summation order: TP splits the
qkv/fc output columns and the proj/fc2 reduction over ranks then all-reduces partial sums;
DDP averages two half-batch losses and gradients where PP averages micro-batch losses.
Measured on the 2-core CPU runner: relative loss differences <= 1.2e-7 over steps 0-2 (about
one fp32 ulp) and 0 to 5e-7 on grad_norm; they grow through Adam to ~2e-6 by step 29. We
assert rtol=1e-5 on the first three steps' losses and step 0's grad_norm: ~100x the measured
gap, yet tight enough for real bugs: dropping the tied-embedding all-reduce (tp1pp2) moved
step 0's grad_norm by 1.3% and step 1's loss by 1.8e-4 relative.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.records import FixedConfig, RunSpec, run_spec_from_dict, to_dict
from runner.model import GPT, count_gpt_params, count_params
from runner.presets import PRESETS, build_model_config
from runner.strategies import RankContext, build_trainer

REPO = Path(__file__).resolve().parents[1]
RTOL = 1e-5
LAYOUTS = {"tp2pp2": (2, 2), "tp2pp1": (2, 1), "tp1pp2": (1, 2)}  # name -> (tp, pp)
# Steps of the two layouts launched here (the demo's runs have 30): enough to learn > 1 nat from
# ln V = 6.9 (measured: a mean 5.63 over steps 7-11; the losses are deterministic), and the first 3 steps, compared
# with DDP, run at the warm-up learning rate, which does not depend on the step count.
LAUNCHED_STEPS = 12


def _spec(*, name: str, strategy: str, engine: str, world_size: int, tp: int, pp: int, mbs: int) -> RunSpec:
    p = PRESETS["tiny"]
    fixed = FixedConfig(
        preset="tiny", model=build_model_config(p, max_tp_degree=2), global_batch_size=p.global_batch_size,
        dtype="fp32", seed=1, steps=p.steps, warmup_steps=p.warmup_steps, lr=p.lr, min_lr=p.min_lr,
        lr_warmup_steps=p.lr_warmup_steps, weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.95, grad_clip=1.0,
        data="synthetic",
    )
    dp = world_size // (tp * pp)
    return RunSpec(
        campaign="t", name=name, strategy=strategy, engine=engine, world_size=world_size, tp_degree=tp,
        pp_degree=pp, dp_degree=dp, micro_batch_size=mbs, num_microbatches=p.global_batch_size // (mbs * dp),
        device="cpu", backend="gloo", fixed=fixed,
    )


def _launch(run_dir: Path, spec: RunSpec) -> list[list[dict]]:
    """torchrun the spec; returns metrics rows per rank. Fails with the rank logs' tails."""
    run_dir.mkdir(parents=True)
    (run_dir / "spec.json").write_text(json.dumps(to_dict(spec)), encoding="utf-8")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(spec.world_size), "-m", "runner.train", "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=180)
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((run_dir / "logs").glob("*.log")))
    assert proc.returncode == 0, f"{spec.name} exited {proc.returncode}\n{proc.stderr[-2000:]}\n{logs}"
    return [
        [json.loads(line) for line in (run_dir / "metrics" / f"rank{r}.jsonl").read_text().splitlines()]
        for r in range(spec.world_size)
    ]


def _rows_per_rank(run_dir: Path, world_size: int) -> list[list[dict]]:
    return [[json.loads(line) for line in (run_dir / "metrics" / f"rank{r}.jsonl").read_text().splitlines()]
            for r in range(world_size)]


@pytest.fixture(scope="module")
def runs(demo_campaign, tmp_path_factory) -> dict[str, list[list[dict]]]:
    root = tmp_path_factory.mktemp("tp_pp_torch")
    out = {}
    for name, run in (("ddp", "ddp"), ("tp2pp2", "tp2-pp2")):
        spec = run_spec_from_dict(json.loads((demo_campaign / run / "spec.json").read_text()))
        out[name] = _rows_per_rank(demo_campaign / run, spec.world_size)
        out[name + "/info"] = json.loads((demo_campaign / run / "run_info.json").read_text())
    base = run_spec_from_dict(json.loads((demo_campaign / "tp2-pp2" / "spec.json").read_text()))
    for name in ("tp2pp1", "tp1pp2"):
        tp, pp = LAYOUTS[name]
        spec = dataclasses.replace(base, name=name, world_size=tp * pp, tp_degree=tp, pp_degree=pp, plant=None,
                                   checkpoint_step=None, checkpoint_verify_steps=0,  # e2e checks the torch checkpoint
                                   fixed=dataclasses.replace(base.fixed, steps=LAUNCHED_STEPS, profile_num_steps=0,
                                                             profile_start_step=0))
        out[name] = _launch(root / name, spec)
        out[name + "/info"] = json.loads((root / name / "run_info.json").read_text())
    return out


def _is_last_stage(rank: int, *, tp: int, pp: int) -> bool:
    return (rank // tp) % pp == pp - 1  # mesh (dp, pp, tp), tp innermost


@pytest.mark.parametrize("name", LAYOUTS)
def test_rows_and_loss_only_on_last_stage(runs, name):
    tp, pp = LAYOUTS[name]
    for rank, rows in enumerate(runs[name]):
        assert [r["step"] for r in rows] == list(range(30 if name == "tp2pp2" else LAUNCHED_STEPS))
        has_loss = [r["loss"] is not None for r in rows]
        assert all(has_loss) if _is_last_stage(rank, tp=tp, pp=pp) else not any(has_loss), rank
        assert all(r["grad_norm"] is not None for r in rows)
    last = runs[name][-1]
    assert sum(r["loss"] for r in last[-5:]) / 5 < last[0]["loss"] - 1.0  # ~6.9 -> ~4.8 (30 steps), ~5.6 (12)


@pytest.mark.parametrize("name", LAYOUTS)
def test_matches_ddp(runs, name):
    ddp = runs["ddp"]
    # DDP rows hold each rank's own half-batch loss; equal halves, so their mean is the batch's.
    ddp_loss = [(a["loss"] + b["loss"]) / 2 for a, b in zip(*ddp)]
    tp, pp = LAYOUTS[name]
    for rank, rows in enumerate(runs[name]):
        assert rows[0]["grad_norm"] == pytest.approx(ddp[0][0]["grad_norm"], rel=RTOL), rank
        if _is_last_stage(rank, tp=tp, pp=pp):
            assert [r["loss"] for r in rows[:3]] == pytest.approx(ddp_loss[:3], rel=RTOL), rank
    cfg = build_model_config(PRESETS["tiny"], max_tp_degree=2)
    assert runs[name + "/info"]["num_params"] == runs["ddp/info"]["num_params"] == count_gpt_params(cfg)
    assert runs[name + "/info"]["num_params_position_embedding"] == runs["ddp/info"]["num_params_position_embedding"]


def test_num_params_closed_form():
    cfg = build_model_config(PRESETS["tiny"], max_tp_degree=2)
    assert count_params(GPT(cfg)) == count_gpt_params(cfg)


def test_too_few_microbatches_for_1f1b():
    spec = _spec(name="x", strategy="tp_pp", engine="torch", world_size=2, tp=1, pp=2, mbs=16)  # 1 micro-batch
    ctx = RankContext(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="num_microbatches >= pp_degree"):
        build_trainer(spec, ctx=ctx)
