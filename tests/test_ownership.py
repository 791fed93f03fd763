"""One owner per campaign, on real runs (tiny preset, gloo, CPU): a second runner is refused,
a runner killed with SIGKILL leaves orphans that the next runner finds and refuses to measure
beside (or stops with --kill-orphans), `runner status` tells running from a dead runner, and a
full disk (a small tmpfs) names the file, keeps what finished and records the failed run's cause."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

RUNNER = [sys.executable, "-m", "runner.cli"]


def _matrix(tmp: Path, *, steps: int, runs: int, name: str = "own") -> Path:
    path = tmp / "m.toml"
    path.write_text(f'[campaign]\nname = "{name}"\npreset = "tiny"\n[fixed]\nsteps = {steps}\nwarmup_steps = 2\n'
                    + "".join(f'[[runs]]\nname = "run{i}"\nstrategy = "ddp"\n' for i in range(runs)))
    return path


def _steps(run_dir: Path, rank: int) -> list[int]:
    path = run_dir / "metrics" / f"rank{rank}.jsonl"
    return [json.loads(x)["step"] for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _train_processes(out: Path) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "runner.train" in cmd and str(out) in cmd:
            found.append(p)
    return found


def _wait_for(predicate, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.3)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([*RUNNER, *args], capture_output=True, text=True, timeout=timeout)


def test_second_runner_refused_sigkill_orphans_found_and_stopped(tmp_path):
    out = tmp_path / "camp"
    # one run: the campaign's next runs after a resume are test_faults' interrupt-and-resume's
    first = subprocess.Popen([*RUNNER, "all", "--matrix", str(_matrix(tmp_path, steps=300, runs=1)),
                              "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: len(_steps(out / "run0", 0)) >= 3, 240)
        lock = json.loads((out / ".runner.lock").read_text())
        assert lock["pid"] == first.pid and lock["child"]["run"] == "run0"

        # a second owner is refused in one line, before touching anything
        for args in (["all", "--resume", str(out)], ["all", "--matrix", str(tmp_path / "m.toml"), "--out", str(out)]):
            res = _cli(*args)
            assert res.returncode == 2, res.stdout + res.stderr
            assert len(res.stderr.strip().splitlines()) == 1, res.stderr
            assert f"campaign is in use by another runner (pid {first.pid} on " in res.stderr \
                or "output path exists" in res.stderr
        status = _cli("status", str(out))
        assert f"runner: running (pid {first.pid}" in status.stdout
        assert "run0  running" in status.stdout

        first.send_signal(signal.SIGKILL)  # the runner cannot stop its torchrun now
        first.wait(timeout=30)
        assert _train_processes(out)  # the orphans still train, writing into run0
        status = _cli("status", str(out))
        assert "runner: dead (its lock: pid" in status.stdout and "run0  runner dead" in status.stdout, status.stdout

        res = _cli("all", "--resume", str(out))
        assert res.returncode == 2, res.stdout + res.stderr
        assert "taking over the lock of a runner that is gone" in res.stdout
        assert "process(es) of an earlier runner still write into this campaign" in res.stderr
        assert "(torchrun)" in res.stderr and "(rank)" in res.stderr and "--kill-orphans" in res.stderr
        assert not (out / ".runner.lock").exists()  # the refused runner let go
        assert _train_processes(out)
        before = len(_steps(out / "run0", 0))

        res = _cli("all", "--resume", str(out), "--kill-orphans", timeout=500)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "stopped" in res.stdout and "process(es) of an earlier runner" in res.stdout
    finally:
        if first.poll() is None:
            first.kill()
        for p in _train_processes(out):  # never leave a stray rank behind a failed assertion
            p.kill()
    # the killed attempt is archived whole; the resumed one measured every step exactly once
    assert len(_steps(out / "run0" / "attempt-1", 0)) >= before
    assert json.loads((out / "run0" / "status.json").read_text())["status"] == "ok"
    for rank in (0, 1):
        assert _steps(out / "run0", rank) == list(range(300))
    assert not _train_processes(out)
    assert not (out / ".runner.lock").exists() and not (out / ".runner.reserve").exists()
    assert "runner:" not in _cli("status", str(out)).stdout  # no runner line once the campaign is finished


def test_stale_lock_of_a_dead_pid_is_taken_over(tmp_path):
    out = tmp_path / "camp"
    res = _cli("all", "--matrix", str(_matrix(tmp_path, steps=4, runs=1)), "--out", str(out), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    os.unlink(out / "run0" / "status.json")
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out / ".runner.lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename,
                                                   "started_at": "2026-01-01T00:00:00+00:00"}))
    assert "runner: dead (its lock: pid" in _cli("status", str(out)).stdout
    res = _cli("all", "--resume", str(out), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"taking over the lock of a runner that is gone (pid {dead.pid} on" in res.stdout
    assert not (out / ".runner.lock").exists()


FILL = r"""
set -u
mount -t tmpfs -o size=40m tmpfs "$MNT"
"$@" > "$MNT.stdout" 2> "$MNT.stderr" &
runner=$!
while [ ! -e "$MNT/camp/run0/status.json" ]; do
  kill -0 $runner 2>/dev/null || break
  sleep 0.2
done
cp -a "$MNT/camp/run0" "$MNT.run0-at-end"      # what run0 looked like when it finished
while [ -z "$(ls "$MNT/camp/run1/metrics" 2>/dev/null)" ]; do
  kill -0 $runner 2>/dev/null || break
  sleep 0.2
done
dd if=/dev/zero of="$MNT/fill" bs=64k 2>/dev/null   # the disk is full now, in the middle of run1
wait $runner
echo $? > "$MNT.rc"
find "$MNT/camp" -name '*.tmp' > "$MNT.tmpfiles"
cp -a "$MNT/camp" "$MNT.camp"
"""


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare for a private tmpfs")
def test_full_disk_names_the_file_keeps_finished_runs_and_records_the_cause(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=1m tmpfs {mnt}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {probe.stderr.strip()}")
    # run1 must still be training when the disk fills (the script fills it once run1's metrics exist):
    # 150 steps leave it seconds of training, against a 0.2 s poll
    cmd = [*RUNNER, "all", "--matrix", str(_matrix(tmp_path, steps=150, runs=3)), "--out", str(mnt / "camp")]
    env = {**os.environ, "MNT": str(mnt)}
    subprocess.run(["unshare", "-rm", "sh", "-c", FILL, "fill", *cmd], env=env, timeout=600, check=True)
    rc = int(Path(f"{mnt}.rc").read_text())
    err = Path(f"{mnt}.stderr").read_text()
    camp = Path(f"{mnt}.camp")
    assert rc == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "No space left on device" in err and str(mnt / "camp") in err  # names the file
    assert "finished runs kept (final status.json): run0; not finished: run1, run2" in err
    # run0 finished before the disk filled: intact, every step once
    assert json.loads((camp / "run0" / "status.json").read_text())["status"] == "ok"
    assert _steps(camp / "run0", 0) == list(range(150)) == _steps(Path(f"{mnt}.run0-at-end"), 0)
    # run1's cause is recorded (the reserve made room for it); --resume will re-run it
    status = json.loads((camp / "run1" / "status.json").read_text())
    assert status["status"] == "interrupted" and "No space left on device" in status["cause"], status
    assert not (camp / "run2" / "status.json").exists()
    assert Path(f"{mnt}.tmpfiles").read_text() == ""  # no temp file left behind
    assert not (camp / ".runner.lock").exists()


def test_ranks_of_another_node_of_the_same_campaign_are_not_orphans(tmp_path):
    """Two nodes of one campaign on one host (as the multi-node tests run them): node 1's ranks
    may start before node 0 checks for orphans; they belong to node 1's runner, not to an
    earlier runner of node 0."""
    from runner.owner import find_orphans

    out = tmp_path / "camp"
    (out / "ddp").mkdir(parents=True)
    cmd = [sys.executable, "-c", "import time; time.sleep(60)", "runner.train", "--run-dir", str(out / "ddp")]
    # started through a shell that exits at once: not a child of this process (those are never orphans)
    res = subprocess.run(["sh", "-c", shlex.join(cmd) + " >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                         env={**os.environ, "RUNNER_NODE_RANK": "1"}, timeout=30)
    proc = psutil.Process(int(res.stdout))
    try:
        deadline = time.monotonic() + 30
        while "runner.train" not in proc.cmdline() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert find_orphans(out, node_rank=0) == []
        assert [p.pid for p in find_orphans(out, node_rank=1)] == [proc.pid]  # its own node's leftovers still count
    finally:
        proc.kill()
