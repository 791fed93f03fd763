"""`runner search` against the exhaustive run of its own candidate set (CPU with gloo, or GPUs).

    .venv/bin/python benchmarks/bench_search.py [--world 4] [--out runs/bench-search]      # CPU, tiny preset
    .venv/bin/python benchmarks/bench_search.py --device cuda --model gpt-125m --world 1 --kernels parity \
        --micro-batches 32,64,128 --result benchmarks/results/search-gpu.json             # one GPU

1. The candidate set: `runner search --dry-run` resolves it and the search writes it as a matrix
   (search-matrix.toml: every runnable candidate, the trials' step counts).
2. Exhaustive: `runner all --matrix that-file` runs every candidate once, one campaign.
3. Search: `runner search` with a budget of 40% of the exhaustive wall time (the issue's target).
4. Recheck (--recheck N, default 3): the search's choice and the exhaustive best run again in one
   campaign, alternately, N times each, so their comparison carries its own noise: on a shared
   2-core machine one candidate's two single measurements differed by 35%.
Each run's step time is the median of its measured steps, slowest rank per step
(runner.search.load_trial, the search's own reader). The search's choice is also looked up in the
exhaustive campaign, so the two are compared under the same conditions.

Writes benchmarks/results/search-cpu.json (or --result): choice_step_ms, exhaustive_best_step_ms, search_wall_s,
exhaustive_wall_s, memory_error_max and the load average before and after (the machine is shared).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runner.search import MATRIX_FILE, TRIAL_STEPS, load_trial  # noqa: E402



def runner(*args: str, log: Path) -> float:
    """Run `runner ARGS` (output to log); -> wall seconds."""
    t0 = time.monotonic()
    with open(log, "w", encoding="utf-8") as f:
        subprocess.run([sys.executable, "-m", "runner.cli", *args], cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
                       check=False)
    return time.monotonic() - t0


def _recheck(req, runnable, names: list[str], *, times: int, out: Path, device: str) -> dict[str, list[float]]:
    """Run ``names`` again, alternately (a, b, a, b, ...), ``times`` each, as one campaign
    (OUT/recheck); -> name -> measured step ms per repetition (None where a repetition failed)."""
    from runner.search import render_matrix

    if times <= 0:
        return {}
    by_name = {c.name: c for c in runnable}
    names = [n for n in dict.fromkeys(names) if n in by_name]  # the choice may be the best: once
    runs = [{**by_name[n].run, "name": f"{n}-r{i}"} for i in range(times) for n in names]
    matrix = out / "recheck.toml"
    matrix.write_text(render_matrix(req, runs, name="recheck"), encoding="utf-8")
    shutil.rmtree(out / "recheck", ignore_errors=True)
    runner("all", "--matrix", str(matrix), "--out", str(out / "recheck"), log=out / "recheck.log")
    warmup = TRIAL_STEPS[device]["warmup_steps"]
    return {n: [load_trial(out / "recheck" / f"{n}-r{i}", warmup_steps=warmup).get("measured_step_ms")
                for i in range(times)] for n in names}


def _median_ratio(a: list | None, b: list | None) -> float | None:
    """median(a) / median(b) - 1 over the repetitions that finished; None without any of one."""
    a, b = [v for v in a or () if v], [v for v in b or () if v]
    return statistics.median(a) / statistics.median(b) - 1 if a and b else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=4, help="CPU ranks or GPUs")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--kernels", default="parity", help="kernels modes searched (comma-separated)")
    ap.add_argument("--micro-batches", help="only these micro-batch sizes (runner search --micro-batches)")
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "bench-search")
    ap.add_argument("--memory-gib", help="per-rank memory the candidates are pruned to and trials held to "
                                         "(runner search --memory-gib)")
    ap.add_argument("--reuse-exhaustive", action="store_true",
                    help="keep OUT/exhaustive from an earlier run (its steps, and its wall time from "
                         "OUT/exhaustive.json) and run the search only")
    ap.add_argument("--exhaustive-only", action="store_true",
                    help="run the exhaustive campaign, write OUT/exhaustive.json and stop (a later "
                         "--reuse-exhaustive runs the search)")
    ap.add_argument("--recheck", type=int, default=3,
                    help="times the choice and the exhaustive best run again, alternately (0: none)")
    ap.add_argument("--result", type=Path, default=REPO / "benchmarks" / "results" / "search-cpu.json")
    args = ap.parse_args()
    timing = args.out / "exhaustive.json"  # the exhaustive campaign's wall time, for a later --reuse-exhaustive
    previous = json.loads(timing.read_text()) if args.reuse_exhaustive else None
    if previous is None:
        shutil.rmtree(args.out, ignore_errors=True)
    shutil.rmtree(args.out / "search", ignore_errors=True)
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    common = ["--model", args.model, "--gpus", str(args.world), "--device", args.device, "--kernels", args.kernels]
    common += ["--micro-batches", args.micro_batches] if args.micro_batches else []
    common += ["--memory-gib", args.memory_gib] if args.memory_gib else []
    # the candidate set as the search resolves it (its own request builder, so both see the same GPU)
    from runner.search import plan_search, render_matrix
    from runner.search_cli import add_search_parser, build_search_request

    parser = argparse.ArgumentParser()
    add_search_parser(parser.add_subparsers())
    req = build_search_request(parser.parse_args(["search", *common, "--out", str(args.out / "search")]))
    candidates, _, _ = plan_search(req, name="exhaustive")
    runnable = [c for c in candidates if c.state != "pruned"]
    matrix = args.out / MATRIX_FILE
    matrix.write_text(render_matrix(req, [c.run for c in runnable], name="exhaustive"), encoding="utf-8")
    exhaustive = args.out / "exhaustive"
    print(f"exhaustive: {len(runnable)} candidates ...", flush=True)
    if previous is None:
        exhaustive_wall_s = runner("all", "--matrix", str(matrix), "--out", str(exhaustive),
                                   log=args.out / "exhaustive.log")
        timing.write_text(json.dumps({"exhaustive_wall_s": exhaustive_wall_s}) + "\n", encoding="utf-8")
    else:
        exhaustive_wall_s = previous["exhaustive_wall_s"]
    steps = {c.name: load_trial(exhaustive / c.name, warmup_steps=TRIAL_STEPS[args.device]["warmup_steps"]).get("measured_step_ms")
             for c in runnable}
    ok = {k: v for k, v in steps.items() if v}
    best = min(ok, key=ok.get)
    print(f"exhaustive: {exhaustive_wall_s:.0f} s, best {best} {ok[best]:.2f} ms ({len(ok)}/{len(steps)} ok)", flush=True)
    if args.exhaustive_only:
        return 0
    budget_min = 0.4 * exhaustive_wall_s / 60
    search = args.out / "search"
    search_wall_s = runner("search", *common, "--budget", f"{budget_min:.3f}", "--top", "3", "--out", str(search),
                           log=args.out / "search.log")
    data = json.loads((search / "search.json").read_text())
    choice = data["choice"]
    recheck = _recheck(req, runnable, [choice, best], times=args.recheck, out=args.out, device=args.device)
    result = {
        "schema_version": 1, "device": "cpu (gloo)" if args.device == "cpu" else req.gpu_name, "preset": args.model,
        "world_size": args.world, "kernels": args.kernels, "micro_batches": args.micro_batches,
        "memory_gib": args.memory_gib,
        "num_candidates": data["num_candidates"], "num_runnable": len(runnable), "num_tried": data["num_tried"],
        "tried": data["tried"], "stop_reason": data["stop_reason"],
        "choice": choice, "choice_step_ms": data["choice_step_ms"],
        "choice_step_ms_in_exhaustive": ok.get(choice), "exhaustive_best": best, "exhaustive_best_step_ms": ok[best],
        "choice_vs_best": (ok[choice] / ok[best] - 1) if choice in ok else None,
        "search_budget_min": budget_min, "search_wall_s": search_wall_s, "exhaustive_wall_s": exhaustive_wall_s,
        "wall_fraction": search_wall_s / exhaustive_wall_s,
        "memory_error_max": data["memory_error_max"],
        "memory_measure": ("CPU: peak RSS above the rank's start-up RSS (runner.membudget) vs the model's device bytes"
                           if args.device == "cpu" else "cuda max_memory_allocated vs the model's device bytes"),
        "step_error_max": data["step_error_max"],
        "recheck_step_ms": recheck,
        "recheck_choice_vs_best": _median_ratio(recheck.get(choice), recheck.get(best)),
        "exhaustive_step_ms": dict(sorted(ok.items(), key=lambda kv: kv[1])),
        "exhaustive_reused": previous is not None,
        "load_average_before": load_before, "load_average_after": os.getloadavg(), "cpu_count": os.cpu_count(),
        "machine": platform.platform(),
    }
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in result.items() if k != "exhaustive_step_ms"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
