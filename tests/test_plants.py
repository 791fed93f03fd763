"""Planted causes, runner side: a run's ``plant`` table is validated (one line per problem, exit 2),
travels in spec.json, and the real engines on CPU/gloo carry it out -- a host delay on one rank,
a data delay on every rank, an explicit uneven pipeline split -- visibly in what the run records."""
from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError
from ingest.io import _field_problems
from core.records import Plant, RunSpec, run_spec_from_dict, to_dict
from runner.matrix import resolve_matrix
from runner.strategies.common import pipeline_layer_split

ROOT = Path(__file__).resolve().parent.parent
HOST_DELAY_S, DATA_DELAY_S = 0.15, 0.10


def _matrix(*runs: dict) -> dict:
    return {"campaign": {"name": "t", "preset": "tiny"}, "fixed": {}, "runs": list(runs)}


def _ddp(plant) -> dict:
    return {"name": "p", "strategy": "ddp", "world_size": 2, "plant": plant}


def _pp2(plant) -> dict:
    return {"name": "p", "strategy": "tp_pp", "engine": "torch", "world_size": 2, "pp_degree": 2, "plant": plant}


@pytest.mark.parametrize(("run", "fragment"), [
    (_ddp({"host_delay": 5}), "run 1 ('p') plant: unknown key 'host_delay' (valid: data_delay_ms, host_delay_ms,"
                              " host_delay_rank, pp_layers)"),
    (_ddp({"host_delay_ms": -1}), "plant host_delay_ms must be a finite number of milliseconds >= 0, got -1"),
    (_ddp({"data_delay_ms": float("nan")}), "data_delay_ms must be a finite number of milliseconds >= 0, got nan"),
    (_ddp({"data_delay_ms": float("inf")}), "plant data_delay_ms must be a finite number"),
    (_ddp({"data_delay_ms": True}), "plant data_delay_ms must be a finite number"),
    (_ddp({"host_delay_ms": 10, "host_delay_rank": 2}), "plant host_delay_rank must be a rank in [0, 2)"),
    (_ddp({"host_delay_ms": 10, "host_delay_rank": -1}), "plant host_delay_rank must be a rank in [0, 2)"),
    (_ddp({"host_delay_rank": 1}), "plant host_delay_rank without host_delay_ms"),
    (_ddp({}), "plant is empty; set one of"),
    (_ddp(5), "plant must be a table"),
    (_ddp({"pp_layers": [2, 2]}), "plant pp_layers needs a pipeline (strategy 'tp_pp' with pp_degree >= 2), got"
                                  " pp_degree 1"),
    (_pp2({"pp_layers": [1, 1, 2]}), "plant pp_layers [1, 1, 2] must have one entry >= 1 per stage (pp_degree 2)"
                                     " summing to num_layers 4"),
    (_pp2({"pp_layers": [1, 2]}), "summing to num_layers 4"),
    (_pp2({"pp_layers": [0, 4]}), "one entry >= 1 per stage"),
    (_pp2({"pp_layers": "1,3"}), "plant pp_layers must be a list of integers"),
    (_pp2({"pp_layers": [1, 3]}) | {"options": {"schedule": "Interleaved1F1B", "virtual_stages": 2}},
     "plant pp_layers needs schedule '1F1B'"),
])
def test_bad_plant_is_refused_naming_run_and_field(run, fragment):
    with pytest.raises(ConfigError) as err:
        resolve_matrix(_matrix(run), source="m.toml", num_gpus=0)
    lines = str(err.value).splitlines()
    assert any(fragment in line and line.startswith("m.toml run 1 ('p')") for line in lines), lines


def test_every_plant_problem_at_once_and_cli_exits_2(tmp_path):
    (tmp_path / "m.toml").write_text('[campaign]\npreset = "tiny"\n[[runs]]\nname = "a"\nstrategy = "ddp"\n'
                                     'plant = { host_delay_ms = -5, data_delay_ms = -1, colour = 1 }\n')
    res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--dry-run", "--matrix", str(tmp_path / "m.toml")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "unknown key 'colour'" in res.stderr and "host_delay_ms must be" in res.stderr
    assert "data_delay_ms must be" in res.stderr


def test_plant_resolves_round_trips_and_old_specs_load():
    camp = resolve_matrix(_matrix(
        {"name": "host", "strategy": "ddp", "plant": {"host_delay_ms": 40}},
        {"name": "both", "strategy": "ddp", "plant": {"host_delay_ms": 5, "host_delay_rank": 1, "data_delay_ms": 30}},
        {"name": "split", "strategy": "tp_pp", "engine": "torch", "pp_degree": 2, "plant": {"pp_layers": [1, 3]}},
        {"name": "clean", "strategy": "ddp"}), source="m", num_gpus=0)
    host, both, split, clean = camp.runs
    assert host.plant == Plant(host_delay_ms=40.0, host_delay_rank=0)  # rank defaults to 0
    assert both.plant == Plant(host_delay_ms=5.0, host_delay_rank=1, data_delay_ms=30.0)
    assert split.plant == Plant(pp_layers=(1, 3)) and pipeline_layer_split(split) == (1, 3)
    assert clean.plant is None and pipeline_layer_split(dataclass_replace(split, plant=None)) == (2, 2)
    for spec in camp.runs:
        raw = json.loads(json.dumps(to_dict(spec)))  # what spec.json holds
        assert run_spec_from_dict(raw) == spec and not _field_problems(RunSpec, raw)
    old = json.loads(json.dumps(to_dict(clean)))
    del old["plant"]  # a spec.json written before plants existed
    assert run_spec_from_dict(old).plant is None and not _field_problems(RunSpec, old)
    bad = json.loads(json.dumps(to_dict(host)))
    bad["plant"]["colour"] = 1
    assert _field_problems(RunSpec, bad) == ["plant.colour: unknown field"]


def dataclass_replace(spec, **kw):
    import dataclasses

    return dataclasses.replace(spec, **kw)


def test_dry_run_prints_the_plant():
    res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--dry-run", "--gpus", "1", "--matrix",
                          str(ROOT / "examples/matrices/1gpu-planted.toml")], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    runs = {line.split(":")[0][2:]: line for line in res.stdout.splitlines() if line.startswith("- ")}
    assert list(runs) == ["clean", "host-delay", "data-delay"]
    assert "plant=" not in runs["clean"]
    assert runs["host-delay"].endswith("plant={host_delay_ms = 40.0, host_delay_rank = 0}")
    assert runs["data-delay"].endswith("plant={data_delay_ms = 30.0}")
    assert "dtype bf16" in res.stdout and "60 steps" in res.stdout and "profiler window: steps 30..32" in res.stdout


# --- real runs: runner all on CPU, gloo, tiny preset ------------------------------------------

PLANTED_MATRIX = f"""
[campaign]
name = "planted"
preset = "tiny"
[fixed]
steps = 8
warmup_steps = 2
profile_start_step = 4   # warm-up step 3, traced step 4
profile_num_steps = 1
[[runs]]
name = "clean"
strategy = "ddp"
[[runs]]
name = "host"
strategy = "ddp"
plant = {{ host_delay_ms = {HOST_DELAY_S * 1e3}, host_delay_rank = 1 }}
[[runs]]
name = "data"
strategy = "ddp"
plant = {{ data_delay_ms = {DATA_DELAY_S * 1e3} }}
[[runs]]
name = "split"
strategy = "tp_pp"
engine = "torch"
pp_degree = 2
plant = {{ pp_layers = [1, 3] }}
"""


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("planted")
    (tmp / "m.toml").write_text(PLANTED_MATRIX)
    out = tmp / "camp"
    res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--matrix", str(tmp / "m.toml"), "--out",
                          str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for run in ("clean", "host", "data", "split"):
        assert json.loads((out / run / "status.json").read_text())["status"] == "ok", run
    return out


def _rows(run_dir: Path, rank: int) -> dict[int, dict]:
    lines = (run_dir / "metrics" / f"rank{rank}.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines)}


def _trace_ranges(run_dir: Path, rank: int, name: str) -> list[float]:
    """Durations (s) of the host ranges called ``name`` in the rank's profiler window."""
    trace = json.loads(gzip.decompress((run_dir / "trace" / f"profile_rank{rank}.json.gz").read_bytes()))
    return [e["dur"] / 1e6 for e in trace["traceEvents"] if e.get("name") == name and e.get("ph") == "X"]


def test_host_delay_makes_the_planted_rank_enter_late(planted):
    spec = run_spec_from_dict(json.loads((planted / "host" / "spec.json").read_text()))
    assert spec.plant == Plant(host_delay_ms=HOST_DELAY_S * 1e3, host_delay_rank=1)

    def lags(run: str) -> list[float]:  # rank 1's step entry after rank 0's
        r0, r1 = _rows(planted / run, 0), _rows(planted / run, 1)
        # step 5 follows each rank's own trace export (unequal host work): left out
        return [r1[s]["step_entry_time_s"] - r0[s]["step_entry_time_s"] for s in (1, 2, 3, 4, 6, 7)]

    assert all(HOST_DELAY_S * 0.8 <= lag <= HOST_DELAY_S * 2 for lag in lags("host")), lags("host")
    assert statistics.median(abs(x) for x in lags("clean")) < HOST_DELAY_S / 3, lags("clean")
    # rank 0 waits for the sleeper in every gradient all-reduce: its steps grow by the delay too
    for rank in (0, 1):
        slow = statistics.median(r["step_time_s"] for r in _rows(planted / "host", rank).values())
        fast = statistics.median(r["step_time_s"] for r in _rows(planted / "clean", rank).values())
        assert slow - fast >= HOST_DELAY_S * 0.8, (rank, slow, fast)
    # the sleep is a host range on the planted rank's training thread, and only there
    traced = _trace_ranges(planted / "host", 1, "plant_host_delay")
    assert traced and all(HOST_DELAY_S <= d <= HOST_DELAY_S * 1.5 for d in traced), traced
    assert _trace_ranges(planted / "host", 0, "plant_host_delay") == []


def test_data_delay_is_counted_as_data_wait_on_every_rank(planted):
    for rank in (0, 1):
        waits = [r["data_wait_s"] for r in _rows(planted / "data", rank).values()]
        assert len(waits) == 8 and statistics.median(waits) >= DATA_DELAY_S and min(waits) >= DATA_DELAY_S, waits
        clean = statistics.median(r["data_wait_s"] for r in _rows(planted / "clean", rank).values())
        assert clean < DATA_DELAY_S / 3, clean
        # inside the step's data range of the trace (the analysis' data-stall source)
        traced = _trace_ranges(planted / "data", rank, "data")
        assert traced and all(d >= DATA_DELAY_S for d in traced), (rank, traced)
    assert _trace_ranges(planted / "data", 0, "plant_host_delay") == []


def test_pp_layers_split_is_what_the_stages_built(planted):
    info = json.loads((planted / "split" / "run_info.json").read_text())
    assert info["pp_stage_num_layers"] == [1, 3]  # gathered from the built stage modules
    assert info["num_params"] == json.loads((planted / "clean" / "run_info.json").read_text())["num_params"]
    assert json.loads((planted / "clean" / "run_info.json").read_text())["pp_stage_num_layers"] is None
    last = _rows(planted / "split", 1)
    assert sorted(last) == list(range(8)) and all(r["loss"] is not None for r in last.values())
