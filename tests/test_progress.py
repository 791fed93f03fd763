"""Runner feedback: progress while `runner all` supervises a run (plain lines when stdout is not a
terminal, a tqdm bar when it is) and `runner status` on finished, partial and foreign directories."""
from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from runner.progress import (
    BarProgress, MetricsTail, PlainProgress, RunProgress, build_progress, render_progress_line, summarize_progress,
)

MATRIX = """
[campaign]
name = "prog"
preset = "tiny"
[fixed]
steps = 40
warmup_steps = 2
[[runs]]
name = "ddp"
strategy = "ddp"
world_size = 2
"""
LINE = re.compile(r"^\[runner\] ddp step (\d+)/40  ([\d.]+)([kMG]?) tok/s  loss ([\d.]+)  ETA (\d+) s$")


def _row(step: int, *, step_time_s: float = 0.5, tokens: int = 1000, loss: float = 5.0, profiled=False,
         run: str = "r") -> dict:
    # a whole StepRow: `runner status` reads metrics as the note does (validated StepRows; a row
    # naming another run than its folder is dropped)
    return {"run": run, "rank": 0, "step": step, "step_time_s": step_time_s, "tokens": tokens, "loss": loss,
            "profiled": profiled, "lr": 1e-3, "grad_norm": 1.0, "mem_peak_allocated_gib": None,
            "mem_peak_reserved_gib": None, "data_wait_s": 0.0, "wall_time_s": 0.5 * (step + 1)}


def _runner(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp = tmp_path_factory.mktemp("prog")
    (tmp / "m.toml").write_text(MATRIX)
    res = _runner("all", "--matrix", str(tmp / "m.toml"), "--out", str(tmp / "camp"))
    assert res.returncode == 0, res.stdout + res.stderr
    return tmp / "camp", res


def test_non_tty_progress_lines_between_the_existing_ones(campaign):
    out, res = campaign
    lines = res.stdout.splitlines()
    assert lines[1] == "[1/1] ddp: ddp/torch-ddp on 2 process(es) ..."
    assert re.fullmatch(r"    ok in \d+\.\d s", lines[-2]) and lines[-1].startswith("done (1/1 runs ok)")
    progress = [LINE.fullmatch(line) for line in lines[2:-2]]
    assert progress and all(progress), lines  # nothing else between "[1/1]" and "ok in"
    steps = [int(m[1]) for m in progress]
    assert steps == sorted(steps) and len(set(steps)) == len(steps) and steps[-1] == 40
    scale = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}
    rows = [json.loads(x) for x in (out / "ddp" / "metrics" / "rank0.jsonl").read_text().splitlines()]
    best = max(r["tokens"] / r["step_time_s"] for r in rows)
    for m in progress:
        assert 0 < float(m[2]) * scale[m[3]] <= best * 1.05  # a median of real step rates
        assert 0 < float(m[4]) < 20  # cross-entropy of the tiny model's vocabulary
    assert float(progress[-1][4]) == pytest.approx(rows[-1]["loss"], abs=0.005) and progress[-1][5] == "0"


def test_tty_bar_renders_step_rate_loss_and_eta():
    class FakeTTY(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = FakeTTY()
    bar = build_progress(run="ddp", num_steps_total=200, stream=stream)
    assert isinstance(bar, BarProgress)
    bar.update(RunProgress(run="ddp", num_steps_done=120, num_steps_total=200, tokens_per_s=340e3, loss=6.52,
                           eta_s=31.0))
    text = stream.getvalue()
    assert "ddp step 120/200" in text and "340k tok/s  loss 6.52  ETA 31 s" in text
    bar.close()
    assert isinstance(build_progress(run="ddp", num_steps_total=200, stream=io.StringIO()), PlainProgress)


def test_plain_progress_every_tenth_and_every_30_s_and_at_the_end():
    now = [0.0]
    stream = io.StringIO()
    plain = PlainProgress(stream, clock=lambda: now[0])

    def at(step: int) -> RunProgress:
        return RunProgress(run="ddp", num_steps_done=step, num_steps_total=200, tokens_per_s=2000.0, loss=6.5,
                           eta_s=1.0)

    for step in (5, 19, 20, 25, 39):  # 10 % of 200 = 20 steps
        plain.update(at(step))
    now[0] = 31.0
    plain.update(at(41))  # crosses 40 too
    now[0] = 62.0
    plain.update(at(45))  # 30 s since the last line
    plain.update(at(47))
    plain.close()
    steps = [int(re.search(r"step (\d+)/", line)[1]) for line in stream.getvalue().splitlines()]
    assert steps == [20, 41, 45, 47]
    assert stream.getvalue().splitlines()[0] == "[runner] ddp step 20/200  2.0k tok/s  loss 6.50  ETA 1 s"


def test_summary_uses_median_of_recent_unprofiled_steps():
    rows = [_row(0, step_time_s=9.0)] + [_row(i, step_time_s=0.5 if i % 2 else 0.25) for i in range(1, 30)] \
        + [_row(30, step_time_s=7.0, profiled=True, loss=4.0)]
    p = summarize_progress(rows, run="r", num_steps_done=31, num_steps_total=101)
    # the last 20 rows: steps 11..29 (10 x 0.5 s, 9 x 0.25 s) and the profiled step 30, left out
    assert p.tokens_per_s == pytest.approx(1000 / 0.5)
    assert p.eta_s == pytest.approx(70 * 0.5) and p.loss == 4.0
    assert render_progress_line(p) == "[runner] r step 31/101  2.0k tok/s  loss 4.00  ETA 35 s"
    empty = summarize_progress([], run="r", num_steps_done=0, num_steps_total=10)
    assert render_progress_line(empty) == "[runner] r step 0/10  - tok/s  loss -  ETA -"


def test_tail_reads_only_appended_bytes_and_waits_for_the_newline(tmp_path):
    (tmp_path / "metrics").mkdir()
    path = tmp_path / "metrics" / "rank0.jsonl"
    tail = MetricsTail(tmp_path)
    assert tail.poll() == []
    first, second = json.dumps(_row(0)), json.dumps(_row(1))
    path.write_text(first + "\n" + second[:10])
    assert [r["step"] for r in tail.poll()] == [0] and tail.num_rows == 1
    with path.open("a") as f:
        f.write(second[10:] + "\n")
    assert [r["step"] for r in tail.poll()] == [1] and tail.num_rows == 2
    # bytes before the offset are not read again: overwriting them in place changes nothing seen
    with path.open("r+") as f:
        f.write(" " * len(first))
    assert tail.poll() == [] and tail.num_rows == 2


def test_status_of_a_finished_campaign(campaign):
    out, _ = campaign
    res = _runner("status", str(out), timeout=120)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0] == f"campaign prog in {out} (1 runs)"
    assert re.fullmatch(r"  ddp  ok\s+40/40 steps  [\d.]+[kM]? tok/s", lines[1]), lines[1]
    assert lines[-1] == f"note: not built yet (report build {out})"


def test_status_of_a_partial_campaign_names_states_and_cause(tmp_path):
    fixed = {"steps": 10, "warmup_steps": 2}
    (tmp_path / "campaign.json").write_text(json.dumps({"name": "half", "runs": ["a", "b", "c"], "fixed": fixed}))
    for name in ("a", "b", "c"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "spec.json").write_text(json.dumps({"name": name, "fixed": fixed}))
    (tmp_path / "a" / "metrics").mkdir()
    (tmp_path / "a" / "metrics" / "rank0.jsonl").write_text("".join(json.dumps(_row(i, run="a")) + "\n" for i in range(4)))
    (tmp_path / "a" / "status.json").write_text(json.dumps({"status": "crash", "cause": "rank 0: RuntimeError: boom"}))
    (tmp_path / "b" / "logs").mkdir()
    (tmp_path / "b" / "metrics").mkdir()
    (tmp_path / "b" / "metrics" / "rank0.jsonl").write_text(json.dumps(_row(0, run="b")) + "\n" + json.dumps(_row(1, run="b"))[:5])
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "note.md").write_text("# note\n")
    res = _runner("status", str(tmp_path), timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [  # no runner holds the campaign: b's runner is dead
        f"campaign half in {tmp_path} (3 runs)",
        f"runner: dead (no runner holds the campaign); finish with: runner all --resume {tmp_path}",
        "  a  crash           4/10 steps  2.0k tok/s  cause: rank 0: RuntimeError: boom",
        "  b  runner dead     1/10 steps  - tok/s",  # step 0 is warm-up: no post-warm-up rate yet
        "  c  not started     0/10 steps  - tok/s",
        f"note: {tmp_path / 'report' / 'note.md'}",
    ]
    me = psutil.Process()  # a live owner (this test process) holds the lock: b is running
    (tmp_path / ".runner.lock").write_text(json.dumps({"pid": me.pid, "host": socket.gethostname(),
                                                       "pid_create_time": me.create_time(), "started_at": "t0"}))
    lines = _runner("status", str(tmp_path), timeout=120).stdout.splitlines()
    assert lines[1] == f"runner: running (pid {me.pid} on {socket.gethostname()} since t0)"
    assert lines[3] == "  b  running         1/10 steps  - tok/s"


@pytest.mark.parametrize("what", ["empty", "file", "missing"])
def test_status_of_a_non_campaign_path_is_one_line_and_exit_2(tmp_path, what):
    path = {"empty": tmp_path, "file": tmp_path / "x.txt", "missing": tmp_path / "nope"}[what]
    if what == "file":
        path.write_text("x")
    res = _runner("status", str(path), timeout=120)
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith(f"runner: error: {path}: ")


def test_tail_takes_the_loss_of_a_pipelines_last_stage(tmp_path):
    """PP: rank 0 (first stage) writes no loss; the progress line shows the last stage's."""
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    (metrics / "rank0.jsonl").write_text("".join(
        json.dumps({"step": s, "step_time_s": 0.1, "tokens": 1024, "loss": None}) + "\n" for s in range(3)))
    (metrics / "rank3.jsonl").write_text("".join(
        json.dumps({"step": s, "step_time_s": 0.1, "tokens": 1024, "loss": 10.0 - s}) + "\n" for s in range(2)))
    tail = MetricsTail(tmp_path)
    rows = tail.poll()
    assert [r["loss"] for r in rows] == [None, None, 9.0] and tail.num_rows == 3
    progress = summarize_progress(rows, run="pp", num_steps_done=3, num_steps_total=10)
    assert "loss 9.00" in render_progress_line(progress)
