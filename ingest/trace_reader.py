"""Chrome trace (torch.profiler / Kineto JSON) as a stream of event dicts: a whole document
streamed with ijson (never the whole file in memory), a lean scan that decodes only the event
kinds the step breakdown reads, and a salvage of the objects in a cut or malformed file.

Bytes in, dicts out; files are opened only by ``ingest.io.open_trace_events``. Deliberately not
here: what the events mean (ingest.traces).
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import IO, Any, Iterable, Iterator

_EVENT_KEYS = frozenset({"ph", "name", "cat", "pid", "tid", "ts", "dur", "args", "id", "bp", "s"})


@dataclass(kw_only=True)
class TraceReadCounts:
    """Filled in by ``iter_trace_events`` while it streams (mutable on purpose: the generator
    reports into it). num_events: dicts yielded; num_skipped: items or fragments that were not a
    JSON object; truncated: the stream ended inside the JSON (crashed writer, cut file);
    reader: "ijson", "lean" (see iter_trace_events; events it does not decode are not
    counted) or "lines" (fragment fallback)."""

    num_events: int = 0
    num_skipped: int = 0
    truncated: bool = False
    reader: str = ""


class _HeadThenRest:
    """A read()-able that replays ``head`` before the rest of ``fp`` (we sniff the format)."""

    def __init__(self, head: bytes, fp: IO[bytes]):
        self._head, self._fp = head, fp

    def read(self, n: int = -1) -> bytes:
        if self._head:
            if n is None or n < 0:
                out, self._head = self._head + self._fp.read(), b""
                return out
            out, self._head = self._head[:n], self._head[n:]
            return out
        return self._fp.read(n)


def iter_trace_events(fp: IO[bytes], *, counts: TraceReadCounts | None = None,
                      lean: bool = False) -> Iterator[dict[str, Any]]:
    """Yield the events (JSON objects) of a Chrome trace read from the binary stream ``fp``.

    Accepts the object form ``{"traceEvents": [...], ...}`` (Kineto), the bare array form
    ``[{...}, ...]`` with or without its closing ``]`` (NCCL profiler plugin), and fragments:
    one or more event objects separated by commas, possibly with a trailing ``},``. Objects are
    streamed with ijson (C backend, floats as float); fragments use a line-wise reader that
    splits at top-level braces. Never raises on content: items that are not objects and
    fragments that are not JSON are counted in ``counts.num_skipped``; a stream that ends
    inside the JSON sets ``counts.truncated`` (the events before the cut are yielded).
    Raises only what ``fp.read`` raises (OSError, gzip.BadGzipFile).

    lean=True (what ``compute_step_breakdown`` reads; ~4x faster on torch.profiler traces): for
    a Kineto document (``schemaVersion`` before ``traceEvents``), only complete events (ph "X")
    of the categories kernel, gpu_memcpy, gpu_memset, cuda_runtime, cuda_driver,
    user_annotation -- and cpu_op when the header lists no CUDA device (deviceProperties
    empty: a CPU run) -- are decoded and yielded; they are found by libkineto's event header
    ``{"ph": "X", "cat": "<cat>"`` with a regex scan, everything else is never decoded.
    Other layouts fall back to the full reader.
    """
    import ijson  # imported here so that importing this module stays cheap

    counts = counts if counts is not None else TraceReadCounts()
    head = fp.read(1 << 16)
    stripped = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    src = _HeadThenRest(head, fp)
    first_key = re.match(rb'\{\s*"([^"\\]{0,64})"', stripped)
    # an object whose first key is not an event field is a trace document (Kineto writes
    # schemaVersion, deviceProperties, distributedInfo... before traceEvents)
    document = first_key is not None and first_key.group(1).decode("ascii", "replace") not in _EVENT_KEYS
    # lean reading needs libkineto's layout: a document with schemaVersion, events "ph" first
    array = re.search(rb'"traceEvents"\s*:\s*\[\s*(?=\{)', head) if document else None
    if lean and array is not None and b'"schemaVersion"' in head[:array.start()]:
        counts.reader = "lean"
        at = array.end() + (0 if document else len(head) - len(stripped))
        gpu_trace = re.search(rb'"deviceProperties"\s*:\s*\[\s*\{', head[:at]) is not None
        yield from _iter_lean_events(_HeadThenRest(head[at:], fp), counts, with_cpu_ops=not gpu_trace)
        return
    if stripped.startswith(b"[") or document or re.search(rb'"traceEvents"\s*:', head):
        counts.reader = "ijson"
        prefix = "item" if stripped.startswith(b"[") else "traceEvents.item"
        try:
            for item in ijson.items(src, prefix, use_float=True):
                if isinstance(item, dict):
                    counts.num_events += 1
                    yield item
                else:
                    counts.num_skipped += 1
        except ijson.JSONError:
            counts.truncated = True
        return
    counts.reader = "lines"
    yield from _iter_fragment_events(src, counts)


_LEAN_CHUNK_BYTES = 1 << 22
_LEAN_TAIL_CHARS = 256  # longer than any event header _lean_header_re matches
_LEAN_MAX_EVENT_CHARS = 1 << 24  # an event that does not decode within 16 Mi chars is malformed
# "]" closing traceEvents, scalar trailer keys, "}" closing the document, at the end of the text
_DOC_END_RE = re.compile(r'\]\s*(?:,\s*"[^"\\]*"\s*:\s*(?:"[^"\\]*"|[-+.\w]+)\s*)*\}\s*$')
_LEAN_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "user_annotation")


def _lean_header_re(cats: Iterable[str]) -> re.Pattern[str]:
    # libkineto's writer (output_json.cpp) starts every complete event with "ph", then "cat"
    alt = "|".join(re.escape(c) for c in cats)
    return re.compile(r'\{\s*"ph"\s*:\s*"X"\s*,\s*"cat"\s*:\s*"(?:' + alt + r')"')


def _iter_lean_events(src: _HeadThenRest, counts: TraceReadCounts, *, with_cpu_ops: bool) -> Iterator[dict[str, Any]]:
    """Complete events of the categories the step breakdown reads, found by their Kineto
    header with a C-level regex scan and decoded with json's C scanner; nothing else is
    decoded (iter_trace_events, lean=True)."""
    import codecs

    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    raw_decode = json.JSONDecoder().raw_decode
    find = _lean_header_re(_LEAN_CATS + (("cpu_op",) if with_cpu_ops else ())).finditer
    buf, eof = "", False
    while not eof:
        chunk = src.read(_LEAN_CHUNK_BYTES)
        eof = not chunk
        buf += decode(chunk, final=eof)
        pos = 0
        for m in find(buf):
            if m.start() < pos:
                continue
            try:
                obj, pos = raw_decode(buf, m.start())
            except ValueError:
                if not eof and len(buf) - m.start() < _LEAN_MAX_EVENT_CHARS:
                    pos = m.start()  # cut by the chunk end: decode it with the next chunk
                    break
                counts.num_skipped += 1  # malformed, or cut by the end of the file
                counts.truncated = counts.truncated or eof
                pos = m.end()
                continue
            counts.num_events += 1
            yield obj
        else:
            pos = max(pos, len(buf) - _LEAN_TAIL_CHARS)  # a header cut by the chunk end: next time
        buf = buf[pos:]
    if not _DOC_END_RE.search(buf):  # the array and the document never close: a cut file
        counts.truncated = True


def _brace_delta(line: str, in_string: bool) -> tuple[int, bool]:
    """Net ``{``/``[`` minus ``}``/``]`` outside strings on one line, and the string state after it."""
    depth, escaped = 0, False
    for ch in line:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
    return depth, in_string


def _iter_fragment_events(src: _HeadThenRest, counts: TraceReadCounts) -> Iterator[dict[str, Any]]:
    """Line-wise reader for pasted fragments: accumulate lines until braces balance, strip the
    separating comma, json-decode. A leading unmatched ``[`` (array without ``]``) is ignored."""
    buf: list[str] = []
    depth, in_string, rest = 0, False, b""

    def flush(text: str) -> Iterator[dict[str, Any]]:
        text = text.strip().strip(",").strip()
        if not text or text in ("[", "]"):
            return
        try:
            obj = json.loads(text)
        except (ValueError, RecursionError):
            counts.num_skipped += 1
            return
        items = obj.get("traceEvents") if isinstance(obj, dict) and "traceEvents" in obj else [obj]
        for item in items if isinstance(items, list) else [items]:
            if isinstance(item, dict):
                counts.num_events += 1
                yield item
            else:
                counts.num_skipped += 1

    while True:
        chunk = src.read(1 << 20)
        data = rest + chunk
        lines = data.split(b"\n")
        rest = lines.pop() if chunk else b""
        for raw in lines:
            line = raw.decode("utf-8", "replace")
            if depth == 0 and not buf:
                s = line.strip()
                if s.startswith("[") and not s.startswith("[{"):  # opening of a bare array
                    line = s[1:]
                elif s in ("]", "],", ""):
                    continue
            delta, in_string = _brace_delta(line, in_string)
            depth += delta
            buf.append(line)
            if depth <= 0:
                yield from flush("\n".join(buf))
                buf, depth, in_string = [], 0, False
        if not chunk:
            break
    if buf and "".join(buf).strip():
        counts.truncated = True
        counts.num_skipped += 1
