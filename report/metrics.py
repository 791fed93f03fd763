"""Per-run metrics from step rows: pure functions, step rows in, RunSummary records (and tables) out.

Formulas and their sources are in the docstrings; nothing here rounds, formats or plots.
Missing inputs give NA, never 0.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from core.records import RUN_STATUSES, LoadedRun, RunSummary
from core.formulas import DEFAULT_CONVENTION, compute_flops_per_token, compute_mfu, compute_tokens_per_s, select_measured


def _na(value: object) -> object:
    """NA/NaN -> None; numpy scalars -> Python."""
    if value is None or pd.isna(value):
        return None
    return value.item() if hasattr(value, "item") else value


def _opt_float(value: object) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _summarize_one(run: LoadedRun, steps: pd.DataFrame, *, warmup_steps: int, peak: float | None, convention: str,
                   ) -> RunSummary:
    measured = select_measured(steps, warmup_steps=warmup_steps)
    per_step = measured.groupby("step").agg(
        step_time_s=("step_time_s", "max"), data_wait_s=("data_wait_s", "max"), tokens=("tokens", "max")
    )
    status = status_label(run.status_name)
    info, checkpoint = run.info, run.checkpoint
    row: dict = dict(
        run=run.name, status=status, failed_at_step=None if status == "ok" else compute_failed_at_step(steps),
        num_steps_measured=len(per_step), num_params=run.num_params, tokens_per_step=_tokens_per_step(run),
        loop_overhead_fraction=info.loop_overhead_fraction if info else None,
        loop_overhead_num_steps=info.loop_overhead_num_steps if info else None,
        loop_overhead_spread=compute_window_spread(steps, info.loop_overhead_num_steps if info else None),
        ckpt_save_s=_opt_float(checkpoint.save_s) if checkpoint else None,
        ckpt_load_s=_opt_float(checkpoint.load_s) if checkpoint else None,
        ckpt_size_bytes=checkpoint.bytes_written if checkpoint else None)
    if not steps.empty:
        losses = steps.dropna(subset=["loss"]).groupby("step")["loss"].mean()
        if not losses.empty:
            row.update(loss_first=float(losses.iloc[0]), loss_last=float(losses.iloc[-1]))
    if per_step.empty:
        return RunSummary(**row)
    times = per_step["step_time_s"].to_numpy(dtype=float)
    row.update(step_time_median_s=float(np.percentile(times, 50, method="linear")),
               step_time_p90_s=float(np.percentile(times, 90, method="linear")),
               data_wait_median_s=_na(float(np.median(per_step["data_wait_s"].to_numpy(dtype=float)))))
    tokens_per_step = int(per_step["tokens"].iloc[0])
    row["tokens_per_step"] = tokens_per_step
    tokens_per_s = _na(compute_tokens_per_s(steps, tokens_per_step=tokens_per_step, warmup_steps=warmup_steps))
    row["tokens_per_s"] = tokens_per_s
    if tokens_per_s is not None:
        row["tokens_per_s_per_gpu"] = tokens_per_s / int(run.spec.world_size)
    for col in ("mem_peak_allocated_gib", "mem_peak_reserved_gib"):
        row[col] = _na(measured[col].max())
    fpt = {c: _flops_per_token(run, c) for c in dict.fromkeys((convention, "6N", "6N+6LHQT"))}
    row["flops_per_token"] = fpt[convention] if row["num_params"] is not None else None
    row["mfu"] = _na(compute_mfu(tokens_per_s, flops_per_token=row["flops_per_token"], peak_flops=peak,
                                 num_gpus=int(run.spec.world_size)))
    row.update(mfu_6n=_mfu(tokens_per_s, fpt["6N"], run, peak), mfu_causal=_mfu(tokens_per_s, fpt["6N+6LHQT"], run, peak))
    row.update(compute_straggler(measured))
    return RunSummary(**row)


def _flops_per_token(run: LoadedRun, convention: str) -> float | None:
    """FLOPs per token under ``convention`` (core.formulas.compute_flops_per_token); None
    without the run's parameter counts."""
    info, model = run.info, run.spec.fixed.model
    if info is None or info.num_params is None or info.num_params_position_embedding is None:
        return None
    return compute_flops_per_token(
        num_params=int(info.num_params), num_layers=int(model.num_layers), hidden_size=int(model.hidden_size),
        seq_length=int(model.seq_length), position_embedding_params=int(info.num_params_position_embedding),
        convention=convention)


def _mfu(tokens_per_s: float | None, flops_per_token: float | None, run: LoadedRun, peak: float | None) -> float | None:
    if tokens_per_s is None or flops_per_token is None:
        return None
    return _na(compute_mfu(tokens_per_s, flops_per_token=flops_per_token, peak_flops=peak,
                           num_gpus=run.spec.world_size))


def status_label(status: object) -> str:
    """status.json's status -> the note's: a RUN_STATUSES value, "unfinished" when status.json
    is missing (the runner was stopped before the run ended), "unknown" for any other value."""
    if status is None or not isinstance(status, str):
        return "unfinished"
    return status if status in RUN_STATUSES else "unknown"


def compute_failed_at_step(steps: pd.DataFrame) -> int | None:
    """First step not completed by every rank that wrote rows: min over ranks of the last step
    recorded, + 1 (0-based). None when the run wrote no rows."""
    if steps.empty:
        return None
    return int(steps.groupby("rank")["step"].max().min()) + 1


def compute_window_spread(steps: pd.DataFrame | None, num_steps: object) -> float | None:
    """(max − min) ÷ median of rank 0's step times over a run's last ``num_steps`` recorded steps:
    the window the loop-overhead estimate (runner.train.measure_loop_overhead: those steps' sum
    against one bare replay of them) compares, so an estimate smaller than this spread is not
    resolved. None without the steps or the count."""
    if steps is None or steps.empty or not num_steps or "rank" not in steps or "step_time_s" not in steps:
        return None
    rank0 = steps[steps["rank"] == 0].sort_values("step")
    times = pd.to_numeric(rank0["step_time_s"], errors="coerce").dropna().tail(int(num_steps))
    if len(times) < int(num_steps) or times.median() <= 0:
        return None
    return float((times.max() - times.min()) / times.median())


def compute_step_spread(summary: RunSummary) -> float | None:
    """(p90 − median) ÷ median of a run's measured step times: its step-to-step noise, the
    yardstick a margin between runs must exceed. None without both."""
    med, p90 = summary.step_time_median_s, summary.step_time_p90_s
    return (p90 - med) / med if med and p90 is not None else None


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
) -> tuple[RunSummary, ...]:
    """One RunSummary per run of ``runs`` (same order).

    steps: StepRow columns (all ranks, all steps). runs: the campaign's runs
    (ingest.io.Campaign.run_records; run_info's parameter counts may be missing). peak_flops:
    run -> dense peak FLOP/s of one of its GPUs, or None (no MFU).

    Steps < warmup_steps and steps inside the profiler window are dropped. The step time of a step is the max over ranks of
    step_time_s (the slowest rank gates the optimizer step); median and p90 over measured
    steps use numpy.percentile(method="linear"). tokens_per_s = tokens per step / median step
    time; tokens_per_s_per_gpu divides by world_size. MFU under ``convention`` and under the 6N
    and causal (6N+6LHQT) ones (core.formulas). data_wait_median_s: median over steps of
    the max over ranks. mem_peak_*_gib: max over ranks and measured steps (NA on CPU).
    loss_first / loss_last: mean over the ranks reporting loss at the first / last step that
    has any loss (warm-up included: loss is not a timing metric). Runs without measured
    steps get num_steps_measured 0 and None metrics. ``unhealthy`` is False here: report.health
    judges it (report.view sets it with dataclasses.replace).
    """
    peak_flops = peak_flops or {}
    by_run = dict(tuple(steps.groupby("run"))) if not steps.empty else {}
    return tuple(
        _summarize_one(run, by_run.get(run.name, steps.iloc[0:0]), warmup_steps=warmup_steps,
                       peak=peak_flops.get(run.name), convention=convention)
        for run in runs)


def compute_loss_curve(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (run, step): loss = mean over the ranks that report it (all steps). Columns run, step, loss."""
    return steps.dropna(subset=["loss"]).groupby(["run", "step"], as_index=False, sort=True)["loss"].mean()
