"""The report stage at its edges: recorded text that tries to become Markdown or HTML, diff
arguments and inputs out of range, folders that are no campaign, campaigns still running."""
from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import mistune
import psutil
import pytest

from report import render
from report.cli import main as report_main
from synthetic_campaign import write_synthetic_campaign

# a heading, an image, a link, raw HTML, a bare URL, and backticks that would close a code span
PAYLOAD = ("x\n# PWN ![i](http://evil.example/p.png) [l](http://evil.example/l) <script>alert(1)</script> "
           "www.evil.example `a``b")


def _plant(camp: Path) -> None:
    """PAYLOAD in every recorded field the note prints: campaign name, a run's cause, hostname,
    launch command, GPU name, CPU model, OS, disk path, a version, an env var, the topology."""
    def rewrite(path: Path, change) -> None:
        record = json.loads(path.read_text())
        change(record)
        path.write_text(json.dumps(record))

    rewrite(camp / "campaign.json", lambda c: c.update(name=PAYLOAD))
    rewrite(camp / "zero3" / "status.json", lambda s: s.update(cause="rank 0: " + PAYLOAD))

    def env(e):
        e.update(hostname="h " + PAYLOAD, launch_command=["runner", PAYLOAD], os=PAYLOAD, env_vars={"X": PAYLOAD},
                 topology="GPU0 X\n```\n# PWN ![t](http://evil.example/t.png)\n````")
        e["cpu"]["model"], e["disk"]["path"], e["versions"]["torch"] = PAYLOAD, PAYLOAD, PAYLOAD
    rewrite(camp / "env.json", env)


def _live_markdown(md: str) -> list[str]:
    """What a CommonMark + GFM viewer (tables, bare-URL autolinks) would make live of PAYLOAD."""
    html = mistune.create_markdown(escape=False, plugins=["table", "url", "strikethrough"])(md)
    return (re.findall(r"<img[^>]*evil[^>]*>", html) + re.findall(r"<a [^>]*evil[^>]*>", html)
            + re.findall(r"<h\d>\s*PWN[^<]*", html) + re.findall(r"<script", html))


def test_markdown_in_recorded_fields_stays_text(tmp_path):
    camp = write_synthetic_campaign(tmp_path / "camp", device_name="NVIDIA H200 " + PAYLOAD, statuses={"zero3": "crash"})
    _plant(camp)
    assert report_main(["build", str(camp), "--out", str(tmp_path / "out"), "--format", "md,html"]) == 0
    md = (tmp_path / "out" / "note.md").read_text()
    assert md.count("PWN") >= 12  # every planted field is printed ...
    assert _live_markdown(md) == []  # ... and none of it is an image, link, heading or HTML
    assert md.startswith("# Parallel layout trade-off: x # PWN \\!\\[i\\](http:\\/\\/evil.example/p.png)")
    assert "| Host | h x # PWN \\!\\[i\\](http:\\/\\/evil.example/p.png)" in md
    assert "Campaign ```x # PWN ![i](http://evil.example/p.png)" in md  # a code span no backtick run closes
    assert "\n`````\nGPU0 X\n```\n# PWN" in md  # the topology's block: a fence longer than its lines
    html = (tmp_path / "out" / "note.html").read_text()
    assert "<script>alert" not in html and not re.search(r"<(img|a)\b[^>]*evil", html)
    assert "<h1>Parallel layout trade-off: x\n# PWN ![i](http://evil.example/p.png)" in html


def test_markdown_code_span_and_escape():
    assert render.md_code("a``b\nc") == "```a``b c```"
    assert render.md_code("`x`") == "`` `x` ``"
    assert render.md_fence("a\n````\nb") == "`````" and render.md_fence("plain") == "```"
    assert render.md_cell("![i](http://e.x/p.png)\n# h <b>") == "\\!\\[i\\](http:\\/\\/e.x/p.png) # h &lt;b&gt;"
    assert render.md_cell("# h > q -> r") == "\\# h > q -> r" and render.md_cell("> q") == "\\> q"


REAL = Path(__file__).parent / "fixtures" / "real"


def _one_line_error(capsys, args: list[str]) -> str:
    assert report_main(args) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "internal error" not in err, err
    return err


def test_a_folder_where_no_file_holds_a_record_is_refused(tmp_path, capsys):
    folder = tmp_path / "notes"
    folder.mkdir()  # text in no known format, and a rule of dashes that looks like torchrun's failure banner
    (folder / "readme.txt").write_text("Policy files\n" + "-" * 72 + "\nThese are not logs.\n")
    (folder / "todo").write_text("buy milk\n")
    err = _one_line_error(capsys, ["build", str(folder), "--out", str(tmp_path / "out"), "--format", "md"])
    assert f"{folder}: none of its 2 file(s) holds a record" in err and "a folder of NCCL" in err
    assert not (tmp_path / "out").exists()
    (folder / "oom.log").write_text((REAL / "60_oom_msg_torch2.0_style_then_app_output.txt").read_text())
    assert report_main(["build", str(folder), "--out", str(tmp_path / "out2"), "--format", "md"]) == 0  # one log: a note
    assert "OutOfMemoryError" in (tmp_path / "out2" / "note.md").read_text()


def test_a_binary_file_is_not_read_as_a_log(tmp_path, capsys):
    """A file with NUL bytes (an executable, an archive) is not parsed, whatever text its strings
    hold: a folder of such files is refused, and beside a real log it is named and left out."""
    from ingest.thirdparty import ingest_file

    folder = tmp_path / "bin"
    folder.mkdir()
    megatron = " iteration        1/      10 | elapsed time per iteration (ms): 5.0 | lm loss: 2.0E+00 |\n"
    (folder / "pager").write_bytes(b"\x7fELF\x02\x01\x00\x00" + megatron.encode() * 20)
    assert ingest_file(folder / "pager").num_records == 0
    err = _one_line_error(capsys, ["build", str(folder), "--out", str(tmp_path / "out"), "--format", "md"])
    assert f"{folder}: is not a campaign" in err and "is a log ingest reads" in err
    (folder / "oom.log").write_text((REAL / "60_oom_msg_torch2.0_style_then_app_output.txt").read_text())
    assert report_main(["build", str(folder), "--out", str(tmp_path / "out2"), "--format", "md"]) == 0
    note = (tmp_path / "out2" / "note.md").read_text()
    assert "OutOfMemoryError" in note and "binary file (NUL bytes" in note
    padded = folder / "padded.log"  # a crash left NUL padding at a log's end: still a log
    padded.write_bytes((REAL / "60_oom_msg_torch2.0_style_then_app_output.txt").read_bytes() + b"\x00" * 4096)
    assert ingest_file(padded).num_records == ingest_file(folder / "oom.log").num_records > 0


def test_diff_of_a_folder_of_unrelated_logs_says_it_is_no_campaign(tmp_path, capsys):
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("51_torchrun_childfailed_multi_failures_sigabrt.txt", "54_watchdog_2022_legacy_no_numel.txt"):
        (logs / name).write_text((REAL / name).read_text())
    camp = write_synthetic_campaign(tmp_path / "camp")
    for args in ([str(logs), str(camp)], [str(camp), str(logs)]):
        err = _one_line_error(capsys, ["diff", *args, "--out", str(tmp_path / "dd")])
        assert f"{logs}: a folder of logs of 2 job(s), not one training job" in err and "report build" in err
    assert not (tmp_path / "dd").exists()


@pytest.mark.parametrize("threshold", ["1e400", "nan", "-0.1", "11"])
def test_diff_threshold_out_of_range_is_one_line(tmp_path, capsys, threshold):
    camp = write_synthetic_campaign(tmp_path / "camp")
    err = _one_line_error(capsys, ["diff", str(camp), str(camp), "--threshold", threshold, "--out", str(tmp_path / "dd")])
    assert "--threshold" in err and "must be a relative change from 0 to 10" in err
    assert not (tmp_path / "dd").exists()
    assert report_main(["diff", str(camp), str(camp), "--threshold", "10", "--out", str(tmp_path / "ok"),
                        "--format", "md"]) == 0  # the largest allowed: diff.json holds it
    assert json.loads((tmp_path / "ok" / "diff.json").read_text())["threshold"] == 10


def test_build_while_the_first_run_is_live_says_the_runs_are_still_running(tmp_path, capsys):
    camp = write_synthetic_campaign(tmp_path / "camp")
    for status in camp.glob("*/status.json"):
        status.unlink()  # no run has ended; ddp and zero3 have step rows
    me = psutil.Process()  # this process holds the campaign's lock, as a live `runner all` does
    (camp / ".runner.lock").write_text(json.dumps({"pid": me.pid, "host": socket.gethostname(),
                                                   "pid_create_time": me.create_time(),
                                                   "started_at": "2026-01-01T00:00:00+00:00"}))
    err = _one_line_error(capsys, ["build", str(camp), "--out", str(tmp_path / "out"), "--format", "md"])
    assert f"{camp}: no run has finished yet: the campaign's runner is still running (pid {me.pid}" in err
    assert "step rows are left out of the note until the run ends" in err and "no run has metrics" not in err
    (camp / ".runner.lock").unlink()  # no runner: the runs stopped, and their rows make a note
    assert report_main(["build", str(camp), "--out", str(tmp_path / "out"), "--format", "md"]) == 0
