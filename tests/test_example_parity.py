"""The committed H200 parity campaigns rebuild without a GPU, and their numbers trace to the
recorded artifacts: benchmarks/results/h200-parity.json equals the note's summary, and the kernel
parity table names the class that keeps the eager engines apart."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _build(name: str, out: Path) -> dict:
    rep = subprocess.run([sys.executable, "-m", "report.cli", "build", str(REPO / "examples" / name), "--out", str(out),
                          "--format", "md"], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert rep.returncode == 0, rep.stderr
    return {r["run"]: r for r in json.loads((out / "summary.json").read_text())["runs"]}


@pytest.fixture(scope="module")
def parity(tmp_path_factory) -> dict:
    return _build("h200-1gpu-parity", tmp_path_factory.mktemp("parity"))


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


def test_deepspeed_knob_and_data_round_campaign_rebuilds(tmp_path):
    runs = _build("h200-1gpu-parity-data", tmp_path)
    assert {"ddp", "ddp-real", "zero3-deepspeed", "zero3-deepspeed-persistent"} <= set(runs)
    assert runs["ddp-real"]["data_wait_median_s"] > runs["ddp"]["data_wait_median_s"]
    # two engines at equal math: the reference lies between them, so both are named, DeepSpeed above
    assert runs["zero3-deepspeed"]["parity"]["reason"].startswith("elementwise +")
    assert runs["ddp"]["parity"]["reason"].startswith("elementwise -")
    # the knob run is compared with the default-knob run of its layout, engine and data round
    note = (tmp_path / "note.md").read_text()
    assert ("**zero3-deepspeed-persistent** vs zero3-deepspeed (DeepSpeed; `zero.stage3_param_persistence_threshold`"
            " 1000000 → 100000000)") in note
    assert "**zero3-deepspeed-persistent-real** vs zero3-deepspeed-real" in note
