"""NCCL RAS client output (``ncclras`` / ``echo status | nc localhost 28028``, NCCL >= 2.24).

Formats from NCCL's src/ras/client_support.cc (rasClientRunInit / rasClientRunComms): sections
underlined with ``=``; fixed-width tables whose column headers span two rows; detail blocks
``#0-0 (fa93daea854b060b) MISMATCH`` or bare ``INCOMPLETE`` / ``DEAD``, then message lines and
per-rank or per-process lines (``Rank 12 -- GPU 4 managed by process 323032 on node n``).

Records: ``env`` (NCCL and CUDA versions), ``comm_topology`` (``ras_job``: the job-summary row;
``ras_comm_group``: one per communicator-group row, columns from COLUMNS), ``events``
(``ras_<status>`` per detail block with its message lines in ``detail``; ``ras_rank`` /
``ras_process`` per rank / process line, with the block's ``status``). Deliberately not here:
``set format json`` output (counted unparsed), deciding which rank is at fault.
"""
from __future__ import annotations

import re

from ingest.parsers import CELLS, Col, LineParser, ParseResult, apply_rule, match_rules, rule, run_parsers
from ingest.parsers.failures import FailureScanner

S = str

_LINES = (
    rule("nccl_version", r"NCCL version (?P<v>\S+)(?: compiled with CUDA (?P<cuda>\S+))?$", "env",
         Col("v", "value", S), key="nccl_version", kind="nccl_ras"),
    rule("cuda_versions", r"CUDA runtime version (?P<rt>\d+), driver version (?P<drv>\d+)$", "versions"),
    rule("section", r"(?P<section>Job summary|Communicators\.\.\.|Errors|Warnings)(?: \([\d.]+s\))?$", "section"),
    rule("underline", r"=+$", None),
    rule("block", r"#(?P<group>\d+-\d+) \((?P<hash>[0-9a-fA-F]+)\) (?P<status>[A-Z,]+)$", "block"),
    rule("bare_block", r"(?P<status>INCOMPLETE|DEAD|TIMEOUT)$", "block"),
    rule("rank", r"Rank (?P<rank>\d+) -- (?:GPU (?P<gpu>\S+) managed by process (?P<pid>\d+) on node (?P<node>\S+)"
         r"|\[process information not found\])$", "events",
         Col("rank", "rank", int), Col("gpu", "gpu", S), Col("pid", "pid", int), Col("node", "node", S), event="ras_rank"),
    rule("process", r"Process (?P<pid>\d+) on node (?P<node>\S+) managing GPUs? (?P<gpu>.+)$", "events",
         Col("pid", "pid", int), Col("node", "node", S), Col("gpu", "gpu", S), event="ras_process"),
    rule("outlier_node", r"Node (?P<node>\S+) running process(?:es)? (?P<pids>[\d,]+)$", "events",
         Col("node", "node", S), Col("pids", "detail", S), event="ras_outlier_node"),
    rule("no_data", r"No communicator data collected!$", None),
)
# Two-row headers -> our column names (joined "row1 row2"); a new column is one row.
COLUMNS = {
    "Nodes (total)": "num_nodes", "Nodes": "num_nodes", "Processes per node": "num_processes_per_node",
    "GPUs per process": "num_gpus_per_process", "Processes (total)": "num_processes", "GPUs (total)": "num_gpus",
    "Group #": "comm_group", "Comms in group": "num_comms", "Nodes per comm": "num_nodes_per_comm",
    "Ranks per node": "ranks_per_node", "Ranks per comm": "num_ranks_per_comm", "Ranks in group": "num_ranks_in_group",
    "Status": "status", "Errors": "errors",
}
_HEADER1 = re.compile(r"(?:Nodes|Group|Processes)\s{2,}\S")
_HEADER2 = re.compile(r"(?:\(total\)|#|per (?:node|process|comm)|in group)(?:\s{2,}\S|$)")
_VALUES = re.compile(r"\d+(?:\s+[\w,\-]+)*$")


class RasParser(LineParser):
    kind = "nccl_ras"
    # underlines, bare statuses and a block's message lines are its only inside a report (busy); a
    # table's second header row and its rows, inside the table its first header row opened (a report
    # pasted without its section banners)
    gate = (*(r.regex for r in _LINES if r.name not in ("underline", "bare_block", "no_data")), _HEADER1)
    busy = property(lambda self: self._section is not None or self._block is not None or self._head1 is not None
                    or self._cols is not None)
    _section: str | None = None
    _head1: list[str] | None = None
    _cols: list[str] | None = None
    _block: dict | None = None

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        r, m = match_rules(_LINES, body)
        if r is not None:
            return self._rule(r, m, lineno)
        if _HEADER1.match(body):
            self._head1, self._cols = CELLS.split(body), None
            return True
        if self._head1 is not None and _HEADER2.match(body):
            head2 = CELLS.split(body)
            # a shorter second row: from the left when it starts under the first column ('(total)', '#'),
            # else from the right (its first cell is under a later column: 'per node  per process')
            pad = [""] * (len(self._head1) - len(head2))
            head2 = head2 + pad if head2[0] in ("(total)", "#") else pad + head2
            names = [f"{a} {b}".strip() for a, b in zip(self._head1, head2)]
            self._cols = [COLUMNS.get(n, re.sub(r"\W+", "_", n.lower()).strip("_")) for n in names]
            self._head1 = None
            return True
        if self._cols is not None and _VALUES.match(body):
            cells = body.split()
            if len(cells) != len(self._cols):
                return False
            row = dict(zip(self._cols, (int(c) if c.isdigit() else c for c in cells)))
            record = "ras_job" if "num_gpus" in row or "num_nodes" in row else "ras_comm_group"
            self.records.append({"table": "comm_topology", "source": self.source, "line": lineno, "record": record,
                                 "kind": self.kind, **row})
            return True
        if self._cols is not None and self._section is None:
            self._cols = None  # a table outside any section ends at its first line that is not a row
        if self._block is not None and re.match(r"[\w\[(]", body) and " NCCL " not in body:  # its message lines (not
            # an NCCL log line of a process writing the same stream)
            self._block["detail"] = f"{self._block['detail']}; {body}" if self._block["detail"] else body
            return True
        return False

    def _rule(self, r, m, lineno: int) -> bool:
        rec = apply_rule(r, m, source=self.source, lineno=lineno)
        g = m.groupdict()
        if r.table == "env":
            self.records.append(rec)
            if g.get("cuda"):
                self.records.append({**rec, "record": "cuda_build_version", "key": "cuda_build_version", "value": g["cuda"]})
        elif r.table == "versions":
            for key, grp in (("cuda_runtime_version", "rt"), ("cuda_driver_version", "drv")):
                self.env(lineno, key, g[grp], record=key)
        elif r.table == "section":
            self._section, self._cols, self._head1, self._block = g["section"].rstrip("."), None, None, None
        elif r.table == "block":
            status = g["status"]
            self._block = {"table": "events", "source": self.source, "line": lineno, "record": "ras_block",
                           "kind": self.kind, "event": "ras_" + status.split(",")[0].lower(), "status": status,
                           "comm_group": g.get("group"), "comm_hash": g.get("hash"), "section": self._section,
                           "rank": None, "detail": ""}
            self.records.append(self._block)
            self._cols = None
        elif rec is not None:  # per-rank / per-process lines belong to the block above them
            rec.update(kind=self.kind, status=self._block["status"] if self._block else None,
                       comm_hash=self._block["comm_hash"] if self._block else None, section=self._section)
            rec.setdefault("rank", None)
            self.records.append(rec)
        return True


def parse_nccl_ras(text, *, source: str) -> ParseResult:
    """Parse NCCL RAS client output (see module doc). Pure; never raises on content."""
    return run_parsers(text, [RasParser(source), FailureScanner(source)], kind="nccl_ras")
