"""Same layout, different engine (issue 11), on CPU with the real engines (gloo, tiny preset, no mocks).

The demo campaign (conftest.demo_campaign: the CPU default matrix, shared with the e2e and layout
tests) runs DDP, ZeRO-3 under DeepSpeed stage 3 and under torch FSDP2 on 2 processes, and TP2 x
PP2 under the torch-native engine on 4; one more launch runs the same TP+PP layout under the
torch engine's Interleaved1F1B schedule. (examples/matrices/cpu-engines.toml, the same engines
with TP1 x PP2, is for running by hand.) Megatron-core cannot
run on CPU (its pipeline schedules need CUDA), so "both engines" for TP+PP is only the torch
engine's two schedules here; the note says so.

Tolerance. Same seed, same initial weights (the whole GPT is built from the seed before any
sharding), same tokens, fp32: the engines differ only in summation order (reduce-scatter vs
all-reduce, micro-batch vs pipeline accumulation). Measured on the 2-core CPU runner: the mean
loss of the first 5 steps agrees with DDP's to <= 5e-8 relative (FSDP2 and DeepSpeed <= 3e-8,
TP+PP <= 8e-8), step 0's grad norm to <= 1e-7. We assert rtol = 1e-5 on steps 0-4 and on step 0's
grad norm: ~100x the measured gap, tight enough for real bugs (tests/test_tp_pp_torch.py: a
dropped tied-embedding reduction moves step 1's loss by 1.8e-4 relative).
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigError
from core.records import RunSummary, run_spec_from_dict, to_dict
from report.memory import build_model_states, compute_param_numels
from report.rules import GAP_CATEGORIES, THRESHOLDS, GapRow, rule_engine_gap
from core.records import STRATEGY_ENGINES
from runner.matrix import load_matrix, resolve_matrix
from runner.model import count_gpt_params
from synthetic_campaign import make_run

REPO = Path(__file__).resolve().parents[1]
RUNS = {"ddp": "torch-ddp", "zero3": "deepspeed", "zero3-fsdp2": "fsdp2", "tp2-pp2": "torch"}  # the demo's
RTOL = 1e-5
NUM_STEPS_COMPARED = 5


@pytest.fixture(scope="module")
def campaign(demo_campaign) -> Path:
    """The demo campaign and its note (conftest)."""
    return demo_campaign


@pytest.fixture(scope="module")
def interleaved(campaign, tmp_path_factory) -> Path:
    """The campaign's TP2 x PP2 torch spec under Interleaved1F1B (2 chunks per rank), no profiler,
    for the NUM_STEPS_COMPARED steps compared (no checkpoint probe, no loop-overhead replay). Its
    losses equal the 30-step run's: the first lr_warmup_steps (5) steps' learning rate is the
    linear warm-up, which does not depend on the step count (runner.train.lr_at)."""
    spec = run_spec_from_dict(json.loads((campaign / "tp2-pp2" / "spec.json").read_text()))
    assert spec.fixed.lr_warmup_steps >= NUM_STEPS_COMPARED - 1
    spec = dataclasses.replace(spec, name="tp1-pp2-interleaved",
                               options={**spec.options, "schedule": "Interleaved1F1B", "virtual_stages": 2},
                               checkpoint_step=None, checkpoint_verify_steps=0,
                               fixed=dataclasses.replace(spec.fixed, steps=NUM_STEPS_COMPARED, profile_num_steps=0,
                                                         profile_start_step=0))
    run_dir = tmp_path_factory.mktemp("interleaved") / spec.name
    run_dir.mkdir()
    (run_dir / "spec.json").write_text(json.dumps(to_dict(spec)), encoding="utf-8")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(spec.world_size),
           "-m", "runner.train", "--run-dir", str(run_dir)]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    logs = "\n".join(p.read_text()[-2000:] for p in sorted((run_dir / "logs").glob("*.log")))
    assert proc.returncode == 0, proc.stderr[-2000:] + logs
    return run_dir


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((run_dir / "metrics").glob("rank*.jsonl"))
            for line in p.read_text().splitlines()]


def _losses(run_dir: Path) -> list[float]:
    rows = _rows(run_dir)
    return [float(np.mean([r["loss"] for r in rows if r["step"] == s and r["loss"] is not None]))
            for s in range(NUM_STEPS_COMPARED)]


def _grad_norm0(run_dir: Path) -> float:
    return next(r["grad_norm"] for r in _rows(run_dir) if r["step"] == 0 and r["rank"] == 0)


def test_every_engine_ran_with_its_knobs_recorded(campaign):
    for name, engine in RUNS.items():
        assert json.loads((campaign / name / "status.json").read_text())["status"] == "ok", name
        info = json.loads((campaign / name / "run_info.json").read_text())
        assert info["engine"] == engine
        spec = run_spec_from_dict(json.loads((campaign / name / "spec.json").read_text()))
        assert info["num_params"] == count_gpt_params(spec.fixed.model)
    fsdp2 = json.loads((campaign / "zero3-fsdp2" / "spec.json").read_text())["options"]
    assert {k: fsdp2[k] for k in ("reshard_after_forward", "reduce_dtype", "prefetch_num_blocks",
                                  "reduce_every_microbatch", "compile")} == {
        "reshard_after_forward": True, "reduce_dtype": "fp32", "prefetch_num_blocks": 0,
        "reduce_every_microbatch": True, "compile": False}
    tp_pp = json.loads((campaign / "tp2-pp2" / "spec.json").read_text())["options"]
    assert (tp_pp["schedule"], tp_pp["virtual_stages"]) == ("1F1B", 1)


def test_losses_agree_across_engines_and_schedules(campaign, interleaved):
    ddp = _losses(campaign / "ddp")
    for name in ("zero3", "zero3-fsdp2", "tp2-pp2"):
        assert _losses(campaign / name) == pytest.approx(ddp, rel=RTOL), name
        assert _grad_norm0(campaign / name) == pytest.approx(_grad_norm0(campaign / "ddp"), rel=RTOL), name
    assert _losses(interleaved) == pytest.approx(ddp, rel=RTOL)
    assert _grad_norm0(interleaved) == pytest.approx(_grad_norm0(campaign / "ddp"), rel=RTOL)
    assert sorted(r["step"] for r in _rows(interleaved)) == [s for s in range(NUM_STEPS_COMPARED) for _ in range(4)]


def test_note_groups_the_engines_and_splits_engine_from_layout_cost(campaign):
    md = (campaign / "report" / "note.md").read_text()
    section = md.split("## 6. Conclusion", 1)[1].split("When the answer changes", 1)[0]
    assert "### Same layout, different engine" in section
    assert "**ZeRO-3 (world 2, DP 2): " in section
    zero = section.split("**ZeRO-3", 1)[1].split("**TP+PP", 1)[0]
    assert "FSDP2" in zero and "DeepSpeed" in zero
    table = [ln for ln in zero.splitlines() if ln.startswith("| zero3") or ln.startswith("| ddp (baseline)")]
    assert len(table) == 3
    assert "Engine cost — kernels and host/launch gaps" in zero and "Exposed transfer, bubble and stage imbalance:" in zero
    assert "What the layout itself costs inside each engine" in zero
    assert "Memory per rank, by engine" in zero and "16Ψ/N" in zero
    assert "Measured peaks are not recorded on CPU" in zero
    tp_pp = section.split("**TP+PP", 1)[1]
    assert "ran under torch-native only, not Megatron-core: Megatron-core's pipeline schedules need CUDA" in tp_pp
    assert "Same layout, different engine" in (campaign / "report" / "note.html").read_text()


# ------------------------------------------------------------------ no launch: knobs, memory, rule

def _matrix(*runs: dict, **fixed) -> dict:
    return {"campaign": {"name": "t", "world_size": 2}, "fixed": fixed, "runs": list(runs)}


def test_interleaved_schedule_needs_stages_that_divide():
    with pytest.raises(ConfigError) as e:
        resolve_matrix(_matrix({"name": "a", "strategy": "tp_pp", "engine": "torch", "tp_degree": 2,
                                "options": {"schedule": "Interleaved1F1B"}},
                               {"name": "b", "strategy": "tp_pp", "engine": "torch", "pp_degree": 2,
                                "options": {"schedule": "Interleaved1F1B", "virtual_stages": 4}},
                               {"name": "c", "strategy": "tp_pp", "engine": "torch", "pp_degree": 2,
                                "options": {"schedule": "ZeroBubble"}}),
                       source="m.toml", num_gpus=0)
    msg = str(e.value)
    assert "run 1 ('a') options: schedule 'Interleaved1F1B' needs pp_degree >= 2, got 1; use '1F1B'" in msg
    assert "run 2 ('b') options: num_layers 4 is not divisible by pp_degree 2 x virtual_stages 4" in msg
    assert "run 3 ('c') options: 'schedule' must be one of 1F1B, Interleaved1F1B, got 'ZeroBubble'" in msg
    ok = resolve_matrix(_matrix({"name": "d", "strategy": "tp_pp", "engine": "torch", "pp_degree": 2,
                                 "options": {"schedule": "Interleaved1F1B"}}), source="m.toml", num_gpus=0)
    assert (ok.runs[0].options["virtual_stages"], ok.runs[0].num_microbatches) == (2, 8)


def test_fsdp2_knobs_resolve_per_device_and_dtype():
    gpu = resolve_matrix({"campaign": {"name": "g", "world_size": 1},
                          "runs": [{"name": "f", "strategy": "zero3", "engine": "fsdp2"}]}, source="m", num_gpus=1)
    opts = gpu.runs[0].options
    assert (opts["reduce_dtype"], opts["compile"], opts["fused_adamw"], opts["reshard_after_forward"]) == (
        "bf16", True, True, True)
    with pytest.raises(ConfigError) as e:
        resolve_matrix(_matrix({"name": "f", "strategy": "zero3", "engine": "fsdp2",
                                "options": {"reduce_dtype": "fp16", "prefetch_num_blocks": -1, "zero": {}}}),
                       source="m.toml", num_gpus=0)
    msg = str(e.value)
    assert "'reduce_dtype' must be one of bf16, fp32, got 'fp16'" in msg
    assert "'prefetch_num_blocks' must be >= 0, got -1" in msg
    assert "unknown key 'zero'" in msg


def test_gpu_engine_matrix_resolves():
    camp = resolve_matrix(load_matrix(REPO / "examples" / "matrices" / "1gpu-engines.toml"),
                          source="1gpu-engines.toml", num_gpus=1)
    got = [(r.name, r.strategy, r.engine, r.micro_batch_size) for r in camp.runs]
    assert got == [("ddp", "ddp", "torch-ddp", 128), ("zero3-deepspeed", "zero3", "deepspeed", 64),
                   ("zero3-fsdp2", "zero3", "fsdp2", 64), ("megatron-tp1-pp1", "tp_pp", "megatron", 128),
                   ("torch-tp1-pp1", "tp_pp", "torch", 128)]
    assert camp.fixed.dtype == "bf16" and all(r.world_size == 1 for r in camp.runs)
    assert camp.runs[-1].options["micro_batch_search"]["candidates"][0] == 128  # probes 128 first


def test_model_state_bytes_per_engine():
    psi = 124_475_904  # gpt-125m, tied embedding once
    cases = [  # (strategy, engine, dtype, tp, pp, dp, options) -> bytes per parameter per rank
        (("ddp", "torch-ddp", "bf16", 1, 1, 8, {}), 16.0),
        (("zero3", "deepspeed", "bf16", 1, 1, 8, {}), 2.0),  # 16/N (ZeRO §5.3)
        (("zero3", "fsdp2", "bf16", 1, 1, 8, {}), 2.0),
        (("tp_pp", "megatron", "bf16", 1, 1, 8, {"use_distributed_optimizer": True}), 6 + 12 / 8),
        (("tp_pp", "megatron", "bf16", 1, 1, 1, {"use_distributed_optimizer": False}), 18.0),
        (("tp_pp", "megatron", "fp32", 1, 1, 4, {"use_distributed_optimizer": True}), 8 + 8 / 4),
        (("tp_pp", "torch", "bf16", 2, 2, 2, {}), 16 / 4),
    ]
    for (strategy, engine, dtype, tp, pp, dp, opts), want in cases:
        got = build_model_states(strategy=strategy, engine=engine, dtype=dtype, num_params=psi, tp_degree=tp,
                                        pp_degree=pp, dp_degree=dp, options=opts)
        assert got.total_bytes_per_param == pytest.approx(want), (strategy, engine)
        assert got.total_bytes == pytest.approx(want * psi)
    from runner.presets import PRESETS, build_model_config
    numels = compute_param_numels(build_model_config(PRESETS["gpt-125m"], max_tp_degree=1))
    assert sum(numels) == psi
    ds = build_model_states(strategy="zero3", engine="deepspeed", dtype="bf16", num_params=psi, tp_degree=1,
                                   pp_degree=1, dp_degree=8, param_numels=numels,
                                   options={"zero": {"stage3_param_persistence_threshold": 1_000_000}})
    persist = sum(k for k in numels if k < 1_000_000)  # biases, LayerNorms, attn proj 768x768, wpe
    assert ds.weights_bytes_per_param * psi == pytest.approx(2 * (persist + (psi - persist) / 8))
    assert "Ψ_persist" in ds.formula
    assert build_model_states(strategy="zero3", engine="fsdp2", dtype="bf16", num_params=psi, tp_degree=1,
                                     pp_degree=1, dp_degree=1, options={"reshard_after_forward": False}).extra


def _summary(run: str, tps: float, spread: float = 0.01) -> RunSummary:
    step = 1.0 / tps
    return RunSummary(run=run, status="ok", tokens_per_s=tps, step_time_median_s=step, step_time_p90_s=step * (1 + spread))


def _run(run: str, strategy: str, engine: str, world: int = 1, device: str = "cuda"):
    return make_run(run, strategy=strategy, engine=engine, world_size=world, device=device)


def _bd(run: str, **secs: float) -> GapRow:
    cats = {c: secs.get(c, 0.0) for c in GAP_CATEGORIES}
    return GapRow(run=run, step_time_s=sum(cats.values()), seconds=cats)


def test_rule_engine_gap_splits_engine_from_layout_cost():
    runs = [_run("ddp", "ddp", "torch-ddp"), _run("ds", "zero3", "deepspeed"), _run("fsdp", "zero3", "fsdp2"),
            _run("mg", "tp_pp", "megatron"), _run("tt", "tp_pp", "torch")]
    summary = [_summary("ddp", 446e3), _summary("ds", 163e3), _summary("fsdp", 400e3), _summary("mg", 145e3),
               _summary("tt", 150e3)]
    bd = [_bd("ds", compute=0.30, transfer=0.01, launch_gaps=0.49), _bd("fsdp", compute=0.30, transfer=0.02, launch_gaps=0.01)]
    found = rule_engine_gap(summary, runs, bd, THRESHOLDS, engines=STRATEGY_ENGINES)
    zero, tp_pp = found
    assert zero.kind == "engine_gap" and zero.runs == ("fsdp", "ds")
    gap = zero.evidence.gap
    assert gap.delta_step_s == pytest.approx(0.47)
    assert gap.engine_part_s == pytest.approx(0.48) and gap.layout_part_s == pytest.approx(-0.01)
    assert gap.dominant == "launch_gaps" and gap.dominates
    assert zero.evidence.degenerate and zero.evidence.baseline.run == "ddp"
    assert dict(zero.evidence.baseline.vs_baseline)["ds"] == pytest.approx(163 / 446)
    assert tp_pp.kind == "engine_parity"  # 150k vs 145k: 3.4% < engine_gap_min (5%)
    assert tp_pp.evidence.gap is None  # no traces
    single = rule_engine_gap([_summary("tt", 1.0)], [_run("tt", "tp_pp", "torch", 2, device="cpu")], [],
                             THRESHOLDS, engines=STRATEGY_ENGINES)
    assert single[0].kind == "engine_single" and single[0].evidence.engines_not_run == ("megatron",)
    assert single[0].evidence.cpu
