"""How fast errors and dry runs answer: each command as a user types it (the console script
beside this interpreter), from a scratch directory, best and median of N runs, plus the modules
it loaded that the target forbids (no torch, numpy, pandas before a command needs them) and
`python -X importtime`'s five largest top-level imports.

    python benchmarks/bench_cli_startup.py [--repeat 7] [--out benchmarks/results/cli_startup.json]

Target: under 0.5 s each (the median, on an idle machine). The bare interpreter's start is
measured too, to tell the tool's share from the machine's.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_S = 0.5
COMMANDS = [
    "runner all --matrix nope.toml --dry-run",
    "runner all --dry-run",
    "runner all --dry-run --gpus 2",
    "runner all --dry-rn",
    "runner status nope",
    "runner collect nope nope2",
    "ingest MISSING.log",
    "report build nope",
    "report diff nope nope2",
]


def time_command(argv: list[str], *, cwd: Path, repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` runs of argv."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run(argv, cwd=cwd, capture_output=True, timeout=120)
        times.append(time.perf_counter() - start)
    return times


def top_imports(module: str, args: list[str], *, cwd: Path, count: int = 5) -> list[list]:
    """[name, cumulative ms] of the largest top-level imports of `python -X importtime -m module args`."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", module, *args], cwd=cwd, capture_output=True,
                         text=True, timeout=120)
    rows = []
    for line in res.stderr.splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and len(parts) == 3 and parts[1].strip().isdigit():
            name = parts[2]
            if len(name) - len(name.lstrip()) == 1:  # imported by the command itself, not by another module
                rows.append([name.strip(), round(int(parts[1]) / 1000, 1)])
    return sorted(rows, key=lambda r: -r[1])[:count]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "cli_startup.json")
    args = parser.parse_args()
    bindir = Path(sys.executable).parent
    modules = {"runner": "runner.cli", "report": "report.cli", "ingest": "ingest.cli"}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bare = time_command([sys.executable, "-c", "pass"], cwd=work, repeat=args.repeat)
        for command in COMMANDS:
            program, *rest = command.split()
            times = time_command([str(bindir / program), *rest], cwd=work, repeat=args.repeat)
            results.append({"command": command, "best_s": round(min(times), 3),
                            "median_s": round(statistics.median(times), 3),
                            "meets_target": statistics.median(times) < TARGET_S,
                            "top_imports_ms": top_imports(modules[program], rest, cwd=work)})
            print(f"{command:<45} best {min(times):.3f} s  median {statistics.median(times):.3f} s")
    record = {"target_s": TARGET_S, "repeat": args.repeat, "machine": platform.machine(), "cpus": os.cpu_count(),
              "load_avg_at_start": os.getloadavg()[0], "python": platform.python_version(),
              "bare_python_best_s": round(min(bare), 3), "bare_python_median_s": round(statistics.median(bare), 3),
              "commands": results}
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
