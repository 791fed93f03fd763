"""Conclusion rules: summary table in, findings out (the templates word them).

Each rule returns ``Finding``s -- a kind, the runs concerned, the evidence numbers and the
threshold it compared against. Thresholds live in ``THRESHOLDS`` (overridable by the
caller), never inline. Deliberately not here: wording, formatting, any file access.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
import re
from typing import Any

from core.memory import STATE_BYTES
from core.records import LoadedRun, RunSpec, RunSummary
from report.evidence import BreakdownRow, KernelShares
from report.metrics import compute_step_spread
from report.health import RunHealth
from report.i18n import N_

THRESHOLDS: dict[str, float] = {
    # a throughput margin counts as real only if it exceeds this multiple of the step-time
    # noise, noise = the larger relative (p90 - median) / median spread of the two runs
    "noise_multiple": 1.0,
    # below this fraction of free GPU memory a layout is "tight" (allocator, activations spikes)
    "memory_headroom_min": 0.10,
    # final losses of the same data/seed/steps should agree within this many nats
    "loss_agreement_nats": 0.05,
    # a rank is a straggler when it enters the step this long after the first rank (median over
    # steps), both in seconds and as a fraction of the median step time
    "straggler_lag_min_s": 0.005,
    "straggler_lag_min_fraction": 0.05,
    # a rank is the traces' straggler when the wait it causes inside the step (median over the
    # traced steps) is at least this fraction of the traced step
    "straggler_trace_min_fraction": 0.02,
    # one layout under several engines: a tokens/s ratio - 1 below this is engine parity (and it
    # must also exceed noise_multiple x the step-to-step spread to count as a gap)
    "engine_gap_min": 0.05,
    # a breakdown category "dominates" an engine gap when it holds at least this share of it
    "engine_gap_dominant_min": 0.5,
    # kernel parity at equal math (report.parity): a non-communication kernel class may differ from
    # the median of the equal-math runs by this fraction; differences below parity_min_share of the
    # run's non-communication time per token are ignored (classes of a few microseconds)
    "parity_tolerance": 0.10,
    "parity_min_share": 0.01,
    # training health (report.health): a loss spike is a loss above the median of the up to
    # loss_spike_window_steps finite losses before it (at least loss_spike_min_window_steps) by more
    # than loss_spike_k SDs of their step-to-step noise and by more than loss_spike_min_nats; the
    # committed GPU campaigns' healthy runs reach 2.7 SDs and 0.02 nats
    "loss_spike_window_steps": 20,
    "loss_spike_min_window_steps": 5,
    "loss_spike_k": 6.0,
    "loss_spike_min_nats": 0.1,
    # a run diverged when a loss is non-finite or above its first step's loss by more than this
    "loss_diverge_nats": 1.0,
    # a gradient norm explodes when non-finite or above this multiple of the median norm of the
    # loss_spike_window_steps steps before it (the committed healthy runs reach 3.0x)
    "grad_norm_explode_multiple": 10.0,
}


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """A finding's evidence: one record per kind (the subclasses here and in report.parity,
    report.data_rounds and report.view); this base, empty, for a kind with nothing to cite."""


@dataclass(frozen=True, kw_only=True)
class Finding:
    """kind: rule id (the template words each kind); runs: run names concerned;
    evidence: the named numbers/strings backing it (units in the names), the kind's Evidence
    record; threshold: value compared."""

    kind: str
    runs: tuple[str, ...] = ()
    evidence: Evidence = field(default_factory=Evidence)
    threshold: float | None = None


def evidence_items(finding: Finding) -> dict[str, Any]:
    """A finding's evidence as name -> value, in the record's field order (summary.json, caveats)."""
    return dataclasses.asdict(finding.evidence)


@dataclass(frozen=True, kw_only=True)
class SingleRunEvidence(Evidence):
    """single_run: the one ranked run's tokens/s."""

    tokens_per_s: float


@dataclass(frozen=True, kw_only=True)
class FastestEvidence(Evidence):
    """fastest: its tokens/s and median step (s); margins: (run, tokens/s ratio - 1, that run's
    median step s) for every other ranked run, fastest first."""

    tokens_per_s: float
    step_time_median_s: float
    margins: tuple[tuple[str, float, float], ...]


@dataclass(frozen=True, kw_only=True)
class NoiseEvidence(Evidence):
    """beyond_noise / within_noise: the fastest run's margin over the runner-up (tokens/s ratio
    - 1) against the larger relative (p90 - median) step spread of the two."""

    margin: float
    noise: float


@dataclass(frozen=True, kw_only=True)
class PartialEvidence(Evidence):
    """excluded_partial: (run, status, failed_at_step) of each run with numbers that did not end ok."""

    statuses: tuple[tuple[str, str, int | None], ...]


@dataclass(frozen=True, kw_only=True)
class MemoryEvidence(Evidence):
    """memory_tight / memory_headroom: peak reserved and GPU memory (GiB), headroom = 1 - their ratio."""

    mem_peak_reserved_gib: float
    gpu_memory_gib: float
    headroom: float


@dataclass(frozen=True, kw_only=True)
class LossEvidence(Evidence):
    """loss_agrees / loss_disagrees (rule_loss): the largest loss spread across the runs (nats),
    at worst_step (None: the final losses'), compared from from_step; the final losses' spread;
    (run, final loss) per run."""

    loss_spread_nats: float
    worst_step: int | None
    from_step: int
    final_spread_nats: float
    losses: tuple[tuple[str, float], ...]


@dataclass(frozen=True, kw_only=True)
class UnhealthyEvidence(Evidence):
    """excluded_unhealthy (rule_unhealthy): why (report.health HEALTH_REASONS), the divergence
    and the first gradient explosion (None where none), and the two thresholds."""

    reasons: tuple[str, ...]
    diverged_at_step: int | None
    divergence: str | None
    divergence_loss: float | None
    loss_first: float | None
    explosion_step: int | None
    explosion_non_finite: bool | None
    explosion_grad_norm: float | None
    explosion_ratio: float | None
    loss_diverge_nats: float
    grad_norm_explode_multiple: float


@dataclass(frozen=True, kw_only=True)
class StragglerEvidence(Evidence):
    """straggler (rule_straggler): the late rank, its median lag entering the step (s) and as a
    fraction of the median step, the share of steps it entered last, the median step (s)."""

    rank: int
    lag_median_s: float
    lag_fraction: float
    last_share: float
    step_time_median_s: float


@dataclass(frozen=True, kw_only=True)
class FailureEvidence(Evidence):
    """oom / crash / hang / timeout (rule_failed): status.json's status, exit code and cause, the
    first step not completed by every rank (None: unknown), the engine; timeout has nothing more."""

    status: str
    exit_code: int | None
    cause: str | None
    failed_at_step: int | None
    engine: str


@dataclass(frozen=True, kw_only=True)
class OomEvidence(FailureEvidence):
    """oom: the rank and allocator message (status.json diagnosis, else the cause) and the layout
    that did not fit."""

    rank: int | None
    message: str | None
    strategy: str
    world_size: int
    tp_degree: int
    pp_degree: int
    dp_degree: int
    micro_batch_size: int
    device: str


@dataclass(frozen=True, kw_only=True)
class CrashEvidence(FailureEvidence):
    """crash: the rank that raised and its exception (status.json diagnosis; None: unknown)."""

    rank: int | None
    exception: str | None


@dataclass(frozen=True, kw_only=True)
class HangEvidence(FailureEvidence):
    """hang: where the per-rank evidence comes from (py-spy or the flight recorder) and how many ranks it covers."""

    source: str | None
    num_ranks_diagnosed: int


@dataclass(frozen=True, kw_only=True)
class GpuCountEvidence(Evidence):
    """condition_gpu_count: the measured world sizes, (n, ring all-reduce factor 2(n-1)/n) for
    them and 8, basis, no_comm (every run on one process), on_gpu."""

    world_sizes: tuple[int, ...]
    allreduce_factors: tuple[tuple[int, float], ...]
    basis: str
    no_comm: bool
    on_gpu: bool


@dataclass(frozen=True, kw_only=True)
class InterconnectEvidence(Evidence):
    """condition_interconnect: basis, GPUs in env.json, whether a topology was recorded, and the
    NVLink cells (NV<k>) seen in it."""

    basis: str
    num_gpus: int
    topology_recorded: bool
    nvlink: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class ModelSizeEvidence(Evidence):
    """condition_model_size: parameters, dtype, (label, bytes) per model state and their sum per
    parameter, the model states' bytes; with a known GPU memory (GiB) the parameter count at
    which unsharded states fill it (else None)."""

    basis: str
    num_params: int
    dtype: str | None
    bytes_parts: tuple[tuple[str, int], ...]
    bytes_per_param: int
    model_states_bytes: int
    gpu_memory_gib: float | None = None
    max_params_unsharded: float | None = None


def rule_fastest(rows: Sequence[RunSummary], t: Mapping[str, float]) -> list[Finding]:
    """Fastest layout by tokens/s among runs that ended ok, its margin over each other run
    (tokens/s ratio - 1, with both median step times), and whether the margin to the runner-up
    exceeds the within-run step-to-step spread (relative p90-median) of the two runs. One run
    per layout: run-to-run variation is not measured, and the wording says so."""
    ok = sorted((r for r in rows if r.tokens_per_s is not None), key=lambda r: -r.tokens_per_s)
    if not ok:
        return [Finding(kind="no_measured_runs")]
    best = ok[0]
    if len(ok) == 1:
        return [Finding(kind="single_run", runs=(best.run,), evidence=SingleRunEvidence(tokens_per_s=best.tokens_per_s))]
    out = [Finding(kind="fastest", runs=(best.run,), evidence=FastestEvidence(
        tokens_per_s=best.tokens_per_s, step_time_median_s=best.step_time_median_s,
        margins=tuple((r.run, best.tokens_per_s / r.tokens_per_s - 1, r.step_time_median_s) for r in ok[1:])))]
    second = ok[1]
    margin = best.tokens_per_s / second.tokens_per_s - 1
    noise = max(compute_step_spread(best), compute_step_spread(second))
    kind = "beyond_noise" if margin > t["noise_multiple"] * noise else "within_noise"
    out.append(Finding(kind=kind, runs=(best.run, second.run),
                       evidence=NoiseEvidence(margin=margin, noise=noise), threshold=t["noise_multiple"]))
    return out


def rule_partial(rows: Sequence[RunSummary]) -> list[Finding]:
    """Runs that did not end ok but have measured steps: their numbers are in the table,
    marked partial, and left out of the ranking. rows: the runs that did not end ok."""
    partial = [r for r in rows if r.tokens_per_s is not None]
    if not partial:
        return []
    return [Finding(kind="excluded_partial", runs=tuple(r.run for r in partial), evidence=PartialEvidence(
        statuses=tuple((r.run, r.status, r.failed_at_step) for r in partial)))]


def rule_memory(rows: Sequence[RunSummary], gpu_memory_gib: float | None, t: Mapping[str, float],
                *, on_gpu: bool = True) -> list[Finding]:
    """Headroom = 1 - peak reserved / GPU memory per run; flags runs below the threshold.
    on_gpu False (a CPU campaign): one ``memory_cpu`` finding (no device allocator to read)."""
    if not on_gpu:
        return [Finding(kind="memory_cpu")]
    measured = [r for r in rows if r.mem_peak_reserved_gib is not None]
    if gpu_memory_gib is None or not measured:
        return [Finding(kind="memory_unknown")]
    out = []
    for r in measured:
        headroom = 1 - r.mem_peak_reserved_gib / gpu_memory_gib
        kind = "memory_tight" if headroom < t["memory_headroom_min"] else "memory_headroom"
        out.append(Finding(kind=kind, runs=(r.run,), threshold=t["memory_headroom_min"], evidence=MemoryEvidence(
            mem_peak_reserved_gib=r.mem_peak_reserved_gib, gpu_memory_gib=gpu_memory_gib, headroom=headroom)))
    return out


def rule_loss(rows: Sequence[RunSummary], t: Mapping[str, float],
              curves: Mapping[str, Mapping[int, float]] | None = None, *, from_step: int = 0) -> list[Finding]:
    """Same data, seed and steps should give the same loss at every step whatever the layout.

    curves: run -> step -> loss (mean over the ranks reporting it); the spread is the largest
    max - min across the runs over the steps they all report from ``from_step`` on (the first
    measured step; worst_step: where); without curves, the final losses'. The warm-up steps are
    left out as from every measured number, and for a reason of their own: Adam's first updates
    are m/sqrt(v) = +-1 per element (Kingma & Ba 2015, Algorithm 1, bias-corrected), so kernels
    that round a tiny gradient differently make whole-size update differences there (bf16 runs of
    one model differ by up to 0.07 nats at step 1, 0.03 after step 10). Evidence:
    loss_spread_nats, worst_step, from_step, final_spread_nats, losses (final, per run)."""
    losses = [(r.run, r.loss_last) for r in rows if r.loss_last is not None]
    if len(losses) < 2:
        return []
    final = max(v for _, v in losses) - min(v for _, v in losses)
    spread, worst = final, None
    names = [n for n, _ in losses]
    if curves and all(n in curves for n in names):
        common = sorted(set.intersection(*(set(curves[n]) for n in names)))
        for step in (s for s in common if s >= from_step):
            values = [curves[n][step] for n in names]
            gap = max(values) - min(values)
            if worst is None or gap > spread:
                spread, worst = gap, step
        spread = max(spread, final)
    kind = "loss_agrees" if spread <= t["loss_agreement_nats"] else "loss_disagrees"
    return [Finding(kind=kind, runs=tuple(names), threshold=t["loss_agreement_nats"],
                    evidence=LossEvidence(loss_spread_nats=spread, worst_step=worst, from_step=from_step,
                                          final_spread_nats=final, losses=tuple(losses)))]


FAILURE_STATUSES = ("oom", "crash", "hang", "timeout")


def rule_failed(runs: Sequence[LoadedRun], *, failed_at_step: Mapping[str, int | None] | None = None) -> list[Finding]:
    """Runs that failed (oom / crash / hang / timeout) are findings too: an OOM is an answer
    about memory. failed_at_step: run -> first step not completed by every rank (or None).
    Interrupted, unfinished, skipped and unknown statuses are not findings about the layout (caveats)."""
    out = []
    for r in runs:
        status, spec = r.status_name, r.spec
        if status not in FAILURE_STATUSES:
            continue
        diagnosis = r.status.diagnosis or {}
        base = dict(status=status, exit_code=r.status.exit_code, cause=r.status.cause,
                    failed_at_step=(failed_at_step or {}).get(r.name), engine=spec.engine)
        ev: FailureEvidence
        if status == "oom":
            ev = OomEvidence(**base, rank=diagnosis.get("rank"), message=diagnosis.get("message") or r.status.cause,
                             strategy=spec.strategy, world_size=spec.world_size, tp_degree=spec.tp_degree,
                             pp_degree=spec.pp_degree, dp_degree=spec.dp_degree,
                             micro_batch_size=spec.micro_batch_size, device=spec.device)
        elif status == "crash":
            ev = CrashEvidence(**base, rank=diagnosis.get("rank"), exception=diagnosis.get("exception"))
        elif status == "hang":
            ev = HangEvidence(**base, source=diagnosis.get("source"),
                              num_ranks_diagnosed=len(diagnosis.get("ranks") or {}))
        else:
            ev = FailureEvidence(**base)
        out.append(Finding(kind=status, runs=(r.name,), evidence=ev))
    return out


def build_findings(
    summary_rows: Sequence[RunSummary],
    run_rows: Sequence[LoadedRun],
    *,
    gpu_memory_gib: float | None,
    on_gpu: bool = True,
    thresholds: Mapping[str, float] | None = None,
    ranked: Sequence[bool] | None = None,
    loss_curves: Mapping[str, Mapping[int, float]] | None = None,
    loss_from_step: int = 0,
    health: Sequence[RunHealth] = (),
) -> list[Finding]:
    """All conclusion rules in order. summary_rows: report.metrics.summarize_runs records; run_rows: the campaign's runs
    (same order). Only runs with status "ok" are ranked; the others' numbers are partial.
    thresholds: overrides of ``THRESHOLDS``. ranked: which rows enter the ranking and the loss
    agreement (default all; a campaign with data rounds ranks its first round's runs, whose
    data and losses compare like for like). loss_curves: run -> step -> loss (rule_loss compares
    every common step from ``loss_from_step``, the first measured one, not only the last).
    health: report.health records; an unhealthy run is neither ranked nor in the loss agreement
    (rule_unhealthy says why)."""
    t = {**THRESHOLDS, **(thresholds or {})}
    ranked = [True] * len(summary_rows) if ranked is None else list(ranked)
    unhealthy = {h.run for h in health if h.verdict == "unhealthy"}
    ok_rows = [r for r, s in zip(summary_rows, run_rows) if s.status_name == "ok"]
    ranked_ok = [r for r, s, k in zip(summary_rows, run_rows, ranked)
                 if s.status_name == "ok" and k and r.run not in unhealthy]
    partial_rows = [r for r, s in zip(summary_rows, run_rows) if s.status_name != "ok"]
    failed_at_step = {s.run: s.failed_at_step for s in summary_rows}
    return (rule_fastest(ranked_ok, t) + rule_unhealthy(health, t) + rule_partial(partial_rows)
            + rule_failed(run_rows, failed_at_step=failed_at_step)
            + rule_memory(ok_rows, gpu_memory_gib, t, on_gpu=on_gpu) + rule_loss(ranked_ok, t, loss_curves, from_step=loss_from_step)
            + rule_straggler(summary_rows, t))


def rule_unhealthy(health: Sequence[RunHealth], t: Mapping[str, float]) -> list[Finding]:
    """One ``excluded_unhealthy`` finding per run whose training was unhealthy (report.health):
    its speed numbers are shown, marked, and never ranked. Evidence: reasons (HEALTH_REASONS),
    diverged_at_step, divergence, divergence_loss, loss_first (nats), the first gradient
    explosion's step, norm and ratio to the median before it (None where none), and the
    thresholds loss_diverge_nats and grad_norm_explode_multiple."""
    out = []
    for h in health:
        if h.verdict != "unhealthy":
            continue
        boom = h.explosions[0] if h.explosions else None
        out.append(Finding(kind="excluded_unhealthy", runs=(h.run,), evidence=UnhealthyEvidence(
            reasons=h.reasons, diverged_at_step=h.diverged_at_step, divergence=h.divergence,
            divergence_loss=h.divergence_loss, loss_first=h.loss_first,
            explosion_step=boom.step if boom else None, explosion_non_finite=boom.non_finite if boom else None,
            explosion_grad_norm=boom.grad_norm if boom else None, explosion_ratio=boom.ratio if boom else None,
            loss_diverge_nats=t["loss_diverge_nats"], grad_norm_explode_multiple=t["grad_norm_explode_multiple"])))
    return out


def rule_straggler(rows: Sequence[RunSummary], t: Mapping[str, float]) -> list[Finding]:
    """A rank that enters the step last by more than the thresholds (report.metrics.compute_straggler)."""
    out = []
    for r in rows:
        lag, median = r.straggler_lag_median_s, r.step_time_median_s
        if lag is None or not median:
            continue
        if lag >= t["straggler_lag_min_s"] and lag / median >= t["straggler_lag_min_fraction"]:
            out.append(Finding(kind="straggler", runs=(r.run,), threshold=t["straggler_lag_min_fraction"],
                               evidence=StragglerEvidence(rank=r.straggler_rank, lag_median_s=lag,
                                                          lag_fraction=lag / median, last_share=r.straggler_last_share,
                                                          step_time_median_s=median)))
    return out


# Model-state bytes per parameter with Adam, labelled: (label, bytes) for weights, grads and the
# optimizer's states (core.memory.STATE_BYTES). The labels are English messages (report.i18n.N_),
# translated by the template.
_STATE_LABELS = {"bf16": (N_("weights"), N_("grads"), N_("fp32 master weights, m and v")),
                 "fp32": (N_("weights"), N_("grads"), N_("m and v"))}
MODEL_STATE_BYTES = {dtype: tuple(zip(_STATE_LABELS["fp32" if dtype == "fp32" else "bf16"], STATE_BYTES[dtype]))
                     for dtype in STATE_BYTES}


def _nvlink_in_topology(topology: str) -> tuple[str, ...]:
    """NVLink cells (``NV<k>``) of the GPU rows of ``nvidia-smi topo -m`` (legend lines excluded)."""
    cells = [c for line in topology.splitlines() if line.strip().startswith("GPU")
             for c in line.split()[1:] if re.fullmatch(r"NV\d+", c)]
    return tuple(sorted(set(cells)))


def rule_conditions(
    run_rows: Sequence[LoadedRun], *, gpu_memory_gib: float | None, topology: str | None,
    num_params: int | None, num_gpus: int = 0, dtype: str | None = None,
) -> list[Finding]:
    """Conditions under which the answer changes. Each finding carries ``basis``: "rule of
    thumb" (published, not measured here: its source in ``source``) or "computed" (from
    recorded numbers), so the note never presents an unmeasured claim as measured.

    - GPU count: ring all-reduce sends 2(n-1)/n x Psi gradient elements per GPU per step (the
      NCCL bus-bandwidth factor; nccl-tests doc/PERFORMANCE.md), nearly constant in n; ZeRO-3
      moves 1.5x DDP's volume (ZeRO paper section 7.2.2). The factor is computed for the
      measured world sizes and for 8.
    - Interconnect (GPU campaigns only): TP = 4 all-reduces per layer per micro-batch
      (Megatron-LM, Shoeybi et al. 2019, section 3); NVLink seen in the recorded topology.
    - Model size: 16 bytes/param of Adam model states (``MODEL_STATE_BYTES``) vs GPU memory."""
    world_sizes = tuple(sorted({int(r.spec.world_size) for r in run_rows}))
    factors = tuple((n, 2 * (n - 1) / n) for n in sorted(set(world_sizes) | {8}))
    out = [Finding(kind="condition_gpu_count", evidence=GpuCountEvidence(
        world_sizes=world_sizes, allreduce_factors=factors, basis="rule of thumb", no_comm=world_sizes == (1,),
        on_gpu=num_gpus > 0))]
    if num_gpus > 0:
        out.append(Finding(kind="condition_interconnect", evidence=InterconnectEvidence(
            basis="rule of thumb", num_gpus=num_gpus, topology_recorded=topology is not None,
            nvlink=_nvlink_in_topology(topology) if topology else ())))
    if num_params is not None:
        parts = MODEL_STATE_BYTES.get(dtype or "", MODEL_STATE_BYTES["bf16"])
        per_param = sum(b for _, b in parts)
        out.append(Finding(kind="condition_model_size", evidence=ModelSizeEvidence(
            basis="computed", num_params=num_params, dtype=dtype, bytes_parts=parts, bytes_per_param=per_param,
            model_states_bytes=per_param * num_params, gpu_memory_gib=gpu_memory_gib,
            max_params_unsharded=gpu_memory_gib * 2**30 / per_param if gpu_memory_gib is not None else None)))
    return out


@dataclass(frozen=True, kw_only=True)
class NcclMapEvidence(Evidence):
    """map_nccl: transports seen in the NCCL logs; per traced run (run, exposed transfer share,
    skew-wait share, hidden-communication share), None where unknown."""

    transports: tuple[str, ...]
    comm: tuple[tuple[str, float | None, float | None, float | None], ...]


@dataclass(frozen=True, kw_only=True)
class DdpMapEvidence(Evidence):
    """map_ddp: map_nccl's per-run shares for the DDP runs."""

    comm: tuple[tuple[str, float | None, float | None, float | None], ...]


@dataclass(frozen=True, kw_only=True)
class ZeroMapEvidence(Evidence):
    """map_zero: per ZeRO-3 run (run, median step / DDP's, transfer share, skew-wait share,
    launch-gap share, peak reserved GiB); the DDP run compared with and its peak reserved GiB."""

    runs: tuple[tuple[str, float | None, float | None, float | None, float | None, float | None], ...]
    ddp_run: str | None
    ddp_mem_peak_reserved_gib: float | None


@dataclass(frozen=True, kw_only=True)
class TpPpMapEvidence(Evidence):
    """map_tp_pp: per TP/PP run (run, TP, PP, bubble share, 1F1B formula, compute imbalance,
    transfer share, skew-wait share, imbalance share)."""

    runs: tuple[tuple[str, int, int, float | None, float | None, float | None, float | None, float | None,
                      float | None], ...]


@dataclass(frozen=True, kw_only=True)
class DataMapEvidence(Evidence):
    """map_data: per traced run (run, data-stall share, median host data wait s)."""

    runs: tuple[tuple[str, float | None, float | None], ...]


@dataclass(frozen=True, kw_only=True)
class KernelMapEvidence(Evidence):
    """map_kernels: per run (run, GEMM, attention and elementwise shares of kernel time, top
    kernel, its share)."""

    runs: tuple[tuple[str, float | None, float | None, float | None, str | None, float | None], ...]


# ---------------------------------------------------------------- stage-2 knowledge map
# One row per topic (issue 4): symptom, the campaign's own numbers, the tuning action and its
# side effect. Rules pick the numbers; the template words each topic.
KNOWLEDGE_MAP_TOPICS = ("nccl", "ddp", "zero", "tp_pp", "data", "kernels")


def build_knowledge_map(
    breakdown_rows: Sequence[BreakdownRow],
    summary_rows: Sequence[RunSummary],
    run_rows: Sequence[LoadedRun],
    *,
    kernel_rows: Sequence[KernelShares] = (),
    nccl_transports: Sequence[str] = (),
    attribution: Mapping[str, Mapping[str, float | None]] | None = None,
) -> list[Finding]:
    """One Finding per KNOWLEDGE_MAP_TOPICS (kind ``map_<topic>``) whose evidence holds this
    campaign's numbers for the runs the topic concerns. breakdown_rows:
    the section-5 rows (report.evidence.BreakdownRow); summary_rows /
    run_rows: as build_findings (same order); kernel_rows: the runs' kernel time by class
    (report.evidence.KernelShares); nccl_transports: transport names seen in the runs' NCCL logs; attribution: run ->
    the cross-rank shares (report.evidence.summarize_attribution ``shares``): exposed
    communication is then split into transfer and skew wait, launch gaps and stage imbalance
    named; without it the single-rank shares stand (transfer = exposed comm, skew unknown)."""
    by_run = {b.run: b for b in breakdown_rows}
    runs = {r.name: r.spec for r in run_rows}
    summary = {s.run: s for s in summary_rows}

    def strategy(run: str) -> str | None:
        return runs[run].strategy if run in runs else None

    ddp = next((s for s in summary_rows if strategy(s.run) == "ddp" and s.step_time_median_s), None)

    def share(run: str, cat: str) -> float | None:
        """The single-rank share of a breakdown category (BREAKDOWN_CATEGORIES), None without a trace."""
        b = by_run.get(run)
        return None if b is None else {"compute": b.compute_share, "exposed_comm": b.exposed_comm_share,
                                       "bubble": b.bubble_share, "data_stall": b.data_stall_share,
                                       "other": b.other_share}[cat]

    def cross(run: str, cat: str) -> float | None:
        """The cross-rank share of a category (None without attribution for the run)."""
        return (attribution or {}).get(run, {}).get(cat)

    def transfer(run: str) -> float | None:
        return cross(run, "transfer") if run in (attribution or {}) else share(run, "exposed_comm")

    comm = [(r, transfer(r), cross(r, "skew_wait"), b.hidden_comm_s / b.step_time_s if b.step_time_s else None)
            for r, b in by_run.items()]
    out = [Finding(kind="map_nccl", runs=tuple(by_run), evidence=NcclMapEvidence(transports=tuple(nccl_transports),
                                                                                 comm=tuple(comm)))]
    ddp_runs = [r for r in by_run if strategy(r) == "ddp"]
    out.append(Finding(kind="map_ddp", runs=tuple(ddp_runs),
                       evidence=DdpMapEvidence(comm=tuple(c for c in comm if c[0] in ddp_runs))))
    zero = []
    for r, spec in runs.items():
        if spec.strategy == "zero3" and r in summary and summary[r].step_time_median_s:
            ratio = (summary[r].step_time_median_s / ddp.step_time_median_s) if ddp else None
            zero.append((r, ratio, transfer(r), cross(r, "skew_wait"),
                         cross(r, "launch_gaps") if r in (attribution or {}) else share(r, "other"),
                         summary[r].mem_peak_reserved_gib))
    out.append(Finding(kind="map_zero", runs=tuple(z[0] for z in zero),
                       evidence=ZeroMapEvidence(runs=tuple(zero), ddp_run=ddp.run if ddp else None,
                                                ddp_mem_peak_reserved_gib=ddp.mem_peak_reserved_gib if ddp else None)))
    tp_pp = [(r, runs[r].tp_degree, runs[r].pp_degree,
              cross(r, "bubble") if r in (attribution or {}) else share(r, "bubble"), by_run[r].bubble_expected,
              by_run[r].compute_imbalance, transfer(r), cross(r, "skew_wait"), cross(r, "imbalance"))
             for r in by_run if strategy(r) == "tp_pp"]
    out.append(Finding(kind="map_tp_pp", runs=tuple(t[0] for t in tp_pp), evidence=TpPpMapEvidence(runs=tuple(tp_pp))))
    data = [(r, share(r, "data_stall"), summary[r].data_wait_median_s if r in summary else None) for r in by_run]
    out.append(Finding(kind="map_data", runs=tuple(by_run), evidence=DataMapEvidence(runs=tuple(data))))
    kernels = [(k.run, k.shares["gemm"], k.shares["attention"], k.shares["elementwise"], k.top_kernel,
                k.top_kernel_share) for k in kernel_rows]
    out.append(Finding(kind="map_kernels", runs=tuple(k[0] for k in kernels), evidence=KernelMapEvidence(runs=tuple(kernels))))
    return out


# ---------------------------------------------------------------- same layout, different engine
# section 5's cross-rank categories (ingest.attribution); skew_wait (waiting for a late rank) is
# neither an engine nor a layout cost: it is timing between the ranks
GAP_CATEGORIES = ("compute", "transfer", "skew_wait", "bubble", "imbalance", "launch_gaps", "data_stall", "other")
ENGINE_COST_CATEGORIES = ("compute", "launch_gaps", "other")  # kernels, host/launch gaps, exposed copies
LAYOUT_COST_CATEGORIES = ("transfer", "bubble", "imbalance")  # what the layout itself adds to a step


@dataclass(frozen=True, kw_only=True)
class GapRow:
    """One traced run's step for the engine comparisons: the traced step (s), seconds per traced
    step of each GAP_CATEGORIES (category -> s; every category present), and the kernel classes'
    shares of kernel time ((class, share), ...; () when unknown)."""

    run: str
    step_time_s: float
    seconds: Mapping[str, float]
    class_shares: tuple[tuple[str, float | None], ...] = ()


@dataclass(frozen=True, kw_only=True)
class EngineLayoutEvidence(Evidence):
    """engine_single / engine_gap / engine_parity: the layout compared (strategy, degrees, data
    round), degenerate (ZeRO-3 on one rank, TP1 x PP1), cpu (every run on CPU)."""

    strategy: str
    world_size: int
    tp_degree: int
    pp_degree: int
    dp_degree: int
    data_round: str
    degenerate: bool
    cpu: bool


@dataclass(frozen=True, kw_only=True)
class EngineSingleEvidence(EngineLayoutEvidence):
    """engine_single: the engines that ran this layout and those of its strategy that did not."""

    engines_run: tuple[str, ...]
    engines_not_run: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class TracedEngine:
    """One traced run of an engine comparison: its traced step (s), seconds per step of each
    GAP_CATEGORIES, the layout's cost (transfer + bubble + imbalance; s and share of the step),
    the launch-gap share and the elementwise kernels' share of kernel time (None: unknown)."""

    run: str
    engine: str
    step_time_s: float
    seconds: Mapping[str, float]
    layout_cost_s: float
    layout_cost_share: float
    other_share: float
    elementwise_share: float | None


@dataclass(frozen=True, kw_only=True)
class GapSplit:
    """The traced gap slowest - fastest (s per step): per GAP_CATEGORIES, the engine part
    (ENGINE_COST_CATEGORIES), layout part (LAYOUT_COST_CATEGORIES) and skew part, the largest
    category, its share of the gap (None when the gap is not positive) and whether it dominates."""

    delta_step_s: float
    deltas_s: Mapping[str, float]
    engine_part_s: float
    layout_part_s: float
    skew_part_s: float
    dominant: str
    dominant_share: float | None
    dominates: bool


@dataclass(frozen=True, kw_only=True)
class EngineBaseline:
    """The DDP run of the same world size and data round: its tokens/s and (run, ratio to it) per engine run."""

    run: str
    tokens_per_s: float
    vs_baseline: tuple[tuple[str, float], ...]


@dataclass(frozen=True, kw_only=True)
class EngineComparisonEvidence(EngineLayoutEvidence):
    """engine_gap / engine_parity: margin (fastest / slowest tokens/s - 1) against noise (the
    larger relative step spread), the two runs, engines fastest first (run, engine, tokens/s,
    fastest / this, median step s), the traced runs, the gap split when both ends were traced,
    and the DDP baseline when there is one (None otherwise)."""

    margin: float
    noise: float
    fastest: str
    slowest: str
    engines: tuple[tuple[str, str, float, float, float | None], ...]
    traced: tuple[TracedEngine, ...]
    gap: GapSplit | None = None
    baseline: EngineBaseline | None = None


@dataclass(frozen=True, kw_only=True)
class EngineKnobEvidence(Evidence):
    """engine_knob (rule_engine_knobs): the reference run, engine, (knob, base value, this value)
    per knob that differs, margin (tokens/s ratio - 1) against noise, beyond, both tokens/s, and
    when both runs were traced the step and per-category deltas (s; None otherwise)."""

    base: str
    engine: str
    knobs: tuple[tuple[str, object, object], ...]
    margin: float
    noise: float
    beyond: bool
    tokens_per_s: float
    base_tokens_per_s: float
    delta_step_s: float | None = None
    deltas_s: Mapping[str, float] | None = None


def layout_key(spec: RunSpec) -> tuple:
    """(strategy, world_size, tp_degree, pp_degree, dp_degree): runs with equal keys are one
    layout, whatever engine ran them."""
    return (spec.strategy, int(spec.world_size), int(spec.tp_degree), int(spec.pp_degree), int(spec.dp_degree))


def _data_round(spec: RunSpec) -> str:
    return str(spec.data_round or "synthetic")


def rule_engine_gap(summary_rows: Sequence[RunSummary], run_rows: Sequence[LoadedRun],
                    breakdown_rows: Sequence[GapRow], t: Mapping[str, float], *,
                    engines: Mapping[str, Sequence[str]]) -> list[Finding]:
    """One finding per layout of a strategy that has several engines (``engines``: strategy ->
    its engines, core.records.STRATEGY_ENGINES), separating what the engine costs from what the
    layout costs.

    Layout ran under >= 2 engines (runs that ended ok with measured steps): kind "engine_gap"
    when fastest/slowest tokens/s - 1 exceeds both ``engine_gap_min`` and ``noise_multiple`` x the
    larger relative (p90 - median) spread of the two, else "engine_parity". Evidence: the
    engines fastest first (run, engine, tokens/s, fastest/this ratio, median step); per traced
    run the mean seconds per step of each GAP_CATEGORIES (report.evidence.summarize_breakdown),
    its layout cost (transfer + bubble + imbalance), its host launch-gap share and, where the breakdown
    rows know their ``class_shares``, the elementwise kernels' share of kernel time (where unfused
    work shows); and the traced gap
    slowest - fastest split into those categories: engine part = compute + launch gaps + other
    (kernels, host/launch gaps, exposed copies: the layout does not change them), layout part =
    transfer + bubble + imbalance, skew part = skew_wait (waiting for a late rank),
    ``dominant`` the category holding the largest part (``dominates`` when its share of the gap
    >= ``engine_gap_dominant_min``). The DDP run of the same world size, if any, is the
    baseline: ratios to it are in ``vs_baseline``; on a degenerate layout (ZeRO-3 on one rank,
    TP1 x PP1) the whole gap to it is engine cost. Layout ran under one engine: kind
    "engine_single" naming the engines not run (``cpu``: Megatron-core cannot run there).
    Runs of different data rounds (RunSpec.data_round) are separate groups.
    summary_rows / run_rows: as build_findings (same order); breakdown_rows: the traced runs'
    GapRow (report.view.gap_row)."""
    status = {r.name: r.status_name for r in run_rows}
    tps = {s.run: s.tokens_per_s for s in summary_rows}
    summary = {s.run: s for s in summary_rows}
    traced = {b.run: b for b in breakdown_rows}
    # one group per layout and data round: a real-text round is another experiment, not another engine
    groups: dict[tuple, list[RunSpec]] = {}
    for r in run_rows:
        if len(engines.get(r.spec.strategy, ())) > 1:
            groups.setdefault((*layout_key(r.spec), _data_round(r.spec)), []).append(r.spec)
    baselines = {(int(r.spec.world_size), _data_round(r.spec)): r.spec for r in run_rows
                 if r.spec.strategy == "ddp" and status.get(r.name) == "ok" and tps.get(r.name)}
    out = []
    for key, runs in groups.items():
        strategy, world, tp, pp, dp, data_round = key
        ok = sorted((r for r in runs if status.get(r.name) == "ok" and tps.get(r.name)), key=lambda r: -tps[r.name])
        layout = dict(strategy=strategy, world_size=world, tp_degree=tp, pp_degree=pp, dp_degree=dp,
                      data_round=data_round,
                      degenerate=(strategy == "zero3" and dp == 1 and world == 1) or (strategy == "tp_pp" and tp == pp == 1),
                      cpu=all(r.device == "cpu" for r in runs))
        ran = sorted({r.engine for r in ok})
        if len(ran) < 2:
            out.append(Finding(kind="engine_single", runs=tuple(r.name for r in runs), evidence=EngineSingleEvidence(
                **layout, engines_run=tuple(sorted({r.engine for r in runs})),
                engines_not_run=tuple(e for e in engines[strategy] if e not in {r.engine for r in runs}))))
            continue
        best, worst = ok[0], ok[-1]
        margin = tps[best.name] / tps[worst.name] - 1
        noise = max(compute_step_spread(summary[best.name]), compute_step_spread(summary[worst.name]))
        gap = margin > t["engine_gap_min"] and margin > t["noise_multiple"] * noise
        per_run = []
        for r in ok:
            b = traced.get(r.name)
            if b is None or not b.step_time_s:
                continue
            layout_s = sum(b.seconds[c] for c in LAYOUT_COST_CATEGORIES)
            per_run.append(TracedEngine(
                run=r.name, engine=r.engine, step_time_s=b.step_time_s, seconds={c: b.seconds[c] for c in GAP_CATEGORIES},
                layout_cost_s=layout_s, layout_cost_share=layout_s / b.step_time_s,
                other_share=b.seconds["launch_gaps"] / b.step_time_s,
                elementwise_share=dict(b.class_shares).get("elementwise")))
        by_run = {p.run: p for p in per_run}
        split = None
        if best.name in by_run and worst.name in by_run:
            fast, slow = by_run[best.name], by_run[worst.name]
            delta_s = slow.step_time_s - fast.step_time_s
            deltas = {c: slow.seconds[c] - fast.seconds[c] for c in GAP_CATEGORIES}
            dominant = max(GAP_CATEGORIES, key=lambda c: deltas[c])
            split = GapSplit(delta_step_s=delta_s, deltas_s=deltas,
                             engine_part_s=sum(deltas[c] for c in ENGINE_COST_CATEGORIES),
                             layout_part_s=sum(deltas[c] for c in LAYOUT_COST_CATEGORIES),
                             skew_part_s=deltas["skew_wait"], dominant=dominant,
                             dominant_share=deltas[dominant] / delta_s if delta_s > 0 else None,
                             dominates=delta_s > 0 and deltas[dominant] / delta_s >= t["engine_gap_dominant_min"])
        base = baselines.get((world, data_round))
        baseline = (EngineBaseline(run=base.name, tokens_per_s=tps[base.name],
                                   vs_baseline=tuple((r.name, tps[r.name] / tps[base.name]) for r in ok))
                    if base is not None else None)
        ev = EngineComparisonEvidence(
            **layout, margin=margin, noise=noise, fastest=best.name, slowest=worst.name,
            engines=tuple((r.name, r.engine, tps[r.name], tps[best.name] / tps[r.name],
                           summary[r.name].step_time_median_s) for r in ok),
            traced=tuple(per_run), gap=split, baseline=baseline)
        out.append(Finding(kind="engine_gap" if gap else "engine_parity", runs=tuple(r.name for r in ok),
                           evidence=ev, threshold=t["engine_gap_min"]))
    return out


# ---------------------------------------------------------------- same layout and engine, other knobs
def flat_options(options: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested engine knobs as one level: {"zero.overlap_comm": True, ...}."""
    out: dict[str, Any] = {}
    for k, v in (options or {}).items():
        if isinstance(v, Mapping):
            out.update(flat_options(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# options that say how a run was placed or searched, not an engine knob
_NOT_KNOBS = ("repeat", "kernels", "micro_batch_search")


def rule_engine_knobs(summary_rows: Sequence[RunSummary], run_rows: Sequence[LoadedRun],
                      breakdown_rows: Sequence[GapRow], t: Mapping[str, float]) -> list[Finding]:
    """One finding per run that repeats another run's layout, engine, data round and micro-batch
    with different engine knobs (``options`` other than repeat/kernels/search): what the knobs
    buy. The reference is the first such run in campaign order. Kind "engine_knob". Evidence:
    ``base``; ``knobs`` ((key, base value, this value), ...) flattened ("zero.overlap_comm");
    ``margin`` = this tokens/s / base tokens/s - 1; ``noise`` the larger relative (p90 - median)
    step spread of the two; ``beyond`` when |margin| exceeds ``noise_multiple`` x noise; and,
    when both runs were traced, ``deltas_s`` (this - base, seconds per traced step) per
    GAP_CATEGORIES with ``delta_step_s``. Runs that did not end ok are left out.
    summary_rows / run_rows / breakdown_rows: as rule_engine_gap."""
    summary = {s.run: s for s in summary_rows}
    traced = {b.run: b for b in breakdown_rows}
    groups: dict[tuple, list[RunSpec]] = {}
    for r in run_rows:
        if r.status_name == "ok" and r.name in summary and summary[r.name].tokens_per_s:
            key = (*layout_key(r.spec), r.spec.engine, _data_round(r.spec), r.spec.micro_batch_size)
            groups.setdefault(key, []).append(r.spec)
    out = []
    for runs in groups.values():
        base = runs[0]
        base_knobs = {k: v for k, v in flat_options(base.options or {}).items()
                      if k.split(".")[0] not in _NOT_KNOBS}
        for r in runs[1:]:
            knobs = {k: v for k, v in flat_options(r.options or {}).items() if k.split(".")[0] not in _NOT_KNOBS}
            diff = tuple((k, base_knobs.get(k), knobs.get(k)) for k in sorted(set(knobs) | set(base_knobs))
                         if knobs.get(k) != base_knobs.get(k))
            if not diff:
                continue  # a repeat, not a knob
            s, sb = summary[r.name], summary[base.name]
            margin = s.tokens_per_s / sb.tokens_per_s - 1
            noise = max(compute_step_spread(s), compute_step_spread(sb))
            b, bb = traced.get(r.name), traced.get(base.name)
            both = b is not None and bb is not None and b.step_time_s and bb.step_time_s
            out.append(Finding(kind="engine_knob", runs=(r.name, base.name), evidence=EngineKnobEvidence(
                base=base.name, engine=r.engine, knobs=diff, margin=margin, noise=noise,
                beyond=abs(margin) > t["noise_multiple"] * noise, tokens_per_s=s.tokens_per_s,
                base_tokens_per_s=sb.tokens_per_s, delta_step_s=b.step_time_s - bb.step_time_s if both else None,
                deltas_s={c: b.seconds[c] - bb.seconds[c] for c in GAP_CATEGORIES} if both else None)))
    return out
