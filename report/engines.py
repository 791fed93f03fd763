"""Section 6's engine comparison: one layout run under several engines (ZeRO-3: DeepSpeed vs
FSDP2; TP+PP: Megatron-core vs torch-native), as view-model records.

Per layout of a strategy with alternative engines, one ``EngineGroup``: a row per run with its
throughput, MFU, measured memory peaks beside the analytic model-state bytes of *its* engine
(report.memory), the derived activations/buffers and allocator reserve, the trace breakdown's
layout cost (exposed comm + bubble) and host gaps ("other"), and the rule's finding
(report.rules.rule_engine_gap) that the template words. Deliberately not here: wording,
formatting, file access.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.records import STRATEGY_ENGINES, LoadedRun, ModelConfig, RunSummary
from report.memory import GIB, build_model_states, compute_param_numels
from report.rules import THRESHOLDS, Finding, GapRow, layout_key, rule_engine_gap


@dataclass(frozen=True, kw_only=True)
class EngineRow:
    """One run of an engine group. Memory in GiB per rank (the run's largest over ranks):
    model_states_gib analytic (report.memory), activations_gib = peak allocated - model states
    (activations, gathered parameters, buckets, temporaries; derived), allocator_reserve_gib =
    peak reserved - peak allocated. max_params_states_only: the parameter count at which this
    engine's model states alone fill one GPU of the campaign at this layout (None on CPU).
    Shares are of the traced step (report.evidence); None without a trace."""

    run: str
    engine: str
    baseline: bool  # the DDP run of the same world size, shown for reference
    tokens_per_s: float | None
    ratio_to_fastest: float | None  # fastest engine's tokens/s / this run's
    mfu: float | None
    step_time_median_s: float | None
    mem_peak_allocated_gib: float | None
    mem_peak_reserved_gib: float | None
    model_states_bytes: float | None
    model_states_gib: float | None
    model_states_bytes_per_param: float | None
    model_states_formula: str | None
    model_states_source: str | None
    model_states_extra: str | None
    activations_gib: float | None
    allocator_reserve_gib: float | None
    max_params_states_only: float | None
    traced_step_s: float | None
    compute_share: float | None
    exposed_comm_share: float | None
    bubble_share: float | None
    other_share: float | None
    layout_cost_share: float | None  # transfer + bubble + imbalance (section 5 across ranks)


@dataclass(frozen=True, kw_only=True)
class EngineGroup:
    strategy: str
    world_size: int
    tp_degree: int
    pp_degree: int
    dp_degree: int
    device: str
    data_round: str = "synthetic"  # RunSpec.data_round of the group's runs
    rows: tuple[EngineRow, ...]
    finding: Finding


def _row(run: LoadedRun, s: RunSummary | None, b: GapRow | None, *, dtype: str,
         param_numels: list[int] | None,
         fastest_tps: float | None, gpu_memory_gib: float | None, baseline: bool) -> EngineRow:
    spec = run.spec
    states = None
    if run.num_params:
        states = build_model_states(
            strategy=spec.strategy, engine=spec.engine, dtype=dtype, num_params=int(run.num_params),
            tp_degree=int(spec.tp_degree), pp_degree=int(spec.pp_degree), dp_degree=int(spec.dp_degree),
            options=spec.options, param_numels=param_numels)
    states_gib = states.total_bytes / GIB if states else None
    alloc, reserved = (s.mem_peak_allocated_gib, s.mem_peak_reserved_gib) if s else (None, None)
    tps = s.tokens_per_s if s else None
    step = b.step_time_s if b else None

    def share(cat: str) -> float | None:
        return b.seconds[cat] / step if b and step else None

    return EngineRow(
        run=run.name, engine=spec.engine, baseline=baseline, tokens_per_s=tps,
        ratio_to_fastest=fastest_tps / tps if fastest_tps and tps else None, mfu=s.mfu if s else None,
        step_time_median_s=s.step_time_median_s if s else None, mem_peak_allocated_gib=alloc, mem_peak_reserved_gib=reserved,
        model_states_bytes=states.total_bytes if states else None,
        model_states_gib=states_gib, model_states_bytes_per_param=states.total_bytes_per_param if states else None,
        model_states_formula=states.formula if states else None, model_states_source=states.source if states else None,
        model_states_extra=(states.extra or None) if states else None,
        activations_gib=alloc - states_gib if alloc is not None and states_gib is not None else None,
        allocator_reserve_gib=reserved - alloc if reserved is not None and alloc is not None else None,
        max_params_states_only=(gpu_memory_gib * GIB / states.total_bytes_per_param
                                if gpu_memory_gib and states and spec.device == "cuda" else None),
        traced_step_s=step, compute_share=share("compute"), exposed_comm_share=share("transfer"),
        bubble_share=share("bubble"), other_share=share("launch_gaps"),
        layout_cost_share=(share("transfer") + share("bubble") + share("imbalance")) if b and step else None)


def build_engine_groups(summary_rows: Sequence[RunSummary], run_rows: Sequence[LoadedRun],
                        breakdown_rows: Sequence[GapRow], *, dtype: str, gpu_memory_gib: float | None,
                        model: ModelConfig | None = None,
                        thresholds: Mapping[str, float] | None = None) -> tuple[EngineGroup, ...]:
    """One EngineGroup per layout of a strategy with several engines (ZeRO-3, TP+PP), in the
    order the layouts first appear. summary_rows / run_rows: as report.rules.build_findings (same
    order, ``status`` on run_rows); breakdown_rows: the traced runs' GapRow (report.view.gap_row)
    -- empty without traces. dtype: the campaign's; model: its
    fixed model shape (parameter shapes for DeepSpeed's persistent parameters), or None."""
    t = {**THRESHOLDS, **(thresholds or {})}
    findings = rule_engine_gap(summary_rows, run_rows, breakdown_rows, t, engines=STRATEGY_ENGINES)
    summary = {s.run: s for s in summary_rows}
    traced = {b.run: b for b in breakdown_rows}
    by_run = {r.name: r for r in run_rows}
    numels = compute_param_numels(model) if model else None
    groups = []
    for f in findings:
        runs = [by_run[name] for name in f.runs]
        if f.kind == "engine_single":
            runs = [r for r in runs if r.status_name == "ok"] or runs
        fastest = f.evidence.engines[0][2] if f.kind != "engine_single" else None
        rows = [_row(r, summary.get(r.name), traced.get(r.name), dtype=dtype, param_numels=numels,
                     fastest_tps=fastest,
                     gpu_memory_gib=gpu_memory_gib, baseline=False) for r in runs]
        base = f.evidence.baseline if f.kind != "engine_single" else None
        if base is not None:
            rows.append(_row(by_run[base.run], summary[base.run], traced.get(base.run), dtype=dtype,
                             param_numels=numels,
                             fastest_tps=fastest, gpu_memory_gib=gpu_memory_gib, baseline=True))
        r0 = runs[0]
        strategy, world, tp, pp, dp = layout_key(r0.spec)
        groups.append(EngineGroup(strategy=strategy, world_size=world, tp_degree=tp, pp_degree=pp, dp_degree=dp,
                                  device=str(r0.spec.device), data_round=str(f.evidence.data_round),
                                  rows=tuple(rows), finding=f))
    return tuple(groups)
