"""The flight-recorder analyzer's report (``torchfrtrace`` / ``python -m
tools.flight_recorder.fr_trace``, torch/distributed/flight_recorder/components/builder.py): a
collective not every rank joined, then its fields one per line, and with ``-v`` the tables it
built (Groups, Memberships, Collectives, NCCLCalls).

Records: ``events`` (``fr_not_all_joined``: seq, entry, group, collective, missing ranks,
expected ranks as ``num_ranks``, state, the stack as ``detail``), ``comm_topology``
(``fr_group``: each group's id, description and size). Its progress messages are read. Deliberately
not here: which rank hangs (ingest.hangs reads the dumps themselves).
"""
from __future__ import annotations

import re

from ingest.parsers import CELLS, RULE_LINE, LineParser, ParseResult, run_parsers
from ingest.parsers.failures import FailureScanner

_MISMATCH = re.compile(r"Not all ranks joining collective (?P<seq>\d+) at entry (?P<entry>\d+)$")
# a mismatch's fields (builder.py's prints) -> column, converter
_FIELDS = {"group info": ("group", str), "collective": ("collective", str), "missing ranks": ("missing_ranks", str),
           "input sizes": ("input_sizes", str), "output sizes": ("output_sizes", str),
           "expected ranks": ("num_ranks", int), "collective state": ("state", str)}
_FIELD = re.compile(r"(?P<key>group info|collective|missing ranks|input sizes|output sizes|expected ranks|"
                    r"collective state): (?P<value>.+)$")
_FRAME = re.compile(r"\S+ at \S+:\d+$")
_PROGRESS = re.compile(r"loaded \d+ files in [\d.]+s$|built groups, memberships$|built collectives, nccl_calls$"
                       r"|appending a non-matching collective$|collective stack trace:$")
_SECTIONS = ("Groups", "Memberships", "Collectives", "NCCLCalls")


class FrAnalyzerParser(LineParser):
    kind = "flight_recorder"
    gate = (_MISMATCH, _PROGRESS, re.compile("(?:" + "|".join(_SECTIONS) + ")$"))
    busy = property(lambda self: self._event is not None or self._section is not None)
    _event: dict | None = None
    _section: str | None = None
    _cols: list[str] | None = None

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        m = _MISMATCH.match(body)
        if m:
            self._section = None
            self._event = self.event("fr_not_all_joined", lineno, rank, ts, seq_num=int(m.group("seq")),
                                     entry=int(m.group("entry")), detail=None)
            return True
        if body in _SECTIONS:
            self._event, self._section, self._cols = None, body, None
            return True
        if _PROGRESS.match(body):
            return True
        if self._event is not None:
            f = _FIELD.match(body)
            if f:
                col, conv = _FIELDS[f.group("key")]
                try:
                    self._event[col] = conv(f.group("value").strip())
                except ValueError:
                    self._event[col] = f.group("value").strip()
                return True
            if _FRAME.match(body):
                self._event["detail"] = f"{self._event['detail']}; {body}" if self._event["detail"] else body
                return True
            self._event = None
            return False
        if self._section is not None:
            return self._table_line(lineno, body)
        return False

    def _table_line(self, lineno: int, body: str) -> bool:
        if RULE_LINE.regex.match(body):
            return True
        cells = CELLS.split(body)
        if self._cols is None:
            self._cols = cells
            return True
        if len(cells) != len(self._cols):
            self._section = None
            return False
        if self._section == "Groups":
            row = dict(zip(self._cols, cells))
            self.records.append({"table": "comm_topology", "source": self.source, "line": lineno, "record": "fr_group",
                                 "kind": self.kind, "comm_group": row.get("id"), "desc": row.get("desc"),
                                 "num_ranks_per_comm": int(row["size"]) if row.get("size", "").isdigit() else None})
        return True  # Memberships, Collectives, NCCLCalls rows: read (the dumps hold the same facts)


def parse_fr_analyzer(text, *, source: str) -> ParseResult:
    """Parse the flight-recorder analyzer's report (see module doc). Pure; never raises on content."""
    return run_parsers(text, [FrAnalyzerParser(source), FailureScanner(source)], kind="flight_recorder")
