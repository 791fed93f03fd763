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
