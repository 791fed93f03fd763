"""Synthetic token batches, identical across strategies.

Every rank draws the *whole* global batch of step ``k`` from a generator seeded by
(seed, k) and keeps its slice, so every strategy trains on the same tokens in the same
order whatever its layout. Tokens are i.i.d. Zipf(s) over the real (unpadded) vocabulary:
the loss starts near ln(V) and falls towards the distribution's entropy, which
``zipf_entropy_nats`` gives, so a reader can tell learning from noise.

Deliberately not here: real text (a later round) and any I/O.
"""
from __future__ import annotations

import numpy as np
import torch

ZIPF_EXPONENT = 1.1


def _zipf_probs(vocab_size: int, exponent: float) -> np.ndarray:
    ranks = np.arange(1, vocab_size + 1, dtype=np.float64)
    w = ranks ** (-exponent)
    return w / w.sum()


def zipf_entropy_nats(vocab_size: int, exponent: float = ZIPF_EXPONENT) -> float:
    """Entropy (nats) of the synthetic token distribution: the loss floor of a model that
    learns it perfectly."""
    p = _zipf_probs(vocab_size, exponent)
    return float(-(p * np.log(p)).sum())


class SyntheticBatches:
    """Global batches of step k: ``tokens(k)`` -> int64 [global_batch, seq + 1] (CPU).

    A fixed random permutation maps Zipf ranks to token ids so frequent tokens are spread
    over the vocabulary.
    """

    def __init__(self, *, vocab_size: int, seq_length: int, global_batch_size: int, seed: int) -> None:
        self.seq_length = seq_length
        self.global_batch_size = global_batch_size
        self.seed = seed
        self._cdf = np.cumsum(_zipf_probs(vocab_size, ZIPF_EXPONENT))
        self._cdf[-1] = 1.0
        self._perm = np.random.default_rng(seed).permutation(vocab_size)

    def tokens(self, step: int) -> torch.Tensor:
        rng = np.random.default_rng((self.seed, step))
        u = rng.random((self.global_batch_size, self.seq_length + 1))
        ranks = np.searchsorted(self._cdf, u, side="right")
        return torch.from_numpy(self._perm[ranks].astype(np.int64))


def slice_batch(
    global_tokens: torch.Tensor, *, dp_rank: int, dp_degree: int, micro_batch_size: int, num_microbatches: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Split a global batch [B, T+1] into this DP rank's micro-batches.

    DP rank r takes the contiguous rows [r*B/dp, (r+1)*B/dp), cut into ``num_microbatches``
    micro-batches of ``micro_batch_size`` rows. Returns [(inputs [mbs, T], labels [mbs, T])].
    Raises ValueError when the sizes do not multiply to B.
    """
    b = global_tokens.shape[0]
    if micro_batch_size * num_microbatches * dp_degree != b:
        raise ValueError(
            f"micro_batch_size {micro_batch_size} x num_microbatches {num_microbatches} x dp_degree {dp_degree}"
            f" != global batch {b}"
        )
    per_rank = b // dp_degree
    mine = global_tokens[dp_rank * per_rank : (dp_rank + 1) * per_rank]
    out = []
    for i in range(num_microbatches):
        mb = mine[i * micro_batch_size : (i + 1) * micro_batch_size]
        out.append((mb[:, :-1], mb[:, 1:]))
    return out
