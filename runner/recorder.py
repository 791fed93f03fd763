"""Per-step metric rows for one rank, timed with device events.

On CUDA each step's end is marked with an event and its row is resolved one step later,
so the host never waits for the step it just queued: the only sync per step is the loss
of the *previous* step, which has already finished by then (a run that hangs loses that one
pending row). On CPU, perf_counter, and each row is written at once.
Rows are appended to metrics/rank<r>.jsonl and flushed per line (a crash keeps every
completed step).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import torch

from core.records import StepRow, to_dict

GIB = 1024**3


@dataclass
class _Pending:
    step: int
    end: torch.cuda.Event | float
    loss: torch.Tensor | None
    grad_norm: torch.Tensor | float | None
    lr: float
    data_wait_s: float
    entry_time_s: float | None
    profiled: bool
    mem_alloc_gib: float | None
    mem_reserved_gib: float | None


def _scalar(x: torch.Tensor | float | None) -> float | None:
    if x is None:
        return None
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


class StepRecorder:
    def __init__(self, out: IO[str], *, run: str, engine: str, rank: int, tokens_per_step: int, device: torch.device) -> None:
        self._out = out
        self._run = run
        self._engine = engine
        self._rank = rank
        self._tokens = tokens_per_step
        self._cuda = device.type == "cuda"
        self._t0 = time.perf_counter()
        self._pending: _Pending | None = None
        self.step_times: dict[int, float] = {}  # step -> step_time_s of every row written
        self.losses: dict[int, float | None] = {}  # step -> loss of every row written (checkpoint restore check)
        self.mem_peak_allocated_gib: float | None = None  # largest per-step allocator peak written (CUDA)
        self._last_end = self._mark()

    def _mark(self) -> torch.cuda.Event | float:
        if self._cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def begin_step(self) -> None:
        if self._cuda:
            torch.cuda.reset_peak_memory_stats()

    def end_step(
        self, *, step: int, loss: torch.Tensor | None, grad_norm, lr: float, data_wait_s: float,
        entry_time_s: float | None = None, profiled: bool = False,
    ) -> None:
        mem_a = mem_r = None
        if self._cuda:  # allocator counters are host-side: no sync
            mem_a = torch.cuda.max_memory_allocated() / GIB
            mem_r = torch.cuda.max_memory_reserved() / GIB
        pending = _Pending(step, self._mark(), loss, grad_norm, lr, data_wait_s, entry_time_s, profiled, mem_a, mem_r)
        if self._pending is not None:
            self._write(self._pending)
        self._pending = pending
        if not self._cuda:  # CPU work is synchronous: nothing to wait for, write now
            self.close()

    def close(self) -> None:
        if self._pending is not None:
            self._write(self._pending)
            self._pending = None

    def restart_clock(self) -> None:
        """Write the pending row, then start the next step's clock now: host work between
        steps (the profiler's trace export) is kept out of every step's time."""
        self.close()
        self._last_end = self._mark()

    def _write(self, p: _Pending) -> None:
        if self._cuda:
            p.end.synchronize()
            step_time_s = self._last_end.elapsed_time(p.end) / 1e3
        else:
            step_time_s = p.end - self._last_end
        self._last_end = p.end
        self.step_times[p.step] = step_time_s
        self.losses[p.step] = _scalar(p.loss)
        if p.mem_alloc_gib is not None:
            self.mem_peak_allocated_gib = max(self.mem_peak_allocated_gib or 0.0, p.mem_alloc_gib)
        row = StepRow(
            run=self._run,
            rank=self._rank,
            step=p.step,
            step_time_s=step_time_s,
            tokens=self._tokens,
            loss=self.losses[p.step],
            lr=p.lr,
            grad_norm=_scalar(p.grad_norm),
            mem_peak_allocated_gib=p.mem_alloc_gib,
            mem_peak_reserved_gib=p.mem_reserved_gib,
            data_wait_s=p.data_wait_s,
            wall_time_s=time.perf_counter() - self._t0,
            engine=self._engine,
            step_entry_time_s=p.entry_time_s,
            profiled=p.profiled,
        )
        self._out.write(json.dumps(to_dict(row)) + "\n")
        self._out.flush()


def open_metrics_file(run_dir: Path, rank: int) -> IO[str]:
    path = run_dir / "metrics" / f"rank{rank}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("w", encoding="utf-8", buffering=1)
