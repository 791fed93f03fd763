"""`report diff`: compare two campaigns run by run, from their CampaignSummary records
(report.summary.build_campaign_summary: the numbers of each note's own view-model, the same as
its summary.json).

Per run present in both: old -> new, delta and relative change of throughput, MFU, step time,
memory peaks and the section-5 shares; a regression flag where a metric moved the wrong way by
more than the threshold (relative), or where a run that ended ok no longer does -- only between
campaigns of the same fixed variables (model, sequence length, global batch, dtype) on the same
GPU count; across different ones the diff says they are not comparable and judges nothing. Runs present on
one side only are listed; environment fields that differ are marked. Records in, records out:
deliberately no formatting (report/templates/diff.*.j2 and report.render's filters) and no file access.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from core.records import RunSummary
from report.summary import BREAKDOWN_SHARES, VERSION_KEYS, BreakdownShares, CampaignSummary, EnvironmentSummary

# (field, unit, better): better is "higher" / "lower" for metrics whose move beyond the threshold
# is a regression (throughput down, step time up, memory up), None for those shown only (MFU
# follows tokens/s; shares move between categories and are read, not judged).
METRICS: tuple[tuple[str, str, str | None], ...] = (
    ("tokens_per_s", "tokens_per_s", "higher"),
    ("tokens_per_s_per_gpu", "tokens_per_s", None),
    ("mfu", "fraction", None),
    ("step_time_median_s", "s", "lower"),
    ("step_time_p90_s", "s", None),
    ("mem_peak_allocated_gib", "gib", "lower"),
    ("mem_peak_reserved_gib", "gib", "lower"),
) + tuple((share, "share", None) for share in BREAKDOWN_SHARES)
# the fixed variables (model shape with its sequence length, global batch, dtype): when one differs the
# campaigns measure different workloads, so no change between them is a regression
FIXED_FIELDS = ("model", "global_batch_size", "dtype")
# and the GPU count (or node count): a run of the same name is then another layout (its world size)
NOT_COMPARABLE_FIELDS = (*FIXED_FIELDS, "gpu_count", "num_nodes")
ENV_FIELDS = ("gpu_name", "gpu_count", "driver_version", *(f"{k}_version" for k in VERSION_KEYS), "num_nodes",
              "tool_git_commit", *FIXED_FIELDS)


@dataclass(frozen=True, kw_only=True)
class MetricDelta:
    metric: str
    unit: str  # "tokens_per_s" | "fraction" | "s" | "gib" | "share": how the template prints it
    old: float | None
    new: float | None
    delta: float | None  # new - old, in the metric's unit
    rel_change: float | None  # delta / old; None when old is missing or 0
    regression: bool


@dataclass(frozen=True, kw_only=True)
class RunDiff:
    run: str
    old_status: str
    new_status: str
    metrics: tuple[MetricDelta, ...]
    regressions: tuple[str, ...]  # metric names flagged, "status" when an ok run no longer is


@dataclass(frozen=True, kw_only=True)
class EnvChange:
    field: str
    old: Any
    new: Any
    changed: bool


@dataclass(frozen=True, kw_only=True)
class CampaignRef:
    campaign: str
    source: str
    created_at: str | None
    tool_git_commit: str | None


@dataclass(frozen=True, kw_only=True)
class Diff:
    """The comparison note's view-model."""

    title: str
    old: CampaignRef
    new: CampaignRef
    threshold: float
    runs: tuple[RunDiff, ...]
    only_old: tuple[str, ...]
    only_new: tuple[str, ...]
    env: tuple[EnvChange, ...]
    mfu_conventions: tuple[str | None, str | None]
    not_comparable: tuple[str, ...] = ()  # NOT_COMPARABLE_FIELDS that differ: numbers side by side, nothing judged

    @property
    def comparable(self) -> bool:
        return not self.not_comparable

    @property
    def regressed_runs(self) -> tuple[RunDiff, ...]:
        return tuple(r for r in self.runs if r.regressions)

    @property
    def env_changed(self) -> tuple[EnvChange, ...]:
        return tuple(e for e in self.env if e.changed)


def compute_metric_delta(old: float | None, new: float | None, *, metric: str, unit: str, better: str | None,
                         threshold: float) -> MetricDelta:
    """One metric old -> new. regression: |rel_change| > threshold in the worse direction
    (better = "higher": fell; "lower": rose); never when either side is missing."""
    delta = None if old is None or new is None else new - old
    rel = None if delta is None or not old else delta / old
    worse = rel is not None and better is not None and (-rel if better == "higher" else rel) > threshold
    return MetricDelta(metric=metric, unit=unit, old=old, new=new, delta=delta, rel_change=rel, regression=worse)


def _value(run: RunSummary, shares: BreakdownShares | None, metric: str) -> float | None:
    if metric in BREAKDOWN_SHARES:
        return getattr(shares, metric) if shares is not None else None
    return getattr(run, metric)


def compute_run_diffs(old: CampaignSummary, new: CampaignSummary, *,
                      threshold: float, judge: bool = True) -> tuple[list[RunDiff], list[str], list[str]]:
    """Both campaigns' runs -> (per-run diffs for names in both, in the new campaign's order;
    names only in old; names only in new). judge=False (campaigns that are not comparable):
    deltas only, no metric or status flagged as a regression."""
    old_by = {r.run: r for r in old.runs}
    new_names = {r.run for r in new.runs}
    diffs = []
    for n in new.runs:
        o = old_by.get(n.run)
        if o is None:
            continue
        rows = tuple(compute_metric_delta(_value(o, old.shares.get(o.run), m), _value(n, new.shares.get(n.run), m),
                                          metric=m, unit=u, better=b if judge else None, threshold=threshold)
                     for m, u, b in METRICS)
        flagged = tuple(d.metric for d in rows if d.regression)
        if judge and o.status == "ok" and n.status != "ok":
            flagged = ("status", *flagged)
        diffs.append(RunDiff(run=n.run, old_status=o.status, new_status=n.status, metrics=rows, regressions=flagged))
    only_old = [r.run for r in old.runs if r.run not in new_names]
    only_new = [r.run for r in new.runs if r.run not in old_by]
    return diffs, only_old, only_new


def compute_env_changes(old_env: EnvironmentSummary, new_env: EnvironmentSummary) -> list[EnvChange]:
    """The summary's environment fields side by side, ``changed`` where they differ."""
    return [EnvChange(field=f, old=getattr(old_env, f), new=getattr(new_env, f),
                      changed=getattr(old_env, f) != getattr(new_env, f))
            for f in ENV_FIELDS]


def build_diff(old: CampaignSummary, new: CampaignSummary, *, threshold: float, old_source: str = "",
               new_source: str = "") -> Diff:
    """Two campaigns (report.summary.build_campaign_summary) -> the comparison view-model.
    threshold: relative change (0.05 = 5%) beyond which a metric's worse move is a regression.
    Campaigns whose fixed variables or GPU/node count (NOT_COMPARABLE_FIELDS) differ are not
    comparable: ``not_comparable`` names the fields and no run is flagged."""
    env = compute_env_changes(old.environment, new.environment)
    not_comparable = tuple(e.field for e in env if e.field in NOT_COMPARABLE_FIELDS and e.changed)
    runs, only_old, only_new = compute_run_diffs(old, new, threshold=threshold, judge=not not_comparable)

    def ref(s: CampaignSummary, source: str) -> CampaignRef:
        return CampaignRef(campaign=s.campaign, source=source, created_at=s.created_at,
                           tool_git_commit=s.tool_git_commit)

    return Diff(title=f"Campaign comparison: {old.campaign} → {new.campaign}", old=ref(old, old_source),
                new=ref(new, new_source), threshold=threshold, runs=tuple(runs), only_old=tuple(only_old),
                only_new=tuple(only_new),
                env=tuple(env), mfu_conventions=(old.mfu_convention, new.mfu_convention),
                not_comparable=not_comparable)
