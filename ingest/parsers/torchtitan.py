"""torchtitan metric lines: ``[titan] ts - root - INFO - step: N  loss: X  [grad_norm: G]
memory: 49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%`` (2024: ``wps:``).

Records: ``steps`` (tokens_per_s_per_gpu: torchtitan's tps is per device; memory is the
allocator's max reserved), ``events`` (GC pauses, profiler dumps). Deliberately not here:
our own MFU (report computes it; ``framework_mfu`` is kept for cross-checking only).
"""
from __future__ import annotations

import re

from ingest.parsers import LineParser, ParseResult, put_field, run_parsers, to_int, to_num
from ingest.parsers.failures import FailureScanner

_LINE = re.compile(r"(?:\[titan\] )?(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) - \w+ - (?P<level>[A-Z]+) - (?P<msg>.*)$")
_KV = re.compile(r"(?P<key>[a-z_]+):\s+(?P<value>\S+)")
_MEMORY = re.compile(r"(?P<gib>[\d.]+)GiB\((?P<pct>[\d.]+)%\)")


# Pattern table: key -> (column, type, unit scale).
STEP_FIELDS = {
    "step": ("step", to_int, 1),
    "loss": ("loss", to_num, 1),
    "grad_norm": ("grad_norm", to_num, 1),
    "tps": ("tokens_per_s_per_gpu", to_num, 1),
    "wps": ("tokens_per_s_per_gpu", to_num, 1),
    "tflops": ("framework_tflops_per_gpu", to_num, 1),
    "mfu": ("framework_mfu", lambda text: to_num(text.rstrip("%")), 0.01),  # '34.29%' -> 0.3429
}
_EVENTS = (
    ("gc", re.compile(r"\[GC\] Pe(?:r)?forming periodical GC collection\. (?P<s>[\d.]+) seconds")),
    ("profiler_dump", re.compile(r"Dumping profiler traces at step (?P<step>\d+)")),
    ("profiler_dump_done", re.compile(r"Finished dumping profiler traces in (?P<s>[\d.]+) seconds")),
)


class TorchtitanParser(LineParser):
    kind = "torchtitan"
    gate = (re.compile(_LINE.pattern.split("(?P<msg>")[0]),)  # '[titan] ts - logger - LEVEL - '

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        m = _LINE.match(body)  # [titan] ts - logger - LEVEL - msg
        if m is None:
            return False
        time, msg = m.group("ts", "msg")
        if msg.startswith("step:"):
            row = {"table": "steps", "source": self.source, "line": lineno, "kind": "torchtitan", "rank": rank,
                   "time": time}
            for key, value in _KV.findall(msg):
                spec = STEP_FIELDS.get(key)
                if spec is not None:
                    put_field(row, spec, value)
                elif key == "memory":
                    mm = _MEMORY.match(value)
                    if mm:
                        row["mem_max_reserved_gib"] = float(mm.group("gib"))
                        row["mem_max_reserved_pct"] = float(mm.group("pct"))
            if "step" not in row:
                return False
            row.setdefault("loss", None)
            self.records.append(row)
            return True
        for name, rx in _EVENTS:
            e = rx.search(msg)
            if e:
                g = e.groupdict()
                self.event(name, lineno, rank, time, detail=msg[:500], duration_s=float(g["s"]) if g.get("s") else None,
                           step=int(g["step"]) if g.get("step") else None)
                return True
        return False

    def fallback(self, lineno: int, body: str, ts, rank) -> bool:
        """Another line of torchtitan's logger (tagged ``[titan]``): a warning or error is an event;
        its setup chatter is read and kept in no table."""
        m = _LINE.match(body) if body.startswith("[titan]") else None
        if m is None:
            return False
        if m.group("level") in ("WARNING", "ERROR", "CRITICAL"):
            self.event("warning" if m.group("level") == "WARNING" else "error", lineno, rank, m.group("ts"),
                       detail=m.group("msg")[:500])
        return True


def parse_torchtitan(text, *, source: str) -> ParseResult:
    """Parse a torchtitan log (see module doc). Pure; never raises on content."""
    return run_parsers(text, [TorchtitanParser(source), FailureScanner(source)], kind="torchtitan")
