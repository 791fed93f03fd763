"""`summary.json`: the note's numbers in a machine-readable record, for notebooks, dashboards
and `report diff`.

Built from the one view-model (report.view.Note) the note renders, so every number equals its
table cell before formatting; nothing is computed here beyond picking fields. Deliberately not
here: file access (report.render writes it through ingest.io), formatting, any metric.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.records import TRANSFER_AT_COMMBENCH, RunSummary
from report.attribution import run_plant
from report.rules import evidence_items
from report.view import Note

SUMMARY_SCHEMA_VERSION = 2  # 2: campaign caveats once at the top level, not in every run
# section 5 categories; each run's "<name>_share" of the traced step time
BREAKDOWN_SHARES = ("compute_share", "exposed_comm_share", "bubble_share", "data_stall_share", "other_share")
# env.json "versions" keys worth comparing across campaigns (report diff)
VERSION_KEYS = ("torch", "cuda", "nccl", "deepspeed", "megatron_core")


def _num(x: Any) -> Any:
    """NaN and +-inf -> None (JSON has neither: a diverged loss of inf is "n/a" here, as in the
    note); everything else unchanged."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _jsonable(x: Any) -> Any:
    if isinstance(x, Mapping):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (str, bool, int)):
        return x
    if isinstance(x, float):
        return _num(x)
    if hasattr(x, "item"):  # numpy scalar
        return _jsonable(x.item())
    return str(x)


@dataclass(frozen=True, kw_only=True)
class EnvironmentSummary:
    """The environment fields a comparison cares about (None where env.json does not say): GPU
    name(s) and count, driver, the VERSION_KEYS library versions, node count, tool commit, and
    the campaign's fixed variables (model shape as one line, global batch in samples, dtype):
    across different ones a comparison is not like for like."""

    gpu_name: str | None = None
    gpu_count: int | None = None
    driver_version: str | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    nccl_version: str | None = None
    deepspeed_version: str | None = None
    megatron_core_version: str | None = None
    num_nodes: int | None = None
    tool_git_commit: str | None = None
    model: str | None = None
    global_batch_size: int | None = None
    dtype: str | None = None


@dataclass(frozen=True, kw_only=True)
class BreakdownShares:
    """One traced run's section-5 shares of its traced step time (BREAKDOWN_SHARES), fractions."""

    compute_share: float | None = None
    exposed_comm_share: float | None = None
    bubble_share: float | None = None
    data_stall_share: float | None = None
    other_share: float | None = None


@dataclass(frozen=True, kw_only=True)
class CampaignSummary:
    """One campaign as `report diff` compares it: its name, creation time and tool commit, the
    MFU convention, the environment, every run's metric-table row (report.metrics.summarize_runs,
    campaign order) and the traced runs' section-5 shares (run -> shares)."""

    campaign: str
    created_at: str | None = None
    tool_git_commit: str | None = None
    mfu_convention: str | None = None
    environment: EnvironmentSummary = field(default_factory=EnvironmentSummary)
    runs: tuple[RunSummary, ...] = ()
    shares: Mapping[str, BreakdownShares] = field(default_factory=dict)


def build_environment_summary(note: Note) -> EnvironmentSummary:
    """The note's EnvironmentSummary (env.json and campaign.json's fixed variables)."""
    env, m = note.env, note.model
    versions = dict(env.versions)
    gpu_names = sorted({g.name for g in env.gpus if g.name})
    drivers = sorted({g.driver_version for g in env.gpus if g.driver_version})
    return EnvironmentSummary(
        gpu_name=", ".join(gpu_names) or None, gpu_count=len(env.gpus), driver_version=", ".join(drivers) or None,
        **{f"{k}_version": versions.get(k) for k in VERSION_KEYS},
        num_nodes=env.num_nodes or 1, tool_git_commit=note.tool_git_commit,
        model=(f"{m.preset}: {m.num_layers} layers, hidden {m.hidden_size}, {m.num_heads} heads, seq {m.seq_length}, "
               f"vocab {m.vocab_size}"),
        global_batch_size=m.global_batch_size, dtype=m.dtype)


def build_campaign_summary(note: Note) -> CampaignSummary:
    """The note -> what `report diff` compares (the same numbers summary.json holds)."""
    return CampaignSummary(
        campaign=note.campaign, created_at=note.created_at, tool_git_commit=note.tool_git_commit,
        mfu_convention=note.convention, environment=build_environment_summary(note), runs=tuple(note.metrics),
        shares={b.run: BreakdownShares(**{k: _num(getattr(b, k)) for k in BREAKDOWN_SHARES})
                for b in note.evidence.rows})


def build_run_caveats(note: Note) -> tuple[list[dict[str, Any]], dict[str, list[str]], dict[str, list[int]]]:
    """The note's caveats as plain English sentences (the note words the same findings through
    its templates; these are for machines and diffs), each written once so the record grows
    linearly with the run count: (campaign caveats, run -> its own, run -> indices).

    campaign caveats: ``{"kind", "runs", "text"}`` for every caveat that is not one run's own --
    ``runs`` empty for one about the whole campaign (it applies to every run), else the runs it
    names; run -> its own: the texts of the caveats naming that run alone; run -> indices: the
    positions in the campaign list of the caveats naming that run among others."""
    names = {m.run for m in note.metrics}
    campaign: list[dict[str, Any]] = []
    own: dict[str, list[str]] = {run: [] for run in names}
    refs: dict[str, list[int]] = {run: [] for run in names}
    for f in note.caveats:
        text = caveat_text(f)
        if not text:
            continue
        if len(f.runs) == 1 and f.runs[0] in own:
            own[f.runs[0]].append(text)
            continue
        for run in dict.fromkeys(f.runs):
            if run in refs:
                refs[run].append(len(campaign))
        campaign.append({"kind": f.kind, "runs": list(f.runs), "text": text})
    return campaign, own, refs


def caveat_text(f: Any) -> str:
    """One caveat finding as a short English sentence with its evidence numbers."""
    ev = {k: _jsonable(v) for k, v in evidence_items(f).items()}
    if "text" in ev and len(ev) == 1:
        return str(ev["text"])
    return f"{f.kind}: " + ", ".join(f"{k}={v}" for k, v in sorted(ev.items()))


def build_summary(note: Note) -> dict[str, Any]:
    """Note -> the summary record (plain JSON types, None for missing values).

    Per run: status, throughput (tokens/s, per GPU or process), MFU with its FLOPs/token
    convention and peak source, step time median/p90 (s), memory peaks (GiB), data wait (s),
    loss first/last, the section-5 shares when the run was traced, and its caveats (its own as
    text, the others as indices into the top-level ``caveats``: ``build_run_caveats``)."""
    peak = note.peaks[0] if len(note.peaks) == 1 else None  # one GPU model and dtype: the runs share it
    shares = {b.run: {k: _num(getattr(b, k)) for k in BREAKDOWN_SHARES} | {"timeline": b.timeline,
                                                                           "step_time_s": _num(b.step_time_s)}
              for b in note.evidence.rows}
    attributed = {b.run: b.attribution for b in note.evidence.rows if b.attribution is not None}
    campaign_caveats, caveats, caveat_refs = build_run_caveats(note)
    parity = {p.run: p for p in note.parity}
    health = {h.run: h for h in note.health.runs} if note.health is not None else {}
    runs = []
    for m in note.metrics:
        a = attributed.get(m.run)
        runs.append({
            "run": m.run, "status": m.status, "partial": m.partial, "num_steps_measured": m.num_steps_measured,
            "tokens_per_s": _num(m.tokens_per_s), "tokens_per_s_per_gpu": _num(m.tokens_per_s_per_gpu),
            "per_unit": note.per_unit,
            "mfu": _num(m.mfu), "mfu_convention": note.convention, "mfu_6n": _num(m.mfu_6n),
            "mfu_causal": _num(m.mfu_causal),
            "peak_flops": peak.flops if peak else None, "peak_source": peak.source if peak else None,
            "step_time_median_s": _num(m.step_time_median_s), "step_time_p90_s": _num(m.step_time_p90_s),
            "mem_peak_allocated_gib": _num(m.mem_peak_allocated_gib),
            "mem_peak_reserved_gib": _num(m.mem_peak_reserved_gib),
            "data_wait_median_s": _num(m.data_wait_median_s),
            "loss_first": _num(m.loss_first), "loss_last": _num(m.loss_last),
            "health": _health(health.get(m.run)),
            "breakdown": shares.get(m.run),
            # section 5 across ranks (report.evidence.summarize_attribution): ms per traced step, the
            # kernels' own time; the same with the profiled steps' extra host time taken out to reach
            # the unprofiled median step; each category's median and p90 over the traced steps; what
            # removing each category's cause saves (ingest.whatif)
            "breakdown_ms": dict(a.traced_ms) if a else None,
            "breakdown_median_ms": dict(a.breakdown_ms) if a else None,
            "breakdown_step_p50_ms": dict(a.traced_median_ms) if a else None,
            "breakdown_step_p90_ms": dict(a.traced_p90_ms) if a else None,
            "whatif_saving_ms": {c: a.saving_ms.get(c) for c in a.traced_ms} if a else None,
            "whatif_method": {c: a.saving_method.get(c) for c in a.traced_ms} if a else None,
            # every collective at `runner commbench`'s time for its op, size and group size (None: no commbench)
            "whatif_transfer_at_commbench_ms": a.saving_ms.get(TRANSFER_AT_COMMBENCH) if a else None,
            "replay_step_ms": a.replay_step_ms if a else None,
            "straggler": ({"rank": a.straggler.rank, "host": a.straggler.host,
                           "late_ms_median": a.straggler.late_ms_median}
                          if a and a.straggler and a.straggler.named else None),
            "caveats": caveats.get(m.run, []),  # the run's own; the campaign's are in the top-level "caveats"
            "campaign_caveats": caveat_refs.get(m.run, []),
            "plant": run_plant(a.plant) if a else None,
            "plant_checks": [dataclasses.asdict(c) for c in note.evidence.plant_checks if c.run == m.run],
            "checkpoint_save_s": _num(m.ckpt_save_s), "checkpoint_load_s": _num(m.ckpt_load_s),
            "checkpoint_size_gib": m.ckpt_size_bytes / 2**30 if m.ckpt_size_bytes is not None else None,
            # report.parity: the kernels the run used and its kernel time per token by class (ms);
            # pass None where not checked (not at equal math, no trace, nothing to compare with)
            "kernels": _kernels(parity.get(m.run)),
            "parity": ({"ms_per_token": dict(parity[m.run].ms_per_token) or None, "pass": parity[m.run].passed,
                        "reason": parity[m.run].reason} if m.run in parity else None),
        })
    return _jsonable({
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "campaign": note.campaign,
        "created_at": note.created_at,
        "tool_version": note.tool_version,
        "tool_git_commit": note.tool_git_commit,
        "environment": dataclasses.asdict(build_environment_summary(note)),
        "flops_per_token": note.flops_per_token,
        "mfu_convention": note.convention,
        "peaks": [{"gpu_name": p.gpu_name, "dtype": p.dtype, "flops": p.flops, "source": p.source} for p in note.peaks],
        # every caveat not one run's own, once (runs [] = the whole campaign; runs name the others)
        "caveats": campaign_caveats,
        "runs": runs,
        # layouts run more than once: median tokens/s and the 95% interval across repeats
        "repeats": [{"layout": g.layout, "data_round": g.data_round, "kernels": g.mode, "runs": list(g.runs),
                     "tokens_per_s": list(g.tokens_per_s), "median_tokens_per_s": g.median_tokens_per_s,
                     "interval": [g.ci_low, g.ci_high] if g.ci_low is not None else None,
                     "interval_method": note.interval_method, "representative": g.representative}
                    for g in note.repeats],
        # the training-health rule report.health applied (report.rules.THRESHOLDS)
        "health_rule": dataclasses.asdict(note.health.rule) if note.health is not None else None,
        "findings": [{"kind": f.kind, "runs": list(f.runs), "evidence": evidence_items(f), "threshold": f.threshold}
                     for f in (*note.findings, *(note.data_round.findings if note.data_round else ()))],
        # report.overlap: each layout with its overlap switches on and off (s; see its module docstring)
        "overlap_pairs": ([dataclasses.asdict(p) for p in note.overlap.pairs] if note.overlap is not None else None),
        # report.predict: leave-one-out checks on these runs and predicted (not measured) layouts
        "predicted": dataclasses.asdict(note.predicted) if note.predicted is not None else None,
    })


def _health(h: Any) -> dict[str, Any] | None:
    """A report.health.RunHealth as the record's ``health``: the verdict, why, and the flagged steps."""
    if h is None:
        return None
    return {"verdict": h.verdict, "reasons": list(h.reasons), "loss_spike_steps": list(h.spike_steps),
            "diverged_at_step": h.diverged_at_step, "divergence": h.divergence,
            "grad_norm_recorded": h.grad_norm_recorded, "grad_norm_explosion_steps": list(h.explosion_steps),
            "loss_spikes": [dataclasses.asdict(s) for s in h.spikes],
            "grad_norm_explosions": [dataclasses.asdict(e) for e in h.explosions],
            "rank_step_times": [dataclasses.asdict(r) for r in h.rank_step_times]}


def _kernels(p: Any) -> dict[str, Any] | None:
    if p is None or p.mode == "unrecorded":
        return None
    return {"mode": p.mode, "loss": p.loss, "attention": p.attention, "optimizer": p.optimizer,
            "compile": p.compile, "not_taken": dict(p.not_taken)}


def render_summary_json(summary: Mapping[str, Any]) -> bytes:
    """The summary record as UTF-8 JSON (indented, keys in build order, no NaN)."""
    return (json.dumps(summary, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode()
