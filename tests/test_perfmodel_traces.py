"""The performance model's communication checked against what the committed 2xH200 traces show:
Megatron TP2 with sequence parallelism issues all-gathers and reduce-scatters (6 + 4 per layer
per micro-batch), not 4 all-reduces, and torch DDP all-reduces fp32 gradients."""
from __future__ import annotations

from pathlib import Path

import pytest

from core.hardware import HARDWARE_TOML
from core.perfmodel import build_comm_model, build_run_layout, build_shape, load_links, predict_layout
from ingest.io import load_campaign, load_trace_tables

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "h200-2gpu"


@pytest.fixture(scope="module")
def campaign():
    c = load_campaign(EXAMPLE)
    return c, load_trace_tables(c)


def _predict(c, run_name: str):
    run = next(r for r in c.run_records() if r.name == run_name)
    fixed = c.campaign.fixed
    shape = build_shape(fixed.model, name="campaign")
    links = load_links(HARDWARE_TOML)
    comm = build_comm_model([], intra=links["nvlink4"], inter=None, gpus_per_node=2)
    lay = build_run_layout(run.spec, compiled=run.compiled)
    pred = predict_layout(shape, lay, seq_length=int(fixed.model.seq_length),
                          global_batch_size=int(fixed.global_batch_size), gpus_per_node=2, peak_flops=989.4e12,
                          compute_efficiency=0.4, comm=comm, memory_limit_bytes=140 * 2**30)
    return run, lay, pred


def test_sequence_parallel_tp_collectives_match_the_trace(campaign):
    c, tables = campaign
    run, lay, pred = _predict(c, "megatron-tp2")
    assert lay.sequence_parallel
    per_step = {cost.op: cost.num_calls for cost in pred.comm if cost.kind == "tp"}
    assert set(per_step) == {"all_gather", "reduce_scatter"}
    coll = tables.collectives[tables.collectives["run"] == "megatron-tp2"]
    steps = coll["step"].nunique()
    big = coll[coll["nbytes"] >= 1 << 20]  # the hidden-state collectives, not the scalar ones
    for op in ("all_gather", "reduce_scatter"):
        traced = int((big["kind"] == op).sum()) / steps
        assert per_step[op] == pytest.approx(traced, rel=0.10), op


def test_ddp_all_reduces_fp32_gradients_as_the_trace_shows(campaign):
    c, tables = campaign
    run, lay, pred = _predict(c, "ddp")
    assert lay.grad_reduce_bytes == 4
    dp = [cost for cost in pred.comm if cost.kind == "dp"]
    modelled = sum(cost.nbytes_per_step for cost in dp)
    coll = tables.collectives[(tables.collectives["run"] == "ddp") & (tables.collectives["kind"] == "all_reduce")]
    traced = float(coll["nbytes"].sum()) / coll["step"].nunique()
    assert modelled == pytest.approx(traced, rel=0.02)
