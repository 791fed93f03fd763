"""Engine knobs per (strategy, engine): typed, with the defaults an expert picks for a ~125M GPT
on one node, resolved by runner.matrix into every run's ``spec.options`` (so the note prints what
actually ran, not "defaults").

A run's ``[runs.options]`` may set any field of its engine's knob class (plus the common keys);
an unknown key is refused with the list of valid ones, a wrong type naming the expected one.
Device-dependent defaults (``None`` below) are filled at resolve time: ``compile`` and
``fused_adamw`` are on for CUDA and off on CPU (the CPU tests stay fast; fused AdamW is a CUDA
kernel).

Sources for the defaults:
- DDP: torch ``DistributedDataParallel`` docs (bucket_cap_mb 25 MiB is its default and right for
  ~125M parameters: ~10 buckets overlap with backward; ``gradient_as_bucket_view`` saves a copy
  and a gradient-sized buffer). ``static_graph`` stays off: with ``no_sync`` gradient accumulation
  and torch.compile's DDPOptimizer graph splitting it buys nothing measurable at this size.
- ZeRO-3: DeepSpeed config docs (``zero_optimization``). At 125M (~250 MB of bf16 parameters)
  the whole model fits many times over, so parameters below 1M elements stay resident
  (``stage3_param_persistence_threshold`` -- every bias/LayerNorm and the smaller matrices), and
  prefetch / reduce buckets are large (200M elements: one layer's gathers in flight, few
  reduce-scatters), overlap_comm and contiguous_gradients on.
- Megatron-core: ``DistributedDataParallelConfig`` (overlap_grad_reduce, grad_reduce_in_fp32,
  use_distributed_optimizer on when dp > 1) and torch's fused AdamW under Megatron's optimizer
  wrapper (Megatron without TE/apex builds ``torch.optim.AdamW`` without ``fused=``). Unavailable
  without Transformer Engine / apex (recorded in ``MEGATRON_UNAVAILABLE``): TE layer specs and
  fused attention/LayerNorm-linear, apex FusedAdam, ``gradient_accumulation_fusion``
  (fused_weight_gradient_mlp_cuda), ``persist_layer_norm``.

Deliberately not here: launching, the DeepSpeed JSON (runner.strategies.zero3 builds it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

# Fused paths Megatron-core offers that need Transformer Engine or apex (neither on the GPU box).
MEGATRON_UNAVAILABLE = ("transformer_engine layer spec (TE fused attention, LayerNorm+Linear)", "apex FusedAdam",
                        "gradient_accumulation_fusion (apex)", "persist_layer_norm (apex)")


@dataclass(frozen=True, kw_only=True)
class CommonKnobs:
    tf32: bool = False  # TF32 matmuls/convolutions; off so bf16 runs compare bf16 kernels only
    fused_adamw: bool | None = None  # torch.optim.AdamW(fused=True); None -> on for CUDA


@dataclass(frozen=True, kw_only=True)
class DDPKnobs(CommonKnobs):
    bucket_cap_mb: int = 25
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    compile: bool | None = None  # torch.compile of the DDP-wrapped model; None -> on for CUDA


@dataclass(frozen=True, kw_only=True)
class Zero3Knobs(CommonKnobs):
    zero: dict = dataclasses.field(default_factory=dict)  # overrides of ZERO3_DEFAULTS (keys: ZERO_KEYS)
    compile: bool = False  # DeepSpeedEngine.compile(); off: graph breaks at every ZeRO-3 hook at this size


@dataclass(frozen=True, kw_only=True)
class MegatronKnobs(CommonKnobs):
    overlap_grad_reduce: bool = True
    grad_reduce_in_fp32: bool = True
    use_distributed_optimizer: bool | None = None  # None -> on when dp_degree > 1
    init: str = "runner"  # "runner" (the torch engines' exact weights) | "megatron"


@dataclass(frozen=True, kw_only=True)
class TorchTPPPKnobs(CommonKnobs):
    pass


KNOBS: dict[tuple[str, str], type] = {
    ("ddp", "torch-ddp"): DDPKnobs,
    ("zero3", "deepspeed"): Zero3Knobs,
    ("tp_pp", "megatron"): MegatronKnobs,
    ("tp_pp", "torch"): TorchTPPPKnobs,
}

# DeepSpeed zero_optimization keys a run may set (DeepSpeedZeroConfig), with their types.
ZERO_KEYS: dict[str, type] = {
    "overlap_comm": bool, "contiguous_gradients": bool, "reduce_bucket_size": int,
    "stage3_prefetch_bucket_size": int, "stage3_param_persistence_threshold": int,
    "stage3_max_live_parameters": int, "stage3_max_reuse_distance": int, "reduce_scatter": bool,
    "allgather_bucket_size": int, "round_robin_gradients": bool, "zero_hpz_partition_size": int,
    "stage3_gather_16bit_weights_on_model_save": bool,
}
ZERO3_DEFAULTS: dict[str, Any] = {
    "stage": 3,
    "overlap_comm": True,
    "contiguous_gradients": True,
    "reduce_bucket_size": 200_000_000,
    "stage3_prefetch_bucket_size": 200_000_000,
    "stage3_param_persistence_threshold": 1_000_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
}

@dataclass(frozen=True, kw_only=True)
class LoaderKnobs:
    """The real data round's DataLoader (runner.data.RealBatches), in ``[runs.options.loader]``;
    resolved into the specs of real-round runs only (the synthetic round has no loader)."""

    num_workers: int | None = None  # worker processes; None -> 2 on CUDA, 1 on CPU (2 cores shared by the ranks)
    pin_memory: bool | None = None  # pinned host batches (non_blocking copies); None -> on for CUDA
    prefetch_factor: int = 2  # batches each worker keeps ready (ignored with num_workers 0)
    sample_delay_s: float = 0.0  # artificial per-sample delay: a deliberately starved loader, for testing


LOADER_TYPES = {"num_workers": int, "pin_memory": bool, "prefetch_factor": int, "sample_delay_s": float}


def resolve_loader_knobs(raw: Any, *, device: str, where: str) -> tuple[dict[str, Any], list[str]]:
    """``options.loader`` with every LoaderKnobs field filled: (resolved, problems)."""
    if not isinstance(raw, Mapping):
        return {}, [f"{where}: 'loader' must be a table, got {raw!r}"]
    problems = [f"{where}: unknown key 'loader.{k}' (valid: {', '.join(sorted(LOADER_TYPES))})"
                for k in sorted(set(raw) - set(LOADER_TYPES))]
    for k, kind in LOADER_TYPES.items():
        v = raw.get(k)
        if v is None:
            continue
        ok = isinstance(v, bool) if kind is bool else (not isinstance(v, bool) and isinstance(v, (int, float) if kind is float else int))
        if not ok or (kind is not bool and v < 0) or (k == "prefetch_factor" and v < 1):
            problems.append(f"{where}: 'loader.{k}' must be {'true or false' if kind is bool else 'a number >= 0' if kind is float else 'an integer >= ' + ('1' if k == 'prefetch_factor' else '0')}, got {v!r}")
    if problems:
        return {}, problems
    knobs = dataclasses.asdict(LoaderKnobs(**{k: raw[k] for k in LOADER_TYPES if k in raw}))
    cuda = device == "cuda"
    if knobs["num_workers"] is None:
        knobs["num_workers"] = 2 if cuda else 1
    if knobs["pin_memory"] is None:
        knobs["pin_memory"] = cuda
    knobs["sample_delay_s"] = float(knobs["sample_delay_s"])
    return knobs, []


# Keys every run may set besides its engine's knobs: fault injection and a test-only memory
# limit for the micro-batch search (the trainer raises torch.OutOfMemoryError above it).
TEST_OPTION_KEYS = {"fault", "simulate_oom_above_micro_batch_size"}
# The real data round's loader (LoaderKnobs), resolved by runner.matrix for real-round runs.
DATA_OPTION_KEYS = {"loader"}
# Written by the runner after a micro-batch search (never set in a matrix).
RUNNER_OPTION_KEYS = {"micro_batch_search"}


def valid_option_keys(strategy: str, engine: str) -> set[str]:
    cls = KNOBS.get((strategy, engine))
    names = {f.name for f in dataclasses.fields(cls)} if cls else set()
    return names | TEST_OPTION_KEYS | DATA_OPTION_KEYS


def _type_ok(value: Any, kind: Any) -> bool:
    kinds = {"bool": (bool,), "int": (int,), "str": (str,), "dict": (dict,), "bool | None": (bool,)}.get(
        kind if isinstance(kind, str) else getattr(kind, "__name__", ""), ())
    if not kinds:
        return True
    if bool not in kinds and isinstance(value, bool):
        return False
    return isinstance(value, kinds)


def resolve_knobs(strategy: str, engine: str, options: Mapping[str, Any], *, device: str, dp_degree: int,
                  where: str) -> tuple[dict[str, Any], list[str]]:
    """The run's options with every knob of its engine filled: (resolved options, problems).

    Unknown keys and wrong types are problems (one line each, naming the valid keys / type).
    Test keys (``fault``, ``simulate_oom_above_micro_batch_size``) pass through unchanged."""
    cls = KNOBS.get((strategy, engine))
    valid = valid_option_keys(strategy, engine)
    problems = [f"{where}: unknown key '{k}' (valid: {', '.join(sorted(valid))})" for k in sorted(set(options) - valid)]
    if cls is None:
        return dict(options), problems
    fields = {f.name: f for f in dataclasses.fields(cls)}
    given = {k: v for k, v in options.items() if k in fields}
    for k, v in given.items():
        if not _type_ok(v, fields[k].type):
            problems.append(f"{where}: '{k}' must be {fields[k].type}, got {v!r}")
    if "zero" in given and isinstance(given["zero"], dict):
        for k, v in sorted(given["zero"].items()):
            if k not in ZERO_KEYS:
                problems.append(f"{where}: unknown key 'zero.{k}' (valid: {', '.join(sorted(ZERO_KEYS))})")
            elif not _type_ok(v, ZERO_KEYS[k]):
                problems.append(f"{where}: 'zero.{k}' must be {ZERO_KEYS[k].__name__}, got {v!r}")
    if "init" in given and given["init"] not in ("runner", "megatron"):
        problems.append(f"{where}: 'init' must be 'runner' or 'megatron', got {given['init']!r}")
    if problems:
        return dict(options), problems
    knobs = cls(**given)
    resolved = dataclasses.asdict(knobs)
    cuda = device == "cuda"
    if resolved.get("fused_adamw") is None:
        resolved["fused_adamw"] = cuda
    if "compile" in resolved and resolved["compile"] is None:
        resolved["compile"] = cuda
    if "use_distributed_optimizer" in resolved and resolved["use_distributed_optimizer"] is None:
        resolved["use_distributed_optimizer"] = dp_degree > 1
    if "zero" in resolved:
        resolved["zero"] = {**ZERO3_DEFAULTS, **resolved["zero"]}
    extra = {k: v for k, v in options.items() if k in TEST_OPTION_KEYS | DATA_OPTION_KEYS}
    return {**resolved, **extra}, problems
