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

import json
import os
import re
import shutil
import dataclasses
import errno
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.atomic import atomic_writer
from core.records import SCHEMA_VERSION, NodeEnv, RankPlacement, env_record_from_dict, record_from_dict, to_dict

ENV_NODE_PATTERN = re.compile(r"^env_node([0-9]{1,7})\.json\Z")
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


# The files a node writes inside one run folder (module docstring, runner.launch, runner.train,
# runner.membudget, runner.checkpoint, ingest.io's tables), as paths relative to the run folder;
# <rank> a global rank and <node> a node rank, both below the run's world_size. Also under a
# previous attempt's folder (runner.launch.archive_attempt) and a micro-batch probe's (runner.tune).
# Not the checkpoint/ folder: an engine's own files, and not what the note reads (checkpoint.json is).
_NUMBER = r"(?:0|[1-9][0-9]{0,6})"  # as the runner writes it: rank1, never rank01 or rank١
_RANK, _NODE = rf"(?P<rank>{_NUMBER})", rf"(?P<node>{_NUMBER})"
RUN_FILE_PATTERNS = tuple(re.compile(r"(?:attempt-[0-9]{1,7}/|probes/mbs[0-9]{1,7}/)?" + p) for p in (
    r"(?:spec|status|run_info|placement|plant_truth|checkpoint)\.json", rf"(?:spec|status)_node{_NODE}\.json",
    r"logs/(?:launcher|ingest)\.log", rf"logs/launcher_node{_NODE}\.log", rf"logs/rank{_RANK}\.log",
    rf"metrics/rank{_RANK}\.jsonl", rf"memory/rank{_RANK}\.json", rf"data/samples_rank{_RANK}\.json",
    rf"trace/profile_rank{_RANK}\.json(?:\.gz)?", rf"trace/profile_meta_rank{_RANK}\.json",
    rf"trace/flight_recorder_rank{_RANK}", rf"trace/stacks_rank{_RANK}\.txt", rf"trace/nsys_node{_NODE}\.nsys-rep",
    r"tables/trace_[a-z]{1,20}\.parquet"))
RUN_SUBDIRS = re.compile(r"logs|metrics|memory|data|trace|tables|attempt-[0-9]{1,7}|probes|mbs[0-9]{1,7}")


def collect_node_dirs(campaign_dir: Path, node_dirs: list[Path]) -> list[Path]:
    """Merge nodes' campaign directories into ``campaign_dir`` (node 0's, with campaign.json):
    copy every file it lacks of those a node's directory is expected to hold (``_node_files``:
    env_node<K>.json and, in the campaign's run folders, the names RUN_FILE_PATTERNS lists for
    the run's ranks and nodes; anything else is left out); identical files are skipped; node 0's
    campaign.json/env.json are never replaced. Every file is opened without following a link, at
    any component (``open_node_file``), so a file swapped for a link after the check is not read.
    Returns the copied paths (relative). Raises ConfigError, before copying anything, listing
    every node directory that is not one (a symbolic link, no env_node<K>.json: /etc, a home
    folder), every symlink and hard link in one, every symlink on the campaign side between
    ``campaign_dir`` and a file to write (``find_campaign_link``: a link there would take the copy
    outside the campaign) and every conflict (same path, different bytes)."""
    problems = []
    if not (campaign_dir / "campaign.json").is_file():
        problems.append(f"{campaign_dir}: no campaign.json; the first argument is node 0's campaign directory")
    for d in node_dirs:
        if d.is_symlink():
            problems.append(f"{d}: a symbolic link (to {os.readlink(d)}), not followed; pass the node's --out "
                            "directory itself")
        elif not d.is_dir():
            problems.append(f"{d}: not a directory; pass each node's --out directory")
        elif not any(ENV_NODE_PATTERN.match(p.name) for p in d.iterdir()):
            problems.append(f"{d}: not a node's campaign directory (no env_node<K>.json, which `runner all --nnodes` "
                            "writes on every node); pass each node's --out directory")
    if problems:
        raise ConfigError("\n".join(problems))
    meta = _load(campaign_dir / "campaign.json") or {}
    runs = {str(n): _world_size(campaign_dir / n) for n in meta.get("runs", []) if isinstance(n, str)}
    plan: list[tuple[Path, Path, Path]] = []
    planned: dict[Path, tuple[Path, Path]] = {}
    links: set[Path] = set()
    for d in node_dirs:
        for rel in _node_files(d, runs, problems):
            src, dst = d / rel, campaign_dir / rel
            try:
                link = find_campaign_link(campaign_dir, rel)
                if link is not None:
                    if link not in links:  # once per link, not per file below it
                        links.add(link)
                        problems.append(_campaign_link_problem(campaign_dir, link))
                elif rel in planned:
                    if not _same_bytes(planned[rel], (d, rel)):
                        problems.append(f"{rel}: differs between {planned[rel][0]} and {d}; remove the wrong copy")
                elif dst.exists():
                    if not _same_bytes((campaign_dir, rel), (d, rel)):
                        problems.append(f"{rel}: {src} differs from {dst}; remove the wrong copy and collect again")
                else:
                    planned[rel] = (d, rel)
                    plan.append((d, rel, dst))
            except ConfigError as e:
                problems.append(str(e))
    if problems:
        head = "refusing to merge (nothing was copied):"
        raise ConfigError(f"{head} {problems[0]}" if len(problems) == 1 else "\n".join([head, *problems]))
    for d, rel, dst in plan:
        dst.parent.mkdir(parents=True, exist_ok=True)
        link = find_campaign_link(campaign_dir, rel)  # again at the write: a folder swapped for a link since
        if link is not None:
            raise ConfigError(_campaign_link_problem(campaign_dir, link))
        with open_node_file(d, rel) as f, atomic_writer(dst) as out:
            shutil.copyfileobj(f, out, 1 << 20)
            st = os.fstat(f.fileno())
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    refresh_env_record(campaign_dir, [str(n) for n in meta.get("runs", [])])
    return [dst.relative_to(campaign_dir) for _, _, dst in plan]


def find_campaign_link(campaign_dir: Path, rel: Path) -> Path | None:
    """The first path from ``campaign_dir`` down to ``campaign_dir / rel`` (``campaign_dir`` itself
    not included) that is a symbolic link, or that resolves outside ``campaign_dir`` (a relative
    path climbing out); None when every existing component is a plain file or folder inside."""
    root = campaign_dir.resolve()
    path = campaign_dir
    for part in rel.parts:
        path = path / part
        if path.is_symlink() or not path.resolve().is_relative_to(root):
            return path
        if not path.exists():
            return None  # what is below it does not exist yet: collect creates it, as folders
    return None


def _campaign_link_problem(campaign_dir: Path, link: Path) -> str:
    if not link.is_symlink():
        return f"{link}: resolves outside {campaign_dir}; collect writes only inside the campaign"
    return (f"{link}: a symbolic link (to {os.readlink(link)}) inside the campaign, not followed (the copy would "
            f"land outside {campaign_dir}); replace it with a real folder and collect again")


def _world_size(run_dir: Path) -> int | None:
    """The run's world_size from node 0's spec.json; None when unknown (then no rank's file is expected)."""
    spec = _load(run_dir / "spec.json")
    size = spec.get("world_size") if isinstance(spec, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else None


def open_node_file(root: Path, rel: Path):
    """``root / rel`` opened for reading (binary) without following a symbolic link at any component
    below ``root`` (O_NOFOLLOW, each folder opened relative to the last), so a file or folder
    swapped for a link after it was checked is refused, not read. Raises ConfigError naming the
    file when it is a link, not a regular file (a FIFO is not waited on) or a hard link (more than
    one name: its bytes may be anyone's file)."""
    path = root / rel
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in rel.parts[:-1]:
            fd, parent = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd), fd
            os.close(parent)
        fd, parent = os.open(rel.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd), fd
        os.close(parent)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            raise ConfigError(f"{path}: a symbolic link on the way (not followed); a node's files are never links, "
                              "remove it") from None
        raise ConfigError(f"{path}: cannot read ({e.strerror}); check the node's directory") from None
    st = os.fstat(fd)
    problem = ("not a regular file; remove it" if not stat.S_ISREG(st.st_mode) else
               f"a hard link ({st.st_nlink} names for one file: it may be any file of the node); copy it instead "
               "of linking it" if st.st_nlink > 1 else None)
    if problem:
        os.close(fd)
        raise ConfigError(f"{path}: {problem}")
    return os.fdopen(fd, "rb")


def _same_bytes(a: tuple[Path, Path], b: tuple[Path, Path]) -> bool:
    with open_node_file(*a) as fa, open_node_file(*b) as fb:
        while True:
            x, y = fa.read(1 << 20), fb.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def _node_files(node_dir: Path, runs: dict[str, int | None], problems: list[str]) -> list[Path]:
    """Paths (relative to node_dir) of the files a node's directory is expected to hold: its
    env_node<K>.json and, in the folders of the campaign's runs (``runs``: name -> world_size),
    the files RUN_FILE_PATTERNS names for that run's ranks and nodes; regular files with one name
    only, walked without following symlinks. A symlink or a hard link is a problem naming it (it
    could be anything: /etc/shadow); anything else (FIFOs, stray files, a rank the run does not
    have) is left out."""
    out = []
    for top, dirs, files in os.walk(node_dir):  # os.walk never descends into a symlinked folder
        here = Path(top)
        rel_top = here.relative_to(node_dir)
        if rel_top.parts and (rel_top.parts[0] not in runs
                              or len(rel_top.parts) > 1 and not RUN_SUBDIRS.fullmatch(rel_top.name)):
            dirs.clear()
            continue
        for name in sorted(dirs + files):
            path = here / name
            rel = path.relative_to(node_dir)
            try:
                st = path.lstat()
            except OSError:
                continue
            if stat.S_ISLNK(st.st_mode):
                problems.append(f"{path}: a symbolic link (to {os.readlink(path)}); a node's files are never links, "
                                "remove it")
            elif name in files and stat.S_ISREG(st.st_mode) and _expected_node_file(rel, runs):
                if st.st_nlink > 1:
                    problems.append(f"{path}: a hard link ({st.st_nlink} names for one file: it may be any file of "
                                    "the node); copy it instead of linking it")
                else:
                    out.append(rel)
        dirs[:] = sorted(n for n in dirs if not (here / n).is_symlink())
    return out


def _expected_node_file(rel: Path, runs: dict[str, int | None]) -> bool:
    if len(rel.parts) == 1:
        return bool(ENV_NODE_PATTERN.fullmatch(rel.name))
    world_size = runs.get(rel.parts[0])
    for pattern in RUN_FILE_PATTERNS:
        m = pattern.fullmatch("/".join(rel.parts[1:]))
        if m:
            numbers = [int(v) for v in m.groupdict().values() if v is not None]
            return not numbers or (world_size is not None and all(n < world_size for n in numbers))
    return False


def placement_record(*, run: str, ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """<run>/placement.json content from the all-gathered per-rank records (index = global rank)."""
    return {"schema_version": SCHEMA_VERSION, "run": run, "ranks": {str(r): rec for r, rec in enumerate(ranks)}}
