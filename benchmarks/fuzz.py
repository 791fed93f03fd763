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
CLI level (``--cli-inputs``): the same campaign (profiler traces left out, for speed) mutated
as a user or a crash would leave it (NaN/Infinity/negative values, duplicated, out-of-order and
truncated metric rows, symlinks and FIFOs in place of files, absolute and ``..`` run names,
deep JSON, plus the JSON mutations above), then ``runner status``, ``ingest``, ``report
build --format md`` and ``runner all --resume --dry-run`` (what a resume would keep and run;
nothing launched) called through their ``main`` in-process, each under a time limit. Counted:
tracebacks (an exception out of ``main`` or an "internal error" line), hangs (over the limit),
impossible numbers in the note (a negative, infinite or NaN number in a table cell), and reads
or writes outside the campaign (a canary text from a planted outside file in any output, or a
new file outside the campaign and --out dirs). A real ``runner all --resume`` is not in it:
on a mutated campaign it would launch real runs; its dry run reads the same files.
Results (counts, failures with a reproducer seed) go to benchmarks/results/fuzz.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.errors import ToolError  # noqa: E402
from ingest.io import load_campaign  # noqa: E402
from ingest.parsers.dispatch import PARSED_KINDS, parse_text  # noqa: E402
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


CANARY = "CANARY-outside-the-campaign-7f3a"
IMPOSSIBLE_CELL = re.compile(r"\|\s*(?:[-−]\s*\d|(?:inf|nan|infinity)\b)", re.IGNORECASE)


def _mutate_campaign(work: Path, outside: Path, rng: random.Random) -> str:
    """One user-level mutation of campaign ``work`` (see the module docstring). -> its name."""
    runs = sorted(p.parent for p in work.iterdir() if p.is_dir() and not p.is_symlink())
    run = rng.choice(runs)
    metrics = run / "metrics" / "rank0.jsonl"
    op = rng.randrange(12)
    if op <= 2 and metrics.is_file():  # impossible values in one row
        lines = metrics.read_text().splitlines()
        i = rng.randrange(len(lines))
        row = json.loads(lines[i])
        key = rng.choice(["step_time_s", "tokens", "step", "data_wait_s", "loss", "lr", "wall_time_s"])
        row[key] = rng.choice([float("nan"), float("inf"), float("-inf"), -1, -0.5, -10**9, 0])
        lines[i] = json.dumps(row)
        metrics.write_text("\n".join(lines) + "\n")
        return f"value:{key}"
    if op == 3 and metrics.is_file():  # duplicated block (two writers)
        lines = metrics.read_text().splitlines()
        i, j = sorted(rng.randrange(len(lines) + 1) for _ in range(2))
        metrics.write_text("\n".join(lines[:j] + lines[i:j] * rng.randint(1, 3) + lines[j:]) + "\n")
        return "duplicate-rows"
    if op == 4 and metrics.is_file():  # out of order, or one torn line in the middle
        lines = metrics.read_text().splitlines()
        if rng.random() < 0.5:
            rng.shuffle(lines)
        else:
            i = rng.randrange(len(lines))
            lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
        metrics.write_text("\n".join(lines) + "\n")
        return "order-or-torn"
    target = rng.choice([metrics, run / "status.json", run / "logs" / "rank0.log", run / "spec.json",
                         run / "run_info.json"])
    if op == 5:  # a symlink out of the campaign
        target.unlink(missing_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(outside / rng.choice(["secret.jsonl", "secret.json", "ddp"]), target)
        return f"symlink:{target.name}"
    if op == 6:  # a FIFO where a file should be
        target.unlink(missing_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(target)
        return f"fifo:{target.name}"
    if op in (7, 8) and (work / "campaign.json").is_file() and (run / "spec.json").is_file():  # names that are paths
        bad = rng.choice([str(outside / "ddp"), "../outside/ddp", "..", "/", "a/../../outside/ddp", "x\ny"])
        if op == 7:
            meta = json.loads((work / "campaign.json").read_text())
            meta["runs"][rng.randrange(len(meta["runs"]))] = bad
            (work / "campaign.json").write_text(json.dumps(meta))
            return "campaign-run-name"
        spec = json.loads((run / "spec.json").read_text())
        spec["name"] = bad
        (run / "spec.json").write_text(json.dumps(spec))
        return "spec-name"
    files = [p for p in work.rglob("*") if p.suffix in (".json", ".jsonl") and p.is_file() and not p.is_symlink()]
    return _mutate_json_file(rng.choice(files), rng) if files else "none"


def _metric_table(note: str) -> list[str]:
    """The rows of the note's metric table (section 4: run, status, steps, step time, tokens/s,
    MFU, memory, data wait...): every number there is a count, a time, a rate or a size, never
    negative, infinite or NaN. (Other tables hold signed numbers, e.g. prediction errors.)"""
    lines, rows, inside = note.splitlines(), [], False
    for ln in lines:
        if ln.startswith("| Run | Status |"):
            inside = True
            continue
        if inside and not ln.startswith("|"):
            break
        if inside and not ln.startswith("|-") and not ln.startswith("| -"):
            rows.append(ln)
    return rows


def _call(main_fn, argv: list[str], *, limit_s: int) -> tuple[str, str, str]:
    """main_fn(argv) in-process with stdout/stderr captured and a SIGALRM limit.
    -> (outcome: ok | error | traceback | hang, stdout, stderr)."""
    import contextlib
    import io
    import signal

    class Hang(BaseException):
        pass

    def on_alarm(signum, frame):  # noqa: ARG001
        raise Hang

    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main_fn(argv)
        outcome = "ok" if code in (0, None) else "error"
    except Hang:
        outcome = "hang"
    except SystemExit as e:
        outcome = "ok" if e.code in (0, None) else "error"
    except BaseException as e:  # noqa: BLE001 - the point is to find these
        err.write(f"Traceback: {type(e).__name__}: {e}")
        outcome = "traceback"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    if "internal error" in err.getvalue() or "Traceback" in err.getvalue():
        outcome = "traceback"
    return outcome, out.getvalue(), err.getvalue()


def fuzz_cli(n: int, rng: random.Random, *, limit_s: int = 30, on_progress=None, progress_every: int = 500) -> dict:
    """``n`` CLI-level inputs (module docstring): n // 4 mutated campaigns x 4 commands.
    on_progress(partial result) every ``progress_every`` inputs, so a long run leaves its counts."""
    from ingest.cli import main as ingest_main
    from report.cli import main as report_main
    from runner.cli import main as runner_main

    counts = {"inputs": 0, "ok": 0, "error": 0, "traceback": 0, "hang": 0, "impossible_number": 0,
              "outside_access": 0}
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = tmp / "base"
        shutil.copytree(CAMPAIGN, base, ignore=shutil.ignore_patterns("trace"))
        outside = tmp / "outside"
        (outside / "ddp" / "logs").mkdir(parents=True)
        (outside / "secret.jsonl").write_text(json.dumps({"step": 0, "run": CANARY}) + "\n" + CANARY + "\n")
        (outside / "secret.json").write_text(json.dumps({"status": "crash", "cause": CANARY}))
        (outside / "ddp" / "logs" / "rank0.log").write_text(CANARY + "\n")
        shutil.copy(base / "ddp" / "spec.json", outside / "ddp" / "spec.json")
        outside_before = sorted(p for p in outside.rglob("*"))
        work, out_dir, tables = tmp / "camp", tmp / "out", tmp / "tables"
        while counts["inputs"] < n:
            seed = rng.randrange(2**32)
            r = random.Random(seed)
            for d in (work, out_dir, tables):
                shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(base, work, symlinks=True)
            ops = []
            for _ in range(r.randint(1, 3)):
                try:
                    ops.append(_mutate_campaign(work, outside, r))
                except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError, OSError):  # an earlier mutation broke it
                    ops.append("skipped")
            for name, fn, argv in (("runner status", runner_main, ["status", str(work)]),
                                   ("ingest", ingest_main, [str(work), "--out", str(tables)]),
                                   ("report build", report_main, ["build", str(work), "--out", str(out_dir),
                                                                  "--format", "md"]),
                                   ("runner all --resume --dry-run", runner_main,
                                    ["all", "--resume", str(work), "--dry-run"])):
                counts["inputs"] += 1
                outcome, stdout, stderr = _call(fn, argv, limit_s=limit_s)
                counts[outcome] += 1
                problems = [] if outcome in ("ok", "error") else [outcome]
                note = out_dir / "note.md"
                text = stdout + stderr + (note.read_text(errors="replace") if name == "report build"
                                          and note.is_file() else "")
                if name == "report build" and note.is_file():
                    if any(IMPOSSIBLE_CELL.search(ln) for ln in _metric_table(note.read_text(errors="replace"))):
                        counts["impossible_number"] += 1
                        problems.append("impossible number in a table cell")
                if CANARY in text or sorted(outside.rglob("*")) != outside_before or \
                        set(tmp.iterdir()) - {base, outside, work, out_dir, tables}:
                    counts["outside_access"] += 1
                    problems.append("read or write outside the campaign")
                if problems:
                    failures.append({"seed": seed, "command": name, "ops": ops, "problems": problems,
                                     "stderr": stderr[-300:]})
            if on_progress is not None and counts["inputs"] // progress_every > (counts["inputs"] - 4) // progress_every:
                on_progress({**counts, "failures": failures[:20], "complete": False})
    return {**counts, "failures": failures[:20], "complete": True}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parser-inputs", type=int, default=10_000)
    parser.add_argument("--report-inputs", type=int, default=10_000)
    parser.add_argument("--cli-inputs", type=int, default=0, help="CLI-level inputs (0: none)")
    parser.add_argument("--only-cli", action="store_true",
                        help="run only the CLI level and update its entry in --out, keeping the others")
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz.json")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    if args.only_cli:
        t0 = time.perf_counter()
        result = json.loads(args.out.read_text()) if args.out.is_file() else {"seed": args.seed}

        def record(cli: dict) -> None:
            result["cli"] = {"seed": args.seed, "requested": args.cli_inputs, **cli}
            result.setdefault("seconds", {})["cli"] = round(time.perf_counter() - t0, 1)
            args.out.write_text(json.dumps(result, indent=2) + "\n")

        record(fuzz_cli(args.cli_inputs, rng, on_progress=record))
        cli = result["cli"]
        print(json.dumps({k: v for k, v in cli.items() if k != "failures"}))
        return 1 if any(cli[k] for k in ("traceback", "hang", "impossible_number", "outside_access")) else 0
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
