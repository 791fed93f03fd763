"""Scorecard of ingest on real logs: the pasted fixtures (/work/shared/fixtures/real/ or
../shared/fixtures/real, tests/fixtures/real/, facts in benchmarks/real_logs_expected.toml) and the
corpus of real public artifacts (tests/corpus/<group>/*.txt, facts in tests/corpus/<group>/facts.toml),
each compared with the facts a reader takes from it (written from reading the file, not from the
tool's output).

Per file: right (every expected fact is in the tables, every kind it holds is found and no other,
and nothing is lost), partial (a kind it holds is found and nothing contradicts the file, but some
expected fact or kind is missing, another kind is claimed, or more lines are unparsed than the
file's noise explains), wrong (none of its kinds found, or a number that contradicts the file),
silent (no records and no warning: the file read as nothing). Writes benchmarks/results/real_logs.json.

    python benchmarks/real_logs.py [--corpus DIR ...] [--out benchmarks/results/real_logs.json]
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ingest.thirdparty import ingest_file  # noqa: E402

EXPECTED = ROOT / "benchmarks" / "real_logs_expected.toml"
FOLDERS = (ROOT.parent / "shared" / "fixtures" / "real", Path("/work/shared/fixtures/real"), ROOT / "tests" / "fixtures" / "real")
CORPUS = ROOT / "tests" / "corpus"
VERDICTS = ("right", "partial", "wrong", "silent")


def _same(a, b) -> bool:
    if isinstance(b, float) or isinstance(a, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-6)
        except (TypeError, ValueError):
            return False
    return str(a) == str(b)


def score_file(path: Path, want: dict) -> dict:
    """One file against its expectations -> {file, verdict, missing, contradicted, ...}."""
    f = ingest_file(path)
    r, recs = f.result, f.records()
    by_table: dict[str, list[dict]] = {}
    for rec in recs:
        by_table.setdefault(rec["table"], []).append(rec)
    missing, contradicted = [], []
    found = set(r.kinds) | {r.kind}
    if "kinds" in want:  # every kind the file holds, and no other
        wanted = set(want["kinds"])
        if not wanted & found:
            contradicted.append(f"kinds {sorted(set(r.kinds) or {r.kind})}, expected {sorted(wanted)}")
        else:
            missing += [f"kind {k}" for k in sorted(wanted - found)]
            missing += [f"kind {k} claimed" for k in r.kinds if k not in wanted]
    elif want["kind"] not in found:
        contradicted.append(f"kind {r.kind}, expected {want['kind']}")
    for table, n in want.get("min_records", {}).items():
        if len(by_table.get(table, [])) < n:
            missing.append(f"{table}: {len(by_table.get(table, []))} records, expected at least {n}")
    seen = {x.get("transport") for x in by_table.get("comm_topology", []) if x.get("record") == "transport"}
    missing += [f"transport {t}" for t in want.get("transports", []) if t not in seen]
    if "world_size" in want:
        sizes = {int(x[k]) for t in by_table.values() for x in t for k in ("num_ranks", "num_ranks_per_comm")
                 if x.get(k) is not None}
        sizes |= {int(x["value"]) for x in by_table.get("env", []) if x.get("key") in ("world_size", "num_processes")
                  and str(x.get("value")).isdigit()}
        if not sizes:
            missing.append(f"world size {want['world_size']}")
        elif want["world_size"] not in sizes:
            contradicted.append(f"world size {sorted(sizes)}, expected {want['world_size']}")
    steps = [x for x in by_table.get("steps", []) if any(x.get(k) is not None for k in
                                                          ("step_time_s", "samples_per_s", "tokens_per_s_per_gpu"))]
    # rows per kind, the most of any kind: one step that two grammars describe (a Megatron-style
    # iteration line and DeepSpeed's timer line of the same step) is one step
    by_kind: dict = {}
    for x in steps:
        by_kind[x.get("kind")] = by_kind.get(x.get("kind"), 0) + 1
    num_steps = max(by_kind.values(), default=0)
    if "num_steps" in want and num_steps != want["num_steps"]:
        (contradicted if num_steps > want["num_steps"] else missing).append(
            f"{num_steps} timed steps, expected {want['num_steps']}")
    if "steps" in want and steps:
        got = [min(int(x["step"]) for x in steps), max(int(x["step"]) for x in steps)]
        if got != want["steps"]:
            contradicted.append(f"steps {got}, expected {want['steps']}")
    env = {}
    for x in by_table.get("env", []):
        env.setdefault(x.get("key"), x.get("value"))
    for k, v in want.get("env", {}).items():
        if k not in env:
            missing.append(f"env {k}")
        elif not str(env[k]).startswith(str(v)):
            contradicted.append(f"env {k} = {env[k]}, expected {v}")
    kinds = {x.get("event") for x in by_table.get("events", [])}
    missing += [f"event {e}" for e in want.get("events", []) if e not in kinds]
    for table, col, value in want.get("values", []):
        rows = [x for x in by_table.get(table, []) if x.get(col) is not None]
        if not any(_same(x[col], value) for x in rows):
            (contradicted if rows and table == "steps" else missing).append(f"{table}.{col} = {value}")
    for w in want.get("warn", []):
        if not any(w in text for text in r.warnings):
            missing.append(f"warning mentioning {w!r}")
    if r.unparsed > want.get("max_unparsed", 0):
        missing.append(f"{r.unparsed} unparsed lines, expected at most {want.get('max_unparsed', 0)}")
    silent = not recs and not r.warnings
    verdict = "wrong" if contradicted else "silent" if silent else "partial" if missing else "right"
    return {"file": path.name, "verdict": verdict, "kind": r.kind, "kinds": list(r.kinds), "num_records": len(recs),
            "unparsed": r.unparsed, "missing": missing,
            "contradicted": contradicted + (["no records and no warning"] if silent else [])}


def load_cases(corpora: list[Path] | None = None) -> list[tuple[str, Path, dict | None]]:
    """(group, file, its facts or None) for the pasted fixtures and every corpus folder (default:
    each folder of tests/corpus holding a facts.toml)."""
    expected = tomllib.loads(EXPECTED.read_text())
    files: dict[str, Path] = {}
    for folder in FOLDERS:
        if folder.is_dir():
            for p in sorted(folder.glob("*.txt")):
                files.setdefault(p.name, p)
    cases = [("fixtures", path, expected.get(name)) for name, path in sorted(files.items())]
    for folder in corpora if corpora is not None else sorted(p.parent for p in CORPUS.glob("*/facts.toml")):
        facts = tomllib.loads((folder / "facts.toml").read_text()) if (folder / "facts.toml").is_file() else {}
        cases += [(folder.name, p, facts.get(p.name)) for p in sorted(folder.glob("*.txt"))]
    return cases


def grade(cases: list[tuple[str, Path, dict | None]]) -> dict:
    """Every case graded (score_file) -> {num_files, right, partial, wrong, silent, groups, files}."""
    rows = []
    for group, path, want in cases:
        row = (score_file(path, want) if want is not None else
               {"file": path.name, "verdict": "wrong", "contradicted": ["no facts written"], "missing": []})
        rows.append({"group": group, **row})
    count = lambda rs: {v: sum(r["verdict"] == v for r in rs) for v in VERDICTS}  # noqa: E731
    groups = {g: {"num_files": sum(r["group"] == g for r in rows), **count([r for r in rows if r["group"] == g])}
              for g in dict.fromkeys(r["group"] for r in rows)}
    return {"num_files": len(rows), **count(rows), "groups": groups, "files": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", action="append", type=Path, metavar="DIR",
                        help="grade only this corpus folder (with the fixtures); repeatable")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "real_logs.json"))
    args = parser.parse_args(argv)
    result = grade(load_cases(args.corpus))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for r in result["files"]:
        why = "; ".join(r["contradicted"] + r["missing"])
        print(f"{r['verdict']:8} {r['group']}/{r['file']}" + (f"  ({why})" if why else ""))
    for g, c in result["groups"].items():
        print(f"{g}: " + ", ".join(f"{c[v]} {v}" for v in VERDICTS) + f" of {c['num_files']}")
    print(", ".join(f"{result[v]} {v}" for v in VERDICTS) + f" of {result['num_files']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
