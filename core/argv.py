"""argparse helpers the three command lines share. Deliberately no options or commands here."""
from __future__ import annotations

import argparse


def parse_args(parser: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
    """``parser.parse_args``, except that an argument a subcommand does not know is reported with that
    subcommand's usage (``runner all --dry-rn`` prints ``usage: runner all ...``), not the top level's.
    Exits 2 through argparse on any mistake."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        command = getattr(args, subparsers[0].dest, None) if subparsers else None
        (subparsers[0].choices[command] if command else parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args
