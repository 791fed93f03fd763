"""`runner plan --calibration CAMPAIGN`: the compute rate each engine reached in a measured campaign.

Each ok GPU run's median step time (core.formulas' measured-step rule, as in the note's metric
table) is solved for the compute rate at which the performance model (core.perfmodel) reproduces
it -- the same solve the note's predicted block makes -- and divided by the GPU's dense peak
(core.hardware). Deliberately not here: the note (report), choosing layouts (runner.plan).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from core.errors import ConfigError, ToolError
from core.formulas import compute_step_times
from core.hardware import lookup_peak
from core.perfmodel import build_campaign_comm_model, build_run_layout, build_shape, find_campaign_gpu, solve_rate
from ingest.io import load_campaign, load_commbench


def calibrate_campaign(path: str | Path) -> dict[str, tuple[float, str]]:
    """engine -> (compute efficiency = solved rate / the GPU's dense peak, source), averaged over the
    campaign's ok GPU runs of that engine. Raises ConfigError for a CPU campaign or an unknown peak."""
    campaign = load_campaign(path)  # a campaign.json without 'fixed' is refused there (ParseError)
    fixed = campaign.campaign.fixed
    runs = campaign.run_records()
    gpu_name = find_campaign_gpu(runs, campaign.env)[0] if any(r.spec.device == "cuda" for r in runs) else None
    if gpu_name is None:
        raise ConfigError(f"--calibration {path}: not a GPU campaign; its rates do not carry to GPUs")
    peak = lookup_peak(gpu_name, fixed.dtype)
    if peak is None:
        raise ConfigError(f"--calibration {path}: no dense peak for {gpu_name} in hardware.toml")
    rows: list[dict] = []
    bench = Path(campaign.source) / "commbench"
    if bench.is_dir():
        try:
            rows = [r for r in load_commbench(bench) if r.get("device") == "cuda"]
        except ToolError:
            rows = []
    per_node = max([int(r.spec.world_size) for r in runs] + [1])
    comm, _ = build_campaign_comm_model(rows, gpu_name=gpu_name, gpus_per_node=max(per_node, 8))
    shape = build_shape(fixed.model, name=str(fixed.preset or "campaign model"))
    times = compute_step_times(campaign.steps, warmup_steps=int(fixed.warmup_steps))
    medians = {run: float(np.percentile(t.to_numpy(dtype=float), 50, method="linear"))
               for run, t in times.groupby("run")["step_time_s"]}
    by_engine: dict[str, list[float]] = {}
    for r in runs:
        median = medians.get(r.name)
        if r.status_name != "ok" or not median:
            continue
        try:
            rate = solve_rate(shape, build_run_layout(r.spec, compiled=r.compiled), fixed=fixed, comm=comm,
                              step_time_s=median, num_gpus_per_node=per_node)
        except ToolError:
            rate = None
        if rate:
            by_engine.setdefault(r.spec.engine, []).append(rate / peak.flops)
    return {e: (sum(v) / len(v), f"{path}: {len(v)} {gpu_name} run(s) of {e}, model rate / dense peak")
            for e, v in by_engine.items()}
