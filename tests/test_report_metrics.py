"""Golden FLOPs/MFU numbers and summarize_runs invariants (hypothesis)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.records import ModelConfig, RunSummary
from core.hardware import lookup_peak
from core.formulas import compute_flops_per_token, compute_mfu
from report.metrics import summarize_runs
from runner.model import count_gpt_params
from synthetic_campaign import make_run

GPT2 = ModelConfig(num_layers=12, hidden_size=768, num_heads=12, ffn_hidden_size=3072, seq_length=1024,
                   vocab_size=50257, padded_vocab_size=50257)
GPT2_PARAMS = 124_439_808  # nanoGPT GPT-2 124M, tied embedding once, incl. 1024x768 positions
POS = 1024 * 768


def test_gpt2_param_count_matches_model():
    assert count_gpt_params(GPT2) == GPT2_PARAMS


@pytest.mark.parametrize("convention, expected", [
    ("6N+12LHQT", 6 * (GPT2_PARAMS - POS) + 12 * 12 * 768 * 1024),  # 855,166,464
    ("6N", 6 * (GPT2_PARAMS - POS)),
    ("6N+6LHQT", 6 * (GPT2_PARAMS - POS) + 6 * 12 * 768 * 1024),
])
def test_flops_per_token_gpt2(convention, expected):
    got = compute_flops_per_token(num_params=GPT2_PARAMS, num_layers=12, hidden_size=768, seq_length=1024,
                                  position_embedding_params=POS, convention=convention)
    assert got == expected


def test_gpt2_is_855_mflop_per_token():
    got = compute_flops_per_token(num_params=GPT2_PARAMS, num_layers=12, hidden_size=768, seq_length=1024,
                                  position_embedding_params=POS)
    assert got == 855_166_464
    assert round(got / 1e6) == 855


def test_unknown_convention_rejected():
    with pytest.raises(ValueError, match="6N\\+12LHQT"):
        compute_flops_per_token(num_params=10, num_layers=1, hidden_size=1, seq_length=1, position_embedding_params=0,
                                convention="7N")


def test_mfu_golden_h200():
    # GPU.md: ~498k tokens/s for GPT-2 124M on one H200 is ~43% MFU by 6N+12LHQT
    peak = lookup_peak("NVIDIA H200", "bf16")
    mfu = compute_mfu(498_000, flops_per_token=855_166_464, peak_flops=peak.flops, num_gpus=1)
    assert mfu == pytest.approx(498_000 * 855_166_464 / 989.4e12)
    assert 0.43 <= mfu < 0.431


def test_mfu_scales_with_gpus_and_is_none_without_peak():
    assert compute_mfu(2e5, flops_per_token=1e9, peak_flops=1e15, num_gpus=4) == pytest.approx(2e14 / 4e15)
    assert compute_mfu(2e5, flops_per_token=1e9, peak_flops=None, num_gpus=1) is None
    assert compute_mfu(None, flops_per_token=1e9, peak_flops=1e15, num_gpus=1) is None
    assert lookup_peak("Some Future GPU", "bf16") is None
    assert lookup_peak("cpu", "fp32") is None


def _runs(names, world):
    # the tiny model: 2 layers, hidden 64, seq 32 (2048 position parameters), 8 x 32 = 256 tokens per step
    return [make_run(n, world_size=world, num_params=100_000) for n in names]


def _steps(times, *, ranks, tokens=256, losses=None):
    rows = []
    for step, per_rank in enumerate(times):
        for rank in range(ranks):
            rows.append({"run": "a", "rank": rank, "step": step, "step_time_s": per_rank[rank], "tokens": tokens,
                         "loss": None if losses is None or rank != ranks - 1 else losses[step], "lr": 1e-3,
                         "grad_norm": None, "mem_peak_allocated_gib": None, "mem_peak_reserved_gib": None,
                         "data_wait_s": 0.0, "wall_time_s": float(step)})
    return pd.DataFrame(rows).astype({"loss": "float64", "grad_norm": "float64", "mem_peak_allocated_gib": "float64",
                                      "mem_peak_reserved_gib": "float64"})


def test_summarize_exact_numbers():
    times = [[9.0, 9.0], [1.0, 2.0], [3.0, 1.0], [1.0, 4.0], [5.0, 5.0]]  # step 0 is warm-up
    out = summarize_runs(_steps(times, ranks=2, losses=[5.0, 4.0, 3.0, 2.0, 1.0]), _runs(["a"], 2), warmup_steps=1,
                         peak_flops={"a": 1e12})[0]
    assert out.num_steps_measured == 4
    assert out.step_time_median_s == 3.5  # per-step max: 2, 3, 4, 5
    assert out.step_time_p90_s == pytest.approx(np.percentile([2, 3, 4, 5], 90))
    assert out.tokens_per_s == pytest.approx(256 / 3.5)
    assert out.tokens_per_s_per_gpu == pytest.approx(256 / 3.5 / 2)
    fpt = 6 * (100_000 - 2048) + 12 * 2 * 64 * 32
    assert out.flops_per_token == fpt
    assert out.mfu == pytest.approx(256 / 3.5 * fpt / (2 * 1e12))
    assert out.mem_peak_allocated_gib is None  # CPU: NA, never 0
    assert (out.loss_first, out.loss_last) == (5.0, 1.0)


def test_summarize_run_without_steps_is_na():
    out = summarize_runs(_steps([[1.0]], ranks=1), _runs(["a", "crashed"], 1), warmup_steps=0)[1]
    assert out.num_steps_measured == 0
    assert out.step_time_median_s is None and out.tokens_per_s is None and out.mfu is None


@settings(max_examples=60, deadline=None)
@given(times=st.lists(st.lists(st.floats(0.001, 100.0), min_size=3, max_size=3), min_size=1, max_size=30),
       warmup=st.integers(0, 3))
def test_summarize_invariants(times, warmup):
    out = summarize_runs(_steps(times, ranks=3), _runs(["a"], 3), warmup_steps=warmup, peak_flops={"a": 1e15})[0]
    measured = [max(t) for t in times[warmup:]]
    assert out.num_steps_measured == len(measured)
    if not measured:
        assert out.step_time_median_s is None
        return
    assert min(measured) <= out.step_time_median_s <= out.step_time_p90_s <= max(measured)
    assert math.isclose(out.tokens_per_s * out.step_time_median_s, 256, rel_tol=1e-9)
    assert math.isclose(out.tokens_per_s_per_gpu * 3, out.tokens_per_s, rel_tol=1e-9)
    assert 0 < out.mfu
    # the slowest rank gates: slowing one rank never makes the median faster
    slower = [[t[0] * 2, t[1], t[2]] for t in times]
    out2 = summarize_runs(_steps(slower, ranks=3), _runs(["a"], 3), warmup_steps=warmup)[0]
    assert out2.step_time_median_s >= out.step_time_median_s


def test_loss_agreement_is_judged_from_the_first_measured_step():
    """Warm-up steps are out of the loss comparison (Adam's first updates are sign-like, so rounding
    differences become whole-size update differences there); a gap after them is still found."""
    from report.rules import THRESHOLDS, rule_loss
    rows = [RunSummary(run="a", status="ok", loss_last=6.50), RunSummary(run="b", status="ok", loss_last=6.51)]
    early = {"a": {1: 9.60, 10: 9.00, 20: 6.50}, "b": {1: 9.67, 10: 9.02, 20: 6.51}}  # 0.07 at step 1 only
    (f,) = rule_loss(rows, THRESHOLDS, early, from_step=10)
    assert f.kind == "loss_agrees" and f.evidence.worst_step == 10 and f.evidence.from_step == 10
    assert abs(f.evidence.loss_spread_nats - 0.02) < 1e-9
    (g,) = rule_loss(rows, THRESHOLDS, early, from_step=0)
    assert g.kind == "loss_disagrees" and g.evidence.worst_step == 1
    late = {"a": {1: 9.60, 10: 9.00, 20: 6.50}, "b": {1: 9.60, 10: 9.20, 20: 6.51}}  # 0.2 after the warm-up
    (h,) = rule_loss(rows, THRESHOLDS, late, from_step=10)
    assert h.kind == "loss_disagrees" and h.evidence.worst_step == 10


def test_each_run_of_one_table_gets_its_own_straggler():
    """Stragglers of several runs come from one pass over their rows: run a's rank 1 enters 5 ms
    after rank 0 in every step, run b's rank 0 enters 2 ms after rank 1 in 3 of its 4 steps;
    b's step 3 lacks rank 1's entry time and is left out."""
    from report.metrics import compute_straggler, compute_stragglers

    rows = [dict(run="a", rank=r, step=s, step_entry_time_s=10.0 * s + 0.005 * r) for s in range(4) for r in (0, 1)]
    rows += [dict(run="b", rank=0, step=s, step_entry_time_s=10.0 * s + (0.002 if s < 3 else 0.0)) for s in range(5)]
    rows += [dict(run="b", rank=1, step=s, step_entry_time_s=10.0 * s + (0.0 if s != 2 else 0.004)) for s in range(5)]
    rows[-2]["step_entry_time_s"] = None  # b, rank 1, step 3
    rows += [dict(run="c", rank=0, step=s, step_entry_time_s=float(s)) for s in range(3)]  # one rank: none
    steps = pd.DataFrame(rows).astype({"step_entry_time_s": "float64"})
    out = compute_stragglers(steps)
    assert sorted(out) == ["a", "b"]
    assert out["a"]["straggler_rank"] == 1 and out["a"]["straggler_last_share"] == 1.0
    assert out["a"]["straggler_lag_median_s"] == pytest.approx(0.005)
    # b's steps 0, 1, 2, 4: rank 0's lags 2, 2, 0, 0 ms (median 1); rank 1's 0, 0, 2, 0 (median 0)
    assert out["b"]["straggler_rank"] == 0 and out["b"]["straggler_lag_median_s"] == pytest.approx(0.001)
    assert out["b"]["straggler_last_share"] == 0.75  # last in steps 0, 1 and 4 (a tie: the lower rank)
    assert compute_straggler(steps[steps["run"] == "b"]) == out["b"]


def test_figures_draw_the_fastest_and_slowest_runs_of_many():
    from report.metrics import compute_loss_band, select_figure_runs

    runs = [f"r{i:02d}" for i in range(20)]
    median_s = {r: 1.0 + (i * 7 % 20) / 10 for i, r in enumerate(runs)}  # r00 1.0 s, r03 1.1, r06 1.2 ... r17 2.9
    step_times = pd.DataFrame([dict(run=r, step=s, step_time_s=median_s[r] + 0.01 * (s - 1)) for r in runs
                               for s in range(3)])
    assert select_figure_runs(step_times, runs[:16]) == runs[:16]  # few enough: all, in their order
    drawn = select_figure_runs(step_times, runs, max_runs=4)
    assert drawn == ["r00", "r03", "r14", "r17"]  # two fastest (1.0, 1.1 s), two slowest (2.8, 2.9 s)
    # a run without measured steps is never drawn in place of one with them
    assert select_figure_runs(step_times[step_times["run"] != "r00"], runs, max_runs=4) == ["r03", "r06", "r14", "r17"]
    loss = pd.DataFrame([dict(run=r, step=s, loss=5.0 - s + i) for i, r in enumerate(runs[:3]) for s in range(2)])
    band = compute_loss_band(loss)
    assert band.to_dict("list") == {"step": [0, 1], "loss_min": [5.0, 4.0], "loss_max": [7.0, 6.0]}
