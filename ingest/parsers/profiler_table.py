"""torch.profiler ``key_averages().table()`` text: lower-resolution evidence of where time went.

Both header generations: old left-aligned (``Self CPU total %``, ``Number of Calls``; torch <= 1.7)
and modern right-aligned (``Self CPU %``, ``# of Calls``), optional memory / FLOPs / input-shape
columns, dashed rules, ``Self CPU time total:`` footers; cells split on runs of 2+ spaces.

Records: ``kernels`` (one per row, columns from HEADERS: times in seconds, ``*_pct``, memory in
bytes; ``columns``: the printed header cells joined by ``|``), ``events`` for the footers.
Deliberately not here: summing rows (nested ops double count; report decides) or guessing
columns of a row seen before any header (counted unparsed).
"""
from __future__ import annotations

import re
from typing import Callable

from ingest.parsers import (BINARY, CELLS, RULE_LINE, SI, Col, LineParser, Message, N_, ParseResult, apply_rule, match_rules,
                            read_scaled, rule, run_parsers, to_num)
from ingest.parsers.failures import FailureScanner

_TIME = re.compile(r"(-?[\d.,]+)\s*(ns|us|ms|s)")
_MEM = re.compile(r"(-?[\d.,]+)\s*([KMG]?b)", re.I)


def to_seconds(text: str) -> float:
    """'890.805us' / '5.234ms' / '1.203s' / '-3.000us' -> seconds."""
    return read_scaled(text, _TIME, lambda unit: SI[unit[:-1]])


def to_pct(text: str) -> float:
    if not text.endswith("%"):
        raise ValueError(text)
    return to_num(text[:-1])


def to_bytes(text: str) -> int:
    """'1.25 Gb' / '-512 b' -> bytes (as torch prints them, format_memory: Gb/Mb/Kb are binary multiples)."""
    return round(read_scaled(text, _MEM, lambda unit: BINARY[unit[:-1].upper()]))


# Pattern table of header cells: (regex, column template, converter). Templates use the
# named groups: dev (cpu/cuda/xpu/...), so "Self CUDA %" -> self_cuda_pct.
HEADERS: tuple[tuple[re.Pattern, str | Callable[[re.Match], str], Callable], ...] = tuple(
    (re.compile(p, re.I), col, conv) for p, col, conv in (
        (r"Name", "name", str),
        (r"Self (?P<dev>\w+)(?: total)? %", "self_{dev}_pct", to_pct),
        (r"Self (?P<dev>\w+)(?: total)?", "self_{dev}_s", to_seconds),
        (r"(?P<dev>\w+) total %", "{dev}_total_pct", to_pct),
        (r"(?P<dev>\w+) total", "{dev}_total_s", to_seconds),
        (r"(?P<dev>\w+) time avg", "{dev}_avg_s", to_seconds),
        (r"Self (?P<dev>\w+) Mem", "self_{dev}_mem_bytes", to_bytes),
        (r"(?P<dev>\w+) Mem", "{dev}_mem_bytes", to_bytes),
        (r"(?:# of|Number of) Calls", "num_calls", lambda t: int(t.replace(",", ""))),
        (r"Input Shapes", "input_shapes", str),
        (r"Source Location", "source_location", str),
        (r"Node ID", "node_id", int),
    ))
STANDARD = ("self_cpu_s", "cpu_total_s", "self_cuda_s", "cuda_total_s", "num_calls")  # None when not printed
_FLOPS = re.compile(r"Total (?P<unit>[KMGTP]?)FLOPs", re.I)

_LINES = (
    RULE_LINE,
    rule("self_time_total", r"Self (?P<dev>\w+) time total: (?P<t>-?[\d.,]+\s*(?:ns|us|ms|s))$", "events",
         Col("dev", "device", str.lower), Col("t", "duration_s", to_seconds), event="profiler_self_time_total"),
)


def _header_columns(cells: list[str]) -> list[tuple[str, Callable]] | None:
    """Header cells -> [(column, converter)], or None if this is not a profiler header."""
    if not cells or cells[0] != "Name":
        return None
    out = []
    for cell in cells:
        m = _FLOPS.fullmatch(cell)
        if m:
            out.append(("total_flops", lambda t, s=SI[m.group("unit").upper()]: to_num(t) * s))
            continue
        for rx, col, conv in HEADERS:
            h = rx.fullmatch(cell)
            if h:
                out.append((col.format(dev=(h.groupdict().get("dev") or "").lower()), conv))
                break
        else:
            out.append((re.sub(r"\W+", "_", cell.strip().lower()).strip("_") or "column", str))
    return out if len(out) >= 2 else None


# A row whose header the excerpt lost, read by torch's column order (torch/autograd/profiler_util.py
# _build_table: Name, the CPU block, the device block, memory pairs, # of Calls, FLOPs) and each
# cell's unit: (cell shape, columns it may fill, in order).
_SHAPES = (("pct", re.compile(r"-?[\d.,]+%")), ("time", re.compile(r"-?[\d.,]+(?:ns|us|ms|s)")),
           ("mem", re.compile(r"-?[\d.,]+ ?[KMG]?b", re.I)), ("int", re.compile(r"[\d,]+")))
_POSITIONAL = (("pct", "self_cpu_pct", to_pct), ("time", "self_cpu_s", to_seconds), ("pct", "cpu_total_pct", to_pct),
               ("time", "cpu_total_s", to_seconds), ("time", "cpu_avg_s", to_seconds))
_DEVICE = (("time", "self_cuda_s", to_seconds), ("pct", "self_cuda_pct", to_pct), ("time", "cuda_total_s", to_seconds),
           ("time", "cuda_avg_s", to_seconds))
# torch <= 1.7 printed no self device time: CUDA total %, CUDA total, CUDA time avg
_DEVICE_OLD = (("pct", "cuda_total_pct", to_pct), ("time", "cuda_total_s", to_seconds), ("time", "cuda_avg_s", to_seconds))
_MEMS = ("cpu_mem_bytes", "self_cpu_mem_bytes", "cuda_mem_bytes", "self_cuda_mem_bytes")


def _shape(cell: str) -> str | None:
    return next((name for name, rx in _SHAPES if rx.fullmatch(cell)), None)


def positional_columns(cells: list[str]) -> list[tuple[str, Callable]] | None:
    """The columns of a header-less row (cells: name first) by torch's order and the cells' units,
    or None when the cells do not follow it: the device block as torch >= 1.8 prints it or as
    torch <= 1.7 did; after # of Calls, a list literal is the input shapes, and a last cell (FLOPs,
    unit unknown without the header) is kept as text."""
    shapes = [_shape(c) for c in cells[1:]]
    if [s for s, _, _ in _POSITIONAL] != shapes[:5]:
        return None
    out, i = [("name", str)] + [(col, conv) for _, col, conv in _POSITIONAL], 5
    for block in (_DEVICE, _DEVICE_OLD):
        if [s for s, _, _ in block] == shapes[i:i + len(block)]:
            out += [(col, conv) for _, col, conv in block]
            i += len(block)
            break
    mems = 0
    while i < len(shapes) and shapes[i] == "mem" and mems < len(_MEMS):
        out.append((_MEMS[mems], to_bytes))
        mems, i = mems + 1, i + 1
    if i < len(shapes) and shapes[i] == "int":
        out.append(("num_calls", lambda t: int(t.replace(",", ""))))
        i += 1
    if i < len(shapes) and cells[i + 1].startswith("["):  # Input Shapes: a list literal
        out.append(("input_shapes", str))
        i += 1
    out += [("total_flops_as_printed", str)] * (len(shapes) - i == 1)
    return out if len(out) == len(cells) else None


class ProfilerTableParser(LineParser):
    kind = "profiler_table"
    # its header, its footer, or the rule of dashed cells above the header; rows: only under a header (busy)
    gate = (re.compile(r"Name\s{2,}\S|-{3,}(?:\s+-{3,})+$"), *(r.regex for r in _LINES if r is not RULE_LINE),
            "%  ")  # a row without its header: a percentage cell
    busy = property(lambda self: self._cols is not None)
    _cols: list[tuple[str, Callable]] | None = None
    _header = ""
    _fewest = 0  # the fewest cells of the table's header and rows so far: a row with fewer may be cut
    _bare_header: int | None = None  # the line of the last header no row has followed yet

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        r, m = match_rules(_LINES, body)
        if r is not None:
            rec = apply_rule(r, m, source=self.source, lineno=lineno)
            if rec is not None:
                rec.update(kind=self.kind, rank=rank)
                self.records.append(rec)
                self._cols = None  # a footer ends the table
            return True
        cells = CELLS.split(body)
        cols = _header_columns(cells)
        if cols is not None:
            self._cols, self._header, self._fewest = cols, "|".join(cells), len(cols)
            self._bare_header = lineno
            return True
        if self._cols is None:
            cols = positional_columns(cells)
            if cols is None:
                return False
            self._cols, self._header, self._fewest = cols, "(no header: columns by torch's order and units)", len(cols)
            self.warnings.append(Message(N_("line %(line)s: profiler rows without their header: columns read by torch's "
                                            "order and the cells' units"), line=lineno))
        if len(cells) < 2:
            return False
        self.open_line = lineno if len(cells) < (self._fewest or len(cells)) else None
        extra, self._fewest = len(cells) - len(self._cols), min(self._fewest or len(cells), len(cells))
        if extra > 0:  # a name with double spaces inside
            cells = ["  ".join(cells[:extra + 1])] + cells[extra + 1:]
        rec = {"table": "kernels", "source": self.source, "line": lineno, "record": "profiler_row", "kind": self.kind,
               "rank": rank, "columns": self._header}
        numbers = 0
        for (col, conv), cell in zip(self._cols, cells):
            if conv is str:
                rec[col] = cell
                continue
            try:
                rec[col] = conv(cell)
                numbers += 1
            except (ValueError, TypeError, OverflowError):
                rec[col] = None  # '--' (no FLOPs), blank or mangled cell
        for col in STANDARD + tuple(c for c, _ in self._cols):
            rec.setdefault(col, None)
        if 2 * numbers < sum(conv is not str for _, conv in self._cols) or not rec.get("name"):
            return False
        self.records.append(rec)
        self._bare_header = None
        return True

    def finish(self) -> None:
        if self._bare_header is not None:  # (no silent loss: a table whose rows are gone is said so)
            self.warnings.append(Message(N_("line %(line)s: a profiler table header with no rows after it: the table may "
                                            "be cut (truncated) there"), line=self._bare_header))


def parse_profiler_table(text, *, source: str) -> ParseResult:
    """Parse torch.profiler key_averages tables (see module doc). Pure; never raises on content."""
    return run_parsers(text, [ProfilerTableParser(source), FailureScanner(source)], kind="profiler_table")
