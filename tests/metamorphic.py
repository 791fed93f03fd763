"""Metamorphic variants of a real log: the same content as another launcher, terminal, editor or
copy would have handed it over. tests/test_metamorphic.py requires each variant to give the facts
its original gives (benchmarks/real_logs.py grades both).

A family is a function ``text -> text`` (None: it does not apply, or changes nothing) and a
``Change``: what the family legitimately changes in the facts, as an adjustment of the facts the
variant is graded against (``adjust``) and of the text its outcome is compared with
(``reference``). Families: every launcher / logger prefix iter_lines strips, alone and stacked;
editor line numbers; ANSI colour; CRLF; hard wraps at 80 and 116 columns; tabs for the aligned
cells of tables and tabs expanded; thousands separators added to and dropped from table numbers;
a table's header or its rule lines removed; the last line cut in the middle; interleaving with
the lines of a fixture of another kind; gzip (``GZIP``: written compressed, read as ever).

Deliberately not here: grading (benchmarks/real_logs.py ``score_file``), parsing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

# Kinds read as whole documents (JSON): a launcher never prefixes them, a terminal never wraps them.
WHOLE_DOCUMENT_KINDS = frozenset({"chrome_trace"})
# Kinds printed as aligned tables: the header / rule families apply to them.
TABLE_KINDS = frozenset({"profiler_table", "nsys_stats", "nvidia_smi_topo", "nvidia_smi_q", "nccl_ras", "collect_env",
                         "deepspeed_tables", "flight_recorder"})
GZIP = "gzip"
INTERLEAVE = "interleave"


def _lines(text: str) -> tuple[list[str], bool]:
    """(lines, whether the text ends with a newline)."""
    ends = text.endswith("\n")
    return (text[:-1] if ends else text).split("\n"), ends


def _join(lines: list[str], ends: bool) -> str:
    return "\n".join(lines) + ("\n" if ends else "")


def per_line(fn: Callable[[int, str], str]) -> Callable[[str], str]:
    """A family that rewrites every line (1-based number, line) on its own."""
    def apply(text: str) -> str:
        lines, ends = _lines(text)
        return _join([fn(i, line) for i, line in enumerate(lines, 1)], ends)
    return apply


def _quoted(text: str) -> bool:
    """Whether a text is pasted as a '>' quote (its first non-blank lines all start with '>')."""
    heads = [line.lstrip(" ")[:1] for line in text.split("\n")[:40] if line.strip()]
    return len(heads) >= 3 and all(h == ">" for h in heads)


def prefixed(prefix: str) -> Callable[[str], str]:
    """Every line, blank ones too, behind ``prefix`` (as a launcher writes them); in a text pasted as a
    '>' quote, inside the quote marks (the launcher wrote the lines before anyone quoted them)."""
    def apply(text: str) -> str:
        if _quoted(text):
            return per_line(lambda i, line: "> " + prefix + line.lstrip(" ")[1:].removeprefix(" ")
                            if line.lstrip(" ")[:1] == ">" else prefix + line)(text)
        return per_line(lambda i, line: prefix + line)(text)
    return apply


def hard_wrap(width: int) -> Callable[[str], str | None]:
    """Lines longer than ``width`` cut into ``width``-character pieces (a terminal copy); trailing
    whitespace dropped first, as a terminal selection does."""
    def apply(text: str) -> str | None:
        lines, ends = _lines(text)
        out = []
        for line in lines:
            line = line.rstrip()
            out += [line[i:i + width] for i in range(0, len(line), width)] or [""]
        return _join(out, ends) if any(len(line.rstrip()) > width for line in lines) else None
    return apply


_CELL_GAP = re.compile(r"(?<=\S) {2,}(?=\S)")


def _table_row(line: str) -> bool:
    return len(_CELL_GAP.findall(line)) >= 2 and " NCCL " not in line


def spaces_to_tabs(text: str) -> str | None:
    """The gaps between aligned cells of table rows (2+ spaces between words, twice or more) as one tab."""
    out = per_line(lambda i, line: _CELL_GAP.sub("\t", line) if _table_row(line) else line)(text)
    return out if out != text else None


def tabs_to_spaces(text: str) -> str | None:
    return text.expandtabs(8) if "\t" in text else None


_PLAIN_INT = re.compile(r"(?<![\w.,:/\-])(\d{4,})(?![\w.,:/\-]|\.\d)")
# (not after ':' or '-', not before '-': a timestamp's ",123" milliseconds, a CPU list "0-55,112-167")
_GROUPED_INT = re.compile(r"(?<![\w.,:\-])(\d{1,3}(?:,\d{3})+)(?![\w,\-]|\.\d)")


def thousands_on(text: str) -> str | None:
    """Integers of 4+ digits in table rows written with thousands separators (1073741824 -> 1,073,741,824)."""
    out = per_line(lambda i, line: _PLAIN_INT.sub(lambda m: f"{int(m.group(1)):,}", line)
                   if _table_row(line) else line)(text)
    return out if out != text else None


def thousands_off(text: str) -> str | None:
    """Numbers printed with thousands separators written without (5,856 -> 5856)."""
    out = _GROUPED_INT.sub(lambda m: m.group(1).replace(",", ""), text)
    return out if out != text else None


_RULE = re.compile(r"\s*(?:[-=+|]\s*){3,}$")


def _names_only(line: str) -> bool:
    """Whether a line reads as names (a header or banner): a letter, and no word that starts with a digit
    (a value: '2.26.2', '0-47,96-143', '12:07:22')."""
    words = line.split()
    return any(c.isalpha() for c in line) and not any(w[0].isdigit() for w in words)


def no_header(text: str) -> str | None:
    """The first table's header or banner gone: the first non-blank line after any rule lines, and the
    rule lines right after it. None where that line holds a value (a data row, a version line, a
    bracket): it is no header."""
    lines, ends = _lines(text)
    i = next((i for i, line in enumerate(lines) if line.strip() and not _RULE.match(line)), None)
    if i is None or not _names_only(lines[i]):
        return None
    j = i + 1
    while j < len(lines) and _RULE.match(lines[j]):
        j += 1
    return _join(lines[:i] + lines[j:], ends)


def no_rules(text: str) -> str | None:
    """Every rule line (---- / ==== banners and separators) gone."""
    lines, ends = _lines(text)
    out = [line for line in lines if not (line.strip() and _RULE.match(line))]
    return _join(out, ends) if len(out) != len(lines) else None


def _last_line(lines: list[str]) -> int | None:
    return next((i for i in range(len(lines) - 1, -1, -1) if len(lines[i].strip()) >= 2), None)


def cut_mid_last_line(text: str) -> str | None:
    """The text ending in the middle of its last line (a partial copy, a crashed writer). None for a
    text of one line: nothing would be left to read the same."""
    lines, _ = _lines(text)
    i = _last_line(lines)
    if i is None or not any(line.strip() for line in lines[:i]):
        return None
    return "\n".join(lines[:i] + [lines[i][:len(lines[i]) // 2]])


def without_last_line(text: str) -> str:
    """The reference of cut_mid_last_line: the last line gone whole, the rest ending as it did."""
    lines, ends = _lines(text)
    i = _last_line(lines)
    return _join(lines[:i], True)


def crlf(text: str) -> str:
    return text.replace("\n", "\r\n")


def ansi(text: str) -> str:
    return per_line(lambda i, line: f"\x1b[32m{line}\x1b[0m" if line.strip() else line)(text)


def editor_bar(i: int, line: str) -> str:
    return f"{i + 40:>6} | {line}"  # an excerpt from line 41 of the file, as a viewer shows it


def interleave(text: str, other: str, every: int = 2) -> str:
    """The lines of ``other`` put one by one before every ``every``-th line of ``text`` that starts
    a record (not indented, not blank): two processes writing one stream. The rest of ``other``
    before the record that holds the last line of ``text``, which stays the stream's last (a copy
    cut short cuts the stream's last line, whoever wrote it)."""
    lines, ends = _lines(text)
    extra = [line for line in _lines(other)[0] if line.strip()]
    last = _last_line(lines)  # the rest goes before the record (not indented) the last line is in
    last = next((i for i in range(last, -1, -1) if lines[i][:1].strip()), last) if last is not None else None
    out, starts = [], 0
    for i, line in enumerate(lines):
        if i == last:
            out += extra
            extra = []
        if extra and line[:1].strip():
            starts += 1
            if starts % every == 0:
                out.append(extra.pop(0))
        out.append(line)
    return _join(out + extra, True)


@dataclass(frozen=True)
class Change:
    """What a family legitimately changes: ``adjust(facts) -> facts`` the variant is graded against;
    ``reference(text) -> text`` whose outcome the variant's must equal (default: the original),
    graded against ``reference_adjust(facts)``."""

    adjust: Callable[[dict], dict] | None = None
    reference: Callable[[str], str] | None = None
    reference_adjust: Callable[[dict], dict] | None = None  # the facts the reference is graded against


def _cut_facts(want: dict) -> dict:
    """A cut last line: one more unparsed line and a warning naming the cut."""
    return {**want, "max_unparsed": want.get("max_unparsed", 0) + 1, "warn": [*want.get("warn", []), "cut"]}


def _uncut_facts(want: dict) -> dict:
    return {**want, "warn": [w for w in want.get("warn", []) if w != "cut"]}


SAME = Change()

# name -> (text -> variant or None, what it changes, which kinds it applies to: None any line kind, or a set)
FAMILIES: dict[str, tuple[Callable[[str], str | None], Change, frozenset | None]] = {
    "rank": (prefixed("[rank0]:"), SAME, None),
    "default": (prefixed("[default0]:"), SAME, None),
    "openmpi": (prefixed("[1,0]<stdout>:"), SAME, None),
    "slurm": (prefixed("0: "), SAME, None),
    "slurm_wide": (prefixed(" 0: "), SAME, None),
    "torchx": (prefixed("trainer/0 [0]:"), SAME, None),
    "ray": (prefixed("(RayWorkerWrapper pid=626, ip=192.0.2.7) "), SAME, None),
    "iso_ts": (prefixed("2024-05-01 12:00:00,123 "), SAME, None),
    "bracket_ts": (prefixed("[2024-05-01 12:00:00] "), SAME, None),
    "zulu_ts": (prefixed("2024-12-04T05:27:45.082Z "), SAME, None),
    "stacked": (prefixed("0: [1,0]<stdout>:[rank0]:"), SAME, None),
    "ts_rank": (prefixed("2024-05-01T12:00:00.123456+00:00 [default0]:"), SAME, None),
    "editor": (per_line(editor_bar), SAME, None),
    "cat_n": (per_line(lambda i, line: f"{i:>6}\t{line}"), SAME, None),
    "ansi": (ansi, SAME, None),
    "crlf": (crlf, SAME, None),
    "wrap80": (hard_wrap(80), SAME, None),
    "wrap116": (hard_wrap(116), SAME, None),
    "tabs": (spaces_to_tabs, SAME, None),
    "untabs": (tabs_to_spaces, SAME, None),
    "thousands_on": (thousands_on, SAME, None),
    "thousands_off": (thousands_off, SAME, None),
    "no_header": (no_header, SAME, TABLE_KINDS),
    "no_rules": (no_rules, SAME, TABLE_KINDS),
    "cut": (cut_mid_last_line, Change(adjust=_cut_facts, reference=without_last_line, reference_adjust=_uncut_facts), None),
    GZIP: (lambda text: text, SAME, None),
    INTERLEAVE: (lambda text: None, SAME, None),  # built by the test: it needs the other fixture
}


def applies(family: str, kinds: set[str]) -> bool:
    """Whether a family applies to a text holding ``kinds``."""
    if family in (GZIP, "crlf"):
        return True
    if kinds & WHOLE_DOCUMENT_KINDS:
        return False
    only = FAMILIES[family][2]
    return only is None or bool(kinds & only)
