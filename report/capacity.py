"""The note's Capacity section from a capacity probe (core.records.CapacityResult, runner.capacity):
per layout the largest model of the ladder that trained (measured) and the largest the memory
model lets fit (predicted), the speed at that size, and what CPU offload costs in tokens/s.

Every number is a trial's recorded value or a ratio of two of them. Predicted fit: the largest
rung whose predicted per-rank memory is within the limit the trials ran against -- on a GPU the
device share (offloaded states live in host memory), on CPU device + host, since the budget caps
the whole process. Deliberately not here: wording (templates), reading files (ingest.io).
"""
from __future__ import annotations

from dataclasses import dataclass

from core.records import CapacityResult, CapacityTrial


@dataclass(frozen=True, kw_only=True)
class CapacityTrialRow:
    layout: str
    rung: int
    num_params: int
    status: str
    mem_peak_gib: float | None  # max over ranks
    predicted_gib: float  # what the limit is checked against (see module doc)
    mem_error: float | None  # measured / predicted - 1
    host_peak_rss_gib: float | None  # max over ranks: where offloaded states went
    tokens_per_s: float | None


@dataclass(frozen=True, kw_only=True)
class CapacityLayoutRow:
    layout: str
    strategy: str
    engine: str
    offload: str
    world_size: int
    tp_degree: int
    pp_degree: int
    dp_degree: int
    largest_params: int | None  # measured: the largest rung that trained; None: none did
    largest_rung: int | None
    predicted_largest_params: int | None
    predicted_largest_rung: int | None
    tokens_per_s: float | None  # at the measured largest rung
    mem_peak_gib: float | None  # at the measured largest rung, max over ranks
    bound_params: int | None  # the smallest rung that did not train, and how it ended
    bound_status: str | None
    bound_cause: str | None
    ladder_top: bool  # the largest rung trained: the limit lies beyond the ladder


@dataclass(frozen=True, kw_only=True)
class OffloadCost:
    """An offloaded layout against the same engine without offload, at the largest rung both
    trained: slowdown = tokens/s without / with offload (the step-time ratio); params_gained:
    largest trained with offload - without (None where one trained nothing)."""

    layout: str
    reference: str
    num_params: int
    tokens_per_s: float
    reference_tokens_per_s: float
    slowdown: float
    params_gained: int | None


@dataclass(frozen=True, kw_only=True)
class CapacitySection:
    device: str
    device_name: str | None
    memory_limit_gib: float | None
    limit_kind: str  # "gpu" | "rlimit_data"
    probe_steps: int
    probe_warmup_steps: int
    micro_batch_size: int
    global_batch_size: int
    ladder: tuple[tuple[int, int, int, int], ...]  # (rung, num_layers, hidden_size, num_params)
    layouts: tuple[CapacityLayoutRow, ...]
    trials: tuple[CapacityTrialRow, ...]
    offload: tuple[OffloadCost, ...]
    max_abs_mem_error: float | None
    mem_measure: str | None


def _peak(values: tuple[float, ...]) -> float | None:
    return max(values) if values else None


def predicted_gib(trial: CapacityTrial, *, limit_kind: str) -> float:
    """The trial's predicted per-rank memory against its limit: device share on a GPU; device +
    host under a CPU budget (one memory)."""
    return trial.predicted_device_gib + (trial.predicted_host_gib if limit_kind != "gpu" else 0.0)


def build_capacity_section(result: CapacityResult, *, num_params_by_rung: tuple[int, ...]) -> CapacitySection:
    """The section's rows from the probe's trials. num_params_by_rung: parameters at each rung of
    result.ladder (runner.model's count, recorded in the trials; a rung never tried takes the
    count the caller computes)."""
    rows, layouts, by_layout = [], [], {}
    for t in result.trials:
        by_layout.setdefault(t.layout, []).append(t)
        peak, pred = _peak(t.mem_peak_gib), predicted_gib(t, limit_kind=result.limit_kind)
        rows.append(CapacityTrialRow(
            layout=t.layout, rung=t.rung, num_params=t.num_params, status=t.status, mem_peak_gib=peak,
            predicted_gib=pred, mem_error=peak / pred - 1 if peak is not None and pred > 0 else None,
            host_peak_rss_gib=_peak(t.host_peak_rss_gib), tokens_per_s=t.tokens_per_s))
    for name in result.layouts:
        trials = sorted(by_layout.get(name, []), key=lambda t: t.rung)
        if not trials:
            continue
        ok = [t for t in trials if t.status == "ok"]
        best = ok[-1] if ok else None
        bound = next((t for t in trials if t.status != "ok" and (best is None or t.rung > best.rung)), None)
        fits = [t.rung for t in trials if predicted_gib(t, limit_kind=result.limit_kind) <= (
            result.memory_limit_gib if result.memory_limit_gib is not None else float("inf"))]
        # predicted largest among the rungs tried: the model's answer where the probe asked the question
        pred_rung = max(fits) if fits else None
        first = trials[0]
        layouts.append(CapacityLayoutRow(
            layout=name, strategy=first.strategy, engine=first.engine, offload=first.offload,
            world_size=first.world_size, tp_degree=first.tp_degree, pp_degree=first.pp_degree,
            dp_degree=first.dp_degree, largest_params=best.num_params if best else None,
            largest_rung=best.rung if best else None,
            predicted_largest_params=num_params_by_rung[pred_rung] if pred_rung is not None else None,
            predicted_largest_rung=pred_rung, tokens_per_s=best.tokens_per_s if best else None,
            mem_peak_gib=_peak(best.mem_peak_gib) if best else None,
            bound_params=bound.num_params if bound else None, bound_status=bound.status if bound else None,
            bound_cause=bound.cause if bound else None,
            ladder_top=best is not None and best.rung == len(result.ladder) - 1))
    offload = []
    for row in (r for r in layouts if r.offload != "none"):
        ref = next((r for r in layouts if r.offload == "none" and (r.strategy, r.engine, r.world_size)
                    == (row.strategy, row.engine, row.world_size)), None)
        if ref is None:
            continue
        mine = {t.rung: t for t in by_layout[row.layout] if t.status == "ok" and t.tokens_per_s}
        theirs = {t.rung: t for t in by_layout[ref.layout] if t.status == "ok" and t.tokens_per_s}
        common = sorted(set(mine) & set(theirs))
        if not common:
            continue
        a, b = mine[common[-1]], theirs[common[-1]]
        offload.append(OffloadCost(
            layout=row.layout, reference=ref.layout, num_params=a.num_params, tokens_per_s=a.tokens_per_s,
            reference_tokens_per_s=b.tokens_per_s, slowdown=b.tokens_per_s / a.tokens_per_s,
            params_gained=(row.largest_params - ref.largest_params)
            if row.largest_params is not None and ref.largest_params is not None else None))
    errors = [abs(r.mem_error) for r in rows if r.mem_error is not None]
    return CapacitySection(
        device=result.device, device_name=result.device_name, memory_limit_gib=result.memory_limit_gib,
        limit_kind=result.limit_kind, probe_steps=result.probe_steps, probe_warmup_steps=result.probe_warmup_steps,
        micro_batch_size=result.micro_batch_size, global_batch_size=result.global_batch_size,
        ladder=tuple((i, m.num_layers, m.hidden_size, num_params_by_rung[i]) for i, m in enumerate(result.ladder)),
        layouts=tuple(layouts), trials=tuple(rows), offload=tuple(offload),
        max_abs_mem_error=max(errors) if errors else None,
        mem_measure=next((t.mem_measure for t in result.trials if t.mem_measure), None))
