"""The what-if at `runner commbench`'s bandwidth: every collective replayed at the time commbench
measured for its op, size and group size (ingest.whatif), on the committed 2-GPU H200 campaign's
ZeRO-3 run and its real commbench results, and on commbench results changed to known extremes."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.records import TRANSFER_AT_COMMBENCH
from ingest.commbench import compute_bench_time_s
from ingest.io import compute_run_trace_tables

ROOT = Path(__file__).resolve().parents[1]
CAMPAIGN = ROOT / "examples" / "h200-2gpu"


def _savings_ms(tmp_path: Path, scale_time: float | None) -> dict[str, float]:
    """zero3's what-if savings (ms) with the campaign's commbench times multiplied by ``scale_time``
    (None: no commbench folder)."""
    camp = tmp_path / "camp"
    camp.mkdir(parents=True)
    shutil.copytree(CAMPAIGN / "zero3" / "trace", camp / "zero3" / "trace")
    if scale_time is not None:
        (camp / "commbench").mkdir()
        doc = json.loads((CAMPAIGN / "commbench" / "commbench.json").read_text())
        for row in doc["rows"]:  # a commbench row's bandwidths follow its time (nccl-tests)
            row["time_us"] *= scale_time
            row["algbw_gbps"] /= scale_time
            row["busbw_gbps"] /= scale_time
        (camp / "commbench" / "commbench.json").write_text(json.dumps(doc))
    spec = json.loads((CAMPAIGN / "zero3" / "spec.json").read_text())
    tables = compute_run_trace_tables(camp / "zero3", name="zero3", num_microbatches=spec["num_microbatches"])
    return {r.category: r.saving_s * 1e3 for r in tables.whatif.itertuples() if r.saving_s is not None}


def test_bench_time_is_linear_in_bytes_between_measured_sizes():
    rows = [{"op": "all_reduce", "nbytes": 1000, "world_size": 2, "time_us": 10.0},
            {"op": "all_reduce", "nbytes": 3000, "world_size": 2, "time_us": 30.0}]
    assert compute_bench_time_s(rows, op="all_reduce", nbytes=2000, num_ranks=2) == pytest.approx(20e-6)
    assert compute_bench_time_s(rows, op="all_reduce", nbytes=500, num_ranks=2) == pytest.approx(10e-6)
    assert compute_bench_time_s(rows, op="all_reduce", nbytes=6000, num_ranks=2) == pytest.approx(60e-6)
    assert compute_bench_time_s(rows, op="all_reduce", nbytes=2000, num_ranks=4) is None
    assert compute_bench_time_s(rows, op="all_gather", nbytes=2000, num_ranks=2) is None


def test_no_commbench_no_row(tmp_path):
    assert TRANSFER_AT_COMMBENCH not in _savings_ms(tmp_path, None)


def test_commbench_near_zero_time_saves_what_transfer_at_zero_saves(tmp_path):
    s = _savings_ms(tmp_path, 1e-9)
    assert s[TRANSFER_AT_COMMBENCH] == pytest.approx(s["transfer"], abs=1e-3)


def test_commbench_as_measured_and_ten_times_slower(tmp_path):
    """The real commbench results: this run's collectives were faster than commbench's, so the
    replayed step at commbench's times is longer (a negative saving); ten times slower costs more."""
    measured = _savings_ms(tmp_path / "a", 1.0)[TRANSFER_AT_COMMBENCH]
    slower = _savings_ms(tmp_path / "b", 10.0)[TRANSFER_AT_COMMBENCH]
    assert slower < measured < 0
