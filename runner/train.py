"""Training entry point, one process per rank under torchrun:

    python -m runner.train --run-dir RUN_DIR      (reads RUN_DIR/spec.json)

Owns what every strategy shares -- process group, seeds, the data round (synthetic tokens or the
real-text DataLoader), the LR schedule, step timing, the metric rows, the checkpoint probe and a
run's planted causes (runner.plants) -- and delegates the step itself (and its checkpoint format)
to the strategy's trainer.
Each rank's stdout/stderr (NCCL_DEBUG lines included) go to RUN_DIR/logs/rank<r>.log.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import faulthandler
import json
import math
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from core.records import FixedConfig, RunInfo, RunSpec, run_spec_from_dict, to_dict
from runner.faults import build_fault, inject
from runner.membudget import start_memory_budget, write_rank_memory
from core.atomic import write_json_atomic
from runner.matrix import LOOP_OVERHEAD_STEPS
from runner.nodes import placement_record
from runner.checkpoint import CheckpointProbe
from runner.data import BatchPrefetcher, RealBatches, SampleOrder, SyntheticBatches, TokenWindows, slice_batch
from runner.recorder import StepRecorder, open_metrics_file
from runner.strategies import RankContext, build_trainer
from runner.plants import (PLANT_EXTRA_COLLECTIVE_RANGE, PLANT_EXTRA_MATMUL_RANGE, PLANT_HOST_DELAY_RANGE,
                            PlantWork, build_plant_truth, build_plant_work, planted_delays_s, planted_lr_factor,
                            time_plant_work)
from runner.strategies.common import enable_nvtx, phase, plant_range


def lr_at(step: int, fixed: FixedConfig) -> float:
    """Linear warm-up over lr_warmup_steps, then cosine decay to min_lr at the last step
    (nanoGPT get_lr; Megatron-LM OptimizerParamScheduler 'cosine')."""
    if step < fixed.lr_warmup_steps:
        return fixed.lr * (step + 1) / fixed.lr_warmup_steps
    span = max(1, fixed.steps - fixed.lr_warmup_steps)
    ratio = min(1.0, (step - fixed.lr_warmup_steps) / span)
    return fixed.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (fixed.lr - fixed.min_lr)


def trace_path(run_dir: Path, rank: int) -> Path:
    """Where rank ``rank`` writes its profiler window (Chrome trace JSON; the runner gzips it
    after the run, outside the timed loop)."""
    return run_dir / "trace" / f"profile_rank{rank}.json"


def profiled_steps(fixed: FixedConfig) -> range:
    """Steps inside the profiler window: its warm-up step, then the traced steps."""
    if fixed.profile_num_steps == 0:
        return range(0)
    return range(fixed.profile_start_step - 1, fixed.profile_start_step + fixed.profile_num_steps)


def build_profiler(spec: RunSpec, *, run_dir: Path, ctx: RankContext) -> torch.profiler.profile | None:
    """A torch.profiler whose schedule traces steps profile_start_step .. +profile_num_steps-1
    after one warm-up step, so ``ProfilerStep#k`` is the loop's step k (prof.step() is called
    once at the end of every step from step 0). The trace is exported when the window closes;
    export seconds go to trace/profile_meta_rank<r>.json for the note's cost line."""
    f = spec.fixed
    if f.profile_num_steps == 0:
        return None
    activities = [torch.profiler.ProfilerActivity.CPU]
    if ctx.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    path = trace_path(run_dir, ctx.rank)

    def export(prof: torch.profiler.profile) -> None:
        t0 = time.perf_counter()
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        write_json_atomic(path.with_name(f"profile_meta_rank{ctx.rank}.json"), {
            "run": spec.name, "rank": ctx.rank, "warmup_step": f.profile_start_step - 1,
            "traced_steps": list(range(f.profile_start_step, f.profile_start_step + f.profile_num_steps)),
            "export_s": time.perf_counter() - t0, "trace_bytes": path.stat().st_size,
        })

    return torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(skip_first=f.profile_start_step - 1, wait=0, warmup=1,
                                         active=f.profile_num_steps, repeat=1),
        on_trace_ready=export, record_shapes=False, with_stack=False, profile_memory=False,
    )


def _redirect_output(run_dir: Path, rank: int) -> None:
    """Point fds 1 and 2 at logs/rank<r>.log so C-level output (NCCL_DEBUG) lands there too."""
    path = run_dir / "logs" / f"rank{rank}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)


def _rank_context(spec: RunSpec) -> RankContext:
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if spec.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return RankContext(rank=rank, world_size=int(os.environ["WORLD_SIZE"]), local_rank=local_rank, device=device)


def apply_precision_knobs(spec: RunSpec) -> None:
    """TF32 matmuls and cuDNN convolutions off unless ``options.tf32`` (bf16 runs then use bf16
    tensor cores only, and the fp32 pieces -- loss, optimizer -- stay true fp32)."""
    tf32 = bool(spec.options.get("tf32", False))
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32


def check_simulated_memory(spec: RunSpec) -> None:
    """Test-only memory limit for the micro-batch search: ``options.simulate_oom_above_micro_batch_size``
    makes a run whose micro-batch exceeds it fail as an allocation failure would."""
    limit = spec.options.get("simulate_oom_above_micro_batch_size")
    if limit is not None and spec.micro_batch_size > int(limit):
        raise torch.OutOfMemoryError(f"simulated out of memory (test option): micro_batch_size {spec.micro_batch_size}"
                                     f" > simulate_oom_above_micro_batch_size {limit}")


def train(spec: RunSpec, *, run_dir: Path, ctx: RankContext) -> None:
    f = spec.fixed
    print(f"[runner] run {spec.name}: strategy {spec.strategy}, engine {spec.engine}, rank {ctx.rank}/{ctx.world_size}"
          f" (tp {spec.tp_degree}, pp {spec.pp_degree}, dp {spec.dp_degree}, micro-batch {spec.micro_batch_size})",
          flush=True)
    torch.manual_seed(f.seed)
    enable_nvtx(spec.nsys and ctx.device.type == "cuda")
    apply_precision_knobs(spec)
    check_simulated_memory(spec)
    budget = start_memory_budget(spec, device=ctx.device)  # capacity trials only (runner.membudget)
    trainer = build_trainer(spec, ctx=ctx)
    info = RunInfo(
        run=spec.name,
        engine=spec.engine,
        num_params=trainer.num_params,
        num_params_position_embedding=trainer.num_params_position_embedding,
        torch_version=torch.__version__,
        engine_version=trainer.engine_version,
        device_name=torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda" else "cpu",
        num_gpus=ctx.world_size if ctx.device.type == "cuda" else 0,
        compile=bool(spec.options.get("compile", False)) or (getattr(trainer, "kernels", None) or {}).get(
            "compile", "none") != "none",
        pp_stage_num_layers=getattr(trainer, "pp_stage_num_layers", None),
        kernels=getattr(trainer, "kernels", None),
    )
    if ctx.rank == 0:
        write_json_atomic(run_dir / "run_info.json", to_dict(info))
    data = build_data(spec, dp_rank=trainer.dp_rank, dp_degree=trainer.dp_degree)
    fault = build_fault(spec.options)
    plant_work = build_plant_work(spec, device=ctx.device)
    truth_before = time_plant_work(plant_work, ctx=ctx)  # apart from the traced steps, on both sides of them
    probe = CheckpointProbe(spec, trainer, run_dir=run_dir, rank=ctx.rank, device=ctx.device) \
        if spec.checkpoint_step is not None else None
    with open_metrics_file(run_dir, ctx.rank) as out:
        recorder = StepRecorder(out, run=spec.name, engine=spec.engine, rank=ctx.rank, tokens_per_step=spec.tokens_per_step, device=ctx.device)
        profiler = build_profiler(spec, run_dir=run_dir, ctx=ctx)
        prefetcher = BatchPrefetcher(data, num_steps=f.steps, dp_rank=trainer.dp_rank, dp_degree=trainer.dp_degree,
                                     micro_batch_size=spec.micro_batch_size, num_microbatches=spec.num_microbatches,
                                     device=ctx.device)
        try:
            first = slowest_rank(run_loop(spec, trainer, prefetcher, recorder, fault=fault, ctx=ctx,
                                          profiler=profiler, checkpoint=probe, plant_work=plant_work), ctx=ctx)
            recorder.close()
            truth = build_plant_truth(spec, plant_work, before=truth_before,
                                      after=time_plant_work(plant_work, ctx=ctx), ctx=ctx)
            first.update(measure_loop_overhead(spec, trainer, data, recorder, ctx=ctx))
        except BaseException:
            try:  # keep the last completed step's row; never mask the original error
                recorder.close()
            except Exception:  # noqa: BLE001
                pass
            raise
        finally:
            prefetcher.close()
            if isinstance(data, RealBatches):
                data.close()
        recorder.close()
    if isinstance(data, RealBatches):
        (run_dir / "data").mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / "data" / f"samples_rank{ctx.rank}.json", {
            "run": spec.name, "rank": ctx.rank, "dp_rank": trainer.dp_rank, "dp_degree": trainer.dp_degree,
            "steps": {str(k): v for k, v in sorted(data.consumed.items())}})
    if probe is not None and probe.save_s is not None:  # a run shorter than its checkpoint step saved nothing
        verify_checkpoint(probe, losses=recorder.losses, lr_at=lambda s: lr_at(s, f),
                     batches=lambda s: replay_batches(spec, data, s, dp_rank=trainer.dp_rank,
                                                      dp_degree=trainer.dp_degree, device=ctx.device))
    if budget is not None:
        write_rank_memory(budget, run_dir=run_dir, run=spec.name, rank=ctx.rank, device=ctx.device,
                          device_peak_gib=recorder.mem_peak_allocated_gib)
    if ctx.rank == 0 and first:
        write_json_atomic(run_dir / "run_info.json", to_dict(dataclasses.replace(info, **first)))
    if ctx.rank == 0 and truth is not None:
        write_json_atomic(run_dir / "plant_truth.json", to_dict(truth))


def slowest_rank(walls: dict, *, ctx: RankContext) -> dict:
    """``run_loop``'s first_step_s / compile_s as the slowest rank's (max over ranks): the run
    waits for its last rank to finish compiling. A collective: every rank calls it."""
    keys = ("first_step_s", "compile_s")
    values = torch.tensor([float("nan") if walls.get(k) is None else float(walls[k]) for k in keys],
                          dtype=torch.float64, device=ctx.device)
    if ctx.world_size > 1:
        values = torch.nan_to_num(values, nan=-1.0)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        values[values < 0] = float("nan")
    out = dict(walls)
    for k, v in zip(keys, values.tolist()):
        if k in walls:
            out[k] = None if v != v else v
    return out


def verify_checkpoint(probe: CheckpointProbe, **kwargs) -> None:
    """``probe.verify``; a failing engine load is reported on the rank's log, not raised: the
    run's steps are measured already (its run_info is written after this)."""
    try:
        probe.verify(**kwargs)
    except Exception as e:  # noqa: BLE001
        print(f"[runner] {probe.spec.name}: checkpoint restore failed ({type(e).__name__}: {e}); no restore check"
              " for this run", flush=True)


def build_data(spec: RunSpec, *, dp_rank: int, dp_degree: int) -> SyntheticBatches | RealBatches:
    """This rank's batch source for the run's data round: synthetic Zipf tokens, or the real-text
    indexed dataset through a DataLoader with the run's ``options.loader`` knobs (runner.data)."""
    f = spec.fixed
    if spec.data_round == "synthetic":
        return SyntheticBatches(vocab_size=f.model.vocab_size, seq_length=f.model.seq_length,
                                global_batch_size=f.global_batch_size, seed=f.seed)
    if not f.data_path or not f.data_token_dtype or not f.data_num_tokens:
        raise ValueError(f"run {spec.name}: data round 'real' without a validated dataset in the spec "
                         "(runner all resolves one before launching)")
    loader = dict(spec.options.get("loader") or {})
    windows = TokenWindows(prefix=f.data_path, token_dtype=f.data_token_dtype, num_tokens=f.data_num_tokens,
                           seq_length=f.model.seq_length, sample_delay_s=float(loader.get("sample_delay_s", 0.0)))
    order = SampleOrder(num_samples=len(windows), global_batch_size=f.global_batch_size, seed=f.seed)
    return RealBatches(windows, order, dp_rank=dp_rank, dp_degree=dp_degree, steps=range(f.steps),
                       num_workers=int(loader.get("num_workers", 0)),
                       pin_memory=bool(loader.get("pin_memory", False)) and torch.cuda.is_available(),
                       prefetch_factor=int(loader.get("prefetch_factor", 2)))


def replay_batches(spec: RunSpec, data: SyntheticBatches | RealBatches, step: int, *, dp_rank: int, dp_degree: int,
                   device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Step ``step``'s micro-batches for this rank, read directly (no loader, no delay), on ``device``."""
    rows = data.rows_at(step) if isinstance(data, RealBatches) else data.rows(step, dp_rank=dp_rank, dp_degree=dp_degree)
    return [(x.to(device), y.to(device)) for x, y in slice_batch(
        rows, dp_rank=0, dp_degree=1, micro_batch_size=spec.micro_batch_size, num_microbatches=spec.num_microbatches)]


def measure_loop_overhead(spec: RunSpec, trainer, data: SyntheticBatches | RealBatches, recorder: StepRecorder, *,
                          ctx: RankContext) -> dict:
    """Measurement overhead, same process (issue 7): the run's last LOOP_OVERHEAD_STEPS steps as the
    recorder timed them (instrumented loop: prefetch wait, phase ranges, per-step rows) against
    the same steps' batches replayed through a bare ``trainer.train_step`` loop, batches already on
    the device, wall time with a device sync at both ends. Every rank replays (the steps hold
    collectives). Returns {loop_overhead_fraction, loop_overhead_num_steps} or {} when the last
    steps are not all measured ones (warm-up, profiler window) or the run is too short. The
    replay steps update the model after the run's last row: nothing is recorded from them."""
    f = spec.fixed
    steps = range(f.steps - LOOP_OVERHEAD_STEPS, f.steps)
    window = set(profiled_steps(f))
    if steps.start < max(f.warmup_steps, 1) or window & set(steps):
        return {}
    times = recorder.step_times
    if any(s not in times for s in steps):
        return {}
    batches = [replay_batches(spec, data, s, dp_rank=trainer.dp_rank, dp_degree=trainer.dp_degree, device=ctx.device)
               for s in steps]
    _synced_wall_s(time.perf_counter(), ctx.device)  # start from an idle device
    t0 = time.perf_counter()
    for s, batch in zip(steps, batches):
        trainer.train_step(batch, lr=lr_at(s, f))
    bare_s = _synced_wall_s(t0, ctx.device)
    instrumented_s = sum(times[s] for s in steps)
    return {"loop_overhead_fraction": instrumented_s / bare_s - 1.0 if bare_s > 0 else None,
            "loop_overhead_num_steps": len(steps)}


def _synced_wall_s(t0: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def run_loop(spec: RunSpec, trainer, prefetcher: BatchPrefetcher, recorder: StepRecorder, *, fault, ctx: RankContext,
             profiler: torch.profiler.profile | None = None, steps: range | None = None,
             checkpoint: CheckpointProbe | None = None, plant_work: PlantWork | None = None) -> dict:
    """The instrumented training loop: per step, wait for the prefetched batch (``data_wait_s``;
    a planted data delay sleeps inside it), a planted host delay, a planted extra matmul, the
    trainer's step, a planted extra all-reduce (exposed: nothing overlaps it), the recorder's
    row; after ``spec.checkpoint_step`` the checkpoint save (its time kept out of every step's
    by restarting the recorder's clock). Returns ``{first_step_s, compile_s}`` (seconds).

    Planted and clean runs take the same path apart from the plant's own work (runner.plants;
    ``plant_work``: built from the spec when None): no extra device synchronisation in either,
    so on CUDA a planted sleep costs a step only what the host's lead over the device does not
    hide, as a real slow host would.

    first_step_s: wall time of step 0 (host-synchronised after it), which holds torch.compile's
    tracing and code generation, lazy engine set-up and allocator growth. compile_s:
    first_step_s minus step 1's wall time (also synchronised; both are warm-up steps, which the
    metric table drops, so neither the sync nor the compilation reaches a reported step time);
    None without ``options.compile``, when warmup_steps < 2 or the run has fewer than 2 steps."""
    f = spec.fixed
    window = profiled_steps(f)
    timed = {0, 1} if f.warmup_steps >= 2 else {0}
    walls: dict[int, float] = {}
    if profiler is not None:
        profiler.start()
    data_delay_s, host_delay_s = planted_delays_s(spec, rank=ctx.rank)
    work = plant_work if plant_work is not None else build_plant_work(spec, device=ctx.device)
    for step in steps if steps is not None else range(f.steps):
        recorder.begin_step()
        t_step = t0 = time.perf_counter()
        with phase("data"):
            inject(fault, point="data", step=step, rank=ctx.rank, device=ctx.device)
            microbatches = prefetcher.get(step)
            if data_delay_s:  # planted: the fetch takes longer, in the loop, so the step waits for it
                time.sleep(data_delay_s)
        data_wait_s = time.perf_counter() - t0
        lr = lr_at(step, f) * planted_lr_factor(spec, step=step)  # planted: a known perturbation of training
        inject(fault, point="step", step=step, rank=ctx.rank, device=ctx.device)
        if host_delay_s:  # planted: host time on the training thread right before the forward
            with plant_range(PLANT_HOST_DELAY_RANGE):
                time.sleep(host_delay_s)
        kept = step >= f.warmup_steps  # the steps the metric table keeps: the plant's own clock times these
        if work.matmul is not None:  # planted: compute of known FLOPs right before the forward
            with plant_range(PLANT_EXTRA_MATMUL_RANGE), work.in_step.span("matmul", keep=kept):
                work.run_matmul()
        entry_time_s = time.time()  # wall clock: comparable across ranks of one host
        out_step = trainer.train_step(microbatches, lr=lr)
        if work.collective is not None:  # planted: a collective of known bytes, after the step's own
            with plant_range(PLANT_EXTRA_COLLECTIVE_RANGE), work.in_step.span("collective", keep=kept):
                work.run_collective()
        recorder.end_step(step=step, loss=out_step.loss, grad_norm=out_step.grad_norm, lr=lr, data_wait_s=data_wait_s,
                            entry_time_s=entry_time_s, profiled=step in window)
        if step in timed:
            walls[step] = _synced_wall_s(t_step, ctx.device)
        if profiler is not None:
            profiler.step()  # exports the trace after the window's last step, outside any step's timing
            if step == window[-1]:
                profiler.stop()
                profiler = None
                recorder.restart_clock()
        if checkpoint is not None and step == spec.checkpoint_step:
            recorder.close()  # the step's row first, then the save; the next step's clock starts after it
            checkpoint.save(step)
            recorder.restart_clock()
        if ctx.rank == 0 and (step % 10 == 0 or step == f.steps - 1):
            print(f"[runner] {spec.name} step {step}/{f.steps}", flush=True)
    if 0 not in walls:
        return {}
    compiled = bool(spec.options.get("compile", False))
    return {"first_step_s": walls[0], "compile_s": walls[0] - walls[1] if compiled and 1 in walls else None}


def write_placement(spec: RunSpec, *, run_dir: Path, ctx: RankContext) -> None:
    """Every rank says where it lives (runner node rank, hostname, local rank, torchrun's group
    rank); rank 0 writes <run>/placement.json. With c10d rendezvous torchrun orders nodes by its
    own rule, not by --node-rank, so which global ranks share a node is only known here."""
    record = {"node_rank": int(os.environ["RUNNER_NODE_RANK"]),
              "group_rank": int(os.environ.get("GROUP_RANK", "0")), "hostname": socket.gethostname(),
              "local_rank": ctx.local_rank}
    gathered: list = [None] * ctx.world_size
    dist.all_gather_object(gathered, record)
    if ctx.rank == 0:
        write_json_atomic(run_dir / "placement.json", placement_record(run=spec.name, ranks=gathered))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runner.train")
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--spec", type=Path, help="spec file (default: RUN_DIR/spec.json; node K > 0: spec_node<K>.json)")
    args = parser.parse_args(argv)
    spec = run_spec_from_dict(json.loads((args.spec or args.run_dir / "spec.json").read_text(encoding="utf-8")))
    rank = int(os.environ["RANK"])
    _redirect_output(args.run_dir, rank)
    faulthandler.enable(all_threads=True)  # a fatal signal (SIGSEGV, SIGABRT) prints every thread's Python stack to the rank log
    ctx = _rank_context(spec)
    dist.init_process_group(backend=spec.backend, timeout=dt.timedelta(seconds=spec.collective_timeout_s))
    try:
        if "RUNNER_NODE_RANK" in os.environ:  # multi-node launch (runner.launch sets it); one node: nothing to place
            write_placement(spec, run_dir=args.run_dir, ctx=ctx)
        train(spec, run_dir=args.run_dir, ctx=ctx)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


def exit_without_static_destructors(code: int) -> None:
    """Flush Python's and C's streams and logging, then leave with ``code`` without running atexit hooks
    or C++ static destructors: torch's profiler keeps a background thread in a static object
    whose destructor can abort a finished rank at interpreter exit ("terminate called without an
    active exception", SIGABRT, in about 1 of 6 CPU runs under load). Every artifact is written
    and closed by then (metrics, traces, checkpoints, status records)."""
    import ctypes
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).fflush(None)  # C stdio buffers too (NCCL_DEBUG lines written through the rank log's fd)
    os._exit(code)


if __name__ == "__main__":
    exit_without_static_destructors(main())
