"""Words that are true (issue 33, item 6): each message says what happened and what to do, a
command printed for copying is shell-quoted (a campaign path with a space and a quote), and
text from status files is inert in Markdown and HTML."""
from __future__ import annotations

import errno
import re
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from core.errors import ToolError

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "h200-1gpu"
RUNNER = [sys.executable, "-m", "runner.cli"]


def _copy_example(tmp: Path) -> Path:
    camp = tmp / "my camp's dir"
    shutil.copytree(EXAMPLE, camp, ignore=shutil.ignore_patterns("trace", "tables"))
    return camp


def test_disk_full_lists_the_runs_status_json_calls_finished(tmp_path, monkeypatch):
    """A run that wrote status 'ok' just before the disk filled is 'kept', as status.json says."""
    import runner.cli as cli
    from core.records import run_spec_from_dict

    camp = _copy_example(tmp_path)
    specs = [run_spec_from_dict(json.loads((camp / n / "spec.json").read_text())) for n in ("ddp", "zero3")]
    (camp / "zero3" / "status.json").unlink()

    def fill_disk(out, specs, supervision, *, node, lock, done):  # ddp finished; writing its tables fails
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "ddp" / "tables" / "x.parquet"))

    monkeypatch.setattr(cli, "_run_campaign", fill_disk)
    with pytest.raises(ToolError) as e:
        cli.run_campaign(camp, specs, supervision=None)
    msg = str(e.value)
    assert "finished runs kept (final status.json): ddp;" in msg and "not finished: zero3" in msg, msg
    assert msg.endswith(f"after freeing space: runner all --resume {shlex.quote(str(camp))}"), msg


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_runner_status_with_orphans_suggests_a_command_that_works(tmp_path):
    out = tmp_path / "it's camp"
    matrix = tmp_path / "m.toml"
    matrix.write_text('[campaign]\nname = "w"\npreset = "tiny"\n[fixed]\nsteps = 3\nwarmup_steps = 1\n'
                      '[[runs]]\nname = "ddp"\nstrategy = "ddp"\nworld_size = 1\n')
    res = subprocess.run([*RUNNER, "all", "--matrix", str(matrix), "--out", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"report build {shlex.quote(str(out))}" in res.stdout  # the hint at the end, quoted
    # a runner killed with SIGKILL: its lock stale, the run without status, one of its ranks still running
    (out / "ddp" / "status.json").unlink()
    (out / ".runner.lock").write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname(),
                                                  "started_at": "2026-01-01T00:00:00+00:00"}))
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "runner.train", "--run-dir",
                               str(out / "ddp")], start_new_session=True)
    reaper = threading.Thread(target=orphan.wait, daemon=True)  # as init would: no zombie left to look alive
    reaper.start()
    try:
        status = subprocess.run([*RUNNER, "status", str(out)], capture_output=True, text=True, timeout=60)
        line = next(ln for ln in status.stdout.splitlines() if ln.startswith("runner: dead"))
        assert f"pid {orphan.pid} (rank)" in line, line
        command = line.split("finish with: ", 1)[1]
        assert command == shlex.join(["runner", "all", "--resume", str(out), "--kill-orphans"])
        plain = subprocess.run([*RUNNER, "all", "--resume", str(out)], capture_output=True, text=True, timeout=60)
        assert plain.returncode == 2 and "--kill-orphans" in plain.stderr  # what it said before fails
        res = subprocess.run([*RUNNER, *shlex.split(command)[1:]], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        reaper.join(timeout=20)
        assert orphan.returncode is not None
        assert json.loads((out / "ddp" / "status.json").read_text())["status"] == "ok"
    finally:
        if orphan.poll() is None:
            orphan.kill()


def test_note_during_a_live_run_does_not_say_runner_stopped(tmp_path):
    from ingest.io import load_campaign
    from report.render import render_markdown
    from report.view import build_note

    camp = _copy_example(tmp_path)
    (camp / "zero3" / "status.json").unlink()
    me = psutil.Process()
    (camp / ".runner.lock").write_text(json.dumps({"pid": me.pid, "host": socket.gethostname(),
                                                   "pid_create_time": me.create_time(),
                                                   "started_at": "2026-01-01T00:00:00+00:00"}))
    note = render_markdown(build_note(load_campaign(camp)))
    assert "runner stopped?" not in note
    assert f"run zero3: not finished yet; the campaign's runner is still running (pid {me.pid}" in note
    (camp / ".runner.lock").write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    assert "zero3: unfinished (no status recorded — runner stopped?)" in render_markdown(build_note(load_campaign(camp)))


@pytest.mark.parametrize("argv, patch", [
    (["plan", "--model", "gpt-125m", "--gpus", "8"], ("runner.plan", "build_plan")),  # plan_cli imports it when plan runs
    (["all", "--dry-run", "--gpus", "1"], ("runner.cli", "load_matrix")),
    (["all", "--resume", "CAMP", "--dry-run"], ("runner.cli", "load_campaign_meta")),
])
def test_sigterm_to_a_command_that_launches_nothing(argv, patch, tmp_path, monkeypatch, capsys):
    """SIGTERM (a real signal, through runner.cli's handler) while plan or a dry run works."""
    import importlib

    import runner.cli as cli

    def terminated(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("SIGTERM did not arrive")

    monkeypatch.setattr(importlib.import_module(patch[0]), patch[1], terminated)
    camp = _copy_example(tmp_path)
    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    try:
        code = cli.main([str(camp) if a == "CAMP" else a for a in argv])
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGHUP, old[1])
    err = capsys.readouterr().err
    said = "nothing was launched and no plan was written" if argv[0] == "plan" else "nothing was launched or written"
    assert code == 130 and said in err and "marked 'interrupted'" not in err, err


def test_sigterm_to_a_campaign_names_its_resume_command():
    import runner.cli as cli

    args = cli.build_parser().parse_args(["all", "--out", "a b"])
    assert cli.interrupted_text(args).endswith("(finish with: runner all --resume 'a b')")


HOSTILE = "# Owned\n![x](http://evil.example/i.png) [click](https://evil.example) <img src=x onerror=alert(1)> *b*"


def test_status_cause_is_inert_markdown_and_html(tmp_path):
    from ingest.io import load_campaign
    from report.render import render_html, render_markdown
    from report.view import build_note

    camp = _copy_example(tmp_path)
    status = json.loads((camp / "zero3" / "status.json").read_text())
    status.update(status="crash", exit_code=1, cause=HOSTILE)
    (camp / "zero3" / "status.json").write_text(json.dumps(status))
    skipped = json.loads((camp / "ddp" / "status.json").read_text())
    skipped.update(status="skipped", exit_code=None, cause=HOSTILE)
    (camp / "ddp" / "status.json").write_text(json.dumps(skipped))
    note = build_note(load_campaign(camp))
    md, html = render_markdown(note), render_html(note)
    assert md.count("\\# Owned") >= 2, md  # both causes printed, escaped
    assert not [ln for ln in md.splitlines() if ln.lstrip("-> ").startswith("# Owned")]
    printed = " ".join(ln for ln in md.splitlines() if "Owned" in ln)
    assert not re.search(r"!\[|(?<!\\)\]\(|(?<!\\)\[click", printed) and "<img" not in md and "http://" not in printed
    assert "<img" not in html and "&lt;img src=x" in html
