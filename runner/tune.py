"""Automatic micro-batch search (``micro_batch_size = "auto"`` in a run of the matrix).

Before the run itself, the runner launches short probe runs (the run's spec with a few steps and
no profiler window), one per candidate micro-batch size, largest first, each its own torchrun
group under the same watchdog, so an out-of-memory probe costs that probe only. Candidates divide
the per-DP batch (runner.matrix.micro_batch_candidates): the global batch, and so the tokens each
step sees, never change -- only how a DP rank's rows are cut into micro-batches.

Policy "fastest" (default): the candidate with the best measured tokens/s among those that fit,
stopping once a smaller candidate is clearly slower than the best (throughput rises with the
micro-batch until the GPU is saturated); "largest": the largest that fits. The chosen size and
every probe's outcome are written into the run's spec (``options.micro_batch_search``).

Deliberately not here: launching (the caller passes ``launch``), multi-node runs.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any, Callable

from core.records import RunSpec

SLOWER_STOP_FRACTION = 0.03  # "fastest" stops at a candidate this much slower than the best so far


def probe_spec(spec: RunSpec, *, micro_batch_size: int, steps: int, warmup_steps: int) -> RunSpec:
    """The run's spec at another micro-batch size, shortened to ``steps`` with no profiler window
    and no checkpoint.
    Raises ValueError when the size does not divide the per-DP batch."""
    per_dp = spec.fixed.global_batch_size // spec.dp_degree
    if per_dp % micro_batch_size:
        raise ValueError(f"micro_batch_size {micro_batch_size} does not divide the per-DP batch {per_dp}")
    fixed = dataclasses.replace(spec.fixed, steps=steps, warmup_steps=warmup_steps, profile_num_steps=0,
                                profile_start_step=0, lr_warmup_steps=min(spec.fixed.lr_warmup_steps, steps))
    options = {k: v for k, v in spec.options.items() if k != "micro_batch_search"}
    return dataclasses.replace(spec, fixed=fixed, micro_batch_size=micro_batch_size,
                               num_microbatches=per_dp // micro_batch_size, options=options, nsys=False,
                               checkpoint_step=None, checkpoint_verify_steps=0)  # a probe times steps only


def load_probe_tokens_per_s(run_dir: Path, *, warmup_steps: int, tokens_per_step: int) -> float | None:
    """tokens/s of a probe: tokens per step / median over measured steps of the slowest rank's
    step time. None when no measured step was recorded."""
    per_step: dict[int, float] = {}
    for path in sorted((run_dir / "metrics").glob("rank*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["step"] >= warmup_steps:
                per_step[row["step"]] = max(per_step.get(row["step"], 0.0), row["step_time_s"])
    if not per_step:
        return None
    return tokens_per_step / statistics.median(per_step.values())


def choose_micro_batch(results: list[dict[str, Any]], *, policy: str) -> int | None:
    """The chosen size from probe results [{micro_batch_size, status, tokens_per_s}], or None when
    no candidate fit. "largest": largest ok; "fastest": best tokens/s among ok (ties: larger)."""
    ok = [r for r in results if r["status"] == "ok" and r["tokens_per_s"] is not None]
    if not ok:
        return None
    if policy == "largest":
        return max(r["micro_batch_size"] for r in ok)
    return max(ok, key=lambda r: (r["tokens_per_s"], r["micro_batch_size"]))["micro_batch_size"]


def search_micro_batch(spec: RunSpec, *, run_dir: Path, launch: Callable[[RunSpec, Path], Any],
                       log: Callable[[str], None] = print) -> RunSpec:
    """Probe the candidates of ``spec.options.micro_batch_search`` and return the spec at the
    chosen size, with the search recorded. ``launch(probe_spec, probe_dir)`` runs one probe and
    returns its RunStatus. When nothing fits, the smallest candidate is kept (the run will then
    fail as the probes did, and say so in its own status)."""
    search = dict(spec.options["micro_batch_search"])
    if "chosen" in search:  # resumed campaign: already searched
        return spec
    policy = search.get("policy", "fastest")
    results: list[dict[str, Any]] = []
    best = None
    for mbs in sorted(search["candidates"], reverse=True):
        probe = probe_spec(spec, micro_batch_size=mbs, steps=search["probe_steps"],
                           warmup_steps=search["probe_warmup_steps"])
        probe_dir = run_dir / "probes" / f"mbs{mbs}"
        status = launch(probe, probe_dir)
        tps = load_probe_tokens_per_s(probe_dir, warmup_steps=search["probe_warmup_steps"],
                                      tokens_per_step=spec.tokens_per_step) if status.status == "ok" else None
        results.append({"micro_batch_size": mbs, "status": status.status, "tokens_per_s": tps})
        log(f"    probe micro_batch_size {mbs}: {status.status}" + (f", {tps:,.0f} tokens/s" if tps else ""))
        if tps is None:
            continue
        if policy == "largest":
            break
        if best is not None and tps < best * (1 - SLOWER_STOP_FRACTION):
            break
        best = max(best or 0.0, tps)
    chosen = choose_micro_batch(results, policy=policy)
    if chosen is None:
        chosen = min(search["candidates"])
    per_dp = spec.fixed.global_batch_size // spec.dp_degree
    search.update(results=results, chosen=chosen)
    return dataclasses.replace(spec, micro_batch_size=chosen, num_microbatches=per_dp // chosen,
                               options={**spec.options, "micro_batch_search": search})
