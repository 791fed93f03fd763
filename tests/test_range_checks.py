"""Issue 21: every matrix and CLI value range-checked up front, one line per problem (exit 2),
and a hang diagnosis that says what is known of a rank without a stack, never "None"."""
from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import ConfigError
from ingest.hangs import diagnose_from_stacks
from report.view import HangRank, build_hang_ranks
from runner.matrix import resolve_matrix
from tests.synthetic_campaign import make_run

REPO = Path(__file__).resolve().parent.parent


def _problems(runs: list[dict], fixed: dict | None = None, campaign: dict | None = None) -> list[str]:
    raw = {"campaign": {"name": "c", **(campaign or {})}, "fixed": {"steps": 30, **(fixed or {})}, "runs": runs}
    with pytest.raises(ConfigError) as e:
        resolve_matrix(raw, source="m.toml", num_gpus=0)
    return str(e.value).splitlines()


def test_run_options_and_fault_out_of_range_are_listed_one_line_each():
    lines = _problems([
        {"name": "ddp", "strategy": "ddp", "world_size": 2,
         "options": {"bucket_cap_mb": -1, "fault": {"kind": "hang", "rank": 7, "step": 30, "seconds": -math.inf}}},
        {"name": "z", "strategy": "zero3", "world_size": 2,
         "options": {"zero": {"reduce_bucket_size": 0}, "simulate_oom_above_micro_batch_size": 0,
                     "fault": {"kind": "melt", "rank": True}}},
    ], campaign={"run_timeout_s": math.nan})
    assert lines == [
        "m.toml [campaign] run_timeout_s must be a positive, finite number of seconds, got nan",
        "m.toml run 1 ('ddp') options: 'bucket_cap_mb' must be >= 1, got -1",
        "m.toml run 1 ('ddp') options.fault rank must be an integer in [0, 2) (world_size 2), got 7",
        "m.toml run 1 ('ddp') options.fault step must be an integer in [0, 30) (steps 30), got 30",
        "m.toml run 1 ('ddp') options.fault seconds must be a finite number >= 0, got -inf",
        "m.toml run 2 ('z') options: 'zero.reduce_bucket_size' must be >= 1, got 0",
        "m.toml run 2 ('z') options: 'simulate_oom_above_micro_batch_size' must be >= 1, got 0",
        "m.toml run 2 ('z') options.fault kind must be one of oom, crash, hang, gpu_hang, straggler, slow_data,"
        " got 'melt'",
        "m.toml run 2 ('z') options.fault rank must be an integer in [0, 2) (world_size 2), got True",
    ]


def test_a_fault_inside_the_run_is_accepted():
    raw = {"campaign": {"name": "c"}, "fixed": {"steps": 30}, "runs": [
        {"name": "ddp", "strategy": "ddp", "world_size": 2, "options": {"fault": {"kind": "straggler", "rank": 1,
                                                                               "step": 29, "seconds": 0.5}}}]}
    spec = resolve_matrix(raw, source="m.toml", num_gpus=0).runs[0]
    assert spec.options["fault"] == {"kind": "straggler", "rank": 1, "step": 29, "seconds": 0.5}


@pytest.mark.parametrize("fixed, line", [
    ({"lr": math.inf}, "m.toml [fixed] lr must be a finite number, got inf"),
    ({"lr": -1e-3}, "m.toml [fixed] lr must be >= 0.0, got -0.001"),
    ({"lr": 0.0}, "m.toml [fixed] lr must be > 0, got 0.0"),
    ({"min_lr": 0}, "m.toml [fixed] min_lr must be > 0, got 0"),
    ({"min_lr": -math.inf}, "m.toml [fixed] min_lr must be a finite number, got -inf"),
    ({"steps": 10**20}, "m.toml [fixed] steps must be <= 10000000, got 100000000000000000000"),
    ({"steps": 1e23}, "m.toml [fixed] steps must be an integer, got 1e+23"),
    ({"warmup_steps": -1}, "m.toml [fixed] warmup_steps must be >= 0, got -1"),
    ({"adam_beta2": 1.0}, "m.toml [fixed] adam_beta2 must be < 1, got 1.0"),
    ({"lr": 1e-4, "min_lr": 1e-3}, "m.toml [fixed] min_lr (0.001) must not exceed lr (0.0001): the schedule decays"
                                   " from lr to min_lr"),
])
def test_fixed_numbers_out_of_range(fixed, line):
    assert _problems([{"name": "ddp", "strategy": "ddp"}], fixed=fixed) == [line]


def _runner(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_commbench_refuses_nproc_0_and_inverted_sizes_before_launching(tmp_path):
    res = _runner("commbench", "--device", "cpu", "--nproc", "0", "--min-bytes", "8M", "--max-bytes", "1K",
                  "--timeout-s", "nan", "--node-rank", "1", "--out", str(tmp_path / "cb"))
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        "runner: error: --node-rank 1: must be in [0, 1) (--nnodes 1)",
        "runner: error: --timeout-s nan: must be a finite number of seconds > 0",
        "runner: error: --min-bytes 8388608 / --max-bytes 1024: need 0 < min <= max",
        "runner: error: --nproc 0: must be >= 1",
    ]
    assert not (tmp_path / "cb").exists()
    res = _runner("commbench", "--device", "cpu", "--nproc", "-3", "--min-bytes", "lots")
    assert res.stderr.splitlines() == [
        "runner: error: --min-bytes size 'lots': expected bytes like 4096, 64K, 256M or 1G",
        "runner: error: --nproc -3: must be >= 1",
    ]


def test_rank_without_a_stack_is_described_by_its_process_state_never_none():
    stacks = {0: {"blocked_in": "all_reduce", "frame": "all_reduce (torch/distributed/c10d.py:2)",
                  "user_frame": "step (runner/train.py:88)"},
              1: {"blocked_in": None, "frame": None, "user_frame": None, "process_state": "stopped (state T)",
                  "stack_error": "Error: Failed to suspend process"}}
    cause, diagnosis = diagnose_from_stacks(stacks)
    assert cause == ("rank 1: stopped (state T), no stack (py-spy: Error: Failed to suspend process); "
                     "rank(s) 0 wait in all_reduce")
    assert diagnosis["odd_ranks"] == [1]
    rows = build_hang_ranks([make_run("ddp", status="hang", diagnosis=diagnosis)])
    assert rows == (HangRank(run="ddp", rank=0, blocked_in="all_reduce", where="step (runner/train.py:88)"),
                    HangRank(run="ddp", rank=1, blocked_in="no stack (Error: Failed to suspend process)",
                             where="process stopped (state T)"))
    assert "None" not in cause + repr(rows)


def test_a_sigstopped_process_reads_as_stopped_state_t():
    import psutil

    from runner.launch import describe_process_state

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        p = psutil.Process(proc.pid)
        deadline = time.monotonic() + 30  # the kernel delivers the stop when it next schedules the process
        while p.status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.01)
        assert describe_process_state(p) == "stopped (state T)"
    finally:
        proc.kill()
        proc.wait()
    assert describe_process_state(p) == "gone (exited)"


def test_triage_of_a_stopped_rank_names_its_state_not_none():
    from report.triage import build_triage_runs

    stacks = {0: {"blocked_in": "all_reduce", "frame": "all_reduce (c10d.py:2)", "user_frame": "step (train.py:88)"},
              1: {"blocked_in": None, "frame": None, "user_frame": None, "process_state": "stopped (state T)",
                  "stack_error": "timed out after 60 s"}}
    cause, diagnosis = diagnose_from_stacks(stacks)
    from synthetic_campaign import make_run

    (run,) = build_triage_runs([make_run("ddp", status="hang", cause=cause, diagnosis=diagnosis)])
    assert run.hang.frames == ((1, "no stack (timed out after 60 s)", "process stopped (state T)"),
                               (0, "all_reduce", "step (train.py:88)"))
    assert run.hang.fix is None and run.hang.odd_collective is None
    assert "None" not in repr(run.hang.frames) + run.hang.cause


def test_huge_numbers_format_with_every_digit_and_int64_overflow_is_an_impossible_row():
    from ingest.io import step_row_problem
    from report.i18n import load_language

    assert load_language("en").number(f"{1e300:.2f}").startswith("1000000000000000052504760255204420248704468581")
    assert load_language("en").percent(1e40, 1).endswith("%")
    assert step_row_problem({"step": 3, "rank": 0, "step_time_s": 2**63}) == f"step_time_s {2**63}"
