"""TP+PP [Megatron-core 0.16]: tensor parallelism (Shoeybi et al. 2019, section 3) with sequence
parallelism (Korthikanti et al. 2022; Narayanan et al. 2021 section 4.2 layout) inside a
pipeline run by Megatron's non-interleaved 1F1B schedule (Narayanan et al. 2021, section 2.2),
data-parallel over what is left (world = TP x PP x DP).

Layout. ``parallel_state.initialize_model_parallel(tp, pp)``: TP groups are consecutive ranks,
then PP, then DP (Megatron's default order "tp-cp-ep-dp-pp"). Each rank holds layers
[pp_rank * L/pp, (pp_rank+1) * L/pp), or, for a run with a planted uneven split
(``plant.pp_layers``), that many layers per stage through Megatron's custom pipeline layout
(``TransformerConfig.pipeline_model_parallel_layout``, e.g. "Et|tttL" for [1, 3]); the first
stage the word + position embeddings, the last the final LayerNorm and the LM head, which
with pp > 1 is a *copy* of the tied word embedding
(initialised from stage 0 by an all-reduce, its gradient summed with stage 0's in
``finalize_model_grads``). Within a stage, QKV and fc1 are column-parallel (each rank whole
heads), proj and fc2 row-parallel, the vocabulary split across TP ranks; activations between
blocks are [s/tp, b, h] (sequence parallel) when tp > 1.

Shapes. The training loop hands each rank its DP slice: ``num_microbatches`` pairs
(inputs [mbs, T], labels [mbs, T]) int64 on device. GPTModel takes input_ids / position_ids
[mbs, T] and labels [mbs, T] and returns the per-token cross entropy [mbs, T] in fp32
(vocab-parallel cross entropy on logits cast to fp32), so logits are never gathered over TP.
attention_mask is None: the SDPA core applies causality itself.

Math matches runner.model.GPT: pre-LN blocks, LayerNorm eps 1e-5, GELU-tanh, biases on every
linear, learned absolute positions, tied embedding, QKV output features laid out
(head, {q,k,v}, head_dim) in both, init N(0, 0.02) with residual projections scaled by
1/sqrt(2L), dropout 0; attention through ``F.scaled_dot_product_attention`` (see
megatron_attention). ``map_gpt_state_to_megatron`` copies a runner.model.GPT state dict into
any TP/PP shard of this model; by default (``options.init = "runner"``) the trainer starts from
exactly the torch engines' initial weights, ``"megatron"`` keeps Megatron's own init (same
distributions, other draws; Megatron-LM's per-stage seed offset of 100 x pp_rank).

Loss and gradient. loss_func returns (mean token loss of the micro-batch, {...}); Megatron 0.16
(``schedules.forward_step_calc_loss``, 2-tuple branch) divides it by num_microbatches before
backward, and its DDP pre-scales gradients by 1/dp (``calculate_per_token_loss=False``,
``average_in_collective=False``), so the gradient is that of the mean token loss over the
global batch -- the same objective as the DDP trainer (every micro-batch has mbs*T tokens).

Mixed precision, the Megatron way: bf16 parameters under ``Float16Module`` (outputs upcast to
fp32 on the last stage, except the logits handed to the shared loss: bf16, as in the other
engines), gradients reduced in fp32 (``grad_reduce_in_fp32``), fp32 master
weights in ``Float16OptimizerWithFloat16Params`` (or the ``DistributedOptimizer`` when
``options.use_distributed_optimizer``). Without TE/apex, ``get_megatron_optimizer`` 0.16.1
falls back to ``torch.optim.AdamW`` (``OptimizerConfig.decoupled_weight_decay=True``, the
default; constructed without ``fused=``, so torch would pick its foreach kernel; with
``options.fused_adamw`` (default on) ``use_fused_adamw`` switches it to the fused kernel the torch
engines use): decoupled AdamW weight decay, as the torch engines. Megatron
puts biases and 1-D parameters in a group with ``wd_mult=0`` but leaves that group's
``weight_decay`` at the default -- its OptimizerParamScheduler applies ``wd_mult`` every step;
we do the same in ``_set_lr_and_wd``, giving nanoGPT's grouping (decay on matrices only).
Gradient clipping to ``grad_clip`` and the pre-clip global norm (tied and TP-duplicate
parameters counted once) come from ``optimizer.step()``.

Deliberately not here: Transformer Engine, apex, FP8, the interleaved (virtual-pipeline)
schedule, context / expert parallelism, activation recomputation, uneven pipeline splits other than a
planted one.
Megatron's schedules need CUDA: this engine runs on GPU only; on CPU the torch TP+PP engine
runs the same layout.
"""
from __future__ import annotations

from functools import partial

import torch
import torch.distributed as dist
import torch.nn.functional as F

from core.records import ModelConfig, RunSpec
from runner.strategies import RankContext, StepOutput
from runner.membudget import INIT_ON_DEVICE_KEY
from runner.strategies.megatron_attention import build_gpt_block_spec, gelu_tanh
from runner.strategies.common import gather_stage_num_layers, phase, pipeline_layer_split

INIT_STD = 0.02


def pipeline_layout(pp_layers: tuple[int, ...]) -> str:
    """Megatron's custom pipeline layout string for ``pp_layers`` transformer layers per stage:
    "E" (embedding) on the first stage, "t" per decoder layer, "L" (loss) on the last, stages
    split by "|" (megatron.core.transformer.pipeline_parallel_layer_layout, parse_str_to_list).
    [1, 3] -> "Et|tttL"."""
    return "E" + "|".join("t" * n for n in pp_layers) + "L"


def build_transformer_config(
    cfg: ModelConfig, *, dtype: str, tp_degree: int, pp_degree: int, pp_layers: tuple[int, ...] | None = None,
    use_cpu_initialization: bool = False, fused_bias_ops: bool = False, recompute: str = "none",
):
    """The TransformerConfig matching runner.model.GPT(cfg). ``dtype``: "bf16" | "fp32".

    Sequence parallelism is on whenever tp_degree > 1 (Megatron's guidance; it cannot be on
    at tp 1). ``pp_layers``: layers per pipeline stage (a planted uneven split, as
    ``pipeline_model_parallel_layout``); None: Megatron's even split. ``use_cpu_initialization``
    is for CPU tests only. ``fused_bias_ops`` (Megatron-LM's default; the engine sets it on
    CUDA): the MLP's bias + GELU and each residual's bias + dropout + add as Megatron's own fused
    functions (``megatron.core.fusions``, compiled by its jit_fuser, torch.compile); the fused
    GELU is the tanh approximation, its constants sqrt(2/pi) and 0.044715 to float32 precision,
    selected by ``activation_func=F.gelu``. Off: ``gelu_tanh`` and unfused adds. ``recompute``
    "full": Megatron's full activation recomputation, every layer (granularity "full", method
    "uniform", one layer per checkpoint: only each layer's input is kept); "none": off."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    bf16 = dtype == "bf16"
    params_dtype = torch.bfloat16 if bf16 else torch.float32
    return TransformerConfig(
        num_layers=cfg.num_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_heads,
        ffn_hidden_size=cfg.ffn_hidden_size,
        tensor_model_parallel_size=tp_degree,
        pipeline_model_parallel_size=pp_degree,
        sequence_parallel=tp_degree > 1,
        normalization="LayerNorm",
        layernorm_epsilon=1e-5,
        activation_func=F.gelu if fused_bias_ops else gelu_tanh,
        bias_activation_fusion=fused_bias_ops,
        gated_linear_unit=False,
        add_bias_linear=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=INIT_STD,  # output_layer_init_method defaults to std / sqrt(2L)
        bf16=bf16,
        params_dtype=params_dtype,
        pipeline_dtype=params_dtype,
        use_cpu_initialization=use_cpu_initialization,
        masked_softmax_fusion=False,
        bias_dropout_fusion=fused_bias_ops,
        gradient_accumulation_fusion=False,  # needs apex's fused_weight_gradient_mlp_cuda
        deallocate_pipeline_outputs=True,  # Megatron-LM's default: free sent activations early
        calculate_per_token_loss=False,
        pipeline_model_parallel_layout=pipeline_layout(pp_layers) if pp_layers is not None else None,
        **({"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
           if recompute == "full" else {}),
    )


def build_gpt_model(cfg: ModelConfig, config, *, pp_rank: int | None = None):
    """GPTModel for this rank's pipeline stage (parallel_state must be initialised)."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel

    rank = parallel_state.get_pipeline_model_parallel_rank() if pp_rank is None else pp_rank
    return GPTModel(
        config=config,
        transformer_layer_spec=build_gpt_block_spec(config, pp_rank=rank),
        vocab_size=cfg.padded_vocab_size,
        max_sequence_length=cfg.seq_length,
        pre_process=rank == 0,
        post_process=rank == config.pipeline_model_parallel_size - 1,
        parallel_output=True,
        share_embeddings_and_output_weights=True,
        position_embedding_type="learned_absolute",
    )


def count_local_params(model: torch.nn.Module, *, tp_rank: int) -> tuple[int, int]:
    """(parameters, position-embedding parameters) this rank contributes to the whole-model
    count: TP-sharded parameters always, TP-replicated ones (LayerNorms, row-parallel biases,
    position embedding) on TP rank 0 only, the last stage's copy of the tied embedding never
    (Megatron marks it ``shared``). Summed over the model-parallel group this equals
    runner.model.count_gpt_params."""
    total = pos = 0
    for name, p in {id(p): (n, p) for n, p in model.named_parameters()}.values():
        if getattr(p, "shared", False):
            continue
        if not getattr(p, "tensor_model_parallel", False) and tp_rank != 0:
            continue
        total += p.numel()
        if name.endswith("position_embeddings.weight"):
            pos += p.numel()
    return total, pos


def map_gpt_state_to_megatron(
    gpt_state: dict[str, torch.Tensor], cfg: ModelConfig, *, tp_rank: int, tp_degree: int, pp_rank: int, pp_degree: int,
    pp_layers: tuple[int, ...] | None = None,
) -> dict[str, torch.Tensor]:
    """runner.model.GPT state dict -> the state dict of this (tp_rank, pp_rank) GPTModel shard.

    Column-parallel weights/biases (qkv, fc1, word embedding / LM head) are cut along dim 0,
    row-parallel weights (proj, fc2) along dim 1; both models lay QKV out as
    (head, {q,k,v}, head_dim), so a contiguous cut gives each rank whole heads. Layers split
    evenly over stages, or ``pp_layers`` per stage. Raises ValueError when the shape does not
    divide or pp_layers does not cover the layers."""
    L = cfg.num_layers
    if pp_layers is not None and (len(pp_layers) != pp_degree or min(pp_layers) < 1 or sum(pp_layers) != L):
        raise ValueError(f"pp_layers {list(pp_layers)} must give each of {pp_degree} stages >= 1 layer, {L} in all")
    split = tuple(pp_layers) if pp_layers is not None else (L // pp_degree,) * pp_degree
    if (pp_layers is None and L % pp_degree) or cfg.num_heads % tp_degree or cfg.padded_vocab_size % tp_degree:
        raise ValueError(f"layers {L} / heads {cfg.num_heads} / vocab {cfg.padded_vocab_size} "
                         f"do not divide by pp {pp_degree} / tp {tp_degree}")

    def col(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp_degree, dim=0)[tp_rank].clone()

    def row(t: torch.Tensor) -> torch.Tensor:
        return t.chunk(tp_degree, dim=1)[tp_rank].clone()

    out: dict[str, torch.Tensor] = {}
    if pp_rank == 0:
        out["embedding.word_embeddings.weight"] = col(gpt_state["wte.weight"])
        out["embedding.position_embeddings.weight"] = gpt_state["wpe.weight"].clone()
    first = sum(split[:pp_rank])
    for local in range(split[pp_rank]):
        src, dst = f"blocks.{first + local}.", f"decoder.layers.{local}."
        for a, b, split in (
            ("ln_1.weight", "input_layernorm.weight", None), ("ln_1.bias", "input_layernorm.bias", None),
            ("attn.qkv.weight", "self_attention.linear_qkv.weight", col),
            ("attn.qkv.bias", "self_attention.linear_qkv.bias", col),
            ("attn.proj.weight", "self_attention.linear_proj.weight", row),
            ("attn.proj.bias", "self_attention.linear_proj.bias", None),
            ("ln_2.weight", "pre_mlp_layernorm.weight", None), ("ln_2.bias", "pre_mlp_layernorm.bias", None),
            ("mlp.fc.weight", "mlp.linear_fc1.weight", col), ("mlp.fc.bias", "mlp.linear_fc1.bias", col),
            ("mlp.proj.weight", "mlp.linear_fc2.weight", row), ("mlp.proj.bias", "mlp.linear_fc2.bias", None),
        ):
            t = gpt_state[src + a]
            out[dst + b] = split(t) if split else t.clone()
    if pp_rank == pp_degree - 1:
        out["decoder.final_layernorm.weight"] = gpt_state["ln_f.weight"].clone()
        out["decoder.final_layernorm.bias"] = gpt_state["ln_f.bias"].clone()
        if pp_degree > 1:  # the last stage's copy of the tied embedding
            out["output_layer.weight"] = col(gpt_state["wte.weight"])
    return out


def use_fused_adamw(optimizer) -> int:
    """Switch every torch AdamW under a Megatron optimizer wrapper (Float16Optimizer /
    DistributedOptimizer / ChainedOptimizer) to torch's fused CUDA kernel, which Megatron without
    TE/apex never asks for (it builds ``torch.optim.AdamW`` without ``fused=``, so torch picks
    foreach). Same update rule; returns the number of param groups switched. The fp32 master
    parameters it steps are CUDA tensors, which the fused kernel requires."""
    stack, n = [optimizer], 0
    while stack:
        opt = stack.pop()
        stack.extend(getattr(opt, "chained_optimizers", []) or [])
        inner = getattr(opt, "optimizer", None)
        if isinstance(inner, torch.optim.AdamW):
            for group in inner.param_groups:
                group["fused"], group["foreach"] = True, False
                n += 1
            inner.defaults["fused"], inner.defaults["foreach"] = True, False
        elif inner is not None and inner is not opt:
            stack.append(inner)
    return n


def _forward_step(data_iterator, model, *, position_ids: torch.Tensor, shared_loss=None):
    """Megatron forward_step_func: (per-token loss [mbs, T] fp32 on the last stage, else the
    stage's hidden states; the loss reducer). With ``shared_loss`` (parity kernels, TP = 1) the
    model runs without labels, so the last stage returns whole logits [mbs, T, V] (GPTModel
    transposes them batch-first) and the shared loss (runner.strategies.parity) reduces them."""
    inputs, labels = next(data_iterator)
    if shared_loss is None:
        output = model(input_ids=inputs, position_ids=position_ids, attention_mask=None, labels=labels)
        return output, _loss_func
    # bf16 logits into the shared loss, as the other engines hand it theirs (it computes in fp32
    # inside): Float16Module would otherwise upcast the [mbs, T, V] logits to fp32, a copy of
    # twice their size and its backward
    from megatron.core.transformer.module import Float16Module

    kwargs = {"fp32_output": False} if isinstance(_unwrap_ddp(model), Float16Module) else {}
    output = model(input_ids=inputs, position_ids=position_ids, attention_mask=None, **kwargs)
    return output, partial(_shared_loss_func, labels=labels, shared_loss=shared_loss)


def _unwrap_ddp(model):
    return getattr(model, "module", model)


def _shared_loss_func(logits: torch.Tensor, *, labels: torch.Tensor, shared_loss):
    loss = shared_loss(logits, labels)
    return loss, {"lm loss": loss.detach().clone()}


def _loss_func(per_token_loss: torch.Tensor):
    loss = per_token_loss.float().mean()
    # the schedule divides the returned loss in place, so report a copy
    return loss, {"lm loss": loss.detach().clone()}


def _planted_pp_layers(spec: RunSpec) -> tuple[int, ...] | None:
    """The run's planted layers per stage (core.records.Plant.pp_layers), or None: the even split."""
    return pipeline_layer_split(spec) if spec.plant is not None and spec.plant.pp_layers is not None else None


def _load_runner_gpt_init(model: torch.nn.Module, spec: RunSpec, *, tp_rank: int, pp_rank: int) -> None:
    """Overwrite this shard with the initial weights of runner.model.GPT under the campaign
    seed -- bit for bit the DDP / ZeRO-3 / torch TP+PP engines' start (built on CPU after
    ``torch.manual_seed(seed)``, as runner.train does) -- so loss curves compare from step 0.
    In bf16 the fp32 master copies are then made from the bf16 parameters, as Megatron always
    does (its own init also lands in bf16 first)."""
    from runner.model import GPT

    cpu_rng = torch.get_rng_state()
    torch.manual_seed(spec.fixed.seed)
    gpt_state = GPT(spec.fixed.model).state_dict()
    torch.set_rng_state(cpu_rng)
    shard = map_gpt_state_to_megatron(gpt_state, spec.fixed.model, tp_rank=tp_rank, tp_degree=spec.tp_degree,
                                      pp_rank=pp_rank, pp_degree=spec.pp_degree, pp_layers=_planted_pp_layers(spec))
    missing, unexpected = model.load_state_dict(shard, strict=False)
    missing = [k for k in missing if not k.endswith("_extra_state")]
    if missing or unexpected:
        raise RuntimeError(f"weight mapping mismatch: missing {missing}, unexpected {unexpected}")


# Megatron-LM's dist-checkpoint metadata (training/checkpointing._build_sharded_state_dict_metadata):
# the distributed optimizer's "dp_reshardable" layout -- every DP rank saves and loads its own
# buffer shard, no gather -- for a restore into the same layout, as here.
DIST_CKPT_METADATA = {"distrib_optim_sharding_type": "dp_reshardable", "singleton_local_shards": False,
                      "chained_optim_avoid_prefix": True}


class MegatronTPPPTrainer:
    checkpoint_format = "megatron.dist_checkpointing"

    def __init__(self, spec: RunSpec, *, ctx: RankContext) -> None:
        from megatron.core import __version__ as mcore_version
        from megatron.core import parallel_state, tensor_parallel
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.pipeline_parallel import get_forward_backward_func
        from megatron.core.transformer.module import Float16Module

        if ctx.device.type != "cuda":
            raise RuntimeError("the Megatron TP+PP engine needs CUDA; use engine 'torch' on CPU")
        f, cfg = spec.fixed, spec.fixed.model
        self.spec, self.ctx = spec, ctx
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=spec.tp_degree, pipeline_model_parallel_size=spec.pp_degree
        )
        pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        # Megatron-LM (_set_random_seed) offsets by stage so stages do not draw identical layers.
        torch.manual_seed(f.seed + 100 * pp_rank)
        tensor_parallel.model_parallel_cuda_manual_seed(f.seed + 100 * pp_rank)

        self.config = build_transformer_config(cfg, dtype=f.dtype, tp_degree=spec.tp_degree, pp_degree=spec.pp_degree,
                                               pp_layers=_planted_pp_layers(spec), fused_bias_ops=True,
                                               recompute=str(spec.options.get("recompute", "none")))
        model = build_gpt_model(cfg, self.config, pp_rank=pp_rank)
        # what was built, gathered over the pipeline: the run's record of its stage split
        self.pp_stage_num_layers = gather_stage_num_layers(
            len(model.decoder.layers), group=parallel_state.get_pipeline_model_parallel_group(),
            device=ctx.device) if spec.pp_degree > 1 else None
        # a capacity trial (INIT_ON_DEVICE_KEY) takes Megatron's own init, drawn per stage on the device
        init = "megatron" if spec.options.get(INIT_ON_DEVICE_KEY) else spec.options.get("init", "runner")
        if init == "runner":
            _load_runner_gpt_init(model, spec, tp_rank=tp_rank, pp_rank=pp_rank)
        elif init != "megatron":
            raise ValueError(f"options.init must be 'runner' or 'megatron', not {init!r}")
        model.cuda(torch.cuda.current_device())
        counts = torch.tensor(count_local_params(model, tp_rank=tp_rank), dtype=torch.int64, device=ctx.device)
        dist.all_reduce(counts, group=parallel_state.get_model_parallel_group())
        self.num_params, self.num_params_position_embedding = (int(c) for c in counts.tolist())

        if self.config.bf16:
            model = Float16Module(self.config, model)
        opts = spec.options
        use_dist_opt = bool(opts.get("use_distributed_optimizer", False))
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=bool(opts.get("grad_reduce_in_fp32", True)),
            overlap_grad_reduce=bool(opts.get("overlap_grad_reduce", True)), use_distributed_optimizer=use_dist_opt,
            # the distributed optimizer's parameter all-gather in the next forward's pre-hooks
            **({"overlap_param_gather": True} if opts.get("overlap_param_gather", False) else {}),
        )
        self.model = DistributedDataParallel(self.config, ddp_config, model)
        # what Megatron-LM's training.setup_model_and_optimizer wires into the config
        self.config.no_sync_func = self.model.no_sync
        self.config.grad_sync_func = self.model.start_grad_sync
        self.config.finalize_model_grads_func = finalize_model_grads

        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam", lr=f.lr, min_lr=f.min_lr, weight_decay=f.weight_decay,
                adam_beta1=f.adam_beta1, adam_beta2=f.adam_beta2, adam_eps=1e-8, clip_grad=f.grad_clip,
                bf16=self.config.bf16, params_dtype=self.config.params_dtype,
                use_distributed_optimizer=use_dist_opt,
            ),
            [self.model],
        )
        if opts.get("fused_adamw", True) and ctx.device.type == "cuda":
            use_fused_adamw(self.optimizer)
        # kernels (runner.strategies.parity): at TP = 1 in parity mode the shared loss on the last
        # stage's logits; otherwise Megatron's own vocab-parallel cross entropy
        from runner.strategies.parity import build_loss_fn, spec_kernels

        self.kernels = spec_kernels(opts, strategy=spec.strategy, engine=spec.engine, device=ctx.device.type,
                                    tp_degree=spec.tp_degree)
        self._shared_loss = (None if self.kernels["loss"] == "megatron-vocab-parallel"
                             else build_loss_fn(self.kernels))
        self._forward_backward = get_forward_backward_func()
        self._position_ids = torch.arange(cfg.seq_length, device=ctx.device).unsqueeze(0).expand(
            spec.micro_batch_size, -1
        )
        self.is_last_stage = parallel_state.is_pipeline_last_stage()
        self.engine_version = mcore_version
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_degree = parallel_state.get_data_parallel_world_size()
        if self.dp_degree != spec.dp_degree:
            raise RuntimeError(f"Megatron's DP degree {self.dp_degree} != spec.dp_degree {spec.dp_degree}")

    def _set_lr_and_wd(self, lr: float) -> None:
        """What OptimizerParamScheduler.step does: lr * lr_mult, weight_decay * wd_mult."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = self.spec.fixed.weight_decay * group.get("wd_mult", 1.0)

    def train_step(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]], *, lr: float) -> StepOutput:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        with phase("forward_backward"):
            losses = self._forward_backward(
                forward_step_func=partial(_forward_step, position_ids=self._position_ids,
                                          shared_loss=self._shared_loss),
                data_iterator=iter(microbatches),
                model=[self.model],
                num_microbatches=len(microbatches),
                seq_length=self.spec.fixed.model.seq_length,
                micro_batch_size=self.spec.micro_batch_size,
                forward_only=False,
            )
        with phase("optimizer"):
            self._set_lr_and_wd(lr)
            update_successful, grad_norm, _ = self.optimizer.step()
        if not update_successful:  # only possible with fp16 loss scaling, which we never use
            raise RuntimeError("Megatron optimizer skipped the update")
        loss = torch.stack([d["lm loss"] for d in losses]).mean() if self.is_last_stage else None
        return StepOutput(loss=loss, grad_norm=grad_norm)


    def _sharded_state_dict(self, *, is_loading: bool) -> dict:
        """{"model": GPTModel.sharded_state_dict, "optimizer": optimizer.sharded_state_dict(...)}
        as Megatron-LM builds it (training/checkpointing.generate_state_dict on the unwrapped
        model): ShardedTensors with global offsets per TP shard and PP stage."""
        from megatron.core.utils import unwrap_model

        state = {"model": unwrap_model(self.model).sharded_state_dict(metadata=dict(DIST_CKPT_METADATA))}
        state["optimizer"] = self.optimizer.sharded_state_dict(state, is_loading=is_loading,
                                                               metadata=dict(DIST_CKPT_METADATA))
        return state

    def save_checkpoint(self, path) -> None:
        """Megatron's dist_checkpointing (torch_dist backend), saves spread over the DP replicas
        (FullyParallelSaveStrategyWrapper, Megatron-LM's --ckpt-fully-parallel-save default).
        ``path`` must exist. Collective."""
        from megatron.core import dist_checkpointing, parallel_state
        from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
        from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

        strategy = FullyParallelSaveStrategyWrapper(
            get_default_save_sharded_strategy(), parallel_state.get_data_parallel_group(with_context_parallel=True))
        dist_checkpointing.save(self._sharded_state_dict(is_loading=False), str(path), sharded_strategy=strategy)

    def load_checkpoint(self, path) -> None:
        """dist_checkpointing.load into this layout's sharded state dict, then the model's and the
        optimizer's load_state_dict (Megatron-LM's load_checkpoint order). Collective."""
        from megatron.core import dist_checkpointing
        from megatron.core.utils import unwrap_model

        state = dist_checkpointing.load(self._sharded_state_dict(is_loading=True), str(path))
        missing, unexpected = unwrap_model(self.model).load_state_dict(state["model"], strict=False)
        missing = [k for k in missing if not k.endswith("_extra_state")]
        if missing or unexpected:
            raise RuntimeError(f"checkpoint {path}: model keys missing {missing[:4]}, unexpected {unexpected[:4]}")
        self.optimizer.load_state_dict(state["optimizer"])


def build_trainer(spec: RunSpec, *, ctx: RankContext) -> MegatronTPPPTrainer:
    return MegatronTPPPTrainer(spec, ctx=ctx)
