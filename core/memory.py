"""Per-GPU memory of a parallel layout: model states and activations, in bytes.

Model states follow ZeRO (Rajbhandari et al. 2020, section 5) and Megatron-LM's distributed
optimizer (docs/source/api-guide/dist_optimizer.md); activations follow Korthikanti et al.
2022 ("Reducing Activation Recomputation in Large Transformer Models", sections 4-5),
generalised to grouped-query attention, gated MLPs and models without dropout term by term
(for GPT-3's shape it is the paper's sbh(34 + 5as/h) exactly). Every function is pure
arithmetic. Deliberately not here: allocator fragmentation, CUDA context, NCCL buffers (the
planner keeps a reserve for those), and which layout to choose (runner.plan).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.errors import ConfigError
from core.formulas import ModelShape, count_embedding_params, count_layer_params, count_mlp_params

# Optimizer-state sharding schemes, bf16 mixed precision with Adam (K = 12 bytes of fp32 master
# weights, momentum and variance per parameter).
SHARDINGS = ("ddp", "zero1", "zero2", "zero3", "megatron", "megatron-distopt")
RECOMPUTES = ("none", "selective", "full")
ACTIVATION_BYTES = 2  # bf16 activations
# Adam's model states in bytes per parameter, (weights, grads, optimizer), by training dtype (ZeRO,
# Rajbhandari et al. 2020, section 3.1): mixed precision 2 + 2 + 12 (fp32 master weights, m, v);
# plain fp32 4 + 4 + 8 (m, v). Both 16.
STATE_BYTES: dict[str, tuple[int, int, int]] = {"bf16": (2, 2, 12), "fp16": (2, 2, 12), "fp32": (4, 4, 8)}
FP32_GRAD_BYTES = 4  # a gradient kept or reduced in fp32 (Megatron's grad_reduce_in_fp32)


def compute_state_bytes_per_param(*, sharding: str, shard_degree: int) -> float:
    """Model-state bytes per parameter on one GPU, for parameters sharded over shard_degree
    (d) data-parallel ranks (bf16 weights and gradients, fp32 Adam states, K = 12):

    - ddp 16 (2 weights + 2 grads + 12); zero1 4 + 12/d; zero2 2 + 14/d; zero3 16/d: ZeRO
      (Rajbhandari et al. 2020) section 5, Pos / Pos+g / Pos+g+p with Ψ per GPU.
    - megatron 18 and megatron-distopt 6 + 12/d: Megatron-LM with fp32 main gradients
      (grad_reduce_in_fp32, the runner's default), non-distributed and distributed optimizer
      (Megatron-LM docs/source/api-guide/dist_optimizer.md, "bf16 param, fp32 grads" row).

    Raises ConfigError for an unknown scheme or d < 1.
    """
    if shard_degree < 1:
        raise ConfigError(f"shard_degree must be >= 1, got {shard_degree}")
    d = shard_degree
    w, g, o = STATE_BYTES["bf16"]
    fp32_g = FP32_GRAD_BYTES
    table = {"ddp": float(w + g + o), "zero1": (w + g) + o / d, "zero2": w + (g + o) / d, "zero3": (w + g + o) / d,
             "megatron": float(w + fp32_g + o), "megatron-distopt": (w + fp32_g) + o / d}
    if sharding not in table:
        raise ConfigError(f"unknown optimizer sharding {sharding!r}; choose one of {', '.join(SHARDINGS)}")
    return table[sharding]


AUTOCAST_COPY_BYTES = 2  # the bf16 copy of an fp32 weight that torch.autocast caches (cache_enabled=True)


def compute_torch_ddp_extra_bytes_per_param(*, autocast_bf16: bool, num_microbatches: int) -> float:
    """Bytes per parameter torch DDP holds beside its model states at the backward peak:

    - 2 with bf16 autocast over fp32 weights: autocast caches each weight's bf16 copy in the
      forward and autograd saves it for the backward (torch.autocast, ``cache_enabled``);
    - 4 with gradient accumulation (num_microbatches > 1): micro-batches under ``no_sync``
      accumulate fp32 gradients in ``param.grad``, apart from DDP's gradient buckets, until the
      last micro-batch copies them in (torch DistributedDataParallel, ``no_sync`` and
      ``gradient_as_bucket_view`` with gradients set to None between steps).

    Raises ConfigError for num_microbatches < 1."""
    if num_microbatches < 1:
        raise ConfigError(f"num_microbatches must be >= 1, got {num_microbatches}")
    return (AUTOCAST_COPY_BYTES if autocast_bf16 else 0) + (FP32_GRAD_BYTES if num_microbatches > 1 else 0)


def split_layers(*, num_layers: int, pp_degree: int, uneven: bool = False) -> tuple[int, ...]:
    """Layers per pipeline stage. Even split when pp divides num_layers; with ``uneven`` the
    first and last stages carry fewer layers (Megatron-LM --decoder-first/last-pipeline-num-layers;
    Llama 3 405B: 126 layers on 16 stages = 7 + 14 x 8 + 7, Dubey et al. 2024 section 3.3.2).
    Raises ConfigError when the split is impossible."""
    if num_layers % pp_degree == 0:
        return (num_layers // pp_degree,) * pp_degree
    if not uneven or pp_degree < 2:
        raise ConfigError(f"num_layers {num_layers} is not divisible by pp_degree {pp_degree}")
    base = math.ceil(num_layers / pp_degree)
    short = base * pp_degree - num_layers
    first, last = base - (short + 1) // 2, base - short // 2
    if first < 1 or last < 1 or short > 2 * (base - 1):
        raise ConfigError(f"num_layers {num_layers} cannot be split over {pp_degree} stages")
    return (first, *(base,) * (pp_degree - 2), last)


@dataclass(frozen=True, kw_only=True)
class StageParams:
    """Parameters one GPU of one pipeline stage holds (already divided by TP and, for experts, EP).
    dense: sharded over the DP x CP group by ZeRO / distributed optimizer; expert: over
    DP x CP / EP (expert data parallelism)."""

    dense: float
    expert: float


def compute_stage_params(shape: ModelShape, *, stage: int, layers: tuple[int, ...], tp_degree: int,
                         ep_degree: int = 1) -> StageParams:
    """Parameters per GPU of pipeline stage ``stage`` (0-based) given the layers per stage:
    its layers / TP (experts / (TP x EP)), plus the input embedding (and learned positions) on
    the first stage and the output layer and final norm on the last (a tied embedding is kept
    on both ends when PP > 1, as Megatron-LM does). Norms are counted as TP-sharded (a
    negligible overcount of the saving)."""
    emb = count_embedding_params(shape)
    n = layers[stage]
    expert = 0.0
    per_layer = count_layer_params(shape)
    if shape.num_experts > 1:
        expert = n * shape.num_experts * count_mlp_params(shape) / (tp_degree * ep_degree)
        per_layer -= shape.num_experts * count_mlp_params(shape)
    dense = n * per_layer
    if stage == 0:
        dense += emb["embedding"] + emb["position"]
    if stage == len(layers) - 1:
        dense += emb["final_norm"] + (emb["output"] if not shape.tied_embedding else
                                      (emb["embedding"] if len(layers) > 1 else 0))
    return StageParams(dense=dense / tp_degree, expert=expert)


def compute_model_state_bytes(params: StageParams, *, sharding: str, dp_degree: int, cp_degree: int = 1,
                              ep_degree: int = 1) -> float:
    """Model-state bytes on one GPU: dense parameters sharded over dp x cp ranks (Megatron's
    data-parallel-with-context-parallel group), expert parameters over dp x cp / ep
    (compute_state_bytes_per_param gives the bytes per parameter)."""
    d = dp_degree * cp_degree
    out = params.dense * compute_state_bytes_per_param(sharding=sharding, shard_degree=d)
    if params.expert:
        out += params.expert * compute_state_bytes_per_param(sharding=sharding, shard_degree=max(d // ep_degree, 1))
    return out


@dataclass(frozen=True, kw_only=True)
class EngineStateBytes:
    """Model-state bytes one rank of a run holds, per parameter of the whole model (Ψ):
    weights, grads and optimizer states (Adam), so a rank holds their sum x Ψ bytes.
    num_params_persistent: DeepSpeed ZeRO-3 parameters kept whole on every rank (below
    ``zero.stage3_param_persistence_threshold`` elements; 0 otherwise); grads_bytes: bytes of one
    gradient element as the engine keeps it; distributed_optimizer: optimizer states sharded
    over the data-parallel ranks."""

    weights_bytes_per_param: float
    grads_bytes_per_param: float
    optimizer_bytes_per_param: float
    grads_bytes: int
    distributed_optimizer: bool
    num_params_persistent: int = 0
    persistence_threshold: int | None = None

    @property
    def total_bytes_per_param(self) -> float:
        return self.weights_bytes_per_param + self.grads_bytes_per_param + self.optimizer_bytes_per_param


def compute_engine_state_bytes(*, strategy: str, engine: str, dtype: str, num_params: int, tp_degree: int,
                               pp_degree: int, dp_degree: int, options: Mapping[str, Any] | None = None,
                               param_numels: Sequence[int] | None = None) -> EngineStateBytes | None:
    """Model-state bytes one rank holds (Adam), for (strategy, engine) at these degrees, per
    parameter of the whole model.

    Ψ = num_params (tied embedding once); M = TP x PP (model-parallel split, taken as even:
    replicated LayerNorms/embeddings under TP and the last stage's tied-embedding copy make real
    stages a little uneven); N = dp_degree; bytes (w, g, o) from STATE_BYTES.

    - DDP (torch, autocast) and torch TP+PP: fp32 weights 4 + fp32 grads 4 + Adam m, v 8 = 16/M
      (autocast keeps fp32 weights whatever the dtype).
    - ZeRO-3 DeepSpeed: (w + g + o)/N (ZeRO section 5.3). Parameters below
      ``zero.stage3_param_persistence_threshold`` elements stay whole on every rank (DeepSpeed
      keeps them gathered), so with ``param_numels`` their weights count w(Ψ_persist + (Ψ -
      Ψ_persist)/N)/Ψ instead of w/N.
    - ZeRO-3 FSDP2: fp32 sharded weights 4 (the master copy) + fp32 grads 4 + m, v 8, all / N
      (torch FSDP2 fully_shard keeps the parameters' original dtype).
    - Megatron: w + g + o, g = 4 with grad_reduce_in_fp32 (default) else 2 under bf16, o / N with
      the distributed optimizer (default when N > 1), all / M: 6 + 12/N or 18 under bf16
      (Megatron-LM docs, distributed optimizer bytes/param table).

    Returns None for an unknown (strategy, engine) or a dtype other than bf16 / fp32. Raises
    ValueError for non-positive degrees or parameter count.
    """
    if min(tp_degree, pp_degree, dp_degree) < 1 or num_params < 1:
        raise ValueError(f"degrees and num_params must be positive: tp {tp_degree}, pp {pp_degree}, dp {dp_degree},"
                         f" num_params {num_params}")
    if dtype not in ("bf16", "fp32"):
        return None
    opts = options or {}
    m, n = tp_degree * pp_degree, dp_degree
    fw, fg, fo = STATE_BYTES["fp32"]
    if (strategy, engine) in (("ddp", "torch-ddp"), ("tp_pp", "torch")):
        return EngineStateBytes(weights_bytes_per_param=fw / m, grads_bytes_per_param=fg / m,
                                optimizer_bytes_per_param=fo / m, grads_bytes=fg, distributed_optimizer=False)
    if (strategy, engine) == ("zero3", "deepspeed"):
        w, g, o = STATE_BYTES[dtype]
        threshold = (opts.get("zero") or {}).get("stage3_param_persistence_threshold")
        persist = sum(k for k in param_numels if k < threshold) if param_numels and threshold is not None else 0
        return EngineStateBytes(weights_bytes_per_param=w * (persist + (num_params - persist) / n) / num_params,
                                grads_bytes_per_param=g / n, optimizer_bytes_per_param=o / n, grads_bytes=g,
                                distributed_optimizer=True, num_params_persistent=persist,
                                persistence_threshold=threshold)
    if (strategy, engine) == ("zero3", "fsdp2"):
        return EngineStateBytes(weights_bytes_per_param=fw / n, grads_bytes_per_param=fg / n,
                                optimizer_bytes_per_param=fo / n, grads_bytes=fg, distributed_optimizer=True)
    if (strategy, engine) == ("tp_pp", "megatron"):
        distributed = bool(opts.get("use_distributed_optimizer", n > 1))
        w, g, o = STATE_BYTES[dtype]
        if dtype == "bf16" and opts.get("grad_reduce_in_fp32", True):
            g = FP32_GRAD_BYTES
        o_rank = o / n if distributed else o
        return EngineStateBytes(weights_bytes_per_param=w / m, grads_bytes_per_param=g / m,
                                optimizer_bytes_per_param=o_rank / m, grads_bytes=g, distributed_optimizer=distributed)
    return None


@dataclass(frozen=True, kw_only=True)
class ActivationTerms:
    """One layer's stored activations for one micro-batch, bytes, before any division by TP.
    replicated: what TP alone does not split (norm inputs, QKV and MLP inputs, dropout masks)
    -- sequence parallelism splits it; sharded: Q/K/V, the projection input and the MLP hidden
    activations; scores: softmax output (+ dropout mask and output), which selective
    recomputation (or flash attention) never stores."""

    replicated: float
    sharded: float
    scores: float


def compute_activation_terms(shape: ModelShape, *, seq_length: int, micro_batch_size: int) -> ActivationTerms:
    """Korthikanti et al. 2022 section 4.1, term by term (2-byte activations, 1-byte dropout masks):

    - replicated: norm inputs 4sbh, QKV input 2sbh, MLP input 2sbh, dropout masks 2sbh (if dropout);
    - sharded: Q, K, V 2sb(h + 2h_kv), projection input 2sbh, MLP hidden 4sbF (GELU: its input and
      output) or 6sbF (SwiGLU: gate and up outputs, their product), x moe_top_k for MoE;
    - scores: 2as²b softmax output (+ as²b mask + 2as²b dropout output with dropout).

    GPT-3 shape (h_kv = h, F = 4h, dropout): 10sbh + 24sbh + 5as²b = sbh(34 + 5as/h), the paper's eq. (1).
    seq_length is the sequence a GPU holds (s / CP under context parallelism).
    """
    s, b, h, f = seq_length, micro_batch_size, shape.hidden_size, shape.ffn_hidden_size
    sbh = s * b * h
    replicated = (8 + (2 if shape.dropout else 0)) * sbh
    mlp = (6 if shape.gated_mlp else 4) * s * b * f * (shape.moe_top_k if shape.num_experts > 1 else 1)
    sharded = 2 * s * b * (h + 2 * shape.kv_hidden_size) + 2 * sbh + mlp
    scores = (5 if shape.dropout else 2) * shape.num_heads * s * s * b
    return ActivationTerms(replicated=float(replicated), sharded=float(sharded), scores=float(scores))


def compute_activation_bytes_per_layer(shape: ModelShape, *, seq_length: int, micro_batch_size: int,
                                       tp_degree: int = 1, sequence_parallel: bool = False,
                                       recompute: str = "none") -> float:
    """Stored activations of one layer for one micro-batch on one GPU, bytes.

    Korthikanti et al. 2022: no recompute, TP t: replicated + (sharded + scores)/t (eq. 2:
    sbh(10 + 24/t + 5as/(ht))); with sequence parallelism everything / t (eq. 4:
    sbh(34/t + 5as/(ht))); selective recomputation drops the scores (section 5: sbh·34/t);
    full recomputation keeps only the layer input, 2sbh (/ t with SP) (section 4.2).
    Raises ConfigError for an unknown recompute mode.
    """
    if recompute not in RECOMPUTES:
        raise ConfigError(f"unknown recompute {recompute!r}; choose one of {', '.join(RECOMPUTES)}")
    t = tp_degree
    split = t if sequence_parallel else 1
    if recompute == "full":
        return 2.0 * seq_length * micro_batch_size * shape.hidden_size / split
    terms = compute_activation_terms(shape, seq_length=seq_length, micro_batch_size=micro_batch_size)
    scores = terms.scores if recompute == "none" else 0.0
    return terms.replicated / split + (terms.sharded + scores) / t


def compute_output_activation_bytes(shape: ModelShape, *, seq_length: int, micro_batch_size: int,
                                    tp_degree: int = 1, logits_bytes: int = 4) -> float:
    """The output layer's activations at its peak (Korthikanti et al. 2022 section 4.3): its norm
    and projection inputs 4sbh/t and the logits, logits_bytes x sbV/t -- 4: the fp32 logits a fused
    or vocab-parallel cross entropy keeps (the paper's 4sbv/t); more for an unfused one."""
    s, b = seq_length, micro_batch_size
    return (4.0 * s * b * shape.hidden_size + float(logits_bytes) * s * b * shape.vocab_size) / tp_degree


def compute_inflight_microbatches(*, stage: int, pp_degree: int, num_microbatches: int,
                                  num_virtual_stages: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` holds at its peak under 1F1B:
    min(p - stage, m) (Narayanan et al. 2021 section 2.2; the first stage holds p, so its
    activations equal a whole model's, Korthikanti et al. 2022 section 4.2.3); the interleaved
    schedule multiplies the first stage's by 1 + (p - 1)/(p·v) (ibid.)."""
    n = float(min(pp_degree - stage, num_microbatches))
    if num_virtual_stages > 1 and stage == 0:
        n *= 1 + (pp_degree - 1) / (pp_degree * num_virtual_stages)
    return n


OFFLOADS = ("none", "optimizer", "optimizer+param")


def describe_offload(*, engine: str, options: Mapping[str, Any] | None) -> str:
    """A run's CPU offload from its engine knobs: "none" | "optimizer" | "optimizer+param"
    (FSDP2's ``offload`` is CPUOffloadPolicy: parameters, gradients and optimizer states together;
    DeepSpeed's ``offload_param`` / ``offload_optimizer``)."""
    o = options or {}
    if engine == "fsdp2":
        return "optimizer+param" if o.get("offload") else "none"
    if engine == "deepspeed":
        if o.get("offload_param"):
            return "optimizer+param"
        return "optimizer" if o.get("offload_optimizer") else "none"
    return "none"


def compute_offloaded_fraction(*, sharding: str, offload: str) -> float:
    """Share of a rank's model-state bytes (16 per parameter, bf16 weights and grads + 12 of fp32
    master, m, v) that CPU offload keeps in host memory instead of on the device:

    - "optimizer": the 12 bytes of fp32 master weights, momentum and variance, 12/16 (ZeRO-Offload,
      Ren et al. 2021 section 4; DeepSpeed ``offload_optimizer``);
    - "optimizer+param": all 16 (ZeRO-Infinity, Rajbhandari et al. 2021 section 5, DeepSpeed
      ``offload_param`` as well; torch FSDP2 ``CPUOffloadPolicy`` keeps the sharded parameters,
      gradients and optimizer states on the host);
    - "none": 0.

    Only the sharded scheme (zero3) offloads. Raises ConfigError for another scheme or offload."""
    if offload not in OFFLOADS:
        raise ConfigError(f"unknown offload {offload!r}; choose one of {', '.join(OFFLOADS)}")
    if offload == "none":
        return 0.0
    if sharding != "zero3":
        raise ConfigError(f"offload {offload!r} needs the zero3 sharding, got {sharding!r}")
    return 12 / 16 if offload == "optimizer" else 1.0


def round_pinned_bytes(num_bytes: int) -> int:
    """Host bytes PyTorch's pinned-memory allocator takes for one tensor of ``num_bytes``: the
    next power of two (CachingHostAllocator rounds every block up to one, c10::llvm::PowerOf2Ceil
    in aten/src/ATen/core/CachingHostAllocator.h); 0 for 0."""
    return 0 if num_bytes <= 0 else 1 << (int(num_bytes) - 1).bit_length()


def list_gpt_param_shapes(shape: ModelShape) -> list[tuple[int, int]]:
    """The (dim 0, dim 1) of every parameter tensor of the campaign's GPT (runner.model.GPT: tied
    embedding once, learned positions, biases, GELU MLP); a vector is (n, 1). Their sizes sum
    to core.formulas.count_params(shape)."""
    h, f = shape.hidden_size, shape.ffn_hidden_size
    block = [(h, 1), (h, 1), (3 * h, h), (3 * h, 1), (h, h), (h, 1),  # ln_1, qkv, attention proj
             (h, 1), (h, 1), (f, h), (f, 1), (h, f), (h, 1)]  # ln_2, MLP fc and proj
    return [(shape.vocab_size, h), (int(shape.max_position_embeddings or 0), h),
            *block * shape.num_layers, (h, 1), (h, 1)]


def compute_fsdp2_offload_host_bytes(shape: ModelShape, *, shard_degree: int) -> int:
    """Host bytes of torch FSDP2's CPU offload on one rank (``CPUOffloadPolicy(pin_memory=True)``,
    fp32 shards): each parameter's fp32 shard and its fp32 gradient in pinned memory, each
    tensor rounded up by ``round_pinned_bytes``, plus AdamW's momentum and variance in pageable
    memory (8 bytes per parameter, unrounded). A shard is ceil(dim 0 / shard_degree) rows (FSDP2
    pads dim 0 to the mesh). Unpinned (pin_memory=False, no CUDA) the same tensors hold 16
    bytes per parameter. Raises ConfigError for shard_degree < 1."""
    if shard_degree < 1:
        raise ConfigError(f"shard_degree must be >= 1, got {shard_degree}")
    total = 0
    for rows, cols in list_gpt_param_shapes(shape):
        numel = math.ceil(rows / shard_degree) * cols
        total += 2 * round_pinned_bytes(4 * numel) + 8 * numel
    return total

