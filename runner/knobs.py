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
- FSDP2 (torch ``fully_shard``, the ZeRO-3 layout's torch-native engine): torch FSDP2 docs and
  torchtitan ``parallelize`` (one ``fully_shard`` per transformer block, then the root;
  ``reshard_after_forward`` on: parameters are freed after forward and all-gathered again for
  backward, ZeRO-3's semantics; FSDP2's implicit prefetch; per-block ``torch.compile`` before
  sharding on CUDA). The mixed-precision policy matches the DeepSpeed run's: bf16 compute
  parameters over fp32 sharded master weights, gradients reduce-scattered in bf16 (DeepSpeed's
  ``communication_data_type`` defaults to the bf16 model dtype; engine.py), reduce-scatter every
  micro-batch (DeepSpeed stage 3 partitions gradients per micro-batch).
- torch TP+PP: ``Schedule1F1B`` (the Megatron engine's non-interleaved 1F1B) by default;
  ``Interleaved1F1B`` with ``virtual_stages`` model chunks per rank where the layers divide
  (Narayanan et al. 2021, section 2.2.2); per-block ``torch.compile`` on CUDA as DDP compiles.
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
import math
from dataclasses import dataclass
from typing import Any, Mapping

# Fused paths Megatron-core offers that need Transformer Engine or apex (neither on the GPU box).
MEGATRON_UNAVAILABLE = ("transformer_engine layer spec (TE fused attention, LayerNorm+Linear)", "apex FusedAdam",
                        "gradient_accumulation_fusion (apex)", "persist_layer_norm (apex)")


@dataclass(frozen=True, kw_only=True)
class CommonKnobs:
    tf32: bool = False  # TF32 matmuls/convolutions; off so bf16 runs compare bf16 kernels only
    fused_adamw: bool | None = None  # torch.optim.AdamW(fused=True); None -> on for CUDA
    # activation recomputation: "full" keeps each block's input only and recomputes the block in
    # backward (torch engines: a non-reentrant checkpoint per block, torchtitan's full AC; Megatron:
    # recompute_granularity "full", method "uniform", 1 layer per group); "none" stores every activation
    recompute: str = "none"


@dataclass(frozen=True, kw_only=True)
class DDPKnobs(CommonKnobs):
    bucket_cap_mb: int = 25
    gradient_as_bucket_view: bool = True
    static_graph: bool = False
    compile: bool | None = None  # torch.compile of the DDP-wrapped model; None -> on for CUDA
    overlap_grad_reduce: bool = True  # bucketed all-reduce during backward; False: one flat all-reduce after it


@dataclass(frozen=True, kw_only=True)
class Zero3Knobs(CommonKnobs):
    zero: dict = dataclasses.field(default_factory=dict)  # overrides of ZERO3_DEFAULTS (keys: ZERO_KEYS)
    compile: bool = False  # DeepSpeedEngine.compile(); off: graph breaks at every ZeRO-3 hook at this size
    offload_optimizer: bool = False  # zero_optimization.offload_optimizer device "cpu": fp32 master, m, v on the host
    offload_param: bool = False  # zero_optimization.offload_param device "cpu": parameter partitions on the host


@dataclass(frozen=True, kw_only=True)
class FSDP2Knobs(CommonKnobs):
    reshard_after_forward: bool = True  # free gathered parameters after forward (ZeRO-3); False: keep to backward
    reduce_dtype: str | None = None  # "bf16" | "fp32"; None -> the campaign dtype (DeepSpeed's default)
    prefetch_num_blocks: int = 0  # explicit all-gather prefetch of the next k blocks; 0: FSDP2's implicit one
    prefetch: bool = True  # all-gathers issued ahead of their block; False: none, each waits for its block
    reduce_every_microbatch: bool = True  # reduce-scatter per micro-batch (DeepSpeed's); False: once per step
    compile: bool | None = None  # torch.compile of each block before sharding; None -> on for CUDA
    offload: bool = False  # CPUOffloadPolicy: sharded parameters, gradients and optimizer states on the host


@dataclass(frozen=True, kw_only=True)
class MegatronKnobs(CommonKnobs):
    overlap_grad_reduce: bool = True
    grad_reduce_in_fp32: bool = True
    use_distributed_optimizer: bool | None = None  # None -> on when dp_degree > 1
    init: str = "runner"  # "runner" (the torch engines' exact weights) | "megatron"
    overlap_param_gather: bool = False  # distributed optimizer's all-gather in the next forward (needs it on)


@dataclass(frozen=True, kw_only=True)
class TorchTPPPKnobs(CommonKnobs):
    schedule: str = "1F1B"  # "1F1B" | "Interleaved1F1B" (torch.distributed.pipelining)
    virtual_stages: int | None = None  # model chunks per rank; None -> 1 for 1F1B, 2 for Interleaved1F1B
    compile: bool | None = None  # torch.compile of each block (after TP); None -> on for CUDA


PP_SCHEDULES = ("1F1B", "Interleaved1F1B")
RECOMPUTE_MODES = ("none", "full")
REDUCE_DTYPES = ("bf16", "fp32")


KNOBS: dict[tuple[str, str], type] = {
    ("ddp", "torch-ddp"): DDPKnobs,
    ("zero3", "deepspeed"): Zero3Knobs,
    ("zero3", "fsdp2"): FSDP2Knobs,
    ("tp_pp", "megatron"): MegatronKnobs,
    ("tp_pp", "torch"): TorchTPPPKnobs,
}

# Each engine's overlap switches: knob ("zero.key" inside ``zero``) -> its value with the overlap
# off (runner.matrix's ``overlap`` pairs run a twin with these set; every other knob the same).
# torch TP+PP has none: its DP all-reduce already runs after the schedule (runner.strategies.tp_pp_torch)
# and the pipeline's p2p is the schedule's own.
OVERLAP_SWITCHES: dict[tuple[str, str], dict[str, Any]] = {
    ("ddp", "torch-ddp"): {"overlap_grad_reduce": False},
    ("zero3", "deepspeed"): {"zero.overlap_comm": False},
    ("zero3", "fsdp2"): {"prefetch": False, "prefetch_num_blocks": 0},
    ("tp_pp", "megatron"): {"overlap_grad_reduce": False, "overlap_param_gather": False},
}


def build_overlap_off(strategy: str, engine: str, options: Mapping[str, Any]) -> dict[str, Any] | None:
    """Resolved ``options`` with the engine's overlap switches off (OVERLAP_SWITCHES); None for
    an engine without one."""
    switches = OVERLAP_SWITCHES.get((strategy, engine))
    if switches is None:
        return None
    out = dict(options)
    for key, value in switches.items():
        if key.startswith("zero."):
            out["zero"] = {**out.get("zero", {}), key.removeprefix("zero."): value}
        else:
            out[key] = value
    return out


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

# Lower bounds of integer knobs (any engine's, and the test key): a knob not named takes any value of its type.
KNOB_MINIMUMS: dict[str, int] = {"bucket_cap_mb": 1, "prefetch_num_blocks": 0, "virtual_stages": 1,
                                 "simulate_oom_above_micro_batch_size": 1}
# Lower bounds of the integer zero_optimization keys (sizes in elements, distances in parameters).
ZERO_MINIMUMS: dict[str, int] = {"reduce_bucket_size": 1, "stage3_prefetch_bucket_size": 0,
                                 "stage3_param_persistence_threshold": 0, "stage3_max_live_parameters": 1,
                                 "stage3_max_reuse_distance": 0, "allgather_bucket_size": 1,
                                 "zero_hpz_partition_size": 1}


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
        if not ok or (kind is not bool and (not math.isfinite(v) or v < 0)) or (k == "prefetch_factor" and v < 1):
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
# Written by the runner (never set in a matrix): a micro-batch search's record; a capacity trial's
# per-process memory budget and weights drawn on the device (runner.capacity).
# An overlap pair's twin (runner.matrix) names the run it pairs with: ``overlap_off_of``.
RUNNER_OPTION_KEYS = {"micro_batch_search", "memory_budget_gib", "init_on_device", "overlap_off_of"}


def valid_option_keys(strategy: str, engine: str) -> set[str]:
    cls = KNOBS.get((strategy, engine))
    names = {f.name for f in dataclasses.fields(cls)} if cls else set()
    return names | TEST_OPTION_KEYS | DATA_OPTION_KEYS


def _type_ok(value: Any, kind: Any) -> bool:
    kinds = {"bool": (bool,), "int": (int,), "str": (str,), "dict": (dict,), "bool | None": (bool,),
             "str | None": (str,), "int | None": (int,)}.get(
        kind if isinstance(kind, str) else getattr(kind, "__name__", ""), ())
    if not kinds:
        return True
    if bool not in kinds and isinstance(value, bool):
        return False
    return isinstance(value, kinds)


def resolve_knobs(strategy: str, engine: str, options: Mapping[str, Any], *, device: str, dp_degree: int,
                  where: str, dtype: str = "fp32") -> tuple[dict[str, Any], list[str]]:
    """The run's options with every knob of its engine filled: (resolved options, problems).

    Unknown keys and wrong types are problems (one line each, naming the valid keys / type).
    Test keys (``fault``, ``simulate_oom_above_micro_batch_size``) pass through unchanged.
    dtype: the campaign's ("bf16" | "fp32"), the default of FSDP2's ``reduce_dtype``."""
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
            elif k in ZERO_MINIMUMS and v < ZERO_MINIMUMS[k]:
                problems.append(f"{where}: 'zero.{k}' must be >= {ZERO_MINIMUMS[k]}, got {v!r}")
    ahead = given.get("prefetch_num_blocks", 0)
    if given.get("prefetch") is False and isinstance(ahead, int) and not isinstance(ahead, bool) and ahead > 0:
        problems.append(f"{where}: 'prefetch' false turns every all-gather prefetch off; drop prefetch_num_blocks"
                        f" ({given['prefetch_num_blocks']}) or set prefetch = true")
    if given.get("overlap_param_gather") is True and given.get("use_distributed_optimizer") is False:
        problems.append(f"{where}: 'overlap_param_gather' needs use_distributed_optimizer (its all-gather is the"
                        " one overlapped); drop it or set use_distributed_optimizer = true")
    if "init" in given and given["init"] not in ("runner", "megatron"):
        problems.append(f"{where}: 'init' must be 'runner' or 'megatron', got {given['init']!r}")
    for key, valid_values in (("schedule", PP_SCHEDULES), ("reduce_dtype", REDUCE_DTYPES),
                              ("recompute", RECOMPUTE_MODES)):
        if key in given and given[key] is not None and given[key] not in valid_values:
            problems.append(f"{where}: '{key}' must be one of {', '.join(valid_values)}, got {given[key]!r}")
    for key, minimum in KNOB_MINIMUMS.items():
        value = options.get(key)
        if key not in fields and key not in TEST_OPTION_KEYS or value is None:
            continue
        if key in TEST_OPTION_KEYS and (isinstance(value, bool) or not isinstance(value, int)):
            problems.append(f"{where}: '{key}' must be an integer >= {minimum}, got {value!r}")
        elif isinstance(value, int) and not isinstance(value, bool) and value < minimum:
            problems.append(f"{where}: '{key}' must be >= {minimum}, got {value!r}")
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
    if "reduce_dtype" in resolved and resolved["reduce_dtype"] is None:
        resolved["reduce_dtype"] = dtype
    if "virtual_stages" in resolved and resolved["virtual_stages"] is None:
        resolved["virtual_stages"] = 2 if resolved["schedule"] == "Interleaved1F1B" else 1
    extra = {k: v for k, v in options.items() if k in TEST_OPTION_KEYS | DATA_OPTION_KEYS}
    return {**resolved, **extra}, problems


def check_layout_knobs(options: Mapping[str, Any], *, num_layers: int, pp_degree: int, num_microbatches: int,
                       where: str) -> list[str]:
    """Problems of resolved knobs that depend on the layout (one line each), for the torch TP+PP
    engine's schedule: 1F1B runs one model chunk per rank; Interleaved1F1B needs pp_degree > 1,
    virtual_stages >= 2 chunks per rank, num_layers divisible by pp_degree x virtual_stages, and
    num_microbatches a multiple of its rounds max(1, m // p) (torch.distributed.pipelining
    ScheduleInterleaved1F1B)."""
    schedule, v = options.get("schedule"), options.get("virtual_stages")
    if schedule is None or not isinstance(v, int):
        return []
    if schedule == "1F1B":
        return [f"{where}: schedule '1F1B' runs one chunk per rank; virtual_stages must be 1, got {v}"] if v != 1 else []
    problems = []
    if pp_degree < 2:
        problems.append(f"{where}: schedule 'Interleaved1F1B' needs pp_degree >= 2, got {pp_degree}; use '1F1B'")
    if v < 2:
        problems.append(f"{where}: schedule 'Interleaved1F1B' needs virtual_stages >= 2, got {v}")
    elif num_layers % (pp_degree * v):
        problems.append(f"{where}: num_layers {num_layers} is not divisible by pp_degree {pp_degree} x virtual_stages {v}"
                        " (Interleaved1F1B gives every chunk the same number of blocks)")
    rounds = max(1, num_microbatches // pp_degree)
    if pp_degree >= 2 and num_microbatches % rounds:
        problems.append(f"{where}: Interleaved1F1B needs num_microbatches ({num_microbatches}) to be a multiple of"
                        f" max(1, num_microbatches // pp_degree) = {rounds}")
    return problems
