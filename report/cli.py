"""`report build CAMPAIGN_DIR [--out DIR] [--format md,html,pdf] [--lang en|zh] [--hardware FILE]` and
`report diff OLD NEW [--out DIR] [--threshold 0.05] [--format md,html,pdf] [--hardware FILE]`.

CAMPAIGN_DIR (and OLD, NEW) is a campaign directory written by `runner all`, a tables
directory written by `ingest` or a folder of third-party logs. Exit codes: 0 ok, 2 user error (one line ``report: error: ...`` on stderr, never
a traceback).
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from core.errors import NoDataError, ToolError
from report import FORMATS
from report.i18n import DEFAULT_LANGUAGE, available_languages


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="report", description="Render the engineering note of a campaign.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    build = sub.add_parser("build", help="write note.md / note.html / note.pdf")
    build.add_argument("campaign_dir", metavar="CAMPAIGN_DIR", help="campaign dir (`runner all`) or tables dir (`ingest`)")
    build.add_argument("--out", metavar="DIR", help="output directory (default: CAMPAIGN_DIR/report; for a committed "
                       "example of the tool's checkout, runs/NAME/report in the current directory)")
    build.add_argument("--format", default=None, metavar="FMTS",
                       help=f"comma-separated subset of {','.join(FORMATS)} (default: all; without the PDF's "
                            "system libraries the default writes md and html and says how to get the PDF)")
    build.add_argument("--lang", default=DEFAULT_LANGUAGE, choices=available_languages(),
                       help=f"language of the note's text, numbers and dates (default: {DEFAULT_LANGUAGE})")
    build.add_argument("--model", metavar="KEY=VALUE,...", default=None,
                       help="for a folder of logs: model shape and layout the logs do not print "
                            "(num_layers=..,hidden_size=..,seq_length=..,world_size=..); cited as --model in the note")
    hardware_help = "your GPUs and links ([gpu.<id>], [link.<id>] as in hardware.toml), merged over the shipped table"
    build.add_argument("--hardware", metavar="FILE", help=hardware_help)
    diff = sub.add_parser("diff", help="compare two campaigns: diff.md / diff.html / diff.pdf + diff.json")
    diff.add_argument("old", metavar="OLD", help="the baseline campaign (campaign, tables or third-party dir)")
    diff.add_argument("new", metavar="NEW", help="the campaign compared with it")
    diff.add_argument("--out", metavar="DIR", help="output directory (default: runs/diff-OLD-vs-NEW in the current directory)")
    diff.add_argument("--threshold", type=float, default=0.05, metavar="REL",
                      help="relative change flagged as a regression: tokens/s down, step time or memory up (default 0.05)")
    diff.add_argument("--format", default=",".join(FORMATS), metavar="FMTS",
                      help=f"comma-separated subset of {','.join(FORMATS)} (default: all)")
    diff.add_argument("--hardware", metavar="FILE", help=hardware_help)
    return parser


_STOP = {"requested": False}  # set by a stop signal: what fails after it failed because of it


def _interrupt(signum, frame) -> None:
    _STOP["requested"] = True
    raise KeyboardInterrupt


def _interrupted(parser: argparse.ArgumentParser) -> int:
    print(f"{parser.prog}: interrupted; --out keeps what it held before (a note is swapped in whole at the end)",
          file=sys.stderr)
    return 130


def main(argv: list[str] | None = None) -> int:
    from core.argv import parse_args

    parser = build_parser()
    args = parse_args(parser, argv)
    on_main = threading.current_thread() is threading.main_thread()  # signal handlers live there only
    previous = signal.signal(signal.SIGTERM, _interrupt) if on_main else None  # stop as Ctrl-C does
    ctrl_c = on_main and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    previous_int = signal.signal(signal.SIGINT, _interrupt) if ctrl_c else None
    try:
        return _main(parser, args)
    finally:
        if on_main:
            signal.signal(signal.SIGTERM, previous)
        if ctrl_c:
            signal.signal(signal.SIGINT, previous_int)


def _main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    # the default asks for every format, the PDF where it can be made; --format pdf insists on it
    pdf_optional = args.command == "build" and args.format is None
    formats = [f.strip() for f in (",".join(FORMATS) if args.format is None else args.format).split(",") if f.strip()]
    notes: list[str] = []
    try:
        sources = [args.old, args.new] if args.command == "diff" else [args.campaign_dir]
        missing = [s for s in sources if not os.path.lexists(s)]
        if missing:  # said before the seconds of imports below
            raise NoDataError("; ".join(f"{s}: no such directory" for s in missing)
                              + "; pass a campaign directory written by `runner all`, a tables directory or a folder of logs")
        # here, not at import: pandas, matplotlib and the view-model (torch via runner.data) cost
        # seconds that `report --help` should not pay
        from report.render import build_diff_report, build_report

        if args.hardware:
            from core.hardware import use_hardware_file

            use_hardware_file(args.hardware)

        if args.command == "diff":
            paths = build_diff_report(args.old, args.new, out_dir=args.out, threshold=args.threshold, formats=formats)
        else:
            from ingest.thirdparty import parse_model_flags

            paths = build_report(args.campaign_dir, out_dir=args.out, formats=formats, lang=args.lang,
                                 warn=notes.append if pdf_optional else None,
                                 model=parse_model_flags(args.model) if args.model else None)
    except ToolError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return _interrupted(parser)
    except OSError as e:  # permission denied, disk full...: still one line, no traceback
        print(f"{parser.prog}: error: {e.filename or ''}: {e.strerror or e}; check the path and permissions", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - last resort: a bug must still end in one line, not a traceback
        if _STOP["requested"]:  # a stop that landed in a module's import surfaces as its ImportError
            return _interrupted(parser)
        print(f"{parser.prog}: error: internal error {type(e).__name__}: {' '.join(str(e).split())} (please report)", file=sys.stderr)
        return 2
    for path in paths:
        print(f"wrote {path}")
    for note in notes:
        print(f"{parser.prog}: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
