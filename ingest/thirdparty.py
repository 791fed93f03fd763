"""Third-party artifacts -> normalized Parquet tables (``ingest FILE|DIR ... [--out DIR] [--strict]``).

Each file's kind is detected by content (``ingest.parsers.detect_kind``), its lines streamed
through the matching pure parser, and the records gathered into tables: ``steps``,
``memory``, ``timers``, ``comm_topology``, ``collectives``, ``events``, ``env``, plus
``files`` (one row per input: kind, records, unparsed lines, warnings). Every table's
Parquet metadata carries ``schema_version``. Deliberately not here: file reading (ingest.io),
metric computation (report).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ingest.errors import NoDataError
from ingest.io import iter_text_lines, read_text_head, write_bytes_atomic
from ingest.parsers import HEAD_CHARS, ParseResult, detect_kind, parse_text
from ingest.schema import SCHEMA_VERSION

TABLES = ("steps", "memory", "timers", "comm_topology", "collectives", "events", "env")
FILES_TABLE = "files"
MAX_STRICT_LINES = 20  # file:line entries listed per file by --strict


@dataclass(frozen=True, kw_only=True)
class IngestedFile:
    path: str
    result: ParseResult


def find_artifacts(paths: list[str]) -> list[Path]:
    """Expand the CLI paths: files as given, directories to their regular files (sorted,
    recursive, hidden files and our own outputs skipped). Raises NoDataError when none."""
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(f for f in p.rglob("*") if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts)
                              and f.suffix not in (".parquet", ".pdf", ".html", ".png", ".svg", ".gz")))
        elif p.is_file():
            out.append(p)
        else:
            raise NoDataError(f"{p}: no such file or directory; pass log files or folders of them")
    if not out:
        raise NoDataError(f"{', '.join(paths)}: no files to ingest; pass log files or folders of them")
    return out


def ingest_file(path: str | os.PathLike[str]) -> IngestedFile:
    """Detect the kind of one file and parse it, streaming its lines."""
    kind = detect_kind(read_text_head(path, HEAD_CHARS))
    source = str(path)
    if kind is None:
        result = parse_text(iter_text_lines(path), source=source, kind="unknown")
    else:
        result = parse_text(iter_text_lines(path), source=source, kind=kind)
    return IngestedFile(path=source, result=result)


def build_tables(files: list[IngestedFile]) -> dict[str, pd.DataFrame]:
    """Records of all files -> one DataFrame per table (columns: union of the records' keys)."""
    rows: dict[str, list[dict]] = {t: [] for t in TABLES}
    for f in files:
        for rec in f.result.records:
            rec = dict(rec)
            rows.setdefault(rec.pop("table"), []).append(rec)
    tables = {name: pd.DataFrame(recs) for name, recs in rows.items() if recs}
    tables[FILES_TABLE] = pd.DataFrame([{
        "source": f.path, "kind": f.result.kind, "num_records": len(f.result.records), "num_lines": f.result.num_lines,
        "num_unparsed_lines": f.result.unparsed, "warnings": json.dumps(f.result.warnings),
        "unparsed_lines": json.dumps(list(f.result.unparsed_lines)),
    } for f in files])
    return tables


def write_thirdparty_tables(tables: dict[str, pd.DataFrame], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write each table as ``<name>.parquet`` (atomic) with schema_version in its metadata."""
    written = []
    for name, df in tables.items():
        df = df.copy()
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
    return f"{f.path}: {r.kind}, {len(r.records)} records, {r.unparsed} unparsed lines" + (
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
