"""Pure parsers for third-party artifacts: text in, records + unparsed-line count out.

Shared pieces live here: ``ParseResult``, the line normaliser every parser runs its input
through (launcher prefixes, ANSI colour, paste indentation, ISO timestamps on their own
line), ``detect_kind`` (by content, never by file name) and ``parse_text`` (detect + parse),
and the shard protocol ``ingest.sharded`` reads one file with on several processes: each
parser's ``start_shard`` / ``at_rest`` / ``absorb``, ``Runner.absorb``, ``run_shard``.

Each format has its own module with one pattern table (``Rule`` rows: name, regex with named
groups, table, and per group the column, type and unit scale): a new field is one row.
Deliberately not here: opening files (ingest.io), writing tables (ingest.thirdparty),
any analysis of the records.

Records are plain dicts; ``record["table"]`` names the output table (steps, memory, timers,
comm_topology, collectives, events, env, kernels, stacks); every record carries ``source`` and ``line``
(1-based line of the input it came from, the first one for aggregated records).
"""
from __future__ import annotations

import functools
import itertools
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator

NATIVE = True  # use a parser's compiled scanner where it is built (tests switch it off to compare)
MAX_LINE_CHARS = 1 << 16  # longer lines are counted unparsed unread: bounded time per line
MAX_UNPARSED_LINENOS = 1000  # line numbers kept for --strict; the count is always exact


@dataclass(frozen=True, kw_only=True)
class ParseResult:
    """What a parser returns.

    records: dicts with a ``table`` key (see module doc); unparsed: number of non-blank input
    lines no rule recognised; warnings: human-readable notes (truncation, skipped huge lines,
    unknown fields); kind: the format parsed; unparsed_lines: the first
    ``MAX_UNPARSED_LINENOS`` 1-based line numbers that were not parsed.
    """

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


def put_field(row: dict, spec: tuple, value: str) -> None:
    """``row[column] = type(value) * scale`` for a (column, type, scale) pattern-table entry;
    a value that does not convert is left out."""
    column, typ, scale = spec
    try:
        v = typ(value)
    except ValueError:
        return
    row[column] = v * scale if scale != 1 else v


def apply_rule(r: Rule, m: re.Match, *, source: str, lineno: int) -> dict | None:
    """Build the record of a matched rule (None for recognised-only rules)."""
    if r.table is None:
        return None
    rec: dict = {"table": r.table, "source": source, "line": lineno, "record": r.name}
    if r.const:
        rec.update(r.const)
    if r.plan:
        for (column, typ, scale), text in zip(r.plan, m.group(*r.groups)):  # (one column: its group twice)
            if text is None:
                continue
            try:
                value = typ(text)
            except (ValueError, TypeError):
                continue
            rec[column] = value * scale if scale != 1.0 else value
    return rec


def match_rules(rules: Iterable[Rule], text: str) -> tuple[Rule, re.Match] | tuple[None, None]:
    for r in rules:
        m = r.regex.match(text)
        if m:
            return r, m
    return None, None


_UNIT_GIB = {"B": 1 / 2**30, "KB": 1 / 2**20, "KIB": 1 / 2**20, "MB": 1 / 2**10, "MIB": 1 / 2**10,
             "GB": 1.0, "GIB": 1.0, "TB": 2**10, "TIB": 2**10}


_SIZE = re.compile(r"\s*([\d.,]+)\s*([KMGT]?i?B)\s*", re.I)


@functools.lru_cache(maxsize=1 << 12)  # memory figures repeat from step to step
def to_gib(text: str) -> float:
    """'649.97 MiB' / '1.01 GiB' / '0.26GB' -> GiB (GB taken as GiB, as PyTorch/DeepSpeed print them)."""
    m = _SIZE.fullmatch(text)
    if not m:
        raise ValueError(text)
    return to_num(m.group(1)) * _UNIT_GIB[m.group(2).upper()]


# ---------------------------------------------------------------- line normaliser

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
# Launcher prefixes, possibly stacked ("[80746] [rank0]:"); rank captured where it is a rank.
_PREFIX = re.compile(
    r"(?:\s+"
    r"|\[rank(?P<r1>\d+)\]:"
    r"|\[default(?P<r2>\d+)\]:"
    r"|\[\d+,(?P<r3>\d+)\]<std(?:out|err)>:"
    r"|\[\d+\] "
    r"|[\w.\-]+/\d+ \[\d+\]:"
    r"|\(\w+ pid=\d+(?:, ip=[^)]*)?\) "
    r")+"
)
_PREFIX_START = frozenset(" \t[(")
_ISO_TS = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?")

Line = tuple  # (lineno, body, timestamp | None, rank | None)


def is_timestamp_line(body: str) -> bool:
    """Whether a non-empty normalised line is an ISO timestamp alone (CloudWatch exports put one
    before each log line; it belongs to the next line)."""
    return body[0].isdigit() and len(body) <= 35 and _ISO_TS.fullmatch(body) is not None


class TextBlocks:
    """Text streamed as blocks of whole lines: the input's lines are the blocks joined with
    newlines (a block never ends inside a line). ``ingest.io.iter_text_blocks`` reads files
    this way, so no Python object per line exists before the parsers' own regex pass.
    Iterating yields the blocks; ``lines()`` yields the lines."""

    def __init__(self, blocks: Iterable[str]) -> None:
        self.blocks = blocks

    def __iter__(self) -> Iterator[str]:
        return iter(self.blocks)

    def lines(self) -> Iterator[str]:
        for block in self.blocks:
            yield from block.split("\n")


def iter_lines(text: str | Iterable[str]) -> Iterator[Line]:
    """Normalised non-blank lines: ``(lineno, body, timestamp, rank)``.

    body: the line without launcher prefixes, ANSI colour codes, leading indentation and
    trailing whitespace. timestamp: an ISO timestamp that stood alone on the previous line
    (CloudWatch exports), else None; such timestamp lines are consumed, not yielded.
    rank: from a ``[rankN]:`` / ``[defaultN]:`` / ``[job,N]<stdout>:`` prefix, else None.
    Long lines (> MAX_LINE_CHARS) are yielded with body None so callers count them unparsed.
    ``text`` may be a string or any iterable of lines (streaming).
    """
    lines = text.split("\n") if isinstance(text, str) else text.lines() if isinstance(text, TextBlocks) else text
    pending_ts = None
    prefix_match = _PREFIX.match
    for lineno, raw in enumerate(lines, start=1):
        if len(raw) > MAX_LINE_CHARS:
            yield lineno, None, None, None
            continue
        if "\x1b" in raw:
            raw = _ANSI.sub("", raw)
        line = raw.rstrip()
        if not line:
            continue
        rank = None
        if line[0] in _PREFIX_START or "/" in line[:40]:
            m = prefix_match(line)
            if m and m.end():
                r = m.group("r1") or m.group("r2") or m.group("r3")
                rank = int(r) if r else None
                line = line[m.end():]
                if not line:
                    continue
        if is_timestamp_line(line):
            pending_ts = line
            continue
        yield lineno, line, pending_ts, rank
        pending_ts = None


class LineParser:
    """Base of the stateful per-format scanners: ``feed`` a normalised line, return whether
    it was recognised; ``finish`` flushes state. Records go to ``self.records``.

    Two optional class attributes let the chunked runner skip the per-line path:
    ``hints``: substrings of which every line the parser recognises holds one (lines that
    start like a launcher prefix, a timestamp or a digit are always fed); None: no such
    bound. ``fast_lines``: (name, regex) rows for the frequent line shapes of the format,
    each completing ``fast_head`` (a regex all of them start with, matched once) to a whole
    normalised line; a matched line goes to ``fast_<name>(lineno, m, ts)`` if the parser has
    one, else to ``feed`` with the line. Group names are unique across head and rows. Only the
    first parser of a chain has fast lines: a line they match is one it recognises.
    ``bulk_lines``: fast rows whose lines ``bulk`` can count per chunk at once: row name ->
    the row's groups that make the aggregation key (in the order they appear in the row).
    ``bulk_normalise``: (regex, replacement) rows that overwrite fields outside the keys of
    bulk lines (call counters, buffer addresses, timings) with a constant that the row still
    matches, so a chunk made only of bulk lines reduces to its few distinct lines in C
    (``str.split`` + ``Counter``); ``bulk_markers``: literals of which every bulk line holds
    one (a chunk with fewer markers than lines is not tried that way).
    """

    kind = ""
    hints: tuple[str, ...] | None = None
    fast_head = ""
    fast_lines: tuple[tuple[str, str], ...] = ()
    bulk_lines: dict[str, tuple[str, ...]] = {}
    bulk_normalise: tuple[tuple[re.Pattern, str], ...] = ()
    bulk_markers: tuple[str, ...] = ()
    native = False  # True where ``native_scan`` is a compiled scanner (ingest/parsers/_*_scan.pyx) that is built
    native_misses = False  # True where ``native_scan`` takes ``misses`` (see there)

    def native_scan(self, text: str, pos: int, lineno: int, misses=None) -> tuple[int, int, int, int]:
        """The compiled scanner's protocol. ``text``: a chunk, a newline before each line;
        ``pos``: the index of the newline before the next line; ``lineno``: the number of the
        line before it. Takes lines from there while it reads each whole exactly as the Python
        path would (records, aggregates, state), and stops before the first it does not (a
        timestamp line, a prefix, a shape it does not know, anything unusual). Returns ``(pos,
        lineno, last, resume)``: where it stopped (``len(text)`` at the end), the number of the
        line before ``pos``, the number of the last non-blank line it took (0: none), and the
        index of the newline before the next line after ``pos`` it may take (``pos`` if it
        does not know), so the Python path takes the lines in between.

        ``misses`` (passed only to a parser with ``native_misses``, only while every parser of
        the chain has hints and is idle): ``(hints, count)``. The scanner may then also take
        the lines ``Runner._gap`` counts unparsed without feeding them -- a line holding none of
        ``hints`` that does not start (after whitespace) with a digit, ``[`` or ``(`` or as a
        ``host/N [`` launcher prefix (``_NORMALISED_LINE``) -- calling ``count(lineno, n)`` for
        each run of n such lines after line lineno, in line order. (Its own lines must leave
        every parser idle: the chain stays idle while it scans.)"""
        raise NotImplementedError

    def bulk(self, counts: dict[str, Counter]) -> bool:
        """Apply the line counts of ``bulk_lines`` rows (row name -> key groups -> lines) if
        that adds no new row or order-dependent value; else change nothing, return False."""
        return False

    def bulk_new(self, counts: dict[str, Counter]) -> set[tuple[str, tuple]] | None:
        """When ``bulk`` refused ``counts``: the (row name, key) entries that are new and that
        ``bulk_create`` can make from the key alone; None (or empty) if any new entry cannot be
        made that way. Changes nothing."""
        return None

    def bulk_create(self, lineno: int, name: str, key: tuple) -> None:
        """Make the row (or row part) of a ``bulk_new`` entry, as its first line (``lineno``)
        would; counts one line."""
        raise NotImplementedError

    def __init__(self, source: str) -> None:
        self.source = source
        self.records: list[dict] = []
        self.warnings: list[str] = []

    def feed(self, lineno: int, body: str, ts: str | None, rank: int | None) -> bool:  # pragma: no cover
        raise NotImplementedError

    def idle(self) -> bool:
        """True when a line without hints would change nothing (no multi-line state open)."""
        return True

    def finish(self) -> None:
        pass

    # Shards (ingest.sharded): a file read in pieces by fresh parsers, merged in order. A parser
    # whose state another piece's lines may need says so in ``at_rest``; ``absorb`` merges.

    def start_shard(self) -> None:
        """Make a fresh parser the reader of a shard after the first: state that earlier lines
        would have set (a last step, a last rank...) becomes ``UNKNOWN``, to be filled in by
        ``absorb`` once the shards before it are merged. Nothing to do for a parser without state."""

    def end_shard(self) -> None:
        """At a shard's end, in the process that read it: put the state in the form ``absorb``
        takes (work done here is done in parallel; ``absorb`` runs in one process)."""

    def at_rest(self) -> bool:
        """Whether the next shard, read from a fresh parser after ``start_shard``, gives what
        reading on from this state gives, once ``absorb`` merges it: no multi-line block open,
        no carried state ``absorb`` cannot fill in. A parser with state of its own says when;
        by default only a parser with none is at rest."""
        return vars(self).keys() <= {"source", "records", "warnings"}

    def can_absorb(self, later: LineParser) -> bool:
        """Whether ``absorb(later)`` is exact (checked only when ``at_rest`` holds)."""
        return True

    def absorb(self, later: LineParser) -> None:
        """Merge the parser of the next shard (same class, before ``finish``) into this one, so
        this one is as if it had read that shard's lines itself: its records and warnings follow
        these; a subclass merges its own state."""
        self.records.extend(later.records)
        self.warnings.extend(later.warnings)


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

    def start_shard(self) -> None:
        """Rows this shard makes are ``ShardRow``s (they tell which values only setdefault put)."""
        self._step_row = self._shard_step_row

    def _shard_step_row(self, rank, step: int, lineno: int) -> dict:
        row = type(self)._step_row(self, rank, step, lineno)
        if type(row) is not ShardRow:
            row = self._steps[(rank, step)] = ShardRow(row)
        return row

    def end_shard(self) -> None:
        """Rows as plain dicts, and per row (``_soft``) the keys only setdefault filled."""
        steps, soft = {}, {}
        for key, row in self._steps.items():
            plain = dict(row)
            if row.soft:
                keys = [k for k in row.soft if type(plain[k]) is Soft]  # (an assignment since made it a value)
                for k in keys:
                    plain[k] = plain[k].value
                if keys:
                    soft[key] = keys
            steps[key] = plain
        self._steps, self._soft = steps, soft
        del self._step_row  # (the ShardRow maker: not shipped back)

    def at_rest(self) -> bool:
        return vars(self).keys() <= {"source", "records", "warnings", "_steps"}

    def absorb(self, later: StepRowParser) -> None:
        """Rows of a (rank, step) both shards made: the earlier row (its ``line``, its key order)
        takes the later row's values as the serial parse would have; new rows follow, in order."""
        steps, soft = self._steps, later._soft
        for key, row in later._steps.items():
            mine = steps.get(key)
            if mine is None:
                steps[key] = row
            else:
                merge_step_row(mine, row, soft.get(key, ()))
        super().absorb(later)


# Fast lines: after a newline, the launcher prefixes the fast path takes itself (indentation, one
# ``[rankN]:``), then one alternative, then trailing whitespace. Digits are [0-9], not \d: a
# stricter match only sends a line to the general path. A timestamp alone on its line is one
# alternative of every format (CloudWatch exports put one before each line). Optional parts
# are written ``(?:x|)``, not ``(?:x)?``: the same language, twice as fast in CPython's re.
_FAST_PREFIX = r"\n[ \t]*(?:\[rank(?P<rank>[0-9]+)\]:[ \t]*|)"
_FAST_ISO_TS = (r"[0-9]{4}-[0-9][0-9]-[0-9][0-9][T ][0-9][0-9]:[0-9][0-9]:[0-9][0-9](?:[.,][0-9]{1,9}|)"
                r"(?:Z|[+-][0-9][0-9]:?[0-9][0-9]|)")  # at most 35 characters, as iter_lines requires
# Lines of a gap the normaliser may change beyond a substring: blank, prefixed, digit-first.
_NORMALISED_LINE = re.compile(r"\n[^\S\n]*(?:[\d\[(\n]|\Z|[\w.\-]+/\d+ \[)")
_FAST_CACHE: dict[type, re.Pattern | None] = {}
CHUNK_CHARS = 1 << 20
CHUNK_LINES = 20000


def fast_regex(parser_type: type) -> re.Pattern | None:
    """The compiled fast-line regex of a parser class: after the launcher prefix, a timestamp
    line or the format's ``fast_head`` and one of its rows (group ``body_at`` marks where the
    normalised line starts)."""
    if parser_type not in _FAST_CACHE:
        rows = "|".join(f"(?P<{name}>{pattern})" for name, pattern in parser_type.fast_lines)
        _FAST_CACHE[parser_type] = re.compile(
            f"{_FAST_PREFIX}(?:(?P<iso_ts>{_FAST_ISO_TS})|(?P<body_at>){parser_type.fast_head}(?:{rows}))[^\\S\\n]*$",
            re.M) if rows else None
    return _FAST_CACHE[parser_type]


def bulk_regex(parser_type: type) -> tuple[re.Pattern, list[tuple[str, int, tuple[int, ...]]]] | None:
    """The split regex of a parser's ``bulk_lines``: an optional timestamp line (group 1), the
    head and one of the rows, only key groups capturing, each row led by an empty marker
    group; and per row (name, marker position, key positions) in the split's group tuple."""
    if not parser_type.bulk_lines:
        return None
    keys = {k for ks in parser_type.bulk_lines.values() for k in ks}

    def only_keys(pattern: str) -> str:
        return re.sub(r"\(\?P<(\w+)>", lambda g: g.group(0) if g.group(1) in keys else "(?:", pattern)
    alts = [f"(?P<bulk_{name}>){only_keys(pattern)}" for name, pattern in parser_type.fast_lines
            if name in parser_type.bulk_lines]
    rx = re.compile(f"\\n(?:({_FAST_ISO_TS})[^\\S\\n]*\\n|){only_keys(parser_type.fast_head)}(?:{'|'.join(alts)})"
                    f"[^\\S\\n]*$", re.M)
    at = {name: i - 2 for name, i in rx.groupindex.items()}  # position in the tuple of groups 2..
    return rx, [(name, at[f"bulk_{name}"], tuple(at[k] for k in ks)) for name, ks in parser_type.bulk_lines.items()]


def bulk_line_regex(parser_type: type) -> re.Pattern | None:
    """The bulk regex of ``bulk_regex`` for one whole line (no newline, no timestamp line): its
    groups are those of the split's tuple, so the same (marker, key) positions apply."""
    if not parser_type.bulk_markers:
        return None
    rx, _ = bulk_regex(parser_type)
    head = f"\\n(?:({_FAST_ISO_TS})[^\\S\\n]*\\n|)"
    assert rx.pattern.startswith(head) and rx.pattern.endswith("$"), rx.pattern
    return re.compile(rx.pattern[len(head):-1])


def _has_long_line(text: str) -> bool:
    """Whether a line of text (lines joined by newlines) is longer than MAX_LINE_CHARS. Such a
    line holds a whole aligned window of MAX_LINE_CHARS // 2 characters, so the lines are split
    and measured only where a window holds no newline (a few finds per chunk, not a split)."""
    w, find = MAX_LINE_CHARS // 2, text.find
    if all(find("\n", i, i + w) >= 0 for i in range(0, len(text) - w + 1, w)):
        return False
    return max(map(len, text.split("\n"))) > MAX_LINE_CHARS


def fast_rank(m: re.Match) -> int | None:
    r = m.group("rank")
    return int(r) if r else None


class Runner:
    """Feeds raw lines through the normaliser to ``parsers`` (first that recognises a line
    wins) and keeps the counts.

    ``chunk`` takes many lines at once: one regex pass finds the first parser's fast lines,
    and runs of other lines that hold none of the chain's ``hints`` are counted unparsed in
    bulk; the rest takes the per-line path (``raw``). Both paths give the same result
    (tests/test_parsers_fastpath.py checks this).
    """

    def __init__(self, parsers: list[LineParser], *, kind: str, fast: bool = True) -> None:
        self.parsers, self.kind = parsers, kind
        self.feeds = [p.feed for p in parsers]
        self.unparsed, self.linenos, self.num_lines, self.huge = 0, [], 0, 0
        self.pending_ts: str | None = None
        self.lineno = 0
        hints = [p.hints for p in parsers]
        self.hints = None if not fast or None in hints else tuple(h for hs in hints for h in hs)
        self.fast = fast_regex(type(parsers[0])) if fast else None
        self.native = parsers[0].native_scan if fast and NATIVE and parsers[0].native else None
        self.native_misses = bool(self.native and parsers[0].native_misses and self.hints)
        self.bulk, self.bulk_rows = (bulk_regex(type(parsers[0])) if fast else None) or (None, [])
        self.bulk_line = bulk_line_regex(type(parsers[0])) if self.bulk is not None else None
        first = parsers[0]
        self.handlers = {name: getattr(first, f"fast_{name}", None) or self._feed_first(name)
                         for name, _ in first.fast_lines}

    def _feed_first(self, name: str):
        feed = self.parsers[0].feed

        def handler(lineno: int, m: re.Match, ts) -> bool:
            return feed(lineno, m.string[m.end("body_at"):m.end(name)], ts, fast_rank(m))
        return handler

    def miss(self, lineno: int) -> None:
        self.unparsed += 1
        if len(self.linenos) < MAX_UNPARSED_LINENOS:
            self.linenos.append(lineno)

    def raw(self, lineno: int, raw: str) -> None:
        if len(raw) > MAX_LINE_CHARS:
            self.huge += 1
            self.num_lines = lineno
            self.miss(lineno)
            return
        if "\x1b" in raw:
            raw = _ANSI.sub("", raw)
        line = raw.rstrip()
        if not line:
            return
        rank = None
        if line[0] in _PREFIX_START or "/" in line[:40]:
            m = _PREFIX.match(line)
            if m and m.end():
                r = m.group("r1") or m.group("r2") or m.group("r3")
                rank = int(r) if r else None
                line = line[m.end():]
                if not line:
                    return
        self.num_lines = lineno
        if is_timestamp_line(line):
            self.pending_ts = line
            return
        ts, self.pending_ts = self.pending_ts, None
        for feed in self.feeds:
            try:
                if feed(lineno, line, ts, rank):
                    return
            except (ValueError, IndexError, KeyError, OverflowError) as e:
                self.parsers[0].warnings.append(f"line {lineno}: not understood ({type(e).__name__})")
                break
        self.miss(lineno)

    def chunk(self, lines: list[str]) -> None:
        """Consecutive raw lines, numbered on from the last chunk."""
        text = "\n" + "\n".join(lines)
        if text.count("\n") != len(lines):  # a "line" holding newlines: take the lines as given
            self._general(lines)
        else:
            self._chunk(text, lines)

    def chunk_text(self, block: str) -> None:
        """Consecutive raw lines as one text block (lines joined by newlines), numbered on."""
        self._chunk("\n" + block, None)

    def _general(self, lines: list[str]) -> None:
        start = self.lineno
        self.lineno += len(lines)
        for lineno, line in enumerate(lines, start + 1):  # general path: huge lines, odd input
            if line:
                self.raw(lineno, line)

    def _chunk(self, text: str, lines: list[str] | None) -> None:
        """text: a newline, then the chunk's lines joined by newlines (``lines``, if at hand)."""
        if (self.fast is None and self.hints is None) or (len(text) > MAX_LINE_CHARS and (
                max(map(len, lines)) > MAX_LINE_CHARS if lines is not None else _has_long_line(text))):
            self._general(lines if lines is not None else text[1:].split("\n"))
            return
        start = self.lineno
        if "\x1b" in text:
            text = _ANSI.sub("", text)  # no escape sequence spans a newline: same as per line
        if self.native is not None and self.fast is not None:
            self.lineno = self._native(text, start)  # (it counts the lines: no count of the chunk)
            return
        self.lineno += text.count("\n")
        if self.fast is None:
            self._gap(text, 0, len(text), start)
        elif self.bulk is None or not (self._bulk_only(text, start) or self._bulk(text, start)):
            self._scan(text, start)

    def _native(self, text: str, start: int) -> int:
        """A chunk through the first parser's compiled scanner (``native_scan``), which takes
        the lines it reads whole and stops before any other; the lines from there to where it
        can go on take ``_scan`` (at least one, and the line after a timestamp line; a single
        line takes ``raw``). Returns the number of the chunk's last line."""
        scan = self.native
        pos, lineno, end = 0, start, len(text)
        while pos < end:
            if self.pending_ts is None:
                if self.native_misses and all(p.idle() for p in self.parsers):  # (made per call: no cycle through self)
                    pos, lineno, last, resume = scan(text, pos, lineno, (self.hints, self._misses))
                else:
                    pos, lineno, last, resume = scan(text, pos, lineno)
                if last > self.num_lines:
                    self.num_lines = last
                if pos >= end:
                    break
            else:
                resume = pos  # the line a timestamp line belongs to: the Python path
            cut = text.find("\n", pos + 1)
            if cut < 0:
                cut = end
            if resume <= cut:  # one line, the usual stop: the per-line path (what _scan does with it)
                lineno += 1
                self.raw(lineno, text[pos + 1:cut])
            else:
                cut = resume
                lineno = self._scan(text[pos:cut], lineno)
            pos = cut
        return lineno

    def _bulk_only(self, text: str, start: int) -> bool:
        """A chunk of only bulk lines, timestamp lines before them and blank lines: count its
        distinct lines once their non-key fields are normalised, with no regex pass over the
        chunk; False (nothing changed) if the chunk holds any other line or a new key."""
        first = self.parsers[0]
        if self.bulk_line is None:
            return False
        lines = text.count("\n") - text.count("\n\n")
        for marker in first.bulk_markers:  # a cheap bound: fewer markers than non-blank lines, some is not a bulk line
            lines -= text.count(marker)
            if lines <= 0:
                break
        else:
            return False
        norm = text
        for rx, repl in first.bulk_normalise:
            norm = rx.sub(repl, norm)
        counts: dict[str, Counter] = {name: Counter() for name, _, _ in self.bulk_rows}
        match = self.bulk_line.fullmatch
        for line, n in Counter(norm.split("\n")).items():
            body = line.rstrip()
            if not body:
                continue
            m = match(line)
            if m is None:
                if is_timestamp_line(body):
                    continue  # consumed by the bulk line after it (checked below: not the last line)
                return False
            groups = m.groups()
            for name, marker, at in self.bulk_rows:
                if groups[marker] is not None:
                    counts[name][tuple(groups[i] for i in at)] += n
                    break
        tail = text.rstrip()
        last = tail[tail.rfind("\n") + 1:]
        if not tail or is_timestamp_line(last):
            return False  # blank, or a timestamp for the next chunk's first line
        if not first.bulk(counts):
            return False
        self.pending_ts = None
        self.num_lines = max(self.num_lines, start + tail.count("\n"))
        return True

    def _bulk(self, text: str, start: int) -> bool:
        """Aggregate the first parser's bulk lines of a chunk in one split + Counter (no Python
        per line), if its ``bulk`` accepts the counts (it does when they add nothing new, so
        order does not matter) or its ``bulk_new`` can create the new rows from their keys at
        their first lines, in order; the lines between them take ``_scan``."""
        parts = self.bulk.split(text)
        step = self.bulk.groups + 1  # per match: the timestamp line before it (or None), then the rows' groups
        if len(parts) == 1:
            return False
        first = self.parsers[0]
        matches = list(zip(*(parts[i::step] for i in range(2, step))))
        counts: dict[str, Counter] = {name: Counter() for name, _, _ in self.bulk_rows}
        keys: dict[tuple, tuple[str, tuple]] = {}  # distinct groups -> (row, key)
        for groups, n in Counter(matches).items():
            for name, marker, at in self.bulk_rows:
                if groups[marker] is not None:  # the row that matched
                    key = keys[groups] = (name, tuple(groups[i] for i in at))
                    counts[name][key[1]] += n
                    break
        new = None
        if not first.bulk(counts):
            new = first.bulk_new(counts)
            if not new:
                return False
        lineno = start
        for piece, ts, groups in zip(parts[::step], parts[1::step], matches):
            if piece:
                lineno = self._scan(piece, lineno)
            lineno += 1 if ts is None else 2
            self.pending_ts = None
            if new:  # rows created at their first line, in line order, between the lines _scan takes
                row = keys[groups]
                if row in new:
                    new.discard(row)
                    first.bulk_create(lineno, *row)
                    counts[row[0]][row[1]] -= 1
        if new is not None and not first.bulk(counts):  # every row exists now: bulk only adds
            raise RuntimeError(f"{type(first).__name__}.bulk refused counts after bulk_create made their rows")
        if lineno > self.num_lines:
            self.num_lines = lineno
        if parts[-1]:
            self._scan(parts[-1], lineno)
        return True

    def _scan(self, text: str, start: int) -> int:
        """Lines of text (each after a newline) numbered from start + 1; returns the last number."""
        lineno, pos, last = start, 0, 0
        handlers = self.handlers
        for m in self.fast.finditer(text):
            s, e = m.span()
            if s != pos:
                lineno = self._gap(text, pos, s, lineno)
            last = lineno = lineno + 1
            pos = e
            name = m.lastgroup
            if name == "iso_ts":
                self.pending_ts = m.group(name)
                continue
            ts = self.pending_ts
            if ts is not None:
                self.pending_ts = None
            try:
                if handlers[name](lineno, m, ts):
                    continue
            except (ValueError, IndexError, KeyError, OverflowError) as err:
                self.parsers[0].warnings.append(f"line {lineno}: not understood ({type(err).__name__})")
                self.miss(lineno)
                continue
            self.pending_ts = ts  # not recognised after all: the general path decides
            self.raw(lineno, text[s + 1:pos])
        if last > self.num_lines:
            self.num_lines = last
        if pos < len(text):
            lineno = self._gap(text, pos, len(text), lineno)
        return lineno

    def _gap(self, text: str, a: int, b: int, lineno: int) -> int:
        """Lines text[a + 1:b] (a: the newline before them); returns the last line number."""
        seg = text[a:b]
        n = seg.count("\n")
        if n >= 4 and self._unrecognisable(seg):  # (a short run is cheaper to take line by line)
            self._misses(lineno, n)
        elif n > 16:  # halve: a hint in a long run sends only its half line by line
            mid = seg.find("\n", len(seg) // 2)
            if mid <= 0:
                mid = seg.rfind("\n", 1, len(seg) // 2 + 1)
            self._gap(text, a + mid, b, self._gap(text, a, a + mid, lineno))
        else:
            for i, line in enumerate(seg[1:].split("\n"), lineno + 1):
                if line:
                    if n > 1 and self._unrecognisable("\n" + line):
                        self._misses(i - 1, 1)
                    else:
                        self.raw(i, line)
        return lineno + n

    def _unrecognisable(self, seg: str) -> bool:
        """Whether no parser can recognise any line of seg ("\\n"-separated, leading newline)."""
        return (self.hints is not None and not _NORMALISED_LINE.search(seg) and not any(map(seg.__contains__, self.hints))
                and all(p.idle() for p in self.parsers))

    def _misses(self, lineno: int, n: int) -> None:
        """Lines lineno + 1 .. lineno + n, all non-blank, recognised by none."""
        self.unparsed += n
        room = MAX_UNPARSED_LINENOS - len(self.linenos)
        if room > 0:
            self.linenos.extend(range(lineno + 1, lineno + 1 + min(n, room)))
        self.num_lines = lineno + n
        self.pending_ts = None

    def result(self) -> ParseResult:
        records, warnings = [], []
        for p in self.parsers:
            p.finish()
            records.extend(p.records)
            warnings.extend(p.warnings)
        if self.huge:
            warnings.append(f"{self.huge} line(s) longer than {MAX_LINE_CHARS} characters skipped")
        return ParseResult(records=records, unparsed=self.unparsed, warnings=warnings, kind=self.kind,
                           unparsed_lines=tuple(self.linenos), num_lines=self.num_lines)

    # Shards (ingest.sharded)

    def start_shard(self, first_lineno: int) -> None:
        """Read a shard after the first: lines are numbered from ``first_lineno`` (1-based) and
        the (fresh) parsers take their shard start state (``LineParser.start_shard``). Such a
        shard is read on the Python path: its step rows are ``ShardRow``s, which the compiled
        scanners do not make."""
        self.lineno = first_lineno - 1
        self.native = None
        for p in self.parsers:
            p.start_shard()

    def shard_state(self) -> ShardState:
        """What this runner read, before ``result`` (which would finish the parsers), in the
        form ``absorb`` takes (``LineParser.end_shard``)."""
        for p in self.parsers:
            p.end_shard()
        return ShardState(parsers=self.parsers, unparsed=self.unparsed, unparsed_lines=self.linenos,
                          num_lines=self.num_lines, huge=self.huge, pending_ts=self.pending_ts, last_lineno=self.lineno)

    def at_rest(self) -> bool:
        """Whether a shard read from here by a fresh chain can be merged exactly (``absorb``): no
        timestamp line waits for the next line, and every parser is at rest."""
        return self.pending_ts is None and all(p.at_rest() for p in self.parsers)

    def absorb(self, state: ShardState) -> bool:
        """Merge the next shard's state, read by a fresh chain of the same parsers, as if this
        runner had read its lines; False (nothing changed) when that would not be exact (then
        read the shard's text on with ``chunk_text``)."""
        if not self.at_rest() or not all(p.can_absorb(q) for p, q in zip(self.parsers, state.parsers)):
            return False
        for p, q in zip(self.parsers, state.parsers):
            p.absorb(q)
        self.unparsed += state.unparsed
        self.linenos.extend(state.unparsed_lines[:MAX_UNPARSED_LINENOS - len(self.linenos)])
        self.num_lines = max(self.num_lines, state.num_lines)
        self.huge += state.huge
        self.pending_ts = state.pending_ts
        self.lineno = state.last_lineno
        return True


def run_parsers(text: str | Iterable[str], parsers: list[LineParser], *, kind: str, fast: bool = True) -> ParseResult:
    """Feed every line of ``text`` (a string or an iterable of lines) to ``parsers``, in chunks.

    fast=False: every line through the per-line normaliser (the reference the fast path is
    tested against).
    """
    runner = Runner(parsers, kind=kind, fast=fast)
    if isinstance(text, (str, TextBlocks)):
        for block in iter_blocks(text):
            runner.chunk_text(block)
    else:
        for batch in iter_chunks(text):
            runner.chunk(batch)
    return runner.result()


def iter_blocks(text: str | TextBlocks) -> Iterator[str]:
    """A text (or the blocks of a TextBlocks) cut at newlines into blocks growing to about
    CHUNK_CHARS characters. The first blocks are small: a log's new keys (edges, call shapes)
    come early, and a chunk with new ones is not counted in bulk."""
    grow = 1 / 16
    for whole in ((text,) if isinstance(text, str) else text):
        start = 0
        while start <= len(whole):
            end = whole.find("\n", start + max(1, int(CHUNK_CHARS * grow)))
            if end < 0:
                end = len(whole)
            yield whole[start:end]
            start, grow = end + 1, min(1, grow * 2)


def iter_chunks(text: Iterable[str]) -> Iterator[list[str]]:
    """Streamed lines in batches growing to CHUNK_LINES lines (small first, as iter_blocks)."""
    grow = 1 / 16
    it = iter(text)
    while True:
        batch = list(itertools.islice(it, max(1, int(CHUNK_LINES * grow))))
        if not batch:
            return
        yield batch
        grow = min(1, grow * 2)


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


def normalised_head(text_head: str) -> str:
    return "\n".join(body for _, body, _, _ in iter_lines(text_head[:HEAD_CHARS]) if body)


def detect_kind(text_head: str) -> str | None:
    """The artifact kind of a text, by its content (first 64 KiB), or None if unknown.

    Kinds with a parser: see ``PARSED_KINDS``; other kinds are recognised so ingest can say
    what a file is and that it is not parsed yet (chrome_trace).
    """
    head = normalised_head(text_head)
    for kind, sig in _SIGNATURES:
        if sig.search(head):
            return kind
    return None


def _parsers() -> dict[str, Callable[..., ParseResult]]:
    from ingest.parsers import (collect_env, deepspeed, failures, flight_recorder, megatron, nccl, nccl_ras, nsys_stats,
                                nvidia_smi, profiler_table, pyspy, torchtitan)
    return {
        "nccl": nccl.parse_nccl,
        "megatron": megatron.parse_megatron,
        "deepspeed": deepspeed.parse_deepspeed,
        "torchtitan": torchtitan.parse_torchtitan,
        "nvidia_smi_topo": nvidia_smi.parse_nvidia_smi_topo,
        "nvidia_smi_q": nvidia_smi.parse_nvidia_smi_q,
        "collect_env": collect_env.parse_collect_env,
        "failures": failures.parse_failures,
        "profiler_table": profiler_table.parse_profiler_table,
        "nsys_stats": nsys_stats.parse_nsys_stats,
        "flight_recorder": flight_recorder.parse_flight_recorder,
        "pyspy": pyspy.parse_pyspy,
        "nccl_ras": nccl_ras.parse_nccl_ras,
    }


def parse_text(text: str | Iterable[str], *, source: str, kind: str | None = None, fast: bool = True) -> ParseResult:
    """Detect (unless ``kind`` is given) and parse. Unknown or not-yet-parsed kinds return no
    records, every non-blank line unparsed and a warning saying so. Never raises on content.
    fast=False takes every line through the per-line path (same result, for tests)."""
    if kind is None:
        if not isinstance(text, str):
            raise TypeError("pass kind= when streaming text")
        kind = detect_kind(text[:HEAD_CHARS])
    parser = _parsers().get(kind or "")
    if parser is not None:
        return parser(text, source=source, fast=fast)
    return no_parser_result(run_parsers(text, [_Nothing(source)], kind=kind or "unknown", fast=fast))


def no_parser_result(result: ParseResult) -> ParseResult:
    """The result for a kind with no parser (``result``: its lines read by ``_Nothing``): no
    records, every non-blank line unparsed, one warning saying why."""
    kind = result.kind
    what = f"kind {kind!r} has no parser yet" if kind != "unknown" else "unknown kind (no known signature in the first 64 KiB)"
    return ParseResult(records=[], unparsed=result.unparsed, warnings=[what], kind=kind,
                       unparsed_lines=result.unparsed_lines, num_lines=result.num_lines)


class _Nothing(LineParser):
    hints = ()

    def feed(self, lineno, body, ts, rank) -> bool:
        return False


PARSED_KINDS = ("nccl", "megatron", "deepspeed", "torchtitan", "nvidia_smi_topo", "nvidia_smi_q",
                "collect_env", "failures", "profiler_table", "nsys_stats", "flight_recorder", "pyspy", "nccl_ras")


# ---------------------------------------------------------------- shards (ingest.sharded)

class _Unknown:
    """State a shard's parser would have taken from the lines before the shard (last step,
    last rank, memory label): not known until the shards before it are merged (``absorb``).
    Pickles as itself, so a worker's records come back holding this very object."""

    def __repr__(self) -> str:
        return "UNKNOWN"

    def __reduce__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()


class Soft:
    """A value ``setdefault`` put in a ``ShardRow``: the serial parse would have kept an
    earlier shard's value of that key instead."""

    __slots__ = ("value",)

    def __init__(self, value) -> None:
        self.value = value

    def __reduce__(self):
        return Soft, (self.value,)

    def __repr__(self) -> str:
        return f"Soft({self.value!r})"


class ShardRow(dict):
    """A step row made by a shard after the first. ``setdefault`` stores its value as ``Soft``
    and lists the key in ``soft``; plain assignments replace the value. Parsers only write
    rows while parsing, never read them."""

    __slots__ = ("soft",)

    def __init__(self, row: dict) -> None:
        super().__init__(row)
        self.soft: list = []

    def setdefault(self, key, default=None):
        if key in self:
            value = self[key]
            return value.value if type(value) is Soft else value
        self[key] = Soft(default)
        self.soft.append(key)
        return default


_ROW_KEYS = frozenset(("table", "source", "line", "kind", "rank", "step"))  # set when a row is made, never after


def merge_step_row(into: dict, later: dict, soft, into_soft: list | None = None) -> None:
    """Give ``into`` (a step row) the values that ``later``, the same (rank, step) row made by
    a later stretch of the log, was given: assigned values overwrite, those of the keys in
    ``soft`` (only setdefault filled them) only fill a missing key; the keys set when a row is
    made stay ``into``'s. into_soft: ``into``'s own setdefault-only keys, kept up to date
    (when ``into`` is itself a shard's row)."""
    for key, value in later.items():
        if key in _ROW_KEYS:
            continue
        if key in soft:
            if key not in into:
                into[key] = value
                if into_soft is not None:
                    into_soft.append(key)
        else:
            into[key] = value
            if into_soft and key in into_soft:
                into_soft.remove(key)


@dataclass(frozen=True, kw_only=True)
class ShardState:
    """A shard's reading before ``finish``: its parsers (records and carried state), its
    counts as ``Runner`` keeps them, the timestamp line left waiting at its end (None if none)
    and the number of its last line (blank ones included)."""

    parsers: list[LineParser]
    unparsed: int
    unparsed_lines: list[int]
    num_lines: int
    huge: int
    pending_ts: str | None
    last_lineno: int


# Kinds whose parsers merge across shards (every parser of the chain has at_rest/absorb); kinds
# with no parser (unknown, chrome_trace) too. The others are small files (tables, dumps) whose
# parsers carry a header or a section across the whole text: read serially.
SHARD_KINDS = ("nccl", "megatron", "deepspeed", "torchtitan", "failures")


def _chains() -> dict[str, Callable[[str], list[LineParser]]]:
    from ingest.parsers import deepspeed, failures, megatron, nccl, torchtitan
    return {"nccl": nccl.build_nccl_chain, "megatron": megatron.build_megatron_chain,
            "deepspeed": deepspeed.build_deepspeed_chain, "torchtitan": torchtitan.build_torchtitan_chain,
            "failures": failures.build_failures_chain}


def build_chain(kind: str, *, source: str) -> list[LineParser] | None:
    """The parser chain the parse function of ``kind`` runs (``[_Nothing]`` for a kind with
    no parser, e.g. "unknown"), or None when the kind's parsers cannot read shards."""
    if kind in SHARD_KINDS:
        return _chains()[kind](source)
    if kind not in PARSED_KINDS:
        return [_Nothing(source)]
    return None


def run_shard(text: str | TextBlocks, *, kind: str, source: str, first_lineno: int) -> ShardState:
    """Read one shard of a file (``text``: its lines; ``first_lineno``: the file's 1-based
    number of its first line) with a fresh chain of ``kind`` in shard start state. Pure;
    never raises on content. Raises ValueError for a kind ``build_chain`` has no chain for."""
    parsers = build_chain(kind, source=source)
    if parsers is None:
        raise ValueError(f"kind {kind!r} is not read in shards (SHARD_KINDS)")
    runner = Runner(parsers, kind=kind)
    runner.start_shard(first_lineno)
    for block in iter_blocks(text):
        runner.chunk_text(block)
    return runner.shard_state()
