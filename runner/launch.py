"""Launch one run as its own ``torchrun`` process group and classify how it ended.

One process group per run (start_new_session), so a crash, OOM or hang costs that run only;
a deadline kills the whole group. The launcher's own output goes to logs/launcher.log; each
rank writes logs/rank<r>.log itself (runner.train).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from ingest.schema import RunSpec, RunStatus, to_dict

OOM_PATTERN = re.compile(r"(CUDA out of memory|OutOfMemoryError|DefaultCPUAllocator: can't allocate memory)")
EXCEPTION_PATTERN = re.compile(r"^(?:\[rank\d+\]: )?(\w+(?:\.\w+)*(?:Error|Exception)\b.*)$", re.MULTILINE)
# Debug output the campaign records (DESIGN.md: NCCL debug output per rank).
NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,GRAPH"}


def build_command(spec: RunSpec, *, run_dir: Path, master_port: int) -> list[str]:
    """The exact torchrun command line for one run (single node, static rendezvous)."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        f"--nproc-per-node={spec.world_size}", "--nnodes=1",
        "--master-addr=127.0.0.1", f"--master-port={master_port}",
        "-m", "runner.train", "--run-dir", str(run_dir),
    ]


def build_run_env(spec: RunSpec, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    if spec.device == "cuda":
        for k, v in NCCL_ENV.items():
            env.setdefault(k, v)
        env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # Megatron: TP comm/compute ordering
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def write_json_atomic(path: Path, data: dict) -> None:
    """Write JSON via temp file + rename, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def classify_failure(run_dir: Path, exit_code: int) -> tuple[str, str]:
    """(status, cause) from the ranks' logs of a run that exited non-zero."""
    texts = [p.read_text(encoding="utf-8", errors="replace") for p in sorted((run_dir / "logs").glob("rank*.log"))]
    for text in texts:
        m = OOM_PATTERN.search(text)
        if m:
            line = text[m.start():].splitlines()[0]
            return "oom", line[:300]
    for rank_log in sorted((run_dir / "logs").glob("rank*.log")):
        found = EXCEPTION_PATTERN.findall(rank_log.read_text(encoding="utf-8", errors="replace"))
        if found:
            return "crash", f"{rank_log.stem}: {found[-1][:300]}"
    if exit_code < 0:
        return "crash", f"killed by signal {signal.Signals(-exit_code).name}"
    return "crash", f"exit code {exit_code}, no exception in the rank logs"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def run_one(spec: RunSpec, *, run_dir: Path, timeout_s: float, master_port: int) -> RunStatus:
    """Launch, wait up to timeout_s, kill the group on deadline or interrupt, write status.json.

    KeyboardInterrupt is re-raised after the run's group is killed and its status recorded.
    """
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    cmd = build_command(spec, run_dir=run_dir, master_port=master_port)
    started, t0 = _now(), time.monotonic()
    status, cause, code = "ok", None, None
    with (run_dir / "logs" / "launcher.log").open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=build_run_env(spec),
                                start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            status, cause = "timeout", f"no exit within the {timeout_s:.0f} s deadline; process group killed"
        except KeyboardInterrupt:
            _kill_group(proc)
            _write_status(run_dir, spec, "interrupted", "runner interrupted (SIGINT)", proc.returncode, started, t0, cmd)
            raise
    if status == "ok" and code != 0:
        status, cause = classify_failure(run_dir, code)
    return _write_status(run_dir, spec, status, cause, code, started, t0, cmd)


def _kill_group(proc: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=10)
            return
        except subprocess.TimeoutExpired:
            continue


def _write_status(run_dir, spec, status, cause, code, started, t0, cmd) -> RunStatus:
    rs = RunStatus(run=spec.name, status=status, exit_code=code, cause=cause, started_at=started,
                   ended_at=_now(), duration_s=time.monotonic() - t0, command=tuple(cmd),
                   engine=spec.engine)
    write_json_atomic(run_dir / "status.json", to_dict(rs))
    return rs
