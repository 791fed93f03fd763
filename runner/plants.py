"""Planted causes, carried out on every rank (core.records.Plant; DESIGN.md, "Proving the analysis").

What a run's plant adds to each step, and nothing else: the delays (seconds this rank sleeps), the
extra per-step work (one all-reduce of known bytes after the trainer's step, one square matmul of
known FLOPs before the forward), each inside its own profiler range (core.records.PLANT_RANGES),
and the truth of that work -- timed here, in separate loops right before and right after the
training loop and by a clock of its own around the op in every kept step, never taken from the
trace the analysis judges -- as a PlantTruth record (<run>/plant_truth.json).
Deliberately not here: when in the step the work runs (runner.train.run_loop), validation
(runner.matrix.build_plant), and any reading of traces.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from core.formulas import compute_square_matmul_n
from core.records import (PLANT_EXTRA_COLLECTIVE_RANGE, PLANT_EXTRA_MATMUL_RANGE, PLANT_HOST_DELAY_RANGE, PlantTruth,
                          RunSpec)
from runner.strategies import RankContext

TRUTH_NUM_WARMUP, TRUTH_NUM_TIMED = 5, 10  # iterations of each planted op per timing loop
TRUTH_SEED = 0  # the matmul's operands come from their own generator: the run's RNG stream is untouched


def planted_delays_s(spec: RunSpec, *, rank: int) -> tuple[float, float]:
    """(data delay, host delay) in seconds this rank sleeps every step under the run's plant
    (core.records.Plant): the data delay on every rank, the host delay on host_delay_rank only."""
    plant = spec.plant
    if plant is None:
        return 0.0, 0.0
    data = (plant.data_delay_ms or 0.0) / 1e3
    host = (plant.host_delay_ms or 0.0) / 1e3 if rank == plant.host_delay_rank else 0.0
    return data, host


def planted_lr_factor(spec: RunSpec, *, step: int) -> float:
    """The factor the run's plant multiplies step ``step``'s learning rate by (1.0 unplanted)."""
    plant = spec.plant
    hit = plant is not None and plant.lr_spike_step == step and plant.lr_spike_factor is not None
    return plant.lr_spike_factor if hit else 1.0


class InStepClock:
    """Durations of the planted ops inside the training steps, by a clock apart from the profiler:
    time.perf_counter on CPU (gloo collectives and CPU matmuls return when done), else a pair of
    CUDA events on the current stream around the op (no host synchronisation in the step; read
    after the loop). Only the steps ``span`` is told to keep are timed."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._marks: dict[str, list] = {"collective": [], "matmul": []}

    @contextlib.contextmanager
    def span(self, op: str, *, keep: bool) -> Iterator[None]:
        """Times the body as one sample of ``op`` ("collective" | "matmul") when ``keep``."""
        if not keep:
            yield
            return
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self._marks[op].append((start, end))
            return
        t0 = time.perf_counter()
        yield
        self._marks[op].append(time.perf_counter() - t0)

    def seconds(self, op: str) -> list[float]:
        """This rank's samples of ``op`` in step order, seconds (waits for the CUDA events)."""
        out = []
        for mark in self._marks[op]:
            if isinstance(mark, tuple):
                mark[1].synchronize()
                mark = mark[0].elapsed_time(mark[1]) / 1e3
            out.append(float(mark))
        return out


@dataclass(frozen=True, kw_only=True)
class PlantWork:
    """The extra per-step work of a run's plant on one rank, its tensors allocated once (so a
    step spends only the op's own time). collective: the fp32 tensor all-reduced (numel = bytes / 4),
    or None. matmul: (a, b, out), n x n each in the run's dtype, or None. in_step: the clock
    the training loop times each op with in the steps it keeps (runner.train.run_loop)."""

    collective: torch.Tensor | None = None
    matmul: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    in_step: InStepClock | None = field(default=None, compare=False)

    def run_collective(self) -> None:
        """One all-reduce (sum) of ``collective`` on the world process group; blocks like the
        trainer's own collectives (on CUDA: the current stream waits for it)."""
        assert self.collective is not None
        dist.all_reduce(self.collective)

    def run_matmul(self) -> None:
        """One ``a @ b`` into ``out`` (2 n^3 FLOPs)."""
        assert self.matmul is not None
        a, b, out = self.matmul
        torch.mm(a, b, out=out)


def matmul_dtype(spec: RunSpec) -> torch.dtype:
    """The extra matmul's dtype: the run's (bf16 runs multiply in bf16, fp32 runs in fp32)."""
    return torch.bfloat16 if spec.fixed.dtype == "bf16" else torch.float32


def build_plant_work(spec: RunSpec, *, device: torch.device) -> PlantWork:
    """This rank's PlantWork for the run's plant (empty without extra work)."""
    plant = spec.plant
    coll = mm = None
    if plant is not None and plant.extra_collective_bytes is not None:
        coll = torch.zeros(plant.extra_collective_bytes // 4, dtype=torch.float32, device=device)
        assert coll.numel() * coll.element_size() == plant.extra_collective_bytes
    if plant is not None and plant.extra_matmul_gflop is not None:
        n = compute_square_matmul_n(plant.extra_matmul_gflop)
        gen = torch.Generator().manual_seed(TRUTH_SEED)
        a, b = (torch.randn(n, n, generator=gen).to(device=device, dtype=matmul_dtype(spec)) for _ in range(2))
        mm = (a, b, torch.empty_like(a))
    return PlantWork(collective=coll, matmul=mm, in_step=InStepClock(device) if coll is not None or mm is not None
                     else None)


def _timed_s(fn: Callable[[], None], *, ctx: RankContext) -> float:
    """Seconds ``fn`` takes on this rank, started after a barrier (every rank at once, as in a
    step) on an idle device: CUDA events around it on the current stream, else perf_counter."""
    if ctx.world_size > 1:
        dist.barrier()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize(ctx.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _every_rank_s(fn: Callable[[], None], *, ctx: RankContext) -> list[list[float]]:
    """TRUTH_NUM_TIMED timed calls of ``fn`` after TRUTH_NUM_WARMUP untimed ones, on every rank
    (a collective): [rank][iteration] seconds."""
    for _ in range(TRUTH_NUM_WARMUP):
        _timed_s(fn, ctx=ctx)
    return _gathered([_timed_s(fn, ctx=ctx) for _ in range(TRUTH_NUM_TIMED)], ctx=ctx)


def _gathered(samples: list[float], *, ctx: RankContext) -> list[list[float]]:
    """Every rank's ``samples`` (the same count on each rank; a collective): [rank][iteration]."""
    mine = torch.tensor(samples, dtype=torch.float64, device=ctx.device)
    if ctx.world_size == 1:
        return [mine.tolist()]
    everyone = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(everyone, mine)
    return [t.tolist() for t in everyone]


@dataclass(frozen=True, kw_only=True)
class PlantTimings:
    """One timing loop's samples ([rank][iteration] seconds) of each planted op, None where the
    plant has no such op."""

    collective: list[list[float]] | None = None
    matmul: list[list[float]] | None = None


def time_plant_work(work: PlantWork, *, ctx: RankContext) -> PlantTimings:
    """One timing loop over the plant's extra ops (every rank calls it: it holds collectives)."""
    return PlantTimings(
        collective=_every_rank_s(work.run_collective, ctx=ctx) if work.collective is not None else None,
        matmul=_every_rank_s(work.run_matmul, ctx=ctx) if work.matmul is not None else None)


def _collective_s(per_rank: list[list[float]]) -> float:
    return statistics.median(min(it) for it in zip(*per_rank))  # per iteration the last-arriving rank's


def _matmul_s(per_rank: list[list[float]]) -> float:
    return statistics.fmean(statistics.median(r) for r in per_rank)


def _joined(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    return [x + y for x, y in zip(a, b)]


def build_plant_truth(spec: RunSpec, work: PlantWork, *, before: PlantTimings, after: PlantTimings,
                      ctx: RankContext) -> PlantTruth | None:
    """The PlantTruth record of the timing loops run before and after the training loop (see
    PlantTruth for the reductions). None when the plant adds no work."""
    if work.collective is None and work.matmul is None:
        return None
    coll: dict[str, float | int | None] = {}
    if before.collective is not None and after.collective is not None:
        coll = {"extra_collective_bytes": spec.plant.extra_collective_bytes,
                "extra_collective_s": _collective_s(_joined(before.collective, after.collective)),
                "extra_collective_before_s": _collective_s(before.collective),
                "extra_collective_after_s": _collective_s(after.collective)}
    mm: dict[str, float | int | str | None] = {}
    if work.matmul is not None and before.matmul is not None and after.matmul is not None:
        n = work.matmul[0].shape[0]
        mm = {"extra_matmul_n": n, "extra_matmul_flop": 2 * n**3,
              "extra_matmul_dtype": str(work.matmul[0].dtype).removeprefix("torch."),
              "extra_matmul_s": _matmul_s(_joined(before.matmul, after.matmul)),
              "extra_matmul_before_s": _matmul_s(before.matmul), "extra_matmul_after_s": _matmul_s(after.matmul)}
    in_step = work.in_step
    if in_step is not None and work.collective is not None and (samples := in_step.seconds("collective")):
        coll["extra_collective_in_step_s"] = _collective_s(_gathered(samples, ctx=ctx))
        coll["extra_collective_in_step_num"] = len(samples)
    if in_step is not None and work.matmul is not None and (samples := in_step.seconds("matmul")):
        mm["extra_matmul_in_step_s"] = _matmul_s(_gathered(samples, ctx=ctx))
        mm["extra_matmul_in_step_num"] = len(samples)
    clock = "CUDA events on the current stream" if ctx.device.type == "cuda" else "time.perf_counter"
    return PlantTruth(
        run=spec.name, device=ctx.device.type, world_size=ctx.world_size, num_warmup=TRUTH_NUM_WARMUP,
        num_timed=TRUTH_NUM_TIMED,
        method=(f"in the run's processes, one loop right before the training loop and one right after it:"
                f" {TRUTH_NUM_WARMUP} warm-up and {TRUTH_NUM_TIMED} timed iterations of each op per loop, each"
                f" after a barrier on an idle device, timed with {clock}; collective: median over both loops'"
                " iterations of the shortest rank's time; matmul: mean over ranks of each rank's median;"
                f" in the steps: {clock} around the op in every step after the warm-up, reduced alike"),
        **coll, **mm)
