"""Training health: loss spikes, divergence, gradient-norm explosions and per-rank step times.

Step rows in (StepRow columns, all runs), frozen records out: a reviewer checks these before
trusting any speed number, so a run found unhealthy is marked in the metric table and never
ranked (report.rules). The rule and its thresholds (report.rules.THRESHOLDS ``loss_spike_*``,
``loss_diverge_nats``, ``grad_norm_explode_multiple``) are carried in ``HealthRule`` so the note
states them.

Non-finite values: the tables hold NaN both for "not recorded" (a pipeline stage that computes
no loss, DeepSpeed with offload and its grad norm) and for a NaN the trainer produced. A NaN is
read as the trainer's only where the rank recorded a finite value at an earlier step and none
from that step to its last row (a NaN loss poisons the weights: every later step is NaN too);
+-inf is always non-finite. Deliberately not here: wording, plotting, file access.
"""
from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from core.formulas import select_measured
from report.metrics import run_slices

# the MAD of a normal sample times this is its standard deviation (Rousseeuw & Croux 1993; the
# Hampel filter's scale). The loss's noise is read from its step-to-step differences (their MAD
# x MAD_TO_SD / sqrt 2: the difference of two independent draws has twice the variance), so a
# falling loss's trend does not widen it (Donoho & Johnstone 1994 estimate noise the same way,
# from the MAD of the finest wavelet details)
MAD_TO_SD = 1.4826
HEALTH_VERDICTS = ("healthy", "unhealthy", "not_recorded")
# why a run is unhealthy (the template words each)
HEALTH_REASONS = ("loss_non_finite", "loss_above_start", "grad_norm_non_finite", "grad_norm_explosion")


@dataclass(frozen=True, kw_only=True)
class HealthRule:
    """The thresholds the health rule applied (report.rules.THRESHOLDS), for the note to state.

    A loss spike at step t: loss_t - median > max(spike_k x noise SD, spike_min_nats), over the up
    to window_steps finite losses before t (at least min_window_steps of them): their median, and
    the noise SD = 1.4826 x MAD of their step-to-step differences / sqrt 2. Divergence: a
    non-finite loss, or a loss above the run's first by more than diverge_nats. Explosion: a
    non-finite gradient norm, or one above grad_norm_explode_multiple x the median of the window
    before it."""

    window_steps: int
    min_window_steps: int
    spike_k: float
    spike_min_nats: float
    diverge_nats: float
    grad_norm_explode_multiple: float


@dataclass(frozen=True, kw_only=True)
class LossSpike:
    """One flagged step: loss (nats, mean over the ranks reporting it), the median and noise SD
    (HealthRule) of the window before it, excess_nats = loss - rolling_median."""

    step: int
    loss: float
    rolling_median: float
    noise_sd_nats: float
    excess_nats: float


@dataclass(frozen=True, kw_only=True)
class GradExplosion:
    """One flagged step: non_finite (a rank's norm was inf/NaN), else grad_norm (max over
    ranks) above the median of the window before it; ratio = grad_norm / rolling_median."""

    step: int
    non_finite: bool
    grad_norm: float | None
    rolling_median: float | None
    ratio: float | None


@dataclass(frozen=True, kw_only=True)
class RankStepTime:
    """One rank's step time over the measured steps (warm-up and profiled steps left out):
    median and p90 (numpy.percentile, linear), max, in seconds."""

    rank: int
    num_steps: int
    median_s: float
    p90_s: float
    max_s: float


@dataclass(frozen=True, kw_only=True)
class RunHealth:
    """One run's health. verdict: HEALTH_VERDICTS ("not_recorded": no loss and no gradient norm
    in its rows); reasons: HEALTH_REASONS that made it unhealthy; loss_first / loss_last /
    loss_max (nats, finite steps); diverged_at_step with divergence "non_finite" |
    "above_start" and divergence_loss (None when NaN); grad_norm_recorded False where no rank
    recorded one (DeepSpeed with offload); rank_step_times per rank, slowest median first."""

    run: str
    verdict: str
    reasons: tuple[str, ...]
    num_loss_steps: int
    loss_first: float | None
    loss_last: float | None
    loss_max: float | None
    spikes: tuple[LossSpike, ...]
    diverged_at_step: int | None
    divergence: str | None
    divergence_loss: float | None
    grad_norm_recorded: bool
    grad_norm_median: float | None
    grad_norm_max: float | None
    explosions: tuple[GradExplosion, ...]
    rank_step_times: tuple[RankStepTime, ...]

    @property
    def spike_steps(self) -> tuple[int, ...]:
        return tuple(s.step for s in self.spikes)

    @property
    def explosion_steps(self) -> tuple[int, ...]:
        return tuple(e.step for e in self.explosions)


@dataclass(frozen=True, kw_only=True)
class HealthSection:
    """The note's training-health block: the rule, one RunHealth per run with rows (campaign
    order), and its figures (report.view.Figure, added when they are drawn)."""

    rule: HealthRule
    runs: tuple[RunHealth, ...]
    figures: tuple = ()

    @functools.cached_property
    def unhealthy(self) -> dict[str, RunHealth]:
        """Run -> its RunHealth, for the unhealthy runs (built once: the note asks it per run)."""
        return {h.run: h for h in self.runs if h.verdict == "unhealthy"}


def build_health_rule(thresholds: Mapping[str, float]) -> HealthRule:
    """HealthRule from report.rules.THRESHOLDS (with any overrides)."""
    return HealthRule(window_steps=int(thresholds["loss_spike_window_steps"]),
                      min_window_steps=int(thresholds["loss_spike_min_window_steps"]),
                      spike_k=float(thresholds["loss_spike_k"]), spike_min_nats=float(thresholds["loss_spike_min_nats"]),
                      diverge_nats=float(thresholds["loss_diverge_nats"]),
                      grad_norm_explode_multiple=float(thresholds["grad_norm_explode_multiple"]))


def _trainer_non_finite(rows: pd.DataFrame, column: str) -> np.ndarray:
    """Per row: the value is inf, or NaN on a rank that recorded a finite value earlier and no
    finite value from this step on (see the module docstring). rows: sorted by run, step and
    rank (any number of runs)."""
    v = rows[column].to_numpy(dtype=float)
    finite = pd.Series(np.isfinite(v), index=rows.index)
    keys = [rows["run"], rows["rank"]]
    seen_before = (finite.groupby(keys).cumsum() - finite).to_numpy() > 0
    # finite values at this row or later on the rank: a reversed cumulative sum
    finite_after = finite[::-1].groupby([k[::-1] for k in keys]).cumsum()[::-1].to_numpy() > 0
    return np.isinf(v) | (np.isnan(v) & seen_before & ~finite_after)


def compute_health_curves(steps: pd.DataFrame) -> pd.DataFrame:
    """Per (run, step), all steps: loss = mean over ranks of the finite losses (NaN: none),
    loss_non_finite (any rank's loss non-finite, _trainer_non_finite), grad_norm = max over ranks
    of the finite norms, grad_norm_non_finite likewise, grad_norm_recorded (any rank recorded
    one, finite or not). steps: StepRow columns. Columns run, step, loss, loss_non_finite,
    grad_norm, grad_norm_non_finite, grad_norm_recorded; rows sorted by run, then step."""
    cols = ["run", "step", "loss", "loss_non_finite", "grad_norm", "grad_norm_non_finite", "grad_norm_recorded"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    rows = steps.sort_values(["run", "step", "rank"], kind="stable")
    df = rows[["run", "step", "rank"]].copy()
    for c in ("loss", "grad_norm"):
        v = rows[c].astype(float)
        df[f"{c}_non_finite"] = _trainer_non_finite(rows, c)
        df[c] = v.where(np.isfinite(v))
    df["grad_norm_recorded"] = df["grad_norm"].notna() | df["grad_norm_non_finite"]
    return df.groupby(["run", "step"], as_index=False, sort=False).agg(
        loss=("loss", "mean"), loss_non_finite=("loss_non_finite", "any"), grad_norm=("grad_norm", "max"),
        grad_norm_non_finite=("grad_norm_non_finite", "any"),
        grad_norm_recorded=("grad_norm_recorded", "any"))[cols].reset_index(drop=True)


# rows of trailing windows built at a time: bounds the (rows x window) copies at 10,000+ runs
_TRAILING_CHUNK_ROWS = 65536


def compute_trailing_stats(values: np.ndarray, *, window_steps: int, min_window_steps: int,
                           groups: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Median of the up to ``window_steps`` values before each position (the value itself
    excluded; NaNs skipped) and the MAD of their step-to-step differences; NaN where fewer than
    ``min_window_steps`` are finite. values: 1-D float array in step order; groups: a label per
    value (e.g. the run), each group's values contiguous: a window never reaches into the group
    before (None: one group). Returns (median, diff_mad), each values' shape."""
    values = np.asarray(values, dtype=float)
    n = len(values)
    if n == 0:
        return np.array([]), np.array([])
    if groups is None:
        group_index = np.zeros(n, dtype=np.int64)
    else:
        g = np.asarray(groups)
        group_index = np.cumsum(np.r_[True, g[1:] != g[:-1]]) - 1
    # each group's values after window_steps NaNs of its own: row t's window is padded[pos_t - W : pos_t]
    pos = np.arange(n) + window_steps * (group_index + 1)
    padded = np.full(n + window_steps * (int(group_index[-1]) + 1), np.nan)
    padded[pos] = values
    windows = np.lib.stride_tricks.sliding_window_view(padded, window_steps)
    median, mad, count = np.empty(n), np.empty(n), np.empty(n, dtype=np.int64)
    for lo in range(0, n, _TRAILING_CHUNK_ROWS):
        views = windows[pos[lo:lo + _TRAILING_CHUNK_ROWS] - window_steps]
        part = slice(lo, lo + len(views))
        count[part] = np.sum(~np.isnan(views), axis=1)
        with warnings.catch_warnings():  # an all-NaN window is NaN, as intended
            warnings.simplefilter("ignore", RuntimeWarning)
            median[part] = np.nanmedian(views, axis=1)
            diffs = np.diff(views, axis=1)
            mad[part] = np.nanmedian(np.abs(diffs - np.nanmedian(diffs, axis=1)[:, None]), axis=1)
    short = count < max(1, min_window_steps)
    median[short], mad[short] = np.nan, np.nan
    return median, mad


def compute_loss_spikes(curve: pd.DataFrame, rule: HealthRule) -> pd.DataFrame:
    """Curves (compute_health_curves rows of one or more runs, sorted by run then step) with
    columns rolling_median, noise_sd_nats (the noise SD: MAD_TO_SD x the MAD of the step-to-step
    differences in the window of finite losses before each step / sqrt 2) and spike (HealthRule's
    test). The window slides over each run's steps that have a finite loss."""
    out = curve.copy()
    finite = out["loss"].notna()
    values = out.loc[finite, "loss"].to_numpy(dtype=float)
    median, mad = compute_trailing_stats(values, window_steps=rule.window_steps, min_window_steps=rule.min_window_steps,
                                         groups=out.loc[finite, "run"].to_numpy())
    out["rolling_median"], out["noise_sd_nats"] = np.nan, np.nan
    out.loc[finite, "rolling_median"], out.loc[finite, "noise_sd_nats"] = median, MAD_TO_SD * mad / np.sqrt(2)
    limit = np.maximum(rule.spike_k * out["noise_sd_nats"], rule.spike_min_nats)
    out["spike"] = (out["loss"] - out["rolling_median"] > limit).fillna(False).astype(bool)
    return out


def compute_grad_explosions(curve: pd.DataFrame, rule: HealthRule) -> pd.DataFrame:
    """Curves (one or more runs, sorted by run then step) with columns grad_rolling_median
    (median of the run's finite norms in the window before each step) and explosion
    (non-finite, or above grad_norm_explode_multiple x that median)."""
    out = curve.copy()
    finite = out["grad_norm"].notna()
    median, _ = compute_trailing_stats(out.loc[finite, "grad_norm"].to_numpy(dtype=float),
                                       window_steps=rule.window_steps, min_window_steps=rule.min_window_steps,
                                       groups=out.loc[finite, "run"].to_numpy())
    out["grad_rolling_median"] = np.nan
    out.loc[finite, "grad_rolling_median"] = median
    high = (out["grad_norm"] > rule.grad_norm_explode_multiple * out["grad_rolling_median"]).fillna(False)
    out["explosion"] = (high | out["grad_norm_non_finite"]).astype(bool)
    return out


def compute_rank_step_times(steps: pd.DataFrame, *, warmup_steps: int) -> pd.DataFrame:
    """Per measured (run, rank, step) (core.formulas.select_measured: warm-up and profiled steps
    left out): columns run, rank, step, step_time_s."""
    measured = select_measured(steps, warmup_steps=warmup_steps)
    return measured[["run", "rank", "step", "step_time_s"]].sort_values(["run", "rank", "step"]).reset_index(drop=True)


def _none(x: float) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


def compute_flagged_curves(steps: pd.DataFrame, rule: HealthRule) -> pd.DataFrame:
    """compute_health_curves with, per run, compute_loss_spikes' and compute_grad_explosions'
    columns (rolling_median, noise_sd_nats, spike, grad_rolling_median, explosion); rows sorted
    by run, then step."""
    curves = compute_health_curves(steps)
    if curves.empty:
        return curves.assign(rolling_median=[], noise_sd_nats=[], spike=[], grad_rolling_median=[], explosion=[])
    return compute_grad_explosions(compute_loss_spikes(curves, rule), rule)


def _rank_step_times(rank_times: pd.DataFrame) -> dict[str, tuple[RankStepTime, ...]]:
    """Run -> its RankStepTime per rank, slowest median first. rank_times: compute_rank_step_times
    rows (sorted by run, rank, step)."""
    t = rank_times["step_time_s"].to_numpy(dtype=float)
    run, rank = rank_times["run"].to_numpy(), rank_times["rank"].to_numpy()
    if len(t) == 0:
        return {}
    starts = np.flatnonzero(np.r_[True, (run[1:] != run[:-1]) | (rank[1:] != rank[:-1])])
    out: dict[str, list[RankStepTime]] = {}
    for lo, hi in zip(starts, np.r_[starts[1:], len(t)]):
        v = t[lo:hi]
        out.setdefault(run[lo], []).append(RankStepTime(
            rank=int(rank[lo]), num_steps=len(v), median_s=float(np.percentile(v, 50, method="linear")),
            p90_s=float(np.percentile(v, 90, method="linear")), max_s=float(v.max())))
    return {r: tuple(sorted(ranks, key=lambda x: (-x.median_s, x.rank))) for r, ranks in out.items()}


def summarize_health(curves: pd.DataFrame, rank_times: pd.DataFrame, rule: HealthRule) -> dict[str, RunHealth]:
    """Run -> its RunHealth, for every run of ``curves`` (compute_flagged_curves rows) with its
    compute_rank_step_times rows (a run without any has no rank step times)."""
    spikes: dict[str, list[LossSpike]] = {}
    for r in curves[curves["spike"]].itertuples():
        spikes.setdefault(r.run, []).append(LossSpike(
            step=int(r.step), loss=float(r.loss), rolling_median=float(r.rolling_median),
            noise_sd_nats=float(r.noise_sd_nats), excess_nats=float(r.loss - r.rolling_median)))
    explosions: dict[str, list[GradExplosion]] = {}
    for r in curves[curves["explosion"]].itertuples():
        explosions.setdefault(r.run, []).append(GradExplosion(
            step=int(r.step), non_finite=bool(r.grad_norm_non_finite),
            grad_norm=None if r.grad_norm_non_finite else _none(r.grad_norm),
            rolling_median=_none(r.grad_rolling_median),
            ratio=None if r.grad_norm_non_finite else _none(r.grad_norm / r.grad_rolling_median)))
    ranks = _rank_step_times(rank_times)
    step = curves["step"].to_numpy()
    loss, norm = curves["loss"].to_numpy(dtype=float), curves["grad_norm"].to_numpy(dtype=float)
    loss_nf = curves["loss_non_finite"].to_numpy(dtype=bool)
    recorded_any = curves["grad_norm_recorded"].to_numpy(dtype=bool)
    out = {}
    for run, sl in run_slices(curves["run"].to_numpy()).items():
        losses, steps_, nf = loss[sl], step[sl], loss_nf[sl]
        losses = losses[~np.isnan(losses)]
        first = _none(losses[0]) if len(losses) else None
        above = steps_[loss[sl] > first + rule.diverge_nats] if first is not None else steps_[:0]
        hits = [(int(x.min()), k) for x, k in ((steps_[nf], "non_finite"), (above, "above_start")) if len(x)]
        diverged_at, divergence = min(hits) if hits else (None, None)
        divergence_loss = None
        if divergence == "above_start":
            divergence_loss = _none(loss[sl][np.flatnonzero(steps_ == diverged_at)[0]])
        run_explosions = tuple(explosions.get(run, ()))
        reasons = tuple(k for k, hit in (
            ("loss_non_finite", divergence == "non_finite"), ("loss_above_start", divergence == "above_start"),
            ("grad_norm_non_finite", any(e.non_finite for e in run_explosions)),
            ("grad_norm_explosion", any(not e.non_finite for e in run_explosions))) if hit)
        recorded = bool(recorded_any[sl].any())
        norms = norm[sl][~np.isnan(norm[sl])]
        has_any = len(losses) or nf.any() or recorded
        out[run] = RunHealth(
            run=run, verdict="not_recorded" if not has_any else "unhealthy" if reasons else "healthy",
            reasons=reasons, num_loss_steps=int(len(losses)), loss_first=first,
            loss_last=_none(losses[-1]) if len(losses) else None, loss_max=_none(losses.max()) if len(losses) else None,
            spikes=tuple(spikes.get(run, ())), diverged_at_step=diverged_at, divergence=divergence,
            divergence_loss=divergence_loss, grad_norm_recorded=recorded,
            grad_norm_median=_none(np.median(norms)) if len(norms) else None,
            grad_norm_max=_none(norms.max()) if len(norms) else None, explosions=run_explosions,
            rank_step_times=ranks.get(run, ()))
    return out


def build_health_section(steps: pd.DataFrame, runs: Sequence[str], *, warmup_steps: int,
                         thresholds: Mapping[str, float]) -> HealthSection:
    """HealthSection for ``runs`` (campaign order; a run without step rows is left out).
    steps: StepRow columns, all runs; thresholds: report.rules.THRESHOLDS with overrides."""
    rule = build_health_rule(thresholds)
    curves = compute_flagged_curves(steps, rule)
    rank_times = compute_rank_step_times(steps, warmup_steps=warmup_steps) if not steps.empty else \
        pd.DataFrame(columns=["run", "rank", "step", "step_time_s"])
    health = summarize_health(curves, rank_times, rule) if not curves.empty else {}
    return HealthSection(rule=rule, runs=tuple(health[r] for r in runs if r in health))
