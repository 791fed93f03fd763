"""`runner search`: plan the candidate layouts, run the best few as short trials, refit, run on.

Candidates come from the planner (runner.plan.enumerate_layouts: TP x PP x DP degrees, micro-batch,
optimizer sharding, recomputation, interleaving) mapped onto what the campaign runner runs
(runner.matrix: DDP; ZeRO-3 on DeepSpeed and FSDP2; TP x PP on Megatron-core and the torch-native
engine; the kernels mode on GPUs). Each candidate is resolved as a matrix run, so one the runner
would refuse is pruned with the runner's own reason; so is one whose engine does not import here,
and one whose predicted peak memory on its fullest rank (the heaviest pipeline stage,
core.perfmodel.compute_layout_memory on the run's layout, as the note's predicted block) exceeds the
usable share of the device memory (perfmodel.toml [memory] usable_fraction: the stated margin).

The rest are ranked by predicted step time (core.perfmodel.predict_run at a prior compute rate: the
GPU's dense peak x perfmodel.toml's efficiency, or CPU_PRIOR_RATE_FLOPS on CPU). The first --top
trials take the best predicted candidate of each kind (DP, TP, PP, TP+PP), then of each
engine-and-degrees family. Trials are runs of one campaign (warm-up, a short profiler window, then
measured steps for a median and a spread), each launched by the campaign's own resume (`runner all
--resume <out>` once the trial is listed in campaign.json), so a failed, OOM or hung trial is
recorded like any run and the next one starts.
After every trial each finished trial's compute rate is solved (core.perfmodel.solve_rate, as
runner.calibrate and the note do), the untried candidates are re-predicted with the rate of the
other trials of their family (else engine and kind, else kind, else the data-parallel trials;
the nearest micro-batch size first) and re-ranked, and the best untried one runs while the budget lasts and the refit
predicts it within SEARCH_SLACK (or the best trial's p90 spread, if larger) of the best measured
step. <out>/search.json holds every candidate (tried, pruned, untried) with predictions before and
after the refit and what was measured; it is rewritten after every trial, and a search started
again on the same <out> resumes (runs already final are kept: the campaign's own resume).

Deliberately not here: the note (report.search words the ranking from the traces' what-if numbers),
the arithmetic (core), launching a process (runner.launch).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError, ToolError
from core.i18n import Message, N_  # reasons are sentences the note prints: catalogue messages
from core.perfmodel import Layout, build_run_layout, build_shape, compute_layout_memory, predict_run, solve_rate
from core.records import FINAL_STATUSES

SEARCH_SCHEMA_VERSION = 1
SEARCH_FILE = "search.json"
MATRIX_FILE = "search-matrix.toml"  # every runnable candidate: `runner all --matrix` runs them all (exhaustive)
GIB = 2**30
# Prior compute rate per CPU rank before any trial (FLOP/s): an assumption, replaced by the refit
# after the first trial; it only orders compute against the assumed gloo transfer below.
CPU_PRIOR_RATE_FLOPS = 5e9
CPU_LINK = {"key": "gloo-loopback", "name": "gloo over loopback TCP (assumed)", "bus_bw_gbps": 1.0,
            "latency_us": 100.0, "scope": "intra", "per": "gpu",
            "source": "assumption: gloo on one host moves ~1 GB/s; a CAMPAIGN/commbench table replaces it"}
SEARCH_SLACK = 0.10  # an untried candidate runs only while its refit prediction is within this of the best measured
# Trial shape: warm-up steps (untimed), a profiler window (one warm-up step + traced steps, for
# the note's what-if evidence) and measured steps for the median and its spread.
# A trial's time is mostly start-up (processes, engine, compile), so measured steps are cheap: enough
# of them that the median is not the noise of a shared machine.
TRIAL_STEPS = {"cpu": {"warmup_steps": 3, "profile_num_steps": 2, "measured_steps": 24},
               "cuda": {"warmup_steps": 8, "profile_num_steps": 2, "measured_steps": 20}}
TRIAL_TIMEOUTS_S = {"cpu": {"run_timeout_s": 300.0, "stall_timeout_s": 60.0, "startup_timeout_s": 180.0},
                    "cuda": {"run_timeout_s": 600.0, "stall_timeout_s": 180.0, "startup_timeout_s": 600.0}}
INTERRUPT_GRACE_S = 120.0  # a stopped trial's runner gets this long to stop its ranks and write 'interrupted'
ENGINE_MODULES = {"deepspeed": "deepspeed", "megatron": "megatron.core"}  # engines a machine may lack


@dataclass(frozen=True, kw_only=True)
class SearchRequest:
    """What `runner search` was asked. memory_gib: per-rank device memory (None: no limit, CPU
    without --memory-gib); usable_fraction: the share of it a candidate may fill (the margin)."""

    preset: str
    num_gpus: int
    num_nodes: int
    device: str  # "cuda" | "cpu"
    gpu_key: str | None
    gpu_name: str | None
    peak_flops: float | None
    memory_gib: float | None
    usable_fraction: float
    budget_s: float
    top_k: int
    kernels: tuple[str, ...]
    max_trials: int | None = None
    micro_batch_sizes: tuple[int, ...] | None = None  # only these micro-batch sizes (None: every one the planner gives)
    faults: Mapping[str, str] = dataclasses.field(default_factory=dict)  # candidate -> runner.faults kind

    @property
    def gpus_per_node(self) -> int:
        return max(1, self.num_gpus // self.num_nodes)

    @property
    def memory_limit_bytes(self) -> float:
        return math.inf if self.memory_gib is None else self.memory_gib * GIB * self.usable_fraction


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """A candidate's predicted step (ms) and its categories (compute, transfer, bubble: the note's
    CATEGORY_GROUPS but 'other', which the model does not price) at one compute rate (FLOP/s)."""

    step_ms: float
    compute_ms: float
    transfer_ms: float
    bubble_ms: float
    rate_flops: float
    rate_from: str


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One candidate layout: the matrix run it would be, its planner layout and what is known of it.
    mem_peak_gib: predicted on the fullest rank; measured_mem_peak_gib: per rank, as recorded."""

    name: str
    strategy: str
    engine: str
    tp_degree: int
    pp_degree: int
    dp_degree: int
    micro_batch_size: int
    num_microbatches: int
    sharding: str
    recompute: str
    num_virtual_stages: int
    kernels: str
    run: Mapping[str, Any]  # the [[runs]] table
    state: str = "untried"
    reason: str | None = None  # why pruned, or the failed trial's cause
    mem_peak_gib: float | None = None
    before: Prediction | None = None
    after: Prediction | None = None
    measured_step_ms: float | None = None
    measured_step_p10_ms: float | None = None
    measured_step_p90_ms: float | None = None
    measured_num_steps: int | None = None
    measured_mem_peak_gib: tuple[float, ...] = ()
    trial_index: int | None = None
    trial_wall_s: float | None = None


def describe(c: Candidate) -> str:
    """'megatron TP2 x PP1 x DP1, micro-batch 4 x 4, parity' (the table's layout column)."""
    extra = f", v={c.num_virtual_stages}" if c.num_virtual_stages > 1 else ""
    rc = "" if c.recompute == "selective" else f", {c.recompute} recompute"
    return (f"{c.engine} TP{c.tp_degree} x PP{c.pp_degree} x DP{c.dp_degree}, micro-batch {c.micro_batch_size} x "
            f"{c.num_microbatches}{extra}{rc}, {c.kernels}")


def _engine_runs(lay: Layout) -> list[tuple[str, str, dict[str, Any]]]:
    """(strategy, engine, options) the campaign runner would run a planner layout with; [] when
    it has no engine for the optimizer sharding (ZeRO-1/2)."""
    if lay.sharding == "ddp":
        return [("ddp", "torch-ddp", {})] if lay.tp_degree == lay.pp_degree == 1 else []
    if lay.sharding == "zero3":
        return [("zero3", "deepspeed", {}), ("zero3", "fsdp2", {})] if lay.tp_degree == lay.pp_degree == 1 else []
    if lay.sharding == "megatron":
        out = [("tp_pp", "megatron", {"use_distributed_optimizer": False} if lay.dp_degree > 1 else {})]
        schedule = {} if lay.num_virtual_stages == 1 else {"schedule": "Interleaved1F1B",
                                                          "virtual_stages": lay.num_virtual_stages}
        return out + [("tp_pp", "torch", schedule)]  # the torch engine keeps a replicated optimizer
    if lay.sharding == "megatron-distopt":
        return [("tp_pp", "megatron", {"use_distributed_optimizer": True})]
    return []


def _name(strategy: str, engine: str, lay: Layout, options: Mapping[str, Any], kernels: str) -> str:
    head = {"torch-ddp": "ddp", "deepspeed": "zero3-ds", "fsdp2": "zero3-fsdp2"}.get(engine)
    if head is None:
        head = f"{engine}-tp{lay.tp_degree}-pp{lay.pp_degree}" + ("-distopt" if options.get("use_distributed_optimizer")
                                                                  else "")
    tail = (f"-v{lay.num_virtual_stages}" if lay.num_virtual_stages > 1 else "") + (
        "-full" if lay.recompute == "full" else "") + ("-eb" if kernels == "engine-best" else "")
    return f"{head}-dp{lay.dp_degree}-mb{lay.micro_batch_size}{tail}"


def build_plan_request(req: SearchRequest, shape):
    """The planner's request for this search (only the fields its enumeration reads matter here)."""
    from runner.plan import PlanRequest
    from runner.presets import PRESETS

    preset = PRESETS[req.preset]
    return PlanRequest(shape=shape, seq_length=preset.seq_length, global_batch_size=preset.global_batch_size,
                       num_gpus=req.num_gpus, gpus_per_node=req.gpus_per_node, gpu_key=req.gpu_key or "cpu",
                       gpu_name=req.gpu_name or "CPU", peak_flops=req.peak_flops or CPU_PRIOR_RATE_FLOPS,
                       peak_source="", memory_gib=req.memory_gib or math.inf,
                       memory_usable_fraction=req.usable_fraction, comm=None, default_efficiency=1.0,
                       default_efficiency_source="")


def enumerate_candidates(req: SearchRequest) -> list[Candidate]:
    """Every planner layout for the request as the campaign runner's runs, one Candidate per
    (layout, engine, kernels mode); none pruned yet."""
    from core.perfmodel import build_shape as shape_of
    from runner.plan import enumerate_layouts
    from runner.presets import PRESETS, build_model_config

    preset = PRESETS[req.preset]
    shape = shape_of(build_model_config(preset, max_tp_degree=1), name=preset.name)
    out, seen = [], set()
    for lay in enumerate_layouts(build_plan_request(req, shape)):
        if req.micro_batch_sizes and lay.micro_batch_size not in req.micro_batch_sizes:
            continue
        runs = _engine_runs(lay)
        if not runs:
            runs = [("zero3" if lay.tp_degree == lay.pp_degree == 1 else "tp_pp", f"({lay.sharding})", {})]
        for strategy, engine, options in runs:
            for kernels in req.kernels:
                name = _name(strategy, engine, lay, options, kernels).replace("(", "").replace(")", "")
                if name in seen:
                    continue
                seen.add(name)
                run = {"name": name, "strategy": strategy, "engine": engine, "world_size": lay.world_size,
                       "tp_degree": lay.tp_degree, "pp_degree": lay.pp_degree,
                       "micro_batch_size": lay.micro_batch_size, "kernels": kernels, "overlap": "single"}
                if lay.recompute == "full":  # the runner's switch (runner.knobs CommonKnobs.recompute)
                    options = {**options, "recompute": "full"}
                if options:
                    run["options"] = dict(options)
                out.append(Candidate(name=name, strategy=strategy, engine=engine, tp_degree=lay.tp_degree,
                                     pp_degree=lay.pp_degree, dp_degree=lay.dp_degree,
                                     micro_batch_size=lay.micro_batch_size, num_microbatches=lay.num_microbatches,
                                     sharding=lay.sharding, recompute=lay.recompute,
                                     num_virtual_stages=lay.num_virtual_stages, kernels=kernels, run=run))
    return out


def build_fixed_section(req: SearchRequest) -> dict[str, Any]:
    """[fixed] of every trial: the preset's, shortened to warm-up + profiler window + measured steps."""
    t = TRIAL_STEPS[req.device]
    warm, window = t["warmup_steps"], t["profile_num_steps"]
    return {"steps": warm + 1 + window + t["measured_steps"], "warmup_steps": warm, "lr_warmup_steps": warm,
            "profile_start_step": warm + 1, "profile_num_steps": window}


def render_matrix(req: SearchRequest, runs: Sequence[Mapping[str, Any]], *, name: str) -> str:
    """The matrix TOML of ``runs`` with the search's campaign and fixed sections."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, Mapping):
            return "{ " + ", ".join(f"{k} = {value(x)}" for k, x in v.items()) + " }"
        return repr(v)

    lines = ["# Written by runner search: every runnable candidate (`runner all --matrix` this file runs them all).",
             "[campaign]", f"name = {value(name)}", f"preset = {value(req.preset)}"]
    lines += [f"{k} = {v}" for k, v in TRIAL_TIMEOUTS_S[req.device].items()]
    lines += ["", "[fixed]"] + [f"{k} = {v}" for k, v in build_fixed_section(req).items()]
    for run in runs:
        lines += ["", "[[runs]]"] + [f"{k} = {value(v)}" for k, v in run.items()]
    return "\n".join(lines) + "\n"


def resolve_candidates(req: SearchRequest, candidates: list[Candidate], *, name: str):
    """Prune what the runner would refuse, what does not import here and what is predicted not
    to fit; resolve the rest as one
    campaign (one set of fixed variables). -> (candidates, the resolved Campaign or None)."""
    from runner.matrix import resolve_matrix

    import tomllib

    num_gpus = req.num_gpus if req.device == "cuda" else 0
    out, keep = [], []
    for c in candidates:
        reason = None
        if c.engine.startswith("("):
            reason = Message(N_("not runnable: the campaign runner has no %(sharding)s engine (ZeRO stage 3 only)"),
                             sharding=c.sharding)
        elif c.engine in ENGINE_MODULES and importlib.util.find_spec(ENGINE_MODULES[c.engine].split(".")[0]) is None:
            reason = Message(N_("engine %(engine)s is not importable here (%(module)s)"), engine=c.engine,
                             module=ENGINE_MODULES[c.engine])
        else:
            try:
                one = tomllib.loads(render_matrix(req, [c.run], name=name))
                resolve_matrix(one, source="candidate", num_gpus=num_gpus)
            except ConfigError as e:
                reason = Message(N_("runner refuses it: %(error)s"),
                                 error=re.sub(r"^candidate run 1 \('[^']*'\):? ?", "", str(e).splitlines()[0]))
        if reason is None:
            keep.append(c)
        out.append(dataclasses.replace(c, state="pruned", reason=reason) if reason else c)
    if not keep:
        return out, None
    campaign = resolve_matrix(tomllib.loads(render_matrix(req, [c.run for c in keep], name=name)), source=MATRIX_FILE,
                              num_gpus=num_gpus)
    return out, campaign


def build_comm(req: SearchRequest, out: Path | None):
    """Collective curves: <out>/commbench when there is one (this device's rows), else the GPU's
    nominal links (hardware.toml), else on CPU the assumed gloo link CPU_LINK."""
    from core.hardware import Link
    from core.perfmodel import build_campaign_comm_model, build_comm_model

    rows = []
    if out is not None and (out / "commbench").is_dir():
        from ingest.io import load_commbench

        with contextlib.suppress(ToolError):
            rows = [r for r in load_commbench(out / "commbench") if r.get("device") == req.device]
    if req.device == "cuda":
        return build_campaign_comm_model(rows, gpu_name=req.gpu_name, gpus_per_node=req.gpus_per_node)[0]
    return build_comm_model(rows, intra=Link(**CPU_LINK), inter=Link(**CPU_LINK), gpus_per_node=req.gpus_per_node)


def prior_rate(req: SearchRequest, *, compiled: bool) -> tuple[float, str]:
    """(FLOP/s per rank, its source) before any trial."""
    from core.perfmodel import load_assumptions

    if req.device == "cpu":
        return CPU_PRIOR_RATE_FLOPS, "prior: runner.search.CPU_PRIOR_RATE_FLOPS (assumption)"
    a = load_assumptions()
    rate = req.peak_flops * a.compute_efficiency / (1 if compiled else a.compile_speedup)
    return rate, (f"prior: {req.gpu_name} dense peak x efficiency {a.compute_efficiency:g}"
                  + ("" if compiled else f" / compile speed-up {a.compile_speedup:g}") + " (perfmodel.toml)")


def predict_candidate(spec, *, fixed, comm, rate: float, rate_from: str, per_node: int) -> Prediction:
    """core.perfmodel.predict_run of a resolved spec at ``rate``, as the search's Prediction."""
    shape = build_shape(fixed.model, name=str(fixed.preset))
    p = predict_run(shape, build_run_layout(spec, compiled=is_compiled(spec)), fixed=fixed, comm=comm, rate=rate,
                    num_gpus_per_node=per_node, memory_limit_bytes=math.inf)
    return Prediction(step_ms=p.step_time_s * 1e3, compute_ms=p.compute_time_s * 1e3,
                      transfer_ms=(p.exposed_comm_s + p.stage_time_s - p.compute_time_s) * 1e3,
                      bubble_ms=p.bubble_time_s * 1e3, rate_flops=rate, rate_from=rate_from)


def is_compiled(spec) -> bool:
    return (spec.options.get("kernels") or {}).get("compile", "none") != "none"


def predict_memory_gib(spec) -> float:
    """Predicted peak bytes on the spec's fullest rank (heaviest stage), GiB."""
    state, act = compute_layout_memory(build_shape(spec.fixed.model, name=spec.name),
                                       build_run_layout(spec, compiled=is_compiled(spec)),
                                       seq_length=int(spec.fixed.model.seq_length))
    return (state + act) / GIB


def plan_search(req: SearchRequest, *, name: str, out: Path | None = None):
    """Candidates pruned and predicted at the prior rate, runnable ones fastest first.
    -> (candidates in table order, resolved Campaign or None, comm model)."""
    candidates, campaign = resolve_candidates(req, enumerate_candidates(req), name=name)
    comm = build_comm(req, out)
    specs = {s.name: s for s in campaign.runs} if campaign else {}
    done = []
    for c in candidates:
        if c.state == "pruned":
            done.append(c)
            continue
        spec = specs[c.name]
        mem_gib = predict_memory_gib(spec)
        rate, source = prior_rate(req, compiled=is_compiled(spec))
        try:
            before = predict_candidate(spec, fixed=spec.fixed, comm=comm, rate=rate, rate_from=source,
                                       per_node=req.gpus_per_node)
        except ToolError as e:
            done.append(dataclasses.replace(c, state="pruned", reason=f"the model cannot price it: {e}",
                                            mem_peak_gib=mem_gib))
            continue
        c = dataclasses.replace(c, mem_peak_gib=mem_gib, before=before,
                                micro_batch_size=spec.micro_batch_size, num_microbatches=spec.num_microbatches)
        if mem_gib * GIB > req.memory_limit_bytes:
            c = dataclasses.replace(c, state="pruned", reason=Message(
                N_("predicted %(mem)s GiB on its fullest rank > %(usable)s GiB usable (%(fraction)s of %(total)s GiB)"),
                mem=f"{mem_gib:.2f}", usable=f"{req.memory_limit_bytes / GIB:.2f}", fraction=f"{req.usable_fraction:.0%}",
                total=f"{req.memory_gib:g}"))
        done.append(c)
    return order(done), campaign, comm


def order(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Tried first (by measured step), then untried by their latest prediction (ties: the larger
    micro-batch, as runner.plan.rank_layouts), then failed trials, then pruned."""
    def key(c: Candidate):
        pred = c.after or c.before
        if c.measured_step_ms is not None:
            return (0, c.measured_step_ms, 0, c.name)
        if c.state in ("pruned",):
            return (3, c.before.step_ms if c.before else math.inf, 0, c.name)
        if c.state != "untried":
            return (2, c.trial_index or 0, 0, c.name)
        return (1, round(pred.step_ms, 9) if pred else math.inf, -c.micro_batch_size, c.name)
    return sorted(candidates, key=key)


def kind(c: Candidate) -> tuple[bool, bool]:
    """(tensor parallel, pipeline parallel): which model-parallel categories a layout has."""
    return c.tp_degree > 1, c.pp_degree > 1


def family(c: Candidate) -> tuple:
    """What the refit and the first trials group by: engine, degrees, interleaving, optimizer
    sharding (the kernels mode apart: the refit matches it by compile on or off)."""
    return (c.strategy, c.engine, c.tp_degree, c.pp_degree, c.num_virtual_stages, c.sharding)


def refit(candidates: Sequence[Candidate], *, specs: Mapping[str, Any], comm, per_node: int) -> list[Candidate]:
    """Every candidate re-predicted with the compute rate the trials measured (core.perfmodel.
    solve_rate on each ok trial's median step): the mean over the *other* trials, in its kernels
    mode, of its family (engine, degrees), else of its engine and kind (TP, PP or neither), else of
    its kind, else of the data-parallel trials, else of every other trial -- within that pool, the
    trials of the nearest micro-batch size. A
    trial is so predicted leave-one-out: its 'after' error is the refit's error, not zero by
    construction."""
    rates: dict[str, tuple[float, Candidate, bool]] = {}
    for c in candidates:
        if c.state == "ok" and c.measured_step_ms:
            spec = specs[c.name]
            shape = build_shape(spec.fixed.model, name=str(spec.fixed.preset))
            try:
                rate = solve_rate(shape, build_run_layout(spec, compiled=is_compiled(spec)), fixed=spec.fixed,
                                  comm=comm, step_time_s=c.measured_step_ms / 1e3, num_gpus_per_node=per_node)
            except ToolError:
                rate = None
            if rate:
                rates[c.name] = (rate, c, is_compiled(spec))
    if not rates:
        return list(candidates)
    out = []
    for c in candidates:
        if c.before is None or c.name not in specs:
            out.append(c)
            continue
        spec = specs[c.name]
        mode = is_compiled(spec)
        others = [(n, r, t) for n, (r, t, m) in rates.items() if n != c.name and m == mode]
        # a TP or PP trial's solved rate carries its kind's mispriced transfer or bubble: it calibrates
        # layouts of that kind only; others take the data-parallel trials' rate
        pools = ([x for x in others if family(x[2]) == family(c)],
                 [x for x in others if x[2].engine == c.engine and kind(x[2]) == kind(c)],
                 [x for x in others if kind(x[2]) == kind(c)],
                 [x for x in others if kind(x[2]) == (False, False)],
                 [(n, r, t) for n, (r, t, _) in rates.items() if n != c.name])
        pool = next((p for p in pools if p), None)
        if pool is None:
            out.append(c)
            continue
        # the achieved rate depends on the micro-batch (GEMM sizes, per-micro-batch overhead), which the
        # model does not price: take the trials of the nearest micro-batch size in the pool
        near = min(abs(math.log2(t.micro_batch_size / c.micro_batch_size)) for _, _, t in pool)
        pool = [(n, r) for n, r, t in pool if abs(math.log2(t.micro_batch_size / c.micro_batch_size)) == near]
        rate = sum(r for _, r in pool) / len(pool)
        source = "refit: " + ", ".join(n for n, _ in pool)
        try:
            after = predict_candidate(spec, fixed=spec.fixed, comm=comm, rate=rate, rate_from=source, per_node=per_node)
        except ToolError:
            after = None
        out.append(dataclasses.replace(c, after=after))
    return out


def load_trial(run_dir: Path, *, warmup_steps: int) -> dict[str, Any]:
    """A finished trial's measured step times (median, p10, p90 over measured steps, ms:
    core.formulas.compute_step_times' slowest rank per step) and per-rank peak memory (GiB)."""
    import numpy as np
    import pandas as pd

    from core.formulas import compute_step_times

    rows = []
    for path in sorted((run_dir / "metrics").glob("rank*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                rows.append({"run": run_dir.name, "rank": row.get("rank"), "step": row["step"],
                             "step_time_s": row["step_time_s"], "profiled": bool(row.get("profiled"))})
    out: dict[str, Any] = {}
    if rows:
        times = compute_step_times(pd.DataFrame(rows), warmup_steps=warmup_steps)["step_time_s"].to_numpy(float)
        if times.size:
            p10, p50, p90 = np.percentile(times * 1e3, [10, 50, 90], method="linear")
            out.update(measured_step_ms=float(p50), measured_step_p10_ms=float(p10),
                       measured_step_p90_ms=float(p90), measured_num_steps=int(times.size))
    mems = {}
    for path in sorted((run_dir / "memory").glob("rank*.json")):
        with contextlib.suppress(ValueError, OSError, KeyError):
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("mem_peak_gib") is not None:
                mems[int(data["rank"])] = float(data["mem_peak_gib"])
    if mems:
        out["measured_mem_peak_gib"] = tuple(mems[r] for r in sorted(mems))
    return out


def build_search_dict(req: SearchRequest, candidates: Sequence[Candidate], *, wall_s: float,
                      stop_reason: str | None) -> dict[str, Any]:
    """search.json's content (schema SEARCH_SCHEMA_VERSION)."""
    tried = [c for c in candidates if c.trial_index is not None]
    ok = [c for c in tried if c.state == "ok" and c.measured_step_ms]
    best = min(ok, key=lambda c: c.measured_step_ms, default=None)
    mem_errors = [abs(c.mem_peak_gib - max(c.measured_mem_peak_gib)) / max(c.measured_mem_peak_gib)
                  for c in ok if c.measured_mem_peak_gib and c.mem_peak_gib and max(c.measured_mem_peak_gib) > 0]
    rows = []
    for c in candidates:
        d = dataclasses.asdict(c)
        d["layout"] = describe(c)
        rows.append(d)
    errs_before = [abs(c.before.step_ms / c.measured_step_ms - 1) for c in ok if c.before]
    errs_after = [abs(c.after.step_ms / c.measured_step_ms - 1) for c in ok if c.after]
    return {
        "schema_version": SEARCH_SCHEMA_VERSION, "request": dataclasses.asdict(req),
        "margin": {"usable_fraction": req.usable_fraction, "memory_limit_gib":
                   None if req.memory_gib is None else req.memory_limit_bytes / GIB,
                   "source": "perfmodel.toml [memory] usable_fraction"},
        "num_candidates": len(candidates), "num_pruned": sum(c.state == "pruned" for c in candidates),
        "num_tried": len(tried), "choice": best.name if best else None,
        "choice_step_ms": best.measured_step_ms if best else None, "search_wall_s": wall_s,
        "stop_reason": stop_reason, "memory_error_max": max(mem_errors) if mem_errors else None,
        "step_error_max": {"before": max(errs_before) if errs_before else None,
                           "after": max(errs_after) if errs_after else None},
        "candidates": rows,
    }


def render_table(candidates: Sequence[Candidate], req: SearchRequest) -> str:
    """The candidate table: predicted step ms (after the refit where there is one), predicted
    peak GiB per rank, measured step and memory, state and why."""
    head = (f"{'#':>3} {'candidate':34} {'pred ms':>9} {'refit ms':>9} {'meas ms':>9} {'pred GiB':>9} "
            f"{'meas GiB':>9}  state")
    lines = [head]
    for i, c in enumerate(candidates, 1):
        def ms(p: Prediction | None) -> str:
            return f"{p.step_ms:9.2f}" if p else f"{'-':>9}"
        meas_mem = f"{max(c.measured_mem_peak_gib):9.3f}" if c.measured_mem_peak_gib else f"{'-':>9}"
        meas = f"{c.measured_step_ms:9.2f}" if c.measured_step_ms is not None else f"{'-':>9}"
        mem = f"{c.mem_peak_gib:9.3f}" if c.mem_peak_gib is not None else f"{'-':>9}"
        why = f" ({c.reason})" if c.reason else ""
        lines.append(f"{i:3} {c.name:34} {ms(c.before)} {ms(c.after)} {meas} {mem} {meas_mem}  {c.state}{why}")
    return "\n".join(lines) + "\n"


def render_header(req: SearchRequest, candidates: Sequence[Candidate]) -> str:
    limit = ("no memory limit (CPU without --memory-gib)" if req.memory_gib is None else
             f"memory limit {req.memory_limit_bytes / GIB:.2f} GiB per rank = {req.usable_fraction:.0%} of "
             f"{req.memory_gib:g} GiB (margin {1 - req.usable_fraction:.0%}, perfmodel.toml [memory])")
    n_pruned = sum(c.state == "pruned" for c in candidates)
    where = f"{req.num_gpus} x {req.gpu_name}" if req.device == "cuda" else f"{req.num_gpus} CPU ranks (gloo)"
    kernels = ", ".join(req.kernels) + ("" if req.device == "cuda" else " (on CPU engine-best = parity: no compile)")
    if req.micro_batch_sizes:
        kernels += f"; micro-batch sizes {', '.join(map(str, req.micro_batch_sizes))} only"
    return (f"search {req.preset} on {where}: {len(candidates)} candidates, {n_pruned} pruned, "
            f"{len(candidates) - n_pruned} runnable; {limit}; kernels {kernels}; budget {req.budget_s / 60:g} min, "
            f"top {req.top_k} first\n")


def run_search(req: SearchRequest, *, out: Path, name: str, log: Callable[[str], None] = print,
               launch_trial: Callable[[Path, Any, Any], tuple[str, str | None]] | None = None) -> dict[str, Any]:
    """Plan, run trials into the campaign ``out`` and refit until the budget is spent or no
    untried candidate is predicted within SEARCH_SLACK (or the best trial's spread) of the best measured step. Resumes a
    search already in ``out`` (same request). -> search.json's content."""
    from core.atomic import write_json_atomic

    start = time.monotonic()
    candidates, campaign, comm = plan_search(req, name=name, out=out)
    unknown = sorted(set(req.faults) - {c.name for c in candidates})
    if unknown:
        raise ConfigError(f"--fault: no candidate named {', '.join(unknown)}; `--dry-run` lists the candidates' names")
    if not candidates:
        raise ConfigError("no candidate: the planner gives no layout for these GPUs and micro-batch sizes (each "
                          "--micro-batches size must divide the global batch over the data-parallel ranks)")
    if campaign is None:
        raise ConfigError("no candidate is runnable here:\n" + "\n".join(f"{c.name}: {c.reason}" for c in candidates))
    specs = {s.name: _trial_spec(s, req) for s in campaign.runs}
    previous = load_previous(out, req)
    (out / MATRIX_FILE).parent.mkdir(parents=True, exist_ok=True)
    (out / MATRIX_FILE).write_text(render_matrix(req, [c.run for c in candidates if c.state != "pruned"], name=name),
                                   encoding="utf-8")
    log(render_header(req, candidates).rstrip())
    by_name = {c.name: c for c in candidates}
    for i, prev_name in enumerate(previous.get("tried", [])):
        if prev_name in by_name:
            by_name[prev_name] = dataclasses.replace(by_name[prev_name], trial_index=i + 1)
    candidates = list(by_name.values())
    # what an earlier start recorded of each trial: a final one is read back, not run again
    earlier = {r.get("name"): r for r in previous.get("candidates", []) if isinstance(r, dict)}
    final_at_start = {name: _final_status(out / name) for name in earlier}  # the campaign's resume keeps these
    launch = launch_trial or campaign_launcher(out, campaign=campaign, req=req, matrix=out / MATRIX_FILE)
    stop_reason = None
    wall_before = previous.get("search_wall_s", 0.0)
    while True:
        # tried before this start (a resume): run again where not final, else just read back
        pending = [c for c in candidates if c.trial_index is not None and c.state in ("untried",)]
        if pending:
            nxt = min(pending, key=lambda c: c.trial_index)
        else:
            elapsed = wall_before + time.monotonic() - start
            tried = [c for c in candidates if c.trial_index is not None]
            untried = [c for c in order(candidates) if c.state == "untried"]
            if not untried:
                stop_reason = Message(N_("every runnable candidate was tried"))
                break
            if req.max_trials is not None and len(tried) >= req.max_trials:
                stop_reason = Message(N_("--max-trials %(num)s reached"), num=req.max_trials)
                break
            mean_trial = (sum(c.trial_wall_s or 0 for c in tried) / len(tried)) if tried else 0.0
            if tried and elapsed + mean_trial > req.budget_s:
                stop_reason = Message(N_("budget: %(spent)s s spent + a trial's %(trial)s s > %(budget)s s"),
                                      spent=f"{elapsed:.0f}", trial=f"{mean_trial:.0f}", budget=f"{req.budget_s:.0f}")
                break
            ok = [c for c in candidates if c.state == "ok" and c.measured_step_ms]
            nxt = untried[0]
            if len(tried) < req.top_k:  # the first trials: the best of each kind (DP, TP, PP, TP+PP) not yet
                # tried, then of each family, so the refit has a rate for as many kinds, engines and degrees as
                # it can (a kind's prior can be far off: on an oversubscribed CPU a pipeline's idle ranks give
                # their core to the others)
                kinds, families = {kind(c) for c in tried}, {family(c) for c in tried}
                nxt = next((c for c in untried if kind(c) not in kinds), None) or next(
                    (c for c in untried if family(c) not in families), nxt)
            if len(tried) >= req.top_k and ok:
                top = min(ok, key=lambda c: c.measured_step_ms)
                best = top.measured_step_ms
                # within the best trial's own spread (p90 over median) a prediction cannot be told apart
                slack = max(SEARCH_SLACK, (top.measured_step_p90_ms or best) / best - 1)
                pred = (nxt.after or nxt.before).step_ms
                if pred > best * (1 + slack):
                    stop_reason = (f"the best untried candidate ({nxt.name}) is predicted at {pred:.2f} ms, more "
                                   f"than "
                                   f"{slack:.0%} over the best measured {best:.2f} ms (the larger of "
                                   f"{SEARCH_SLACK:.0%} and that trial's p90 spread)")
                    break
            nxt = dataclasses.replace(nxt, trial_index=len(tried) + 1)
        t0 = time.monotonic()
        tried = sorted([c for c in candidates if c.trial_index is not None and c.name != nxt.name] + [nxt],
                       key=lambda c: c.trial_index)
        status, cause = launch(out, specs[nxt.name], [specs[c.name] for c in tried])
        wall = time.monotonic() - t0
        before = earlier.get(nxt.name) or {}
        kept = final_at_start.get(nxt.name) == status and before.get("trial_wall_s") is not None
        if kept:
            wall = float(before["trial_wall_s"])
        measured = load_trial(out / nxt.name, warmup_steps=specs[nxt.name].fixed.warmup_steps) if status == "ok" else {}
        done = dataclasses.replace(nxt, state=status, reason=cause if status != "ok" else None, trial_wall_s=wall,
                                   **measured)
        if status == "ok" and not measured.get("measured_step_ms"):
            done = dataclasses.replace(done, state="crash", reason="ended ok without a measured step")
        candidates = [done if c.name == done.name else c for c in candidates]
        candidates = order(refit(candidates, specs=specs, comm=comm, per_node=req.gpus_per_node))
        ok = [c for c in candidates if c.state == "ok" and c.measured_step_ms]
        best = min(ok, key=lambda c: c.measured_step_ms, default=None)
        step = f"{done.measured_step_ms:.2f} ms (p10 {done.measured_step_p10_ms:.2f}, p90 " \
               f"{done.measured_step_p90_ms:.2f})" if done.measured_step_ms else "-"
        mem = f", peak {max(done.measured_mem_peak_gib):.3f} GiB/rank (predicted {done.mem_peak_gib:.3f})" \
            if done.measured_mem_peak_gib else ""
        took = f"(kept from an earlier start, where it took {wall:.1f} s)" if kept else f"in {wall:.1f} s"
        log(f"trial {done.trial_index} {done.name}: {done.state} {took}, step {step}{mem}"
            + (f" [{done.reason}]" if done.reason else "")
            + (f"; best so far {best.name} {best.measured_step_ms:.2f} ms" if best else "; no trial ok yet"))
        write_json_atomic(out / SEARCH_FILE, build_search_dict(req, candidates, wall_s=wall_before + time.monotonic()
                                                               - start, stop_reason=None)
                          | {"tried": [c.name for c in sorted((c for c in candidates if c.trial_index), key=lambda c:
                                                              c.trial_index)]})
    result = build_search_dict(req, candidates, wall_s=wall_before + time.monotonic() - start,
                               stop_reason=stop_reason)
    result["tried"] = [c.name for c in sorted((c for c in candidates if c.trial_index), key=lambda c: c.trial_index)]
    write_json_atomic(out / SEARCH_FILE, result)
    log(f"stopped: {stop_reason}")
    log(render_table(order(candidates), req).rstrip())
    log(f"choice: {result['choice']} ({result['choice_step_ms']:.2f} ms)" if result["choice"]
        else "choice: none ran ok")
    return result


def _trial_spec(spec, req: SearchRequest):
    """A trial: its ranks record their memory and are held to --memory-gib (runner.membudget: a
    per-process budget on CPU; on CUDA the allocator's fraction when it is below the GPU's memory),
    and a planted fault where the request asks for one."""
    from runner.membudget import BUDGET_KEY

    options = {**spec.options, BUDGET_KEY: req.memory_gib}
    if spec.name in req.faults:
        options["fault"] = {"kind": req.faults[spec.name], "rank": 0, "step": spec.fixed.warmup_steps + 1}
    return dataclasses.replace(spec, options=options)


def _final_status(run_dir: Path) -> str | None:
    """The run's recorded status when a resumed campaign keeps it (core.records.FINAL_STATUSES), else None."""
    try:
        status = json.loads((run_dir / "status.json").read_text(encoding="utf-8")).get("status")
    except (OSError, ValueError, AttributeError):
        return None
    return status if status in FINAL_STATUSES else None


def load_previous(out: Path, req: SearchRequest) -> dict[str, Any]:
    """search.json of an earlier start in ``out`` (a resume), checked to be the same request; {} if none."""
    path = out / SEARCH_FILE
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: unreadable ({e}); choose another --out") from None
    was = data.get("request") or {}
    mine = json.loads(json.dumps(dataclasses.asdict(req)))
    # what decides the candidate set must match (the budget, --top and --max-trials may change on a resume)
    diff = [k for k in ("preset", "num_gpus", "num_nodes", "device", "gpu_key", "kernels", "memory_gib",
                        "micro_batch_sizes") if was.get(k) != mine[k]]
    if diff:
        raise ConfigError(f"{path}: a search of another request ({', '.join(f'{k} {was.get(k)!r}' for k in diff)}); "
                          "repeat its arguments to resume it, or choose another --out")
    return data


def campaign_launcher(out: Path, *, campaign, req: SearchRequest, matrix: Path):
    """launch(out, spec, tried_specs) -> (status, cause): the trial as a run of the campaign in
    ``out``: its spec.json and campaign.json (listing the tried runs) written, then the campaign's
    own resume (`runner all --resume out`, a process of its own) runs what has no final status;
    its output goes to <out>/search-runner.log."""
    import datetime as dt
    import signal
    import subprocess
    import sys

    from core.atomic import write_json_atomic
    from core.records import CampaignRecord, SupervisionLimits, to_dict
    from core.redact import redact_text
    from runner import __version__

    supervision = SupervisionLimits(**TRIAL_TIMEOUTS_S[req.device])
    state: dict[str, Any] = {}

    def launch(out: Path, spec, tried: Sequence[Any]) -> tuple[str, str | None]:
        if "commit" not in state:
            env_path = out / "env.json"
            if not env_path.is_file():
                from runner.env import collect_env

                write_json_atomic(env_path, to_dict(collect_env(
                    launch_command=[redact_text(a) for a in sys.orig_argv], data_dir=out)))
            state["commit"] = json.loads(env_path.read_text(encoding="utf-8")).get("tool_git_commit")
        run_dir = out / spec.name
        run_dir.mkdir(parents=True, exist_ok=True)
        if not (run_dir / "spec.json").is_file():
            write_json_atomic(run_dir / "spec.json", to_dict(spec))
        meta = CampaignRecord(
            name=campaign.name, created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            tool_version=__version__, tool_git_commit=state["commit"], matrix_path=str(matrix),
            launch_command=tuple(redact_text(a) for a in sys.orig_argv), device=campaign.device,
            supervision=supervision, fixed=campaign.fixed, runs=tuple(s.name for s in tried))
        write_json_atomic(out / "campaign.json", to_dict(meta))
        deadline = sum(TRIAL_TIMEOUTS_S[req.device].values())  # the run's own watchdogs fire first
        with open(out / "search-runner.log", "a", encoding="utf-8") as log:
            # a session of its own: a terminal's Ctrl-C reaches the search only, which then sends the
            # runner one SIGTERM (a second signal during its stop would cut it before it writes the
            # trial's status)
            proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "all", "--resume", str(out)], stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=deadline)
            except (subprocess.TimeoutExpired, KeyboardInterrupt) as e:
                # SIGTERM (the runner takes it as Ctrl-C) lets it stop its torchrun and mark the run
                # 'interrupted' (SIGKILL would leave the ranks running, and the next resume refusing to
                # start beside them)
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=INTERRUPT_GRACE_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                if isinstance(e, KeyboardInterrupt):
                    raise
        path = run_dir / "status.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return "crash", f"the campaign runner wrote no status.json (see {out / 'search-runner.log'})"
        return str(data.get("status", "crash")), data.get("cause")

    return launch
