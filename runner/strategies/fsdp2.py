"""ZeRO-3 [torch FSDP2, ``fully_shard``]: the same layout as DeepSpeed stage 3 -- parameters,
gradients and optimizer states sharded over the data-parallel ranks (Rajbhandari et al. 2020,
ZeRO section 5.3: model states 16Ψ/N bytes per rank), parameters all-gathered per block for
forward and again for backward, gradients reduce-scattered -- under PyTorch's own engine.

Sharding (torch FSDP2 docs; torchtitan ``apply_fsdp``): one ``fully_shard`` per Block, then
the root GPT (embeddings, final LayerNorm, the LM head; the tied embedding weight lives in the
root's group, once). Every parameter becomes a DTensor sharded on dim 0 over the 1-D "dp" mesh;
its local shard is the fp32 master copy, so AdamW's m and v are sharded too.

Mixed precision, as the DeepSpeed run does it (``options.reduce_dtype`` defaults to the campaign
dtype): with bf16, ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)`` -- blocks compute
with bf16 parameters cast at all-gather (LayerNorm included, as DeepSpeed's bf16 module), gradients
reduce-scattered in bf16 and accumulated into the fp32 shards; logits stay bf16 and the loss is
computed in fp32 by the run's loss (runner.strategies.parity.build_loss_fn). fp32 campaigns: no policy.

Gradient accumulation: by default every micro-batch's backward reduce-scatters its gradients
(DeepSpeed stage 3 partitions gradients per micro-batch, so both hold only a 1/N gradient
shard); ``options.reduce_every_microbatch = false`` keeps unsharded gradients until the last
micro-batch (fewer collectives, ZeRO-2-like gradient memory).

Same model and kernels as DDP: runner.model.GPT built whole with the campaign seed, attention
through ``F.scaled_dot_product_attention``. A "per-block" compile scope (runner.strategies.parity; on
for CUDA) compiles each Block
before it is sharded, so FSDP2's hooks stay eager around the compiled blocks (torchtitan's order).

Prefetch (the layout's overlap switch): by default FSDP2 issues the next block's all-gather in
backward before the current block's (implicit), ``prefetch_num_blocks`` k > 0 issues k blocks'
in forward and backward (explicit); ``prefetch = false`` issues none (each module's backward
prefetch list names only itself, which turns the implicit one off), so each all-gather starts
when its block does. Forward has no implicit prefetch to turn off; on a GPU the host may still
issue block i+1's all-gather while block i's kernels run.

CPU offload (``options.offload``): FSDP2's ``CPUOffloadPolicy`` keeps the sharded parameters,
their gradients and AdamW's states on the host; each block's shard is copied to the device for
its all-gather and its gradient shard back (torch FSDP2 docs), and the optimizer steps on the host.

Deliberately not here: HSDP (2-D meshes), FP8 all-gather, activation checkpointing.
"""
from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor

from core.records import RunSpec
from runner.model import count_params
from runner.strategies import RankContext, StepOutput
from runner.strategies.parity import build_loss_fn, spec_kernels
from runner.strategies.common import (
    TORCH_CHECKPOINT_FORMAT, apply_recompute, build_adamw, build_param_groups, build_run_gpt, load_torch_checkpoint,
    phase, save_torch_checkpoint, set_lr,
)

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def build_mp_policy(*, dtype: str, reduce_dtype: str) -> MixedPrecisionPolicy:
    """FSDP2 mixed-precision policy for a campaign ``dtype`` ("bf16" | "fp32"): bf16 compute
    parameters and ``reduce_dtype`` gradient reduce-scatter for bf16; none (fp32 throughout) for fp32."""
    if dtype != "bf16":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=DTYPES[reduce_dtype])


class FSDP2Trainer:
    checkpoint_format = TORCH_CHECKPOINT_FORMAT

    def __init__(self, spec: RunSpec, *, ctx: RankContext) -> None:
        self.spec, self.ctx = spec, ctx
        opts = spec.options
        model = build_run_gpt(spec, device=ctx.device)  # same seed -> the DDP run's initial weights
        self.num_params = count_params(model)
        self.num_params_position_embedding = model.wpe.weight.numel()
        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,), mesh_dim_names=("dp",))
        mp = build_mp_policy(dtype=spec.fixed.dtype, reduce_dtype=str(opts.get("reduce_dtype", spec.fixed.dtype)))
        reshard = bool(opts.get("reshard_after_forward", True))
        offload = CPUOffloadPolicy(pin_memory=ctx.device.type == "cuda") if opts.get("offload", False) else OffloadPolicy()
        self.kernels = spec_kernels(opts, strategy=spec.strategy, engine=spec.engine, device=ctx.device.type,
                                    tp_degree=1)
        self.loss_fn = build_loss_fn(self.kernels)
        apply_recompute(model.blocks, spec)  # before compile and sharding (torchtitan's order)
        if self.kernels["compile"] == "per-block":
            for i, block in enumerate(model.blocks):
                model.blocks[i] = torch.compile(block)  # hooks of fully_shard below stay outside the graph
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp, offload_policy=offload)
        ahead = int(opts.get("prefetch_num_blocks", 0))
        if not opts.get("prefetch", True):
            # overlap off: an empty list leaves FSDP2's implicit backward prefetch on; a module naming
            # itself replaces it with a no-op (its own all-gather has already finished by then)
            for module in (*model.blocks, model):
                module.set_modules_to_backward_prefetch([module])
        elif ahead > 0:  # explicit prefetch: block i's all-gather also issues blocks i+1..i+k (i-1..i-k backward)
            blocks = list(model.blocks)
            for i, block in enumerate(blocks):
                block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + ahead])
                block.set_modules_to_backward_prefetch(blocks[max(0, i - ahead) : i][::-1])
        self.model = model
        self.reduce_every_microbatch = bool(opts.get("reduce_every_microbatch", True))
        # offloaded: the shards AdamW updates live on the host (not fused: a CUDA kernel)
        self.optimizer = build_adamw(
            build_param_groups(model.named_parameters(), weight_decay=spec.fixed.weight_decay), spec,
            device=torch.device("cpu") if opts.get("offload", False) else ctx.device)
        self.engine_version = torch.__version__
        self.dp_rank, self.dp_degree = ctx.rank, ctx.world_size

    @torch.no_grad()
    def _clip_grad_norm(self) -> torch.Tensor:
        """Global pre-clip L2 norm over the sharded gradients (DTensor: partial sums all-reduced
        by ``full_tensor``), then torch's clip rule (coef = max_norm / (norm + 1e-6), at most 1),
        as torch.nn.utils.clip_grad_norm_ in the DDP engine (torchtitan ``clip_grad_norm_``)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        torch.nn.utils.clip_grads_with_norm_(params, self.spec.fixed.grad_clip, norm)
        return norm

    def train_step(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]], *, lr: float) -> StepOutput:
        n = len(microbatches)
        total = torch.zeros((), device=self.ctx.device)
        for i, (inputs, labels) in enumerate(microbatches):
            if not self.reduce_every_microbatch:
                self.model.set_requires_gradient_sync(i == n - 1)
            with phase("forward"):
                loss = self.loss_fn(self.model(inputs), labels) / n
            with phase("backward"):
                loss.backward()
            total += loss.detach()
        with phase("optimizer"):
            grad_norm = self._clip_grad_norm()
            set_lr(self.optimizer, lr)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        return StepOutput(loss=total, grad_norm=grad_norm)

    def save_checkpoint(self, path) -> None:
        """Model + AdamW state via torch distributed checkpoint: each rank writes its own DTensor
        shards (FSDP2's sharded state dict, no all-gather). Collective."""
        save_torch_checkpoint(self.model, self.optimizer, path, key="fsdp2")

    def load_checkpoint(self, path) -> None:
        load_torch_checkpoint(self.model, self.optimizer, path, key="fsdp2")


def build_trainer(spec: RunSpec, *, ctx: RankContext) -> FSDP2Trainer:
    return FSDP2Trainer(spec, ctx=ctx)
