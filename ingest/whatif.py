"""What removing each cause would save: the traced steps replayed as a dependency graph.

Records in, records out: ``compute_whatif`` takes every rank's ``RankTimeline`` (with its
``ReplayInput`` chain, ingest.traces) and the run's ``AttributionRow``s and returns one
``WhatIfRow`` per category of ATTRIBUTION_CATEGORIES.

The model (after Daydream, Zhu et al., USENIX ATC 2020, and dPRO, Hu et al., MLSys 2022, reduced
to what a Kineto trace records):

* Per rank, the analysed window is a chain of items in device order: work (kernels, or host ops
  on CPU timelines) and waits for a collective. A work item starts when its predecessor ends and,
  on a GPU, not before the host launched it, plus the idle the trace shows beyond both (launch
  latency); it lasts what it measured. A wait ends when its collective ends.
* A collective starts on each rank at the point of that rank's chain where it started in the
  trace (mapped through the replayed chain), not before its host launch and not before the
  previous collective of its process group on that rank ended (when the trace names the group); it ends on all its ranks when the
  last one has started plus its transfer time (the shortest duration across its ranks: the rank
  that arrived last waited for nobody, as in ingest.attribution).
* GPU hosts run ahead of their device except at host calls that wait for it (cuda*Synchronize):
  such a call returns when the device reaches the point where it returned in the trace; every
  later launch moves with it. So a rank whose host is itself slow gains only its slack when a late
  peer is fixed: the replay cannot start a kernel its host has not launched.
* Ranks' clocks differ: each rank's offset is the median difference of the ends of the
  collectives it shares with a rank of known offset (a collective ends at once on all its ranks).

What-ifs, one cause removed at a time, each replayed and compared with the replay of the trace
as recorded: transfer at zero (and, with `runner commbench` results, at commbench's measured time
for each collective's op, size and group size); launch gaps (the host time the device waited for, outside batch
fetches, removed where it waited); data stall (batch fetches take no time); skew_wait (per step,
each rank's launch-gap time beyond the median of the other ranks' is removed where its device
waited for it). Pipeline bubble and imbalance are analytic
(1F1B: a step of (m + p - 1) micro-batch slots of the slowest stage, Narayanan et al. 2021):
bubble: the traced bubble (infinite micro-batches); imbalance: (m + p - 1) / m x (slowest stage's
compute - mean stage compute). Compute and other have no what-if.

Deliberately not here: reading files, attribution (ingest.attribution), wording (report).
"""
from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from core.formulas import compute_bubble_ratio
from core.i18n import Message, N_
from core.records import ATTRIBUTION_CATEGORIES, TRANSFER_AT_COMMBENCH, AttributionRow, WhatIfRow
from ingest.commbench import compute_bench_time_s
from ingest.intervals import measure
from ingest.traces import NO_LAUNCH, WORK_CATS, RankTimeline

_NEG = -(1 << 62)
UNNAMED_GROUPS = frozenset({"gloo", "?"})  # ingest.traces' group names when the trace does not say


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """One cause removed. work: rank -> every replay item's duration (ns) to use instead of the
    measured; host_cuts: rank -> (t0, t1, ns): host time removed, growing from 0 at t0 to ns at t1
    (a host range that takes no time) or all at t0 == t1; disjoint, sorted by t0."""

    transfer_zero: bool = False
    transfer_ns: Sequence[int | None] | None = None  # per collective (``keys`` order): its transfer instead
    ignore_launch: bool = False
    work: Mapping[int, np.ndarray] | None = None
    host_cuts: Mapping[int, tuple[np.ndarray, np.ndarray]] | None = None


class _Stall(Exception):
    """The rank needs a collective that another rank has not started yet."""


class _Graph:
    """Collective instances: members, transfer time, starts and end (ns, common clock)."""

    def __init__(self, timelines: Mapping[int, RankTimeline], keys: Mapping[tuple, Mapping[int, int]],
                 transfer_zero: bool, transfer_ns: Sequence[int | None] | None = None):
        self.gid = {r: [-1] * tl.coll_end.size for r, tl in timelines.items()}
        self.size, self.transfer, self.starts, self.end = [], [], [], []
        self.num_forced = 0
        for members in keys.values():
            g = len(self.size)
            durs = [int(timelines[r].coll_end[i] - timelines[r].coll_start[i]) for r, i in members.items()]
            self.size.append(len(members))
            override = transfer_ns[g] if transfer_ns is not None else None
            self.transfer.append(0 if transfer_zero else override if override is not None else min(durs))
            self.starts.append({})
            self.end.append(None)
            for r, i in members.items():
                self.gid[r][i] = g

    def arrive(self, g: int, rank: int, t: int) -> None:
        self.starts[g][rank] = t
        if len(self.starts[g]) == self.size[g] and self.end[g] is None:
            self.end[g] = max(self.starts[g].values()) + self.transfer[g]

    def force(self, g: int, t: int) -> None:
        """End collective g with the ranks that have arrived (at least at t): its members'
        traces give it in another order, so the others would never meet it."""
        self.end[g] = max([t, *self.starts[g].values()]) + self.transfer[g]
        self.num_forced += 1


class _Rank:
    """One rank's chain being replayed (module doc); times in ns on the common clock."""

    def __init__(self, r: int, tl: RankTimeline, offset: int, sc: Scenario, graph: _Graph):
        ri = tl.replay
        self.r, self.graph = r, graph
        self.s = (ri.start - offset).tolist()
        self.e = (ri.end - offset).tolist()
        dur = sc.work.get(r) if sc.work else None
        self.dur = (dur if dur is not None else ri.end - ri.start).tolist()
        self.kind, self.coll = ri.kind.tolist(), ri.coll.tolist()
        launch = np.where(ri.launch == NO_LAUNCH, _NEG, ri.launch - offset)
        prev = np.append(ri.start[:1] - offset, ri.end[:-1] - offset)
        self.resid = np.maximum((ri.start - offset) - np.maximum(prev, launch), 0).tolist()
        self.launch = [None if sc.ignore_launch or x == _NEG else x for x in launch.tolist()]
        self.cs = (tl.coll_start - offset).tolist()
        self.ce = (tl.coll_end - offset).tolist()
        self.cgroup = tl.coll_group
        self.claunch = [None if sc.ignore_launch or x == NO_LAUNCH else x - offset for x in ri.coll_launch.tolist()]
        self.ss, self.se = (ri.sync_start - offset).tolist(), (ri.sync_end - offset).tolist()
        cuts = sc.host_cuts.get(r) if sc.host_cuts else None
        self.cut_t0 = (cuts[0] - offset).tolist() if cuts is not None else []
        self.cut_t1 = (cuts[1] - offset).tolist() if cuts is not None else []
        self.cut_ns = cuts[2].tolist() if cuts is not None else []
        self.cut_before = np.append(0, np.cumsum(cuts[2])[:-1]).tolist() if cuts is not None else []
        self.start2: list[int] = [0] * len(self.s)
        self.end2: list[int | None] = [None] * len(self.s)
        self.delta, self.cut_at_sync = 0, 0
        self.group_last: dict[str, int] = {}
        self.waiting_on: tuple[int, int] | None = None  # (collective, replayed time) this rank stalled on
        events = [(t, 0, k) for k, t in enumerate(self.s)] + [(t, 1, q) for q, t in enumerate(self.cs)]
        events += [(t, 2, j) for j, t in enumerate(self.se)]
        events.sort()
        self.events, self.ptr = events, 0

    def _cut(self, t: int) -> int:
        """Host time removed before host time t."""
        i = bisect.bisect_right(self.cut_t0, t) - 1
        if i < 0:
            return 0
        t0, t1, ns = self.cut_t0[i], self.cut_t1[i], self.cut_ns[i]
        return self.cut_before[i] + (ns if t >= t1 else ns * (t - t0) // (t1 - t0))

    def _host(self, t: int) -> int:
        """Replayed time of host time t (a launch, a sync call)."""
        return t + self.delta - (self._cut(t) - self.cut_at_sync)

    def _end(self, k: int) -> int:
        if self.end2[k] is None:
            if self.kind[k] == 0:
                self.end2[k] = self.start2[k] + self.dur[k]
            else:
                q = self.coll[k]
                g = self.graph.gid[self.r][q]
                end = self.graph.end[g]
                if end is None:
                    self.waiting_on = (g, self.start2[k])
                    raise _Stall
                self.end2[k] = max(self.start2[k], end + (self.e[k] - self.ce[q]))
        return self.end2[k]

    def _anchor(self, t: int) -> int:
        """Replayed time of trace time t of this rank's device chain."""
        i = bisect.bisect_right(self.s, t) - 1
        if i < 0:
            return self.start2[0] - (self.s[0] - t) if self.s else t
        if t < self.e[i]:
            return self.start2[i] + (t - self.s[i])
        return self._end(i) + (t - self.e[i])

    def step(self) -> None:
        t, what, k = self.events[self.ptr]
        if what == 0:
            pe = self._end(k - 1) if k else self.s[0]
            launch = self.launch[k] if self.kind[k] == 0 else None
            self.start2[k] = max(pe, self._host(launch) if launch is not None else _NEG) + self.resid[k]
        elif what == 1:
            g = self.graph.gid[self.r][k]
            group = self.cgroup[k]
            # one stream per process group serialises its collectives; a placeholder name (gloo
            # ranges, kernels without their group) says nothing about which group ran them
            prev = self.group_last.get(group) if group not in UNNAMED_GROUPS else None
            prev_end = self.graph.end[prev] if prev is not None else _NEG
            if prev_end is None:
                self.waiting_on = (prev, self._anchor(self.cs[k]))
                raise _Stall
            at = self._anchor(self.cs[k])
            launch = self.claunch[k]
            start = max(at, prev_end, self._host(launch) if launch is not None else _NEG)
            self.group_last[group] = g
            self.graph.arrive(g, self.r, start)
        else:
            returned = max(self._host(self.ss[k]), self._anchor(t))
            self.delta = returned - t
            self.cut_at_sync = self._cut(t)
        self.ptr += 1

    def done(self) -> bool:
        while self.ptr < len(self.events):
            try:
                self.step()
            except _Stall:
                return False
        if self.s:
            try:  # the chain's last item may be a collective not ended yet: wait for it like any other
                self._end(len(self.s) - 1)
            except _Stall:
                return False
        return True


def offsets_ns(timelines: Mapping[int, RankTimeline], keys: Mapping[tuple, Mapping[int, int]]) -> dict[int, int]:
    """Each rank's clock minus the lowest rank's (ns): the median difference of the ends of the
    collectives two ranks share, chained from the lowest rank; a rank sharing none is aligned by
    its first window's start."""
    ranks = sorted(timelines)
    diffs: dict[tuple[int, int], list[int]] = {}
    for members in keys.values():
        items = sorted(members.items())
        for (a, i), (b, j) in zip(items, items[1:]):
            diffs.setdefault((a, b), []).append(int(timelines[b].coll_end[j] - timelines[a].coll_end[i]))
    edges = {k: int(np.median(v)) for k, v in diffs.items()}
    off = {ranks[0]: 0}
    todo = [ranks[0]]
    while todo:
        a = todo.pop()
        for (x, y), d in edges.items():
            if x == a and y not in off:
                off[y] = off[a] + d
                todo.append(y)
            elif y == a and x not in off:
                off[x] = off[a] - d
                todo.append(x)
    for r in ranks:
        if r not in off:
            off[r] = int(timelines[r].lo[0] - timelines[ranks[0]].lo[0]) if timelines[r].lo.size else 0
    return off


def replay_step_s(timelines: Mapping[int, RankTimeline], keys: Mapping[tuple, Mapping[int, int]],
                  offsets: Mapping[int, int], sc: Scenario) -> tuple[float | None, int]:
    """The mean step (s) over the ranks of the chains replayed under ``sc`` (each rank's window
    replayed end minus its start, over its number of steps), and how many collectives had to be
    ended without all their ranks: when every rank waits for a collective another rank reaches
    only after one it waits for itself (the traces give their collectives in different orders,
    e.g. gloo ranges of several process groups that share one name), the earliest such
    collective ends with the ranks that have arrived. (None, n) when nothing is left to replay."""
    graph = _Graph(timelines, keys, sc.transfer_zero, sc.transfer_ns)
    ranks = {r: _Rank(r, tl, offsets[r], sc, graph) for r, tl in timelines.items()}
    pending = set(ranks)
    while pending:
        before = sum(ranks[r].ptr for r in pending), len(pending)
        for r in sorted(pending):
            if ranks[r].done():
                pending.discard(r)
        if pending and (sum(ranks[r].ptr for r in pending), len(pending)) == before:
            stalled = [ranks[r].waiting_on for r in sorted(pending) if ranks[r].waiting_on is not None]
            open_ = [(t, g) for g, t in stalled if graph.end[g] is None]
            if not open_:
                return None, graph.num_forced
            t, g = min(open_)
            graph.force(g, t)
    per_rank = [(st.end2[-1] - st.start2[0]) / max(tl.steps.size, 1) for st, tl in
                ((ranks[r], timelines[r]) for r in ranks) if st.s]
    return (float(np.mean(per_rank)) / 1e9 if per_rank else None), graph.num_forced


def _work_without(tl: RankTimeline, cat: str, scale: np.ndarray | None = None) -> np.ndarray:
    """A CPU rank's item durations with category ``cat``'s items scaled (by step) or removed."""
    ri = tl.replay
    dur = (ri.end - ri.start).astype(np.float64)
    hit = (ri.kind == 0) & (ri.cat == WORK_CATS.index(cat))
    dur[hit] *= scale[ri.step[hit]] if scale is not None else 0.0
    return np.rint(dur).astype(np.int64)


def _host_excess(timelines: Mapping[int, RankTimeline]) -> dict[int, np.ndarray]:
    """Per rank and step index: launch-gap time beyond the median of the other ranks' in that
    step (ns, >= 0), steps matched by number."""
    out = {}
    for r, tl in timelines.items():
        ex = np.zeros(tl.steps.size)
        for i, step in enumerate(tl.steps.tolist()):
            others = [float(o.gaps[np.flatnonzero(o.steps == step)[0]]) for q, o in timelines.items()
                      if q != r and (o.steps == step).any()]
            if others:
                ex[i] = max(float(tl.gaps[i]) - float(np.median(others)), 0.0)
        out[r] = ex
    return out


def _gap_cuts(tl: RankTimeline, per_step: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A GPU rank's host cuts at the launches its device waited for, by the idle before each
    (not a batch fetch): the whole idle, or ``per_step`` (ns per step index) shared in proportion
    to the idle. Sorted by launch time."""
    ri = tl.replay
    prev = np.append(ri.start[:1], ri.end[:-1])
    waited = (ri.kind == 0) & (ri.launch != NO_LAUNCH) & (ri.launch > prev)
    gap = np.where(waited, np.maximum(ri.start - prev, 0), 0)
    gap = np.maximum(gap - measure((ri.data_start, ri.data_end), prev, np.maximum(ri.start, prev)), 0)
    amount = gap.astype(np.float64)
    if per_step is not None:
        total = np.bincount(ri.step, weights=amount, minlength=tl.steps.size)[ri.step]
        amount = np.where(total > 0, amount / np.where(total > 0, total, 1.0), 0.0) * per_step[ri.step]
    amount = np.rint(amount).astype(np.int64)
    keep = amount > 0
    order = np.argsort(ri.launch[keep], kind="stable")
    return ri.launch[keep][order], ri.launch[keep][order], amount[keep][order]


def _skew_scenario(timelines: Mapping[int, RankTimeline]) -> Scenario:
    """Each rank's extra host time (``_host_excess``) removed where its device waited for its host:
    on GPU ranks, cut from the host timeline at the launches after idle gaps, in proportion to the
    gaps; on CPU ranks, its launch-gap items shortened in proportion."""
    excess = _host_excess(timelines)
    work, cuts = {}, {}
    for r, tl in timelines.items():
        if tl.timeline == "cpu":
            gaps = tl.gaps.astype(np.float64)
            scale = np.where(gaps > 0, 1.0 - np.minimum(excess[r] / np.where(gaps > 0, gaps, 1.0), 1.0), 1.0)
            work[r] = _work_without(tl, "launch_gaps", scale)
        else:
            cuts[r] = _gap_cuts(tl, excess[r])
    return Scenario(work=work, host_cuts=cuts)


def _data_scenario(timelines: Mapping[int, RankTimeline]) -> Scenario:
    """Batch fetches take no time: CPU data items removed; on GPU hosts, each fetch's time cut."""
    work, cuts = {}, {}
    for r, tl in timelines.items():
        ri = tl.replay
        if tl.timeline == "cpu":
            work[r] = _work_without(tl, "data_stall")
        else:
            cuts[r] = (ri.data_start, ri.data_end, ri.data_end - ri.data_start)
    return Scenario(work=work, host_cuts=cuts)


def _gaps_scenario(timelines: Mapping[int, RankTimeline]) -> Scenario:
    """The host keeps up with its device: CPU launch-gap items removed; on GPU hosts, every idle
    gap before a launch (not a batch fetch) cut from the host timeline."""
    return Scenario(work={r: _work_without(tl, "launch_gaps") for r, tl in timelines.items() if tl.timeline == "cpu"},
                    host_cuts={r: _gap_cuts(tl) for r, tl in timelines.items() if tl.timeline != "cpu"})


def _bench_transfers_ns(timelines: Mapping[int, RankTimeline], keys: Mapping[tuple, Mapping[int, int]],
                        commbench: Sequence[Mapping[str, Any]]) -> list[int | None]:
    """Per matched collective (``keys`` order): commbench's time for its op, bytes (the trace's)
    and number of ranks, in ns; None where there is no measurement or no byte count."""
    out: list[int | None] = []
    for (_step, _group, kind, _seq), members in keys.items():
        r, i = next(iter(members.items()))
        t = compute_bench_time_s(commbench, op=kind, nbytes=float(timelines[r].coll_nbytes[i]),
                                 num_ranks=len(members))
        out.append(None if t is None else int(round(t * 1e9)))
    return out


def _pipeline_savings(rows: Sequence[AttributionRow], *, pp_degree: int, num_microbatches: int) -> dict[str, float]:
    """Analytic 1F1B savings (s per step): bubble -> the traced bubble; imbalance ->
    (m + p - 1) / m x (slowest rank's compute - mean compute)."""
    if pp_degree < 2 or not rows:
        return {}
    by_rank: dict[int, list[float]] = {}
    for row in rows:
        by_rank.setdefault(row.rank, []).append(row.compute_s)
    means = [float(np.mean(v)) for v in by_rank.values()]
    slots = 1 + compute_bubble_ratio(pp_degree=pp_degree, num_microbatches=num_microbatches)  # (m + p - 1) / m
    return {"bubble": float(np.mean([row.bubble_s for row in rows])),
            "imbalance": slots * (max(means) - float(np.mean(means)))}


def compute_whatif(timelines: Mapping[int, RankTimeline], rows: Sequence[AttributionRow],
                   keys: Mapping[tuple, Mapping[int, int]], *, run: str, pp_degree: int,
                   num_microbatches: int, commbench: Sequence[Mapping[str, Any]] = ()
                   ) -> tuple[list[WhatIfRow], list[str]]:
    """One WhatIfRow per ATTRIBUTION_CATEGORIES entry for the run, and warnings.

    timelines: rank -> RankTimeline with its replay chain (steps aligned across ranks, as
    ingest.attribution uses them); rows: the run's AttributionRow (spent_s, pipeline); keys: the
    matched collectives, (step, group, kind, seq) -> {rank: index}. Savings are replayed
    (module doc) except bubble and imbalance (analytic); None for compute and other, and for
    every replayed category when the replay cannot finish (a warning says so). With
    ``commbench`` rows (`runner commbench`, ingest.commbench), one more row, category
    TRANSFER_AT_COMMBENCH: every collective replayed at the time commbench measured for its op,
    size and group size (compute_bench_time_s) instead of its traced transfer (a collective
    without a measurement keeps its own; a warning counts them)."""
    rows = [row for row in rows if row.run == run]
    if not rows:
        return [], []
    ranks = {r: tl for r, tl in timelines.items() if tl.replay is not None and tl.replay.start.size}
    spent = {c: float(np.mean([getattr(row, f"{c}_s") for row in rows])) for c in ATTRIBUTION_CATEGORIES}
    traced = float(np.mean([row.step_time_s for row in rows]))
    warnings: list[str] = []
    savings: dict[str, float | None] = {}
    base = None
    if ranks:
        keys = {k: {r: i for r, i in m.items() if r in ranks} for k, m in keys.items()}
        keys = {k: m for k, m in keys.items() if m}
        offsets = offsets_ns(ranks, keys)
        base, forced = replay_step_s(ranks, keys, offsets, Scenario())
        if base is None:
            warnings.append(Message(N_("the what-if replay could not finish (a rank waits for a collective another rank "
                                       "never reaches in the trace); savings are not given")))
        else:
            if len(ranks) > 2 and any(k[1] in UNNAMED_GROUPS for k in keys):
                warnings.append(Message(N_("what-if replay: the trace does not name the collectives' process groups "
                                           "(gloo ranges), so with more than two ranks collectives of different groups "
                                           "may be matched as one; the replayed step is approximate (compare it with "
                                           "the traced step)")))
            if forced:
                warnings.append(Message(N_("what-if replay: %(num)s of %(total)s collectives appear in a different "
                                           "order on different ranks (several process groups under one name?); each "
                                           "ended with the ranks that had arrived, so waits around them are "
                                           "approximate"), num=forced, total=len(keys)))
            for cat, sc in (("transfer", Scenario(transfer_zero=True)), ("launch_gaps", _gaps_scenario(ranks)),
                            ("data_stall", _data_scenario(ranks)), ("skew_wait", _skew_scenario(ranks))):
                step, _ = replay_step_s(ranks, keys, offsets, sc)
                savings[cat] = base - step if step is not None else None
            bench = _bench_transfers_ns(ranks, keys, commbench) if commbench else []
            if any(t is not None for t in bench):
                step, _ = replay_step_s(ranks, keys, offsets, Scenario(transfer_ns=bench))
                savings[TRANSFER_AT_COMMBENCH] = base - step if step is not None else None
                missing = sum(t is None for t in bench)
                if missing:
                    warnings.append(Message(N_("what-if at commbench's bandwidth: %(num)s of %(total)s collectives have "
                                               "no commbench measurement of their op at their group size and keep their "
                                               "traced transfer"), num=missing, total=len(bench)))
    method = {c: "replay" for c in savings}
    for cat, saving in _pipeline_savings(rows, pp_degree=pp_degree, num_microbatches=num_microbatches).items():
        savings[cat], method[cat] = saving, "analytic"
    out = [WhatIfRow(run=run, category=c, spent_s=spent[c], saving_s=savings.get(c), method=method.get(c),
                     replay_step_s=base, traced_step_s=traced) for c in ATTRIBUTION_CATEGORIES]
    if TRANSFER_AT_COMMBENCH in savings:
        out.append(WhatIfRow(run=run, category=TRANSFER_AT_COMMBENCH, spent_s=spent["transfer"],
                             saving_s=savings[TRANSFER_AT_COMMBENCH], method="replay", replay_step_s=base,
                             traced_step_s=traced))
    return out, warnings
