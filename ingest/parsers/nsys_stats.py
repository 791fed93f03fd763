"""``nsys stats`` summaries: text tables, ``--format csv`` output, and the legacy nvprof-style
``CUDA API Statistics (nanoseconds)`` tables of nsys <= 2021.

Text: ``Processing [x.sqlite] with [.../nvtx_sum.py]...`` or ``[3/8] Executing 'nvtx_sum' stats
report`` names the report, `` ** NVTX Range Summary (nvtx_sum):`` titles it, then a header, a
dashed rule and rows with cells separated by two or more spaces. CSV: the same, every cell
quoted. Legacy: a ``<What> Statistics (<unit>)`` title and a header without units.

Records: ``kernels`` (``report``, ``title``, a column per header cell (HEADERS); times in seconds
from the header's unit, sizes in bytes). Rows after a gap, without their header, are read with
nsys's default columns where they fit (with a warning). Deliberately not here: cuda_gpu_trace.
"""
from __future__ import annotations

import csv
import re

from ingest.parsers import CELLS, RULE_LINE, LineParser, Message, N_, ParseResult, apply_rule, match_rules, rule, run_parsers, to_num
from ingest.parsers.failures import FailureScanner

_TIME = {"ns": 1e-9, "nanoseconds": 1e-9, "us": 1e-6, "microseconds": 1e-6, "ms": 1e-3, "milliseconds": 1e-3,
         "s": 1.0, "sec": 1.0, "seconds": 1.0}
_SIZE = {"b": 1, "kb": 1e3, "kib": 2**10, "mb": 1e6, "mib": 2**20, "gb": 1e9, "gib": 2**30}
# Legacy (nvprof-mode) titles -> the modern report name.
_LEGACY = {"CUDA API": "cuda_api_sum", "CUDA Kernel": "cuda_gpu_kern_sum", "CUDA Memory Operation": "cuda_gpu_mem",
           "Operating System Runtime API": "osrt_sum", "NVTX Push-Pop Range": "nvtx_sum", "NVTX Range": "nvtx_sum"}

# Pattern table of header cells (unit stripped): base name -> (column stem, kind).
# kind "time"/"auto": scaled by the cell's unit (to seconds or bytes); "pct", "int", "str" as printed.
HEADERS = {
    "time": ("time_pct", "pct"), "time(%)": ("time_pct", "pct"),
    "total time": ("total", "time"), "total": ("total", "auto"),
    "instances": ("num_calls", "int"), "num calls": ("num_calls", "int"), "calls": ("num_calls", "int"),
    "count": ("num_calls", "int"), "operations": ("num_calls", "int"), "num ops": ("num_calls", "int"),
    "avg": ("avg", "auto"), "average": ("avg", "auto"), "med": ("med", "auto"), "median": ("med", "auto"),
    "min": ("min", "auto"), "minimum": ("min", "auto"), "max": ("max", "auto"), "maximum": ("max", "auto"),
    "stddev": ("stddev", "auto"), "std dev": ("stddev", "auto"),
    "name": ("name", "str"), "range": ("name", "str"), "operation": ("name", "str"), "style": ("style", "str"),
}
STANDARD = ("time_pct", "total_s", "num_calls", "avg_s", "med_s", "min_s", "max_s", "stddev_s")
_CELL = re.compile(r"(?P<base>.*?)\s*(?:\((?P<unit>[^)]*)\))?$")

_LINES = (
    rule("processing", r"Processing \[(?P<file>[^\]]*)\] with \[(?:.*[/\\])?(?P<report>\w+)(?:\.py)?\]\.\.\.$", "report"),
    rule("executing", r"\[\d+/\d+\] Executing '(?P<report>\w+)' stats report$", "report"),
    rule("title", r"\*\* (?P<title>.*) \((?P<report>\w+)\):$", "title"),
    rule("legacy_title", r"(?P<title>(?P<what>[\w /-]+?) Statistics) \((?P<unit>[^)]*)\)$", "legacy"),
    RULE_LINE,
    # nsys's own progress messages (profile, export, stats)
    rule("notice", r"NOTICE: |It is assumed file was previously exported|Consider using --force-export"
         r"|(?:Collecting data|Processing events|Creating final output files)\.\.\.$|Saving temporary \".*\.qdstrm\""
         r"|Saved report file to|Exporting \d+ events: |Exported successfully to|Generating .*\.\.\.$"
         r"|WARNING: .* will be profiled\.$|Generated:$"
         # 2019-era importer and exporter messages
         r"|Importing the qdstrm file using |Importing\.\.\.$|Importing \[=*\d+%\]$|Saving report to file |Report file saved\.$"
         r"|Please discard the qdstrm file|Please use the qdrep file instead\.$|Removed .*\.qdstrm as it was successfully"
         r"|Exporting the qdrep file to SQLite|Exporting \d+ events:$|0% +10 +20 .*100%$|\|(?:----\|)+$|\*{20,}$", None),
    rule("progress", r"(?:\[\d+/\d+\] )?(?:Processing )?\[=*\d+%\]", None),
    rule("no_data", r"SKIPPED: .* does not contain", None),
)


def _header(cells: list[str], *, unit: str | None) -> list[tuple[str, str, float]] | None:
    """Header cells -> [(column, kind, scale)], None unless it looks like a stats header."""
    out = []
    for cell in cells:
        m = _CELL.match(cell.strip())
        base, cunit = m.group("base").lower(), (m.group("unit") or unit or "ns").lower()
        spec = HEADERS.get(base)
        if base in ("time", "time(%)") or cunit == "%":
            out.append(("time_pct", "pct", 1.0))
            continue
        if spec is None:
            out.append((re.sub(r"\W+", "_", base).strip("_") or "column", "str", 1.0))
            continue
        stem, kind = spec
        if kind in ("time", "auto"):
            if cunit in _TIME:
                out.append((f"{stem}_s", "num", _TIME[cunit]))
            elif cunit in _SIZE:
                out.append((f"{stem}_bytes", "num", _SIZE[cunit]))
            else:
                out.append((stem + "_" + re.sub(r"\W+", "_", cunit), "num", 1.0))
        else:
            out.append((stem, kind, 1.0))
    names = [c for c, _, _ in out]
    if "name" not in names or not any(c in names for c in ("total_s", "time_pct", "num_calls", "total_bytes")):
        return None
    return out


DEFAULT_COLS = _header(["Time (%)", "Total Time (ns)", "Num Calls", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)",
                        "StdDev (ns)", "Name"], unit=None)


# what opens an nsys table anywhere in a file: a report banner or title, a header (text or CSV:
# its 'Time (%)' cell), or a row of the default summary layout (numbers, then the name)
_OPENS = (*(r.regex for r in _LINES if r.name in ("processing", "executing", "title", "legacy_title", "notice", "progress")),
          re.compile(r'"?Time ?\(%\)"?(?:,|\s{2,})'), re.compile(r"-?[\d.,]+\s{2,}[\d,]+\s{2,}[\d,]+\s{2,}[\d.,]+\s{2,}"))


class NsysStatsParser(LineParser):
    kind = "nsys_stats"
    gate = _OPENS
    busy = property(lambda self: self._cols is not None or self._report is not None)
    _report: str | None = None
    _title: str | None = None
    _unit: str | None = None
    _cols: list[tuple[str, str, float]] | None = None
    _csv = False
    _warned = False

    def _table_header(self, cells: list[str], *, csv_form: bool) -> bool:
        cols = _header(cells, unit=self._unit)
        if cols is None:
            return False
        self._cols, self._csv = cols, csv_form
        return True

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        r, m = match_rules(_LINES, body)
        if r is not None and (r.name != "rule_line" or self._report is not None or self._cols is not None):  # dashes: only under a report
            rec = apply_rule(r, m, source=self.source, lineno=lineno)
            if rec is not None:  # context lines: remember, no record
                g = m.groupdict()
                if r.table == "legacy":
                    what = g["what"].strip()
                    self._report = next((v for k, v in _LEGACY.items() if what.startswith(k)), None)
                    self._title, self._unit = g["title"], g["unit"]
                else:
                    if g.get("report"):
                        self._report = g["report"]
                    self._title = g.get("title") or (None if r.table == "report" else self._title)
                    self._unit = None
                self._cols = None
            return True
        if body.startswith('"') or ("," in body and "  " not in body):
            cells = _csv_cells(body)
            if cells is not None:
                if self._table_header(cells, csv_form=True):
                    return True
                if self._cols is not None and self._csv:
                    return self._row(lineno, cells, rank)
        cells = CELLS.split(body)
        if self._table_header(cells, csv_form=False):
            return True
        if self._cols is None and len(cells) == len(DEFAULT_COLS):
            return all(_NUM.fullmatch(c) for c in cells[:-1]) and self._row(lineno, cells, rank, headerless=True)
        if self._cols is None or self._csv:
            return False
        if len(cells) > len(self._cols):  # names keep their inner double spaces: split off the numbers only
            cells = cells[:len(self._cols) - 1] + ["  ".join(cells[len(self._cols) - 1:])]
        if self._row(lineno, cells, rank):
            return True
        self._cols = None  # not a row: the table ended (e.g. a "[trimmed]" gap); later rows have no header
        return False

    def _row(self, lineno: int, cells: list[str], rank, *, headerless: bool = False) -> bool:
        cols = DEFAULT_COLS if headerless else self._cols
        if len(cells) != len(cols):
            return False
        rec = {"table": "kernels", "source": self.source, "line": lineno, "record": "nsys_row", "kind": self.kind,
               "rank": rank, "report": None if headerless else self._report, "title": None if headerless else self._title}
        numbers = 0
        for (col, kind, scale), cell in zip(cols, cells):
            cell = cell.strip()
            if kind == "str":
                rec[col] = cell
                continue
            try:
                v = to_num(cell.rstrip("%"))
            except ValueError:
                rec[col] = None
                continue
            numbers += 1
            rec[col] = int(v) if kind == "int" else v * scale if scale != 1.0 else v
        if numbers == 0 or not rec.get("name"):
            return False
        for col in STANDARD:
            rec.setdefault(col, None)
        self.records.append(rec)
        if headerless and not self._warned:  # cuda_api_sum, osrt_sum, cuda_gpu_kern_sum share this layout
            self._warned = True
            self.warnings.append(Message(N_("line %(line)s: rows without their table header; read with nsys's default summary "
                                            "columns (Time (%%), Total Time (ns), Num Calls, Avg, Med, Min, Max, StdDev, Name), "
                                            "report unknown"), line=lineno))
        return True


_NUM = re.compile(r"-?[\d,]+(?:\.\d+)?")


def _csv_cells(body: str) -> list[str] | None:
    try:
        rows = list(csv.reader([body]))
    except csv.Error:
        return None
    return rows[0] if rows and len(rows[0]) >= 2 else None


def parse_nsys_stats(text, *, source: str) -> ParseResult:
    """Parse ``nsys stats`` output (text, CSV or legacy; see module doc). Pure; never raises on content."""
    return run_parsers(text, [NsysStatsParser(source), FailureScanner(source)], kind="nsys_stats")
