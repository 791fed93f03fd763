"""The committed H200 parity campaigns rebuild without a GPU, and their numbers trace to the
recorded artifacts: benchmarks/results/h200-parity.json equals the note's summary, and the kernel
parity table names the class that keeps the eager engines apart."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _summary_runs(note: Path) -> dict:
    return {r["run"]: r for r in json.loads((note / "summary.json").read_text())["runs"]}


@pytest.fixture(scope="module")
def parity(example_note) -> dict:
    """summary.json's runs of the example's note, built once per session (conftest)."""
    return _summary_runs(example_note("h200-1gpu-parity"))


def test_benchmark_result_is_the_campaign_summary(parity):
    result = json.loads((REPO / "benchmarks" / "results" / "h200-parity.json").read_text())
    for key, run in result["runs"].items():
        assert run["tokens_per_s"] == pytest.approx(parity[key]["tokens_per_s"], rel=1e-9), key


def test_parity_table_names_the_eager_engines_elementwise_kernels(parity):
    assert parity["ddp"]["parity"]["pass"] is True
    for eager in ("zero3-deepspeed", "megatron-tp1-pp1"):
        assert parity[eager]["parity"]["pass"] is False
        assert parity[eager]["parity"]["reason"].startswith("elementwise +")
    for run in parity.values():
        assert set(run["parity"]["ms_per_token"]) >= {"gemm", "attention", "loss", "optimizer", "elementwise"}


def test_deepspeed_knob_and_data_round_campaign_rebuilds(example_note):
    runs = _summary_runs(example_note("h200-1gpu-parity-data"))
    assert {"ddp", "ddp-real", "zero3-deepspeed", "zero3-deepspeed-persistent"} <= set(runs)
    assert runs["ddp-real"]["data_wait_median_s"] > runs["ddp"]["data_wait_median_s"]
    # two engines at equal math: the reference lies between them, so both are named, DeepSpeed above
    assert runs["zero3-deepspeed"]["parity"]["reason"].startswith("elementwise +")
    assert runs["ddp"]["parity"]["reason"].startswith("elementwise -")
    # the knob run is compared with the default-knob run of its layout, engine and data round
    note = (example_note("h200-1gpu-parity-data") / "note.md").read_text()
    assert ("**zero3-deepspeed-persistent** vs zero3-deepspeed (DeepSpeed; `zero.stage3_param_persistence_threshold`"
            " 1000000 → 100000000)") in note
    assert "**zero3-deepspeed-persistent-real** vs zero3-deepspeed-real" in note
