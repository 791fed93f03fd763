"""Golden tables of the parser fixtures: what ``ingest`` extracts from each, committed as JSON.

One file per fixture, ``tests/golden/<fixture path under tests/fixtures, '/' as '__'>.json``:
the detected kind, the line / unparsed counts, the unparsed line numbers, the warnings, and the
records per table in the order the parser gives them. The only thing scrubbed is ``source``
(the path the file was read from: it depends on where the checkout lives), written relative to
tests/fixtures. tests/test_parsers_golden.py compares ``ingest_file`` (and ``ingest_files`` on
the whole fixture set, in worker processes) with these.

Regenerate after a deliberate change to a parser, then read the diff line by line before
committing it (a golden that freezes a bug is worth nothing)::

    python -m tests.golden --update          # rewrite every golden
    python -m tests.golden --update NAME...  # only these fixtures (file names)
    python -m tests.golden                   # list fixtures whose output differs from its golden

Deliberately not here: the trace fixtures (tests/fixtures/traces: ingest.traces, not a line parser).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
FIXTURES = TESTS / "fixtures"
GOLDEN = TESTS / "golden"


def fixture_paths() -> list[Path]:
    """Every line-parser fixture: tests/fixtures/*.txt and tests/fixtures/real/*.txt, sorted."""
    return sorted(FIXTURES.glob("*.txt")) + sorted((FIXTURES / "real").glob("*.txt"))


def golden_path(fixture: Path) -> Path:
    return GOLDEN / (fixture.relative_to(FIXTURES).as_posix().replace("/", "__") + ".json")


def outcome(parsed, *, path: Path) -> dict:
    """A ParseResult (or an IngestedFile: its packed records) as the golden JSON object (``source``
    relative to tests/fixtures), JSON round-tripped so tuples compare as the lists the file holds."""
    name = path.relative_to(FIXTURES).as_posix()
    result = getattr(parsed, "result", parsed)
    records = parsed.records() if callable(getattr(parsed, "records", None)) else parsed.records
    tables: dict[str, list[dict]] = {}
    for rec in records:
        rec = dict(rec)
        if rec.get("source") == str(path):
            rec["source"] = name
        tables.setdefault(rec.pop("table"), []).append(rec)
    data = {"fixture": name, "kind": result.kind, "num_lines": result.num_lines, "num_unparsed_lines": result.unparsed,
            "unparsed_lines": list(result.unparsed_lines), "warnings": list(result.warnings),
            "num_records": {t: len(rs) for t, rs in tables.items()}, "tables": tables}
    return json.loads(json.dumps(data))


def ingest_outcome(path: Path) -> dict:
    """What ``ingest`` makes of one fixture file (``ingest.thirdparty.ingest_file``)."""
    from ingest.thirdparty import ingest_file
    return outcome(ingest_file(path), path=path)


def load_golden(path: Path) -> dict:
    return json.loads(golden_path(path).read_text(encoding="utf-8"))


def write_golden(path: Path, data: dict) -> Path:
    out = golden_path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.golden", description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite the goldens (default: only list differences)")
    parser.add_argument("names", nargs="*", help="fixture file names (default: all)")
    args = parser.parse_args(argv)
    paths = [p for p in fixture_paths() if not args.names or p.name in args.names]
    if args.names and len(paths) != len(set(args.names)):
        parser.error(f"unknown fixture(s): {sorted(set(args.names) - {p.name for p in paths})}")
    differ = 0
    for path in paths:
        got = ingest_outcome(path)
        if args.update:
            print(f"wrote {write_golden(path, got).relative_to(TESTS.parent)}")
        elif not golden_path(path).is_file() or load_golden(path) != got:
            differ += 1
            print(f"differs: {path.relative_to(FIXTURES)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
