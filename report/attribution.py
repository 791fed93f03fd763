"""Section 5's cross-rank attribution view of one run (report.evidence's summaries of the
``attribution`` and ``collectives`` trace tables), shared by the campaign note (report.view) and
the triage of a folder of logs (report.triage).

Deliberately not here: computing the attribution (ingest.attribution), wording (templates).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from core.records import CommBenchRow, Plant, record_from_dict
from report import evidence as ev
from report import rules
from report.evidence import AttributionView

BANDWIDTH_MIN_BYTES = 1 << 20  # smaller collectives measure latency, not bandwidth


def run_plant(plant: Plant | None) -> dict[str, Any] | None:
    """A run's planted cause (the matrix's ``plant`` table, RunSpec.plant) as evidence: its set
    keys in name order, the layers per stage as a list; None when the run is not planted."""
    if plant is None:
        return None
    return {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(dataclasses.asdict(plant).items())
            if v is not None}


def build_attribution(trace_tables: Any, *, run: str, pp_degree: int, world_size: int, num_layers: int,
                      plant: Plant | None, host: str | None, commbench: Sequence[CommBenchRow],
                      median_step_s: float | None) -> AttributionView | None:
    """One run's cross-rank attribution view (None when the run has no attribution rows).
    host: the one host every rank ran on (None: several or unknown); commbench: `runner commbench`
    rows (``commbench_rows``) the collectives' bandwidth is compared with; num_layers: the model's
    (an even pipeline split when the plant does not say, 0: unknown)."""
    att = getattr(trace_tables, "attribution", None)
    if att is None or att.empty:
        return None
    s = ev.summarize_attribution(att, run=run, median_step_s=median_step_s)
    if s is None:
        return None
    hosts = {r: host for r in s["per_rank"]} if host else None
    straggler = ev.compute_trace_straggler(att, run=run, min_fraction=rules.THRESHOLDS["straggler_trace_min_fraction"],
                                           hosts=hosts)
    pp = int(pp_degree or 1)
    layers = (list(plant.pp_layers) if plant and plant.pp_layers
              else [num_layers // pp] * pp if pp > 1 and num_layers % pp == 0 else [])
    stages = ev.compute_stage_balance(att, run=run, pp_degree=pp, layers=layers,
                                      ranks_per_stage=int(world_size or pp) // pp)
    whatif = ev.summarize_whatif(getattr(trace_tables, "whatif", None), run=run) or {}
    collectives = getattr(trace_tables, "collectives", None)
    bandwidth = ev.compute_collective_bandwidth(collectives, run=run, commbench=commbench) if collectives is not None else []
    return AttributionView(
        breakdown_ms=s["breakdown_ms"], shares=s["shares"], traced_ms=s["traced_ms"],
        traced_median_ms=s["traced_median_ms"], traced_p90_ms=s["traced_p90_ms"],
        saving_ms=whatif.get("saving_ms", {}), saving_method=whatif.get("method", {}),
        replay_step_ms=whatif.get("replay_step_ms"), profile_host_ms=s["profile_host_ms"],
        per_rank=s["per_rank"], traced_step_s=s["traced_step_s"],
        median_step_s=s["median_step_s"], rescale=s["rescale"], num_launch_gaps=s["num_launch_gaps"],
        launch_gap_p50_s=s["launch_gap_p50_s"], launch_gap_max_s=s["launch_gap_max_s"], straggler=straggler,
        stages=stages, bandwidth=tuple(w for w in bandwidth if w.nbytes >= BANDWIDTH_MIN_BYTES)[:6],
        plant=plant if run_plant(plant) else None,
        groups=tuple(ev.compute_group_stragglers(collectives, run=run)) if collectives is not None else ())


def commbench_rows(source: str) -> list[CommBenchRow]:
    """SOURCE/commbench's rows (or a tables folder's commbench.parquet), or [] (none, or unreadable)."""
    from core.errors import ToolError
    from ingest.io import find_commbench, load_commbench

    bench = find_commbench(source)
    if bench is None:
        return []
    try:
        rows = load_commbench(bench)
    except ToolError:
        return []
    return [record_from_dict(CommBenchRow, r, where=str(bench))[0] for r in rows]
