"""Per-rank attribution of each profiled step on the critical path, across the ranks of a run.

Records in, records out: ``compute_attribution`` takes every rank's ``RankTimeline`` (built by
ingest.traces from that rank's profiler trace) and returns ``AttributionRow`` (one per rank and
analysed step; the categories of ATTRIBUTION_CATEGORIES tile the step) and ``CollectiveRow``
(one per collective matched across ranks) records.

Method (DESIGN.md "slow-run triage, per rank on the critical path"):

* Collectives are matched across ranks by (step, process group, kind, order within them).
  A collective ends at about the same moment on every rank, so the rank whose kernel (or gloo
  range) is shortest arrived last and waited for nobody: its duration is the **transfer**
  time, and every other rank's extra duration is time spent waiting for it. This needs no
  clock alignment between ranks or hosts. Steps found without ProfilerStep marks (numbered
  from each trace's start) are aligned across ranks by their start time when every rank's
  trace is on the Unix-epoch clock (one clock, as far as the hosts' clocks agree), else
  matched by their order in each trace; a warning says which.
* On each rank the exposed part of those waits (not under compute) is **skew_wait**; the rest
  of the exposed collective time is **transfer**.
* The late rank is charged: per step and process group (its name and member ranks: a TP, a DP
  and an embedding group each have their own), the rank the group's others waited for most is
  that group's late rank; its own step is compared with the median of the group's others (compute, data stall, device
  gaps) to say what it was doing -- "GPU busy" / "host compute" (more compute), "data" (longer
  batch fetch) or "host code" (more device-idle gaps: host code between launches, a sleep, GC).
  In the last case that many gap milliseconds of the late rank (at most the others' exposed
  wait) are counted as its skew_wait too, so the run's mean over ranks shows the skew once.
  A cause is named only when the late rank's excess in it is at least CAUSE_MIN_SHARE of the
  wait it caused; otherwise "not determined".
* Pipeline waits (exposed P2P kernels, or P2P ops on CPU timelines; ingest.traces), and on PP
  ranks the waits in collectives after the step's last P2P op (the 1F1B drain: a stage idle
  while an earlier stage runs its last backward, e.g. in the embedding all-reduce) split into
  **bubble** -- what 1F1B implies for balanced stages, mean stage compute x (p - 1) / m
  (Narayanan et al. 2021, section 2.2) --, **imbalance** -- steady-state waits for a stage with
  more compute, at most this rank's compute gap to the slowest stage -- and the rest, a peer
  late for other reasons, which counts as skew_wait.
* **launch_gaps**: device idle outside data fetches and pipeline waits (the host is in
  framework or user code); **data_stall**: device idle while the host fetches the batch;
  **other**: exposed memcpy/memset and other kernels.

What removing each category's cause would save: ingest.whatif, on the same matched collectives.

Deliberately not here: reading files, per-rank interval construction (ingest.traces), units
beyond seconds, and any rescaling to unprofiled steps (report.evidence).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.formulas import COLLECTIVES, compute_bubble_ratio, compute_bus_factor
from core.i18n import Message, MessageList, N_
from core.records import ATTRIBUTION_CATEGORIES, AttributionRow, CollectiveRow, WhatIfRow
from ingest.intervals import I64, intersect, measure, minus, union
from ingest.traces import RankTimeline
from ingest.whatif import compute_whatif

LATE_CAUSES = ("GPU busy", "host compute", "data", "host code", "not determined")
# the late rank's excess in one cause must explain at least this share of the wait it caused
# for that cause to be named
CAUSE_MIN_SHARE = 0.5


@dataclass(frozen=True, kw_only=True)
class Attribution:
    """Result of ``compute_attribution``: rows per (rank, step), matched collectives, and
    warnings (collectives that could not be matched, ranks without timelines)."""

    rows: tuple[AttributionRow, ...]
    collectives: tuple[CollectiveRow, ...]
    warnings: tuple[str, ...] = ()
    whatif: tuple[WhatIfRow, ...] = ()  # ingest.whatif: what removing each category's cause saves


def _bus_factor(kind: str, n: int) -> float | None:
    return compute_bus_factor(kind, n) if kind in COLLECTIVES and n > 1 else None


def _match(timelines: Mapping[int, RankTimeline]) -> dict[tuple, dict[int, int]]:
    """(step, group, kind, seq) -> {rank: index into that rank's coll_* arrays}."""
    keys: dict[tuple, dict[int, int]] = {}
    for rank, tl in timelines.items():
        seen: dict[tuple, int] = {}
        for i, (step, group, kind) in enumerate(zip(tl.coll_step.tolist(), tl.coll_group, tl.coll_kind)):
            base = (step, group, kind)
            seq = seen.get(base, 0)
            seen[base] = seq + 1
            keys.setdefault((*base, seq), {})[rank] = i
    return keys


def _align_unmarked_steps(timelines: Mapping[int, RankTimeline]) -> tuple[dict[int, RankTimeline], list[str]]:
    """Renumber the steps of ranks whose trace had no ProfilerStep marks so that one step
    number means one iteration on every rank: by start time on the shared epoch clock (the
    step of the rank that started first whose start is nearest, within half its median
    period), else left in trace order. Returns the timelines and what was done, as warnings."""
    out = dict(timelines)
    unmarked = [r for r, tl in timelines.items() if tl.step_split not in (None, "marks") and tl.steps.size]
    if len(timelines) < 2 or not unmarked:
        return out, []
    if any(tl.epoch_origin_us is None for tl in timelines.values()):
        return out, [f"rank(s) {', '.join(map(str, sorted(unmarked)))} have no ProfilerStep marks and the traces do "
                     "not share the Unix-epoch clock: steps are matched across ranks by their order in each trace"]

    def starts_us(tl: RankTimeline) -> np.ndarray:
        return tl.epoch_origin_us + tl.lo / 1e3

    ref = min(unmarked, key=lambda r: (float(starts_us(timelines[r])[0]), r))
    ref_starts = starts_us(timelines[ref])
    half_period = float(np.median(np.diff(ref_starts))) / 2 if ref_starts.size > 1 else float("inf")
    shifted = []
    for r in unmarked:
        tl = timelines[r]
        first = float(starts_us(tl)[0])
        k = int(np.argmin(np.abs(ref_starts - first)))
        shift = int(timelines[ref].steps[k]) - int(tl.steps[0])
        if shift and abs(ref_starts[k] - first) <= half_period:
            out[r] = dataclasses.replace(tl, steps=tl.steps + shift, coll_step=tl.coll_step + shift)
            shifted.append(Message(N_("rank %(rank)s by %(shift)s"), rank=r, shift=f"{shift:+d}"))
    ranks = ", ".join(map(str, sorted(unmarked)))
    if shifted:
        return out, [Message(N_("the ranks' traces share the Unix-epoch clock (as far as their hosts' clocks agree): the "
                                "steps of rank(s) %(ranks)s, found without ProfilerStep marks, are aligned by start time "
                                "(renumbered: %(shifted)s)"), ranks=ranks, shifted=MessageList(shifted))]
    return out, [Message(N_("the ranks' traces share the Unix-epoch clock (as far as their hosts' clocks agree): the steps "
                            "of rank(s) %(ranks)s, found without ProfilerStep marks, are aligned by start time"), ranks=ranks)]


def _gap_sizes(tl: RankTimeline, i: int) -> np.ndarray:
    """Durations (ns) of the device-idle gaps inside step i's window."""
    lo, hi = int(tl.lo[i]), int(tl.hi[i])
    s, e = intersect(tl.gap_set, (np.array([lo], I64), np.array([hi], I64)))
    return e - s


def compute_attribution(timelines: Mapping[int, RankTimeline], *, run: str, pp_degree: int,
                        num_microbatches: int, commbench: Sequence[Mapping[str, Any]] = ()) -> Attribution:
    """Attribute every analysed step of every rank (see the module doc).

    timelines: rank -> RankTimeline (ingest.traces); pp_degree, num_microbatches: the run's
    pipeline stages p and micro-batches per step m (bubble = mean stage compute x (p-1)/m);
    commbench: `runner commbench` rows for the what-if at its bandwidth (ingest.whatif).
    Returns Attribution; times in seconds. Raises ValueError for pp_degree or
    num_microbatches < 1.
    """
    if pp_degree < 1 or num_microbatches < 1:
        raise ValueError(f"pp_degree and num_microbatches must be >= 1, got {pp_degree}, {num_microbatches}")
    timelines, warnings = _align_unmarked_steps(timelines)
    ranks = sorted(timelines)
    # 1. match collectives, waits per instance
    waits = {r: np.zeros(timelines[r].coll_step.size, I64) for r in ranks}
    matched: list[tuple] = []  # (step, group, kind, seq, members, late, transfer ns, max wait ns)
    coll_group_of = {r: {} for r in ranks}  # rank -> index into its coll_* arrays -> group
    num_unmatched = 0
    keys = _match(timelines)
    for (step, group, kind, seq), members in sorted(keys.items(), key=lambda kv: kv[0][:1] + kv[0][3:]):
        if len(members) < 2:
            num_unmatched += 1
            continue
        durs = {r: int(timelines[r].coll_end[i] - timelines[r].coll_start[i]) for r, i in members.items()}
        late = min(durs, key=lambda r: (durs[r], r))
        transfer = durs[late]
        for r, i in members.items():
            waits[r][i] = durs[r] - transfer
            coll_group_of[r][i] = (str(group), tuple(sorted(members)))  # a group: its name and member ranks
        matched.append((step, group, kind, seq, members, late, transfer, max(durs.values()) - transfer))
    if num_unmatched:
        warnings.append(Message(N_("%(num)s collective(s) were seen on one rank only (the others' traces lack them); "
                                   "their time counts as transfer"), num=num_unmatched))

    # 2. per-rank, per-step categories before the cross-rank charges
    per: dict[int, dict[str, np.ndarray]] = {}
    group_waits: dict[tuple[int, tuple], np.ndarray] = {}  # (rank, group) -> exposed wait per step index (ns)
    charged: dict[int, np.ndarray] = {}  # rank -> per collective instance: its exposed wait outside the drain (ns)
    for r in ranks:
        tl = timelines[r]
        c_s, c_e = tl.coll_start, tl.coll_start + waits[r]
        wait_set = union(c_s, c_e)
        skew = measure(intersect(wait_set, tl.exposed_set), tl.lo, tl.hi)
        # the pipeline's drain: on a PP rank, waits in the collectives after its last P2P op
        drain = np.zeros_like(skew)
        exposed_skew = tl.exposed_set  # where a wait is exposed and not the drain's
        if pp_degree > 1 and tl.p2p_last is not None:
            has = tl.p2p_last >= 0
            tail = (tl.p2p_last[has], tl.hi[has])
            drain = measure(intersect(intersect(wait_set, tl.exposed_set), tail), tl.lo, tl.hi)
            exposed_skew = minus(tl.exposed_set, union(*tail))
        per[r] = {"compute": tl.compute.copy(), "transfer": tl.exposed - skew, "skew_wait": skew - drain,
                  "pipeline": tl.pipeline_wait + drain, "launch_gaps": tl.gaps.copy(),
                  "data_stall": tl.data_stall.copy(), "other": tl.rest.copy()}
        # each collective's wait where it is exposed and not the drain's: what its late rank is charged for
        charged[r] = measure(exposed_skew, c_s, c_e)
        # the exposed waits of each process group's collectives alone, for charging each group's late rank
        for gkey in set(coll_group_of[r].values()):
            idx = np.array([i for i, g in coll_group_of[r].items() if g == gkey], np.int64)
            group_waits[(r, gkey)] = measure(intersect(union(c_s[idx], c_e[idx]), exposed_skew), tl.lo, tl.hi)

    # the matched collectives' rows, and per (step, group) the wait each late rank caused
    coll_rows: list[CollectiveRow] = []
    late_by_group: dict[tuple[int, tuple], dict[int, int]] = {}  # (step, group) -> late rank -> wait caused (ns)
    for step, group, kind, seq, members, late, transfer, max_wait in matched:
        exposed_wait = max(int(charged[r][i]) for r, i in members.items() if r != late)
        if exposed_wait > 0:
            caused = late_by_group.setdefault((int(step), coll_group_of[late][members[late]]), {})
            caused[late] = caused.get(late, 0) + exposed_wait
        nbytes = float(timelines[late].coll_nbytes[members[late]])
        factor = _bus_factor(kind, len(members))
        busbw = (nbytes / transfer * factor if factor and transfer > 0 and np.isfinite(nbytes) else None)
        coll_rows.append(CollectiveRow(
            run=run, step=int(step), group=str(group), kind=kind, seq=int(seq), num_ranks=len(members),
            nbytes=None if not np.isfinite(nbytes) else int(nbytes), late_rank=int(late),
            transfer_s=transfer / 1e9, max_wait_s=max_wait / 1e9, exposed_wait_s=exposed_wait / 1e9,
            busbw_gbps=busbw))

    # 3. pipeline waits: the 1F1B bubble for stages of the mean compute, then waits for a
    # stage with more compute (at most the compute gap to the slowest stage), then the rest:
    # a peer late for other reasons (host code, data), i.e. skew
    means = {r: float(per[r]["compute"].mean()) for r in ranks if per[r]["compute"].size}
    mean_compute = float(np.mean(list(means.values()))) if means else 0.0
    implied = mean_compute * compute_bubble_ratio(pp_degree=pp_degree, num_microbatches=num_microbatches)
    slowest = max(means.values(), default=0.0)
    for r in ranks:
        pw = per[r]["pipeline"]
        per[r]["bubble"] = np.minimum(pw, np.int64(round(implied)))
        gap = np.int64(round(max(slowest - means.get(r, slowest), 0.0)))
        per[r]["imbalance"] = np.minimum(pw - per[r]["bubble"], gap)
        per[r]["skew_wait"] += pw - per[r]["bubble"] - per[r]["imbalance"]

    # 4. charge the late rank of each process group in each step: a TP group, a DP group and the
    # embedding group each have their own late rank
    index = {r: {int(k): i for i, k in enumerate(timelines[r].steps.tolist())} for r in ranks}
    cause: dict[tuple[int, int], tuple[str, int]] = {}
    for (step, gkey), caused in sorted(late_by_group.items()):
        present = [r for r in gkey[1] if step in index[r]]
        if len(present) < 2:
            continue
        late = max(caused, key=lambda r: (caused[r], -r))
        if late not in present:
            continue
        others = [r for r in present if r != late]
        exposed_wait = max(int(group_waits[(r, gkey)][index[r][step]]) for r in others)
        if exposed_wait <= 0:
            continue
        li = index[late][step]

        def excess(cat: str) -> float:
            own = float(per[late][cat][li])
            return own - float(np.median([per[r][cat][index[r][step]] for r in others]))

        deltas = {"compute": excess("compute"), "data": excess("data_stall"), "host code": excess("launch_gaps")}
        what = max(deltas, key=deltas.get)
        label = what if what != "compute" else ("GPU busy" if timelines[late].timeline == "gpu" else "host compute")
        if deltas[what] < CAUSE_MIN_SHARE * exposed_wait:
            label = "not determined"
        if what == "host code" and deltas[what] > 0:
            moved = int(min(exposed_wait, deltas[what], per[late]["launch_gaps"][li]))
            per[late]["launch_gaps"][li] -= moved
            per[late]["skew_wait"][li] += moved
        if (late, step) in cause:  # late in several groups at once: the larger wait names the cause
            before, waited = cause[(late, step)]
            label = label if exposed_wait > waited else before
            exposed_wait += waited
        cause[(late, step)] = (label, exposed_wait)

    # 5. rows
    rows: list[AttributionRow] = []
    for r in ranks:
        tl = timelines[r]
        p = per[r]
        length = tl.hi - tl.lo
        other = length - sum(p[c] for c in ATTRIBUTION_CATEGORIES if c != "other")
        assert (other >= 0).all(), "attribution partition broke"
        for i, step in enumerate(tl.steps.tolist()):
            gaps = _gap_sizes(tl, i)
            gaps = gaps[gaps >= 1000]  # gaps under 1 us are kernel-to-kernel scheduling, not host time
            label, caused = cause.get((r, int(step)), (None, 0))
            rows.append(AttributionRow(
                run=run, rank=r, step=int(step), timeline=tl.timeline, step_time_s=int(length[i]) / 1e9,
                compute_s=int(p["compute"][i]) / 1e9, transfer_s=int(p["transfer"][i]) / 1e9,
                skew_wait_s=int(p["skew_wait"][i]) / 1e9, bubble_s=int(p["bubble"][i]) / 1e9,
                imbalance_s=int(p["imbalance"][i]) / 1e9, launch_gaps_s=int(p["launch_gaps"][i]) / 1e9,
                data_stall_s=int(p["data_stall"][i]) / 1e9, other_s=int(other[i]) / 1e9,
                num_launch_gaps=int(gaps.size),
                launch_gap_p50_s=float(np.median(gaps)) / 1e9 if gaps.size else None,
                launch_gap_max_s=float(gaps.max()) / 1e9 if gaps.size else None,
                late=label is not None, late_cause=label, late_caused_wait_s=caused / 1e9))
    whatif, more = compute_whatif(timelines, rows, keys, run=run, pp_degree=pp_degree,
                                  num_microbatches=num_microbatches, commbench=commbench)
    return Attribution(rows=tuple(rows), collectives=tuple(coll_rows), warnings=tuple(warnings + more),
                       whatif=tuple(whatif))
