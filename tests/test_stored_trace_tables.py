"""`report build` reads a run's stored trace tables (<run>/tables/, written when the run ended)
instead of analysing its traces again, whenever the tables' fingerprint matches the run's files."""
from __future__ import annotations

from pathlib import Path

import pytest

import ingest.io as io

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-2gpu"


def test_committed_tables_are_read_not_recomputed(monkeypatch):
    def recompute(*args, **kwargs):
        raise AssertionError(f"trace tables recomputed for {kwargs.get('name')}: the stored fingerprint did not match")

    monkeypatch.setattr(io, "compute_run_trace_tables", recompute)
    tables = io.load_trace_tables(io.load_campaign(EXAMPLE))
    assert tables is not None
    assert set(tables.breakdown["run"]) == {"ddp", "zero3", "zero3-fsdp2", "megatron-tp2", "megatron-pp2"}


def test_tables_of_other_inputs_are_not_used(tmp_path):
    import shutil

    run = tmp_path / "ddp"
    shutil.copytree(EXAMPLE / "ddp", run)
    shutil.copytree(EXAMPLE / "commbench", tmp_path / "commbench")  # the what-if at its bandwidth reads it
    row = next(r for r in io.load_campaign(EXAMPLE).runs.to_dict("records") if r["run"] == "ddp")
    pp_degree, num_microbatches = io._run_layout(row)
    fingerprint = io.trace_tables_fingerprint(run, pp_degree=pp_degree, num_microbatches=num_microbatches)
    assert io.read_trace_tables(run / io.RUN_TABLES_DIR, inputs=fingerprint) is not None
    with (run / "logs" / "rank0.log").open("a") as f:  # the rank log grew after the tables were written
        f.write("one more line\n")
    changed = io.trace_tables_fingerprint(run, pp_degree=pp_degree, num_microbatches=num_microbatches)
    assert io.read_trace_tables(run / io.RUN_TABLES_DIR, inputs=changed) is None
    assert io.read_trace_tables(run / io.RUN_TABLES_DIR,
                                inputs={**fingerprint, "analysis": io.TRACE_ANALYSIS_VERSION + 1}) is None
    shutil.rmtree(tmp_path / "commbench")  # tables computed with commbench are not those of a campaign without it
    (run / "logs" / "rank0.log").write_bytes((EXAMPLE / "ddp" / "logs" / "rank0.log").read_bytes())
    assert io.read_trace_tables(run / io.RUN_TABLES_DIR, inputs=io.trace_tables_fingerprint(
        run, pp_degree=pp_degree, num_microbatches=num_microbatches)) is None
