"""Issue 7's targets on whatever GPU is present, in one process (world size 1):

    python benchmarks/bench_gpu.py --out DIR [--steps 80] [--warmup 20] [--targets ddp-eager,ddp,zero3,megatron]

Each target is a run spec resolved by runner.matrix (the knobs an expert picks, runner.knobs),
trained by the runner's own trainers through the runner's instrumented loop (runner.train.run_loop:
prefetched batches, CUDA-event step rows in DIR/<target>/metrics/rank0.jsonl). ``micro_batch_size =
"auto"`` targets first probe candidates in this process (a few steps each, out-of-memory caught),
eagerly even where the target compiles (a compile per candidate would cost more than the search
saves). The instrumented-vs-bare overhead is measured on the DDP target: the same trainer runs the
same steps through run_loop and through a bare ``train_step`` loop over batches already on the
device, alternating bare / instrumented / bare, wall time with a device sync at both ends.

Writes DIR/bench_gpu.json after every target (a timeout keeps what finished): date, versions, GPU,
per target tokens/s (median step), MFU (6N+12LHQT, peak from hardware.toml), knobs, micro-batch
search, compile time, peak memory, data wait, and the overhead. Targets (issue 7): DDP >= 550k
tokens/s per GPU, ZeRO-3 >= 0.8x DDP, Megatron TP1xPP1 >= 0.9x DDP, overhead <= 2%.

Deliberately not here: several GPUs (use `runner all` with a matrix), tracing.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from core.records import to_dict  # noqa: E402
from core.hardware import lookup_peak  # noqa: E402
from core.formulas import compute_flops_per_token, compute_mfu  # noqa: E402
from runner.data import BatchPrefetcher, SyntheticBatches  # noqa: E402
from runner.matrix import resolve_matrix  # noqa: E402
from runner.recorder import StepRecorder  # noqa: E402
from runner.strategies import RankContext, build_trainer  # noqa: E402
from runner.train import apply_precision_knobs, lr_at, run_loop  # noqa: E402
from runner.tune import choose_micro_batch, probe_spec  # noqa: E402

SCHEMA_VERSION = 1
# name -> one [[runs]] table of a matrix (layout + knobs); "ddp-eager" is the untuned baseline
TARGETS = {
    "ddp-eager": {"strategy": "ddp", "micro_batch_size": 16, "options": {"compile": False}},
    "ddp": {"strategy": "ddp", "micro_batch_size": "auto"},
    "zero3": {"strategy": "zero3", "micro_batch_size": "auto"},
    "megatron": {"strategy": "tp_pp", "engine": "megatron", "micro_batch_size": "auto"},
    "zero3-compile": {"strategy": "zero3", "micro_batch_size": "auto", "options": {"compile": True}},
}
GOALS = {"ddp_tokens_per_s": 550_000, "zero3_vs_ddp": 0.8, "megatron_vs_ddp": 0.9, "overhead": 0.02}
PROBE_STEPS, PROBE_WARMUP = 6, 3


def _versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None}
    for mod, key in (("deepspeed", "deepspeed"), ("megatron.core", "megatron_core"), ("triton", "triton")):
        try:
            out[key] = __import__(mod, fromlist=["__version__"]).__version__
        except Exception as e:  # noqa: BLE001
            out[key] = f"unavailable ({type(e).__name__})"
    return out


def _gpu() -> dict:
    if not torch.cuda.is_available():
        return {"name": None}
    props = torch.cuda.get_device_properties(0)
    info = {"name": torch.cuda.get_device_name(0), "memory_gib": props.total_memory / 2**30,
            "count_visible": torch.cuda.device_count()}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,power.limit",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        info["nvidia_smi"] = q.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["nvidia_smi"] = None
    return info


def _free(*objs) -> None:
    for o in objs:
        del o
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _teardown_engine(spec) -> None:
    if spec.engine == "megatron":
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
    torch._dynamo.reset()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_bare(trainer, batches, steps, spec, device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    for step in steps:
        trainer.train_step(batches[step - steps.start], lr=lr_at(step, spec.fixed))
    _sync(device)
    return time.perf_counter() - t0


def probe(spec, mbs: int, ctx: RankContext) -> dict:
    """Train PROBE_STEPS steps at micro-batch ``mbs`` eagerly; tokens/s over the last steps, or
    the out-of-memory error."""
    p = probe_spec(spec, micro_batch_size=mbs, steps=PROBE_STEPS, warmup_steps=PROBE_WARMUP)
    p = dataclasses.replace(p, options={**p.options, "compile": False})
    trainer = None
    try:
        torch.manual_seed(p.fixed.seed)
        trainer = build_trainer(p, ctx=ctx)
        data = SyntheticBatches(vocab_size=p.fixed.model.vocab_size, seq_length=p.fixed.model.seq_length,
                                global_batch_size=p.fixed.global_batch_size, seed=p.fixed.seed)
        pre = BatchPrefetcher(data, num_steps=PROBE_STEPS, dp_rank=0, dp_degree=1, micro_batch_size=mbs,
                              num_microbatches=p.num_microbatches, device=ctx.device)
        try:
            for step in range(PROBE_STEPS):
                if step == PROBE_WARMUP:
                    _sync(ctx.device)
                    t0 = time.perf_counter()
                trainer.train_step(pre.get(step), lr=lr_at(step, p.fixed))
            _sync(ctx.device)
            dt_s = (time.perf_counter() - t0) / (PROBE_STEPS - PROBE_WARMUP)
        finally:
            pre.close()
        mem = torch.cuda.max_memory_allocated() / 2**30 if ctx.device.type == "cuda" else None
        return {"micro_batch_size": mbs, "status": "ok", "tokens_per_s": p.tokens_per_step / dt_s, "mem_peak_gib": mem}
    except torch.OutOfMemoryError as e:
        return {"micro_batch_size": mbs, "status": "oom", "tokens_per_s": None, "error": str(e).splitlines()[0][:300]}
    finally:
        del trainer
        _teardown_engine(p)
        _free()


def search(spec, ctx: RankContext) -> tuple[int, list[dict]]:
    s = spec.options["micro_batch_search"]
    results, best = [], None
    for mbs in sorted(s["candidates"], reverse=True):
        r = probe(spec, mbs, ctx)
        results.append(r)
        print(f"  probe mbs {mbs}: {r['status']} {r.get('tokens_per_s') or 0:,.0f} tok/s", flush=True)
        if r["tokens_per_s"] is None:
            continue
        if best is not None and r["tokens_per_s"] < best * 0.97:
            break
        best = max(best or 0.0, r["tokens_per_s"])
    chosen = choose_micro_batch(results, policy=s["policy"]) or min(s["candidates"])
    return chosen, results


def run_target(name: str, run: dict, *, args, ctx: RankContext, out: Path, with_overhead: bool) -> dict:
    raw = {"campaign": {"name": "bench", "preset": args.preset, "world_size": 1},
           "fixed": {"steps": args.steps, "warmup_steps": args.warmup, "profile_num_steps": 0},
           "runs": [{"name": name, **run}]}
    spec = resolve_matrix(raw, source="bench", num_gpus=torch.cuda.device_count() if ctx.device.type == "cuda" else 0).runs[0]
    res: dict = {"target": name, "strategy": spec.strategy, "engine": spec.engine}
    if "micro_batch_search" in spec.options:
        t0 = time.perf_counter()
        chosen, results = search(spec, ctx)
        per_dp = spec.fixed.global_batch_size // spec.dp_degree
        spec = dataclasses.replace(spec, micro_batch_size=chosen, num_microbatches=per_dp // chosen,
                                   options={**spec.options, "micro_batch_search": {
                                       **spec.options["micro_batch_search"], "results": results, "chosen": chosen}})
        res["search_s"] = time.perf_counter() - t0
    res.update(micro_batch_size=spec.micro_batch_size, num_microbatches=spec.num_microbatches,
               global_batch_size=spec.fixed.global_batch_size, knobs=dict(spec.options))
    run_dir = out / name
    (run_dir / "metrics").mkdir(parents=True, exist_ok=True)
    (run_dir / "spec.json").write_text(json.dumps(to_dict(spec), indent=1))
    torch.manual_seed(spec.fixed.seed)
    apply_precision_knobs(spec)
    trainer = build_trainer(spec, ctx=ctx)
    data = SyntheticBatches(vocab_size=spec.fixed.model.vocab_size, seq_length=spec.fixed.model.seq_length,
                            global_batch_size=spec.fixed.global_batch_size, seed=spec.fixed.seed)
    try:
        with (run_dir / "metrics" / "rank0.jsonl").open("w") as f_out:
            rec = StepRecorder(f_out, run=name, engine=spec.engine, rank=0, tokens_per_step=spec.tokens_per_step,
                               device=ctx.device)
            pre = BatchPrefetcher(data, num_steps=spec.fixed.steps, dp_rank=trainer.dp_rank, dp_degree=1,
                                  micro_batch_size=spec.micro_batch_size, num_microbatches=spec.num_microbatches,
                                  device=ctx.device)
            try:
                first = run_loop(spec, trainer, pre, rec, fault=None, ctx=ctx)
            finally:
                pre.close()
            rec.close()
        rows = [json.loads(x) for x in (run_dir / "metrics" / "rank0.jsonl").read_text().splitlines()]
        measured = [r for r in rows if r["step"] >= spec.fixed.warmup_steps]
        times = sorted(r["step_time_s"] for r in measured)
        med = statistics.median(times)
        tps = spec.tokens_per_step / med
        fpt = compute_flops_per_token(num_params=trainer.num_params, num_layers=spec.fixed.model.num_layers,
                                      hidden_size=spec.fixed.model.hidden_size, seq_length=spec.fixed.model.seq_length,
                                      position_embedding_params=trainer.num_params_position_embedding)
        peak = lookup_peak(torch.cuda.get_device_name(0) if ctx.device.type == "cuda" else None, spec.fixed.dtype)
        res.update(
            num_params=trainer.num_params, engine_version=trainer.engine_version, **first,
            num_measured_steps=len(measured), step_time_median_s=med,
            step_time_p90_s=times[min(len(times) - 1, int(0.9 * len(times)))],
            tokens_per_s=tps, tokens_per_s_mean=spec.tokens_per_step * len(times) / sum(times),
            flops_per_token=fpt, peak_flops=peak.flops if peak else None, peak_source=peak.source if peak else None,
            mfu=compute_mfu(tps, flops_per_token=fpt, peak_flops=peak.flops if peak else None, num_gpus=1),
            data_wait_median_s=statistics.median(r["data_wait_s"] for r in measured),
            mem_peak_allocated_gib=max((r["mem_peak_allocated_gib"] or 0) for r in measured) or None,
            loss_first=rows[0]["loss"], loss_last=rows[-1]["loss"])
        if with_overhead:
            res["overhead"] = measure_overhead(spec, trainer, data, ctx=ctx, out=run_dir, n=args.overhead_steps)
    finally:
        del trainer
        _teardown_engine(spec)
        _free()
    return res


def measure_overhead(spec, trainer, data, *, ctx, out: Path, n: int) -> dict:
    """Same trainer, same steps (warmup .. warmup+n-1): bare loop (batches already on the device,
    no recorder, no prefetch thread), then the instrumented run_loop, then bare again."""
    steps = range(spec.fixed.warmup_steps, spec.fixed.warmup_steps + n)
    from runner.data import slice_batch

    batches = [[(x.to(ctx.device).contiguous(), y.to(ctx.device).contiguous()) for x, y in slice_batch(
        data.tokens(s), dp_rank=0, dp_degree=1, micro_batch_size=spec.micro_batch_size,
        num_microbatches=spec.num_microbatches)] for s in steps]
    bare1 = _timed_bare(trainer, batches, steps, spec, ctx.device)
    with (out / "metrics" / "overhead_rank0.jsonl").open("w") as f_out:
        rec = StepRecorder(f_out, run="overhead", engine=spec.engine, rank=0, tokens_per_step=spec.tokens_per_step,
                           device=ctx.device)
        pre = BatchPrefetcher(data, num_steps=steps.stop, dp_rank=0, dp_degree=1, micro_batch_size=spec.micro_batch_size,
                              num_microbatches=spec.num_microbatches, device=ctx.device, first_step=steps.start)
        _sync(ctx.device)
        t0 = time.perf_counter()
        try:
            run_loop(spec, trainer, pre, rec, fault=None, ctx=ctx, steps=steps)
            rec.close()
        finally:
            pre.close()
        _sync(ctx.device)
        instr = time.perf_counter() - t0
    bare2 = _timed_bare(trainer, batches, steps, spec, ctx.device)
    bare = (bare1 + bare2) / 2
    return {"num_steps": n, "bare_s": [bare1, bare2], "instrumented_s": instr, "overhead_fraction": instr / bare - 1.0,
            "method": "wall time with device sync at both ends; bare = mean of the loop before and after"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=80)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--overhead-steps", type=int, default=30)
    ap.add_argument("--preset", default="auto")
    ap.add_argument("--targets", default="ddp-eager,ddp,zero3,megatron,zero3-compile")
    ap.add_argument("--budget-s", type=float, default=1e9, help="skip remaining targets after this many seconds")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511", "RANK": "0", "WORLD_SIZE": "1",
                 "LOCAL_RANK": "0"}.items():
        os.environ.setdefault(k, v)
    if cuda:
        torch.cuda.set_device(0)
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    ctx = RankContext(rank=0, world_size=1, local_rank=0, device=device)
    t_start = time.perf_counter()
    doc = {"schema_version": SCHEMA_VERSION, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "command": sys.argv, "versions": _versions(), "gpu": _gpu(), "goals": GOALS,
           "flops_convention": "6N+12LHQT (PaLM appendix B), N without position embeddings, tied embedding once",
           "targets": {}, "errors": {}}
    path = args.out / "bench_gpu.json"
    names = [t for t in args.targets.split(",") if t]
    for name in names:
        if time.perf_counter() - t_start > args.budget_s:
            doc["errors"][name] = "skipped: time budget spent"
            continue
        if TARGETS[name].get("engine") == "megatron" and not cuda:
            doc["errors"][name] = "skipped: Megatron's schedules need CUDA"
            continue
        print(f"== {name}", flush=True)
        t0 = time.perf_counter()
        try:
            doc["targets"][name] = run_target(name, TARGETS[name], args=args, ctx=ctx, out=args.out,
                                              with_overhead=name == "ddp")
            doc["targets"][name]["wall_s"] = time.perf_counter() - t0
            r = doc["targets"][name]
            print(f"   {r['tokens_per_s']:,.0f} tok/s, mbs {r['micro_batch_size']}, mfu {r['mfu']}", flush=True)
        except Exception as e:  # noqa: BLE001 -- one target's failure must not lose the others
            doc["errors"][name] = "".join(traceback.format_exception(e))[-4000:]
            print(doc["errors"][name], flush=True)
            _free()
        doc["ratios"] = _ratios(doc["targets"])
        doc["wall_s"] = time.perf_counter() - t_start
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(path)
    dist.destroy_process_group()
    return 0


def _ratios(t: dict) -> dict:
    ddp = t.get("ddp", {}).get("tokens_per_s")
    out = {}
    if ddp:
        for k in ("zero3", "megatron", "zero3-compile", "ddp-eager"):
            if t.get(k, {}).get("tokens_per_s"):
                out[f"{k}_vs_ddp"] = t[k]["tokens_per_s"] / ddp
    return out


if __name__ == "__main__":
    sys.exit(main())
