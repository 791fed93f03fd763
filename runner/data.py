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


class BatchPrefetcher:
    """This rank's micro-batches of step k+1, built while step k runs.

    A one-thread pool draws ``data.tokens(k + 1)`` (the same tokens as a direct call: the draw
    depends only on (seed, step)), keeps this DP rank's rows and, on CUDA, pins them and copies
    them to the device with ``non_blocking`` on a side stream, cutting contiguous (inputs,
    labels) micro-batches there; ``get(k)`` makes the compute stream wait on that copy's event
    (no host sync) and hands the tensors over (``record_stream``, so the allocator does not
    reuse their memory before the compute stream is done with them). On CPU the thread does the
    draw and the cut. ``get`` must be called with steps first_step, first_step + 1, ... in order.
    Shapes: [(inputs [mbs, T], labels [mbs, T])] int64, num_microbatches of them.
    """

    def __init__(self, data: SyntheticBatches, *, num_steps: int, dp_rank: int, dp_degree: int,
                 micro_batch_size: int, num_microbatches: int, device: torch.device, first_step: int = 0) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._data, self._num_steps = data, num_steps
        self._rank, self._dp = dp_rank, dp_degree
        self._mbs, self._nmb = micro_batch_size, num_microbatches
        self._device = device
        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device=device) if self._cuda else None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="batch-prefetch")
        self._next = self._pool.submit(self._build, first_step) if first_step < num_steps else None
        self._step = first_step

    def _build(self, step: int):
        tokens = self._data.tokens(step)
        per_rank = tokens.shape[0] // self._dp
        if self._mbs * self._nmb * self._dp != tokens.shape[0]:
            raise ValueError(f"micro_batch_size {self._mbs} x num_microbatches {self._nmb} x dp_degree {self._dp}"
                             f" != global batch {tokens.shape[0]}")
        mine = tokens[self._rank * per_rank : (self._rank + 1) * per_rank]
        if not self._cuda:
            return slice_batch(mine, dp_rank=0, dp_degree=1, micro_batch_size=self._mbs,
                               num_microbatches=self._nmb), None
        pinned = mine.pin_memory()
        with torch.cuda.device(self._device), torch.cuda.stream(self._stream):
            on_device = pinned.to(self._device, non_blocking=True)
            batches = [(x.contiguous(), y.contiguous()) for x, y in slice_batch(
                on_device, dp_rank=0, dp_degree=1, micro_batch_size=self._mbs, num_microbatches=self._nmb)]
            ready = torch.cuda.Event()
            ready.record(self._stream)
        return batches, ready

    def get(self, step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Step ``step``'s micro-batches (on the device), and start building the next step's."""
        if step != self._step or self._next is None:
            raise ValueError(f"BatchPrefetcher.get({step}): expected step {self._step} of {self._num_steps}")
        batches, ready = self._next.result()
        self._step += 1
        self._next = self._pool.submit(self._build, self._step) if self._step < self._num_steps else None
        if ready is not None:
            current = torch.cuda.current_stream(self._device)
            current.wait_event(ready)
            for x, y in batches:
                x.record_stream(current)
                y.record_stream(current)
        return batches

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
