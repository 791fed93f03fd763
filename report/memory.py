"""Model-state memory per rank, by layout *and* engine, from the parameter count (analytic).

Model states are the parameters, their gradients and the optimizer's states (Adam: m, v and,
under mixed precision, an fp32 master copy) -- what ZeRO shards (Rajbhandari et al. 2020,
section 3.1). Two engines of one layout can hold them differently: DeepSpeed ZeRO-3 keeps bf16
parameter and gradient partitions beside the fp32 master partition, FSDP2 keeps only fp32 shards
(the bf16 copy exists per block while it is gathered); Megatron keeps bf16 weights and an fp32
gradient buffer beside its optimizer, the torch TP+PP engine fp32 weights under autocast. What a
run measures beyond these bytes (peak allocated - model states) is activations, gathered
parameters, communication buckets and temporaries; peak reserved - peak allocated is the caching
allocator's reserve.

Deliberately not here: activation estimates (measured, not modelled), reading files, wording.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


def _state(weights: float, grads: float, optimizer: float, *, num_params: int, formula: str, source: str,
           extra: str = "") -> ModelStateBytes:
    total = weights + grads + optimizer
    return ModelStateBytes(weights_bytes_per_param=weights, grads_bytes_per_param=grads,
                           optimizer_bytes_per_param=optimizer, total_bytes_per_param=total,
                           total_bytes=total * num_params, formula=formula, source=source, extra=extra)


def compute_model_state_bytes(*, strategy: str, engine: str, dtype: str, num_params: int, tp_degree: int,
                              pp_degree: int, dp_degree: int, options: Mapping[str, Any] | None = None,
                              param_numels: list[int] | None = None) -> ModelStateBytes | None:
    """Model-state bytes one rank holds (Adam), for (strategy, engine) at these degrees.

    Ψ = num_params (whole model, tied embedding once); M = TP x PP (model-parallel split, taken as
    even: replicated LayerNorms/embeddings under TP and the last stage's tied-embedding copy make
    real stages a little uneven); N = dp_degree.

    - DDP (torch, autocast) and torch TP+PP: fp32 weights 4 + fp32 grads 4 + Adam m, v 8 = 16Ψ/M
      (autocast keeps fp32 weights; ZeRO §3.1 counts the same 16 bytes for mixed precision).
    - ZeRO-3 DeepSpeed, bf16: bf16 weights 2 + bf16 grads 2 + fp32 master, m, v 12, all / N =
      16Ψ/N (ZeRO §5.3); fp32: 4 + 4 + 8, / N. Parameters below
      ``zero.stage3_param_persistence_threshold`` elements stay whole on every rank (DeepSpeed
      keeps them gathered), so with ``param_numels`` (compute_param_numels) their weight bytes
      count Ψ_persist + (Ψ - Ψ_persist)/N instead of Ψ/N.
    - ZeRO-3 FSDP2, bf16: fp32 sharded weights 4 (the master copy) + fp32 sharded grads 4 + m, v 8,
      all / N = 16Ψ/N; bf16 copies exist only while a block is gathered (``extra`` says when they
      are held longer: reshard_after_forward = false, or reduce_every_microbatch = false).
    - Megatron, bf16: bf16 weights 2 + grads g (4 with grad_reduce_in_fp32, else 2) + fp32 master,
      m, v 12 (/ N with the distributed optimizer), all / M: (2 + g + 12/N)Ψ/M, i.e. 6 + 12/N or 18
      (Megatron-LM distributed-optimizer table); fp32: 4 + 4 + 8 (/ N distributed).

    Returns None for an unknown (strategy, engine) or dtype. Raises ValueError for
    non-positive degrees or parameter count.
    """
    if min(tp_degree, pp_degree, dp_degree) < 1 or num_params < 1:
        raise ValueError(f"degrees and num_params must be positive: tp {tp_degree}, pp {pp_degree}, dp {dp_degree},"
                         f" num_params {num_params}")
    if dtype not in ("bf16", "fp32"):
        return None
    opts = options or {}
    m, n = tp_degree * pp_degree, dp_degree
    bf16 = dtype == "bf16"
    if (strategy, engine) in (("ddp", "torch-ddp"), ("tp_pp", "torch")):
        where = "Ψ" if m == 1 else "Ψ/(TP·PP)"
        return _state(4 / m, 4 / m, 8 / m, num_params=num_params, source=ZERO_SOURCE,
                      formula=Message(N_("(4 fp32 weights + 4 fp32 grads + 8 Adam m, v) %(where)s = 16%(where)s"),
                                      where=where))
    if (strategy, engine) == ("zero3", "deepspeed"):
        w, g, o = (2, 2, 12) if bf16 else (4, 4, 8)
        parts = Message(N_("2 bf16 weights + 2 bf16 grads + 12 fp32 master, m, v") if bf16
                        else N_("4 weights + 4 grads + 8 m, v"))
        threshold = (opts.get("zero") or {}).get("stage3_param_persistence_threshold")
        persist = sum(k for k in param_numels if k < threshold) if param_numels and threshold is not None else 0
        w_rank = w * (persist + (num_params - persist) / n) / num_params
        formula, extra = Message(N_("(%(parts)s) Ψ/N = 16Ψ/N, N = %(n)s"), parts=parts, n=n), ""
        if persist and n > 1:
            formula = Message(N_("(%(parts)s) Ψ/N + %(w)sΨ_persist·(1 − 1/N), N = %(n)s"), parts=parts, w=w, n=n)
            extra = Message(N_("Ψ_persist = %(persist)s (%(share)s of Ψ): parameters below"
                               " stage3_param_persistence_threshold (%(threshold)s elements) stay whole on every rank"),
                            persist=f"{persist:,}", share=f"{persist / num_params:.1%}", threshold=f"{threshold:,}")
        return _state(w_rank, g / n, o / n, num_params=num_params, source=ZERO_SOURCE, formula=formula, extra=extra)
    if (strategy, engine) == ("zero3", "fsdp2"):
        extra = []
        if bf16 and not opts.get("reshard_after_forward", True):
            extra.append(Message(N_("+2Ψ bf16 gathered weights held from forward to backward"
                                    " (reshard_after_forward = false)")))
        if not opts.get("reduce_every_microbatch", True):
            extra.append(Message(N_("+%(bytes)sΨ unsharded gradients until the last micro-batch"
                                    " (reduce_every_microbatch = false)"), bytes=2 if bf16 else 4))
        return _state(4 / n, 4 / n, 8 / n, num_params=num_params, source=FSDP2_SOURCE,
                      formula=Message(N_("(4 fp32 sharded weights + 4 fp32 grads + 8 m, v) Ψ/N = 16Ψ/N, N = %(n)s"), n=n),
                      extra=MessageList(extra, "; "))
    if (strategy, engine) == ("tp_pp", "megatron"):
        distributed = bool(opts.get("use_distributed_optimizer", n > 1))
        if bf16:
            g = 4 if opts.get("grad_reduce_in_fp32", True) else 2
            w, o = 2, 12
            parts = Message(N_("2 bf16 weights + 4 fp32 grads + 12 fp32 master, m, v") if g == 4
                            else N_("2 bf16 weights + 2 bf16 grads + 12 fp32 master, m, v"))
        else:
            w, g, o = 4, 4, 8
            parts = Message(N_("4 weights + 4 grads + 8 m, v"))
        o_rank = o / n if distributed else o
        where = "Ψ" if m == 1 else "Ψ/(TP·PP)"
        formula = (N_("(%(parts)s, optimizer / N) %(where)s = (%(wg)s + %(o)s/N)%(where)s, N = %(n)s") if distributed
                   else N_("(%(parts)s) %(where)s = (%(wg)s + %(o)s)%(where)s, N = %(n)s"))
        return _state(w / m, g / m, o_rank / m, num_params=num_params, source=MEGATRON_SOURCE,
                      formula=Message(formula, parts=parts, where=where, wg=w + g, o=o, n=n))
    return None
