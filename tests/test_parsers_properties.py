"""Property tests: no parser raises on mangled input, and unparsed lines are counted."""
from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings, strategies as st

from ingest.parsers import MAX_LINE_CHARS, iter_lines
from ingest.parsers.dispatch import PARSED_KINDS, parse_text

FIXTURES = Path(__file__).parent / "fixtures" / "real"
# Every parsed kind (PARSED_KINDS: incl. profiler_table, nsys_stats, flight_recorder, pyspy, nccl_ras)
# meets every real fixture and the constructed ones (nsys CSV, DeepSpeed flops/comms tables).
TEXTS = {p.name: p.read_text(encoding="utf-8")
         for p in sorted(FIXTURES.glob("*.txt")) + sorted(FIXTURES.parent.glob("*_constructed.txt"))}
NAMES = sorted(TEXTS)
PREFIXES = st.sampled_from(["", "[rank3]:", "[1,3]<stdout>:", "[0] ", "trainer/0 [0]:", "[default3]:", "      ",
                            "\x1b[32m", "[80746] [rank0]:", "(RayWorkerWrapper pid=1, ip=192.0.2.1) "])
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(result, text):
    assert 0 <= result.unparsed <= sum(1 for line in text.split("\n") if line.strip())
    assert len(result.unparsed_lines) == min(result.unparsed, 1000)
    assert all(isinstance(r, dict) and "table" in r for r in result.records)


@SETTINGS
@given(name=st.sampled_from(NAMES), data=st.data())
def test_random_launcher_prefixes_change_no_count(name, data):
    """Any mix of launcher prefixes, colour codes and paste indentation: same kind, same counts."""
    lines = TEXTS[name].split("\n")
    prefixes = data.draw(st.lists(PREFIXES, min_size=len(lines), max_size=len(lines)))
    text = "\n".join(p + line if line.strip() else line for p, line in zip(prefixes, lines))
    plain = parse_text(TEXTS[name], source=name)
    prefixed = parse_text(text, source=name)
    check(prefixed, text)
    assert (prefixed.kind, prefixed.unparsed) == (plain.kind, plain.unparsed)
    if not any("rank" in p or "default" in p or "<stdout>" in p for p in prefixes):
        # rank-bearing prefixes may legitimately split rows merged per (rank, step)
        assert len(prefixed.records) == len(plain.records)


@SETTINGS
@given(name=st.sampled_from(NAMES), kind=st.sampled_from(PARSED_KINDS), cut=st.floats(0, 1))
def test_truncation_at_any_byte(name, kind, cut):
    data = TEXTS[name].encode()
    text = data[: int(len(data) * cut)].decode("utf-8", errors="replace")
    check(parse_text(text, source=name, kind=kind), text)


@SETTINGS
@given(a=st.sampled_from(NAMES), b=st.sampled_from(NAMES), kind=st.sampled_from(PARSED_KINDS), data=st.data())
def test_glued_lines(a, b, kind, data):
    la, lb = TEXTS[a].split("\n"), TEXTS[b].split("\n")
    i, j = data.draw(st.integers(0, len(la) - 1)), data.draw(st.integers(0, len(lb) - 1))
    glued = la[:i] + [la[i] + lb[j]] + la[i + 1:]
    text = "\n".join(glued)
    check(parse_text(text, source=a, kind=kind), text)


@SETTINGS
@given(noise=st.binary(max_size=2000), kind=st.sampled_from(PARSED_KINDS + (None,)), name=st.sampled_from(NAMES))
def test_binary_noise(noise, kind, name):
    text = TEXTS[name] + noise.decode("utf-8", errors="replace") + TEXTS[name]
    check(parse_text(text, source=name, kind=kind), text)


# the line-based kinds (a Chrome trace is one JSON document, read by its own reader)
LINE_KINDS = [k for k in PARSED_KINDS if k != "chrome_trace"]


@settings(max_examples=10, deadline=None)
@given(kind=st.sampled_from(LINE_KINDS), char=st.sampled_from(["a", " ", "|", ":", "x NCCL INFO ", "iteration "]))
def test_one_megabyte_line_is_counted_unparsed(kind, char):
    huge = char * (1_000_000 // len(char))
    text = f"{huge}\nplain trailing line\n"
    result = parse_text(text, source="huge", kind=kind)
    assert result.unparsed == 2 and result.unparsed_lines == (1, 2)
    assert any(str(MAX_LINE_CHARS) in w for w in result.warnings)


@SETTINGS
@given(text=st.text(max_size=500))
def test_normaliser_and_detection_total(text):
    for lineno, body, ts, rank in iter_lines(text):
        assert body is None or (body.strip() and body == body.rstrip())
    check(parse_text(text, source="t"), text)
