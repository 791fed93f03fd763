"""`runner` command line.

    runner all [--matrix FILE] [--out DIR] [--dry-run] [--preset NAME] [--steps N]
    runner prepare-data SOURCE... --out PREFIX [--tokenizer tokenizer.json] [--vocab-size N] [--text-key K]
    runner all --nnodes N --node-rank K --rdzv-endpoint HOST:PORT --out DIR [--print-node-commands]
    runner collect CAMPAIGN_DIR NODE_DIR...
    runner status CAMPAIGN_DIR
    runner capacity [--matrix FILE] [--out DIR] [--dry-run]                       (runner.capacity)
    runner slurm --nodes N --gpus-per-node G [--partition P] [--time HH:MM:SS] [--dry-run]
    runner plan --model NAME|--layers L ... --seq S --global-batch B --gpus N [...]   (runner.plan_cli)
    runner commbench [--nproc N] [--device cpu|cuda] [--ops ...] [--out DIR]        (runner.commbench)
    runner search --model PRESET --gpus N [--budget MIN] [--top K] [--dry-run] --out DIR  (runner.search)

Resolves the matrix (embedded default picked by the GPUs found), records the environment
and launches one torchrun per run, in order, into a campaign directory; on several nodes
each node runs the same command with its own --node-rank (runner.nodes says who writes
what). While a run goes, its progress (step, tokens/s, loss, ETA) is a bar on a terminal and
plain `[runner] ...` lines otherwise. User errors print one line per problem and exit 2.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import math
import os
import re
import shlex
import shutil
import signal
import socket
import sys
from pathlib import Path

from core.errors import ConfigError, ToolError
from core.redact import redact_text
from core.records import (
    FINAL_STATUSES, CampaignNodes, CampaignRecord, DatasetRecord, Plant, StorageInfo, SupervisionLimits,
    run_spec_from_dict, to_dict,
)
from runner import __version__
from runner.matrix import Campaign, attach_dataset, load_matrix, resolve_matrix, tokens_read
from runner.nodes import (
    ENV_NODE_PATTERN, NodeLaunch, build_node_launch, check_divisible, collect_node_dirs, env_node_path,
    refresh_env_record, status_path_for,
)

MATRIX_DIR = Path(__file__).resolve().parent.parent / "examples" / "matrices"
NODE_LOCK_PATTERN = re.compile(r"\.runner_node\d+\.lock")  # runner.owner.lock_path of nodes K > 0
DEFAULT_MATRICES = {0: "cpu.toml", 1: "1gpu.toml", 2: "2gpu.toml", 8: "8gpu.toml", 16: "2x8gpu.toml"}
GENERATED_MATRIX_DIR = Path("runs") / "matrices"  # other GPU counts: runner.default_matrix writes one here


def count_cpus() -> int:
    """CPU cores this process may run on (its affinity: a container's or taskset's share)."""
    return len(os.sched_getaffinity(0))


def count_gpus() -> int:
    """CUDA/ROCm devices torch sees; 0 without importing torch (seconds) where the machine has no
    GPU device node for a driver to open (/dev/nvidia<N>, ROCm's /dev/kfd, WSL's /dev/dxg)."""
    dev = Path("/dev")
    if not any(dev.glob("nvidia[0-9]*")) and not (dev / "kfd").exists() and not (dev / "dxg").exists():
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def default_matrix(num_gpus: int) -> Path:
    """The hand-written matrix for this GPU count (examples/matrices), else a generated one
    (runner.default_matrix: DDP, ZeRO-3 and the TP x PP layouts that divide the count) written
    to runs/matrices/<N>gpu-default.toml."""
    if num_gpus in DEFAULT_MATRICES:
        return MATRIX_DIR / DEFAULT_MATRICES[num_gpus]
    if num_gpus < 0:
        raise ToolError(f"--gpus must be >= 0, got {num_gpus}")
    from runner.default_matrix import GPU_PRESET_GLOBAL_BATCH, compute_default_world_size, write_default_matrix

    path = write_default_matrix(num_gpus, directory=GENERATED_MATRIX_DIR)
    world = compute_default_world_size(num_gpus)
    split = "" if world == num_gpus else (
        f"; every layout on {world} of the {num_gpus} GPUs: the global batch ({GPU_PRESET_GLOBAL_BATCH} sequences) "
        "splits evenly only over a power-of-two number of data-parallel ranks")
    print(f"runner: no hand-written matrix for {num_gpus} GPUs; using the generated {path} "
          f"(DDP, ZeRO-3 and the TP x PP layouts that divide {world}{split}; --matrix FILE for your own)", file=sys.stderr)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _print_dry_run(campaign: Campaign, out: Path, node: NodeLaunch | None = None) -> None:
    from runner.env import collect_env_vars
    from runner.launch import build_command, build_run_env

    print(f"campaign {campaign.name}: preset {campaign.preset}, device {campaign.device}, "
          f"global batch {campaign.fixed.global_batch_size} x seq {campaign.fixed.model.seq_length}, "
          f"{campaign.fixed.steps} steps, dtype {campaign.fixed.dtype}")
    f = campaign.fixed
    print(f"profiler window: steps {f.profile_start_step}..{f.profile_start_step + f.profile_num_steps - 1} after one"
          f" warm-up step (excluded from the metric table)" if f.profile_num_steps else "profiler window: none")
    if node is not None:
        print(f"node {node.node_rank} of {node.nnodes}: c10d rendezvous at {node.rdzv_host}:{node.rdzv_port}"
              f" + run index")
    print(f"data rounds: {f.data.replace('+', ', ')}" + (
        "" if "real" not in f.data.split("+") else
        f"; real text from {campaign.data_source.path or 'sources ' + ', '.join(campaign.data_source.sources)}"
        if campaign.data_source and (campaign.data_source.path or campaign.data_source.sources) else
        f"; real text: the default corpus (Python standard library), tokenized at launch into {out / 'data'}"))
    c = campaign.checkpoint
    print(f"checkpoint: save after step {c.step}, restore and replay {c.verify_steps} step(s), in "
          f"{c.dir or '<run>/checkpoint'}" if c.enabled else "checkpoint: none")
    for i, spec in enumerate(campaign.runs):
        print(f"- {spec.name}: strategy={spec.strategy} engine={spec.engine} world_size={spec.world_size} "
              f"tp={spec.tp_degree} pp={spec.pp_degree} dp={spec.dp_degree} "
              + (f"micro_batch_size=auto (probes {spec.options['micro_batch_search']['candidates']}, largest first)"
                 if "micro_batch_search" in spec.options else
                 f"micro_batch_size={spec.micro_batch_size} num_microbatches={spec.num_microbatches}")
              + (f" options={dict(spec.options)}" if spec.options else "")
              + (f" plant={describe_plant(spec.plant)}" if spec.plant is not None else ""))
        run_dir = out / spec.name
        added = {k: v for k, v in collect_env_vars(build_run_env(spec, run_dir=run_dir, base={}, node=node)).items()}
        added["PYTHONUNBUFFERED"] = "1"
        if node is not None:
            added["RUNNER_NODE_RANK"] = str(node.node_rank)
        print("    " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(added.items())) + " "
              + shlex.join(build_command(spec, run_dir=run_dir, master_port=29500, node=node, run_index=i)))
    print("(the master port is a free port picked at launch; runner.train reads <run-dir>/spec.json, "
          "which `runner all` writes before launching)")


def describe_plant(plant: Plant) -> str:
    """A run's plant as matrix-style text: the keys it sets, e.g. ``{host_delay_ms = 40.0, host_delay_rank = 0}``."""
    fields = {f.name: getattr(plant, f.name) for f in dataclasses.fields(plant)}
    return "{" + ", ".join(f"{k} = {list(v) if isinstance(v, tuple) else v}" for k, v in fields.items()
                           if v is not None) + "}"


def node_command(argv: list[str], *, node_rank: int) -> list[str]:
    """The `runner all` command line for one node: ``argv`` with --node-rank set to node_rank and
    --print-node-commands / --dry-run dropped."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in ("--print-node-commands", "--dry-run"):
            continue
        if a == "--node-rank":
            skip = True
            continue
        if a.startswith("--node-rank="):
            continue
        out.append(a)
    return [*out, "--node-rank", str(node_rank)]


def cmd_all(args: argparse.Namespace) -> int:
    node = build_node_launch(nnodes=args.nnodes, node_rank=args.node_rank if args.node_rank is not None else (
        0 if args.print_node_commands else None), rdzv_endpoint=args.rdzv_endpoint)
    if args.resume:
        if node is not None:
            raise ToolError("--resume is single-node only for now; re-run the whole multi-node campaign into a new --out")
        if args.dry_run:
            return plan_resume(args.resume)
        return resume_campaign(args.resume, kill=args.kill_orphans)
    if args.gpus is not None and not args.dry_run:
        raise ToolError("--gpus only applies to --dry-run (a real campaign uses the GPUs it finds)")
    if args.gpus is not None and args.gpus < 0:
        raise ConfigError(f"--gpus {args.gpus}: must be >= 0 (0: resolve for CPU)")
    if node is not None and args.out is None:
        raise ToolError("--out DIR is required with --nnodes: every node must write into the same campaign directory")
    raw = load_matrix(args.matrix) if args.matrix else None  # a bad --matrix is reported before GPUs are counted
    num_gpus = count_gpus() if args.gpus is None else args.gpus  # per node
    nnodes = node.nnodes if node else 1
    matrix_path = args.matrix or default_matrix(num_gpus * nnodes)
    campaign = resolve_matrix(raw if raw is not None else load_matrix(matrix_path), source=str(matrix_path),
                              num_gpus=num_gpus * nnodes, overrides={"preset": args.preset, "steps": args.steps},
                              num_cpus=count_cpus() * nnodes)  # each node as this one, as for GPUs
    if node is not None:
        check_divisible(campaign.runs, nnodes=node.nnodes)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or Path("runs") / f"{campaign.name}-{stamp}"
    if args.print_node_commands:
        if node is None:
            raise ToolError("--print-node-commands needs --nnodes N and --rdzv-endpoint HOST:PORT")
        argv = [*_prog(), *sys.argv[1:]]
        for k in range(node.nnodes):
            print(f"# node {k}" + (" (writes campaign.json, env.json, status.json)" if k == 0 else ""))
            print(shlex.join(node_command(argv, node_rank=k)))
        return 0
    if args.dry_run:
        _print_dry_run(campaign, out, node)
        return 0
    if any(spec.nsys for spec in campaign.runs) and shutil.which("nsys") is None:
        raise ConfigError(f"{args.matrix or 'the matrix'}: [campaign] nsys = true but `nsys` is not on PATH; "
                          "install Nsight Systems or set nsys = false")
    if node is not None and node.node_rank > 0:
        return join_campaign(out, campaign, node)
    if out.exists() and (not out.is_dir() or not _may_start_in(out, campaign, node)):
        raise ToolError(f"{out}: output path exists and is not an empty directory; choose another --out "
                        "(or --resume it)")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    lock = own_campaign(out, node_rank=node.node_rank if node else None, kill=args.kill_orphans)
    try:
        try:
            campaign, dataset_meta = resolve_real_data(campaign, out=out)
        except ToolError:
            if created:
                lock.release()
                shutil.rmtree(out, ignore_errors=True)
            raise
        return _start_campaign(out, campaign, node, matrix_path=matrix_path, dataset_meta=dataset_meta, lock=lock)
    finally:
        lock.release()


def _start_campaign(out: Path, campaign: Campaign, node: NodeLaunch | None, *, matrix_path: Path,
                    dataset_meta: DatasetRecord | None, lock) -> int:
    """Record the environment, every spec and campaign.json into ``out`` (owned: ``lock``), then run."""
    from runner.env import collect_env
    from core.atomic import write_json_atomic

    launch_command = [redact_text(a) for a in sys.orig_argv]  # a token on the command line stays out of the record
    # what the ranks actually run with (NCCL_DEBUG, flight recorder, OMP threads), not the runner's own env
    from runner.env import collect_env_vars
    from runner.launch import build_run_env

    env = dataclasses.replace(
        collect_env(launch_command=launch_command, data_dir=out), storage=collect_campaign_storage(campaign, out=out),
        env_vars=collect_env_vars(build_run_env(campaign.runs[0], run_dir=out / "<run>", node=node)))
    if node is not None:
        write_json_atomic(env_node_path(out, 0), to_dict(dataclasses.replace(env, node_rank=0)))
    write_json_atomic(out / "env.json", to_dict(env))
    supervision = campaign_supervision(campaign)
    for spec in campaign.runs:  # every spec up front, so --resume knows the whole campaign
        (out / spec.name).mkdir(exist_ok=node is not None)
        write_json_atomic(out / spec.name / "spec.json", to_dict(spec))
    # every path the user typed (matrix, [data] path, corpus files) is redacted as the launch command
    # is; spec.json keeps the real data path the ranks open, --resume reads only names and limits here
    data_path = campaign.fixed.data_path
    fixed = dataclasses.replace(campaign.fixed, data_path=data_path and redact_text(data_path))
    if dataset_meta is not None:
        dataset_meta = dataclasses.replace(
            dataset_meta, prefix=redact_text(dataset_meta.prefix),
            sources=tuple(map(redact_text, dataset_meta.sources)),
            tokenizer=dataset_meta.tokenizer and redact_text(dataset_meta.tokenizer))
    meta = CampaignRecord(
        name=campaign.name, created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        tool_version=__version__, tool_git_commit=env.tool_git_commit,
        matrix_path=redact_text(str(matrix_path)),
        launch_command=tuple(launch_command), device=campaign.device, supervision=supervision, fixed=fixed,
        runs=tuple(s.name for s in campaign.runs), dataset=dataset_meta,
        nodes=CampaignNodes(nnodes=node.nnodes, rdzv_endpoint=f"{node.rdzv_host}:{node.rdzv_port}",
                            rdzv_port_rule="base port + run index") if node is not None else None)
    write_json_atomic(out / "campaign.json", to_dict(meta))
    print(f"campaign {campaign.name} -> {out} ({len(campaign.runs)} runs, preset {campaign.preset}"
          + (f", node 0 of {node.nnodes}" if node else "") + ")", flush=True)
    return run_campaign(out, list(campaign.runs), supervision, node=node, lock=lock)


def campaign_supervision(campaign: Campaign) -> SupervisionLimits:
    return SupervisionLimits(run_timeout_s=campaign.run_timeout_s, stall_timeout_s=campaign.stall_timeout_s,
                             startup_timeout_s=campaign.startup_timeout_s)


def own_campaign(out: Path, *, node_rank: int | None = None, kill: bool = False):
    """Take ``out``'s lock (runner.owner) and make sure no process of an earlier runner still
    writes there: found ones are stopped with ``kill``, else refused (ToolError), so nothing is
    measured beside them. -> the held CampaignLock (the caller releases it)."""
    from runner.owner import acquire_lock, describe_orphans, find_orphans, kill_orphans

    lock, stale = acquire_lock(out, node_rank=node_rank)
    try:
        if stale is not None:
            print(f"runner: taking over the lock of a runner that is gone ({stale.describe()})", flush=True)
        orphans = find_orphans(out, stale=stale, node_rank=node_rank)
        if orphans and not kill:
            raise ToolError(f"{out}: {len(orphans)} process(es) of an earlier runner still write into this campaign "
                            f"({describe_orphans(orphans)}); stop them with: "
                            f"{shlex.join(['runner', 'all', '--resume', str(out), '--kill-orphans'])}")
        if orphans:
            left = kill_orphans(orphans)
            print(f"runner: stopped {len(orphans) - len(left)} process(es) of an earlier runner "
                  f"({describe_orphans(orphans)})", flush=True)
            if left:
                raise ToolError(f"{out}: could not stop pid(s) {', '.join(map(str, left))}; stop them by hand")
    except BaseException:
        lock.release()
        raise
    return lock


def resolve_real_data(campaign: Campaign, *, out: Path) -> tuple[Campaign, DatasetRecord | None]:
    """A campaign with a real data round gets its dataset before any launch: the prepared one
    of ``[data] path`` validated, or ``[data] sources`` / the default corpus tokenized into
    ``out/data`` (runner.corpus). Returns the campaign and the dataset record for campaign.json
    (its source list cut to the first SOURCES_IN_META files; data/dataset.json has them all).
    Raises ConfigError naming the file at fault."""
    if "real" not in campaign.fixed.data.split("+"):
        return campaign, None
    from runner.corpus import DataSourceConfig, resolve_campaign_dataset

    print(f"real data round: resolving the dataset into {out / 'data'} ...", flush=True)
    f = campaign.fixed
    record = resolve_campaign_dataset(campaign.data_source or DataSourceConfig(), data_dir=out / "data",
                                      model_vocab_size=f.model.vocab_size, seq_length=f.model.seq_length,
                                      tokens_needed=tokens_read(campaign))
    print(f"    {record.num_tokens} tokens in {record.num_documents} documents ({record.source}), vocab "
          f"{record.vocab_size}" + (f", built in {record.build_s:.1f} s" if record.build_s else ""), flush=True)
    meta = dataclasses.replace(record, sources=record.sources[:SOURCES_IN_META], num_sources=len(record.sources))
    return attach_dataset(campaign, prefix=record.prefix, token_dtype=record.token_dtype,
                          num_tokens=record.num_tokens), meta


SOURCES_IN_META = 10


def collect_campaign_storage(campaign: Campaign, *, out: Path) -> tuple[StorageInfo, ...]:
    """env.json's storage record: the campaign directory, the real round's dataset, the checkpoints."""
    from runner.env import collect_storage

    paths = {"campaign": out}
    if campaign.fixed.data_path:
        paths["data"] = Path(campaign.fixed.data_path).parent
    if campaign.checkpoint.enabled:
        paths["checkpoints"] = Path(campaign.checkpoint.dir) if campaign.checkpoint.dir else out
    return collect_storage(paths)


def cmd_prepare_data(args: argparse.Namespace) -> int:
    from runner.corpus import prepare_data

    if not 2 <= args.vocab_size <= 1 << 24:  # past 16M ids no tokenizer exists; the trainer would try
        raise ConfigError(f"--vocab-size must be in 2..{1 << 24}, got {args.vocab_size}")
    record = prepare_data(list(args.sources), out_prefix=args.out, tokenizer_path=args.tokenizer,
                          vocab_size=args.vocab_size, text_key=args.text_key)
    print(f"{record.prefix}.bin / .idx: {record.num_tokens} tokens in {record.num_documents} documents, "
          f"{record.token_dtype} ids (tokenizer {record.tokenizer}{', trained here' if record.tokenizer_trained else ''}, "
          f"vocab {record.vocab_size}); use it with [data] path = \"{record.prefix}\"")
    return 0


def _prog() -> list[str]:
    """How this process was started, for printing commands to run elsewhere."""
    if Path(sys.argv[0]).name in ("runner", "runner.exe"):
        return ["runner"]
    return [sys.executable, "-m", "runner.cli"]


def _may_start_in(out: Path, campaign: Campaign, node: NodeLaunch | None) -> bool:
    """Node 0 (or a single node) starts only in an empty directory; on several nodes it may
    find what other nodes already wrote there (their env_node<K>.json and run directories),
    but never another campaign."""
    entries = [e for e in out.iterdir() if not (node is not None and NODE_LOCK_PATTERN.fullmatch(e.name))]
    if node is None or not entries:
        return not entries
    runs = {s.name for s in campaign.runs}
    return all((e.is_file() and ENV_NODE_PATTERN.match(e.name) and e.name != env_node_path(out, 0).name)
               or (e.is_dir() and e.name in runs and not (e / "spec.json").exists()) for e in entries)


def join_campaign(out: Path, campaign: Campaign, node: NodeLaunch) -> int:
    """Node K > 0: write only this node's files (env_node<K>.json, <run>/spec_node<K>.json) and
    launch this node's agent of every run. Works on a shared directory (node 0's campaign.json
    must then list the same runs) and on a node-local one (merge with `runner collect`)."""
    from runner.env import collect_env, collect_env_vars
    from runner.launch import build_run_env, load_json
    from core.atomic import write_json_atomic

    out.mkdir(parents=True, exist_ok=True)
    mine = env_node_path(out, node.node_rank)
    if mine.exists():
        raise ToolError(f"{mine}: node {node.node_rank} already ran in {out}; choose another --out")
    lock = own_campaign(out, node_rank=node.node_rank)
    try:
        return _join_campaign(out, campaign, node, lock=lock)
    finally:
        lock.release()


def _join_campaign(out: Path, campaign: Campaign, node: NodeLaunch, *, lock) -> int:
    from runner.env import collect_env, collect_env_vars
    from runner.launch import build_run_env, load_json
    from core.atomic import write_json_atomic

    mine = env_node_path(out, node.node_rank)
    names = [s.name for s in campaign.runs]
    if (out / "campaign.json").exists():
        theirs = load_json(out / "campaign.json")
        if theirs.get("name") != campaign.name or theirs.get("runs") != names:
            raise ToolError(f"{out}/campaign.json is campaign {theirs.get('name')!r} with runs {theirs.get('runs')}, "
                            f"not this matrix's {campaign.name!r} {names}; every node needs the same --matrix")
    campaign, _ = resolve_real_data(campaign, out=out)  # same sources, same deterministic build on every node
    env = dataclasses.replace(
        collect_env(launch_command=list(sys.orig_argv), data_dir=out), node_rank=node.node_rank,
        env_vars=collect_env_vars(build_run_env(campaign.runs[0], run_dir=out / "<run>", node=node)),
        storage=collect_campaign_storage(campaign, out=out))
    write_json_atomic(mine, to_dict(env))
    for spec in campaign.runs:
        (out / spec.name).mkdir(exist_ok=True)
        write_json_atomic(out / spec.name / f"spec_node{node.node_rank}.json", to_dict(spec))
    supervision = campaign_supervision(campaign)
    print(f"campaign {campaign.name} -> {out} ({len(campaign.runs)} runs, node {node.node_rank} of {node.nnodes})",
          flush=True)
    return run_campaign(out, list(campaign.runs), supervision, node=node, lock=lock)


def resume_campaign(out: Path, *, kill: bool = False) -> int:
    """Re-run the runs of an existing campaign that have no final status (never started,
    interrupted, or cut off with the runner). Earlier partial artifacts move to attempt-<n>/."""
    from runner.launch import load_json

    if not (out / "campaign.json").is_file():
        raise ToolError(f"{out}: not a campaign directory (no campaign.json); pass a directory written by `runner all`")
    lock = own_campaign(out, kill=kill)
    try:
        meta = load_campaign_meta(out)
        specs = [load_run_spec(out, name) for name in meta["runs"]]
        print(f"resuming campaign {meta['name']} in {out}", flush=True)
        sup = meta["supervision"]
        limits = SupervisionLimits(run_timeout_s=sup["run_timeout_s"], stall_timeout_s=sup["stall_timeout_s"],
                                   startup_timeout_s=sup["startup_timeout_s"])
        return run_campaign(out, specs, limits, lock=lock)
    finally:
        lock.release()


def plan_resume(out: Path) -> int:
    """``runner all --resume CAMPAIGN --dry-run``: print what a resume would do (each run kept, with
    its final status, or run again) and touch nothing: no lock, no launch, no file moved."""
    from ingest.paths import resolve_under
    from runner.launch import load_json

    if not (out / "campaign.json").is_file():
        raise ToolError(f"{out}: not a campaign directory (no campaign.json); pass a directory written by `runner all`")
    meta = load_campaign_meta(out)
    specs = [load_run_spec(out, name) for name in meta["runs"]]
    print(f"resume of campaign {meta['name']} in {out} (dry run: nothing is launched or moved)")
    for i, spec in enumerate(specs, 1):
        path = resolve_under(out, spec.name, "status.json")  # a symlink out of the campaign is refused
        status = load_json(path).get("status") if path.exists() else None
        if status in FINAL_STATUSES:
            print(f"[{i}/{len(specs)}] {spec.name}: already {status}, kept")
        else:
            print(f"[{i}/{len(specs)}] {spec.name}: would run ({spec.strategy}/{spec.engine} on {spec.world_size} "
                  f"process(es)" + (f"; its status '{status}' is not final" if isinstance(status, str) else "") + ")")
    return 0


def load_campaign_meta(out: Path) -> dict:
    """campaign.json checked for what --resume needs: an object with a name, a list of plain run
    names and the supervision limits. ConfigError naming the file otherwise."""
    from runner.launch import load_json
    from ingest.paths import run_name_problem

    meta = load_json(out / "campaign.json")
    runs, sup = meta.get("runs"), meta.get("supervision")
    problems = [] if isinstance(runs, list) else [f"runs: expected a list of run names, got {type(runs).__name__}"]
    problems += [p for n in (runs if isinstance(runs, list) else []) if (p := run_name_problem(n))]
    if not isinstance(sup, dict) or not all(isinstance(sup.get(k), (int, float)) for k in
                                            ("run_timeout_s", "stall_timeout_s", "startup_timeout_s")):
        problems.append("supervision: expected run_timeout_s, stall_timeout_s and startup_timeout_s numbers")
    if problems:
        raise ConfigError(f"{out / 'campaign.json'}: {'; '.join(problems)}; the campaign is damaged")
    meta.setdefault("name", out.name)
    return meta


def load_run_spec(out: Path, name: str):
    """<out>/<name>/spec.json as a RunSpec; its own name must be ``name``. ConfigError otherwise."""
    from runner.launch import load_json

    from ingest.paths import check_run_inside

    check_run_inside(out, name)  # the run's folder and records stay in the campaign
    path = out / name / "spec.json"
    raw = load_json(path)
    if raw.get("name") != name:
        raise ConfigError(f"{path}: name {str(raw.get('name'))[:80]!r} is not the run's directory {name!r}; "
                          "the campaign is damaged")
    try:
        return run_spec_from_dict(raw)
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"{path}: not a run spec ({type(e).__name__}: {str(e)[:100]}); the campaign is damaged") from None


def run_campaign(out: Path, specs: list, supervision: SupervisionLimits, *, node: NodeLaunch | None = None, lock=None) -> int:
    """Run every spec without a final status, in order. ``lock`` (runner.owner), when given,
    records each torchrun's session for an orphan search after a SIGKILL. An I/O error (full
    disk) stops the campaign with a ToolError naming the file, what finished and what did not."""
    from runner.launch import describe_error

    done: list[str] = []
    try:
        return _run_campaign(out, specs, supervision, node=node, lock=lock, done=done)
    except OSError as e:
        # what status.json says, not what this loop got to note: a run may have written 'ok' just before the error
        kept = finished_on_disk(out, specs, node=node)
        left = [s.name for s in specs if s.name not in kept]
        raise ToolError(f"{describe_error(e)}; finished runs kept (final status.json): {', '.join(kept) or 'none'}; "
                        f"not finished: {', '.join(left) or 'none'} (the current one marked 'interrupted' with this "
                        f"cause where it could be written); after freeing space: "
                        f"{shlex.join(['runner', 'all', '--resume', str(out)])}") from None


def finished_on_disk(out: Path, specs: list, *, node: NodeLaunch | None = None) -> list[str]:
    """Names of the runs whose status.json (this node's) holds a final status, in spec order;
    a missing or unreadable file counts as not finished."""
    from runner.launch import load_json

    kept = []
    for spec in specs:
        path = status_path_for(out / spec.name, node)
        try:
            if path.is_file() and load_json(path).get("status") in FINAL_STATUSES:
                kept.append(spec.name)
        except (ToolError, OSError):
            continue
    return kept


def _run_campaign(out: Path, specs: list, supervision: SupervisionLimits, *, node: NodeLaunch | None, lock,
                  done: list[str]) -> int:
    from runner.launch import Watchdog, archive_attempt, load_json, run_one
    from core.atomic import write_json_atomic
    from runner.progress import build_progress

    def on_launch(run: str):
        return None if lock is None else (lambda pid: lock.record_child(run=run, pid=pid))

    statuses = []
    searched: dict[tuple[str, str], object] = {}  # (layout, data round) -> the spec its micro-batch search chose
    for i, spec in enumerate(specs, 1):
        run_dir = out / spec.name
        status_path = status_path_for(run_dir, node)
        if status_path.exists() and load_json(status_path).get("status") in FINAL_STATUSES:
            statuses.append(load_json(status_path)["status"])
            done.append(spec.name)
            print(f"[{i}/{len(specs)}] {spec.name}: already {statuses[-1]}, kept", flush=True)
            continue
        if node is None:  # on a shared directory another node's files of this run are not ours to move
            archive_attempt(run_dir)
        print(f"[{i}/{len(specs)}] {spec.name}: {spec.strategy}/{spec.engine} on {spec.world_size} "
              f"process(es) ...", flush=True)
        def watchdog() -> Watchdog:
            return Watchdog(deadline_s=supervision.run_timeout_s, stall_timeout_s=supervision.stall_timeout_s,
                            startup_timeout_s=supervision.startup_timeout_s)

        searched_key = (spec.layout or spec.name, spec.data_round)
        if ("micro_batch_search" in spec.options and "chosen" not in spec.options["micro_batch_search"]
                and searched_key in searched):
            # a repeat of a layout searched already in this round: its choice, not a second search
            first = searched[searched_key]
            spec = dataclasses.replace(spec, micro_batch_size=first.micro_batch_size,
                                       num_microbatches=first.num_microbatches, options={
                                           **spec.options, "micro_batch_search": {
                                               **first.options["micro_batch_search"], "reused_from": first.name}})
            write_json_atomic(run_dir / "spec.json", to_dict(spec))
            print(f"    micro_batch_size {spec.micro_batch_size}: the search of {first.name} (same layout)", flush=True)
        if "micro_batch_search" in spec.options and "chosen" not in spec.options["micro_batch_search"]:
            from runner.tune import search_micro_batch

            if node is not None:
                raise ToolError(f"run {spec.name}: micro_batch_size = \"auto\" is single-node only for now; "
                                "set an integer micro_batch_size for multi-node campaigns")
            def launch_probe(probe, probe_dir: Path):
                probe_dir.mkdir(parents=True, exist_ok=True)
                write_json_atomic(probe_dir / "spec.json", to_dict(probe))
                return run_one(probe, run_dir=probe_dir, watchdog=watchdog(), master_port=_free_port(),
                               on_launch=on_launch(spec.name))

            spec = search_micro_batch(spec, run_dir=run_dir, launch=launch_probe)
            searched[searched_key] = spec
            write_json_atomic(run_dir / "spec.json", to_dict(spec))
            print(f"    micro_batch_size {spec.micro_batch_size} chosen "
                  f"({spec.options['micro_batch_search']['policy']}; global batch unchanged)", flush=True)
        status = run_one(spec, run_dir=run_dir, watchdog=watchdog(), master_port=_free_port(),
                         node=node, run_index=i - 1,
                         progress=build_progress(run=spec.name, num_steps_total=spec.fixed.steps),
                         on_launch=on_launch(spec.name))
        if lock is not None:
            lock.clear_child()
        print(f"    {status.status} in {status.duration_s:.1f} s" + (f": {status.cause}" if status.cause else ""),
              flush=True)
        statuses.append(status.status)
        if status.status in FINAL_STATUSES:
            done.append(spec.name)
        if node is not None and node.node_rank == 0:
            refresh_env_record(out, [s.name for s in specs])
    print(f"done ({statuses.count('ok')}/{len(statuses)} runs ok): {shlex.join(['report', 'build', str(out)])}")
    return 0 if "ok" in statuses else 1  # a campaign where nothing ran is a failed job


CAPACITY_MATRICES = {0: "cpu-capacity.toml", 1: "1gpu-capacity.toml"}


def cmd_capacity(args: argparse.Namespace) -> int:
    """Bisect the [capacity] ladder for every layout of the matrix (runner.capacity)."""
    from runner.capacity import build_capacity_config, build_ladder, check_layouts, predict_trial_memory, \
        build_trial_spec, run_capacity
    from core.perfmodel import count_model_params

    if args.gpus is not None and args.gpus < 0:
        raise ToolError(f"--gpus {args.gpus}: must be 0 (CPU) or more")
    num_gpus = count_gpus() if args.gpus is None else args.gpus
    if args.gpus is not None and not args.dry_run:
        raise ToolError("--gpus only applies to --dry-run (a real probe uses the GPUs it finds)")
    matrix_path = args.matrix or MATRIX_DIR / CAPACITY_MATRICES.get(num_gpus, "1gpu-capacity.toml")
    raw = load_matrix(matrix_path)
    # the [capacity] table first: a matrix without one is refused before its runs are resolved
    config = build_capacity_config(raw.get("capacity"), where=str(matrix_path), device="cuda" if num_gpus > 0 else "cpu",
                                   num_layouts=len(raw["runs"]) if isinstance(raw.get("runs"), list) else 1)
    campaign = resolve_matrix(raw, source=str(matrix_path), num_gpus=num_gpus, overrides={"preset": args.preset})
    specs = tuple(s for s in campaign.runs if s.data_round == "synthetic" and int(s.options.get("repeat", 1)) == 1)
    searched = [s.name for s in specs if "micro_batch_search" in s.options]
    if searched:
        raise ConfigError(f"{matrix_path}: run(s) {', '.join(searched)}: micro_batch_size = \"auto\" is not for the "
                          "capacity probe; set an integer (every rung uses it)")
    ladder = build_ladder(campaign.fixed.model, config.ladder, where=str(matrix_path))
    check_layouts(specs, ladder, where=str(matrix_path))
    out = args.out or Path("runs") / f"{campaign.name}-{dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    if args.dry_run:
        print(f"capacity probe {campaign.name}: device {campaign.device}, {len(specs)} layout(s), {len(ladder)} rungs, "
              f"{config.probe_steps} steps per trial ({config.probe_warmup_steps} untimed), micro-batch "
              f"{specs[0].micro_batch_size} of {campaign.fixed.global_batch_size}"
              + (f", budget {config.memory_budget_gib} GiB per process (RLIMIT_DATA)" if config.memory_budget_gib else ""))
        for i, m in enumerate(ladder):
            print(f"rung {i}: {m.num_layers} layers x hidden {m.hidden_size} ({m.num_heads} heads, ffn "
                  f"{m.ffn_hidden_size}): {count_model_params(m) / 1e6:,.1f}M params")
        for spec in specs:
            preds = [predict_trial_memory(build_trial_spec(spec, m, rung=i, config=config)) for i, m in enumerate(ladder)]
            print(f"- {spec.name}: {spec.strategy}/{spec.engine} world {spec.world_size} tp {spec.tp_degree} pp "
                  f"{spec.pp_degree} dp {spec.dp_degree}; predicted GiB per rank (device + host) by rung: "
                  + ", ".join(f"{d / 2**30:.2f}+{h / 2**30:.2f}" for _, _, d, h in preds))
        print(f"trials: ceil(log2({len(ladder)} + 1)) = {math.ceil(math.log2(len(ladder) + 1))} per layout, into "
              f"{out}/<layout>/rung<k>/ (one torchrun each, as `runner all` launches a run)")
        return 0
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ToolError(f"{out}: output path exists and is not an empty directory; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    from core.atomic import write_json_atomic
    from runner.env import collect_env
    from runner.launch import Watchdog, run_one

    env = collect_env(launch_command=[redact_text(a) for a in sys.orig_argv], data_dir=out)
    write_json_atomic(out / "env.json", to_dict(env))
    limit = device_name = None
    if campaign.device == "cuda":
        import torch

        props = torch.cuda.get_device_properties(0)
        limit, device_name = props.total_memory / 2**30, props.name
    supervision = campaign_supervision(campaign)

    def launch(spec, trial_dir: Path):
        return run_one(spec, run_dir=trial_dir, master_port=_free_port(), watchdog=Watchdog(
            deadline_s=supervision.run_timeout_s, stall_timeout_s=supervision.stall_timeout_s,
            startup_timeout_s=supervision.startup_timeout_s))

    print(f"capacity probe {campaign.name} -> {out} ({len(specs)} layouts, {len(ladder)} rungs)", flush=True)
    result = run_capacity(specs, config, out=out, name=campaign.name, device=campaign.device, device_name=device_name,
                          memory_limit_gib=config.memory_budget_gib if limit is None else limit, launch=launch)
    print(f"done ({len(result.trials)} trials): {out / 'capacity.json'}")
    return 0


def cmd_collect(args: argparse.Namespace) -> int:
    copied = collect_node_dirs(args.campaign_dir, list(args.node_dirs))
    if not copied:
        raise ToolError(f"collected nothing: {', '.join(map(str, args.node_dirs))} hold(s) no file that "
                        f"{args.campaign_dir} lacks (already collected, or the nodes' runs wrote nothing yet)")
    print(f"collected {len(copied)} file(s) into {args.campaign_dir}: "
          f"{shlex.join(['report', 'build', str(args.campaign_dir)])}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from runner.status import load_campaign_status, render_status

    meta, states = load_campaign_status(args.campaign_dir)
    print(render_status(args.campaign_dir, meta, states))
    return 0


def cmd_slurm(args: argparse.Namespace) -> int:
    from runner.slurm import submit_sbatch

    script, path = build_slurm_script(args)
    if args.dry_run:
        print(script, end="")
        return 0
    return submit_sbatch(script, path=path)


def build_slurm_script(args: argparse.Namespace) -> tuple[str, Path]:
    """Validate the matrix for nodes x gpus_per_node GPUs and build the script. -> (text, path to write)."""
    from runner.slurm import build_sbatch_script, slurm_field_problems

    problems = []
    if args.nodes < 1:
        problems.append(f"--nodes must be >= 1, got {args.nodes}")
    if args.gpus_per_node < 1:
        problems.append(f"--gpus-per-node must be >= 1, got {args.gpus_per_node}")
    if not 1 <= args.port <= 65535:
        problems.append(f"--port must be a TCP port 1..65535, got {args.port}")
    problems += slurm_field_problems(partition=args.partition, time_limit=args.time, out=args.out or Path("runs"),
                                     job_name="runner")
    if problems:
        raise ToolError("\n".join(problems))
    total = args.nodes * args.gpus_per_node
    matrix_path = args.matrix or default_matrix(total)
    campaign = resolve_matrix(load_matrix(matrix_path), source=str(matrix_path), num_gpus=total)
    check_divisible(campaign.runs, nnodes=args.nodes)
    out = args.out or Path("runs") / f"{campaign.name}-{args.nodes}x{args.gpus_per_node}"
    script = build_sbatch_script(campaign, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                                 partition=args.partition, time_limit=args.time, matrix=matrix_path, out=out,
                                 port=args.port, python=sys.executable, workdir=Path.cwd())
    return script, out.parent / f"{out.name}.sbatch"


def _sigterm_to_interrupt(signum, frame):  # noqa: ARG001
    raise KeyboardInterrupt


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="runner", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_all = sub.add_parser("all", help="run every run of the matrix, one torchrun each")
    p_all.add_argument("--matrix", type=Path, help="experiment matrix TOML (default: embedded, by GPUs found)")
    p_all.add_argument("--out", type=Path, help="campaign directory (default: runs/<name>-<timestamp>)")
    p_all.add_argument("--dry-run", action="store_true", help="print resolved runs and exact commands; run nothing "
                       "(with --resume: which runs a resume would keep and which it would run)")
    p_all.add_argument("--preset", help="model preset (overrides the matrix): gpt-125m | tiny")
    p_all.add_argument("--steps", type=int, help="optimizer steps per run (overrides the matrix)")
    p_all.add_argument("--gpus", type=int, help="with --dry-run: resolve as if this many GPUs were present")
    p_all.add_argument("--resume", type=Path, metavar="CAMPAIGN",
                       help="finish an existing campaign: run only the runs without a final status")
    p_all.add_argument("--kill-orphans", action="store_true",
                       help="stop processes of an earlier runner (killed with SIGKILL) still writing into the "
                            "campaign, instead of refusing to start beside them")
    p_all.add_argument("--nnodes", type=int, help="nodes in a multi-node campaign (world_size in the matrix is the total)")
    p_all.add_argument("--node-rank", type=int, help="this node's rank, 0..nnodes-1 (node 0 writes campaign.json)")
    p_all.add_argument("--rdzv-endpoint", metavar="HOST:PORT",
                       help="c10d rendezvous endpoint reachable from every node; run i uses PORT + i")
    p_all.add_argument("--print-node-commands", action="store_true",
                       help="with --nnodes: print the command to run on each node; run nothing")
    p_all.set_defaults(func=cmd_all)
    p_pd = sub.add_parser("prepare-data", help="tokenize raw text into a Megatron indexed dataset (.bin/.idx)")
    p_pd.add_argument("sources", type=Path, nargs="+", help="text files: .txt (any UTF-8 text), .jsonl, .parquet")
    p_pd.add_argument("--out", type=Path, required=True, help="output prefix: writes PREFIX.bin, PREFIX.idx, PREFIX.json")
    p_pd.add_argument("--tokenizer", type=Path, help="local HF tokenizer.json (default: fit a byte-level BPE on the sources)")
    p_pd.add_argument("--vocab-size", type=int, default=50257,
                      help="the model's vocabulary: cap of a fitted tokenizer, bound for a given one (default 50257)")
    p_pd.add_argument("--text-key", default="text", help="jsonl field / parquet column holding the text (default text)")
    p_pd.set_defaults(func=cmd_prepare_data, interrupted="runner: prepare-data interrupted; no output written (PREFIX.bin, "
                      ".idx, .json and a fitted tokenizer are renamed into place only once all are complete)")
    p_col = sub.add_parser("collect", help="merge nodes' campaign directories into node 0's")
    p_col.add_argument("campaign_dir", type=Path, help="node 0's campaign directory (has campaign.json)")
    p_col.add_argument("node_dirs", type=Path, nargs="+", help="the other nodes' --out directories")
    p_col.set_defaults(func=cmd_collect)
    p_st = sub.add_parser("status", help="print each run's state, steps, tokens/s and failure cause")
    p_st.add_argument("campaign_dir", type=Path, help="a campaign directory written by `runner all`")
    p_st.set_defaults(func=cmd_status)
    p_sl = sub.add_parser("slurm", help="write (and submit) an sbatch script running the campaign on N nodes")
    p_sl.add_argument("--nodes", type=int, required=True)
    p_sl.add_argument("--gpus-per-node", type=int, required=True)
    p_sl.add_argument("--partition")
    p_sl.add_argument("--time", help="job time limit HH:MM:SS (default: the partition's)")
    p_sl.add_argument("--matrix", type=Path, help="experiment matrix TOML (default: embedded, by total GPUs)")
    p_sl.add_argument("--out", type=Path, help="campaign directory on the shared filesystem")
    p_sl.add_argument("--port", type=int, default=29500, help="base rendezvous port (run i uses port + i)")
    p_sl.add_argument("--dry-run", action="store_true", help="print the script; submit nothing")
    p_sl.set_defaults(func=cmd_slurm)
    p_cap = sub.add_parser("capacity", help="largest model of a size ladder each layout trains, by bisection")
    p_cap.add_argument("--matrix", type=Path, help="matrix TOML with a [capacity] ladder (default: "
                       "examples/matrices/cpu-capacity.toml on CPU, 1gpu-capacity.toml on GPUs)")
    p_cap.add_argument("--out", type=Path, help="capacity folder (default: runs/<name>-<timestamp>); inside a "
                       "campaign as <campaign>/capacity, `report build` adds a Capacity section")
    p_cap.add_argument("--dry-run", action="store_true", help="print the ladder, layouts and predictions; run nothing")
    p_cap.add_argument("--preset", help="model preset the ladder grows from (overrides the matrix)")
    p_cap.add_argument("--gpus", type=int, help="with --dry-run: resolve as if this many GPUs were present")
    p_cap.set_defaults(func=cmd_capacity)
    from runner.commbench import add_commbench_parser
    from runner.plan_cli import add_plan_parser
    from runner.search_cli import add_search_parser

    add_plan_parser(sub)
    add_search_parser(sub)
    add_commbench_parser(sub)
    return parser


def interrupted_text(args: argparse.Namespace) -> str:
    """What SIGINT/SIGTERM stopped: a campaign's runs (``runner all`` / ``--resume``, not a dry
    run), a plan (its --out JSON not written), or a command that only reads and prints (status, a
    dry run)."""
    if getattr(args, "func", None) is cmd_all and not getattr(args, "dry_run", False):
        where = getattr(args, "resume", None) or getattr(args, "out", None)
        again = shlex.join(["runner", "all", "--resume", str(where)]) if where else "runner all --resume CAMPAIGN"
        return f"runner: interrupted; the current run was stopped and marked 'interrupted' (finish with: {again})"
    if getattr(args, "command", None) == "plan":  # plan writes its JSON, atomically, once all is computed
        out = getattr(args, "out", None) or "runs/plan-<model>-<N>gpu.json"
        return (f"runner: interrupted; nothing was launched and no plan was written ({out} is written whole at the "
                "end: it is absent, or still the earlier plan)")
    if getattr(args, "func", None) in (cmd_status,) or getattr(args, "dry_run", False):
        return "runner: interrupted; nothing was launched or written (this command only reads and prints)"
    return "runner: interrupted before it finished"


def main(argv: list[str] | None = None) -> int:
    from core.argv import parse_args

    args = parse_args(build_parser(), argv)
    signal.signal(signal.SIGTERM, _sigterm_to_interrupt)
    signal.signal(signal.SIGHUP, _sigterm_to_interrupt)
    try:
        return args.func(args)
    except ToolError as e:
        for line in str(e).splitlines():
            print(f"runner: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(getattr(args, "interrupted", None) or interrupted_text(args), file=sys.stderr)
        return 130
    except OSError as e:  # full disk, permissions: name the file
        from runner.launch import describe_error

        print(f"runner: error: {describe_error(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
