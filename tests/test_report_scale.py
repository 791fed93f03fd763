"""A campaign of more runs than a figure draws: the loss and step-time figures show the fastest
and slowest runs over a band of all, the captions say so, and the tables keep every run.

The campaign is written by benchmarks/bench_report_scale.py's synthesizer (the tool's own records
and writers); its timings live in that benchmark, not here."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from report.metrics import MAX_FIGURE_RUNS
from report.render import build_report

ROOT = Path(__file__).resolve().parent.parent
NUM_RUNS = 40


def _synthesize():
    spec = importlib.util.spec_from_file_location("bench_report_scale", ROOT / "benchmarks" / "bench_report_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.synthesize_campaign


@pytest.fixture(scope="module")
def note(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale")
    campaign = _synthesize()(root / "c40", num_runs=NUM_RUNS, steps=12)
    out = root / "note"
    build_report(campaign, out_dir=out, formats=("md",))
    return out


def test_the_figures_draw_the_fastest_and_slowest_runs_and_the_captions_say_so(note):
    md = (note / "note.md").read_text()
    assert md.count(f"Drawn: {MAX_FIGURE_RUNS} of the {NUM_RUNS} runs, those with the lowest and the highest "
                    "median step time") == 2
    assert "grey band: the lowest to the highest loss of all 40 runs at each step" in md
    # the synthesizer's step times rise with k % 40 (k: the run's index): r00000 is the fastest, r00039 the slowest
    loss_svg = (note / "figures" / "loss.svg").read_text()
    legend = set(re.findall(r"r\d{5}-\w+", loss_svg))
    assert len(legend) == MAX_FIGURE_RUNS and "r00000-ddp" in legend and "r00039-tp_pp" in legend
    assert "r00020-ddp" not in legend and "every run: lowest to highest loss" in loss_svg
    step_svg = (note / "figures" / "step_time.svg").read_text()
    assert set(re.findall(r"r\d{5}-\w+", step_svg)) == legend
    # every run is still in the metric table and summary.json
    summary = json.loads((note / "summary.json").read_text())
    assert len(summary["runs"]) == NUM_RUNS and all(f"| r{k:05d}-" in md for k in range(NUM_RUNS))


def test_the_health_figures_say_how_many_runs_they_draw(note):
    from report.figures import MAX_HEALTH_FIGURE_RUNS, MAX_RANK_STEP_TIME_PANELS

    md = (note / "note.md").read_text()
    for drawn in (MAX_HEALTH_FIGURE_RUNS, MAX_RANK_STEP_TIME_PANELS):
        assert md.count(f"Drawn: {drawn} of the {NUM_RUNS} runs, the unhealthy ones first, then in campaign order; "
                        "the table above gives every run.") == 1


def test_the_captions_are_translated(note, tmp_path):
    campaign = next(p for p in note.parent.iterdir() if p.name == "c40")
    build_report(campaign, out_dir=tmp_path / "zh", formats=("md", "html"), lang="zh")
    for name in ("note.md", "note.html"):
        text = (tmp_path / "zh" / name).read_text()
        assert text.count(f"绘制：{NUM_RUNS} 个运行中的 {MAX_FIGURE_RUNS} 个，即中位步时间最低和最高的运行") == 2, name
        assert "绘制：40 个运行中的 20 个，先是不健康的运行" in text and "Drawn:" not in text, name
