"""DDP baseline [torch DistributedDataParallel]: every rank holds the whole model and
optimizer; gradients are all-reduced in buckets overlapped with backward.

``options.overlap_grad_reduce = false`` turns that overlap off: every micro-batch's backward runs
under ``no_sync`` and the summed gradients are averaged after the last backward by one all-reduce
of all of them flattened into one buffer (the same sum, none of it hidden behind backward)."""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.nn.parallel import DistributedDataParallel

from core.records import RunSpec
from runner.model import GPT, count_params
from runner.strategies import RankContext, StepOutput
from runner.strategies.parity import build_loss_fn, spec_kernels
from runner.strategies.common import (
    TORCH_CHECKPOINT_FORMAT, apply_recompute, autocast, build_adamw, build_param_groups, build_run_gpt,
    load_torch_checkpoint, phase, save_torch_checkpoint, set_lr,
)


class _GPTWithLoss(torch.nn.Module):
    """forward(inputs [mbs, T], labels [mbs, T]) -> mean LM loss (the run's loss,
    runner.strategies.parity.build_loss_fn)."""

    def __init__(self, gpt: GPT, loss_fn) -> None:
        super().__init__()
        self.gpt = gpt
        self.loss_fn = loss_fn

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.gpt(inputs), labels)


class DDPTrainer:
    checkpoint_format = TORCH_CHECKPOINT_FORMAT

    def __init__(self, spec: RunSpec, *, ctx: RankContext) -> None:
        self.spec = spec
        self.ctx = ctx
        model = build_run_gpt(spec, device=ctx.device)
        self.num_params = count_params(model)
        self.num_params_position_embedding = model.wpe.weight.numel()
        # kernels (runner.strategies.parity): parity compiles each block and calls the shared loss
        # outside the graphs; engine-best compiles the DDP-wrapped model with its fp32 loss in one
        # graph (nanoGPT's shape); eager, the same two calls.
        self.kernels = spec_kernels(spec.options, strategy=spec.strategy, engine=spec.engine,
                                    device=ctx.device.type, tp_degree=1)
        scope = self.kernels["compile"]
        apply_recompute(model.blocks, spec)
        if scope == "per-block":
            for i, block in enumerate(model.blocks):
                model.blocks[i] = torch.compile(block)
        self.model = DistributedDataParallel(
            _GPTWithLoss(model, build_loss_fn(self.kernels)),
            device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None,
            gradient_as_bucket_view=bool(spec.options.get("gradient_as_bucket_view", True)),
            bucket_cap_mb=int(spec.options.get("bucket_cap_mb", 25)),
            static_graph=bool(spec.options.get("static_graph", False)),
        )
        self.forward = torch.compile(self.model) if scope == "model+loss" else self.model
        self.optimizer = build_adamw(
            build_param_groups(model.named_parameters(), weight_decay=spec.fixed.weight_decay), spec, device=ctx.device
        )
        self.overlap_grad_reduce = bool(spec.options.get("overlap_grad_reduce", True))
        self.engine_version = torch.__version__
        self.dp_rank = ctx.rank
        self.dp_degree = ctx.world_size

    def train_step(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]], *, lr: float) -> StepOutput:
        n = len(microbatches)
        total = torch.zeros((), device=self.ctx.device)
        for i, (inputs, labels) in enumerate(microbatches):
            # all-reduce only on the last micro-batch (gradient accumulation); never with overlap off
            sync = contextlib.nullcontext() if i == n - 1 and self.overlap_grad_reduce else self.model.no_sync()
            with sync:
                with phase("forward"), autocast(self.spec, self.ctx.device):
                    loss = self.forward(inputs, labels) / n
                with phase("backward"):
                    loss.backward()
                    if i == n - 1 and not self.overlap_grad_reduce:
                        self._all_reduce_after_backward()
            total += loss.detach()
        with phase("optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.spec.fixed.grad_clip)
            set_lr(self.optimizer, lr)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return StepOutput(loss=total, grad_norm=grad_norm)


    @torch.no_grad()
    def _all_reduce_after_backward(self) -> None:
        """Average the gradients over the ranks with one all-reduce of one flat buffer (DDP's
        average: sum / world size), after backward has finished."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(self.ctx.world_size)
        for g, synced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            g.copy_(synced)

    def save_checkpoint(self, path) -> None:
        """Model + AdamW state via torch distributed checkpoint (replicas deduplicated). Collective."""
        save_torch_checkpoint(self.model, self.optimizer, path, key="ddp")

    def load_checkpoint(self, path) -> None:
        load_torch_checkpoint(self.model, self.optimizer, path, key="ddp")


def build_trainer(spec: RunSpec, *, ctx: RankContext) -> DDPTrainer:
    return DDPTrainer(spec, ctx=ctx)
