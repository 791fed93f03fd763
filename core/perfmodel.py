"""Predicted step time of a parallel layout: compute, pipeline bubble and exposed communication.

One step on the critical pipeline stage is

    t_stage = FLOPs_stage / (peak x efficiency) + TP + CP + EP communication    (on the critical path)
    step    = t_stage x (1 + (p - 1)/(v·m))                                     (1F1B bubble, Narayanan et al. 2021 s2.2)
            + exposed PP send/recv + exposed DP gradient / ZeRO traffic

Collective times come from ``CommModel``: bus bandwidth vs message size measured by
`runner commbench` (nccl-tests conventions, doc/PERFORMANCE.md: all-reduce busbw = algbw x
2(n-1)/n, all-gather / reduce-scatter / all-to-all x (n-1)/n, send/recv x 1 -- busbw carries
over between group sizes, which is what lets a 2-GPU measurement price an 8-GPU collective),
or nominal link figures from hardware.toml where nothing was measured. What overlaps what is
this tool's stated assumption (``predict_layout``'s docstring), not a measurement.
Deliberately not here: choosing layouts (runner.plan), memory formulas (core.memory), FLOPs and
the bus factor (core.formulas).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from core import memory as mem
from core.errors import ConfigError
from core.i18n import Message, N_
from core.formulas import (
    COLLECTIVES, ModelShape, compute_bubble_fraction, compute_bubble_ratio, compute_bus_factor,
    compute_layer_flops_per_token, compute_model_flops_per_token, compute_output_flops_per_token, count_params,
)
from core.hardware import Link, load_hardware_toml, load_links, lookup_gpu  # noqa: F401 - Link, load_links: re-exported
from core.records import EnvRecord, FixedConfig, LoadedRun, ModelConfig, RunSpec

PERFMODEL_TOML = Path(files("core") / "perfmodel.toml")
REFERENCE_FLOPS = 1e12  # calibration: rates are solved as efficiency x this reference, then carried as FLOP/s
ENGINE_OF_SHARDING = {"ddp": "torch-ddp", "zero1": "deepspeed", "zero2": "deepspeed", "zero3": "deepspeed",
                      "megatron": "megatron", "megatron-distopt": "megatron"}
GRAD_BYTES = {"ddp": 2, "zero1": 2, "zero2": 2, "zero3": 2, "megatron": 4, "megatron-distopt": 4}  # Megatron: fp32 main grads


@dataclass(frozen=True, kw_only=True)
class Assumptions:
    """perfmodel.toml: the model's stated assumptions, each with its source."""

    compute_efficiency: float
    compute_source: str
    compile_speedup: float
    compile_source: str
    memory_usable_fraction: float
    memory_source: str


@functools.cache
def load_assumptions(path: Path = PERFMODEL_TOML) -> Assumptions:
    """Read perfmodel.toml. Raises ConfigError naming a missing or out-of-range key."""
    data = load_hardware_toml(path)  # the same TOML reader (ParseError when malformed)
    try:
        out = Assumptions(
            compute_efficiency=float(data["compute"]["efficiency"]), compute_source=data["compute"]["source"],
            compile_speedup=float(data["compile"]["speedup"]), compile_source=data["compile"]["source"],
            memory_usable_fraction=float(data["memory"]["usable_fraction"]), memory_source=data["memory"]["source"])
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{path}: missing or malformed key {e}; restore it from the repository") from None
    if not (0 < out.compute_efficiency <= 1 and 0 < out.memory_usable_fraction <= 1 and out.compile_speedup > 0):
        raise ConfigError(f"{path}: efficiency and usable_fraction must be in (0, 1], speedup > 0")
    return out


@dataclass(frozen=True, kw_only=True)
class CommCurve:
    """Bus bandwidth of one collective in one scope vs message size: measured points
    (ascending nbytes; time_us the measured time) or, with no points, a nominal link
    (latency_us + factor x nbytes / bus_bw)."""

    op: str
    scope: str
    nbytes: tuple[float, ...] = ()
    bus_bw_gbps: tuple[float, ...] = ()
    time_us: tuple[float, ...] = ()
    world_size: int | None = None  # the group size it was measured at
    latency_us: float = 0.0
    nominal_bus_bw_gbps: float | None = None
    source: str = ""

    @property
    def measured(self) -> bool:
        return bool(self.nbytes)


def compute_collective_time_s(curve: CommCurve, *, nbytes: float, group_size: int) -> float:
    """Seconds for one collective moving a ``nbytes`` buffer (nccl-tests "size": the whole
    all-reduced / gathered / scattered buffer, the message for send/recv) over ``group_size`` ranks.

    Measured: factor x nbytes / busbw(nbytes), busbw interpolated log-log between the measured
    sizes and held constant beyond them, never below the fastest measured call (the latency floor).
    Nominal: latency + factor x nbytes / bus_bw. 0 for a group of one (send/recv excepted).
    """
    if nbytes <= 0 or (group_size <= 1 and curve.op != "send_recv"):
        return 0.0
    factor = compute_bus_factor(curve.op, max(group_size, 2))
    if not curve.measured:
        return curve.latency_us * 1e-6 + factor * nbytes / (curve.nominal_bus_bw_gbps * 1e9)
    xs, ys = curve.nbytes, curve.bus_bw_gbps
    if nbytes <= xs[0]:
        bw = ys[0]
    elif nbytes >= xs[-1]:
        bw = ys[-1]
    else:
        i = next(k for k in range(1, len(xs)) if xs[k] >= nbytes)
        w = (math.log(nbytes) - math.log(xs[i - 1])) / (math.log(xs[i]) - math.log(xs[i - 1]))
        bw = math.exp(math.log(max(ys[i - 1], 1e-12)) * (1 - w) + math.log(max(ys[i], 1e-12)) * w)
    return max(factor * nbytes / (bw * 1e9), min(curve.time_us) * 1e-6)


@dataclass(frozen=True, kw_only=True)
class CommModel:
    """Collective curves by (op, scope): measured where `runner commbench` ran, else nominal."""

    curves: Mapping[tuple[str, str], CommCurve]
    intra: Link | None
    inter: Link | None

    def curve(self, op: str, scope: str) -> CommCurve:
        """The measured curve for (op, scope), else (all_to_all: the all_gather curve, same bus
        factor) the nominal link of that scope. Raises ConfigError when neither exists."""
        if (op, scope) in self.curves:
            return self.curves[(op, scope)]
        if op == "all_to_all" and ("all_gather", scope) in self.curves:
            return dataclasses.replace(self.curves[("all_gather", scope)], op=op)
        link = self.intra if scope == "intra" else self.inter
        if link is None:
            raise ConfigError(Message(N_("no %(scope)s-node %(op)s figures: no `runner commbench` table and no nominal "
                                         "link (CPU/gloo: run `runner commbench --device cpu --out CAMPAIGN/commbench`)"),
                                      scope=scope, op=op))
        return CommCurve(op=op, scope=scope, latency_us=link.latency_us, nominal_bus_bw_gbps=link.bus_bw_gbps,
                         source=f"nominal {link.name} ({link.source})")


def build_comm_model(rows: Sequence[Mapping[str, Any]], *, intra: Link | None, inter: Link | None,
                     gpus_per_node: int) -> CommModel:
    """Curves from commbench rows (ingest.commbench: op, nbytes, world_size, num_nodes, time_us,
    busbw_gbps): per (op, scope) the rows of the largest group measured, averaged per size.
    A node-shared inter link's bandwidth is divided among the node's GPUs."""
    if inter is not None and inter.per == "node":
        inter = dataclasses.replace(inter, bus_bw_gbps=inter.bus_bw_gbps / max(gpus_per_node, 1),
                                  name=f"{inter.name}, shared by {gpus_per_node} GPUs")
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        scope = "inter" if int(r.get("num_nodes") or 1) > 1 else "intra"
        groups.setdefault((r["op"], scope), []).append(r)
    curves = {}
    for (op, scope), rs in groups.items():
        n = max(int(r["world_size"]) for r in rs)
        by_size: dict[float, list[tuple[float, float]]] = {}
        for r in rs:
            if int(r["world_size"]) == n and r.get("busbw_gbps") and r["busbw_gbps"] > 0:
                by_size.setdefault(float(r["nbytes"]), []).append((float(r["busbw_gbps"]), float(r["time_us"])))
        if not by_size:
            continue
        sizes = sorted(by_size)
        curves[(op, scope)] = CommCurve(
            op=op, scope=scope, nbytes=tuple(sizes), world_size=n,
            bus_bw_gbps=tuple(sum(b for b, _ in by_size[x]) / len(by_size[x]) for x in sizes),
            time_us=tuple(sum(t for _, t in by_size[x]) / len(by_size[x]) for x in sizes),
            source=f"runner commbench, {op} on {n} ranks"
                   + (f" ({rs[0].get('backend')}, {rs[0].get('device_name') or rs[0].get('device')})" if rs[0].get("backend") else ""))
    return CommModel(curves=curves, intra=intra, inter=inter)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """One parallel layout. world size = tp x pp x cp x dp (EP is carved out of dp x cp, as in
    Megatron-core). sharding: core.memory.SHARDINGS; recompute: core.memory.RECOMPUTES."""

    tp_degree: int = 1
    pp_degree: int = 1
    cp_degree: int = 1
    ep_degree: int = 1
    dp_degree: int = 1
    num_virtual_stages: int = 1
    micro_batch_size: int = 1
    num_microbatches: int = 1
    sharding: str = "ddp"
    recompute: str = "selective"
    sequence_parallel: bool = False
    uneven_pp: bool = False
    # bytes per gradient element the data-parallel reduction moves; None: GRAD_BYTES[sharding]
    # (a campaign run: what its engine reduces -- torch DDP under autocast keeps fp32 parameters and
    # all-reduces fp32 gradients; Megatron with grad_reduce_in_fp32; FSDP2 its reduce_dtype)
    grad_reduce_bytes: int | None = None
    # bytes per logit held at the output layer's peak: 4 = the fp32 logits a fused or vocab-parallel
    # cross entropy keeps (Korthikanti et al. 2022 s4.3); 10 = an unfused eager cross entropy
    # (runner.model.lm_loss: bf16 logits 2 + their fp32 copy 4 + the fp32 gradient 4)
    logits_bytes: int = 4
    # bytes per parameter a campaign run's engine holds beside its model states at the backward
    # peak (core.memory.compute_torch_ddp_extra_bytes_per_param); 0: the planner's engines
    extra_bytes_per_param: float = 0.0

    @property
    def world_size(self) -> int:
        return self.tp_degree * self.pp_degree * self.cp_degree * self.dp_degree

    @property
    def engine(self) -> str:
        return ENGINE_OF_SHARDING[self.sharding]


@dataclass(frozen=True, kw_only=True)
class CommCost:
    """One kind of communication of one step on the critical GPU.
    kind: tp | cp | ep | pp | dp; nbytes_per_call: the nccl-tests size of one call."""

    kind: str
    op: str
    group_size: int
    scope: str
    num_calls: float
    nbytes_per_call: float
    time_s: float
    exposed_s: float
    source: str

    @property
    def nbytes_per_step(self) -> float:
        return self.num_calls * self.nbytes_per_call


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """A layout's predicted memory (bytes on its fullest GPU) and step time (seconds)."""

    layout: Layout
    mem_model_state_bytes: float
    mem_activation_bytes: float
    mem_total_bytes: float
    mem_limit_bytes: float
    fits: bool
    compute_time_s: float  # critical stage, all micro-batches, no communication
    stage_time_s: float  # + TP/CP/EP communication on the critical path
    bubble_fraction: float
    bubble_time_s: float
    comm: tuple[CommCost, ...]
    exposed_comm_s: float
    step_time_s: float
    tokens_per_s: float
    mfu: float
    compute_efficiency: float
    efficiency_source: str
    stage_imbalance: float  # slowest / fastest stage compute
    warnings: tuple[str, ...] = field(default_factory=tuple)


def _group_scope(*, stride: int, size: int, gpus_per_node: int) -> str:
    """"inter" when the first group of ``size`` ranks ``stride`` apart spans two nodes (ranks
    fill nodes in order; Megatron-core orders TP, CP, EP/DP, PP from the innermost)."""
    return "inter" if size > 1 and (size - 1) * stride >= gpus_per_node else "intra"


def predict_layout(shape: ModelShape, layout: Layout, *, seq_length: int, global_batch_size: int,
                   gpus_per_node: int, peak_flops: float, compute_efficiency: float, comm: CommModel,
                   memory_limit_bytes: float, efficiency_source: str = "") -> Prediction:
    """Memory and step time of ``layout`` training ``shape`` on global_batch_size sequences of
    seq_length tokens per step, on GPUs of ``peak_flops`` dense FLOP/s.

    Compute: each stage's FLOPs (layers x compute_layer_flops_per_token, + the output layer on the
    last stage, x 4/3 on the layers under full recomputation) over the stage's m x b x s/cp
    tokens / TP, at peak x compute_efficiency. Overlap assumptions (this tool's, stated):
    TP collectives (4 all-reduces per layer per micro-batch, 6 with full recompute, Narayanan et
    al. 2021 s3.2; with sequence parallelism 6 all-gathers + 4 reduce-scatters, Korthikanti et
    al. 2022 s4.2.2), CP's K/V all-gathers beyond the attention compute, and MoE all-to-alls
    are exposed; PP send/recv costs 2(v·m + p - 1) transfers on the critical path; DP gradient
    reduction hides under the last micro-batch's backward (2/3 of its compute); the
    distributed optimizer's / ZeRO-1/2's parameter all-gather is exposed; ZeRO-3's per
    micro-batch all-gather (forward, backward) + reduce-scatter (ZeRO s7: 3Ψ vs 2Ψ) hides under
    that micro-batch's compute. Raises ConfigError when the layout is impossible.
    """
    lay, s, h = layout, seq_length, shape.hidden_size
    t, p, cp, dp, ep, v = lay.tp_degree, lay.pp_degree, lay.cp_degree, lay.dp_degree, lay.ep_degree, lay.num_virtual_stages
    b, m = lay.micro_batch_size, lay.num_microbatches
    if b * m * dp != global_batch_size:
        raise ConfigError(f"micro_batch_size {b} x num_microbatches {m} x dp {dp} != global batch {global_batch_size}")
    layers = mem.split_layers(num_layers=shape.num_layers, pp_degree=p, uneven=lay.uneven_pp)
    s_local = s // cp
    tokens_mb = b * s_local  # tokens of one micro-batch on one GPU
    layer_flops = compute_layer_flops_per_token(shape, seq_length=s) * (4 / 3 if lay.recompute == "full" else 1)
    out_flops = compute_output_flops_per_token(shape)
    rate = peak_flops * compute_efficiency
    act_bytes = float(tokens_mb * h * mem.ACTIVATION_BYTES)  # one micro-batch's hidden states, full width

    # per-stage compute and critical-path communication
    tp_scope = _group_scope(stride=1, size=t, gpus_per_node=gpus_per_node)
    cp_scope = _group_scope(stride=t, size=cp, gpus_per_node=gpus_per_node)
    dp_scope = _group_scope(stride=t, size=cp * dp, gpus_per_node=gpus_per_node)  # the DP x CP group
    pp_scope = _group_scope(stride=t * cp * dp, size=p, gpus_per_node=gpus_per_node)
    # TP per layer per micro-batch. Without sequence parallelism: 4 all-reduces of the hidden states
    # (2 forward, 2 backward; +2 with full recompute; Narayanan et al. 2021 s3.2). With it, each
    # becomes an all-gather + reduce-scatter pair, and the backward re-gathers each column-parallel
    # linear's input for its weight gradient: 6 all-gathers + 4 reduce-scatters (+2 + 2 with full
    # recompute; Korthikanti et al. 2022 s4.2.2, Megatron-core's tensor_parallel/layers.py).
    if lay.sequence_parallel:
        tp_ops = (("all_gather", 8 if lay.recompute == "full" else 6), ("reduce_scatter", 6 if lay.recompute == "full" else 4))
    else:
        tp_ops = (("all_reduce", 6 if lay.recompute == "full" else 4),)
    tp_curves = {op: comm.curve(op, tp_scope) for op, _ in tp_ops}
    tp_call_s = {op: compute_collective_time_s(tp_curves[op], nbytes=act_bytes, group_size=t) for op, _ in tp_ops}
    t_tp_layer = sum(n * tp_call_s[op] for op, n in tp_ops)  # one layer, one micro-batch
    cp_curve = comm.curve("all_gather", cp_scope)
    kv_bytes = 2.0 * b * s * shape.kv_hidden_size * mem.ACTIVATION_BYTES / t
    t_cp_call = compute_collective_time_s(cp_curve, nbytes=kv_bytes, group_size=cp)
    moe = shape.num_experts > 1
    ep_curve = comm.curve("all_to_all", "inter" if ep * t * cp > gpus_per_node else "intra")
    a2a_bytes = act_bytes * shape.moe_top_k / (t if lay.sequence_parallel else 1)
    t_ep_call = compute_collective_time_s(ep_curve, nbytes=a2a_bytes, group_size=ep) if moe else 0.0
    stage_compute, stage_time = [], []
    for k, n_layers in enumerate(layers):
        flops = m * tokens_mb * (n_layers * layer_flops + (out_flops if k == p - 1 else 0.0)) / t
        compute_s = flops / rate
        attention_s = m * tokens_mb * n_layers * 12 * h * s / t / rate
        tp_s = m * n_layers * t_tp_layer
        cp_s = max(0.0, m * n_layers * 3 * t_cp_call - attention_s)
        ep_s = m * n_layers * 4 * t_ep_call
        stage_compute.append(compute_s)
        stage_time.append(compute_s + tp_s + cp_s + ep_s)
    crit = max(range(p), key=lambda k: stage_time[k])
    t_stage = stage_time[crit]
    bubble_s = t_stage * compute_bubble_ratio(pp_degree=p, num_microbatches=m, num_virtual_stages=v) if p > 1 else 0.0
    t_mb = t_stage / m

    costs = []
    n_crit = layers[crit]
    if t > 1:
        for op, n in tp_ops:
            total = m * n_crit * n * tp_call_s[op]
            costs.append(CommCost(kind="tp", op=op, group_size=t, scope=tp_scope, num_calls=m * n_crit * n,
                                  nbytes_per_call=act_bytes, time_s=total, exposed_s=total, source=tp_curves[op].source))
    if cp > 1:
        total = m * n_crit * 3 * t_cp_call
        attention_s = m * tokens_mb * n_crit * 12 * h * s / t / rate
        costs.append(CommCost(kind="cp", op="all_gather", group_size=cp, scope=cp_scope, num_calls=m * n_crit * 3,
                              nbytes_per_call=kv_bytes, time_s=total, exposed_s=max(0.0, total - attention_s),
                              source=cp_curve.source))
    if moe and ep > 1:
        total = m * n_crit * 4 * t_ep_call
        costs.append(CommCost(kind="ep", op="all_to_all", group_size=ep, scope=ep_curve.scope,
                              num_calls=m * n_crit * 4, nbytes_per_call=a2a_bytes, time_s=total, exposed_s=total,
                              source=ep_curve.source))
    if p > 1:
        pp_curve = comm.curve("send_recv", pp_scope)
        pp_bytes = act_bytes / (t if lay.sequence_parallel else 1)
        t_p2p = compute_collective_time_s(pp_curve, nbytes=pp_bytes, group_size=2)
        costs.append(CommCost(kind="pp", op="send_recv", group_size=p, scope=pp_scope, num_calls=2 * v * m,
                              nbytes_per_call=pp_bytes, time_s=2 * v * m * t_p2p,
                              exposed_s=2 * (v * m + p - 1) * t_p2p, source=pp_curve.source))
    d = dp * cp  # gradients are reduced over the data-parallel-with-context group
    params = mem.compute_stage_params(shape, stage=crit, layers=layers, tp_degree=t, ep_degree=ep)
    psi = params.dense + params.expert
    if d > 1:
        costs += _dp_costs(lay, comm=comm, psi=psi, d=d, scope=dp_scope, t_mb=t_mb, m=m)
    exposed = sum(c.exposed_s for c in costs if c.kind in ("pp", "dp"))
    step = t_stage + bubble_s + exposed

    state_bytes, act_bytes_peak = compute_layout_memory(shape, lay, seq_length=s)
    total_tokens = global_batch_size * s
    tokens_per_s = total_tokens / step
    mfu = tokens_per_s * compute_model_flops_per_token(shape, seq_length=s) / (lay.world_size * peak_flops)
    warnings = []
    if p > 1 and m < 4 * p:
        warnings.append(f"m = {m} < 4p = {4 * p}: bubble {compute_bubble_fraction(pp_degree=p, num_microbatches=m, num_virtual_stages=v):.0%}")
    if lay.uneven_pp:
        warnings.append(f"uneven pipeline split {layers[0]}+...+{layers[-1]} layers")
    if tp_scope == "inter":
        warnings.append("TP group crosses nodes")
    return Prediction(
        layout=lay, mem_model_state_bytes=state_bytes, mem_activation_bytes=act_bytes_peak,
        mem_total_bytes=state_bytes + act_bytes_peak, mem_limit_bytes=memory_limit_bytes,
        fits=state_bytes + act_bytes_peak <= memory_limit_bytes, compute_time_s=stage_compute[crit],
        stage_time_s=t_stage, bubble_fraction=bubble_s / (t_stage + bubble_s), bubble_time_s=bubble_s,
        comm=tuple(costs), exposed_comm_s=step - stage_compute[crit] - bubble_s, step_time_s=step,
        tokens_per_s=tokens_per_s, mfu=mfu, compute_efficiency=compute_efficiency,
        efficiency_source=efficiency_source, stage_imbalance=max(stage_compute) / min(stage_compute),
        warnings=tuple(warnings))


def compute_layout_memory(shape: ModelShape, layout: Layout, *, seq_length: int) -> tuple[float, float]:
    """(model-state bytes, activation bytes) on the layout's fullest GPU: over the first, second
    and last pipeline stages (the others equal the second), model states (core.memory,
    sharded over DP x CP, plus the engine's extra_bytes_per_param) + per-layer activations x layers x in-flight micro-batches (1F1B),
    + the output layer's activations on the last stage. Context parallelism needs flash
    attention, so its scores are never stored."""
    lay = layout
    t, p, cp = lay.tp_degree, lay.pp_degree, lay.cp_degree
    layers = mem.split_layers(num_layers=shape.num_layers, pp_degree=p, uneven=lay.uneven_pp)
    s_local, b = seq_length // cp, lay.micro_batch_size
    per_layer = mem.compute_activation_bytes_per_layer(
        shape, seq_length=s_local, micro_batch_size=b, tp_degree=t, sequence_parallel=lay.sequence_parallel,
        recompute="selective" if (cp > 1 and lay.recompute == "none") else lay.recompute)
    out_act = mem.compute_output_activation_bytes(shape, seq_length=s_local, micro_batch_size=b, tp_degree=t,
                                                  logits_bytes=lay.logits_bytes)
    best = (0.0, 0.0)
    for k in sorted({0, min(1, p - 1), p - 1}):
        params = mem.compute_stage_params(shape, stage=k, layers=layers, tp_degree=t, ep_degree=lay.ep_degree)
        state = mem.compute_model_state_bytes(params, sharding=lay.sharding, dp_degree=lay.dp_degree, cp_degree=cp,
                                              ep_degree=lay.ep_degree)
        state += (params.dense + params.expert) * lay.extra_bytes_per_param
        inflight = mem.compute_inflight_microbatches(stage=k, pp_degree=p, num_microbatches=lay.num_microbatches,
                                                     num_virtual_stages=lay.num_virtual_stages)
        act = per_layer * layers[k] * inflight + (out_act if k == p - 1 else 0.0)
        if state + act > sum(best):
            best = (state, act)
    return best


def _dp_costs(lay: Layout, *, comm: CommModel, psi: float, d: int, scope: str, t_mb: float, m: int) -> list[CommCost]:
    """Data-parallel traffic of one step for the layout's optimizer sharding (see predict_layout)."""
    grad_bytes = psi * (lay.grad_reduce_bytes or GRAD_BYTES[lay.sharding])
    param_bytes = psi * 2
    window = 2 / 3 * t_mb  # the last micro-batch's backward
    ar, rs, ag = (comm.curve(op, scope) for op in ("all_reduce", "reduce_scatter", "all_gather"))
    if lay.sharding in ("ddp", "megatron"):
        time = compute_collective_time_s(ar, nbytes=grad_bytes, group_size=d)
        return [CommCost(kind="dp", op="all_reduce", group_size=d, scope=scope, num_calls=1, nbytes_per_call=grad_bytes,
                         time_s=time, exposed_s=max(0.0, time - window), source=ar.source)]
    if lay.sharding == "zero3":
        t_ag = compute_collective_time_s(ag, nbytes=param_bytes, group_size=d)
        t_rs = compute_collective_time_s(rs, nbytes=grad_bytes, group_size=d)
        exposed = m * max(0.0, 2 * t_ag + t_rs - t_mb)
        return [CommCost(kind="dp", op="all_gather", group_size=d, scope=scope, num_calls=2 * m,
                         nbytes_per_call=param_bytes, time_s=2 * m * t_ag, exposed_s=exposed * 2 * t_ag / (2 * t_ag + t_rs),
                         source=ag.source),
                CommCost(kind="dp", op="reduce_scatter", group_size=d, scope=scope, num_calls=m,
                         nbytes_per_call=grad_bytes, time_s=m * t_rs, exposed_s=exposed * t_rs / (2 * t_ag + t_rs),
                         source=rs.source)]
    t_rs = compute_collective_time_s(rs, nbytes=grad_bytes, group_size=d)
    t_ag = compute_collective_time_s(ag, nbytes=param_bytes, group_size=d)
    return [CommCost(kind="dp", op="reduce_scatter", group_size=d, scope=scope, num_calls=1, nbytes_per_call=grad_bytes,
                     time_s=t_rs, exposed_s=max(0.0, t_rs - window), source=rs.source),
            CommCost(kind="dp", op="all_gather", group_size=d, scope=scope, num_calls=1, nbytes_per_call=param_bytes,
                     time_s=t_ag, exposed_s=t_ag, source=ag.source)]


def compute_time_to_train_s(*, num_params: float, num_tokens: float, num_gpus: int, peak_flops: float,
                            mfu: float) -> float:
    """Seconds to train on num_tokens: 6·N·D / (GPUs x dense peak x MFU) (Kaplan et al. 2020
    s2.1 for 6ND; DESIGN.md "Time to train"). Raises ConfigError for non-positive inputs."""
    if min(num_params, num_tokens, num_gpus, peak_flops, mfu) <= 0:
        raise ConfigError("time to train needs positive parameters, tokens, GPUs, peak and MFU")
    return 6.0 * num_params * num_tokens / (num_gpus * peak_flops * mfu)


# --- a campaign's runs as the model sees them (the note's predicted block and `runner plan --calibration`)


def build_shape(model: ModelConfig, *, name: str) -> ModelShape:
    """The campaign's GPT (runner.model: GELU MLP, biases, learned positions, tied embedding,
    no dropout) as a planner shape; vocab is the padded vocab the runs trained."""
    return ModelShape(name=name, num_layers=int(model.num_layers), hidden_size=int(model.hidden_size),
                      num_heads=int(model.num_heads), num_kv_heads=int(model.num_heads),
                      ffn_hidden_size=int(model.ffn_hidden_size), vocab_size=int(model.padded_vocab_size),
                      max_position_embeddings=int(model.seq_length))


def count_model_params(model: ModelConfig) -> int:
    """Closed-form parameter count of the campaign's GPT (runner.model.GPT: tied embedding once,
    padded vocab): core.formulas.count_params of its shape. Per block: 4H^2+4H (attention qkv+proj
    with biases) + 2HF+F+H (MLP) + 4H (two LayerNorms)."""
    return count_params(build_shape(model, name="runner.model.GPT"))


def build_run_layout(spec: RunSpec, *, compiled: bool | None) -> Layout:
    """A campaign run's layout: DDP, DeepSpeed ZeRO-3, Megatron (distributed optimizer when the
    run's knob says so; sequence parallel with TP > 1, as runner.strategies.tp_pp_megatron), the
    torch TP+PP engine (replicated optimizer, no SP). Attention is SDPA flash: scores never stored
    ("selective"); ``options.recompute = "full"``: only each layer's input is stored ("full").
    compiled: torch.compile on (the run's RunInfo.compile; None: not recorded, taken as off)."""
    options = spec.options or {}
    if spec.strategy == "zero3":
        sharding = "zero3"
    elif spec.strategy == "tp_pp" and spec.engine == "megatron":
        sharding = "megatron-distopt" if options.get("use_distributed_optimizer") else "megatron"
    else:
        sharding = "ddp"
    return Layout(tp_degree=int(spec.tp_degree), pp_degree=int(spec.pp_degree), dp_degree=int(spec.dp_degree),
                  micro_batch_size=int(spec.micro_batch_size), num_microbatches=int(spec.num_microbatches),
                  sharding=sharding, recompute="full" if options.get("recompute") == "full" else "selective",
                  sequence_parallel=spec.engine == "megatron" and int(spec.tp_degree) > 1,
                  grad_reduce_bytes=grad_reduce_bytes(spec),
                  logits_bytes=logits_bytes(spec.engine, compiled=bool(compiled)),
                  extra_bytes_per_param=mem.compute_torch_ddp_extra_bytes_per_param(
                      autocast_bf16=spec.fixed.dtype == "bf16", num_microbatches=int(spec.num_microbatches))
                  if spec.engine == "torch-ddp" else 0.0)


def grad_reduce_bytes(spec: RunSpec) -> int:
    """Bytes per gradient element a campaign run's data-parallel reduction moves: torch DDP and
    the torch TP+PP engine keep fp32 parameters under autocast, so their gradients are fp32 (4);
    Megatron reduces fp32 with grad_reduce_in_fp32 (its default here), else the campaign dtype;
    FSDP2 its reduce_dtype; DeepSpeed the campaign dtype."""
    options, dtype = spec.options or {}, spec.fixed.dtype
    half = 2 if dtype in ("bf16", "fp16") else 4
    engine = spec.engine
    if engine in ("torch-ddp", "torch"):
        return 4
    if engine == "megatron":
        return 4 if options.get("grad_reduce_in_fp32", True) else half
    if engine == "fsdp2":
        return {"fp32": 4, "bf16": 2}.get(options.get("reduce_dtype") or dtype, half)
    return half


def logits_bytes(engine: str, *, compiled: bool) -> int:
    """Bytes per logit at the output layer's peak: Megatron's vocab-parallel cross entropy and a
    compiled loss keep the fp32 logits (4); the torch engines' eager runner.model.lm_loss also
    holds the bf16 logits and the fp32 gradient (10)."""
    return 4 if engine == "megatron" or compiled else 10


def predict_run(shape: ModelShape, lay: Layout, *, fixed: FixedConfig, comm: CommModel, rate: float,
             num_gpus_per_node: int, memory_limit_bytes: float):
    return predict_layout(shape, lay, seq_length=int(fixed.model.seq_length),
                          global_batch_size=int(fixed.global_batch_size), gpus_per_node=num_gpus_per_node,
                          peak_flops=REFERENCE_FLOPS, compute_efficiency=rate / REFERENCE_FLOPS, comm=comm,
                          memory_limit_bytes=memory_limit_bytes)


def solve_rate(shape: ModelShape, lay: Layout, *, fixed: FixedConfig, comm: CommModel, step_time_s: float,
               num_gpus_per_node: int) -> float | None:
    """The compute rate (FLOP/s per GPU) at which the model reproduces step_time_s (bisection in
    log space; the step time falls as the rate rises). None when communication alone is slower."""
    def step(rate: float) -> float:
        return predict_run(shape, lay, fixed=fixed, comm=comm, rate=rate, num_gpus_per_node=num_gpus_per_node,
                        memory_limit_bytes=math.inf).step_time_s

    lo, hi = 1e3, 1e18
    if step(hi) > step_time_s:
        return None
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if step(mid) > step_time_s else (lo, mid)
        if hi / lo < 1 + 1e-9:
            break
    return math.sqrt(lo * hi)


def find_campaign_gpu(runs: Sequence[LoadedRun], env: EnvRecord) -> tuple[str | None, float | None]:
    """(device name, memory GiB) of a campaign's GPUs: the runs' run_info device name, else env.json's;
    memory from env.json, else hardware.toml."""
    name = next((r.info.device_name for r in runs if r.spec.device == "cuda" and r.info and r.info.device_name), None)
    name = name or next((g.name for g in env.gpus if g.name), None)
    mib = next((g.memory_total_mib for g in env.gpus if g.memory_total_mib is not None), None)
    if mib:
        return name, mib / 1024
    entry = lookup_gpu(name) if name else None
    return name, entry.memory_gib if entry else None


def build_campaign_comm_model(rows: Sequence[Mapping[str, Any]], *, gpu_name: str | None,
                              gpus_per_node: int) -> tuple[CommModel, Link | None]:
    """A campaign's collective curves: its `runner commbench` rows (already filtered to its device
    kind), else the GPU's nominal scale-up link from hardware.toml (NVLink fabric, else PCIe) inside
    a node and InfiniBand NDR between nodes. Returns (model, the nominal intra-node link or None)."""
    entry = lookup_gpu(gpu_name) if gpu_name else None
    links = load_links()
    intra = links.get(entry.fabric or entry.pcie) if entry else None
    return build_comm_model(rows, intra=intra, inter=links.get("ib_ndr"), gpus_per_node=gpus_per_node), intra
