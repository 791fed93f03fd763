"""Issue 19's GPU benchmark, run on the device in one call from the repository root:

    python benchmarks/bench_parity.py --out "$OUT"

1. installs the carried wheels (``.whl/*.whl``: deepspeed, megatron-core, liger-kernel and their
   needs, built/downloaded as GPU.md says) into /tmp/pydeps and puts it on PYTHONPATH;
2. runs ``examples/matrices/1gpu-parity.toml`` with ``runner all`` and builds its note;
3. runs nanoGPT's own bench loop (``bench.py``: compiled, bf16, synthetic data) at micro-batch 32
   and 64 -- only when a nanoGPT checkout is present (``--nanogpt``, default ``.nanogpt/``, an
   ignored folder; nanoGPT is not vendored);
4. writes ``h200-parity.json``: ``nanogpt_tokens_per_s`` (best of the two, or null) and ``runs``
   keyed ddp, zero3-deepspeed, zero3-fsdp2, megatron-tp1-pp1, torch-tp1-pp1, each with the
   campaign summary's ``tokens_per_s`` (and its parity record).

Everything it writes lands under --out (the campaign, its note, the JSON); copy the JSON to
benchmarks/results/ and the campaign (small traces) to examples/ afterwards.
Deliberately not here: any number computed anew (tokens/s come from summary.json and nanoGPT's log).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "examples" / "matrices" / "1gpu-parity.toml"
RUN_KEYS = ("ddp", "zero3-deepspeed", "zero3-fsdp2", "megatron-tp1-pp1", "torch-tp1-pp1")
NANOGPT_BATCHES = (32, 64)
BLOCK_SIZE = 1024  # nanoGPT bench.py's block_size
# nanoGPT bench.py prints "time per iteration: 123.4567ms, MFU: 43.21%"
NANOGPT_ITER_RE = re.compile(r"time per iteration:\s*([0-9.]+)\s*ms")


def install_wheels(target: Path) -> None:
    wheels = sorted(glob.glob(str(REPO / ".whl" / "*.whl")))
    if not wheels:
        print("no .whl/*.whl carried: deepspeed / megatron-core / liger-kernel runs will fail", flush=True)
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--no-deps", "--quiet", "--target",
                    str(target), *wheels], check=True, timeout=300)


def run_nanogpt(nanogpt: Path, env: dict[str, str], log_dir: Path, *, deadline: float) -> float | None:
    """Best tokens/s of nanoGPT's bench.py over NANOGPT_BATCHES, or None without a checkout (or
    without time left before ``deadline``, a time.monotonic() value)."""
    if not (nanogpt / "bench.py").is_file():
        print(f"no nanoGPT checkout at {nanogpt}: nanogpt_tokens_per_s = null", flush=True)
        return None
    best = None
    for batch in NANOGPT_BATCHES:
        left = deadline - time.monotonic()
        if left < 60:
            print(f"nanoGPT batch {batch}: skipped, {left:.0f} s left in the call", flush=True)
            continue
        cmd = [sys.executable, "bench.py", f"--batch_size={batch}", "--compile=True", "--real_data=False",
               "--profile=False"]
        try:
            res = subprocess.run(cmd, cwd=nanogpt, env=env, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            print(f"nanoGPT batch {batch}: timed out", flush=True)
            continue
        (log_dir / f"nanogpt_b{batch}.log").write_text(res.stdout + res.stderr)
        times = [float(m) for m in NANOGPT_ITER_RE.findall(res.stdout)]
        if res.returncode != 0 or not times:
            print(f"nanoGPT batch {batch}: failed (exit {res.returncode})", flush=True)
            continue
        tps = batch * BLOCK_SIZE / (times[-1] / 1e3)  # the benchmark stage's line (after the burn-in's)
        print(f"nanoGPT batch {batch}: {tps:,.0f} tokens/s", flush=True)
        best = max(best or 0.0, tps)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", REPO / "runs")))
    ap.add_argument("--nanogpt", type=Path, default=REPO / ".nanogpt")
    ap.add_argument("--pydeps", type=Path, default=Path("/tmp/pydeps"))
    ap.add_argument("--budget-s", type=float, default=570.0, help="wall-clock budget of the whole call (s)")
    args = ap.parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    install_wheels(args.pydeps)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(args.pydeps), str(REPO), os.environ.get("PYTHONPATH", "")])}
    camp = args.out / "h200-1gpu-parity"
    res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--matrix", str(MATRIX), "--out", str(camp)],
                         cwd=REPO, env=env, timeout=max(60.0, deadline - time.monotonic() - 30))
    print(f"runner all: exit {res.returncode}", flush=True)
    subprocess.run([sys.executable, "-m", "report.cli", "build", str(camp), "--format", "md,html"], cwd=REPO, env=env,
                   timeout=120)  # the note first: the campaign is the call's main result
    summary_path = camp / "report" / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {"runs": []}
    by_run = {r["run"]: r for r in summary["runs"]}
    nanogpt = run_nanogpt(args.nanogpt, env, args.out, deadline=deadline)
    record = {
        "nanogpt_tokens_per_s": nanogpt,
        "matrix": str(MATRIX.relative_to(REPO)),
        "runs": {k: {"tokens_per_s": by_run.get(k, {}).get("tokens_per_s"), "status": by_run.get(k, {}).get("status"),
                     "kernels": by_run.get(k, {}).get("kernels"), "parity": by_run.get(k, {}).get("parity")}
                 for k in RUN_KEYS},
    }
    (args.out / "h200-parity.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({k: v["tokens_per_s"] for k, v in record["runs"].items()} | {"nanogpt": nanogpt}), flush=True)
    return 0 if res.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
