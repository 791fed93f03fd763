"""Pure parsers for third-party artifacts: text in, records + unparsed-line count out.

Shared here: ``ParseResult``, pattern-table rows (``Rule``: name, regex with named groups, table,
and per group the column, type and unit scale), the line normaliser (launcher prefixes, ANSI
colour, indentation, ISO timestamps on their own line), ``detect_kind`` (by content, never by
file name) and ``run_parsers``, which feeds each normalised line to a format's ``LineParser`` chain.
Records are plain dicts; ``record["table"]`` names the output table (steps, memory, timers,
comm_topology, collectives, events, env, kernels, stacks); each carries ``source`` and ``line``
(1-based, the first line for aggregated records). Detect + parse: ``ingest.parsers.dispatch``.
Deliberately not here: a second, faster copy of any rule (speed comes from one process per
file, ingest.thirdparty), opening files (ingest.io), writing tables, analysis.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

MAX_LINE_CHARS = 1 << 16  # longer lines are counted unparsed unread: bounded time per line
MAX_UNPARSED_LINENOS = 1000  # line numbers kept for --strict; the count is always exact


@dataclass(frozen=True, kw_only=True)
class ParseResult:
    """What a parser returns. unparsed: the number of non-blank lines no rule recognised;
    unparsed_lines: the first ``MAX_UNPARSED_LINENOS`` of them (1-based); num_lines: lines read."""

    records: list[dict]
    unparsed: int
    warnings: list[str]
    kind: str
    unparsed_lines: tuple[int, ...] = ()
    num_lines: int = 0


# ---------------------------------------------------------------- pattern tables

@dataclass(frozen=True)
class Col:
    """One output column taken from a named group: ``column = type(group) * scale``."""

    group: str
    column: str
    type: Callable = float
    scale: float = 1.0  # unit conversion into the column's unit (e.g. ms -> s: 1e-3)


@dataclass(frozen=True)
class Rule:
    """One row of a pattern table. ``table`` None: recognised, no record (noise we know)."""

    name: str
    regex: re.Pattern
    table: str | None
    cols: tuple[Col, ...] = ()
    const: tuple[tuple[str, object], ...] = ()

    def __post_init__(self) -> None:
        # what apply_rule needs per match, unpacked once: the groups, and (column, type, scale) each
        object.__setattr__(self, "groups", tuple(c.group for c in self.cols) * (1 + (len(self.cols) == 1)))
        object.__setattr__(self, "plan", tuple((c.column, c.type, c.scale) for c in self.cols))


def rule(name: str, pattern: str, table: str | None, *cols: Col, **const: object) -> Rule:
    return Rule(name, re.compile(pattern), table, tuple(cols), tuple(const.items()))


def to_num(text: str) -> float:
    """'5,856' -> 5856.0; raises ValueError on anything else."""
    return float(text.replace(",", ""))


def to_int(text: str) -> int:
    return int(text.replace(",", ""))


def put_field(row: dict, spec: tuple, value: str | None) -> None:
    """``row[column] = type(value) * scale`` for a (column, type, scale) pattern-table entry;
    a value that is absent (None) or does not convert is left out."""
    if value is not None:
        try:
            v = spec[1](value)
        except (ValueError, TypeError):
            return
        row[spec[0]] = v if spec[2] == 1 else v * spec[2]


def apply_rule(r: Rule, m: re.Match, *, source: str, lineno: int) -> dict | None:
    """Build the record of a matched rule (None for recognised-only rules)."""
    if r.table is None:
        return None
    rec: dict = {"table": r.table, "source": source, "line": lineno, "record": r.name}
    if r.const:
        rec.update(r.const)
    if r.plan:
        for spec, text in zip(r.plan, m.group(*r.groups)):  # (one column: its group twice)
            put_field(rec, spec, text)
    return rec


_NAMED_GROUP = re.compile(r"(?<!\\)\(\?P<\w+>")
_UNJOINABLE = re.compile(r"\(\?P=|\\[1-9]|\(\?\(|^\(\?[a-zA-Z]+\)")  # backreferences, conditionals, global flags
_GATES: dict[int, tuple] = {}  # id(table) -> (the table, kept so its id is not reused; its gate or None)


def join_regexes(regexes: Iterable[re.Pattern]) -> re.Pattern | None:
    """One alternation matching where any of ``regexes`` matches (groups made plain); None when one
    cannot be joined (flags, backreferences, conditionals)."""
    regexes = list(regexes)
    if not all(rx.flags == re.UNICODE and not _UNJOINABLE.search(rx.pattern) for rx in regexes):
        return None
    return re.compile("|".join("(?:" + _NAMED_GROUP.sub("(?:", rx.pattern) + ")" for rx in regexes))


def match_rules(rules: tuple[Rule, ...], text: str) -> tuple[Rule, re.Match] | tuple[None, None]:
    """The first rule of a table whose regex matches ``text``. A line none matches is rejected by one
    alternation of the table's regexes (join_regexes), built from the table on first use."""
    gate = _GATES.get(id(rules)) if type(rules) is tuple else (rules, None)
    if gate is None:
        gate = _GATES[id(rules)] = (rules, join_regexes(r.regex for r in rules))
    if gate[1] is not None and gate[1].match(text) is None:
        return None, None
    for r in rules:
        m = r.regex.match(text)
        if m:
            return r, m
    return None, None


# Unit prefixes, for every parser's sizes, times and counts: decimal (SI) and binary (1024-based).
SI = {"P": 1e15, "T": 1e12, "G": 1e9, "M": 1e6, "K": 1e3, "k": 1e3, "": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
BINARY = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}


def read_scaled(text: str, pattern: re.Pattern, scale: Callable[[str], float]) -> float:
    """``<number><unit>`` text matched whole by ``pattern`` (groups: the number, thousands
    separators allowed; the unit) -> number x scale(unit). Raises ValueError."""
    m = pattern.fullmatch(text)
    if m is None:
        raise ValueError(text)
    return to_num(m.group(1)) * scale(m.group(2))


_SIZE = re.compile(r"\s*([\d.,]+)\s*([KMGT]?i?B)\s*", re.I)


@functools.lru_cache(maxsize=1 << 12)  # memory figures repeat from step to step
def to_gib(text: str) -> float:
    """'649.97 MiB' / '1.01 GiB' / '0.26GB' -> GiB (GB taken as GiB, as PyTorch/DeepSpeed print them)."""
    return read_scaled(text, _SIZE, lambda unit: BINARY[unit.upper()[:-1].rstrip("I")] / 2**30)


def slug(text: str) -> str:
    """A printed name as a column or key: 'Params norm (x)' -> 'params_norm_x'."""
    return re.sub(r"[^0-9a-z]+", "_", text.lower()).strip("_")


CELLS = re.compile(r"\s{2,}")  # the cell separator of tables printed with aligned columns
RULE_LINE = rule("rule_line", r"-{3,}(?:\s+-{3,})*$", None)  # dashes under a table header


# ---------------------------------------------------------------- line normaliser

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
# Launcher prefixes, possibly stacked ("[80746] [rank0]:"); rank captured where it is a rank.
_PREFIX = re.compile(
    r"(?:\s+"
    r"|\[(?:rank(?P<r1>\d+)\]:"
    r"|default(?P<r2>\d+)\]:"
    r"|\d+(?:,(?P<r3>\d+)\]<std(?:out|err)>:"
    r"|\] ))"
    r"|[\w.\-]+/\d+ \[\d+\]:"
    r"|\(\w+ pid=\d+(?:, ip=[^)]*)?\) "
    r")+"
)
_PREFIX_START = frozenset(" \t[(")
_ISO_TS = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?")


class TextBlocks:
    """Blocks of whole lines joined by newlines (``ingest.io.iter_text_blocks``). iter_lines sets
    num_lines (the last non-blank line's number) and cut_line (a last line the input ends inside)."""

    def __init__(self, blocks: Iterable[str]) -> None:
        self.blocks = blocks
        self.ends_cut = False  # set by the reader before its last block when the input ends inside a line
        self.num_lines = 0
        self.cut_line: int | None = None

    def __iter__(self) -> Iterator[str]:
        return iter(self.blocks)


def iter_lines(text: str | Iterable[str], *, cut: bool = False
               ) -> Iterator[tuple[int, str | None, str | None, int | None]]:
    """``(lineno, body, timestamp, rank)`` per non-blank line of a string, a ``TextBlocks`` or an
    iterable of lines, normalised: ANSI colour codes, launcher prefixes (rank taken from
    ``[rankN]:`` / ``[defaultN]:`` / ``[job,N]<stdout>:``), indentation and trailing whitespace
    removed. timestamp: an ISO timestamp alone on the line before (consumed, not yielded, as
    CloudWatch prints them); a line longer than MAX_LINE_CHARS comes with body None, unread. cut:
    a last line the input ends inside (``TextBlocks.ends_cut``) is withheld, its number in cut_line."""
    blocks = text if isinstance(text, TextBlocks) else TextBlocks([text] if isinstance(text, str) else text)
    pending_ts, lineno, last, prefix, iso, ansi = None, 0, 0, _PREFIX.match, _ISO_TS.fullmatch, _ANSI.sub
    for block in blocks:
        lines = block.split("\n")
        if cut and blocks.ends_cut and lines[-1].strip():  # cut: withhold a last line the input ends inside
            blocks.cut_line = lineno + len(lines)
            lines.pop()
        for raw in lines:
            lineno += 1
            if len(raw) > MAX_LINE_CHARS:
                last = lineno
                yield lineno, None, None, None
                continue
            if "\x1b" in raw:
                raw = ansi("", raw)
            line = raw.rstrip()
            if not line:
                continue
            rank = None
            if line[0] in _PREFIX_START or line.find("/", 0, 40) >= 0:
                m = prefix(line)
                if m and m.end():
                    r = m.group("r1") or m.group("r2") or m.group("r3")
                    rank = int(r) if r else None
                    line = line[m.end():]
                    if not line:
                        continue
            last = lineno
            if line[0].isdigit() and len(line) <= 35 and iso(line) is not None:
                pending_ts = line
                continue
            yield lineno, line, pending_ts, rank
            pending_ts = None
    blocks.num_lines = blocks.cut_line or last


class LineParser:
    """Base of the stateful per-format scanners: ``feed`` a normalised line, return whether
    it was recognised; ``finish`` flushes state. Records go to ``self.records``."""

    kind = ""
    # gate: a line it takes while not busy starts with one of these regexes or holds one of these strings
    gate: tuple[re.Pattern | str, ...] | None = None  # None: any line may be its
    busy = False  # inside a block of lines its gate does not describe

    def __init__(self, source: str) -> None:
        self.source = source
        self.records: list[dict] = []
        self.warnings: list[str] = []

    def feed(self, lineno: int, body: str, ts: str | None, rank: int | None) -> bool:
        return False  # the base recognises no line: a kind without a parser (dispatch)

    def finish(self) -> None:
        pass

    def env(self, lineno: int, key: str, value, *, record: str) -> dict:
        """Append (and return) an ``env`` record (an environment fact) of this parser's kind."""
        rec = {"table": "env", "source": self.source, "line": lineno, "record": record, "kind": self.kind,
               "key": key, "value": value}
        self.records.append(rec)
        return rec

    def event(self, event: str, lineno: int, rank, time, **cols) -> dict:
        """Append (and return) an ``events`` record: its kind, rank, time as printed, then ``cols``."""
        rec = {"table": "events", "source": self.source, "line": lineno, "event": event, "rank": rank, "time": time}
        rec.update(cols)
        self.records.append(rec)
        return rec


class StepRowParser(LineParser):
    """A LineParser whose step rows are assembled from several lines (iteration line, timers,
    memory): one row per (rank, step), created on first sight and flushed by ``finish``."""

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self._steps: dict[tuple, dict] = {}

    def _step_row(self, rank, step: int, lineno: int) -> dict:
        row = self._steps.get((rank, step))
        if row is None:
            row = self._steps[(rank, step)] = {"table": "steps", "source": self.source, "line": lineno,
                                               "kind": self.kind, "rank": rank, "step": step}
        return row

    def finish(self) -> None:
        self.records.extend(self._steps.values())
        self._steps = {}


def run_parsers(text: str | Iterable[str], parsers: list[LineParser], *, kind: str) -> ParseResult:
    """Feed every normalised line of ``text`` (``iter_lines``) to ``parsers``, first that
    recognises it wins; count the unparsed lines. A parser that raises ValueError, IndexError,
    KeyError or OverflowError on a line leaves it unparsed with a warning."""
    blocks = text if isinstance(text, TextBlocks) else TextBlocks([text] if isinstance(text, str) else text)
    feeds, warnings = [p.feed for p in parsers], parsers[0].warnings
    unparsed, linenos, huge = 0, [], 0
    # the chain's gate: a line no parser's gate passes goes unread unless a parser is inside a block
    gates = None if any(p.gate is None for p in parsers) else [g for p in parsers for g in p.gate]
    starts = gates and join_regexes(g for g in gates if not isinstance(g, str))
    holds = re.compile("|".join(re.escape(g) for g in gates if isinstance(g, str)) or "(?!)").search if starts else None
    stateful, fed = [p for p in parsers if type(p).busy is not LineParser.busy], False
    for lineno, body, ts, rank in iter_lines(blocks, cut=True):
        feed = None
        if body is None:
            huge += 1
        elif holds is None or starts.match(body) or holds(body) or fed and any(p.busy for p in stateful):
            fed = True  # a parser may be inside a block from now on (only a feed changes that)
            try:
                for feed in feeds:
                    if feed(lineno, body, ts, rank):
                        break
                else:
                    feed = None
            except (ValueError, IndexError, KeyError, OverflowError) as e:
                warnings.append(f"line {lineno}: not understood ({type(e).__name__})")
                feed = None
        else:
            fed = False
        if feed is None:
            unparsed += 1
            if len(linenos) < MAX_UNPARSED_LINENOS:
                linenos.append(lineno)
    if blocks.cut_line:  # a file that ends inside a line was cut (a crashed writer, a partial copy)
        unparsed += 1
        if len(linenos) < MAX_UNPARSED_LINENOS:
            linenos.append(blocks.cut_line)
        warnings.append(f"line {blocks.cut_line}: cut (the file ends without a newline); not used")
    records, warnings = [], []
    for p in parsers:
        p.finish()
        records.extend(p.records)
        warnings.extend(p.warnings)
    if huge:
        warnings.append(f"{huge} line(s) longer than {MAX_LINE_CHARS} characters skipped")
    return ParseResult(records=records, unparsed=unparsed, warnings=warnings, kind=kind,
                       unparsed_lines=tuple(linenos), num_lines=blocks.num_lines)


# ---------------------------------------------------------------- detection

# (kind, signature regex searched in the normalised head); first hit wins, most specific first.
_SIGNATURES: tuple[tuple[str, re.Pattern], ...] = tuple((k, re.compile(p, re.M)) for k, p in (
    ("nccl_ras", r"^Communicators\.\.\.|^Job summary$"),
    ("chrome_trace", r'"ph":\s*"[A-Za-z]"'),
    ("flight_recorder", r"[\"']pg_config[\"']\s*:|[\"']entries[\"']\s*:\s*\["),
    ("pyspy", r"^Thread \d+ \((?:idle|active)"),
    ("profiler_table", r"Self CPU(?: total)? %|# of Calls|Number of Calls"),
    ("nsys_stats", r"^Processing \[.*\] with \[|^ ?\*\* .*\(\w+\):$|^CUDA API Statistics|nsys-rep|\.qdrep"
                   r"|^\[\d+/\d+\] Executing '\w+' stats report|^\"?Time \(%\)\"?,\"?Total Time"),
    ("torchtitan", r"\[titan\] |- root - INFO - step:\s"),
    ("megatron", r"^(?:\[[\d\- :]+\] )?iteration\s+\d+/\s*\d+ \||\(after \d+ iterations\) memory \(MB\)"
                 r"|^-+ arguments -+$|^> building \w+ datasets"),
    ("deepspeed", r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\] \[(?:INFO|WARNING|ERROR|DEBUG)\] \[\w+\.py:\d+:\w+\]"),
    ("nccl", r" NCCL (?:INFO|WARN) |^NCCL version \d|^# nThread \d+ nGpus"),
    ("nvidia_smi_topo", r"^GPU0\s.*(?:CPU Affinity|GPU1)|^GPU\d+\s+(?:X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)\s"
                        r"|^NIC\d+: |nvidia-smi topo -m"),
    ("nvidia_smi_q", r"=+NVSMI LOG=+|^Driver Version\s+: \d"),
    ("collect_env", r"^Collecting environment information|^PyTorch version\s*: |^Is CUDA available\s*: "),
    ("failures", r"ChildFailedError|Watchdog caught collective|ProcessGroupNCCL\.cpp:\d+|CUDA out of memory"),
))

HEAD_CHARS = 64 * 1024


def detect_kind(text_head: str) -> str | None:
    """The artifact kind of a text by its content (first HEAD_CHARS), or None if unknown."""
    head = "\n".join(body for _, body, _, _ in iter_lines(text_head[:HEAD_CHARS]) if body)
    for kind, sig in _SIGNATURES:
        if sig.search(head):
            return kind
    return None
