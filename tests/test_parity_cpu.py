"""Kernel parity, repeats and kernel modes (issue 19) on CPU with the real engines (gloo, tiny
preset, one process per run so the runs are at equal math).

One campaign: DDP, ZeRO-3 under FSDP2 and TP1 x PP1 under the torch engine in parity mode, plus
DDP in engine-best mode, each twice (``repeats = 2``, interleaved). Checked: the parity kernels
resolve to the same choices for the three engines and each run records them in run_info; the
kernel-class table of a real CPU trace puts the cross entropy's host ops (aten::_log_softmax,
aten::nll_loss_forward and their backwards) in "loss" and AdamW's foreach ops in "optimizer";
the repeats run interleaved and the note shows their median and interval; the engine-best run is
not ranked against the parity runs. (The parity pass/fail itself is not asserted: CPU host time
on a shared 2-core machine is noise, not kernels.)
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MATRIX = """
[campaign]
name = "cpu-parity"
preset = "tiny"
world_size = 1
repeats = 2

[fixed]
steps = 8
warmup_steps = 2
profile_start_step = 4
profile_num_steps = 2

[[runs]]
name = "ddp"
strategy = "ddp"

[[runs]]
name = "fsdp2"
strategy = "zero3"
engine = "fsdp2"

[[runs]]
name = "torch-tp1-pp1"
strategy = "tp_pp"
engine = "torch"

[[runs]]
name = "ddp-best"
strategy = "ddp"
kernels = "engine-best"
"""
PARITY_LAYOUTS = ("ddp", "fsdp2", "torch-tp1-pp1")


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("parity")
    matrix = root / "m.toml"
    matrix.write_text(MATRIX)
    out = root / "camp"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--matrix", str(matrix), "--out", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = subprocess.run([sys.executable, "-m", "report.cli", "build", str(out), "--format", "md,html"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def _notes(out: Path) -> Path:
    return out / "report"


def test_parity_resolves_the_same_kernels_and_runs_record_them(campaign):
    want = {"mode": "parity", "loss": "eager-cross-entropy", "attention": "sdpa-causal",
            "optimizer": "adamw-foreach", "compile": "none", "not_taken": {}}
    for layout in PARITY_LAYOUTS:
        for k in (1, 2):
            run = campaign / f"{layout}-r{k}"
            assert json.loads((run / "spec.json").read_text())["options"]["kernels"] == want
            assert json.loads((run / "run_info.json").read_text())["kernels"] == want
    best = json.loads((campaign / "ddp-best-r1" / "run_info.json").read_text())["kernels"]
    assert best["mode"] == "engine-best"


def test_repeats_run_interleaved(campaign):
    order = json.loads((campaign / "campaign.json").read_text())
    names = [r["name"] if isinstance(r, dict) else r for r in order.get("runs", [])] or None
    expected = [f"{lay}-r1" for lay in (*PARITY_LAYOUTS, "ddp-best")] + [f"{lay}-r2" for lay in (*PARITY_LAYOUTS, "ddp-best")]
    if names:
        assert names == expected
    starts = {n: json.loads((campaign / n / "status.json").read_text())["started_at"] for n in expected}
    assert sorted(expected, key=lambda n: starts[n]) == expected


def test_cpu_trace_classes_loss_and_optimizer(campaign):
    from ingest.io import load_campaign, load_trace_tables

    tables = load_trace_tables(load_campaign(campaign))
    k = tables.kernels
    ddp = k[k["run"] == "ddp-r1"]
    by_name = dict(zip(ddp["name"], ddp["kernel_class"]))
    assert by_name["aten::_log_softmax"] == "loss" and by_name["aten::nll_loss_forward"] == "loss"
    assert by_name["aten::_log_softmax_backward_data"] == "loss"
    assert any(n.startswith("aten::_foreach_") for n, c in by_name.items() if c == "optimizer")
    assert by_name.get("aten::addmm", "gemm") == "gemm"


def test_summary_and_note_show_parity_repeats_and_modes(campaign):
    notes = _notes(campaign)
    summary = json.loads((notes / "summary.json").read_text())
    runs = {r["run"]: r for r in summary["runs"]}
    for layout in PARITY_LAYOUTS:
        p = runs[f"{layout}-r1"]["parity"]
        assert set(p) == {"ms_per_token", "pass", "reason"}
        assert p["ms_per_token"]["loss"] > 0 and p["ms_per_token"]["optimizer"] > 0
        assert isinstance(p["pass"], bool)
        assert runs[f"{layout}-r1"]["kernels"]["loss"] == "eager-cross-entropy"
    groups = {(g["layout"], g["kernels"]): g for g in summary["repeats"]}
    assert set(groups) == {(lay, "parity") for lay in PARITY_LAYOUTS} | {("ddp-best", "engine-best")}
    g = groups[("ddp", "parity")]
    assert g["runs"] == ["ddp-r1", "ddp-r2"] and g["interval"][0] <= g["median_tokens_per_s"] <= g["interval"][1]
    ranked = [f for f in summary["findings"] if f["kind"] in ("fastest", "beyond_noise", "within_noise")]
    ranked_runs = {r for f in ranked for r in f["runs"]}
    assert ranked_runs and not any(r.startswith("ddp-best") for r in ranked_runs)
    assert len(ranked_runs & {"ddp-r1", "ddp-r2"}) <= 1  # one repeat represents its layout
    assert any(f["kind"] in ("margin_beyond_repeats", "margin_within_repeats") for f in summary["findings"])
    md = (notes / "note.md").read_text()
    assert "Kernel parity" in md and "Repeats" in md and "95% Student-t interval" in md
    assert "ddp-best-r1 (engine-best)" in md
    html = (notes / "note.html").read_text()
    assert "<thead><tr><th>Run</th><th>Kernels</th>" in html
