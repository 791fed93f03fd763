"""Per-run metrics from step rows: pure functions, step rows in, RunSummary records (and tables) out.

Formulas and their sources are in the docstrings; nothing here rounds, formats or plots.
Missing inputs give NA, never 0.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from core.records import RUN_STATUSES, LoadedRun, RunSummary
from core.formulas import (DEFAULT_CONVENTION, compute_flops_per_token, compute_mfu, compute_tokens_per_s_at,
                           select_measured)


def _na(value: object) -> object:
    """NA/NaN -> None; numpy scalars -> Python."""
    if value is None or pd.isna(value):
        return None
    return value.item() if hasattr(value, "item") else value


def _opt_float(value: object) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _summarize_one(run: LoadedRun, t: "_RunTables", *, warmup_steps: int, peak: float | None, convention: str,
                   ) -> RunSummary:
    status = status_label(run.status_name)
    info, checkpoint = run.info, run.checkpoint
    per_step = t.per_step.get(run.name)
    num_overhead = info.loop_overhead_num_steps if info else None
    row: dict = dict(
        run=run.name, status=status, failed_at_step=None if status == "ok" else t.failed_at_step.get(run.name),
        num_steps_measured=0 if per_step is None else per_step.stop - per_step.start, num_params=run.num_params,
        tokens_per_step=_tokens_per_step(run),
        loop_overhead_fraction=info.loop_overhead_fraction if info else None,
        loop_overhead_num_steps=num_overhead,
        loop_overhead_spread=compute_window_spread(t.rows(run.name), num_overhead) if num_overhead else None,
        ckpt_save_s=_opt_float(checkpoint.save_s) if checkpoint else None,
        ckpt_load_s=_opt_float(checkpoint.load_s) if checkpoint else None,
        ckpt_size_bytes=checkpoint.bytes_written if checkpoint else None)
    if run.name in t.losses:
        row.update(loss_first=t.losses[run.name][0], loss_last=t.losses[run.name][1])
    if per_step is None:
        return RunSummary(**row)
    times = t.step_time_s[per_step]
    median_s = float(np.percentile(times, 50, method="linear"))
    row.update(step_time_median_s=median_s, step_time_p90_s=float(np.percentile(times, 90, method="linear")),
               data_wait_median_s=_na(float(np.median(t.data_wait_s[per_step]))))
    tokens_per_step = int(t.tokens[per_step.start])
    row["tokens_per_step"] = tokens_per_step
    tokens_per_s = _na(compute_tokens_per_s_at(tokens_per_step=tokens_per_step, step_time_median_s=median_s))
    row["tokens_per_s"] = tokens_per_s
    if tokens_per_s is not None:
        row["tokens_per_s_per_gpu"] = tokens_per_s / int(run.spec.world_size)
    for col in ("mem_peak_allocated_gib", "mem_peak_reserved_gib"):
        row[col] = _na(t.mem_peak[col].get(run.name))
    fpt = {c: _flops_per_token(run, c) for c in dict.fromkeys((convention, "6N", "6N+6LHQT"))}
    row["flops_per_token"] = fpt[convention] if row["num_params"] is not None else None
    row["mfu"] = _na(compute_mfu(tokens_per_s, flops_per_token=row["flops_per_token"], peak_flops=peak,
                                 num_gpus=int(run.spec.world_size)))
    row.update(mfu_6n=_mfu(tokens_per_s, fpt["6N"], run, peak), mfu_causal=_mfu(tokens_per_s, fpt["6N+6LHQT"], run, peak))
    row.update(t.stragglers.get(run.name, _NO_STRAGGLER))
    return RunSummary(**row)


def run_slices(keys: np.ndarray) -> dict[str, slice]:
    """Run name -> its rows' slice, for the run column (keys) of a table sorted by run (each run's
    rows contiguous), in table order: numpy per run over one table, not a pandas group per run."""
    if len(keys) == 0:
        return {}
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(keys)]
    return {str(keys[s]): slice(int(s), int(e)) for s, e in zip(starts, ends)}


class _RunTables:
    """Every run's per-step table and per-run aggregates from one groupby each over the step
    rows (all runs): per-run pandas work costs milliseconds a run, which at 10,000 runs is minutes."""

    def __init__(self, steps: pd.DataFrame, *, warmup_steps: int):
        self._steps = steps
        self._rows: dict | None = None
        measured = select_measured(steps, warmup_steps=warmup_steps)
        # per (run, step): the slowest rank gates the step
        per_step = measured.groupby(["run", "step"], sort=True).agg(
            step_time_s=("step_time_s", "max"), data_wait_s=("data_wait_s", "max"), tokens=("tokens", "max"))
        self.per_step = run_slices(per_step.index.get_level_values("run").to_numpy())
        self.step_time_s = per_step["step_time_s"].to_numpy(dtype=float)
        self.data_wait_s = per_step["data_wait_s"].to_numpy(dtype=float)
        self.tokens = per_step["tokens"].to_numpy()
        by_run = measured.groupby("run", sort=False)
        self.mem_peak = {c: by_run[c].max().to_dict() for c in ("mem_peak_allocated_gib", "mem_peak_reserved_gib")}
        self.failed_at_step = {r: int(s) + 1 for r, s in
                               steps.groupby(["run", "rank"])["step"].max().groupby(level="run").min().items()}
        # loss per (run, step): the mean over the ranks reporting it; a run's first and last such step
        losses = steps.dropna(subset=["loss"]).groupby(["run", "step"], sort=True)["loss"].mean()
        values = losses.to_numpy(dtype=float)
        self.losses = {r: (float(values[s.start]), float(values[s.stop - 1]))
                       for r, s in run_slices(losses.index.get_level_values("run").to_numpy()).items()}
        self.stragglers = compute_stragglers(measured)

    def rows(self, run: str) -> pd.DataFrame:
        """One run's step rows, in table order."""
        if self._rows is None:
            self._rows = self._steps.groupby("run", sort=False).indices
        idx = self._rows.get(run)
        return self._steps.iloc[0:0] if idx is None else self._steps.iloc[idx]


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


_NO_STRAGGLER = {"straggler_rank": None, "straggler_lag_median_s": None, "straggler_last_share": None}


def compute_straggler(steps: pd.DataFrame) -> dict:
    """The rank that enters the step last: per step, each rank's lag = its ``step_entry_time_s``
    minus the earliest rank's; the straggler is the rank with the largest median lag.

    steps: one run's StepRow rows. Returns straggler_rank (int), straggler_lag_median_s (s),
    straggler_last_share (fraction of steps in which it entered last), or all None with fewer
    than 2 ranks or no entry times. A lag here is host-side: a slow data loader, CPU contention,
    GC or a slow previous step on that rank; GPU-side slowness shows in collective entry skew in
    profiler traces instead (DESIGN.md slow-run triage: "one rank enters collectives last")."""
    return next(iter(compute_stragglers(steps.assign(run="")).values()), dict(_NO_STRAGGLER))


def compute_stragglers(steps: pd.DataFrame) -> dict[str, dict]:
    """compute_straggler for every run of ``steps`` (StepRow rows, all runs) in one pass:
    run -> its dict; a run without one (fewer than 2 ranks with entry times, or no step that
    every such rank entered) is left out. Per run, only steps with an entry time from each of
    its ranks count; a rank's lag is its entry time minus the step's earliest, its median is
    over those steps; ties go to the lowest rank."""
    if "step_entry_time_s" not in steps:
        return {}
    e = steps.dropna(subset=["step_entry_time_s"])
    if e.empty:
        return {}
    # the first row of each (run, step, rank), as a pivot with aggfunc "first"
    e = e.drop_duplicates(["run", "step", "rank"], keep="first")[["run", "step", "rank", "step_entry_time_s"]]
    e = e[e.groupby("run")["rank"].transform("nunique").to_numpy() >= 2]
    num_ranks = e.groupby("run")["rank"].transform("nunique").to_numpy()
    e = e[e.groupby(["run", "step"])["rank"].transform("size").to_numpy() == num_ranks]
    e = e.sort_values(["run", "step", "rank"], kind="stable")
    if e.empty:
        return {}
    entry = e.groupby(["run", "step"])["step_entry_time_s"]
    lag = e["step_entry_time_s"] - entry.transform("min")
    medians = lag.groupby([e["run"], e["rank"]]).median()
    # the rank entering last per step: the first (lowest) rank holding the step's latest entry
    latest = e["step_entry_time_s"] == entry.transform("max")
    last_rank = e[latest].groupby(["run", "step"])["rank"].first()
    num_steps = last_rank.groupby(level="run").size().to_dict()
    num_last = last_rank.groupby([last_rank.index.get_level_values("run"), last_rank]).size().to_dict()
    medians = medians.reset_index(name="lag")
    best = medians.loc[medians.groupby("run", sort=False)["lag"].idxmax()]
    return {str(run): {"straggler_rank": int(rank), "straggler_lag_median_s": float(lag),
                       "straggler_last_share": float(num_last.get((run, rank), 0) / num_steps[run])}
            for run, rank, lag in zip(best["run"], best["rank"], best["lag"])}


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
    tables = _RunTables(steps, warmup_steps=warmup_steps)
    return tuple(_summarize_one(run, tables, warmup_steps=warmup_steps, peak=peak_flops.get(run.name),
                                convention=convention) for run in runs)


def compute_loss_curve(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (run, step): loss = mean over the ranks that report it (all steps). Columns run, step, loss."""
    return steps.dropna(subset=["loss"]).groupby(["run", "step"], as_index=False, sort=True)["loss"].mean()


# runs the loss and step-time figures draw at most: a campaign of thousands of runs took minutes
# per figure (a line and a legend entry each) and no reader could tell its lines apart
MAX_FIGURE_RUNS = 16


def select_figure_runs(step_times: pd.DataFrame, runs: Sequence[str], *, max_runs: int = MAX_FIGURE_RUNS) -> list[str]:
    """The runs the loss and step-time figures draw: ``runs`` as they are when there are at most
    ``max_runs``; else, of the runs with measured steps (step_times: core.formulas.compute_step_times
    columns run, step, step_time_s), the max_runs // 2 with the lowest and the max_runs // 2 with
    the highest median step time (numpy.percentile, linear), fastest first, ties in ``runs`` order."""
    runs = list(runs)
    if len(runs) <= max_runs:
        return runs
    t = step_times.sort_values("run", kind="stable")
    values = t["step_time_s"].to_numpy(dtype=float)
    medians = {r: float(np.percentile(values[s], 50, method="linear"))
               for r, s in run_slices(t["run"].to_numpy()).items()}
    ranked = sorted((r for r in runs if r in medians), key=lambda r: medians[r])  # stable: ties keep runs' order
    if len(ranked) <= max_runs:
        return ranked
    return ranked[:max_runs // 2] + ranked[len(ranked) - (max_runs - max_runs // 2):]


def compute_loss_band(loss_curve: pd.DataFrame) -> pd.DataFrame:
    """Per step, over every run of ``loss_curve`` (compute_loss_curve columns run, step, loss):
    loss_min and loss_max (nats). Columns step, loss_min, loss_max; step order."""
    return loss_curve.groupby("step", as_index=False, sort=True).agg(loss_min=("loss", "min"), loss_max=("loss", "max"))
