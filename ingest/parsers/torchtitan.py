"""torchtitan metric lines: ``[titan] ts - root - INFO - step: N  loss: X  [grad_norm: G]
memory: 49.66GiB(52.28%)  tps: 5,856  tflops: 339.16  mfu: 34.29%`` (with/without rank
prefix, thousands separators, colour codes — stripped by the normaliser; 2024 ``wps:``).

Records: ``steps`` (tokens_per_s_per_gpu: torchtitan's tps is per device; memory is the
allocator's max reserved), ``events`` (GC pauses, profiler dumps). Deliberately not here:
our own MFU (report computes it; ``framework_mfu`` is kept for cross-checking only).
"""
from __future__ import annotations

import re

from ingest.parsers import LineParser, ParseResult, fast_rank, put_field, run_parsers, to_int, to_num
from ingest.parsers.failures import FailureScanner

try:
    from ingest.parsers import _train_scan
except ImportError:  # not built (no C compiler at install): the Python path alone
    _train_scan = None

_LINE = re.compile(r"(?:\[titan\] )?(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) - \w+ - (?P<level>[A-Z]+) - (?P<msg>.*)$")
_KV = re.compile(r"(?P<key>[a-z_]+):\s+(?P<value>\S+)")
_MEMORY = re.compile(r"(?P<gib>[\d.]+)GiB\((?P<pct>[\d.]+)%\)")


def to_pct(text: str) -> float:
    """'34.29%' -> 34.29 (thousands separators dropped as to_num does)."""
    return to_num(text.rstrip("%"))


# Pattern table: key -> (column, type, unit scale).
STEP_FIELDS = {
    "step": ("step", to_int, 1),
    "loss": ("loss", to_num, 1),
    "grad_norm": ("grad_norm", to_num, 1),
    "tps": ("tokens_per_s_per_gpu", to_num, 1),
    "wps": ("tokens_per_s_per_gpu", to_num, 1),
    "tflops": ("framework_tflops_per_gpu", to_num, 1),
    "mfu": ("framework_mfu", to_pct, 0.01),
}


def _step_field(key: str) -> tuple | None:
    """The STEP_FIELDS entry of a step-line key (None: not a column)."""
    return STEP_FIELDS.get(key)


_EVENTS = (
    ("gc", re.compile(r"\[GC\] Pe(?:r)?forming periodical GC collection\. (?P<s>[\d.]+) seconds")),
    ("profiler_dump", re.compile(r"Dumping profiler traces at step (?P<step>\d+)")),
    ("profiler_dump_done", re.compile(r"Finished dumping profiler traces in (?P<s>[\d.]+) seconds")),
)

# Fast line: the usual layout of a step line. Values are taken loosely (single-class repeats
# are what the regex engine runs fast) and converted with float()/int(); a value that does
# not convert sends the line to feed, so fast_step gives what _KV and STEP_FIELDS give.
_FAST_STEP = (
    r"step: +(?P<t_step>[0-9]+) +loss: +(?P<t_loss>\S+)(?: +grad_norm: +(?P<t_gn>\S+)|) +memory: +(?P<t_gib>[0-9.]+)GiB"
    r"\((?P<t_pct>[0-9.]+)%\) +[tw]ps: +(?P<t_tps>[0-9,]+) +tflops: +(?P<t_tflops>\S+) +mfu: +(?P<t_mfu>\S+)%"
)


class TorchtitanParser(LineParser):
    kind = "torchtitan"
    hints = (" - ",)
    fast_head = r"(?:\[titan\] |)(?P<t_ts>[0-9]{4}-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9],[0-9]+) - \w+ - [A-Z]+ - "
    fast_lines = (("step", _FAST_STEP), ("line", r"(?P<l_msg>.*\S)"))
    native = native_misses = _train_scan is not None

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self._native = None if _train_scan is None else _train_scan.TorchtitanScan(
            source, field_spec=_step_field, converters={to_num: "num", to_int: "int", to_pct: "pct"})

    def native_scan(self, text: str, pos: int, lineno: int, misses=None) -> tuple[int, int, int, int]:
        """Step and event lines in the compiled scanner (_train_scan.TorchtitanScan)."""
        return self._native.scan(text, pos, lineno, misses, self.records)

    def fast_step(self, lineno: int, m, ts) -> bool:
        rank, time, step, loss, gn, gib, pct, tps, tflops, mfu = m.group(
            "rank", "t_ts", "t_step", "t_loss", "t_gn", "t_gib", "t_pct", "t_tps", "t_tflops", "t_mfu")
        try:
            row = {"table": "steps", "source": self.source, "line": lineno, "kind": "torchtitan",
                   "rank": int(rank) if rank else None, "time": time, "step": int(step), "loss": float(loss)}
            if gn is not None:
                row["grad_norm"] = float(gn)
            row["mem_max_reserved_gib"], row["mem_max_reserved_pct"] = float(gib), float(pct)
            row["tokens_per_s_per_gpu"], row["framework_tflops_per_gpu"] = to_num(tps), float(tflops)
            row["framework_mfu"] = float(mfu) * STEP_FIELDS["mfu"][2]
        except ValueError:
            return False
        self.records.append(row)
        return True

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        m = _LINE.match(body)
        if m is None:
            return False
        return self._message(lineno, m.group("ts"), m.group("msg"), rank)

    def fast_line(self, lineno: int, m, ts) -> bool:
        return self._message(lineno, m.group("t_ts"), m.group("l_msg"), fast_rank(m))

    def _message(self, lineno: int, time: str, msg: str, rank) -> bool:
        """The message of a ``ts - logger - LEVEL - msg`` line."""
        if msg.startswith("step:"):
            row = {"table": "steps", "source": self.source, "line": lineno, "kind": "torchtitan", "rank": rank,
                   "time": time}
            for kv in _KV.finditer(msg):
                key, value = kv.group("key"), kv.group("value")
                if key == "memory":
                    mm = _MEMORY.match(value)
                    if mm:
                        row["mem_max_reserved_gib"] = float(mm.group("gib"))
                        row["mem_max_reserved_pct"] = float(mm.group("pct"))
                    continue
                spec = STEP_FIELDS.get(key)
                if spec is not None:
                    put_field(row, spec, value)
            if "step" not in row:
                return False
            row.setdefault("loss", None)
            self.records.append(row)
            return True
        for name, rx in _EVENTS:
            e = rx.search(msg)
            if e:
                g = e.groupdict()
                self.records.append({"table": "events", "source": self.source, "line": lineno, "event": name,
                                     "rank": rank, "time": time, "detail": msg[:500],
                                     "duration_s": float(g["s"]) if g.get("s") else None,
                                     "step": int(g["step"]) if g.get("step") else None})
                return True
        return False


def build_torchtitan_chain(source: str) -> list[LineParser]:
    """The parsers a torchtitan log goes through, first that recognises a line wins."""
    return [TorchtitanParser(source), FailureScanner(source)]


def parse_torchtitan(text, *, source: str, fast: bool = True) -> ParseResult:
    """Parse a torchtitan log (see module doc). Pure; never raises on content."""
    return run_parsers(text, build_torchtitan_chain(source), kind="torchtitan", fast=fast)
