"""User errors end in exit code 2 and one line on stderr, never a traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from synthetic_campaign import write_synthetic_campaign

ROOT = Path(__file__).resolve().parent.parent


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def _assert_one_line_error(proc: subprocess.CompletedProcess, prog: str, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"{prog}: error: ")
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture
def campaign(tmp_path: Path) -> Path:
    return write_synthetic_campaign(tmp_path / "camp", device_name=None)


def test_nonexistent_path(tmp_path):
    _assert_one_line_error(_run("report.cli", "build", str(tmp_path / "nope")), "report", "no such directory")


def test_empty_dir(tmp_path):
    _assert_one_line_error(_run("report.cli", "build", str(tmp_path)), "report", "is empty")


def test_foreign_dir(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "data.bin").write_bytes(bytes(range(256)))
    (tmp_path / "sub").mkdir()
    _assert_one_line_error(_run("report.cli", "build", str(tmp_path)), "report", "run `runner all`")


def test_a_file_not_a_dir(tmp_path):
    f = tmp_path / "x.json"
    f.write_text("{}")
    _assert_one_line_error(_run("report.cli", "build", str(f)), "report", "not a directory")


def test_malformed_campaign_json_names_file_and_line(campaign):
    (campaign / "campaign.json").write_text('{\n  "name": "x",\n  "runs": [,]\n}')
    _assert_one_line_error(_run("report.cli", "build", str(campaign)), "report", "campaign.json:3:")


def test_malformed_metrics_line_is_dropped_with_a_caveat_naming_file_and_line(campaign):
    """A malformed row mid-file (interleaved writers) is dropped and counted in the note's
    caveats, never averaged in and never a refusal of the whole campaign."""
    path = campaign / "ddp" / "metrics" / "rank1.jsonl"
    lines = path.read_text().splitlines()
    lines[4] = lines[4][:-5]
    path.write_text("\n".join(lines) + "\n")
    proc = _run("report.cli", "build", str(campaign), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    note = (campaign / "report" / "note.md").read_text()
    assert "ddp/metrics/rank1.jsonl: 1 row(s) dropped: 1 malformed JSON" in note and "line 5" in note


def test_step_row_with_wrong_fields_is_skipped_with_a_caveat(campaign):
    path = campaign / "zero3" / "metrics" / "rank0.jsonl"
    path.write_text(json.dumps({"run": "zero3", "step": 0}) + "\n")
    proc = _run("ingest.cli", str(campaign), "--out", str(campaign / "tables"))
    assert proc.returncode == 0, proc.stderr
    assert "caveat: zero3/metrics/rank0.jsonl:1: not a StepRow (rank: missing;" in proc.stdout


def test_no_metrics_and_no_status_anywhere(campaign):
    for run in ("ddp", "zero3", "tp_pp"):
        for p in (campaign / run).rglob("*"):
            if p.name == "status.json" or p.suffix == ".jsonl":
                p.unlink()
    _assert_one_line_error(_run("ingest.cli", str(campaign)), "ingest", "no run has metrics")


def test_unknown_format(campaign):
    _assert_one_line_error(_run("report.cli", "build", str(campaign), "--format", "md,docx"), "report", "docx")


def test_empty_format_is_an_error_not_the_default(campaign):
    _assert_one_line_error(_run("report.cli", "build", str(campaign), "--format", ""), "report",
                           "unknown --format (empty)")


def test_ingest_cli_summary_and_crashed_run_loads(campaign, tmp_path):
    proc = _run("ingest.cli", str(campaign), "--out", str(tmp_path / "tables"))
    assert proc.returncode == 0, proc.stderr
    assert "3 runs" in proc.stdout and "tp_pp" in proc.stdout and "oom" in proc.stdout
    assert (tmp_path / "tables" / "runs.parquet").is_file() and (tmp_path / "tables" / "steps.parquet").is_file()


# ------------------------------------------------------------------ fonts and the PDF's system libraries
H200 = Path(__file__).resolve().parent.parent / "examples" / "h200-1gpu"


def test_chinese_pdf_without_a_cjk_font_exits_2_saying_how_to_install(tmp_path, capsys, monkeypatch):
    from report import render
    from report.cli import main as report_main

    monkeypatch.setattr(render, "find_font_family", lambda fc_lang: [])  # fontconfig answers: none
    assert report_main(["build", str(H200), "--out", str(tmp_path / "zh"), "--lang", "zh"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "apt-get install fonts-noto-cjk" in err and "--format md,html" in err
    assert not (tmp_path / "zh").exists()  # refused before anything is written
    assert report_main(["build", str(H200), "--out", str(tmp_path / "md"), "--lang", "zh", "--format", "md"]) == 0


def test_chinese_pdf_is_not_refused_where_the_font_is_installed(monkeypatch):
    from report import render

    monkeypatch.setattr(render, "find_font_family", lambda fc_lang: ["Noto Sans CJK SC"])
    render.check_pdf_fonts(render.load_language("zh"))  # no error
    monkeypatch.setattr(render, "find_font_family", lambda fc_lang: None)  # no fc-list: cannot tell, go on
    render.check_pdf_fonts(render.load_language("zh"))


def test_without_pango_the_default_build_writes_md_and_html_and_exits_0(tmp_path, capsys, monkeypatch):
    import sys as _sys

    from report.cli import main as report_main

    monkeypatch.setitem(_sys.modules, "weasyprint", None)  # `import weasyprint` fails as without Pango
    assert report_main(["build", str(H200), "--out", str(tmp_path / "a")]) == 0
    captured = capsys.readouterr()
    assert {p.name for p in (tmp_path / "a").iterdir()} >= {"note.md", "note.html"}
    assert not (tmp_path / "a" / "note.pdf").exists()
    assert captured.err.count("\n") == 1 and captured.err.startswith("report: no PDF: ")
    assert "apt-get install libpango-1.0-0" in captured.err
    # asked for explicitly, the PDF that cannot be made is an error
    assert report_main(["build", str(H200), "--out", str(tmp_path / "b"), "--format", "pdf"]) == 2
    assert capsys.readouterr().err.startswith("report: error: PDF output needs WeasyPrint")
