"""Megatron-LM (and Megatron-DeepSpeed, Megatron-LLM) training logs.

Records: ``steps`` (one per iteration line, all eras: with/without ``[timestamp]``, with/without
throughput, skipped iterations without loss; memory report lines merge into the step row of
the same rank and iteration), ``timers`` (``time (ms) | name: v | ...`` lines and the per-rank
``name ....: (min, max)`` form, attached to the last iteration seen), ``env`` (the argument
dump ``  name ........ value``, keys prefixed ``megatron.``). Lines it does not know go to
the DeepSpeed scanner (Megatron-DeepSpeed) and then to the failure scanner.
Deliberately not here: tokens/s or MFU of our own (report computes those from step times).
"""
from __future__ import annotations

import re

from ingest.parsers import UNKNOWN, LineParser, ParseResult, StepRowParser, fast_rank, put_field, run_parsers, to_int, to_num
from ingest.parsers.deepspeed import DeepSpeedParser, timer_records
from ingest.parsers.failures import FailureScanner

try:
    from ingest.parsers import _train_scan
except ImportError:  # not built (no C compiler at install): the Python path alone
    _train_scan = None

_ITER = re.compile(r"(?:\[(?P<ts>[\d\-: .]+)\] )?iteration\s+(?P<step>\d+)/\s*(?P<total>\d+) \|(?P<rest>.*)$")
_MEM = re.compile(r"\[Rank (?P<rank>\d+)\] \(after (?P<step>\d+) iterations\) memory \(MB\) \|(?P<rest>.*)$")
_ARG = re.compile(r"(?P<key>[A-Za-z_][\w.\-]*) \.{2,} (?P<value>.*)$")
_MINMAX = re.compile(r"(?P<name>[\w\-/ ]+?) \.{2,}: \((?P<min>[\d.]+), (?P<max>[\d.]+)\)$")

# Pattern table for ``key: value`` segments of an iteration line: key -> (column, type, unit scale).
ITER_FIELDS: dict[str, tuple[str, type | object, float]] = {
    "consumed samples": ("consumed_samples", to_int, 1),
    "consumed tokens": ("consumed_tokens", to_int, 1),
    "elapsed time per iteration (ms)": ("step_time_s", to_num, 1e-3),
    "elapsed time per iteration (s)": ("step_time_s", to_num, 1),
    "learning rate": ("lr", to_num, 1),
    "global batch size": ("global_batch_size", to_int, 1),
    "lm loss": ("loss", to_num, 1),
    "loss scale": ("loss_scale", to_num, 1),
    "grad norm": ("grad_norm", to_num, 1),
    "num zeros": ("num_zeros", to_num, 1),
    "params norm": ("params_norm", to_num, 1),
    "number of skipped iterations": ("num_skipped_iterations", to_int, 1),
    "number of nan iterations": ("num_nan_iterations", to_int, 1),
    "samples per second": ("samples_per_s", to_num, 1),
    "TFLOPs": ("framework_tflops_per_gpu", to_num, 1),
    "throughput per GPU (TFLOP/s/GPU)": ("framework_tflops_per_gpu", to_num, 1),
    "tokens per GPU (tokens/s/GPU)": ("tokens_per_s_per_gpu", to_num, 1),
    "tokens/s/GPU": ("tokens_per_s_per_gpu", to_num, 1),
    "seq_len": ("seq_length", to_int, 1),
    "actual seqlen": ("seq_length", to_int, 1),
}
MEM_FIELDS = {  # memory (MB) line: key -> column (MB -> GiB)
    "allocated": "mem_allocated_gib", "max allocated": "mem_max_allocated_gib",
    "reserved": "mem_reserved_gib", "max reserved": "mem_max_reserved_gib",
}
_NOISE = (
    re.compile(r"(?:\[.*\] )?datetime: \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"),
    re.compile(r"(?:training|done with setup|Done with setup) \.\.\.$"),
    re.compile(r"-+ (?:end of )?arguments -+$"),
    re.compile(r"\(min, max\) time across ranks \(ms\):$"),
)


# The C converter tried first for each pattern-table converter: the same value whenever the
# text holds no thousands separator (the converter is the fallback for those).
_FAST_TYPE = {to_num: float, to_int: int}
MAX_SHAPES = 8  # distinct iteration-line key sequences read by a learned regex; more take the general path


def _slug(text: str) -> str:
    return re.sub(r"[^0-9a-z]+", "_", text.lower()).strip("_")


def _field_spec(key: str) -> tuple | None:
    """The pattern-table entry of an iteration-line key as ``_iteration`` reads it (ITER_FIELDS,
    else the ``* loss`` / ``*_loss`` rule); None: not in the table (warned about once)."""
    spec = ITER_FIELDS.get(key)
    if spec is None and (key.endswith(" loss") or key.endswith("_loss")):
        spec = (_slug(key), to_num, 1)
    return spec


class MegatronParser(StepRowParser):
    kind = "megatron"
    hints = ("iteration", "time (ms)", "memory (MB)", "...", "datetime: ", "arguments", "(min, max)")
    fast_lines = (  # the frequent lines, handed to feed without the per-line normaliser
        # (a bracket of digits alone is a launcher prefix the normaliser strips, not a timestamp)
        ("iteration", r"(?:\[(?P<m_ts>[0-9]*[\-: .][0-9\-: .]*)\] |)iteration +(?P<m_step>[0-9]+)/ *(?P<m_total>[0-9]+) \|(?P<m_rest>.*\S|)"),
        ("timers", r"time \(ms\)(?:.*\S|)"),
        ("memory", r"\[Rank [0-9]+\] \(after [0-9]+ iterations\) memory \(MB\) \|(?:.*\S|)"),
        ("datetime", r"(?:\[[^\]\n]*\] |)datetime: [0-9]{4}-[0-9][0-9]-[0-9][0-9] [0-9][0-9]:[0-9][0-9]:[0-9][0-9]"),
    )

    native = native_misses = _train_scan is not None

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self._last_step: int | None = None
        self._unknown: set[str] = set()
        self._shapes: list[tuple[re.Pattern, tuple]] = []  # the iteration lines' key sequences seen so far, with their plans
        self._native = None if _train_scan is None else _train_scan.MegatronScan(
            source, kind=self.kind, field_spec=_field_spec, mem_fields=MEM_FIELDS,
            converters={to_num: "num", to_int: "int"}, to_num=to_num)

    def native_scan(self, text: str, pos: int, lineno: int, misses=None) -> tuple[int, int, int, int]:
        """Iteration, timer, memory and noise lines in the compiled scanner (_train_scan.MegatronScan)."""
        pos, lineno, last, resume, self._last_step = self._native.scan(text, pos, lineno, misses, self.records,
                                                                      self._steps, self._last_step, self._unknown)
        return pos, lineno, last, resume

    def _learn_shape(self, rest: str) -> None:
        """Remember the key sequence of an iteration line as one regex (segments split at ``|``,
        each ``key: value``, as ``_iteration`` reads them) and per kept key its group, column,
        converter and unit scale, so the next lines of that shape are read by one match. Called
        after the general reading of the line: keys not in the pattern table are read, not kept,
        where they were warned about already; a shape with one that was not (its value was
        empty) is not kept, so the general reading meets that key with a value and warns."""
        if len(self._shapes) >= MAX_SHAPES:
            return
        parts, plan, group = [], [], 0
        for seg in rest.split("|"):
            key, sep, _ = seg.partition(":")
            if not sep:
                if seg.strip():
                    return  # free text between bars: leave such lines to the general reading
                parts.append(r"\s*")
                continue
            key = key.strip()
            spec = _field_spec(key)
            if spec is None and key not in self._unknown:
                return
            # the value with its surrounding spaces: float() and int() ignore them (where they
            # refuse it, the general reading's str.strip(), which also strips \x1c-\x1f, comes
            # first), and ``[^|]*`` before a literal bar matches one way only (no backtracking)
            if spec is not None:
                plan.append((group, spec[0], _FAST_TYPE[spec[1]], spec[1], spec[2]))
            parts.append(rf"\s*{re.escape(key)}\s*:([^|]*)")
            group += 1
        self._shapes.append((re.compile(r"\|".join(parts)), tuple(plan)))

    def fast_iteration(self, lineno: int, m, ts) -> bool:
        return self._iteration(lineno, m.group("m_ts") or ts, m.group("m_step"), m.group("m_total"), m.group("m_rest"),
                               fast_rank(m))

    def fast_timers(self, lineno: int, m, ts) -> bool:
        self.records.extend(timer_records(m.string[m.end("body_at"):m.end("timers")], source=self.source, lineno=lineno,
                                          step=self._last_step, rank=fast_rank(m), kind="megatron"))
        return True

    def _iteration(self, lineno: int, time, step: str, total: str, rest: str, rank) -> bool:
        """An iteration line: ``iteration N/ M | key: value | ...`` (rest: after the first ``|``)."""
        step = int(step)
        row = self._step_row(rank, step, lineno)
        row["time"] = time
        row["num_steps_total"] = int(total)
        for rx, plan in self._shapes:
            m = rx.fullmatch(rest)
            if m:
                values = m.groups()
                for group, column, fast, slow, scale in plan:  # put_field, inlined: the hot loop
                    value = values[group]
                    try:
                        v = fast(value)
                    except ValueError:  # thousands separators, separators float() keeps, or not a number
                        try:
                            v = slow(value.strip())
                        except ValueError:
                            continue
                    row[column] = v * scale if scale != 1 else v
                row.setdefault("loss", None)
                self._last_step = step
                return True
        fields = ITER_FIELDS
        for seg in rest.split("|"):
            key, sep, value = seg.partition(":")
            if not sep:
                continue
            key, value = key.strip(), value.strip()
            if not value:
                continue
            spec = fields.get(key)
            if spec is None:
                if key.endswith(" loss") or key.endswith("_loss"):
                    spec = (_slug(key), to_num, 1)
                else:
                    if key not in self._unknown:
                        self._unknown.add(key)
                        self.warnings.append(f"line {lineno}: iteration field {key!r} not in the pattern table")
                    continue
            put_field(row, spec, value)
        self._learn_shape(rest)
        row.setdefault("loss", None)
        self._last_step = step
        return True

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        if "iteration" in body:
            m = _ITER.match(body)
            if m:
                return self._iteration(lineno, m.group("ts") or ts, m.group("step"), m.group("total"), m.group("rest"), rank)
        if body.startswith("time (ms)") or body.startswith("rank=") and "time (ms)" in body:
            self.records.extend(timer_records(body, source=self.source, lineno=lineno, step=self._last_step,
                                              rank=rank, kind="megatron"))
            return True
        if "memory (MB)" in body:
            m = _MEM.match(body)
            if m:
                row = self._step_row(int(m.group("rank")), int(m.group("step")), lineno)
                for seg in m.group("rest").split("|"):
                    key, _, value = seg.partition(":")
                    col = MEM_FIELDS.get(key.strip())
                    if col:
                        row[col] = to_num(value.strip()) / 1024
                return True
        if "..." in body:
            m = _MINMAX.match(body)
            if m:
                self.records.append({"table": "timers", "source": self.source, "line": lineno, "kind": "megatron",
                                     "rank": rank, "step": self._last_step, "name": m.group("name").strip(),
                                     "time_min_s": float(m.group("min")) * 1e-3, "time_max_s": float(m.group("max")) * 1e-3})
                return True
            m = _ARG.match(body)
            if m:
                self.records.append({"table": "env", "source": self.source, "line": lineno, "record": "argument",
                                     "kind": "megatron", "key": f"megatron.{m.group('key')}", "value": m.group("value").strip()})
                return True
        for rx in _NOISE:
            if rx.match(body):
                return True
        return False

    # Shards (LineParser.start_shard): the last step is unknown until the shards before are merged.

    def start_shard(self) -> None:
        super().start_shard()
        self._last_step = UNKNOWN

    def end_shard(self) -> None:
        super().end_shard()
        self._unknown_step = [i for i, rec in enumerate(self.records) if rec.get("step") is UNKNOWN]

    def at_rest(self) -> bool:
        return True  # rows, last step and warned keys merge; _shapes is a cache of what _iteration reads

    def absorb(self, later: MegatronParser) -> None:
        """Timers read before the later shard's first iteration line get this one's last step;
        an unknown iteration field is warned about once per file (its first line)."""
        for i in later._unknown_step:
            later.records[i]["step"] = self._last_step
        warned = {f": iteration field {key!r} not in the pattern table" for key in later._unknown & self._unknown}
        if warned:  # (a key holds no ':', so the warning's text after its first ':' is this)
            later.warnings = [w for w in later.warnings if not (w.startswith("line ") and w[w.find(":"):] in warned)]
        self._unknown |= later._unknown
        if later._last_step is not UNKNOWN:
            self._last_step = later._last_step
        super().absorb(later)


def build_megatron_chain(source: str) -> list[LineParser]:
    """The parsers a Megatron-LM log goes through, first that recognises a line wins."""
    return [MegatronParser(source), DeepSpeedParser(source), FailureScanner(source)]


def parse_megatron(text, *, source: str, fast: bool = True) -> ParseResult:
    """Parse a Megatron-LM log (see module doc). Pure; never raises on content."""
    return run_parsers(text, build_megatron_chain(source), kind="megatron", fast=fast)
