"""DeepSpeed logs: ``[ts] [LEVEL] [file.py:line:func] msg`` lines.

Records: ``steps`` (``step=N, skipped=K, lr=[..]`` lines merged with the same step's throughput
line, old ``e/s, SamplesPerSec=..`` or new ``epoch=/micro_step=/global_step=, RunningAvgSamplesPerSec=..``;
pipeline-engine ``steps: N loss: .. iter time (s): ..``), ``timers`` (``time (ms) | name: v``),
``memory`` (``see_memory_usage`` label / MA / CPU lines), ``env`` (config dump ``key ..... value``,
the launcher ``cmd = ...``). The flops-profiler and comms-logger tables: deepspeed_tables.
"""
from __future__ import annotations

import re
import sys

from ingest.parsers import ParseResult, StepRowParser, put_field, run_parsers, to_gib
from ingest.parsers.failures import FailureScanner

_PREFIX = re.compile(r"\[(?P<ts>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+)\] \[(?P<level>[A-Z]+)\] \[(?P<loc>[\w.]+:\d+):(?P<func>\w+)\] ?(?P<msg>.*)$")
_RANK = re.compile(r"\[Rank (\d+)\] ")
_STEP = re.compile(r"(?:\[Rank (?P<rank>\d+)\] )?step=(?P<step>\d+), skipped=(?P<skipped>\d+), lr=\[(?P<lr>[^\],]+)")
_OLD_TIMER = re.compile(r"(?P<epoch>\d+)/(?P<step>\d+), SamplesPerSec=(?P<sps>[\d.]+)(?:, MemAllocated=(?P<ma>[\d.]+\w*B), MaxMemAllocated=(?P<mma>[\d.]+\w*B))?")
_NEW_TIMER = re.compile(r"epoch=(?P<epoch>\d+)/micro_step=(?P<micro>\d+)/global_step=(?P<step>\d+), RunningAvgSamplesPerSec=(?P<avg>[\d.]+), "
                        r"CurrSamplesPerSec=(?P<sps>[\d.]+)(?:, MemAllocated=(?P<ma>[\d.]+\w*B), MaxMemAllocated=(?P<mma>[\d.]+\w*B))?")
_OVERFLOW = re.compile(r"OVERFLOW! Rank \d+ Skipping step\. Attempted loss scale: (?P<scale>[\d.]+)")
_PIPE = re.compile(r"steps: (?P<step>\d+) loss: (?P<loss>[\d.eE+\-]+|nan) iter time \(s\): (?P<t>[\d.]+) samples/sec: (?P<sps>[\d.]+)")
_MA = re.compile(r"MA (?P<ma>[\d.]+) GB\s+Max_MA (?P<mma>[\d.]+) GB\s+CA (?P<ca>[\d.]+) GB\s+Max_CA (?P<mca>[\d.]+) GB")
_CPU = re.compile(r"CPU Virtual Memory:\s+used = (?P<used>[\d.]+) GB, percent = (?P<pct>[\d.]+)%")
_CFG = re.compile(r"(?P<key>[A-Za-z_][\w.]*) \.{2,} (?P<value>.*)$")
# One ``| name: v`` segment (name starts with a non-space: the segment is stripped first).
_TIMER_SEGS = re.compile(r"\|\s*([\w\-/.][\w\-/ .]*): ([\d.]+)")
_TIMER_LINE = re.compile(r"(?:rank=(?P<rank>\d+) )?time \(ms\) (?P<rest>\|.*)$")


def timer_records(body: str, *, source: str, lineno: int, step, rank, kind: str) -> list[dict]:
    """``[rank=R ]time (ms) | name: v | name: v`` -> one ``timers`` row per name (seconds)."""
    m = _TIMER_LINE.match(body)
    if not m:
        return []
    base = {"table": "timers", "source": source, "line": lineno, "kind": kind,
            "rank": int(m.group("rank")) if m.group("rank") else rank, "step": step}
    return [dict(base, name=sys.intern(name), time_s=float(v) * 1e-3)  # names interned: the same few every step
            for name, v in _TIMER_SEGS.findall(m.group("rest"))]


class DeepSpeedParser(StepRowParser):
    kind = "deepspeed"
    gate = (_PREFIX, _MA, _CPU)
    _last_step = None
    _mem_label: str | None = None
    _mem: dict | None = None
    _last_rank = None  # "[Rank r] step=" names the rank; the timer line after it does not

    def _row(self, rank, step: int, lineno: int) -> dict:
        if rank is None:
            rank = self._last_rank
        else:
            self._last_rank = rank
        self._last_step = step
        return self._step_row(rank, step, lineno)

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        p = _PREFIX.match(body) if body[:1] == "[" else None
        if p is None:
            return self._bare(lineno, body, ts, rank)
        return self._message(lineno, p.group("ts"), p.group("func"), p.group("msg").strip(), rank)

    def fallback(self, lineno: int, body: str, ts, rank) -> bool:
        """Any other line of DeepSpeed's logger: a warning or error is an event (the loss scaler's
        overflow with its scales); an info line is its chatter, read and kept in no table."""
        p = _PREFIX.match(body) if body[:1] == "[" else None
        if p is None:
            return False
        level, msg = p.group("level"), p.group("msg").strip()
        m = _OVERFLOW.search(msg)
        if m:
            self.event("loss_scale_overflow", lineno, rank, p.group("ts"), loc=p.group("loc"),
                       loss_scale=float(m.group("scale")), detail=msg[:500])
        elif level in ("WARNING", "ERROR", "CRITICAL") or msg.startswith("Killing subprocess "):  # (launch.py's sigkill_handler)
            event = {"WARNING": "warning", "INFO": "subprocess_killed"}.get(level, "error")
            self.event(event, lineno, rank, p.group("ts"), loc=p.group("loc"), detail=msg[:500])
        return True

    def _message(self, lineno: int, ts: str, func: str, msg: str, rank) -> bool:
        """The message of a prefixed line (the ``in`` tests: literals each regex needs, a cheap filter)."""
        rm = _RANK.match(msg) if msg[:6] == "[Rank " else None
        if rm:
            rank, msg = int(rm.group(1)), msg[rm.end():]
        if func == "see_memory_usage":  # the label, then (bare, or with the prefix since ~0.10) MA and CPU lines
            if self._bare(lineno, msg, ts, rank):
                return True
            if msg.startswith(("MA ", "CPU Virtual Memory:")):  # its figures cut short: no label
                self.open_line = lineno
            else:
                self._mem_label = msg
            return True
        m = _STEP.match(msg) if "step=" in msg else None
        if m:
            r = int(m.group("rank")) if m.group("rank") else rank
            row = self._row(r, int(m.group("step")), lineno)
            row.update(time=ts, num_skipped_iterations=int(m.group("skipped")))
            put_field(row, ("lr", float, 1), m.group("lr"))
            return True
        m = (_NEW_TIMER.match(msg) or _OLD_TIMER.match(msg)) if "SamplesPerSec=" in msg else None
        if m:
            g = m.groupdict()
            row = self._row(rank, int(g["step"]), lineno)
            row.setdefault("time", ts)
            row["samples_per_s"] = float(g["sps"])
            if g.get("avg"):
                row["samples_per_s_running_avg"] = float(g["avg"])
            if g.get("ma"):
                row["mem_allocated_gib"] = to_gib(g["ma"])
                row["mem_max_allocated_gib"] = to_gib(g["mma"])
            return True
        if msg.startswith("time (ms)") or msg.startswith("rank=") and "time (ms)" in msg:
            self.records.extend(timer_records(msg, source=self.source, lineno=lineno, step=self._last_step,
                                              rank=rank, kind="deepspeed"))
            return True
        m = _PIPE.match(msg) if msg[:7] == "steps: " else None
        if m:
            row = self._row(rank, int(m.group("step")), lineno)
            row.update(time=ts, step_time_s=float(m.group("t")), samples_per_s=float(m.group("sps")),
                       loss=None if m.group("loss") == "nan" else float(m.group("loss")))
            return True
        if msg.startswith("DeepSpeed info: version="):  # (runtime/engine.py, once at start)
            msg = "deepspeed_version ..... " + msg[24:].partition(",")[0]
        if msg.startswith("cmd = "):
            self.env(lineno, "launch_command", msg[6:], record="launch_command")
            return True
        m = _CFG.match(msg) if " .." in msg else None
        if m:
            key = m.group("key")
            self.env(lineno, key if key == "deepspeed_version" else f"deepspeed.{key}", m.group("value").strip(), record="config")
            return True
        return False

    def _bare(self, lineno: int, body: str, ts, rank) -> bool:
        """see_memory_usage continuation lines (no prefix)."""
        m = _MA.match(body) if body[:3] == "MA " else None
        if m:
            self._mem = {"table": "memory", "source": self.source, "line": lineno, "kind": "deepspeed", "rank": rank,
                         "label": self._mem_label, "step": self._last_step,
                         "mem_allocated_gib": float(m.group("ma")), "mem_max_allocated_gib": float(m.group("mma")),
                         "mem_reserved_gib": float(m.group("ca")), "mem_max_reserved_gib": float(m.group("mca"))}
            self.records.append(self._mem)
            return True
        m = _CPU.match(body) if body[:4] == "CPU " else None
        if m:
            if self._mem is not None:
                self._mem.update(cpu_mem_used_gib=float(m.group("used")), cpu_mem_pct=float(m.group("pct")))
            return True
        return False


def parse_deepspeed(text, *, source: str) -> ParseResult:
    """Parse a DeepSpeed log (see module doc). Pure; never raises on content."""
    from ingest.parsers.deepspeed_tables import AutotuningParser, CommsLogParser, FlopsProfileParser
    chain = [DeepSpeedParser(source), FlopsProfileParser(source), CommsLogParser(source), AutotuningParser(source),
             FailureScanner(source)]
    return run_parsers(text, chain, kind="deepspeed")
