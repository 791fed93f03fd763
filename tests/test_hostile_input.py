"""Hostile input to report build: markup in recorded text is escaped, symlinks out of the
campaign and binary junk give a one-line error or a caveat, and nothing is written outside --out."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.synthetic_campaign import write_synthetic_campaign

SCRIPT = "<script>alert('x')</script>"


def _build(camp: Path, out: Path, *formats: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "report.cli", "build", str(camp), "--out", str(out),
                           "--format", ",".join(formats or ("md", "html"))],
                          capture_output=True, text=True, timeout=300)


def test_markup_in_a_crash_cause_renders_as_text(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp", statuses={"zero3": "crash"})
    status_path = camp / "zero3" / "status.json"
    status = json.loads(status_path.read_text())
    status["cause"] = f"rank 0: RuntimeError: {SCRIPT}"  # as the runner writes it: cause and diagnosis
    status["diagnosis"] = {"rank": 0, "exception": f"RuntimeError: {SCRIPT}"}
    status_path.write_text(json.dumps(status))
    res = _build(camp, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    html = (tmp_path / "out" / "note.html").read_text()
    assert SCRIPT not in html and "&lt;script&gt;" in html


def test_symlinked_metrics_pointing_outside_are_not_read(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp")
    outside = tmp_path / "secret.jsonl"
    outside.write_text("top secret\n")
    target = camp / "ddp" / "metrics" / "rank0.jsonl"
    target.unlink()
    os.symlink(outside, target)
    res = _build(camp, tmp_path / "out", "md")
    assert "Traceback" not in res.stderr
    assert res.returncode == 0, res.stderr
    note = (tmp_path / "out" / "note.md").read_text()
    assert "top secret" not in note and "a link to a file outside the campaign; not read" in note


def test_binary_and_huge_files_in_a_campaign(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp")
    (camp / "ddp" / "status.json").write_bytes(bytes(range(256)) * 40)
    (camp / "zero3" / "metrics" / "rank0.jsonl").write_text("x" * 3_000_000)
    before = set(tmp_path.rglob("*"))
    res = _build(camp, tmp_path / "out", "md")
    assert "Traceback" not in res.stderr and res.returncode in (0, 2)
    if res.returncode == 2:
        assert len(res.stderr.strip().splitlines()) == 1
    written = set(tmp_path.rglob("*")) - before
    assert all(p.is_relative_to(tmp_path / "out") for p in written)  # nothing outside --out
