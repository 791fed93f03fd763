"""Registry of (strategy, engine) -> trainer builder, and the contract every trainer meets.

A trainer owns one parallel layout of the shared GPT on one rank. The training loop
(runner.train) owns data, timing, the LR schedule and the metric rows; a trainer only turns
a step's micro-batches into a loss and a gradient norm. Engines are imported lazily so a DDP
run never imports DeepSpeed or Megatron.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol

import torch

from core.records import RunSpec

# (strategy, engine) -> module exposing build_trainer(spec, *, ctx) -> Trainer
_REGISTRY: dict[tuple[str, str], str] = {
    ("ddp", "torch-ddp"): "runner.strategies.ddp",
    ("zero3", "deepspeed"): "runner.strategies.zero3",
    ("zero3", "fsdp2"): "runner.strategies.fsdp2",
    ("tp_pp", "torch"): "runner.strategies.tp_pp_torch",
    ("tp_pp", "megatron"): "runner.strategies.tp_pp_megatron",
}


@dataclass(frozen=True, kw_only=True)
class RankContext:
    """Where this process sits: global rank, world size, local rank and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


@dataclass(frozen=True, kw_only=True)
class StepOutput:
    """loss: mean LM loss over this rank's micro-batches (0-dim tensor, still on device, so the
    loop decides when to sync) or None where this rank computes none (early pipeline stages).
    grad_norm: global L2 norm of the gradients before clipping (tensor or float), or None."""

    loss: torch.Tensor | None
    grad_norm: torch.Tensor | float | None


class Trainer(Protocol):
    engine_version: str
    num_params: int  # unique parameters of the whole model (all ranks), tied embedding once
    num_params_position_embedding: int
    dp_rank: int  # which slice of the global batch this rank consumes
    dp_degree: int

    def train_step(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]], *, lr: float) -> StepOutput:
        """One optimizer step over this rank's micro-batches [(inputs [mbs, T], labels [mbs, T])]
        already on ``ctx.device``; sets the learning rate to ``lr`` before the update."""
        ...


def build_trainer(spec: RunSpec, *, ctx: RankContext) -> Trainer:
    """Import the engine module for ``(spec.strategy, spec.engine)`` and build its trainer.

    Raises KeyError for an unregistered pair (runner.matrix rejects those before launch)."""
    module = importlib.import_module(_REGISTRY[(spec.strategy, spec.engine)])
    return module.build_trainer(spec, ctx=ctx)


def registered() -> list[tuple[str, str]]:
    return list(_REGISTRY)
