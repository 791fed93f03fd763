"""The committed H200 engine campaign (examples/h200-1gpu-engines: DDP, ZeRO-3 under DeepSpeed
and FSDP2, TP1xPP1 under Megatron-core and torch) rebuilds into a note without a GPU; its
engine comparison and checkpoint numbers trace back to the raw artifacts."""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from report.render import duration, si

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-1gpu-engines"
ENGINES = {"ddp": "torch-ddp", "zero3-deepspeed": "deepspeed", "zero3-fsdp2": "fsdp2",
           "megatron-tp1-pp1": "megatron", "torch-tp1-pp1": "torch"}
FORMATS = {"ddp": "torch.distributed.checkpoint", "zero3-deepspeed": "deepspeed",
           "zero3-fsdp2": "torch.distributed.checkpoint", "megatron-tp1-pp1": "megatron.dist_checkpointing",
           "torch-tp1-pp1": "torch.distributed.checkpoint"}


@pytest.fixture(scope="module")
def note_md(example_note) -> str:
    """The example's note, built once per session (conftest)."""
    return (example_note("h200-1gpu-engines") / "note.md").read_text()


def _median_step_s(run: str) -> float:
    spec = json.loads((EXAMPLE / run / "spec.json").read_text())
    rows = [json.loads(x) for x in (EXAMPLE / run / "metrics" / "rank0.jsonl").read_text().splitlines()]
    return statistics.median(r["step_time_s"] for r in rows
                             if r["step"] >= spec["fixed"]["warmup_steps"] and not r.get("profiled"))


def test_five_engines_ran_on_the_h200_with_the_same_fixed_variables():
    env = json.loads((EXAMPLE / "env.json").read_text())
    assert env["gpu_count"] == 1 and env["gpus"][0]["name"] == "NVIDIA H200"
    fixed = set()
    for run, engine in ENGINES.items():
        assert json.loads((EXAMPLE / run / "status.json").read_text())["status"] == "ok"
        spec = json.loads((EXAMPLE / run / "spec.json").read_text())
        assert spec["engine"] == engine
        fixed.add(json.dumps(spec["fixed"], sort_keys=True))
        rows = [json.loads(x) for x in (EXAMPLE / run / "metrics" / "rank0.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == list(range(150))
        assert rows[0]["loss"] > 10.5 and rows[-1]["loss"] < 7.0
    assert len(fixed) == 1  # only the engine (and its knobs) changed


def test_every_engine_restores_its_own_sharded_checkpoint_to_the_same_loss():
    """Issue 5 on the GPU: save -> load -> replay gives the uninterrupted run's losses (bf16)."""
    for run, fmt in FORMATS.items():
        ckpt = json.loads((EXAMPLE / run / "checkpoint.json").read_text())
        assert ckpt["format"] == fmt and ckpt["step"] == 147 and ckpt["ok"] is True
        assert ckpt["max_abs_diff_nats"] <= ckpt["tolerance_nats"]
        assert ckpt["bytes_written"] > 1.3 * 2**30  # weights + fp32 AdamW state of 124M parameters
        rows = {r["step"]: r for r in map(json.loads, (EXAMPLE / run / "metrics" / "rank0.jsonl").read_text().splitlines())}
        assert list(ckpt["loss_uninterrupted"]) == pytest.approx([rows[s]["loss"] for s in ckpt["verify_steps"]])


def test_note_tables_and_engine_groups_trace_to_the_jsonl(note_md):
    table = {}
    metric_table = "| Run | Status |" + note_md.split("## 4. ", 1)[1].split("| Run | Status |", 1)[1].split("\n\n", 1)[0]
    for line in metric_table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in ENGINES:
            table[cells[0]] = cells
    assert set(table) == set(ENGINES)
    for run in ENGINES:
        assert table[run][3] == duration(_median_step_s(run))
        ckpt = json.loads((EXAMPLE / run / "checkpoint.json").read_text())
        assert table[run][12] == duration(ckpt["save_s"]) and table[run][13] == duration(ckpt["load_s"])
    section = note_md.split("### Same layout, different engine", 1)[1]
    for fast, slow, fast_name, slow_name in (("zero3-fsdp2", "zero3-deepspeed", "FSDP2", "DeepSpeed"),
                                             ("torch-tp1-pp1", "megatron-tp1-pp1", "torch-native", "Megatron-core")):
        ratio = _median_step_s(slow) / _median_step_s(fast)
        tps = 128 * 1024 / _median_step_s(fast), 128 * 1024 / _median_step_s(slow)
        assert (f"**{fast_name}** ({fast}) runs this layout at {ratio:.2f}× the tokens/s of {slow_name} ({slow}): "
                f"{si(tps[0])} vs {si(tps[1])} tokens/s") in section
    # one GPU: the layouts are degenerate, so the note books the whole gap as engine cost
    assert section.count("the whole gap to DDP is engine cost") == 2
    assert "Engine cost — kernels and host/launch gaps" in section


def test_one_gpu_commbench_is_ingested_but_prices_no_link(note_md):
    """`runner commbench` ran on the H200 (one rank): its table is read, and since one rank
    measures no link (bus bandwidth 0) the predictions say so and use the nominal NVLink."""
    from ingest.io import load_commbench
    rows = load_commbench(EXAMPLE / "commbench")
    assert {r["op"] for r in rows} >= {"all_reduce", "all_gather", "reduce_scatter"}
    assert all(r["world_size"] == 1 and r["device"] == "cuda" and r["busbw_gbps"] == 0 for r in rows)
    assert "measured no link (one rank: bus bandwidth 0)" in note_md and "Collectives: nominal NVLink" in note_md
