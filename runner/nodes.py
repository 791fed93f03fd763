"""Multi-node campaigns: the launch plan of one node, its files, and merging nodes' directories.

A multi-node campaign is ``runner all --nnodes N --node-rank K --rdzv-endpoint HOST:PORT`` run
on every node with the same matrix and ``--out``. Each run is one torchrun per node joined
through torchrun's c10d rendezvous at HOST:(PORT + run index), so consecutive runs never share
a rendezvous store. Who writes what:

- node 0: campaign.json, env.json, <run>/spec.json, <run>/status.json, logs/launcher.log
  (exactly the single-node files), and after each run folds the nodes' records into env.json;
- every node K: env_node<K>.json (its hardware), <run>/spec_node<K>.json (what its ranks read),
  logs/launcher_node<K>.log and, for K > 0, <run>/status_node<K>.json;
- every rank: its own metrics/rank<r>.jsonl and logs/rank<r>.log (global ranks, so no clashes);
  global rank 0 also writes <run>/run_info.json and <run>/placement.json (rank -> node).

So node K > 0 never writes a file node 0 writes: the directory can be shared, or each node's
directory merged afterwards with ``runner collect`` (``collect_node_dirs``). Deliberately not
here: the torchrun command itself (runner.launch) and the Slurm script (runner.slurm).
"""
from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.atomic import atomic_writer
from core.records import SCHEMA_VERSION, NodeEnv, RankPlacement, env_record_from_dict, record_from_dict, to_dict

ENV_NODE_PATTERN = re.compile(r"^env_node(\d+)\.json$")
# Written by node 0 only; a node directory brought to `runner collect` may hold its own copy.
NODE0_FILES = {"campaign.json", "env.json"}


@dataclass(frozen=True, kw_only=True)
class NodeLaunch:
    """This node's place in a multi-node campaign. rdzv_port: the base port; run i uses port + i."""

    nnodes: int
    node_rank: int
    rdzv_host: str
    rdzv_port: int

    def port_for(self, run_index: int) -> int:
        return self.rdzv_port + run_index


def parse_rdzv_endpoint(text: str) -> tuple[str, int]:
    """'HOST:PORT' -> (host, port). Raises ConfigError with the expected form."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--rdzv-endpoint {text!r} must be HOST:PORT (e.g. node001:29500)")
    return host, int(port)


def build_node_launch(*, nnodes: int | None, node_rank: int | None, rdzv_endpoint: str | None) -> NodeLaunch | None:
    """The node's launch plan from the CLI flags; None for a single-node campaign.
    Raises ConfigError listing every missing or invalid flag."""
    if nnodes in (None, 1) and node_rank in (None, 0) and rdzv_endpoint is None:
        return None
    problems = []
    if nnodes is None or nnodes < 1:
        problems.append(f"--nnodes must be an integer >= 1 for a multi-node campaign, got {nnodes!r}")
    if node_rank is None:
        problems.append("--node-rank K is required with --nnodes (0 on the node that writes campaign.json)")
    elif nnodes is not None and not 0 <= node_rank < max(nnodes, 1):
        problems.append(f"--node-rank {node_rank} must be in 0..{nnodes - 1} for --nnodes {nnodes}")
    if rdzv_endpoint is None:
        problems.append("--rdzv-endpoint HOST:PORT is required with --nnodes (a host every node reaches, "
                        "usually node 0's)")
    host, port = "", 0
    if rdzv_endpoint is not None:
        try:
            host, port = parse_rdzv_endpoint(rdzv_endpoint)
        except ConfigError as e:
            problems.append(str(e))
    if problems:
        raise ConfigError("\n".join(problems))
    return NodeLaunch(nnodes=nnodes, node_rank=node_rank, rdzv_host=host, rdzv_port=port)


def check_divisible(specs, *, nnodes: int) -> None:
    """Every run's world_size (the total over nodes) must split evenly over the nodes.
    Raises ConfigError, one line per run that does not."""
    bad = [f"run '{s.name}': world_size {s.world_size} is not divisible by --nnodes {nnodes}; "
           f"processes per node = world_size / nnodes" for s in specs if s.world_size % nnodes]
    if bad:
        raise ConfigError("\n".join(bad))


def env_node_path(out: Path, node_rank: int) -> Path:
    return out / f"env_node{node_rank}.json"


def spec_path_for(run_dir: Path, node: NodeLaunch | None) -> Path:
    """The spec file this node's ranks read: node 0 (and single-node) spec.json, node K spec_node<K>.json."""
    return run_dir / ("spec.json" if node is None or node.node_rank == 0 else f"spec_node{node.node_rank}.json")


def status_path_for(run_dir: Path, node: NodeLaunch | None) -> Path:
    return run_dir / ("status.json" if node is None or node.node_rank == 0 else f"status_node{node.node_rank}.json")


def launcher_log_name(node: NodeLaunch | None) -> str:
    return "launcher.log" if node is None or node.node_rank == 0 else f"launcher_node{node.node_rank}.log"


def _load(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):  # also an integer past 4,300 digits
        return None  # half-collected directories are normal; the note says what is missing


def build_node_record(out: Path, run_names: list[str]) -> tuple[int | None, tuple[NodeEnv, ...],
                                                                dict[str, dict[str, RankPlacement]]]:
    """(num_nodes, nodes, placement) from env_node<K>.json files and <run>/placement.json.

    nodes: one per node (node_rank, hostname, cpu, host_memory_gib, gpu_count, gpus), by node
    rank. placement: {run: {"<global rank>": RankPlacement}}. Unreadable files are skipped (a
    node not yet collected)."""
    nodes = []
    for path in sorted(out.glob("env_node*.json")):
        m = ENV_NODE_PATTERN.match(path.name)
        data = _load(path) if m else None
        if isinstance(data, dict):
            env, _ = env_record_from_dict(data, where=path.name)
            nodes.append(NodeEnv(node_rank=int(m.group(1)), hostname=env.hostname, cpu=env.cpu,
                                 host_memory_gib=env.host_memory_gib, gpu_count=env.gpu_count, gpus=env.gpus))
    nodes.sort(key=lambda n: n.node_rank)
    placement = {}
    for name in run_names:
        data = _load(out / name / "placement.json")
        if isinstance(data, dict) and isinstance(data.get("ranks"), dict):
            placement[name] = {str(r): record_from_dict(RankPlacement, rec, where=f"{name}/placement.json")[0]
                               for r, rec in data["ranks"].items() if isinstance(rec, dict)}
    num_nodes = len({n.node_rank for n in nodes}) or None
    for ranks in placement.values():
        seen = {r.node_rank for r in ranks.values()}
        num_nodes = max(num_nodes or 0, len(seen))
    return num_nodes, tuple(nodes), placement


def refresh_env_record(out: Path, run_names: list[str]) -> None:
    """Fold the nodes' records (build_node_record) into env.json, atomically. No env.json: no-op."""
    from core.atomic import write_json_atomic

    data = _load(out / "env.json")
    if not isinstance(data, dict):
        return
    env, _ = env_record_from_dict(data)
    num_nodes, nodes, placement = build_node_record(out, run_names)
    write_json_atomic(out / "env.json", to_dict(dataclasses.replace(env, num_nodes=num_nodes, nodes=nodes,
                                                                     placement=placement)))


def collect_node_dirs(campaign_dir: Path, node_dirs: list[Path]) -> list[Path]:
    """Merge nodes' campaign directories into ``campaign_dir`` (node 0's, with campaign.json):
    copy every file it lacks of those a node's directory is expected to hold (``_node_files``:
    env_node<K>.json, logs/, the campaign's run folders; never a symlink); identical files are
    skipped; node 0's campaign.json/env.json are never replaced. Returns the copied paths
    (relative). Raises ConfigError, before copying anything, listing every node directory that
    is not one (no env_node<K>.json: /etc, a home folder), every symlink in one and every
    conflict (same path, different bytes)."""
    problems = []
    if not (campaign_dir / "campaign.json").is_file():
        problems.append(f"{campaign_dir}: no campaign.json; the first argument is node 0's campaign directory")
    for d in node_dirs:
        if not d.is_dir() or d.is_symlink():
            problems.append(f"{d}: not a directory; pass each node's --out directory")
        elif not any(ENV_NODE_PATTERN.match(p.name) for p in d.iterdir()):
            problems.append(f"{d}: not a node's campaign directory (no env_node<K>.json, which `runner all --nnodes` "
                            "writes on every node); pass each node's --out directory")
    if problems:
        raise ConfigError("\n".join(problems))
    meta = _load(campaign_dir / "campaign.json") or {}
    runs = {str(n) for n in meta.get("runs", []) if isinstance(n, str)}
    plan: list[tuple[Path, Path]] = []
    planned: dict[Path, Path] = {}
    for d in node_dirs:
        for src, rel in _node_files(d, runs, problems):
            dst = campaign_dir / rel
            if rel in planned:
                if not filecmp.cmp(planned[rel], src, shallow=False):
                    problems.append(f"{rel}: differs between {planned[rel].parent} and {d}; remove the wrong copy")
            elif dst.exists():
                if not filecmp.cmp(dst, src, shallow=False):
                    problems.append(f"{rel}: {src} differs from {dst}; remove the wrong copy and collect again")
            else:
                planned[rel] = src
                plan.append((src, dst))
    if problems:
        raise ConfigError("\n".join(["refusing to merge (nothing was copied):", *problems]))
    for src, dst in plan:
        dst.parent.mkdir(parents=True, exist_ok=True)
        with src.open("rb") as f, atomic_writer(dst) as out:
            shutil.copyfileobj(f, out, 1 << 20)
        shutil.copystat(src, dst)
    refresh_env_record(campaign_dir, [str(n) for n in meta.get("runs", [])])
    return [dst.relative_to(campaign_dir) for _, dst in plan]


def _node_files(node_dir: Path, runs: set[str], problems: list[str]) -> list[tuple[Path, Path]]:
    """(path, path relative to node_dir) of the files a node's directory is expected to hold: its
    env_node<K>.json, logs/, and the folders of the campaign's runs (``runs``), regular files only,
    walked without following symlinks. A symlink anywhere is a problem naming it (it could point
    anywhere: /etc/shadow); other special files (FIFOs) and anything else are left out."""
    out = []
    for top, dirs, files in os.walk(node_dir):  # os.walk never descends into a symlinked folder
        here = Path(top)
        rel_top = here.relative_to(node_dir)
        if rel_top.parts and rel_top.parts[0] not in runs and rel_top.parts[0] != "logs":
            dirs.clear()
            continue
        for name in sorted(dirs + files):
            path = here / name
            rel = path.relative_to(node_dir)
            if path.is_symlink():
                problems.append(f"{path}: a symbolic link (to {os.readlink(path)}); a node's files are never links, "
                                "remove it")
            elif name in files and path.is_file() and _expected_node_file(rel, runs):
                out.append((path, rel))
        dirs[:] = sorted(n for n in dirs if not (here / n).is_symlink())
    return out


def _expected_node_file(rel: Path, runs: set[str]) -> bool:
    if rel.name.endswith(".tmp") or rel.name.startswith("."):
        return False
    if len(rel.parts) == 1:
        return bool(ENV_NODE_PATTERN.match(rel.name))
    return rel.parts[0] in runs or rel.parts[0] == "logs"


def placement_record(*, run: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """<run>/placement.json content from the all-gathered per-rank records (index = global rank)."""
    return {"schema_version": SCHEMA_VERSION, "run": run, "ranks": {str(r): rec for r, rec in enumerate(ranks)}}
