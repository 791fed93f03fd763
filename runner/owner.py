"""One owner per campaign directory: the runner's lock file and the processes a dead runner left.

`runner all` and `runner all --resume` hold ``<campaign>/.runner.lock`` (node K > 0 of a
multi-node campaign: ``.runner_node<K>.lock``) while they run: a JSON record of the owner's pid,
host, start time and the process session of the torchrun it supervises now. The file is
created with O_EXCL, so of two runners started on one campaign exactly one gets it; the other
is refused (LockHeldError). A lock whose pid is dead on this host is stale (the runner was
killed with SIGKILL, or the machine rebooted) and is taken over with a message.

A runner killed with SIGKILL cannot stop its torchrun: the run's processes live on in their own
session and keep appending to the campaign's files. ``find_orphans`` finds them (the session
recorded in the lock, and any torchrun / rank whose ``--run-dir`` lies in the campaign), so the
next runner refuses to measure beside them or stops them (``--kill-orphans``).

Deliberately not here: deciding what to re-run (runner.cli) or how a run's group is killed on
the runner's own exit (runner.launch).
"""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

from core.errors import ToolError
from core.atomic import write_json_atomic

LOCK_NAME = ".runner.lock"
# Space set aside while a runner owns the campaign, freed when the disk fills so the failed
# run's status.json (its cause) can still be written.
RESERVE_NAME, RESERVE_BYTES = ".runner.reserve", 256 * 1024


class LockHeldError(ToolError):
    """Another live runner owns the campaign."""


def lock_path(out: Path, *, node_rank: int | None = None) -> Path:
    """The lock file of the runner of node ``node_rank`` (None or 0: the campaign's main runner)."""
    return out / (LOCK_NAME if not node_rank else f".runner_node{node_rank}.lock")


@dataclass(frozen=True, kw_only=True)
class LockState:
    """What a lock file says. state: "held" (a live pid on this host), "stale" (its pid is dead
    on this host), "foreign" (another host: liveness unknown, treated as held), "unreadable"."""

    path: Path
    state: str
    record: dict

    def describe(self) -> str:
        r = self.record
        return f"pid {r.get('pid', '?')} on {r.get('host', '?')} since {r.get('started_at', '?')}"


def _pid_alive(pid: object, create_time: object) -> bool:
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        # a recycled pid is another process: compare start times
        return not isinstance(create_time, (int, float)) or abs(proc.create_time() - create_time) < 1.0
    except psutil.Error:
        return False


def read_lock(path: Path) -> LockState | None:
    """The state of the lock at ``path``; None when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError:
        return LockState(path=path, state="unreadable", record={})
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        record = None
    if not isinstance(record, dict):  # a runner killed between create and first write leaves it empty
        return LockState(path=path, state="unreadable", record={})
    if record.get("host") != socket.gethostname():
        return LockState(path=path, state="foreign", record=record)
    alive = _pid_alive(record.get("pid"), record.get("pid_create_time"))
    return LockState(path=path, state="held" if alive else "stale", record=record)


class CampaignLock:
    """The held lock of one campaign. ``record_child`` / ``clear_child`` note the torchrun session
    being supervised (for the next runner's orphan search); ``release`` removes the file."""

    def __init__(self, path: Path, record: dict) -> None:
        self.path, self._record = path, record

    def record_child(self, *, run: str, pid: int) -> None:
        self._write({**self._record, "child": {"run": run, "pid": pid, "sid": pid}})

    def clear_child(self) -> None:
        self._write(self._record)

    def _write(self, record: dict) -> None:
        write_json_atomic(self.path, record)

    def release(self) -> None:
        current = read_lock(self.path)
        if current is not None and current.record.get("pid") == os.getpid():
            free_reserve(self.path.parent)
            self.path.unlink(missing_ok=True)


def write_reserve(out: Path) -> None:
    """Set RESERVE_BYTES aside in ``out`` (best effort: a disk already full gets none)."""
    try:
        with open(out / RESERVE_NAME, "wb") as f:
            f.write(b"\0" * RESERVE_BYTES)
            f.flush()
            os.fsync(f.fileno())
    except OSError:
        (out / RESERVE_NAME).unlink(missing_ok=True)


def free_reserve(out: Path) -> bool:
    """Give the reserved space back (a full disk: room for status.json). -> whether there was any."""
    try:
        (out / RESERVE_NAME).unlink()
        return True
    except OSError:
        return False


def acquire_lock(out: Path, *, node_rank: int | None = None) -> tuple[CampaignLock, LockState | None]:
    """Take the campaign's lock. -> (lock, the stale lock taken over or None). Raises
    LockHeldError naming the owner when a live runner (or one on another host) holds it."""
    path = lock_path(out, node_rank=node_rank)
    me = psutil.Process()
    record = {"pid": os.getpid(), "host": socket.gethostname(), "pid_create_time": me.create_time(),
              "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    taken_over = None
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            state = read_lock(path)
            if state is None:
                continue  # released between our open and our read: try again
            if state.state in ("held", "foreign"):
                where = "" if state.state == "held" else " (another host: if that runner is gone, delete the lock)"
                raise LockHeldError(f"{out}: campaign is in use by another runner ({state.describe()}){where}; "
                                    f"lock {path}") from None
            if state.state == "unreadable" and _young(path):
                raise LockHeldError(f"{out}: campaign is being taken by another runner (lock {path} is being "
                                    "written); try again in a moment") from None
            _remove_if_same(path, state)
            taken_over = state
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(record, indent=2) + "\n")
        if not node_rank:
            write_reserve(out)
        return CampaignLock(path, record), taken_over
    raise LockHeldError(f"{out}: could not take the campaign lock {path} (other runners racing for it)")


def _young(path: Path) -> bool:
    try:
        return dt.datetime.now().timestamp() - path.stat().st_mtime < 5.0
    except OSError:
        return False


def _remove_if_same(path: Path, state: LockState) -> None:
    """Remove a stale lock only if it is still the one we judged stale (another runner may have
    taken it over meanwhile): compare the record again just before unlinking."""
    again = read_lock(path)
    if again is not None and again.record == state.record and again.state == state.state:
        path.unlink(missing_ok=True)


def find_orphans(out: Path, *, stale: LockState | None = None, node_rank: int | None = None) -> list[psutil.Process]:
    """Processes other than this one still working in campaign ``out``: the torchrun session a
    dead runner recorded in its lock, and any torchrun or rank whose ``--run-dir`` is under
    ``out`` -- except those another node of the same multi-node campaign launched on this host
    (their ``RUNNER_NODE_RANK`` differs from ``node_rank``; that node's runner owns them). Ordered
    by pid."""
    root = out.resolve()
    sid = ((stale.record.get("child") or {}).get("sid") if stale and stale.state == "stale" else None)
    found: dict[int, psutil.Process] = {}
    mine = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        if proc.pid in mine:
            continue
        try:
            if isinstance(sid, int) and os.getsid(proc.pid) == sid:
                found[proc.pid] = proc
                continue
        except OSError:
            continue
        cmd = proc.info.get("cmdline") or []
        if "runner.train" not in cmd or "--run-dir" not in cmd:
            continue
        i = cmd.index("--run-dir")
        if i + 1 >= len(cmd):
            continue
        run_dir = Path(cmd[i + 1])
        if not run_dir.is_absolute():
            run_dir = Path(proc.info.get("cwd") or "/") / run_dir
        if run_dir.resolve().is_relative_to(root) and not _other_nodes(proc, node_rank):
            found[proc.pid] = proc
    return [found[p] for p in sorted(found)]


def _other_nodes(proc: psutil.Process, node_rank: int | None) -> bool:
    """Whether ``proc`` was launched by the runner of another node (RUNNER_NODE_RANK, set by
    runner.cli for multi-node campaigns) than ``node_rank``."""
    try:
        theirs = proc.environ().get("RUNNER_NODE_RANK")
    except psutil.Error:
        return False
    return theirs is not None and theirs != str(node_rank or 0)


def describe_orphans(procs: list[psutil.Process]) -> str:
    """'pid 12 (torchrun), pid 13 (rank)' for a message."""
    parts = []
    for p in procs:
        try:
            cmd = p.cmdline()
        except psutil.Error:
            cmd = []
        kind = "torchrun" if "torch.distributed.run" in cmd else "rank" if "runner.train" in " ".join(cmd) else "process"
        parts.append(f"pid {p.pid} ({kind})")
    return ", ".join(parts)


def kill_orphans(procs: list[psutil.Process], *, timeout_s: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL after ``timeout_s``, each process and its process group. -> pids still alive."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in procs:
            try:
                pgid = os.getpgid(p.pid)
                if pgid != os.getpgrp():  # never our own group
                    os.killpg(pgid, sig)
            except OSError:
                pass
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        _, procs = psutil.wait_procs(procs, timeout=timeout_s)
        if not procs:
            break
    return [p.pid for p in procs]
