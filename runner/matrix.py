"""Experiment matrix (TOML) -> validated, resolved RunSpecs.

Format::

    [campaign]            name, preset ("auto" | "gpt-125m" | "tiny"), world_size ("auto" | int),
                          run_timeout_s; kernels ("parity", the default: every engine the same
                          loss, attention, optimizer and compile scope, runner.strategies.parity |
                          "engine-best": each engine its favourite settings); repeats (int >= 1:
                          every layout runs that many times, interleaved)
    [fixed]               overrides of the preset's fixed variables (same for every run);
                          data = "synthetic" | "real" | ["synthetic", "real"]: the data rounds
    [data]                the real round's text (runner.corpus.DataSourceConfig): path (a prepared
                          indexed dataset) or sources (raw files), tokenizer, text_key; neither:
                          the default corpus (Python's standard library), built at launch
    [checkpoint]          checkpoint cost (CheckpointConfig): enabled, step, verify_steps, dir, keep
                          overlap_pairs (bool, default false: every run whose engine has overlap
                          switches, runner.knobs.OVERLAP_SWITCHES, gets a twin with them off)
    [[runs]]              name, strategy, engine, world_size, tp_degree, pp_degree, overlap ("pair":
                          this run gets the twin; "single": not, whatever overlap_pairs says),
                          micro_batch_size (int | "auto": searched by the runner), [runs.options]
                          (engine knobs, runner.knobs; options.loader: the real round's DataLoader),
                          plant (a deliberately injected slowdown, below), kernels (overrides
                          the campaign's for this run; the note never ranks the two modes together)

A run's ``plant`` table (planted causes, DESIGN.md; run-level, not a fixed variable)::

    plant = { host_delay_ms = 40, host_delay_rank = 0 }   # that rank sleeps before every step's forward
    plant = { data_delay_ms = 30 }                        # every rank's every batch fetch, that much longer
    plant = { pp_layers = [1, 3] }                        # layers per pipeline stage instead of the even split
    plant = { extra_collective_bytes = 4194304 }          # one more fp32 all-reduce of that size per step
    plant = { extra_matmul_gflop = 2.0 }                  # one more square matmul of about that much per step

Keys combine; host_delay_rank defaults to 0. extra_collective_bytes: an integer > 0, a multiple
of 4 (fp32 elements), all-reduced on the world group after every step's trainer step;
extra_matmul_gflop: a number > 0, an n x n matmul in the run's dtype (2 n^3 ~ gflop * 1e9) before
every step's forward. runner.train times both apart from the traced steps (plant_truth.json).

Every [[runs]] layout runs once per data round, rounds in order (synthetic first, to rule
out the input pipeline, then real text): the synthetic round keeps the run's name, the real
round is ``<name>-real``; both share RunSpec.layout = name. With ``repeats = N > 1`` every
layout runs N times per round in interleaved order (all layouts once, then all again: a slow
drift of the machine spreads over every layout instead of biasing one), named ``<name>-r<k>``
(``<name>-r<k>-real``), ``options.repeat = k``, RunSpec.layout = name.

An overlap pair: the twin of layout ``<name>`` is layout ``<name>-no-overlap`` with the same spec
but the engine's overlap switches off (runner.knobs.build_overlap_off) and ``options.overlap_off_of
= <name>``; it runs right after its partner in every round and repeat.

The resolved kernel choices of every run are in ``options.kernels`` (runner.strategies.parity);
in parity mode ``options.compile`` / ``options.fused_adamw`` follow them and a run may not set them.

Only the parallel layout may differ between runs; a run that sets a fixed variable is
refused, naming the field. Every problem in a matrix is reported at once (one line each).
Deliberately not here: launching, hardware probing (the caller passes ``num_gpus``).
"""
from __future__ import annotations

import dataclasses
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from core.errors import ConfigError
from core.formulas import MAX_GLOBAL_BATCH_SIZE, MAX_SEQ_LENGTH, SHAPE_MAX, is_finite_number
from core.records import STRATEGY_ENGINES, FixedConfig, Plant, RunSpec
from runner.corpus import DataSourceConfig, build_data_source_config
from runner.faults import fault_problems
from runner.knobs import (
    DATA_OPTION_KEYS, build_overlap_off, check_layout_knobs, resolve_knobs, resolve_loader_knobs,
)
from runner.presets import PRESETS, build_model_config
from runner.kernels import KERNEL_MODES, apply_engine_knobs, liger_available, resolve_kernels

CAMPAIGN_KEYS = {"name", "preset", "world_size", "run_timeout_s", "stall_timeout_s", "startup_timeout_s",
                 "collective_timeout_s", "nsys", "kernels", "repeats", "overlap_pairs"}
# Knobs parity mode fixes for every engine (runner.strategies.parity); a run may set them only
# under kernels = "engine-best".
PARITY_FIXED_KNOBS = ("compile", "fused_adamw")
# Supervision defaults per device (seconds). On CUDA the NCCL collective timeout fires first so the
# flight recorder dumps before the runner's stall watchdog kills the group; gloo has no flight
# recorder, so on CPU the stall watchdog (with py-spy stack dumps) fires first.
TIMEOUT_DEFAULTS = {
    "cuda": {"run_timeout_s": 3600.0, "stall_timeout_s": 420.0, "startup_timeout_s": 900.0,
             "collective_timeout_s": 300.0},
    "cpu": {"run_timeout_s": 900.0, "stall_timeout_s": 120.0, "startup_timeout_s": 300.0,
            "collective_timeout_s": 1800.0},
}
MODEL_KEYS = {"num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "seq_length", "vocab_size"}
FIXED_KEYS = MODEL_KEYS | {
    "global_batch_size", "dtype", "seed", "steps", "warmup_steps", "lr", "min_lr", "lr_warmup_steps",
    "weight_decay", "adam_beta1", "adam_beta2", "grad_clip", "data", "profile_start_step", "profile_num_steps",
}
RUN_KEYS = {"name", "strategy", "engine", "world_size", "tp_degree", "pp_degree", "micro_batch_size", "options",
            "plant", "kernels", "overlap"}
OVERLAP_MODES = ("pair", "single")  # a run's ``overlap``: run a no-overlap twin beside it, or not
NO_OVERLAP_SUFFIX = "-no-overlap"
PLANT_KEYS = {"host_delay_ms", "host_delay_rank", "data_delay_ms", "pp_layers", "extra_collective_bytes",
              "extra_matmul_gflop", "lr_spike_step", "lr_spike_factor"}
DTYPES = ("bf16", "fp32")
# [fixed] key -> (type, minimum); bool is rejected where a number is expected
FIXED_TYPES: dict[str, tuple[type, float | None]] = {
    "num_layers": (int, 1), "hidden_size": (int, 1), "num_heads": (int, 1), "ffn_hidden_size": (int, 1),
    "seq_length": (int, 1), "vocab_size": (int, 2), "global_batch_size": (int, 1), "seed": (int, 0),
    "steps": (int, 1), "warmup_steps": (int, 0), "lr_warmup_steps": (int, 0), "lr": (float, 0.0),
    "min_lr": (float, 0.0), "weight_decay": (float, 0.0), "adam_beta1": (float, 0.0), "adam_beta2": (float, 0.0),
    "grad_clip": (float, 0.0), "dtype": (str, None),
    "profile_start_step": (int, 1), "profile_num_steps": (int, 0),
}
MAX_STEPS = 10_000_000  # far past any comparison campaign; catches typos such as steps = 1e23
# [fixed] bounds besides FIXED_TYPES' minimum: key -> (wording, test)
FIXED_LIMITS = {
    "lr": ("> 0", lambda v: v > 0), "min_lr": ("> 0", lambda v: v > 0),
    "adam_beta1": ("< 1", lambda v: v < 1), "adam_beta2": ("< 1", lambda v: v < 1),
    **{k: (f"<= {MAX_STEPS}", lambda v: v <= MAX_STEPS)
       for k in ("steps", "warmup_steps", "lr_warmup_steps", "profile_start_step", "profile_num_steps")},
    # the model and the batch: core.formulas' bounds (what any machine could run)
    **{k: (f"<= {most}", lambda v, most=most: v <= most)
       for k, most in (*((k, SHAPE_MAX[k]) for k in ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size",
                                                      "vocab_size")),
                       ("seq_length", MAX_SEQ_LENGTH), ("global_batch_size", MAX_GLOBAL_BATCH_SIZE))},
}
# Processes a CPU run may start (gloo ranks, each a Python process with the model): at most
# CPU_RANKS_PER_CORE per core of the machine(s) it runs on (the CPU campaign's TP2 x PP2 runs world
# 4 on a 2-core CI machine: 2 per core; past 4 per core the ranks time-share the cores and the run
# measures the scheduler, not the layout), and never past MAX_CPU_WORLD_SIZE (a typo, world_size =
# 1e9, where the cores are not known)
CPU_RANKS_PER_CORE = 4
MAX_CPU_WORLD_SIZE = 1024
# Runs one matrix may expand to ([[runs]] x data rounds x repeats, overlap twins included): far past
# any comparison (the committed examples hold under 50); a matrix of millions held every RunSpec,
# its dry-run listing and its sbatch script in memory (1.76M runs: 72 s and 2 GB before a word)
MAX_RUNS = 10_000
DEFAULT_PROFILE_NUM_STEPS = 8  # traced steps per run; one warm-up step precedes them
MIN_MEASURED_OUTSIDE_WINDOW = 10  # a default window is dropped from shorter runs (the metric table needs steps)
# the run's last steps, replayed through a bare loop after the run to price the instrumentation
# (runner.train.measure_loop_overhead); a default window ends before them where the run allows
LOOP_OVERHEAD_STEPS = 10
# Engine knobs a run may set under [runs.options]: runner.knobs (typed, with defaults, resolved
# into every spec's options). Micro-batch search: candidates tried by the runner's probe launches.
MICRO_BATCH_AUTO = {"auto": "fastest", "auto-largest": "largest"}  # micro_batch_size value -> search policy
MICRO_BATCH_SEARCH_MAX_CANDIDATES = 4
MICRO_BATCH_PROBE_STEPS = 6  # per probe launch; the first MICRO_BATCH_PROBE_WARMUP are not timed
MICRO_BATCH_PROBE_WARMUP = 3
DATA_ROUNDS = ("synthetic", "real")
SECTION_KEYS = {"campaign", "fixed", "data", "checkpoint", "runs", "capacity"}  # [capacity]: runner capacity's


@dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """The matrix's ``[checkpoint]`` section. enabled: save and restore in every run (default
    true once the section is there). step: save after this step (default steps - verify_steps -
    1, after the profiler window). verify_steps: steps replayed after the restore and compared
    with the uninterrupted run. dir: where checkpoints live (default <run>/checkpoint; a
    per-run subdirectory of it otherwise). keep: leave the files (default: deleted after the
    check, once measured)."""

    enabled: bool = False
    step: int | None = None
    verify_steps: int = 2
    dir: str | None = None
    keep: bool = False


CHECKPOINT_TYPES = {"enabled": bool, "step": int, "verify_steps": int, "dir": str, "keep": bool}


def _checkpoint_config(raw: Any, *, source: str, steps: int, window: range) -> tuple[CheckpointConfig, list[str]]:
    if raw is None:
        return CheckpointConfig(), []
    where = f"{source} [checkpoint]"
    if not isinstance(raw, dict):
        return CheckpointConfig(), [f"{where} must be a table, got {type(raw).__name__}"]
    problems = _unknown(raw.keys(), set(CHECKPOINT_TYPES), where)
    for k, kind in CHECKPOINT_TYPES.items():
        v = raw.get(k)
        if v is not None and (not isinstance(v, kind) or (kind is int and isinstance(v, bool))):
            problems.append(f"{where} {k} must be {kind.__name__}, got {v!r}")
    if problems:
        return CheckpointConfig(), problems
    verify = raw.get("verify_steps", 2)
    step = raw.get("step", steps - verify - 1)
    if verify < 1 or step < 0 or step + verify > steps - 1:
        problems.append(f"{where}: step {step} + verify_steps {verify} must leave the replayed steps inside the run"
                        f" (0 <= step, verify_steps >= 1, step + verify_steps <= steps - 1 = {steps - 1})")
    elif step in window and step != window[-1]:
        problems.append(f"{where}: step {step} is inside the profiler window ({window.start}..{window[-1]}); a save"
                        " there would land in the traced steps; move step or the window")
    return CheckpointConfig(enabled=raw.get("enabled", True), step=step, verify_steps=verify, dir=raw.get("dir"),
                            keep=raw.get("keep", False)), problems


def _delay_ms(raw: Mapping[str, Any], key: str, where: str, problems: list[str]) -> float | None:
    value = raw.get(key)
    if value is None:
        return None
    if not is_finite_number(value) or value < 0:
        problems.append(f"{where} {key} must be a finite number of milliseconds >= 0, got {value!r}")
        return None
    return float(value)


def build_plant(raw: Any, *, where: str, world_size: int, pp_degree: int, num_layers: int,
                schedule: str | None = None, steps: int | None = None) -> tuple[Plant | None, list[str]]:
    """A run's ``plant`` table -> (Plant or None, problems, one line each naming the field).

    host_delay_rank must lie in [0, world_size) (default 0, only with host_delay_ms); pp_layers
    needs pp_degree > 1, one entry >= 1 per stage, summing to num_layers, and the one-chunk-per-rank
    1F1B schedule (``schedule``: the run's resolved options.schedule, None where there is none);
    extra_collective_bytes must be an integer > 0 and a multiple of 4 (fp32 elements), in a run of
    world_size >= 2;
    extra_matmul_gflop a finite number > 0; lr_spike_step a step in [0, steps) and lr_spike_factor a
    finite number > 0, both or neither."""
    where = f"{where} plant"
    if raw is None:
        return None, []
    if not isinstance(raw, dict):
        return None, [f"{where} must be a table such as {{ data_delay_ms = 30 }}, got {raw!r}"]
    problems = _unknown(raw.keys(), PLANT_KEYS, where)
    if not raw:
        problems.append(f"{where} is empty; set one of {', '.join(sorted(PLANT_KEYS))} or drop it")
    host = _delay_ms(raw, "host_delay_ms", where, problems)
    data = _delay_ms(raw, "data_delay_ms", where, problems)
    rank = raw.get("host_delay_rank")
    if rank is not None and "host_delay_ms" not in raw:
        problems.append(f"{where} host_delay_rank without host_delay_ms; set host_delay_ms too")
    elif isinstance(rank, bool) or not isinstance(rank, (int, type(None))) or (
            isinstance(rank, int) and not 0 <= rank < world_size):
        problems.append(f"{where} host_delay_rank must be a rank in [0, {world_size}) (world_size {world_size}),"
                        f" got {rank!r}")
        rank = None
    elif host is not None and rank is None:
        rank = 0
    layers = raw.get("pp_layers")
    if layers is not None:
        if not isinstance(layers, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in layers):
            problems.append(f"{where} pp_layers must be a list of integers (layers per pipeline stage), got {layers!r}")
        elif pp_degree < 2:
            problems.append(f"{where} pp_layers needs a pipeline (strategy 'tp_pp' with pp_degree >= 2), got"
                            f" pp_degree {pp_degree}; drop pp_layers or raise pp_degree")
        elif len(layers) != pp_degree or min(layers) < 1 or sum(layers) != num_layers:
            problems.append(f"{where} pp_layers {layers} must have one entry >= 1 per stage (pp_degree {pp_degree})"
                            f" summing to num_layers {num_layers}")
        elif schedule not in (None, "1F1B"):
            problems.append(f"{where} pp_layers needs schedule '1F1B' (one chunk per rank), got {schedule!r}")
        layers = tuple(layers)
    coll = raw.get("extra_collective_bytes")
    if coll is not None and (isinstance(coll, bool) or not isinstance(coll, int) or coll <= 0 or coll % 4):
        problems.append(f"{where} extra_collective_bytes must be a positive multiple of 4 (bytes of an fp32 tensor),"
                        f" got {coll!r}")
    elif coll is not None and world_size < 2:
        problems.append(f"{where} extra_collective_bytes needs world_size >= 2: an all-reduce on one rank moves "
                        "nothing (NCCL returns at once); plant it in a run of two or more ranks")
    gflop = raw.get("extra_matmul_gflop")
    if gflop is not None and (not is_finite_number(gflop) or gflop <= 0):
        problems.append(f"{where} extra_matmul_gflop must be a finite number of GFLOP > 0, got {gflop!r}")
    spike_step, spike_factor = raw.get("lr_spike_step"), raw.get("lr_spike_factor")
    if (spike_step is None) != (spike_factor is None):
        problems.append(f"{where} lr_spike_step and lr_spike_factor go together (the step whose learning rate is"
                        " multiplied, and by how much); set both or neither")
    if spike_step is not None and (isinstance(spike_step, bool) or not isinstance(spike_step, int) or spike_step < 0
                                   or (steps is not None and spike_step >= steps)):
        problems.append(f"{where} lr_spike_step must be a step in [0, {steps}) (0-based), got {spike_step!r}")
    if spike_factor is not None and (not is_finite_number(spike_factor) or spike_factor <= 0):
        problems.append(f"{where} lr_spike_factor must be a finite number > 0, got {spike_factor!r}")
    if problems:
        return None, problems
    if host is None and data is None and layers is None and coll is None and gflop is None and spike_step is None:
        return None, problems
    return Plant(host_delay_ms=host, host_delay_rank=rank if host is not None else None, data_delay_ms=data,
                 pp_layers=layers, extra_collective_bytes=coll,
                 extra_matmul_gflop=float(gflop) if gflop is not None else None, lr_spike_step=spike_step,
                 lr_spike_factor=float(spike_factor) if spike_factor is not None else None), []


def _data_rounds(value: Any, *, source: str) -> tuple[tuple[str, ...], list[str]]:
    rounds = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list) else None
    if not rounds or not all(isinstance(r, str) for r in rounds):
        return ("synthetic",), [f"{source} [fixed] data must be a round name or a list of them"
                                f" (valid: {', '.join(DATA_ROUNDS)}), got {value!r}"]
    bad = [r for r in rounds if r not in DATA_ROUNDS]
    if bad or len(set(rounds)) != len(rounds):
        return ("synthetic",), [f"{source} [fixed] data {list(rounds)!r}: each round once, from {', '.join(DATA_ROUNDS)}"]
    return tuple(r for r in DATA_ROUNDS if r in rounds), []


def build_overlap_variants(run: Mapping[str, Any], *, strategy: str, engine: str, options: dict[str, Any],
                           overlap_pairs: bool, where: str) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """A run's (layout name, resolved options): itself, then its no-overlap twin where the run's
    ``overlap`` (default "pair" under ``[campaign] overlap_pairs``) asks for one and its engine has
    overlap switches (runner.knobs.OVERLAP_SWITCHES); and problems, one line each (an unknown mode;
    a run that asks for a pair its engine cannot make)."""
    name = run["name"]
    overlap = run.get("overlap", "pair" if overlap_pairs else "single")
    off = build_overlap_off(strategy, engine, options)
    if overlap not in OVERLAP_MODES:
        return [(name, options)], [f"{where} overlap must be one of {', '.join(OVERLAP_MODES)}, got {overlap!r}"]
    if overlap == "pair" and off is None and "overlap" in run:
        return [(name, options)], [f"{where} overlap = \"pair\": engine '{engine}' of strategy '{strategy}' has no"
                                   " overlap switch to turn off; drop overlap"]
    if overlap == "pair" and off is not None:
        return [(name, options), (name + NO_OVERLAP_SUFFIX, off | {"overlap_off_of": name})], []
    return [(name, options)], []


def run_name(layout: str, data_round: str) -> str:
    """A run's name: the layout's for the synthetic round, ``<layout>-<round>`` otherwise."""
    return layout if data_round == "synthetic" else f"{layout}-{data_round}"
DEFAULT_FIXED = {"seed": 1234, "weight_decay": 0.1, "adam_beta1": 0.9, "adam_beta2": 0.95, "grad_clip": 1.0,
                 "data": "synthetic"}


def _profile_window(values: dict[str, Any], given: dict[str, Any], source: str) -> list[str]:
    """Fill the profiler window into ``values`` and return its problems.

    Default: DEFAULT_PROFILE_NUM_STEPS steps (or the matrix's profile_num_steps) starting in the
    middle of the measured steps, after one warm-up step -- earlier where that is needed to end
    before the last LOOP_OVERHEAD_STEPS steps (the loop-overhead replay's) --, leaving
    MIN_MEASURED_OUTSIDE_WINDOW measured steps outside it: in shorter runs a default window
    traces fewer steps, and none (profile_num_steps 0) where not one fits. A window the matrix
    sets explicitly must leave one measured step, or it is an error.
    """
    steps, warmup = values["steps"], values["warmup_steps"]
    explicit = "profile_num_steps" in given or "profile_start_step" in given
    num = values.get("profile_num_steps", DEFAULT_PROFILE_NUM_STEPS)
    if not explicit:
        num = max(0, min(num, steps - warmup - 1 - MIN_MEASURED_OUTSIDE_WINDOW))
    start = values.get("profile_start_step",
                       max(warmup + 1, min((warmup + steps) // 2, steps - LOOP_OVERHEAD_STEPS - num)))
    # a default window must leave MIN_MEASURED_OUTSIDE_WINDOW measured steps; an explicit one, one
    left = MIN_MEASURED_OUTSIDE_WINDOW if not explicit else 1
    fits = num == 0 or (start - 1 >= warmup and start + num <= steps and steps - warmup - (num + 1) >= left)
    if not fits and explicit:
        return [f"{source} [fixed] profiler window (warm-up step {start - 1}, steps {start}..{start + num - 1}) must lie"
                f" within steps {warmup}..{steps - 1} after warmup_steps and leave a measured step outside it;"
                " move profile_start_step or set profile_num_steps = 0"]
    values["profile_num_steps"] = num if fits else 0
    values["profile_start_step"] = start if fits and num else 0
    return []


@dataclass(frozen=True, kw_only=True)
class Campaign:
    """A resolved matrix: campaign-level settings, the fixed variables and one spec per run."""

    name: str
    preset: str
    device: str
    run_timeout_s: float
    stall_timeout_s: float
    startup_timeout_s: float
    fixed: FixedConfig
    runs: tuple[RunSpec, ...]
    data_source: "DataSourceConfig | None" = None  # [data]: where the real round's text comes from
    checkpoint: CheckpointConfig = CheckpointConfig()


# The most read of a matrix file: a matrix of 10,000 runs is about 1 MB of TOML
MAX_MATRIX_BYTES = 16 << 20


def load_matrix(path: Path) -> dict[str, Any]:
    """Read a matrix TOML: a regular file (a FIFO or a device such as /dev/zero is refused, never
    read) of at most MAX_MATRIX_BYTES. Raises ConfigError naming the file (and line) when
    unreadable, too large, nested deeper than the TOML reader's stack, or holding an integer past
    Python's 4,300-digit conversion limit."""
    from ingest.io import read_regular_text

    try:
        if path.is_dir():
            raise IsADirectoryError
        return tomllib.loads(read_regular_text(path, max_bytes=MAX_MATRIX_BYTES))
    except RecursionError:  # tomllib recurses per nested array/table: hostile input, not a matrix
        raise ConfigError(f"{path}: TOML nested too deeply to read; a matrix nests tables two levels deep") from None
    except FileNotFoundError:
        raise ConfigError(f"{path}: matrix file not found; pass --matrix with an existing TOML file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory; pass --matrix with a TOML file") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; a matrix is a TOML file") from None
    except OSError as e:  # also a FIFO/device (EINVAL) and a file past MAX_MATRIX_BYTES (EFBIG)
        raise ConfigError(f"{path}: cannot read ({e.strerror}); pass --matrix with a TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e}); fix the syntax") from None
    except ValueError:  # tomllib's int() past Python's 4,300-digit conversion limit
        raise ConfigError(f"{path}: holds an integer of more than 4,300 digits; no matrix field takes one, "
                          "write a smaller number") from None


def _check_shape(raw: Mapping[str, Any], source: str) -> None:
    """Structural checks before any field is used: tables are tables, runs an array of tables."""
    problems = []
    for key in ("campaign", "fixed"):
        if key in raw and not isinstance(raw[key], dict):
            problems.append(f"{source}: [{key}] must be a table, got {type(raw[key]).__name__}")
    runs = raw.get("runs", [])
    if not isinstance(runs, list) or not all(isinstance(r, dict) for r in runs):
        problems.append(f"{source}: runs must be an array of tables ([[runs]]), got {type(runs).__name__}")
    if problems:
        raise ConfigError("\n".join(problems))


def _check_fixed_types(fixed_raw: Mapping[str, Any], where: str) -> list[str]:
    problems = []
    for key, value in fixed_raw.items():
        if key not in FIXED_TYPES:
            continue
        kind, minimum = FIXED_TYPES[key]
        name = f"--{key.replace('_', '-')}" if where == "--" else f"{where} {key}"
        ok = isinstance(value, str) if kind is str else (
            not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int))
        if not ok:
            problems.append(f"{name} must be {'a string' if kind is str else 'an integer' if kind is int else 'a number'}"
                            f", got {value!r}")
        elif kind is float and not math.isfinite(value):  # nan slips through every comparison
            problems.append(f"{name} must be a finite number, got {value!r}")
        elif minimum is not None and value < minimum:
            problems.append(f"{name} must be >= {minimum}, got {value!r}")
        elif key in FIXED_LIMITS and not FIXED_LIMITS[key][1](value):
            problems.append(f"{name} must be {FIXED_LIMITS[key][0]}, got {value!r}")
    return problems


def _unknown(keys, valid, where: str) -> list[str]:
    return [f"{where}: unknown key '{k}' (valid: {', '.join(sorted(valid))})" for k in sorted(set(keys) - valid)]


def _int(value: Any, where: str, problems: list[str], *, minimum: int = 1) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problems.append(f"{where} must be an integer >= {minimum}, got {value!r}")
        return None
    return value


def _default_micro_batch(per_dp_batch: int, *, cap: int, min_microbatches: int) -> int:
    """Largest divisor of the per-DP batch that is <= cap and leaves >= min_microbatches
    micro-batches (Megatron guidance for PP: m >= 4p); falls back to 1."""
    for mbs in range(min(cap, per_dp_batch), 0, -1):
        if per_dp_batch % mbs == 0 and per_dp_batch // mbs >= min_microbatches:
            return mbs
    return 1


def micro_batch_candidates(per_dp_batch: int, *, min_microbatches: int,
                           max_candidates: int = MICRO_BATCH_SEARCH_MAX_CANDIDATES) -> list[int]:
    """Micro-batch sizes the automatic search tries, largest first: divisors of the per-DP batch
    leaving >= min_microbatches micro-batches (so the global batch never changes), the largest
    ``max_candidates`` of them."""
    fits = [m for m in range(per_dp_batch, 0, -1) if per_dp_batch % m == 0 and per_dp_batch // m >= min_microbatches]
    return fits[:max_candidates] or [1]


def check_run_count(num_runs: int, *, source: str, how: str) -> None:
    """ConfigError naming the matrix when it expands to more than MAX_RUNS runs; called with the
    count before any run is built, so a matrix of millions is refused in the time it takes to read."""
    if num_runs > MAX_RUNS:
        raise ConfigError(f"{source}: expands to {num_runs:,} runs ({how}), more than the {MAX_RUNS:,} a campaign "
                          "may hold; split it into several matrices or lower [campaign] repeats")


def resolve_matrix(
    raw: Mapping[str, Any], *, source: str, num_gpus: int, overrides: Mapping[str, Any] | None = None,
    num_cpus: int | None = None,
) -> Campaign:
    """Validate a parsed matrix and resolve every run.

    num_gpus: GPUs on this machine (0 -> CPU preset, gloo). num_cpus: CPU cores the runs will
    have (None: not known; then only MAX_CPU_WORLD_SIZE bounds a CPU run's world_size, else
    CPU_RANKS_PER_CORE per core does). overrides: CLI values for
    campaign/fixed keys (CLI > file > preset defaults). Raises ConfigError listing every
    problem, one per line; a matrix expanding to more than MAX_RUNS runs is refused alone, counted
    before any run is built.
    """
    overrides = dict(overrides or {})
    _check_shape(raw, source)
    problems: list[str] = _unknown(raw.keys(), SECTION_KEYS, source)
    camp = dict(raw.get("campaign", {}))
    problems += _unknown(camp.keys(), CAMPAIGN_KEYS, f"{source} [campaign]")
    fixed_raw = dict(raw.get("fixed", {}))
    problems += _unknown(fixed_raw.keys(), FIXED_KEYS, f"{source} [fixed]")
    problems += _check_fixed_types(fixed_raw, f"{source} [fixed]")
    cli = {k: v for k, v in overrides.items() if v is not None and k in FIXED_KEYS}
    problems += _check_fixed_types(cli, "--")
    fixed_raw.update(cli)
    if not isinstance(camp.get("name", "campaign"), str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", camp.get("name", "x")):
        problems.append(f"{source} [campaign] name must be letters, digits, '.', '-' or '_', got {camp.get('name')!r}")
    if problems:
        raise ConfigError("\n".join(problems))

    device = "cuda" if num_gpus > 0 else "cpu"
    if overrides.get("preset") is not None:
        preset_name, preset_where = overrides["preset"], "--preset"
        if preset_name not in PRESETS:
            raise ConfigError(f"--preset '{preset_name}' is unknown (valid: {', '.join(PRESETS)})")
    else:
        preset_name, preset_where = camp.get("preset", "auto"), f"{source} [campaign] preset"
    if preset_name == "auto":
        preset_name = "gpt-125m" if device == "cuda" else "tiny"
    if not isinstance(preset_name, str) or preset_name not in PRESETS:
        raise ConfigError(f"{preset_where} '{preset_name}' is unknown (valid: auto, {', '.join(PRESETS)})")
    preset = PRESETS[preset_name]
    base = {f.name: getattr(preset, f.name) for f in dataclasses.fields(preset)} | DEFAULT_FIXED
    values = base | fixed_raw
    if values["dtype"] not in DTYPES:
        problems.append(f"{source} [fixed] dtype '{values['dtype']}' is not supported (valid: {', '.join(DTYPES)})")
    if values["min_lr"] > values["lr"]:
        problems.append(f"{source} [fixed] min_lr ({values['min_lr']}) must not exceed lr ({values['lr']}): the schedule"
                        " decays from lr to min_lr")
    if values["steps"] <= values["warmup_steps"]:
        problems.append(f"{source} [fixed] steps ({values['steps']}) must exceed warmup_steps ({values['warmup_steps']}),"
                        " or no step is measured")
    problems += _profile_window(values, fixed_raw, source)
    rounds, round_problems = _data_rounds(values["data"], source=source)
    problems += round_problems
    values["data"] = "+".join(rounds)
    data_source, data_problems = build_data_source_config(raw.get("data"), where=source)
    problems += data_problems
    window = range(values["profile_start_step"] - 1, values["profile_start_step"] + values["profile_num_steps"]) \
        if values["profile_num_steps"] else range(0)
    checkpoint, ckpt_problems = _checkpoint_config(raw.get("checkpoint"), source=source, steps=values["steps"],
                                                   window=window)
    problems += ckpt_problems
    default_world = camp.get("world_size", "auto")
    if default_world == "auto":
        default_world = num_gpus if num_gpus > 0 else 2

    kernels_mode = camp.get("kernels", "parity")
    if kernels_mode not in KERNEL_MODES:
        problems.append(f"{source} [campaign] kernels must be one of {', '.join(KERNEL_MODES)}, got {kernels_mode!r}")
        kernels_mode = "parity"
    repeats = camp.get("repeats", 1)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        problems.append(f"{source} [campaign] repeats must be an integer >= 1, got {repeats!r}")
        repeats = 1
    overlap_pairs = camp.get("overlap_pairs", False)
    if not isinstance(overlap_pairs, bool):
        problems.append(f"{source} [campaign] overlap_pairs must be true or false, got {overlap_pairs!r}")
        overlap_pairs = False
    liger = liger_available() if device == "cuda" else False
    nsys = camp.get("nsys", False)
    if not isinstance(nsys, bool):
        problems.append(f"{source} [campaign] nsys must be true or false, got {nsys!r}")
        nsys = False
    runs_raw = raw.get("runs", [])
    if not runs_raw:
        problems.append(f"{source}: no [[runs]]; add at least one run table")
    check_run_count(len(runs_raw) * len(rounds) * repeats, source=source,
                    how=f"{len(runs_raw):,} [[runs]] x {len(rounds)} data round(s) x {repeats:,} repeat(s)")
    names: set[str] = set()
    layouts: list[dict[str, Any]] = []
    for i, run in enumerate(runs_raw):
        where = f"{source} run {i + 1} ('{run.get('name', '?')}')"
        for key in sorted(set(run) & FIXED_KEYS):
            problems.append(
                f"{where} sets '{key}', a fixed variable: only the parallel layout may vary; set it once under [fixed]"
            )
        problems += _unknown(set(run) - FIXED_KEYS, RUN_KEYS, where)
        name = run.get("name")
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            problems.append(f"{where}: 'name' must be letters, digits, '-' or '_', got {name!r}")
            continue
        if name in names:
            problems.append(f"{where}: duplicate run name '{name}'")
        names.add(str(name))
        strategy = run.get("strategy")
        if not isinstance(strategy, str) or strategy not in STRATEGY_ENGINES:
            problems.append(f"{where}: unknown strategy {strategy!r} (valid: {', '.join(STRATEGY_ENGINES)})")
            continue
        engines = STRATEGY_ENGINES[strategy]
        default_engine = "torch" if (strategy == "tp_pp" and device == "cpu") else engines[0]
        engine = run.get("engine", default_engine)
        if not isinstance(engine, str) or engine not in engines:
            problems.append(f"{where}: engine {engine!r} is not one of {strategy}'s engines ({', '.join(engines)})")
        elif engine == "megatron" and device == "cpu":
            problems.append(f"{where}: engine 'megatron' needs CUDA (its pipeline schedules do); use engine = \"torch\" on CPU")
        world = _int(run.get("world_size", default_world), f"{where} world_size", problems)
        tp = _int(run.get("tp_degree", 1), f"{where} tp_degree", problems)
        pp = _int(run.get("pp_degree", 1), f"{where} pp_degree", problems)
        if strategy != "tp_pp" and (tp != 1 or pp != 1):
            problems.append(f"{where}: tp_degree/pp_degree apply only to strategy 'tp_pp'")
        if None in (world, tp, pp):
            continue
        if device == "cuda" and world > num_gpus:
            problems.append(f"{where}: world_size {world} exceeds the {num_gpus} GPU(s) found")
        elif device == "cpu" and num_cpus is not None and world > CPU_RANKS_PER_CORE * num_cpus:
            problems.append(f"{where}: world_size {world} exceeds {CPU_RANKS_PER_CORE * num_cpus} processes, "
                            f"{CPU_RANKS_PER_CORE} per CPU core of the {num_cpus} here (more time-share the cores "
                            "and time the scheduler, not the layout); use a smaller world_size")
        elif device == "cpu" and world > MAX_CPU_WORLD_SIZE:
            problems.append(f"{where}: world_size {world} exceeds {MAX_CPU_WORLD_SIZE} processes, the most a CPU "
                            "campaign starts; use a smaller world_size")
        if world % (tp * pp):
            problems.append(
                f"{where}: tp_degree {tp} x pp_degree {pp} does not divide world_size {world}; "
                "world_size = tp_degree x pp_degree x dp_degree"
            )
            continue
        layouts.append({"run": run, "where": where, "strategy": strategy, "engine": engine, "world": world,
                        "tp": tp, "pp": pp, "dp": world // (tp * pp)})

    max_tp = max((lay["tp"] for lay in layouts), default=1)
    shaped = dataclasses.replace(preset, **{k: v for k, v in fixed_raw.items() if k in MODEL_KEYS})
    model = build_model_config(shaped, max_tp_degree=max_tp)
    fixed = FixedConfig(preset=preset_name, model=model, **{k: values[k] for k in FIXED_KEYS - MODEL_KEYS})
    gbs = fixed.global_batch_size
    timeouts = dict(TIMEOUT_DEFAULTS[device])
    for key in timeouts:
        if key in camp:
            value = camp[key]
            if not is_finite_number(value) or value <= 0:
                problems.append(f"{source} [campaign] {key} must be a positive, finite number of seconds, got {value!r}")
            else:
                timeouts[key] = float(value)
    specs = []
    for lay in layouts:
        where, tp, pp, dp = lay["where"], lay["tp"], lay["pp"], lay["dp"]
        if gbs % dp:
            problems.append(f"{where}: global_batch_size {gbs} is not divisible by dp_degree {dp}")
            continue
        if model.num_heads % tp or model.ffn_hidden_size % tp:
            problems.append(f"{where}: tp_degree {tp} must divide num_heads {model.num_heads} and ffn_hidden_size")
        plant_raw = lay["run"].get("plant")
        raw_options = lay["run"].get("options")
        plant, plant_problems = build_plant(
            plant_raw, where=where, world_size=lay["world"], pp_degree=pp, num_layers=model.num_layers,
            schedule=raw_options.get("schedule") if isinstance(raw_options, dict) else None, steps=values["steps"])
        problems += plant_problems
        uneven = isinstance(plant_raw, dict) and plant_raw.get("pp_layers") is not None
        if model.num_layers % pp and not uneven:
            problems.append(f"{where}: pp_degree {pp} must divide num_layers {model.num_layers}"
                            " (or set plant.pp_layers, an explicit split)")
        per_dp = gbs // dp
        min_m = 4 * pp if pp > 1 else 1
        mbs = lay["run"].get("micro_batch_size")
        search = None
        if isinstance(mbs, str) and mbs in MICRO_BATCH_AUTO:
            candidates = micro_batch_candidates(per_dp, min_microbatches=min_m)
            search = {"policy": MICRO_BATCH_AUTO[mbs], "candidates": candidates, "probe_steps": MICRO_BATCH_PROBE_STEPS,
                      "probe_warmup_steps": MICRO_BATCH_PROBE_WARMUP}
            mbs = candidates[0]  # replaced by the runner's search before launch
        if mbs is None:
            mbs = _default_micro_batch(per_dp, cap=preset.micro_batch_size, min_microbatches=min_m)
        if isinstance(mbs, str):
            problems.append(f"{where} micro_batch_size must be an integer >= 1 or a search, got {mbs!r}"
                            f" (valid strings: {', '.join(MICRO_BATCH_AUTO)})")
            continue
        if _int(mbs, f"{where} micro_batch_size", problems) is None:
            continue
        if per_dp % mbs:
            problems.append(
                f"{where}: global_batch_size {gbs} is not divisible by micro_batch_size {mbs} x dp_degree {dp}")
            continue
        if pp > 1 and per_dp // mbs < pp:
            problems.append(f"{where}: {per_dp // mbs} micro-batches < pp_degree {pp}; 1F1B needs m >= p")
        options = lay["run"].get("options", {})
        if not isinstance(options, dict):
            problems.append(f"{where}: 'options' must be a table, got {options!r}")
            continue
        run_mode = lay["run"].get("kernels", kernels_mode)
        if run_mode not in KERNEL_MODES:
            problems.append(f"{where} kernels must be one of {', '.join(KERNEL_MODES)}, got {run_mode!r}")
            continue
        if run_mode == "parity":
            problems += [f"{where} options: '{k}' is fixed by kernels = \"parity\" (the same for every engine);"
                         " drop it or set kernels = \"engine-best\"" for k in PARITY_FIXED_KNOBS if k in options]
        options, knob_problems = resolve_knobs(lay["strategy"], lay["engine"], options, device=device, dp_degree=dp,
                                               where=f"{where} options", dtype=fixed.dtype)
        kernels = resolve_kernels(lay["strategy"], lay["engine"], mode=run_mode, device=device, tp_degree=tp,
                                  liger=liger)
        if run_mode == "parity" and not knob_problems:
            if "compile" in options:
                options["compile"] = kernels["compile"] == "per-block"
            options["fused_adamw"] = device == "cuda"
        options["kernels"] = apply_engine_knobs(kernels, options, strategy=lay["strategy"], engine=lay["engine"])
        problems += knob_problems or check_layout_knobs(options, num_layers=model.num_layers, pp_degree=pp,
                                                        num_microbatches=per_dp // mbs, where=f"{where} options")
        if search is not None:
            options["micro_batch_search"] = search
        problems += [f"{where} {p}" for p in fault_problems(options.get("fault"), world_size=lay["world"],
                                                              steps=fixed.steps)]
        loader_raw = options.pop("loader", None)
        loader, loader_problems = ({}, []) if "real" not in rounds else resolve_loader_knobs(
            loader_raw or {}, device=device, where=f"{where} options")
        problems += loader_problems
        if loader_raw is not None and "real" not in rounds and not round_problems:
            problems.append(f"{where} options: 'loader' applies to the real data round only; add \"real\" to "
                            "[fixed] data or drop it")
        variants, overlap_problems = build_overlap_variants(lay["run"], strategy=lay["strategy"], engine=lay["engine"],
                                                            options=options, overlap_pairs=overlap_pairs, where=where)
        problems += overlap_problems
        for (layout, variant_options), data_round, k in (
                (v, r, k) for r in rounds for k in range(1, repeats + 1) for v in variants):
            run_options = dict(variant_options) | ({"loader": loader} if data_round == "real" else {}) | (
                {"repeat": k} if repeats > 1 else {})
            specs.append(RunSpec(
                campaign=str(camp.get("name", "campaign")),
                name=run_name(layout if repeats == 1 else f"{layout}-r{k}", data_round), strategy=lay["strategy"],
                engine=lay["engine"], world_size=lay["world"], tp_degree=tp, pp_degree=pp, dp_degree=dp,
                micro_batch_size=mbs, num_microbatches=per_dp // mbs, device=device,
                backend="nccl" if device == "cuda" else "gloo", fixed=fixed, options=run_options,
                collective_timeout_s=timeouts["collective_timeout_s"], nsys=nsys, data_round=data_round, layout=layout,
                checkpoint_step=checkpoint.step if checkpoint.enabled else None, checkpoint_dir=checkpoint.dir,
                checkpoint_verify_steps=checkpoint.verify_steps if checkpoint.enabled else 0,
                checkpoint_keep=checkpoint.keep, plant=plant,
            ))
    check_run_count(len(specs), source=source, how="overlap twins included")
    seen: set[str] = set()
    for spec in specs:
        if spec.name in seen:
            problems.append(f"{source}: run name '{spec.name}' occurs twice once the data rounds are expanded"
                            f" (the real round of layout '{spec.layout}' is '<name>-real'); rename a run")
        seen.add(spec.name)
    # round-major (the whole synthetic round first), then repeat-major: every layout once, then again
    specs.sort(key=lambda sp: (rounds.index(sp.data_round), int(sp.options.get("repeat", 1))))
    if problems:
        raise ConfigError("\n".join(problems))
    return Campaign(
        name=str(camp.get("name", "campaign")), preset=preset_name, device=device,
        run_timeout_s=timeouts["run_timeout_s"], stall_timeout_s=timeouts["stall_timeout_s"],
        startup_timeout_s=timeouts["startup_timeout_s"],
        fixed=fixed, runs=tuple(specs), data_source=data_source, checkpoint=checkpoint,
    )


def tokens_read(campaign: Campaign) -> int:
    """Tokens one run of the campaign reads (steps x global batch x (seq + 1))."""
    f = campaign.fixed
    return f.steps * f.global_batch_size * (f.model.seq_length + 1)


def attach_dataset(campaign: Campaign, *, prefix: str, token_dtype: str, num_tokens: int) -> Campaign:
    """The campaign with the validated real-text dataset in its fixed variables (every spec's)."""
    fixed = dataclasses.replace(campaign.fixed, data_path=prefix, data_token_dtype=token_dtype,
                                data_num_tokens=num_tokens)
    return dataclasses.replace(campaign, fixed=fixed,
                               runs=tuple(dataclasses.replace(s, fixed=fixed) for s in campaign.runs))
