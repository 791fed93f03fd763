"""`runner commbench` results -> CommBenchRow records (pure: parsed JSON in, records out).

Accepts the JSON rank 0 writes (``{"kind": "commbench", "rows": [...], ...}``). Rows whose
fields are missing or of the wrong type are counted unparsed with a warning naming the row and
field; the busbw of each row is checked against its algbw and bus factor (nccl-tests
doc/PERFORMANCE.md). File access is ingest.io's (load_commbench / write_commbench_table).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from core.formulas import COLLECTIVES, compute_bus_factor
from ingest.parsers import ParseResult
from core.records import SCHEMA_VERSION, CommBenchRow, record_problems

_FIELDS = {f.name: f.type for f in dataclasses.fields(CommBenchRow)}
_NUMERIC = {"nbytes": int, "world_size": int, "num_nodes": int, "num_iters": int, "time_us": float,
            "algbw_gbps": float, "busbw_gbps": float}
_POSITIVE = ("nbytes", "world_size", "num_nodes", "num_iters", "time_us")
_CHECKED = ("op", *_NUMERIC, "dtype", "backend", "device")


def parse_commbench(data: Any, *, source: str) -> ParseResult:
    """Validate a commbench.json document into records (``table`` = "commbench", the
    CommBenchRow fields, ``source``). A document that is not a commbench record gives no records
    and a warning; schema_version newer than ours is a warning per document."""
    if not isinstance(data, dict) or data.get("kind") != "commbench" or not isinstance(data.get("rows"), list):
        return ParseResult(records=[], unparsed=1, warnings=[f"{source}: not a `runner commbench` JSON document"],
                           kind="commbench")
    warnings = []
    if int(data.get("schema_version") or 0) > SCHEMA_VERSION:
        warnings.append(f"{source}: schema_version {data.get('schema_version')} is newer than {SCHEMA_VERSION}")
    records, unparsed = [], 0
    for i, row in enumerate(data["rows"]):
        problem = _row_problem(row)
        if problem:
            unparsed += 1
            warnings.append(f"{source}: row {i}: {problem}")
            continue
        rec = {k: row.get(k) for k in _FIELDS}
        rec.update({k: t(row[k]) for k, t in _NUMERIC.items()})
        rec["schema_version"] = int(row.get("schema_version") or SCHEMA_VERSION)
        n = rec["world_size"]
        expected = rec["algbw_gbps"] * compute_bus_factor(rec["op"], n) if n > 1 else 0.0
        if not math.isclose(expected, rec["busbw_gbps"], rel_tol=1e-6, abs_tol=1e-9):
            warnings.append(f"{source}: row {i}: busbw {rec['busbw_gbps']} != algbw x bus factor {expected}")
        records.append({"table": "commbench", "source": source, **rec})
    return ParseResult(records=records, unparsed=unparsed, warnings=warnings, kind="commbench",
                       num_lines=len(data["rows"]))


def _row_problem(row: Any) -> str | None:
    """The first reason a row is not a CommBenchRow with possible values, or None (other keys, such
    as the stored table's ``source``, are not looked at)."""
    if not isinstance(row, dict):
        return "not an object"
    # what a row must hold to be read (a whole-number float is an int, as JSON writers may print it)
    checked = {k: int(v) if _NUMERIC.get(k) is int and isinstance(v, float) and v.is_integer() else v
               for k, v in row.items() if k in _CHECKED}
    problems = record_problems(CommBenchRow, checked)
    if problems:
        return problems[0]
    if row["op"] not in COLLECTIVES:
        return f"op {row['op']!r} is not one of {', '.join(COLLECTIVES)}"
    for key in _NUMERIC:
        if row[key] < 0 or (key in _POSITIVE and row[key] <= 0):
            return f"{key}: must be positive, got {row[key]}"
    return None


def compute_bench_time_s(rows: Sequence[Mapping[str, Any]], *, op: str, nbytes: float,
                         num_ranks: int) -> float | None:
    """The time (s) `runner commbench` measured for ``op`` of ``nbytes`` over ``num_ranks`` ranks:
    linear in bytes between the two measured sizes around it (latency + bytes / bandwidth, the
    alpha-beta model), below the smallest size that size's time, above the largest that time
    scaled by bytes. rows: CommBenchRow dicts (op, nbytes, world_size, time_us). None when no row
    has this op at this world size, or nbytes is not a positive number."""
    if not (nbytes > 0 and math.isfinite(nbytes)):
        return None
    points = sorted((float(r["nbytes"]), float(r["time_us"])) for r in rows
                    if r.get("op") == op and int(r.get("world_size") or 0) == num_ranks
                    and r.get("nbytes") and r.get("time_us"))
    if not points:
        return None
    sizes, times = zip(*points)
    if nbytes >= sizes[-1]:
        return times[-1] * nbytes / sizes[-1] / 1e6
    return float(np.interp(nbytes, sizes, times)) / 1e6
