"""Hostile input to report build: markup in recorded text is escaped, symlinks out of the
campaign and binary junk give a one-line error or a caveat, and nothing is written outside --out."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


# ---- impossible numbers, names that leave the campaign, FIFOs, damaged status.json (issue 21)

def _status_cli(camp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", "status", str(camp)],
                          capture_output=True, text=True, timeout=60)


def _resumable(camp: Path) -> Path:
    """The synthetic campaign with the supervision limits `runner all` records (--resume needs them)."""
    meta = json.loads((camp / "campaign.json").read_text())
    meta["supervision"] = {"run_timeout_s": 60, "stall_timeout_s": 30, "startup_timeout_s": 30}
    (camp / "campaign.json").write_text(json.dumps(meta))
    return camp


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _write_rows(path: Path, rows: list[dict], raw: list[str] = ()) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "".join(x + "\n" for x in raw))


def test_impossible_metric_rows_are_dropped_with_a_counted_caveat(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp")
    path = camp / "ddp" / "metrics" / "rank0.jsonl"
    rows = _rows(path)
    bad = [dict(rows[3], step=100, tokens=-50000), dict(rows[4], step=101, step_time_s=-0.2),
           dict(rows[5], step=102, step_time_s=float("inf"))]  # json.dumps writes Infinity
    _write_rows(path, rows[:2] + rows + rows[5:8] + bad)  # steps 0, 1 and 5..7 twice: two writers
    lines = path.read_text().splitlines()
    lines.insert(2, '{"step": 1, "run": "ddp", "ra')  # an interleaved half line in the middle
    path.write_text("\n".join(lines) + "\n")
    res = _build(camp, tmp_path / "out", "md")
    assert res.returncode == 0, res.stderr
    note = (tmp_path / "out" / "note.md").read_text()
    assert ("ddp/metrics/rank0.jsonl: 9 row(s) dropped: 1 malformed JSON (interleaved writers?) (line 3); "
            "5 duplicate or out-of-order step (line 4, line 5, line 16, ...); 3 impossible values (line 19: "
            "tokens -50000, line 20: step_time_s -0.2, line 21: step_time_s inf); the numbers use the 12 valid rows") in note
    assert not re.search(r"\|\s*[−-]\d", note)  # no negative number in any table cell
    assert not re.search(r"\|\s*(inf|nan)", note, re.IGNORECASE)


def test_runner_status_counts_distinct_steps_not_lines(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp", steps=12)
    path = camp / "ddp" / "metrics" / "rank0.jsonl"
    _write_rows(path, _rows(path) * 3)  # every row three times
    res = _status_cli(camp)
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if x.strip().startswith("ddp "))
    assert "12/12 steps" in line, res.stdout


@pytest.mark.parametrize("content, needle", [
    ("[]", "expected a JSON object, got list"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('"ok"', "expected a JSON object, got str"),
    ("{", "not valid JSON"),
])
def test_damaged_status_json_is_one_line_and_exit_2(tmp_path, content, needle):
    camp = _resumable(write_synthetic_campaign(tmp_path / "camp"))
    (camp / "ddp" / "status.json").write_text(content)
    for cmd in (["status", str(camp)], ["all", "--resume", str(camp)]):
        res = subprocess.run([sys.executable, "-m", "runner.cli", *cmd], capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, (cmd, res.stdout, res.stderr)
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert needle in res.stderr and "ddp/status.json" in res.stderr
    assert not (camp / ".runner.lock").exists()  # the refused resume released its lock


@pytest.mark.parametrize("name", ["/etc", "../../..", "a/../../b", ".."])
def test_run_names_that_leave_the_campaign_are_refused(tmp_path, name):
    camp = write_synthetic_campaign(tmp_path / "camp")
    meta = json.loads((camp / "campaign.json").read_text())
    meta["runs"] = [name, *meta["runs"]]
    (camp / "campaign.json").write_text(json.dumps(meta))
    before = set(tmp_path.rglob("*"))
    procs = [_status_cli(camp), _build(camp, tmp_path / "out", "md"),
             subprocess.run([sys.executable, "-m", "runner.cli", "all", "--resume", str(camp)],
                            capture_output=True, text=True, timeout=120),
             subprocess.run([sys.executable, "-m", "ingest.cli", str(camp), "--out", str(tmp_path / "tables")],
                            capture_output=True, text=True, timeout=120)]
    for res in procs:
        assert res.returncode == 2, (res.args, res.stdout, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr, res.stderr
        assert "must be a plain name" in res.stderr and "campaign.json" in res.stderr
    assert set(tmp_path.rglob("*")) == before  # nothing written anywhere


@pytest.mark.parametrize("name", ["/tmp", "../zero3", ".."])
def test_spec_name_that_is_a_path_is_refused(tmp_path, name):
    camp = _resumable(write_synthetic_campaign(tmp_path / "camp"))
    spec = json.loads((camp / "ddp" / "spec.json").read_text())
    spec["name"] = name
    (camp / "ddp" / "spec.json").write_text(json.dumps(spec))
    for res in (_build(camp, tmp_path / "out", "md"),
                subprocess.run([sys.executable, "-m", "runner.cli", "all", "--resume", str(camp)],
                               capture_output=True, text=True, timeout=120)):
        assert res.returncode == 2, (res.args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1 and "ddp/spec.json" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr


def test_fifo_where_metrics_and_logs_should_be_is_skipped_not_waited_on(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp")
    (camp / "zero3" / "metrics" / "rank0.jsonl").unlink()
    os.mkfifo(camp / "zero3" / "metrics" / "rank0.jsonl")
    (camp / "ddp" / "logs").mkdir(exist_ok=True)
    os.mkfifo(camp / "ddp" / "logs" / "rank0.log")
    os.mkfifo(camp / "ddp" / "metrics" / "rank7.jsonl")
    res = _status_cli(camp)  # a timeout here (60 s) is the hang this guards against
    assert res.returncode == 0, res.stderr
    res = _build(camp, tmp_path / "out", "md")
    assert res.returncode == 0, res.stderr
    note = (tmp_path / "out" / "note.md").read_text()
    assert "zero3/metrics/rank0.jsonl: not a regular file (a FIFO?); not read" in note
    res = subprocess.run([sys.executable, "-m", "ingest.cli", str(camp), "--out", str(tmp_path / "tables")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def test_markup_from_logs_is_escaped_in_the_markdown_note(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp", statuses={"zero3": "crash"})
    status_path = camp / "zero3" / "status.json"
    status = json.loads(status_path.read_text())
    status["cause"] = f"rank 0: RuntimeError: {SCRIPT} <img src=x onerror=alert(1)>"
    status["diagnosis"] = {"rank": 0, "exception": f"RuntimeError: {SCRIPT} <img src=x onerror=alert(1)>"}
    status_path.write_text(json.dumps(status))
    res = _build(camp, tmp_path / "out", "md")
    assert res.returncode == 0, res.stderr
    note = (tmp_path / "out" / "note.md").read_text()
    assert "<script>" not in note and "<img" not in note
    assert "&lt;script&gt;alert('x')&lt;/script&gt;" in note


def test_nan_in_the_matrix_is_refused(tmp_path):
    matrix = tmp_path / "m.toml"
    matrix.write_text('[campaign]\nname = "x"\npreset = "tiny"\n[fixed]\nlr = nan\nsteps = 1e23\n'
                      '[[runs]]\nname = "a"\nstrategy = "ddp"\n')
    res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--matrix", str(matrix), "--dry-run",
                          "--gpus", "0"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "[fixed] lr must be a finite number, got nan" in res.stderr
    assert "[fixed] steps must be an integer, got 1e+23" in res.stderr


@pytest.mark.parametrize("step_ms", ["0", "inf", "nan"])
def test_a_log_whose_step_time_is_zero_or_not_finite_gives_no_rate(tmp_path, step_ms):
    """A Megatron iteration line with an elapsed time of 0, inf or nan ms: ingest ends normally and
    no samples/s is derived from it (the hostile fuzz's seed 3264278841 divided by a 0 median)."""
    from ingest.thirdparty import ingest_file

    log = tmp_path / "train.log"
    log.write_text("".join(
        f" iteration {i:>8}/     100 | consumed samples: {8 * i:>10} | elapsed time per iteration (ms): {step_ms} |"
        f" learning rate: 1.000E-04 | global batch size:     8 | lm loss: 9.1E+00 | loss scale: 1.0 |\n"
        for i in (1, 2, 3)), encoding="utf-8")
    res = subprocess.run([sys.executable, "-m", "ingest.cli", str(log), "--out", str(tmp_path / "tables")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "internal error" not in res.stderr, res.stderr[-2000:]
    rows = ingest_file(log).records()
    assert any(r["table"] == "steps" for r in rows)
