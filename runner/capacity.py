"""Capacity probe (``runner capacity``): per layout, the largest model of a size ladder that
trains a few steps without running out of memory, found by bisection with short trials.

The ladder is the campaign GPT's shape family (``[capacity] ladder``: (num_layers, hidden_size)
per rung, smallest first; heads keep the preset's head size, the MLP its ratio, sequence and
vocabulary stay). Each trial is the layout's spec at one rung, shortened to ``probe_steps`` with
no profiler window or checkpoint, launched as its own torchrun group through runner.launch, so
an OOM costs that trial only and is classified as every run's is. Bisection assumes a layout
that does not fit at rung k does not fit above it: ceil(log2(rungs + 1)) trials per layout.
Any trial that does not end ok (oom, or a crash or timeout, named in its record) bounds the
search from above.

Per trial the rank records its memory (runner.membudget; on CPU a per-process budget is
imposed so there is a real limit to find) and the probe records tokens/s and the memory
model's prediction beside it (core.perfmodel.compute_layout_memory, core.memory's offload
split). Results: ``<out>/capacity.json`` (core.records.CapacityResult), rewritten after every
trial, so a stopped probe keeps what it measured.

Deliberately not here: launching (the caller passes ``launch``), choosing a layout (the note).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from core.atomic import write_json_atomic
from core.errors import ConfigError
from core.memory import compute_fsdp2_offload_host_bytes, compute_offloaded_fraction, \
    describe_offload as describe_run_offload
from core.perfmodel import build_run_layout, build_shape, compute_layout_memory, count_model_params
from core.records import (
    CapacityResult, CapacityTrial, ModelConfig, RankMemory, RunSpec, RunStatus, record_from_dict, record_problems,
    to_dict,
)
from runner.matrix import MAX_RUNS
from runner.membudget import BUDGET_KEY, INIT_ON_DEVICE_KEY
from runner.tune import load_probe_tokens_per_s
from core.formulas import is_finite_number

GIB = 1024**3
CAPACITY_FILE = "capacity.json"


@dataclass(frozen=True, kw_only=True)
class CapacityConfig:
    """The matrix's ``[capacity]`` section. ladder: (num_layers, hidden_size) per rung, strictly
    growing in parameters. memory_budget_gib: per process, above its start-up memory (required
    on CPU, where nothing else limits a trial; not allowed on GPU, whose memory is the limit)."""

    ladder: tuple[tuple[int, int], ...]
    probe_steps: int = 4
    probe_warmup_steps: int = 2
    memory_budget_gib: float | None = None


CAPACITY_KEYS = {f.name for f in dataclasses.fields(CapacityConfig)}
# Bisection needs ceil(log2(rungs + 1)) trials: 64 rungs take 7; no real ladder is longer, and a
# longer one costs the dry run a memory prediction per layout per rung.
MAX_RUNGS = 64


def build_capacity_config(raw: Any, *, where: str, device: str, num_layouts: int = 1) -> CapacityConfig:
    """The ``[capacity]`` table -> CapacityConfig, for a matrix of ``num_layouts`` [[runs]]
    (checked before any run is resolved). Raises ConfigError listing every problem (unknown keys
    with the valid ones, types, ranges, a budget on the wrong device); alone, before reading the
    rungs, a ladder longer than MAX_RUNGS or more trials than runner.matrix.MAX_RUNS."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: no [capacity] table (needs ladder = [[num_layers, hidden_size], ...])")
    ladder = raw.get("ladder")
    if isinstance(ladder, list) and len(ladder) > MAX_RUNGS:
        raise ConfigError(f"{where} [capacity] ladder: {len(ladder):,} rungs, more than the {MAX_RUNGS} a probe "
                          f"bisects; keep at most {MAX_RUNGS}, spaced wider")
    if isinstance(ladder, list) and ladder:
        num_trials = num_layouts * math.ceil(math.log2(len(ladder) + 1))
        if num_trials > MAX_RUNS:
            raise ConfigError(f"{where}: {num_layouts:,} layouts x ceil(log2({len(ladder)} + 1)) trials = "
                              f"{num_trials:,} trials, more than the {MAX_RUNS:,} a campaign may hold; split the "
                              "[[runs]] into several matrices")
    problems = [f"{where} [capacity]: unknown key '{k}' (valid: {', '.join(sorted(CAPACITY_KEYS))})"
                for k in sorted(set(raw) - CAPACITY_KEYS)]
    rungs: list[tuple[int, int]] = []
    if not isinstance(ladder, list) or not ladder:
        problems.append(f"{where} [capacity] ladder: must be a list of [num_layers, hidden_size] pairs, got {ladder!r}")
    else:
        for i, rung in enumerate(ladder):
            if (not isinstance(rung, list) or len(rung) != 2
                    or any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in rung)):
                problems.append(f"{where} [capacity] ladder[{i}]: must be [num_layers, hidden_size], positive "
                                f"integers, got {rung!r}")
            else:
                rungs.append((rung[0], rung[1]))
    for key, minimum in (("probe_steps", 2), ("probe_warmup_steps", 1)):
        v = raw.get(key, getattr(CapacityConfig, key))
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            problems.append(f"{where} [capacity] {key}: must be an integer >= {minimum}, got {v!r}")
    steps, warm = raw.get("probe_steps", CapacityConfig.probe_steps), raw.get("probe_warmup_steps",
                                                                               CapacityConfig.probe_warmup_steps)
    if isinstance(steps, int) and isinstance(warm, int) and steps <= warm:
        problems.append(f"{where} [capacity] probe_steps ({steps}) must exceed probe_warmup_steps ({warm}), or no "
                        "step is timed")
    budget = raw.get("memory_budget_gib")
    if budget is not None and (not is_finite_number(budget) or budget <= 0):
        problems.append(f"{where} [capacity] memory_budget_gib: must be a number > 0, got {budget!r}")
    elif device == "cpu" and budget is None:
        problems.append(f"{where} [capacity] memory_budget_gib: required on CPU (a per-process limit for the probe "
                        "to find; e.g. 0.5), or plan a GPU matrix here with --dry-run --gpus N")
    elif device == "cuda" and budget is not None:
        problems.append(f"{where} [capacity] memory_budget_gib: GPU trials are limited by the GPU's memory; drop it")
    if problems:
        raise ConfigError("\n".join(problems))
    return CapacityConfig(ladder=tuple(rungs), probe_steps=steps, probe_warmup_steps=warm,
                          memory_budget_gib=None if budget is None else float(budget))


def build_ladder(model: ModelConfig, rungs: tuple[tuple[int, int], ...], *, where: str) -> tuple[ModelConfig, ...]:
    """The campaign model at each rung: num_layers and hidden_size from the rung, heads at the
    preset's head size (hidden / heads), the MLP at its ratio (ffn / hidden); sequence and
    vocabulary unchanged. Raises ConfigError when a width is not a multiple of the head size or
    the rungs do not grow in parameters."""
    head = model.hidden_size // model.num_heads
    problems, out = [], []
    for i, (layers, hidden) in enumerate(rungs):
        if hidden % head:
            problems.append(f"{where} [capacity] ladder[{i}]: hidden_size {hidden} is not a multiple of the head size "
                            f"{head} (hidden_size / num_heads of the preset)")
            continue
        out.append(dataclasses.replace(model, num_layers=layers, hidden_size=hidden, num_heads=hidden // head,
                                       ffn_hidden_size=hidden * model.ffn_hidden_size // model.hidden_size))
    sizes = [count_model_params(m) for m in out]
    if not problems and any(b <= a for a, b in zip(sizes, sizes[1:])):
        problems.append(f"{where} [capacity] ladder: rungs must grow in parameters, smallest first; got "
                        + ", ".join(f"{s:,}" for s in sizes))
    if problems:
        raise ConfigError("\n".join(problems))
    return tuple(out)


def check_layouts(specs: tuple[RunSpec, ...], ladder: tuple[ModelConfig, ...], *, where: str) -> None:
    """Every layout must build at every rung: layers divisible by pp_degree, heads by tp_degree.
    Raises ConfigError listing every pair that cannot."""
    problems = []
    for spec in specs:
        for i, m in enumerate(ladder):
            if m.num_layers % spec.pp_degree or m.num_heads % spec.tp_degree:
                problems.append(f"{where} run '{spec.name}' at ladder[{i}]: {m.num_layers} layers / {m.num_heads} heads"
                                f" do not split over pp {spec.pp_degree} x tp {spec.tp_degree}")
    if problems:
        raise ConfigError("\n".join(problems))


def describe_offload(spec: RunSpec) -> str:
    """The run's CPU offload (core.memory.describe_offload of its engine and options)."""
    return describe_run_offload(engine=spec.engine, options=spec.options)


def build_trial_spec(spec: RunSpec, model: ModelConfig, *, rung: int, config: CapacityConfig) -> RunSpec:
    """The layout's spec at one rung: probe_steps steps (probe_warmup_steps untimed), no profiler
    window, no checkpoint, the memory budget in options (runner.membudget reads it), weights
    drawn on the device (runner.membudget.INIT_ON_DEVICE_KEY: the DDP, ZeRO-3 and Megatron engines;
    torch TP+PP builds the whole model on the host before taking its stage)."""
    f = spec.fixed
    fixed = dataclasses.replace(f, model=model, steps=config.probe_steps, warmup_steps=config.probe_warmup_steps,
                                profile_num_steps=0, profile_start_step=0,
                                lr_warmup_steps=min(f.lr_warmup_steps, config.probe_steps))
    return dataclasses.replace(spec, name=f"{spec.name}-rung{rung}", fixed=fixed, nsys=False, checkpoint_step=None,
                               checkpoint_verify_steps=0,
                               options={**spec.options, BUDGET_KEY: config.memory_budget_gib,
                                        INIT_ON_DEVICE_KEY: True})


def predict_trial_memory(spec: RunSpec) -> tuple[float, float, float, float]:
    """(model states, activations, device, host) bytes on the trial's fullest rank: the memory
    model of the note's predicted block (core.perfmodel.compute_layout_memory on the run's layout)
    with the offloaded share of the model states (core.memory.compute_offloaded_fraction) moved
    from the device to the host. Host bytes of FSDP2's offload on CUDA are its pinned tensors'
    (core.memory.compute_fsdp2_offload_host_bytes: pinned blocks round up to a power of two)."""
    layout = build_run_layout(spec, compiled=bool((spec.options.get("kernels") or {}).get("compile", "none") != "none"))
    shape = build_shape(spec.fixed.model, name=spec.name)
    state, act = compute_layout_memory(shape, layout, seq_length=int(spec.fixed.model.seq_length))
    offload = describe_offload(spec)
    host = state * compute_offloaded_fraction(sharding=layout.sharding, offload=offload)
    device = state - host + act
    if spec.engine == "fsdp2" and offload != "none" and spec.device == "cuda":
        host = float(compute_fsdp2_offload_host_bytes(shape, shard_degree=spec.dp_degree))
    return state, act, device, host


def bisect_ladder(num_rungs: int, fits: Callable[[int], bool]) -> int | None:
    """The largest rung index for which ``fits`` holds, assuming it holds below any rung where it
    does (monotone), with ceil(log2(num_rungs + 1)) calls; None when rung 0 does not fit."""
    lo, hi = -1, num_rungs  # rung lo fits (or -1), rung hi does not (or past the ladder)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo if lo >= 0 else None


def load_rank_memories(trial_dir: Path) -> dict[int, RankMemory]:
    """memory/rank<r>.json of a trial -> {rank: RankMemory}; a file that is not a valid record is
    left out (the trial's peak is then None for that rank)."""
    out = {}
    for path in sorted((trial_dir / "memory").glob("rank*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not record_problems(RankMemory, data):
            out[int(data["rank"])] = RankMemory(**data)
    return out


def load_trial_status(trial_dir: Path) -> RunStatus | None:
    """The trial's status.json as the launcher wrote it; None when it is missing or unreadable."""
    try:
        data = json.loads((trial_dir / "status.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    status, problems = record_from_dict(RunStatus, data, where=str(trial_dir / "status.json"))
    return None if problems else status


def summarize_trial(spec: RunSpec, status: RunStatus, *, rung: int, trial_dir: Path, rel: str,
                    layout: RunSpec) -> CapacityTrial:
    """One trial's record from its status, its ranks' memory files and metrics."""
    mems = load_rank_memories(trial_dir) if status.status == "ok" else {}
    tps = load_probe_tokens_per_s(trial_dir, warmup_steps=spec.fixed.warmup_steps,
                                  tokens_per_step=spec.tokens_per_step) if status.status == "ok" else None
    state, act, device, host = predict_trial_memory(spec)
    ranks = range(spec.world_size)
    complete = all(r in mems for r in ranks)
    return CapacityTrial(
        layout=layout.name, strategy=spec.strategy, engine=spec.engine, offload=describe_offload(spec),
        world_size=spec.world_size, tp_degree=spec.tp_degree, pp_degree=spec.pp_degree, dp_degree=spec.dp_degree,
        rung=rung, num_params=count_model_params(spec.fixed.model), run_dir=rel, status=status.status,
        cause=status.cause, duration_s=status.duration_s,
        mem_peak_gib=tuple(mems[r].mem_peak_gib for r in ranks) if complete else (),
        mem_measure=next((m.mem_measure for m in mems.values()), None),
        host_peak_rss_gib=tuple(mems[r].host_peak_rss_gib for r in ranks) if complete else (),
        tokens_per_s=tps, step_time_s=spec.tokens_per_step / tps if tps else None,
        predicted_state_gib=state / GIB, predicted_activation_gib=act / GIB, predicted_device_gib=device / GIB,
        predicted_host_gib=host / GIB)


def run_capacity(specs: tuple[RunSpec, ...], config: CapacityConfig, *, out: Path, name: str, device: str,
                 device_name: str | None, memory_limit_gib: float | None,
                 launch: Callable[[RunSpec, Path], RunStatus], log: Callable[[str], None] = print) -> CapacityResult:
    """Bisect the ladder for every layout of ``specs`` (their fixed model is the ladder's base),
    each trial in <out>/<layout>/rung<k>/ through ``launch(spec, trial_dir)``; capacity.json is
    rewritten after every trial. -> the finished CapacityResult."""
    ladder = build_ladder(specs[0].fixed.model, config.ladder, where=name)
    result = CapacityResult(
        name=name, created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), device=device,
        device_name=device_name, memory_limit_gib=memory_limit_gib,
        limit_kind="gpu" if device == "cuda" else "rlimit_data", probe_steps=config.probe_steps,
        probe_warmup_steps=config.probe_warmup_steps, micro_batch_size=specs[0].micro_batch_size,
        global_batch_size=specs[0].fixed.global_batch_size, ladder=ladder, layouts=tuple(s.name for s in specs))
    write_json_atomic(out / CAPACITY_FILE, to_dict(result))
    trials: list[CapacityTrial] = []
    for layout in specs:
        def fits(rung: int, layout: RunSpec = layout) -> bool:
            spec = build_trial_spec(layout, ladder[rung], rung=rung, config=config)
            rel = f"{layout.name}/rung{rung}"
            trial_dir = out / rel
            trial_dir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(trial_dir / "spec.json", to_dict(spec))
            try:
                status = launch(spec, trial_dir)
            except KeyboardInterrupt:  # the launcher marked the trial 'interrupted': keep it in capacity.json
                stopped = load_trial_status(trial_dir)
                if stopped is not None:
                    trials.append(summarize_trial(spec, stopped, rung=rung, trial_dir=trial_dir, rel=rel,
                                                  layout=layout))
                    write_json_atomic(out / CAPACITY_FILE, to_dict(dataclasses.replace(result, trials=tuple(trials))))
                raise
            trial = summarize_trial(spec, status, rung=rung, trial_dir=trial_dir, rel=rel, layout=layout)
            trials.append(trial)
            write_json_atomic(out / CAPACITY_FILE, to_dict(dataclasses.replace(result, trials=tuple(trials))))
            peak = max(trial.mem_peak_gib, default=None)
            # the measured peak is the device's on a GPU (offloaded states are not in it), the RSS on CPU
            predicted = trial.predicted_device_gib + (0.0 if spec.device == "cuda" else trial.predicted_host_gib)
            log(f"    {layout.name} rung {rung} ({trial.num_params / 1e6:,.1f}M params): {status.status}"
                + (f", peak {peak:.3f} GiB/rank (predicted {predicted:.3f})" if peak is not None else "")
                + (f", {trial.tokens_per_s:,.0f} tokens/s" if trial.tokens_per_s else "")
                + (f": {status.cause}" if status.cause and status.status != "ok" else ""))
            return status.status == "ok"

        log(f"{layout.name}: {layout.strategy}/{layout.engine} on {layout.world_size} process(es), "
            f"{len(ladder)} rungs")
        largest = bisect_ladder(len(ladder), fits)
        log(f"    largest that fits: " + (f"rung {largest} ({count_model_params(ladder[largest]) / 1e6:,.1f}M params)"
                                          if largest is not None else "none"))
    return dataclasses.replace(result, trials=tuple(trials))

