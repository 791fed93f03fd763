"""Pure parsers for third-party artifacts: text in, records + unparsed-line count out.

Shared here: ``ParseResult``, pattern-table rows (``Rule``: name, regex with named groups, table,
and per group the column, type and unit scale), the line normaliser (``iter_lines``: launcher and
logger prefixes, editor numbers, quotes, ANSI colour, redraws, hard wraps), ``detect_kind`` (the
whole-text formats, by content, never by file name) and ``run_parsers``, which routes each
normalised line to the ``LineParser``s whose gates claim it.
Records are plain dicts; ``record["table"]`` names the output table (steps, memory, timers,
comm_topology, collectives, events, env, kernels, stacks); each carries ``source`` and ``line``
(1-based, the first line for aggregated records). Detect + parse: ``ingest.parsers.dispatch``.
Deliberately not here: a second, faster copy of any rule (speed comes from one process per
file, ingest.thirdparty), opening files (ingest.io), writing tables, analysis.
"""
from __future__ import annotations

import collections
import functools
import re
import string
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from core.i18n import Message, N_  # a warning is a sentence the note prints: a catalogue message

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
    kinds: tuple[str, ...] = ()  # every kind whose parser recognised lines, most lines first


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


# A printed integer with or without thousands separators ("5856", "5,856"): every grammar that reads a
# count, size or step as text reads it with this, and to_int / to_num take the separators out.
INT = r"(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)"
NUM = rf"(?:{INT}(?:\.\d*)?|\.\d+)"  # the same with an optional fraction ("12,646", "12646.5", ".5")


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


_SIZE = re.compile(r"\s*([\d.,]+)\s*([KMGT]?i?B|bytes?)\s*", re.I)


@functools.lru_cache(maxsize=1 << 12)  # memory figures repeat from step to step
def to_gib(text: str) -> float:
    """'649.97 MiB' / '1.01 GiB' / '0.26GB' / '0 bytes' -> GiB (GB taken as GiB, as PyTorch/DeepSpeed
    print them)."""
    return read_scaled(text, _SIZE, lambda unit: BINARY[unit.upper()[:-1].rstrip("I").replace("BYTE", "")] / 2**30)


def slug(text: str) -> str:
    """A printed name as a column or key: 'Params norm (x)' -> 'params_norm_x'."""
    return re.sub(r"[^0-9a-z]+", "_", text.lower()).strip("_")


CELLS = re.compile(r"\s{2,}|\t")  # the cell separator of tables printed with aligned columns (or tabs)
RULE_LINE = rule("rule_line", r"-{3,}(?:\s+-+)*$", None)  # dashes under a table header (the last cut short by a wrap)


# ---------------------------------------------------------------- line normaliser

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-_]")
_TS = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
# Launcher and logger prefixes as they stack ("0: [80746] [rank0]:"). Fields: r, a rank (repeated
# groups keep their last match: the innermost prefix's rank wins), t1/t2, a timestamp. Left for the
# parsers that read them: DeepSpeed's "[ts] [LEVEL] [file.py:N:fn]" header, Python logging's
# "ts - name - LEVEL - " (torchtitan), glog "I0323 hh:mm:ss.us tid file:N]" and "[E file.cpp:N]" (failures).
_NUM = r"[-+]?\d[\d.,:]*(?:[eE][-+]?\d+)?%?"
_NUMS = rf"\s*{_NUM}(?:\s+{_NUM})*\s*"  # a row of numbers only (blank-separated: no backtracking)
_PREFIX = re.compile(
    r"(?:\s+"
    r"|(?:\[(?:rank|default|\d+,)|(?=\d{1,5}:(?: |$)))(?P<r>\d+)"  # [rankN]: [defaultN]: [job,N]<stdout>: Slurm "N: "
    rf"(?:\]:|\]<std(?:out|err)>:|:(?: (?!{_NUMS}$)|$))"  # (Slurm: a row of numbers only is no log line)
    r"|\[\d+\] "
    rf"|\[(?P<t1>{_TS})\](?: (?!\[[A-Z]+\] \[)|$)"
    rf"|(?P<t2>{_TS})\s(?!\s*-\s\w+ - [A-Z]+ - )"  # (Python logging's "ts - name - LEVEL - msg": torchtitan reads it)
    r"|[\w.\-]+/\d+ \[\d+\]:"  # TorchX "trainer/0 [0]:"
    r"|\(\w+ pid=\d+(?:, ip=[^)]*)?\)(?: |$)"  # Ray
    r"|`{3}[\w+\-]*$|`{1,3}(?=\S)"  # Markdown residue of a paste: a code fence, a stray backtick
    r"|\[\d{1,3}(?:;\d{1,3})*m(?=\s|$)"  # an ANSI colour code whose ESC byte a paste lost ("[0m ")
    r")+"
)
# A tqdm bar ("desc: 6%|██ | 32040/500150 [6:28:43<94:39:17, 1.37it/s, loss=2.6]", tqdm's format_meter)
# with another line glued after it: the bar's redraw had no newline; the glued line is the record
_BAR = re.compile(r"\d+%(?:\|[^|]*\||\s)\s*[\d.]+[kMG]?/[\d.?]+[kMG]? \[[\d:?]+<[\d:?]+,[^\]]*\](?=\S)")
_PREFIX_START = frozenset(" \t[(0123456789`")
_SLURM, _SLURM_START = re.compile(r"\s*(\d{1,5}): "), frozenset(" \t0123456789")
_ISO_TS = re.compile(_TS)
# Editor or viewer line numbers ("  12 | ", "12: ", cat -n's "    12\t"), stripped only from a text
# whose first lines are all numbered consecutively (a Slurm label repeats; an editor's number counts).
_EDITOR = re.compile(r"[ \t]*(\d{1,7})(?:(?P<tab>\t)|[ \t]*(?P<bar>[|\u2502\u2192])(?: |$)|:(?: |$)|$)")  # (cat -n's tab first:
# a numbered Markdown table row keeps its own leading '|')
_EDITOR_SAMPLE = 40
# Terminal widths a pasted log is hard-wrapped at; a block whose longest line has one of these lengths
# has its lines of exactly that length joined with the next line unless that one starts a record.
WRAP_WIDTHS = frozenset((80, 100, 110, 116, 120, 128, 132, 140, 150, 160, 180, 200, 220, 240, 250, 256))
_RECORD_START = re.compile(
    r"\s*(?:Traceback \(|File \"|[EWIF]\d{4} \d\d:|\[[EWIF]\d* |\[(?:rank|default)\d+\]:|\[\d+,\d+\]<std|\[?"
    + _TS + r"|[\w.\-]+:\d+:\d+ \[\d+\] |\(\w+ pid=\d+|\d{1,5}: )")


_CLASSES = str.maketrans("0123456789" + string.ascii_letters, "0" * 10 + "a" * 52)


def _shape(text: str, width: int = 8) -> str:
    """A line's start as character classes ('host-a:17' -> 'aaaa-a:00'), to compare record heads."""
    return text[:width].translate(_CLASSES)


_NUMBER_RUN, _WORD_RUN = re.compile(r"0[0.,]*"), re.compile(r"a+")


def _words_shape(text: str) -> list[str]:
    """A line's first two words as character classes, a number or a word one class ('iteration  122/'
    -> ['a', '0/']; 'iteration (ms):' -> ['a', '(a):']; '3,201,638' -> '0'): a wrap cut just before a
    word that repeats the line's first word is told from the next record."""
    return [_WORD_RUN.sub("a", _NUMBER_RUN.sub("0", w.translate(_CLASSES))) for w in text.split(None, 2)[:2]]


def _unprefixed(line: str) -> str:
    """``line`` without a launcher or logger prefix (indentation alone is kept: it is the line's shape)."""
    m = _PREFIX.match(line)
    return line[m.end():] if m and not m.group(0).isspace() else line


_FRAME = re.compile(r'\s*File "')
_BARE_PREFIX = re.compile(r"\[\d+\] |\d{1,5}: ")


def _starts_record(head: str, nxt: str, rows: bool = True) -> bool:
    """Whether ``nxt``, the line after one of exactly the wrap width that began with ``head``, is a
    record by itself: blank, headed like ``head``, a launcher prefix, timestamp, NCCL/glog header or
    traceback start, a traceback's source line under its frame; and where the block's lines of
    the width are table rows (``rows``, ``_rows_at_width``), an indented line after an indented one."""
    stripped = nxt.lstrip()
    if not stripped:
        return True
    raw_head = head
    head, body = _unprefixed(head), _unprefixed(nxt)
    # (a piece that ends between cells, where the block's full-width lines are not padded rows, is cut
    # there: what follows is the rest of its row, however like the row's start it looks)
    if rows or head[-2:] != "  " or head is not raw_head:  # (a padded head with a launcher prefix: compared too)
        a, b = _shape(head, 16), _shape(body, 16)  # (the same first 16: no need to look at the words)
        if a[:8] == b[:8] and (a == b or _words_shape(head) == _words_shape(body)):
            return True
    if len(stripped) < len(nxt) - 1 and (rows and raw_head[:1] in " \t" or _FRAME.match(raw_head)):  # (one blank: a cut at a word boundary)
        return True
    m = _PREFIX.match(nxt)  # a launcher or logger prefix of its own ('[N] ' or 'N: ' only after a line with one:
    if m and m.end() and not m.group(0).isspace():  # NCCL's "Trees [0] 1/-1/-1->0->-1 [1] ..." cut before a '[1] ')
        if not _BARE_PREFIX.fullmatch(m.group(0).lstrip()) or (h := _PREFIX.match(raw_head)) and not h.group(0).isspace():
            return True
    # (a head that is one word, a host name cut short, goes on whatever the rest looks like: 'host:pid:tid [d] ')
    return _RECORD_START.match(nxt) is not None and " " in head.strip()


def _rows_at_width(lines: list[str], width: int) -> bool:
    """Whether a block's lines of exactly ``width`` are table rows as wide as it, not pieces of wrapped
    lines: at least two of them, indented (2+ blanks), are followed by another line of the width
    indented as they are (a wrapped line's full pieces are followed by the rest of their line,
    which starts where the cut fell)."""
    pairs = 0
    for a, b in zip(lines, lines[1:]):
        if len(a) == width == len(b) and a[:2].isspace() and b[:2].isspace() and not (a.isspace() or b.isspace()):
            pairs += 1
            if pairs >= 2:
                return True
    return False


def _editor_numbered(lines: list[str]) -> bool:
    """Whether the first lines of a text all carry consecutive editor line numbers: at least 3, or 2
    in cat -n's or a viewer's form (a tab or a bar after the number; 'N: ' is also a Slurm label)."""
    first, count, marked = None, 0, True
    for i, raw in enumerate(lines[:_EDITOR_SAMPLE]):
        if not raw.strip():
            continue
        m = _EDITOR.match(raw)
        if m is None:
            return False
        n = int(m.group(1)) - i
        if first is None:
            first = n
        if n != first or n + i < 1:
            return False
        count += 1
        marked = marked and (m.group("tab") or m.group("bar")) is not None
    return count >= 3 or count == 2 and marked


_QUOTE = re.compile(r"> ?")


def _quoted(lines: list[str]) -> bool:
    """Whether a text is pasted as a quote: its first non-blank lines (at least 3 of the first 40)
    all start with '>' (Markdown / e-mail quoting; a lone '>' is a quoted blank line)."""
    heads = [raw.lstrip(" ")[:1] for raw in lines[:_EDITOR_SAMPLE] if raw.strip()]
    return len(heads) >= 3 and all(h == ">" for h in heads)


class TextBlocks:
    """Blocks of whole lines joined by newlines (``ingest.io.iter_text_blocks``). iter_lines sets
    num_lines (the last non-blank line's number) and cut_line (a last line the input ends inside)."""

    def __init__(self, blocks: Iterable[str]) -> None:
        self.blocks = blocks
        self.ends_cut = False  # set by the reader before its last block when the input ends inside a line
        self.num_lines = 0
        self.last_start = 0  # the first line of the last line yielded (a rejoined wrap spans more)
        self.cut_line: int | None = None

    def __iter__(self) -> Iterator[str]:
        return iter(self.blocks)


def _clean(raw: str) -> str:
    """ANSI colour codes out; of a line redrawn with ``\\r`` (a progress bar, CRLF), the last text."""
    if "\x1b" in raw:
        raw = _ANSI.sub("", raw)
    if "\r" in raw:
        raw = raw.rstrip("\r")
        raw = raw[raw.rfind("\r") + 1:]
    return raw


def _joined(lines: list[str], lineno: int, width: int, held: list, spans: dict) -> Iterator[tuple[int, str]]:
    """``(first lineno, line)`` with hard-wrapped lines rejoined: a line of exactly ``width``
    characters takes the next one unless that one starts a record (``_starts_record``); where the
    block's lines of the width are table rows (``_rows_at_width``), one indented like them or padded
    with blanks to the width is a row, not a wrap. ``held`` ([first lineno, text or None, its width, rows]) carries a
    line across blocks; ``spans``: first lineno -> last lineno of each joined line."""
    rows = _rows_at_width(lines, width) if width else held[3]
    # a line padded with blanks to the width is a wrap's piece only where wrapping shows (2+ lines of the width)
    padded_wraps = not rows and width > 0 and sum(len(line) == width for line in lines) >= 2
    for raw in lines:
        if held[1] is not None:
            # (no piece is longer than the width; a piece of blanks as wide as it is a bar's padding, not a blank line)
            if len(raw) <= held[2] and (len(raw) == held[2] and raw.isspace() or not _starts_record(held[1], raw, held[3])):
                held[1] += raw
                spans[held[0]] = lineno
                lineno += 1
                if len(raw) != held[2]:
                    yield held[0], held[1]
                    held[1] = None
                continue
            yield held[0], held[1]
            held[1] = None
        # (a tab: the line's width on a terminal is not its length, so a length equal to the width is chance)
        if len(raw) == width and "\t" not in raw and (padded_wraps or raw[-2:] != "  ") and not (rows and raw[:2].isspace()):
            held[0], held[1], held[2], held[3] = lineno, raw, width, rows
        else:
            yield lineno, raw
        lineno += 1


def _physical_lines(blocks: TextBlocks, cut: bool, spans: dict) -> Iterator[Iterable[tuple[int, str]]]:
    """Per block, its ``(lineno, line)`` pairs: cleaned (``_clean``), editor numbers and quote marks stripped,
    hard wraps rejoined (``_joined``); a cut last line withheld (``iter_lines``)."""
    lineno, numbered, quoted, held = 0, None, None, [0, None, 0, True]
    for block in blocks:
        lines = block.split("\n")
        if cut and blocks.ends_cut and lines[-1].strip():  # cut: withhold a last line the input ends inside
            blocks.cut_line = lineno + len(lines)
            lines.pop()
        if "\x1b" in block or "\r" in block:
            lines = [_clean(raw) for raw in lines]
        if numbered is None:
            numbered = _editor_numbered(lines)
        if numbered:
            lines = [raw[m.end():] if (m := _EDITOR.match(raw)) else raw for raw in lines]
        if quoted is None:
            quoted = _quoted(lines)
        if quoted:
            lines = [raw.lstrip(" ")[1:].removeprefix(" ") if raw.lstrip(" ")[:1] == ">" else raw for raw in lines]
        width = max(map(len, lines)) if len(lines) > 1 else 0
        if width in WRAP_WIDTHS or held[1] is not None:
            yield _joined(lines, lineno + 1, width if width in WRAP_WIDTHS else 0, held, spans)
        else:
            yield enumerate(lines, lineno + 1)
        lineno += len(lines)
    if held[1] is not None:  # the input ends with a line of exactly the wrap width
        yield ((held[0], held[1]),)


def iter_lines(text: str | Iterable[str], *, cut: bool = False
               ) -> Iterator[tuple[int, str | None, str | None, int | None]]:
    """``(lineno, body, timestamp, rank)`` per non-blank line of a string, a ``TextBlocks`` or an
    iterable of lines, normalised: ANSI colour codes, the text a ``\\r`` redraw overwrote, editor
    line numbers (a text numbered consecutively from its first line), quote marks (a text pasted as a
    '>' quote), launcher and logger prefixes
    in any stack (``_PREFIX``: rank from ``[rankN]:`` / ``[defaultN]:`` / ``[job,N]<stdout>:`` /
    Slurm ``N: `` / TorchX ``role/i [N]:``, the innermost one winning; timestamp from a leading ISO
    or bracketed ISO one), indentation and trailing whitespace removed; lines hard-wrapped at a
    terminal width (``WRAP_WIDTHS``) rejoined, lineno the first's. timestamp also: an ISO timestamp
    alone on the line before (consumed, not yielded, as CloudWatch prints them). A line longer than
    MAX_LINE_CHARS comes with body None, unread. cut: a last line the input ends inside
    (``TextBlocks.ends_cut``) is withheld, its number in cut_line."""
    blocks = text if isinstance(text, TextBlocks) else TextBlocks([text] if isinstance(text, str) else text)
    pending_ts, last, prefix, iso, starts, spans = None, 0, _PREFIX.match, _ISO_TS.fullmatch, _PREFIX_START, {}
    labels: set[str] = set()  # the Slurm labels ("0: ") seen on log lines: a row of numbers behind one is labelled too
    for numbered_lines in _physical_lines(blocks, cut, spans):
        for n, raw in numbered_lines:
            if len(raw) > MAX_LINE_CHARS:
                last = n
                yield n, None, None, None
                continue
            line = raw.rstrip()
            if not line:
                continue
            if "\t" in line:  # a tab is a gap between cells or words: read as the 2+ spaces the grammars split on
                line = line.replace("\t", "  ")
            rank = ts = None
            if line[0] in starts or line.find("/", 0, 40) >= 0:
                m = prefix(line)
                if labels and (m is None or m.group("r") is None) and (sm := _SLURM.match(line)) and sm.group(0) in labels:
                    # a row of numbers behind a Slurm label this text's log lines carry: the label, not a cell
                    rank, line = int(sm.group(1)), line[sm.end():].lstrip()
                    m = prefix(line) if line else None
                    if not line:
                        continue
                if m:
                    if m.lastindex:
                        r = m.group("r")
                        rank, ts = int(r) if r else None, m.group("t1") or m.group("t2")
                        if r and line[0] in _SLURM_START and (sm := _SLURM.match(line)) and sm.end() <= m.end():
                            labels.add(sm.group(0))
                    line = line[m.end():]
                    if not line:
                        continue
            if "%" in line and "<" in line and (m := _BAR.search(line)):  # (tqdm: "[elapsed<remaining")
                line = line[m.end():]
            last = n
            if line[0].isdigit() and len(line) <= 35 and iso(line) is not None:
                pending_ts = line
                continue
            yield n, line, ts or pending_ts, rank
            pending_ts = None
    blocks.num_lines, blocks.last_start = blocks.cut_line or spans.get(last, last), last


class LineParser:
    """Base of the stateful per-format scanners: ``feed`` a normalised line, return whether
    it was recognised; ``finish`` flushes state. Records go to ``self.records``."""

    kind = ""
    # gate: a line it takes while not busy starts with one of these regexes or holds one of these strings
    gate: tuple[re.Pattern | str, ...] | None = None  # None: any line may be its
    busy = False  # inside a block of lines its gate does not describe
    # fallback(lineno, body, ts, rank) -> bool: offered a line no parser of the chain recognised that
    # passed this parser's gate or its fallback_gate (a logger's own format around messages other
    # parsers read; a message whose prefix was stripped); or None
    fallback: Callable[[int, str, str | None, int | None], bool] | None = None
    fallback_gate: tuple[re.Pattern | str, ...] = ()
    open_line: int | None = None  # a line it took that leaves its record or block open: cut if the text ends there

    def __init__(self, source: str) -> None:
        self.source = source
        self.records: list[dict] = []
        self.warnings: list[str] = []

    def feed(self, lineno: int, body: str, ts: str | None, rank: int | None) -> bool:
        return False  # the base recognises no line: a kind without a parser (dispatch)

    FOREIGN_LINES = 2  # a block goes on across this many lines in a row that are not its
    _misses = 0

    def block_goes_on(self, read: bool) -> bool:
        """After a line inside a block: whether the block goes on. It does after a line it read, and
        across up to FOREIGN_LINES lines in a row it did not (another process's, written into it)."""
        self._misses = 0 if read else self._misses + 1
        return self._misses <= self.FOREIGN_LINES

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


def _claim(gate: tuple | None) -> Callable[[str], object] | None:
    """A parser's gate as one test of a line: its regexes matched at the start (one alternation),
    its literals searched anywhere. None: the parser is offered every line."""
    if gate is None:
        return None
    cached = _CLAIMS.get(id(gate))
    if cached is not None and cached[0] is gate:
        return cached[1]
    regexes = [g for g in gate if not isinstance(g, str)]
    starts = join_regexes(regexes) if regexes else None  # (an empty alternation would match every line)
    lits = [g for g in gate if isinstance(g, str)]
    holds = re.compile("|".join(re.escape(g) for g in lits)).search if lits else None
    if starts is None and regexes:  # a regex that cannot be joined: each tried in turn
        matches = [g.match for g in regexes]
        start = lambda body: any(m(body) for m in matches)  # noqa: E731
    else:
        start = starts.match if starts is not None else None
    claim = (lambda body: start(body) or holds(body)) if start and holds else start or holds or (lambda body: False)
    _CLAIMS[id(gate)] = (gate, claim)
    return claim


_CLAIMS: dict[int, tuple] = {}  # id(gate) -> (the gate, kept so its id is not reused; its claim)


def _memo(test: Callable[[str], object], size: int = 4096) -> Callable[[str], bool]:
    """``test`` with its answers kept for the last distinct ``size`` texts (cleared when full)."""
    seen: dict[str, bool] = {}

    def memo(text: str) -> bool:
        hit = seen.get(text)
        if hit is None:
            if len(seen) >= size:
                seen.clear()
            hit = seen[text] = bool(test(text))
        return hit
    return memo


@functools.lru_cache(maxsize=64)
def _chain_gate(classes: tuple[type, ...]) -> Callable[[str], object] | None:
    """Whether any parser of a chain (its classes) may take a line: the union of their gates and
    fallback gates; None when one has no gate (every line may be its)."""
    if any(cls.gate is None for cls in classes):
        return None
    return _claim(tuple(g for cls in classes for g in (*cls.gate, *cls.fallback_gate)))


# Too many unclaimed lines to leave to the unparsed count alone: a warning names them (no silent loss).
UNCLAIMED_WARN_FRACTION = 0.5
UNCLAIMED_WARN_MIN_LINES = 5


def run_parsers(text: str | Iterable[str], parsers: list[LineParser], *, kind: str | None = None) -> ParseResult:
    """Route every normalised line of ``text`` (``iter_lines``) to the parsers that claim it: first
    to those inside a block (``busy``), then, in chain order, to each parser whose ``gate`` passes
    (a parser without a gate is offered every line); the first that recognises it wins; a line none
    recognises goes to each parser's ``fallback``. Count the unparsed lines. A parser that raises
    ValueError, IndexError, KeyError or OverflowError on a line leaves it unparsed with a warning.
    kinds: the kinds whose parsers recognised lines and made records (when none made any: that
    recognised lines), most lines first; kind: ``kind`` when given, else the first of
    ``KIND_PRIORITY`` among kinds ("unknown" when no line was recognised)."""
    blocks = text if isinstance(text, TextBlocks) else TextBlocks([text] if isinstance(text, str) else text)
    feeds, claims, warnings = [p.feed for p in parsers], [_claim(p.gate) for p in parsers], parsers[0].warnings
    order = list(zip(range(len(parsers)), claims, feeds))
    fallbacks = [(i, p.fallback) for i, p in enumerate(parsers) if p.fallback is not None]
    hits, last_read = [0] * len(parsers), [(0, "")] * len(parsers)
    unparsed, linenos, huge, num_bodies = 0, [], 0, 0
    # the chain's gate: a line no parser's gate passes goes unread unless a parser is inside a block
    gate = _chain_gate(tuple(type(p) for p in parsers))
    if gate is not None:  # a pure test of the text, and logs repeat their lines (noise above all): memoised
        gate = _memo(gate)
    stateful = [type(p).busy is not LineParser.busy for p in parsers]
    watch: dict[int, LineParser] = {}  # the stateful parsers fed since they were last seen outside a block
    got, body, lineno, noise = 0, None, 0, 0.0
    recent: collections.deque[str] = collections.deque(maxlen=32)  # the last lines read
    for lineno, body, ts, rank in iter_lines(blocks, cut=True):
        noise, got = noise * 0.875 + (got < 0), -1  # ~ unread lines among the last 8
        if body is None:
            huge += 1
        else:
            num_bodies += 1
            try:
                tried = None
                if watch:  # a parser only enters a block when fed: only those fed since need asking
                    for i in sorted(watch):
                        if watch[i].busy:
                            if feeds[i](lineno, body, ts, rank):
                                got = i
                                break
                            tried = (tried or set()) | {i}
                        else:
                            del watch[i]
                # the chain's gate (any parser's gate passes) first where lines nobody reads are
                # frequent (noise), else straight to the parsers' own gates: the same lines reach them
                if got < 0 and (noise < 0.5 or gate is None or gate(body)):
                    for i, claim, feed in order:
                        if (claim is None or claim(body)) and (tried is None or i not in tried):
                            if stateful[i]:
                                watch[i] = parsers[i]
                            if feed(lineno, body, ts, rank):
                                got = i
                                break
                    else:  # no parser recognised it: the fallbacks (offered only lines the chain's gate passed)
                        if noise >= 0.5 or gate is None or gate(body):
                            for i, fallback in fallbacks:
                                if stateful[i]:
                                    watch[i] = parsers[i]
                                if fallback(lineno, body, ts, rank):
                                    got = i
                                    break
            except (ValueError, IndexError, KeyError, OverflowError) as e:
                warnings.append(Message(N_("line %(line)s: not understood (%(error)s)"), line=lineno, error=type(e).__name__))
                got = -1
        if got >= 0:
            hits[got] += 1
            last_read[got] = (lineno, body)
            recent.append(body)
        else:
            unparsed += 1
            if len(linenos) < MAX_UNPARSED_LINENOS:
                linenos.append(lineno)
    # cut by whoever copied the file (a paste, an excerpt): a record or block a parser leaves open at
    # the end of its log (the last line it read: its log may be interleaved with others); the last
    # line of a log opening more brackets than it closes; a last line that starts as a line read
    # before it but is not read, or is read and much shorter (_looks_cut)
    opened = {p.open_line for p, (n, _) in zip(parsers, last_read) if p.open_line is not None and p.open_line >= n}
    last = bool(body) and not blocks.cut_line and lineno == blocks.last_start
    looks = last and (lineno in opened or _looks_cut(body, got >= 0, recent))
    opened |= {n for n, b in (*last_read, (lineno, body or "")) if sum(map(b.count, "([{")) > sum(map(b.count, ")]}"))}
    left_open, cut_short = last and lineno in opened, looks or last and lineno in opened
    named = {lineno} if looks and got < 0 else set()  # named in a warning below, not counted unparsed
    named |= opened & set(linenos) - {lineno}
    unparsed, linenos = unparsed - len(named), [n for n in linenos if n not in named]
    if blocks.cut_line:  # a file that ends inside a line was cut (a crashed writer, a partial copy)
        unparsed += 1
        if len(linenos) < MAX_UNPARSED_LINENOS:
            linenos.append(blocks.cut_line)
        warnings.append(Message(N_("line %(line)s: cut (the file ends without a newline); not used"), line=blocks.cut_line))
    records, warnings = [], []
    for p in parsers:
        p.finish()
        records.extend(p.records)
        warnings.extend(p.warnings)
    if huge:
        warnings.append(Message(N_("%(num)s line(s) longer than %(max)s characters skipped"), num=huge, max=MAX_LINE_CHARS))
    by_kind: dict[str, int] = {}  # kinds whose parsers made records (else: that recognised lines)
    with_records = any(p.records for p, n in zip(parsers, hits) if n)
    for p, n in zip(parsers, hits):
        if n and (p.records or not with_records):
            by_kind[p.kind or "unknown"] = by_kind.get(p.kind or "unknown", 0) + n
    kinds = tuple(sorted(by_kind, key=lambda k: -by_kind[k]))
    claimed = sum(hits)
    if kind is None:
        kind = next((k for k in KIND_PRIORITY if k in by_kind), kinds[0] if kinds else "unknown")
        if not claimed and num_bodies:
            warnings.append(Message(N_("unknown kind: none of %(num)s lines is in a format the parsers know"), num=num_bodies))
    if cut_short:
        why = (N_("line %(line)s: the last line leaves a record, block or bracket open: the file may be cut (truncated) there")
               if left_open else N_("line %(line)s: the last line starts as a line before it but is shorter: the file may be "
                                    "cut (truncated) there") if got >= 0 else N_("line %(line)s: the last line starts as a "
                                    "line before it but is not read: the file may be cut (truncated) there"))
        warnings.append(Message(why, line=lineno))
    warnings += [Message(N_("line %(line)s: a record or block its log ends inside: the log may be cut (truncated) there"),
                         line=n) for n in sorted(opened - {lineno, None})]
    if claimed and unparsed >= UNCLAIMED_WARN_MIN_LINES and unparsed > UNCLAIMED_WARN_FRACTION * (claimed + unparsed):
        warnings.append(Message(N_("%(num)s of %(total)s lines not recognised by any parser (first at line %(line)s); see the "
                                   "unparsed line numbers"), num=unparsed, total=claimed + unparsed, line=linenos[0]))
    return ParseResult(records=records, unparsed=unparsed, warnings=warnings, kind=kind,
                       unparsed_lines=tuple(linenos), num_lines=blocks.num_lines, kinds=kinds)


def _looks_cut(last: str, was_read: bool, recent: Iterable[str]) -> bool:
    """Whether a text's last line looks cut short: not read, it starts as a line read before it (the
    same character classes in its first 16 characters, or a prefix of them); read, it is the same
    message as a line read before it (the same classes over its first 72 characters) but shorter
    than 3/4 of that line."""
    if not was_read:
        shape = _head_shape(last)
        return any(_head_shape(ref) == shape or len(last) < 16 and _head_shape(ref).startswith(shape) for ref in recent)
    n = min(72, len(last))
    shape = _shape(last, n)
    ref = next((r for r in reversed(list(recent)[:-1]) if _shape(r, n) == shape), None)
    return ref is not None and len(last) < 0.75 * len(ref)


def _head_shape(body: str) -> str:
    """A line's first 16 characters as character classes ('host-a:17' -> 'aaaa-a:00')."""
    return _shape(body, 16)


# A file's kind (its primary kind, for naming a run): the first of these its lines hold. Training
# logs first (they carry the steps), then tables and reports, then the lines found inside others.
KIND_PRIORITY = ("megatron", "torchtitan", "deepspeed", "nanogpt", "hf_trainer", "nccl_ras", "nsys_stats", "profiler_table", "pyspy",
                 "flight_recorder", "nccl", "nvidia_smi_topo", "nvidia_smi_q", "collect_env", "failures")


# ---------------------------------------------------------------- detection

# Whole-text formats, found by their signature in the normalised head (every other kind is a
# property of lines: ingest.parsers.dispatch routes each line to the parsers that claim it).
_SIGNATURES: tuple[tuple[str, re.Pattern], ...] = tuple((k, re.compile(p, re.M)) for k, p in (
    ("chrome_trace", r'"ph":\s*"[A-Za-z]"'),
    ("flight_recorder", r"[\"']pg_config[\"']\s*:|[\"']entries[\"']\s*:\s*\["),
    ("nvidia_smi_q", r"=+NVSMI LOG=+"),
))

HEAD_CHARS = 64 * 1024


def detect_kind(text_head: str) -> str | None:
    """The whole-text format of a text by its content (first HEAD_CHARS): chrome_trace,
    flight_recorder or nvidia_smi_q; None for a text read line by line."""
    head = "\n".join(body for _, body, _, _ in iter_lines(text_head[:HEAD_CHARS]) if body)
    for kind, sig in _SIGNATURES:
        if sig.search(head):
            return kind
    return None
