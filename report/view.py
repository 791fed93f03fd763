"""The note's view-model: frozen dataclasses built from a Campaign, one per section.

Six sections (DESIGN.md, "The note"): environment, model and data, configurations, metric
table, evidence, conclusion (+ caveats and the formulas used). Every number is computed here
or in report.metrics / report.rules and carried raw (units in field names); the templates
only format. Missing values are None. Deliberately not here: wording of findings, formatting,
file access.
"""
from __future__ import annotations

import dataclasses
import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from ingest.hangs import rank_evidence
from ingest.io import Campaign, load_plant_truths
from core.records import (
    KERNEL_CLASSES, RUN_STATUSES, CpuInfo, DiskInfo, EnvRecord, FixedConfig, LoadedRun, PlantTruth, RunSpec, RunSummary,
)
from report import evidence as ev
from report.evidence import BreakdownRow, compute_category_separations
from report.data_rounds import DataRoundSection, build_data_round_section
from report import metrics
from core.hardware import lookup_peak
from report.i18n import N_, Message, MessageList
from report.placement import RunPlacement, compute_placements
from report.attribution import AttributionView, build_attribution, commbench_rows, run_plant
from report.engines import EngineGroup, build_engine_groups
from report.health import HealthSection, build_health_section
from report.overlap import OverlapSection, build_overlap_section
from report.search import build_search_note
from report.parity import (
    INTERVAL_METHOD, ParityRow, RepeatGroup, build_parity_rows, build_repeat_groups, kernels_mode, ranked_runs,
    ranking_mode, rule_parity, rule_repeat_spread, run_repeat,
)
from report import rules
from report.rules import (
    THRESHOLDS, Evidence, Finding, GapRow, build_findings, build_knowledge_map, flat_options, rule_conditions, rule_engine_knobs,
)
from core.formulas import (
    DEFAULT_CONVENTION, ZIPF_EXPONENT, compute_bubble_fraction, compute_flops_per_token, compute_mfu, zipf_entropy_nats,
)

if TYPE_CHECKING:  # imported where they are built: the prediction model and the probe's loader cost import time
    from report.capacity import CapacitySection
    from report.predict import PredictedSection

# English messages (report.i18n.N_): the templates translate them when they print them
NOT_MEASURED = N_("not measured yet")
FORMULAS = (
    (N_("FLOPs/token (default)"),
     N_("6N + 12·L·H·Q·T; N = parameters without position embeddings, tied embedding once"),
     N_("PaLM (Chowdhery et al. 2022) appendix B; nanoGPT model.py estimate_mfu")),
    (N_("FLOPs/token (6N)"), "6N", N_("Kaplan et al. 2020, section 2.1")),
    (N_("FLOPs/token (causal)"), N_("6N + 6·L·H·Q·T (attention halved by the causal mask)"),
     N_("Megatron-LM num_floating_point_operations (2025); llm.c")),
    (N_("MFU"), N_("tokens/s × FLOPs/token ÷ (num GPUs × dense peak FLOP/s for the GPU and dtype)"),
     N_("PaLM appendix B")),
    (N_("Step time"), N_("per step: max over ranks; median and p90 over measured (post-warm-up) steps"),
     N_("this tool")),
    (N_("Model states"), N_("16 bytes/param (2 weights + 2 grads + 12 fp32 master/m/v); ZeRO-3: 16Ψ/N"),
     N_("ZeRO (Rajbhandari et al. 2020) section 3.1")),
    (N_("Torch DDP beyond its model states"),
     N_("+ 2 bytes/param: the bf16 weight copies autocast caches for the backward; + 4 bytes/param with more than "
        "one micro-batch: gradients accumulated under no_sync beside DDP's buckets"),
     N_("torch.autocast (cache_enabled); torch DistributedDataParallel no_sync")),
    (N_("1F1B bubble"), N_("(p − 1) / (m + p − 1) for p stages, m micro-batches"),
     N_("Narayanan et al. 2021 section 2.2")),
    (N_("Interleaved 1F1B bubble"), N_("(p − 1) / (v·m + p − 1) with v model chunks per rank"),
     N_("Narayanan et al. 2021 section 2.2.2")),
)
# RunSpec fields a run may set (its layout); the fixed variables are campaign.json's, the same for all
LAYOUT_FIELDS = ("strategy", "engine", "world_size", "tp_degree", "pp_degree", "dp_degree", "micro_batch_size",
                 "num_microbatches", "device", "backend", "options", "collective_timeout_s", "nsys")


@dataclass(frozen=True, kw_only=True)
class Gpu:
    index: int | None
    name: str | None
    memory_total_gib: float | None
    driver_version: str | None
    power_limit_w: float | None
    clocks_sm_max_mhz: float | None


@dataclass(frozen=True, kw_only=True)
class NodeInfo:
    """One node of a multi-node campaign (env_node<K>.json, folded into env.json by the runner)."""

    node_rank: int
    hostname: str | None
    cpu_model: str | None
    cores_logical: int | None
    host_memory_gib: float | None
    gpu_count: int | None
    gpu_name: str | None


@dataclass(frozen=True, kw_only=True)
class EnvSection:
    hostname: str | None
    os: str | None
    cpu_model: str | None
    cores_logical: int | None
    cores_physical: int | None
    host_memory_gib: float | None
    disk_path: str | None
    disk_total_gib: float | None
    disk_free_gib: float | None
    gpus: tuple[Gpu, ...]
    topology: str | None
    versions: tuple[tuple[str, str | None], ...]
    launch_command: str | None
    tool_git_commit: str | None
    env_vars: tuple[tuple[str, str], ...]
    num_nodes: int | None = None  # multi-node campaigns only (env.json "num_nodes")
    nodes: tuple[NodeInfo, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ModelSection:
    preset: str
    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    padded_vocab_size: int
    vocab_padding: int
    num_params: tuple[int, ...]  # distinct counts reported by the runs (one if they agree)
    global_batch_size: int
    tokens_per_step: int
    dtype: str
    steps: int
    warmup_steps: int
    seed: int
    optimizer: tuple[tuple[str, float], ...]
    data: str
    zipf_exponent: float
    loss_init_nats: float  # ln(V): a uniform guess
    loss_floor_nats: float  # entropy of the Zipf distribution


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    run: str
    strategy: str
    engine: str
    world_size: int
    tp_degree: int
    pp_degree: int
    dp_degree: int
    micro_batch_size: int
    num_microbatches: int
    grad_accum_steps: int | None  # None where micro-batches are pipeline micro-batches
    bubble_fraction: float | None  # theoretical 1F1B idle fraction, PP > 1 only
    num_params: int | None
    device: str
    options: str  # every engine knob as resolved into the spec, "key=value" (nested: "zero.key=value"); "" = defaults
    micro_batch_search: str | None  # how an automatic search chose micro_batch_size, None when set by hand
    compile: bool | None  # torch.compile on
    first_step_s: float | None  # step 0's wall time (compilation, lazy set-up); a warm-up step
    compile_s: float | None  # first_step_s - step 1's wall time; never in a reported step time
    sequence_parallel: bool = False  # TP activations split along the sequence (all-gather + reduce-scatter)


@dataclass(frozen=True, kw_only=True)
class PeakUsed:
    gpu_name: str
    dtype: str
    flops: float | None  # None: unknown GPU/dtype -> MFU n/a
    source: str | None


@dataclass(frozen=True, kw_only=True)
class HangRank:
    """One rank of a hung run, from status.json's ``diagnosis.ranks`` (py-spy stacks or the
    flight recorder)."""

    run: str
    rank: int | str
    blocked_in: str | None
    where: str | None


@dataclass(frozen=True, kw_only=True)
class Figure:
    kind: str  # "loss" | "step_time" | "breakdown" | "timeline": the templates word title and caption
    path: str  # relative to the note's directory
    # runs drawn of the campaign's (report.metrics.select_figure_runs), where the figure shows only some
    num_drawn: int | None = None
    num_runs: int | None = None


@dataclass(frozen=True, kw_only=True)
class PlantCheck:
    """One planted cause against section 5: run, the matrix key (cause), planted_ms (the
    delay; for pp_layers the stage excess over the mean stage compute the traces measure),
    category it must land in, reference (the unplanted run of the same layout it is compared
    with, or None), recovered_ms (the category's ms minus the reference's), error
    (recovered / planted - 1), rank (the planted rank) and straggler_rank (the traces' named
    straggler, or None)."""

    run: str
    cause: str
    planted_ms: float
    category: str
    reference: str | None
    recovered_ms: float | None
    error: float | None
    rank: int | None
    straggler_rank: int | None
    # what removing the category's cause saves (ingest.whatif) beyond the reference's, against
    # what the plant measurably cost (the planted run's median step minus the reference's)
    saving_ms: float | None = None
    cost_ms: float | None = None
    # cost_ms at equal kernels: plus how much faster the planted run's kernels ran than the
    # reference's (traced compute; a GPU with idle gaps clocks higher), which the replay keeps
    # fixed; saving_error is against it (0 for a compute plant: its kernels are the plant)
    kernel_drift_ms: float | None = None
    saving_error: float | None = None
    truth: str = ""  # where planted_ms comes from (the matrix, plant_truth.json, the even split)


@dataclass(frozen=True, kw_only=True)
class EvidenceSection:
    rows: tuple[BreakdownRow, ...]
    runs_without_trace: tuple[str, ...]
    warnings: tuple[str, ...]
    knowledge_map: tuple[Finding, ...]
    straggler: tuple[Finding, ...]
    # (run, lines) summarising the NCCL communicators/transports in each run's rank logs (section 1)
    nccl: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # third-party profiler / nsys summary tables (report.evidence.summarize_profile_tables)
    profile_tables: tuple[ev.ProfileTable, ...] = ()
    # planted causes against what section 5 recovered (build_plant_checks)
    plant_checks: tuple[PlantCheck, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """The title block's hardware line: what the runs ran on."""

    device: str  # "cuda" when any run used GPUs, else "cpu"
    num_gpus: int  # GPUs recorded in env.json (all nodes), 0 on CPU
    gpu_name: str | None
    gpu_memory_gib: float | None
    num_nodes: int
    cpu_model: str | None


@dataclass(frozen=True, kw_only=True)
class ExecutiveSummary:
    """The note's opening paragraph, from the conclusion's findings and conditions: the
    recommended layout (the fastest run that ended ok), how sure the campaign is of it, and
    the conditions under which it changes. kind: "recommend" (two or more ranked runs),
    "only_run" (one), "none" (no run ended ok with measured steps)."""

    kind: str
    run: str | None = None
    strategy: str | None = None
    engine: str | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    runner_up: str | None = None
    margin: float | None = None  # tokens/s ratio over the runner-up - 1
    beyond_noise: bool | None = None
    loss_agrees: bool | None = None  # None: fewer than two losses to compare
    headroom: float | None = None  # the recommended run's free GPU memory fraction
    world_sizes: tuple[int, ...] = ()
    no_comm: bool = False  # every run on one process: no communication measured
    on_gpu: bool = False
    gpu_memory_gib: float | None = None
    max_params_unsharded: float | None = None
    nvlink: bool | None = None  # None on one GPU or without a recorded topology
    not_ok: tuple[tuple[str, str], ...] = ()  # (run, status) of runs that did not end ok
    # equal-math runs whose kernel time per token differs by class (report.parity): (run, class, diff)
    not_layout_only: tuple[tuple[str, str, float], ...] = ()
    # the margin against run-to-run spread (repeats): report.parity.rule_repeat_spread's finding
    repeat_spread: Finding | None = None
    unranked_modes: tuple[tuple[str, str], ...] = ()  # (run, kernels mode) left out of the ranking
    # why the winner wins (build_why): the two categories whose removal would gain the runner-up
    # the most beyond what it would gain the winner, (category, ms per step), from section 5's what-ifs
    why: tuple[tuple[str, float], ...] = ()
    kernels_match: bool | None = None  # both runs passed the kernel-parity check (report.parity)
    unhealthy: tuple[str, ...] = ()  # runs left out of the ranking for their training health (report.health)


@dataclass(frozen=True, kw_only=True)
class Note:
    campaign: str
    created_at: str | None
    tool_version: str | None
    tool_git_commit: str | None
    per_unit: str  # "GPU" on GPU campaigns, "process" on CPU ones (tokens/s per ...)
    env: EnvSection
    model: ModelSection
    configs: tuple[RunConfig, ...]
    metrics: tuple[RunSummary, ...]  # the metric table (report.metrics.summarize_runs)
    peaks: tuple[PeakUsed, ...]
    flops_per_token: float | None
    convention: str
    not_measured: str
    figures: tuple[Figure, ...]
    evidence: EvidenceSection
    findings: tuple[Finding, ...]
    hang_ranks: tuple[HangRank, ...]
    placements: tuple[RunPlacement, ...]  # multi-node runs with a placement record
    conditions: tuple[Finding, ...]
    caveats: tuple[Finding, ...]
    formulas: tuple[tuple[str, str, str], ...]
    predicted: PredictedSection | None = None  # the model checked on these runs, unrun layouts (report.predict)
    engine_groups: tuple[EngineGroup, ...] = ()  # one layout under several engines (report.engines)
    knob_findings: tuple[Finding, ...] = ()  # one layout and engine under other knobs (rules.rule_engine_knobs)
    data_round: DataRoundSection | None = None  # data rounds and checkpoint cost (report.data_rounds)
    hardware: Hardware | None = None
    executive: ExecutiveSummary = ExecutiveSummary(kind="none")
    resolved_config: str = "{}"  # JSON: campaign.json and each run's layout (appendix)
    parity: tuple[ParityRow, ...] = ()  # kernels per run and time per token by kernel class (report.parity)
    repeats: tuple[RepeatGroup, ...] = ()  # layouts run more than once (report.parity)
    interval_method: str = INTERVAL_METHOD
    parity_tolerance: float = THRESHOLDS["parity_tolerance"]
    triage: TriageSection | None = None  # failed runs (campaigns) or the folder's jobs (logs) (report.triage)
    capacity: CapacitySection | None = None  # the campaign's capacity probe, if it has one (report.capacity)
    capacity_problems: tuple[str, ...] = ()  # why a capacity probe's file was left out
    health: HealthSection | None = None  # loss spikes, divergence, gradient norm, per-rank step time (report.health)
    overlap: OverlapSection | None = None  # overlap pairs: switches on and off, measured and predicted (report.overlap)
    search: Any = None  # report.search.SearchSection: the campaign's `runner search`, if it was one


def _py(value: Any) -> Any:
    """NA/NaN -> None; numpy scalars -> Python."""
    if value is None or (not isinstance(value, (str, tuple, list, dict)) and pd.isna(value)):
        return None
    return value.item() if hasattr(value, "item") else value


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    return [{k: _py(v) for k, v in row.items()} for row in df.to_dict("records")]


def build_env(env: EnvRecord) -> EnvSection:
    """Environment section from the environment record (any value may be missing)."""
    cpu, disk = env.cpu or CpuInfo(), env.disk or DiskInfo()
    gpus = tuple(
        Gpu(index=g.index, name=g.name, driver_version=g.driver_version,
            memory_total_gib=g.memory_total_mib / 1024 if g.memory_total_mib is not None else None,
            power_limit_w=g.power_limit_w, clocks_sm_max_mhz=g.clocks_sm_max_mhz)
        for g in env.gpus)
    return EnvSection(
        hostname=env.hostname, os=env.os, cpu_model=cpu.model, cores_logical=cpu.cores_logical,
        cores_physical=cpu.cores_physical, host_memory_gib=env.host_memory_gib,
        disk_path=disk.path, disk_total_gib=disk.total_gib, disk_free_gib=disk.free_gib,
        gpus=gpus, topology=env.topology, versions=tuple(env.versions.items()),
        launch_command=shlex.join(env.launch_command) if env.launch_command else None,
        tool_git_commit=env.tool_git_commit, env_vars=tuple(sorted(env.env_vars.items())),
        num_nodes=env.num_nodes, nodes=tuple(
            NodeInfo(node_rank=n.node_rank, hostname=n.hostname, cpu_model=n.cpu.model if n.cpu else None,
                     cores_logical=n.cpu.cores_logical if n.cpu else None, host_memory_gib=n.host_memory_gib,
                     gpu_count=n.gpu_count, gpu_name=n.gpus[0].name if n.gpus else None)
            for n in env.nodes if n.node_rank is not None))


def build_model(fixed: FixedConfig, runs: Sequence[LoadedRun]) -> ModelSection:
    """Model and data section from campaign.json's fixed variables and the runs' reported parameter counts."""
    m = fixed.model
    return ModelSection(
        preset=fixed.preset, num_layers=m.num_layers, hidden_size=m.hidden_size, num_heads=m.num_heads,
        ffn_hidden_size=m.ffn_hidden_size, seq_length=m.seq_length, vocab_size=m.vocab_size,
        padded_vocab_size=m.padded_vocab_size, vocab_padding=m.padded_vocab_size - m.vocab_size,
        num_params=tuple(sorted({r.num_params for r in runs if r.num_params is not None})),
        global_batch_size=fixed.global_batch_size, tokens_per_step=fixed.global_batch_size * m.seq_length,
        dtype=fixed.dtype, steps=fixed.steps, warmup_steps=fixed.warmup_steps, seed=fixed.seed,
        optimizer=tuple((k, getattr(fixed, k)) for k in ("lr", "min_lr", "lr_warmup_steps", "weight_decay",
                                                          "adam_beta1", "adam_beta2", "grad_clip")),
        data=fixed.data, zipf_exponent=ZIPF_EXPONENT, loss_init_nats=math.log(m.vocab_size),
        loss_floor_nats=zipf_entropy_nats(m.vocab_size))


def build_config(r: LoadedRun) -> RunConfig:
    """One run's layout. Micro-batches are gradient-accumulation steps without PP and
    pipeline micro-batches with PP (then the 1F1B bubble is shown)."""
    spec, info = r.spec, r.info
    pp, m = int(spec.pp_degree), int(spec.num_microbatches)
    options = spec.options
    return RunConfig(
        run=r.name, strategy=spec.strategy, engine=spec.engine, world_size=spec.world_size, tp_degree=spec.tp_degree,
        pp_degree=pp, dp_degree=spec.dp_degree, micro_batch_size=spec.micro_batch_size, num_microbatches=m,
        grad_accum_steps=m if pp == 1 else None,
        bubble_fraction=compute_bubble_fraction(pp_degree=pp, num_microbatches=m,
                                                        num_virtual_stages=_virtual_stages(options)) if pp > 1 else None,
        num_params=r.num_params, device=spec.device,
        options=render_options(options), micro_batch_search=describe_micro_batch_search(options),
        compile=_opt_bool(r.compiled), first_step_s=_opt_float(info.first_step_s if info else None),
        compile_s=_opt_float(info.compile_s if info else None),
        # Megatron turns sequence parallelism on with TP (runner.strategies.tp_pp_megatron)
        sequence_parallel=spec.engine == "megatron" and int(spec.tp_degree) > 1)


def _virtual_stages(options: Any) -> int:
    """Model chunks per pipeline rank (the torch engine's Interleaved1F1B), 1 otherwise.
    options: the spec's options (RunSpec.options)."""
    v = options.get("virtual_stages") if isinstance(options, Mapping) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else 1


def _opt_float(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and v != v) else float(v)


def _opt_bool(v: Any) -> bool | None:
    return None if v is None or (isinstance(v, float) and v != v) else bool(v)


def render_options(options: Mapping[str, Any]) -> str:
    """Engine knobs as "key=value, ..." sorted, nested tables flattened ("zero.overlap_comm=True");
    the micro-batch search record is described apart (describe_micro_batch_search), the kernels and
    the repeat index too (section 5's kernel parity table, the repeats table)."""
    shown = flat_options({k: v for k, v in options.items() if k not in ("micro_batch_search", "kernels", "repeat")})
    return ", ".join(f"{k}={shown[k]}" for k in sorted(shown, key=lambda k: k.split(".")))


def describe_micro_batch_search(options: Mapping[str, Any]) -> str | None:
    """"auto (fastest): 32 of 64 oom, 32 612k tok/s, 16 590k tok/s" from options.micro_batch_search."""
    search = options.get("micro_batch_search")
    if not isinstance(search, Mapping) or "chosen" not in search:
        return None
    parts = [f"{r['micro_batch_size']} " + (f"{r['tokens_per_s'] / 1e3:.0f}k tok/s" if r.get("tokens_per_s") else r["status"])
             for r in search.get("results", [])]
    if search.get("reused_from"):
        return Message(N_("auto (%(policy)s): %(chosen)s of %(tried)s (the search of %(run)s)"),
                       policy=search.get("policy"), chosen=search["chosen"], tried=", ".join(parts),
                       run=search["reused_from"])
    return Message(N_("auto (%(policy)s): %(chosen)s of %(tried)s"), policy=search.get("policy"),
                   chosen=search["chosen"], tried=", ".join(parts))


def _gpu_name(run: LoadedRun, env: EnvRecord) -> str | None:
    if run.spec.device != "cuda":
        return None
    return (run.info.device_name if run.info else None) or (env.gpus[0].name if env.gpus else None)


def build_hang_ranks(runs: Sequence[LoadedRun]) -> tuple[HangRank, ...]:
    """Per-rank evidence of hung runs: py-spy (blocked_in, our innermost frame) or the flight
    recorder (last collective and its state); a rank without a stack is shown with its process
    state (e.g. "stopped (state T)") and py-spy's error instead."""
    out = []
    for r in runs:
        if r.status_name != "hang":
            continue
        d = r.status.diagnosis or {}
        for rank, s in sorted((d.get("ranks") or {}).items(), key=lambda kv: int(kv[0]) if str(kv[0]).isdigit() else 0):
            if not isinstance(s, dict):
                continue
            if d.get("source") == "flight-recorder":
                blocked = (Message(N_("collective #%(seq)s %(op)s (%(state)s)"), seq=s["last_seq_id"],
                                   op=s.get("last_op") or Message(N_("op unknown")),
                                   state=s.get("last_state") or Message(N_("state unknown")))
                           if s.get("last_seq_id") is not None else Message(N_("no collective recorded")))
                done = s.get("last_completed_seq_id")
                where = Message(N_("flight recorder, %(completed)s"),
                                completed=Message(N_("last completed #%(seq)s"), seq=done) if done is not None
                                else Message(N_("none completed")))
            else:  # a rank without a stack (py-spy failed, e.g. on a stopped process): what is known of it
                blocked, where = rank_evidence(s)
            out.append(HangRank(run=r.name, rank=int(rank) if str(rank).isdigit() else str(rank),
                                blocked_in=blocked, where=where))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class TextEvidence(Evidence):
    """load_problem: the loader's own sentence."""

    text: str


@dataclass(frozen=True, kw_only=True)
class StepsEvidence(Evidence):
    """unfinished: the run's measured steps and the first step not completed by every rank."""

    num_steps_measured: int
    failed_at_step: int | None


@dataclass(frozen=True, kw_only=True)
class UnknownStatusEvidence(StepsEvidence):
    """unknown_status: status.json's status as written and the statuses known (RUN_STATUSES)."""

    status: object
    known: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class StoppedEvidence(StepsEvidence):
    """interrupted / skipped: status.json's cause."""

    cause: str | None


@dataclass(frozen=True, kw_only=True)
class FaultEvidence(Evidence):
    """fault_injected: the run's ``fault`` option table (runner.faults)."""

    fault: Mapping[str, object]


@dataclass(frozen=True, kw_only=True)
class WorldSizesEvidence(Evidence):
    """world_sizes_differ: (run, world size) of the ranked runs."""

    world_sizes: tuple[tuple[str, int], ...]


@dataclass(frozen=True, kw_only=True)
class OversubscribedEvidence(WorldSizesEvidence):
    """oversubscribed: CPU runs with more ranks than env.json's logical cores."""

    cores: int


@dataclass(frozen=True, kw_only=True)
class EngineNameEvidence(Evidence):
    """cpu_tp_pp_engine: the engine that ran TP+PP on CPU."""

    engine: str


@dataclass(frozen=True, kw_only=True)
class UnknownPeakEvidence(Evidence):
    """unknown_peak: the GPU and dtype hardware.toml has no dense peak for."""

    gpu_name: str
    dtype: str


@dataclass(frozen=True, kw_only=True)
class TpCrossingEvidence(Evidence):
    """tp_crosses_nodes: TP groups crossing nodes, all TP groups, nodes."""

    crossing: int
    total: int
    num_nodes: int


@dataclass(frozen=True, kw_only=True)
class ParamMismatchEvidence(Evidence):
    """param_mismatch: the distinct parameter counts the runs reported."""

    num_params: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class OverheadEvidence(Evidence):
    """measurement_overhead: the instrumented loop's overhead fraction and the window's spread."""

    fraction: float
    spread: float


@dataclass(frozen=True, kw_only=True)
class PredictionErrorEvidence(Evidence):
    """prediction_error: the lowest and highest leave-one-out step-time errors."""

    low: float
    high: float


@dataclass(frozen=True, kw_only=True)
class PlantedEvidence(Evidence):
    """planted: the run's planted cause (report.attribution.run_plant)."""

    plant: Mapping[str, object]


@dataclass(frozen=True, kw_only=True)
class RescaleEvidence(Evidence):
    """profiled_slower: traced step / unprofiled median step."""

    rescale: float


@dataclass(frozen=True, kw_only=True)
class ShareEvidence(Evidence):
    """profile_cost: the profiler's share of the run's time."""

    share: float


@dataclass(frozen=True, kw_only=True)
class CompileModesEvidence(Evidence):
    """mixed_compile: the runs compiled with torch.compile and those run eager."""

    compiled: tuple[str, ...]
    eager: tuple[str, ...]


def build_caveats(campaign: Campaign, runs: Sequence[LoadedRun], model: ModelSection,
                  peaks: Sequence[PeakUsed], *, rows: Sequence[RunSummary] = (),
                  cores: int | None = None, placements: Sequence[RunPlacement] = ()) -> list[Finding]:
    """Caveats the reader must see next to the numbers (the template words each kind).
    rows: the metric rows (same order as runs); cores: logical CPU cores from env.json."""
    out = [Finding(kind="load_problem", evidence=TextEvidence(text=p)) for p in campaign.problems]
    for r, m in zip(runs, rows):
        steps = dict(num_steps_measured=m.num_steps_measured, failed_at_step=m.failed_at_step)
        if m.status == "unfinished":
            out.append(Finding(kind="unfinished", runs=(r.name,), evidence=StepsEvidence(**steps)))
        elif m.status == "unknown":
            out.append(Finding(kind="unknown_status", runs=(r.name,),
                               evidence=UnknownStatusEvidence(**steps, status=r.status_name, known=RUN_STATUSES)))
        elif m.status in ("interrupted", "skipped"):
            out.append(Finding(kind=m.status, runs=(r.name,), evidence=StoppedEvidence(**steps, cause=r.status.cause)))
        if r.spec.options.get("fault"):
            out.append(Finding(kind="fault_injected", runs=(r.name,),
                               evidence=FaultEvidence(fault=r.spec.options["fault"])))
    ranked = [(r.name, int(r.spec.world_size)) for r, m in zip(runs, rows)
              if m.status == "ok" and m.tokens_per_s is not None]
    if len({w for _, w in ranked}) > 1:
        out.append(Finding(kind="world_sizes_differ", runs=tuple(n for n, _ in ranked),
                           evidence=WorldSizesEvidence(world_sizes=tuple(ranked))))
    over = tuple((r.name, int(r.spec.world_size)) for r in runs
                 if r.spec.device == "cpu" and cores is not None and int(r.spec.world_size) > cores)
    if over:
        out.append(Finding(kind="oversubscribed", runs=tuple(n for n, _ in over),
                           evidence=OversubscribedEvidence(world_sizes=over, cores=cores)))
    for r in runs:
        spec = r.spec
        if spec.strategy == "zero3" and spec.world_size == 1:
            out.append(Finding(kind="degenerate_zero3", runs=(r.name,)))
        if spec.strategy == "tp_pp" and spec.tp_degree == 1 and spec.pp_degree == 1:
            out.append(Finding(kind="degenerate_tp_pp", runs=(r.name,)))
        if spec.strategy == "tp_pp" and spec.device == "cpu":
            out.append(Finding(kind="cpu_tp_pp_engine", runs=(r.name,), evidence=EngineNameEvidence(engine=spec.engine)))
    if any(r.spec.device == "cpu" for r in runs):
        out.append(Finding(kind="cpu_campaign"))
    for p in peaks:
        if p.flops is None:
            out.append(Finding(kind="unknown_peak", evidence=UnknownPeakEvidence(gpu_name=p.gpu_name, dtype=p.dtype)))
    for p in placements:  # TP all-reduces on the critical path over the inter-node network
        if p.num_tp_groups_crossing:
            out.append(Finding(kind="tp_crosses_nodes", runs=(p.run,),
                               evidence=TpCrossingEvidence(crossing=p.num_tp_groups_crossing, total=p.num_tp_groups,
                                                           num_nodes=p.num_nodes)))
    if len(model.num_params) > 1:
        out.append(Finding(kind="param_mismatch", runs=tuple(r.name for r in runs),
                           evidence=ParamMismatchEvidence(num_params=model.num_params)))
    return out



PROFILED_SLOWER_MIN = 0.05  # profiled steps this much slower than unprofiled ones are worth a caveat


PREDICTION_ERROR_MAX = 0.25  # leave-one-out errors beyond this make the predictions a rough guide


def build_measurement_caveats(runs: Sequence[LoadedRun], evidence: EvidenceSection,
                              fixed: FixedConfig, *, metric_rows: Sequence[RunSummary] = (),
                              predicted: PredictedSection | None = None) -> list[Finding]:
    """Caveats from facts the campaign already holds: planted causes, profiled steps slower
    than unprofiled ones (section 5 is rescaled), a profiling cost over 2% of the run, a
    measurement overhead beyond its steps' spread, runs at different compile modes (kernels
    differ, not only layouts), one run per layout (margins compared with step-to-step spread
    only), synthetic data only, leave-one-out prediction errors beyond PREDICTION_ERROR_MAX."""
    out: list[Finding] = []
    for m in metric_rows:
        f, spread = m.loop_overhead_fraction, m.loop_overhead_spread
        if f is not None and spread is not None and abs(f) >= spread:
            out.append(Finding(kind="measurement_overhead", runs=(m.run,),
                               evidence=OverheadEvidence(fraction=f, spread=spread)))
    checks = predicted.checks if predicted is not None else ()
    errors = [c.error for c in checks if c.error is not None]
    if errors and max(abs(e) for e in errors) > PREDICTION_ERROR_MAX:
        out.append(Finding(kind="prediction_error", runs=(), threshold=PREDICTION_ERROR_MAX,
                           evidence=PredictionErrorEvidence(low=min(errors), high=max(errors))))
    for r in runs:
        plant = run_plant(r.spec.plant)
        if plant:
            out.append(Finding(kind="planted", runs=(r.name,), evidence=PlantedEvidence(plant=plant)))
    for b in evidence.rows:
        a = b.attribution
        if a is not None and a.rescale is not None and abs(a.rescale - 1) > PROFILED_SLOWER_MIN:
            out.append(Finding(kind="profiled_slower", runs=(b.run,), evidence=RescaleEvidence(rescale=a.rescale),
                               threshold=PROFILED_SLOWER_MIN))
        if b.profile_cost_share is not None and b.profile_cost_share > 0.02:
            out.append(Finding(kind="profile_cost", runs=(b.run,), evidence=ShareEvidence(share=b.profile_cost_share),
                               threshold=0.02))
    compiled = {bool(r.spec.options.get("compile", False)): r.name for r in runs}
    if len(compiled) > 1:
        modes = {m: tuple(r.name for r in runs if bool(r.spec.options.get("compile", False)) == m)
                 for m in (True, False)}
        out.append(Finding(kind="mixed_compile", runs=tuple(r.name for r in runs),
                           evidence=CompileModesEvidence(compiled=modes[True], eager=modes[False])))
    if len(runs) > 1 and not any(run_repeat(r) for r in runs):
        out.append(Finding(kind="no_repeats", runs=()))
    if str(fixed.data or "synthetic") == "synthetic":
        out.append(Finding(kind="synthetic_only", runs=()))
    return out


def build_evidence(trace_tables: Any, campaign: Campaign, runs: Sequence[LoadedRun],
                   summary: Sequence[RunSummary], findings: Sequence[Finding]) -> EvidenceSection:
    """Section 5 from the trace tables (ingest.io.TraceTables or None when the source has no
    traces: third-party folders, campaigns run before profiling)."""
    straggler = tuple(f for f in findings if f.kind == "straggler")
    if trace_tables is None:
        return EvidenceSection(rows=(), runs_without_trace=tuple(r.name for r in runs), warnings=(),
                               knowledge_map=(), straggler=straggler,
                               profile_tables=tuple(ev.summarize_profile_tables(campaign.kernel_summaries)))
    bd = _records(ev.summarize_breakdown(trace_tables.breakdown, campaign.steps))
    classes = {k.run: k for k in ev.build_kernel_shares(ev.summarize_kernel_classes(trace_tables.kernels))}
    warmup = int(campaign.campaign.fixed.warmup_steps or 0)
    cost = {c["run"]: c for c in _records(ev.compute_profile_cost(campaign.steps, trace_tables.meta,
                                                                   warmup_steps=warmup))}
    by_name = {r.name: r for r in runs}
    host = campaign.env.hostname if int(campaign.env.num_nodes or 1) == 1 else None  # one host: it names every rank
    bench = commbench_rows(campaign.source)
    truths, truth_problems = load_plant_truths(campaign.source, [r.name for r in runs if r.spec.plant])
    rows = []
    for b in bd:
        r = by_name.get(b["run"])
        spec = r.spec if r is not None else None
        pp, m = int(spec.pp_degree or 1) if spec else 1, int(spec.num_microbatches or 1) if spec else 1
        bubble_expected = compute_bubble_fraction(
            pp_degree=pp, num_microbatches=m, num_virtual_stages=_virtual_stages(spec.options if spec else None)) \
            if pp > 1 else None
        top = _records(ev.top_kernels(trace_tables.kernels, run=b["run"], num=5))
        k = classes.get(b["run"])
        c = cost.get(b["run"], {})
        median = next((x.step_time_median_s for x in summary if x.run == b["run"]), None)
        rows.append(BreakdownRow(
            attribution=build_attribution(
                trace_tables, run=b["run"], pp_degree=pp, world_size=int(spec.world_size or pp) if spec else pp,
                num_layers=int(spec.fixed.model.num_layers or 0) if spec else 0, plant=spec.plant if spec else None,
                host=host, commbench=bench, median_step_s=median) if spec else None,
            median_step_time_s=median,
            **{f: b[f] for f in ("run", "timeline", "num_ranks", "num_steps", "step_time_s", "recorded_step_time_s",
                                 "sum_error", "compute_s", "exposed_comm_s", "bubble_s", "data_stall_s", "other_s",
                                 "compute_share", "exposed_comm_share", "bubble_share", "data_stall_share",
                                 "other_share", "hidden_comm_s", "idle_s", "compute_imbalance", "compute_min_rank",
                                 "compute_max_rank")},
            bubble_expected=bubble_expected, pp_degree=pp, num_microbatches=m,
            top_kernels=tuple((t["name"], t["kernel_class"], t["share"]) for t in top),
            class_shares=tuple((cls, k.shares[cls] if k else None) for cls in KERNEL_CLASSES),
            profile_cost_s=c.get("cost_s"), profile_cost_share=c.get("share"), export_s=c.get("export_s"),
            nccl=tuple(trace_tables.nccl.get(b["run"], ())),
        ))
    rows = link_stage_predictions(rows, runs)
    transports = tuple(sorted({t for lines in trace_tables.nccl_transports.values() for t in lines}))
    kmap = build_knowledge_map(rows, summary, runs, kernel_rows=list(classes.values()), nccl_transports=transports,
                               attribution={b.run: b.attribution.shares for b in rows if b.attribution is not None})
    traced = {b["run"] for b in bd}
    return EvidenceSection(rows=tuple(rows), runs_without_trace=tuple(r.name for r in runs if r.name not in traced),
                           plant_checks=tuple(build_plant_checks(rows, runs, truths)),
                           warnings=tuple(trace_tables.warnings) + tuple(truth_problems), knowledge_map=tuple(kmap),
                           straggler=straggler,
                           nccl=tuple((r.name, tuple(trace_tables.nccl[r.name])) for r in runs
                                      if trace_tables.nccl.get(r.name)))





def _layout_key(spec: RunSpec) -> tuple:
    """What makes two runs the same layout for a reference: strategy, engine, degrees, micro-batch
    size and data round (a plant may differ)."""
    return (spec.strategy, spec.engine, spec.world_size, spec.tp_degree, spec.pp_degree, spec.dp_degree,
            spec.micro_batch_size, spec.data_round)


def link_stage_predictions(rows: Sequence[BreakdownRow], runs: Sequence[LoadedRun]) -> list[BreakdownRow]:
    """Every pipeline run's balancing split as a prediction with its error: the split and its
    slowest stage from the per-layer cost of an evenly split run of the same layout
    (report.evidence.balance_layers; the run itself when it is even), checked on a run of that
    layout with another split (check_stage_prediction: the largest stage error). Adds to the
    run's stages: source_run (None: no evenly split run, the run's own stages gave the split),
    check_run, check_layers and check_error (None: the campaign has no run of another split)."""
    by_name = {r.name: r for r in runs}
    stages = {b.run: b.attribution.stages for b in rows
              if b.attribution is not None and b.attribution.stages and b.run in by_name}

    def even(name: str) -> bool:
        return len(set(stages[name].layers)) == 1

    out = []
    for b in rows:
        if b.run not in stages:
            out.append(b)
            continue
        peers = [n for n in stages if _layout_key(by_name[n].spec) == _layout_key(by_name[b.run].spec)]
        source = b.run if even(b.run) else next((n for n in peers if even(n)), None)
        linked = dataclasses.replace(stages[b.run], source_run=source, check_run=None, check_layers=None,
                                     check_error=None)
        if source is not None:
            split, slowest = ev.balance_layers(stages[source])
            linked = dataclasses.replace(linked, split=split, predicted_max_stage_s=slowest)
            check = next((n for n in peers if stages[n].layers != stages[source].layers), None)
            if check is not None:
                linked = dataclasses.replace(linked, check_run=check, check_layers=stages[check].layers,
                                             check_error=ev.check_stage_prediction(stages[source], stages[check]))
        out.append(dataclasses.replace(b, attribution=dataclasses.replace(b.attribution, stages=linked)))
    return out


def build_plant_checks(rows: Sequence[BreakdownRow], runs: Sequence[LoadedRun],
                       truths: Mapping[str, PlantTruth] | None = None) -> list[PlantCheck]:
    """Each planted cause (matrix ``plant``) against the category it must be found in: a host
    delay in skew_wait (launch_gaps on one rank: nobody waits), a data delay in data_stall, an
    uneven pipeline split in imbalance, an extra collective in transfer, an extra matmul in
    compute. Truth, measured apart from the trace judged: the delay the matrix asks; for the
    extra collective and matmul their cost timed apart (plant_truth.json, ``truths``); for an
    uneven split the imbalance predicted from the evenly split reference run's per-layer cost.
    recovered = the category's ms in the traced steps minus that of the unplanted run of the
    same strategy, engine and degrees (no reference: the category's ms); traced, not rescaled (a
    planted delay is a fixed time per step). saving: the category's what-if saving minus the
    reference's, against cost: the planted run's median (unprofiled) step minus the reference's,
    taken at equal kernels (kernel_drift_ms: the reference's traced compute minus the planted
    run's; the replay holds kernel durations fixed)."""
    def layout(name: str) -> tuple | None:
        return _layout_key(by_name[name].spec) if name in by_name else None

    by_name = {r.name: r for r in runs}
    truths = truths or {}
    att = {b.run: b.attribution for b in rows if b.attribution is not None}
    median = {b.run: b.median_step_time_s for b in rows}
    out = []
    for name, a in att.items():
        if not a.plant:
            continue
        ref = next((n for n, b in att.items() if not b.plant and layout(n) == layout(name)), None)
        world_size = by_name[name].spec.world_size if name in by_name else None
        truth = truths.get(name)
        causes = []
        if a.plant.host_delay_ms:
            causes.append(("host_delay_ms", float(a.plant.host_delay_ms),
                           "skew_wait" if int(world_size or 1) > 1 else "launch_gaps",
                           int(a.plant.host_delay_rank or 0), "matrix"))
        if a.plant.data_delay_ms:
            causes.append(("data_delay_ms", float(a.plant.data_delay_ms), "data_stall", None, "matrix"))
        if a.plant.pp_layers and a.stages:
            even = att[ref].stages if ref and att[ref].stages else None
            share = ev.predict_stage_imbalance(even, a.plant.pp_layers) if even else None
            if share is not None:  # the split's share from the even run, at this run's total compute
                mean = float(sum(a.stages.stage_compute_s) / len(a.stages.stage_compute_s))
                causes.append(("pp_layers", share * mean * 1e3, "imbalance", None, "even split's per-layer cost"))
        # the op's cost timed in its own steps where recorded, else in the loops around the training loop
        coll_s = truth and (truth.extra_collective_in_step_s or truth.extra_collective_s)
        if a.plant.extra_collective_bytes and coll_s and int(world_size or 1) > 1:
            causes.append(("extra_collective_bytes", coll_s * 1e3, "transfer", None,  # one rank moves nothing
                           "plant_truth.json"))
        if a.plant.extra_matmul_gflop and (mm_s := truth and (truth.extra_matmul_in_step_s or truth.extra_matmul_s)):
            causes.append(("extra_matmul_gflop", mm_s * 1e3, "compute", None, "plant_truth.json"))
        for cause, planted, cat, rank, source in causes:
            got = a.traced_ms.get(cat)
            base = att[ref].traced_ms.get(cat) if ref and cause != "pp_layers" else 0.0
            recovered = got - base if got is not None and base is not None else None
            saved, ref_saved = a.saving_ms.get(cat), (att[ref].saving_ms.get(cat) if ref else 0.0)
            saving = saved - (ref_saved or 0.0) if saved is not None else None
            cost = ((median[name] - median[ref]) * 1e3 if ref and median.get(name) is not None
                    and median.get(ref) is not None else None)
            drift = (att[ref].traced_ms["compute"] - a.traced_ms["compute"]) if ref and cat != "compute" else 0.0
            equal = cost + drift if cost is not None else None
            out.append(PlantCheck(run=name, cause=cause, planted_ms=planted, category=cat,
                                  reference=ref if cause != "pp_layers" else None, recovered_ms=recovered,
                                  error=recovered / planted - 1 if recovered is not None and planted > 0 else None,
                                  rank=rank, straggler_rank=(a.straggler.rank if a.straggler and a.straggler.named
                                                             else None),
                                  saving_ms=saving, cost_ms=cost, kernel_drift_ms=drift,
                                  saving_error=saving / equal - 1 if saving is not None and equal and equal > 0 else None,
                                  truth=source))
    return out


def gap_row(b: BreakdownRow) -> GapRow:
    """A breakdown row for the engine comparison: seconds per traced step of the cross-rank
    categories (ingest.attribution); a run without them keeps its single-rank ones (exposed comm
    as transfer, "other" as launch gaps, no skew wait or imbalance)."""
    a = b.attribution
    if a is not None:
        seconds = {c: (a.shares[c] or 0.0) * a.traced_step_s for c in ev.ATTRIBUTION_KEYS}
    else:
        seconds = {"compute": b.compute_s, "transfer": b.exposed_comm_s, "skew_wait": 0.0, "bubble": b.bubble_s,
                   "imbalance": 0.0, "launch_gaps": b.other_s, "data_stall": b.data_stall_s, "other": 0.0}
    return GapRow(run=b.run, step_time_s=b.step_time_s, seconds=seconds, class_shares=b.class_shares)


def build_hardware(env: EnvSection, *, on_gpu: bool) -> Hardware | None:
    """The hardware the campaign ran on (env.json, cleaned); None when GPU runs' environment
    names no GPU (third-party logs that do not print it): the note says n/a, not "0 × n/a"."""
    names = [g.name for g in env.gpus if g.name]
    mems = [g.memory_total_gib for g in env.gpus if g.memory_total_gib is not None]
    num_gpus = sum(n.gpu_count or 0 for n in env.nodes) if env.nodes else len(env.gpus)
    if on_gpu and not num_gpus and not names:
        return None
    return Hardware(device="cuda" if on_gpu else "cpu", num_gpus=num_gpus if on_gpu else 0,
                    gpu_name=names[0] if names else None, gpu_memory_gib=min(mems) if mems else None,
                    num_nodes=env.num_nodes or 1, cpu_model=env.cpu_model)


def build_executive_summary(findings: Sequence[Finding], conditions: Sequence[Finding],
                            configs: Sequence[RunConfig], rows: Sequence[RunSummary]) -> ExecutiveSummary:
    """The recommendation and its conditions, from the findings already computed (report.rules):
    nothing here is measured or decided anew."""
    kinds = {f.kind: f for f in (*findings, *conditions)}
    best = kinds.get("fastest") or kinds.get("single_run")
    if best is None:
        return ExecutiveSummary(kind="none", not_ok=tuple((m.run, m.status) for m in rows if m.status != "ok"))
    run = best.runs[0]
    config = next(c for c in configs if c.run == run)
    row = next(m for m in rows if m.run == run)
    noise = kinds.get("beyond_noise") or kinds.get("within_noise")
    memory = next((f for f in findings if f.kind in ("memory_headroom", "memory_tight") and f.runs == (run,)), None)
    gpu_count = kinds.get("condition_gpu_count")
    model_size = kinds.get("condition_model_size")
    interconnect = kinds.get("condition_interconnect")
    loss = kinds.get("loss_agrees") or kinds.get("loss_disagrees")
    return ExecutiveSummary(
        kind="recommend" if best.kind == "fastest" else "only_run", run=run, strategy=config.strategy,
        engine=config.engine, tokens_per_s=row.tokens_per_s, mfu=row.mfu,
        runner_up=noise.runs[1] if noise else None, margin=noise.evidence.margin if noise else None,
        beyond_noise=(noise.kind == "beyond_noise") if noise else None,
        loss_agrees=(loss.kind == "loss_agrees") if loss else None,
        headroom=memory.evidence.headroom if memory else None,
        world_sizes=gpu_count.evidence.world_sizes if gpu_count else (),
        no_comm=bool(gpu_count and gpu_count.evidence.no_comm),
        on_gpu=bool(gpu_count and gpu_count.evidence.on_gpu),
        gpu_memory_gib=model_size.evidence.gpu_memory_gib if model_size else None,
        max_params_unsharded=model_size.evidence.max_params_unsharded if model_size else None,
        nvlink=(bool(interconnect.evidence.nvlink) if interconnect and interconnect.evidence.num_gpus > 1
                and interconnect.evidence.topology_recorded else None),
        not_ok=tuple((m.run, m.status) for m in rows if m.status != "ok"))


def build_why(evidence: EvidenceSection, winner: str | None, runner_up: str | None) -> tuple[tuple[str, float], ...]:
    """The two largest positive separations between the runner-up and the winner, per category:
    the runner-up's what-if saving minus the winner's (ingest.whatif; a run where no what-if applies
    saves 0), or, for a category neither has a what-if for (compute, other), its traced time minus
    the winner's (ms per step). () without both
    runs' attribution."""
    att = {b.run: b.attribution for b in evidence.rows if b.attribution is not None}
    a, b = att.get(winner), att.get(runner_up)
    if a is None or b is None:
        return ()
    diffs, _ = compute_category_separations(a, b)
    top = sorted(((c, d) for c, d in diffs.items() if d > 0), key=lambda cd: -cd[1])[:2]
    return tuple((c, float(d)) for c, d in top)


def build_resolved_config(campaign_json: Mapping[str, Any], runs: Sequence[LoadedRun]) -> str:
    """The full resolved configuration as indented JSON: campaign.json as written (fixed
    variables, supervision limits, launch command, tool version) and each run's layout fields
    (LAYOUT_FIELDS of its spec)."""
    def layout(r: LoadedRun) -> dict[str, Any]:
        return {k: getattr(r.spec, k) for k in LAYOUT_FIELDS}

    return json.dumps({"campaign": dict(campaign_json), "runs": {r.name: layout(r) for r in runs}}, indent=2,
                      ensure_ascii=False, default=str)


def build_note(campaign: Campaign, *, figures: Sequence[Figure] = (), convention: str = DEFAULT_CONVENTION,
               thresholds: Mapping[str, float] | None = None, trace_tables: Any = None) -> Note:
    """The whole note's view-model."""
    info, fixed, env_record = campaign.campaign, campaign.campaign.fixed, campaign.env
    runs = campaign.run_records()
    peaks: dict[str, float | None] = {}
    peak_notes: dict[tuple[str, str], PeakUsed] = {}
    for r in runs:
        name = _gpu_name(r, env_record)
        dtype = r.spec.fixed.dtype
        peak = lookup_peak(name, dtype) if name else None
        peaks[r.name] = peak.flops if peak else None
        if name:
            peak_notes[(name, dtype)] = PeakUsed(gpu_name=name, dtype=dtype, flops=peak and peak.flops,
                                                 source=peak and peak.source)
    health = build_health_section(campaign.steps, [r.name for r in runs], warmup_steps=fixed.warmup_steps,
                                  thresholds={**THRESHOLDS, **(thresholds or {})})
    summary = tuple(
        dataclasses.replace(s, unhealthy=True) if s.run in health.unhealthy else s
        for s in metrics.summarize_runs(campaign.steps, runs, warmup_steps=fixed.warmup_steps, peak_flops=peaks,
                                        convention=convention))
    failed_at_step = {s.run: s.failed_at_step for s in summary}
    env = build_env(env_record)
    gpu_mem = min((g.memory_total_gib for g in env.gpus if g.memory_total_gib is not None), default=None)
    model = build_model(fixed, runs)
    fpt = next((s.flops_per_token for s in summary if s.flops_per_token is not None), None)
    on_gpu = any(r.spec.device == "cuda" for r in runs)
    placements = compute_placements(runs, env_record.placement or {})
    commit = info.tool_git_commit if info.tool_git_commit is not None else env.tool_git_commit
    rounds = str(fixed.data or "synthetic").split("+")  # several data rounds: rank the first one's runs
    # ranked: the first data round, one kernels mode, a repeated layout by its median repeat (report.parity)
    repeats = build_repeat_groups(runs, summary)
    ranked = ranked_runs(runs, repeats, first_round=rounds[0])
    curve = metrics.compute_loss_curve(campaign.steps) if not campaign.steps.empty else None
    loss_curves = None
    if curve is not None:  # run -> {step: loss}; curve is sorted by run, then step
        steps_, losses = curve["step"].astype(int).tolist(), curve["loss"].astype(float).tolist()
        loss_curves = {run: dict(zip(steps_[sl], losses[sl]))
                       for run, sl in metrics.run_slices(curve["run"].to_numpy()).items()}
    findings = tuple(build_findings(summary, runs, gpu_memory_gib=gpu_mem, on_gpu=on_gpu, thresholds=thresholds,
                                    loss_curves=loss_curves, loss_from_step=fixed.warmup_steps or 0, ranked=ranked,
                                    health=health.runs))
    evidence = build_evidence(trace_tables, campaign, runs, summary, findings)
    parity = build_parity_rows(trace_tables.kernels if trace_tables is not None else None, runs,
                               timelines={b.run: b.timeline for b in evidence.rows}, thresholds=thresholds)
    findings += tuple(rule_parity(parity)) + tuple(rule_repeat_spread(
        repeats, next((f for f in findings if f.kind in ("beyond_noise", "within_noise")), None)))
    conditions = tuple(rule_conditions(runs, gpu_memory_gib=gpu_mem, topology=env.topology,
                                       num_params=model.num_params[0] if model.num_params else None,
                                       num_gpus=len(env.gpus) if on_gpu else 0, dtype=model.dtype))
    configs = tuple(build_config(r) for r in runs)
    mode = ranking_mode(runs)  # once: inside the loop below it was a scan of every run per run
    predicted = build_predicted_or_reason(campaign, fixed, runs, summary, env_record, measured={
        b.run: dict(b.attribution.breakdown_ms) for b in evidence.rows if b.attribution is not None})
    return Note(
        campaign=campaign.name, created_at=info.created_at,
        tool_version=info.tool_version, tool_git_commit=commit,
        per_unit=N_("GPU") if on_gpu else N_("process"), env=env, model=model, configs=configs,
        metrics=summary, peaks=tuple(peak_notes.values()), flops_per_token=fpt, convention=convention,
        not_measured=NOT_MEASURED, figures=tuple(figures),
        evidence=evidence,
        engine_groups=build_engine_groups(summary, runs, [gap_row(b) for b in evidence.rows],
                                          dtype=model.dtype, gpu_memory_gib=gpu_mem, model=fixed.model,
                                          thresholds=thresholds),
        knob_findings=tuple(rule_engine_knobs(summary, runs, [gap_row(b) for b in evidence.rows],
                                              {**THRESHOLDS, **(thresholds or {})})),
        findings=findings,
        hang_ranks=build_hang_ranks(runs), placements=placements,
        conditions=conditions,
        caveats=tuple(build_caveats(campaign, runs, model, list(peak_notes.values()), rows=summary,
                                    cores=env.cores_logical or env.cores_physical,
                                    placements=placements)) + tuple(build_measurement_caveats(
                                        runs, evidence, fixed, metric_rows=summary, predicted=predicted)),
        formulas=FORMULAS, hardware=build_hardware(env, on_gpu=on_gpu),
        executive=dataclasses.replace(
            build_executive_summary(findings, conditions, configs, summary),
            not_layout_only=next((tuple(f.evidence.classes) for f in findings if f.kind == "not_layout_only"), ()),
            repeat_spread=next((f for f in findings if f.kind.startswith("margin_") and f.kind.endswith("_repeats")),
                               None),
            unranked_modes=tuple((r.name, kernels_mode(r)) for r in runs if kernels_mode(r) != mode),
            unhealthy=tuple(health.unhealthy),
            **_why(evidence, parity, findings)),
        parity=parity, repeats=repeats,
        parity_tolerance={**THRESHOLDS, **(thresholds or {})}["parity_tolerance"],
        resolved_config=build_resolved_config(campaign.campaign_json, runs),
        triage=TriageSection(runs=build_triage_runs(runs, failed_at_step=failed_at_step)),
        predicted=predicted, health=health, **build_capacity(campaign.source),
        search=build_search_note(campaign.source, evidence),
        overlap=build_overlap_section(
            runs, step_times_s={m.run: (m.step_time_median_s, m.step_time_p90_s) for m in summary},
            attribution={b.run: b.attribution for b in evidence.rows if b.attribution is not None},
            noise_multiple={**THRESHOLDS, **(thresholds or {})}["noise_multiple"]),
        data_round=build_data_round_section(
            fixed=fixed, dataset=info.dataset, env=env_record, runs=runs, summary=summary, steps=campaign.steps,
            thresholds=thresholds))


def build_capacity(source: Any) -> dict[str, Any]:
    """Note fields ``capacity`` / ``capacity_problems`` from <campaign>/capacity/capacity.json
    (ingest.io.load_capacity; report.capacity); nothing for a source without one."""
    from core.formulas import count_params
    from core.perfmodel import build_shape
    from ingest.io import load_capacity
    from report.capacity import build_capacity_section

    if not isinstance(source, (str, Path)):
        return {}
    result, problems = load_capacity(source)
    if result is None:
        return {"capacity_problems": tuple(problems)} if problems else {}
    sizes = tuple(count_params(build_shape(m, name=f"rung{i}")) for i, m in enumerate(result.ladder))
    return {"capacity": build_capacity_section(result, num_params_by_rung=sizes)}


def _why(evidence: EvidenceSection, parity: Sequence[Any], findings: Sequence[Finding]) -> dict[str, Any]:
    """ExecutiveSummary's why and kernels_match for the fastest run against the runner-up."""
    kinds = {f.kind: f for f in findings}
    best, noise = kinds.get("fastest"), kinds.get("beyond_noise") or kinds.get("within_noise")
    if best is None or noise is None:
        return {}
    winner, runner_up = best.runs[0], noise.runs[1]
    passed = {p.run: p.passed for p in parity}
    both = (passed.get(winner), passed.get(runner_up))
    return {"why": build_why(evidence, winner, runner_up),
            "kernels_match": None if None in both else all(both)}


from report.triage import TriageSection, build_triage_runs  # noqa: E402 - below the Note it fills


def build_predicted_or_reason(campaign: Campaign, fixed: FixedConfig, runs: Sequence[LoadedRun],
                              summary: Sequence[RunSummary], env: EnvRecord,
                              measured: Mapping[str, Mapping[str, float]] | None = None) -> PredictedSection:
    """report.predict's block (measured: run -> section 5's breakdown_median_ms, for the
    per-category checks); a source it cannot model (third-party logs without a layout) gets
    the block's reason instead of a failed note."""
    from report.predict import build_predicted, unavailable

    unsized = [r.name for r in runs if r.spec.micro_batch_size is None]
    if unsized:  # a third-party log that does not print it: the model cannot split the batch
        return unavailable(Message(N_("the logs do not give the micro-batch size of %(runs)s; pass it with "
                                      "--model micro_batch_size=N"), runs=MessageList(unsized)))
    try:
        return build_predicted(campaign.source, fixed=fixed, runs=runs, summary=summary, env=env, breakdowns=measured)
    except (KeyError, TypeError, ValueError, ArithmeticError) as e:  # a field the model needs is missing or odd
        return unavailable(f"{type(e).__name__}: {e}")
