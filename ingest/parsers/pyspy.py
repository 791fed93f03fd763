"""``py-spy dump`` text: where every thread of a (possibly hung) process is.

Optional ``Process 1234: python train.py`` / ``Python v3.10.12 (...)`` headers; per thread a
header ``Thread 42 (idle): "MainThread"`` (name optional, id decimal or hex), then frames
innermost first (``func (file.py:line)``, native ``0xADDR (lib.so)`` or ``symbol (lib.so)``),
optionally ``Arguments:`` / ``Locals:`` blocks (``--locals``; recognised, not recorded).

Records: ``stacks`` (one per thread; ``frames`` innermost first joined by `` <- ``; ``collective``,
``collective_frame``: the innermost that ``is_collective`` accepts). Deliberately not here:
comparing ranks (ingest.hangs).
"""
from __future__ import annotations

import re

from ingest.parsers import Col, LineParser, ParseResult, apply_rule, match_rules, rule, run_parsers
from ingest.parsers.failures import FailureScanner

S = str
# Names of collectives as torch, DeepSpeed and Megatron spell their entry points.
_COLLECTIVE_NAME = re.compile(r"all_?gather|all_?reduce|reduce_?scatter|all_?to_?all|broadcast|barrier|"
                              r"(?:^|_)(?:i?send|i?recv)$|coalesced|^(?:reduce|gather|scatter)$", re.I)
# A wait/synchronize only counts inside a distributed module (threading.Condition.wait does not).
_DIST_FILE = re.compile(r"distributed|c10d|deepspeed/comm|nccl|megatron/core/(?:tensor|pipeline)_parallel")
_WAITS = frozenset({"wait", "synchronize", "_wait", "wait_tensor", "get_future"})

_LINES = (
    rule("process", r"Process (?P<pid>\d+): (?P<cmd>.*)$", "process", Col("pid", "pid", int), Col("cmd", "cmdline", S)),
    rule("python", r"Python v(?P<v>\d+\.\d+\S*)(?: \((?P<exe>[^)]*)\))?$", "python", Col("v", "python_version", S)),
    rule("thread", r'Thread (?P<tid>0x[0-9A-Fa-f]+|\d+)(?: \((?P<state>[\w+]+)\))?(?:: "(?P<name>[^"]*)")?$', "thread",
         Col("tid", "thread_id", S), Col("state", "state", S), Col("name", "thread_name", S)),
    rule("frame", r"(?P<func>\S.*?) \((?P<file>[^()]+?):(?P<ln>\d+)\)$", "frame",
         Col("func", "func", S), Col("file", "file", S), Col("ln", "frame_line", int)),
    rule("native_frame", r"(?P<func>0x[0-9a-fA-F]+|\S.*?) \((?P<file>[^():]+\.(?:so|dylib|dll)[\w.]*)\)$", "frame",
         Col("func", "func", S), Col("file", "file", S)),
    rule("locals_header", r"(?:Arguments|Locals):$", "locals"),
)
_LOCAL = re.compile(r"\w+: .*")


def is_collective(func: str, file: str) -> bool:
    """Does this frame look like a collective call (or a wait on one)?"""
    if func in _WAITS:
        return bool(_DIST_FILE.search(file))
    return bool(_COLLECTIVE_NAME.search(func))


class PySpyParser(LineParser):
    kind = "pyspy"
    gate = tuple(r.regex for r in _LINES if r.name in ("process", "python", "thread"))  # frames: only in a thread
    busy = property(lambda self: self._thread is not None or self._in_locals)
    _pid = None
    _thread: dict | None = None  # the thread being read; its frames (func, file, line), innermost first
    _frames: list[tuple[str, str, int | None]]
    _in_locals = False
    threads: tuple = ()  # (stacks record, its frames (func, file, line)) per thread, for ingest.hangs

    def _flush(self) -> None:
        t = self._thread
        if t is None:
            return
        text = [f"{f} ({file}:{ln})" if ln is not None else f"{f} ({file})" for f, file, ln in self._frames]
        hit = next((i for i, (f, file, _) in enumerate(self._frames) if is_collective(f, file)), None)
        t.update(top_frame=text[0] if text else None, num_frames=len(text), frames=" <- ".join(text),
                 collective=self._frames[hit][0] if hit is not None else None,
                 collective_frame=text[hit] if hit is not None else None)
        self.records.append(t)
        self.threads += ((t, self._frames),)
        self._thread = None

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        r, m = match_rules(_LINES, body)
        if r is None:
            # --locals blocks: "name: value" lines under Arguments:/Locals:
            return bool(self._in_locals and self._thread is not None and _LOCAL.match(body))
        rec = apply_rule(r, m, source=self.source, lineno=lineno)
        if r.table == "frame":
            if self._thread is None:
                return False  # a frame-looking line outside any thread
            self._in_locals = False
            self._frames.append((rec["func"], rec["file"], rec.get("frame_line")))
            return True
        if r.table == "locals":
            self._in_locals = self._thread is not None
            return self._in_locals
        self._flush()
        self._in_locals = False
        if r.table == "process":
            self._pid = rec["pid"]
        elif r.table == "thread":
            self._thread = {"table": "stacks", "source": self.source, "line": lineno, "record": "pyspy_thread",
                            "kind": self.kind, "rank": rank, "pid": self._pid, "thread_id": rec["thread_id"],
                            "thread_name": rec.get("thread_name"), "state": rec.get("state")}
            self._frames = []
        return True

    def finish(self) -> None:
        self._flush()


def parse_pyspy(text, *, source: str) -> ParseResult:
    """Parse ``py-spy dump`` output (see module doc). Pure; never raises on content."""
    return run_parsers(text, [PySpyParser(source), FailureScanner(source)], kind="pyspy")
