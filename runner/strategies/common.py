"""Pieces every torch-side trainer shares: optimizer param groups, the autocast policy, phase
ranges, torch checkpoints and the pipeline layer split."""
from __future__ import annotations

import contextlib
from typing import Iterable

import torch
import torch.distributed as dist
from torch import nn

from core.records import PHASE_RANGES, PLANT_RANGES, RunSpec
from runner.membudget import INIT_ON_DEVICE_KEY
from runner.model import build_gpt


def build_run_gpt(spec: RunSpec, *, device: torch.device) -> nn.Module:
    """The run's GPT on ``device`` (runner.model.build_gpt), its weights drawn on the device when
    the capacity probe asked for it (runner.membudget.INIT_ON_DEVICE_KEY in the run's options)."""
    return build_gpt(spec.fixed.model, device=device, on_device=bool(spec.options.get(INIT_ON_DEVICE_KEY)))


def build_param_groups(named_params: Iterable[tuple[str, nn.Parameter]], *, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on matrices (dim >= 2), none on biases/LayerNorm (nanoGPT
    configure_optimizers). Tied parameters appear once."""
    seen: dict[int, tuple[str, nn.Parameter]] = {}
    for name, p in named_params:
        if p.requires_grad:
            seen.setdefault(id(p), (name, p))
    decay = [p for _, p in seen.values() if p.dim() >= 2]
    no_decay = [p for _, p in seen.values() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_adamw(params: list[dict], spec: RunSpec, *, device: torch.device) -> torch.optim.AdamW:
    """torch AdamW with the campaign's betas, stepping on ``device``: the fused kernel (one pass over
    each tensor's weights, gradient and moments; CUDA, or CPU for an offloaded optimizer's host
    shards) when ``options.fused_adamw`` (resolved on for CUDA runs, off on CPU; absent: on for a
    CUDA ``device``), the same update as the foreach path, else foreach."""
    f = spec.fixed
    fused = bool(spec.options.get("fused_adamw", device.type == "cuda"))
    # not fused: foreach, named explicitly (torch's default picks it on CUDA only; on CPU it would loop
    # per tensor), the "adamw-foreach" of runner.kernels on every device
    return torch.optim.AdamW(params, lr=f.lr, betas=(f.adam_beta1, f.adam_beta2), eps=1e-8, fused=fused or None,
                             foreach=None if fused else True)


def apply_recompute(blocks: nn.ModuleList, spec: RunSpec) -> None:
    """Full activation recomputation (``options.recompute = "full"``): each block wrapped in
    torch's non-reentrant activation checkpoint (torch.distributed's checkpoint_wrapper, as
    torchtitan's full AC), so forward keeps only the block's input and backward recomputes the
    block. Applied before torch.compile and before any sharding wrapper; a no-op for "none"."""
    if spec.options.get("recompute", "none") != "full":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper

    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block, checkpoint_impl=CheckpointImpl.NO_REENTRANT, preserve_rng_state=False)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def autocast(spec: RunSpec, device: torch.device) -> contextlib.AbstractContextManager:
    """bf16 autocast with fp32 master weights for torch engines; no-op for fp32 campaigns."""
    if spec.fixed.dtype == "bf16":
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


PHASES = PHASE_RANGES  # core.records: the contract between these annotations and ingest.traces


_NVTX = {"on": False}


def enable_nvtx(on: bool) -> None:
    """Also emit each phase as an NVTX range (runs under nsys; set once per process by
    runner.train from RunSpec.nsys)."""
    _NVTX["on"] = on


def phase(name: str) -> contextlib.AbstractContextManager:
    """A profiler range named after one of PHASES (near-free when no profiler is active), and
    an NVTX range of the same name when enable_nvtx(True)."""
    assert name in PHASES, name
    return _range(name)


def plant_range(name: str) -> contextlib.AbstractContextManager:
    """``phase``'s ranges (profiler, NVTX under nsys) around a planted cause's own work, named
    after one of core.records.PLANT_RANGES."""
    assert name in PLANT_RANGES, name
    return _range(name)


@contextlib.contextmanager
def _range(name: str):
    with torch.profiler.record_function(name):
        if _NVTX["on"]:
            with torch.cuda.nvtx.range(name):
                yield
        else:
            yield


def pipeline_layer_split(spec: RunSpec, *, num_stages: int | None = None) -> tuple[int, ...]:
    """Transformer layers per pipeline stage, in stage order: the run's planted ``pp_layers``
    (core.records.Plant) when it has one, else the even split of num_layers over ``num_stages``
    (default pp_degree). Raises ValueError when neither fits."""
    num_layers, n = spec.fixed.model.num_layers, num_stages or spec.pp_degree
    planted = spec.plant.pp_layers if spec.plant is not None else None
    if planted is not None:
        if len(planted) != n or min(planted) < 1 or sum(planted) != num_layers:
            raise ValueError(f"plant.pp_layers {list(planted)} must give each of {n} stages >= 1 layer,"
                             f" {num_layers} in all")
        return tuple(planted)
    if num_layers % n:
        raise ValueError(f"num_layers {num_layers} is not divisible by {n} pipeline stages")
    return (num_layers // n,) * n


def gather_stage_num_layers(num_local_layers: int, *, group: dist.ProcessGroup,
                            device: torch.device) -> tuple[int, ...]:
    """Every pipeline rank's built layer count, in pp-rank order (collective over ``group``)."""
    local = torch.tensor([num_local_layers], dtype=torch.int64, device=device)
    out = [torch.zeros_like(local) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, local, group=group)
    return tuple(int(t.item()) for t in out)


TORCH_CHECKPOINT_FORMAT = "torch.distributed.checkpoint"


def save_torch_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, path, *, key: str) -> None:
    """Save model + optimizer state with torch distributed checkpoint (DCP): each rank writes
    its own shards (DTensor shards; replicated tensors once, deduplicated by DCP's planner) to
    ``path``. ``key`` namespaces this rank's part (pipeline stages hold different modules under
    the same local names). State dicts from ``torch.distributed.checkpoint.state_dict.get_state_dict``
    (FQN-keyed, DDP wrappers unwrapped). Collective: every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({key: {"model": model_sd, "optim": optim_sd}}, checkpoint_id=str(path))


def load_torch_checkpoint(model: nn.Module, optimizer: torch.optim.Optimizer, path, *, key: str) -> None:
    """Inverse of ``save_torch_checkpoint``: DCP loads into this rank's current state dicts (same
    layout), then ``set_state_dict`` copies them into the model and optimizer. Collective."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {key: {"model": model_sd, "optim": optim_sd}}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state[key]["model"], optim_state_dict=state[key]["optim"])
