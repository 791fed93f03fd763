"""`ingest CAMPAIGN_DIR [--out DIR]`: write runs.parquet / steps.parquet and print a summary.

Exit codes: 0 ok, 2 user error (one line ``ingest: error: ...`` on stderr, never a traceback).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ingest.errors import ToolError
from ingest.io import load_campaign, write_tables


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ingest", description="Normalize a campaign directory into Parquet tables.")
    parser.add_argument("campaign_dir", metavar="CAMPAIGN_DIR", help="directory written by `runner all`")
    parser.add_argument("--out", metavar="DIR", help="output directory (default: CAMPAIGN_DIR/tables)")
    return parser


def run(args: argparse.Namespace) -> int:
    campaign = load_campaign(args.campaign_dir)
    out_dir = Path(args.out) if args.out else Path(args.campaign_dir) / "tables"
    paths = write_tables(campaign, out_dir)
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


if __name__ == "__main__":
    sys.exit(main())
