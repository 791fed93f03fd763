"""A log that ends inside a line (a crashed writer, a partial copy) has its last line flagged and
none of its numbers used; the same log with its newline is read whole."""
from __future__ import annotations

from ingest.thirdparty import ingest_file

LINES = [
    "[2024-05-01 10:00:00,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)]",
    "[2024-05-01 10:00:05,000] [INFO] [logging.py:96:log_dist] [Rank 0] step=20, skipped=0, lr=[0.0002], mom=[(0.9, 0.95)]",
]


def _steps(f) -> list[int]:
    return sorted(r["step"] for r in f.rows("steps"))


def test_cut_last_line_is_flagged_and_not_used(tmp_path):
    whole, cut = tmp_path / "whole.log", tmp_path / "cut.log"
    whole.write_text("\n".join(LINES) + "\n")
    cut.write_text("\n".join(LINES))  # no newline after the last line: the writer stopped mid-line
    full, part = ingest_file(whole), ingest_file(cut)
    assert _steps(full) == [10, 20]
    assert _steps(part) == [10]
    assert part.result.unparsed == full.result.unparsed + 1
    assert any("line 2: cut (the file ends without a newline); not used" in w for w in part.result.warnings)


def test_flight_recorder_dump_without_final_newline_is_read_whole(tmp_path):
    """A printed flight-recorder dump is one Python literal: its reader repairs a truncated dump
    itself, so a missing final newline costs it no line."""
    from pathlib import Path

    text = (Path(__file__).parent / "fixtures" / "real" / "36_flight_recorder_dump_unpickled_v2.5.txt").read_text()
    whole, bare = tmp_path / "whole.txt", tmp_path / "bare.txt"
    whole.write_text(text.rstrip("\n") + "\n")
    bare.write_text(text.rstrip("\n"))
    full, part = ingest_file(whole), ingest_file(bare)
    def unsourced(f):
        return [{k: v for k, v in r.items() if k != "source"} for r in f.records()]
    assert part.result == full.result and unsourced(part) == unsourced(full) and len(full.records()) == 3


def test_an_excerpt_cut_short_inside_its_last_line_is_warned_of():
    """A paste that stops inside its last line but ends with a newline: a last line that is the same
    message as a line before it but much shorter (read or not) gets a 'may be cut' warning; the same
    log whole, or ending in a different message, gets none."""
    from ingest.parsers.dispatch import parse_text
    step = "[rank0]:[titan] 2025-06-26 18:23:1{i},580 - root - INFO - step:  {i}  loss:  8.1121  memory:  2.66GiB(2.80%)  tps: 175,100  tflops: 12.59  mfu: 1.27%"
    lines = [step.format(i=i) for i in range(1, 5)]
    whole = parse_text("\n".join(lines) + "\n", source="t")
    assert not [w for w in whole.warnings if "cut" in w]
    read_short = parse_text("\n".join(lines[:3] + [lines[3][:70]]) + "\n", source="t")  # still a step line, fields lost
    assert [w for w in read_short.warnings if "may be cut" in w] == [
        "line 4: the last line starts as a line before it but is shorter: the file may be cut (truncated) there"]
    unread = parse_text("\n".join(lines[:3] + [lines[3][:20]]) + "\n", source="t")  # the head only: not read
    assert [w for w in unread.warnings if "may be cut" in w] == [
        "line 4: the last line starts as a line before it but is not read: the file may be cut (truncated) there"]
    other = parse_text("\n".join(lines + ["[rank0]:[titan] 2025-06-26 18:23:15,000 - root - INFO - Training completed"]) + "\n",
                       source="t")
    assert not [w for w in other.warnings if "cut" in w]
