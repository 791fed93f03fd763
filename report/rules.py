"""Conclusion rules: summary table in, findings out (the templates word them).

Each rule returns ``Finding``s -- a kind, the runs concerned, the evidence numbers and the
threshold it compared against. Thresholds live in ``THRESHOLDS`` (overridable by the
caller), never inline. Deliberately not here: wording, formatting, any file access.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

THRESHOLDS: dict[str, float] = {
    # a throughput margin counts as real only if it exceeds this multiple of the step-time
    # noise, noise = the larger relative (p90 - median) / median spread of the two runs
    "noise_multiple": 1.0,
    # below this fraction of free GPU memory a layout is "tight" (allocator, activations spikes)
    "memory_headroom_min": 0.10,
    # final losses of the same data/seed/steps should agree within this many nats
    "loss_agreement_nats": 0.05,
}


@dataclass(frozen=True, kw_only=True)
class Finding:
    """kind: rule id (the template words each kind); runs: run names concerned;
    evidence: named numbers/strings backing it (units in the names); threshold: value compared."""

    kind: str
    runs: tuple[str, ...] = ()
    evidence: Mapping[str, Any] = field(default_factory=dict)
    threshold: float | None = None


def _rel_spread(row: Mapping[str, Any]) -> float:
    return (row["step_time_p90_s"] - row["step_time_median_s"]) / row["step_time_median_s"]


def rule_fastest(rows: Sequence[Mapping[str, Any]], t: Mapping[str, float]) -> list[Finding]:
    """Fastest layout by tokens/s, its margin over each other run, and whether the margin to
    the runner-up exceeds the step-time noise (relative p90-median spread)."""
    ok = sorted((r for r in rows if r.get("tokens_per_s") is not None), key=lambda r: -r["tokens_per_s"])
    if not ok:
        return [Finding(kind="no_measured_runs")]
    best = ok[0]
    if len(ok) == 1:
        return [Finding(kind="single_run", runs=(best["run"],), evidence={"tokens_per_s": best["tokens_per_s"]})]
    out = [Finding(kind="fastest", runs=(best["run"],), evidence={
        "tokens_per_s": best["tokens_per_s"],
        "margins": tuple((r["run"], best["tokens_per_s"] / r["tokens_per_s"] - 1) for r in ok[1:])})]
    second = ok[1]
    margin = best["tokens_per_s"] / second["tokens_per_s"] - 1
    noise = max(_rel_spread(best), _rel_spread(second))
    kind = "beyond_noise" if margin > t["noise_multiple"] * noise else "within_noise"
    out.append(Finding(kind=kind, runs=(best["run"], second["run"]),
                       evidence={"margin": margin, "noise": noise}, threshold=t["noise_multiple"]))
    return out


def rule_memory(rows: Sequence[Mapping[str, Any]], gpu_memory_gib: float | None, t: Mapping[str, float]) -> list[Finding]:
    """Headroom = 1 - peak reserved / GPU memory per run; flags runs below the threshold."""
    measured = [r for r in rows if r.get("mem_peak_reserved_gib") is not None]
    if gpu_memory_gib is None or not measured:
        return [Finding(kind="memory_unknown")]
    out = []
    for r in measured:
        headroom = 1 - r["mem_peak_reserved_gib"] / gpu_memory_gib
        kind = "memory_tight" if headroom < t["memory_headroom_min"] else "memory_headroom"
        out.append(Finding(kind=kind, runs=(r["run"],), threshold=t["memory_headroom_min"], evidence={
            "mem_peak_reserved_gib": r["mem_peak_reserved_gib"], "gpu_memory_gib": gpu_memory_gib,
            "headroom": headroom}))
    return out


def rule_loss(rows: Sequence[Mapping[str, Any]], t: Mapping[str, float]) -> list[Finding]:
    """Same data, seed and steps should give the same final loss whatever the layout."""
    losses = [(r["run"], r["loss_last"]) for r in rows if r.get("loss_last") is not None]
    if len(losses) < 2:
        return []
    spread = max(v for _, v in losses) - min(v for _, v in losses)
    kind = "loss_agrees" if spread <= t["loss_agreement_nats"] else "loss_disagrees"
    return [Finding(kind=kind, runs=tuple(n for n, _ in losses), threshold=t["loss_agreement_nats"],
                    evidence={"loss_spread_nats": spread, "losses": tuple(losses)})]


def rule_failed(runs: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Runs that did not end ok are findings too (an OOM is an answer about memory)."""
    return [Finding(kind="failed", runs=(r["run"],), evidence={
        "status": r.get("status") or "no status.json", "exit_code": r.get("exit_code"), "cause": r.get("cause")})
        for r in runs if r.get("status") != "ok"]


def build_findings(
    summary_rows: Sequence[Mapping[str, Any]],
    run_rows: Sequence[Mapping[str, Any]],
    *,
    gpu_memory_gib: float | None,
    thresholds: Mapping[str, float] | None = None,
) -> list[Finding]:
    """All conclusion rules in order. summary_rows: report.metrics.summarize_runs records with
    NA as None; run_rows: Campaign.runs records. thresholds: overrides of ``THRESHOLDS``."""
    t = {**THRESHOLDS, **(thresholds or {})}
    ok_rows = [r for r, s in zip(summary_rows, run_rows) if s.get("status") == "ok"]
    return (rule_fastest(ok_rows, t) + rule_failed(run_rows) + rule_memory(ok_rows, gpu_memory_gib, t)
            + rule_loss(ok_rows, t))


def rule_conditions(
    run_rows: Sequence[Mapping[str, Any]], *, gpu_memory_gib: float | None, topology: str | None, num_params: int | None
) -> list[Finding]:
    """Conditions under which the answer changes, each with the measured/derived numbers it
    rests on: GPU count (world sizes measured), interconnect (topology recorded or not),
    model size and memory (16 bytes/param model states vs GPU memory; ZeRO paper section 3.1)."""
    world_sizes = tuple(sorted({int(r["world_size"]) for r in run_rows}))
    out = [Finding(kind="condition_gpu_count", evidence={"world_sizes": world_sizes})]
    out.append(Finding(kind="condition_interconnect", evidence={"topology_recorded": topology is not None}))
    if num_params is not None:
        ev: dict[str, Any] = {"num_params": num_params, "model_states_gib": 16 * num_params / 2**30}
        if gpu_memory_gib is not None:
            ev["gpu_memory_gib"] = gpu_memory_gib
            ev["max_params_unsharded"] = gpu_memory_gib * 2**30 / 16
        out.append(Finding(kind="condition_model_size", evidence=ev))
    return out
