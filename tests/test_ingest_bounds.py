"""Hostile campaign files at ingest: values the campaign's GPU cannot produce, rows and files that
claim another run or rank, a spec named after another run, integers past Python's digit limit, a
metrics folder that links to itself. Each is a caveat naming the file (and line) or a one-line
error, never a traceback and never the impossible number in the note."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.synthetic_campaign import write_synthetic_campaign

LONG_INT = "9" * 5000  # past Python's 4,300-digit limit for int("...")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=300)


def _build(camp: Path, out: Path) -> subprocess.CompletedProcess:
    return _cli("report.cli", "build", str(camp), "--out", str(out), "--format", "md")


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _write_rows(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _one_line_error(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, (res.args, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    return res.stderr


# ---- D: integers longer than 4,300 digits

def test_an_over_long_integer_in_a_metrics_row_is_a_caveat_naming_the_line(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp")
    path = camp / "ddp" / "metrics" / "rank0.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = lines[4].replace('"tokens": 256', f'"tokens": {LONG_INT}')
    assert LONG_INT in lines[4]
    path.write_text("\n".join(lines) + "\n")
    res = _build(camp, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    note = (tmp_path / "out" / "note.md").read_text()
    assert ("ddp/metrics/rank0.jsonl: 1 row(s) dropped: 1 an integer longer than 4,300 digits (line 5); "
            "the numbers use the 11 valid rows") in note
    res = _cli("ingest.cli", str(camp), "--out", str(tmp_path / "tables"))
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("record", ["status.json", "spec.json", "run_info.json"])
def test_an_over_long_integer_in_a_record_is_a_one_line_error_naming_file_and_line(tmp_path, record):
    camp = write_synthetic_campaign(tmp_path / "camp")
    path = camp / "ddp" / record
    text = path.read_text().splitlines()
    text.insert(2, f' "x_extra": {LONG_INT},')  # line 3 of the file
    path.write_text("\n".join(text))
    for res in (_build(camp, tmp_path / "out"), _cli("ingest.cli", str(camp), "--out", str(tmp_path / "tables")),
                _cli("report.cli", "diff", str(camp), str(camp), "--out", str(tmp_path / "diff"), "--format", "md")):
        err = _one_line_error(res)
        assert f"ddp/{record}:3: an integer longer than Python reads (4,300 digits)" in err, err


# ---- B: rows and files that claim another run or rank (duplicate (run, rank, step) crashed report build)

def _claim_other_run(camp: Path) -> str:
    for path in (camp / "zero3" / "metrics").glob("rank*.jsonl"):
        _write_rows(path, [dict(r, run="ddp") for r in _rows(path)])
    return ("zero3/metrics/rank0.jsonl: 12 row(s) dropped: 12 naming another run or rank than the file's (zero3, "
            "rank 0) (line 1: 'ddp', rank 0, line 2: 'ddp', rank 0, line 3: 'ddp', rank 0, ...); the numbers use the "
            "0 valid rows")


def _claim_other_rank(camp: Path) -> str:
    path = camp / "ddp" / "metrics" / "rank1.jsonl"
    _write_rows(path, [dict(r, rank=0) for r in _rows(path)])
    return "ddp/metrics/rank1.jsonl: 12 row(s) dropped: 12 naming another run or rank than the file's (ddp, rank 1)"


def _padded_copy(camp: Path) -> str:
    (camp / "ddp" / "metrics" / "rank00.jsonl").write_bytes((camp / "ddp" / "metrics" / "rank0.jsonl").read_bytes())
    return ("ddp/metrics/rank00.jsonl: not a rank's metrics file as the runner names them (rank0.jsonl, rank1.jsonl, "
            "...); not read (rename or remove it)")


def _newline_copy(camp: Path) -> str:
    (camp / "ddp" / "metrics" / "rank1\n# PWN.jsonl").write_bytes((camp / "ddp" / "metrics" / "rank1.jsonl").read_bytes())
    return "'ddp/metrics/rank1\\n# PWN.jsonl': not a rank's metrics file as the runner names them"


@pytest.mark.parametrize("forge", [_claim_other_run, _claim_other_rank, _padded_copy, _newline_copy])
def test_rows_of_another_run_or_rank_are_dropped_and_the_note_builds(tmp_path, forge):
    from ingest.io import load_campaign

    camp = write_synthetic_campaign(tmp_path / "camp")
    caveat = forge(camp)
    campaign = load_campaign(camp)
    assert not campaign.steps.duplicated(["run", "rank", "step"]).any()
    assert any(caveat in p for p in campaign.problems), campaign.problems
    rows = campaign.steps.groupby(["run", "rank"]).size().to_dict()
    expected = {("ddp", 0): 12, ("ddp", 1): 12, ("zero3", 0): 12, ("zero3", 1): 12}
    if forge is _claim_other_run:
        del expected[("zero3", 0)], expected[("zero3", 1)]
    if forge is _claim_other_rank:
        del expected[("ddp", 1)]
    assert rows == expected
    res = _build(camp, tmp_path / "out")
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    note = (tmp_path / "out" / "note.md").read_text()
    assert caveat.replace("<", "&lt;") in note
    assert "\n# PWN" not in note  # the newline of a file name never starts a line of the note


# ---- P: a metrics folder that is a symlink to itself

def test_a_metrics_folder_linking_to_itself_is_a_caveat(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp")
    for p in (camp / "ddp" / "metrics").iterdir():
        p.unlink()
    (camp / "ddp" / "metrics").rmdir()
    os.symlink("metrics", camp / "ddp" / "metrics")
    res = _build(camp, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    note = (tmp_path / "out" / "note.md").read_text()
    assert ("ddp/metrics: a symlink loop, so no metrics were read; remove it or restore the run's metrics folder"
            in note)


# ---- C: a spec.json whose name is another run's

def test_a_spec_naming_another_run_leaves_that_run_out_with_a_caveat(tmp_path):
    from ingest.io import load_campaign

    camp = write_synthetic_campaign(tmp_path / "camp")
    spec = json.loads((camp / "zero3" / "spec.json").read_text())
    (camp / "zero3" / "spec.json").write_text(json.dumps(dict(spec, name="ddp")))
    campaign = load_campaign(camp)
    assert list(campaign.runs["run"]) == ["ddp", "tp_pp"]  # no second "ddp"
    caveat = ("run zero3: zero3/spec.json names the run 'ddp', not its folder; left out of the note (`runner all "
              "--resume` refuses it too; restore the run's own spec.json)")
    assert caveat in campaign.problems
    res = _build(camp, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    note = (tmp_path / "out" / "note.md").read_text()
    assert caveat.replace("`", "\\`") in note or caveat in note
    assert len([x for x in note.splitlines() if x.startswith("| ddp | ok |")]) == 1


# ---- A: numbers the campaign's GPU cannot produce (they passed the flat caps)

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-1gpu"


def test_rows_past_what_the_h200_can_do_are_dropped_with_file_and_line(tmp_path):
    """The real H200 campaign with three ddp rows forged: a 0.1 ms step (MFU ~1000x), memory
    peaks of 4,000 GiB (under the flat 4,096 GiB cap, 28x the GPU's), a data wait longer than its
    step and the step before it together."""
    import shutil

    from ingest.io import load_campaign

    camp = tmp_path / "camp"
    shutil.copytree(EXAMPLE, camp, ignore=shutil.ignore_patterns("report", "trace", "tables"))
    path = camp / "ddp" / "metrics" / "rank0.jsonl"
    rows = _rows(path)
    rows[100]["step_time_s"] = 0.0001
    rows[120].update(mem_peak_allocated_gib=4000.0, mem_peak_reserved_gib=4000.0)
    rows[140]["data_wait_s"] = rows[140]["step_time_s"] + rows[139]["step_time_s"] + 0.01
    rows[160]["data_wait_s"] = rows[160]["step_time_s"] + 0.5 * rows[159]["step_time_s"]  # possible: host ran ahead
    _write_rows(path, rows)
    campaign = load_campaign(camp)
    # MFU by hand: 131,072 tokens / 0.1 ms x (6 x 123,689,472 + 12 x 12 x 768 x 1024) FLOPs per token
    # (the note's default convention, run_info's parameters less the position embedding) / 989.4e12 = 1133.2
    assert ("ddp/metrics/rank0.jsonl: 3 row(s) dropped: 3 impossible values (line 101: tokens/step_time_s 1.31e+09 "
            "(MFU 113318%: more model FLOP/s per GPU than the NVIDIA H200's dense peak, 9.89e+14), line 121: "
            "mem_peak_allocated_gib 4000.0 (> 140.4 GiB, all of one NVIDIA H200's memory), mem_peak_reserved_gib "
            "4000.0 (> 140.4 GiB, all of one NVIDIA H200's memory), line 141: data_wait_s 0.534 (> step_time_s 0.261 "
            "+ the previous step's 0.263)); the numbers use the 197 valid rows") in campaign.problems
    kept = set(campaign.steps.query("run == 'ddp'")["step"])
    assert {100, 120, 140}.isdisjoint(kept) and 160 in kept and len(kept) == 197
    res = _build(camp, tmp_path / "out")
    assert res.returncode == 0, res.stderr
    note = (tmp_path / "out" / "note.md").read_text()
    assert "4000.00 GiB" not in note and "4,000" not in note
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    mfu = {r["run"]: r["mfu"] for r in summary["runs"]}
    assert 0 < mfu["ddp"] < 1, mfu


@pytest.mark.parametrize("device_name, wait_factor, dropped", [
    (None, 1.2, True),  # CPU: the wait lies inside the step (perf_counter)
    (None, 0.9, False),
    ("NVIDIA H200", 1.2, False),  # CUDA: the host may wait while the device runs the step before
    ("NVIDIA H200", 2.2, True),  # ...but not longer than that step and this one together
])
def test_a_data_wait_longer_than_the_step_is_dropped(tmp_path, device_name, wait_factor, dropped):
    from ingest.io import load_campaign

    camp = write_synthetic_campaign(tmp_path / "camp", device_name=device_name)
    path = camp / "ddp" / "metrics" / "rank0.jsonl"
    rows = _rows(path)
    rows[6]["data_wait_s"] = wait_factor * max(rows[5]["step_time_s"], rows[6]["step_time_s"])
    _write_rows(path, rows)
    campaign = load_campaign(camp)
    caveats = [p for p in campaign.problems if "impossible values (line 7: data_wait_s" in p]
    assert (6 not in set(campaign.steps.query("run == 'ddp' and rank == 0")["step"])) is dropped
    assert len(caveats) == int(dropped), campaign.problems


def test_an_unknown_gpu_keeps_the_flat_caps_and_env_json_memory(tmp_path):
    """A GPU hardware.toml does not list: no peak, so no MFU bound (a fast row is kept); its
    memory from env.json (143,771 MiB) still bounds a rank's peak."""
    from ingest.io import load_campaign

    camp = write_synthetic_campaign(tmp_path / "camp", device_name="Mystery Accelerator 9000")
    path = camp / "ddp" / "metrics" / "rank0.jsonl"
    rows = _rows(path)
    rows[5]["tokens"] = 1 << 30  # 1e10 tokens/s: under the flat 1e12 cap, above an H200's peak for this model
    rows[6]["mem_peak_reserved_gib"] = 200.0
    _write_rows(path, rows)
    campaign = load_campaign(camp)
    assert ("ddp/metrics/rank0.jsonl: 1 row(s) dropped: 1 impossible values (line 7: mem_peak_reserved_gib 200.0 "
            "(> 140.4 GiB, all of one Mystery Accelerator 9000's memory)); the numbers use the 11 valid rows"
            ) in campaign.problems
    camp = write_synthetic_campaign(tmp_path / "h200", device_name="NVIDIA H200")
    _write_rows(camp / "ddp" / "metrics" / "rank0.jsonl", rows[:6])
    campaign = load_campaign(camp)
    assert any("(line 6: tokens/step_time_s 1.07e+10 (MFU " in p for p in campaign.problems), campaign.problems


def _forge_example(tmp_path: Path, *, step_time_s: float) -> Path:
    import shutil

    camp = tmp_path / "camp"
    shutil.copytree(EXAMPLE, camp, ignore=shutil.ignore_patterns("report", "trace", "tables"))
    path = camp / "ddp" / "metrics" / "rank0.jsonl"
    _write_rows(path, [dict(r, step_time_s=step_time_s, data_wait_s=0.0001) for r in _rows(path)])
    return camp


@pytest.mark.parametrize("step_time_s, dropped", [(0.109, True), (0.115, False)])
def test_the_mfu_bound_counts_the_flops_the_note_prints(tmp_path, step_time_s, dropped):
    """The bound counts the most FLOPs per token of any convention the note prints (6N+12LHQT),
    so no printed MFU is above 100%. By hand, 131,072 tokens per step on one H200 (989.4e12):
    at 0.109 s, 6N+12LHQT (855,383,040 FLOPs per token) gives 104.0% -- dropped, though causal
    6N+6LHQT (798,759,936) gives 97.1%; at 0.115 s, 98.5% -- kept."""
    from ingest.io import load_campaign

    campaign = load_campaign(_forge_example(tmp_path, step_time_s=step_time_s))
    kept = len(campaign.steps.query("run == 'ddp'"))
    caveats = [p for p in campaign.problems if "impossible values" in p]
    if dropped:
        assert kept == 0 and len(caveats) == 1, campaign.problems
        assert ("ddp/metrics/rank0.jsonl: 200 row(s) dropped: 200 impossible values (line 1: tokens/step_time_s "
                "1.2e+06 (MFU 104%: more model FLOP/s per GPU than the NVIDIA H200's dense peak, 9.89e+14)") in caveats[0]
    else:
        assert kept == 200 and caveats == [], campaign.problems


def test_env_json_memory_cannot_raise_a_known_gpus_limit(tmp_path):
    """An H200 is 140.4 GiB (hardware.toml) whatever env.json says: a forged 4,000 GiB
    memory_total is one caveat, and a 3,999 GiB peak is dropped; the real 143,771 MiB H200 and
    81,559 MiB H100 (79.6 GiB at the table's 0.1 GiB) are no caveat."""
    from ingest.io import load_campaign

    camp = write_synthetic_campaign(tmp_path / "camp", device_name="NVIDIA H200")
    env = json.loads((camp / "env.json").read_text())
    (camp / "env.json").write_text(json.dumps(dict(env, gpus=[dict(g, memory_total_mib=4000 * 1024)
                                                              for g in env["gpus"]])))
    path = camp / "ddp" / "metrics" / "rank0.jsonl"
    rows = _rows(path)
    rows[6]["mem_peak_reserved_gib"] = 3999.0
    _write_rows(path, rows)
    campaign = load_campaign(camp)
    assert [p for p in campaign.problems if "env.json" in p] == [
        "env.json: gpus[0].memory_total_mib: 4096000 MiB (4000.0 GiB) is impossible for the NVIDIA H200 (140.4 GiB in "
        "hardware.toml); its ranks' memory peaks are checked against 140.4 GiB"]
    assert ("ddp/metrics/rank0.jsonl: 1 row(s) dropped: 1 impossible values (line 7: mem_peak_reserved_gib 3999.0 "
            "(> 140.4 GiB, all of one NVIDIA H200's memory)); the numbers use the 11 valid rows") in campaign.problems
    for name, mib in (("NVIDIA H200", 143771), ("NVIDIA H100 80GB HBM3", 81559)):
        camp = write_synthetic_campaign(tmp_path / str(mib), device_name=name)
        env = json.loads((camp / "env.json").read_text())
        (camp / "env.json").write_text(json.dumps(dict(env, gpus=[dict(g, memory_total_mib=mib) for g in env["gpus"]])))
        assert not [p for p in load_campaign(camp).problems if "env.json" in p or "impossible" in p]


@pytest.mark.parametrize("tokens, dropped", [(1 << 25, True), (1 << 23, False)])
def test_a_cpu_row_past_any_cpus_flops_is_dropped(tmp_path, tokens, dropped):
    """hardware.toml has no CPU peak; a CPU rank is bounded by 1e14 model FLOP/s. By hand, the
    synthetic tiny model: 6 x 120,000 + 12 x 2 x 64 x 32 = 769,152 FLOPs per token, 2 ranks, a
    0.11 s step: 2^25 tokens give 1.17e14 per rank (dropped), 2^23 give 2.93e13 (kept). The
    unforged CPU campaign (2,560 tokens/s) has no caveat."""
    from ingest.io import load_campaign

    camp = write_synthetic_campaign(tmp_path / "camp")
    assert not [p for p in load_campaign(camp).problems if "impossible" in p]
    path = camp / "ddp" / "metrics" / "rank0.jsonl"
    rows = _rows(path)
    rows[6].update(tokens=tokens, step_time_s=0.11, data_wait_s=0.0)
    _write_rows(path, rows)
    campaign = load_campaign(camp)
    caveat = ("ddp/metrics/rank0.jsonl: 1 row(s) dropped: 1 impossible values (line 7: tokens/step_time_s 3.05e+08 "
              "(1.17e+14 model FLOP/s per rank: more than a CPU process reaches, 1e+14)); the numbers use the 11 valid rows")
    assert (caveat in campaign.problems) is dropped, campaign.problems
    assert (6 in set(campaign.steps.query("run == 'ddp' and rank == 0")["step"])) is not dropped


def test_a_cut_trace_is_analysed_up_to_the_cut_and_said_to_be_cut(tmp_path):
    """A profiler trace whose JSON ends mid-array (its writer stopped, or the copy was cut) is
    analysed up to the cut, with one warning naming the file; the whole file gets none."""
    import gzip
    import shutil

    from ingest.io import compute_run_trace_tables

    src = Path(__file__).resolve().parents[1] / "examples" / "h200-1gpu" / "ddp"
    whole, cut = tmp_path / "whole" / "ddp", tmp_path / "cut" / "ddp"
    for run in (whole, cut):
        (run / "trace").mkdir(parents=True)
        shutil.copy(src / "spec.json", run / "spec.json")
    shutil.copy(src / "trace" / "profile_rank0.json.gz", whole / "trace" / "profile_rank0.json.gz")
    text = gzip.decompress((src / "trace" / "profile_rank0.json.gz").read_bytes())
    (cut / "trace" / "profile_rank0.json.gz").write_bytes(gzip.compress(text[: int(len(text) * 0.9)]))
    warned = {}
    for run in (whole, cut):
        tables = compute_run_trace_tables(run, name="ddp", root=run.parent)
        warned[run.parent.name] = [str(w) for w in tables.warnings if "ends inside its JSON" in str(w)]
    assert warned["whole"] == []
    assert warned["cut"] == ["ddp/trace/profile_rank0.json.gz: the trace ends inside its JSON (cut, or its writer "
                             "stopped); the steps before the cut are analysed"]
