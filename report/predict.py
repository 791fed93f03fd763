"""The note's "predicted" block: the performance model checked on the runs the campaign made,
then applied to layouts it did not run.

Calibration (stated in the note): each run's compute rate -- model FLOP/s per GPU on its
critical stage with the modelled bubble and exposed communication taken out (core.perfmodel,
solved for the rate that reproduces the run's median step time) -- is the model's only fitted
quantity. A run is predicted from the *other* runs (leave-one-out): runs of the same engine and
kernel mode (torch.compile or eager) if there are any; else runs in the same kernel mode on any
engine; else the other mode's runs carried over by perfmodel.toml's compile speed-up (measured
separately, benchmarks/results/h200-tuning); else no prediction. Layouts not run use every run
of their engine (the same rule without leaving anything out). Collectives come from a
`runner commbench` table in CAMPAIGN/commbench when there is one, else from the nominal links
of hardware.toml. Deliberately not here: formatting (templates), file access beyond
ingest.io.load_commbench.
"""
from __future__ import annotations

import collections
import math
from collections.abc import Mapping, Sequence
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import ToolError
from core.memory import compute_offloaded_fraction, describe_offload
from core.hardware import lookup_peak
from report.i18n import N_, Message, MessageList
from core.perfmodel import (
    CommModel, Layout, build_campaign_comm_model, build_run_layout, build_shape, compute_layout_memory,
    find_campaign_gpu, load_assumptions, logits_bytes, predict_run, solve_rate,
)
from core.formulas import ModelShape, compute_model_flops_per_token
from core.records import EnvRecord, FixedConfig, LoadedRun, RunSummary

REFERENCE_RATE = 1e12  # FLOP/s: the rate a run's compute time is first predicted at, then scaled
PREDICT_GPU_COUNTS = (2, 8)  # the embedded matrices' sizes (examples/matrices/{2gpu,8gpu}.toml)
MAX_PREDICTED_TP = 8
GIB = 2**30


@dataclass(frozen=True, kw_only=True)
class PredictedCheck:
    """One run of the campaign: predicted vs measured median step time (error = predicted /
    measured - 1) and memory, with the calibration the prediction used."""

    run: str
    engine: str
    compiled: bool
    world_size: int
    measured_step_time_s: float | None
    predicted_step_time_s: float | None
    error: float | None
    measured_mem_gib: float | None  # peak allocated
    predicted_mem_gib: float | None
    rate_flops: float | None  # the run's own solved compute rate (FLOP/s per GPU)
    calibration: str  # where the predicted rate came from, or why there is none (a report.i18n.Message)


@dataclass(frozen=True, kw_only=True)
class PredictedLayout:
    """A layout the campaign did not run, as the model predicts it."""

    num_gpus: int
    strategy: str
    engine: str
    sharding: str
    tp_degree: int
    pp_degree: int
    dp_degree: int
    micro_batch_size: int
    num_microbatches: int
    step_time_s: float
    tokens_per_s: float
    mfu: float | None
    bubble_fraction: float
    exposed_comm_s: float
    comm_bytes_per_step: float  # all kinds, per GPU
    mem_gib: float
    calibration: str
    # the step time the leave-one-out errors of the campaign's own runs allow: predicted /
    # (1 + largest error) .. predicted / (1 + smallest error); None with fewer than 2 checks
    step_time_low_s: float | None = None
    step_time_high_s: float | None = None


CATEGORY_GROUPS = ("compute", "transfer", "bubble", "other")  # the calibrated model's categories
UNCALIBRATED_ERROR = 0.5  # a leave-one-out step error beyond this marks a prediction uncalibrated


@dataclass(frozen=True, kw_only=True)
class CategoryCheck:
    """One traced run predicted per category from the other runs (leave-one-out), ms per step:
    measured from section 5 (breakdown_median_ms: compute; transfer; bubble + imbalance; the rest
    -- host time: launch gaps, skew wait, data stall, other --, summing to the unprofiled median
    step). Predicted: compute by core.perfmodel at the compute rate of the other runs' traced
    compute (report.predict.choose_rate's rule); transfer and bubble by core.perfmodel, each
    times the ratio measured / modelled summed over the other runs of the same communication
    pattern (COMM_PATTERN: TP, PP, sharding) -- 1 where there is none (transfer_from, bubble_from
    name the runs); host time the median of the other runs' of the same engine and kernel mode,
    else of all of them (host_from; host_same_engine says which). error: predicted / measured - 1
    per category (None where measured is under 1 ms) and for the step; calibrated: |step error|
    <= UNCALIBRATED_ERROR."""

    run: str
    measured_ms: Mapping[str, float]
    predicted_ms: Mapping[str, float | None]
    error: Mapping[str, float | None]
    step_measured_ms: float
    step_predicted_ms: float | None
    step_error: float | None
    calibrated: bool
    host_from: tuple[str, ...]  # the runs whose host time was carried over
    host_same_engine: bool = True  # host_from ran this engine in this kernel mode (else: every other run)
    transfer_from: tuple[str, ...] = ()  # the runs whose measured / modelled transfer scaled this one's
    bubble_from: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PredictedSection:
    """The predicted block. reason: why there is no check or no prediction (None when both exist).
    calibration, comm_source and reason are report.i18n.Messages (English str, translated in the note)."""

    checks: tuple[PredictedCheck, ...]
    max_abs_error: float | None
    layouts: tuple[PredictedLayout, ...]
    gpu_name: str | None
    comm_source: str
    compile_speedup: float
    compile_source: str
    memory_usable_fraction: float
    reason: str | None = None
    category_checks: tuple[CategoryCheck, ...] = ()
    # leave-one-out error per category over category_checks: largest |error|, None without any
    category_max_abs_error: Mapping[str, float | None] = dataclasses.field(default_factory=dict)


def unavailable(reason: str) -> PredictedSection:
    """A block that says why there are no predictions."""
    a = load_assumptions()
    return PredictedSection(checks=(), max_abs_error=None, layouts=(), gpu_name=None, comm_source="n/a",
                            compile_speedup=a.compile_speedup, compile_source=a.compile_source,
                            memory_usable_fraction=a.memory_usable_fraction,
                            reason=Message(N_("Predictions unavailable (%(reason)s)"), reason=reason))


@dataclass(frozen=True, kw_only=True)
class _Rate:
    run: str
    engine: str
    compiled: bool
    rate: float
    offload: bool = False  # CPU offload: its rate (host-bound steps) calibrates only other offload runs


def _offloads(run: LoadedRun) -> bool:
    return describe_offload(engine=run.spec.engine, options=run.spec.options) != "none"


def choose_rate(pool: Sequence[_Rate], *, engine: str, compiled: bool, exclude: str | None, speedup: float,
                speedup_source: str, offload: bool = False) -> tuple[float | None, str]:
    """(rate, how it was chosen) by the module's rule, leaving ``exclude`` out of the pool and
    keeping runs with CPU offload and runs without apart."""
    if offload and not any(p.offload and p.run != exclude for p in pool):
        return None, Message(N_("no other run with CPU offload to calibrate from (its steps are host-bound)"))
    pool = [p for p in pool if p.run != exclude and p.offload == offload]
    mode = "compiled" if compiled else "eager"

    def mean(items: Sequence[_Rate]) -> float:
        return sum(p.rate for p in items) / len(items)

    def names(items: Sequence[_Rate]) -> MessageList:
        return MessageList(Message(N_("%(run)s (%(engine)s, compiled)") if p.compiled else N_("%(run)s (%(engine)s, eager)"),
                                   run=p.run, engine=p.engine) for p in items)

    same = [p for p in pool if p.engine == engine and p.compiled == compiled]
    if same:
        return mean(same), names(same)
    kin = [p for p in pool if p.compiled == compiled]
    if kin:
        return mean(kin), Message(N_("other compiled engines: %(runs)s") if compiled else N_("other eager engines: %(runs)s"),
                                  runs=names(kin))
    other = [p for p in pool if p.compiled != compiled]
    if other:
        factor = speedup if compiled else 1 / speedup
        return mean(other) * factor, Message(N_("%(runs)s x torch.compile speed-up %(factor)s (%(source)s)"),
                                             runs=names(other), factor=f"{factor:.3g}", source=speedup_source)
    return None, Message(N_("no other run to calibrate from"))


def build_comm(source: str | Path, *, gpu_name: str | None, device: str, gpus_per_node: int) -> tuple[CommModel, str]:
    """Collective curves: CAMPAIGN/commbench (ingest.io.load_commbench) measured on this device
    kind, else the GPU's nominal scale-up link from hardware.toml (intra-node only)."""
    from ingest.io import find_commbench, load_commbench

    rows: list[dict] = []
    bench = find_commbench(source)
    if bench is not None:
        try:
            rows = [r for r in load_commbench(bench) if r.get("device") == device]
        except ToolError:
            rows = []
    comm, intra = build_campaign_comm_model(rows, gpu_name=gpu_name, gpus_per_node=gpus_per_node)
    if comm.curves:
        text = "; ".join(sorted({c.source for c in comm.curves.values()}))
        return comm, Message(N_("measured: %(curves)s (%(path)s)"), curves=text, path=bench)
    # a table of one-rank rows measures no link (bus bandwidth 0): it is said, and not used
    why = (Message(N_("the runner commbench table in %(path)s measured no link (one rank: bus bandwidth 0)"), path=bench)
           if rows else Message(N_("no runner commbench table in CAMPAIGN/commbench")))
    if intra is None:
        return comm, Message(N_("none: %(why)s and no nominal link for this device"), why=why)
    return comm, Message(N_("nominal %(link)s, %(bandwidth)s GB/s bus bandwidth, %(latency)s us (hardware.toml: "
                            "%(source)s); %(why)s"),
                         link=intra.name, bandwidth=f"{intra.bus_bw_gbps:g}", latency=f"{intra.latency_us:g}",
                         source=intra.source, why=why)


def build_predicted(source: str | Path, *, fixed: FixedConfig, runs: Sequence[LoadedRun],
                    summary: Sequence[RunSummary], env: EnvRecord,
                    breakdowns: Mapping[str, Mapping[str, float]] | None = None) -> PredictedSection:
    """The predicted block from the note's runs and metric rows (same order); breakdowns: run ->
    section 5's breakdown_median_ms (traced runs), for the per-category checks."""
    assumptions = load_assumptions()
    shape = build_shape(fixed.model, name=str(fixed.preset or "campaign model"))
    device = "cuda" if any(r.spec.device == "cuda" for r in runs) else "cpu"
    gpu_name, memory_gib = find_campaign_gpu(runs, env) if device == "cuda" else (None, None)
    per_node = max([int(r.spec.world_size) for r in runs] + [1])
    comm, comm_source = build_comm(source, gpu_name=gpu_name, device=device, gpus_per_node=max(per_node, 8))
    limit = (memory_gib or math.inf) * GIB * assumptions.memory_usable_fraction
    empty = dict(gpu_name=gpu_name, comm_source=comm_source, compile_speedup=assumptions.compile_speedup,
                 compile_source=assumptions.compile_source, memory_usable_fraction=assumptions.memory_usable_fraction)
    pool, solved, layouts, why = [], {}, {}, {}
    for r, s in zip(runs, summary):
        layouts[r.name] = lay = build_run_layout(r.spec, compiled=r.compiled)
        median = s.step_time_median_s
        if r.status_name != "ok" or not median:
            continue
        try:
            rate = solve_rate(shape, lay, fixed=fixed, comm=comm, step_time_s=float(median), num_gpus_per_node=per_node)
            # (message, parameters) completed with the calibration's text below
            why[r.name] = None if rate is not None else (
                N_("%(how)s; this run's modelled communication alone exceeds its measured step time"), {})
        except ToolError as e:
            rate, why[r.name] = None, (N_("%(how)s; this run cannot be modelled: %(error)s"), {"error": str(e)})
        solved[r.name] = rate
        if rate is not None:
            pool.append(_Rate(run=r.name, engine=r.spec.engine, compiled=bool(r.compiled), rate=rate,
                              offload=_offloads(r)))
    offloads = {r.name: _offloads(r) for r in runs}
    # runs ended ok with a measured step time, by offload (counted once: a list per run was quadratic)
    num_solved = collections.Counter(offloads[name] for name in solved)
    checks = []
    for r, s in zip(runs, summary):
        lay = layouts[r.name]
        measured = s.step_time_median_s if r.status_name == "ok" else None
        rate, how = choose_rate(pool, engine=r.spec.engine, compiled=bool(r.compiled), exclude=r.name,
                                speedup=assumptions.compile_speedup, speedup_source="perfmodel.toml [compile]",
                                offload=_offloads(r))
        predicted = None
        if rate is not None and measured:
            try:
                predicted = predict_run(shape, lay, fixed=fixed, comm=comm, rate=rate, num_gpus_per_node=per_node,
                                     memory_limit_bytes=limit).step_time_s
            except ToolError as e:
                rate, how = None, Message(N_("no prediction: %(error)s"), error=str(e))
        offload = _offloads(r)
        others = num_solved[offload] - (r.name in solved and offloads[r.name] == offload)
        if rate is None and others:  # other runs ended ok, but none gave a rate: say so, not "no other run"
            how = Message(N_("none of the %(count)s other runs could be calibrated (each row says why)"),
                          count=others)
        if rate is None and why.get(r.name):
            message, params = why[r.name]
            how = Message(message, how=how, **params)
        state, act = compute_layout_memory(shape, lay, seq_length=int(fixed.model.seq_length))
        # the device's share: offloaded model states live in host memory (core.memory)
        state *= 1 - compute_offloaded_fraction(
            sharding=lay.sharding, offload=describe_offload(engine=r.spec.engine, options=r.spec.options))
        checks.append(PredictedCheck(
            run=r.name, engine=r.spec.engine, compiled=bool(r.compiled), world_size=int(r.spec.world_size),
            measured_step_time_s=measured, predicted_step_time_s=predicted,
            error=predicted / measured - 1 if predicted and measured else None,
            measured_mem_gib=s.mem_peak_allocated_gib, predicted_mem_gib=(state + act) / GIB,
            rate_flops=solved.get(r.name), calibration=how))
    errors = [abs(c.error) for c in checks if c.error is not None]
    predicted_layouts: tuple[PredictedLayout, ...] = ()
    reason = None
    if device != "cuda" or gpu_name is None:
        reason = Message(N_("No layouts predicted: this is a CPU campaign, and layouts are predicted for GPU campaigns"
                            " only"))
    elif not pool:
        reason = Message(N_("No layouts predicted: no run ended ok with a step time the model could calibrate on"))
    else:
        predicted_layouts = tuple(_predict_unrun(shape, fixed=fixed, runs=runs, pool=pool, comm=comm, limit=limit,
                                                 gpu_name=gpu_name, assumptions=assumptions))
    signed = [c.error for c in checks if c.error is not None and c.error > -1]
    if len(signed) >= 2:
        predicted_layouts = tuple(dataclasses.replace(l, step_time_low_s=l.step_time_s / (1 + max(signed)),
                                                      step_time_high_s=l.step_time_s / (1 + min(signed)))
                                  for l in predicted_layouts)
    cat_checks = build_category_checks(shape, fixed=fixed, runs=[r for r in runs if r.status_name == "ok"],
                                       layouts=layouts, comm=comm, per_node=per_node, measured=breakdowns or {},
                                       speedup=assumptions.compile_speedup)
    cat_max = {c: max((abs(k.error[c]) for k in cat_checks if k.error[c] is not None), default=None)
               for c in CATEGORY_GROUPS} if cat_checks else {}
    if cat_checks:
        steps = [abs(k.step_error) for k in cat_checks if k.step_error is not None]
        cat_max["step"] = max(steps) if steps else None
    return PredictedSection(checks=tuple(checks), max_abs_error=max(errors) if errors else None,
                            layouts=predicted_layouts, reason=reason, category_checks=tuple(cat_checks),
                            category_max_abs_error=cat_max, **empty)


def _measured_groups(ms: Mapping[str, float]) -> dict[str, float]:
    """Section 5's eight categories (ms) as CATEGORY_GROUPS."""
    return {"compute": ms["compute"], "transfer": ms["transfer"], "bubble": ms["bubble"] + ms["imbalance"],
            "other": ms["skew_wait"] + ms["launch_gaps"] + ms["data_stall"] + ms["other"]}


def comm_pattern(lay: Layout) -> tuple[bool, bool, str]:
    """What a run's exposed communication is made of: (TP collectives, PP p2p, sharding of the
    data-parallel traffic). Runs of one pattern calibrate each other's transfer."""
    return lay.tp_degree > 1, lay.pp_degree > 1, lay.sharding if lay.dp_degree > 1 else "none"


MIN_MODELLED_MS = 0.5  # a run whose model gives less of a category than this does not scale it


def build_category_checks(shape: ModelShape, *, fixed: FixedConfig, runs: Sequence[LoadedRun],
                          layouts: Mapping[str, Layout], comm: CommModel, per_node: int,
                          measured: Mapping[str, Mapping[str, float]], speedup: float) -> list[CategoryCheck]:
    """CategoryCheck per run with section 5's breakdown (``measured``: run -> breakdown_median_ms),
    each predicted from the other such runs only (CategoryCheck says how)."""
    groups = {r.name: _measured_groups(measured[r.name]) for r in runs if r.name in measured}
    rates, specs, own = [], {r.name: r for r in runs if r.name in groups}, {}
    for name, g in groups.items():
        r = specs[name]
        try:
            at_ref = predict_run(shape, layouts[name], fixed=fixed, comm=comm, rate=REFERENCE_RATE,
                                 num_gpus_per_node=per_node, memory_limit_bytes=math.inf).compute_time_s
        except ToolError:
            continue
        if g["compute"] > 0:  # compute time scales as 1 / rate
            rate = REFERENCE_RATE * at_ref / (g["compute"] / 1e3)
            rates.append(_Rate(run=name, engine=r.spec.engine, compiled=bool(r.compiled), rate=rate,
                               offload=_offloads(r)))
            own[name] = _modelled(shape, layouts[name], fixed=fixed, comm=comm, rate=rate, per_node=per_node)

    def scale(name: str, category: str, peers: Sequence[str]) -> tuple[float, tuple[str, ...]]:
        """measured / modelled of ``category`` summed over ``peers`` (each at its own traced rate)."""
        used = tuple(n for n in peers if n in own and own[n][category] >= MIN_MODELLED_MS)
        modelled = sum(own[n][category] for n in used)
        return (sum(groups[n][category] for n in used) / modelled, used) if modelled > 0 else (1.0, ())

    out = []
    for name, g in groups.items():
        r = specs[name]
        rate, _ = choose_rate(rates, engine=r.spec.engine, compiled=bool(r.compiled), exclude=name, speedup=speedup,
                              speedup_source="", offload=_offloads(r))
        others = [n for n in groups if n != name]
        same = [n for n in others if specs[n].spec.engine == r.spec.engine and bool(specs[n].compiled) == bool(r.compiled)]
        peers = same or others
        pred: dict[str, float | None] = dict.fromkeys(CATEGORY_GROUPS)
        transfer_from: tuple[str, ...] = ()
        bubble_from: tuple[str, ...] = ()
        if rate is not None:
            try:
                m = _modelled(shape, layouts[name], fixed=fixed, comm=comm, rate=rate, per_node=per_node)
                k_transfer, transfer_from = scale(name, "transfer", [n for n in others if comm_pattern(layouts[n])
                                                                       == comm_pattern(layouts[name])])
                k_bubble, bubble_from = scale(name, "bubble", [n for n in others if layouts[n].pp_degree > 1])
                pred.update(compute=m["compute"], transfer=m["transfer"] * k_transfer, bubble=m["bubble"] * k_bubble)
            except ToolError:
                pass
        pred["other"] = float(np.median([groups[n]["other"] for n in peers])) if peers else None
        step = sum(pred.values()) if all(v is not None for v in pred.values()) else None
        measured_step = sum(g.values())
        err = {c: (pred[c] / g[c] - 1 if pred[c] is not None and g[c] >= 1.0 else None) for c in CATEGORY_GROUPS}
        step_error = step / measured_step - 1 if step is not None and measured_step > 0 else None
        out.append(CategoryCheck(run=name, measured_ms=g, predicted_ms=pred, error=err, step_measured_ms=measured_step,
                                 step_predicted_ms=step, step_error=step_error,
                                 calibrated=step_error is not None and abs(step_error) <= UNCALIBRATED_ERROR,
                                 host_from=tuple(peers), host_same_engine=bool(same), transfer_from=transfer_from,
                                 bubble_from=bubble_from))
    return out


def _modelled(shape: ModelShape, lay: Layout, *, fixed: FixedConfig, comm: CommModel, rate: float,
              per_node: int) -> dict[str, float]:
    """core.perfmodel's compute, exposed transfer and bubble (ms per step) at ``rate``."""
    p = predict_run(shape, lay, fixed=fixed, comm=comm, rate=rate, num_gpus_per_node=per_node,
                    memory_limit_bytes=math.inf)
    return {"compute": p.compute_time_s * 1e3, "bubble": p.bubble_time_s * 1e3,
            "transfer": (p.exposed_comm_s + p.stage_time_s - p.compute_time_s) * 1e3}


def _strategy_of(lay: Layout) -> tuple[str, str] | None:
    """(strategy, engine) the runner would run this layout with, or None when it would not."""
    if lay.tp_degree == lay.pp_degree == 1 and lay.sharding in ("ddp", "zero3"):
        return ("ddp", "torch-ddp") if lay.sharding == "ddp" else ("zero3", "deepspeed")
    if lay.tp_degree * lay.pp_degree > 1 and lay.sharding == ("megatron-distopt" if lay.dp_degree > 1 else "megatron"):
        return "tp_pp", "megatron"
    return None


def _predict_unrun(shape: ModelShape, *, fixed: FixedConfig, runs: Sequence[LoadedRun],
                   pool: Sequence[_Rate], comm: CommModel, limit: float, gpu_name: str, assumptions) -> list[PredictedLayout]:
    """Each DDP, ZeRO-3 and Megatron TP x PP layout on PREDICT_GPU_COUNTS single-node GPUs that
    the campaign did not run, at the largest micro-batch that fits and leaves m >= 4p (the
    runner's auto-largest search; 1F1B, no interleaving, no recompute: what the runner runs).
    The calibrated rate does not depend on the micro-batch, so smaller ones are not favoured."""
    from core.formulas import divisors

    peak = lookup_peak(gpu_name, fixed.dtype)
    ran = {(int(r.spec.world_size), r.spec.strategy, int(r.spec.tp_degree), int(r.spec.pp_degree)) for r in runs}
    compiled_by_engine = {r.spec.engine: bool(r.compiled) for r in runs}
    seq, batch = int(fixed.model.seq_length), int(fixed.global_batch_size)
    fpt = compute_model_flops_per_token(shape, seq_length=seq)
    out = []
    for n in PREDICT_GPU_COUNTS:
        best: dict[tuple, tuple[Any, Layout, str]] = {}
        for tp in [t for t in divisors(min(n, MAX_PREDICTED_TP)) if shape.num_heads % t == 0]:
            for pp in [p for p in divisors(n // tp) if shape.num_layers % p == 0]:
                dp = n // (tp * pp)
                if batch % dp:
                    continue
                shardings = ("ddp", "zero3") if tp * pp == 1 else ("megatron-distopt" if dp > 1 else "megatron",)
                for sharding in shardings:
                    strategy, engine = _strategy_of(Layout(tp_degree=tp, pp_degree=pp, dp_degree=dp, sharding=sharding))
                    if (n, strategy, tp, pp) in ran:
                        continue
                    compiled = compiled_by_engine.get(engine, engine == "torch-ddp")
                    per_dp, min_m = batch // dp, (4 * pp if pp > 1 else 1)
                    # the runner's auto-largest policy: the largest micro-batch leaving m >= 4p that fits
                    for b in [b for b in reversed(divisors(per_dp)) if per_dp // b >= min_m]:
                        lay = Layout(tp_degree=tp, pp_degree=pp, dp_degree=dp, micro_batch_size=b,
                                     num_microbatches=per_dp // b, sharding=sharding, sequence_parallel=tp > 1,
                                     logits_bytes=logits_bytes(engine, compiled=compiled))
                        if sum(compute_layout_memory(shape, lay, seq_length=seq)) <= limit:
                            break
                    else:
                        continue
                    rate, how = choose_rate(pool, engine=engine, compiled=compiled, exclude=None,
                                            speedup=assumptions.compile_speedup,
                                            speedup_source="perfmodel.toml [compile]")
                    if rate is None:
                        continue
                    pred = predict_run(shape, lay, fixed=fixed, comm=comm, rate=rate, num_gpus_per_node=n,
                                    memory_limit_bytes=limit)
                    best[(strategy, tp, pp)] = (pred, lay, how)
        for (strategy, tp, pp), (pred, lay, how) in sorted(best.items(), key=lambda kv: kv[1][0].step_time_s):
            out.append(PredictedLayout(
                num_gpus=n, strategy=strategy, engine=_strategy_of(lay)[1], sharding=lay.sharding, tp_degree=tp,
                pp_degree=pp, dp_degree=lay.dp_degree, micro_batch_size=lay.micro_batch_size,
                num_microbatches=lay.num_microbatches, step_time_s=pred.step_time_s, tokens_per_s=pred.tokens_per_s,
                mfu=pred.tokens_per_s * fpt / (n * peak.flops) if peak else None,
                bubble_fraction=pred.bubble_fraction, exposed_comm_s=pred.exposed_comm_s,
                comm_bytes_per_step=sum(c.nbytes_per_step for c in pred.comm), mem_gib=pred.mem_total_bytes / GIB,
                calibration=how))
    return out
