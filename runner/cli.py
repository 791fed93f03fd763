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
import signal
import socket
import sys
from pathlib import Path

from ingest.errors import ToolError
from ingest.schema import SCHEMA_VERSION, run_spec_from_dict, to_dict
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
    from runner.env import collect_env_vars
    from runner.launch import build_command, build_run_env

    print(f"campaign {campaign.name}: preset {campaign.preset}, device {campaign.device}, "
          f"global batch {campaign.fixed.global_batch_size} x seq {campaign.fixed.model.seq_length}, "
          f"{campaign.fixed.steps} steps, dtype {campaign.fixed.dtype}")
    for spec in campaign.runs:
        print(f"- {spec.name}: strategy={spec.strategy} engine={spec.engine} world_size={spec.world_size} "
              f"tp={spec.tp_degree} pp={spec.pp_degree} dp={spec.dp_degree} "
              f"micro_batch_size={spec.micro_batch_size} num_microbatches={spec.num_microbatches}"
              + (f" options={dict(spec.options)}" if spec.options else ""))
        run_dir = out / spec.name
        added = {k: v for k, v in collect_env_vars(build_run_env(spec, run_dir=run_dir, base={})).items()}
        added["PYTHONUNBUFFERED"] = "1"
        print("    " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(added.items())) + " "
              + shlex.join(build_command(spec, run_dir=run_dir, master_port=29500)))
    print("(the master port is a free port picked at launch; runner.train reads <run-dir>/spec.json, "
          "which `runner all` writes before launching)")


FINAL_STATUSES = {"ok", "oom", "crash", "hang", "timeout", "skipped"}  # "interrupted" is re-run by --resume


def cmd_all(args: argparse.Namespace) -> int:
    if args.resume:
        return resume_campaign(args.resume)
    if args.gpus is not None and not args.dry_run:
        raise ToolError("--gpus only applies to --dry-run (a real campaign uses the GPUs it finds)")
    num_gpus = count_gpus() if args.gpus is None else args.gpus
    matrix_path = args.matrix or default_matrix(num_gpus)
    campaign = resolve_matrix(load_matrix(matrix_path), source=str(matrix_path), num_gpus=num_gpus,
                              overrides={"preset": args.preset, "steps": args.steps})
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or Path("runs") / f"{campaign.name}-{stamp}"
    if args.dry_run:
        _print_dry_run(campaign, out)
        return 0
    from runner.env import collect_env
    from runner.launch import write_json_atomic

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ToolError(f"{out}: output path exists and is not an empty directory; choose another --out "
                        "(or --resume it)")
    out.mkdir(parents=True, exist_ok=True)
    launch_command = list(sys.orig_argv)
    env = collect_env(launch_command=launch_command, data_dir=out)
    # what the ranks actually run with (NCCL_DEBUG, flight recorder, OMP threads), not the runner's own env
    from runner.env import collect_env_vars
    from runner.launch import build_run_env

    env["env_vars"] = collect_env_vars(build_run_env(campaign.runs[0], run_dir=out / "<run>"))
    write_json_atomic(out / "env.json", env)
    supervision = {"run_timeout_s": campaign.run_timeout_s, "stall_timeout_s": campaign.stall_timeout_s,
                   "startup_timeout_s": campaign.startup_timeout_s}
    for spec in campaign.runs:  # every spec up front, so --resume knows the whole campaign
        (out / spec.name).mkdir()
        write_json_atomic(out / spec.name / "spec.json", to_dict(spec))
    write_json_atomic(out / "campaign.json", {
        "schema_version": SCHEMA_VERSION, "name": campaign.name,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "tool_version": __version__, "tool_git_commit": env["tool_git_commit"], "matrix_path": str(matrix_path),
        "launch_command": launch_command, "device": campaign.device, "supervision": supervision,
        "fixed": to_dict(campaign.fixed), "runs": [s.name for s in campaign.runs],
    })
    print(f"campaign {campaign.name} -> {out} ({len(campaign.runs)} runs, preset {campaign.preset})", flush=True)
    return run_campaign(out, list(campaign.runs), supervision)


def resume_campaign(out: Path) -> int:
    """Re-run the runs of an existing campaign that have no final status (never started,
    interrupted, or cut off with the runner). Earlier partial artifacts move to attempt-<n>/."""
    from runner.launch import load_json

    meta = load_json(out / "campaign.json")
    specs = [run_spec_from_dict(load_json(out / name / "spec.json")) for name in meta["runs"]]
    print(f"resuming campaign {meta['name']} in {out}", flush=True)
    return run_campaign(out, specs, meta["supervision"])


def run_campaign(out: Path, specs: list, supervision: dict) -> int:
    from runner.launch import Watchdog, archive_attempt, load_json, run_one

    statuses = []
    for i, spec in enumerate(specs, 1):
        run_dir = out / spec.name
        status_path = run_dir / "status.json"
        if status_path.exists() and load_json(status_path).get("status") in FINAL_STATUSES:
            statuses.append(load_json(status_path)["status"])
            print(f"[{i}/{len(specs)}] {spec.name}: already {statuses[-1]}, kept", flush=True)
            continue
        archive_attempt(run_dir)
        print(f"[{i}/{len(specs)}] {spec.name}: {spec.strategy}/{spec.engine} on {spec.world_size} "
              f"process(es) ...", flush=True)
        watchdog = Watchdog(deadline_s=supervision["run_timeout_s"], stall_timeout_s=supervision["stall_timeout_s"],
                            startup_timeout_s=supervision["startup_timeout_s"])
        status = run_one(spec, run_dir=run_dir, watchdog=watchdog, master_port=_free_port())
        print(f"    {status.status} in {status.duration_s:.1f} s" + (f": {status.cause}" if status.cause else ""),
              flush=True)
        statuses.append(status.status)
    print(f"done ({statuses.count('ok')}/{len(statuses)} runs ok): report build {out}")
    return 0 if "ok" in statuses else 1  # a campaign where nothing ran is a failed job


def _sigterm_to_interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runner", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_all = sub.add_parser("all", help="run every run of the matrix, one torchrun each")
    p_all.add_argument("--matrix", type=Path, help="experiment matrix TOML (default: embedded, by GPUs found)")
    p_all.add_argument("--out", type=Path, help="campaign directory (default: runs/<name>-<timestamp>)")
    p_all.add_argument("--dry-run", action="store_true", help="print resolved runs and exact commands; run nothing")
    p_all.add_argument("--preset", help="model preset (overrides the matrix): gpt-125m | tiny")
    p_all.add_argument("--steps", type=int, help="optimizer steps per run (overrides the matrix)")
    p_all.add_argument("--gpus", type=int, help="with --dry-run: resolve as if this many GPUs were present")
    p_all.add_argument("--resume", type=Path, metavar="CAMPAIGN",
                       help="finish an existing campaign: run only the runs without a final status")
    p_all.set_defaults(func=cmd_all)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    signal.signal(signal.SIGHUP, _sigterm_to_interrupt)
    try:
        return args.func(args)
    except ToolError as e:
        for line in str(e).splitlines():
            print(f"runner: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("runner: interrupted; the current run was stopped and marked 'interrupted' "
              "(finish with: runner all --resume CAMPAIGN)", file=sys.stderr)
        return 130
    except OSError as e:  # full disk, permissions: what was written before stays intact
        print(f"runner: error: {e.filename or ''}: {e.strerror or e}; completed runs are intact", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
