"""Failure reports as events: torchrun ChildFailedError blocks, NCCL watchdog timeouts (the
2022 ``[E ProcessGroupNCCL.cpp:N]`` form, the glog-timestamped ``[rankN]:[E0321 ...]`` form
with NumelIn/Out, the ``[PG ID n PG GUID g Rank r]`` form), CUDA OOM messages (torch <=2.0,
2.1 typo, >=2.2), torchrun agent lines, and Python tracebacks (recognised, not recorded).

Records: ``events`` (``event``, ``rank``, ``time`` as printed, ``detail``, per-kind columns); every
other parser's chain ends with FailureScanner. Deliberately not here: deciding which rank hung.
"""
from __future__ import annotations

import re

from ingest.parsers import INT, Col, LineParser, ParseResult, apply_rule, match_rules, put_field, rule, run_parsers, to_gib, to_int

_GLOG = re.compile(
    r"\[?(?P<sev>[EWIF])(?P<date>\d{3,4})?(?: (?P<time>\d\d:\d\d:\d\d\.\d+))?(?: \d+)? (?P<loc>[\w./]+:\d+)\] (?P<msg>.*)"
)
_GLOG_CUT = re.compile(r"[EWIF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+(?: [\w./]*)?$")  # a glog head the text ends inside
_PG_RANK = re.compile(r"\[(?:PG (?:ID )?(?P<pg>\d+) (?:PG GUID (?P<guid>\S+?) )?)?Rank (?P<rank>\d+)\] (?P<body>.*)")
_WORK = re.compile(r"WorkNCCL\((?P<work>[^()]*(?:\([^()]*\)[^()]*)*)\)(?: ran for (?P<ran>\d+) milliseconds)?")
_WORK_KEYS = {"SeqNum": ("seq_num", int, 1), "OpType": ("op_type", str, 1), "NumelIn": ("numel_in", int, 1),
              "NumelOut": ("numel_out", int, 1), "Timeout(ms)": ("timeout_s", lambda ms: int(ms) / 1000, 1)}

# Pattern table: body of a glog/ProcessGroupNCCL message after "[... Rank r] ".
_WATCHDOG_RULES = (
    rule("nccl_timeout", r"Watchdog caught collective operation timeout: (?P<detail>.*)", "events"),
    rule("watchdog_exception", r"(?:Exception \(either an error or timeout\) detected by watchdog at work: (?P<work>\d+), "
         r"last enqueued NCCL work: (?P<enq>-?\d+), last completed NCCL work: (?P<comp>-?\d+)"
         # torch 2.6+: " failure detected by watchdog at work sequence id: N PG status: last enqueued work: .."
         r"|\s*failure detected by watchdog at work sequence id: (?P<work2>\d+) PG status: last enqueued work: "
         r"(?P<enq2>-?\d+), last completed work: (?P<comp2>-?\d+))", "events",
         Col("work2", "seq_num", int), Col("enq2", "last_enqueued_seq", int), Col("comp2", "last_completed_seq", int),
         Col("work", "seq_num", int), Col("enq", "last_enqueued_seq", int), Col("comp", "last_completed_seq", int)),
    rule("watchdog_terminated", r"(?:Process group|NCCL) watchdog thread terminated with exception: (?P<detail>.*)", "events"),
    rule("nccl_failed", r"(?P<detail>Some NCCL operations have failed or timed out.*)", "events"),
    rule("process_abort", r"(?P<detail>To avoid data inconsistency, we are taking the entire process down.*)", "events"),
    rule("fr_dump", r"(?P<detail>ProcessGroupNCCL preparing to dump debug info.*)", "events"),
    rule("timeout_dump", r"(?P<detail>.*(?:[Tt]imeout|[Dd]ump).*)", "events"),
)

# Pattern table: whole-line rules; the two after any "[...] " prefix are found by a literal each needs.
_EXITED, _CLOSING, _NCCL_ERROR, _DS_EXIT = "failed (exitcode: ", "Sending process ", "NCCL error", " exits with return code = "
_LINE_RULES = (
    rule("traceback", r"Traceback \(most recent call last\):$", None),
    rule("traceback_frame", r'File "(?P<file>[^"]*)", line (?P<ln>\d+)(?:, in (?P<func>.*))?$', None),
    rule("chained", r"(?:The above exception was the direct cause of the following exception|During handling of the "
         r"above exception, another exception occurred):$", None),
    rule("traceback_carets", r"[\^~ ]*\^[\^~ ]*$", None),
    rule("cpp_frame", r"frame #\d+: ", None),
    rule("exception_raised", r"Exception raised from \S+ at ", None),
    rule("rule_line", r"(?:={20,}|-{20,})$", None),
    rule("agent_failed", r"(?:.*\]\s?)?(?:ERROR:[\w.]+:)?" + re.escape(_EXITED) + r"(?P<code>-?\d+)\) local_rank: (?P<lr>\d+) "
         rf"\(pid: (?P<pid>{INT})\) of binary: (?P<detail>.*)", "events",
         Col("code", "exitcode", int), Col("lr", "local_rank", int), Col("pid", "pid", to_int)),
    # DeepSpeed's launcher (launcher/launch.py sigkill_handler): "[ERROR] ... ['python', ...] exits with return code = 1"
    rule("launcher_exit", r".*\] (?P<detail>.*)" + _DS_EXIT + r"(?P<code>-?\d+)$", "events", Col("code", "exitcode", int)),
    rule("closing_signal", r"(?:.*\]\s?)?" + _CLOSING + r"(?P<pid>\d+) closing signal (?P<detail>\w+)", "events",
         Col("pid", "pid", int)),
    # NCCL_* settings, and the options ProcessGroupNCCL prints one per line under "initialized with following options:"
    rule("nccl_env", r"(?P<key>NCCL_\w+|TORCH_NCCL_\w+|TIMEOUT\(ms\)|USE_HIGH_PRIORITY_STREAM): (?P<value>\S.*)$", "env",
         Col("key", "key", str), Col("value", "value", str)),
    # an NCCL error as torch raises it (c10d NCCLUtils: "NCCL error in: file:line, msg, NCCL version v"),
    # alone or as a work's async exception; then NCCL's own result name and its "Last error:" line
    rule("nccl_error", r".*?" + _NCCL_ERROR + r"(?: in: (?P<loc>\S+?))?[:,] (?P<detail>.*?)(?:, NCCL version (?P<v>\S+))?$",
         "events", Col("loc", "loc", str)),
    rule("nccl_result", r"nccl[A-Z]\w*(?:Error|Usage|Argument): .*$|Last error:$", None),
)

_CHILD_FAILED, _OOM_TEXT, _SEARCHED = "ChildFailedError", "CUDA out of memory", ("agent_failed", "closing_signal", "nccl_error", "launcher_exit")
_OOM = re.compile(r"(?:(?P<cls>[\w.]*(?:OutOfMemoryError|RuntimeError)): )?CUDA out of memory\. Tried to allocate (?P<tried>[\d.]+ ?(?:[KMGT]?i?B|bytes))")
# c10/cuda/CUDACachingAllocator.cpp, when a memory fraction is set: "Allocation on device 0 would exceed
# allowed memory. (out of memory)" then "Currently allocated : X", "Requested : Y", "Device limit : Z", ...
_OOM_LIMIT = "would exceed allowed memory"
_OOM_LIMIT_RX = re.compile(r"Allocation on device (?P<gpu>\d+) would exceed allowed memory")
_OOM_LIMIT_FIELD = re.compile(r"(?P<key>Currently allocated|Requested|Device limit|Free \(according to CUDA\)"
                              r"|PyTorch limit \(set by user-supplied memory fraction\))\s*(?:: (?P<v>[\d.,]+ ?(?:[KMGT]?i?B|bytes?)))?$"
                              r"|: (?P<v2>[\d.,]+ ?(?:[KMGT]?i?B|bytes?))$")  # (the limit's value on a line of its own)
_OOM_LIMIT_COLS = {"Currently allocated": ("mem_allocated_gib", to_gib, 1), "Requested": ("mem_tried_gib", to_gib, 1),
                   "Device limit": ("mem_total_gib", to_gib, 1), "Free (according to CUDA)": ("mem_free_gib", to_gib, 1),
                   "PyTorch limit (set by user-supplied memory fraction)": ("mem_limit_gib", to_gib, 1)}
# torch.cuda.memory_summary() (torch/cuda/memory.py), often printed after an OOM: a boxed table,
# per metric "| Allocated memory | cur | peak | tot alloc | tot freed |"
_MEM_SUMMARY = re.compile(r"(?:Memory summary: )?\|=+\|$|\|\s+PyTorch CUDA memory summary, device ID (?P<dev>\d+)\s+\|$")
_MEM_ROW = re.compile(r"\|\s*(?P<metric>[A-Za-z][\w -]*?)\s*\|\s*(?P<cur>[\d.]+ ?(?:[KMGT]?i?B|bytes))\s*\|\s*(?P<peak>[\d.]+ ?(?:[KMGT]?i?B|bytes))\s*\|")
_MEM_METRICS = {"Allocated memory": ("mem_allocated_gib", "mem_max_allocated_gib"),
                "GPU reserved memory": ("mem_reserved_gib", "mem_max_reserved_gib")}
_OOM_FIELDS = (
    (re.compile(r"\(GPU (?P<v>\d+);"), "gpu", int),
    (re.compile(r"GPU (?P<v>\d+) has a total capac"), "gpu", int),
    (re.compile(r"(?P<v>[\d.]+ ?(?:[KMGT]?i?B|bytes)) total capacity"), "mem_total_gib", to_gib),
    (re.compile(r"total capac(?:i)?ty of (?P<v>[\d.]+ ?(?:[KMGT]?i?B|bytes))"), "mem_total_gib", to_gib),
    (re.compile(r"(?P<v>[\d.]+ ?(?:[KMGT]?i?B|bytes)) already allocated"), "mem_allocated_gib", to_gib),
    (re.compile(r"Of the allocated memory (?P<v>[\d.]+ ?(?:[KMGT]?i?B|bytes)) is allocated by PyTorch"), "mem_allocated_gib", to_gib),
    (re.compile(r"(?P<v>[\d.]+ ?(?:[KMGT]?i?B|bytes)) free"), "mem_free_gib", to_gib),
    (re.compile(r"of which (?P<v>[\d.]+ ?(?:[KMGT]?i?B|bytes)) is free"), "mem_free_gib", to_gib),
    (re.compile(r"(?P<v>[\d.]+ ?(?:[KMGT]?i?B|bytes)) reserved in total by PyTorch"), "mem_reserved_gib", to_gib),
    (re.compile(r"this process has (?P<v>[\d.]+ ?(?:[KMGT]?i?B|bytes)) memory in use"), "mem_in_use_gib", to_gib),
    (re.compile(r"(?P<v>[\d.]+ ?(?:[KMGT]?i?B|bytes)) is reserved by PyTorch but unallocated"), "mem_reserved_unallocated_gib", to_gib),
    (re.compile(r"(?P<v>expandable_segments)"), "hint", str),
)

_STAMPED = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d")  # a logger's record, not a traceback's source line
_OTHER_WRITER = re.compile(r"[\w.\-]+:\d+:\d+ \[\d+\] |[EWIF]\d{4} \d\d:\d\d:")  # NCCL's and glog's line heads
_CHILD_KV = re.compile(r"(?P<key>time|host|rank|exitcode|error_file|traceback)\s*: ?(?P<value>.*)$")
# ChildFailedError entry values read into two columns: key -> (pattern, its groups' int columns)
_CHILD_PAIRS = {"rank": (re.compile(r"(\d+)(?: \(local_rank: (\d+)\))?"), ("rank", "local_rank")),
                "exitcode": (re.compile(r"(-?\d+)(?: \(pid: (\d+)\))?"), ("exitcode", "pid"))}
# torchrun's failure report (torch/distributed/elastic/multiprocessing/errors), read when an excerpt
# starts inside it: its section heads, an entry head "[N]:", the keys only it prints
_CHILD_OPENS = re.compile(r"Root Cause \(first observed failure\):$|Failures:$|\[\d+\]:$|(?:exitcode|error_file)\s*: |(?:time|host) {6}: "
                          r"|rank\s*: \d+ \(local_rank: \d+\)$|\S+\.py FAILED$")
_PG_KEYS = {"size": "pg_size", "NCCL version": "nccl_version", "global rank": "pg_global_rank"}
# A Python traceback (traceback.py's format): inside it, frames, their source lines and carets; it
# ends at the exception line "module.Class: message"; a frame's file says whose code it is
_TB_INSIDE = re.compile(r'File "|[\^~ ]*\^[\^~ ]*$|\.\.\.$|\[Previous line repeated')
_EXCEPTION = re.compile(r"(?P<cls>[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Failure|Warning))(?::\s?(?P<msg>.*))?$")
_FRAMEWORK = re.compile(r"/torch/|/deepspeed/|/megatron/|/transformers/|/accelerate/|nccl")
_LIBRARY = re.compile(r"site-packages|dist-packages|/lib/python\d|^<frozen|/torch/|/deepspeed/|/megatron/")


def _user_frame(frame: tuple) -> bool:
    return _LIBRARY.search(frame[0]) is None


_SIGNAL = re.compile(r"Signal (?P<num>\d+) \((?P<name>\w+)\)")


class FailureScanner(LineParser):
    kind = "failures"
    gate = (_CHILD_FAILED, _CHILD_OPENS, "what():", _OOM_TEXT, _OOM_LIMIT, "Memory summary: |", "PyTorch CUDA memory summary", _EXITED, _CLOSING, _NCCL_ERROR, _DS_EXIT, _GLOG, _GLOG_CUT, *(r.regex for r in _LINE_RULES if r.name not in _SEARCHED))
    busy = property(lambda self: self._in_block or bool(self._after_frame) or self._oom is not None or bool(self._tbs)
                    or self._summary is not None or self._last_error_at is not None)
    _last_error_at: int | None = None  # the line of NCCL's "Last error:" (its message is the next line of its writer)
    _summary: dict | None = None  # the memory_summary() table being read
    _oom_key: str | None = None  # the allocator-limit figure whose value may come on the next line
    _oom: dict | None = None  # an allocator-limit OOM whose figures follow it
    _tbs: dict  # rank -> the Python traceback being read (its frames so far)

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self._tbs, self._after_frame = {}, set()
    _child: dict | None = None  # the failure entry being filled
    _in_block = False
    _root = False
    _script: str | None = None
    _report_line: int | None = None  # a report's "script FAILED" line, until an entry of it is read
    _opts: tuple[int, int] | None = None  # ProcessGroupNCCL's option lines: (in the block read, the most in one before)
    _after_frame: set  # the ranks whose last line was a traceback frame: their source line comes next
    _frame_lineno = -1
    _frame_key = None  # the traceback the last frame was of

    def _flush_child(self, *, end: bool = False) -> None:
        if end and self._report_line is not None:  # a report that ends before its entries: the child it names
            self.event("child_failed", self._report_line, None, None, script=self._script, root_cause=False)
            self._report_line = None
        if self._child is not None:
            self.records.append(self._child)
            self._child = None

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        if self._last_error_at is not None and not _OTHER_WRITER.match(body):  # (another process's line: the next)
            self._last_error_at = None
            err = next((r for r in reversed(self.records) if r.get("event") == "nccl_error"), None)
            if err is not None:
                err["last_error"] = body  # NCCL's last error message (the system call or peer that failed)
                return True
        if body == "Last error:":
            self._last_error_at = lineno
        read = self._read(lineno, body, ts, rank)
        if read and self._in_block:  # torchrun's report is whole at the rule closing its root cause entry
            self.open_line = None if self._root and body[:1] == "=" else lineno
        return read

    def _read(self, lineno: int, body: str, ts, rank) -> bool:
        if rank is None and self._tbs and None not in self._tbs and _OTHER_WRITER.match(body):
            # an NCCL or glog line without a rank while only ranks' tracebacks are open: another
            # process's line between a frame and its source line, not that source line
            return self._feed(lineno, body, ts, rank, False)
        # the source line under a frame: of this rank's last frame (ranks' tracebacks interleave), or
        # right after a frame when this rank has no traceback open (a prefix on some lines only)
        key = self._tb_key(rank)
        after_frame = key in self._after_frame or (key not in self._tbs and self._frame_lineno == lineno - 1
                                                   and (rank is None or self._frame_key is None
                                                        or not _STAMPED.search(body, 0, 48)))  # (not another rank's record)
        self._after_frame.discard(key)
        if key in self._tbs and not after_frame and not _TB_INSIDE.match(body):
            if (self._frame_lineno == lineno - 1 and self._frame_key != key and self._frame_key in self._after_frame
                    and not _EXCEPTION.match(body) and not _STAMPED.search(body, 0, 48)):
                self._after_frame.discard(self._frame_key)  # the source line of the frame just above, under
                return True                                 # another rank's prefix (no exception line, no record)
            closed = self._close_traceback(key, body)  # the exception line ends the traceback
            if self._feed(lineno, body, ts, rank, after_frame):
                return True
            return closed
        return self._feed(lineno, body, ts, rank, after_frame)

    def _tb_key(self, rank):
        """The traceback a line of ``rank`` continues: its rank's; a line without a rank, or a rank
        with none open while the only open one has no rank, continues the only one open."""
        if rank in self._tbs or len(self._tbs) != 1:
            return rank
        (only,) = self._tbs
        return only if rank is None or only is None else rank

    def _close_traceback(self, rank, body: str) -> bool:
        """Close ``rank``'s traceback on ``body``; True when body is its exception line."""
        tb = self._tbs.pop(rank)
        frames = tb.pop("_frames")
        m = _EXCEPTION.match(body)
        if m:
            tb.update(exception=m.group("cls"), detail=(m.group("msg") or "")[:500])
        tb["num_frames"] = len(frames)
        for col, keep in (("frame_innermost", lambda f: True), ("frame_user", _user_frame),
                          ("frame_framework", lambda f: _FRAMEWORK.search(f[0]) is not None)):
            f = next((f for f in reversed(frames) if keep(f)), None)
            tb[col] = f"{f[0]}:{f[1]} ({f[2]})" if f else None
        self.records.append(tb)
        return m is not None

    def _feed(self, lineno: int, body: str, ts, rank, after_frame: bool) -> bool:
        # --- torchrun ChildFailedError block
        if _CHILD_FAILED in body:
            self._flush_child(end=True)
            self._in_block, self._root = True, False
            return True
        if not self._in_block and _CHILD_OPENS.match(body):
            self._in_block, self._root = True, False
            if body.endswith(" FAILED"):
                self._script, self._report_line = body[: -len(" FAILED")], lineno
                return True
            if _CHILD_KV.match(body):  # an entry whose "[N]:" head the excerpt lost
                self._child = {"table": "events", "source": self.source, "line": lineno, "event": "child_failed",
                               "rank": None, "time": None, "root_cause": False, "script": self._script, "detail": None}
        if self._in_block:
            if body.endswith(" FAILED") and self._script is None:
                self._script, self._report_line = body[: -len(" FAILED")], lineno
                return True
            if body in ("Failures:", "<NO_OTHER_FAILURES>"):
                return True
            if body.startswith("Root Cause"):
                self._flush_child()
                self._root = True
                return True
            m = re.fullmatch(r"\[(\d+)\]:", body)
            if m:
                self._flush_child()
                self._child = {"table": "events", "source": self.source, "line": lineno, "event": "child_failed",
                               "rank": None, "time": None, "root_cause": self._root, "script": self._script,
                               "detail": None}
                self._report_line = None
                return True
            m = _CHILD_KV.match(body)
            if m and self._child is not None:
                key, value = m.group("key"), m.group("value").strip()
                if key in _CHILD_PAIRS:
                    rx, cols = _CHILD_PAIRS[key]
                    vm = rx.match(value)
                    if vm:
                        self._child.update((col, int(v) if v else None) for col, v in zip(cols, vm.groups()))
                elif key == "traceback":
                    self._child["detail"] = value
                    sm = _SIGNAL.search(value)
                    if sm:
                        self._child["signal"] = sm.group("name")
                else:  # time, host as printed; error_file
                    self._child[key] = None if key == "error_file" and value == "<N/A>" else value
                return True
            if re.fullmatch(r"[=\-]{20,}", body):
                return True
            self._flush_child(end=True)
            self._in_block = False
        # --- OOM
        # --- torch.cuda.memory_summary()
        if self._summary is not None or "emory summary" in body:
            if self._memory_summary(lineno, body, rank):
                return True
        # --- the allocator's limit (a memory fraction set): the message, then its figures one per line
        if self._oom is not None:
            m = _OOM_LIMIT_FIELD.match(body)
            if m:
                key = m.group("key") or self._oom_key
                self._oom_key = key
                if key in _OOM_LIMIT_COLS:
                    put_field(self._oom, _OOM_LIMIT_COLS[key], m.group("v") or m.group("v2"))
                return True
            self._oom = None
        if _OOM_LIMIT in body:
            m = _OOM_LIMIT_RX.search(body)
            if m:
                self._oom = self.event("cuda_oom", lineno, rank, ts, gpu=int(m.group("gpu")), detail=body[:500])
                return True
        if _OOM_TEXT in body:
            m = _OOM.search(body)
            if m:
                cols = {"mem_tried_gib": to_gib(m.group("tried")), "detail": body[:500]}
                for rx, col, typ in _OOM_FIELDS:
                    fm = rx.search(body)
                    if fm and col not in cols:
                        cols[col] = typ(fm.group("v"))
                self.event("cuda_oom", lineno, rank, ts, **cols)
                return True
        # --- a C++ exception's message as std::terminate prints it: "  what():  [PG 1 Rank 7] ..."
        if body.startswith("what():"):
            return self._pg_message(lineno, body[7:].lstrip(), ts, rank, None)
        # --- glog / ProcessGroupNCCL lines
        if "] " in body:
            g = _GLOG.match(body)
            if g:
                time = " ".join(x for x in (g.group("date"), g.group("time")) if x) or ts
                msg = g.group("msg")
                if self._pg_message(lineno, msg, time, rank, g.group("loc")) or self._line_rules(lineno, msg, time, rank):
                    return True
                if g.group("loc").startswith("ProcessGroupNCCL.cpp") and self._pg_options(lineno, msg):
                    return True
                if g.group("sev") == "I":
                    return True  # an info line of torch's C++ log (or a plugin's): read, no failure in it
                if g.group("sev") in "EFW":  # an error, or a warning (c10d's socket and store warnings)
                    self.event("error" if g.group("sev") != "W" else "warning", lineno, rank, time, loc=g.group("loc"),
                               detail=msg[:500])
                    return True
                return False
        if self._line_rules(lineno, body, ts, rank):
            return True
        if _GLOG_CUT.match(body):
            self.open_line = lineno
        return after_frame  # the source line Python prints under each traceback frame

    def _memory_summary(self, lineno: int, body: str, rank) -> bool:
        """A line of memory_summary()'s box: its title opens a ``memory`` record (label
        "memory_summary"), the Allocated / GPU reserved rows fill it (current and peak); a line
        outside the box closes it."""
        m = _MEM_SUMMARY.match(body)
        if m:
            if self._summary is not None and m.group("dev") is not None and self._summary["gpu"] is None:
                self._summary["gpu"] = int(m.group("dev"))  # the title under the opening rule
            elif m.group("dev") is not None or self._summary is None:
                self._summary = {"table": "memory", "source": self.source, "line": lineno, "kind": self.kind,
                                 "rank": rank, "label": "memory_summary", "step": None,
                                 "gpu": int(m.group("dev")) if m.group("dev") is not None else None}
                self.records.append(self._summary)
            return True
        if self._summary is None or not body.startswith("|"):
            self._summary = None
            return False
        r = _MEM_ROW.match(body)
        if r and r.group("metric") in _MEM_METRICS:
            cur, peak = _MEM_METRICS[r.group("metric")]
            self._summary[cur], self._summary[peak] = to_gib(r.group("cur")), to_gib(r.group("peak"))
        return True  # its other rows and rules: read

    def _pg_options(self, lineno: int, msg: str) -> bool:
        """ProcessGroupNCCL's "initialization options: size: 8, ..., TIMEOUT(ms): .." and "environments:
        NCCL version: 2.21.5, .." lines -> env rows (the default group's size is the world size)."""
        pm = _PG_RANK.match(msg)
        body = pm.group("body") if pm else msg
        head, sep, pairs = body.partition("options:") if "options:" in body else body.partition("environments: ")
        if not sep or not head.startswith("ProcessGroupNCCL"):
            return False
        if not pairs.startswith(" "):  # torch <= 2.0: one option a line under "with following options:"
            self._opts = (0, max(self._opts or (0, 0)))  # (a terminal wrap may glue the first to it)
            if pairs:
                self._option_line(lineno)
        for key, _, value in (item.partition(": ") for item in pairs.split(", ")):
            key, value = key.strip(), value.strip()
            if not value:
                continue
            name = _PG_KEYS.get(key, key)
            self.env(lineno, name, value, record="pg_options")
            if name == "pg_size" and pm is not None and pm.group("pg") in (None, "0"):
                self.env(lineno, "world_size", value, record="pg_options")
        return True

    def _option_line(self, lineno: int) -> None:
        """One more line of an options block: open while shorter than a block before it."""
        self._opts = (self._opts[0] + 1, self._opts[1])
        self.open_line = lineno if self._opts[0] < self._opts[1] else None

    def _pg_message(self, lineno: int, msg: str, time, rank, loc: str | None) -> bool:
        """A ProcessGroupNCCL message ``[PG p Rank r] <watchdog rule>`` -> its event (WorkNCCL fields read)."""
        pm = _PG_RANK.match(msg)
        r2, m2 = match_rules(_WATCHDOG_RULES, pm.group("body")) if pm else (None, None)
        if r2 is None:
            return False
        rec = apply_rule(r2, m2, source=self.source, lineno=lineno)
        rec.pop("record")
        rec.update(event=r2.name, rank=int(pm.group("rank")) if rank is None else rank, time=time,
                   loc=loc, pg_id=int(pm.group("pg")) if pm.group("pg") else None,
                   detail=m2.groupdict().get("detail") or pm.group("body")[:500])
        wm = _WORK.search(pm.group("body"))
        if wm:
            for k, _, v in (item.partition("=") for item in wm.group("work").split(", ")):
                if k in _WORK_KEYS:
                    put_field(rec, _WORK_KEYS[k], v)
            if wm.group("ran"):
                rec["ran_for_s"] = int(wm.group("ran")) / 1000
        inner = _PG_RANK.match(rec["detail"]) if rec["event"] == "watchdog_terminated" else None
        if inner and "Watchdog caught collective operation timeout: WorkNCCL(".startswith(inner.group("body")):
            self.open_line = lineno  # the exception it names is cut inside its first words
        if rec["event"] == "watchdog_terminated" and "seq_num" in rec and "timeout" in rec["detail"]:
            # the thread died of a collective's timeout: the line states both, the timeout with its work
            self.records.append(dict(rec, event="watchdog_terminated"))
            rec["event"] = "nccl_timeout"
        self.records.append(rec)
        return True

    def _line_rules(self, lineno: int, body: str, ts, rank) -> bool:
        r2, m2 = match_rules(_LINE_RULES, body)
        if r2 is not None:
            key = self._tb_key(rank) if r2.name == "traceback_frame" else rank
            if r2.name == "traceback" or r2.name == "traceback_frame" and key not in self._tbs:  # (an excerpt
                if rank in self._tbs:                                                             # may start inside one)
                    self._close_traceback(rank, "")
                key = rank
                self._tbs[key] = {"table": "events", "source": self.source, "line": lineno, "event": "traceback",
                                   "rank": rank, "time": ts, "exception": None, "detail": None, "_frames": []}
            if r2.name == "traceback_frame":
                self._after_frame.add(key)
                self._frame_lineno, self._frame_key = lineno, key
                self._tbs[key]["_frames"].append((m2.group("file"), int(m2.group("ln")), m2.group("func")))
            rec = apply_rule(r2, m2, source=self.source, lineno=lineno)
            if r2.name == "nccl_env" and self._opts is not None:
                self._option_line(lineno)
            if rec is not None:
                if rec["table"] == "events":
                    rec["event"] = rec.pop("record")
                    rec.update(rank=rank, time=ts, detail=m2.group("detail"))
                    if m2.groupdict().get("v"):  # the NCCL version torch names with the error
                        self.env(lineno, "nccl_version", m2.group("v"), record="nccl_error")
                self.records.append(rec)
            return True
        return False

    def finish(self) -> None:
        self._flush_child(end=True)
        for rank in list(self._tbs):  # a traceback the text ends inside: its frames, no exception
            self._close_traceback(rank, "")


def parse_failures(text, *, source: str) -> ParseResult:
    """Parse failure reports into ``events`` rows (see module doc). Pure; never raises on content."""
    return run_parsers(text, [FailureScanner(source)], kind="failures")
