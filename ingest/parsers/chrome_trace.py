"""Chrome traces a user brings -> records, plus the rank's timeline for ingest.attribution.

A torch.profiler (Kineto) trace gives one ``traces`` record (rank and world size from
``distributedInfo``, else the file name), its ``breakdown`` rows (ingest.traces; without
ProfilerStep marks: steps split by a repeating annotation or kernel pattern, else the whole trace
as one window; the record says which) and an ``env`` record of its NCCL version.
Any other trace (NCCL profiler plugin, a pasted fragment) gives one ``collectives`` record per
event (``b``/``e`` pairs joined), at most MAX_EVENT_RECORDS. Deliberately not here: reading the
file (ingest.io), matching ranks (ingest.attribution), grouping traces into jobs (ingest.jobs).
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from ingest.parsers import Message, N_, ParseResult

MAX_EVENT_RECORDS = 20_000  # per-event records of a non-Kineto trace; the rest are counted
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.I)
_INFO = re.compile(r'"distributedInfo"\s*:\s*')
# (record column, event args key) of an NCCL profiler plugin / Kineto collective event: one row each
_EVENT_ARGS = (("seq_num", "SeqNum"), ("comm_hash", "CommHash"), ("rank", "Rank"), ("count", "Count"),
               ("dtype", "Datatype"), ("algorithm", "Algorithm"), ("protocol", "Protocol"),
               ("num_channels", "nChannels"), ("group_id", "groupId"), ("pg_name", "Process Group Name"),
               ("pg_desc", "Process Group Description"), ("in_msg_nelems", "In msg nelems"))


@dataclass(frozen=True, kw_only=True)
class TraceParse:
    """``parse_chrome_trace``'s result. timeline: the rank's RankTimeline (ingest.traces), None when
    nothing was analysed; rank: None when neither distributedInfo nor the file name says."""

    result: ParseResult
    timeline: Any = None
    rank: int | None = None


def parse_trace_header(head: str) -> dict[str, Any]:
    """The header fields of a Kineto document from its first characters: ``schemaVersion``
    (bool: present), ``distributedInfo`` (dict, {} if absent or unreadable), ``trace_id``,
    ``baseTimeNanoseconds`` (int, the epoch ns its ts count from; None when the header lacks it:
    older Kineto wrote absolute epoch microseconds in every ts instead)."""
    before_events = head.split('"traceEvents"')[0]
    t = re.search(r'"trace_id"\s*:\s*"([^"]{1,128})"', before_events)
    b = re.search(r'"baseTimeNanoseconds"\s*:\s*(\d{1,20})\b', before_events)
    out: dict[str, Any] = {"kineto": '"schemaVersion"' in before_events, "distributedInfo": {},
                           "trace_id": t.group(1) if t else None,
                           "baseTimeNanoseconds": int(b.group(1)) if b else None}
    m = _INFO.search(head)
    if m:
        try:
            info, _ = json.JSONDecoder().raw_decode(head, m.end())
            out["distributedInfo"] = info if isinstance(info, dict) else {}
        except ValueError:
            pass
    return out


def pg_signature(info: dict[str, Any]) -> str | None:
    """A distributedInfo's process groups as one string every rank of a job writes the same
    (backend, world size, each group's description and size); None when it names no world size."""
    if not info.get("world_size"):
        return None
    groups = info.get("pg_config") or []
    parts = [f"{g.get('pg_desc') or g.get('pg_name')}:{g.get('pg_size')}" for g in groups if isinstance(g, dict)]
    return f"{info.get('backend')} world {info.get('world_size')} [{', '.join(parts)}]"


def parse_chrome_trace(events: Iterable[dict[str, Any]], *, source: str, head: str, read_counts: Any) -> TraceParse:
    """One Chrome trace -> TraceParse. events: its events (streamed, consumed once); head: the first
    characters of its text; read_counts: the ``ingest.trace_reader.TraceReadCounts`` the reader fills
    (events read, items skipped, truncation). Never raises on content."""
    from ingest.traces import compute_step_breakdown

    header = parse_trace_header(head)
    info = header["distributedInfo"]
    name = source.rsplit("/", 1)[-1]
    rank = info.get("rank") if isinstance(info.get("rank"), int) else None
    rank_from = "distributedInfo"
    if rank is None:
        m = _RANK_IN_NAME.search(name)
        rank, rank_from = (int(m.group(1)), "file name") if m else (None, None)
    records: list[dict] = []
    warnings: list[str] = []
    loose: list[dict] = []
    stream = events if header["kineto"] else _keep_events(events, loose, source=source)
    # consumes every event (so a non-Kineto trace's events are all recorded)
    breakdown = compute_step_breakdown(stream, run=name, rank=rank if rank is not None else 0, pp_degree=1,
                                       unmarked="split", base_time_ns=header["baseTimeNanoseconds"])
    if header["kineto"]:
        records.append({"table": "traces", "source": source, "line": None, "record": "trace_meta", "rank": rank,
                        "rank_from": rank_from, "world_size": info.get("world_size"), "backend": info.get("backend"),
                        "pg_signature": pg_signature(info), "trace_id": header["trace_id"],
                        "timeline": breakdown.timeline, "num_steps": len(breakdown.steps),
                        "whole_trace": breakdown.step_split == "window", "step_split": breakdown.step_split,
                        "step_split_name": breakdown.step_split_name,
                        "epoch_clock": breakdown.rank_timeline is not None
                        and breakdown.rank_timeline.epoch_origin_us is not None,
                        "num_events": read_counts.num_events})
        records += [{"table": "breakdown", "source": source, "line": None, **dataclasses.asdict(r)}
                    for r in breakdown.steps]
        if info.get("nccl_version"):
            records.append({"table": "env", "source": source, "line": None, "record": "trace_env",
                            "key": "nccl_version", "value": str(info["nccl_version"])})
        warnings += list(breakdown.warnings)
        if rank is None:
            warnings.append(Message(N_("no distributedInfo.rank and no rank in the file name: analysed as rank 0; "
                                       "name the file profile_rank<r>.json to place it")))
    else:
        records += loose[:MAX_EVENT_RECORDS]
        if len(loose) > MAX_EVENT_RECORDS:
            warnings.append(Message(N_("%(num)s more events not kept as records (first %(max)s kept)"),
                                    num=len(loose) - MAX_EVENT_RECORDS, max=MAX_EVENT_RECORDS))
        warnings.append(Message(N_("not a torch.profiler (Kineto) document: its events are listed, no step breakdown")))
    if read_counts.truncated:
        warnings.append(Message(N_("the trace ends inside its JSON (cut file or a crash while writing): the events before "
                                   "the cut are used")))
    if read_counts.num_skipped:
        warnings.append(Message(N_("%(num)s item(s) that are not JSON event objects were skipped"), num=read_counts.num_skipped))
    if not records:
        warnings.append(Message(N_("no records: the trace holds no event this tool reads")))
    result = ParseResult(records=records, unparsed=read_counts.num_skipped, warnings=warnings, kind="chrome_trace",
                         num_lines=read_counts.num_events + read_counts.num_skipped)
    return TraceParse(result=result, timeline=breakdown.rank_timeline if header["kineto"] else None, rank=rank)


def _keep_events(events: Iterable[dict[str, Any]], out: list[dict], *, source: str) -> Iterator[dict[str, Any]]:
    """Pass the events through, appending a ``collectives`` record for each (a ``b`` event and
    its ``e`` joined into one, with the duration)."""
    open_: dict[tuple, dict] = {}
    for i, ev in enumerate(events, start=1):
        yield ev
        ph = ev.get("ph")
        key = (ev.get("name"), ev.get("cat"), ev.get("id"), ev.get("pid"), ev.get("tid"))
        if ph == "e" and key in open_:
            rec = open_.pop(key)
            ts = _num(ev.get("ts"))
            if ts is not None and rec.get("ts_us") is not None:
                rec["dur_us"] = ts - rec["ts_us"]
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        rec = {"table": "collectives", "source": source, "line": None, "event_index": i, "record": "trace_event", "name": str(ev.get("name")),
               "cat": ev.get("cat"), "ph": ph, "ts_us": _num(ev.get("ts")), "dur_us": _num(ev.get("dur"))}
        for col, key_ in _EVENT_ARGS:
            if key_ in args and args[key_] is not None:
                rec[col] = str(args[key_]) if col == "comm_hash" else args[key_]
        out.append(rec)
        if ph == "b":
            open_[key] = rec


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None
