"""Artifacts of valid JSON syntax but wrong types or fields (SYNTHETIC campaigns): a
campaign-level problem is one ``report: error:`` line naming file and field (exit 2); a per-run
or per-line problem becomes a caveat in the note, that run/line skipped; an unexpected
exception still ends in one line, exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import report.cli
from report.cli import main as report_main
from synthetic_campaign import write_synthetic_campaign


@pytest.fixture
def camp(tmp_path: Path) -> Path:
    return write_synthetic_campaign(tmp_path / "camp", failed=())


def _edit(path: Path, fn) -> None:
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def _build(camp: Path, capsys) -> tuple[int, str, str]:
    code = report_main(["build", str(camp), "--out", str(camp / "r"), "--format", "md"])
    out, err = capsys.readouterr()
    md = (camp / "r" / "note.md").read_text() if code == 0 else ""
    return code, md, err


def _one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("report: error: ") and "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("edit, needles", [
    (lambda d: d["fixed"].pop("warmup_steps"), ("campaign.json", "fixed.warmup_steps: missing")),
    (lambda d: d["fixed"]["model"].update(num_layers="12"), ("campaign.json", "fixed.model.num_layers: expected int, got str")),
    (lambda d: d["fixed"].update(model="gpt2"), ("campaign.json", "fixed.model: expected an object, got str")),
    (lambda d: d.update(fixed="x"), ("campaign.json", "fixed: expected an object")),
])
def test_campaign_json_wrong_fields_is_one_line_error(camp, capsys, edit, needles):
    _edit(camp / "campaign.json", edit)
    code, _, err = _build(camp, capsys)
    _one_line_error(code, err, *needles)


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.update(fixed="x"), "zero3/spec.json does not match RunSpec (fixed: expected an object, got str"),
    (lambda d: d.update(world_size="2"), "zero3/spec.json does not match RunSpec (world_size: expected int, got str '2')"),
])
def test_bad_spec_json_skips_the_run_with_a_caveat(camp, capsys, edit, needle):
    _edit(camp / "zero3" / "spec.json", edit)
    code, md, _ = _build(camp, capsys)
    assert code == 0 and needle in md and "left out of the note" in md
    assert "| zero3 |" not in md.split("## 4. Metrics", 1)[1].split("##", 1)[0]


def test_bad_run_info_is_ignored_with_a_caveat(camp, capsys):
    _edit(camp / "ddp" / "run_info.json", lambda d: d.update(num_params="x"))
    code, md, _ = _build(camp, capsys)
    assert code == 0 and "ddp/run_info.json: does not match RunInfo (num_params: expected int, got str 'x')" in md
    assert "| ddp | ok | 10 |" in md


def test_bad_status_json_types_is_a_caveat(camp, capsys):
    _edit(camp / "ddp" / "status.json", lambda d: d.update(exit_code="0"))
    code, md, _ = _build(camp, capsys)
    assert code == 0 and "ddp/status.json: does not match RunStatus (exit_code: expected int" in md
    assert "| ddp | unfinished |" in md


def test_env_json_wrong_types_are_caveats(camp, capsys):
    _edit(camp / "env.json", lambda d: d.update(gpus="none", cpu="Xeon", versions={"torch": 2.13}))
    code, md, _ = _build(camp, capsys)
    assert code == 0
    assert "env.json: gpus: expected a list, got str 'none'; ignored" in md
    assert "env.json: cpu: expected an object, got str 'Xeon'; ignored" in md
    assert "| torch | 2.13 |" in md


@pytest.mark.parametrize("field, value", [("loss", "nan?"), ("step_time_s", "x"), ("step", 2.5)])
def test_metrics_line_with_wrong_type_is_skipped_with_a_caveat(camp, capsys, field, value):
    path = camp / "ddp" / "metrics" / "rank1.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[4])
    row[field] = value
    lines[4] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    code, md, _ = _build(camp, capsys)
    assert code == 0
    assert f"ddp/metrics/rank1.jsonl:5: not a StepRow ({field}: expected " in md and "; line skipped" in md


def test_truncated_last_line_is_skipped_with_a_caveat(camp, capsys):
    path = camp / "ddp" / "metrics" / "rank0.jsonl"
    text = path.read_text().rstrip("\n")
    path.write_text(text[:-20])  # the runner died mid-write: no closing brace, no newline
    code, md, _ = _build(camp, capsys)
    assert code == 0 and "ddp/metrics/rank0.jsonl:12: truncated line skipped" in md


def test_unexpected_exception_is_one_line_internal_error(camp, capsys, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("something\nbroke")

    import report.render

    monkeypatch.setattr(report.render, "build_report", boom)  # report.cli imports it when a command runs
    code = report_main(["build", str(camp)])
    _one_line_error(code, capsys.readouterr().err, "internal error RuntimeError: something broke (please report)")


def test_ingest_unexpected_exception_is_one_line_internal_error(camp, capsys, monkeypatch):
    import ingest.cli

    def boom(*a, **k):
        raise KeyError("x")

    monkeypatch.setattr(ingest.cli, "load_campaign", boom)
    assert ingest.cli.main([str(camp)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["ingest: error: internal error KeyError: 'x' (please report)"]


def test_strict_and_lenient_checks_are_one_walk():
    """record_problems (a run's spec/status/info, every step row: a bad one is dropped whole) and
    the lenient env/campaign decoder (a bad field is dropped alone) name the same problems the
    same way, nested records, list items and int64 included."""
    from core.records import EnvRecord, StepRow, record_from_dict, record_problems
    row = {"schema_version": 1, "run": "a", "rank": 0, "step": 2**63, "loss": True, "extra": 1}
    problems = record_problems(StepRow, row)
    assert "step: expected int, got an integer beyond int64" in problems
    assert "loss: expected float, got bool True" in problems and "extra: unknown field" in problems
    assert any(p.endswith(": missing") for p in problems)
    env, lenient = record_from_dict(EnvRecord, {"gpus": [{"index": "0"}, {"index": 1}]}, where="env.json")
    assert lenient == ["env.json: gpus[0].index: expected int, got str '0'; ignored"]
    assert [g.index for g in env.gpus] == [None, 1]
    strict = record_problems(EnvRecord, {"gpus": [{"index": "0"}]})
    assert "gpus[0].index: expected int, got str '0'" in strict
