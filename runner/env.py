"""Probe the machine for the environment record (env.json).

What a reviewer needs to reproduce a campaign (DESIGN.md, Environment record): GPUs,
driver, topology, CPU, memory, disk, OS, library versions, launch command, tool commit and
an allow-listed, redacted slice of the environment. Every probe is best effort: a missing
tool gives None, never an exception. Deliberately not here: parsing third-party env dumps
(ingest does that).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil

from core.records import CpuInfo, DiskInfo, EnvRecord, GpuInfo, StorageInfo
from core.redact import redact_text, redact_value

ENV_PREFIXES = ("NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "OMP_")
SECRET_PATTERN = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|KEY|CREDENTIAL|AUTH)", re.IGNORECASE)
GPU_QUERY = "index,name,memory.total,driver_version,power.limit,clocks.max.sm"
TOOL_ROOT = Path(__file__).resolve().parent.parent
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
# A source tree copied without .git (e.g. to a GPU box) may carry its commit in this file.
COMMIT_FILE = TOOL_ROOT / "TOOL_COMMIT"


def _run(cmd: list[str], *, timeout_s: float = 20.0) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]" and friends


def collect_gpus() -> tuple[GpuInfo, ...]:
    """nvidia-smi --query-gpu, one record per GPU; () without nvidia-smi."""
    out = _run(["nvidia-smi", f"--query-gpu={GPU_QUERY}", "--format=csv,noheader,nounits"])
    gpus = []
    for line in (out or "").splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) != 6:
            continue
        gpus.append(GpuInfo(index=int(f[0]), name=f[1], memory_total_mib=_float(f[2]), driver_version=f[3],
                            power_limit_w=_float(f[4]), clocks_sm_max_mhz=_float(f[5])))
    return tuple(gpus)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def collect_versions() -> dict[str, str | None]:
    import torch

    nccl = None
    if torch.cuda.is_available():
        v = torch.cuda.nccl.version()
        nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": str(cudnn) if cudnn else None,
        "nccl": nccl,
        "deepspeed": _version("deepspeed"),
        "megatron_core": _version("megatron-core"),
    }


def collect_env_vars(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Allow-listed variables (NCCL_*, CUDA_*, TORCH_*, PYTORCH_*, OMP_*), secrets redacted: by
    name (SECRET_PATTERN: the whole value) and by value (core.redact: a URL's password, a token
    inside an otherwise kept value such as TORCH_HUB_URL or NCCL_IB_HCA)."""
    env = os.environ if environ is None else environ
    return {
        k: ("<redacted>" if SECRET_PATTERN.search(k) else redact_text(v))
        for k, v in sorted(env.items())
        if k.startswith(ENV_PREFIXES)
    }


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def collect_tool_commit() -> str | None:
    """The TOOL_COMMIT file if present, else `git describe --always --dirty` of the tool's
    tree, else None. The file wins: a copied working tree (a lent GPU host, a container) may
    carry a stale .git whose HEAD is not the code that runs; whoever copies it writes the
    real commit into TOOL_COMMIT."""
    try:
        written = COMMIT_FILE.read_text(encoding="utf-8").strip()
    except OSError:
        written = ""
    if written:
        return written
    described = _run(["git", "-C", str(TOOL_ROOT), "describe", "--always", "--dirty", "--abbrev=40"])
    return described.strip() if described else None


def redact_record(record: Any) -> Any:
    """``record`` (a frozen dataclass such as EnvRecord or StorageInfo, or a tuple or dict of them)
    with every string in it passed through core.redact.redact_text, however deep: the one
    redaction every recorded value goes through, so a token in --out (a path) or a hostname is
    caught as one in an environment value is."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return dataclasses.replace(record, **{f.name: redact_record(getattr(record, f.name))
                                              for f in dataclasses.fields(record) if f.init})
    if isinstance(record, tuple):
        return tuple(redact_record(v) for v in record)
    if isinstance(record, dict):
        return {k: redact_record(v) for k, v in record.items()}
    return redact_value(record)


def collect_env(*, launch_command: list[str], data_dir: Path) -> EnvRecord:
    """The whole environment record (core.records.EnvRecord; env.json is its to_dict), every
    value redacted (redact_record)."""
    gpus = collect_gpus()
    disk = shutil.disk_usage(data_dir)
    topology = _run(["nvidia-smi", "topo", "-m"])
    return redact_record(EnvRecord(
        collected_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        hostname=socket.gethostname(),
        os=platform.platform(),
        python=sys.version.split()[0],
        cpu=CpuInfo(model=_cpu_model(), cores_logical=psutil.cpu_count(logical=True),
                    cores_physical=psutil.cpu_count(logical=False)),
        host_memory_gib=psutil.virtual_memory().total / 1024**3,
        disk=DiskInfo(path=str(data_dir), total_gib=disk.total / 1024**3, free_gib=disk.free / 1024**3),
        gpu_count=len(gpus),
        gpus=gpus,
        topology=ANSI_ESCAPE.sub("", topology) if topology else None,
        versions=collect_versions(),
        launch_command=tuple(launch_command),
        tool_git_commit=collect_tool_commit(),
        env_vars=collect_env_vars(),
    ))


NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "ceph", "fuse.sshfs", "9p", "glusterfs")


def _block_device_kind(device: str) -> str | None:
    """"nvme" / "ssd" / "hdd" from /sys/block/<disk>/queue/rotational for a /dev/<partition>."""
    name = Path(device).name
    if not device.startswith("/dev/") or not name:
        return None
    base = re.sub(r"p\d+$", "", name) if name.startswith(("nvme", "mmcblk")) else re.sub(r"\d+$", "", name)
    try:
        rotational = Path(f"/sys/block/{base}/queue/rotational").read_text().strip()
    except OSError:
        return None
    if base.startswith("nvme"):
        return "nvme"
    return {"0": "ssd", "1": "hdd"}.get(rotational)


def collect_storage(paths: dict[str, Path]) -> tuple[StorageInfo, ...]:
    """Where the campaign's data and checkpoints live: per role ("campaign", "data",
    "checkpoints"), the path, its mount point, filesystem type, device, disk kind (nvme / ssd /
    hdd / network / memory, None when unknown), total and free GiB. Best effort: a path that does
    not exist yet is measured at its nearest existing parent. Every value redacted (redact_record):
    a path may carry a token (--out /tmp/run-hf_...)."""
    parts = sorted(psutil.disk_partitions(all=True), key=lambda p: len(p.mountpoint), reverse=True)
    out = []
    for role, path in paths.items():
        probe = Path(path).expanduser().resolve()
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        mount = next((p for p in parts if str(probe) == p.mountpoint or str(probe).startswith(p.mountpoint.rstrip("/") + "/")),
                     None)
        try:
            usage = shutil.disk_usage(probe)
        except OSError:
            usage = None
        fstype = mount.fstype if mount else None
        kind = ("network" if fstype in NETWORK_FS else "memory" if fstype in ("tmpfs", "ramfs")
                else _block_device_kind(mount.device) if mount else None)
        out.append(StorageInfo(role=role, path=str(path), mountpoint=mount.mountpoint if mount else None,
                               fstype=fstype, device=mount.device if mount else None, kind=kind,
                               total_gib=usage.total / 1024**3 if usage else None,
                               free_gib=usage.free / 1024**3 if usage else None))
    return redact_record(tuple(out))
