"""Per-run metrics from step rows: pure functions, DataFrame in, DataFrame out.

Formulas and their sources are in the docstrings; nothing here rounds, formats or plots.
Missing inputs give NA, never 0.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from core.records import LoadedRun
from core.formulas import DEFAULT_CONVENTION, compute_flops_per_token, compute_mfu, compute_step_times, compute_tokens_per_s, select_measured


SUMMARY_COLUMNS = (
    "run", "num_steps_measured", "step_time_median_s", "step_time_p90_s", "tokens_per_step", "tokens_per_s",
    "tokens_per_s_per_gpu", "flops_per_token", "mfu", "mem_peak_allocated_gib", "mem_peak_reserved_gib",
    "data_wait_median_s", "loss_first", "loss_last", "num_params",
    "straggler_rank", "straggler_lag_median_s", "straggler_last_share",
)
_FLOAT_COLUMNS = tuple(c for c in SUMMARY_COLUMNS
                       if c not in ("run", "num_steps_measured", "tokens_per_step", "num_params", "straggler_rank"))


def _na(value: object) -> object:
    return None if value is None or pd.isna(value) else value


def _summarize_one(run: LoadedRun, steps: pd.DataFrame, *, warmup_steps: int, peak: float | None, convention: str) -> dict:
    measured = select_measured(steps, warmup_steps=warmup_steps)
    per_step = measured.groupby("step").agg(
        step_time_s=("step_time_s", "max"), data_wait_s=("data_wait_s", "max"), tokens=("tokens", "max")
    )
    row: dict = {c: None for c in SUMMARY_COLUMNS}
    info, model = run.info, run.spec.fixed.model
    row.update(run=run.name, num_steps_measured=len(per_step), num_params=run.num_params)
    row["tokens_per_step"] = _tokens_per_step(run)
    if not steps.empty:
        losses = steps.dropna(subset=["loss"]).groupby("step")["loss"].mean()
        if not losses.empty:
            row.update(loss_first=float(losses.iloc[0]), loss_last=float(losses.iloc[-1]))
    if per_step.empty:
        return row
    times = per_step["step_time_s"].to_numpy(dtype=float)
    median_s = float(np.percentile(times, 50, method="linear"))
    row.update(step_time_median_s=median_s, step_time_p90_s=float(np.percentile(times, 90, method="linear")))
    row["data_wait_median_s"] = float(np.median(per_step["data_wait_s"].to_numpy(dtype=float)))
    tokens_per_step = int(per_step["tokens"].iloc[0])
    row["tokens_per_step"] = tokens_per_step
    row["tokens_per_s"] = compute_tokens_per_s(steps, tokens_per_step=tokens_per_step, warmup_steps=warmup_steps)
    if row["tokens_per_s"] is not None:
        row["tokens_per_s_per_gpu"] = row["tokens_per_s"] / int(run.spec.world_size)
    for col in ("mem_peak_allocated_gib", "mem_peak_reserved_gib"):
        row[col] = _na(measured[col].max())
    if row["num_params"] is not None and info.num_params_position_embedding is not None:
        row["flops_per_token"] = compute_flops_per_token(
            num_params=int(info.num_params), num_layers=int(model.num_layers), hidden_size=int(model.hidden_size),
            seq_length=int(model.seq_length), position_embedding_params=int(info.num_params_position_embedding),
            convention=convention,
        )
    row["mfu"] = compute_mfu(row["tokens_per_s"], flops_per_token=row["flops_per_token"], peak_flops=peak,
                             num_gpus=int(run.spec.world_size))
    row.update(compute_straggler(measured))
    return row


def compute_straggler(steps: pd.DataFrame) -> dict:
    """The rank that enters the step last: per step, each rank's lag = its ``step_entry_time_s``
    minus the earliest rank's; the straggler is the rank with the largest median lag.

    Returns straggler_rank (int), straggler_lag_median_s (s), straggler_last_share (fraction of
    steps in which it entered last), or all None with fewer than 2 ranks or no entry times.
    A lag here is host-side: a slow data loader, CPU contention, GC or a slow previous step on
    that rank; GPU-side slowness shows in collective entry skew in profiler traces instead
    (DESIGN.md slow-run triage: "one rank enters collectives last")."""
    none = {"straggler_rank": None, "straggler_lag_median_s": None, "straggler_last_share": None}
    if "step_entry_time_s" not in steps:
        return none
    entries = steps.dropna(subset=["step_entry_time_s"])
    if entries.empty or entries["rank"].nunique() < 2:
        return none
    table = entries.pivot_table(index="step", columns="rank", values="step_entry_time_s", aggfunc="first").dropna()
    if table.empty:
        return none
    lag = table.sub(table.min(axis=1), axis=0)
    medians = lag.median(axis=0)
    rank = int(medians.idxmax())
    last_share = float((table.idxmax(axis=1) == rank).mean())
    return {"straggler_rank": rank, "straggler_lag_median_s": float(medians[rank]), "straggler_last_share": last_share}


def _tokens_per_step(run: LoadedRun) -> int | None:
    """Global batch x sequence length; None where either is unknown (third-party logs)."""
    f = run.spec.fixed
    return None if f.global_batch_size is None or f.model.seq_length is None else run.spec.tokens_per_step


def summarize_runs(
    steps: pd.DataFrame,
    runs: Sequence[LoadedRun],
    *,
    warmup_steps: int,
    peak_flops: Mapping[str, float | None] | None = None,
    convention: str = DEFAULT_CONVENTION,
) -> pd.DataFrame:
    """One row per run of ``runs`` (same order), columns ``SUMMARY_COLUMNS``.

    steps: StepRow columns (all ranks, all steps). runs: the campaign's runs
    (ingest.io.Campaign.run_records; run_info's parameter counts may be missing). peak_flops:
    run -> dense peak FLOP/s of one of its GPUs, or None (no MFU).

    Steps < warmup_steps and steps inside the profiler window are dropped. The step time of a step is the max over ranks of
    step_time_s (the slowest rank gates the optimizer step); median and p90 over measured
    steps use numpy.percentile(method="linear"). tokens_per_s = tokens per step / median step
    time; tokens_per_s_per_gpu divides by world_size. data_wait_median_s: median over steps of
    the max over ranks. mem_peak_*_gib: max over ranks and measured steps (NA on CPU).
    loss_first / loss_last: mean over the ranks reporting loss at the first / last step that
    has any loss (warm-up included: loss is not a timing metric). Runs without measured
    steps get num_steps_measured 0 and NA metrics.
    """
    peak_flops = peak_flops or {}
    by_run = dict(tuple(steps.groupby("run"))) if not steps.empty else {}
    rows = [
        _summarize_one(run, by_run.get(run.name, steps.iloc[0:0]), warmup_steps=warmup_steps,
                       peak=peak_flops.get(run.name), convention=convention)
        for run in runs
    ]
    out = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    return out.astype({c: "Float64" for c in _FLOAT_COLUMNS} | {"num_params": "Int64", "tokens_per_step": "Int64",
                                                               "num_steps_measured": "int64"})


def compute_loss_curve(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (run, step): loss = mean over the ranks that report it (all steps). Columns run, step, loss."""
    return steps.dropna(subset=["loss"]).groupby(["run", "step"], as_index=False, sort=True)["loss"].mean()
