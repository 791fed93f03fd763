"""Trace analysis speed and memory: ingest.traces against HolisticTraceAnalysis, on a big trace.

    python benchmarks/bench_traces.py --source <trace.json[.gz]> [--mb 200] [--workdir /tmp/bench_traces]
                                      [--out benchmarks/results/traces.json]

Builds a >= --mb MB Kineto trace (in --workdir, never in the repository) by replicating the
source trace's events -- every ProfilerStep with its CPU ops, launches, kernels and flow events
-- with timestamps shifted by the source's span, correlation / External ids and step numbers
offset per copy. Then runs, each in its own child process (measured with os.wait4, so peak
RSS is the child's own ru_maxrss):

* ours: ``compute_step_breakdown(open_trace_events(path, lean=True), ...)``
* HTA:  ``TraceAnalysis(trace_dir=...).get_temporal_breakdown(visualize=False)`` (HTA's
  default parser and its ns rounding), and once more with HTA_DISABLE_NS_ROUNDING=1 to
  show that the totals agree exactly when both use the same timestamps.

Acceptance (issue 4): ours >= 5x faster than HTA, our peak RSS <= 2x the file size.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def load_json(path: Path) -> dict:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def build_trace(source: Path, dest: Path, min_bytes: int) -> dict:
    """Write ``dest`` (one rank's trace, object form) by replicating ``source``'s events."""
    doc = load_json(source)
    events = doc.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in body)
    span = max(e["ts"] + e.get("dur", 0) for e in body) - t0 + 100.0
    ids = [e.get("args", {}).get(k, 0) for e in body for k in ("correlation", "External id")] + \
          [e.get("id", 0) for e in body if isinstance(e.get("id"), int)]
    id_step = max(i for i in ids if isinstance(i, int)) + 1
    steps = [int(e["name"].split("#")[1]) for e in body if str(e.get("name", "")).startswith("ProfilerStep#")]
    step_step = max(steps) - min(steps) + 1 if steps else 0
    dest.parent.mkdir(parents=True, exist_ok=True)
    copies = 0
    with open(dest, "w", encoding="utf-8") as f:
        head = json.dumps(doc)[:-1]
        f.write(head + (', ' if doc else '') + '"traceEvents": [\n')
        f.write(",\n".join(json.dumps(e) for e in meta))
        while f.tell() < min_bytes or copies == 0:
            lines = []
            for e in body:
                e = dict(e, ts=e["ts"] + copies * span)
                if "args" in e:
                    e["args"] = a = dict(e["args"])
                    for k in ("correlation", "External id"):
                        if isinstance(a.get(k), int) and a[k] >= 0:
                            a[k] += copies * id_step
                if isinstance(e.get("id"), int):
                    e["id"] += copies * id_step
                name = str(e.get("name", ""))
                if name.startswith("ProfilerStep#"):
                    e["name"] = f"ProfilerStep#{int(name.split('#')[1]) + copies * step_step}"
                lines.append(json.dumps(e))
            f.write(",\n" + ",\n".join(lines))
            copies += 1
        f.write("\n]}\n")
    return {"copies": copies, "events": len(meta) + copies * len(body), "steps": copies * len(steps)}


CHILD_OURS = """
import json, sys, time
from ingest.io import open_trace_events
from ingest.trace_reader import TraceReadCounts
from ingest.traces import compute_step_breakdown
t = time.perf_counter()
counts = TraceReadCounts()
r = compute_step_breakdown(open_trace_events(sys.argv[1], counts=counts, lean=True), run="bench", rank=0, pp_degree=1)
dt = time.perf_counter() - t
tot = {c: sum(getattr(s, c) for s in r.steps) * 1e6 for c in ("step_time_s", "compute_s", "idle_s")}
print(json.dumps({"seconds": dt, "steps": len(r.steps), "events": counts.num_events,
                  "kernel_time_us": tot["step_time_s"], "compute_us": tot["compute_s"], "idle_us": tot["idle_s"],
                  "non_compute_us": tot["step_time_s"] - tot["compute_s"] - tot["idle_s"]}))
"""

CHILD_HTA = """
import json, logging, sys, time
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
df = TraceAnalysis(trace_dir=sys.argv[1]).get_temporal_breakdown(visualize=False)
dt = time.perf_counter() - t
row = df.iloc[0]
print(json.dumps({"seconds": dt, "kernel_time_us": float(row["kernel_time(us)"]), "compute_us": float(row["compute_time(us)"]),
                  "idle_us": float(row["idle_time(us)"]), "non_compute_us": float(row["non_compute_time(us)"])}))
"""


def run_child(code: str, arg: str, env_extra: dict[str, str] | None = None, timeout_s: float = 3600) -> dict:
    """Run ``code`` in a fresh interpreter; wall time, peak RSS (os.wait4 rusage) and its JSON line."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **(env_extra or {}))
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code, arg], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env, cwd=str(ROOT))
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        raise RuntimeError(f"child failed with exit code {proc.returncode}")
    result = json.loads(out.decode().strip().splitlines()[-1])
    # ru_maxrss is KiB on Linux; it covers the child and the children it waited for (HTA's pool)
    result.update(wall_s=wall, peak_rss_mib=usage.ru_maxrss / 1024)
    return result


def pct(r: dict) -> dict:
    k = r["kernel_time_us"]
    return {c: 100 * r[f"{c}_us"] / k for c in ("compute", "non_compute", "idle")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", required=True, type=Path, help="one rank's real Kineto trace (.json or .json.gz)")
    ap.add_argument("--mb", type=float, default=200)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/bench_traces"))
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "traces.json")
    ap.add_argument("--skip-hta-unrounded", action="store_true")
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    trace = args.workdir / "rank0" / "rank0.trace.json"
    if args.build_only:
        print(json.dumps(build_trace(args.source, trace, int(args.mb * 1e6))))
        return
    # built in a child: a fork inherits the parent's peak RSS (ru_maxrss), so the parent stays
    # small (no source trace in memory, no pandas/HTA imported) for the measured children
    built = json.loads(subprocess.run(
        [sys.executable, __file__, "--build-only", "--source", str(args.source), "--mb", str(args.mb),
         "--workdir", str(args.workdir)], check=True, capture_output=True, text=True, timeout=3600).stdout)
    size = trace.stat().st_size
    from importlib.metadata import version
    ours = run_child(CHILD_OURS, str(trace))
    theirs = run_child(CHILD_HTA, str(trace.parent))
    unrounded = None if args.skip_hta_unrounded else run_child(CHILD_HTA, str(trace.parent),
                                                               {"HTA_DISABLE_NS_ROUNDING": "1"})
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    result = {
        "schema_version": 1,
        "benchmark": "trace analysis: ingest.traces.compute_step_breakdown vs HTA get_temporal_breakdown",
        "machine": {"cpu": cpu, "num_cpus": os.cpu_count(), "mem_gib": round(os.sysconf("SC_PHYS_PAGES")
                    * os.sysconf("SC_PAGE_SIZE") / 2**30, 1), "platform": platform.platform(),
                    "python": platform.python_version(), "numpy": version("numpy"),
                    "ijson": version("ijson"), "hta": version("holistictraceanalysis"),
                    "load_average_at_end": os.getloadavg()},
        "trace": {"source": str(args.source), "copies": built["copies"], "events": built["events"],
                  "profiler_steps": built["steps"], "file_mib": size / 2**20, "file_bytes": size},
        "ours": ours, "hta": theirs, "hta_ns_rounding_disabled": unrounded,
        "speedup_vs_hta": theirs["wall_s"] / ours["wall_s"],
        "ours_peak_rss_over_file_size": ours["peak_rss_mib"] * 2**20 / size,
        "hta_peak_rss_over_file_size": theirs["peak_rss_mib"] * 2**20 / size,
        "agreement_pct_points": {
            "vs_hta": {c: pct(ours)[c] - pct(theirs)[c] for c in pct(ours)},
            "vs_hta_ns_rounding_disabled": ({c: pct(ours)[c] - pct(unrounded)[c] for c in pct(ours)}
                                            if unrounded else None)},
        "targets": {"speedup_vs_hta_min": 5, "peak_rss_over_file_size_max": 2},
    }
    result["pass"] = (result["speedup_vs_hta"] >= 5 and result["ours_peak_rss_over_file_size"] <= 2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: result[k] for k in ("speedup_vs_hta", "ours_peak_rss_over_file_size", "pass")}),
          f"ours {ours['wall_s']:.1f}s {ours['peak_rss_mib']:.0f} MiB; HTA {theirs['wall_s']:.1f}s "
          f"{theirs['peak_rss_mib']:.0f} MiB; file {size / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
