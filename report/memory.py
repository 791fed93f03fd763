"""Model-state memory per rank, by layout *and* engine, as the note shows it: core.memory's
bytes (compute_engine_state_bytes) with the formula, source and caveats worded.

Model states are the parameters, their gradients and the optimizer's states (Adam: m, v and,
under mixed precision, an fp32 master copy) -- what ZeRO shards (Rajbhandari et al. 2020,
section 3.1). Two engines of one layout can hold them differently: DeepSpeed ZeRO-3 keeps bf16
parameter and gradient partitions beside the fp32 master partition, FSDP2 keeps only fp32 shards
(the bf16 copy exists per block while it is gathered); Megatron keeps bf16 weights and an fp32
gradient buffer beside its optimizer, the torch TP+PP engine fp32 weights under autocast. What a
run measures beyond these bytes (peak allocated - model states) is activations, gathered
parameters, communication buckets and temporaries; peak reserved - peak allocated is the caching
allocator's reserve.

Deliberately not here: the byte arithmetic (core.memory), activation estimates (measured, not
modelled), reading files.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.memory import STATE_BYTES, compute_engine_state_bytes
from core.records import ModelConfig
from report.i18n import N_, Message, MessageList

GIB = 1024**3


@dataclass(frozen=True, kw_only=True)
class ModelStateBytes:
    """Per-rank model-state bytes of one run. ``*_bytes_per_param``: bytes per parameter of the
    whole model (Ψ) held by one rank, so total_bytes = total_bytes_per_param x Ψ. formula: the
    expression in Ψ and the degrees; source: where the byte counts come from; extra: held by the
    engine outside model states at the step's peak (e.g. an unsharded bf16 copy), or "". formula,
    source and extra are report.i18n messages (English str, translated in the note)."""

    weights_bytes_per_param: float
    grads_bytes_per_param: float
    optimizer_bytes_per_param: float
    total_bytes_per_param: float
    total_bytes: float
    formula: str
    source: str
    extra: str = ""


ZERO_SOURCE = N_("ZeRO (Rajbhandari et al. 2020) §3.1, §5.3")
MEGATRON_SOURCE = N_("Megatron-LM docs, distributed optimizer (bytes/param table)")
FSDP2_SOURCE = N_("torch FSDP2 fully_shard docs (sharded parameters keep their original dtype); ZeRO §5.3")


def compute_param_numels(model: ModelConfig) -> list[int]:
    """Element counts of every parameter of runner.model.GPT for a campaign's ``fixed.model``
    record (num_layers L, hidden_size H, ffn_hidden_size F, seq_length T, padded_vocab_size V):
    tied embedding V x H once, positions T x H, per block LayerNorms 4 x H, qkv 3H x H + 3H, proj
    H x H + H, fc F x H + F, proj H x F + H, final LayerNorm 2 x H. Sums to
    runner.model.count_gpt_params."""
    h, f, t, v = model.hidden_size, model.ffn_hidden_size, model.seq_length, model.padded_vocab_size
    block = [h, h, 3 * h * h, 3 * h, h * h, h, h, h, f * h, f, h * f, h]
    return [v * h, t * h, *block * int(model.num_layers), h, h]


def build_model_states(*, strategy: str, engine: str, dtype: str, num_params: int, tp_degree: int,
                       pp_degree: int, dp_degree: int, options: Mapping[str, Any] | None = None,
                       param_numels: list[int] | None = None) -> ModelStateBytes | None:
    """Model-state bytes one rank holds (Adam), for (strategy, engine) at these degrees, with the
    formula and source the note prints: the bytes are core.memory.compute_engine_state_bytes's
    (its docstring gives each engine's formula and source); ``extra`` says what FSDP2 holds
    longer (reshard_after_forward = false: +2Ψ bf16 gathered weights; reduce_every_microbatch =
    false: unsharded gradients until the last micro-batch) and which DeepSpeed parameters stay
    whole (Ψ_persist).

    Returns None for an unknown (strategy, engine) or dtype. Raises ValueError for
    non-positive degrees or parameter count.
    """
    b = compute_engine_state_bytes(strategy=strategy, engine=engine, dtype=dtype, num_params=num_params,
                                   tp_degree=tp_degree, pp_degree=pp_degree, dp_degree=dp_degree, options=options,
                                   param_numels=param_numels)
    if b is None:
        return None
    opts = options or {}
    m, n = tp_degree * pp_degree, dp_degree
    bf16 = dtype == "bf16"
    where = "Ψ" if m == 1 else "Ψ/(TP·PP)"
    source, extra = ZERO_SOURCE, ""
    if engine in ("torch-ddp", "torch"):
        formula = Message(N_("(4 fp32 weights + 4 fp32 grads + 8 Adam m, v) %(where)s = 16%(where)s"), where=where)
    elif engine == "deepspeed":
        w = STATE_BYTES[dtype][0]
        parts = Message(N_("2 bf16 weights + 2 bf16 grads + 12 fp32 master, m, v") if bf16
                        else N_("4 weights + 4 grads + 8 m, v"))
        persist, threshold = b.num_params_persistent, b.persistence_threshold
        formula = Message(N_("(%(parts)s) Ψ/N = 16Ψ/N, N = %(n)s"), parts=parts, n=n)
        if persist and n > 1:
            formula = Message(N_("(%(parts)s) Ψ/N + %(w)sΨ_persist·(1 − 1/N), N = %(n)s"), parts=parts, w=w, n=n)
            extra = Message(N_("Ψ_persist = %(persist)s (%(share)s of Ψ): parameters below"
                               " stage3_param_persistence_threshold (%(threshold)s elements) stay whole on every rank"),
                            persist=f"{persist:,}", share=f"{persist / num_params:.1%}", threshold=f"{threshold:,}")
    elif engine == "fsdp2":
        held = []
        if bf16 and not opts.get("reshard_after_forward", True):
            held.append(Message(N_("+2Ψ bf16 gathered weights held from forward to backward"
                                   " (reshard_after_forward = false)")))
        if not opts.get("reduce_every_microbatch", True):
            held.append(Message(N_("+%(bytes)sΨ unsharded gradients until the last micro-batch"
                                   " (reduce_every_microbatch = false)"), bytes=2 if bf16 else 4))
        source, extra = FSDP2_SOURCE, MessageList(held, "; ")
        formula = Message(N_("(4 fp32 sharded weights + 4 fp32 grads + 8 m, v) Ψ/N = 16Ψ/N, N = %(n)s"), n=n)
    else:  # megatron
        w, _, o = STATE_BYTES[dtype]
        if bf16:
            parts = Message(N_("2 bf16 weights + 4 fp32 grads + 12 fp32 master, m, v") if b.grads_bytes == 4
                            else N_("2 bf16 weights + 2 bf16 grads + 12 fp32 master, m, v"))
        else:
            parts = Message(N_("4 weights + 4 grads + 8 m, v"))
        text = (N_("(%(parts)s, optimizer / N) %(where)s = (%(wg)s + %(o)s/N)%(where)s, N = %(n)s")
                if b.distributed_optimizer else N_("(%(parts)s) %(where)s = (%(wg)s + %(o)s)%(where)s, N = %(n)s"))
        source, formula = MEGATRON_SOURCE, Message(text, parts=parts, where=where, wg=w + b.grads_bytes, o=o, n=n)
    total = b.weights_bytes_per_param + b.grads_bytes_per_param + b.optimizer_bytes_per_param
    return ModelStateBytes(weights_bytes_per_param=b.weights_bytes_per_param,
                           grads_bytes_per_param=b.grads_bytes_per_param,
                           optimizer_bytes_per_param=b.optimizer_bytes_per_param, total_bytes_per_param=total,
                           total_bytes=total * num_params, formula=formula, source=source, extra=extra)
