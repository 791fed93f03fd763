"""`runner commbench` on CPU (gloo, 2 real processes through torchrun), its JSON/Parquet
table, `ingest` of it, and its use by the performance model."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ingest.commbench import parse_commbench
from core.errors import ConfigError
from ingest.io import load_commbench
from runner.cli import main as runner_main
from runner.commbench import CommBenchConfig, build_commbench_command, build_sizes, check_config, parse_size
from core.perfmodel import build_comm_model, compute_collective_time_s
from core.formulas import compute_bus_factor

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("commbench")
    res = subprocess.run([sys.executable, "-m", "runner.cli", "commbench", "--device", "cpu", "--nproc", "2",
                          "--ops", "all_reduce,all_gather,reduce_scatter,send_recv", "--min-bytes", "4K",
                          "--max-bytes", "64K", "--factor", "4", "--iters", "3", "--warmup", "1", "--out", str(out)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "busbw (GB/s)" in res.stdout and f"wrote {out / 'commbench.parquet'}" in res.stdout
    return out


def test_cpu_gloo_table_follows_nccl_tests_conventions(bench_dir):
    doc = json.loads((bench_dir / "commbench.json").read_text())
    assert doc["kind"] == "commbench" and doc["schema_version"] == 1 and doc["backend"] == "gloo"
    assert doc["world_size"] == 2 and doc["num_nodes"] == 1
    rows = doc["rows"]
    assert [(r["op"], r["nbytes"]) for r in rows] == [
        (op, n) for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv") for n in (4096, 16384, 65536)]
    for r in rows:
        assert r["world_size"] == 2 and r["device"] == "cpu" and r["time_us"] > 0
        assert r["algbw_gbps"] == pytest.approx(r["nbytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * compute_bus_factor(r["op"], 2))
    # the Parquet table holds the same rows
    parquet = load_commbench(bench_dir / "commbench.parquet")
    assert [(r["op"], r["nbytes"], r["time_us"]) for r in parquet] == [(r["op"], r["nbytes"], r["time_us"]) for r in rows]


def test_ingest_writes_the_table(bench_dir, tmp_path):
    res = subprocess.run([sys.executable, "-m", "ingest.cli", str(bench_dir), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert "commbench: 12 rows (all_gather, all_reduce, reduce_scatter, send_recv)" in res.stdout
    assert len(load_commbench(tmp_path / "commbench.parquet")) == 12


def test_model_uses_the_measured_curve(bench_dir):
    rows = load_commbench(bench_dir)
    comm = build_comm_model(rows, intra=None, inter=None, gpus_per_node=2)
    curve = comm.curve("all_reduce", "intra")
    assert curve.measured and curve.world_size == 2 and "runner commbench" in curve.source
    measured = {r["nbytes"]: r["time_us"] for r in rows if r["op"] == "all_reduce"}
    for nbytes, t_us in measured.items():  # at a measured point the model returns the measurement
        assert compute_collective_time_s(curve, nbytes=nbytes, group_size=2) * 1e6 == pytest.approx(t_us, rel=1e-6)


def test_gpu_plan_refuses_a_cpu_table(bench_dir, tmp_path, capsys):
    code = runner_main(["plan", "--model", "gpt-125m", "--gpus", "2", "--commbench", str(bench_dir),
                        "--out", str(tmp_path / "p.json")])
    assert code == 2 and "no GPU (NCCL) rows" in capsys.readouterr().err


def test_parser_counts_bad_rows_and_names_the_field():
    good = {"op": "all_reduce", "nbytes": 1024, "world_size": 4, "num_nodes": 1, "dtype": "float32", "num_iters": 5,
            "time_us": 10.0, "algbw_gbps": 0.1024, "busbw_gbps": 0.1536, "backend": "nccl", "device": "cuda"}
    doc = {"kind": "commbench", "schema_version": 1,
           "rows": [good, {**good, "op": "gather"}, {**good, "time_us": "fast"}, {**good, "busbw_gbps": 9.0}]}
    res = parse_commbench(doc, source="x.json")
    assert res.unparsed == 2 and len(res.records) == 2
    assert any("row 1: op 'gather'" in w for w in res.warnings)
    assert any("row 2: time_us: expected float, got str 'fast'" in w for w in res.warnings)
    assert any("row 3: busbw 9.0 != algbw x bus factor" in w for w in res.warnings)
    assert res.records[0]["busbw_gbps"] == pytest.approx(0.1024 * 1.5)
    other = parse_commbench({"campaign": "x"}, source="y.json")
    assert other.records == [] and "not a `runner commbench` JSON document" in other.warnings[0]


def test_sizes_and_config_checks():
    assert parse_size("64K") == 65536 and parse_size("1G") == 2**30 and parse_size("4096") == 4096
    cfg = CommBenchConfig(ops=("all_gather",), min_bytes=1000, max_bytes=100_000, step_factor=10, num_warmup=1,
                          num_iters=1, dtype="float32", device="cpu")
    assert build_sizes(cfg, world_size=3) == [1008, 10008, 100008]  # whole float32 chunks per rank
    bad = CommBenchConfig(ops=("gather",), min_bytes=10, max_bytes=5, step_factor=1, num_warmup=0, num_iters=0,
                          dtype="int8", device="tpu")
    with pytest.raises(ConfigError) as e:
        check_config(bad, nproc=0)
    assert str(e.value).count("\n") == 6  # seven problems, one line each


def test_multinode_command_uses_c10d(tmp_path):
    cmd = build_commbench_command(config_path=tmp_path / "c.json", out_dir=tmp_path, nproc=8, master_port=1,
                                  nnodes=2, rdzv_endpoint="node001:29500")
    assert "--rdzv-backend=c10d" in cmd and "--rdzv-endpoint=node001:29500" in cmd and "--nproc-per-node=8" in cmd
    assert cmd[cmd.index("-m", 3):][:3] == ["-m", "runner.commbench", "--worker"]


def test_bad_ops_is_exit_2(capsys, tmp_path):
    assert runner_main(["commbench", "--device", "cpu", "--ops", "all_reduce,bogus", "--out", str(tmp_path)]) == 2
    assert "--ops bogus: choose from" in capsys.readouterr().err


def test_parser_reads_whole_number_floats_and_ignores_extra_fields():
    """Rows other tools wrote: 1048576.0 for an int, a text schema_version, a device_name of
    another type: read as before; a wrong type where a number belongs still names the field."""
    row = {"op": "all_reduce", "nbytes": 1048576.0, "world_size": 2, "num_nodes": 1, "dtype": "float32",
           "num_iters": 5.0, "time_us": 10.0, "algbw_gbps": 104.8576, "busbw_gbps": 104.8576, "backend": "nccl",
           "device": "cuda", "schema_version": "1", "device_name": 7}
    res = parse_commbench({"kind": "commbench", "rows": [row, {**row, "op": 5}]}, source="x.json")
    assert len(res.records) == 1 and res.records[0]["nbytes"] == 1048576 and res.unparsed == 1
    assert any("row 1: op: expected str, got int 5" in w for w in res.warnings)
