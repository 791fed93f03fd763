"""Tables in, note out: the trace tables `ingest` and the runner write give the note the raw
traces give (examples/h200-2gpu, section 5 included); stale or broken tables are not used."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from ingest.cli import main as ingest_main
from ingest.io import (
    RUN_TABLES_DIR, TRACE_TABLE_FILES, compute_run_trace_tables, ingest_run_traces, load_campaign,
    load_trace_tables, read_trace_tables,
)
from report.render import build_report

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-2gpu"


def _summary(path: Path, source: Path) -> dict:
    text = (path / "summary.json").read_text()
    return json.loads(text.replace(str(source), "SOURCE"))


def test_ingested_tables_folder_gives_the_campaigns_note(tmp_path):
    campaign = tmp_path / "campaign"
    shutil.copytree(EXAMPLE, campaign, ignore=shutil.ignore_patterns("report", RUN_TABLES_DIR))
    tables = tmp_path / "tables"
    assert ingest_main([str(campaign), "--out", str(tables)]) == 0
    assert {f"{n}" for n in TRACE_TABLE_FILES.values()} <= {p.name for p in tables.iterdir()}
    build_report(campaign, out_dir=tmp_path / "from_campaign", formats=["md"])
    build_report(tables, out_dir=tmp_path / "from_tables", formats=["md"])
    old = _summary(tmp_path / "from_campaign", campaign / "commbench")
    new = _summary(tmp_path / "from_tables", tables)
    # section 5 is there (not two empty notes agreeing): every run has its breakdown and attribution
    assert all(r["breakdown"] and r["breakdown_ms"] for r in old["runs"]), [r["run"] for r in old["runs"]]
    assert new == old
    # the note names where the commbench came from, the one difference
    note = (tmp_path / "from_campaign" / "note.md").read_text().replace(str(campaign / "commbench"), "SOURCE")
    assert (tmp_path / "from_tables" / "note.md").read_text().replace(str(tables), "SOURCE") == note

def test_run_tables_are_read_only_when_computed_from_the_present_traces(tmp_path):
    run = tmp_path / "c" / "ddp"
    shutil.copytree(EXAMPLE / "ddp", run, ignore=shutil.ignore_patterns(RUN_TABLES_DIR))
    written = ingest_run_traces(run, name="ddp")
    assert {p.name for p in written} == set(TRACE_TABLE_FILES.values())
    stored = read_trace_tables(run / RUN_TABLES_DIR)
    fresh = compute_run_trace_tables(run, name="ddp")
    assert stored.breakdown.equals(fresh.breakdown) and stored.nccl == fresh.nccl
    assert stored.warnings == fresh.warnings
    # a trace that changed after the tables were written: the tables are stale, not used
    assert read_trace_tables(run / RUN_TABLES_DIR, inputs={"files": [], "pp_degree": 1, "num_microbatches": 1}) is None


def test_runner_ingest_failure_is_a_warning_not_a_failed_run(tmp_path, capsys):
    from core.records import run_spec_from_dict
    from runner.launch import INGEST_LOG, ingest_traces

    spec = run_spec_from_dict(json.loads((EXAMPLE / "ddp" / "spec.json").read_text()))
    run = tmp_path / "ddp"
    (run / "trace").mkdir(parents=True)
    (run / "logs").mkdir()
    (run / "trace" / "profile_meta_rank0.json").write_text("{not json")
    assert ingest_traces(run, spec) == []
    assert "trace tables not written" in (run / "logs" / INGEST_LOG).read_text()
    assert "warning" in capsys.readouterr().err
