"""Transformer shapes for planning: parameter counts and FLOPs of published models.

A ``ModelShape`` describes a decoder-only transformer well enough to size its memory and
compute (GPT-2/GPT-3 style: GELU MLP, biases, learned positions, tied embedding; Llama
style: SwiGLU MLP, grouped-query attention, RoPE, no biases, untied output layer; optional
mixture-of-experts MLP). ``SHAPES`` holds the configurations the planner's worked examples
use, each with its source. Deliberately not here: memory (runner.memory), time
(runner.perfmodel), the torch model itself (runner.model).
"""
from __future__ import annotations

from dataclasses import dataclass

from core.errors import ConfigError
from runner.presets import PRESETS, pad_vocab


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A decoder-only transformer's shape.

    num_kv_heads: key/value heads (== num_heads without grouped-query attention).
    vocab_size: the embedding rows as trained (padded where the trainer pads).
    gated_mlp: SwiGLU (three H x F matrices) instead of GELU (two).
    max_position_embeddings: rows of a learned position embedding (GPT-2); None for RoPE.
    bias: linear and LayerNorm biases (GPT-2); False = bias-free linears and RMSNorm (Llama).
    dropout: dropout masks are stored for backward (Korthikanti et al. 2022 count them).
    num_experts / moe_top_k: mixture-of-experts MLP (1 / 1 = dense).
    source: where the configuration comes from.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    gated_mlp: bool = False
    tied_embedding: bool = True
    max_position_embeddings: int | None = None
    bias: bool = True
    dropout: bool = False
    num_experts: int = 1
    moe_top_k: int = 1
    source: str = ""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_hidden_size(self) -> int:
        """num_kv_heads x head_dim: the width of K (and of V)."""
        return self.num_kv_heads * self.head_dim


def check_shape(shape: ModelShape) -> None:
    """Raise ConfigError naming every field that makes the shape impossible."""
    problems = [f"{k} must be >= 1, got {getattr(shape, k)}" for k in
                ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size",
                 "num_experts", "moe_top_k") if getattr(shape, k) < 1]
    if not problems:
        if shape.hidden_size % shape.num_heads:
            problems.append(f"--hidden {shape.hidden_size} is not divisible by --heads {shape.num_heads}")
        if shape.num_heads % shape.num_kv_heads:
            problems.append(f"--heads {shape.num_heads} is not divisible by --kv-heads {shape.num_kv_heads}")
        if shape.moe_top_k > shape.num_experts:
            problems.append(f"moe_top_k {shape.moe_top_k} exceeds --moe-experts {shape.num_experts}")
    if problems:
        raise ConfigError("; ".join(problems))


def _gpt125m() -> ModelShape:
    p = PRESETS["gpt-125m"]
    return ModelShape(
        name="gpt-125m", num_layers=p.num_layers, hidden_size=p.hidden_size, num_heads=p.num_heads,
        num_kv_heads=p.num_heads, ffn_hidden_size=p.ffn_hidden_size,
        vocab_size=pad_vocab(p.vocab_size, max_tp_degree=1), max_position_embeddings=p.seq_length,
        source="GPT-2 small (Radford et al. 2019); runner.presets gpt-125m, vocab padded to 128 as the campaigns do")


SHAPES: dict[str, ModelShape] = {
    "gpt-125m": _gpt125m(),
    "gpt3-175b": ModelShape(
        name="gpt3-175b", num_layers=96, hidden_size=12288, num_heads=96, num_kv_heads=96, ffn_hidden_size=49152,
        vocab_size=51200, max_position_embeddings=2048, dropout=True,
        source="GPT-3 175B (Brown et al. 2020, Table 2.1); the model of Korthikanti et al. 2022, Table 3"),
    "llama2-70b": ModelShape(
        name="llama2-70b", num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8, ffn_hidden_size=28672,
        vocab_size=32000, gated_mlp=True, tied_embedding=False, bias=False,
        source="Llama 2 70B (Touvron et al. 2023; params.json of the released weights)"),
    "llama3-405b": ModelShape(
        name="llama3-405b", num_layers=126, hidden_size=16384, num_heads=128, num_kv_heads=8, ffn_hidden_size=53248,
        vocab_size=128256, gated_mlp=True, tied_embedding=False, bias=False,
        source="Llama 3 405B (Dubey et al. 2024, Table 3)"),
    "gpt-1t": ModelShape(
        name="gpt-1t", num_layers=128, hidden_size=25600, num_heads=160, num_kv_heads=160, ffn_hidden_size=102400,
        vocab_size=51200, max_position_embeddings=2048, dropout=True,
        source="the 1T GPT of Narayanan et al. 2021 (Table 1: 128 layers, hidden 25600, 160 heads; GPT-3 vocab)"),
}


def lookup_shape(name: str) -> ModelShape:
    """A published shape by name. Raises ConfigError listing the known names."""
    if name not in SHAPES:
        raise ConfigError(f"--model {name!r}: unknown; choose one of {', '.join(SHAPES)} or give --layers --hidden "
                          "--heads --ffn --vocab")
    return SHAPES[name]


def count_mlp_params(shape: ModelShape) -> int:
    """One MLP (one expert): 2HF (GELU) or 3HF (SwiGLU), + F + H biases (GELU) or 2F + H (SwiGLU)."""
    h, f = shape.hidden_size, shape.ffn_hidden_size
    return (3 if shape.gated_mlp else 2) * h * f + ((2 * f if shape.gated_mlp else f) + h if shape.bias else 0)


def count_layer_params(shape: ModelShape, *, active: bool = False) -> int:
    """Parameters of one transformer layer: attention H(H + 2H_kv) + H^2 (+ H + 2H_kv + H
    biases), the MLP (count_mlp_params; x num_experts for MoE, or x moe_top_k with
    active=True: the experts one token's compute touches), two norms (2H each with bias:
    LayerNorm; H: RMSNorm) and, for MoE, the H x E router. For gpt-125m this equals
    runner.model.count_gpt_params's per-block term 4H^2+4H + 2HF+F+H + 4H.
    """
    h, hkv = shape.hidden_size, shape.kv_hidden_size
    attention = h * (h + 2 * hkv) + h * h + ((h + 2 * hkv) + h if shape.bias else 0)
    norms = 2 * (2 * h if shape.bias else h)
    if shape.num_experts == 1:
        return attention + count_mlp_params(shape) + norms
    experts = shape.moe_top_k if active else shape.num_experts
    return attention + experts * count_mlp_params(shape) + norms + h * shape.num_experts


def count_embedding_params(shape: ModelShape) -> dict[str, int]:
    """Parameters outside the layers: input embedding, output layer (0 when tied), learned
    position embedding (0 for RoPE), final norm."""
    h = shape.hidden_size
    return {"embedding": shape.vocab_size * h, "output": 0 if shape.tied_embedding else shape.vocab_size * h,
            "position": (shape.max_position_embeddings or 0) * h, "final_norm": 2 * h if shape.bias else h}


def count_params(shape: ModelShape) -> int:
    """All parameters, a tied embedding counted once (every expert of an MoE model)."""
    return shape.num_layers * count_layer_params(shape) + sum(count_embedding_params(shape).values())


def compute_layer_flops_per_token(shape: ModelShape, *, seq_length: int) -> float:
    """One layer's training FLOPs per token: 6 x its active parameters (forward 2, backward 4)
    + 12·H·T for attention scores and values over the full T x T matrix (PaLM, Chowdhery et
    al. 2022, appendix B)."""
    return float(6 * count_layer_params(shape, active=True) + 12 * shape.hidden_size * seq_length)


def compute_output_flops_per_token(shape: ModelShape) -> float:
    """The output layer's (LM head's) 6·H·V training FLOPs per token: the last pipeline
    stage's extra work (the first stage's embedding lookup does no matmul)."""
    return float(6 * shape.hidden_size * shape.vocab_size)


def compute_model_flops_per_token(shape: ModelShape, *, seq_length: int) -> float:
    """Training model FLOPs per token, 6N + 12·L·H·Q·T (PaLM appendix B; the note's default
    convention): N = the active parameters that take part in matmuls -- the layers, the
    output layer (a tied embedding once) and the final norm; not the position embedding, not
    an untied input embedding (a lookup). For gpt-125m this is the campaign's 855,383,040
    at T = 1024 (report.metrics.compute_flops_per_token)."""
    emb = count_embedding_params(shape)
    n = shape.num_layers * count_layer_params(shape, active=True) + emb["final_norm"] + shape.vocab_size * shape.hidden_size
    return float(6 * n + 12 * shape.num_layers * shape.hidden_size * seq_length)
