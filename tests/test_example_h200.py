"""The committed H200 campaign (examples/h200-1gpu) rebuilds into a note without a GPU, and
its MFU column equals the formula applied to the raw JSONL with the H200's dense bf16 peak."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from report.render import pct, si

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-1gpu"
RUNS = ("ddp", "zero3", "megatron-tp1-pp1")
H200_BF16_DENSE_FLOPS = 989.4e12  # NVIDIA H200 SXM datasheet: 1,979 TFLOPS bf16 with sparsity / 2


@pytest.fixture(scope="module")
def note_md(example_note) -> str:
    """The example's note, built once per session (conftest); the PDF is laid out by test_layout."""
    return (example_note("h200-1gpu") / "note.md").read_text()


def test_gpu_campaign_is_real_and_complete():
    env = json.loads((EXAMPLE / "env.json").read_text())
    assert env["gpu_count"] == 1 and env["gpus"][0]["name"] == "NVIDIA H200"
    assert env["versions"]["deepspeed"] and env["versions"]["megatron_core"] and env["versions"]["nccl"]
    for run in RUNS:
        assert json.loads((EXAMPLE / run / "status.json").read_text())["status"] == "ok"
        rows = [json.loads(x) for x in (EXAMPLE / run / "metrics" / "rank0.jsonl").read_text().splitlines()]
        assert len(rows) >= 200
        assert rows[0]["tokens"] == 128 * 1024
        assert rows[0]["loss"] > 10.5 and rows[-1]["loss"] < 7.0  # from ~ln(50257) = 10.8 downwards
        assert "NCCL INFO" in (EXAMPLE / run / "logs" / "rank0.log").read_text()


def test_mfu_golden_from_jsonl(note_md):
    table = {}
    for line in note_md.split("## 4. Metrics", 1)[1].split("## 5.", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in RUNS:
            table[cells[0]] = cells
    assert set(table) == set(RUNS)
    for run in RUNS:
        info = json.loads((EXAMPLE / run / "run_info.json").read_text())
        spec = json.loads((EXAMPLE / run / "spec.json").read_text())
        model = spec["fixed"]["model"]
        n = info["num_params"] - info["num_params_position_embedding"]
        flops_per_token = 6 * n + 12 * model["num_layers"] * model["hidden_size"] * model["seq_length"]
        assert flops_per_token == 855_383_040  # GPT-2 124M with vocab padded to 50,304, T = 1024
        rows = [json.loads(x) for x in (EXAMPLE / run / "metrics" / "rank0.jsonl").read_text().splitlines()]
        median = statistics.median(r["step_time_s"] for r in rows
                                   if r["step"] >= spec["fixed"]["warmup_steps"] and not r.get("profiled"))
        tokens_per_s = 128 * 1024 / median
        mfu = tokens_per_s * flops_per_token / (1 * H200_BF16_DENSE_FLOPS)
        assert table[run][5] == si(tokens_per_s)
        assert table[run][7] == pct(mfu)
    assert "989 TFLOP/s dense" in note_md


def _ms(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"s": 1e3, "ms": 1.0, "µs": 1e-3}[unit]


def test_section5_breakdown_on_the_h200_traces(note_md):
    section = note_md.split("## 5. Evidence", 1)[1].split("## 6.", 1)[0]
    table_text = section.split("| Run | Timeline |", 1)[1].split("\n\n", 1)[0]  # this table only
    rows = [ln for ln in table_text.splitlines()[2:] if ln.startswith("| ")]
    table = {c[0]: c for c in ([x.strip() for x in ln.strip("|").split("|")] for ln in rows)}
    assert set(table) == set(RUNS)
    for run, cells in table.items():
        assert cells[1] == "gpu ×1"
        assert cells[4:9] == ["—", "—", "— / (no PP)", "—", "—"]  # categories live in the across-ranks table
        assert float(cells[3].rsplit("(", 1)[1].rstrip("%)")) <= 2.0, cells[3]
        assert float(cells[10].rstrip("%")) <= 2.0, cells[10]  # profiled steps cost <= 2% (issue 4)
    # the across-ranks table: each category's time spent / what removing it saves; spent tiles the traced step
    across = section.split("| Run | Traced step |", 1)[1].split("\n\n", 1)[0]
    rows = [[x.strip() for x in ln.strip("|").split("|")] for ln in across.splitlines()[2:] if ln.startswith("| ")]
    spent = {c[0]: [_ms(cell.split(" / ")[0].split(" (p90 ")[0]) for cell in c[2:10]] for c in rows}
    for c in rows:
        assert sum(spent[c[0]]) == pytest.approx(_ms(c[1]), rel=0.01), c
        assert _ms(c[10]) == pytest.approx(_ms(c[1]), rel=0.01)  # the replay of the trace as recorded
    # ZeRO-3 on one GPU leaves the GPU waiting on its host-side hooks: far more launch gaps than DDP
    assert spent["zero3"][5] > 5 * spent["ddp"][5]
