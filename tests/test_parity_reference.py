"""The kernel-parity reference and the knob comparison on hand-built tables: one engine's
variants must not outvote another engine, and a knob run is compared with the first run of its
layout, engine and data round (a repeat is not a knob)."""
from __future__ import annotations

import pandas as pd
import pytest

from core.records import RunSummary
from report.parity import build_parity_rows
from report.rules import THRESHOLDS, GapRow, rule_engine_knobs
from tests.synthetic_campaign import make_run

TOKENS = 1000
PARITY = {"kernels": {"mode": "parity"}}


def _run(name: str, strategy: str, engine: str, *, options: dict | None = None, data_round: str = "synthetic"):
    return make_run(name, strategy=strategy, engine=engine, options={**PARITY, **(options or {})},
                    data_round=data_round)


def _kernels(elementwise_s: dict[str, float]) -> pd.DataFrame:
    rows = []
    for run, ew in elementwise_s.items():
        rows.append({"run": run, "kernel_class": "gemm", "total_s": 1.0, "num_steps": 1})
        rows.append({"run": run, "kernel_class": "elementwise", "total_s": ew, "num_steps": 1})
    return pd.DataFrame(rows)


def test_one_engines_variants_do_not_outvote_the_other_engine():
    # four DeepSpeed runs (knob variants, data rounds) at 0.6 s elementwise, two DDP runs at 0.3 s:
    # a median over runs would be DeepSpeed's and name DDP as the odd one out
    runs = [_run("ddp", "ddp", "torch-ddp"), _run("ddp-real", "ddp", "torch-ddp")]
    runs += [_run(f"ds{i}", "zero3", "deepspeed") for i in range(4)]
    ew = {"ddp": 0.3, "ddp-real": 0.3, **{f"ds{i}": 0.6 for i in range(4)}}
    rows = {r.run: r for r in build_parity_rows(_kernels(ew), runs, timelines={})}
    # the reference is midway (0.45 s): both engines differ by a third, in opposite directions
    assert rows["ddp"].failed_class == "elementwise" and rows["ddp"].failed_diff == pytest.approx(0.3 / 0.45 - 1)
    assert rows["ds0"].failed_class == "elementwise" and rows["ds0"].failed_diff == pytest.approx(0.6 / 0.45 - 1)


def test_three_engines_name_only_the_odd_one():
    runs = [_run("ddp", "ddp", "torch-ddp"), _run("fsdp2", "zero3", "fsdp2"), _run("ds", "zero3", "deepspeed"),
            _run("ds-knob", "zero3", "deepspeed")]
    rows = {r.run: r for r in build_parity_rows(_kernels({"ddp": 0.30, "fsdp2": 0.31, "ds": 0.6, "ds-knob": 0.6}),
                                                runs, timelines={})}
    assert rows["ddp"].passed and rows["fsdp2"].passed
    assert rows["ds"].failed_class == "elementwise" and rows["ds"].failed_diff == pytest.approx(0.6 / 0.31 - 1)


def _summary(name: str, tokens_per_s: float, spread: float = 0.01) -> RunSummary:
    step = TOKENS / tokens_per_s
    return RunSummary(run=name, status="ok", tokens_per_s=tokens_per_s, step_time_median_s=step,
                      step_time_p90_s=step * (1 + spread))


def _breakdown(name: str, step_s: float, launch_gaps_s: float) -> GapRow:
    cats = dict.fromkeys(("compute", "transfer", "skew_wait", "bubble", "imbalance", "data_stall", "other"), 0.0)
    cats["compute"] = step_s - launch_gaps_s
    return GapRow(run=name, step_time_s=step_s, seconds={**cats, "launch_gaps": launch_gaps_s})


def test_knob_run_is_compared_with_its_layouts_first_run():
    base = _run("ds", "zero3", "deepspeed", options={"zero": {"persistence": 1}})
    knob = _run("ds-persist", "zero3", "deepspeed", options={"zero": {"persistence": 100}})
    repeat = _run("ds-r1", "zero3", "deepspeed", options={"zero": {"persistence": 1}, "repeat": 1})
    other_round = _run("ds-real", "zero3", "deepspeed", data_round="real", options={"zero": {"persistence": 100}})
    runs = [base, knob, repeat, other_round]
    summary = [_summary("ds", 1000.0), _summary("ds-persist", 1100.0), _summary("ds-r1", 1001.0),
               _summary("ds-real", 900.0)]
    breakdown = [_breakdown("ds", 1.0, 0.2), _breakdown("ds-persist", 0.91, 0.11)]
    findings = rule_engine_knobs(summary, runs, breakdown, THRESHOLDS)
    assert [f.runs for f in findings] == [("ds-persist", "ds")]  # the repeat and the lone real round are not knobs
    ev = findings[0].evidence
    assert ev.knobs == (("zero.persistence", 1, 100),)
    assert ev.margin == pytest.approx(0.1) and ev.beyond
    assert ev.deltas_s["launch_gaps"] == pytest.approx(-0.09) and ev.delta_step_s == pytest.approx(-0.09)
