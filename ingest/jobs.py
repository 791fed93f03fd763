"""A folder of logs -> jobs: which files belong together, what each job's own files say, what
failed first and what followed, and (for hangs) which rank is missing from the collective.

Pure functions over the ingest tables (``build_tables`` output or the Parquet files of a tables
dir: every row carries ``source`` and ``line``). Files join one job only on positive evidence
printed in them: a shared NCCL ``commId``/``commHash``, a shared host and pid (NCCL prefixes,
torchrun failure blocks), or per-rank files (``*rank<r>*``) of one run directory; a join whose
files disagree on world size or global batch is refused. Every fact names its source
``file:line``; a fact a job's own files do not state stays ``None`` ("unknown"), never borrowed
from another job. Deliberately not here: wording (report/), reading files (ingest.io), ranking
jobs against each other (unrelated jobs are never compared).
"""
from __future__ import annotations

import functools
import re
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd

from core.formulas import is_finite_number
from core.i18n import Message, MessageList, N_
from ingest.hangs import (diagnose_from_flight_recorder, diagnose_from_stacks, summarize_flight_recorder,
                          user_frame)

# Event kinds (ingest.parsers.failures / nccl / flight_recorder) -> (causal order, label). The order
# is the usual chain: a rank's own error first, then the watchdogs that noticed, then the launcher.
# The labels are catalogue messages (the note translates them).
EVENT_ORDER: dict[str, tuple[int, Message]] = {
    "cuda_oom": (0, Message(N_("CUDA out of memory"))),
    "nccl_warn": (1, Message(N_("NCCL WARN"))),
    "nccl_error": (1, Message(N_("NCCL error raised in torch"))),
    "error_unwind": (2, Message(N_("NCCL error unwind"))),
    "abort_complete": (3, Message(N_("NCCL communicator aborted"))),
    "nccl_timeout": (4, Message(N_("collective timeout (NCCL watchdog)"))),
    "watchdog_exception": (5, Message(N_("watchdog: last enqueued / completed work"))),
    "fr_dump": (6, Message(N_("flight-recorder dump requested"))),
    "timeout_dump": (6, Message(N_("watchdog timeout / dump"))),
    "nccl_failed": (7, Message(N_("NCCL operations failed or timed out"))),
    "process_abort": (8, Message(N_("process taken down"))),
    "watchdog_terminated": (9, Message(N_("watchdog thread terminated"))),
    "agent_failed": (10, Message(N_("torchrun: worker failed"))),
    "child_failed": (11, Message(N_("torchrun ChildFailedError"))),
    "closing_signal": (12, Message(N_("torchrun: closing signal sent to the other workers"))),
}
HANG_EVENTS = frozenset({"nccl_timeout", "watchdog_exception", "fr_dump", "timeout_dump"})
_RANK_FILE = re.compile(r"rank[_-]?(\d+)", re.I)
_FRAME = re.compile(r"^(?P<func>.+?) \((?P<file>[^()]+?)(?::(?P<line>\d+))?\)$")
_ATTEMPT = re.compile(r"attempt[_-]?(\d+)", re.I)


@dataclass(frozen=True, kw_only=True)
class Fact:
    """One thing a job's files state. value None: the job's own files do not say (unknown)."""

    name: str
    value: Any = None
    sources: tuple[str, ...] = ()  # "file:line" (or "file") it was read from, or "--model"
    how: Message | None = None  # how it was derived, when not printed as such


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """One failure line (or a run of identical ones) of a job, cited by file:line."""

    event: str
    label: str
    rank: int | None
    host: str | None
    time: str | None
    detail: str
    source: str
    line: int
    count: int = 1  # identical (event, rank) lines folded into this one
    last_line: int | None = None
    root_cause: bool = False  # torchrun's "Root Cause (first observed failure)"


@dataclass(frozen=True, kw_only=True)
class HangView:
    """Which rank is not in the collective the others wait in, from stacks, flight-recorder
    dumps or watchdog lines (``source``)."""

    source: str  # "py-spy" | "flight-recorder" | "watchdog"
    cause: str
    odd_ranks: tuple[int, ...] = ()
    waiting_ranks: tuple[int, ...] = ()
    odd_collective: str | None = None
    waiting_collective: str | None = None
    seq_num: int | None = None
    frames: tuple[tuple[int, str | None, str | None], ...] = ()  # (rank, collective, user frame "func (file:line)")
    fix: str | None = None
    repeats: str | None = None  # "same" | "different" across attempts, None: one attempt
    attempts: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()  # file:line


@dataclass(frozen=True, kw_only=True)
class Job:
    name: str
    sources: tuple[str, ...]
    kinds: tuple[str, ...]
    joined_by: tuple[str, ...]  # why these files are one job ("commId 0x..", "host-a pid 12")
    facts: Mapping[str, Fact]
    status: str  # "oom" | "hang" | "failed" | "no failure logged" | "unknown"
    first_failure: Evidence | None = None
    chain: tuple[Evidence, ...] = ()
    hang: HangView | None = None
    not_joined: tuple[str, ...] = ()  # joins refused because the files disagree
    has_steps: bool = False

    @property
    def unknown(self) -> tuple[str, ...]:
        """Facts this job's own files do not state."""
        return tuple(n for n, f in self.facts.items() if f.value is None)


FACT_NAMES = ("world_size", "global_batch_size", "seq_length", "num_steps", "step_time_median_s", "samples_per_s",
              "tokens_per_s", "hosts", "ranks_seen", "gpus", "time_range", "nccl_version", "torch_version",
              "step_time_by_rank", "timers_ms", "nccl_transports", "nccl_socket")


def _rows(tables: Mapping[str, pd.DataFrame], name: str) -> list[dict[str, Any]]:
    """A table's rows as dicts, a missing value (NaN, NA, NaT) as None."""
    df = tables.get(name)
    if df is None or df.empty:
        return []
    values = df.astype(object).where(df.notna(), None)  # Python objects: numbers need no boxing per cell
    columns = list(values.columns)
    return [dict(zip(columns, row)) for row in values.to_numpy().tolist()]


@functools.lru_cache(maxsize=1 << 12)
def _file_name(source: Any) -> str:
    return Path(str(source)).name


@functools.lru_cache(maxsize=1 << 12)
def _file_rank(source: Any) -> int | None:
    m = _RANK_FILE.search(_file_name(source))
    return int(m.group(1)) if m else None


def _cite(r: Mapping[str, Any]) -> str:
    return f"{_file_name(r['source'])}:{int(r['line'])}" if r.get("line") is not None else _file_name(r["source"])


def _int(v: Any) -> int | None:
    try:
        return int(float(str(v).replace(",", "").strip()))
    except (TypeError, ValueError):
        return None


def _rank_of(r: Mapping[str, Any]) -> int | None:
    """The record's rank, else the rank in its file name (``stacks_rank3.txt``)."""
    if r.get("rank") is not None:
        return int(r["rank"])
    return _file_rank(r["source"])


def _run_dir(source: str) -> str:
    p = Path(source).parent
    return str(p.parent if p.name in ("logs", "trace", "metrics", "stacks") else p)


# ---------------------------------------------------------------- grouping


def compute_file_facts(source: str, rows: Iterable[Mapping[str, Any]]) -> dict[str, Fact]:
    """What one file states about its job: world size, global batch, sequence length (each with
    file:line). Used to refuse a join between files that disagree."""
    out: dict[str, Fact] = {}
    for r in rows:
        key = str(r.get("key") or "")
        for name, keys in (("world_size", ("megatron.world_size", "world_size")),
                           ("global_batch_size", ("megatron.global_batch_size",)),
                           ("seq_length", ("megatron.seq_length",))):
            if key in keys and name not in out and _int(r.get("value")) is not None:
                out[name] = Fact(name=name, value=_int(r["value"]), sources=(_cite(r),))
        if r.get("table") == "steps" and r.get("global_batch_size") is not None and "global_batch_size" not in out:
            out["global_batch_size"] = Fact(name="global_batch_size", value=int(r["global_batch_size"]), sources=(_cite(r),))
    comms = [r for r in rows if r.get("record") in ("comm_init", "init_complete") and r.get("num_ranks")]
    if comms and "world_size" not in out:
        top = max(comms, key=lambda r: int(r["num_ranks"]))
        out["world_size"] = Fact(name="world_size", value=int(top["num_ranks"]), sources=(_cite(top),),
                                 how=Message(N_("the largest NCCL communicator in the log")))
    traces = [r for r in rows if r.get("record") == "trace_meta" and r.get("world_size")]
    if traces and "world_size" not in out:
        out["world_size"] = Fact(name="world_size", value=int(traces[0]["world_size"]), sources=(_cite(traces[0]),),
                                 how=Message(N_("the trace's distributedInfo")))
    return out


def _link_keys(source: str, rows: list[dict[str, Any]]) -> set[str]:
    keys: set[str] = set()
    for r in rows:
        for col in ("comm_id", "comm_hash"):
            if r.get(col) and str(r[col]) not in ("0x0", "0"):
                keys.add(f"{col.replace('_id', 'Id').replace('_hash', 'Hash')} {r[col]}")
        if r.get("host") and r.get("pid") is not None:
            keys.add(Message(N_("%(host)s pid %(pid)s"), host=r["host"], pid=int(r["pid"])))
        if r.get("record") == "trace_meta" and r.get("pg_signature"):
            keys.add(Message(N_("profiler traces of %(signature)s"), signature=r["pg_signature"]))  # every rank of one job writes the same
    if _RANK_FILE.search(Path(source).name):
        keys.add(Message(N_("per-rank files of %(folder)s"), folder=_run_dir(source)))
    return keys


def compute_jobs(tables: Mapping[str, pd.DataFrame], *, model: Mapping[str, Any] | None = None) -> list[Job]:
    """Ingest tables (``files`` plus the record tables) -> jobs, in the order of their first file.
    ``model`` (``--model`` flags) fills what a job's files do not say, cited as ``--model``."""
    files = _rows(tables, "files")
    by_source: dict[str, list[dict[str, Any]]] = {str(f["source"]): [] for f in files}
    timers = tables.get("timers")  # the largest table: kept a DataFrame, only the timer means need it
    timers_by_source = ({str(s): df for s, df in timers.groupby("source", sort=False)}
                        if timers is not None and not timers.empty else {})
    for name in ("steps", "memory", "timers", "comm_topology", "collectives", "events", "env", "kernels", "stacks",
                 "flops_profile", "traces"):
        if name == "timers":
            for source in timers_by_source:
                by_source.setdefault(source, [])
            continue
        for r in _rows(tables, name):
            r["table"] = name
            by_source.setdefault(str(r.get("source")), []).append(r)
    sources = list(by_source)
    facts = {s: compute_file_facts(s, rows) for s, rows in by_source.items()}
    parent = {s: s for s in sources}

    def find(s: str) -> str:
        while parent[s] != s:
            parent[s] = parent[parent[s]]
            s = parent[s]
        return s

    group_facts = {s: dict(facts[s]) for s in sources}
    trace_ranks = {s: {int(r["rank"]) for r in by_source[s] if r.get("record") == "trace_meta" and r.get("rank") is not None}
                   for s in sources}
    joined: dict[str, set[str]] = defaultdict(set)
    refused: dict[str, list[str]] = defaultdict(list)
    owners: dict[str, str] = {}
    for s in sources:
        for key in sorted(_link_keys(s, by_source[s])):
            if key not in owners:
                owners[key] = s
                continue
            a, b = find(owners[key]), find(s)
            if a == b:
                joined[a].add(key)
                continue
            clash = [Message(N_("%(fact)s: %(value)s (%(sources)s) vs %(other)s (%(other_sources)s)"), fact=n,
                             value=group_facts[a][n].value, sources=", ".join(group_facts[a][n].sources),
                             other=group_facts[b][n].value, other_sources=", ".join(group_facts[b][n].sources))
                     for n in group_facts[a] if n in group_facts[b] and group_facts[a][n].value != group_facts[b][n].value]
            both = trace_ranks[a] & trace_ranks[b]
            if both:  # two traces of one rank are two runs (or attempts), never one job
                clash.append(Message(N_("both hold a profiler trace of rank(s) %(ranks)s"), ranks=_ranges(sorted(both))))
            if clash:
                refused[a].append(Message(N_("not joined with %(file)s despite %(key)s: %(clashes)s"), file=Path(b).name,
                                          key=key, clashes=MessageList(clash, "; ")))
                continue
            parent[b] = a
            trace_ranks[a] |= trace_ranks[b]
            group_facts[a] = {**group_facts[b], **group_facts[a]}
            joined[a] |= joined.pop(b, set()) | {key}
            refused[a] += refused.pop(b, [])
    groups: dict[str, list[str]] = {}
    for s in sources:
        groups.setdefault(find(s), []).append(s)
    kinds = {str(f["source"]): str(f["kind"]) for f in files}
    jobs = []
    names: Counter = Counter()
    for root, members in groups.items():
        rows = [r for s in members for r in by_source[s]]
        name = Path(members[0]).stem if len(members) == 1 else f"{Path(members[0]).stem} (+{len(members) - 1})"
        names[name] += 1
        if names[name] > 1:
            name = f"{name}#{names[name]}"
        jobs.append(build_job(name=name, sources=members, kinds=[kinds.get(s, "unknown") for s in members], rows=rows,
                              joined_by=sorted(joined.get(root, set())), not_joined=refused.get(root, []), model=model,
                              file_facts=[facts[s] for s in members],
                              timers=[timers_by_source[s] for s in members if s in timers_by_source]))
    return jobs


# ---------------------------------------------------------------- one job


def build_job(*, name: str, sources: list[str], kinds: list[str], rows: list[dict[str, Any]],
              joined_by: list[str], not_joined: list[str], model: Mapping[str, Any] | None,
              file_facts: Sequence[Mapping[str, Fact]], timers: Sequence[pd.DataFrame] = ()) -> Job:
    """One job's facts, failure chain and hang view from its own rows only. file_facts: each
    source's compute_file_facts; timers: its sources' timers rows, a DataFrame per source."""
    facts: dict[str, Fact] = {}
    for per_file in file_facts:
        for n, f in per_file.items():
            facts.setdefault(n, f)
    for n in ("world_size", "global_batch_size", "seq_length"):
        if n not in facts and model and model.get(n):
            facts[n] = Fact(name=n, value=int(model[n]), sources=("--model",))
    # a step time must be a positive finite number to give a median and a rate (a log can print 0 or inf)
    steps = [r for r in rows if r["table"] == "steps" and is_finite_number(r.get("step_time_s"))
             and r["step_time_s"] > 0]
    if steps:
        times = [float(r["step_time_s"]) for r in steps]
        cite = (f"{_file_name(steps[0]['source'])}:{steps[0]['line']}-{steps[-1]['line']}",)
        med = statistics.median(times)
        facts["num_steps"] = Fact(name="num_steps", value=len(steps), sources=cite)
        facts["step_time_median_s"] = Fact(name="step_time_median_s", value=med, sources=cite)
        gbs, seq = facts.get("global_batch_size"), facts.get("seq_length")
        if gbs:
            facts["samples_per_s"] = Fact(name="samples_per_s", value=gbs.value / med, sources=gbs.sources + cite,
                                          how=Message(N_("global batch ÷ median step time")))
        if gbs and seq:
            facts["tokens_per_s"] = Fact(name="tokens_per_s", value=gbs.value * seq.value / med,
                                         sources=gbs.sources + seq.sources + cite,
                                         how=Message(N_("global batch × sequence length ÷ median step time")))
    hosts = sorted({str(r["host"]) for r in rows if r.get("host")})
    if hosts:
        facts["hosts"] = Fact(name="hosts", value=", ".join(hosts[:8]) + (f" (+{len(hosts) - 8})" if len(hosts) > 8 else ""),
                              sources=tuple(dict.fromkeys(_cite(r) for r in rows if r.get("host")))[:3])
    ranks = sorted({rk for r in rows if r["table"] in ("events", "stacks", "steps", "comm_topology", "collectives", "traces")
                    and (rk := _rank_of(r)) is not None})
    if ranks:
        ranked = {_file_name(r["source"]) for r in rows if _rank_of(r) is not None}
        ranked |= {_file_name(t["source"].iat[0]) for t in timers
                   if _file_rank(t["source"].iat[0]) is not None or "rank" in t and t["rank"].notna().any()}
        facts["ranks_seen"] = Fact(name="ranks_seen", value=_ranges(ranks), sources=tuple(sorted(ranked)))
    env = {}
    for r in rows:
        if r["table"] == "env" and r.get("key"):
            env.setdefault(str(r["key"]), r)
    for n, key in (("gpus", "gpu_models"), ("nccl_version", "nccl_version"), ("torch_version", "torch_version")):
        if key in env:
            facts[n] = Fact(name=n, value=str(env[key]["value"]), sources=(_cite(env[key]),))
    if "nccl_version" not in facts:
        v = next((r for r in rows if r.get("record") == "nccl_version"), None)
        if v is not None and (v.get("value") or v.get("version")):
            facts["nccl_version"] = Fact(name="nccl_version", value=str(v.get("value") or v.get("version")), sources=(_cite(v),))
    times = [r for r in rows if r.get("time") and r["table"] in ("events", "steps")]
    if times:
        facts["time_range"] = Fact(name="time_range", value=f"{times[0]['time']} … {times[-1]['time']}" if len(times) > 1
                                   else str(times[0]["time"]), sources=(_cite(times[0]), _cite(times[-1])))
    facts.update(compute_slow_run_facts(rows, num_nodes=len(hosts) or None, timers=timers))
    chain = compute_failure_chain(rows)
    first = compute_first_failure(chain)
    hang = compute_hang(rows, world_size=facts["world_size"].value if "world_size" in facts else None)
    events = {e.event for e in chain}
    status = ("oom" if "cuda_oom" in events else "hang" if events & HANG_EVENTS or (hang and hang.odd_ranks)
              else "failed" if events else "no failure logged" if steps or any(r["table"] == "traces" for r in rows)
              else "unknown")
    return Job(name=name, sources=tuple(sources), kinds=tuple(kinds), joined_by=tuple(joined_by),
               facts={n: facts.get(n, Fact(name=n)) for n in FACT_NAMES}, status=status, first_failure=first,
               chain=tuple(chain), hang=hang, not_joined=tuple(not_joined), has_steps=bool(steps))


def _ranges(nums: list[int]) -> str:
    out, start = [], None
    for i, n in enumerate(nums):
        if start is None:
            start = n
        if i + 1 == len(nums) or nums[i + 1] != n + 1:
            out.append(str(start) if start == n else f"{start}–{n}")
            start = None
    return ", ".join(out)


def compute_failure_chain(rows: Iterable[Mapping[str, Any]]) -> list[Evidence]:
    """The job's failure events in causal order (EVENT_ORDER; then rank, file order), identical
    (event, rank, file) lines folded into one cited line with a count."""
    folded: dict[tuple, Evidence] = {}
    for r in rows:
        if r.get("table") != "events" or r.get("event") not in EVENT_ORDER:
            continue
        key = (r["event"], _rank_of(r), str(r["source"]), r.get("seq_num"))
        if key in folded:
            e = folded[key]
            folded[key] = Evidence(**{**e.__dict__, "count": e.count + 1, "last_line": int(r["line"])})
            continue
        folded[key] = Evidence(event=r["event"], label=EVENT_ORDER[r["event"]][1], rank=_rank_of(r),
                               root_cause=bool(r.get("root_cause")),
                               host=r.get("host"), time=str(r["time"]) if r.get("time") else None,
                               detail=" ".join(str(r.get("detail") or "").split())[:240]
                               or (f"exitcode {_int(r['exitcode'])}" if r.get("exitcode") is not None else ""),
                               source=_file_name(r["source"]), line=int(r.get("line") or 0))
    return sorted(folded.values(), key=lambda e: (EVENT_ORDER[e.event][0], e.time or "", e.source, e.line))


def compute_first_failure(chain: list[Evidence]) -> Evidence | None:
    """What failed first: the earliest event in causal order; among torchrun's failures the one it
    marks as root cause (first to exit)."""
    if not chain:
        return None
    head = chain[0]
    if head.event == "child_failed":
        return next((e for e in chain if e.event == "child_failed" and e.root_cause), head)
    return head


# ---------------------------------------------------------------- hangs


def _frames(text: str | None) -> list[dict[str, Any]]:
    out = []
    for part in str(text or "").split(" <- "):
        m = _FRAME.match(part.strip())
        if m:
            out.append({"func": m["func"], "file": m["file"], "line": int(m["line"]) if m["line"] else None})
    return out


def compute_hang(rows: list[dict[str, Any]], *, world_size: int | None) -> HangView | None:
    """The missing rank, from py-spy stacks (preferred: they name the Python line), else
    flight-recorder entries, else watchdog lines. None when the job has none of them."""
    stacks = [r for r in rows if r["table"] == "stacks" and r.get("record") == "pyspy_thread"]
    by_attempt: dict[str, dict[int, dict]] = defaultdict(dict)
    for r in stacks:
        rank = _rank_of(r)
        if rank is None:
            continue
        m = _ATTEMPT.search(str(r["source"]))
        per = by_attempt[m.group(0) if m else ""]
        if rank in per and r.get("thread_name") != "MainThread":
            continue  # the main thread's stack is the one that issued the collective
        frames = _frames(r.get("frames"))
        per[rank] = {"blocked_in": r.get("collective") or (frames[0]["func"] if frames else None),
                     "frame": r.get("collective_frame") or r.get("top_frame"), "user_frame": user_frame(frames),
                     "cite": _cite(r)}
    if by_attempt:
        views = [_hang_from_stacks(per, world_size=world_size) for _, per in sorted(by_attempt.items())]
        view = views[-1]
        if len(views) > 1:
            same = all((v.odd_ranks, v.odd_collective, v.frames and v.frames[0][2]) ==
                       (view.odd_ranks, view.odd_collective, view.frames and view.frames[0][2]) for v in views)
            view = HangView(**{**view.__dict__, "repeats": "same" if same else "different",
                               "attempts": tuple(a or "attempt" for a in sorted(by_attempt))})
        return view
    fr = [r for r in rows if r["table"] == "collectives" and r.get("record") == "fr_entry"]
    if fr:
        per_rank: dict[int, dict] = defaultdict(lambda: {"entries": []})
        for r in fr:
            per_rank[_rank_of(r) or 0]["entries"].append(r)
        summaries = {rk: summarize_flight_recorder(d) for rk, d in per_rank.items()}
        cause, diag = diagnose_from_flight_recorder(summaries, world_size=world_size or (max(summaries) + 1))
        odd = tuple(diag.get("behind_ranks", [])) + tuple(diag.get("missing_ranks", []))
        return HangView(source="flight-recorder", cause=cause, odd_ranks=odd, seq_num=diag.get("max_seq_id"),
                        waiting_ranks=tuple(r for r in summaries if r not in odd),
                        evidence=tuple(dict.fromkeys(_cite(r) for r in fr))[:4],
                        fix=Message(_FIX) if odd else None)
    return _hang_from_watchdog(rows, world_size=world_size)


_FIX = N_("a collective must be called by every rank of its process group, in the same order: call it on every "
          "rank (take it out of the rank-conditional branch), or use a point-to-point send/recv for data only one rank needs")


def describe_fix(*, odd: Sequence[int], collective: Any, where: Any, waiting: Sequence[int], majority: Any) -> Message:
    """The fix of a hang whose odd ranks called another collective than the others: who called
    what where, then _FIX."""
    return Message(N_("rank(s) %(odd)s called %(collective)s at %(where)s while rank(s) %(waiting)s wait in "
                      "%(majority)s: %(fix)s"), odd=_ranges(list(odd)), collective=collective, where=where,
                   waiting=_ranges(list(waiting)), majority=majority, fix=Message(_FIX))


def _hang_from_stacks(per: dict[int, dict], *, world_size: int | None) -> HangView:
    cause, diag = diagnose_from_stacks({r: {k: v for k, v in s.items() if k != "cite"} for r, s in per.items()})
    odd = tuple(diag.get("odd_ranks") or ())
    missing = tuple(sorted(set(range(world_size)) - set(per))) if world_size else ()
    waiting = tuple(sorted(set(per) - set(odd)))
    odd_coll = per[odd[0]]["blocked_in"] if odd else None
    majority = diag.get("majority_blocked_in")
    if missing:
        cause = MessageList([cause, Message(N_("no stack for rank(s) %(ranks)s (of world size %(world_size)s)"),
                                            ranks=_ranges(list(missing)), world_size=world_size)], "; ")
    frames = tuple((r, per[r]["blocked_in"], per[r]["user_frame"] or per[r]["frame"]) for r in (*odd, *waiting))
    fix = None
    if odd and majority:
        where = per[odd[0]]["user_frame"] or per[odd[0]]["frame"]
        fix = describe_fix(odd=odd, collective=odd_coll, where=where, waiting=waiting, majority=majority)
    return HangView(source="py-spy", cause=cause, odd_ranks=odd, waiting_ranks=waiting, odd_collective=odd_coll,
                    waiting_collective=majority, frames=frames, fix=fix,
                    evidence=tuple(per[r]["cite"] for r in sorted(per)))


def _hang_from_watchdog(rows: list[dict[str, Any]], *, world_size: int | None) -> HangView | None:
    timeouts = [r for r in rows if r.get("table") == "events" and r.get("event") == "nccl_timeout"]
    marks = [r for r in rows if r.get("table") == "events" and r.get("event") == "watchdog_exception"]
    if not timeouts and not marks:
        return None
    seqs = Counter(int(r["seq_num"]) for r in timeouts + marks if r.get("seq_num") is not None)
    seq = seqs.most_common(1)[0][0] if seqs else None
    op = next((r.get("op_type") for r in timeouts if r.get("op_type")), None)
    reported = sorted({rk for r in timeouts + marks if (rk := _rank_of(r)) is not None})
    what = Message(N_("a collective")) if op is None else op
    parts = [Message(N_("rank(s) %(ranks)s timed out waiting in %(collective)s #%(seq)s"), ranks=_ranges(reported),
                     collective=what, seq=seq) if seq is not None else
             Message(N_("rank(s) %(ranks)s timed out waiting in %(collective)s"), ranks=_ranges(reported), collective=what)]
    for r in marks[:3]:
        parts.append(Message(N_("rank %(rank)s (PG %(pg)s): last enqueued #%(enqueued)s, last completed #%(completed)s"),
                             rank=_rank_of(r), pg=_int(r.get("pg_id")), enqueued=_int(r.get("last_enqueued_seq")),
                             completed=_int(r.get("last_completed_seq"))))
    absent = sorted(set(range(world_size)) - set(reported)) if world_size else []
    if absent:
        parts.append(Message(N_("no watchdog line from rank(s) %(ranks)s: the rank that never entered #%(seq)s is "
                                "among them (its own log or a stack dump would say where it is)"),
                             ranks=_ranges(absent), seq=seq))
    elif not world_size:
        parts.append(Message(N_("world size unknown: the rank that never entered the collective cannot be named from "
                                "these lines")))
    # attempts: the same rank timing out more than once (torchrun restarts)
    per_rank: dict[int, list[tuple]] = defaultdict(list)
    for r in timeouts:
        per_rank[_rank_of(r) or 0].append((r.get("seq_num"), r.get("op_type")))
    repeats = None
    if any(len(v) > 1 for v in per_rank.values()):
        keys = {k for v in per_rank.values() for k in v}
        repeats = "same" if len(keys) == 1 else "different"
    return HangView(source="watchdog", cause=MessageList(parts, "; "), waiting_ranks=tuple(reported), waiting_collective=op,
                    seq_num=seq, repeats=repeats, evidence=tuple(dict.fromkeys(_cite(r) for r in timeouts + marks))[:6])


# ---------------------------------------------------------------- slow runs

STRAGGLER_MIN_EXCESS = 0.05  # a rank's median step time this much above the others' median names it


def compute_slow_run_facts(rows: list[dict[str, Any]], *, num_nodes: int | None,
                           timers: Sequence[pd.DataFrame] = ()) -> dict[str, Fact]:
    """Slow-run facts of one job's rows, each cited file:line: per-rank median step time and
    the straggler (ranks with their own step rows), the mean of each timer (Megatron's
    ``time (ms) |`` lines, DeepSpeed's timers), the NCCL transports, and NCCL over sockets
    (NET/Socket: TCP where InfiniBand, RoCE or NVLink is usually expected)."""
    out: dict[str, Fact] = {}
    per: dict[int, list[float]] = defaultdict(list)
    cites: dict[int, str] = {}
    for r in rows:
        if r["table"] == "steps" and r.get("step_time_s") is not None and (rk := _rank_of(r)) is not None:
            per[rk].append(float(r["step_time_s"]))
            cites.setdefault(rk, _cite(r))
    if len(per) > 1:
        med = {rk: statistics.median(v) for rk, v in sorted(per.items())}
        slow = max(med, key=med.get)
        rest = statistics.median([v for rk, v in med.items() if rk != slow])
        text = MessageList([Message(N_("rank %(rank)s: %(ms)s ms"), rank=rk, ms=f"{v * 1e3:.1f}") for rk, v in med.items()])
        if rest > 0 and med[slow] / rest - 1 >= STRAGGLER_MIN_EXCESS:
            text = MessageList([text, Message(N_("straggler: rank %(rank)s, %(pct)s%% above the others' median"), rank=slow,
                                              pct=f"{100 * (med[slow] / rest - 1):.0f}")], "; ")
        out["step_time_by_rank"] = Fact(name="step_time_by_rank", value=text, sources=tuple(cites.values())[:6])
    per_timer: dict[str, list[float]] = defaultdict(list)
    tcite: dict[str, None] = {}
    for df in timers:  # each source's timers rows, in file order
        t = df["time_s"] if "time_s" in df else pd.Series(None, index=df.index, dtype=object)
        if "time_max_s" in df:
            t = t.where(t.notna(), df["time_max_s"])
        name = df["name"] if "name" in df else pd.Series(None, index=df.index, dtype=object)
        keep = name.notna() & name.astype(str).ne("") & t.notna()
        for key, ms in zip(name[keep].astype(str).tolist(), (t[keep].astype(float) * 1e3).tolist()):
            per_timer[key].append(ms)
        kept = df[keep]
        for source, line in zip(kept["source"], kept["line"] if "line" in kept else [None] * len(kept)):
            if len(tcite) == 3:
                break
            tcite[_cite({"source": source, "line": None if pd.isna(line) else line})] = None
    if per_timer:
        top = sorted(((statistics.mean(v), k) for k, v in per_timer.items()), reverse=True)[:6]
        out["timers_ms"] = Fact(name="timers_ms", value=", ".join(f"{k} {v:.1f} ms" for v, k in top),
                                sources=tuple(tcite), how=Message(N_("mean of each timer over the lines")))
    edges = [r for r in rows if r.get("record") == "transport" and r.get("transport")]
    if edges:
        names = sorted({str(r["transport"]) for r in edges})
        out["nccl_transports"] = Fact(name="nccl_transports", value=", ".join(names),
                                      sources=tuple(dict.fromkeys(_cite(r) for r in edges))[:3])
        sock = [r for r in edges if "Socket" in str(r["transport"])]
        if sock:
            out["nccl_socket"] = Fact(
                name="nccl_socket", sources=tuple(dict.fromkeys(_cite(r) for r in sock))[:3],
                value=Message(N_("%(num)s channel connection(s) over NET/Socket (TCP) between %(num_hosts)s hosts: "
                                 "InfiniBand/RoCE (NET/IB) or NVLink/P2P is usually expected; check NCCL_IB_DISABLE, "
                                 "NCCL_NET and that the IB plugin and devices are found"), num=len(sock), num_hosts=num_nodes)
                if num_nodes and num_nodes > 1 else
                Message(N_("%(num)s channel connection(s) over NET/Socket (TCP): InfiniBand/RoCE (NET/IB) or NVLink/P2P "
                           "is usually expected; check NCCL_IB_DISABLE, NCCL_NET and that the IB plugin and devices are "
                           "found"), num=len(sock)))
    return out
