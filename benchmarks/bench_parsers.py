"""Parser throughput on synthetic logs built by repeating real fixture lines, read from files.

    python benchmarks/bench_parsers.py [--mb 8] [--repeats 3] [--ranks 4] [--out benchmarks/results/parsers.json]

Each corpus is written once to a temporary file (the fixture's non-blank lines cycled until
--mb MB; for nccl_coll_tuning, real init output once and then the per-call COLL and TUNING
lines of a 16-rank data-parallel run, generated in the documented formats: no fixture holds
them). Measured in one run, as ``ingest`` does it:

- per corpus, one process: the file streamed in blocks of whole lines
  (ingest.io.iter_text_blocks) through the parser's per-line path, best of --repeats rounds
  (a round parses every corpus once, then the folder below once: the VM's speed drifts over
  minutes, so every best is drawn from samples spread over the whole run).
  Throughput = file bytes / wall time (``mb_per_s``: MB/s per core). Target: >= 15 MB/s.
- a folder of --ranks per-rank logs (each a --mb MB copy of the --folder-corpus corpus)
  through ``ingest_files`` (worker processes, one file each, records packed and sent back):
  ``folder.mb_per_s``, against 0.8 x min(ranks, CPUs) x the 15 MB/s per-core target (issue 18's
  "that rate"); ``folder.efficiency_vs_one_process``: the same against that corpus's measured
  one-process rate (parsing only); and the whole ``ingest FOLDER`` (tables, job triage, Parquet
  written): ``folder.ingest_cli``.

The machine's load average is recorded with each measurement: the CPUs are shared, so a
number is only as good as the load it was taken under. Beside the folder's number,
``folder.cpu_scaling``: what the same number of worker processes got for a pure-Python loop
(no I/O, nothing sent back) against one process, just before: the most any folder could gain.
"""
from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import itertools
import json
import os
import platform
import re
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ingest.cli import main as ingest_main  # noqa: E402
from ingest.io import iter_text_blocks  # noqa: E402
from ingest.parsers.dispatch import parse_text  # noqa: E402
from ingest.thirdparty import ingest_files  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "real"
TARGET_MB_PER_S = 15  # per core, each corpus (issue 18)
FOLDER_EFFICIENCY = 0.8  # a folder of N logs: >= this x min(N, CPUs) x the per-core target (issue 18)
CORPORA = {  # name -> (kind, fixtures whose lines are cycled, target MB/s)
    "nccl_transport_init": ("nccl", ["01_nccl_oldfmt_busid_ib_2node.txt", "02_nccl_busid_p2p_ipc_read_container.txt",
                                     "04_nccl_ib_2node_rings_trees_mnnvl.txt", "06_nccl_nvls_shm_h800_devremap.txt",
                                     "12_nccl_tests_h20_cumem_ib_2node.txt"], 100),
    "nccl_cloudwatch_ts": ("nccl", ["08_nccl_cumem_read_cloudwatch_ts_lines.txt"], 100),
    "nccl_coll_tuning": ("nccl", ["04_nccl_ib_2node_rings_trees_mnnvl.txt", "12_nccl_tests_h20_cumem_ib_2node.txt"], 100),
    "megatron": ("megatron", ["17_megatron_2022_bert_timers_memory.txt", "19_megatron_llm_fork_iteration_plain.txt"], 50),
    "deepspeed": ("deepspeed", ["21_deepspeed_2022_timer_samplespersec_notebook.txt"], 50),
    "torchtitan": ("torchtitan", ["25_torchtitan_2025_rank0_prefix_gc_profiler.txt"], 50),
    # A run's log as training writes it: the fixture's setup lines once, then its steady-state
    # lines (from the first step line on) repeated with the step numbers moving on.
    "megatron_run": ("megatron", ["17_megatron_2022_bert_timers_memory.txt"], 50),
    "deepspeed_run": ("deepspeed", ["21_deepspeed_2022_timer_samplespersec_notebook.txt"], 50),
    "torchtitan_run": ("torchtitan", ["25_torchtitan_2025_rank0_prefix_gc_profiler.txt"], 50),
    # NCCL_DEBUG=INFO of jobs as NCCL prints them (8 nodes x 8 GPUs, 16 channels, interleaved
    # ranks), one job after another: distinct hosts, pids and comms, so every edge is new.
    "nccl_init_run": ("nccl", [], 100),
    # NCCL 2.28 as it ran: the rank-0 log of Megatron TP2 on two H200s (examples/h200-2gpu), INIT
    # and GRAPH output then a TUNING line per collective call, cycled
    "nccl_2_28_h200_tp2": ("nccl", ["../../../examples/h200-2gpu/megatron-tp2/logs/rank0.log.gz"], 100),
}
# Step numbers of the steady-state lines, per run corpus (group 1: the number to move on).
RUN_STEPS = {
    "megatron_run": [re.compile(r"(?<=iteration)( +[0-9]+)(?=/)"), re.compile(r"(?<=\(after )([0-9]+)(?= iterations\))")],
    "deepspeed_run": [re.compile(r"(?<=step=)([0-9]+)"), re.compile(r"(?<= [0-9]/)([0-9]+)(?=, SamplesPerSec)")],
    "torchtitan_run": [re.compile(r"(?<=step: )( *[0-9]+)"), re.compile(r"(?<=at step )([0-9]+)")],
}


def coll_tuning_lines(init: list[str]):
    """NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,COLL,TUNING of data-parallel training: the init
    lines once, then per step each rank's gradient-bucket AllReduces and a loss AllReduce,
    every call printed as its TUNING choice and its COLL line (formats: fixtures README).
    Lines are assembled from per-(call, rank) parts so generating them costs little of the
    measured time."""
    yield from init
    ranks = [(f"node-{r // 8}:{41000 + r}:{41200 + r} [{r % 8}] NCCL INFO ", r % 8) for r in range(16)]
    grads = [("AllReduce", 6553600, 7)] * 7 + [("AllReduce", 1234567, 7), ("AllReduce", 1, 7)]

    def parts(calls):
        out = []
        for i, (func, count, dtype) in enumerate(calls):
            size = count * (4 if dtype == 7 else 1)
            algo = "1 proto 2" if size > 65536 else "0 proto 0"
            out.append([(f"{head}{func}: {size} Bytes -> Algo {algo} time ", f"{head}{func}: opCount ",
                         f" sendbuff 0x7f{dev}a{i:04x}000 recvbuff 0x7f{dev}b{i:04x}000 count {count} datatype {dtype} "
                         f"op 0 root 0 comm 0x55d0c{dev}e0 [nranks=16] stream 0x55d0f{dev}a0") for head, dev in ranks])
        return out
    plain, with_sync = parts(grads), parts(grads + [("Broadcast", 240, 0)])  # a periodic sync every 50 steps
    op = 0
    for step in itertools.count():
        for call in (with_sync if step % 50 == 0 else plain):
            time, opcount = f"{25.0 + (op * 7919 % 1000) / 100:.6f}", f"{op:x}"
            for tuning, coll, rest in call:
                yield tuning + time
                yield coll + opcount + rest
            op += 1


def nccl_init_jobs(num_nodes: int = 8, gpus: int = 8, channels: int = 16):
    """Init output of one job after another, in the line formats of the NCCL fixtures (2.19+):
    per rank the version lines, comm init, trees, intra-node P2P/CUMEM edges and inter-node
    NET/IB send/receive edges per channel, thresholds, channel counts and Init COMPLETE;
    rank 0 prints the rings. Phases run over all ranks in turn (as their lines interleave)."""
    n = num_nodes * gpus
    for job in itertools.count():
        ranks = [(f"node-{job}-{r // gpus}:{1000 + job * 97 + r}:{2000 + job * 97 + r} [{r % gpus}] NCCL INFO ", r)
                 for r in range(n)]
        comm = [f"0x{0x55d0c000 + job * 4096 + r * 64:x}" for r in range(n)]
        yield f"{ranks[0][0]}NCCL version 2.21.5+cuda12.4"
        for head, r in ranks:
            yield f"{head}cudaDriverVersion 12040"
            yield f"{head}Bootstrap : Using eth0:192.0.2.{r // gpus + 10}<0>"
            yield f"{head}NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB eth0:192.0.2.{r // gpus + 10}<0>"
            yield f"{head}Using network IB"
            yield (f"{head}comm {comm[r]} rank {r} nRanks {n} nNodes {num_nodes} localRanks {gpus} "
                   f"localRank {r % gpus} MNNVL 0")
        for c in range(channels):
            ring = "".join(f"{(r + c * gpus) % n:4d}" for r in range(n))
            yield f"{ranks[0][0]}Channel {c:02d}/{channels:02d} :{ring}"
        for head, r in ranks:
            yield head + "Trees " + " ".join(f"[{c}] {(r + 1) % n}/-1/-1->{r}->{(r - 1) % n}" for c in range(channels))
            yield f"{head}P2P Chunksize set to 131072"
        for c in range(channels):
            for head, r in ranks:
                if r % gpus < gpus - 1:
                    yield f"{head}Channel {c:02d}/0 : {r}[{r % gpus}] -> {r + 1}[{r % gpus + 1}] via P2P/CUMEM/read"
                else:
                    peer = (r + 1) % n
                    yield f"{head}Channel {c:02d}/0 : {r}[{r % gpus}] -> {peer}[{peer % gpus}] [send] via NET/IB/{c % 2}/GDRDMA"
                    src = (r - gpus) % n
                    yield f"{head}Channel {c:02d}/0 : {src}[{src % gpus}] -> {r}[{r % gpus}] [receive] via NET/IB/{c % 2}/GDRDMA"
        for head, r in ranks:
            yield f"{head}Connected all rings"
            yield f"{head}Connected all trees"
            yield f"{head}threadThresholds 8/8/64 | 512/8/64 | 512 | 512"
            yield f"{head}{channels} coll channels, 0 collnet channels, 0 nvls channels, {channels * 2} p2p channels, 2 p2p channels per peer"
            yield (f"{head}comm {comm[r]} rank {r} nranks {n} cudaDev {r % gpus} nvmlDev {r % gpus} busId {(r % gpus) * 16 + 0x18:x}000 "
                   f"commId 0x{job * 7919 + 12345:x} - Init COMPLETE")


def run_lines(lines: list[str], steps: list[re.Pattern]):
    """A training run's log from a fixture: the lines before its first step line once, then the
    rest (without the fixtures' ``[trimmed]`` marker) over and over, each step number moved on
    by the fixture's step span per repetition (numbers keep their printed width when they can)."""
    first = next(i for i, line in enumerate(lines) if steps[0].search(line))
    body = [line for line in lines[first:] if line != "[trimmed]"]
    numbers = [int(m.group(1)) for line in body for rx in steps for m in rx.finditer(line)]
    span = max(numbers) - min(numbers) + (min(numbers) or 1)
    yield from lines[:first]
    for k in itertools.count():
        def move(m, k=k):
            text = m.group(1)
            return f"{int(text) + k * span:>{len(text)}d}"
        for line in body:
            for rx in steps:
                line = rx.sub(move, line)
            yield line


def corpus(names: list[str], num_bytes: int, *, name: str = ""):
    lines = [line for n in names for line in _read(FIXTURES / n).split("\n") if line.strip()]
    total = 0
    source = (coll_tuning_lines(lines) if name == "nccl_coll_tuning" else nccl_init_jobs() if name == "nccl_init_run"
              else run_lines(lines, RUN_STEPS[name]) if name in RUN_STEPS else itertools.cycle(lines))
    for line in source:
        if total >= num_bytes:
            return
        total += len(line) + 1
        yield line


def _read(path: Path) -> str:
    return (gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()).decode("utf-8")


def write_corpus(name: str, names: list[str], num_bytes: int, directory: Path) -> Path:
    path = directory / f"{name}.log"
    with open(path, "w", encoding="utf-8") as f:
        for line in corpus(names, num_bytes, name=name):
            f.write(line + "\n")
    return path


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def time_parse(path: Path, kind: str) -> tuple[float, tuple[int, int]]:
    """One parse of ``path`` in this process, every line routed to every parser as ``ingest`` reads a
    file (``kind`` names the corpus' format only): (seconds, (records, unparsed lines))."""
    t0 = time.perf_counter()
    result = parse_text(iter_text_blocks(path), source="bench", kind="routed")
    return time.perf_counter() - t0, (len(result.records), result.unparsed)


def corpus_result(path: Path, kind: str, times: list[float], counts: tuple[int, int]) -> dict:
    """A corpus's entry: best of its rounds (the machine is shared: the best run is the parser's cost)."""
    size, dt = path.stat().st_size, min(times)
    return {"kind": kind, "bytes": size, "seconds_best": round(dt, 3), "seconds_all": [round(t, 3) for t in times],
            "mb_per_s": round(size / dt / 1e6, 1), "records": counts[0], "unparsed": counts[1],
            "target_mb_per_s": TARGET_MB_PER_S, "meets_target": size / dt / 1e6 >= TARGET_MB_PER_S}


def _spin(n: int) -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(n):
        x += i
    return time.perf_counter() - t0


def cpu_scaling(workers: int, *, n: int = 10_000_000) -> float:
    """Throughput of ``2 * workers`` pure-Python loops on ``workers`` forked processes, against
    one process running one: how many cores' worth the machine gives right now."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    one = _spin(n)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        t0 = time.perf_counter()
        list(pool.map(_spin, [n] * (2 * workers)))
    return round(2 * workers * one / (time.perf_counter() - t0), 2)


def time_folder(paths: list[Path]) -> float:
    """``ingest_files`` on a folder of per-rank logs (default workers: min(files, CPUs)), seconds."""
    t0 = time.perf_counter()
    ingest_files(paths)
    return time.perf_counter() - t0


def folder_result(paths: list[Path], times: list[float], *, one_process_mb_per_s: float, scaling: float) -> dict:
    size = sum(p.stat().st_size for p in paths)
    workers = min(len(paths), os.cpu_count() or 1)
    rate = size / min(times) / 1e6
    target = FOLDER_EFFICIENCY * workers * TARGET_MB_PER_S
    return {"files": len(paths), "bytes": size, "workers": workers, "seconds_best": round(min(times), 3),
            "seconds_all": [round(t, 3) for t in times], "mb_per_s": round(rate, 1),
            "one_process_mb_per_s": one_process_mb_per_s, "speedup": round(rate / one_process_mb_per_s, 2),
            "efficiency_vs_one_process": round(rate / (workers * one_process_mb_per_s), 2),
            "target_mb_per_s": round(target, 1), "meets_target": rate >= target, "cpu_scaling": scaling}


def measure_ingest_cli(folder: Path, repeats: int) -> dict:
    """The whole ``ingest FOLDER --out DIR`` in this process (parse in workers, tables, triage of
    the jobs, Parquet written), best of ``repeats``: what a user waits for."""
    size = sum(p.stat().st_size for p in folder.iterdir())
    times = []
    load = loadavg()
    for i in range(repeats):
        out = folder.parent / f"tables{i}"
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = ingest_main([str(folder), "--out", str(out)])
        times.append(time.perf_counter() - t0)
        if code != 0:
            raise SystemExit(f"ingest {folder} exited {code}")
    return {"bytes": size, "seconds_best": round(min(times), 3), "seconds_all": [round(t, 3) for t in times],
            "mb_per_s": round(size / min(times) / 1e6, 1), "loadavg_before": load, "loadavg_after": loadavg()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=4, help="per-rank logs in the folder measurement")
    ap.add_argument("--folder-corpus", default="megatron_run", choices=sorted(CORPORA))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "parsers.json"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        paths = {name: write_corpus(name, names, int(args.mb * 1e6), Path(tmp)) for name, (_, names, _) in CORPORA.items()}
        kind, names, _ = CORPORA[args.folder_corpus]
        ranks = Path(tmp) / "ranks"
        ranks.mkdir()
        first = write_corpus(args.folder_corpus, names, int(args.mb * 1e6), ranks)
        rank_paths = [ranks / f"rank{r}.log" for r in range(args.ranks)]
        for p in rank_paths:
            os.link(first, p)  # the same bytes per rank: each is parsed on its own
        first.unlink()
        # Rounds: every corpus once, then the folder, --repeats times. The VM's per-core speed drifts
        # over minutes, so each number's best is taken from samples spread over the whole run.
        scaling = cpu_scaling(min(len(rank_paths), os.cpu_count() or 1))
        load = loadavg()
        times: dict[str, list[float]] = {name: [] for name in CORPORA}
        parsed, folder_times = {}, []
        for _ in range(args.repeats):
            for name, (kind, _, _) in CORPORA.items():
                dt, parsed[name] = time_parse(paths[name], kind)
                times[name].append(dt)
            folder_times.append(time_folder(rank_paths))
        results = {name: corpus_result(paths[name], kind, times[name], parsed[name])
                   for name, (kind, _, _) in CORPORA.items()}
        for name, r in results.items():
            print(f"{name:22s} {r['mb_per_s']:7.1f} MB/s (target {TARGET_MB_PER_S}) records={r['records']} "
                  f"unparsed={r['unparsed']}")
        folder = folder_result(rank_paths, folder_times, one_process_mb_per_s=results[args.folder_corpus]["mb_per_s"],
                               scaling=scaling)
        folder["corpus"] = args.folder_corpus
        folder["loadavg_before_rounds"], folder["loadavg_after_rounds"] = load, loadavg()
        folder["ingest_cli"] = measure_ingest_cli(ranks, args.repeats)
        print(f"folder of {folder['files']} {args.folder_corpus} rank logs via ingest_files: {folder['mb_per_s']} MB/s with "
              f"{folder['workers']} processes (x{folder['speedup']} one process; target {folder['target_mb_per_s']}; "
              f"a pure-Python loop got x{folder['cpu_scaling']} on as many processes) "
              f"(load {folder['loadavg_before_rounds'][0]} -> {folder['loadavg_after_rounds'][0]})")
        cli = folder["ingest_cli"]
        print(f"`ingest` of that folder (tables, job triage, Parquet): {cli['seconds_best']} s, {cli['mb_per_s']} MB/s "
              f"(load {cli['loadavg_before'][0]} -> {cli['loadavg_after'][0]})")
    out = {"python": platform.python_version(), "machine": platform.machine(), "cpu_count": os.cpu_count(),
           "mb_per_corpus": args.mb, "repeats": args.repeats, "loadavg_at_end": loadavg(),
           "max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
           "targets": {"mb_per_s_per_core": TARGET_MB_PER_S, "folder_efficiency": FOLDER_EFFICIENCY},
           "all_corpora_meet_target": all(r["meets_target"] for r in results.values()),
           "results": results, "folder": folder}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"max RSS {out['max_rss_mib']} MiB; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
