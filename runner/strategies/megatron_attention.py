"""Megatron-core building blocks that keep the Megatron GPT on the same math as runner.model.

- ``SDPACoreAttention``: a drop-in for ``megatron.core.transformer.dot_product_attention.
  DotProductAttention`` (same ``__init__`` and ``forward`` signatures) that calls
  ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` -- the fused kernel the torch
  engines use -- instead of Megatron's local unfused baddbmm + softmax + bmm.
- ``SequenceParallelLayerNorm``: ``torch.nn.LayerNorm`` that marks its parameters
  ``sequence_parallel`` the way apex's ``FusedLayerNorm`` wrapper does, so
  ``finalize_model_grads`` sums their gradients over the TP group. Megatron's own fallback
  without TE/apex (``WrappedTorchNorm``) asserts ``not config.sequence_parallel``, so without it
  the local spec cannot run sequence parallelism (Korthikanti et al. 2022) at all.
- ``gelu_tanh``: the MLP activation, ``F.gelu(approximate='tanh')`` exactly as runner.model,
  where Megatron's bias-GELU fusion is off (with it on, Megatron's ``bias_gelu_impl`` computes
  the same tanh approximation; its constants equal sqrt(2/pi) to float32 precision).
- ``build_gpt_block_spec``: ``get_gpt_layer_local_spec()`` with those three substitutions, as a
  ``TransformerBlockSubmodules`` (the final LayerNorm is chosen there, not in the layer spec).

Deliberately not here: context parallelism, packed sequences, attention bias, padding masks
(the campaign trains on full-length causal sequences only).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.enums import AttnMaskType, LayerType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import divide


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation (GPT-2; runner.model.MLP)."""
    return F.gelu(x, approximate="tanh")


class SequenceParallelLayerNorm(torch.nn.LayerNorm):
    """LayerNorm built by Megatron's ``build_module(spec, config=, hidden_size=, eps=)``.

    With ``config.sequence_parallel`` each TP rank normalises its own slice of the sequence, so
    weight/bias gradients are partial sums; the ``sequence_parallel`` attribute tells
    ``megatron.core.distributed.finalize_model_grads`` to all-reduce them over the TP group
    (as ``megatron.core.fusions.fused_layer_norm.FusedLayerNorm`` does).
    """

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-5, **_unused) -> None:
        if config.normalization != "LayerNorm":
            raise ValueError(f"SequenceParallelLayerNorm supports LayerNorm only, not {config.normalization}")
        super().__init__(hidden_size, eps=eps, device="cpu" if config.use_cpu_initialization else None,
                         dtype=config.params_dtype)
        for p in (self.weight, self.bias):
            setattr(p, "sequence_parallel", config.sequence_parallel)


class SDPACoreAttention(MegatronModule):
    """Core attention through ``F.scaled_dot_product_attention``.

    forward(query, key, value [sq, b, heads_per_partition, head_dim], attention_mask ignored
    when causal) -> context [sq, b, heads_per_partition * head_dim]. Grouped-query attention is
    supported by repeating key/value heads, as DotProductAttention does. Softmax scale
    1/sqrt(head_dim) unless given (query-key layer scaling is a no-op for the product, since
    Megatron divides the scale by the layer number and multiplies the scores back in the
    softmax). Raises NotImplementedError for mask types other than causal / no_mask.
    """

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        cp_comm_type: Optional[str] = None,
        pg_collection: Optional[ProcessGroupCollection] = None,
    ) -> None:
        super().__init__(config=config)
        if config.context_parallel_size != 1:
            raise NotImplementedError("SDPACoreAttention does not implement context parallelism")
        if pg_collection is None:
            pg_collection = ProcessGroupCollection.use_mpu_process_groups(required_pgs=["tp"])
        tp_size = pg_collection.tp.size()
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        projection_size = config.kv_channels * config.num_attention_heads
        self.hidden_size_per_partition = divide(projection_size, tp_size)
        self.head_dim = divide(projection_size, config.num_attention_heads)
        self.num_heads_per_partition = divide(config.num_attention_heads, tp_size)
        self.num_query_groups_per_partition = divide(config.num_query_groups, tp_size)
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(self.head_dim)
        self.dropout_p = config.attention_dropout if attention_dropout is None else attention_dropout

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: Optional[torch.Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[torch.Tensor] = None,
        packed_seq_params: Optional[PackedSeqParams] = None,
    ) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SDPACoreAttention: packed sequences and attention bias are not supported")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if mask_type not in (AttnMaskType.causal, AttnMaskType.no_mask):
            raise NotImplementedError(f"SDPACoreAttention: mask type {mask_type} is not supported")
        repeat = self.num_heads_per_partition // self.num_query_groups_per_partition
        if repeat > 1:
            key = key.repeat_interleave(repeat, dim=2)
            value = value.repeat_interleave(repeat, dim=2)
        # [s, b, np, hn] -> [b, np, s, hn]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        # Dropout, if ever non-zero, draws from the default generator: SDPA exposes no generator
        # argument, so it is not forked through Megatron's CUDA RNG tracker.
        context = F.scaled_dot_product_attention(
            q, k, v, is_causal=mask_type == AttnMaskType.causal,
            dropout_p=self.dropout_p if self.training else 0.0, scale=self.softmax_scale,
        )
        # [b, np, s, hn] -> [s, b, np * hn]
        s, b = query.shape[0], query.shape[1]
        return context.permute(2, 0, 1, 3).reshape(s, b, self.hidden_size_per_partition)


def build_gpt_layer_spec() -> ModuleSpec:
    """``get_gpt_layer_local_spec()`` with SDPA core attention and sequence-parallel-aware
    LayerNorms; the linears stay Megatron's Column/RowParallelLinear."""
    spec = get_gpt_layer_local_spec()
    sub = spec.submodules
    sub.input_layernorm = SequenceParallelLayerNorm
    sub.pre_mlp_layernorm = SequenceParallelLayerNorm
    attn = sub.self_attention
    assert attn.params["attn_mask_type"] == AttnMaskType.causal
    attn.submodules.core_attention = SDPACoreAttention
    return spec


def build_gpt_block_spec(config: TransformerConfig, *, pp_rank: Optional[int] = None) -> TransformerBlockSubmodules:
    """The decoder block of this pipeline stage: its share of layers plus the final LayerNorm
    (built only on the last stage). ``pp_rank`` defaults to parallel_state's. With a custom
    pipeline layout (a planted uneven split) the count comes from the layout for ``pp_rank``:
    megatron-core 0.16's get_num_layers_to_build drops pp_rank on that path."""
    layout = config.pipeline_model_parallel_layout
    num_local = layout.get_num_layers_to_build(LayerType.decoder, pp_rank=pp_rank) if layout is not None \
        else get_num_layers_to_build(config, pp_rank=pp_rank)
    layer = build_gpt_layer_spec()
    return TransformerBlockSubmodules(layer_specs=[layer] * num_local, layer_norm=SequenceParallelLayerNorm)
