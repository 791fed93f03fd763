"""`runner plan` arguments -> PlanRequest -> printed plan + JSON.

    runner plan --model {gpt-125m | llama2-70b | llama3-405b | gpt3-175b | gpt-1t}
                | --layers L --hidden H --heads A --ffn F --vocab V [--kv-heads K] [--swiglu] [--untied]
                --seq S --global-batch B --gpus N [--gpus-per-node G] [--gpu NAME] [--gpu-memory-gib X]
                [--interconnect nvlink|pcie] [--inter-node ib|roce|eth] [--moe-experts E [--moe-top-k K]]
                [--tp T] [--pp P] [--cp C] [--ep E] [--uneven-pp] [--tokens D] [--mfu X]
                [--compute-efficiency X] [--calibration CAMPAIGN] [--commbench PATH] [--top K] [--out FILE]

Deliberately thin: argument checking and wiring; the arithmetic is runner.plan / perfmodel / memory.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import ConfigError
from runner.presets import PRESETS
from runner.shapes import SHAPES, lookup_shape
from core.formulas import MAX_GLOBAL_BATCH_SIZE, MAX_SEQ_LENGTH, SHAPE_MAX, ModelShape, check_shape

if TYPE_CHECKING:  # the planner is imported when `runner plan` runs: every other command starts without it
    from runner.plan import PlanRequest

INTER_NODE = {"ib": "ib_ndr", "roce": "roce_400", "eth": "eth_100"}
SHAPE_FLAGS = {"layers": "num_layers", "hidden": "hidden_size", "heads": "num_heads", "kv_heads": "num_kv_heads",
               "ffn": "ffn_hidden_size", "vocab": "vocab_size", "moe_experts": "num_experts", "moe_top_k": "moe_top_k"}


def add_plan_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="size memory, rank TP/PP/CP/EP/DP layouts by predicted step time")
    p.add_argument("--model", help=f"a published shape: {', '.join(SHAPES)} (flags below override its fields)")
    for flag in ("layers", "hidden", "heads", "kv-heads", "ffn", "vocab"):
        p.add_argument(f"--{flag}", type=int)
    p.add_argument("--swiglu", action="store_true", help="gated (SwiGLU) MLP: three H x F matrices")
    p.add_argument("--untied", action="store_true", help="output layer not tied to the input embedding")
    p.add_argument("--moe-experts", type=int, help="mixture of experts: experts per MoE layer")
    p.add_argument("--moe-top-k", type=int, help="experts per token (default 2 with --moe-experts)")
    p.add_argument("--seq", type=int, help="sequence length (tokens)")
    p.add_argument("--global-batch", type=int, help="sequences per optimizer step")
    p.add_argument("--gpus", type=int, required=True, help="GPUs in total")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default min(gpus, 8))")
    p.add_argument("--gpu", default="h100_sxm", help="hardware.toml GPU id or device name (default h100_sxm)")
    p.add_argument("--hardware", type=Path, metavar="FILE",
                   help="your GPUs and links ([gpu.<id>], [link.<id>] as in hardware.toml), merged over the shipped table")
    p.add_argument("--gpu-memory-gib", type=float, help="memory per GPU (default: hardware.toml memory_gib)")
    p.add_argument("--interconnect", choices=("nvlink", "pcie"), help="link inside a node (default: nvlink when the GPU has one)")
    p.add_argument("--inter-node", choices=tuple(INTER_NODE), default="ib", help="network between nodes (default ib: NDR)")
    for k in ("tp", "pp", "cp", "ep"):
        p.add_argument(f"--{k}", type=int, help=f"fix the {k.upper()} degree")
    p.add_argument("--uneven-pp", action="store_true", help="allow first/last stages with fewer layers")
    p.add_argument("--tokens", type=float, help="training token budget for time to train (default 20 x params)")
    p.add_argument("--mfu", type=float, help="also give time to train at this MFU (0-1)")
    p.add_argument("--compute-efficiency", type=float, help="achieved/peak compute rate for every engine (0-1)")
    p.add_argument("--calibration", type=Path, metavar="CAMPAIGN", help="per-engine compute efficiency from a campaign's runs")
    p.add_argument("--commbench", type=Path, metavar="PATH", help="collective curves from `runner commbench` (dir or JSON)")
    p.add_argument("--top", type=int, default=10, help="layouts to list (default 10)")
    p.add_argument("--out", type=Path, help="JSON output (default runs/plan-<model>-<N>gpu.json)")
    p.set_defaults(func=cmd_plan)


def build_shape(args: argparse.Namespace) -> ModelShape:
    """The model from --model and/or the shape flags. Raises ConfigError naming missing flags."""
    given = {field: getattr(args, flag) for flag, field in SHAPE_FLAGS.items() if getattr(args, flag) is not None}
    if args.model:
        base = dataclasses.asdict(lookup_shape(args.model))
    else:
        missing = [f"--{f}" for f in ("layers", "hidden", "heads", "ffn", "vocab") if getattr(args, f) is None]
        if missing:
            raise ConfigError(f"give --model NAME or every shape flag; missing {' '.join(missing)}")
        base = {"name": "custom", "num_kv_heads": args.heads, "tied_embedding": True, "bias": False}
    base.update(given)
    if args.swiglu:
        base["gated_mlp"] = True
    if args.untied:
        base["tied_embedding"] = False
    if base.get("num_experts", 1) > 1 and args.moe_top_k is None:
        base["moe_top_k"] = min(2, base["num_experts"])
    if given and args.model:
        base["name"] = f"{args.model} (modified)"
    if "num_kv_heads" not in given and "num_heads" in given and not args.model:
        base["num_kv_heads"] = base["num_heads"]
    shape = ModelShape(**base)
    check_shape(shape)
    return shape


def build_request(args: argparse.Namespace) -> PlanRequest:
    """Resolve GPU, links, calibration and defaults into a PlanRequest (ConfigError on bad input)."""
    from core.hardware import gpu_keys, lookup_gpu, use_hardware_file
    from core.perfmodel import build_comm_model, load_assumptions, load_links
    from runner.plan import PlanRequest

    if args.hardware:
        use_hardware_file(args.hardware)
    shape = build_shape(args)
    seq, batch = args.seq, args.global_batch
    if args.model == "gpt-125m":  # the campaign preset's fixed variables
        seq = seq or PRESETS["gpt-125m"].seq_length
        batch = batch or PRESETS["gpt-125m"].global_batch_size
    missing = [f for f, v in (("--seq", seq), ("--global-batch", batch)) if v is None]
    if missing:
        raise ConfigError(f"missing {' and '.join(missing)} (sequence length, sequences per step)")
    gpu = lookup_gpu(args.gpu)
    if gpu is None:
        raise ConfigError(f"--gpu {args.gpu!r}: unknown; choose one of {', '.join(gpu_keys())} (hardware.toml)")
    if "bf16" not in gpu.flops:
        raise ConfigError(f"--gpu {gpu.key}: hardware.toml has no dense bf16 peak for it")
    memory_gib = args.gpu_memory_gib or gpu.memory_gib
    if not memory_gib or memory_gib <= 0:
        raise ConfigError(f"--gpu {gpu.key}: hardware.toml has no single memory size (e.g. A100 40/80 GB); "
                          "pass --gpu-memory-gib")
    links = load_links()
    interconnect = args.interconnect or ("nvlink" if gpu.fabric else "pcie")
    intra_key = gpu.fabric if interconnect == "nvlink" else gpu.pcie
    if intra_key is None:
        raise ConfigError(f"--interconnect {interconnect}: {gpu.name} has no such link in hardware.toml; "
                          f"use --interconnect {'pcie' if interconnect == 'nvlink' else 'nvlink'}")
    gpus_per_node = args.gpus_per_node or min(args.gpus, 8)
    assumptions = load_assumptions()
    rows = []
    if args.commbench:
        from ingest.io import load_commbench

        rows = [r for r in load_commbench(args.commbench) if r.get("device") == "cuda"]
        if not rows:
            raise ConfigError(f"--commbench {args.commbench}: no GPU (NCCL) rows; a CPU/gloo table cannot price GPU "
                              "collectives")
    comm = build_comm_model(rows, intra=links[intra_key], inter=links[INTER_NODE[args.inter_node]],
                            gpus_per_node=gpus_per_node)
    efficiency = {}
    default_eff, default_source = assumptions.compute_efficiency, f"perfmodel.toml: {assumptions.compute_source}"
    if args.calibration:
        from runner.calibrate import calibrate_campaign

        efficiency = dict(calibrate_campaign(args.calibration))
    if args.compute_efficiency is not None:
        if not 0 < args.compute_efficiency <= 1:
            raise ConfigError(f"--compute-efficiency {args.compute_efficiency}: must be in (0, 1]")
        default_eff, default_source, efficiency = args.compute_efficiency, "--compute-efficiency", {}
    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise ConfigError(f"--mfu {args.mfu}: must be in (0, 1]")
    if args.top < 1:
        raise ConfigError(f"--top {args.top}: must be >= 1")
    return PlanRequest(
        shape=shape, seq_length=seq, global_batch_size=batch, num_gpus=args.gpus, gpus_per_node=gpus_per_node,
        gpu_key=gpu.key, gpu_name=gpu.name, peak_flops=gpu.flops["bf16"], peak_source=gpu.source,
        memory_gib=memory_gib, memory_usable_fraction=assumptions.memory_usable_fraction, comm=comm,
        default_efficiency=default_eff, default_efficiency_source=default_source, efficiency=efficiency,
        tp_degree=args.tp, pp_degree=args.pp, cp_degree=args.cp, ep_degree=args.ep, uneven_pp=args.uneven_pp,
        num_tokens=args.tokens, mfu=args.mfu)


# The largest value each integer flag may take: the model's from core.formulas.SHAPE_MAX, a
# million GPUs (16k trained 405B); small enough that the layout search (divisors of layers,
# batch and GPUs) answers in seconds.
INT_FLAG_MAX = {**{flag: SHAPE_MAX[field] for flag, field in SHAPE_FLAGS.items()}, "seq": MAX_SEQ_LENGTH,
                "global_batch": MAX_GLOBAL_BATCH_SIZE, "gpus": 1 << 20, "gpus_per_node": 1024, "tp": 1 << 20,
                "pp": SHAPE_MAX["num_layers"], "cp": 1 << 20, "ep": SHAPE_MAX["num_experts"], "top": 10_000}
# float flags: (lowest, highest) allowed, both inclusive; NaN and infinities never
FLOAT_FLAG_RANGE = {"tokens": (1.0, 1e18), "gpu_memory_gib": (1e-3, 1e6)}


def check_plan_args(args: argparse.Namespace) -> None:
    """Every numeric flag within its range (>= 1 and <= INT_FLAG_MAX; FLOAT_FLAG_RANGE, finite).
    ConfigError listing every flag out of range, one per line."""
    import math

    problems = []
    for flag, most in INT_FLAG_MAX.items():
        value = getattr(args, flag, None)
        if value is not None and not 1 <= value <= most:
            problems.append(f"--{flag.replace('_', '-')} {value}: must be in 1..{most}")
    for flag, (low, high) in FLOAT_FLAG_RANGE.items():
        value = getattr(args, flag, None)
        if value is not None and not (math.isfinite(value) and low <= value <= high):
            problems.append(f"--{flag.replace('_', '-')} {value}: must be a number in {low:g}..{high:g}")
    if problems:
        raise ConfigError("\n".join(problems))


def cmd_plan(args: argparse.Namespace) -> int:
    from core.atomic import write_json_atomic
    from runner.plan import NoFitError, build_plan, plan_to_dict, render_plan_text

    check_plan_args(args)
    req = build_request(args)
    plan = build_plan(req, top=args.top)
    print(render_plan_text(plan), end="")
    if not plan.layouts:  # why and what would fit, once (on stderr); exit 2 and no plan file: nothing to plan from
        raise NoFitError("\n".join(plan.advice))
    out = args.out or Path("runs") / f"plan-{req.shape.name.split()[0]}-{req.num_gpus}gpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out, json.loads(json.dumps(plan_to_dict(plan), default=str)))
    print(f"wrote {out}")
    return 0
