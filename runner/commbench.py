"""`runner commbench`: collective time and bus bandwidth vs message size, nccl-tests style.

The launcher starts one torchrun (its own process group, killed on timeout) of this module's
worker: NCCL on GPUs, gloo on CPU. Every rank times each op over a geometric range of message
sizes -- all_reduce, all_gather (all_gather_into_tensor), reduce_scatter
(reduce_scatter_tensor), all_to_all (all_to_all_single), send_recv (a ring: each rank sends to
rank + 1 and receives from rank - 1, as nccl-tests' sendrecv_perf) -- with CUDA events on GPUs
(perf_counter on CPU), after warm-up calls; the reported time is the mean per call, max over
ranks. Rank 0 writes ``commbench.json`` (rows of core.records.CommBenchRow with the
environment), the launcher adds ``commbench.parquet`` (ingest.io). The performance model reads
them back (core.perfmodel.build_comm_model; `runner plan --commbench`; the note when a
campaign holds a ``commbench/`` folder).

Deliberately not here: validation of results (nccl-tests' #wrong), NCCL algorithm/protocol
sweeps, in-place variants.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError, LaunchError
from core.atomic import write_bytes_atomic
from core.records import SCHEMA_VERSION, CommBenchRow, to_dict
from core.formulas import COLLECTIVES, compute_bus_factor

COMMBENCH_JSON = "commbench.json"
DTYPES = {"float32": 4, "bfloat16": 2}
_SIZE = re.compile(r"^(\d+)([KMG]?)$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """'64K' -> 65536, '256M', '1G' (binary multiples, as nccl-tests -b/-e), '4096'. ConfigError otherwise."""
    m = _SIZE.match(text.strip())
    if not m:
        raise ConfigError(f"size {text!r}: expected bytes like 4096, 64K, 256M or 1G")
    return int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2).upper()]


@dataclass(frozen=True, kw_only=True)
class CommBenchConfig:
    """What to measure. Sizes min_bytes, min_bytes x step_factor, ... <= max_bytes, each rounded
    up to a multiple of world_size x element size (so every rank's chunk is whole)."""

    ops: tuple[str, ...]
    min_bytes: int
    max_bytes: int
    step_factor: int
    num_warmup: int
    num_iters: int
    dtype: str
    device: str  # "cuda" | "cpu"


def check_config(cfg: CommBenchConfig, *, nproc: int) -> None:
    """ConfigError listing every bad field (config_problems)."""
    problems = config_problems(cfg, nproc=nproc)
    if problems:
        raise ConfigError("\n".join(problems))


def config_problems(cfg: CommBenchConfig, *, nproc: int) -> list[str]:
    """Every bad field of ``cfg`` (and the process count), one line each."""
    problems = []
    bad = [op for op in cfg.ops if op not in COLLECTIVES]
    if bad or not cfg.ops:
        problems.append(f"--ops {','.join(bad) or '(empty)'}: choose from {','.join(COLLECTIVES)}")
    if not 0 < cfg.min_bytes <= cfg.max_bytes:
        problems.append(f"--min-bytes {cfg.min_bytes} / --max-bytes {cfg.max_bytes}: need 0 < min <= max")
    if cfg.step_factor < 2:
        problems.append(f"--factor {cfg.step_factor}: must be >= 2")
    if cfg.num_iters < 1 or cfg.num_warmup < 0:
        problems.append(f"--iters {cfg.num_iters} / --warmup {cfg.num_warmup}: need iters >= 1, warmup >= 0")
    if cfg.dtype not in DTYPES:
        problems.append(f"--dtype {cfg.dtype}: choose from {', '.join(DTYPES)}")
    if cfg.device not in ("cuda", "cpu"):
        problems.append(f"--device {cfg.device}: choose cuda or cpu")
    if nproc < 1:
        problems.append(f"--nproc {nproc}: must be >= 1")
    return problems


def build_sizes(cfg: CommBenchConfig, *, world_size: int) -> list[int]:
    """Message sizes in bytes, ascending, distinct."""
    unit = world_size * DTYPES[cfg.dtype]
    sizes, n = [], cfg.min_bytes
    while n <= cfg.max_bytes:
        rounded = -(-n // unit) * unit
        if not sizes or rounded > sizes[-1]:
            sizes.append(rounded)
        n *= cfg.step_factor
    return sizes


def build_commbench_command(*, config_path: Path, out_dir: Path, nproc: int, master_port: int,
                            nnodes: int = 1, rdzv_endpoint: str | None = None) -> list[str]:
    """The torchrun command: static rendezvous on loopback on one node; c10d at rdzv_endpoint
    with ``nproc`` processes per node on several."""
    worker = ["-m", "runner.commbench", "--worker", "--config", str(config_path), "--out", str(out_dir)]
    if nnodes == 1:
        return [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", "--nnodes=1",
                "--master-addr=127.0.0.1", f"--master-port={master_port}", *worker]
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", "--rdzv-id=commbench", "--max-restarts=0",
            *worker]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_commbench(cfg: CommBenchConfig, *, out_dir: Path, nproc: int, timeout_s: float, nnodes: int = 1,
                  node_rank: int = 0, rdzv_endpoint: str | None = None) -> list[Path]:
    """Launch the workers, wait (killing the process group past timeout_s), then write
    commbench.parquet from rank 0's commbench.json. Returns the written paths. Raises
    LaunchError naming the log when the workers fail or time out."""
    from ingest.io import load_commbench, write_commbench_table

    check_config(cfg, nproc=nproc)
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = out_dir / "commbench_config.json"
    config_path.write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n", encoding="utf-8")
    (out_dir / COMMBENCH_JSON).unlink(missing_ok=True)
    cmd = build_commbench_command(config_path=config_path, out_dir=out_dir, nproc=nproc, master_port=_free_port(),
                                  nnodes=nnodes, rdzv_endpoint=rdzv_endpoint)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONUNBUFFERED": "1"}
    log_path = out_dir / f"commbench_node{node_rank}.log"
    with log_path.open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise LaunchError(f"commbench did not finish in {timeout_s:.0f} s (see {log_path}); lower --max-bytes "
                              "or --iters, or raise --timeout-s") from None
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
    if code != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:] or ["(empty log)"]
        raise LaunchError(f"commbench workers exited with {code}: {tail[0][:300]} (full log: {log_path})")
    if node_rank != 0:
        return [log_path]
    rows = load_commbench(out_dir / COMMBENCH_JSON)
    return [out_dir / COMMBENCH_JSON, write_commbench_table(rows, out_dir)]


# ------------------------------------------------------------------------------------ worker

def _time_op(op: str, nbytes: int, *, cfg: CommBenchConfig, device, rank: int, world_size: int) -> float:
    """Mean seconds per call on this rank (warm-up calls excluded)."""
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, cfg.dtype)
    count = nbytes // DTYPES[cfg.dtype]
    chunk = count // world_size
    full = torch.ones(count, dtype=dtype, device=device)
    if op == "all_reduce":
        call = lambda: dist.all_reduce(full)  # noqa: E731
    elif op == "all_gather":
        part = torch.ones(chunk, dtype=dtype, device=device)
        call = lambda: dist.all_gather_into_tensor(full, part)  # noqa: E731
    elif op == "reduce_scatter":
        part = torch.empty(chunk, dtype=dtype, device=device)
        call = lambda: dist.reduce_scatter_tensor(part, full)  # noqa: E731
    elif op == "all_to_all":
        out = torch.empty_like(full)
        call = lambda: dist.all_to_all_single(out, full)  # noqa: E731
    else:  # send_recv ring
        recv = torch.empty_like(full)
        peers = ((rank + 1) % world_size, (rank - 1) % world_size)

        def call() -> None:
            ops = [dist.P2POp(dist.isend, full, peers[0]), dist.P2POp(dist.irecv, recv, peers[1])]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
    for _ in range(cfg.num_warmup):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(cfg.num_iters):
            call()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) * 1e-3 / cfg.num_iters
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(cfg.num_iters):
        call()
    return (time.perf_counter() - t0) / cfg.num_iters


def _nccl_version() -> str:
    import torch

    v = torch.cuda.nccl.version()  # a tuple (2, 28, 9) in current torch, an int in old releases
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def worker_main(config_path: Path, out_dir: Path) -> int:
    """One rank of the benchmark (started by torchrun). Rank 0 writes commbench.json."""
    import torch
    import torch.distributed as dist

    cfg = CommBenchConfig(**{k: tuple(v) if k == "ops" else v
                             for k, v in json.loads(config_path.read_text(encoding="utf-8")).items()})
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cfg.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend=backend, device_id=device if cfg.device == "cuda" else None)
    rank, n = dist.get_rank(), dist.get_world_size()
    num_nodes = max(1, n // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", n))))
    device_name = torch.cuda.get_device_name(device) if cfg.device == "cuda" else None
    rows, warnings = [], []
    if n == 1:
        warnings.append("one rank: no link is measured (bus bandwidth 0); send_recv skipped")
    for op in cfg.ops:
        if op == "send_recv" and n == 1:
            continue
        for nbytes in build_sizes(cfg, world_size=n):
            seconds = _time_op(op, nbytes, cfg=cfg, device=device, rank=rank, world_size=n)
            slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            t = float(slowest.item())
            algbw = nbytes / t / 1e9
            rows.append(CommBenchRow(op=op, nbytes=nbytes, world_size=n, num_nodes=num_nodes, dtype=cfg.dtype,
                                     num_iters=cfg.num_iters, time_us=t * 1e6, algbw_gbps=algbw,
                                     busbw_gbps=algbw * compute_bus_factor(op, max(n, 2)) if n > 1 else 0.0,
                                     backend=backend, device=cfg.device, device_name=device_name))
    if rank == 0:
        record = {
            "schema_version": SCHEMA_VERSION, "kind": "commbench",
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "hostname": socket.gethostname(), "world_size": n, "num_nodes": num_nodes, "backend": backend,
            "device": cfg.device, "device_name": device_name, "config": dataclasses.asdict(cfg),
            "versions": {"torch": torch.__version__, "nccl": _nccl_version() if cfg.device == "cuda" else None},
            "command": list(sys.orig_argv), "warnings": warnings, "rows": [to_dict(r) for r in rows],
        }
        write_bytes_atomic(out_dir / COMMBENCH_JSON, (json.dumps(record, indent=1) + "\n").encode("utf-8"))
    dist.barrier()
    dist.destroy_process_group()
    return 0


# ------------------------------------------------------------------------------------ CLI

def add_commbench_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("commbench", help="measure collective bandwidth/latency vs message size (nccl-tests style)")
    p.add_argument("--nproc", type=int, help="processes per node (default: GPUs found, or 2 on CPU)")
    p.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto", help="cuda (NCCL) or cpu (gloo)")
    p.add_argument("--ops", default=",".join(COLLECTIVES), help=f"comma-separated subset of {','.join(COLLECTIVES)}")
    p.add_argument("--min-bytes", default="8K", help="smallest message (default 8K)")
    p.add_argument("--max-bytes", help="largest message (default 1G on GPUs, 4M on CPU)")
    p.add_argument("--factor", type=int, default=4, help="size step factor (default 4)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls per size (default 5)")
    p.add_argument("--iters", type=int, default=20, help="timed calls per size (default 20)")
    p.add_argument("--dtype", default="float32", choices=tuple(DTYPES))
    p.add_argument("--out", type=Path, help="output directory (default runs/commbench-<timestamp>; "
                   "CAMPAIGN/commbench puts it beside a campaign, where the note's predictions use it)")
    p.add_argument("--timeout-s", type=float, default=900.0, help="kill the benchmark after this long (default 900)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes (run the same command on each)")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="c10d rendezvous endpoint with --nnodes > 1")
    p.set_defaults(func=cmd_commbench)


def cmd_commbench(args: argparse.Namespace) -> int:
    from ingest.io import load_commbench

    problems = []  # every bad value at once, one line each, before anything is launched
    if args.nnodes < 1:
        problems.append(f"--nnodes {args.nnodes}: must be >= 1")
    elif not 0 <= args.node_rank < args.nnodes:
        problems.append(f"--node-rank {args.node_rank}: must be in [0, {args.nnodes}) (--nnodes {args.nnodes})")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        problems.append("--nnodes > 1 needs --rdzv-endpoint HOST:PORT")
    if not (math.isfinite(args.timeout_s) and args.timeout_s > 0):
        problems.append(f"--timeout-s {args.timeout_s}: must be a finite number of seconds > 0")
    device = args.device
    gpus = 0
    if device in ("auto", "cuda"):
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if device == "cuda" and gpus == 0:
            problems.append("--device cuda: no GPU found; use --device cpu (gloo)")
        device = "cuda" if gpus else "cpu"
    nproc = args.nproc if args.nproc is not None else (gpus if device == "cuda" else 2)  # 0 is refused, not the default
    if device == "cuda" and nproc > gpus:
        problems.append(f"--nproc {nproc}: only {gpus} GPU(s) here; NCCL needs one GPU per rank")
    sizes = {}
    for flag, text in (("--min-bytes", args.min_bytes), ("--max-bytes", args.max_bytes or ("1G" if device == "cuda" else "4M"))):
        try:
            sizes[flag] = parse_size(text)
        except ConfigError as e:
            problems.append(f"{flag} {e}")
    cfg = CommBenchConfig(ops=tuple(o.strip() for o in args.ops.split(",") if o.strip()),
                          min_bytes=sizes.get("--min-bytes", 1) if len(sizes) == 2 else 1,
                          max_bytes=sizes.get("--max-bytes", 1) if len(sizes) == 2 else 1,
                          step_factor=args.factor, num_warmup=args.warmup, num_iters=args.iters, dtype=args.dtype,
                          device=device)
    problems += config_problems(cfg, nproc=nproc)
    if problems:
        raise ConfigError("\n".join(problems))
    out = args.out or Path("runs") / f"commbench-{dt.datetime.now():%Y%m%d-%H%M%S}"
    print(f"commbench: {','.join(cfg.ops)} on {nproc * args.nnodes} {device} rank(s) "
          f"({'nccl' if device == 'cuda' else 'gloo'}), {cfg.min_bytes}..{cfg.max_bytes} bytes x{cfg.step_factor}",
          flush=True)
    paths = run_commbench(cfg, out_dir=out, nproc=nproc, timeout_s=args.timeout_s, nnodes=args.nnodes,
                          node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint)
    if args.node_rank == 0:
        print(f"{'op':15} {'size (B)':>12} {'time (us)':>11} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}")
        for r in load_commbench(out / COMMBENCH_JSON):
            print(f"{r['op']:15} {r['nbytes']:12d} {r['time_us']:11.1f} {r['algbw_gbps']:13.3f} {r['busbw_gbps']:13.3f}")
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="runner.commbench worker")
    parser.add_argument("--worker", action="store_true", required=True)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    ns = parser.parse_args()
    sys.exit(worker_main(ns.config, ns.out))
