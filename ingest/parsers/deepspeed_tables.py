"""The tables DeepSpeed prints (with ``print``, no log prefix) inside its logs.

Flops profiler (deepspeed/profiling/flops_profiler/profiler.py, ``print_model_profile``): a
banner, ``Profile Summary at step N:``, ``Notations:``, ``fwd latency:  80.71 ms`` rows
(number_to_string: ``29.03 GMACs``, ``2.39 B`` params), module sections (recognised, not
recorded), a closing rule -> one ``flops_profile`` record per summary (FLOPS_FIELDS).

Comms logger (deepspeed/utils/comms_logging.py, ``CommsLogger.log_all``): a ``Comm. Op  Message
Size  Count ...`` header, an op-name line (``all_reduce | [Caller Func: step]`` with debug), one
row per message size, optionally a straggler table; verbose ``comm op: X | time (ms): ..`` lines
-> ``collectives``. ``msg_size_bytes``: the rounded printed size (1024-based, convert_size);
bandwidths: DeepSpeed's gigabits per second (calc_bw_log multiplies bytes by 8).

Autotuner (deepspeed/autotuning/autotuner.py): the per-tuning-space summary -> ``autotuning``
rows (tuning_space, num_experiments, best_metric_val, best_exp_name) and an ``autotuning_done``
event (its duration and experiment count).
"""
from __future__ import annotations

import re

from ingest.parsers import BINARY, SI, LineParser, read_scaled

_SI_NUMBER = re.compile(r"(-?[\d.]+(?:[eE][+-]?\d+)?)\s*([TGBMKkmun]?)\s*(?:MACs|FLOPS|FLOPs|s)?")
_SIZE = re.compile(r"([\d.]+)\s*([KMGTP]?B)")


def to_si(text: str) -> float:
    """'29.03 GMACs' / '81.9 TFLOPS' / '80.71 ms' / '2.39 B' (params: billions) / '58.18 G' -> a number."""
    return read_scaled(text.strip(), _SI_NUMBER, lambda prefix: 1e9 if prefix == "B" else SI[prefix])


def to_bytes(text: str) -> int:
    """convert_size output '678.86 MB' / '0B' -> bytes (approximate: printed with 2 decimals)."""
    return round(read_scaled(text.strip(), _SIZE, lambda unit: BINARY[unit[:-1]]))


# Pattern table of the flops-profiler summary: key (lower case, as printed before ':') ->
# (column, converter). Older DeepSpeed prints "flops", newer "FLOPs": keys are lower-cased.
FLOPS_FIELDS = {
    "world size": ("world_size", int), "data parallel size": ("dp_degree", int),
    "model parallel size": ("mp_degree", int), "batch size per gpu": ("micro_batch_size", int),
    "model paralel size": ("mp_degree", int),  # (DeepSpeed 0.3-0.5's spelling)
    "fwd flops per gpu = 2 * fwd macs per gpu": ("fwd_flops_per_gpu", to_si),  # (0.3-0.5)
    "device": ("device", str), "input shape": ("input_shape", str),
    "params per gpu": ("num_params_per_gpu", to_si),
    "params of model = params per gpu * mp_size": ("num_params", to_si),
    "fwd macs per gpu": ("fwd_macs_per_gpu", to_si), "fwd flops per gpu": ("fwd_flops_per_gpu", to_si),
    "fwd flops of model = fwd flops per gpu * mp_size": ("fwd_flops", to_si),
    "fwd latency": ("fwd_latency_s", to_si),
    "fwd flops per gpu = fwd flops per gpu / fwd latency": ("fwd_flops_per_s_per_gpu", to_si),
    "bwd latency": ("bwd_latency_s", to_si),
    "bwd flops per gpu = 2 * fwd flops per gpu / bwd latency": ("bwd_flops_per_s_per_gpu", to_si),
    "fwd+bwd flops per gpu = 3 * fwd flops per gpu / (fwd+bwd latency)": ("fwd_bwd_flops_per_s_per_gpu", to_si),
    "step latency": ("step_latency_s", to_si), "iter latency": ("iter_latency_s", to_si),
    "flops per gpu = 3 * fwd flops per gpu / iter latency": ("flops_per_s_per_gpu", to_si),
    "samples/second": ("samples_per_s", float),
}
_BANNER = re.compile(r"-+ DeepSpeed Flops Profiler -+$")
_SECTION = re.compile(r"-+ (?:Aggregated|Detailed) Profile(?: per GPU)? -+$")
_CLOSE = re.compile(r"-{60,}$")
_STEP = re.compile(r"Profile Summary at step (?P<step>\d+):$")
_KV = re.compile(r"(?P<key>[A-Za-z][^:]*?):\s+(?P<value>\S.*)$")
_NOTATION = re.compile(r"Notations:$|.*\([\w ,+]+\)(?:, .*)?,?$")

_COMMS_HEADER = re.compile(r"Comm\. Op\s+Message Size\s+Count\s+(?P<kind>Total Latency\(ms\)|Total comm lat\(ms\))")
_COMMS_OP = re.compile(r"(?P<op>[A-Za-z_][\w.]*)(?: \| \[Caller Func: (?P<caller>[^\]]*)\])?$")
_NUM = r"(-?[\d.]+(?:[eE][+-]?\d+)?)"
_COMMS_ROW = re.compile(rf"(?P<size>[\d.]+ ?[KMGTP]?B)\s+(?P<count>\d+)\s+{_NUM}\s+{_NUM}\s+{_NUM}\s+{_NUM}$")
_STRAGGLER = re.compile(r"_{10,}$|Breakdown with straggler effect$|-{10,}$")
_VERBOSE_TEXT = "comm op: "
_VERBOSE = re.compile(r"comm op: (?P<op>.+?) \| time \(ms\): (?P<t>[\d.]+) \| msg size: (?P<size>[\d.]+ ?[KMGTP]?B) \| "
                      r"algbw \(Gbps\): (?P<alg>[\d.]+) \| busbw \(Gbps\): (?P<bus>[\d.]+)")


class FlopsProfileParser(LineParser):
    kind = "deepspeed"
    gate = (_BANNER,)
    busy = property(lambda self: self._rec is not None)
    _rec: dict | None = None
    _modules = False  # inside the aggregated/detailed part: every line is the profiler's

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        if body[:1] == "-" and _BANNER.match(body):
            self._rec = {"table": "flops_profile", "source": self.source, "line": lineno, "record": "ds_flops_profile",
                         "kind": self.kind, "rank": rank, "step": None}
            self.records.append(self._rec)
            self._modules = False
            return True
        if self._rec is None:
            return False
        if _CLOSE.match(body):
            self._rec, self._modules = None, False
            return True
        if self._modules or _SECTION.match(body):
            self._modules = True
            return True
        m = _STEP.match(body)
        if m:
            self._rec["step"] = int(m.group("step"))
            return True
        m = _KV.match(body)
        if m:
            key = re.sub(r"\s+", " ", m.group("key").strip().lower())
            spec = FLOPS_FIELDS.get(key)
            if spec is not None:
                col, conv = spec
                try:
                    self._rec[col] = conv(m.group("value").strip())
                except ValueError:
                    self._rec[col] = None
                return True
        return bool(_NOTATION.match(body))


class CommsLogParser(LineParser):
    kind = "deepspeed"
    gate = (_VERBOSE_TEXT, _COMMS_HEADER)
    busy = property(lambda self: self._table is not None)
    _table: str | None = None  # "summary" | "straggler" while inside a table
    _op: tuple[str, str | None] | None = None

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        read = self._read(lineno, body, rank)
        if self._table is not None and not self.block_goes_on(read):
            self._table = self._op = None  # anything else ends the table (another process's line or two do not)
        return read

    def _read(self, lineno: int, body: str, rank) -> bool:
        m = _VERBOSE.search(body) if _VERBOSE_TEXT in body else None
        if m:
            r = re.search(r"\[Rank (\d+)\] comm op:", body)
            rank = int(r.group(1)) if r else rank
            self.records.append(self._record(lineno, rank, "ds_comm_op", m.group("op"), None, m.group("size"), 1,
                                             algbw_gbps=float(m.group("alg")), busbw_gbps=float(m.group("bus")),
                                             latency_s=float(m.group("t")) * 1e-3))
            return True
        m = _COMMS_HEADER.match(body)
        if m:
            self._table = "summary" if m.group("kind").startswith("Total Latency") else "straggler"
            self._op = None
            return True
        if self._table is None:
            return False
        m = _COMMS_ROW.match(body)
        if m and self._op is not None:
            a, b, c, d = (float(m.group(i)) for i in (3, 4, 5, 6))
            if self._table == "summary":
                extra = dict(total_latency_s=a * 1e-3, avg_latency_s=b * 1e-3, algbw_gbps=c, busbw_gbps=d)
            else:
                extra = dict(total_latency_s=a * 1e-3, total_straggler_s=b * 1e-3, avg_latency_s=c * 1e-3,
                             avg_straggler_s=d * 1e-3)
            self.records.append(self._record(lineno, rank, f"ds_comms_{self._table}", *self._op, m.group("size"),
                                             int(m.group("count")), **extra))
            return True
        if _STRAGGLER.match(body):
            return True
        m = _COMMS_OP.match(body)
        if m:
            self._op = (m.group("op"), m.group("caller"))
            return True
        return False

    def _record(self, lineno, rank, record, op, caller, size, count, **extra) -> dict:
        try:
            size_bytes = to_bytes(size)
        except (ValueError, KeyError):
            size_bytes = None
        return {"table": "collectives", "source": self.source, "line": lineno, "record": record, "kind": self.kind,
                "rank": rank, "collective": op, "caller": caller, "msg_size_bytes": size_bytes, "num_calls": count,
                **extra}



# The autotuner's summary (deepspeed/autotuning/autotuner.py, print_tuning_results: tabulate's
# "pipe" table, keys as headers), then "Tuning completed in 0:39:25.25. Total number of experiments: 12."
_TUNING_HEADER = re.compile(r"\|\s*tuning_space\s*\|")
_TUNING_DONE = re.compile(r"Tuning completed in (?P<h>\d+):(?P<m>\d+):(?P<s>[\d.]+)\. Total number of experiments: (?P<n>\d+)\.")
_ALIGN_ROW = re.compile(r"\|(?:\s*:?-+:?\s*\|)+$")
TUNING_FIELDS = {"tuning_space": str, "num_experiments": int, "best_metric_val": float, "best_exp_name": str}


class AutotuningParser(LineParser):
    kind = "deepspeed"
    gate = (_TUNING_HEADER, _TUNING_DONE)
    busy = property(lambda self: self._cols is not None)
    _cols: list[str] | None = None

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        m = _TUNING_DONE.match(body)
        if m:
            self._cols = None
            self.event("autotuning_done", lineno, rank, ts, num_experiments=int(m.group("n")),
                       duration_s=int(m.group("h")) * 3600 + int(m.group("m")) * 60 + float(m.group("s")))
            return True
        if _TUNING_HEADER.match(body):
            self._cols = [c.strip() for c in body.strip("|").split("|")]
            return True
        if self._cols is None or not body.startswith("|"):
            if self._cols is not None and not self.block_goes_on(False):
                self._cols = None  # another process's line or two inside the table do not end it
            return False
        self.block_goes_on(True)
        if _ALIGN_ROW.match(body):
            return True
        cells = [c.strip() for c in body.strip("|").split("|")]
        if len(cells) != len(self._cols):
            self._cols = None
            return False
        rec = {"table": "autotuning", "source": self.source, "line": lineno, "kind": self.kind, "rank": rank}
        for col, cell in zip(self._cols, cells):
            try:
                rec[col] = TUNING_FIELDS.get(col, str)(cell)
            except ValueError:
                rec[col] = cell
        self.records.append(rec)
        return True
