"""Published transformer shapes for planning (``SHAPES``), each with its source.

``core.formulas.ModelShape`` describes a decoder-only transformer well enough to size its memory and
compute (GPT-2/GPT-3 style: GELU MLP, biases, learned positions, tied embedding; Llama
style: SwiGLU MLP, grouped-query attention, RoPE, no biases, untied output layer; optional
mixture-of-experts MLP). ``SHAPES`` holds the configurations the planner's worked examples
use, each with its source. Deliberately not here: parameter counts and FLOPs
(core.formulas), memory (core.memory), time (core.perfmodel), the torch model (runner.model).
"""
from __future__ import annotations

from core.errors import ConfigError
from core.formulas import ModelShape
from runner.presets import PRESETS, pad_vocab


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


