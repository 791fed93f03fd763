"""`runner search` arguments -> SearchRequest -> the candidate table (--dry-run) or the search.

    runner search --model PRESET --gpus N [--nodes M] [--device cuda|cpu] [--gpu NAME]
                  [--memory-gib X] [--kernels parity,engine-best] [--budget MINUTES] [--top K]
                  [--micro-batches B,B] [--max-trials N] [--fault CANDIDATE:KIND] [--dry-run] --out DIR

Deliberately thin: argument checking and wiring; the search is runner.search. A dry run imports
neither torch nor pandas.
"""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from core.errors import ConfigError

FAULT_KINDS = ("oom", "crash", "hang")


def add_search_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="plan candidate layouts, run the best few briefly, refit, explain the choice")
    p.add_argument("--model", required=True, help="a campaign preset (runner.presets): gpt-125m | tiny")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in all (on CPU: gloo ranks)")
    p.add_argument("--nodes", type=int, default=1, help="nodes the GPUs are spread over (default 1)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda (default) or cpu (gloo ranks)")
    p.add_argument("--gpu", help="hardware.toml GPU id or name (default: the GPU found; h100_sxm in a dry run "
                                 "without one)")
    p.add_argument("--memory-gib", type=float, help="memory per rank (default: the GPU's; on CPU none, or a "
                   "per-process budget each trial is held to)")
    p.add_argument("--kernels", default=None, help="kernels modes to search, comma-separated (default "
                   "parity,engine-best on GPUs; parity on CPU, where the two are the same)")
    p.add_argument("--budget", type=float, default=10.0, help="wall-clock minutes for the trials (default 10)")
    p.add_argument("--top", type=int, default=3, help="candidates run before the first refit (default 3)")
    p.add_argument("--micro-batches", metavar="B,B,...", help="only these micro-batch sizes (default: every divisor "
                   "of the per-replica batch the planner gives)")
    p.add_argument("--max-trials", type=int, help="stop after this many trials (default: the budget decides)")
    p.add_argument("--fault", action="append", default=[], metavar="CANDIDATE:KIND",
                   help=f"plant a fault ({', '.join(FAULT_KINDS)}) in that candidate's trial, rank 0 (tests the "
                        "search's failure handling)")
    p.add_argument("--dry-run", action="store_true", help="print the candidate table; run nothing")
    p.add_argument("--out", type=Path, required=True, help="campaign directory (resumed when it holds this search)")
    p.set_defaults(func=cmd_search, interrupted="runner: search interrupted; the current trial was stopped and marked "
                   "'interrupted' (resume: the same command with the same --out)")


def build_search_request(args: argparse.Namespace):
    """SearchRequest from the arguments. ConfigError listing every problem, one per line."""
    from core.hardware import gpu_keys, lookup_gpu
    from core.perfmodel import load_assumptions
    from runner.presets import PRESETS
    from runner.search import SearchRequest

    problems = []
    if args.model not in PRESETS:
        problems.append(f"--model {args.model!r}: unknown preset; choose one of {', '.join(PRESETS)}")
    for flag, value, most in (("--gpus", args.gpus, 1024), ("--nodes", args.nodes, 128), ("--top", args.top, 1000),
                              ("--max-trials", 1 if args.max_trials is None else args.max_trials, 100_000)):
        if not 1 <= value <= most:
            problems.append(f"{flag} {value}: must be in 1..{most}")
    if not (math.isfinite(args.budget) and 0 < args.budget <= 7 * 24 * 60):
        problems.append(f"--budget {args.budget}: must be minutes in (0, {7 * 24 * 60}]")
    if args.memory_gib is not None and not (math.isfinite(args.memory_gib) and 0 < args.memory_gib <= 1e6):
        problems.append(f"--memory-gib {args.memory_gib}: must be a number of GiB in (0, 1e6]")
    if args.nodes >= 1 and args.gpus >= 1 and args.gpus % args.nodes:
        problems.append(f"--gpus {args.gpus} is not divisible by --nodes {args.nodes}")
    if args.device == "cpu" and args.nodes != 1:
        problems.append("--nodes: a CPU search runs on this machine only; drop --nodes")
    kernels = tuple(k.strip() for k in (args.kernels or ("parity,engine-best" if args.device == "cuda" else
                                                        "parity")).split(",") if k.strip())
    bad = [k for k in kernels if k not in ("parity", "engine-best")]
    if bad or not kernels:
        problems.append(f"--kernels {args.kernels!r}: comma-separated modes from parity, engine-best")
    micro = None
    if args.micro_batches is not None:
        try:
            micro = tuple(sorted({int(b) for b in args.micro_batches.split(",")}))
        except ValueError:
            micro = ()
        if not micro or min(micro) < 1:
            problems.append(f"--micro-batches {args.micro_batches!r}: comma-separated integers >= 1")
    faults = {}
    for item in args.fault:
        m = re.fullmatch(r"([A-Za-z0-9_-]+):([a-z_]+)", item)
        if not m or m.group(2) not in FAULT_KINDS:
            problems.append(f"--fault {item!r}: must be CANDIDATE:KIND with KIND one of {', '.join(FAULT_KINDS)}")
        else:
            faults[m.group(1)] = m.group(2)
    gpu = None
    if args.device == "cuda":
        name = args.gpu or (None if args.dry_run else detect_gpu_name()) or "h100_sxm"
        gpu = lookup_gpu(name)
        if gpu is None:
            problems.append(f"--gpu {name!r}: unknown; choose one of {', '.join(gpu_keys())} (hardware.toml)")
        elif args.model in PRESETS and PRESETS[args.model].dtype not in gpu.flops:
            problems.append(f"--gpu {gpu.key}: hardware.toml has no dense {PRESETS[args.model].dtype} peak for it")
        elif (args.memory_gib or gpu.memory_gib) is None:
            problems.append(f"--gpu {gpu.key}: hardware.toml has no single memory size; pass --memory-gib")
    elif args.gpu:
        problems.append("--gpu applies to --device cuda only")
    if problems:
        raise ConfigError("\n".join(problems))
    return SearchRequest(
        preset=args.model, num_gpus=args.gpus, num_nodes=args.nodes, device=args.device,
        gpu_key=gpu.key if gpu else None, gpu_name=gpu.name if gpu else None,
        peak_flops=gpu.flops[PRESETS[args.model].dtype] if gpu else None,
        memory_gib=args.memory_gib or (gpu.memory_gib if gpu else None),
        usable_fraction=load_assumptions().memory_usable_fraction, budget_s=args.budget * 60.0, top_k=args.top,
        kernels=kernels, max_trials=args.max_trials, micro_batch_sizes=micro or None, faults=faults)


def detect_gpu_name() -> str | None:
    """The first CUDA device's name, or None without one (imports torch: not in a dry run)."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None


def cmd_search(args: argparse.Namespace) -> int:
    from core.errors import ToolError
    from runner.search import SEARCH_FILE, plan_search, render_header, render_table, run_search

    req = build_search_request(args)
    # the campaign is named after --out, prefixed once ("runs/search-cpu" -> "search-cpu", "runs/x" -> "search-x")
    base = args.out.resolve().name
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", base if base.startswith("search") else f"search-{base}") or "search"
    if args.dry_run:
        candidates, _, _ = plan_search(req, name=name, out=args.out if args.out.is_dir() else None)
        print(render_header(req, candidates) + render_table(candidates, req), end="")
        return 0
    if req.device == "cuda":
        import torch

        found = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if found < req.num_gpus // req.num_nodes:
            raise ConfigError(f"--gpus {req.num_gpus}: {found} GPU(s) found here; use --device cpu or fewer GPUs")
        if req.num_nodes > 1:
            raise ConfigError("--nodes > 1: trials on several nodes are not supported yet; `--dry-run` plans them")
    if args.out.exists() and (not args.out.is_dir() or (any(args.out.iterdir())
                                                         and not (args.out / SEARCH_FILE).is_file())):
        raise ToolError(f"{args.out}: exists and is not a search directory; choose another --out")
    created = not args.out.exists()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        result = run_search(req, out=args.out, name=name)
    except ConfigError:
        if created and not any(args.out.iterdir()):
            args.out.rmdir()  # nothing was searched: leave no empty folder behind
        raise
    print(f"wrote {args.out / SEARCH_FILE}: report build {args.out}")
    return 0 if result["choice"] else 1
