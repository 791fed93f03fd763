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


def _call(main_fn, argv: list[str], *, limit_s: int, wall_limit_s: int | None = None) -> tuple[str, str, str]:
    """main_fn(argv) in-process with stdout/stderr captured, stopped after ``limit_s`` seconds of
    this process's CPU time (SIGPROF: the tool's own work, whatever else the machine runs) or
    ``wall_limit_s`` of wall time (SIGALRM: a blocked wait uses no CPU; default: limit_s).
    -> (outcome: ok | error | traceback | hang, stdout, stderr)."""
    import contextlib
    import io
    import signal

    class Hang(BaseException):
        pass

    def on_limit(signum, frame):  # noqa: ARG001
        raise Hang

    out, err = io.StringIO(), io.StringIO()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    old_alarm = signal.signal(signal.SIGALRM, on_limit)
    old_prof = signal.signal(signal.SIGPROF, on_limit)
    signal.setitimer(signal.ITIMER_PROF, limit_s)
    signal.alarm(wall_limit_s or limit_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main_fn(argv)
        outcome = "ok" if code in (0, None) else "error"
    except Hang:
        outcome = "hang"
        err.write(f"stopped after {time.process_time() - cpu0:.1f} s CPU, {time.perf_counter() - wall0:.1f} s wall")
    except SystemExit as e:
        outcome = "ok" if e.code in (0, None) else "error"
    except BaseException as e:  # noqa: BLE001 - the point is to find these
        err.write(f"Traceback: {type(e).__name__}: {e}")
        outcome = "traceback"
    finally:
        signal.alarm(0)
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGALRM, old_alarm)
        signal.signal(signal.SIGPROF, old_prof)
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


# --- hostile inputs (issue 33, item 4): special files, nesting, numbers, bombs, malformed text ---

MATRIX = (ROOT / "examples" / "matrices" / "1gpu.toml").read_text()
NUMBERS = ["0", "-1", "1e308", "-1e308", "5e-324", "9223372036854775807", "99999999999999", "1e999", "nan", "inf",
           "-inf", "1000000000", "0.0", '"x"', "[]", "{}", "true", "2e-9"]
NUMBER_FIELDS = ["world_size", "steps", "micro_batch_size", "global_batch_size", "seq_length", "num_layers",
                 "hidden_size", "warmup_steps", "tp_degree", "pp_degree", "run_timeout_s"]
PLAN_FLAGS = ["--layers", "--hidden", "--heads", "--ffn", "--vocab", "--seq", "--global-batch", "--gpus", "--tp",
              "--pp", "--tokens", "--mfu", "--gpu-memory-gib", "--top", "--moe-experts"]
# a caveat that names the file and line of a value it rejected ("impossible values (line 31: ...)", "rank0.jsonl:152:
# not a StepRow (... got float inf); line skipped")
QUOTING_CAVEAT = re.compile(r"impossible value|line skipped|row\(s\) dropped")
QUOTED_INPUT = re.compile(r"'[^'\n]*'")
IMPOSSIBLE_TEXT = re.compile(r"\d{25,}|\b\d+(?:\.\d+)?\s?[EZY] ?tokens/s|\binf(?:inity)?\b|\bnan\b", re.IGNORECASE)


def _special(path: Path, kind: str, rng: random.Random) -> str:
    """Make ``path`` a special file: fifo, symlink loop, dangling link, /dev/zero or /dev/null link, a directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        os.symlink(path.name, path)  # a link to itself
    elif kind == "loop2":
        os.symlink(path.name + ".b", path)
        os.symlink(path.name, path.parent / (path.name + ".b"))
    elif kind == "dangling":
        os.symlink(path.parent / "nowhere", path)
    elif kind == "zero":
        os.symlink("/dev/zero", path)
    elif kind == "null":
        os.symlink("/dev/null", path)
    else:
        path.mkdir()
    return kind


SPECIAL_KINDS = ("fifo", "loop", "loop2", "dangling", "zero", "null", "dir")


def _deep(kind: str, depth: int) -> str:
    if kind == "toml-array":
        return "[campaign]\nname = \"d\"\n[fixed]\nx = " + "[" * depth + "]" * depth + "\n"
    if kind == "toml-table":
        return "[campaign]\nname = \"d\"\n[fixed]\nx = " + "{a = " * depth + "1" + "}" * depth + "\n"
    if kind == "json-array":
        return "[" * depth + "]" * depth
    return '{"text": ' + '{"a": ' * depth + "1" + "}" * depth + "}"


def _bomb(path: Path, cache: dict, *, mib: int) -> None:
    """A gzip file of ``mib`` MiB of one repeated line (ratio ~1000:1), built once and copied."""
    import gzip

    key = ("bomb", mib)
    if key not in cache:
        src = cache["dir"] / f"bomb-{mib}.gz"
        with gzip.open(src, "wb", compresslevel=9) as f:
            block = (b"NCCL INFO " + b"A" * 1000 + b"\n") * 1024
            for _ in range(mib):
                f.write(block)
        cache[key] = src
    shutil.copy(cache[key], path)


def _mutate_toml(text: str, rng: random.Random) -> str:
    op = rng.randrange(5)
    if op == 0:
        return text[: rng.randrange(len(text))]
    if op == 1:
        b = bytearray(text.encode())
        for _ in range(rng.randint(1, 10)):
            b[rng.randrange(len(b))] = rng.choice(b'[]{}="\n#.,\\\x00\xff')
        return b.decode("utf-8", errors="replace")
    if op == 2:
        field = rng.choice(NUMBER_FIELDS)
        return text.replace("[[runs]]", f"[[runs]]\n{field} = {rng.choice(NUMBERS)}", 1)
    if op == 3:
        return text.replace("[campaign]", f"[campaign]\n{rng.choice(NUMBER_FIELDS)} = {rng.choice(NUMBERS)}", 1)
    return text + "".join(f'[[runs]]\nname = "r{i}"\nstrategy = "ddp"\n' for i in range(rng.choice((50, 2000))))


def _hostile_case(box: Path, rng: random.Random, cache: dict) -> tuple[str, str, list[str]]:
    """One hostile input in folder ``box``. -> (name, cli: runner | ingest | report, argv)."""
    inp, out = box / "in", box / "out"
    inp.mkdir(parents=True, exist_ok=True)
    op = rng.randrange(9)
    special = rng.choice(SPECIAL_KINDS)
    if op == 0:  # a matrix that is a special file
        _special(inp / "m.toml", special, rng)
        cmd = rng.choice([["all", "--matrix", str(inp / "m.toml"), "--dry-run", "--gpus", "1"],
                          ["slurm", "--nodes", "1", "--gpus-per-node", "1", "--matrix", str(inp / "m.toml"),
                           "--out", str(out / "c"), "--dry-run"]])
        return f"matrix:{special}", "runner", cmd
    if op == 1:  # a deeply nested or malformed or out-of-range matrix
        kind = rng.choice(["toml-array", "toml-table", "mutate", "mutate", "mutate"])
        text = _mutate_toml(MATRIX, rng) if kind == "mutate" else _deep(kind, rng.choice((100, 2000, 100_000)))
        (inp / "m.toml").write_text(text)
        cmd = rng.choice([["all", "--matrix", str(inp / "m.toml"), "--dry-run", "--gpus", str(rng.choice((0, 1, 8)))],
                          ["slurm", "--nodes", "2", "--gpus-per-node", "1", "--matrix", str(inp / "m.toml"),
                           "--out", str(out / "c"), "--dry-run"]])
        return f"matrix:{kind}", "runner", cmd
    if op == 2:  # planner inputs out of range
        argv = ["plan", "--model", rng.choice(["gpt-125m", "llama-7b", "nope"]), "--gpus", rng.choice(NUMBERS[:12]),
                "--out", str(out / "plan.json")]
        for _ in range(rng.randint(1, 3)):
            argv += [rng.choice(PLAN_FLAGS), rng.choice(NUMBERS[:12]).strip('"')]
        return "plan:numbers", "runner", argv
    if op == 3:  # prepare-data on a special file
        _special(inp / "d.jsonl", special, rng)
        return f"prepare-data:{special}", "runner", ["prepare-data", str(inp / "d.jsonl"), "--out", str(out / "ds"),
                                                    "--vocab-size", "300"]
    if op == 4:  # prepare-data on nested, malformed or long-line JSONL
        kind = rng.choice(["deep", "malformed", "long-line", "binary", "numbers"])
        if kind == "deep":
            text = _deep("json-object", rng.choice((100, 5000, 100_000))) + "\n"
        elif kind == "malformed":
            text = "".join(rng.choice(['{"text": "ok"}\n', '{"text": \n', '{"text": 1e999}\n', "[1,2]\n", '"x"\n',
                                       '{"text": null}\n', '{"text": "\\ud800"}\n', "\n"]) for _ in range(20))
        elif kind == "long-line":
            text = json.dumps({"text": "a b " * rng.choice((10_000, 500_000))}) + "\n"
        elif kind == "binary":
            text = bytes(rng.randrange(256) for _ in range(4000)).decode("latin-1")
        else:
            text = "".join(json.dumps({"text": rng.choice(NUMBERS)}) + "\n" for _ in range(10))
        (inp / "d.jsonl").write_text(text, encoding="utf-8", errors="surrogatepass")
        return f"prepare-data:{kind}", "runner", ["prepare-data", str(inp / "d.jsonl"), "--out", str(out / "ds"),
                                                 "--vocab-size", "300"]
    if op == 5:  # third-party ingest of special files and bombs
        name = rng.choice(["rank0.log", "trace.json", "profile.json.gz", "nccl.txt"])
        if rng.random() < 0.3:
            _bomb(inp / (name + ".gz" if not name.endswith(".gz") else name), cache, mib=rng.choice((64, 256)))
            what = "gzip-bomb"
        else:
            what = _special(inp / name, special, rng)
        return f"ingest:{what}", "ingest", [str(inp), "--out", str(out / "tables")]
    if op == 6:  # third-party ingest of malformed or nested JSON/JSONL and huge numbers in log lines
        blob = rng.choice(FIXTURE_BLOBS)
        kind = rng.choice(["mutated", "deep", "numbers"])
        if kind == "mutated":
            text = mutate_text(blob, rng)
        elif kind == "deep":
            text = _deep("json-array", rng.choice((500, 100_000)))
        else:
            text = re.sub(r"\d+(?:\.\d+)?", lambda m: rng.choice(NUMBERS[:12]), blob.decode("utf-8", "replace"),
                          count=200)
        (inp / rng.choice(["a.log", "trace.json", "metrics.jsonl"])).write_text(text)
        return f"ingest:{kind}", "ingest", [str(inp), "--out", str(out / "tables")]
    if op == 7:  # a campaign whose metrics carry huge or tiny numbers, or a special file: report build
        camp = box / "camp"
        shutil.copytree(cache["campaign"], camp, symlinks=True)
        metrics = camp / "ddp" / "metrics" / "rank0.jsonl"
        if rng.random() < 0.3:
            metrics.unlink()
            what = _special(metrics, special, rng)
        else:
            lines = metrics.read_text().splitlines()
            i = rng.randrange(len(lines))
            row = json.loads(lines[i])
            key = rng.choice(["step_time_s", "tokens", "mem_peak_allocated_gib", "loss", "wall_time_s", "step"])
            row[key] = rng.choice([2**63 - 1, 1e308, 5e-324, -5e-324, 10**30, 1e-30, float("inf")])
            lines[i] = json.dumps(row)
            metrics.write_text("\n".join(lines) + "\n")
            what = f"number:{key}"
        return f"report:{what}", "report", ["build", str(camp), "--out", str(out / "note"), "--format", "md"]
    camp = box / "camp"  # a campaign file nested or special, through runner status / resume dry run
    shutil.copytree(cache["campaign"], camp, symlinks=True)
    target = camp / rng.choice(["campaign.json", "env.json", "ddp/spec.json", "ddp/status.json"])
    target.unlink()
    if rng.random() < 0.5:
        target.write_text(_deep(rng.choice(["json-array", "json-object"]), rng.choice((500, 100_000))))
        what = "deep"
    else:
        what = _special(target, special, rng)
    cli, argv = rng.choice([("runner", ["status", str(camp)]), ("runner", ["all", "--resume", str(camp), "--dry-run"]),
                            ("report", ["build", str(camp), "--out", str(out / "note"), "--format", "md"]),
                            ("ingest", [str(camp), "--out", str(out / "tables")])])
    return f"{cli} {argv[0] if cli != 'ingest' else 'campaign'}:{target.name}:{what}", cli, argv


FIXTURE_BLOBS: list[bytes] = []


def hostile_seed(base: int, index: int) -> int:
    """The seed of hostile case ``index`` of a run seeded ``base``: any slice of the cases can be
    run alone and gives the cases a whole run gives."""
    return random.Random(f"{base}:{index}").randrange(2**32)


def fuzz_hostile(n: int, rng: random.Random, *, limit_s: int = 10, wall_limit_s: int = 300, seeds=None,
                 on_progress=None, progress_every: int = 500, keep_failures: int = 20) -> dict:
    """``n`` hostile inputs (special files, deep nesting, huge and tiny numbers, gzip bombs,
    malformed TOML/JSON/JSONL) through runner (all --dry-run, slurm --dry-run, plan,
    prepare-data, status, all --resume --dry-run), ingest and report build, in-process, each
    under ``limit_s`` of CPU time and ``wall_limit_s`` of wall time. Counted: tracebacks (an
    exception out of main, or 'internal error'), hangs (over a limit), escapes (a file written
    outside the case's out dir and its inputs) and impossible numbers in what was printed or
    written (25+ digit numbers, E/Z/Y tokens/s, inf, nan). seeds: the cases' seeds (default: n
    drawn from rng); a case the harness cannot build is counted under 'harness', not as an input.
    Failures: the first ``keep_failures`` of each problem kind, each with its seed."""
    from ingest.cli import main as ingest_main
    from report.cli import main as report_main
    from runner.cli import main as runner_main

    mains = {"runner": runner_main, "ingest": ingest_main, "report": report_main}
    if not FIXTURE_BLOBS:
        FIXTURE_BLOBS.extend(p.read_bytes()[:200_000] for p in FIXTURES)
    counts = {"inputs": 0, "ok": 0, "error": 0, "traceback": 0, "hang": 0, "escape": 0, "impossible_number": 0,
              "quoted_in_caveat": 0, "harness": 0}
    seeds = iter(seeds) if seeds is not None else (rng.randrange(2**32) for _ in iter(int, 1))
    num_kept: dict[str, int] = {}
    kinds: dict[str, int] = {}
    failures = []
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        cache: dict = {"campaign": tmp / "base", "dir": tmp}
        shutil.copytree(CAMPAIGN, tmp / "base", ignore=shutil.ignore_patterns("trace", "tables"))
        (tmp / "cases").mkdir()
        (tmp / "cwd").mkdir()
        os.chdir(tmp / "cwd")  # a relative default output (runs/...) would land here: an escape
        try:
            while counts["inputs"] < n:
                seed = next(seeds, None)
                if seed is None:
                    break
                box = tmp / "cases" / "box"
                shutil.rmtree(box, ignore_errors=True)
                box.mkdir()
                try:
                    name, cli, argv = _hostile_case(box, random.Random(seed), cache)
                except (OSError, ValueError, UnicodeError) as e:  # the harness could not build it: not counted
                    counts["harness"] += 1
                    if counts["harness"] <= keep_failures:
                        failures.append({"seed": seed, "harness": f"{type(e).__name__}: {e}"[:200]})
                    continue
                before = {p for p in box.rglob("*") if not p.is_relative_to(box / "out")}
                outside_before = sorted(p.name for p in tmp.iterdir()) + sorted(os.listdir(tmp / "cwd"))
                counts["inputs"] += 1
                kinds[name.split(":")[0]] = kinds.get(name.split(":")[0], 0) + 1
                outcome, stdout, stderr = _call(mains[cli], argv, limit_s=limit_s, wall_limit_s=wall_limit_s)
                counts[outcome] += 1
                problems = [] if outcome in ("ok", "error") else [outcome]
                after = {p for p in box.rglob("*") if not p.is_relative_to(box / "out")} if outcome != "hang" else before
                new = sorted(str(p.relative_to(box)) for p in after - before
                             if not p.is_relative_to(box / "camp") or p.name not in ("report", ".runner.lock"))
                new = [p for p in new if not p.startswith("camp/")]  # report build's own files inside the campaign
                if new or sorted(p.name for p in tmp.iterdir()) + sorted(os.listdir(tmp / "cwd")) != outside_before:
                    counts["escape"] += 1
                    problems.append(f"wrote outside --out: {new[:3]}")
                written = ""
                note = box / "out" / "note" / "note.md"
                if note.is_file() and not note.is_symlink():
                    written = note.read_text(errors="replace")
                # a caveat naming the dropped row quotes its value on purpose (file, line, value): counted apart
                # so does a warning quoting the input's text in '...' (a field name "number of nan#iterations")
                shown = "\n".join(QUOTED_INPUT.sub("''", ln) for ln in (stdout + "\n" + written).splitlines()
                                  if not QUOTING_CAVEAT.search(ln))
                if IMPOSSIBLE_TEXT.search(shown):
                    counts["impossible_number"] += 1
                    problems.append(f"impossible number: {IMPOSSIBLE_TEXT.search(shown).group(0)[:40]}")
                elif IMPOSSIBLE_TEXT.search(written + stdout):
                    counts["quoted_in_caveat"] += 1
                if problems:
                    kind = problems[0].split(":")[0]
                    num_kept[kind] = num_kept.get(kind, 0) + 1
                    if num_kept[kind] <= keep_failures:
                        failures.append({"seed": seed, "case": name, "argv": argv[:3], "problems": problems,
                                         "stderr": stderr[-300:]})
                if on_progress is not None and counts["inputs"] % progress_every == 0:
                    on_progress({**counts, "kinds": kinds, "failures": failures, "complete": False})
        finally:
            os.chdir(cwd)
    return {**counts, "kinds": kinds, "failures": failures, "complete": True}


# 10 s of the tool's own CPU; the wall limit only catches a blocked wait, and is wide because a
# run at nice 19 on a shared 2-core VM can wait minutes for the CPU its work needs
HOSTILE_LIMIT_S = {"cpu_s": 10, "wall_s": 300}
HOSTILE_PROBLEMS = ("traceback", "hang", "escape", "impossible_number")


def _merge_hostile(entry: dict) -> dict:
    """The hostile entry's totals from its slices: counts summed over complete slices; complete
    when they cover cases 0..requested-1."""
    done = sorted((tuple(map(int, k.split(":"))), v) for k, v in entry["slices"].items() if v.get("complete"))
    totals: dict = {}
    kinds: dict = {}
    failures = []
    covered = 0
    for (a, b), part in done:
        if a <= covered:
            covered = max(covered, b)
        for k, v in part.items():
            if isinstance(v, int) and not isinstance(v, bool):
                totals[k] = totals.get(k, 0) + v
        for k, v in part["kinds"].items():
            kinds[k] = kinds.get(k, 0) + v
        failures += part["failures"]
    keep = ("seed", "requested", "limit", "slices")
    return {**{k: entry[k] for k in keep}, **totals, "seconds": round(sum(p["seconds"] for _, p in done), 1),
            "cases_covered": covered, "complete": covered >= entry["requested"], "kinds": kinds, "failures": failures}


def _run_hostile(args) -> int:
    if args.case_seed is not None:
        part = fuzz_hostile(1, random.Random(), seeds=[args.case_seed], limit_s=HOSTILE_LIMIT_S["cpu_s"],
                            wall_limit_s=HOSTILE_LIMIT_S["wall_s"])
        print(json.dumps(part, indent=2))
        return 1 if any(part[k] for k in HOSTILE_PROBLEMS) else 0
    start, stop = map(int, (args.slice or f"0:{args.hostile_inputs}").split(":"))
    result = json.loads(args.out.read_text()) if args.out.is_file() else {"seed": args.seed}
    entry = result.get("hostile", {})
    if entry.get("seed") != args.seed or entry.get("requested") != args.hostile_inputs or "slices" not in entry:
        entry = {"seed": args.seed, "requested": args.hostile_inputs, "limit": HOSTILE_LIMIT_S, "slices": {}}
    key = f"{start}:{stop}"
    t0 = time.perf_counter()

    def record(part: dict) -> None:
        entry["slices"][key] = {**part, "seconds": round(time.perf_counter() - t0, 1)}
        result["hostile"] = _merge_hostile(entry)
        result.setdefault("seconds", {})["hostile"] = result["hostile"]["seconds"]
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    seeds = [hostile_seed(args.seed, i) for i in range(start, stop)]
    part = fuzz_hostile(len(seeds), random.Random(), seeds=seeds, limit_s=HOSTILE_LIMIT_S["cpu_s"],
                        wall_limit_s=HOSTILE_LIMIT_S["wall_s"], on_progress=record, progress_every=100)
    record(part)
    print(json.dumps({k: v for k, v in part.items() if k != "failures"}))
    return 1 if any(part[k] for k in HOSTILE_PROBLEMS) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parser-inputs", type=int, default=10_000)
    parser.add_argument("--report-inputs", type=int, default=10_000)
    parser.add_argument("--cli-inputs", type=int, default=0, help="CLI-level inputs (0: none)")
    parser.add_argument("--hostile-inputs", type=int, default=0,
                        help="hostile inputs (special files, nesting, numbers, bombs; 0: none)")
    parser.add_argument("--only-hostile", action="store_true",
                        help="run only the hostile inputs and update their entry in --out, keeping the others")
    parser.add_argument("--only-cli", action="store_true",
                        help="run only the CLI level and update its entry in --out, keeping the others")
    parser.add_argument("--slice", metavar="A:B", default=None,
                        help="with --only-hostile: run cases A..B-1 of --hostile-inputs and merge them into --out")
    parser.add_argument("--case-seed", type=int, default=None,
                        help="with --only-hostile: run the one hostile case of this seed (a failure's) and print it")
    parser.add_argument("--seed", type=int, default=20261129)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "fuzz.json")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()  # the hostile cases run in a folder of their own (os.chdir)
    rng = random.Random(args.seed)
    if args.only_hostile:
        return _run_hostile(args)
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
