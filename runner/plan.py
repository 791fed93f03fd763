"""`runner plan`: size memory, enumerate TP/PP/CP/EP/DP layouts, rank those that fit by
predicted step time, and say what to change when none does.

The recipe (DESIGN.md "Placement recipe"): TP inside a node (<= 8 and <= GPUs per node, dividing
the heads and KV heads), PP over the layers (dividing them, or an uneven first/last stage on
request), CP for sequences of 16K tokens and more, EP over the experts of an MoE model, the rest
data parallel with an optimizer sharding (DDP, ZeRO-1/2/3, Megatron with or without its
distributed optimizer). For each layout the micro-batch size, interleaving and recomputation
with the best predicted step time that fits are kept. Numbers come from core.memory and
core.perfmodel; this module chooses and explains. Deliberately not here: launching anything.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from core.errors import ConfigError
from core import memory as mem
from core.perfmodel import (
    CommModel, Layout, Prediction, compute_layout_memory, compute_time_to_train_s, predict_layout,
)
from core.formulas import ModelShape, compute_model_flops_per_token, count_params, divisors

PLAN_SCHEMA_VERSION = 1
MAX_TP = 8  # TP all-reduces need the scale-up link: at most one node of 8 (Narayanan et al. 2021 s3.3)
CP_MIN_SEQ = 16384  # context parallelism is considered from this sequence length
CP_MIN_LOCAL_SEQ = 4096  # ... down to this many tokens per CP rank
DP_SHARDINGS = ("ddp", "zero1", "zero2", "zero3", "megatron", "megatron-distopt")
MP_SHARDINGS = ("megatron", "megatron-distopt")
RECOMPUTE_CHOICES = ("selective", "full")  # every engine here uses flash attention: scores never stored
GIB = 2**30


class NoFitError(ConfigError):
    """No layout fits: the message says the smallest change that makes one fit."""


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What `runner plan` was asked. global_batch_size: sequences per optimizer step.
    efficiency: engine -> (compute efficiency, its source); engines absent use default_efficiency."""

    shape: ModelShape
    seq_length: int
    global_batch_size: int
    num_gpus: int
    gpus_per_node: int
    gpu_key: str
    gpu_name: str
    peak_flops: float
    peak_source: str
    memory_gib: float
    memory_usable_fraction: float
    comm: CommModel
    default_efficiency: float
    default_efficiency_source: str
    efficiency: Mapping[str, tuple[float, str]] = dataclasses.field(default_factory=dict)
    tp_degree: int | None = None
    pp_degree: int | None = None
    cp_degree: int | None = None
    ep_degree: int | None = None
    uneven_pp: bool = False
    num_tokens: float | None = None
    mfu: float | None = None

    @property
    def memory_limit_bytes(self) -> float:
        return self.memory_gib * GIB * self.memory_usable_fraction


@dataclass(frozen=True, kw_only=True)
class StateRow:
    """Model-state bytes per GPU of one optimizer sharding over shard_degree ranks, for the
    parameters of one model-parallel shard (params_per_gpu)."""

    sharding: str
    shard_degree: int
    params_per_gpu: float
    bytes_per_gpu: float


@dataclass(frozen=True, kw_only=True)
class ActivationRow:
    """One layer's activations for one micro-batch on one GPU, bytes."""

    tp_degree: int
    sequence_parallel: bool
    recompute: str
    micro_batch_size: int
    seq_length: int
    bytes_per_layer: float


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The answer: memory tables, ranked layouts that fit (best first), time to train, and
    advice when nothing fits (layouts empty)."""

    schema_version: int
    request: PlanRequest
    num_params: int
    flops_per_token: float
    model_states_dp: tuple[StateRow, ...]  # pure data parallelism over every GPU
    model_states_best: tuple[StateRow, ...]  # the best layout's model-parallel shard
    activations: tuple[ActivationRow, ...]
    layouts: tuple[Prediction, ...]
    num_layouts_considered: int
    num_layouts_fit: int
    num_tokens: float
    time_to_train_s: float | None  # at the best layout's predicted MFU
    time_to_train_at_mfu_s: float | None  # at the requested --mfu
    advice: tuple[str, ...]


def check_request(req: PlanRequest) -> None:
    """Raise ConfigError with one line per impossible fixed choice, each naming the field and
    the nearest values that work."""
    sh, problems = req.shape, []
    for flag, value in (("--seq", req.seq_length), ("--global-batch", req.global_batch_size), ("--gpus", req.num_gpus),
                        ("--gpus-per-node", req.gpus_per_node)):
        if value < 1:
            problems.append(f"{flag} {value}: must be >= 1")
    if problems:
        raise ConfigError("\n".join(problems))
    if req.tp_degree is not None:
        t = req.tp_degree
        ok = [d for d in divisors(math.gcd(sh.num_heads, sh.num_kv_heads)) if d <= min(MAX_TP, req.gpus_per_node)]
        if sh.num_heads % t or sh.num_kv_heads % t:
            problems.append(f"--tp {t}: num_heads {sh.num_heads} (KV heads {sh.num_kv_heads}) is not divisible by {t};"
                            f" TP degrees that divide the heads and fit a node: {', '.join(map(str, ok))}")
        elif t > req.gpus_per_node or t > MAX_TP:
            problems.append(f"--tp {t}: TP must stay inside a node (<= {min(MAX_TP, req.gpus_per_node)} here: "
                            f"--gpus-per-node {req.gpus_per_node}); use one of {', '.join(map(str, ok))}")
    if req.pp_degree is not None:
        p = req.pp_degree
        if p > sh.num_layers:
            problems.append(f"--pp {p}: more stages than the {sh.num_layers} layers")
        elif sh.num_layers % p and not req.uneven_pp:
            near = sorted(divisors(sh.num_layers), key=lambda d: (abs(d - p), d))[:2]
            problems.append(f"--pp {p}: num_layers {sh.num_layers} is not divisible by {p}; use --pp "
                            f"{' or '.join(map(str, sorted(near)))} (divisors: {', '.join(map(str, divisors(sh.num_layers)))}),"
                            f" or --uneven-pp (first/last stages carry fewer layers)")
        elif req.uneven_pp:
            try:
                mem.split_layers(num_layers=sh.num_layers, pp_degree=p, uneven=True)
            except ConfigError as e:
                problems.append(f"--pp {p}: {e}")
    if req.cp_degree is not None and req.seq_length % (2 * req.cp_degree):
        problems.append(f"--cp {req.cp_degree}: --seq {req.seq_length} must be divisible by 2 x cp (load-balanced "
                        "causal chunks, Megatron-core context parallelism)")
    if req.ep_degree is not None and (sh.num_experts == 1 or sh.num_experts % req.ep_degree):
        problems.append(f"--ep {req.ep_degree}: needs --moe-experts divisible by it (have {sh.num_experts} expert(s))")
    fixed = (req.tp_degree or 1) * (req.pp_degree or 1) * (req.cp_degree or 1)
    if req.num_gpus % fixed:
        problems.append(f"--gpus {req.num_gpus} is not divisible by tp x pp x cp = {fixed}; use a multiple of {fixed}")
    elif req.tp_degree and req.pp_degree and req.cp_degree and req.global_batch_size % (req.num_gpus // fixed):
        dp = req.num_gpus // fixed
        problems.append(f"--global-batch {req.global_batch_size} is not divisible by dp = {dp}; use a multiple of {dp}, "
                        f"e.g. {math.ceil(req.global_batch_size / dp) * dp}")
    if problems:
        raise ConfigError("\n".join(problems))


def enumerate_layouts(req: PlanRequest, *, num_gpus: int | None = None) -> Iterator[Layout]:
    """Every candidate layout on num_gpus (default the request's) honouring the fixed degrees."""
    sh, n = req.shape, num_gpus or req.num_gpus
    tps = [req.tp_degree] if req.tp_degree else [
        d for d in divisors(min(MAX_TP, req.gpus_per_node, n)) if sh.num_heads % d == 0 and sh.num_kv_heads % d == 0]
    if req.pp_degree:
        pps = [req.pp_degree]
    elif req.uneven_pp:
        pps = [d for d in range(1, min(sh.num_layers, n) + 1) if _splits(sh.num_layers, d)]
    else:
        pps = [d for d in divisors(sh.num_layers) if d <= n]
    if req.cp_degree:
        cps = [req.cp_degree]
    else:
        cps = [1] + [c for c in (2, 4, 8, 16, 32, 64) if req.seq_length >= CP_MIN_SEQ
                     and req.seq_length % (2 * c) == 0 and req.seq_length // c >= CP_MIN_LOCAL_SEQ]
    eps = [req.ep_degree] if req.ep_degree else ([1] if sh.num_experts == 1 else divisors(sh.num_experts))
    for t in tps:
        for p in pps:
            for cp in cps:
                if n % (t * p * cp):
                    continue
                dp = n // (t * p * cp)
                if req.global_batch_size % dp:
                    continue
                for ep in eps:
                    if (dp * cp) % ep:
                        continue
                    model_parallel = t > 1 or p > 1 or cp > 1 or ep > 1
                    shardings = MP_SHARDINGS if model_parallel else DP_SHARDINGS
                    if dp * cp == 1:  # nothing to shard: the schemes coincide in memory and traffic
                        shardings = ("megatron",) if model_parallel else ("ddp", "zero3", "megatron")
                    per_dp = req.global_batch_size // dp
                    layers = math.ceil(sh.num_layers / p)
                    # interleaved 1F1B (Narayanan et al. 2021 s2.2): v chunks per stage, m a multiple of p
                    vs = [1] + [v for v in (2, 4, 8) if p > 1 and layers % v == 0 and sh.num_layers % p == 0]
                    for sharding in shardings:
                        for b in divisors(per_dp):
                            m = per_dp // b
                            for v in vs:
                                if v > 1 and m % p:
                                    continue
                                for rc in RECOMPUTE_CHOICES:
                                    yield Layout(tp_degree=t, pp_degree=p, cp_degree=cp, ep_degree=ep, dp_degree=dp,
                                                 num_virtual_stages=v, micro_batch_size=b, num_microbatches=m,
                                                 sharding=sharding, recompute=rc, sequence_parallel=t > 1,
                                                 uneven_pp=req.uneven_pp and sh.num_layers % p != 0)


def _splits(num_layers: int, pp_degree: int) -> bool:
    try:
        mem.split_layers(num_layers=num_layers, pp_degree=pp_degree, uneven=True)
    except ConfigError:
        return False
    return True


def _efficiency(req: PlanRequest, engine: str) -> tuple[float, str]:
    return req.efficiency.get(engine, (req.default_efficiency, req.default_efficiency_source))


def rank_layouts(req: PlanRequest) -> tuple[list[Prediction], int]:
    """(the best prediction per distinct layout -- degrees and sharding -- that fits, fastest
    first; the number of candidates considered). Among a layout's micro-batch sizes,
    interleavings and recomputations the fastest that fits is kept (ties: the larger
    micro-batch, then no full recompute)."""
    best: dict[tuple, Prediction] = {}
    count = 0
    for lay in enumerate_layouts(req):
        count += 1
        state, act = compute_layout_memory(req.shape, lay, seq_length=req.seq_length)
        if state + act > req.memory_limit_bytes:
            continue
        eff, source = _efficiency(req, lay.engine)
        pred = predict_layout(req.shape, lay, seq_length=req.seq_length, global_batch_size=req.global_batch_size,
                              gpus_per_node=req.gpus_per_node, peak_flops=req.peak_flops, compute_efficiency=eff,
                              comm=req.comm, memory_limit_bytes=req.memory_limit_bytes, efficiency_source=source)
        key = (lay.tp_degree, lay.pp_degree, lay.cp_degree, lay.ep_degree, lay.dp_degree, lay.sharding)
        old = best.get(key)
        rank = (pred.step_time_s, -lay.micro_batch_size, lay.recompute == "full")
        if old is None or rank < (old.step_time_s, -old.layout.micro_batch_size, old.layout.recompute == "full"):
            best[key] = pred
    return sorted(best.values(), key=lambda q: (q.step_time_s, q.mem_total_bytes)), count


def compute_min_memory(req: PlanRequest, *, num_gpus: int | None = None) -> tuple[float, Layout | None]:
    """The least memory any candidate layout needs on its fullest GPU (bytes) and that layout."""
    low, where = math.inf, None
    for lay in enumerate_layouts(req, num_gpus=num_gpus):
        total = sum(compute_layout_memory(req.shape, lay, seq_length=req.seq_length))
        if total < low:
            low, where = total, lay
    return low, where


def describe_layout(lay: Layout) -> str:
    """'TP8 x PP2 x DP4, megatron-distopt, micro-batch 1 x 256, full recompute' (CP/EP/v only when > 1)."""
    parts = [f"TP{lay.tp_degree}", f"PP{lay.pp_degree}"]
    parts += [f"CP{lay.cp_degree}"] if lay.cp_degree > 1 else []
    parts += [f"DP{lay.dp_degree}"]
    text = " x ".join(parts) + (f" (EP{lay.ep_degree})" if lay.ep_degree > 1 else "")
    extra = f", v={lay.num_virtual_stages}" if lay.num_virtual_stages > 1 else ""
    memory = {"selective": "selective recompute (flash attention)", "full": "full recompute"}.get(
        lay.recompute, "no recompute")
    return f"{text}, {lay.sharding}, micro-batch {lay.micro_batch_size} x {lay.num_microbatches}{extra}, {memory}"


def explain_no_fit(req: PlanRequest) -> list[str]:
    """Why nothing fits and the smallest changes that would: more GPUs (the fewest, doubling),
    more memory per GPU, or a degree the user fixed."""
    low, where = compute_min_memory(req)
    limit = req.memory_limit_bytes
    lines = []
    if where is None:
        lines.append(f"no layout exists for {req.num_gpus} GPUs with these constraints (global batch "
                     f"{req.global_batch_size} must divide by the data-parallel degree)")
    else:
        state, act = compute_layout_memory(req.shape, where, seq_length=req.seq_length)
        lines.append(f"{req.shape.name} does not fit {req.num_gpus} x {req.gpu_name} ({req.memory_gib:.1f} GiB, "
                     f"{limit / GIB:.1f} GiB usable): the least memory any layout needs is {low / GIB:.1f} GiB per GPU "
                     f"({describe_layout(where)}: model states {state / GIB:.1f} GiB, activations {act / GIB:.1f} GiB)")
        lines.append(f"smallest change: GPUs with >= {low / req.memory_usable_fraction / GIB:.0f} GiB of memory")
    # the fewest GPUs (doubling) at which some layout fits, letting PP split the layers unevenly
    wider = dataclasses.replace(req, uneven_pp=req.pp_degree is None or req.uneven_pp)
    for k in range(1, 16):
        n = req.num_gpus * 2**k
        low_n, where_n = compute_min_memory(wider, num_gpus=n)
        if low_n <= limit:
            flag = " with --uneven-pp" if where_n.uneven_pp and not req.uneven_pp else ""
            lines.append(f"smallest change: {n} GPUs ({math.ceil(n / req.gpus_per_node)} node(s)){flag}, e.g. "
                         f"{describe_layout(where_n)} at {low_n / GIB:.1f} GiB per GPU")
            break
    fixed = [f"--{k} {getattr(req, k + '_degree')}" for k in ("tp", "pp", "cp", "ep") if getattr(req, k + "_degree")]
    if fixed:
        free = dataclasses.replace(req, tp_degree=None, pp_degree=None, cp_degree=None, ep_degree=None)
        low_free, where_free = compute_min_memory(free)
        if low_free <= limit:
            lines.append(f"or drop {' '.join(fixed)}: {describe_layout(where_free)} fits at {low_free / GIB:.1f} GiB")
    return lines


def build_plan(req: PlanRequest, *, top: int = 10) -> Plan:
    """Check the request, rank the layouts and fill the memory tables. Raises ConfigError for
    an impossible fixed choice; when nothing fits returns a Plan with no layouts and the advice."""
    check_request(req)
    ranked, count = rank_layouts(req)
    n_params = count_params(req.shape)
    num_tokens = req.num_tokens or 20.0 * n_params  # Chinchilla: ~20 tokens per parameter (Hoffmann et al. 2022)
    best = ranked[0] if ranked else None
    lay = best.layout if best else Layout(dp_degree=req.num_gpus)
    layers = mem.split_layers(num_layers=req.shape.num_layers, pp_degree=lay.pp_degree, uneven=lay.uneven_pp)
    shard = mem.compute_stage_params(req.shape, stage=0, layers=layers, tp_degree=lay.tp_degree,
                                     ep_degree=lay.ep_degree)
    d_best = lay.dp_degree * lay.cp_degree

    def rows(params: float, d: int) -> tuple[StateRow, ...]:
        return tuple(StateRow(sharding=s, shard_degree=d, params_per_gpu=params,
                              bytes_per_gpu=params * mem.compute_state_bytes_per_param(sharding=s, shard_degree=d))
                     for s in mem.SHARDINGS)

    s_local = req.seq_length // lay.cp_degree
    b = lay.micro_batch_size if best else 1
    acts = tuple(ActivationRow(tp_degree=t, sequence_parallel=sp, recompute=rc, micro_batch_size=b, seq_length=s_local,
                               bytes_per_layer=mem.compute_activation_bytes_per_layer(
                                   req.shape, seq_length=s_local, micro_batch_size=b, tp_degree=t,
                                   sequence_parallel=sp, recompute=rc))
                 for t in sorted({1, lay.tp_degree}) for sp in ((False, True) if t > 1 else (False,))
                 for rc in mem.RECOMPUTES)
    return Plan(
        schema_version=PLAN_SCHEMA_VERSION, request=req, num_params=n_params,
        flops_per_token=compute_model_flops_per_token(req.shape, seq_length=req.seq_length),
        model_states_dp=rows(float(n_params), req.num_gpus), model_states_best=rows(shard.dense + shard.expert, d_best),
        activations=acts, layouts=tuple(ranked[:top]), num_layouts_considered=count, num_layouts_fit=len(ranked),
        num_tokens=num_tokens,
        time_to_train_s=compute_time_to_train_s(num_params=n_params, num_tokens=num_tokens, num_gpus=req.num_gpus,
                                                peak_flops=req.peak_flops, mfu=best.mfu) if best else None,
        time_to_train_at_mfu_s=compute_time_to_train_s(num_params=n_params, num_tokens=num_tokens,
                                                       num_gpus=req.num_gpus, peak_flops=req.peak_flops,
                                                       mfu=req.mfu) if req.mfu else None,
        advice=() if ranked else tuple(explain_no_fit(req)))


def _gb(x: float) -> str:
    if x < 1e9:
        return f"{x / 1e6:.1f} MB ({x / 2**20:.1f} MiB)"
    return f"{x / 1e9:.1f} GB ({x / GIB:.1f} GiB)"


def _dur(s: float) -> str:
    if s >= 86400:
        return f"{s / 86400:.1f} days"
    if s >= 1:
        return f"{s:.2f} s"
    return f"{s * 1e3:.1f} ms"


def render_plan_text(plan: Plan) -> str:
    """The plan as the terminal shows it (every figure also in the JSON, unrounded)."""
    req, sh = plan.request, plan.request.shape
    out = [f"plan: {sh.name} ({plan.num_params / 1e9:.3g} B params; {sh.num_layers} layers, hidden {sh.hidden_size}, "
           f"{sh.num_heads} heads ({sh.num_kv_heads} KV), FFN {sh.ffn_hidden_size}"
           f"{' SwiGLU' if sh.gated_mlp else ''}, vocab {sh.vocab_size}"
           + (f", {sh.num_experts} experts top-{sh.moe_top_k}" if sh.num_experts > 1 else "") + ")",
           f"      seq {req.seq_length}, global batch {req.global_batch_size} sequences = "
           f"{req.global_batch_size * req.seq_length:,} tokens/step, {req.num_gpus} x {req.gpu_name} "
           f"({req.gpus_per_node} per node, {req.memory_gib:.1f} GiB, {req.memory_usable_fraction:.0%} usable; "
           f"dense bf16 peak {req.peak_flops / 1e12:.1f} TFLOP/s)",
           f"      links: intra-node {req.comm.intra.name if req.comm.intra else 'n/a'}; inter-node "
           f"{req.comm.inter.name if req.comm.inter else 'n/a'}; measured collectives: "
           f"{', '.join(sorted({f'{o}/{s}' for o, s in req.comm.curves})) or 'none (nominal figures)'}",
           f"      FLOPs/token {plan.flops_per_token:.4g} (6N + 12·L·H·T, PaLM appendix B)", "",
           f"Model states per GPU (bf16 weights/grads, fp32 Adam; ZeRO s5, Megatron dist. optimizer):",
           f"  {'sharding':18} {'data parallel over ' + str(req.num_gpus):>28} "
           + (f"{'best layout shard (d=' + str(plan.model_states_best[0].shard_degree) + ')':>30}" if plan.layouts else "")]
    for a, b in zip(plan.model_states_dp, plan.model_states_best):
        out.append(f"  {a.sharding:18} {_gb(a.bytes_per_gpu):>28} " + (f"{_gb(b.bytes_per_gpu):>30}" if plan.layouts else ""))
    out += ["", "Activations per layer per micro-batch (Korthikanti et al. 2022; selective = flash attention):"]
    for r in plan.activations:
        out.append(f"  TP{r.tp_degree} SP {'on ' if r.sequence_parallel else 'off'} {r.recompute:9} "
                   f"b={r.micro_batch_size} s={r.seq_length}: {_gb(r.bytes_per_layer)}")
    out.append("")
    if not plan.layouts:
        # why, and the smallest changes that would fit (plan.advice), are the command's error: said once, there
        out.append(f"No layout fits ({plan.num_layouts_considered} considered).")
        return "\n".join(out) + "\n"
    out.append(f"Layouts that fit, fastest first ({plan.num_layouts_fit} of {plan.num_layouts_considered} candidates "
               f"fit; top {len(plan.layouts)}):")
    for i, q in enumerate(plan.layouts, 1):
        lay = q.layout
        out.append(f"{i:3}. {describe_layout(lay)} [{lay.engine}]")
        out.append(f"     step {_dur(q.step_time_s)} = compute {_dur(q.compute_time_s)} + bubble {_dur(q.bubble_time_s)} "
                   f"({q.bubble_fraction:.1%}) + exposed comm {_dur(q.exposed_comm_s)}; {q.tokens_per_s:,.0f} tokens/s, "
                   f"MFU {q.mfu:.1%} (efficiency {q.compute_efficiency:.0%}); memory {_gb(q.mem_total_bytes)} "
                   f"= states {q.mem_model_state_bytes / GIB:.1f} + activations {q.mem_activation_bytes / GIB:.1f} GiB")
        for c in q.comm:
            out.append(f"     {c.kind.upper():2} {c.op:14} x{c.num_calls:<8g} {c.nbytes_per_call / 2**20:10.1f} MiB "
                       f"over {c.group_size} ({c.scope}): {_dur(c.time_s)}, exposed {_dur(c.exposed_s)}")
        for w in q.warnings:
            out.append(f"     ! {w}")
    best = plan.layouts[0]
    out += ["", f"Time to train on {plan.num_tokens:.3g} tokens (6ND / (GPUs x peak x MFU)): "
            f"{_dur(plan.time_to_train_s)} at the best layout's predicted MFU {best.mfu:.1%}"
            + (f"; {_dur(plan.time_to_train_at_mfu_s)} at MFU {req.mfu:.0%}" if plan.time_to_train_at_mfu_s else "")]
    sources = sorted({f"{q.layout.engine}: {q.compute_efficiency:.0%} ({q.efficiency_source})" for q in plan.layouts})
    out += ["Compute efficiency used: " + "; ".join(sources)]
    return "\n".join(out) + "\n"


def plan_to_dict(plan: Plan) -> dict:
    """JSON-ready dict of the plan (layout engine names included)."""
    d = dataclasses.asdict(plan)
    req = d["request"]
    req["comm"] = {"intra": req["comm"]["intra"], "inter": req["comm"]["inter"],
                   "measured": sorted(f"{o}/{s}" for o, s in plan.request.comm.curves)}
    req["efficiency"] = {k: {"efficiency": v[0], "source": v[1]} for k, v in plan.request.efficiency.items()}
    for q, raw in zip(plan.layouts, d["layouts"]):
        raw["layout"]["engine"] = q.layout.engine
        raw["layout"]["world_size"] = q.layout.world_size
    return d
