"""Fault injection for testing the campaign's failure handling (off unless a run's spec asks).

A run's ``options.fault`` table: ``{kind, rank, step[, seconds]}`` with kind one of

- ``oom``: rank r asks the allocator for an impossible block at step k (a real allocation
  failure: ``torch.OutOfMemoryError`` on CUDA, the CPU allocator's error on CPU);
- ``crash``: rank r raises at step k;
- ``hang``: rank r enters a collective the other ranks never call at step k -- the classic
  "all_gather under ``if rank == 0``" while the others wait in the gradient all-reduce;
- ``gpu_hang``: rank r's stream spins in a kernel for ``seconds`` and an all-reduce is queued
  behind it (a stuck kernel; lets one GPU exercise the NCCL watchdog and flight recorder);
- ``straggler``: rank r sleeps ``seconds`` before every step from step k;
- ``slow_data``: rank r's data fetch sleeps ``seconds`` from step k.

Deliberately tiny: the training loop calls ``inject(point, step)`` at three points.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping
from core.formulas import is_finite_number

if TYPE_CHECKING:
    import torch

FAULT_KINDS = ("oom", "crash", "hang", "gpu_hang", "straggler", "slow_data")
FAULT_KEYS = ("kind", "rank", "step", "seconds")
IMPOSSIBLE_BYTES = 1 << 50  # 1 PiB: no allocator on earth grants it


@dataclass(frozen=True, kw_only=True)
class Fault:
    kind: str
    rank: int
    step: int
    seconds: float = 0.0


def fault_problems(raw: Any, *, world_size: int, steps: int) -> list[str]:
    """Problems of a run's ``options.fault`` table, one line each (empty: a valid fault or none):
    kind one of FAULT_KINDS, rank an integer in [0, world_size), step an integer in [0, steps),
    seconds a finite number >= 0, no other keys."""
    if raw is None or (isinstance(raw, Mapping) and not raw):
        return []
    if not isinstance(raw, Mapping):
        return [f"options.fault must be a table such as {{ kind = \"crash\", rank = 1, step = 5 }}, got {raw!r}"]
    problems = [f"options.fault: unknown key '{k}' (valid: {', '.join(FAULT_KEYS)})"
                for k in sorted(set(map(str, raw)) - set(FAULT_KEYS))]
    if raw.get("kind") not in FAULT_KINDS:
        problems.append(f"options.fault kind must be one of {', '.join(FAULT_KINDS)}, got {raw.get('kind')!r}")
    for key, bound, name in (("rank", world_size, "world_size"), ("step", steps, "steps")):
        value = raw.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < bound:
            problems.append(f"options.fault {key} must be an integer in [0, {bound}) ({name} {bound}), got {value!r}")
    seconds = raw.get("seconds", 0.0)
    if not is_finite_number(seconds) or seconds < 0:
        problems.append(f"options.fault seconds must be a finite number >= 0, got {seconds!r}")
    return problems


def build_fault(options: Mapping[str, Any]) -> Fault | None:
    """The run's fault, or None (runner.matrix checked it with fault_problems). Raises ValueError
    naming the bad field."""
    raw = options.get("fault")
    if not raw:
        return None
    unknown = set(raw) - {"kind", "rank", "step", "seconds"}
    if unknown or raw.get("kind") not in FAULT_KINDS:
        raise ValueError(f"options.fault {dict(raw)!r}: kind must be one of {', '.join(FAULT_KINDS)}; "
                         "keys: kind, rank, step, seconds")
    return Fault(kind=raw["kind"], rank=int(raw.get("rank", 0)), step=int(raw.get("step", 0)),
                 seconds=float(raw.get("seconds", 0.0)))


def inject(fault: Fault | None, *, point: str, step: int, rank: int, device: torch.device) -> None:
    """Fire the fault if it applies here. point: "data" (inside the timed data fetch) or
    "step" (before the trainer's step)."""
    if fault is None or rank != fault.rank or step < fault.step:
        return
    # torch here, not at import: runner.matrix reads build_fault, and `runner --help` must not load torch
    import torch
    import torch.distributed as dist

    if point == "data":
        if fault.kind == "slow_data":
            time.sleep(fault.seconds)
        return
    if fault.kind == "straggler":
        time.sleep(fault.seconds)
    if step != fault.step:
        return
    if fault.kind == "oom":
        torch.empty(IMPOSSIBLE_BYTES, dtype=torch.uint8, device=device)
    elif fault.kind == "crash":
        raise RuntimeError(f"injected fault: crash on rank {rank} at step {step}")
    elif fault.kind == "hang":
        out = [torch.zeros(1, device=device) for _ in range(dist.get_world_size())]
        dist.all_gather(out, torch.zeros(1, device=device))  # no other rank joins this one
    elif fault.kind == "gpu_hang":
        torch.cuda._sleep(int(fault.seconds * 2e9))  # ~cycles at ~2 GHz; the stream stalls
        dist.all_reduce(torch.zeros(1, device=device))  # queued behind it: never starts in time
