"""End to end on CPU (gloo, world size 8): rank 0 all_gathers in its checkpoint function while
ranks 1-7 enter the next step's all_reduce; py-spy dumps each rank's stack; `report build` on
the folder names rank 0, its all_gather, the file and line, and the fix (issue 20, item 3)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from report.cli import main as report_main

SCRIPT = Path(__file__).parent / "fixtures" / "hang" / "checkpoint_hang.py"
WORLD = 8
PYSPY = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))


def run_hung_job(out: Path, *, world: int = WORLD, timeout_s: float = 240) -> None:
    """torchrun the script; once every rank has printed step 1, py-spy dump each worker into
    out/stacks_rank<r>.txt; then end the job (its own process group only)."""
    log = (out / "torchrun.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world}",
                             "--tee=3", str(SCRIPT)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", "HANG_TIMEOUT_S": "600"})
    try:
        deadline = time.monotonic() + timeout_s
        while (out / "torchrun.log").read_text().count("step 1 done") < world:
            assert proc.poll() is None and time.monotonic() < deadline, (out / "torchrun.log").read_text()[-3000:]
            time.sleep(1)
        time.sleep(3)  # let ranks 1-7 reach step 2's all_reduce
        workers = [c for c in psutil.Process(proc.pid).children(recursive=True) if str(SCRIPT) in " ".join(c.cmdline())]
        assert len(workers) == world
        for w in workers:
            rank = int(w.environ()["RANK"])
            dump = subprocess.run([PYSPY, "dump", "--pid", str(w.pid)], capture_output=True, text=True, timeout=60)
            (out / f"stacks_rank{rank}.txt").write_text(dump.stdout)
    finally:
        # torchrun starts each worker in a session of its own: kill them by pid (SIGKILL of the
        # launcher's group alone left 8 hung ranks spinning for the rest of the suite)
        try:
            workers_left = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            workers_left = []
        for w in workers_left:
            try:
                w.kill()
            except psutil.NoSuchProcess:
                pass
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        psutil.wait_procs(workers_left, timeout=60)
        log.close()


@pytest.mark.skipif(PYSPY is None, reason="py-spy not installed")
def test_missing_rank_named_with_its_collective_frame_and_fix(tmp_path):
    logs = tmp_path / "hung-job"
    logs.mkdir()
    run_hung_job(logs)
    assert report_main(["build", str(logs), "--format", "md"]) == 0
    note = (logs / "report" / "note.md").read_text(encoding="utf-8")
    triage = note.split("## Triage: what failed first", 1)[1]
    assert "Missing rank(s): 0 — in all_gather; the others wait in all_reduce" in triage
    assert f"rank 0: all_gather at save_checkpoint ({SCRIPT.as_posix().lstrip('/')}:15)" in triage.replace(
        str(SCRIPT), SCRIPT.as_posix().lstrip("/")) or "save_checkpoint (" in triage
    line = next(l for l in triage.splitlines() if l.startswith("- rank 0: all_gather at save_checkpoint"))
    assert line.endswith("checkpoint_hang.py:15)")
    for r in range(1, WORLD):
        assert any(l.startswith(f"- rank {r}: all_reduce at train_step") and l.endswith("checkpoint_hang.py:20)")
                   for l in triage.splitlines())
    assert "Fix: rank(s) 0 called all_gather at save_checkpoint" in triage
    assert "call it on every rank" in triage
    assert "one job because they share per-rank files of" in triage
