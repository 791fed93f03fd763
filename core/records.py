"""Typed records that cross stage boundaries (runner -> ingest -> report).

Every record is a frozen, keyword-only dataclass; every file written from one carries
``schema_version``. Stages exchange only these records (or tables whose columns are these
records' fields). This module holds no I/O and no logic beyond (de)serialisation.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

SCHEMA_VERSION = 1

# Strategies and their engines; the first engine of each is the default.
STRATEGY_ENGINES: dict[str, tuple[str, ...]] = {
    "ddp": ("torch-ddp",),
    "zero3": ("deepspeed", "fsdp2"),
    "tp_pp": ("megatron", "torch"),
}

RUN_STATUSES = ("ok", "oom", "crash", "hang", "timeout", "interrupted", "skipped")
# Statuses a resumed campaign or search keeps; "interrupted" (and a run still "running") is run again.
FINAL_STATUSES = frozenset(RUN_STATUSES) - {"interrupted"}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """GPT shape. ``padded_vocab_size`` is ``vocab_size`` rounded up to a multiple of
    128 x (largest tp_degree in the campaign), as Megatron-LM pads it, so every run of a
    campaign has the same parameter count."""

    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    seq_length: int
    vocab_size: int
    padded_vocab_size: int


@dataclass(frozen=True, kw_only=True)
class FixedConfig:
    """Variables held fixed across every run of a campaign (DESIGN.md, fixed-variable experiment)."""

    preset: str
    model: ModelConfig
    global_batch_size: int  # sequences per optimizer step
    dtype: str  # "bf16" | "fp32"
    seed: int
    steps: int
    warmup_steps: int  # steps excluded from the metric table (compile, allocator, caches)
    lr: float
    min_lr: float
    lr_warmup_steps: int
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    grad_clip: float
    # data rounds, '+'-joined in matrix order ("synthetic", "real", "synthetic+real"); each run
    # reads one of them (RunSpec.data_round): synthetic Zipf tokens or the real-text dataset below
    data: str
    # torch.profiler window (issue 4): one warm-up step at profile_start_step - 1, then
    # profile_num_steps traced steps; all of them are marked ``profiled`` and kept out of the
    # metric table. profile_num_steps == 0 disables tracing.
    profile_start_step: int = 0
    profile_num_steps: int = 0
    # the real-text round's dataset (runner.corpus): Megatron indexed dataset prefix (<prefix>.bin /
    # .idx, absolute), its token dtype and token count as validated before launch; None without one
    data_path: str | None = None
    data_token_dtype: str | None = None
    data_num_tokens: int | None = None


@dataclass(frozen=True, kw_only=True)
class Plant:
    """A known slowdown deliberately injected into one run (the matrix's ``plant`` table), so the
    analysis can be proven to find it (DESIGN.md, planted causes). None: not planted.

    host_delay_ms: rank ``host_delay_rank`` sleeps this long on the host right before every
    step's forward (a ``plant_host_delay`` profiler range on the training thread). data_delay_ms:
    every rank's every batch fetch takes this much longer (inside the step's ``data`` range).
    pp_layers: transformer layers per pipeline stage, in stage order (len == pp_degree, each >= 1,
    sum == num_layers) instead of the even split. extra_collective_bytes: every rank runs one
    extra all-reduce of an fp32 tensor of exactly this many bytes (a multiple of 4) on the world
    process group every step, after the trainer's step (a ``plant_extra_collective`` range):
    exposed transfer. extra_matmul_gflop: every rank runs one extra square matmul of about this
    many GFLOP (2 n^3, n from core.formulas.compute_square_matmul_n; the run's dtype) every step
    before the forward (a ``plant_extra_matmul`` range): compute. The truth of the last two is
    timed apart from the traced steps (PlantTruth). lr_spike_factor: the learning rate of step
    lr_spike_step (0-based) times this factor, on every rank (a known perturbation of training
    for the health check, report.health). Checked by runner.matrix."""

    host_delay_ms: float | None = None
    host_delay_rank: int | None = None  # set whenever host_delay_ms is
    data_delay_ms: float | None = None
    pp_layers: tuple[int, ...] | None = None
    extra_collective_bytes: int | None = None
    extra_matmul_gflop: float | None = None
    lr_spike_step: int | None = None  # set together with lr_spike_factor
    lr_spike_factor: float | None = None


@dataclass(frozen=True, kw_only=True)
class PlantTruth:
    """What a run's extra collective and extra matmul plants cost, timed apart from the traced
    steps (<run>/plant_truth.json, written by rank 0 after the run): the known answer the
    analysis of the trace is checked against, never computed from that trace.

    Each op is timed in two loops in the run's own processes, one right before the training loop
    and one right after it (so a machine whose load drifts during the run is sampled on both
    sides of the traced steps): num_warmup untimed, then num_timed timed iterations each.
    method: how (clock, barriers, reduction over ranks). extra_collective_s: median over the
    timed iterations of both loops of the shortest rank's time for one all-reduce of
    extra_collective_bytes (the rank that arrived last waited for nobody: its time is the
    transfer); _before_s / _after_s: the same over one loop. extra_matmul_s: mean over ranks of
    each rank's median time of one extra_matmul_n x extra_matmul_n matmul in
    extra_matmul_dtype (extra_matmul_flop = 2 n^3 exactly); _before_s / _after_s likewise.
    _in_step_s: the same reduction over the op timed by its own clock inside each of the
    _in_step_num steps after the warm-up (the cost the op has among the step's other work, on
    a machine whose other load the loops do not see); the note's known answer where present.
    None where that plant is not set."""

    schema_version: int = SCHEMA_VERSION
    run: str
    method: str
    device: str  # "cuda" | "cpu"
    world_size: int
    num_warmup: int  # per loop
    num_timed: int  # per loop
    extra_collective_bytes: int | None = None
    extra_collective_s: float | None = None
    extra_collective_before_s: float | None = None
    extra_collective_after_s: float | None = None
    extra_collective_in_step_s: float | None = None
    extra_collective_in_step_num: int | None = None
    extra_matmul_n: int | None = None
    extra_matmul_flop: int | None = None
    extra_matmul_dtype: str | None = None
    extra_matmul_s: float | None = None
    extra_matmul_before_s: float | None = None
    extra_matmul_after_s: float | None = None
    extra_matmul_in_step_s: float | None = None
    extra_matmul_in_step_num: int | None = None


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """What one run was asked to do: the fixed variables plus its parallel layout.

    Invariants (checked by runner.matrix): world_size == tp_degree * pp_degree * dp_degree;
    global_batch_size == micro_batch_size * num_microbatches * dp_degree.
    """

    schema_version: int = SCHEMA_VERSION
    campaign: str
    name: str
    strategy: str
    engine: str
    world_size: int
    tp_degree: int
    pp_degree: int
    dp_degree: int
    micro_batch_size: int
    num_microbatches: int  # grad-accumulation steps (DDP/ZeRO) or pipeline micro-batches (PP)
    device: str  # "cuda" | "cpu"
    backend: str  # "nccl" | "gloo"
    fixed: FixedConfig
    options: Mapping[str, Any] = field(default_factory=dict)  # engine knobs (e.g. ZeRO buckets)
    collective_timeout_s: float = 1800.0  # process-group timeout (NCCL watchdog / gloo)
    nsys: bool = False  # run under `nsys profile` (NVTX ranges for the phases), report in trace/
    # which data round this run reads ("synthetic" | "real"; FixedConfig.data lists the rounds) and
    # the matrix's [[runs]] name the rounds of one layout share (the run name of the synthetic round)
    data_round: str = "synthetic"
    layout: str | None = None
    # checkpoint cost (runner.checkpoint): save after step checkpoint_step (None: no checkpoint) into
    # checkpoint_dir (None: <run>/checkpoint), restore after the run and replay the next
    # checkpoint_verify_steps steps against the uninterrupted run's losses; keep the files or not
    checkpoint_step: int | None = None
    checkpoint_dir: str | None = None
    checkpoint_verify_steps: int = 0
    checkpoint_keep: bool = False
    plant: Plant | None = None  # a deliberately injected slowdown (planted-cause tests); None in real runs

    @property
    def tokens_per_step(self) -> int:
        return self.fixed.global_batch_size * self.fixed.model.seq_length


@dataclass(frozen=True, kw_only=True)
class StepRow:
    """One optimizer step on one rank (metrics/rank<r>.jsonl).

    step_time_s: time between the end of the previous step and the end of this one,
    measured with CUDA events on GPU (perf_counter on CPU). tokens: tokens consumed by the
    whole job in this step (global batch x seq). loss: mean LM loss over the rank's
    micro-batches, None on ranks that do not compute it (non-last pipeline stages).
    mem_*_gib: allocator peaks within this step (None on CPU). data_wait_s: host time
    blocked fetching this step's batch.
    """

    schema_version: int = SCHEMA_VERSION
    run: str
    rank: int
    step: int
    step_time_s: float
    tokens: int
    loss: float | None
    lr: float
    grad_norm: float | None
    mem_peak_allocated_gib: float | None
    mem_peak_reserved_gib: float | None
    data_wait_s: float
    wall_time_s: float  # monotonic seconds since the rank's training loop began
    engine: str | None = None  # every artifact names its engine (None in rows written before schema 1.1)
    # wall clock (epoch s) when this rank had its batch and entered the step's compute: the
    # spread across ranks of one step is the straggler skew (same host clock; NTP across nodes)
    step_entry_time_s: float | None = None
    # inside the profiler window (its warm-up step included): excluded from the metric table
    profiled: bool = False


@dataclass(frozen=True, kw_only=True)
class RunInfo:
    """Facts a run learns about itself at start-up (run_info.json, written by rank 0)."""

    schema_version: int = SCHEMA_VERSION
    run: str
    engine: str
    num_params: int  # unique parameters, tied embedding counted once
    num_params_position_embedding: int
    torch_version: str
    engine_version: str
    device_name: str
    num_gpus: int
    compile: bool = False  # torch.compile on (options.compile)
    first_step_s: float | None = None  # wall time of step 0 (compilation, lazy set-up), a warm-up step
    compile_s: float | None = None  # first_step_s - step 1's wall time: compile cost, never in a step time
    # measurement overhead (rank 0): the recorder's time for the run's last loop_overhead_num_steps
    # steps / a bare train_step loop over the same steps' batches after the run, minus 1
    loop_overhead_fraction: float | None = None
    loop_overhead_num_steps: int | None = None
    # transformer layers each pipeline rank's built modules hold, in pp-rank order (gathered from
    # the ranks, so a planted uneven split is evidenced by what was built); None without PP
    pp_stage_num_layers: tuple[int, ...] | None = None
    # the kernels the run used (runner.kernels): mode ("parity" | "engine-best"), loss, attention,
    # optimizer, compile scope, and not_taken {piece: why this engine cannot take parity's choice}
    kernels: dict | None = None


@dataclass(frozen=True, kw_only=True)
class CheckpointRecord:
    """One run's checkpoint save and restore (<run>/checkpoint.json, written by rank 0).

    format: the engine's own sharded format ("torch.distributed.checkpoint", "deepspeed",
    "megatron.dist_checkpointing"). save_s / load_s: wall seconds from a barrier before to a
    barrier after the call, max over ranks (the job waits for the slowest). bytes_written /
    num_files: what the directory holds after the save. verify_steps: the steps replayed after
    the restore; loss_uninterrupted / loss_restored: their losses (mean over the ranks that
    compute one) in the uninterrupted run and after the restore; max_abs_diff_nats: the largest
    gap; ok: every gap <= tolerance_nats."""

    schema_version: int = SCHEMA_VERSION
    run: str
    engine: str
    format: str
    path: str
    step: int  # saved after this step's optimizer update
    save_s: float
    load_s: float | None
    bytes_written: int
    num_files: int
    verify_steps: tuple[int, ...] = ()
    loss_uninterrupted: tuple[float, ...] = ()
    loss_restored: tuple[float, ...] = ()
    max_abs_diff_nats: float | None = None
    tolerance_nats: float | None = None
    ok: bool | None = None
    kept: bool = False  # False: the files were deleted after the restore check


@dataclass(frozen=True, kw_only=True)
class DatasetRecord:
    """The real-text dataset of a campaign (<campaign>/data/dataset.json; runner.corpus).

    prefix: Megatron indexed dataset prefix (.bin/.idx). source: what the text is ("python
    stdlib" or "files"), sources: the input files (or the stdlib directory), source_bytes: their
    size. tokenizer: tokenizer.json used (trained: fitted on this corpus by runner.corpus).
    num_documents / num_tokens: as written (EOD appended to every document); token_dtype: the
    .bin element type; vocab_size: the tokenizer's; max_token_id: the largest id in the .bin."""

    schema_version: int = SCHEMA_VERSION
    prefix: str
    source: str
    sources: tuple[str, ...]
    source_bytes: int
    tokenizer: str | None
    tokenizer_trained: bool
    vocab_size: int | None
    eod_token_id: int | None
    num_documents: int
    num_tokens: int
    token_dtype: str
    max_token_id: int
    bin_bytes: int
    build_s: float | None = None  # wall time to tokenize and write (None: prepared elsewhere)
    # how many source files: campaign.json's copy lists only the first few in ``sources``
    num_sources: int | None = None


@dataclass(frozen=True, kw_only=True)
class RunStatus:
    """How a run ended (status.json)."""

    schema_version: int = SCHEMA_VERSION
    run: str
    status: str  # one of RUN_STATUSES
    exit_code: int | None
    cause: str | None
    started_at: str | None  # ISO-8601 UTC
    ended_at: str | None
    duration_s: float | None
    command: tuple[str, ...] = ()
    engine: str | None = None
    # hang/oom/crash evidence: per-rank stacks or flight-recorder summary, allocator numbers
    diagnosis: Mapping[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class LoadedRun:
    """One run as ingest loaded it, for the note: what it was asked (spec.json), how it ended
    (status.json; None: no file, the runner stopped first), what it learned about itself
    (run_info.json; None: no file), its checkpoint (checkpoint.json; None: none) and how many
    metric files and valid rows were read. Runs reconstructed from third-party logs carry None
    in the spec and info fields the logs do not state, whatever the field's type says."""

    spec: RunSpec
    status: RunStatus | None = None
    info: RunInfo | None = None
    checkpoint: CheckpointRecord | None = None
    num_metric_files: int = 0
    num_metric_rows: int = 0

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def status_name(self) -> str | None:
        """status.json's status (any text), None without status.json."""
        return self.status.status if self.status is not None else None

    @property
    def num_params(self) -> int | None:
        return self.info.num_params if self.info is not None else None

    @property
    def compiled(self) -> bool | None:
        """torch.compile on (run_info), None without run_info.json."""
        return self.info.compile if self.info is not None else None


@dataclass(frozen=True, kw_only=True)
class RunSummary:
    """One run's measured summary (report.metrics.summarize_runs), the note's metric-table row.

    Times in seconds, memory in GiB (max over ranks and measured steps), MFU and shares as
    fractions; None where not measured (never 0). status: a RUN_STATUSES value, "unfinished"
    (no status.json) or "unknown" (any other value); failed_at_step: the first step not completed
    by every rank (0-based), None for runs that ended ok or wrote no rows."""

    run: str
    status: str
    failed_at_step: int | None = None
    num_steps_measured: int = 0
    step_time_median_s: float | None = None
    step_time_p90_s: float | None = None
    tokens_per_step: int | None = None  # global batch x sequence length
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None  # per process on CPU
    flops_per_token: float | None = None  # the note's convention
    mfu: float | None = None  # the note's convention
    mfu_6n: float | None = None
    mfu_causal: float | None = None
    mem_peak_allocated_gib: float | None = None
    mem_peak_reserved_gib: float | None = None
    data_wait_median_s: float | None = None
    loss_first: float | None = None
    loss_last: float | None = None
    num_params: int | None = None
    # the rank that enters the step last (report.metrics.compute_straggler)
    straggler_rank: int | None = None
    straggler_lag_median_s: float | None = None
    straggler_last_share: float | None = None
    # instrumented loop vs a bare train_step loop over the run's last steps (RunInfo), or None
    loop_overhead_fraction: float | None = None
    loop_overhead_num_steps: int | None = None
    # (max - min) / median of rank 0's step times over those same steps: an estimate inside it is not resolved
    loop_overhead_spread: float | None = None
    # checkpoint.json (runner.checkpoint): save / restore seconds and bytes written, None without one
    ckpt_save_s: float | None = None
    ckpt_load_s: float | None = None
    ckpt_size_bytes: int | None = None
    # report.health: the loss diverged or the gradient norm exploded; the speed numbers are not ranked
    unhealthy: bool = False

    @property
    def partial(self) -> bool:
        """Numbers from a run that did not end ok: shown, never ranked."""
        return self.status != "ok" and self.num_steps_measured > 0


# ---------------------------------------------------------------- env.json (runner.env)


@dataclass(frozen=True, kw_only=True)
class CpuInfo:
    model: str | None = None
    cores_logical: int | None = None
    cores_physical: int | None = None


@dataclass(frozen=True, kw_only=True)
class DiskInfo:
    """Size of the filesystem holding the campaign directory (``path``)."""

    path: str | None = None
    total_gib: float | None = None
    free_gib: float | None = None


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    """One GPU as ``nvidia-smi --query-gpu`` reports it."""

    index: int | None = None
    name: str | None = None
    memory_total_mib: float | None = None
    driver_version: str | None = None
    power_limit_w: float | None = None
    clocks_sm_max_mhz: float | None = None


@dataclass(frozen=True, kw_only=True)
class StorageInfo:
    """Where one role's files live (runner.env.collect_storage): role "campaign" | "data" |
    "checkpoints", the path, its mount point, filesystem type, device, disk kind ("nvme" | "ssd" |
    "hdd" | "network" | "memory", None when unknown), total and free GiB."""

    role: str | None = None
    path: str | None = None
    mountpoint: str | None = None
    fstype: str | None = None
    device: str | None = None
    kind: str | None = None
    total_gib: float | None = None
    free_gib: float | None = None


@dataclass(frozen=True, kw_only=True)
class NodeEnv:
    """One node of a multi-node campaign (its env_node<K>.json, folded into env.json by runner.nodes)."""

    node_rank: int | None = None
    hostname: str | None = None
    cpu: CpuInfo | None = None
    host_memory_gib: float | None = None
    gpu_count: int | None = None
    gpus: tuple[GpuInfo, ...] = ()


@dataclass(frozen=True, kw_only=True)
class RankPlacement:
    """Where one global rank of a multi-node run lived (<run>/placement.json, runner.train)."""

    node_rank: int | None = None
    group_rank: int | None = None  # torchrun's GROUP_RANK
    hostname: str | None = None
    local_rank: int | None = None


@dataclass(frozen=True, kw_only=True)
class EnvRecord:
    """The environment of a campaign (env.json, runner.env.collect_env; DESIGN.md, Environment
    record): host, CPU, memory, disk, GPUs, ``nvidia-smi topo -m``, library versions, launch
    command, tool commit and the allow-listed, redacted environment variables the ranks ran with.
    storage: where the campaign's files live. Multi-node campaigns add num_nodes, nodes (one per
    node) and placement (run -> global rank as text -> where it lived); a node's own
    env_node<K>.json carries node_rank. sources: for a record read from third-party logs, the
    files it was read from. Every field may be missing (None) in an older or damaged file."""

    schema_version: int = SCHEMA_VERSION
    collected_at: str | None = None  # ISO-8601 UTC
    hostname: str | None = None
    os: str | None = None
    python: str | None = None
    cpu: CpuInfo | None = None
    host_memory_gib: float | None = None
    disk: DiskInfo | None = None
    gpu_count: int | None = None
    gpus: tuple[GpuInfo, ...] = ()
    topology: str | None = None
    versions: Mapping[str, str | None] = field(default_factory=dict)  # library -> version text
    launch_command: tuple[str, ...] | None = None
    tool_git_commit: str | None = None
    env_vars: Mapping[str, str | None] = field(default_factory=dict)
    storage: tuple[StorageInfo, ...] | None = None
    num_nodes: int | None = None
    nodes: tuple[NodeEnv, ...] = ()
    placement: Mapping[str, Mapping[str, RankPlacement]] | None = None
    node_rank: int | None = None
    sources: tuple[str, ...] | None = None


# ---------------------------------------------------------------- campaign.json (runner.cli)


@dataclass(frozen=True, kw_only=True)
class SupervisionLimits:
    """The watchdog's limits for every run of a campaign (runner.matrix; runner.launch.Watchdog)."""

    run_timeout_s: float
    stall_timeout_s: float
    startup_timeout_s: float


@dataclass(frozen=True, kw_only=True)
class CampaignNodes:
    """A multi-node campaign's launch: node count and the rendezvous (run i uses base port + i)."""

    nnodes: int
    rdzv_endpoint: str  # HOST:PORT
    rdzv_port_rule: str


@dataclass(frozen=True, kw_only=True)
class CampaignRecord:
    """A campaign as the runner resolved it (campaign.json): its name, when and by which tool
    version and commit it was made, the matrix file and launch command, the device, the
    watchdog limits, the fixed variables every run shares, the run names in order, the
    real-text round's dataset (its ``sources`` cut to the first few; None without a real round)
    and, on several nodes, the launch (None on one). Fields an older file lacks read as None."""

    schema_version: int = SCHEMA_VERSION
    name: str | None = None
    created_at: str | None = None  # ISO-8601 UTC
    tool_version: str | None = None
    tool_git_commit: str | None = None
    matrix_path: str | None = None
    launch_command: tuple[str, ...] | None = None
    device: str | None = None  # "cuda" | "cpu"
    supervision: SupervisionLimits | None = None
    fixed: FixedConfig
    runs: tuple[str, ...] = ()
    dataset: DatasetRecord | None = None
    nodes: CampaignNodes | None = None


# Phase ranges every engine annotates (torch.profiler record_function; NVTX under nsys):
# the runner writes them, ingest.traces reads them. Pipeline schedules that interleave forward
# and backward annotate the whole schedule as "forward_backward".
PHASE_RANGES = ("data", "forward", "backward", "forward_backward", "optimizer")
# Ranges around a planted cause's own work (Plant; runner.plants): a host delay's sleep on the
# planted rank, the extra all-reduce after the trainer's step, the extra matmul before the forward.
PLANT_HOST_DELAY_RANGE, PLANT_EXTRA_COLLECTIVE_RANGE, PLANT_EXTRA_MATMUL_RANGE = (
    "plant_host_delay", "plant_extra_collective", "plant_extra_matmul")
PLANT_RANGES = (PLANT_HOST_DELAY_RANGE, PLANT_EXTRA_COLLECTIVE_RANGE, PLANT_EXTRA_MATMUL_RANGE)

# Categories of a step's time on one rank; they partition the step's interval, so
# compute + exposed_comm + bubble + data_stall + other == step interval (by construction).
BREAKDOWN_CATEGORIES = ("compute", "exposed_comm", "bubble", "data_stall", "other")
KERNEL_CLASSES = ("gemm", "attention", "loss", "optimizer", "elementwise", "comm", "memory", "other")


@dataclass(frozen=True, kw_only=True)
class StepBreakdownRow:
    """Where one profiled step's time went on one rank, measured from its profiler trace.

    timeline: "gpu" (CUDA kernels/memcpy on all streams of the rank's device) or "cpu" (host
    ops of the training thread, for CPU/gloo runs). step_time_s: the step's interval on that
    timeline (GPU: first kernel launched by step k to first kernel launched by step k+1; CPU:
    the ProfilerStep#k range). The five category fields partition step_time_s:

    * compute_s: time some compute kernel (or host compute op) runs;
    * exposed_comm_s: communication with no concurrent compute (collectives; on PP ranks
      the P2P send/recv time is counted as bubble instead);
    * bubble_s: on pipeline ranks, idle or P2P-wait time between micro-batches;
    * data_stall_s: device idle while the host is inside the step's ``data`` range;
    * other_s: the rest (exposed memcpy/memset, launch gaps, host overhead).

    hidden_comm_s (comm overlapped by compute) and idle_s (no kernel at all) are extra views,
    not part of the partition. Reference: HolisticTraceAnalysis temporal breakdown
    (hta/analyzers/breakdown_analysis.py) for the idle/compute/non-compute split.
    """

    schema_version: int = SCHEMA_VERSION
    run: str
    rank: int
    step: int
    timeline: str
    step_time_s: float
    compute_s: float
    exposed_comm_s: float
    bubble_s: float
    data_stall_s: float
    other_s: float
    hidden_comm_s: float
    idle_s: float
    num_kernels: int


@dataclass(frozen=True, kw_only=True)
class KernelSummaryRow:
    """One kernel (or host op on CPU timelines) name on one rank, summed over the analysed
    steps. kernel_class: one of KERNEL_CLASSES. total_s: summed durations (not a union)."""

    schema_version: int = SCHEMA_VERSION
    run: str
    rank: int
    name: str
    kernel_class: str
    num_calls: int
    total_s: float
    num_steps: int


@dataclass(frozen=True, kw_only=True)
class AttributionRow:
    """Where one profiled step's time went on one rank, with the other ranks' traces taken
    into account (ingest.attribution). The eight ``*_s`` categories tile step_time_s:

    * compute_s: a compute kernel (host compute op on CPU timelines) runs;
    * transfer_s: a collective runs exposed (no compute) after the last rank has arrived;
    * skew_wait_s: exposed collective time spent waiting for a later rank, plus, on the rank
      the others waited for, its device-idle host time that made it late;
    * bubble_s: pipeline warm-up/cool-down waits that 1F1B implies for balanced stages;
    * imbalance_s: the other pipeline waits (a slower stage);
    * launch_gaps_s: device idle while the host runs code (not a batch fetch);
    * data_stall_s: device idle while the host fetches the batch;
    * other_s: the rest (exposed memcpy/memset, other kernels, host ops outside the phases).

    num_launch_gaps / launch_gap_p50_s / launch_gap_max_s: count and sizes of the idle gaps of
    1 us or more. late: the other ranks waited for this rank in this step; late_cause: what it
    was doing ("GPU busy", "host compute", "data", "host code"); late_caused_wait_s: the
    largest exposed wait it caused on another rank."""

    schema_version: int = SCHEMA_VERSION
    run: str
    rank: int
    step: int
    timeline: str
    step_time_s: float
    compute_s: float
    transfer_s: float
    skew_wait_s: float
    bubble_s: float
    imbalance_s: float
    launch_gaps_s: float
    data_stall_s: float
    other_s: float
    num_launch_gaps: int
    launch_gap_p50_s: float | None
    launch_gap_max_s: float | None
    late: bool
    late_cause: str | None
    late_caused_wait_s: float


# The eight categories of AttributionRow that tile a traced step (ingest.attribution), in the
# note's order; WhatIfRow.category is one of them.
ATTRIBUTION_CATEGORIES = ("compute", "transfer", "skew_wait", "bubble", "imbalance", "launch_gaps", "data_stall",
                          "other")
# a WhatIfRow category beside ATTRIBUTION_CATEGORIES: every collective at `runner commbench`'s
# measured time for its op, size and group size, instead of at zero
TRANSFER_AT_COMMBENCH = "transfer_at_commbench"


@dataclass(frozen=True, kw_only=True)
class WhatIfRow:
    """What removing one category's cause would save in one run (ingest.whatif): spent_s, the
    category's mean time per traced step over the ranks (AttributionRow); saving_s, the traced
    step time minus the step replayed without the cause (signed; None: no what-if removes this
    category, e.g. compute); method: "replay" (the dependency replay of the traced steps) or
    "analytic" (pipeline bubble and imbalance, from the 1F1B model); replay_step_s: the replayed
    step with nothing removed, traced_step_s: the traced mean step (their difference is the
    replay's own error). Seconds per step."""

    schema_version: int = SCHEMA_VERSION
    run: str
    category: str
    spent_s: float
    saving_s: float | None
    method: str | None
    replay_step_s: float | None
    traced_step_s: float


@dataclass(frozen=True, kw_only=True)
class CollectiveRow:
    """One collective matched across the ranks' traces (ingest.attribution). group: process
    group name ("gloo" on CPU timelines); kind: runner commbench's op name; seq: its order
    among the step's collectives of that group and kind; nbytes: nccl-tests' size (None when
    the trace does not say); late_rank: the rank that arrived last (shortest duration);
    transfer_s: that rank's duration; max_wait_s: the longest wait of another rank;
    exposed_wait_s: the longest such wait where it was exposed (not under compute) and not the
    pipeline's drain: what the late rank is charged for (None in tables of an older analysis);
    busbw_gbps: nbytes / transfer_s x bus factor (nccl-tests doc/PERFORMANCE.md), GB/s."""

    schema_version: int = SCHEMA_VERSION
    run: str
    step: int
    group: str
    kind: str
    seq: int
    num_ranks: int
    nbytes: int | None
    late_rank: int
    transfer_s: float
    max_wait_s: float
    busbw_gbps: float | None
    exposed_wait_s: float | None = None


@dataclass(frozen=True, kw_only=True)
class TimelineSpanRow:
    """A merged busy span of one category in one step on one rank, for the timeline figure.
    start_s/end_s: seconds from the step's start on that timeline. category: one of
    BREAKDOWN_CATEGORIES or "hidden_comm"."""

    schema_version: int = SCHEMA_VERSION
    run: str
    rank: int
    step: int
    category: str
    start_s: float
    end_s: float


@dataclass(frozen=True, kw_only=True)
class CommBenchRow:
    """One collective at one message size, measured by `runner commbench` (nccl-tests
    conventions, doc/PERFORMANCE.md). nbytes: the whole buffer (all-reduced, gathered output,
    scattered input, each rank's send buffer); time_us: mean per call over num_iters, max over
    ranks; algbw_gbps = nbytes / time (GB/s, 1e9 bytes/s); busbw_gbps = algbw x bus factor
    (all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; send_recv 1).
    num_nodes > 1: the group spans nodes (the inter-node scope)."""

    schema_version: int = SCHEMA_VERSION
    op: str
    nbytes: int
    world_size: int
    num_nodes: int
    dtype: str
    num_iters: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    backend: str
    device: str  # "cuda" | "cpu"
    device_name: str | None = None


@dataclass(frozen=True, kw_only=True)
class RankMemory:
    """One rank's memory in a capacity trial (<trial>/memory/rank<r>.json, runner.membudget).

    budget_gib: the per-process budget the probe imposed (CPU: RLIMIT_DATA set to the data
    segment at start-up + budget_gib; None: none imposed, a GPU's own memory is the limit).
    baseline_rss_gib: resident set right before the model is built (libraries, process group);
    host_peak_rss_gib: the process's peak resident set (getrusage ru_maxrss) at the end.
    mem_peak_gib: what the layout itself held at its peak: CUDA max_memory_allocated over the
    trial; CPU host_peak_rss_gib - baseline_rss_gib. mem_measure names which."""

    schema_version: int = SCHEMA_VERSION
    run: str
    rank: int
    device: str  # "cuda" | "cpu"
    budget_gib: float | None
    limit_mechanism: str | None  # "RLIMIT_DATA" on CPU with a budget, else None
    baseline_rss_gib: float
    host_peak_rss_gib: float
    mem_peak_gib: float
    mem_measure: str


@dataclass(frozen=True, kw_only=True)
class CapacityTrial:
    """One short trial of the capacity probe (runner.capacity): one layout at one size of the
    ladder, its own torchrun group, classified as every run is (ok | oom | crash | ...).

    mem_peak_gib: RankMemory.mem_peak_gib of every rank, in rank order; () where not all ranks
    recorded one (a trial that did not end ok). predicted_*_gib: the memory model's bytes on the fullest rank
    (core.perfmodel.compute_layout_memory, core.memory's offload split): device_gib = model
    states left on the device + activations; host_gib = offloaded model states.
    tokens_per_s: global tokens per step / median measured step time (slowest rank)."""

    schema_version: int = SCHEMA_VERSION
    layout: str  # the capacity matrix's run name
    strategy: str
    engine: str
    offload: str  # "none" | "optimizer" | "optimizer+param"
    world_size: int
    tp_degree: int
    pp_degree: int
    dp_degree: int
    rung: int  # index into CapacityResult.ladder
    num_params: int
    run_dir: str  # relative to the capacity folder
    status: str  # one of RUN_STATUSES
    cause: str | None
    duration_s: float | None
    mem_peak_gib: tuple[float, ...]
    mem_measure: str | None
    host_peak_rss_gib: tuple[float, ...]
    tokens_per_s: float | None
    step_time_s: float | None
    predicted_state_gib: float
    predicted_activation_gib: float
    predicted_device_gib: float
    predicted_host_gib: float


@dataclass(frozen=True, kw_only=True)
class CapacityResult:
    """A capacity probe (capacity.json): per layout, the trials of a bisection over ``ladder``
    (the campaign GPT's shape family, smallest first). memory_limit_gib: per process, what the
    trials ran against (the GPU's memory, or the CPU budget); limit_kind: "gpu" | "rlimit_data"."""

    schema_version: int = SCHEMA_VERSION
    name: str
    created_at: str
    device: str
    device_name: str | None
    memory_limit_gib: float | None
    limit_kind: str
    probe_steps: int
    probe_warmup_steps: int
    micro_batch_size: int
    global_batch_size: int
    ladder: tuple[ModelConfig, ...]
    layouts: tuple[str, ...]
    trials: tuple[CapacityTrial, ...] = ()


def to_dict(record: Any) -> dict[str, Any]:
    """Dataclass -> JSON-ready dict (tuples become lists)."""
    return dataclasses.asdict(record)


def run_spec_from_dict(data: Mapping[str, Any]) -> RunSpec:
    """Inverse of ``to_dict`` for RunSpec. Raises KeyError/TypeError on a malformed dict.
    A spec written before ``plant`` existed (no key) reads as unplanted."""
    fixed = dict(data["fixed"])
    fixed["model"] = ModelConfig(**fixed["model"])
    rest = {k: v for k, v in data.items() if k not in ("fixed", "plant")}
    plant = data.get("plant")
    return RunSpec(fixed=FixedConfig(**fixed), plant=plant_from_dict(plant) if plant is not None else None, **rest)


def plant_from_dict(data: Mapping[str, Any]) -> Plant:
    """Inverse of ``to_dict`` for Plant (spec.json's ``plant``; keys a spec written before a plant
    existed lacks read as None). Raises TypeError on an unknown key."""
    plant = dict(data)
    if plant.get("pp_layers") is not None:
        plant["pp_layers"] = tuple(plant["pp_layers"])
    return Plant(**plant)


# ---------------------------------------------------------------- lenient decoding of env.json / campaign.json


def record_from_dict(cls: type, data: Mapping[str, Any], *, where: str) -> tuple[Any, list[str]]:
    """A JSON object -> (record of dataclass ``cls``, problems), leniently: a missing or null
    field takes its default (None where it has none); a value of the wrong JSON type is dropped
    the same way, with one problem text naming ``where`` and the field. Nested records, lists
    (as tuples) and objects are decoded the same way, field by field."""
    problems: list[str] = []
    return _decode_record(cls, data, where=where, path="", problems=problems), problems


def env_record_from_dict(data: Mapping[str, Any], *, where: str = "env.json") -> tuple[EnvRecord, list[str]]:
    """env.json's object -> (EnvRecord, problems). Lenient: a missing field reads as None (or
    empty); a value of the wrong JSON type is dropped (None, or left out of its list) with one
    problem text naming it (``"env.json: gpus[1].index: expected int, got str '0'; ignored"``),
    so a bad field costs its cell in the note, never the note. Library versions and environment
    variables are name -> text: their values are kept as text whatever their JSON type."""
    return record_from_dict(EnvRecord, data, where=where)


def campaign_record_from_dict(data: Mapping[str, Any], *,
                              where: str = "campaign.json") -> tuple[CampaignRecord, list[str]]:
    """campaign.json's object -> (CampaignRecord, problems), as lenient as ``env_record_from_dict``.
    The caller checks ``fixed`` strictly first (a wrong fixed variable mislabels every number);
    a campaign.json without one raises KeyError."""
    if not isinstance(data.get("fixed"), Mapping):
        raise KeyError("fixed")
    return record_from_dict(CampaignRecord, data, where=where)


def record_problems(cls: type, data: Any, *, prefix: str = "") -> list[str]:
    """Strict check of a parsed JSON object against dataclass ``cls``: every missing required
    field, unknown field, null where the field takes none and value of the wrong JSON type
    (nested records, list items and object values too), as ``"field: what is wrong"`` texts; []
    when it is a valid ``cls``. The same walk as the lenient decoders, which drop what this names."""
    if not isinstance(data, dict):
        return [f"{prefix.rstrip('.') or 'record'}: expected an object, got {type(data).__name__} {data!r:.40}"]
    problems: list[str] = []
    _decode_record(cls, data, where=None, path=prefix, problems=problems)
    return problems


_DROP = object()  # a value of the wrong JSON type: left out
_INT64 = (-2**63, 2**63)  # Parquet's int64: what a table can hold
_SCALARS = {int: int, float: (int, float), str: str}  # the common case, answered first


@functools.lru_cache(maxsize=None)
def _fields(cls: type) -> tuple[tuple[dataclasses.Field, Any, bool, bool], ...]:
    """Per field of ``cls``: (field, its resolved annotation, required, whether it takes None)."""
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
                  type(None) in typing.get_args(hints[f.name])) for f in dataclasses.fields(cls))


@functools.lru_cache(maxsize=None)
def _shape(hint: Any) -> tuple[Any, tuple]:
    return typing.get_origin(hint), typing.get_args(hint)


def _decode_record(cls: type, data: Mapping[str, Any], *, where: str | None, path: str, problems: list[str]) -> Any:
    """``where`` None: strict (record_problems) -- missing, unknown and null fields are problems too."""
    kwargs: dict[str, Any] = {}
    fields = _fields(cls)
    for f, hint, required, optional in fields:
        value = data.get(f.name)
        if where is None and value is None and (required or f.name in data):
            if f.name not in data:
                problems.append(f"{path}{f.name}: missing")
            elif not optional:
                problems.append(f"{path}{f.name}: null, expected {f.type}")
        if value is not None:
            value = _decode_value(hint, value, where=where, path=f"{path}{f.name}", problems=problems)
        if where is not None and (value is None or value is _DROP):  # lenient: the default, else None
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                value = None
        kwargs[f.name] = value
    if where is None:
        if len(data) > len(fields) or any(k not in kwargs for k in data):
            problems.extend(f"{path}{k}: unknown field" for k in data if k not in kwargs)
        return None
    return cls(**kwargs)


def _decode_value(hint: Any, value: Any, *, where: str | None, path: str, problems: list[str]) -> Any:
    """One JSON value against its field's annotation: the value (records built, lists as tuples)
    or _DROP with a problem text. JSON's bool is never an int or a number; an int must fit int64."""
    def bad(want: str) -> Any:
        got = "an integer beyond int64" if type(value) is int and want == "int" else f"{type(value).__name__} {value!r:.40}"
        problems.append(f"{path}: expected {want}, got {got}" if where is None else
                        f"{where}: {path}: expected {want}, got {got}; ignored")
        return _DROP

    if hint in _SCALARS and not isinstance(value, bool) and isinstance(value, _SCALARS[hint]):
        return value if hint is not int or _INT64[0] <= value < _INT64[1] else bad("int")
    origin, args = _shape(hint)
    if origin in (typing.Union, types.UnionType):  # X | None: X
        return _decode_value(next(a for a in args if a is not type(None)), value, where=where, path=path,
                             problems=problems)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            return bad("an object")
        return _decode_record(hint, value, where=where, path=f"{path}.", problems=problems)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return bad("a list")
        items = (_decode_value(args[0], v, where=where, path=f"{path}[{i}]", problems=problems)
                 for i, v in enumerate(value))
        return tuple(v for v in items if v is not _DROP)
    if origin in (collections.abc.Mapping, dict) or hint in (dict, Mapping):
        if not isinstance(value, dict):
            return bad("an object")
        if not args or args[1] is Any:
            return dict(value)
        if args[1] == str | None:  # name -> text
            return {str(k): (None if v is None else str(v)) for k, v in value.items()}
        items = ((str(k), _decode_value(args[1], v, where=where, path=f"{path}.{k}", problems=problems))
                 for k, v in value.items())
        return {k: v for k, v in items if v is not _DROP}
    if hint is bool:
        return value if isinstance(value, bool) else bad("bool")
    if isinstance(value, bool):
        return bad({int: "int", float: "float", str: "str"}.get(hint, "another type"))
    if hint is int:
        return value if isinstance(value, int) and _INT64[0] <= value < _INT64[1] else bad("int")
    if hint is float:
        return value if isinstance(value, (int, float)) else bad("float")
    if hint is str:
        return value if isinstance(value, str) else bad("str")
    return value  # Any
