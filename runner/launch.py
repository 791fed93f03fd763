"""Launch one run as its own ``torchrun`` process group and classify how it ended.

One process group per run (start_new_session), so a crash, OOM or hang costs that run only;
a deadline kills the whole group. The launcher's own output goes to logs/launcher.log; each
rank writes logs/rank<r>.log itself (runner.train).
"""
from __future__ import annotations

import datetime as dt
import errno
import json
import gzip
import os
import pickle
import shutil
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from ingest.hangs import (
    diagnose_from_flight_recorder,
    diagnose_from_stacks,
    parse_pyspy_dump,
    summarize_flight_recorder,
    summarize_stack,
)
from core.errors import ConfigError
from core.i18n import Message, N_  # a cause is a sentence the note prints: a catalogue message
from ingest.io import read_regular_text
from core.atomic import atomic_writer, write_json_atomic
from core.records import RunSpec, RunStatus, to_dict
from core.redact import redact_text, redact_value
from runner.progress import RECENT_STEPS, MetricsTail, ProgressReporter, summarize_progress
from runner.nodes import NodeLaunch, launcher_log_name, spec_path_for, status_path_for

OOM_PATTERN = re.compile(r"(CUDA out of memory|OutOfMemoryError|DefaultCPUAllocator: can't allocate memory)")
WATCHDOG_PATTERN = re.compile(r"Watchdog caught collective operation timeout|WorkNCCL\(SeqNum=\d+")
EXCEPTION_PATTERN = re.compile(r"^(?:\[rank\d+\]: )?(\w+(?:\.\w+)*(?:Error|Exception)\b.*)$", re.MULTILINE)
# Debug output the campaign records (DESIGN.md: NCCL debug output per rank). Not TUNING: NCCL
# 2.28 then prints a line per collective call on rank 0 only, host work on one rank's launch
# path -- the instrument must not make the straggler it reports.
NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,GRAPH"}


def nsys_prefix(spec: RunSpec, *, run_dir: Path, node: NodeLaunch | None = None) -> list[str]:
    """``nsys profile ...`` around torchrun when the campaign asks for it (``[campaign] nsys``):
    CUDA, NVTX (the phase ranges) and OS-runtime tracing of the whole process tree, one report
    per node in trace/nsys_node<k>.nsys-rep. [] otherwise. The runner checks nsys is on PATH
    before launching (runner.cli)."""
    if not spec.nsys:
        return []
    out = run_dir / "trace" / f"nsys_node{node.node_rank if node else 0}"
    return ["nsys", "profile", "--trace=cuda,nvtx,osrt", "--sample=none", "--force-overwrite=true",
            f"--output={out}"]


def build_command(spec: RunSpec, *, run_dir: Path, master_port: int, node: NodeLaunch | None = None,
                  run_index: int = 0) -> list[str]:
    """The exact torchrun command line for one run: single node with a static rendezvous on
    loopback, or (``node`` given) this node's agent of a c10d rendezvous at the endpoint's host
    and port + run_index, with world_size / nnodes processes per node. master_port is
    ignored for multi-node runs."""
    train = ["-m", "runner.train", "--run-dir", str(run_dir)]
    if node is None:
        return [
            *nsys_prefix(spec, run_dir=run_dir),
            sys.executable, "-m", "torch.distributed.run",
            f"--nproc-per-node={spec.world_size}", "--nnodes=1",
            "--master-addr=127.0.0.1", f"--master-port={master_port}",
            *train,
        ]
    return [
        *nsys_prefix(spec, run_dir=run_dir, node=node),
        sys.executable, "-m", "torch.distributed.run",
        f"--nnodes={node.nnodes}", f"--nproc-per-node={spec.world_size // node.nnodes}",
        "--rdzv-backend=c10d", f"--rdzv-endpoint={node.rdzv_host}:{node.port_for(run_index)}",
        f"--rdzv-id={spec.campaign}-{spec.name}", "--max-restarts=0",
        *train, "--spec", str(spec_path_for(run_dir, node)),
    ]


def build_run_env(spec: RunSpec, *, run_dir: Path, base: dict[str, str] | None = None,
                  node: NodeLaunch | None = None) -> dict[str, str]:
    """The run's environment: NCCL debug output and the flight recorder (dumped into trace/ on a
    collective timeout) on CUDA; one OpenMP thread per rank."""
    env = dict(os.environ if base is None else base)
    if spec.device == "cuda":
        for k, v in NCCL_ENV.items():
            env.setdefault(k, v)
        prefix = str(run_dir / "trace" / "flight_recorder_rank")
        for k, v in {"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000",
                     "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_FR_DUMP_TEMP_FILE": prefix,
                     "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}.items():
            env.setdefault(k, v)
        env.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # Megatron: TP comm/compute ordering
    env.setdefault("OMP_NUM_THREADS", "1")
    if spec.device == "cpu" and spec.options.get("memory_budget_gib") is not None:
        # a capacity trial's budget (runner.membudget): blocks >= 64 KiB mmap'd and returned at free, so
        # the process holds what it uses, not what glibc's per-thread arenas kept from freed tensors
        env.setdefault("MALLOC_MMAP_THRESHOLD_", "65536")
    env["PYTHONUNBUFFERED"] = "1"
    if node is not None:  # the runner's node rank, recorded in placement.json (torchrun's GROUP_RANK may differ)
        env["RUNNER_NODE_RANK"] = str(node.node_rank)
    return env


def _rank_logs(run_dir: Path) -> dict[int, str]:
    return {int(p.stem[4:]): p.read_text(encoding="utf-8", errors="replace")
            for p in (run_dir / "logs").glob("rank*.log") if p.stem[4:].isdigit()}


def classify_failure(run_dir: Path, exit_code: int, *, world_size: int,
                     launcher_log: str = "launcher.log") -> tuple[str, str, dict | None]:
    """(status, cause, diagnosis) for a run that exited non-zero, from its rank logs and trace/.

    NCCL watchdog timeouts with flight-recorder dumps -> 'hang' (who is missing from which
    collective); allocator failures -> 'oom' (with the allocator's own numbers); else 'crash'
    naming the first rank that raised."""
    logs = _rank_logs(run_dir)
    root_rank, root_exit = _torchrun_root_cause(run_dir / "logs" / launcher_log)
    if root_rank is not None and root_rank in logs:  # look at the first failed rank first
        logs = {root_rank: logs[root_rank], **{r: t for r, t in logs.items() if r != root_rank}}
    dumps = load_flight_recorder_dumps(run_dir / "trace")
    if dumps or any(WATCHDOG_PATTERN.search(t) for t in logs.values()):
        cause, diagnosis = diagnose_from_flight_recorder(
            {r: summarize_flight_recorder(d) for r, d in dumps.items()}, world_size=world_size)
        return "hang", Message(N_("collective timeout (NCCL watchdog): %(cause)s"), cause=cause), diagnosis
    if root_exit is not None and root_exit < 0:
        sig = signal.Signals(-root_exit).name
        cause = (Message(N_("rank %(rank)s killed by %(signal)s (often the host's OOM killer; see dmesg)"), rank=root_rank,
                         signal=sig) if sig == "SIGKILL" else
                 Message(N_("rank %(rank)s killed by %(signal)s"), rank=root_rank, signal=sig))
        return "crash", cause, {"rank": root_rank, "signal": sig}
    for rank, text in logs.items():
        m = OOM_PATTERN.search(text)
        if m:
            line = text[m.start():].splitlines()[0]
            return "oom", f"rank {rank}: {line[:400]}", {"rank": rank, "message": line[:2000]}
    for rank, text in logs.items():
        found = EXCEPTION_PATTERN.findall(text)
        if found:
            return "crash", f"rank {rank}: {found[-1][:300]}", {"rank": rank, "exception": found[-1][:2000]}
    if exit_code < 0:
        return "crash", Message(N_("killed by signal %(signal)s"), signal=signal.Signals(-exit_code).name), None
    return "crash", Message(N_("exit code %(code)s, no exception in the rank logs"), code=exit_code), None


_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(?P<rank>\d+).*?exitcode\s*:\s*(?P<exit>-?\d+)", re.DOTALL)


def _torchrun_root_cause(launcher_log: Path) -> tuple[int | None, int | None]:
    """(rank, exit code) of torchrun's "Root Cause (first observed failure)" block, if any."""
    try:
        m = _ROOT_CAUSE.search(launcher_log.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return None, None
    return (int(m["rank"]), int(m["exit"])) if m else (None, None)


def load_flight_recorder_dumps(trace_dir: Path) -> dict[int, dict]:
    """trace/flight_recorder_rank<r> pickles written by PyTorch's NCCL watchdog -> {rank: dump}.
    Unreadable dumps are skipped (the caller still sees the watchdog message)."""
    dumps = {}
    for path in trace_dir.glob("flight_recorder_rank*"):
        suffix = path.name.removeprefix("flight_recorder_rank")
        if not suffix.isdigit():
            continue
        try:
            dumps[int(suffix)] = pickle.loads(path.read_bytes())  # written by torch itself, in our run dir
        except Exception:  # noqa: BLE001 - a truncated dump must not stop classification
            continue
    return dumps


def _rank_processes(proc: subprocess.Popen) -> dict[int, psutil.Process]:
    ranks = {}
    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return ranks
    for child in children:
        try:
            if "runner.train" in " ".join(child.cmdline()):
                ranks[int(child.environ().get("RANK", "-1"))] = child
        except (psutil.Error, ValueError):
            continue
    return ranks


# psutil status -> the kernel's one-letter state (ps STAT column)
PROCESS_STATE_LETTERS = {"running": "R", "sleeping": "S", "disk-sleep": "D", "stopped": "T", "tracing-stop": "t",
                         "zombie": "Z", "dead": "X", "idle": "I"}


def describe_process_state(process: psutil.Process) -> str:
    """A rank's process state as words, e.g. "stopped (state T)" for a SIGSTOPped rank; "gone"
    once it has exited."""
    try:
        status = process.status()
    except psutil.NoSuchProcess:
        return "gone (exited)"
    except psutil.Error as e:
        return f"state unknown ({type(e).__name__})"
    letter = PROCESS_STATE_LETTERS.get(status)
    return f"{status} (state {letter})" if letter else str(status)


def diagnose_stall(proc: subprocess.Popen, run_dir: Path, *, world_size: int) -> tuple[str, dict]:
    """Dump every rank's Python stack with py-spy into trace/stacks_rank<r>.txt and say which
    rank is not in the collective the others wait in."""
    pyspy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if pyspy is None:
        return "py-spy not found: no stack dumps", {"source": "py-spy", "ranks": {}}
    summaries = {}
    for rank, child in sorted(_rank_processes(proc).items()):
        try:
            out = subprocess.run([pyspy, "dump", "--pid", str(child.pid)], capture_output=True, text=True,
                                 timeout=60, check=False)
        except subprocess.TimeoutExpired:
            summaries[rank] = {"blocked_in": None, "frame": None, "user_frame": None,
                               "process_state": describe_process_state(child), "stack_error": "timed out after 60 s"}
            continue
        (run_dir / "trace" / f"stacks_rank{rank}.txt").write_text(out.stdout + out.stderr, encoding="utf-8")
        summary = summarize_stack(parse_pyspy_dump(out.stdout))
        if summary["blocked_in"] is None:  # no stack: say what is known of the process instead
            summary["process_state"] = describe_process_state(child)
            error = next((ln.strip() for ln in (out.stderr or out.stdout).splitlines() if ln.strip()), "")
            summary["stack_error"] = error[:200] or f"exit code {out.returncode}, no frames"
        summaries[rank] = summary
    cause, diagnosis = diagnose_from_stacks(summaries)
    missing = sorted(set(range(world_size)) - set(summaries))
    if missing:
        cause += f"; no stack for rank(s) {', '.join(map(str, missing))}"
    return cause, diagnosis


def load_json(path: Path) -> dict:
    """Read one of our JSON artifacts (a JSON object); ConfigError naming the file when missing,
    not a regular file (a FIFO would block), malformed, nested too deeply, holding an integer past
    Python's 4,300-digit limit, or not an object."""
    try:
        text = read_regular_text(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: missing; is this a campaign directory written by `runner all`?") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e.reason}); the campaign is damaged") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror or e}); the campaign is damaged") from None
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid JSON ({e}); the campaign is damaged") from None
    except ValueError:  # an integer past Python's 4,300-digit conversion limit
        raise ConfigError(f"{path}: holds an integer of more than 4,300 digits, which no field of ours takes; "
                          "the campaign is damaged") from None
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested too deeply to read; the campaign is damaged") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}; the campaign is damaged")
    return data


def archive_attempt(run_dir: Path) -> None:
    """Move a previous attempt's artifacts (metrics, logs, trace, status) to attempt-<n>/ so a
    re-run starts clean and nothing measured is lost."""
    old = [run_dir / n for n in ("metrics", "logs", "trace", "tables", "status.json", "run_info.json") if (run_dir / n).exists()]
    if not old:
        return
    n = 1
    while (run_dir / f"attempt-{n}").exists():
        n += 1
    (run_dir / f"attempt-{n}").mkdir()
    for path in old:
        os.replace(path, run_dir / f"attempt-{n}" / path.name)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True, kw_only=True)
class Watchdog:
    """deadline_s: the run's hard limit. Once three steps are recorded the deadline tightens to
    the time so far + remaining steps x the observed step time x ``deadline_factor`` +
    ``deadline_margin_s``. stall_timeout_s: no new step row for this long (after the first
    row) means a hang; startup_timeout_s: the same before the first row."""

    deadline_s: float
    stall_timeout_s: float
    startup_timeout_s: float
    deadline_factor: float = 3.0
    deadline_margin_s: float = 120.0
    poll_s: float = 1.0


def _metrics_bytes(run_dir: Path) -> int:
    """Bytes over all ranks' metrics files here (stat only): the watchdog's sign of life."""
    return sum(p.stat().st_size for p in (run_dir / "metrics").glob("rank*.jsonl") if p.stem[4:].isdigit())


def compress_traces(run_dir: Path) -> list[Path]:
    """Gzip every profiler trace the ranks exported (trace/profile_rank<r>.json ->
    .json.gz), after the run, so compression never sits inside the timed loop. Atomic per
    file: the .json is removed only once its .gz is complete."""
    done = []
    for path in sorted((run_dir / "trace").glob("profile_rank*.json")):
        if not re.fullmatch(r"profile_rank\d+\.json", path.name):
            continue
        target = path.with_name(path.name + ".gz")
        with path.open("rb") as src, atomic_writer(target) as raw, \
                gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        path.unlink()
        done.append(target)
    return done


INGEST_LOG = "ingest.log"


def ingest_traces(run_dir: Path, spec: RunSpec) -> list[Path]:
    """Write the run's section-5 tables (ingest.io.ingest_run_traces -> <run>/tables/) so
    `report build` reads them instead of the raw traces. Any failure is a warning, in
    logs/ingest.log and on stderr, never a failed run: the note then analyses the traces itself."""
    from ingest.io import ingest_run_traces

    try:
        return ingest_run_traces(run_dir, name=spec.name, pp_degree=spec.pp_degree,
                                 num_microbatches=spec.num_microbatches)
    except Exception as e:  # noqa: BLE001 - the run is done and recorded; its tables are an optimisation
        text = f"warning: {spec.name}: trace tables not written ({type(e).__name__}: {e}); " \
               "`report build` will analyse the traces itself"
        print(f"runner: {text}", file=sys.stderr)
        try:
            with (run_dir / "logs" / INGEST_LOG).open("a", encoding="utf-8") as log:
                log.write(text + "\n")
        except OSError:
            pass
        return []


def run_one(spec: RunSpec, *, run_dir: Path, watchdog: Watchdog, master_port: int, node: NodeLaunch | None = None,
            run_index: int = 0, progress: ProgressReporter | None = None,
            on_launch=None) -> RunStatus:
    """Launch one run, supervise it, classify how it ended and write status.json.

    A stall (no new step row within the watchdog's limits) dumps every rank's Python stack
    (py-spy) into trace/ before the group is killed; a deadline kills it as 'timeout'.
    Any exception of the runner's own (KeyboardInterrupt from SIGINT, or SIGTERM turned into it
    by the CLI; an OSError such as a full disk) kills the group, records 'interrupted' with the
    cause (naming the file for an I/O error) and is re-raised. ``on_launch(pid)`` is called once
    torchrun started (its pid is its session id; runner.owner records it). With ``node`` (multi-node), this node's agent only: node K > 0
    writes logs/launcher_node<K>.log and status_node<K>.json, never node 0's files.
    ``progress`` (runner.progress) is updated each poll and closed when the run ends.
    """
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    (run_dir / "trace").mkdir(exist_ok=True)
    cmd = build_command(spec, run_dir=run_dir, master_port=master_port, node=node, run_index=run_index)
    status_path = status_path_for(run_dir, node)
    started, t0 = _now(), time.monotonic()
    proc, ended = None, None
    try:
        with (run_dir / "logs" / launcher_log_name(node)).open("w", encoding="utf-8") as log:
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                    env=build_run_env(spec, run_dir=run_dir, node=node), start_new_session=True)
            if on_launch is not None:
                on_launch(proc.pid)
            status, cause, code, diagnosis = _supervise(proc, spec, run_dir=run_dir, watchdog=watchdog, node=node,
                                                        run_index=run_index, progress=progress)
        if status == "ok" and code != 0:
            status, cause, diagnosis = classify_failure(run_dir, code, world_size=spec.world_size,
                                                        launcher_log=launcher_log_name(node))
        ended = f"{status}: {cause}" if cause else status
        compress_traces(run_dir)
        written = _write_status(run_dir, spec, status, cause, code, started, t0, cmd, diagnosis, path=status_path)
        if node is None or node.node_rank == 0:
            ingest_traces(run_dir, spec)
        return written
    except BaseException as e:  # any exit of the runner's own (signal, full disk, bug) stops the run's group
        if proc is not None:
            _kill_group(proc)
        cause = (Message(N_("runner interrupted (SIGINT/SIGTERM)")) if isinstance(e, KeyboardInterrupt)
                 else Message(N_("runner stopped by an error: %(error)s"), error=describe_error(e)))
        if ended:
            cause = Message(N_("%(cause)s; the run had ended: %(ended)s"), cause=cause, ended=ended)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            from runner.owner import free_reserve

            free_reserve(run_dir.parent)  # room for this status.json
        try:  # on a full disk this may fail too; the run then stays without status (re-run by --resume)
            _write_status(run_dir, spec, "interrupted", cause, proc.returncode if proc else None,
                          started, t0, cmd, None, path=status_path)
        except OSError:
            pass
        raise


def describe_error(e: BaseException) -> str:
    """'<file>: No space left on device' for an OSError (the file named), else 'Type: message'."""
    if isinstance(e, OSError):
        return f"{e.filename}: {e.strerror or e}" if e.filename else f"{e.strerror or e}"
    return f"{type(e).__name__}: {e}"


def _supervise(proc: subprocess.Popen, spec: RunSpec, *, run_dir: Path, watchdog: Watchdog,
               node: NodeLaunch | None = None, run_index: int = 0, progress: ProgressReporter | None = None):
    """Wait for the run, enforcing the watchdog and showing ``progress``. -> (status, cause, exit
    code, diagnosis). Each poll reads only the rows appended since the last one (MetricsTail)."""
    tail = MetricsTail(run_dir)
    try:
        return _watch(proc, spec, run_dir=run_dir, watchdog=watchdog, node=node, run_index=run_index,
                      tail=tail, progress=progress)
    finally:
        if progress is not None:
            progress.close()


def _watch(proc, spec, *, run_dir, watchdog, node, run_index, tail, progress):
    t0 = time.monotonic()
    seen, last_progress, deadline, first_row_at = -1, t0, watchdog.deadline_s, None
    recent: list[dict] = []

    def poll_rows() -> int:
        nonlocal recent
        recent = (recent + tail.poll())[-RECENT_STEPS:]
        if progress is not None and tail.num_rows:
            progress.update(summarize_progress(recent, run=spec.name, num_steps_done=tail.num_rows,
                                               num_steps_total=spec.fixed.steps))
        return tail.num_rows

    while True:
        try:
            code = proc.wait(timeout=watchdog.poll_s)
            poll_rows()  # the rows written since the last poll, for the final progress line
            return "ok", None, code, None
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        size, rows = _metrics_bytes(run_dir), poll_rows()
        if size != seen:
            seen, last_progress = size, now
        if rows and first_row_at is None:
            first_row_at = now
        if rows >= 3 and deadline == watchdog.deadline_s:
            per_step = (now - first_row_at) / (rows - 1)
            derived = (now - t0) + (spec.fixed.steps - rows) * per_step * watchdog.deadline_factor
            deadline = min(watchdog.deadline_s, derived + watchdog.deadline_margin_s)
        limit = watchdog.stall_timeout_s if size > 0 else watchdog.startup_timeout_s
        if now - last_progress > limit and node is not None and size == 0 and not _rank_processes(proc):
            # torchrun's agent is still waiting in the c10d rendezvous: a node is missing, not a hang in training
            _kill_group(proc)
            return "hang", Message(N_("no rank started within %(limit)s s: the c10d rendezvous at %(endpoint)s did not "
                                      "complete; are all %(num)s nodes running `runner all` with the same matrix and "
                                      "--rdzv-endpoint?"), limit=f"{limit:.0f}", endpoint=f"{node.rdzv_host}:"
                                   f"{node.port_for(run_index)}", num=node.nnodes), None, {"source": "rendezvous"}
        if now - last_progress > limit:
            cause, diagnosis = diagnose_stall(proc, run_dir, world_size=spec.world_size)
            _kill_group(proc)
            dumps = load_flight_recorder_dumps(run_dir / "trace")
            if dumps:  # the NCCL watchdog fired and dumped, but the ranks never exited
                stacks = diagnosis
                cause, diagnosis = diagnose_from_flight_recorder(
                    {r: summarize_flight_recorder(d) for r, d in dumps.items()}, world_size=spec.world_size)
                diagnosis = {**diagnosis, "stacks": stacks}
            return "hang", Message(N_("no step row for %(limit)s s; %(cause)s"), limit=f"{limit:.0f}", cause=cause), None, diagnosis
        if now - t0 > deadline:
            _kill_group(proc)
            return "timeout", Message(N_("no exit within the %(limit)s s deadline (derived from the observed step time)")
                                      if deadline < watchdog.deadline_s else N_("no exit within the %(limit)s s deadline"),
                                      limit=f"{deadline:.0f}"), None, None


def _kill_group(proc: subprocess.Popen) -> None:
    """Stop torchrun and every rank: SIGTERM to the session and each descendant (ranks may
    sit in process groups of their own), then SIGKILL whatever is left after 10 s."""
    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        for p in tree:
            try:
                p.send_signal(sig)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(tree, timeout=10)
        tree = alive
        if not alive:
            break
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def _write_status(run_dir, spec, status, cause, code, started, t0, cmd, diagnosis, *, path=None) -> RunStatus:
    rs = RunStatus(run=spec.name, status=status, exit_code=code, cause=redact_text(cause) if cause else cause,
                   started_at=started, ended_at=_now(), duration_s=time.monotonic() - t0,
                   command=tuple(redact_text(a) for a in cmd), engine=spec.engine, diagnosis=redact_value(diagnosis))
    write_json_atomic(path or run_dir / "status.json", to_dict(rs))
    return rs
