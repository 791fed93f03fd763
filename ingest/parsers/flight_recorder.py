"""A printed (unpickled) PyTorch flight-recorder dump: a Python dict literal, not JSON.

``{"version": "2.5", "pg_config": {...}, "pg_status": {...}, "entries": [{...}, ...]}`` with
tuples, ``None`` or JSON's ``null``/``true``/``false``, and ``...`` where a paste elided entries.
Read with ``ast`` (nothing is executed) after the line normaliser. A truncated dump is cut after
its last complete element and the open brackets closed (with a warning).

Records: ``collectives`` (per entry: ENTRY_FIELDS, TEXT_FIELDS as text, ``pg``/``pg_desc``,
``collective`` (profiling_name without ``nccl:``), ``num_frames``, ``top_frame``), ``events``
(``fr_pg_status``: a process group's last enqueued/started/completed ids; ``fr_pg_config``: its
ranks). Lines outside the dict are unparsed. Deliberately not here: blaming a rank (ingest.hangs).
"""
from __future__ import annotations

import ast
import io
import tokenize
from typing import Iterable

from ingest.parsers import MAX_LINE_CHARS, MAX_UNPARSED_LINENOS, Message, N_, ParseResult, iter_lines

_NAMES = {"null": None, "None": None, "true": True, "True": True, "false": False, "False": False}
_OPEN, _CLOSE = "([{", ")]}"
MAX_REPAIR_TRIES = 20

# Entry key -> (column, scale): copied as-is under its own name unless renamed and scaled here.
_SCALED = {"duration_ms": ("duration_s", 1e-3), "timeout_ms": ("timeout_s", 1e-3)}
ENTRY_FIELDS = {key: _SCALED.get(key, (key, None)) for key in (
    "pg_id", "record_id", "collective_seq_id", "p2p_seq_id", "op_id", "profiling_name", "state", "time_created_ns",
    "time_discovered_started_ns", "time_discovered_completed_ns", "duration_ms", "timeout_ms", "is_p2p", "retired")}
TEXT_FIELDS = ("input_sizes", "output_sizes", "input_dtypes", "output_dtypes")


class _Literals(ast.NodeTransformer):
    """JSON's null/true/false (and Python's names) -> constants, so literal_eval accepts them."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in _NAMES:
            return ast.copy_location(ast.Constant(_NAMES[node.id]), node)
        return node


def _value(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _dict_items(node: ast.AST) -> dict:
    """An ast.Dict -> {key: value node} (keys that are not literals are skipped)."""
    if not isinstance(node, ast.Dict):
        return {}
    out = {}
    for k, v in zip(node.keys, node.values):
        key = _value(k) if k is not None else None
        if isinstance(key, (str, int)):
            out[key] = v
    return out


def _scan(text: str) -> tuple[int | None, list[tuple[int, int, str]]]:
    """Tokenize the literal: (end row of the outermost dict if it closes, else None; the safe
    cuts in order: (row, col) after a ',' or an opening bracket, and the closers the cut needs)."""
    stack: list[str] = []
    cuts = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.ERRORTOKEN and not tok.string.isspace():
                break
            if tok.type != tokenize.OP:
                continue
            s = tok.string
            if s in _OPEN:
                stack.append(_CLOSE[_OPEN.index(s)])
            elif s in _CLOSE:
                if not stack or stack[-1] != s:
                    break
                stack.pop()
                if not stack:
                    return tok.end[0], []
                continue
            elif s != "," or not stack:
                continue
            cuts.append((*tok.end, "".join(reversed(stack))))
    except (tokenize.TokenError, SyntaxError, IndentationError, ValueError):
        pass
    return None, cuts


def _parse_literal(lines: list[str]) -> tuple[ast.AST | None, int, bool]:
    """(root node, number of lines it spans, truncated?) of the dict literal in ``lines``; a
    truncated one is cut after its last element that parses, the open brackets closed."""
    end_row, cuts = _scan("\n".join(lines))
    # a closed dict is tried whole (_scan gives no cuts then), else the cuts from the last
    tries = [(end_row, len(lines[end_row - 1]), "")] if end_row is not None else cuts[::-1][:MAX_REPAIR_TRIES]
    for row, col, closers in tries:
        try:
            head = "\n".join(lines[:row - 1] + [lines[row - 1][:col]])
            return _Literals().visit(ast.parse(head + closers, mode="eval")).body, row, end_row is None
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            pass
    return None, 0, False


def _text(value) -> str | None:
    return None if value is None else str(value)


def parse_flight_recorder(text: str | Iterable[str], *, source: str) -> ParseResult:
    """Parse a printed flight-recorder dump (see module doc). Pure; never raises on content."""
    numbered = [(n, body) for n, body, _, _ in iter_lines(text)]
    start = next((i for i, (_, body) in enumerate(numbered) if body is not None and body.startswith("{")), None)
    records: list[dict] = []
    warnings: list[str] = []
    used: set[int] = set()
    if start is not None:
        block = numbered[start:]
        cut_at = next((i for i, (_, body) in enumerate(block) if body is None), len(block))  # a huge line ends it
        block = block[:cut_at]
        root, num_rows, truncated = _parse_literal([body for _, body in block])
        if isinstance(root, ast.Dict):
            linenos = [n for n, _ in block]
            used = set(linenos[:num_rows])
            if truncated:
                warnings.append(Message(N_("line %(line)s: dump cut short (truncated); entries up to here kept"),
                                        line=linenos[num_rows - 1]))
            records = _records(root, linenos, source=source, warnings=warnings)
        else:
            warnings.append(Message(N_("no complete dict literal found: not a printed flight-recorder dump")))
    missed = [n for n, body in numbered if n not in used]
    huge = sum(1 for _, body in numbered if body is None)
    if huge:
        warnings.append(Message(N_("%(num)s line(s) longer than %(max)s characters skipped"), num=huge, max=MAX_LINE_CHARS))
    return ParseResult(records=records, unparsed=len(missed), warnings=warnings, kind="flight_recorder",
                       unparsed_lines=tuple(missed[:MAX_UNPARSED_LINENOS]),
                       num_lines=numbered[-1][0] if numbered else 0)


def _records(root: ast.Dict, linenos: list[int], *, source: str, warnings: list[str]) -> list[dict]:
    def line_of(node: ast.AST) -> int:
        return linenos[min(max(getattr(node, "lineno", 1), 1), len(linenos)) - 1]

    top = _dict_items(root)
    version, rank = (_value(top[k]) if k in top else None for k in ("version", "rank"))
    rank = rank if isinstance(rank, int) and not isinstance(rank, bool) else None
    base = {"source": source, "kind": "flight_recorder", "rank": rank, "fr_version": version if isinstance(version, str) else None}
    out: list[dict] = []
    entries = top.get("entries")
    elided = 0
    for node in entries.elts if isinstance(entries, (ast.List, ast.Tuple)) else ():
        if isinstance(node, ast.Constant) and node.value is Ellipsis:
            elided += 1
            continue
        fields = _dict_items(node)
        if not fields:
            continue
        values = {key: _value(v) for key, v in fields.items()}
        rec = {"table": "collectives", "line": line_of(node), "record": "fr_entry", **base}
        for key, (col, scale) in ENTRY_FIELDS.items():
            v = values.get(key)
            if scale is not None and isinstance(v, (int, float)) and not isinstance(v, bool):
                v = v * scale
            rec[col] = v if isinstance(v, (str, int, float, bool)) or v is None else str(v)
        pg = values.get("process_group")
        pg = tuple(pg) if isinstance(pg, (tuple, list)) else (pg,)
        rec["pg"] = _text(pg[0]) if pg else None
        rec["pg_desc"] = _text(pg[1]) if len(pg) > 1 else None
        name = rec["profiling_name"] if isinstance(rec["profiling_name"], str) else None
        rec["collective"] = name.split(":", 1)[-1] if name else None
        rec.update((key, _text(values.get(key))) for key in TEXT_FIELDS)
        frames = values.get("frames")
        frames = [f for f in frames if isinstance(f, dict)] if isinstance(frames, (list, tuple)) else []
        rec["num_frames"] = len(frames) if "frames" in fields else None
        rec["top_frame"] = f"{frames[0].get('name')} ({frames[0].get('filename')}:{frames[0].get('line')})" if frames else None
        out.append(rec)
    if elided:
        warnings.append(Message(N_("1 entry elided ('...') in the dump")) if elided == 1 else
                        Message(N_("%(num)s entries elided ('...') in the dump"), num=elided))
    for key, event in (("pg_status", "fr_pg_status"), ("pg_config", "fr_pg_config")):
        for pg_id, node in _dict_items(top.get(key)).items():
            values = {k: _value(v) for k, v in _dict_items(node).items()}
            rec = {"table": "events", "line": line_of(node), "event": event, **base, "pg_id": str(pg_id)}
            if event == "fr_pg_status":
                for k in ("last_enqueued_collective", "last_started_collective", "last_completed_collective"):
                    rec[k] = values.get(k) if isinstance(values.get(k), int) else None
                rec["detail"] = (f"pg {pg_id}: last enqueued #{rec['last_enqueued_collective']}, started "
                                 f"#{rec['last_started_collective']}, completed #{rec['last_completed_collective']}")
            else:
                rec.update(pg=_text(values.get("name")), pg_desc=_text(values.get("desc")), ranks=_text(values.get("ranks")))
                rec["detail"] = f"pg {pg_id} ({rec['pg_desc']}): ranks {rec['ranks']}"
            out.append(rec)
    return out
