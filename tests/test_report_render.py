"""Render the note from a SYNTHETIC campaign (tests/synthetic_campaign.py) in all formats."""
from __future__ import annotations

import pandas as pd
import pytest

from ingest.io import load_campaign, write_tables
from report import render
from report.cli import main as report_main
from report.view import build_note
from synthetic_campaign import write_synthetic_campaign


def test_filters():
    assert render.pct(0.4312) == "43.1%" and render.pct(None) == "n/a"
    assert render.si(855_166_464, "FLOP") == "855 MFLOP"
    assert render.si(989.4e12, "FLOP/s") == "989 TFLOP/s"
    assert render.si(999_999) == "1 M"
    assert render.si(6.2146) == "6.21"
    assert render.gib(3.5) == "3.50 GiB" and render.gib(float("nan")) == "n/a"
    assert render.duration(0.13) == "130.0 ms" and render.duration(5e-4) == "500 µs"
    assert render.duration(200) == "3 min 20 s"
    assert render.count(124439808) == "124,439,808"
    assert render.sci(0.000378) == "3.8e-4" and render.sci(0.05) == "0.05" and render.sci(0) == "0"
    assert render.nbytes(16 * 269_696) == "4.12 MiB" and render.nbytes(16 * 124_475_904) == "1.85 GiB"
    assert render.margin(0.078) == "+7.8% tokens/s" and render.margin(2.09) == "3.09× the tokens/s"
    assert render.md_cell("a|b\nc") == "a\\|b c" and render.md_cell(None) == "n/a"


@pytest.mark.parametrize("device_name", [None, "NVIDIA H200"])
def test_build_all_formats(tmp_path, device_name):
    camp = write_synthetic_campaign(tmp_path / "camp", device_name=device_name)
    assert report_main(["build", str(camp)]) == 0
    out = camp / "report"
    md = (out / "note.md").read_text()
    for heading in ("## 1. Environment", "## 2. Model and data", "## 3. Configurations", "## 4. Metrics",
                    "## 5. Evidence", "## 6. Conclusion", "## Appendix: formulas"):
        assert heading in md
    assert "not measured yet" in md and "No profiler trace in this source" in md
    assert "Run **tp_pp** ran out of memory" in md and "does not fit at micro-batch 2" in md  # an answer about memory
    assert "CUDA out of memory. Tried to allocate 2.00 GiB (synthetic)" in md  # the allocator's own message
    assert (out / "note.pdf").read_bytes().startswith(b"%PDF")
    html = (out / "note.html").read_text()
    assert "<b>tp_pp</b>" in html and "figures/loss.svg" in html
    assert (out / "figures" / "loss.svg").is_file() and (out / "figures" / "step_time.svg").is_file()
    if device_name is None:
        assert "CPU campaign" in md and "none (no GPU runs) — MFU n/a" in md
    else:
        assert "989 TFLOP/s dense" in md and "nvidia.com" in md


def test_html_escapes_user_text(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp")
    env = (camp / "env.json").read_text().replace('"synthetic"', '"<script>x</script>"')
    (camp / "env.json").write_text(env)
    assert report_main(["build", str(camp), "--format", "html"]) == 0
    html = (camp / "report" / "note.html").read_text()
    assert "<script>x</script>" not in html and "&lt;script&gt;" in html


def test_tables_dir_renders_same_numbers(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp", device_name="NVIDIA H200")
    campaign = load_campaign(camp)
    write_tables(campaign, tmp_path / "tables")
    again = load_campaign(tmp_path / "tables")
    pd.testing.assert_frame_equal(campaign.runs, again.runs)
    pd.testing.assert_frame_equal(campaign.steps, again.steps)
    assert build_note(campaign) == build_note(again)
    assert report_main(["build", str(tmp_path / "tables"), "--out", str(tmp_path / "r"), "--format", "md"]) == 0
    assert (tmp_path / "r" / "note.md").is_file()


def test_view_numbers_and_findings(tmp_path):
    note = build_note(load_campaign(write_synthetic_campaign(tmp_path / "camp", device_name="NVIDIA H200")))
    ddp = next(m for m in note.metrics if m.run == "ddp")
    assert ddp.step_time_median_s == pytest.approx(0.13)  # slowest rank per step
    assert ddp.mfu is not None and ddp.mfu_6n < ddp.mfu < ddp.mfu * 1.5
    kinds = [f.kind for f in note.findings]
    assert kinds[0] == "fastest" and note.findings[0].runs == ("ddp",)
    assert "oom" in kinds and "loss_agrees" in kinds
    assert {c.kind for c in note.conditions} >= {"condition_gpu_count", "condition_interconnect"}
    tp_pp = next(c for c in note.configs if c.run == "tp_pp")
    assert tp_pp.bubble_fraction == pytest.approx(1 / 5) and tp_pp.grad_accum_steps is None


def test_unknown_gpu_gives_na_mfu_and_caveat(tmp_path):
    note = build_note(load_campaign(write_synthetic_campaign(tmp_path / "camp", device_name="Mystery GPU 9000")))
    assert all(m.mfu is None for m in note.metrics)
    assert any(c.kind == "unknown_peak" for c in note.caveats)
