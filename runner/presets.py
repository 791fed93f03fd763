"""Model presets and the fixed variables that come with them.

``gpt-125m`` is GPT-2 small (Radford et al. 2019; nanoGPT's gpt2 config). ``tiny`` keeps its
structure (layers divisible by 2 for PP=2, heads divisible by 2 for TP=2) at a size whose
whole matrix runs on 2 CPU cores in a minute or two.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.records import ModelConfig


@dataclass(frozen=True, kw_only=True)
class Preset:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    global_batch_size: int
    dtype: str
    steps: int
    warmup_steps: int
    lr: float
    min_lr: float
    lr_warmup_steps: int
    micro_batch_size: int  # default per-GPU micro-batch where the layout leaves a choice


PRESETS: dict[str, Preset] = {
    "gpt-125m": Preset(
        name="gpt-125m", num_layers=12, hidden_size=768, num_heads=12, ffn_hidden_size=3072, seq_length=1024,
        vocab_size=50257, global_batch_size=128, dtype="bf16", steps=200, warmup_steps=20,
        lr=6e-4, min_lr=6e-5, lr_warmup_steps=20, micro_batch_size=16,
    ),
    "tiny": Preset(
        name="tiny", num_layers=4, hidden_size=64, num_heads=4, ffn_hidden_size=256, seq_length=64,
        vocab_size=1000, global_batch_size=16, dtype="fp32", steps=30, warmup_steps=5,
        lr=3e-3, min_lr=3e-4, lr_warmup_steps=5, micro_batch_size=4,
    ),
}


def pad_vocab(vocab_size: int, *, max_tp_degree: int, multiple: int = 128) -> int:
    """Round the vocabulary up to a multiple of ``multiple * max_tp_degree`` (Megatron-LM
    ``_vocab_size_with_padding``), once per campaign so every run has the same shape."""
    m = multiple * max_tp_degree
    return ((vocab_size + m - 1) // m) * m


def build_model_config(preset: Preset, *, max_tp_degree: int) -> ModelConfig:
    return ModelConfig(
        num_layers=preset.num_layers,
        hidden_size=preset.hidden_size,
        num_heads=preset.num_heads,
        ffn_hidden_size=preset.ffn_hidden_size,
        seq_length=preset.seq_length,
        vocab_size=preset.vocab_size,
        padded_vocab_size=pad_vocab(preset.vocab_size, max_tp_degree=max_tp_degree),
    )
