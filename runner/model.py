"""The one GPT definition shared by the torch engines (DDP, DeepSpeed ZeRO-3, torch TP+PP).

GPT-2 architecture (pre-LayerNorm blocks, learned absolute positions, GELU-tanh MLP, tied
input/output embedding) with attention through ``F.scaled_dot_product_attention`` (causal),
the same fused kernel the Megatron engine's core-attention module calls.

The fused QKV projection lays its output features out as (head, {q,k,v}, head_dim) -- the
Megatron-LM layout -- so that sharding it column-wise for tensor parallelism gives each rank
whole heads. Deliberately not here: parallelism, precision policy, optimizer.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from core.perfmodel import count_model_params
from core.records import ModelConfig

INIT_STD = 0.02  # GPT-2 / nanoGPT initialisation


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.hidden_size % cfg.num_heads:
            raise ValueError(f"hidden_size {cfg.hidden_size} is not divisible by num_heads {cfg.num_heads}")
        self.head_dim = cfg.hidden_size // cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [batch, seq, hidden] -> [batch, seq, hidden]. Heads are inferred from the
        projection's (possibly tensor-parallel-sharded) output width."""
        b, t, _ = x.shape
        qkv = self.qkv(x).view(b, t, -1, 3, self.head_dim)
        q, k, v = (u.transpose(1, 2) for u in qkv.unbind(dim=3))  # [b, heads, t, head_dim]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size)
        self.proj = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.hidden_size)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.hidden_size)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2. forward(tokens [batch, seq] int64) -> logits [batch, seq, padded_vocab]."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.seq_length, cfg.hidden_size)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.ln_f = nn.LayerNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied; counted once
        init_gpt_weights(self, num_layers=cfg.num_layers)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def build_gpt(cfg: ModelConfig, *, device: torch.device, on_device: bool = False) -> GPT:
    """The GPT on ``device``, fp32. Default: weights drawn by the CPU generator from the seed the
    caller set, then moved, so every engine and device starts from the same values. on_device:
    the module is created on ``device`` and drawn by its own generator (the same distribution,
    other values, no host copy of the fp32 weights); the device holds the same fp32 model either
    way. Raises torch.OutOfMemoryError when the fp32 model does not fit ``device``."""
    if on_device:
        with torch.device(device):
            return GPT(cfg)
    return GPT(cfg).to(device)


def init_gpt_weights(module: nn.Module, *, num_layers: int) -> None:
    """GPT-2 init: N(0, 0.02) for linears/embeddings, residual projections scaled by
    1/sqrt(2L) (GPT-2 paper section 2.3; nanoGPT model.py), zero biases, unit LayerNorm."""
    for name, p in module.named_parameters():
        if name.endswith("bias"):
            nn.init.zeros_(p)
        elif "ln_" in name:
            nn.init.ones_(p)
        elif name.endswith("proj.weight"):
            nn.init.normal_(p, mean=0.0, std=INIT_STD / math.sqrt(2 * num_layers))
        else:
            nn.init.normal_(p, mean=0.0, std=INIT_STD)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy in fp32. logits [b, t, V], labels [b, t] -> scalar."""
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(0, 1))


def count_params(model: nn.Module) -> int:
    """Unique parameters (a tied weight counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


count_gpt_params = count_model_params  # its one home: core.perfmodel.count_model_params
