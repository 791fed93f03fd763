"""A small, seeded slice of benchmarks/fuzz.py in CI: mutated fixtures through every parser and
mutated campaign files through the report builder raise nothing but ToolError. The full run
(>= 10,000 inputs each) is recorded in benchmarks/results/fuzz.json."""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _fuzz_module():
    spec = importlib.util.spec_from_file_location("fuzz", ROOT / "benchmarks" / "fuzz.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_parsers_survive_mutations():
    result = _fuzz_module().fuzz_parsers(400, random.Random(7))
    assert result["inputs"] >= 400 and result["uncaught"] == 0, result["failures"]


def test_report_builder_survives_mutated_artifacts():
    result = _fuzz_module().fuzz_report(60, random.Random(11))
    assert result["uncaught"] == 0, result["failures"]
    assert result["note"] > 0 and result["tool_error"] > 0  # both outcomes were exercised


def test_cli_level_mutated_campaigns():
    """runner status, ingest and report build on user-level mutations (NaN, duplicates, symlinks,
    FIFOs, path-like run names, deep JSON): no traceback, no hang, no impossible number in the
    note's metric table, nothing read or written outside the campaign."""
    result = _fuzz_module().fuzz_cli(45, random.Random(5), limit_s=60)
    assert result["inputs"] >= 45 and result["ok"] > 0 and result["error"] > 0
    for key in ("traceback", "hang", "impossible_number", "outside_access"):
        assert result[key] == 0, (key, result["failures"])


def test_hostile_inputs_no_traceback_hang_escape_or_impossible_number():
    """Special files (FIFO, symlink loops, /dev/zero), deep TOML/JSON nesting, huge and tiny
    numbers, gzip bombs and malformed TOML/JSON/JSONL through runner, ingest and report build
    (a seeded slice of benchmarks/fuzz.py --only-hostile)."""
    result = _fuzz_module().fuzz_hostile(40, random.Random(13), limit_s=20)
    assert result["inputs"] == 40 and result["error"] > 0
    for key in ("traceback", "hang", "escape", "impossible_number"):
        assert result[key] == 0, (key, result["failures"])


def test_thirdparty_tables_take_an_integer_beyond_int64(tmp_path):
    """Found by the hostile fuzz (seed 2381486149): a log number > 2^63 stopped ingest with
    'internal error OverflowError'; it is written as missing."""
    import pandas as pd
    import pyarrow.parquet as pq

    from ingest.thirdparty import write_thirdparty_tables

    write_thirdparty_tables({"steps": pd.DataFrame({"step": [1, 10**30], "x": [1.0, 2.0]})}, tmp_path)
    assert pq.read_table(tmp_path / "steps.parquet").to_pandas()["step"].tolist()[0] == 1
