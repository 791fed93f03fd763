"""Third-party artifacts -> normalized Parquet tables (``ingest FILE|DIR ... [--out DIR] [--strict]``).

Each file's lines are streamed through every pure parser whose grammar claims them
(``ingest.parsers.dispatch``; a folder's files in parallel worker processes, one file per
process), and the records gathered into tables: ``steps``,
``memory``, ``timers``, ``comm_topology``, ``collectives``, ``events``, ``env``, ``kernels``
(profiler tables, nsys stats), ``stacks`` (py-spy), ``flops_profile`` and ``autotuning`` (DeepSpeed), plus
``files`` (one row per input: kind, kinds, records, unparsed lines, warnings). Every table's
Parquet metadata carries ``schema_version``. Deliberately not here: file reading (ingest.io),
metric computation (report).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import operator
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.errors import NoDataError, ParseError
from core.i18n import Message, N_
from ingest.io import iter_text_blocks, read_text_head
from core.atomic import write_bytes_atomic
from ingest.parsers import HEAD_CHARS, ParseResult, detect_kind
from ingest.parsers.dispatch import PARSED_KINDS, WHOLE_TEXT_KINDS, parse_text
from ingest.topology import summarize_nccl_topology
from core.records import SCHEMA_VERSION
from core.redact import redact_text, redact_value

TABLES = ("steps", "memory", "timers", "comm_topology", "collectives", "events", "env", "kernels", "stacks",
          "flops_profile", "autotuning")
FILES_TABLE = "files"
MAX_STRICT_LINES = 20  # file:line entries listed per file by --strict


class _Missing:
    """The hole of a packed table where a record has no such key; pickled by name, so the one object
    survives the trip from a worker process."""

    def __reduce__(self) -> str:
        return "MISSING"

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


@dataclass(frozen=True)
class PackedTable:
    """One file's records of one table as columns, in the order the keys first appear, MISSING
    where a record lacks a key. first_keys: how many keys the first record has (they come first).
    Columns cross a process boundary ~5x cheaper than the records as dicts."""

    columns: dict[str, list[Any]]
    num_rows: int
    first_keys: int


def pack_records(records: list[dict]) -> dict[str, PackedTable]:
    """Records (each with its ``table``) -> {table: PackedTable}, tables in first-appearance order."""
    by_table: dict[str, list[dict]] = {}
    for r in records:
        by_table.setdefault(r["table"], []).append(r)
    out = {}
    for table, recs in by_table.items():
        try:  # one key set (the usual case), read at C speed: equal sizes, each record has the first one's keys
            columns = {k: list(map(operator.itemgetter(k), recs)) for k in recs[0]} if len(set(map(len, recs))) == 1 else None
        except KeyError:
            columns = None
        if columns is None:
            order: dict[str, None] = {}
            for r in recs:
                if len(r) > len(order) or not r.keys() <= order.keys():
                    order.update(dict.fromkeys(r))
            missing = [MISSING] * len(order)  # records read whole, one after another: their values lie together
            columns = dict(zip(order, map(list, zip(*[tuple(map(r.get, order, missing)) for r in recs]))))
        del columns["table"]
        out[table] = PackedTable(columns=columns, num_rows=len(recs), first_keys=len(recs[0]) - 1)
    return out


@dataclass(frozen=True, kw_only=True)
class IngestedFile:
    """One input file parsed. result: its ParseResult without the records, which are in
    ``tables`` (packed, per table; ``rows`` / ``records`` give them back as dicts).
    timeline / trace_rank: a torch.profiler trace's RankTimeline (ingest.traces) and rank, for
    the cross-rank attribution of its job; None otherwise."""

    path: str
    result: ParseResult
    tables: dict[str, PackedTable] = dataclasses.field(default_factory=dict)
    num_records: int = 0
    timeline: Any = None
    trace_rank: int | None = None

    def rows(self, table: str) -> list[dict]:
        """The file's records of one table, as the parser made them (``table`` key first)."""
        packed = self.tables.get(table)
        if packed is None:
            return []
        names = list(packed.columns)
        return [{"table": table, **{k: v for k, v in zip(names, values) if v is not MISSING}}
                for values in zip(*packed.columns.values())]

    def records(self) -> list[dict]:
        """Every record, table by table."""
        return [r for table in self.tables for r in self.rows(table)]


def _ingested(path: str, result: ParseResult, **trace: Any) -> IngestedFile:
    return IngestedFile(path=path, result=dataclasses.replace(result, records=[]), tables=pack_records(result.records),
                        num_records=len(result.records), **trace)


def find_artifacts(paths: list[str]) -> list[Path]:
    """Expand the CLI paths: files as given, directories to their regular files (sorted,
    recursive, hidden files and our own outputs skipped; gzipped files kept, ingest.io reads
    them decompressed). Raises NoDataError when none."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            ours = {d for d in p.rglob("*") if d.is_dir() and ((d / "files.parquet").is_file() or (d / "note.md").is_file())}
            out.extend(sorted(f for f in p.rglob("*") if f.is_file()
                              and not any(part.startswith(".") for part in f.relative_to(p).parts)
                              and not any(d in ours for d in f.parents)  # our own tables/ and report/ outputs
                              and f.suffix not in (".parquet", ".pdf", ".html", ".png", ".svg")))  # .gz: read decompressed
        elif p.is_file():
            out.append(p)
        elif p.exists() or p.is_symlink():  # a FIFO, a device, a socket, a dangling or looping link
            raise NoDataError(f"{p}: not a regular file or folder (a FIFO, a device or a broken link); it is not "
                              "read (a FIFO would wait for a writer); pass log files or folders of them")
        else:
            raise NoDataError(f"{p}: no such file or directory; pass log files or folders of them")
    if not out:
        tables = [p for p in map(Path, paths) if (p / "files.parquet").is_file() and not (p / "runs.parquet").is_file()]
        if tables:  # what `ingest --out` wrote when the logs gave no run (its note said why)
            raise NoDataError(f"{tables[0]}: tables of logs without a runs table (ingest could not build a run from "
                              "them); run `report build` on the folder of logs itself, or ingest them again with "
                              "--model KEY=VALUE,... for what the logs do not say")
        raise NoDataError(f"{', '.join(paths)}: no files to ingest; pass log files or folders of them")
    return out


BINARY_HEAD_CHARS = 1024  # a file with a NUL byte among its first characters is binary, not read


@contextlib.contextmanager
def _no_cycle_collection():
    """Parsing and packing make no reference cycles (test_parsers_freed_without_the_cycle_collector):
    the cycle collector, run meanwhile, would only walk every record again and again."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@_no_cycle_collection()
def ingest_file(path: str | os.PathLike[str]) -> IngestedFile:
    """Parse one file in this process, streaming its text in blocks of whole lines (memory bounded
    by the records, not the file): a whole-text format its head names (a trace, a flight-recorder
    dump, an ``nvidia-smi -q`` report) whole, any other file line by line through every parser.
    Raises ParseError for an unreadable file."""
    head = read_text_head(path, HEAD_CHARS)
    source = str(path)
    # an executable or an archive has NUL bytes in its header; a log has none there (a crash may
    # leave NUL padding at a log's end: not counted, the parsers skip it as unparsed text)
    if "\x00" in head.rstrip("\x00")[:BINARY_HEAD_CHARS]:
        return _ingested(source, ParseResult(records=[], unparsed=0, kind="unknown", warnings=[
            Message(N_("binary file (NUL bytes in its first %(num)s characters); not a log, not read"),
                    num=BINARY_HEAD_CHARS)]))
    kind = detect_kind(head)
    if kind == "chrome_trace":
        from ingest.io import open_trace_events
        from ingest.parsers.chrome_trace import parse_chrome_trace
        from ingest.trace_reader import TraceReadCounts

        counts = TraceReadCounts()
        parsed = parse_chrome_trace(open_trace_events(path, counts=counts, lean=True), source=source, head=head,
                                    read_counts=counts)
        return _ingested(source, parsed.result, timeline=parsed.timeline, trace_rank=parsed.rank)
    return _ingested(source, parse_text(iter_text_blocks(path), source=source,
                                        kind=kind if kind in WHOLE_TEXT_KINDS else "routed"))


def compute_trace_attribution(files: list[IngestedFile], jobs: list) -> dict[str, pd.DataFrame]:
    """Per job holding torch.profiler traces: ingest.attribution over its ranks' timelines
    (run = the job's name), as the tables ``attribution`` (AttributionRow) and
    ``trace_collectives`` (CollectiveRow), ``trace_whatif`` (WhatIfRow); plus ``trace_warnings`` (run, warning). {} when no
    job has a trace with analysed steps. Two traces of one rank in a job: the first is used,
    the other named in a warning. A trace without ProfilerStep marks whose steps were split by a
    repeating annotation or kernel pattern has that said in ``trace_warnings`` too."""
    from ingest.traces import STEP_SPLIT_PREFIX
    from ingest.attribution import compute_attribution
    from core.records import AttributionRow, CollectiveRow, WhatIfRow

    rows, colls, warns, whatif = [], [], [], []
    by_path = {f.path: f for f in files}
    for job in jobs:
        timelines: dict[int, Any] = {}
        for src in job.sources:
            f = by_path.get(src)
            if f is None or f.timeline is None:
                continue
            rank = f.trace_rank if f.trace_rank is not None else 0
            if rank in timelines:
                warns.append({"run": job.name, "warning": f"{Path(src).name}: a second trace of rank {rank}; not used"})
                continue
            timelines[rank] = f.timeline
            # how an unmarked trace was cut into steps is part of what the note must say
            warns += [{"run": job.name, "warning": f"{Path(src).name}: {w}"} for w in f.result.warnings
                      if w.startswith(STEP_SPLIT_PREFIX)]
        if not timelines:
            continue
        att = compute_attribution(timelines, run=job.name, pp_degree=1, num_microbatches=1)
        rows += [dataclasses.asdict(r) for r in att.rows]
        colls += [dataclasses.asdict(c) for c in att.collectives]
        whatif += [dataclasses.asdict(w) for w in att.whatif]
        warns += [{"run": job.name, "warning": w} for w in att.warnings]
    if not rows:
        return {}
    return {"attribution": pd.DataFrame(rows, columns=[f.name for f in dataclasses.fields(AttributionRow)]),
            "trace_collectives": pd.DataFrame(colls, columns=[f.name for f in dataclasses.fields(CollectiveRow)]),
            "trace_whatif": pd.DataFrame(whatif, columns=[f.name for f in dataclasses.fields(WhatIfRow)]),
            "trace_warnings": pd.DataFrame(warns, columns=["run", "warning"])}


def ingest_files(paths: list[Path], *, max_workers: int | None = None) -> list[IngestedFile]:
    """``ingest_file`` for each path, results in input order. The files are parsed in parallel
    worker processes, one file per task (``max_workers``: default min(files, CPUs); 1 or a
    single file: in this process). A file is always parsed whole by one process (one log per
    rank is the usual shape of a run's output, so a run's folder spreads over the cores).
    Raises ParseError for an unreadable file, as ingest_file."""
    workers = min(len(paths), max_workers or os.cpu_count() or 1)
    if workers < 2:
        return [ingest_file(p) for p in paths]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # fork where the platform has it: a worker starts with the parsers already imported in 0.03 s;
    # spawn and forkserver (Python 3.14's default on Linux) import pandas again, 1.1-1.4 s a pool
    context = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        return list(pool.map(ingest_file, paths))


def build_tables(files: list[IngestedFile]) -> dict[str, pd.DataFrame]:
    """Records of all files -> one DataFrame per table (columns: union of the records' keys in
    the order they first appear, a missing key NaN, as ``pd.DataFrame`` makes of the records as
    dicts; every row gets ``run`` = the file's stem unless it has one)."""
    parts: dict[str, list[tuple[str, PackedTable]]] = {t: [] for t in TABLES}
    for f in files:
        for table, packed in f.tables.items():
            parts.setdefault(table, []).append((Path(f.path).stem, packed))
    tables = {name: _table(p) for name, p in parts.items() if p}
    if "env" in tables:  # environment dumps carry values as recorded: credentials redacted (core.redact)
        env = tables["env"]
        for col in env.columns[env.dtypes == object]:
            env[col] = env[col].map(redact_value)
    tables[FILES_TABLE] = pd.DataFrame([{
        "source": f.path, "kind": f.result.kind, "kinds": ",".join(f.result.kinds), "num_records": f.num_records, "num_lines": f.result.num_lines,
        "num_unparsed_lines": f.result.unparsed, "warnings": redact_text(json.dumps(f.result.warnings)),
        "unparsed_lines": redact_text(json.dumps(list(f.result.unparsed_lines))),
    } for f in files])
    return tables


def _table(parts: list[tuple[str, PackedTable]]) -> pd.DataFrame:
    order: dict[str, None] = {}
    for _, p in parts:
        names = list(p.columns)
        if "run" not in p.columns:  # the run key each record gets after its own keys
            names.insert(p.first_keys, "run")
        order.update(dict.fromkeys(names))
    nan = float("nan")
    columns: dict[str, list[Any]] = {}
    for name in order:
        col: list[Any] = []
        for run, p in parts:
            if name == "run":
                col += [run if v is MISSING else v for v in p.columns["run"]] if "run" in p.columns else [run] * p.num_rows
            elif name in p.columns:
                col += p.columns[name]
            else:
                col += [MISSING] * p.num_rows
        columns[name] = [nan if v is MISSING else v for v in col] if any(v is MISSING for v in col) else col
    return pd.DataFrame(columns)


def merge_campaign_steps(campaign, tables: dict[str, pd.DataFrame]):
    """The campaign's StepRow-shaped steps plus the raw steps rows of runs it does not hold
    (e.g. a torchtitan log without a model shape), so one steps.parquet serves both."""
    kernels = tables.get("kernels")
    if kernels is not None and not kernels.empty:  # profiler / nsys summaries: section 5's evidence
        campaign = dataclasses.replace(campaign, kernel_summaries=kernels)
    raw = tables.get("steps")
    if raw is None:
        return campaign
    rest = raw[~raw["run"].isin(set(campaign.steps["run"]))]
    steps = pd.concat([campaign.steps, rest], ignore_index=True) if not rest.empty else campaign.steps
    return dataclasses.replace(campaign, steps=steps)


def write_thirdparty_tables(tables: dict[str, pd.DataFrame], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write each table as ``<name>.parquet`` (atomic) with schema_version in its metadata. An
    integer beyond int64 (a log's digits, not a count any run makes) is written as missing."""
    written = []
    for name, df in tables.items():
        df = df.copy()
        for col in df.columns[df.dtypes == object]:  # no Parquet integer holds it: pyarrow raised OverflowError
            huge = df[col].map(lambda v: type(v) is int and not -(2**63) <= v < 2**63)
            if huge.any():
                kept = df[col].where(~huge, None)
                ints = kept.dropna().map(lambda v: type(v) is int).all()
                df[col] = pd.array(kept.tolist(), dtype="Int64") if ints else kept
        for col in df.columns:  # mixed-type object columns (e.g. value) are written as text
            if df[col].dtype == object and df[col].map(type).nunique() > 1:
                df[col] = df[col].map(lambda v: None if v is None or (isinstance(v, float) and pd.isna(v)) else str(v))
        table = pa.Table.from_pandas(df, preserve_index=False)
        kv = dict(table.schema.metadata or {})
        kv[b"schema_version"] = json.dumps(SCHEMA_VERSION).encode()
        kv[b"table"] = name.encode()
        sink = pa.BufferOutputStream()
        pq.write_table(table.replace_schema_metadata(kv), sink)
        written.append(write_bytes_atomic(Path(out_dir) / f"{name}.parquet", sink.getvalue().to_pybytes()))
    return written


def summary_line(f: IngestedFile) -> str:
    r = f.result
    also = [k for k in r.kinds if k != r.kind]
    return f"{f.path}: {r.kind}" + (f" (with {', '.join(also)})" if also else "") + (
        f", {f.num_records} records, {r.unparsed} unparsed lines") + (
        f", {len(r.warnings)} warnings" if r.warnings else "")


def strict_problems(files: list[IngestedFile]) -> list[str]:
    """``file:line`` of unparsed content (first MAX_STRICT_LINES per file)."""
    out = []
    for f in files:
        lines = f.result.unparsed_lines
        out.extend(f"{f.path}:{n}: unparsed ({f.result.kind})" for n in lines[:MAX_STRICT_LINES])
        if f.result.unparsed > MAX_STRICT_LINES:
            out.append(f"{f.path}: ... {f.result.unparsed - MAX_STRICT_LINES} more unparsed lines")
    return out


# ---------------------------------------------------------------- third-party run -> Campaign

MODEL_KEYS = ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "seq_length", "vocab_size",
              "global_batch_size", "world_size", "tp_degree", "pp_degree", "micro_batch_size")
TEXT_KEYS = ("dtype", "gpu_name", "position_embedding")
# Megatron argument dump -> our names (a new alias is one row).
_MEGATRON_ARGS = {
    "num_layers": "num_layers", "hidden_size": "hidden_size", "num_attention_heads": "num_heads",
    "ffn_hidden_size": "ffn_hidden_size", "seq_length": "seq_length", "padded_vocab_size": "padded_vocab_size",
    "vocab_size": "vocab_size", "global_batch_size": "global_batch_size", "world_size": "world_size",
    "tensor_model_parallel_size": "tp_degree", "pipeline_model_parallel_size": "pp_degree",
    "micro_batch_size": "micro_batch_size", "position_embedding_type": "position_embedding",
}


def parse_model_flags(text: str) -> dict:
    """``num_layers=24,hidden_size=2048,dtype=bf16`` -> dict. Raises ConfigError naming bad keys."""
    from core.errors import ConfigError

    out, bad = {}, []
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or key not in MODEL_KEYS + TEXT_KEYS:
            bad.append(item)
            continue
        try:
            out[key] = value if key in TEXT_KEYS else int(value)
        except ValueError:
            bad.append(item)
    if bad:
        raise ConfigError(f"--model: cannot use {', '.join(bad)}; write KEY=VALUE pairs with KEY in "
                          f"{', '.join(MODEL_KEYS + TEXT_KEYS)}")
    return out


def _env_records(files: list[IngestedFile]) -> list[dict]:
    return [r for f in files for r in f.rows("env")]


def count_params(*, num_layers: int, hidden_size: int, ffn_hidden_size: int, vocab_size: int, seq_length: int,
                 learned_positions: bool) -> tuple[int, int]:
    """(parameters, position-embedding parameters) of a GPT (Megatron-LM / GPT-2 layout: biases,
    two LayerNorms per layer plus a final one, tied input/output embedding counted once):
    core.formulas.count_params. Per layer: 4H^2 + 4H (QKV + projection) + 2HF + F + H (MLP) + 4H
    (LayerNorms); the head count does not change it."""
    from core.formulas import ModelShape, count_params as count_shape_params

    shape = ModelShape(name="log", num_layers=num_layers, hidden_size=hidden_size, num_heads=1, num_kv_heads=1,
                       ffn_hidden_size=ffn_hidden_size, vocab_size=vocab_size,
                       max_position_embeddings=seq_length if learned_positions else None)
    return count_shape_params(shape), seq_length * hidden_size if learned_positions else 0


def _topology_text(files: list[IngestedFile]) -> str | None:
    recs = [r for f in files for r in f.rows("comm_topology")]
    lines = summarize_nccl_topology(recs)
    return "\n".join(lines) if lines else None


def build_env_record(files: list[IngestedFile]) -> dict:
    """An env.json-shaped object (decoded into core.records.EnvRecord like env.json) from env/topology records."""
    env = {}
    for r in _env_records(files):
        env.setdefault(r["key"], redact_value(r["value"]))
    versions = {label: env[key] for label, key in (
        ("NCCL", "nccl_version"), ("torch", "torch_version"), ("CUDA (torch build)", "cuda_build_version"),
        ("CUDA runtime", "cuda_runtime_version"), ("CUDA driver (NCCL)", "cuda_driver_version"),
        ("NVIDIA driver", "driver_version"), ("Python", "python_version"), ("NCCL network", "nccl_network"),
        ("NCCL net plugin", "nccl_net_plugin")) if env.get(key)}
    gpus = []
    if env.get("gpu_models"):
        for item in str(env["gpu_models"]).split("; "):
            idx, _, name = item.partition(": ")
            gpus.append({"index": int(idx.split()[-1]) if idx.split()[-1].isdigit() else None, "name": name or item,
                         "driver_version": env.get("driver_version")})
    env_vars = {k: v for k, v in env.items() if k.startswith(("NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "OMP_"))}
    return {"schema_version": SCHEMA_VERSION, "os": env.get("os"), "versions": versions, "gpus": gpus,
            "topology": _topology_text(files), "env_vars": env_vars,
            "launch_command": [env["launch_command"]] if env.get("launch_command") else None,
            "sources": sorted({f.path for f in files})}


def build_thirdparty_campaign(files: list[IngestedFile], *, name: str, model: dict | None = None):
    """A ``Campaign`` (ingest.io) with one run per training log that has iteration rows, so
    ``report build`` renders third-party runs like ours. The model shape comes from the log's
    argument dump, overridden by ``model`` (CLI ``--model``). Returns None when no file has
    steps. Raises ConfigError when the shape needed for the note is unknown."""
    from core.errors import ConfigError
    from ingest.io import build_campaign

    timed = {f.path: [r for r in f.rows("steps") if _has_timing(r)] for f in files}  # each file's rows read once
    train = [f for f in files if timed[f.path]]
    if not train:
        return None
    shape: dict = {}
    for r in _env_records(train):
        if r["key"].startswith("megatron."):
            k = _MEGATRON_ARGS.get(r["key"][len("megatron."):])
            if k and k not in shape:
                shape[k] = r["value"] if k in TEXT_KEYS else _int(r["value"])
            if r["key"] in ("megatron.bf16", "megatron.fp16") and r["value"] == "True":
                shape.setdefault("dtype", r["key"][len("megatron."):])
    shape.update(model or {})
    if not shape.get("vocab_size") and shape.get("padded_vocab_size"):
        shape["vocab_size"] = shape["padded_vocab_size"]  # Megatron's dump: the embedding table's size
    steps_all = [r for f in train for r in timed[f.path]]
    gbs = shape.get("global_batch_size") or next((r.get("global_batch_size") for r in steps_all if r.get("global_batch_size")), None)
    if gbs:
        shape["global_batch_size"] = gbs
    world = shape.get("world_size") or max((r.get("num_ranks") or 0 for f in files for r in f.rows("comm_topology")
                                            if r.get("record") in ("comm_init", "init_complete")), default=0) or None
    missing = [k for k in ("num_layers", "hidden_size", "num_heads", "seq_length", "vocab_size", "global_batch_size")
               if not shape.get(k)]
    if missing or not world:
        raise ConfigError(f"{name}: the training log does not say {', '.join(missing + ([] if world else ['world_size']))}; "
                          f"pass them with `ingest ... --model KEY=VALUE,...` (keys: {', '.join(MODEL_KEYS + TEXT_KEYS)})")
    ffn = shape.get("ffn_hidden_size") or 4 * shape["hidden_size"]
    learned = shape.get("position_embedding", "learned_absolute") in ("learned", "learned_absolute")
    num_params, pos = count_params(num_layers=shape["num_layers"], hidden_size=shape["hidden_size"], ffn_hidden_size=ffn,
                                   vocab_size=shape["vocab_size"], seq_length=shape["seq_length"], learned_positions=learned)
    tp, pp = shape.get("tp_degree") or 1, shape.get("pp_degree") or 1
    world_note = None if shape.get("world_size") else Message(
        N_("%(name)s: world size %(world)s taken from the NCCL communicator in the same folder"), name=name, world=world)
    problems = [f"{f.path}: {f.result.unparsed} unparsed lines ({f.result.kind})" for f in files if f.result.unparsed]
    if not shape.get("tp_degree") or not shape.get("pp_degree"):
        problems.append(Message(N_("%(name)s: parallel layout not in the log; TP/PP shown as given or 1"), name=name))
    if world_note:
        problems.append(world_note)
    problems.append(Message(N_("%(name)s: parameter count computed from the model shape (GPT layout, tied embedding), not "
                               "reported by the run"), name=name))
    env = build_env_record(files)
    gpu_name = shape.get("gpu_name") or next((g["name"] for g in env["gpus"] if g.get("name")), None)
    tokens_per_step = shape["global_batch_size"] * shape["seq_length"]
    fixed = {"preset": N_("third-party log"), "model": {
        "num_layers": shape["num_layers"], "hidden_size": shape["hidden_size"], "num_heads": shape["num_heads"],
        "ffn_hidden_size": ffn, "seq_length": shape["seq_length"], "vocab_size": shape["vocab_size"],
        "padded_vocab_size": shape.get("padded_vocab_size") or shape["vocab_size"]},
        "global_batch_size": shape["global_batch_size"], "dtype": shape.get("dtype"), "seed": None, "steps": None,
        "warmup_steps": 0, "lr": None, "min_lr": None, "lr_warmup_steps": None, "weight_decay": None,
        "adam_beta1": None, "adam_beta2": None, "grad_clip": None, "data": N_("as in the original run")}
    runs, step_rows = [], []
    for f in train:
        run = Path(f.path).stem
        rows, derived = derive_step_times(timed[f.path],
                                          global_batch_size=shape["global_batch_size"],
                                          seq_length=shape["seq_length"], world_size=world)
        if derived:
            problems.append(Message(N_("%(run)s: the log prints no iteration time; step time derived from %(derived)s "
                                       "(tokens per step ÷ the framework's throughput), so tokens/s and MFU restate its "
                                       "throughput"), run=run, derived=derived))
        fixed["steps"] = max(r["step"] for r in rows)
        runs.append({"run": run, "campaign": name, "strategy": f"{f.result.kind} log", "engine": f.result.kind,
                     "world_size": world, "tp_degree": tp, "pp_degree": pp, "dp_degree": max(world // (tp * pp), 1),
                     "micro_batch_size": shape.get("micro_batch_size"), "num_microbatches": 1, "device": "cuda",
                     "backend": "nccl", "options": "{}", **{k: v for k, v in fixed.items() if k != "model"},
                     **fixed["model"], "tokens_per_step": tokens_per_step, "status": "ok", "exit_code": None,
                     "cause": None, "num_params": num_params, "num_params_position_embedding": pos,
                     "device_name": gpu_name, "num_gpus": world, "num_metric_files": 1, "num_metric_rows": len(rows)})
        wall = 0.0
        for r in rows:
            wall += r["step_time_s"]
            raw = {k: v for k, v in r.items() if k != "table"}
            step_rows.append({**raw, "schema_version": SCHEMA_VERSION, "run": run, "rank": r.get("rank") or 0, "step": r["step"],
                              "step_time_s": r["step_time_s"], "tokens": tokens_per_step, "loss": r.get("loss"),
                              "lr": r.get("lr"), "grad_norm": r.get("grad_norm"),
                              "mem_peak_allocated_gib": r.get("mem_max_allocated_gib"),
                              "mem_peak_reserved_gib": r.get("mem_max_reserved_gib"), "data_wait_s": None,
                              "wall_time_s": wall, "engine": f.result.kind, "source": f.path, "line": r["line"],
                              "framework_tflops_per_gpu": r.get("framework_tflops_per_gpu"),
                              "framework_mfu": r.get("framework_mfu")})
    campaign = {"schema_version": SCHEMA_VERSION, "name": name, "runs": [r["run"] for r in runs], "fixed": fixed,
                "created_at": None, "tool_version": None, "source": "third-party logs"}
    steps = pd.DataFrame(step_rows).astype({c: "float64" for c in ("loss", "lr", "grad_norm", "mem_peak_allocated_gib",
                                                                    "mem_peak_reserved_gib", "data_wait_s",
                                                                    "framework_tflops_per_gpu", "framework_mfu")})
    runs_df = pd.DataFrame(runs)
    for c in ("micro_batch_size", "exit_code", "seed", "steps", "lr_warmup_steps"):
        runs_df[c] = runs_df[c].astype("Int64")
    return build_campaign(source=name, campaign_json=campaign, env_json=env, runs=runs_df, steps=steps, problems=problems)


def _has_timing(r: dict) -> bool:
    return any(r.get(k) is not None for k in ("step_time_s", "tokens_per_s_per_gpu", "samples_per_s"))


def derive_step_times(rows: list[dict], *, global_batch_size: int, seq_length: int,
                      world_size: int) -> tuple[list[dict], str | None]:
    """Step rows with ``step_time_s``; rows that only carry the framework's throughput get a
    step time derived from it: torchtitan ``tps`` (tokens/s per GPU) -> global_batch_size x
    seq_length / (tps x world_size); DeepSpeed ``SamplesPerSec`` (global samples/s, ThroughputTimer
    in deepspeed/utils/timer.py) -> global_batch_size / samples_per_s. Returns (rows, what it
    was derived from, or None when every row had a measured time)."""
    out, derived = [], None
    for r in rows:
        if r.get("step_time_s") is None:
            if r.get("tokens_per_s_per_gpu"):
                r = {**r, "step_time_s": global_batch_size * seq_length / (r["tokens_per_s_per_gpu"] * world_size)}
                derived = Message(N_("torchtitan's tps (tokens/s per GPU)"))
            elif r.get("samples_per_s"):
                r = {**r, "step_time_s": global_batch_size / r["samples_per_s"]}
                derived = Message(N_("DeepSpeed's SamplesPerSec"))
            else:
                continue
        out.append(r)
    return out, derived


def _int(text: str) -> int | None:
    try:
        return int(str(text).strip())
    except ValueError:
        return None


def is_thirdparty_folder(path: str | os.PathLike[str]) -> bool:
    """A directory that is neither a campaign (campaign.json) nor a tables dir (runs.parquet)
    but holds files: what ``report build`` hands to ``load_thirdparty_campaign``."""
    root = Path(path)
    if not root.is_dir() or (root / "campaign.json").is_file() or (root / "runs.parquet").is_file():
        return False
    return any(f.is_file() for f in root.rglob("*"))


JOB_STATUS = {"oom": "oom", "hang": "hang", "failed": "crash"}  # ingest.jobs status -> a run's status


def load_thirdparty_jobs(path: str | os.PathLike[str], *, model: dict | None = None):
    """Parse every file of a folder of third-party logs and group them into jobs (ingest.jobs).
    Returns (campaign, tables, jobs): campaign is the one training job's Campaign (its own files
    only; status from its failure lines) when exactly one job has iteration times, else None
    (several unrelated jobs are never made runs of one campaign). Raises NoDataError when no file
    is of a kind ingest reads, ConfigError when the one training job's shape is unknown."""
    from ingest.jobs import compute_jobs

    files = ingest_files(find_artifacts([str(path)]))
    if not any(f.result.kind in PARSED_KINDS for f in files):
        raise NoDataError(f"{path}: is not a campaign (no campaign.json) nor a tables dir (no runs.parquet), and none of "
                          "its files is a log ingest reads; run `runner all`, or pass a folder of NCCL / Megatron-LM / "
                          "DeepSpeed / torchtitan logs")
    tables = build_tables(files)
    jobs = compute_jobs(tables, model=model)
    tables.update(compute_trace_attribution(files, jobs))
    train = [j for j in jobs if j.has_steps]
    if len(train) != 1:
        return None, tables, jobs
    own = [f for f in files if f.path in set(train[0].sources)]
    campaign = build_thirdparty_campaign(own, name=Path(path).resolve().name, model=model)
    if campaign is None:
        return None, tables, jobs
    return merge_campaign_steps(apply_job_status(campaign, train[0]), build_tables(own)), tables, jobs


def apply_job_status(campaign, job):
    """The campaign whose run is ``job``'s, with the job's failure as the run's status and cause
    (an OOM, hang or crash the logs show; JOB_STATUS), else unchanged."""
    status = JOB_STATUS.get(job.status)
    if not status:
        return campaign
    runs = campaign.runs.copy()
    runs["status"] = status
    first = job.first_failure
    runs["cause"] = f"{first.label}: {first.detail} [{first.source}:{first.line}]" if first else None
    return dataclasses.replace(campaign, runs=runs)


def load_thirdparty_campaign(path: str | os.PathLike[str], *, model: dict | None = None):
    """Parse every file of a folder of third-party logs into a Campaign (model shape from the
    logs, or ``model``). Raises NoDataError (no training log with iteration times) or
    ConfigError (shape unknown: says how to pass it)."""
    files = ingest_files(find_artifacts([str(path)]))
    if not any(f.result.kind in PARSED_KINDS for f in files):
        raise NoDataError(f"{path}: is not a campaign (no campaign.json) nor a tables dir (no runs.parquet), and none of "
                          "its files is a log ingest reads; run `runner all`, or pass a folder of NCCL / Megatron-LM / "
                          "DeepSpeed / torchtitan logs")
    campaign = build_thirdparty_campaign(files, name=Path(path).resolve().name, model=model)
    if campaign is None:
        kinds = ", ".join(f"{Path(f.path).name}: {f.result.kind}" for f in files)
        raise NoDataError(f"{path}: no training log with iteration times among the files ({kinds}); "
                          "add a Megatron-LM/DeepSpeed log or run `runner all`")
    return merge_campaign_steps(campaign, build_tables(files))
