"""Issue 7 on CPU: typed engine knobs, the host-side batch prefetch (same tokens per step), and the
automatic micro-batch search under a simulated memory limit (global batch and tokens unchanged)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.errors import ConfigError
from runner.data import BatchPrefetcher, SyntheticBatches, slice_batch
from runner.knobs import ZERO3_DEFAULTS
from runner.matrix import resolve_matrix
from runner.tune import choose_micro_batch


def _matrix(*runs, fixed=None):
    return {"campaign": {"name": "t", "preset": "tiny"}, "fixed": fixed or {}, "runs": list(runs)}


@pytest.mark.parametrize("dp_rank,dp_degree,mbs", [(0, 1, 4), (1, 2, 2), (3, 4, 1)])
def test_prefetched_batches_are_the_tokens_of_each_step(dp_rank, dp_degree, mbs):
    data = SyntheticBatches(vocab_size=1000, seq_length=16, global_batch_size=8, seed=7)
    ref = SyntheticBatches(vocab_size=1000, seq_length=16, global_batch_size=8, seed=7)
    nmb = 8 // dp_degree // mbs
    pre = BatchPrefetcher(data, num_steps=5, dp_rank=dp_rank, dp_degree=dp_degree, micro_batch_size=mbs,
                          num_microbatches=nmb, device=torch.device("cpu"))
    try:
        for step in range(5):
            got = pre.get(step)
            want = slice_batch(ref.tokens(step), dp_rank=dp_rank, dp_degree=dp_degree, micro_batch_size=mbs,
                               num_microbatches=nmb)
            assert len(got) == len(want) == nmb
            for (x, y), (wx, wy) in zip(got, want):
                assert torch.equal(x, wx) and torch.equal(y, wy)
        with pytest.raises(ValueError):
            pre.get(5)
    finally:
        pre.close()


def test_knobs_resolved_into_the_spec_with_expert_defaults():
    camp = resolve_matrix(_matrix({"name": "d", "strategy": "ddp"},
                                  {"name": "z", "strategy": "zero3", "options": {"zero": {"overlap_comm": False}}},
                                  {"name": "t", "strategy": "tp_pp", "tp_degree": 2}),
                          source="m", num_gpus=0)
    d, z, t = camp.runs
    assert {sp.options.pop("kernels")["mode"] for sp in (d, z, t)} == {"parity"}  # runner.kernels, tests/test_parity_cpu.py
    assert d.options == {"tf32": False, "fused_adamw": False, "recompute": "none", "bucket_cap_mb": 25,
                         "gradient_as_bucket_view": True, "static_graph": False, "overlap_grad_reduce": True,
                         "compile": False}
    assert z.options["zero"] == {**ZERO3_DEFAULTS, "overlap_comm": False}
    assert t.options == {"tf32": False, "fused_adamw": False, "recompute": "none", "schedule": "1F1B",
                         "virtual_stages": 1, "compile": False}
    gpu = resolve_matrix(_matrix({"name": "d", "strategy": "ddp"},
                                 {"name": "m", "strategy": "tp_pp", "engine": "megatron"}), source="m", num_gpus=2)
    assert gpu.runs[0].options["compile"] is True and gpu.runs[0].options["fused_adamw"] is True
    assert gpu.runs[1].options["use_distributed_optimizer"] is True  # dp 2
    assert gpu.runs[1].options["overlap_grad_reduce"] is True


def test_unknown_or_mistyped_knobs_are_refused_with_the_valid_list():
    with pytest.raises(ConfigError) as e:
        resolve_matrix(_matrix({"name": "d", "strategy": "ddp", "options": {"bucket_cap": 1, "compile": "yes"}},
                               {"name": "z", "strategy": "zero3", "options": {"zero": {"prefetch": 1}}}),
                       source="m", num_gpus=0)
    msg = str(e.value)
    assert "unknown key 'bucket_cap' (valid: bucket_cap_mb, compile, fault, fused_adamw" in msg
    assert "'compile' must be bool | None, got 'yes'" in msg
    assert "unknown key 'zero.prefetch' (valid: allgather_bucket_size" in msg


def test_auto_micro_batch_candidates_divide_the_per_dp_batch():
    camp = resolve_matrix(_matrix({"name": "d", "strategy": "ddp", "micro_batch_size": "auto"},
                                  {"name": "p", "strategy": "tp_pp", "pp_degree": 2, "world_size": 2,
                                   "micro_batch_size": "auto-largest"}), source="m", num_gpus=0)
    d, p = camp.runs
    assert d.options["micro_batch_search"]["candidates"] == [8, 4, 2, 1]  # per-DP batch 16 / 2
    assert d.options["micro_batch_search"]["policy"] == "fastest"
    assert p.options["micro_batch_search"]["candidates"] == [2, 1]  # m >= 4p = 8 micro-batches of 16
    assert p.options["micro_batch_search"]["policy"] == "largest"
    with pytest.raises(ConfigError, match="valid strings: auto, auto-largest"):
        resolve_matrix(_matrix({"name": "d", "strategy": "ddp", "micro_batch_size": "max"}), source="m", num_gpus=0)


def test_choose_micro_batch_policies():
    results = [{"micro_batch_size": 8, "status": "oom", "tokens_per_s": None},
               {"micro_batch_size": 4, "status": "ok", "tokens_per_s": 90.0},
               {"micro_batch_size": 2, "status": "ok", "tokens_per_s": 100.0}]
    assert choose_micro_batch(results, policy="largest") == 4
    assert choose_micro_batch(results, policy="fastest") == 2
    assert choose_micro_batch(results[:1], policy="fastest") is None


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((run_dir / "metrics").glob("rank*.jsonl"))
            for line in p.read_text().splitlines()]


def test_search_under_a_simulated_memory_limit_keeps_global_batch_and_tokens(tmp_path):
    matrix = tmp_path / "m.toml"
    matrix.write_text('''
[campaign]
name = "tune"
preset = "tiny"
[fixed]
steps = 8
warmup_steps = 2
[[runs]]
name = "auto"
strategy = "ddp"
micro_batch_size = "auto-largest"
options = { simulate_oom_above_micro_batch_size = 2 }
[[runs]]
name = "fixed"
strategy = "ddp"
micro_batch_size = 4
''')
    out = tmp_path / "camp"
    res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--matrix", str(matrix), "--out", str(out)],
                         capture_output=True, text=True, timeout=500)
    assert res.returncode == 0, res.stdout + res.stderr
    spec = json.loads((out / "auto" / "spec.json").read_text())
    search = spec["options"]["micro_batch_search"]
    assert [(r["micro_batch_size"], r["status"]) for r in search["results"]] == [(8, "oom"), (4, "oom"), (2, "ok")]
    assert search["chosen"] == spec["micro_batch_size"] == 2
    gbs = spec["fixed"]["global_batch_size"]
    assert spec["micro_batch_size"] * spec["num_microbatches"] * spec["dp_degree"] == gbs == 16
    assert json.loads((out / "auto" / "status.json").read_text())["status"] == "ok"
    auto, fixed = _rows(out / "auto"), _rows(out / "fixed")
    assert {r["tokens"] for r in auto} == {gbs * spec["fixed"]["model"]["seq_length"]}
    assert len(auto) == len(fixed) == 2 * 8
    # same tokens, same model: the loss of every step agrees whatever the micro-batch split
    la = {(r["rank"], r["step"]): r["loss"] for r in auto}
    lf = {(r["rank"], r["step"]): r["loss"] for r in fixed}
    for key, value in la.items():
        assert value == pytest.approx(lf[key], rel=1e-4, abs=1e-5), key
    info = json.loads((out / "auto" / "run_info.json").read_text())
    assert info["first_step_s"] > 0 and info["compile"] is False
