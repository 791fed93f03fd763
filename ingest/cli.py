"""`ingest CAMPAIGN_DIR [--out DIR]`: write runs.parquet / steps.parquet, section 5's trace_*.parquet
(ingest.io.write_trace_tables) and commbench.parquet, and print a summary.

`ingest COMMBENCH_DIR [--out DIR]`: `runner commbench` results -> commbench.parquet.

`ingest PATH... [--out DIR] [--strict]`: third-party artifacts (default out: runs/NAME/tables) (NCCL/Megatron/DeepSpeed/
torchtitan logs, env dumps, failure reports; files or folders of them, kinds detected by
content) -> steps/comm_topology/collectives/events/env/... Parquet tables (ingest.thirdparty).
A single directory holding campaign.json (or runs.parquet) is a campaign, exactly as before.
--strict: exit 1 listing file:line of every unparsed line (first 20 per file). --jobs N:
worker processes to parse the files with, one file per process at a time (default: min(files,
CPUs); 1: this process only).

Exit codes: 0 ok, 2 user error (one line ``ingest: error: ...`` on stderr, never a traceback).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from core.errors import ConfigError, ToolError
from ingest.io import (
    load_campaign, load_commbench, load_trace_tables, write_commbench_table, write_tables, write_trace_tables,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ingest", description="Normalize a campaign directory into Parquet tables.")
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="campaign directory written by `runner all`, or third-party log files / folders")
    parser.add_argument("--out", metavar="DIR", help="output directory (default: CAMPAIGN_DIR/tables for a campaign; "
                        "runs/NAME/tables for third-party logs, NAME the first path's name: never inside the input)")
    parser.add_argument("--model", metavar="K=V,...", default="",
                        help="third-party logs: model shape and run facts the log does not print "
                             "(num_layers, hidden_size, num_heads, ffn_hidden_size, seq_length, vocab_size, "
                             "global_batch_size, world_size, tp_degree, pp_degree, micro_batch_size, dtype, gpu_name, "
                             "position_embedding); with them runs.parquet is written for `report build`")
    parser.add_argument("--strict", action="store_true", help="third-party files: exit 1 if any line was not parsed, listing file:line")
    parser.add_argument("--jobs", type=int, metavar="N", help="third-party files: worker processes, each parsing whole "
                        "files (default: min(files, CPUs); 1: this process only)")
    return parser


def _is_campaign(paths: list[str]) -> bool:
    if len(paths) != 1 or not Path(paths[0]).is_dir():
        return False
    root = Path(paths[0])
    return (root / "campaign.json").is_file() or (root / "runs.parquet").is_file() or not any(
        f.is_file() for f in root.rglob("*"))


def default_thirdparty_out(first: Path) -> Path:
    """runs/NAME/tables under the current directory, NAME the first input's folder or file stem
    (the third-party campaign's name, from the out dir's parent)."""
    name = first.resolve().name if first.is_dir() else first.stem
    return Path("runs") / (name or "thirdparty") / "tables"


def run_thirdparty(args: argparse.Namespace) -> int:
    from ingest import thirdparty

    if args.jobs is not None and args.jobs < 1:
        raise ConfigError(f"--jobs: must be at least 1, got {args.jobs}")
    files = thirdparty.ingest_files(thirdparty.find_artifacts(args.paths), max_workers=args.jobs)
    first = Path(args.paths[0])
    # third-party logs are someone else's folder (often read-only, or a repository): write under runs/
    out_dir = Path(args.out) if args.out else default_thirdparty_out(first)
    tables = thirdparty.build_tables(files)
    model = thirdparty.parse_model_flags(args.model)
    from ingest.jobs import compute_jobs

    jobs = compute_jobs(tables, model=model)
    tables.update(thirdparty.compute_trace_attribution(files, jobs))
    paths, notes = [], []
    try:
        campaign = thirdparty.build_thirdparty_campaign(files, name=out_dir.resolve().parent.name, model=model)
    except ToolError as e:
        campaign = None
        notes.append(f"no runs table for `report build`: {e}")
    # the logs' failure is the run's status (as `report build LOGS` says it): the one job, or the one with steps
    train = jobs if len(jobs) == 1 else [j for j in jobs if j.has_steps]
    if campaign is not None and len(train) == 1:
        campaign = thirdparty.apply_job_status(campaign, train[0])
    if campaign is not None:
        paths += write_tables(thirdparty.merge_campaign_steps(campaign, tables), out_dir)
        tables.pop("steps", None)
    paths += thirdparty.write_thirdparty_tables(tables, out_dir)
    for f in files:
        print(thirdparty.summary_line(f))
        for w in f.result.warnings:
            print(f"  warning: {w}")
    for note in notes:
        print(f"note: {note}")
    for path in paths:
        print(f"wrote {path}")
    if args.strict:
        problems = thirdparty.strict_problems(files)
        if problems:
            print("ingest: error: --strict: unparsed content:", file=sys.stderr)
            for p in problems:
                print(f"  {p}", file=sys.stderr)
            return 1
    return 0


def check_tables_out(out: Path) -> None:
    """``--out`` must be new, empty, or a tables folder (only ``*.parquet`` files, as ingest writes):
    tables never land among a stranger's files. Raises ConfigError naming the folder otherwise."""
    if not os.path.lexists(out):
        return
    if not out.is_dir() or out.is_symlink():
        raise ConfigError(f"{out}: --out exists and is not a folder; choose a new or empty folder")
    others = sorted(p.name for p in out.iterdir() if not (p.is_file() and p.suffix == ".parquet"))
    if others:
        raise ConfigError(f"{out}: --out holds files that are not tables ({', '.join(others[:3])}"
                          f"{', ...' if len(others) > 3 else ''}); choose a new or empty folder")


def run(args: argparse.Namespace) -> int:
    missing = [p for p in args.paths if not os.path.lexists(p)]
    if missing:
        raise ConfigError("; ".join(f"{p}: no such file or directory" for p in missing)
                          + "; pass a campaign directory written by `runner all`, or log files / folders")
    if args.out:
        check_tables_out(Path(args.out))
    if len(args.paths) == 1 and (Path(args.paths[0]) / "commbench.json").is_file():  # `runner commbench --out DIR`
        rows = load_commbench(args.paths[0])
        print(f"commbench: {len(rows)} rows ({', '.join(sorted({r['op'] for r in rows}))})")
        print(f"wrote {write_commbench_table(rows, Path(args.out) if args.out else Path(args.paths[0]))}")
        return 0
    if not _is_campaign(args.paths):
        return run_thirdparty(args)
    args.campaign_dir = args.paths[0]
    campaign = load_campaign(args.campaign_dir)
    out_dir = Path(args.out) if args.out else Path(args.campaign_dir) / "tables"
    paths = write_tables(campaign, out_dir)
    trace_tables = load_trace_tables(campaign)  # section 5's tables, so `report build OUT` needs no trace
    if trace_tables is not None:
        paths += write_trace_tables(trace_tables, out_dir)
    bench = Path(args.campaign_dir) / "commbench"
    if (bench / "commbench.json").is_file():
        paths.append(write_commbench_table(load_commbench(bench), out_dir))
    print(f"campaign {campaign.name}: {len(campaign.runs)} runs, {len(campaign.steps)} step rows")
    for run in campaign.runs.to_dict("records"):
        status = run.get("status") if isinstance(run.get("status"), str) else "no status.json"
        print(f"  {run['run']:<24} {status:<14} {run['num_metric_files']} metric files, {run['num_metric_rows']} rows")
    for problem in campaign.problems:
        print(f"  caveat: {problem}")
    for path in paths:
        print(f"wrote {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except ToolError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # e.g. permission denied, disk full: still one line, no traceback
        print(f"{parser.prog}: error: {e.filename or ''}: {e.strerror or e}; check the path and permissions", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - last resort: a bug must still end in one line, not a traceback
        print(f"{parser.prog}: error: internal error {type(e).__name__}: {' '.join(str(e).split())} (please report)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
