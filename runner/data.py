"""Token batches, identical across strategies: the synthetic round and the real-text round.

Synthetic: every rank draws the *whole* global batch of step ``k`` from a generator seeded by
(seed, k) and keeps its slice, so every strategy trains on the same tokens in the same
order whatever its layout. Tokens are i.i.d. Zipf(s) over the real (unpadded) vocabulary:
the loss starts near ln(V) and falls towards the distribution's entropy, which
``core.formulas.zipf_entropy_nats`` gives, so a reader can tell learning from noise.

Real text: a Megatron indexed dataset (runner.corpus wrote or validated it) read as one token
stream, its documents concatenated in order (each ends in EOD); sample i is the window
[i*T, i*T + T + 1) (Megatron GPTDataset's packing: consecutive samples share one token, the
last input's label). ``SampleOrder`` maps (step, row) of the global batch to a sample: position
p = step*B + row walks a fresh permutation of all samples per epoch, drawn from (seed, epoch),
so it depends on the seed and the global batch only -- the same tokens in every global batch
whatever the layout. DP rank r reads the rows [r*B/dp, (r+1)*B/dp) of each step (disjoint
across DP ranks, identical across the TP/PP ranks of one DP rank) through a torch DataLoader
(``build_real_loader``: workers, pinned memory, prefetch), one batch per step, in step order.

Deliberately not here: tokenizing and validating the dataset (runner.corpus).
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import torch

from core.formulas import ZIPF_EXPONENT, compute_zipf_probs

class SyntheticBatches:
    """Global batches of step k: ``tokens(k)`` -> int64 [global_batch, seq + 1] (CPU).

    A fixed random permutation maps Zipf ranks to token ids so frequent tokens are spread
    over the vocabulary.
    """

    def __init__(self, *, vocab_size: int, seq_length: int, global_batch_size: int, seed: int) -> None:
        self.seq_length = seq_length
        self.global_batch_size = global_batch_size
        self.seed = seed
        self._cdf = np.cumsum(compute_zipf_probs(vocab_size, ZIPF_EXPONENT))
        self._cdf[-1] = 1.0
        self._perm = np.random.default_rng(seed).permutation(vocab_size)

    def tokens(self, step: int) -> torch.Tensor:
        rng = np.random.default_rng((self.seed, step))
        u = rng.random((self.global_batch_size, self.seq_length + 1))
        ranks = np.searchsorted(self._cdf, u, side="right")
        return torch.from_numpy(self._perm[ranks].astype(np.int64))

    def rows(self, step: int, *, dp_rank: int, dp_degree: int) -> torch.Tensor:
        """DP rank ``dp_rank``'s rows of step ``step``: int64 [B/dp, T+1]."""
        return dp_rows(self.tokens(step), dp_rank=dp_rank, dp_degree=dp_degree)


def dp_rows(global_tokens: torch.Tensor, *, dp_rank: int, dp_degree: int) -> torch.Tensor:
    """Rows [r*B/dp, (r+1)*B/dp) of a global batch [B, T+1]. Raises ValueError when dp does not divide B."""
    b = global_tokens.shape[0]
    if b % dp_degree:
        raise ValueError(f"global batch {b} is not divisible by dp_degree {dp_degree}")
    per_rank = b // dp_degree
    return global_tokens[dp_rank * per_rank : (dp_rank + 1) * per_rank]


class SampleOrder:
    """Which sample fills row ``row`` of step ``step``'s global batch.

    position p = step * global_batch_size + row; epoch e = p // num_samples; the sample is
    permutation_e[p % num_samples], permutation_e drawn by numpy's default_rng((seed, e)). The
    order depends on (num_samples, global_batch_size, seed) only, never on the layout."""

    def __init__(self, *, num_samples: int, global_batch_size: int, seed: int) -> None:
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self.num_samples, self.global_batch_size, self.seed = num_samples, global_batch_size, seed
        self._perms: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) > 2:  # steps walk forwards: keep the current and the next epoch
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng((self.seed, epoch)).permutation(self.num_samples)
        return self._perms[epoch]

    def global_indices(self, step: int) -> np.ndarray:
        """Sample ids of step ``step``'s global batch, int64 [global_batch_size]."""
        pos = step * self.global_batch_size + np.arange(self.global_batch_size, dtype=np.int64)
        epochs, within = pos // self.num_samples, pos % self.num_samples
        return np.array([self._perm(int(e))[w] for e, w in zip(epochs, within)], dtype=np.int64)

    def indices(self, step: int, *, dp_rank: int, dp_degree: int) -> np.ndarray:
        """DP rank ``dp_rank``'s sample ids of step ``step``, int64 [B/dp] (contiguous rows)."""
        per_rank = self.global_batch_size // dp_degree
        return self.global_indices(step)[dp_rank * per_rank : (dp_rank + 1) * per_rank]


class TokenWindows(torch.utils.data.Dataset):
    """Map-style dataset over an indexed dataset's .bin read as one token stream.

    item i -> (i, int64 [T+1] tokens [i*T, i*T+T+1)). ``sample_delay_s`` sleeps that long per
    item (a deliberately slow loader, for testing the data-stall evidence). The .bin is opened
    lazily per process (DataLoader workers each memory-map it once)."""

    def __init__(self, *, prefix: str, token_dtype: str, num_tokens: int, seq_length: int,
                 sample_delay_s: float = 0.0) -> None:
        self.prefix, self.token_dtype, self.num_tokens = prefix, token_dtype, num_tokens
        self.seq_length, self.sample_delay_s = seq_length, sample_delay_s
        self._data: np.ndarray | None = None

    def __len__(self) -> int:
        return (self.num_tokens - 1) // self.seq_length

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_data": None}

    def window(self, i: int) -> torch.Tensor:
        """Sample i without the artificial delay: int64 [T+1]."""
        if self._data is None:
            self._data = np.memmap(f"{self.prefix}.bin", dtype=np.dtype(self.token_dtype), mode="r",
                                   shape=(self.num_tokens,))
        start = int(i) * self.seq_length
        return torch.from_numpy(self._data[start : start + self.seq_length + 1].astype(np.int64))

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range 0..{len(self) - 1}")
        if self.sample_delay_s > 0:
            time.sleep(self.sample_delay_s)
        return int(i), self.window(i)


class StepBatchSampler(torch.utils.data.Sampler):
    """Yields, for each step of ``steps`` in order, this DP rank's sample ids (one batch per step)."""

    def __init__(self, order: SampleOrder, *, steps: range, dp_rank: int, dp_degree: int) -> None:
        self.order, self.steps, self.dp_rank, self.dp_degree = order, steps, dp_rank, dp_degree

    def __len__(self) -> int:
        return len(self.steps)

    def __iter__(self) -> Iterator[list[int]]:
        for step in self.steps:
            yield self.order.indices(step, dp_rank=self.dp_rank, dp_degree=self.dp_degree).tolist()


def _collate(items: list[tuple[int, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.tensor([i for i, _ in items], dtype=torch.int64), torch.stack([t for _, t in items])


class RealBatches:
    """The real round's batches for one DP rank: an ordered DataLoader stream for the training
    loop (``rows`` must then be called with steps first_step, first_step + 1, ... -- what
    BatchPrefetcher does) and random access (``rows_at``) for replays.

    Loader knobs (runner.knobs LoaderKnobs): num_workers (0: load in the calling thread),
    pin_memory (pinned host batches for non_blocking copies; CUDA only), prefetch_factor
    (batches each worker keeps ready; workers only), sample_delay_s (artificial per-sample delay).
    ``consumed`` keeps the sample ids and token sums of the first ``audit_steps`` steps, as the
    loader delivered them (the cross-layout order check reads them)."""

    def __init__(self, windows: TokenWindows, order: SampleOrder, *, dp_rank: int, dp_degree: int, steps: range,
                 num_workers: int, pin_memory: bool, prefetch_factor: int | None, audit_steps: int = 4) -> None:
        self.windows, self.order, self.dp_rank, self.dp_degree = windows, order, dp_rank, dp_degree
        self._steps = steps
        self._loader = torch.utils.data.DataLoader(
            windows, batch_sampler=StepBatchSampler(order, steps=steps, dp_rank=dp_rank, dp_degree=dp_degree),
            num_workers=num_workers, pin_memory=pin_memory, collate_fn=_collate,
            prefetch_factor=prefetch_factor if num_workers > 0 else None, persistent_workers=False)
        self._it: Iterator | None = iter(self._loader)  # workers start here, in the caller's (main) thread
        self._next_step = steps.start
        self.audit_steps = audit_steps
        self.consumed: dict[int, dict] = {}

    def rows(self, step: int, *, dp_rank: int, dp_degree: int) -> torch.Tensor:
        """The next batch of the loader stream, which must be step ``step``'s: int64 [B/dp, T+1]."""
        if (dp_rank, dp_degree) != (self.dp_rank, self.dp_degree) or step != self._next_step:
            raise ValueError(f"RealBatches.rows({step}, dp {dp_rank}/{dp_degree}): the stream is at step "
                             f"{self._next_step} of dp {self.dp_rank}/{self.dp_degree}")
        if self._it is None:
            raise ValueError("RealBatches.rows after close()")
        ids, tokens = next(self._it)
        expected = self.order.indices(step, dp_rank=dp_rank, dp_degree=dp_degree)
        if not np.array_equal(ids.numpy(), expected):  # the loader's order is the contract: check, never assume
            raise RuntimeError(f"data loader delivered samples {ids.tolist()[:4]}... for step {step}, "
                               f"expected {expected.tolist()[:4]}...")
        if step - self._steps.start < self.audit_steps:
            self.consumed[step] = {"sample_ids": ids.tolist(), "token_sums": tokens.sum(dim=1).tolist()}
        self._next_step += 1
        return tokens

    def rows_at(self, step: int) -> torch.Tensor:
        """Step ``step``'s rows for this DP rank, read directly (no workers, no delay): int64 [B/dp, T+1]."""
        ids = self.order.indices(step, dp_rank=self.dp_rank, dp_degree=self.dp_degree)
        return torch.stack([self.windows.window(int(i)) for i in ids])

    def close(self) -> None:
        self._it = None  # ends the workers


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

    A one-thread pool takes this DP rank's rows of step k + 1 from ``data.rows`` (synthetic: the
    same tokens as a direct call, the draw depends only on (seed, step); real text: the next
    batch of the DataLoader stream, already pinned when pin_memory) and, on CUDA, pins them and copies
    them to the device with ``non_blocking`` on a side stream, cutting contiguous (inputs,
    labels) micro-batches there; ``get(k)`` makes the compute stream wait on that copy's event
    (no host sync) and hands the tensors over (``record_stream``, so the allocator does not
    reuse their memory before the compute stream is done with them). On CPU the thread does the
    draw and the cut. ``get`` must be called with steps first_step, first_step + 1, ... in order.
    Shapes: [(inputs [mbs, T], labels [mbs, T])] int64, num_microbatches of them.
    """

    def __init__(self, data: "SyntheticBatches | RealBatches", *, num_steps: int, dp_rank: int, dp_degree: int,
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
        mine = self._data.rows(step, dp_rank=self._rank, dp_degree=self._dp)
        if self._mbs * self._nmb != mine.shape[0]:
            raise ValueError(f"micro_batch_size {self._mbs} x num_microbatches {self._nmb} x dp_degree {self._dp}"
                             f" != global batch {mine.shape[0] * self._dp}")
        if not self._cuda:
            return slice_batch(mine, dp_rank=0, dp_degree=1, micro_batch_size=self._mbs,
                               num_microbatches=self._nmb), None
        pinned = mine if mine.is_pinned() else mine.pin_memory()
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
