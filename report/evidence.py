"""Section 5's numbers: where each run's step time goes, from the profiler traces' tables.

DataFrame in, DataFrame out. Inputs are the tables ingest builds from the traces
(ingest.schema StepBreakdownRow / KernelSummaryRow columns), the step rows (StepRow) and the
profiler-window metadata (trace/profile_meta_rank<r>.json). Nothing here reads files,
rounds, formats or plots.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ingest.schema import BREAKDOWN_CATEGORIES, KERNEL_CLASSES

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


def compute_profile_cost(steps: pd.DataFrame, meta: pd.DataFrame) -> pd.DataFrame:
    """What the profiler window cost each run, against the run's time outside the window.

    Per step, the step time is the max over ranks. cost_s = sum of the window's step times
    (warm-up step included) - (window length x median step time outside the window and
    after step 0) + the slowest rank's trace export_s (export runs between steps, outside
    every step's time). outside_s = sum of step times outside the window. share = cost_s /
    outside_s (issue 4 asks for <= 2%). meta: columns run, rank, export_s. Columns run,
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
        outside = per_step[~per_step["profiled"]]
        if window.empty or outside.empty:
            continue
        baseline = float(np.median(outside.loc[outside.index > 0, "step_time_s"])) if (outside.index > 0).any() else None
        if baseline is None:
            continue
        export_s = float(m["export_s"].max())
        cost = float(window["step_time_s"].sum()) - len(window) * baseline + export_s
        outside_s = float(outside["step_time_s"].sum())
        rows.append({"run": run, "num_window_steps": len(window), "window_s": float(window["step_time_s"].sum()),
                     "baseline_step_s": baseline, "export_s": export_s, "cost_s": cost, "outside_s": outside_s,
                     "share": cost / outside_s if outside_s > 0 else None})
    return pd.DataFrame(rows, columns=cols)


def summarize_profile_tables(kernels: pd.DataFrame, *, num: int = 8) -> list[dict]:
    """Lower-resolution evidence from summary tables users bring (torch.profiler key_averages,
    nsys stats): per (source file, report), the ``num`` rows with the largest time. Time is
    the row's ``total_s`` (nsys) or self CUDA, else CUDA total, else self CPU time (profiler
    tables); share = time / the sum of that column over the report (so nested ops in a
    profiler table's CUDA-total column can sum past 100%). Returns dicts: source, report,
    time_column, rows [(name, time_s, share, num_calls)]."""
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
        out.append({"source": str(source), "report": str(report) or None, "time_column": column, "rows": rows})
    return out
