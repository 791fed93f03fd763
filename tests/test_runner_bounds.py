"""Hunt 33, the runner's bounds: integers past Python's 4,300-digit limit, matrices that expand
without end, corpora larger than memory, outputs that are not ours, stray files in node folders and
secrets in recorded values. Each test plants the hostile input as a real file and runs the real CLI
in a subprocess; the answer is one line and exit 2, never a traceback."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.synthetic_campaign import write_synthetic_campaign

ROOT = Path(__file__).resolve().parent.parent
BIG = "9" * 5000  # past sys.get_int_max_str_digits() (4,300)


def _runner(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _one_error_line(res: subprocess.CompletedProcess, *needles: str) -> str:
    assert res.returncode == 2, (res.args, res.stdout[-2000:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _resumable(camp: Path) -> Path:
    meta = json.loads((camp / "campaign.json").read_text())
    meta["supervision"] = {"run_timeout_s": 60, "stall_timeout_s": 30, "startup_timeout_s": 30}
    (camp / "campaign.json").write_text(json.dumps(meta))
    return camp


# ---- D. integers longer than 4,300 digits

def test_a_5000_digit_integer_in_spec_json_is_one_line(tmp_path):
    camp = _resumable(write_synthetic_campaign(tmp_path / "camp"))
    spec = camp / "ddp" / "spec.json"
    spec.write_text(re.sub(r'"world_size": *\d+', f'"world_size": {BIG}', spec.read_text()))
    assert BIG in spec.read_text()
    for cmd in (["status", str(camp)], ["all", "--resume", str(camp), "--dry-run"]):
        _one_error_line(_runner(*cmd), "ddp/spec.json", "more than 4,300 digits")


def test_a_5000_digit_step_in_a_metrics_row_is_skipped_by_the_progress_tail(tmp_path):
    """The row is counted, not returned (as any malformed row): what `runner status` and the live
    progress line read."""
    from runner.progress import MetricsTail

    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "rank0.jsonl").write_text(
        f'{{"step": 0, "loss": 2.5}}\n{{"step": {BIG}, "loss": 1.0}}\n{{"step": 1, "loss": 2.0}}\n')
    tail = MetricsTail(tmp_path)
    assert [r["step"] for r in tail.poll()] == [0, 1]
    assert tail.num_rows == 3 and tail.num_steps == 2


def test_a_5000_digit_integer_in_the_matrix_is_one_line(tmp_path):
    matrix = tmp_path / "bigint.toml"
    matrix.write_text(f'[campaign]\nname = "b"\npreset = "tiny"\n[fixed]\nsteps = {BIG}\n'
                      '[[runs]]\nname = "a"\nstrategy = "ddp"\nworld_size = 2\n')
    _one_error_line(_runner("all", "--matrix", str(matrix), "--dry-run"), str(matrix), "more than 4,300 digits")


# ---- E. a matrix that expands to millions of runs

def _matrix(path: Path, *, num_runs: int, campaign: str = "") -> Path:
    path.write_text(f'[campaign]\nname = "h"\npreset = "tiny"\n{campaign}\n'
                    + "".join(f'[[runs]]\nname = "r{i}"\nstrategy = "ddp"\n' for i in range(num_runs)))
    return path


@pytest.mark.parametrize("cmd", [["all", "--dry-run", "--gpus", "0"],
                                 ["slurm", "--nodes", "1", "--gpus-per-node", "2", "--dry-run"]])
def test_a_matrix_of_a_billion_runs_is_refused_before_it_is_built(tmp_path, cmd):
    """1 layout x 10^9 repeats: counted, not built (the timeout is the 72 s, 2 GB this guards against)."""
    matrix = _matrix(tmp_path / "rep.toml", num_runs=1, campaign="repeats = 1000000000")
    _one_error_line(_runner(*cmd, "--matrix", str(matrix), timeout=30), str(matrix),
                    "expands to 1,000,000,000 runs (1 [[runs]] x 1 data round(s) x 1,000,000,000 repeat(s))",
                    "more than the 10,000 a campaign may hold")


def test_overlap_twins_count_toward_the_run_limit(tmp_path):
    matrix = _matrix(tmp_path / "twins.toml", num_runs=5001, campaign="overlap_pairs = true")
    _one_error_line(_runner("all", "--dry-run", "--gpus", "0", "--matrix", str(matrix)), str(matrix),
                    "expands to 10,002 runs (overlap twins included)")


def test_capacity_without_a_capacity_table_says_so_before_resolving_runs(tmp_path):
    matrix = _matrix(tmp_path / "rep.toml", num_runs=1, campaign="repeats = 1000000000")
    _one_error_line(_runner("capacity", "--dry-run", "--gpus", "0", "--matrix", str(matrix), timeout=30),
                    str(matrix), "no [capacity] table")
