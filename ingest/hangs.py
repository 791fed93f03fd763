"""Hang diagnosis from per-rank evidence: py-spy stack dumps and PyTorch flight-recorder dumps.

Pure functions (text or already-unpickled dicts in, records out); the runner and ingest read
the files. The question answered is the one DESIGN.md's triage asks: which rank is not in the
same collective as the others, and which collective (with its sequence number) everyone waits in.
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any, Mapping

from core.i18n import Message, MessageList, N_
from ingest.parsers import run_parsers
from ingest.parsers.pyspy import PySpyParser, is_collective

# Frames of libraries (py-spy prints paths relative to sys.path, or absolute for site-packages)
LIBRARY_FILE = re.compile(r"(^|/)(site-packages|dist-packages|torch|deepspeed|megatron|accelerate|multiprocessing|"
                          r"concurrent)/|^<frozen|(^|/)(threading|runpy)\.py$")
# Innermost Python frame -> what the rank is blocked in when the collective is issued from C++
_BACKWARD = N_("backward (gradient all-reduce/reduce-scatter hooks)")
IMPLICIT = {"_engine_run_backward": _BACKWARD, "backward": _BACKWARD}


def parse_pyspy_dump(text: str) -> list[dict[str, Any]]:
    """py-spy ``dump`` text (read by ingest.parsers.pyspy) -> threads [{tid, state, name, frames:
    [{func, file, line}]}], Python frames only, innermost first."""
    parser = PySpyParser("py-spy dump")
    run_parsers(text, [parser], kind="pyspy")
    return [{"tid": t["thread_id"], "state": t.get("state"), "name": t.get("thread_name"),
             "frames": [{"func": f, "file": file, "line": ln} for f, file, ln in frames if ln is not None]}
            for t, frames in parser.threads]


def summarize_stack(threads: list[dict[str, Any]]) -> dict[str, Any]:
    """Where the main thread is blocked: {"blocked_in": str, "frame": "func (file:line)", "user_frame": ...}.

    blocked_in is the innermost collective call, else the implicit collective of a backward
    pass, else the innermost frame. user_frame is the innermost frame outside torch/deepspeed/megatron
    (the line of *our* code that issued it)."""
    main = next((t for t in threads if t["name"] == "MainThread"), threads[0] if threads else None)
    if not main or not main["frames"]:
        return {"blocked_in": None, "frame": None, "user_frame": None}
    frames = main["frames"]
    hit = next((f for f in frames if is_collective(f["func"], f["file"])), None)
    if hit is not None:
        blocked = hit["func"]
    else:
        hit = next((f for f in frames if f["func"] in IMPLICIT), frames[0])
        blocked = Message(IMPLICIT[hit["func"]]) if hit["func"] in IMPLICIT else hit["func"]
    return {"blocked_in": blocked, "frame": f"{hit['func']} ({hit['file']}:{hit['line']})",
            "user_frame": user_frame(frames)}


def user_frame(frames: list[dict[str, Any]]) -> str | None:
    """The innermost frame ({func, file, line}, innermost first) outside the libraries
    (LIBRARY_FILE): the line of the user's code that issued the call, as "func (file:line)"."""
    f = next((f for f in frames if not LIBRARY_FILE.search(f["file"])), None)
    return f"{f['func']} ({f['file']}:{f['line']})" if f else None


def describe_rank(rank: int | str, s: Mapping[str, Any]) -> str:
    """One rank's summary as words, saying only what is known: "rank 1 in all_reduce at
    step (runner/train.py:88)", or without a stack "rank 1: stopped (state T), no stack
    (py-spy: <its error>)"."""
    blocked, frame = s.get("blocked_in"), s.get("user_frame") or s.get("frame")
    if blocked:
        return (Message(N_("rank %(rank)s in %(collective)s at %(frame)s"), rank=rank, collective=_known(blocked),
                        frame=frame) if frame else
                Message(N_("rank %(rank)s in %(collective)s"), rank=rank, collective=_known(blocked)))
    state, error = s.get("process_state"), s.get("stack_error")
    if error:
        return (Message(N_("rank %(rank)s: %(state)s, no stack (py-spy: %(error)s)"), rank=rank, state=state, error=error)
                if state else Message(N_("rank %(rank)s: no stack (py-spy: %(error)s)"), rank=rank, error=error))
    return (Message(N_("rank %(rank)s: %(state)s, no stack"), rank=rank, state=state) if state else
            Message(N_("rank %(rank)s: no stack"), rank=rank))


def _known(blocked: Any) -> Any:
    """A recorded blocked_in (a status.json read back) that is one of IMPLICIT's words, as the
    Message it was: the note translates it."""
    return Message(blocked) if isinstance(blocked, str) and blocked in IMPLICIT.values() else blocked


def rank_evidence(s: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(blocked in, where) of one rank's py-spy summary, as a table shows them: a rank without a
    stack reads ("no stack (<py-spy's error>)", "process stopped (state T)"), never None."""
    if s.get("blocked_in"):
        return _known(s["blocked_in"]), s.get("user_frame") or s.get("frame")
    blocked = (Message(N_("no stack (%(error)s)"), error=s["stack_error"]) if s.get("stack_error") else
               Message(N_("no stack")))
    return blocked, (Message(N_("process %(state)s"), state=s["process_state"]) if s.get("process_state") else
                     Message(N_("process state not recorded")))


def diagnose_from_stacks(per_rank: Mapping[int, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """Per-rank summaries (summarize_stack, optionally with process_state / stack_error) ->
    (one-line cause, diagnosis dict).

    The odd ones out are the ranks whose blocked_in differs from the majority's; a rank without
    a stack (py-spy failed, e.g. on a SIGSTOPped process) is odd by itself and described by
    what is known of it (describe_rank), never "None"."""
    if not per_rank:
        return Message(N_("no stack dumps could be taken")), {"ranks": {}}
    known = {r: s for r, s in per_rank.items() if s.get("blocked_in")}
    blind = sorted(set(per_rank) - set(known))
    counts = Counter(s["blocked_in"] for s in known.values())
    (majority, top), *rest = counts.most_common() or [(None, 0)]
    if majority is None:
        odd, cause = [], ""
    elif not rest:
        odd, cause = [], (Message(N_("all ranks wait in %(collective)s"), collective=_known(majority)) if not blind else
                          Message(N_("rank(s) %(ranks)s wait in %(collective)s"), ranks=", ".join(map(str, sorted(known))),
                                  collective=_known(majority)))
    elif rest[0][1] == top:  # a tie (e.g. 2 ranks): no majority to call the others odd against
        majority, odd = None, sorted(known)
        cause = Message(N_("ranks are in different collectives: %(ranks)s"),
                        ranks=MessageList([describe_rank(r, per_rank[r]) for r in odd], "; "))
    else:
        odd = sorted(r for r, s in known.items() if s["blocked_in"] != majority)
        others = sorted(set(known) - set(odd))
        cause = Message(N_("%(odd)s while rank(s) %(ranks)s wait in %(collective)s"),
                        odd=MessageList([describe_rank(r, per_rank[r]) for r in odd], "; "),
                        ranks=", ".join(map(str, others)), collective=_known(majority))
    if blind:
        cause = MessageList([describe_rank(r, per_rank[r]) for r in blind] + ([cause] if cause else []), "; ")
    return cause, {"source": "py-spy", "ranks": {str(r): s for r, s in sorted(per_rank.items())},
                   "odd_ranks": sorted([*odd, *blind]), "majority_blocked_in": majority}


def summarize_flight_recorder(dump: Mapping[str, Any]) -> dict[str, Any]:
    """One rank's flight-recorder dump (unpickled) -> its last collective:
    {"last_seq_id", "last_op", "last_state", "last_completed_seq_id", "num_entries"}."""
    entries = list(dump.get("entries") or [])
    if not entries:
        return {"last_seq_id": None, "last_op": None, "last_state": None, "last_completed_seq_id": None,
                "num_entries": 0}
    colls = [e for e in entries if e.get("collective_seq_id") is not None and not e.get("is_p2p", False)] or entries
    last = max(colls, key=lambda e: e.get("collective_seq_id") or 0)
    done = [e.get("collective_seq_id") for e in colls if e.get("state") == "completed"]
    return {"last_seq_id": last.get("collective_seq_id"), "last_op": last.get("profiling_name"),
            "last_state": last.get("state"), "last_completed_seq_id": max(done) if done else None,
            "num_entries": len(entries)}


def diagnose_from_flight_recorder(per_rank: Mapping[int, dict[str, Any]], *, world_size: int) -> tuple[str, dict]:
    """Per-rank FR summaries -> (cause, diagnosis). Ranks without a dump, or behind the highest
    sequence number, are the ones missing from that collective."""
    if not per_rank:
        return Message(N_("no flight-recorder dumps were written")), {"source": "flight-recorder", "ranks": {}}
    top = max((s["last_seq_id"] or 0) for s in per_rank.values())
    lead = next(s for s in per_rank.values() if (s["last_seq_id"] or 0) == top)
    missing = sorted(set(range(world_size)) - set(per_rank))
    behind = sorted(r for r, s in per_rank.items() if (s["last_seq_id"] or 0) < top)
    head = dict(seq=top, op=lead["last_op"], state=lead["last_state"])
    if behind or missing:
        ranks = ", ".join(map(str, behind + missing))
        cause = Message(N_("collective #%(seq)s (%(op)s) %(state)s; rank(s) %(ranks)s never entered it"), **head, ranks=ranks)
        if behind:
            cause = Message(N_("collective #%(seq)s (%(op)s) %(state)s; rank(s) %(ranks)s never entered it (last: %(last)s)"),
                            **head, ranks=ranks, last=MessageList(Message(N_("rank %(rank)s #%(seq)s %(op)s"), rank=r,
                                                                          seq=per_rank[r]["last_seq_id"],
                                                                          op=per_rank[r]["last_op"]) for r in behind))
    elif lead["last_state"] != "completed":
        cause = Message(N_("collective #%(seq)s (%(op)s) %(state)s on every rank: it was enqueued but never finished (a "
                           "stuck kernel or peer)"), **head)
    else:
        cause = Message(N_("collective #%(seq)s (%(op)s) %(state)s"), **head)
    return cause, {"source": "flight-recorder", "ranks": {str(r): s for r, s in sorted(per_rank.items())},
                   "max_seq_id": top, "behind_ranks": behind, "missing_ranks": missing}
