"""The analytic formulas the runner's planner and the note share, each once, with its source.

Parameter counts and training FLOPs per token of a decoder-only transformer (``ModelShape``),
MFU, the 1F1B pipeline bubble, the nccl-tests bus-bandwidth factor, the side of a square matmul
of given FLOPs (the extra-matmul plant) and the synthetic data round's Zipf entropy; which step
rows are measured, and a step's time (max over ranks). Pure arithmetic: no I/O, no formatting.
Deliberately not here: memory (core.memory), step time (core.perfmodel), published shapes
(runner.shapes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from core.errors import ConfigError

if TYPE_CHECKING:  # numpy is imported where used: `runner all --dry-run` and errors answer without it
    import numpy as np

FLOPS_CONVENTIONS = ("6N+12LHQT", "6N", "6N+6LHQT")
DEFAULT_CONVENTION = "6N+12LHQT"
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


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


# The largest value of each model-shape field a planned or launched model may have: past anything
# built or published (Llama 3 405B: 126 layers, hidden 16384, 128 heads, vocab 128k), far enough
# for what-ifs, and small enough that every formula and the planner's layout search answer in
# seconds. With the sequence length and the global batch (sequences per step): the one home of
# these bounds for `runner plan` and the matrix.
SHAPE_MAX = {"num_layers": 4096, "hidden_size": 1 << 20, "num_heads": 1 << 14, "num_kv_heads": 1 << 14,
             "ffn_hidden_size": 1 << 22, "vocab_size": 1 << 24, "num_experts": 1 << 14, "moe_top_k": 1 << 14}
MAX_SEQ_LENGTH = 1 << 24
MAX_GLOBAL_BATCH_SIZE = 1 << 22


def check_shape(shape: ModelShape) -> None:
    """Raise ConfigError naming every field that makes the shape impossible (< 1, or past SHAPE_MAX)."""
    problems = [f"{k} must be in 1..{most}, got {getattr(shape, k)}" for k, most in SHAPE_MAX.items()
                if not 1 <= getattr(shape, k) <= most]
    if not problems:
        if shape.hidden_size % shape.num_heads:
            problems.append(f"--hidden {shape.hidden_size} is not divisible by --heads {shape.num_heads}")
        if shape.num_heads % shape.num_kv_heads:
            problems.append(f"--heads {shape.num_heads} is not divisible by --kv-heads {shape.num_kv_heads}")
        if shape.moe_top_k > shape.num_experts:
            problems.append(f"moe_top_k {shape.moe_top_k} exceeds --moe-experts {shape.num_experts}")
    if problems:
        raise ConfigError("; ".join(problems))


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
    at T = 1024, what compute_flops_per_token gives from the runs' measured parameter count."""
    emb = count_embedding_params(shape)
    n = shape.num_layers * count_layer_params(shape, active=True) + emb["final_norm"] + shape.vocab_size * shape.hidden_size
    return compute_flops_per_token(num_params=n, num_layers=shape.num_layers, hidden_size=shape.hidden_size,
                                   seq_length=seq_length, position_embedding_params=0)


def compute_flops_per_token(
    *,
    num_params: int,
    num_layers: int,
    hidden_size: int,
    seq_length: int,
    position_embedding_params: int,
    convention: str = DEFAULT_CONVENTION,
) -> float:
    """Training FLOPs per token (forward + backward) of a dense decoder-only transformer.

    N = num_params - position_embedding_params (tied input/output embedding counted once;
    learned position embeddings excluded, as nanoGPT ``GPT.estimate_mfu`` /
    ``get_num_params(non_embedding=True)``; a model with an untied output layer must pass its
    input embedding in position_embedding_params too, as compute_model_flops_per_token does); L = num_layers; H*Q = hidden_size (heads x head
    dim); T = seq_length.

    - "6N+12LHQT" (default): 6N for the weight matmuls plus 12*L*H*Q*T for attention scores
      and values over the full T x T matrix. PaLM (Chowdhery et al. 2022), appendix B;
      nanoGPT model.py ``estimate_mfu``. GPT-2 124M at T=1024: ~855e6 FLOP/token.
    - "6N": weight matmuls only (Kaplan et al. 2020, section 2.1).
    - "6N+6LHQT": attention halved for the causal mask (only the lower triangle is
      computed), as Megatron-LM's ``num_floating_point_operations`` since 2025 and llm.c.

    Raises ValueError for an unknown convention or N <= 0.
    """
    if convention not in FLOPS_CONVENTIONS:
        raise ValueError(f"unknown FLOPs convention {convention!r}; choose one of {', '.join(FLOPS_CONVENTIONS)}")
    n = num_params - position_embedding_params
    if n <= 0:
        raise ValueError(f"non-positive parameter count N={n}")
    attention = {"6N+12LHQT": 12, "6N": 0, "6N+6LHQT": 6}[convention] * num_layers * hidden_size * seq_length
    return float(6 * n + attention)


def compute_mfu(
    tokens_per_s: float | None, *, flops_per_token: float | None, peak_flops: float | None, num_gpus: int
) -> float | None:
    """Model FLOPs utilisation = tokens_per_s * flops_per_token / (num_gpus * peak_flops).

    peak_flops: dense peak FLOP/s of one GPU for the run's dtype (core.hardware). Returns
    None when any input is None/NA (unknown GPU, CPU run, no measured steps): never a fallback.
    Source: PaLM (Chowdhery et al. 2022), appendix B.
    """
    if any(_is_missing(v) for v in (tokens_per_s, flops_per_token, peak_flops)):
        return None
    if num_gpus < 1 or peak_flops <= 0:
        raise ValueError(f"num_gpus={num_gpus} and peak_flops={peak_flops} must be positive")
    return float(tokens_per_s) * float(flops_per_token) / (num_gpus * float(peak_flops))


def is_finite_number(value: object) -> bool:
    """An int or float (not a bool) that is finite: what a numeric config field must be."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


def _is_missing(value: object) -> bool:
    """None, NaN or pandas.NA (whose comparison has no truth value)."""
    if value is None:
        return True
    try:
        return bool(value != value)
    except TypeError:
        return True


def compute_bubble_ratio(*, pp_degree: int, num_microbatches: int, num_virtual_stages: int = 1) -> float:
    """Pipeline bubble time over the ideal (bubble-free) time of one 1F1B step, (p-1)/(v·m)
    (Narayanan et al. 2021, sections 2.2 and 2.2.2; v = 1 without interleaving). 0 for p = 1."""
    return (pp_degree - 1) / (num_virtual_stages * num_microbatches)


def compute_bubble_fraction(*, pp_degree: int, num_microbatches: int, num_virtual_stages: int = 1) -> float:
    """Idle fraction of a 1F1B pipeline, (p-1)/(m+p-1) (Narayanan et al. 2021, section 2.2);
    interleaved with v chunks per rank the bubble time shrinks v-fold, (p-1)/v against m ideal
    micro-batch times (section 2.2.2), so the idle fraction is (p-1)/(v·m+p-1)."""
    return (pp_degree - 1) / (num_virtual_stages * num_microbatches + pp_degree - 1)


# The measured-step rule the metric table and the planner's calibration share (DataFrame in, out:
# StepRow columns; no pandas import needed here).


def select_measured(steps: pd.DataFrame, *, warmup_steps: int) -> pd.DataFrame:
    """The steps the metric table uses: step >= warmup_steps and outside the profiler window
    (rows with ``profiled`` true; a missing column or NA counts as not profiled)."""
    keep = steps["step"] >= warmup_steps
    if "profiled" in steps:
        keep &= ~steps["profiled"].fillna(False).astype(bool)
    return steps[keep]


def compute_step_times(steps: pd.DataFrame, *, warmup_steps: int) -> pd.DataFrame:
    """Per measured (run, step) (see select_measured): step_time_s = max over ranks.
    Columns run, step, step_time_s."""
    measured = select_measured(steps, warmup_steps=warmup_steps)
    return measured.groupby(["run", "step"], as_index=False, sort=True)["step_time_s"].max()


def compute_tokens_per_s(steps: pd.DataFrame, *, tokens_per_step: float, warmup_steps: int) -> float | None:
    """tokens/s of one run as the metric table states it: tokens per step (global batch x seq)
    over the median of its measured steps' step time (compute_step_times: slowest rank per
    step, warm-up and profiled steps left out). None without a measured step."""
    import numpy as np

    times = compute_step_times(steps, warmup_steps=warmup_steps)["step_time_s"].to_numpy(dtype=float)
    if times.size == 0:
        return None
    return compute_tokens_per_s_at(tokens_per_step=tokens_per_step,
                                   step_time_median_s=float(np.percentile(times, 50, method="linear")))


def compute_tokens_per_s_at(*, tokens_per_step: float, step_time_median_s: float) -> float | None:
    """compute_tokens_per_s from a run's median measured step time (s): tokens per step over
    it; None unless it is > 0."""
    return tokens_per_step / step_time_median_s if step_time_median_s > 0 else None


def compute_bus_factor(op: str, group_size: int) -> float:
    """busbw / algbw for a collective over n ranks (nccl-tests doc/PERFORMANCE.md): all_reduce
    2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; send_recv 1. Raises ConfigError
    for an unknown op."""
    n = group_size
    factors = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
               "all_to_all": (n - 1) / n, "send_recv": 1.0}
    if op not in factors:
        raise ConfigError(f"unknown collective {op!r}; choose one of {', '.join(COLLECTIVES)}")
    return factors[op]


def compute_square_matmul_n(gflop: float) -> int:
    """The side n >= 1 of a square n x n @ n x n matmul whose 2 n^3 FLOPs (a multiply and an add
    per inner-product term) come nearest ``gflop`` * 1e9: n = round((gflop * 1e9 / 2) ** (1/3)).
    The matmul then does exactly 2 n^3 FLOPs. Raises ConfigError unless gflop is finite and > 0."""
    if not (isinstance(gflop, (int, float)) and math.isfinite(gflop) and gflop > 0):
        raise ConfigError(f"gflop must be a finite number > 0, got {gflop!r}")
    n = max(1, round((gflop * 1e9 / 2) ** (1 / 3)))
    # cube root in floating point: check the neighbours so n is the nearest integer in FLOPs
    return min((m for m in (n - 1, n, n + 1) if m >= 1), key=lambda m: abs(2 * m**3 - gflop * 1e9))


ZIPF_EXPONENT = 1.1  # the synthetic data round's Zipf exponent (runner.data draws its tokens from it)


def compute_zipf_probs(vocab_size: int, exponent: float = ZIPF_EXPONENT) -> np.ndarray:
    """Probabilities of ranks 1..V under Zipf(s): p_k = k^-s / sum_j j^-s (float64, shape [V])."""
    import numpy as np

    ranks = np.arange(1, vocab_size + 1, dtype=np.float64)
    w = ranks ** (-exponent)
    return w / w.sum()


def zipf_entropy_nats(vocab_size: int, exponent: float = ZIPF_EXPONENT) -> float:
    """Entropy (nats) of the synthetic token distribution, -sum p log p: the loss floor of a
    model that learns it perfectly."""
    import numpy as np

    p = compute_zipf_probs(vocab_size, exponent)
    return float(-(p * np.log(p)).sum())


def divisors(n: int) -> list[int]:
    """The divisors of n >= 1, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]
