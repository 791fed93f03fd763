"""Section 5's numbers: where each run's step time goes, from the profiler traces' tables.

DataFrame in, DataFrame out (or the small frozen records below for one run's straggler, pipeline
stages and collectives). Inputs are the tables ingest builds from the traces
(core.records StepBreakdownRow / KernelSummaryRow columns), the step rows (StepRow) and the
profiler-window metadata (trace/profile_meta_rank<r>.json). Nothing here reads files,
rounds, formats or plots.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from core.records import ATTRIBUTION_CATEGORIES, BREAKDOWN_CATEGORIES, KERNEL_CLASSES, CommBenchRow, Plant

@dataclass(frozen=True, kw_only=True)
class TraceStraggler:
    """The rank the others wait for inside the traced steps (compute_trace_straggler): late in
    late_steps of num_steps; the wait it caused per step, median and p90 (ms); cause: its most
    frequent late_cause; named: the median wait reaches the threshold share of the step; host:
    the one host every rank ran on, or None."""

    rank: int
    host: str | None
    late_steps: int
    num_steps: int
    late_ms_median: float
    late_ms_p90: float
    cause: str | None
    named: bool


@dataclass(frozen=True, kw_only=True)
class GroupStraggler:
    """One process group's own late rank (compute_group_stragglers): late in late_steps of
    num_steps of the group's steps; the wait it caused per step, median and p90 (ms)."""

    group: str
    num_ranks: int
    rank: int
    late_steps: int
    num_steps: int
    wait_ms_median: float
    wait_ms_p90: float


@dataclass(frozen=True, kw_only=True)
class StageBalance:
    """A pipeline run's stages (compute_stage_balance): each stage's compute per step (s, stage
    order) and its layers; split / predicted_max_stage_s: the layer split that balances them and
    its slowest stage (s; balance_layers; None when not computable); imbalance_s: max - mean stage
    compute. How the split was predicted and checked (report.view.link_stage_predictions):
    source_run (the evenly split run whose per-layer cost gave it; None: this run's own), check_run
    / check_layers / check_error (a run of this layout with another split and the largest stage
    error there; None: no such run)."""

    stage_compute_s: tuple[float, ...]
    layers: tuple[int, ...]
    split: tuple[int, ...] | None = None
    predicted_max_stage_s: float | None = None
    imbalance_s: float | None = None
    source_run: str | None = None
    check_run: str | None = None
    check_layers: tuple[int, ...] | None = None
    check_error: float | None = None


@dataclass(frozen=True, kw_only=True)
class CollectiveBandwidth:
    """One collective kind at one size in a run (compute_collective_bandwidth): calls, median and
    total transfer time (s), achieved bus bandwidth (GB/s, nccl-tests convention) and `runner
    commbench`'s at the nearest measured size (None: none within a factor of 2)."""

    kind: str
    nbytes: int
    num_calls: int
    transfer_s: float
    total_s: float
    busbw_gbps: float | None
    commbench_busbw_gbps: float | None
    commbench_nbytes: int | None


@dataclass(frozen=True, kw_only=True)
class AttributionView:
    """Section 5, one run, across its ranks (summarize_attribution and friends; built by
    report.attribution.build_attribution),
    keyed by ATTRIBUTION_KEYS: traced_ms (ms per traced step, the kernels' own time; its median
    and p90 over the traced steps: traced_median_ms, traced_p90_ms), shares (of
    the traced step), breakdown_ms (traced_ms with the profiled steps' extra host time,
    profile_host_ms, taken from launch gaps then other to reach the unprofiled median step),
    saving_ms / saving_method (ingest.whatif: what removing each cause saves per step, signed,
    None where no what-if applies; "replay" or "analytic"), replay_step_ms (the trace replayed
    as recorded: the replay's own error against traced_step_s); per_rank: rank -> category -> s
    per traced step, rescale: traced step / unprofiled median step; straggler
    (compute_trace_straggler), stages (compute_stage_balance, PP runs), bandwidth
    (compute_collective_bandwidth rows), plant: the planted cause (matrix ``plant`` table, RunSpec.plant)
    or None when nothing is planted;
    groups: each process group's own late rank (compute_group_stragglers)."""

    breakdown_ms: Mapping[str, float | None]
    shares: Mapping[str, float | None]
    traced_ms: Mapping[str, float | None]
    traced_median_ms: Mapping[str, float]
    traced_p90_ms: Mapping[str, float]
    saving_ms: Mapping[str, float | None]
    saving_method: Mapping[str, str | None]
    replay_step_ms: float | None
    profile_host_ms: float
    per_rank: Mapping[int, Mapping[str, float]]
    traced_step_s: float
    median_step_s: float | None
    rescale: float | None
    num_launch_gaps: float
    launch_gap_p50_s: float | None
    launch_gap_max_s: float | None
    straggler: TraceStraggler | None
    stages: StageBalance | None
    bandwidth: tuple[CollectiveBandwidth, ...]
    groups: tuple[GroupStraggler, ...]
    plant: Plant | None


def compute_category_separations(winner: AttributionView, runner_up: AttributionView) -> tuple[dict[str, float], bool]:
    """Per category, ms per step the runner-up loses beyond the winner (signed): the runner-up's
    what-if saving minus the winner's (ingest.whatif; a run where no what-if applies saves 0), or,
    for a category neither has a what-if for (compute, other), its traced time minus the
    winner's. -> (separations, whether any category fell back to traced time)."""
    out, traced = {}, False
    for cat in winner.traced_ms:
        sa, sb = winner.saving_ms.get(cat), runner_up.saving_ms.get(cat)
        if sa is not None or sb is not None:
            out[cat] = (sb or 0.0) - (sa or 0.0)
        else:
            traced = True
            out[cat] = (runner_up.traced_ms.get(cat) or 0.0) - (winner.traced_ms.get(cat) or 0.0)
    return out, traced


@dataclass(frozen=True, kw_only=True)
class BreakdownRow:
    """Section 5, one run: mean seconds per analysed (rank, step) of each category on the
    profiled steps, their shares, and the cross-checks (built by report.view.build_evidence)."""

    run: str
    timeline: str  # "gpu" | "cpu"
    num_ranks: int
    num_steps: int
    step_time_s: float
    recorded_step_time_s: float | None
    sum_error: float | None
    median_step_time_s: float | None  # the metric table's median (unprofiled steps)
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    data_stall_s: float
    other_s: float
    compute_share: float | None
    exposed_comm_share: float | None
    bubble_share: float | None
    data_stall_share: float | None
    other_share: float | None
    hidden_comm_s: float
    idle_s: float
    pp_degree: int
    num_microbatches: int
    bubble_expected: float | None  # (p-1)/(m+p-1) when pp_degree > 1
    compute_imbalance: float | None
    compute_min_rank: int | None
    compute_max_rank: int | None
    top_kernels: tuple[tuple[str, str, float], ...]  # (name, class, share of kernel time)
    class_shares: tuple[tuple[str, float | None], ...]  # (kernel class, share)
    profile_cost_s: float | None
    profile_cost_share: float | None
    export_s: float | None
    nccl: tuple[str, ...]  # NCCL topology/transport lines from the run's rank logs
    attribution: AttributionView | None = None  # the cross-rank attribution (ingest.attribution)


BREAKDOWN_SUMMARY_COLUMNS = (
    "run", "timeline", "num_ranks", "num_steps", "step_time_s", "recorded_step_time_s", "sum_error",
    *(f"{c}_s" for c in BREAKDOWN_CATEGORIES), *(f"{c}_share" for c in BREAKDOWN_CATEGORIES),
    "hidden_comm_s", "idle_s", "compute_min_rank", "compute_max_rank", "compute_imbalance",
)


def summarize_breakdown(breakdown: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per run: mean seconds per analysed (rank, step) for each category of
    BREAKDOWN_CATEGORIES, their shares of the mean step interval (they sum to 1 by
    construction), and the cross-check against the recorder.

    recorded_step_time_s: mean of the StepRow.step_time_s of the same (rank, step) pairs
    (CUDA events / perf_counter, independent of the profiler); sum_error = |step_time_s -
    recorded_step_time_s| / recorded_step_time_s (issue 4 asks for <= 2%). Per step the two
    can differ where a step's batch fetch falls (ingest.traces: the window's first fetch is
    outside it, the dropped step's is inside); over the window they measure the same time. compute_imbalance:
    max over ranks of mean compute_s divided by the min (1.0 = balanced; pipeline stage
    imbalance on PP runs, DESIGN.md "stage imbalance"), with the two ranks named.
    """
    if breakdown.empty:
        return pd.DataFrame(columns=list(BREAKDOWN_SUMMARY_COLUMNS))
    rows = []
    recorded = steps.set_index(["run", "rank", "step"])["step_time_s"] if not steps.empty else pd.Series(dtype=float)
    for run, df in breakdown.groupby("run", sort=False):
        interval = float(df["step_time_s"].mean())
        row = {"run": run, "timeline": df["timeline"].iloc[0], "num_ranks": int(df["rank"].nunique()),
               "num_steps": int(df["step"].nunique()), "step_time_s": interval,
               "hidden_comm_s": float(df["hidden_comm_s"].mean()), "idle_s": float(df["idle_s"].mean())}
        for c in BREAKDOWN_CATEGORIES:
            row[f"{c}_s"] = float(df[f"{c}_s"].mean())
            row[f"{c}_share"] = row[f"{c}_s"] / interval if interval > 0 else None
        keys = list(zip([run] * len(df), df["rank"], df["step"]))
        matched = recorded.reindex(keys).dropna() if len(recorded) else pd.Series(dtype=float)
        row["recorded_step_time_s"] = float(matched.mean()) if len(matched) else None
        row["sum_error"] = (abs(interval - row["recorded_step_time_s"]) / row["recorded_step_time_s"]
                            if row["recorded_step_time_s"] else None)
        per_rank = df.groupby("rank")["compute_s"].mean()
        row["compute_min_rank"], row["compute_max_rank"] = int(per_rank.idxmin()), int(per_rank.idxmax())
        row["compute_imbalance"] = float(per_rank.max() / per_rank.min()) if per_rank.min() > 0 else None
        rows.append(row)
    return pd.DataFrame(rows, columns=list(BREAKDOWN_SUMMARY_COLUMNS))


def summarize_kernel_classes(kernels: pd.DataFrame) -> pd.DataFrame:
    """Per run: share of summed kernel time per KERNEL_CLASSES class (columns ``<class>_share``)
    and the top kernel by time (``top_kernel``, ``top_kernel_share``). Shares are of summed
    durations over all ranks (overlapping kernels count twice, as in nsys cuda_gpu_kern_sum)."""
    cols = ["run", *(f"{c}_share" for c in KERNEL_CLASSES), "top_kernel", "top_kernel_share", "total_s"]
    if kernels.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for run, df in kernels.groupby("run", sort=False):
        total = float(df["total_s"].sum())
        by_class = df.groupby("kernel_class")["total_s"].sum()
        by_name = df.groupby("name")["total_s"].sum().sort_values(ascending=False)
        row = {"run": run, "total_s": total}
        for c in KERNEL_CLASSES:
            row[f"{c}_share"] = float(by_class.get(c, 0.0)) / total if total > 0 else None
        row["top_kernel"] = str(by_name.index[0]) if len(by_name) else None
        row["top_kernel_share"] = float(by_name.iloc[0]) / total if len(by_name) and total > 0 else None
        rows.append(row)
    return pd.DataFrame(rows, columns=cols)


@dataclass(frozen=True, kw_only=True)
class KernelShares:
    """One traced run's kernel time by class (summarize_kernel_classes): class -> share of summed
    kernel time for every KERNEL_CLASSES class (None without kernel time), and the top kernel by
    time with its share (None without kernels)."""

    run: str
    shares: Mapping[str, float | None]
    top_kernel: str | None
    top_kernel_share: float | None


def build_kernel_shares(table: pd.DataFrame) -> list[KernelShares]:
    """summarize_kernel_classes' table -> one KernelShares per run, in table order (NaN as None)."""
    def value(v: Any) -> Any:
        return None if v is None or pd.isna(v) else (v.item() if hasattr(v, "item") else v)

    return [KernelShares(run=str(r["run"]), shares={c: value(r[f"{c}_share"]) for c in KERNEL_CLASSES},
                         top_kernel=value(r["top_kernel"]), top_kernel_share=value(r["top_kernel_share"]))
            for r in table.to_dict("records")]


def top_kernels(kernels: pd.DataFrame, *, run: str, num: int = 5) -> pd.DataFrame:
    """The ``num`` kernels of ``run`` with the largest summed time over its ranks. Columns
    name, kernel_class, num_calls, total_s, share (of the run's summed kernel time)."""
    df = kernels[kernels["run"] == run]
    if df.empty:
        return pd.DataFrame(columns=["name", "kernel_class", "num_calls", "total_s", "share"])
    agg = df.groupby(["name", "kernel_class"], as_index=False).agg(num_calls=("num_calls", "sum"),
                                                                   total_s=("total_s", "sum"))
    agg["share"] = agg["total_s"] / float(df["total_s"].sum())
    return agg.sort_values("total_s", ascending=False).head(num).reset_index(drop=True)


def compute_profile_cost(steps: pd.DataFrame, meta: pd.DataFrame, *, warmup_steps: int = 0) -> pd.DataFrame:
    """What the profiler window cost each run, against the run's time outside the window.

    Per step, the step time is the max over ranks. cost_s = sum of the window's step times
    (warm-up step included) - (window length x median step time outside the window and
    after step 0) + the slowest rank's trace export_s (export runs between steps, outside
    every step's time). outside_s = sum of step times outside the window from warmup_steps on
    (warm-up and compile steps are not the run's measured time). share = cost_s / outside_s. meta: columns run, rank, export_s. Columns run,
    num_window_steps, window_s, baseline_step_s, export_s, cost_s, outside_s, share.
    """
    cols = ["run", "num_window_steps", "window_s", "baseline_step_s", "export_s", "cost_s", "outside_s", "share"]
    if steps.empty or meta.empty or "profiled" not in steps:
        return pd.DataFrame(columns=cols)
    rows = []
    for run, df in steps.groupby("run", sort=False):
        m = meta[meta["run"] == run]
        if m.empty:
            continue
        per_step = df.groupby("step").agg(step_time_s=("step_time_s", "max"),
                                          profiled=("profiled", lambda s: bool(s.fillna(False).astype(bool).any())))
        window = per_step[per_step["profiled"]]
        outside = per_step[~per_step["profiled"] & (per_step.index >= warmup_steps)]
        if window.empty or outside.empty:
            continue
        baseline = float(np.median(outside["step_time_s"]))
        export_s = float(m["export_s"].max())
        cost = float(window["step_time_s"].sum()) - len(window) * baseline + export_s
        outside_s = float(outside["step_time_s"].sum())
        rows.append({"run": run, "num_window_steps": len(window), "window_s": float(window["step_time_s"].sum()),
                     "baseline_step_s": baseline, "export_s": export_s, "cost_s": cost, "outside_s": outside_s,
                     "share": cost / outside_s if outside_s > 0 else None})
    return pd.DataFrame(rows, columns=cols)


@dataclass(frozen=True, kw_only=True)
class ProfileTable:
    """One report of a summary table a user brought (summarize_profile_tables): its source file,
    report name (None: the file has one), the time column ranked by, and its top rows
    (name, time_s, share of the column's sum or None, num_calls or None)."""

    source: str
    report: str | None
    time_column: str
    rows: tuple[tuple[str, float, float | None, int | None], ...]


def summarize_profile_tables(kernels: pd.DataFrame, *, num: int = 8) -> list[ProfileTable]:
    """Lower-resolution evidence from summary tables users bring (torch.profiler key_averages,
    nsys stats): per (source file, report), the ``num`` rows with the largest time. Time is
    the row's ``total_s`` (nsys) or self CUDA, else CUDA total, else self CPU time (profiler
    tables); share = time / the sum of that column over the report (so nested ops in a
    profiler table's CUDA-total column can sum past 100%)."""
    out = []
    if kernels is None or kernels.empty:
        return out
    df = kernels.copy()
    df["report"] = df["report"].fillna("") if "report" in df else ""
    for (source, report), g in df.groupby(["source", "report"], sort=False):
        column = next((c for c in ("total_s", "self_cuda_s", "cuda_total_s", "self_cpu_s")
                       if c in g and g[c].notna().any()), None)
        if column is None:
            continue
        g = g.dropna(subset=[column]).sort_values(column, ascending=False)
        total = float(g[column].sum())
        rows = [(str(r["name"]), float(r[column]), float(r[column]) / total if total > 0 else None,
                 None if pd.isna(r.get("num_calls")) else int(r["num_calls"])) for _, r in g.head(num).iterrows()]
        out.append(ProfileTable(source=str(source), report=str(report) or None, time_column=column, rows=tuple(rows)))
    return out


ATTRIBUTION_KEYS = ATTRIBUTION_CATEGORIES


def summarize_attribution(attribution: pd.DataFrame, *, run: str, median_step_s: float | None) -> dict | None:
    """One run's critical-path attribution (ingest.attribution rows) as the note shows it.

    Per rank: mean seconds per analysed step of each ATTRIBUTION_KEYS category. The run: the
    mean over ranks (each rank's categories tile the same steps). traced_ms: those means in ms
    (absolute: the kernels' own time); shares: category / traced step (sum 1). breakdown_ms:
    traced_ms with the profiled steps' extra host time removed to reach the unprofiled median
    step: on GPU timelines the difference (median - traced, ``profile_host_ms``) goes to launch
    gaps, then to skew wait (waits for a slower host), then to "other" (host time; the profiler
    slows the host, not the kernels), none below 0; what they cannot absorb, and on CPU timelines (the profiler slows every host op) all of
    it, goes to every category in proportion. Without a median, traced_ms. rescale: traced step / unprofiled median step. launch gaps: mean count
    per rank-step, median of the per-step median gap and the largest gap (s). traced_median_ms /
    traced_p90_ms: each category's median and 90th percentile over the traced steps (each step
    the mean over ranks; numpy percentile, linear). None when the run has no rows."""
    df = attribution[attribution["run"] == run] if not attribution.empty else attribution
    if df.empty:
        return None
    cols = [f"{c}_s" for c in ATTRIBUTION_KEYS]
    per_rank = df.groupby("rank")[cols + ["step_time_s"]].mean()
    mean = per_rank.mean(axis=0)
    traced = float(mean["step_time_s"])
    shares = {c: float(mean[f"{c}_s"]) / traced if traced > 0 else None for c in ATTRIBUTION_KEYS}
    traced_ms = {c: float(mean[f"{c}_s"]) * 1e3 for c in ATTRIBUTION_KEYS}
    per_step = df.groupby("step")[cols].mean()  # the mean over ranks of each traced step
    traced_median_ms = {c: float(np.percentile(per_step[f"{c}_s"], 50)) * 1e3 for c in ATTRIBUTION_KEYS}
    traced_p90_ms = {c: float(np.percentile(per_step[f"{c}_s"], 90)) * 1e3 for c in ATTRIBUTION_KEYS}
    host_ms = (median_step_s - traced) * 1e3 if median_step_s else 0.0
    breakdown_ms = dict(traced_ms)
    timeline = str(df["timeline"].iloc[0])
    left = host_ms
    if timeline == "gpu":  # on a CPU timeline the host is the device: the profiler slows every op
        for cat in ("launch_gaps", "skew_wait", "other"):
            moved = max(left, -breakdown_ms[cat])
            breakdown_ms[cat] += moved
            left -= moved
    total = sum(breakdown_ms.values())
    if left and total > 0:  # what the host categories cannot absorb: in proportion to every category
        breakdown_ms = {c: v * (total + left) / total for c, v in breakdown_ms.items()}
    return {
        "run": run, "timeline": timeline, "num_ranks": int(df["rank"].nunique()),
        "num_steps": int(df["step"].nunique()), "traced_step_s": traced, "median_step_s": median_step_s,
        "rescale": traced / median_step_s if median_step_s else None,
        "shares": shares, "traced_ms": traced_ms, "traced_median_ms": traced_median_ms,
        "traced_p90_ms": traced_p90_ms, "breakdown_ms": breakdown_ms,
        "profile_host_ms": host_ms - left if timeline == "gpu" else 0.0,
        "per_rank": {int(r): {c: float(per_rank.loc[r, f"{c}_s"]) for c in ATTRIBUTION_KEYS}
                     for r in per_rank.index},
        "num_launch_gaps": float(df["num_launch_gaps"].mean()),
        "launch_gap_p50_s": float(df["launch_gap_p50_s"].dropna().median()) if df["launch_gap_p50_s"].notna().any() else None,
        "launch_gap_max_s": float(df["launch_gap_max_s"].dropna().max()) if df["launch_gap_max_s"].notna().any() else None,
    }


def summarize_whatif(whatif: pd.DataFrame | None, *, run: str) -> dict | None:
    """One run's what-if savings (ingest.whatif rows): saving_ms (category -> ms per step, signed;
    None: no what-if), method (category -> "replay" / "analytic" / None), replay_step_ms and
    traced_step_ms (the replay of the trace as recorded, and the traced mean step). None when
    the run has no rows."""
    if whatif is None or whatif.empty:
        return None
    df = whatif[whatif["run"] == run]
    if df.empty:
        return None

    def ms(x: Any) -> float | None:
        return None if x is None or pd.isna(x) else float(x) * 1e3

    first = df.iloc[0]
    return {"saving_ms": {str(r.category): ms(r.saving_s) for r in df.itertuples()},
            "method": {str(r.category): (None if r.method is None or pd.isna(r.method) else str(r.method))
                       for r in df.itertuples()},
            "replay_step_ms": ms(first["replay_step_s"]), "traced_step_ms": ms(first["traced_step_s"])}


def compute_trace_straggler(attribution: pd.DataFrame, *, run: str, min_fraction: float,
                            hosts: Mapping[int, str] | None = None) -> TraceStraggler | None:
    """The rank the others wait for inside the steps, from the traces (ingest.attribution's
    per-step late rank and the exposed wait it caused).

    Per rank: late_steps (analysed steps in which it was the late rank); the straggler is the
    rank late in most steps. late_s per step: the wait it caused (0 in steps where another rank
    was late); late_ms_median / late_ms_p90 over the analysed steps (numpy percentile, linear).
    cause: its most frequent late_cause. named: late_ms_median >= min_fraction x the mean traced
    step. None with fewer than 2 ranks or when no rank was ever late."""
    df = attribution[attribution["run"] == run] if not attribution.empty else attribution
    if df.empty or df["rank"].nunique() < 2:
        return None
    late = df[df["late"].astype(bool)]
    if late.empty:
        return None
    counts = late.groupby("rank").size()
    rank = int(counts.sort_values(ascending=False, kind="stable").index[0])
    steps = sorted(df["step"].unique().tolist())
    caused = late[late["rank"] == rank].set_index("step")["late_caused_wait_s"]
    per_step = np.array([float(caused.get(s, 0.0)) for s in steps])
    step_s = float(df.groupby("rank")["step_time_s"].mean().mean())
    median_s = float(np.percentile(per_step, 50))
    cause = late[late["rank"] == rank]["late_cause"].mode()
    return TraceStraggler(rank=rank, host=(hosts or {}).get(rank), late_steps=int(counts[rank]), num_steps=len(steps),
                          late_ms_median=median_s * 1e3, late_ms_p90=float(np.percentile(per_step, 90)) * 1e3,
                          cause=str(cause.iloc[0]) if len(cause) else None,
                          named=bool(step_s > 0 and median_s >= min_fraction * step_s))


def compute_group_stragglers(collectives: pd.DataFrame, *, run: str) -> list[GroupStraggler]:
    """Each process group's own late rank, from the run's matched collectives (ingest.attribution
    CollectiveRow: group, num_ranks, step, late_rank, exposed_wait_s -- the wait it caused where
    exposed and not the pipeline's drain; max_wait_s in tables without it). Per group and step,
    the late rank is the one whose late arrivals caused the largest summed wait; the group's
    straggler is the rank late in most of its steps. wait_ms_median / wait_ms_p90: over the
    group's steps, the wait that rank caused (0 in steps where another was late; numpy
    percentile, linear). Groups where nobody made another wait are left out. Rows sorted by
    median wait, largest first; [] without collectives."""
    df = collectives[collectives["run"] == run] if not collectives.empty else collectives
    if df.empty:
        return []
    wait = "exposed_wait_s" if "exposed_wait_s" in df and df["exposed_wait_s"].notna().all() else "max_wait_s"
    out = []
    for (group, num_ranks), g in df.groupby(["group", "num_ranks"], sort=False):
        caused = g.groupby(["step", "late_rank"])[wait].sum().reset_index()
        caused = caused[caused[wait] > 0]
        if caused.empty:
            continue
        per_step = caused.sort_values([wait, "late_rank"], ascending=[False, True]).drop_duplicates("step")
        counts = per_step.groupby("late_rank").size().sort_values(ascending=False, kind="stable")
        rank = int(counts.index[0])
        steps = sorted(g["step"].unique().tolist())
        mine = per_step[per_step["late_rank"] == rank].set_index("step")[wait]
        waits = np.array([float(mine.get(st, 0.0)) for st in steps])
        out.append(GroupStraggler(group=str(group), num_ranks=int(num_ranks), rank=rank, late_steps=int(counts[rank]),
                                  num_steps=len(steps), wait_ms_median=float(np.percentile(waits, 50)) * 1e3,
                                  wait_ms_p90=float(np.percentile(waits, 90)) * 1e3))
    return sorted(out, key=lambda row: -row.wait_ms_median)


def compute_stage_balance(attribution: pd.DataFrame, *, run: str, pp_degree: int, ranks_per_stage: int,
                          layers: Sequence[int]) -> StageBalance | None:
    """Pipeline stages' compute per step and the layer split that would balance them.

    Stage of rank r: r // ranks_per_stage (Megatron's rank order puts pipeline outermost).
    Per-layer cost from the first stage, l = compute_0 / layers_0 (its embedding lookup is
    cheap); the last stage's extra (LM head + loss) h = compute_last - layers_last x l
    (balance_layers gives the split). Returns stage_compute_s, layers, split,
    predicted_max_stage_s, imbalance_s (max - mean stage compute); None without PP or rows."""
    df = attribution[attribution["run"] == run] if not attribution.empty else attribution
    if pp_degree < 2 or df.empty or len(layers) != pp_degree:
        return None
    per_rank = df.groupby("rank")["compute_s"].mean()
    stage = {}
    for r, c in per_rank.items():
        stage.setdefault(int(r) // max(ranks_per_stage, 1), []).append(float(c))
    if sorted(stage) != list(range(pp_degree)):
        return None
    computes = tuple(float(np.mean(stage[s])) for s in range(pp_degree))
    out = StageBalance(stage_compute_s=computes, layers=tuple(int(n) for n in layers),
                       imbalance_s=max(computes) - float(np.mean(computes)))
    split, best = balance_layers(out)
    return dataclasses.replace(out, split=split, predicted_max_stage_s=best)


def _layer_costs(stages: StageBalance) -> tuple[float, float] | None:
    """(per-layer compute l, the last stage's extra h) in s from a run's stages: l = compute_0 /
    layers_0, h = compute_last - layers_last x l. None without a first-stage layer."""
    computes, layers = stages.stage_compute_s, stages.layers
    if len(computes) < 2 or len(layers) != len(computes) or not layers[0]:
        return None
    per_layer = computes[0] / layers[0]
    return per_layer, computes[-1] - layers[-1] * per_layer


def balance_layers(stages: StageBalance) -> tuple[tuple[int, ...] | None, float | None]:
    """The layer split that minimises the slowest stage with ``stages``' per-layer cost
    (_layer_costs): the last stage gets n layers, the others the rest evenly, minimising
    max(ceil((L - n)/(p - 1)) x l, n x l + h). -> (split, predicted slowest stage s), or (None, None)."""
    costs = _layer_costs(stages)
    if costs is None or costs[0] <= 0:
        return None, None
    per_layer, head = costs
    p, total = len(stages.layers), int(sum(stages.layers))
    split, best = None, None
    for n in range(1, total - p + 2):
        rest = total - n
        cost = max(-(-rest // (p - 1)) * per_layer, n * per_layer + head)
        if best is None or cost < best - 1e-12:
            base, extra = divmod(rest, p - 1)
            split, best = (*(base + (1 if i < extra else 0) for i in range(p - 1)), n), cost
    return split, best


def predict_stage_compute(stages: StageBalance, layers: Sequence[int]) -> list[float] | None:
    """Each stage's compute (s) under the split ``layers``, from ``stages``' per-layer cost
    (_layer_costs: stage i computes layers_i x l, the last + h). None when the split's length
    differs or ``stages`` gives no cost."""
    costs = _layer_costs(stages)
    if costs is None or len(layers) != len(stages.layers):
        return None
    per_layer, head = costs
    return [n * per_layer + (head if i == len(layers) - 1 else 0.0) for i, n in enumerate(layers)]


def predict_stage_imbalance(even: StageBalance, layers: Sequence[int]) -> float | None:
    """Stage imbalance that a layer split ``layers`` would have, as a fraction of the mean stage
    compute ((slowest - mean) / mean), predicted from an evenly split run's stages
    (predict_stage_compute). A fraction, so that it carries to a run on a faster or slower
    machine. None when the even run gives no cost."""
    predicted = predict_stage_compute(even, layers)
    if predicted is None:
        return None
    mean = float(np.mean(predicted))
    return (max(predicted) - mean) / mean if mean > 0 else None


def check_stage_prediction(source: StageBalance, other: StageBalance) -> float | None:
    """The per-layer model's error on a run of another split: max over stages of |predicted -
    measured| / measured, the prediction from ``source``'s stages (predict_stage_compute) for
    ``other``'s layers against ``other``'s measured stage compute. None when not comparable."""
    predicted = predict_stage_compute(source, other.layers)
    measured = other.stage_compute_s
    if predicted is None or len(measured) != len(predicted) or min(measured, default=0) <= 0:
        return None
    return max(abs(p - m) / m for p, m in zip(predicted, measured))


def compute_collective_bandwidth(collectives: pd.DataFrame, *, run: str,
                                 commbench: Sequence[CommBenchRow] = ()) -> list[CollectiveBandwidth]:
    """Per collective kind and size: count, median transfer time (the last-arriving rank's
    duration, s) and achieved bus bandwidth (GB/s, nccl-tests convention), next to `runner
    commbench`'s busbw for the same op at the nearest measured size within a factor of 2 (None
    if none). Rows sorted by total transfer time, largest first."""
    df = collectives[(collectives["run"] == run) & collectives["nbytes"].notna()] if not collectives.empty else collectives
    if df.empty:
        return []
    out = []
    for (kind, nbytes), g in df.groupby(["kind", "nbytes"]):
        bench = [b for b in commbench if b.op == kind and b.nbytes and 0.5 <= float(b.nbytes) / float(nbytes) <= 2.0]
        near = min(bench, key=lambda b: abs(np.log(float(b.nbytes) / float(nbytes))), default=None)
        out.append(CollectiveBandwidth(
            kind=str(kind), nbytes=int(nbytes), num_calls=int(len(g)), transfer_s=float(g["transfer_s"].median()),
            total_s=float(g["transfer_s"].sum()),
            busbw_gbps=float(g["busbw_gbps"].median()) if g["busbw_gbps"].notna().any() else None,
            commbench_busbw_gbps=float(near.busbw_gbps) if near else None,
            commbench_nbytes=int(near.nbytes) if near else None))
    return sorted(out, key=lambda r: -r.total_s)
