"""The note's comparison sentences say what the numbers say, on both signs of every comparison.

Each sentence template is rendered (English, Markdown) from findings built by the rules that
make them (report.data_rounds, report.rules), never from hand-written prose: faster is worded
"more tokens/s", slower "fewer", a gap the noise cannot resolve is not called parity, a data
round is not another engine.
"""
from __future__ import annotations

import pytest

from core.records import STRATEGY_ENGINES, RunSummary
from report import render
from report.data_rounds import DATA_THRESHOLDS, RoundRow, rule_data_bound, rule_data_stall
from report.engines import build_engine_groups
from report.rules import THRESHOLDS, rule_engine_gap
from synthetic_campaign import make_run


def _render(source: str, **context) -> str:
    return " ".join(render.build_environment(html=False).from_string(source).render(**context).split())


def _data_word(finding) -> str:
    return _render('{% from "_data_words.j2" import data_word %}{{ data_word(f) }}', f=finding)


def _round(delta: float, *, wait: float, noise: float = 0.02) -> RoundRow:
    return RoundRow(layout="ddp", strategy="ddp", engine="torch-ddp", synthetic_run="ddp", real_run="ddp-real",
                    synthetic_data_wait_median_s=0.0, real_data_wait_median_s=0.01, synthetic_data_wait_share=0.001,
                    real_data_wait_share=wait, synthetic_tokens_per_s=100.0, real_tokens_per_s=100 * (1 + delta),
                    tokens_per_s_delta=delta, synthetic_mfu=None, real_mfu=None, mfu_delta_points=None,
                    noise=noise, loader=None)


# ------------------------------------------------------------------ data rounds
@pytest.mark.parametrize("delta, wait, kind, direction", [
    (+0.374, 0.20, "data_bound", "37.4% more tokens/s than"),   # faster, but waits: the wait is the evidence
    (-0.200, 0.20, "data_bound", "20.0% fewer tokens/s than"),  # slower and waits
    (-0.200, 0.00, "data_bound", "20.0% fewer tokens/s than"),  # slower beyond noise, no wait
    (+0.100, 0.00, "data_not_bound", "10.0% more tokens/s than"),
    (-0.030, 0.00, "data_not_bound", "3.0% fewer tokens/s than"),
    (0.0, 0.00, "data_not_bound", "the same tokens/s as"),
])
def test_data_round_sentence_states_the_direction_of_the_change(delta, wait, kind, direction):
    (finding,) = rule_data_bound([_round(delta, wait=wait)], DATA_THRESHOLDS)
    assert finding.kind == kind
    text = _data_word(finding)
    assert direction in text, text
    assert "+" not in text.split("tokens/s", 1)[0]  # no signed percentage before "tokens/s" to misread
    opposite = "fewer" if delta > 0 else "more" if delta < 0 else None
    if opposite:
        assert f"{opposite} tokens/s" not in text, text
    if kind == "data_bound" and delta > 0:
        assert "not slower" in text, text  # the bottleneck claim says why it holds although faster
    if kind == "data_not_bound" and delta > 0:
        assert "no slowdown at all" in text, text


def test_data_stall_sentence_names_no_device():
    """The loader wait idles the training ranks, GPU or CPU: the sentence fits a CPU campaign."""
    summary = [RunSummary(run="ddp", status="ok", data_wait_median_s=0.02, step_time_median_s=0.1)]
    (finding,) = rule_data_stall(summary, {"ddp": 0.2}, DATA_THRESHOLDS)
    text = _data_word(finding)
    assert "GPU" not in text and "training ranks sit idle" in text, text


# ------------------------------------------------------------------ signed durations
@pytest.mark.parametrize("seconds, text", [(-0.0474, "−47.4 ms"), (0.0474, "47.4 ms"), (-5e-4, "−500 µs"),
                                           (-3.0, "−3.00 s")])
def test_negative_durations_keep_their_unit(seconds, text):
    assert render.duration(seconds) == text


# ------------------------------------------------------------------ engines
def _run(run, strategy, engine, data_round="synthetic"):
    return make_run(run, strategy=strategy, engine=engine, device="cpu", data_round=data_round)


def _summary(run, tps, spread=0.01):
    step = 1.0 / tps
    return RunSummary(run=run, status="ok", tokens_per_s=tps, step_time_median_s=step, step_time_p90_s=step * (1 + spread))


def _groups(runs, summary):
    return build_engine_groups(summary, runs, [], dtype="fp32", gpu_memory_gib=None)


def _engine_words(group) -> tuple[str, str]:
    title = _render('{% from "_engines.j2" import title %}{{ title(g) }}', g=group)
    words = _render('{% from "_engines.j2" import words %}{{ words(g) }}', g=group)
    return title, words


def test_data_rounds_are_not_engines_and_each_engine_is_named_once():
    runs = [_run("fsdp", "zero3", "fsdp2"), _run("fsdp-real", "zero3", "fsdp2", "real"),
            _run("ds", "zero3", "deepspeed"), _run("ds-real", "zero3", "deepspeed", "real")]
    summary = [_summary("fsdp", 400.0), _summary("fsdp-real", 390.0), _summary("ds", 160.0), _summary("ds-real", 150.0)]
    groups = _groups(runs, summary)
    assert [(g.data_round, [r.run for r in g.rows]) for g in groups] == [
        ("synthetic", ["fsdp", "ds"]), ("real", ["fsdp-real", "ds-real"])]
    titles = [_engine_words(g)[0] for g in groups]
    assert titles[0].endswith(": FSDP2 vs DeepSpeed"), titles
    assert titles[1].endswith(": FSDP2 vs DeepSpeed — real-text data round"), titles


@pytest.mark.parametrize("fast, slow, spread, verdict", [
    (400.0, 160.0, 0.01, "beyond the step-to-step spread"),  # 2.5x, quiet: a gap
    (160.0, 400.0, 0.01, "beyond the step-to-step spread"),  # the other engine faster: named first
    (144.0, 100.0, 0.60, "cannot tell"),                     # 1.44x inside a 60% spread: unresolved, not parity
    (102.0, 100.0, 0.01, "at parity"),                       # 2% < the 5% parity threshold
])
def test_engine_sentence_names_the_faster_engine_and_never_calls_a_gap_parity(fast, slow, spread, verdict):
    runs = [_run("fsdp", "zero3", "fsdp2"), _run("ds", "zero3", "deepspeed")]
    summary = [_summary("fsdp", fast, spread), _summary("ds", slow, spread)]
    (group,) = _groups(runs, summary)
    _, words = _engine_words(group)
    faster, slower = ("FSDP2", "DeepSpeed") if fast > slow else ("DeepSpeed", "FSDP2")
    assert words.startswith(f"**{faster}**"), words
    assert f"the tokens/s of {slower}" in words, words
    assert verdict in words, words
    if verdict != "at parity":
        assert "parity on this layout" not in words, words
    assert rule_engine_gap(summary, runs, [], THRESHOLDS, engines=STRATEGY_ENGINES)[0].kind == (
        "engine_gap" if verdict.startswith("beyond") else "engine_parity")
