"""Mutation fuzzing of every parser and of the report builder: no input may raise anything but
the tool's own ToolError.

    python benchmarks/fuzz.py [--parser-inputs N] [--report-inputs N] [--seed S] [--out FILE]

Parsers: each input is a real fixture (tests/fixtures/real) mutated by a random stack of
operations (truncation at any byte, byte flips, duplicated or dropped chunks, glued lines,
random launcher prefixes, binary noise, a huge line, non-UTF-8 bytes decoded with
replacement) and fed to ``parse_text`` once per parser kind. Report builder: a copy of the
committed H200 campaign with one of its JSON/JSONL files mutated (truncated, bytes flipped,
values replaced by other JSON types, deleted, replaced by binary, deeply nested JSON, int64
overflow), then ``load_campaign`` -> ``build_note`` -> ``render_markdown`` in-process.
Results (counts, failures with a reproducer seed) go to benchmarks/results/fuzz.json.
"""
from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.errors import ToolError  # noqa: E402
from ingest.io import load_campaign  # noqa: E402
from ingest.parsers import PARSED_KINDS, parse_text  # noqa: E402
from report.render import render_markdown  # noqa: E402
from report.view import build_note  # noqa: E402

FIXTURES = sorted((ROOT / "tests" / "fixtures" / "real").glob("*.txt"))
CAMPAIGN = ROOT / "examples" / "h200-1gpu"
PREFIXES = ["[rank3]:", "[1,3]<stdout>:", "[0] ", "trainer/0 [0]:", "[default3]:", "\x1b[31m", "      ",
            "2024-12-04T05:27:45.082Z\n"]


def mutate_text(data: bytes, rng: random.Random) -> str:
    """A random stack of 1-4 mutations of the bytes, decoded leniently."""
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        if op == 0 and data:
            data = data[: rng.randrange(len(data))]
        elif op == 1 and data:
            b = bytearray(data)
            for _ in range(rng.randint(1, 20)):
                b[rng.randrange(len(b))] = rng.randrange(256)
            data = bytes(b)
        elif op == 2 and data:
            i, j = sorted(rng.randrange(len(data)) for _ in range(2))
            data = data[:j] + data[i:j] * rng.randint(1, 5) + data[j:]
        elif op == 3:
            data = data.replace(b"\n", b"", rng.randint(1, 10))  # glued lines
        elif op == 4:
            lines = data.split(b"\n")
            data = b"\n".join(rng.choice(PREFIXES).encode() + ln for ln in lines)
        elif op == 5:
            data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 4096)))
        elif op == 6:
            data += b"\n" + b"x" * rng.choice((70_000, 1_200_000)) + b"\n"
        else:
            lines = data.split(b"\n")
            rng.shuffle(lines)
            data = b"\n".join(lines)
    return data.decode("utf-8", errors="replace")


def fuzz_parsers(n: int, rng: random.Random) -> dict:
    blobs = [p.read_bytes() for p in FIXTURES]
    failures, count = [], 0
    while count < n:
        seed = rng.randrange(2**32)
        text = mutate_text(rng.choice(blobs), random.Random(seed))
        for kind in (None, *PARSED_KINDS):
            count += 1
            try:
                parse_text(text, source="fuzz", kind=kind)
            except ToolError:
                pass
            except Exception as e:  # noqa: BLE001 - the point is to find these
                failures.append({"seed": seed, "kind": kind, "error": f"{type(e).__name__}: {e}"[:300],
                                 "where": traceback.format_exc().splitlines()[-3][:200]})
    return {"inputs": count, "uncaught": len(failures), "failures": failures[:20]}


JSON_REPLACEMENTS = [None, "x", -1, 2**70, 1e308, [], {}, [1, 2], {"a": {"b": {}}}, True, "nan?"]


def _mutate_json_file(path: Path, rng: random.Random) -> str:
    raw = path.read_bytes()
    op = rng.randrange(7)
    if op == 0:
        path.write_bytes(raw[: rng.randrange(max(1, len(raw)))])
        return "truncate"
    if op == 1:
        path.unlink()
        return "delete"
    if op == 2:
        path.write_bytes(bytes(rng.randrange(256) for _ in range(rng.randint(1, 2000))))
        return "binary"
    if op == 3:
        path.write_text("[" * 100_000 + "]" * 100_000)
        return "deep-nesting"
    lines = raw.decode("utf-8", errors="replace").splitlines()
    if not lines:
        return "empty"
    idx = rng.randrange(len(lines))
    try:
        obj = json.loads(lines[idx] if path.suffix == ".jsonl" else raw)
    except json.JSONDecodeError:
        return "unparseable-already"
    if isinstance(obj, dict) and obj:
        key = rng.choice(sorted(obj))
        if op == 4:
            obj[key] = rng.choice(JSON_REPLACEMENTS)
        elif op == 5:
            del obj[key]
        else:
            obj = rng.choice(JSON_REPLACEMENTS)
    text = json.dumps(obj)
    if path.suffix == ".jsonl":
        lines[idx] = text
        path.write_text("\n".join(lines) + "\n")
    else:
        path.write_text(text)
    return f"field:{op}"


def fuzz_report(n: int, rng: random.Random) -> dict:
    files = [p.relative_to(CAMPAIGN) for p in CAMPAIGN.rglob("*") if p.suffix in (".json", ".jsonl")]
    failures, outcomes = [], {"note": 0, "tool_error": 0}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "camp"
        shutil.copytree(CAMPAIGN, work)
        for _ in range(n):
            seed = rng.randrange(2**32)
            r = random.Random(seed)
            target = r.choice(files)
            original = (work / target).read_bytes()
            op = _mutate_json_file(work / target, r)
            try:
                render_markdown(build_note(load_campaign(work)))
                outcomes["note"] += 1
            except ToolError:
                outcomes["tool_error"] += 1
            except Exception as e:  # noqa: BLE001
                failures.append({"seed": seed, "file": str(target), "op": op,
                                 "error": f"{type(e).__name__}: {e}"[:300]})
            finally:
                (work / target).write_bytes(original)  # one mutation at a time
    return {"inputs": n, **outcomes, "uncaught": len(failures), "failures": failures[:20]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parser-inputs", type=int, default=10_000)
    parser.add_argument("--report-inputs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz.json")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    result = {"seed": args.seed, "parsers": fuzz_parsers(args.parser_inputs, rng)}
    t1 = time.perf_counter()
    result["report"] = fuzz_report(args.report_inputs, rng)
    result["seconds"] = {"parsers": round(t1 - t0, 1), "report": round(time.perf_counter() - t1, 1)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v if not isinstance(v, dict) else {kk: vv for kk, vv in v.items() if kk != "failures"}
                      for k, v in result.items()}))
    return 1 if result["parsers"]["uncaught"] or result["report"]["uncaught"] else 0


if __name__ == "__main__":
    sys.exit(main())
