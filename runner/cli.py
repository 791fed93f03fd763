"""`runner` command line.

    runner all [--matrix FILE] [--out DIR] [--dry-run] [--preset NAME] [--steps N]

Resolves the matrix (embedded default picked by the GPUs found), records the environment
and launches one torchrun per run, in order, into a campaign directory. User errors print
one line per problem and exit 2.
"""
from __future__ import annotations

import argparse
import datetime as dt
import shlex
import socket
import sys
from pathlib import Path

from ingest.errors import ToolError
from ingest.schema import SCHEMA_VERSION, to_dict
from runner import __version__
from runner.matrix import Campaign, load_matrix, resolve_matrix

MATRIX_DIR = Path(__file__).resolve().parent.parent / "examples" / "matrices"
DEFAULT_MATRICES = {0: "cpu.toml", 1: "1gpu.toml", 2: "2gpu.toml", 8: "8gpu.toml"}


def count_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_matrix(num_gpus: int) -> Path:
    if num_gpus not in DEFAULT_MATRICES:
        raise ToolError(f"no embedded matrix for {num_gpus} GPUs (have: {sorted(DEFAULT_MATRICES)}); pass --matrix FILE")
    return MATRIX_DIR / DEFAULT_MATRICES[num_gpus]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _print_dry_run(campaign: Campaign, out: Path) -> None:
    from runner.launch import build_command

    print(f"campaign {campaign.name}: preset {campaign.preset}, device {campaign.device}, "
          f"global batch {campaign.fixed.global_batch_size} x seq {campaign.fixed.model.seq_length}, "
          f"{campaign.fixed.steps} steps, dtype {campaign.fixed.dtype}")
    for spec in campaign.runs:
        print(f"- {spec.name}: strategy={spec.strategy} engine={spec.engine} world_size={spec.world_size} "
              f"tp={spec.tp_degree} pp={spec.pp_degree} dp={spec.dp_degree} "
              f"micro_batch_size={spec.micro_batch_size} num_microbatches={spec.num_microbatches}"
              + (f" options={dict(spec.options)}" if spec.options else ""))
        print("    " + shlex.join(build_command(spec, run_dir=out / spec.name, master_port=29500)))


def cmd_all(args: argparse.Namespace) -> int:
    num_gpus = count_gpus()
    matrix_path = args.matrix or default_matrix(num_gpus)
    campaign = resolve_matrix(load_matrix(matrix_path), source=str(matrix_path), num_gpus=num_gpus,
                              overrides={"preset": args.preset, "steps": args.steps})
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or Path("runs") / f"{campaign.name}-{stamp}"
    if args.dry_run:
        _print_dry_run(campaign, out)
        return 0
    from runner.env import collect_env
    from runner.launch import run_one, write_json_atomic

    if out.exists() and any(out.iterdir()):
        raise ToolError(f"{out}: output directory exists and is not empty; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    launch_command = list(sys.orig_argv)
    env = collect_env(launch_command=launch_command, data_dir=out)
    write_json_atomic(out / "env.json", env)
    write_json_atomic(out / "campaign.json", {
        "schema_version": SCHEMA_VERSION, "name": campaign.name,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "tool_version": __version__, "tool_git_commit": env["tool_git_commit"], "matrix_path": str(matrix_path),
        "launch_command": launch_command, "device": campaign.device, "run_timeout_s": campaign.run_timeout_s,
        "fixed": to_dict(campaign.fixed), "runs": [s.name for s in campaign.runs],
    })
    print(f"campaign {campaign.name} -> {out} ({len(campaign.runs)} runs, preset {campaign.preset})", flush=True)
    for i, spec in enumerate(campaign.runs, 1):
        run_dir = out / spec.name
        run_dir.mkdir()
        write_json_atomic(run_dir / "spec.json", to_dict(spec))
        print(f"[{i}/{len(campaign.runs)}] {spec.name}: {spec.strategy}/{spec.engine} on {spec.world_size} "
              f"process(es) ...", flush=True)
        status = run_one(spec, run_dir=run_dir, timeout_s=campaign.run_timeout_s, master_port=_free_port())
        print(f"    {status.status} in {status.duration_s:.1f} s" + (f": {status.cause}" if status.cause else ""),
              flush=True)
    print(f"done: report build {out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runner", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_all = sub.add_parser("all", help="run every run of the matrix, one torchrun each")
    p_all.add_argument("--matrix", type=Path, help="experiment matrix TOML (default: embedded, by GPUs found)")
    p_all.add_argument("--out", type=Path, help="campaign directory (default: runs/<name>-<timestamp>)")
    p_all.add_argument("--dry-run", action="store_true", help="print resolved runs and exact commands; run nothing")
    p_all.add_argument("--preset", help="model preset (overrides the matrix): gpt-125m | tiny")
    p_all.add_argument("--steps", type=int, help="optimizer steps per run (overrides the matrix)")
    p_all.set_defaults(func=cmd_all)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ToolError as e:
        for line in str(e).splitlines():
            print(f"runner: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("runner: interrupted; the current run was stopped and marked 'interrupted'", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
