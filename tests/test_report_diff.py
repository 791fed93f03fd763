"""`report diff`: a synthetic regression (one run's step times × 1.2, NCCL version changed) on a
copy of the committed H200 campaign is flagged with its numbers; unchanged runs are not; bad
inputs end in one line and exit 2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from core.records import RunSummary
from report.cli import main as report_main
from report.diff import build_diff, compute_metric_delta
from report.summary import CampaignSummary, EnvironmentSummary

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-1gpu"


@pytest.fixture(scope="module")
def regressed(tmp_path_factory) -> Path:
    new = tmp_path_factory.mktemp("diff") / "new"
    shutil.copytree(EXAMPLE, new, ignore=shutil.ignore_patterns("report", "report-diff"))
    metrics = new / "zero3" / "metrics" / "rank0.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps({**r, "step_time_s": r["step_time_s"] * 1.2}) + "\n" for r in rows))
    env = json.loads((new / "env.json").read_text())
    env["versions"]["nccl"] = "2.29.1"
    (new / "env.json").write_text(json.dumps(env))
    return new


@pytest.fixture(scope="module")
def diff_out(regressed, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("diffout")
    assert report_main(["diff", str(EXAMPLE), str(regressed), "--out", str(out), "--format", "md,html"]) == 0
    return out


def test_regression_and_nccl_change_flagged(diff_out):
    d = json.loads((diff_out / "diff.json").read_text())
    runs = {r["run"]: r for r in d["runs"]}
    assert set(runs) == {"ddp", "zero3", "megatron-tp1-pp1"} and d["only_old"] == d["only_new"] == []
    zero3 = {m["metric"]: m for m in runs["zero3"]["metrics"]}
    assert zero3["tokens_per_s"]["rel_change"] == pytest.approx(1 / 1.2 - 1, abs=1e-6)  # -16.7%
    assert zero3["step_time_median_s"]["rel_change"] == pytest.approx(0.2, abs=1e-6)
    assert runs["zero3"]["regressions"] == ["tokens_per_s", "step_time_median_s"]
    assert zero3["mem_peak_allocated_gib"]["delta"] == 0 and not zero3["mem_peak_allocated_gib"]["regression"]
    for run in ("ddp", "megatron-tp1-pp1"):  # untouched: zero change, nothing flagged
        assert runs[run]["regressions"] == []
        assert all(m["delta"] in (0, None) for m in runs[run]["metrics"])
    changed = [e for e in d["env"] if e["changed"]]
    assert changed == [{"field": "nccl_version", "old": "2.28.9", "new": "2.29.1", "changed": True}]

    md = (diff_out / "diff.md").read_text()
    summary = md.split("## Environment", 1)[0]
    assert "**Regression in zero3**: Tokens/s 345 k → 287 k (−16.7%)" in summary
    assert "ddp" not in summary and "megatron" not in summary
    assert "**NCCL** 2.28.9 → 2.29.1" in summary
    assert "| NCCL | 2.28.9 | 2.29.1 | **changed** |" in md
    assert "| Driver | 580.159.04 | 580.159.04 |  |" in md
    html = (diff_out / "diff.html").read_text()
    assert '<tr class="changed"><td>NCCL</td>' in html and "Regression in zero3" in html


def test_runs_on_one_side_and_status_regression():
    def summary(runs):
        return CampaignSummary(campaign="c", runs=tuple(runs))

    ok = RunSummary(run="a", status="ok", tokens_per_s=100.0)
    old = summary([ok, RunSummary(run="gone", status="ok")])
    new = summary([RunSummary(run="a", status="oom", tokens_per_s=None), RunSummary(run="added", status="ok")])
    d = build_diff(old, new, threshold=0.05)
    assert d.only_old == ("gone",) and d.only_new == ("added",)
    assert d.runs[0].regressions == ("status",)  # ok -> oom; tokens/s missing on one side: no delta
    assert d.runs[0].metrics[0].delta is None


@pytest.mark.parametrize("old,new,better,flag", [(100, 94, "higher", True), (100, 96, "higher", False),
                                                 (100, 106, "lower", True), (100, 94, "lower", False),
                                                 (100, 50, None, False), (None, 5, "higher", False)])
def test_threshold_direction(old, new, better, flag):
    assert compute_metric_delta(old, new, metric="m", unit="s", better=better, threshold=0.05).regression is flag


def test_bad_paths_one_line_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    for argv in (["diff", str(tmp_path / "missing"), str(EXAMPLE)], ["diff", str(EXAMPLE), str(empty)],
                 ["diff", str(EXAMPLE), str(EXAMPLE), "--threshold", "-0.1"]):
        assert report_main([*argv, "--out", str(tmp_path / "o"), "--format", "md"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("report: error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_changed_fixed_variables_are_environment_changes():
    from report.diff import compute_env_changes
    old = {"model": "gpt-125m: 12 layers, hidden 768", "global_batch_size": 128, "dtype": "bf16", "nccl_version": "2.28.9"}
    new = {**old, "model": "tiny: 4 layers, hidden 64", "global_batch_size": 16}
    changed = {c.field for c in compute_env_changes(EnvironmentSummary(**old), EnvironmentSummary(**new)) if c.changed}
    assert changed == {"model", "global_batch_size"}


def _summary(campaign: str, env: dict, step_time_s: float, status: str = "ok") -> CampaignSummary:
    return CampaignSummary(campaign=campaign, environment=EnvironmentSummary(**env), runs=(
        RunSummary(run="ddp", status=status, tokens_per_s=1.0 / step_time_s, step_time_median_s=step_time_s,
                   mem_peak_allocated_gib=1.0),))


@pytest.mark.parametrize("field, new_value", [("model", "tiny: 4 layers, hidden 64, seq 256"),
                                              ("global_batch_size", 16), ("dtype", "fp32"), ("gpu_count", 2),
                                              ("num_nodes", 2)])
def test_different_fixed_variables_are_not_comparable_never_a_regression(field, new_value):
    """Step time +131% and a failed run between campaigns of different workloads (or GPU counts:
    a run of the same name is another layout): no regression is called; the summary says why."""
    from report.render import build_environment

    env = {"model": "gpt-125m: 12 layers, hidden 768, seq 1024", "global_batch_size": 128, "dtype": "bf16",
           "gpu_count": 1, "num_nodes": 1}
    diff = build_diff(_summary("a", env, 0.1), _summary("b", {**env, field: new_value}, 0.231, status="crash"),
                      threshold=0.05)
    assert diff.not_comparable == (field,) and not diff.comparable
    assert not diff.regressed_runs and not any(m.regression for m in diff.runs[0].metrics)
    assert diff.runs[0].metrics[3].rel_change == pytest.approx(1.31)  # the numbers are still side by side
    for html in (False, True):
        text = build_environment(html=html).get_template(f"diff.{'html' if html else 'md'}.j2").render(
            diff=diff, css="")
        assert "Not comparable" in text
        for flag in ("Regression in", "**regression**", '<td class="regression">', "— regression"):
            assert flag not in text, flag


def test_same_fixed_variables_are_judged():
    env = {"model": "gpt-125m", "global_batch_size": 128, "dtype": "bf16", "nccl_version": "2.28.9"}
    diff = build_diff(_summary("a", env, 0.1), _summary("b", {**env, "nccl_version": "2.29.1"}, 0.231), threshold=0.05)
    assert diff.comparable and [r.run for r in diff.regressed_runs] == ["ddp"]


def test_default_out_is_under_runs_never_in_an_input(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = sorted(p.name for p in EXAMPLE.iterdir())
    assert report_main(["diff", str(EXAMPLE), str(EXAMPLE), "--format", "md"]) == 0
    assert (work / "runs" / "diff-h200-1gpu-vs-h200-1gpu" / "diff.md").is_file()
    assert sorted(p.name for p in EXAMPLE.iterdir()) == before
