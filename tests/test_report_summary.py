"""summary.json beside the note: the same numbers as the note's metric table (one view-model),
valid JSON without NaN, environment and findings included."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from report.render import pct, si

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-1gpu"
RUNS = ("ddp", "zero3", "megatron-tp1-pp1")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("summary")
    res = subprocess.run([sys.executable, "-m", "report.cli", "build", str(EXAMPLE), "--out", str(out), "--format", "md"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert f"wrote {out / 'summary.json'}" in res.stdout
    text = (out / "summary.json").read_text()
    return json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}")), (out / "note.md").read_text()


def _metric_table(note_md: str) -> dict[str, list[str]]:
    table = {}
    for line in note_md.split("## 4. Metrics", 1)[1].split("## 5.", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in RUNS:
            table[cells[0]] = cells
    return table


def test_summary_numbers_equal_the_note_table(built):
    summary, note_md = built
    table = _metric_table(note_md)
    runs = {r["run"]: r for r in summary["runs"]}
    assert set(runs) == set(RUNS) == set(table)
    for run in RUNS:
        r, cells = runs[run], table[run]
        assert r["status"] == "ok" == cells[1]
        assert si(r["tokens_per_s"]) == cells[5]
        assert si(r["tokens_per_s_per_gpu"]) == cells[6]
        assert pct(r["mfu"]) == cells[7]
        assert 0.2 < r["mfu"] < 0.5 and r["tokens_per_s"] > 3e5
        assert r["mfu_convention"] == summary["mfu_convention"] == "6N+12LHQT"
        assert "h200" in r["peak_source"].lower() and r["peak_flops"] == pytest.approx(989.4e12)
        assert r["step_time_median_s"] <= r["step_time_p90_s"]
        assert r["loss_first"] > r["loss_last"]
        shares = r["breakdown"]  # every run of the example is traced
        assert sum(shares[k] for k in ("compute_share", "exposed_comm_share", "bubble_share", "data_stall_share",
                                       "other_share")) == pytest.approx(1.0, abs=0.02)


def test_summary_header_environment_findings(built):
    summary, _ = built
    assert summary["schema_version"] == 2 and summary["campaign"] == "h200-1gpu"
    env_json = json.loads((EXAMPLE / "env.json").read_text())
    assert summary["environment"]["nccl_version"] == env_json["versions"]["nccl"]
    assert summary["environment"]["gpu_name"] == "NVIDIA H200" and summary["environment"]["gpu_count"] == 1
    assert summary["tool_git_commit"] == json.loads((EXAMPLE / "campaign.json").read_text()).get(
        "tool_git_commit", env_json["tool_git_commit"])
    assert summary["findings"] and all(set(f) == {"kind", "runs", "evidence", "threshold"} for f in summary["findings"])
