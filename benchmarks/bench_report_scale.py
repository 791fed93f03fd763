"""`report build` on campaigns of many runs: wall time and peak memory (RSS) against the run count.

    python benchmarks/bench_report_scale.py [--runs 1000,10000] [--steps 30] [--formats FMTS] [--out FILE]

Each campaign is synthesized on disk as `runner all` writes one, through the tool's own records
and writers: the matrix resolved by runner.matrix.resolve_matrix (CPU, tiny preset; DDP, ZeRO-3
and TP x PP layouts of 1 and 2 ranks in turn), env.json from runner.env.collect_env, every record
written by core.atomic.write_json_atomic from core.records (CampaignRecord, RunSpec, RunStatus,
RunInfo), and one StepRow line per step per rank as runner.recorder writes them. Step times carry
a per-run offset and a per-step jitter, and each rank an entry time (epoch s) with a per-step skew
(the straggler columns); every 50th run ended in OOM and every 97th crashed (a status cause
each), so per-run caveats and a campaign caveat naming many runs are both present.

`report build CAMPAIGN --out DIR` then runs as a subprocess (the command a user runs; default formats,
where the PDF of a note past report.render.MAX_PDF_HTML_BYTES is skipped with one line):
wall seconds, peak RSS of the process (getrusage of the child), CPU seconds, and the sizes of
summary.json and note.md. Linear growth means bytes and seconds per run roughly constant across
run counts. Targets (issue: bounded reads): 10,000 runs under 2 GiB and 5 minutes on 2 cores;
1,000 runs under 500 MB. Results go to benchmarks/results/report_scale.json.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from core.atomic import write_json_atomic  # noqa: E402
from core.records import CampaignRecord, RunInfo, RunStatus, StepRow, to_dict  # noqa: E402
from runner.env import collect_env  # noqa: E402
from runner.matrix import resolve_matrix  # noqa: E402

LAYOUTS = (  # (strategy, world_size, tp_degree, pp_degree)
    ("ddp", 1, 1, 1), ("ddp", 2, 1, 1), ("zero3", 2, 1, 1), ("tp_pp", 2, 2, 1), ("tp_pp", 2, 1, 2))
TARGETS = {1000: {"max_rss_mib": 500}, 10000: {"max_rss_mib": 2048, "max_wall_s": 300}}


def synthesize_campaign(root: Path, *, num_runs: int, steps: int) -> Path:
    """Write a campaign of ``num_runs`` runs of ``steps`` steps under ``root`` (module docstring)."""
    runs = []
    for i in range(num_runs):
        strategy, world, tp, pp = LAYOUTS[i % len(LAYOUTS)]
        run = {"name": f"r{i:05d}-{strategy}", "strategy": strategy, "world_size": world}
        if strategy == "tp_pp":
            run.update(tp_degree=tp, pp_degree=pp)
        runs.append(run)
    matrix = {"campaign": {"name": root.name, "preset": "tiny"},
              "fixed": {"steps": steps, "warmup_steps": 2, "global_batch_size": 8}, "runs": runs}
    campaign = resolve_matrix(matrix, source="bench.toml", num_gpus=0)
    root.mkdir(parents=True)
    launch = ["runner", "all", "--matrix", "bench.toml"]
    env = collect_env(launch_command=launch, data_dir=root)
    write_json_atomic(root / "env.json", to_dict(env))
    write_json_atomic(root / "campaign.json", to_dict(CampaignRecord(
        name=campaign.name, created_at="2026-12-06T00:00:00+00:00", tool_version="bench", matrix_path="bench.toml",
        launch_command=tuple(launch), device=campaign.device, fixed=campaign.fixed,
        runs=tuple(s.name for s in campaign.runs))))
    fixed = campaign.fixed
    tokens = fixed.global_batch_size * fixed.model.seq_length
    for k, spec in enumerate(campaign.runs):
        run_dir = root / spec.name
        write_json_atomic(run_dir / "spec.json", to_dict(spec))
        status = "oom" if k % 50 == 49 else "crash" if k % 97 == 96 else "ok"
        write_json_atomic(run_dir / "status.json", to_dict(RunStatus(
            run=spec.name, status=status, exit_code=0 if status == "ok" else 1,
            cause=None if status == "ok" else f"{status} at step {steps // 2} (synthesized)",
            started_at="2026-12-06T00:00:00+00:00", ended_at="2026-12-06T00:01:00+00:00", duration_s=60.0,
            command=("torchrun", f"--nproc-per-node={spec.world_size}"))))
        write_json_atomic(run_dir / "run_info.json", to_dict(RunInfo(
            run=spec.name, engine=spec.engine, num_params=1_000_000, num_params_position_embedding=4096,
            torch_version="bench", engine_version="bench",
            device_name="cpu", num_gpus=0)))
        (run_dir / "metrics").mkdir()
        base_s = 0.05 + 0.001 * (k % 40)
        num_steps = steps if status == "ok" else steps // 2
        for rank in range(spec.world_size):
            with open(run_dir / "metrics" / f"rank{rank}.jsonl", "w", encoding="utf-8") as f:
                for step in range(num_steps):
                    step_s = base_s * (3 if step == 0 else 1) + 0.002 * ((step * 7 + rank) % 5)
                    last_stage = spec.pp_degree == 1 or rank == spec.world_size - 1
                    f.write(json.dumps(to_dict(StepRow(
                        run=spec.name, rank=rank, step=step, step_time_s=step_s, tokens=tokens,
                        loss=6.2 - 0.05 * step if last_stage else None, lr=6e-4, grad_norm=1.0,
                        mem_peak_allocated_gib=None, mem_peak_reserved_gib=None, data_wait_s=0.001,
                        wall_time_s=step * base_s, engine=spec.engine,
                        step_entry_time_s=1.8e9 + step * base_s + 0.0005 * ((step + rank) % 3)))) + "\n")
    return root


def time_report_build(campaign: Path, out: Path, *, formats: str | None) -> dict:
    """`report build` as a subprocess: wall and CPU seconds, peak RSS (MiB), exit code, sizes."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "report.cli", "build", str(campaign), "--out", str(out),
                          *(["--format", formats] if formats else [])], capture_output=True, text=True, cwd=ROOT)
    wall_s = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    sizes = {name: (out / name).stat().st_size for name in ("summary.json", "note.md", "note.html", "note.pdf")
             if (out / name).is_file()}
    return {"exit_code": res.returncode, "wall_s": round(wall_s, 1),
            "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
            "peak_rss_mib": round(after.ru_maxrss / 1024, 1), "bytes": sizes,
            "stderr_tail": res.stderr.strip().splitlines()[-3:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", default="1000,10000", help="comma-separated run counts")
    parser.add_argument("--steps", type=int, default=30, help="steps per run (the tiny preset's)")
    parser.add_argument("--formats", default=None, help="report build --format (default: the command's own)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "report_scale.json")
    parser.add_argument("--commit", default=None, help="the tool's commit measured (recorded with the rows)")
    args = parser.parse_args(argv)
    result = json.loads(args.out.read_text()) if args.out.is_file() else {}
    result.update({"benchmark": "report build against the run count", "steps_per_run": args.steps,
                   "formats": args.formats or "default (md, html, pdf where it fits)", "python": platform.python_version(),
                   "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)", "targets": TARGETS})
    rows = result.setdefault("rows", {})
    for num_runs in (int(n) for n in args.runs.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            camp = synthesize_campaign(Path(tmp) / f"scale{num_runs}", num_runs=num_runs, steps=args.steps)
            synth_s = time.perf_counter() - t0
            disk = sum(p.stat().st_size for p in camp.rglob("*") if p.is_file())
            row = {"num_runs": num_runs, "commit": args.commit, "campaign_bytes": disk, "synthesize_s": round(synth_s, 1),
                   "load_average_before": [round(x, 2) for x in os.getloadavg()],
                   **time_report_build(camp, Path(tmp) / "note", formats=args.formats)}
            row["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
            target = TARGETS.get(num_runs, {})
            row["within_target"] = row["exit_code"] == 0 and row["peak_rss_mib"] <= target.get("max_rss_mib", 1e9) \
                and row["wall_s"] <= target.get("max_wall_s", 1e9)
            shutil.rmtree(camp)
        rows[str(num_runs)] = row
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps({k: v for k, v in row.items() if k != "stderr_tail"}), flush=True)
    return 0 if all(r.get("within_target") for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
