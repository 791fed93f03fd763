"""TP+PP [torch-native]: DTensor tensor parallelism inside torch.distributed.pipelining stages,
run by the 1F1B schedule or, where the layers divide, the interleaved 1F1B schedule.

Layout. world = dp_degree x pp_degree x tp_degree on a DeviceMesh with dims ("dp", "pp", "tp"),
tp innermost, so global rank = (dp * pp_degree + pp) * tp_degree + tp and adjacent ranks form a
TP group, as Megatron-LM orders them.

Tensor parallel (Shoeybi et al. 2019, "Megatron-LM", section 3), per Block, through
``parallelize_module``: attention ``qkv`` ColwiseParallel (weight [3H, H] -> [3H/tp, H]; its
output features are laid out (head, {q,k,v}, head_dim), so a column shard holds whole heads and
the attention infers num_heads/tp from the shard width), attention ``proj`` RowwiseParallel
([H, H] -> [H, H/tp], one all-reduce in forward), MLP ``fc`` Colwise ([F, H] -> [F/tp, H]) and
``proj`` Rowwise ([H, F] -> [H, F/tp]). Activations between blocks are plain replicated
tensors [mbs, T, H]. Embeddings, LayerNorms and the LM head stay replicated across TP: no
vocab-parallel embedding/loss and no sequence parallel (gloo has no reduce_scatter, which rules
sequence parallel out on CPU anyway).

Pipeline parallel (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters", section 2.2, 1F1B): ``PipelineStage`` + ``Schedule1F1B`` over the "pp" group with
num_microbatches >= pp_degree. The shared GPT (built whole with the campaign seed, so the
weights equal the DDP run's) is cut into S = pp_degree x v contiguous stages of num_layers/S
blocks (or, with v = 1, the run's planted ``plant.pp_layers`` blocks per stage, an uneven
split): stage 0 owns wte+wpe and its blocks, the last stage its blocks + ln_f + LM head.
``options.schedule = "Interleaved1F1B"`` (section 2.2.2) gives each rank v = ``virtual_stages``
chunks, rank r the stages r, r + p, ..., r + (v-1)p (torch's loop-style placement), run by
``ScheduleInterleaved1F1B``: the bubble shrinks to about (p-1)/(v·m) of the ideal time for v times
the stage-boundary traffic; runner.knobs.check_layout_knobs says where the stages allow it. The stage boundary
carries hidden states [mbs, T, H]. The tied embedding: the last stage holds its own copy of
wte's weight for the LM head; after backward the two copies' gradients are summed over the
{first, last} stage pair with the same (dp, tp) coordinates (Megatron-LM's embedding group), so
the copies stay equal. With pp_degree == 1 the stage is the whole GPT and the tie is the model's.

Data parallel: gradients averaged over the "dp" dim after backward (one flat all-reduce).

A "per-block" compile scope (runner.strategies.parity; on for CUDA) compiles each Block after
tensor parallelism is applied
(torchtitan's order); the pipeline machinery and the embedding/LM head stay eager.

Deliberately not here: zero-bubble / DualPipe schedules, overlap of the DP all-reduce with
backward, a distributed optimizer, activation checkpointing.
"""
from __future__ import annotations

import inspect

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from core.records import RunSpec
from runner.knobs import check_layout_knobs
from runner.model import GPT, count_params
from runner.strategies import RankContext, StepOutput
from runner.strategies.parity import build_loss_fn, spec_kernels
from runner.strategies.common import (
    TORCH_CHECKPOINT_FORMAT, apply_recompute, autocast, build_adamw, build_param_groups, gather_stage_num_layers,
    load_torch_checkpoint, phase, pipeline_layer_split, save_torch_checkpoint, set_lr,
)

# Megatron-LM split of one Block (paper section 3, figure 3): f before qkv/fc, g after the projections.
BLOCK_TP_PLAN = {
    "attn.qkv": ColwiseParallel(),
    "attn.proj": RowwiseParallel(),
    "mlp.fc": ColwiseParallel(),
    "mlp.proj": RowwiseParallel(),
}


class GPTStage(nn.Module):
    """One pipeline stage cut from a built GPT: tokens [mbs, T] int64 (first stage) or hidden
    [mbs, T, H] in; hidden [mbs, T, H] or logits [mbs, T, padded_vocab] (last stage) out."""

    def __init__(self, gpt: GPT, *, stage: int, split: tuple[int, ...], spec: RunSpec) -> None:
        """``split``: blocks per stage, all stages in order (common.pipeline_layer_split); this
        stage takes blocks sum(split[:stage]) .. + split[stage] - 1."""
        super().__init__()
        num_stages, start = len(split), sum(split[:stage])
        self.is_first, self.is_last = stage == 0, stage == num_stages - 1
        self.spec = spec
        self.wte = gpt.wte if self.is_first else None
        self.wpe = gpt.wpe if self.is_first else None
        self.blocks = nn.ModuleList(gpt.blocks[start : start + split[stage]])
        self.ln_f = gpt.ln_f if self.is_last else None
        self.lm_head = None
        if self.is_last:
            self.lm_head = gpt.lm_head  # tied to self.wte when the stage is also the first
            if not self.is_first:  # the untied copy of the embedding, same initial values
                self.lm_head.weight = nn.Parameter(gpt.wte.weight.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with autocast(self.spec, x.device):
            if self.is_first:
                x = self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device))
            for block in self.blocks:
                x = block(x)
            if self.is_last:
                x = self.lm_head(self.ln_f(x))
        return x


def _flat_all_reduce(tensors: list[torch.Tensor], group: dist.ProcessGroup, *, scale: float = 1.0) -> None:
    """Sum ``tensors`` in place over ``group`` with one collective, then multiply by ``scale``
    (gloo has no ReduceOp.AVG)."""
    if not tensors:
        return
    flat = torch.cat([t.reshape(-1) for t in tensors])
    dist.all_reduce(flat, group=group)
    flat.mul_(scale)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def build_tp_param_groups(module: nn.Module, *, weight_decay: float) -> list[dict]:
    """common.build_param_groups, split so no group mixes DTensor and plain-tensor parameters:
    the fused CUDA AdamW kernel refuses a mixed list ("got mixed torch.Tensor and DTensor")."""
    named = list(module.named_parameters())
    groups = [
        g
        for is_dtensor in (True, False)
        for g in build_param_groups([(n, p) for n, p in named if isinstance(p, DTensor) == is_dtensor],
                                    weight_decay=weight_decay)
    ]
    return [g for g in groups if g["params"]]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


class TPPPTorchTrainer:
    checkpoint_format = TORCH_CHECKPOINT_FORMAT

    def __init__(self, spec: RunSpec, *, ctx: RankContext) -> None:
        cfg = spec.fixed.model
        dp, pp, tp = spec.dp_degree, spec.pp_degree, spec.tp_degree
        problems = []
        if dp * pp * tp != ctx.world_size:
            problems.append(f"dp {dp} x pp {pp} x tp {tp} != world size {ctx.world_size}")
        planted = spec.plant is not None and spec.plant.pp_layers is not None
        if cfg.num_layers % pp and not planted:
            problems.append(f"num_layers {cfg.num_layers} is not divisible by pp_degree {pp}")
        if cfg.num_heads % tp or cfg.ffn_hidden_size % tp:
            problems.append(f"num_heads {cfg.num_heads} / ffn {cfg.ffn_hidden_size} not divisible by tp_degree {tp}")
        if spec.num_microbatches < pp:
            problems.append(f"1F1B needs num_microbatches >= pp_degree, got {spec.num_microbatches} < {pp}")
        schedule = str(spec.options.get("schedule", "1F1B"))
        v = int(spec.options.get("virtual_stages", 1))
        problems += check_layout_knobs({"schedule": schedule, "virtual_stages": v}, num_layers=cfg.num_layers,
                                       pp_degree=pp, num_microbatches=spec.num_microbatches, where="options")
        if planted and (schedule != "1F1B" or v != 1):
            problems.append(f"plant.pp_layers needs schedule '1F1B' with one chunk per rank, got {schedule!r}"
                            f" with virtual_stages {v}")
        if problems:
            raise ValueError("tp_pp/torch layout: " + "; ".join(problems))
        self.spec, self.ctx = spec, ctx
        self.mesh = init_device_mesh(ctx.device.type, (dp, pp, tp), mesh_dim_names=("dp", "pp", "tp"))
        self.dp_rank, self.dp_degree = self.mesh.get_local_rank("dp"), dp
        self.tp_rank, self.pp_rank = self.mesh.get_local_rank("tp"), self.mesh.get_local_rank("pp")

        gpt = GPT(cfg)  # whole model on every rank from the same seed: weights identical to DDP's
        self.num_params = count_params(gpt)
        self.num_params_position_embedding = gpt.wpe.weight.numel()
        self.engine_version = torch.__version__
        # this rank's chunks: stages pp_rank, pp_rank + pp, ... (v = 1: the one stage pp_rank)
        # blocks per stage: the even split of the S = pp * v stages, or the run's planted pp_layers
        split = pipeline_layer_split(spec, num_stages=pp * v)
        chunks = [GPTStage(gpt, stage=self.pp_rank + k * pp, split=split, spec=spec).to(ctx.device)
                  for k in range(v)]
        del gpt
        self.kernels = spec_kernels(spec.options, strategy=spec.strategy, engine=spec.engine, device=ctx.device.type,
                                    tp_degree=tp)
        loss_fn = build_loss_fn(self.kernels)
        for chunk in chunks:
            if tp > 1:
                for block in chunk.blocks:
                    parallelize_module(block, self.mesh["tp"], BLOCK_TP_PLAN)
            apply_recompute(chunk.blocks, spec)  # after TP (its plan names the block's own submodules)
            if self.kernels["compile"] == "per-block":
                for i, block in enumerate(chunk.blocks):
                    chunk.blocks[i] = torch.compile(block)
        self.stage_module = nn.ModuleList(chunks)  # every parameter of this rank, for the optimizer and norms
        # what was built, gathered: the run's record that a planted split is really in place
        self.pp_stage_num_layers = gather_stage_num_layers(
            sum(len(c.blocks) for c in chunks), group=self.mesh.get_group("pp"), device=ctx.device) if pp > 1 else None
        self.stages = [PipelineStage(chunk, self.pp_rank + k * pp, pp * v, ctx.device, group=self.mesh.get_group("pp"))
                       for k, chunk in enumerate(chunks)]
        self.is_first = any(stage.is_first for stage in self.stages)
        self.is_last = any(stage.is_last for stage in self.stages)
        # loss_fn = the run's loss per micro-batch; scale_grads divides the summed gradients by n (mean).
        if schedule == "Interleaved1F1B":
            self.schedule = ScheduleInterleaved1F1B(self.stages, n_microbatches=spec.num_microbatches, loss_fn=loss_fn)
        else:
            self.schedule = Schedule1F1B(self.stages[0], n_microbatches=spec.num_microbatches, loss_fn=loss_fn)
        # the last stage's outputs are the logits of the whole batch; merging them (torch.cat) only
        # copies them once more (13 GB at micro-batch 128 of the 125M preset), and nothing reads them
        self._step_kwargs = ({"return_outputs": False}
                             if "return_outputs" in inspect.signature(self.schedule.step).parameters else {})
        self.embedding_group = self._build_embedding_group() if pp > 1 else None
        self.optimizer = build_adamw(
            build_tp_param_groups(self.stage_module, weight_decay=spec.fixed.weight_decay), spec, device=ctx.device
        )

    def _build_embedding_group(self) -> dist.ProcessGroup | None:
        """{first stage, last stage} pairs with equal (dp, tp); every rank creates every pair
        (new_group is collective) and keeps its own."""
        ranks = self.mesh.mesh  # [dp, pp, tp] global ranks
        mine = None
        for d in range(ranks.shape[0]):
            for t in range(ranks.shape[2]):
                pair = [int(ranks[d, 0, t]), int(ranks[d, -1, t])]
                group = dist.new_group(pair)
                if self.ctx.rank in pair:
                    mine = group
        return mine

    def _embedding_copy(self) -> nn.Parameter | None:
        """The weight that holds this rank's copy of the tied embedding, if any (with pp > 1 no
        rank holds both the first and the last stage)."""
        for m in self.stage_module:
            if m.wte is not None:
                return m.wte.weight
            if m.lm_head is not None:
                return m.lm_head.weight
        return None

    @torch.no_grad()
    def _sync_grads(self) -> None:
        """Tied-embedding sum over the {first, last} pair, then the DP average."""
        tied = self._embedding_copy()
        if self.embedding_group is not None and tied is not None and tied.grad is not None:
            dist.all_reduce(tied.grad, group=self.embedding_group)
        if self.dp_degree > 1:
            grads = [_local(p.grad) for p in self.stage_module.parameters() if p.grad is not None]
            _flat_all_reduce(grads, self.mesh.get_group("dp"), scale=1.0 / self.dp_degree)

    @torch.no_grad()
    def _grad_norm(self) -> torch.Tensor:
        """Global pre-clip L2 norm, each unique parameter once:

            norm^2 = sum_pp sum_tp [ sum_{tp-sharded g} ||g_local||^2
                                     + [tp_rank == 0] * sum_{tp-replicated g} ||g||^2 ]

        where the last stage's copy of the tied embedding is left out when pp > 1 (stage 0
        counts it) and DP replicas, identical after the average, are not summed."""
        sharded = torch.zeros((), device=self.ctx.device, dtype=torch.float32)
        replicated = torch.zeros((), device=self.ctx.device, dtype=torch.float32)
        skip = {id(m.lm_head.weight) for m in self.stage_module if m.lm_head is not None and m.wte is None}
        for p in self.stage_module.parameters():
            if p.grad is None or id(p) in skip:
                continue
            g = p.grad
            sq = _local(g).float().pow(2).sum()
            if isinstance(g, DTensor) and any(isinstance(pl, Shard) for pl in g.placements):
                sharded += sq
            else:
                replicated += sq
        total = sharded + (replicated if self.tp_rank == 0 else torch.zeros_like(replicated))
        if self.spec.tp_degree > 1:
            dist.all_reduce(total, group=self.mesh.get_group("tp"))
        if self.spec.pp_degree > 1:
            dist.all_reduce(total, group=self.mesh.get_group("pp"))
        return total.sqrt()

    def train_step(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]], *, lr: float) -> StepOutput:
        if len(microbatches) != self.spec.num_microbatches:
            raise ValueError(f"expected {self.spec.num_microbatches} micro-batches, got {len(microbatches)}")
        # The schedule re-splits the whole batch along dim 0 into the same equal micro-batches.
        inputs = torch.cat([x for x, _ in microbatches])
        labels = torch.cat([y for _, y in microbatches])
        losses: list[torch.Tensor] = []
        args = (inputs,) if self.is_first else ()
        with phase("forward_backward"):
            if self.is_last:
                self.schedule.step(*args, target=labels, losses=losses, **self._step_kwargs)
            else:
                self.schedule.step(*args, **self._step_kwargs)
        with phase("optimizer"):
            self._sync_grads()
            grad_norm = self._grad_norm()
            # Same clip rule as torch.nn.utils.clip_grad_norm_ (the DDP engine's).
            clip_coef = torch.clamp(self.spec.fixed.grad_clip / (grad_norm + 1e-6), max=1.0)
            with torch.no_grad():
                for p in self.stage_module.parameters():
                    if p.grad is not None:
                        _local(p.grad).mul_(clip_coef)
            set_lr(self.optimizer, lr)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        loss = torch.stack(losses).mean().detach() if self.is_last else None
        return StepOutput(loss=loss, grad_norm=grad_norm)


    def save_checkpoint(self, path) -> None:
        """This stage's module + AdamW state via torch distributed checkpoint, under key
        ``stage<pp_rank>`` (stages reuse local block names): DTensor shards per TP rank, DP
        replicas written once. Collective over all ranks."""
        save_torch_checkpoint(self.stage_module, self.optimizer, path, key=f"stage{self.pp_rank}")

    def load_checkpoint(self, path) -> None:
        load_torch_checkpoint(self.stage_module, self.optimizer, path, key=f"stage{self.pp_rank}")


def build_trainer(spec: RunSpec, *, ctx: RankContext) -> TPPPTorchTrainer:
    return TPPPTorchTrainer(spec, ctx=ctx)
