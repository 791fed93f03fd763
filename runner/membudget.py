"""A capacity trial's memory, rank side: the per-process budget and what the rank held.

On CPU the probe needs a real limit to find, so a trial's rank caps its own data segment:
``RLIMIT_DATA`` = the data segment right before the model is built + ``options.memory_budget_gib``.
Why RLIMIT_DATA: since Linux 4.7 it counts private writable mappings (heap and anonymous mmap),
which is where torch's CPU allocator puts every tensor, so an allocation past the budget fails
with ENOMEM inside torch ("DefaultCPUAllocator: can't allocate memory"), a Python exception the
runner classifies as 'oom' like a CUDA OOM, while gloo's threads and sockets keep working.
RLIMIT_AS would also count the address space torch and gloo reserve but never touch (thread
stacks, allocator arenas: gigabytes), and a cgroup limit kills the process (SIGKILL) instead of
failing the allocation, and needs privileges. On CUDA a budget below the device's memory (a
`runner search --memory-gib` smaller than the GPU) is imposed through the caching allocator
(``torch.cuda.set_per_process_memory_fraction``: an allocation past it raises the usual CUDA OOM);
without one the GPU is the limit.

Deliberately not here: the bisection (runner.capacity), launching.
"""
from __future__ import annotations

import gc
import importlib
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from core.atomic import write_json_atomic
from core.records import RankMemory, RunSpec, to_dict

if TYPE_CHECKING:  # torch is imported where a rank uses it, not by the probe that only plans
    import torch

GIB = 1024**3
BUDGET_KEY = "memory_budget_gib"  # the option the probe writes into a trial's spec
INIT_ON_DEVICE_KEY = "init_on_device"  # the probe's trials draw their weights on the device (runner.model.build_gpt)
# what an engine imports lazily at build time: loaded before the baseline, so its code is not charged
ENGINE_IMPORTS = {"deepspeed": "deepspeed"}


def read_proc_status_bytes(key: str) -> int:
    """A ``/proc/self/status`` size field (e.g. "VmData", "VmRSS") in bytes.
    Raises KeyError when the kernel does not report it."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    raise KeyError(key)


@dataclass(frozen=True, kw_only=True)
class MemoryBaseline:
    budget_gib: float | None
    limit_mechanism: str | None
    baseline_rss_gib: float


def warm_runtime(device: torch.device) -> None:
    """One small forward, backward, AdamW step and all-reduce, so the runtime's lazy state
    (autograd threads, kernel libraries, the process group's buffers) exists before the baseline
    and is not charged to the layout."""
    import torch

    layer = torch.nn.Linear(64, 64, device=device)
    opt = torch.optim.AdamW(layer.parameters(), foreach=True)
    layer(torch.ones(8, 64, device=device)).sum().backward()
    opt.step()
    t = torch.ones(1024, device=device)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
    del layer, opt, t


def start_memory_budget(spec: RunSpec, *, device: torch.device) -> MemoryBaseline | None:
    """For a capacity trial (``options.memory_budget_gib`` present): import the engine's library,
    take the baseline and, on CPU with a budget, set RLIMIT_DATA to the data segment now + budget.
    None for any other run (nothing measured, nothing limited)."""
    import torch

    if BUDGET_KEY not in spec.options:
        return None
    for name in ("numpy", ENGINE_IMPORTS.get(spec.engine)):
        if name:  # numpy's BLAS allocates its buffers at import; a failed import under the limit reads as a NameError
            importlib.import_module(name)
    warm_runtime(device)
    gc.collect()
    budget = spec.options[BUDGET_KEY]
    mechanism = None
    if device.type == "cpu" and budget is not None:
        limit = read_proc_status_bytes("VmData") + int(float(budget) * GIB)
        resource.setrlimit(resource.RLIMIT_DATA, (limit, resource.getrlimit(resource.RLIMIT_DATA)[1]))
        mechanism = "RLIMIT_DATA"
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        if budget is not None and float(budget) * GIB < total:
            torch.cuda.set_per_process_memory_fraction(float(budget) * GIB / total, device)
            mechanism = "torch.cuda.set_per_process_memory_fraction"
        torch.cuda.reset_peak_memory_stats(device)
    return MemoryBaseline(budget_gib=None if budget is None else float(budget), limit_mechanism=mechanism,
                          baseline_rss_gib=read_proc_status_bytes("VmRSS") / GIB)


def write_rank_memory(baseline: MemoryBaseline, *, run_dir: Path, run: str, rank: int, device: torch.device,
                      device_peak_gib: float | None) -> RankMemory:
    """<run_dir>/memory/rank<r>.json at the end of a trial that trained. device_peak_gib: on
    CUDA the largest per-step max_memory_allocated the recorder saw (GiB); ignored on CPU,
    where the layout's peak is the peak resident set above the baseline."""
    host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB  # ru_maxrss: kB on Linux
    if device.type == "cuda":
        peak, measure = device_peak_gib, "cuda max_memory_allocated"
    else:
        peak, measure = host_peak - baseline.baseline_rss_gib, "peak RSS above the rank's start-up RSS"
    record = RankMemory(run=run, rank=rank, device=device.type, budget_gib=baseline.budget_gib,
                        limit_mechanism=baseline.limit_mechanism, baseline_rss_gib=baseline.baseline_rss_gib,
                        host_peak_rss_gib=host_peak, mem_peak_gib=peak, mem_measure=measure)
    write_json_atomic(run_dir / "memory" / f"rank{rank}.json", to_dict(record))
    return record
