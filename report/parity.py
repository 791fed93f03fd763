"""Kernel parity checked from the traces, and repeats: view-model records for the note and
summary.json (issue 19; DESIGN.md "Comparing layouts, not kernels").

Parity. Per traced run, time per token by kernel class (core.records.KERNEL_CLASSES: gemm,
attention, loss, optimizer, elementwise, comm, memory, other): the summed kernel time of the
class over all ranks per traced step (GPU kernels; host ops on CPU timelines), divided by the
tokens of one step, in ms/token. At equal math -- tp = pp = world = 1, where no layout has anything
to communicate -- runs of the same kernels mode should spend the same time per token in every
non-communication class; a run fails when a class differs from the reference by more than
``parity_tolerance`` (and by more than ``parity_min_share`` of its own non-communication time, so a
class of a few microseconds does not fail a run), naming the class and the difference. The
reference is the median over engines (strategy/engine) of each engine's median run, so one
engine's variants (knob runs, data rounds, repeats) do not outvote the others; with two engines
it lies midway and both are named.
Runs not at equal math carry ``passed = None`` (nothing to compare like for like).

Repeats. Runs sharing a layout, data round and kernels mode (``options.repeat``) form a group:
median tokens/s and a 95% Student-t interval of the mean across the repeats (no SciPy needed:
the two-sided 97.5% quantiles are tabulated below), and the run whose tokens/s is the group's
median (the lower one of the middle two for an even count) represents the layout in the ranking.

Deliberately not here: wording, formatting, file access.
"""
from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from core.records import KERNEL_CLASSES, LoadedRun, RunSummary
from report.rules import THRESHOLDS, Evidence, Finding

NON_COMM_CLASSES = tuple(c for c in KERNEL_CLASSES if c != "comm")
# Student t 97.5% quantiles (two-sided 95%), degrees of freedom 1..30; beyond, the normal 1.96.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
INTERVAL_METHOD = "95% Student-t interval of the mean"


def run_kernels(run: LoadedRun) -> dict[str, Any]:
    """The kernels a run used: run_info's record (RunInfo.kernels), else what its spec asked
    (``options.kernels``), else {} (runs from before kernel modes)."""
    if run.info is not None and run.info.kernels is not None:
        return dict(run.info.kernels)
    return dict(run.spec.options.get("kernels") or {})


def kernels_mode(run: LoadedRun) -> str:
    """"parity" | "engine-best" | "unrecorded" (runs from before kernel modes)."""
    return str(run_kernels(run).get("mode") or "unrecorded")


def run_repeat(run: LoadedRun) -> int | None:
    r = run.spec.options.get("repeat")
    return int(r) if isinstance(r, int) else None


@dataclass(frozen=True, kw_only=True)
class ParityRow:
    run: str
    mode: str  # kernels mode of the run
    loss: str | None
    attention: str | None
    optimizer: str | None
    compile: str | None
    not_taken: tuple[tuple[str, str], ...]  # (piece, why the engine cannot take parity's choice)
    timeline: str | None  # "gpu" | "cpu" | None (no trace)
    ms_per_token: tuple[tuple[str, float], ...]  # (kernel class, ms per token), KERNEL_CLASSES order
    equal_math: bool  # tp = pp = world = 1
    passed: bool | None  # None: not at equal math, no trace, or nothing to compare with
    failed_class: str | None
    failed_diff: float | None  # relative difference of that class to the reference median
    reason: str | None  # English, for summary.json; the note words failed_class / failed_diff


@dataclass(frozen=True, kw_only=True)
class RepeatGroup:
    layout: str
    data_round: str
    mode: str
    runs: tuple[str, ...]
    tokens_per_s: tuple[float, ...]
    median_tokens_per_s: float
    ci_low: float | None  # None with one repeat
    ci_high: float | None
    representative: str  # the run ranked for this layout (its tokens/s is the median)


def compute_ms_per_token(kernels: pd.DataFrame | None, runs: Sequence[LoadedRun]) -> dict[str, dict[str, float]]:
    """run -> {kernel class: ms per token}: per rank, the class's summed time / its traced steps,
    summed over ranks, / tokens per step x 1e3. Runs without kernel rows are absent."""
    out: dict[str, dict[str, float]] = {}
    if kernels is None or kernels.empty:
        return out
    tokens = {r.name: r.spec.tokens_per_step for r in runs}
    for run, df in kernels.groupby("run", sort=False):
        tps = tokens.get(run)
        if not tps:
            continue
        steps = df["num_steps"].where(df["num_steps"] > 0)
        per_step = (df["total_s"] / steps).groupby(df["kernel_class"]).sum()
        out[str(run)] = {c: float(per_step.get(c, 0.0)) / float(tps) * 1e3 for c in KERNEL_CLASSES}
    return out


def _engine_median(peers: Sequence[str], cls: str, ms: Mapping[str, Mapping[str, float]],
                   engines: Mapping[str, str]) -> float:
    """Median over engines of each engine's median ms/token of class ``cls`` among ``peers``."""
    by_engine: dict[str, list[float]] = {}
    for p in peers:
        by_engine.setdefault(engines[p], []).append(ms[p][cls])
    return statistics.median(statistics.median(v) for v in by_engine.values())


def build_parity_rows(kernels: pd.DataFrame | None, runs: Sequence[LoadedRun], *, timelines: Mapping[str, str],
                      thresholds: Mapping[str, float] | None = None) -> tuple[ParityRow, ...]:
    """One ParityRow per run (campaign order). timelines: run -> "gpu" | "cpu" of its trace."""
    t = {**THRESHOLDS, **(thresholds or {})}
    ms = compute_ms_per_token(kernels, runs)
    equal = {r.name: int(r.spec.tp_degree or 1) == 1 and int(r.spec.pp_degree or 1) == 1
             and int(r.spec.world_size or 1) == 1 for r in runs}
    engines = {r.name: f"{r.spec.strategy}/{r.spec.engine}" for r in runs}
    groups: dict[str, list[str]] = {}
    for r in runs:
        if equal[r.name] and r.name in ms and r.status_name == "ok":
            groups.setdefault(kernels_mode(r), []).append(r.name)
    rows = []
    for r in runs:
        name, k = r.name, run_kernels(r)
        mine = ms.get(name)
        passed = failed_class = failed_diff = reason = None
        peers = groups.get(kernels_mode(r), [])
        if mine is None:
            reason = "no trace"
        elif not equal[name]:
            reason = "not at equal math (the check needs tp = pp = world = 1)"
        elif len(peers) < 2 or name not in peers:
            reason = "no other traced run at equal math with the same kernels to compare with"
        else:
            non_comm = sum(mine[c] for c in NON_COMM_CLASSES)
            worst = None
            for c in NON_COMM_CLASSES:
                ref = _engine_median(peers, c, ms, engines)
                if ref <= 0:
                    continue
                diff = mine[c] / ref - 1
                if abs(diff) > t["parity_tolerance"] and abs(mine[c] - ref) > t["parity_min_share"] * non_comm:
                    if worst is None or abs(diff) > abs(worst[1]):
                        worst = (c, diff, mine[c], ref)
            passed = worst is None
            if worst:
                failed_class, failed_diff = worst[0], worst[1]
                reason = (f"{worst[0]} {worst[1]:+.0%} vs the median over engines of equal-math runs with the same kernels"
                          f" ({worst[2]:.4g} vs {worst[3]:.4g} ms/token)")
        rows.append(ParityRow(
            run=name, mode=str(k.get("mode") or "unrecorded"), loss=k.get("loss"), attention=k.get("attention"),
            optimizer=k.get("optimizer"), compile=k.get("compile"),
            not_taken=tuple(sorted((k.get("not_taken") or {}).items())), timeline=timelines.get(name),
            ms_per_token=tuple((c, mine[c]) for c in KERNEL_CLASSES) if mine else (),
            equal_math=equal[name], passed=passed, failed_class=failed_class, failed_diff=failed_diff, reason=reason))
    return tuple(rows)


@dataclass(frozen=True, kw_only=True)
class NotLayoutOnlyEvidence(Evidence):
    """not_layout_only: (run, kernel class, relative difference) of each run that failed the parity check."""

    classes: tuple[tuple[str, str | None, float | None], ...]


@dataclass(frozen=True, kw_only=True)
class RepeatSpreadEvidence(Evidence):
    """margin_beyond_repeats / margin_within_repeats: the medians' margin (tokens/s ratio - 1),
    the larger relative half-width of the two intervals, the fewer repeats, both intervals
    (tokens/s) and how they were computed."""

    margin: float
    spread: float
    num_repeats: int
    fastest_interval: tuple[float, float]
    runner_up_interval: tuple[float, float]
    method: str


def rule_parity(rows: Sequence[ParityRow]) -> list[Finding]:
    """``not_layout_only`` when a run at equal math fails the parity check: its throughput gap to
    the others is partly kernels, not layout. Evidence: (run, class, relative difference)."""
    failed = [r for r in rows if r.passed is False]
    if not failed:
        return []
    return [Finding(kind="not_layout_only", runs=tuple(r.run for r in failed), evidence=NotLayoutOnlyEvidence(
        classes=tuple((r.run, r.failed_class, r.failed_diff) for r in failed)))]


def t_interval(values: Sequence[float]) -> tuple[float, float] | None:
    """95% Student-t interval of the mean of ``values`` (n >= 2), else None. The lower end is
    clamped at 0 (a throughput is never negative; with 2 repeats t = 12.7 makes wide intervals)."""
    n = len(values)
    if n < 2:
        return None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    q = T_975[n - 2] if n - 1 <= len(T_975) else 1.96
    half = q * sd / math.sqrt(n)
    return max(0.0, mean - half), mean + half


def build_repeat_groups(runs: Sequence[LoadedRun], summary: Sequence[RunSummary]) -> tuple[RepeatGroup, ...]:
    """Groups of repeated runs (runs with ``options.repeat``) that ended ok with a tokens/s, by
    (layout, data round, kernels mode), in campaign order of first appearance."""
    tps = {s.run: s.tokens_per_s for s in summary}
    keyed: dict[tuple[str, str, str], list[str]] = {}
    for r in runs:
        if run_repeat(r) is None or r.status_name != "ok" or tps.get(r.name) is None:
            continue
        key = (str(r.spec.layout or r.name), str(r.spec.data_round or "synthetic"), kernels_mode(r))
        keyed.setdefault(key, []).append(r.name)
    out = []
    for (layout, data_round, mode), names in keyed.items():
        values = [float(tps[n]) for n in names]
        ordered = sorted(zip(values, names))
        rep = ordered[(len(ordered) - 1) // 2][1]  # the median, the lower middle one for an even count
        ci = t_interval(values)
        out.append(RepeatGroup(layout=layout, data_round=data_round, mode=mode, runs=tuple(names),
                               tokens_per_s=tuple(values), median_tokens_per_s=statistics.median(values),
                               ci_low=ci[0] if ci else None, ci_high=ci[1] if ci else None, representative=rep))
    return tuple(out)


def ranking_mode(runs: Sequence[LoadedRun]) -> str:
    """The kernels mode the note ranks: parity when any run has it, else engine-best, else unrecorded."""
    modes = {kernels_mode(r) for r in runs}
    return "parity" if "parity" in modes else ("engine-best" if "engine-best" in modes else "unrecorded")


def ranked_runs(runs: Sequence[LoadedRun], groups: Sequence[RepeatGroup], *, first_round: str) -> list[bool]:
    """Which runs enter the ranking: the first data round's, of one kernels mode (parity when any
    run has it: engine-best runs are never ranked against parity runs), and of a repeated layout
    only its representative (the median repeat)."""
    mode = ranking_mode(runs)
    reps = {g.representative for g in groups}
    repeated = {n for g in groups for n in g.runs}
    return [(str(r.spec.data_round or "synthetic") == first_round and kernels_mode(r) == mode
             and (r.name not in repeated or r.name in reps)) for r in runs]


def rule_repeat_spread(groups: Sequence[RepeatGroup], fastest: Finding | None) -> list[Finding]:
    """The recommendation's margin against run-to-run spread: with the fastest layout and the
    runner-up both repeated, ``margin_beyond_repeats`` when the fastest's interval lies wholly above
    the runner-up's, else ``margin_within_repeats``. Evidence: both medians, intervals, the margin
    of the medians and the larger relative half-width (the spread)."""
    if fastest is None or len(fastest.runs) < 2:
        return []
    by_rep = {g.representative: g for g in groups}
    a, b = by_rep.get(fastest.runs[0]), by_rep.get(fastest.runs[1])
    if a is None or b is None or None in (a.ci_low, a.ci_high, b.ci_low, b.ci_high):
        return []
    margin = a.median_tokens_per_s / b.median_tokens_per_s - 1
    spread = max((a.ci_high - a.ci_low) / 2 / a.median_tokens_per_s, (b.ci_high - b.ci_low) / 2 / b.median_tokens_per_s)
    kind = "margin_beyond_repeats" if a.ci_low > b.ci_high else "margin_within_repeats"
    return [Finding(kind=kind, runs=(a.layout, b.layout), evidence=RepeatSpreadEvidence(
        margin=margin, spread=spread, num_repeats=min(len(a.runs), len(b.runs)),
        fastest_interval=(a.ci_low, a.ci_high), runner_up_interval=(b.ci_low, b.ci_high), method=INTERVAL_METHOD))]
