"""The compiled training-log scanners (ingest/parsers/_train_scan.pyx) give exactly what the Python
path gives: the benchmark's corpora, and lines built to be awkward (Unicode digits and spaces,
thousands separators, empty values, unknown keys, launcher prefixes, trailing carriage returns,
cut lines, a step row that exists already), each compared three ways: scanner on, scanner off
(the chunked Python fast path), and the per-line reference path (fast=False)."""
from __future__ import annotations

import shutil
import sys
import sysconfig
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ingest.parsers
from ingest.parsers import deepspeed, megatron, parse_text, torchtitan

from test_parsers_fastpath import outcome as plain_outcome

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from bench_parsers import CORPORA, RUN_STEPS, corpus  # noqa: E402

TRAINING = [name for name, (kind, _, _) in CORPORA.items() if kind in ("megatron", "deepspeed", "torchtitan")]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def exact(value):
    """Values compared strictly: a float by its repr (NaN equals NaN, -0.0 is not 0.0, 1.0 is not 1)."""
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, (list, tuple)):
        return type(value)(map(exact, value))
    return value


def outcome(result):
    return exact(plain_outcome(result))


def three_ways(text, kind):
    """(scanner on, scanner off, per-line reference) outcomes of one text."""
    native = outcome(parse_text(text, source="s", kind=kind))
    with mock.patch.object(ingest.parsers, "NATIVE", False):
        fast = outcome(parse_text(text, source="s", kind=kind))
    return native, fast, outcome(parse_text(text, source="s", kind=kind, fast=False))


def assert_three_equal(text, kind):
    native, fast, general = three_ways(text, kind)
    assert fast == general
    assert native == general


def test_scanner_is_built_and_not_a_stub():
    try:
        from ingest.parsers import _train_scan
    except ImportError:
        if not (shutil.which(sysconfig.get_config_var("CC") or "cc") or shutil.which("cc")):
            pytest.skip("ingest.parsers._train_scan not built: no C compiler here (the Python path is used)")
        raise
    for cls in ("MegatronScan", "DeepSpeedScan", "TorchtitanScan"):
        assert hasattr(_train_scan, cls), f"_train_scan.{cls} missing: a stale stub? rebuild (setup.py build_ext --inplace)"
    assert megatron.MegatronParser.native and deepspeed.DeepSpeedParser.native and torchtitan.TorchtitanParser.native


# ---------------------------------------------------------------- benchmark corpora

def python_reads(kind):
    """Patch the first parser's Python readers of the lines its scanner takes; returns the call list."""
    calls = []

    def spy(name, real):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)
        return wrapper
    targets = {"megatron": [(megatron.MegatronParser, "_iteration"), (megatron, "timer_records")],
               "deepspeed": [(deepspeed.DeepSpeedParser, "_row")],
               "torchtitan": [(torchtitan.TorchtitanParser, "_message"), (torchtitan.TorchtitanParser, "fast_step")]}[kind]
    patches = [mock.patch.object(owner, name, spy(name, getattr(owner, name))) for owner, name in targets]
    return calls, patches


@pytest.mark.parametrize("name", TRAINING)
def test_benchmark_corpora_native_equals_python(name):
    kind, fixtures, _ = CORPORA[name]
    text = "\n".join(corpus(fixtures, 300_000, name=name))
    assert_three_equal(text, kind)
    calls, patches = python_reads(kind)
    for p in patches:
        p.start()
    try:
        parse_text(text, source="s", kind=kind)
    finally:
        for p in patches:
            p.stop()
    # every step, timer and memory line of these corpora is read by the scanner
    assert calls == [], f"{len(calls)} lines of the scanner's shapes read by the Python path: {sorted(set(calls))}"


@pytest.mark.parametrize("name", [n for n in TRAINING if n in RUN_STEPS])
def test_benchmark_corpora_streamed_and_chunked(name, tmp_path):
    """The run corpora from a file in small blocks and as streamed lines (chunk edges everywhere)."""
    from ingest.io import iter_text_blocks
    kind, fixtures, _ = CORPORA[name]
    lines = list(corpus(fixtures, 120_000, name=name))
    text = "\n".join(lines)
    path = tmp_path / "log.txt"
    path.write_text(text, encoding="utf-8")
    general = outcome(parse_text(text, source="s", kind=kind, fast=False))
    with mock.patch.object(ingest.parsers, "CHUNK_CHARS", 3000), mock.patch.object(ingest.parsers, "CHUNK_LINES", 17):
        assert outcome(parse_text(iter_text_blocks(path, block_chars=700), source="s", kind=kind)) == general
        assert outcome(parse_text(iter(lines), source="s", kind=kind)) == general


# ---------------------------------------------------------------- awkward lines

ODD_CHARS = ["\u0661", "\u2003", "\xa0", "\r", ",", "_", "|", ":", " ", "\t", "\xe9", "\x1c", "\x0c", "[", "]", ".", "-",
             "%", "e", "0", "\u3000", "\x85"]
PREFIXES = ["", "", "", " ", "   ", "\t", "[rank3]:", "[rank12]: ", "[default2]:", "[7] ", "[rank1]:[rank2]:",
            "[1,3]<stdout>:", "\u2003", "[rank\u0663]:", "[80746] [rank0]:", "host.x/3 [1]:"]
SUFFIXES = ["", "", "", " ", "\r", " \t", "\u3000", "\xa0", "\x0c"]
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.floats(0, 1e7).map(lambda x: f"{x:,.2f}"),
    st.integers(-10, 10**20).map(str),
    st.sampled_from(["", " ", "1,280", "1_000", "\u0661\u0662", "1.2.3", ".", "5.", ".5", "-0", "+7", "1e5", "1E+05",
                     "nan", "inf", "9" * 30, "0.26GB", "x", "12 34", " 3.5 ", "1,,2", "0x10", "١.٥", "\x1c2.5",
                     "2.5\x1f", "\x0b7", "1,5\x1c", "\u20032"]))
ITER_KEYS = sorted(megatron.ITER_FIELDS) + ["lm loss", "sop loss", "z_loss", "mystery field", "", "  ", "loss"]
LRS = ["5e-05", "abc", " 1e-4 ", "1,5", "", "0.0001]", "1_0", "\x1c5e-05", "5e-05\x1f", "\t1e-3"]
TIMER_VALUES = ["193.77", "0.02", ".", "1.2.3", "5.", "12", "", "\u0661.5", "1e3"]
MEM_RANKS = ["0", "3", "\u0661"]
KV_GAPS = [" ", "  ", "", "\u2003"]
TIMER_NAMES = ["forward-compute", "backward-compute", "optimizer", "a b", "x.y/z", "-lead", "\xfcnicode", "", " space", "tab\t"]


@st.composite
def megatron_lines(draw):
    kind = draw(st.integers(0, 4))
    if kind == 0:  # iteration line
        head = draw(st.sampled_from(["", "", "[2024-01-02 03:04:05] ", "[12] ", "[ 1.5 ] ", "[x] "]))
        gap = draw(st.sampled_from([" ", "      ", "\t", "\u2003", ""]))
        step = draw(st.sampled_from(["10", "20", "30", "0010", "\u0661\u0660", "99999999999999999999", "7"]))
        segs = [f"{draw(st.sampled_from(['', ' ']))}{draw(st.sampled_from(ITER_KEYS))}"
                f"{draw(st.sampled_from([': ', ':', ' : ', '', ':  ']))}{draw(NUMBERS)} "
                for _ in range(draw(st.integers(0, 8)))]
        tail = draw(st.sampled_from(["|", "", "| ", "||"]))
        return f"{head}iteration{gap}{step}/{draw(st.sampled_from([' 100', '100', '  1,000', ' 5']))} |{'|'.join(segs)}{tail}"
    if kind == 1:  # timer line
        segs = [f"{draw(st.sampled_from(['| ', '|', '|  ', ' | ']))}{draw(st.sampled_from(TIMER_NAMES))}"
                f"{draw(st.sampled_from([': ', ':', ' : ']))}{draw(st.sampled_from(TIMER_VALUES))}"
                for _ in range(draw(st.integers(0, 6)))]
        return draw(st.sampled_from(["time (ms) ", "time (ms)", "rank=2 time (ms) "])) + "".join(segs)
    if kind == 2:  # memory line
        vals = [draw(NUMBERS) for _ in range(4)]
        return (f"[Rank {draw(st.sampled_from(MEM_RANKS))}] (after {draw(st.sampled_from(['10', '20', '40']))} "
                f"iterations) memory (MB) | allocated: {vals[0]} | max allocated: {vals[1]} | "
                f"{draw(st.sampled_from(['reserved', 'bogus', 'reserved ']))}: {vals[2]} | max reserved{draw(st.sampled_from([': ', ' ', '']))}{vals[3]}")
    return draw(st.sampled_from([
        "[after dataloaders are built] datetime: 2022-10-31 08:35:51 ", "datetime: 2022-10-31 08:35:51",
        "[x] [y] datetime: 2022-10-31 08:35:51", "[] datetime: 2022-10-31 08:35:51", "[a]datetime: 2022-10-31 08:35:51",
        "[after iteration 5] datetime: 2022-10-31 08:35:5", "[1,2]<stdout>: x] datetime: 2022-10-31 08:35:51",
        "training ...", "done with setup ...", "Done with setup ...", "training ....", "-------- arguments --------",
        "---- end of arguments ----", "- arguments -", "--- arguments", "(min, max) time across ranks (ms):",
        "    forward-compute ...............................: (193.77, 194.02)", "  lr ........ 0.0001",
        "iteration 5 of 10", "[2024-01-02 03:04:05] iteration 3/ 10 | lm loss: 1.0 |", "2024-12-04T05:27:45.082Z",
        "2022-10-31 08:35:51", "   dataset 0, input: 0.333333, achieved: 0.333348", "[trimmed]",
        "[2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] [Rank 0] step=40, skipped=2, lr=[5e-05]",
        "Traceback (most recent call last):", '  File "x.py", line 3, in f']))


DS_HEAD = ["[2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] ", "[2022-03-11 02:06:58,985] [INFO] [timer.py:189:stop] ",
           "[2022-03-11 02:06:58,985] [WARNING] [engine.py:1:see_memory_usage] ", "[2022-03-11 02:06:58,985] [INFO] [a:1:b] ",
           "[2022-03-11 02:06:58] [INFO] [timer.py:189:stop] ", "[2022-03-11 02:06:58,985] [info] [timer.py:189:stop] ",
           "[2022-03-11 02:06:58,985] [INFO] [timer.py:189:stop]", "[2022-03-11 02:06:58,\u0669] [INFO] [t.py:1:f] "]


@st.composite
def deepspeed_lines(draw):
    rank = draw(st.sampled_from(["", "", "[Rank 0] ", "[Rank 3] ", "[Rank 1] [Rank 2] ", "[Rank x] ", " ", "  [Rank 5] "]))
    step = draw(st.sampled_from(["40", "50", "60", "\u0665\u0660"]))
    size = st.sampled_from(["0.26GB", "9.02GB", "1.2XB", "5iB", "1.5.2GB", "12MB", "3KiB", "0.5TB", "7GBx", "GB", "2gb", "1G2B"])
    msg = draw(st.sampled_from(["step", "old", "new", "other"]))
    if msg == "step":
        body = (f"step={step}, skipped={draw(st.sampled_from(['2', '0', '']))}, "
                f"lr=[{draw(st.sampled_from(LRS))}], mom=[[0.9, 0.999]]")
    elif msg == "old":
        body = f"0/{step}, SamplesPerSec={draw(st.sampled_from(['83.48', '1.2.3', '.', '5']))}"
    elif msg == "new":
        body = (f"epoch=0/micro_step={step}/global_step={step}, RunningAvgSamplesPerSec={draw(st.sampled_from(['12.5', '1..2']))}, "
                f"CurrSamplesPerSec={draw(st.sampled_from(['13.1', '.']))}")
    else:
        body = draw(st.sampled_from(["time (ms) | fwd: 1.0 | bwd: 2.0", "steps: 10 loss: 1.5 iter time (s): 0.5 samples/sec: 9.0",
                                     "cmd = python x.py", "train_batch_size ............ 8", "hello", ""]))
    if msg in ("old", "new") and draw(st.booleans()):
        body += f", MemAllocated={draw(size)}, MaxMemAllocated={draw(size)}{draw(st.sampled_from(['', ' tail', 'x']))}"
    lines = [draw(st.sampled_from(DS_HEAD)) + rank + body]
    if draw(st.integers(0, 3)) == 0:
        lines.append(draw(st.sampled_from(["<IPython.core.display.HTML object>", "MA 0.1 GB         Max_MA 0.2 GB         CA 0.3 GB         Max_CA 1 GB ",
                                           "CPU Virtual Memory:  used = 7.5 GB, percent = 12.0%", "", "Comm. Op            Message Size"])))
    return "\n".join(lines)


@st.composite
def torchtitan_lines(draw):
    head = draw(st.sampled_from(["[titan] ", "[titan] ", "", "[titan]", "[titan]  "]))
    ts = draw(st.sampled_from(["2025-06-16 22:30:50,322", "2025-06-16 22:30:50", "2025-06-16 22:30:50,\u0663"]))
    mid = draw(st.sampled_from([" - root - INFO - ", " - root - INFO - ", " - torch.x - INFO - ", " - root - info - ", " - r - W -  "]))
    kind = draw(st.integers(0, 2))
    if kind == 0:
        pairs = [("step", draw(st.sampled_from(["200", "210", "1,000", "x", "\u0661"]))),
                 ("loss", draw(NUMBERS)), ("grad_norm", draw(NUMBERS)),
                 ("memory", draw(st.sampled_from(["49.66GiB(52.28%)", "1.2.3GiB(5%)", "49GiB(5.%)", "1GiB(1.2.3%)", "49.66GiB",
                                                  "49.66GiB(52.28%)x"]))),
                 ("tps", draw(st.sampled_from(["5,856", "5856", "5,8,5,6", "", "1_0"]))),
                 ("wps", draw(st.sampled_from(["12", "x"]))), ("tflops", draw(NUMBERS)),
                 ("mfu", draw(st.sampled_from(["34.29%", "34.29%%", "34", "%", "1,234%"]))), ("Other", "1"), ("a_b", "2")]
        chosen = draw(st.lists(st.sampled_from(pairs), max_size=9))
        if draw(st.booleans()):
            chosen = [pairs[0]] + chosen
        seps = st.sampled_from(["  ", " ", "\t", "  "])
        msg = "".join(f"{k}:{draw(st.sampled_from(KV_GAPS))}{v}{draw(seps)}" for k, v in chosen).rstrip()
        msg = draw(st.sampled_from(["", "", "xstep: 3 "])) + msg
    elif kind == 1:
        msg = draw(st.sampled_from([
            "[GC] Peforming periodical GC collection. 0.06 seconds.", "[GC] Performing periodical GC collection. 0.1 seconds",
            "[GC] Peforming periodical GC collection. 1.2.3 seconds", "x [GC] Pe [GC] Peforming periodical GC collection. 5 seconds",
            "Dumping profiler traces at step 200", "Dumping profiler traces at step x Dumping profiler traces at step 7",
            "Finished dumping profiler traces in 0.22 seconds", "Finished dumping profiler traces in . seconds",
            "Dumping profiler traces at step 99999999999999999999", "[GC] Peforming periodical GC collection. 0.06 secs",
            "Training starts at step 1", "step:"]))
    else:
        msg = draw(st.sampled_from(["Building llama3 8B", "", "step 5"]))
    return f"{head}{ts}{mid}{msg}"


def mangle(draw, line):
    """Perhaps one odd character put into the line, or the line cut short."""
    how = draw(st.integers(0, 5))
    if how == 0 and line:
        i = draw(st.integers(0, len(line)))
        line = line[:i] + draw(st.sampled_from(ODD_CHARS)) + line[i:]
    elif how == 1 and line:
        i = draw(st.integers(0, len(line) - 1))
        line = line[:i] + draw(st.sampled_from(ODD_CHARS)) + line[i + 1:]
    elif how == 2 and line:
        line = line[:draw(st.integers(0, len(line)))]
    return line


@st.composite
def logs(draw, lines):
    out = []
    for _ in range(draw(st.integers(1, 30))):
        for line in draw(lines).split("\n"):
            out.append(draw(st.sampled_from(PREFIXES)) + mangle(draw, line) + draw(st.sampled_from(SUFFIXES)))
        if draw(st.integers(0, 8)) == 0:
            out.append(draw(st.sampled_from(["", "   ", "[rank0]:", "2024-12-04T05:27:45.082Z", out[-1]])))  # blank, a repeat
    return "\n".join(out)


@SETTINGS
@given(text=logs(megatron_lines()), chunk=st.sampled_from([200, 1 << 20]))
def test_megatron_awkward_lines(text, chunk):
    with mock.patch.object(ingest.parsers, "CHUNK_CHARS", chunk):
        assert_three_equal(text, "megatron")


@SETTINGS
@given(text=logs(deepspeed_lines()), chunk=st.sampled_from([200, 1 << 20]))
def test_deepspeed_awkward_lines(text, chunk):
    with mock.patch.object(ingest.parsers, "CHUNK_CHARS", chunk):
        assert_three_equal(text, "deepspeed")


@SETTINGS
@given(text=logs(torchtitan_lines()), chunk=st.sampled_from([200, 1 << 20]))
def test_torchtitan_awkward_lines(text, chunk):
    with mock.patch.object(ingest.parsers, "CHUNK_CHARS", chunk):
        assert_three_equal(text, "torchtitan")


def test_step_row_that_exists_already():
    """A memory line before its iteration line, the same iteration twice, a timer line between:
    the row is made once, at its first line, and later lines add to it in order."""
    text = "\n".join([
        "[Rank 0] (after 10 iterations) memory (MB) | allocated: 1,024 | max allocated: 2048.5 | reserved: 4096 | max reserved: 4096",
        "[rank0]: iteration       10/     100 | consumed samples:        1,280 | lm loss: 2.5E+00 | loss scale: 1.0 |",
        " iteration       10/     100 | consumed samples:        1,280 | lm loss: 2.5E+00 | grad norm: 1.5 |",
        "time (ms) | forward-compute: 193.77 | backward-compute: 73.02",
        " iteration       10/     100 | elapsed time per iteration (ms): 1,234.5 | lm loss: |",
        "[Rank 0] (after 10 iterations) memory (MB) | allocated: 1 | max allocated: 2 | reserved: 3 | max reserved: 4",
    ] * 3)
    assert_three_equal(text, "megatron")
    ds = "\n".join([
        "[2022-03-11 02:06:58,985] [INFO] [timer.py:189:stop] 0/40, SamplesPerSec=83.5, MemAllocated=0.26GB, MaxMemAllocated=9.02GB",
        "[2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] [Rank 0] step=40, skipped=2, lr=[5e-05], mom=[[0.9, 0.999]]",
        "[2022-03-11 02:06:59,985] [INFO] [timer.py:189:stop] 0/40, SamplesPerSec=85.5",
        "[rank1]:[2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] step=40, skipped=2, lr=[5e-05]",
    ] * 3)
    assert_three_equal(ds, "deepspeed")


def test_unknown_iteration_key_warned_once():
    lines = [f" iteration {i:8d}/ 100 | lm loss: 1.0 | new field: {i} | other: x |" for i in range(1, 2000)]
    native, _, general = three_ways("\n".join(lines), "megatron")
    assert native == general
    assert [w for w in native[4] if "not in the pattern table" in w] == [
        "line 1: iteration field 'new field' not in the pattern table", "line 1: iteration field 'other' not in the pattern table"]


def test_numbers_read_as_float_reads_them():
    """The scanners' number reading (c_double) against float() on awkward and random texts."""
    import random
    import struct
    from ingest.parsers._train_scan import read_float
    texts = ["1", "-0.0", "0.1", "1e22", "1e23", "9007199254740993", "9007199254740992.5", "1.012573E+01", ".5", "5.",
             "2.2250738585072011e-308", "4.9e-324", "1e-400", "1e400", "123456789012345678901234567890", "0.000E+00",
             "00000000000000000000000001.5", "1" + "0" * 22 + ".0", "1_0", "inf", "nan", "", ".", "e5", "1e", "1e+", "+-1",
             " 1", "1 ", "\u0661", "1.2.3"]
    rng = random.Random(7)
    for _ in range(20000):
        x = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        texts.append(rng.choice([repr(x), f"{x:.{rng.randint(1, 17)}g}", f"{rng.uniform(0, 1e6):.{rng.randint(0, 10)}f}",
                                 f"{x:.{rng.randint(0, 16)}e}", f"{rng.randint(0, 10 ** 20)}.{rng.randint(0, 999)}"]))
    for text in texts:
        got = read_float(text)
        if got is not None:
            assert repr(got) == repr(float(text)), text
    assert read_float("1,280.5", True) == 1280.5 and read_float("1,280.5") is None
    assert read_float(" 1") is None and read_float("inf") is None and read_float("1_0") is None  # float() decides those


def test_unknown_key_first_seen_empty_is_warned_when_it_has_a_value():
    """A learned line shape never hides the warning the general reading gives: the key was
    skipped unwarned while its value was empty, and is warned about once it has one."""
    text = "\n".join([" iteration 1/ 10 | lm loss: 1.0 | foo: |", " iteration 2/ 10 | lm loss: 1.0 | foo: 5 |",
                      " iteration 3/ 10 | lm loss: 1.0 | foo: 6 |"])
    native, fast, general = three_ways(text, "megatron")
    assert native == fast == general
    assert general[4] == ["line 2: iteration field 'foo' not in the pattern table"]


@pytest.mark.parametrize("kind, line", [
    ("megatron", " iteration       10/     100 | consumed samples:        1,280 | lm loss: 2.5E+00 |"),
    ("deepspeed", "[2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] [Rank 0] step=40, skipped=2, lr=[5e-05]"),
    ("torchtitan", "[rank0]:[titan] 2025-06-16 22:30:50,322 - root - INFO - step: 200  loss:  6.1384  memory: 49.66GiB(52.28%)  "
                   "tps: 5,856  tflops: 339.16  mfu: 34.29%")])
def test_unparsed_lines_counted_by_the_scanner_as_the_runner_counts_them(kind, line):
    """Lines without any of the chain's hints are counted unparsed by the scanner (through the
    Runner's own count), with their numbers -- except while a parser is not idle: the source
    line under a traceback frame is the failure scanner's, so the Python path takes it."""
    html = "<IPython.core.display.HTML object>"
    text = "\n".join([line, html, html, "", html, line, '  File "train.py", line 3, in main', "    loss.backward()", html,
                      "Traceback (most recent call last):", html, "  \u00e9t\u00e9 sans indice", html + "\r", line] * 40)
    gaps = []
    real = ingest.parsers.Runner._scan

    def spy(self, seg, start):
        gaps.append(seg)
        return real(self, seg, start)
    assert_three_equal(text, kind)
    with mock.patch.object(ingest.parsers.Runner, "_scan", spy):
        native = parse_text(text, source="s", kind=kind)
    # the three lines of each repeat before the traceback are counted by the scanner; the rest may go to Python
    assert sum(seg.count(html) for seg in gaps) <= 3 * 40
    assert native.unparsed >= 40 * 5 and native.unparsed_lines[:3] == (2, 3, 5)


def test_more_distinct_keys_and_names_than_the_scanner_keeps():
    """Past the scanner's caches of recurring strings (512 each), keys and names are made per line."""
    lines = []
    for i in range(1200):
        lines.append(f" iteration {i + 1:8d}/ 5000 | lm loss: 1.5 | k{i}_loss: {i}.5 | odd{i}: 1 | consumed samples: {i * 8} |")
        lines.append(f"time (ms) | fwd-{i}: 1.{i} | bwd: 2.0 | step {i % 700}: 0.5")
        lines.append(f"[titan] 2025-06-16 22:30:50,322 - root - INFO - step: {i}  loss: 1.0  k{i}: 5  tps: 1,000")
    text = "\n".join(lines)
    assert_three_equal(text, "megatron")
    assert_three_equal(text, "torchtitan")


def test_native_off_switch_keeps_the_scanners_out():
    text = "\n".join(corpus(CORPORA["megatron_run"][1], 20_000, name="megatron_run"))
    with mock.patch.object(megatron.MegatronParser, "native_scan", side_effect=AssertionError("scanner called")), \
            mock.patch.object(ingest.parsers, "NATIVE", False):
        parse_text(text, source="s", kind="megatron")
    with mock.patch.object(megatron.MegatronParser, "native_scan", side_effect=AssertionError("scanner called")):
        with pytest.raises(AssertionError, match="scanner called"):
            parse_text(text, source="s", kind="megatron")


@pytest.mark.parametrize("name", ["megatron_run", "deepspeed_run", "torchtitan_run"])
def test_parsers_with_scanners_pickle(name):
    """Parsers travel between processes (sharded parsing): a parser that has scanned some lines
    pickles, and the copy scans on as the original does (its scanner made afresh)."""
    import pickle
    from ingest.parsers import run_parsers
    kind, fixtures, _ = CORPORA[name]
    lines = list(corpus(fixtures, 60_000, name=name))
    first, rest = "\n".join(lines[:len(lines) // 2]), "\n".join(lines[len(lines) // 2:])
    chain = {"megatron": lambda: [megatron.MegatronParser("s"), deepspeed.DeepSpeedParser("s")],
             "deepspeed": lambda: [deepspeed.DeepSpeedParser("s")],
             "torchtitan": lambda: [torchtitan.TorchtitanParser("s")]}[kind]
    parsers = chain()
    run_parsers(first, parsers, kind=kind)
    copies = pickle.loads(pickle.dumps(parsers))
    assert outcome(run_parsers(rest, copies, kind=kind)) == outcome(run_parsers(rest, parsers, kind=kind))


def test_separators_float_keeps_around_values():
    """float() and int() strip spaces, tabs and line ends, not \\x1c-\\x1f, which str.strip()
    and the patterns' \\s take as whitespace: each reading converts what its Python reading
    converts (a learned Megatron line shape included)."""
    megatron_text = "\n".join([" iteration 1/ 10 | lm loss: 1.5 | consumed samples: 8 |",
                               " iteration 2/ 10 | lm loss: \x1c2.5\x1f | consumed samples: \x1c16 |",
                               " iteration 3/ 10 | lm loss: 3.5\x0b | consumed samples: 1,024\x1c |"])
    assert_three_equal(megatron_text, "megatron")
    assert [(r["loss"], r["consumed_samples"]) for r in parse_text(megatron_text, source="s", kind="megatron").records] == [
        (1.5, 8), (2.5, 16), (3.5, 1024)]
    ds = "[2022-03-11 02:06:58,985] [INFO] [logging.py:69:log_dist] [Rank 0] step=40, skipped=2, lr=[{}], mom=[[0.9]]"
    for lr in ["\x1c5e-05", "5e-05\x1f", " 5e-05 ", "\x0b5e-05"]:
        assert_three_equal(ds.format(lr), "deepspeed")


def test_deepspeed_lr_at_the_end_of_the_line():
    """An lr list cut at the end of the line: what the normaliser leaves of it (trailing
    whitespace stripped first) is the value, in every reading; nothing left: not a step line."""
    ds = "[2022-03-11 02:06:58,985] [INFO] [a:1:b] [Rank 0] step=40, skipped=2, lr=[{}"
    for tail in ["5e-05\x1f", "5e-05 \t", "5e-05\x1c\x1d", " \x1f", "5e-05", "5e-05\x1f]"]:
        assert_three_equal(ds.format(tail) + "\n" + ds.format(tail), "deepspeed")


@pytest.mark.parametrize("name", ["megatron", "deepspeed", "torchtitan"])
def test_runner_and_parsers_freed_without_the_cycle_collector(name):
    """No reference cycle through the Runner: its parsers (and their records) go when the parse
    returns, not at the next full collection (a cycle here held every record of a 16 MB log)."""
    import gc
    import weakref
    kind, fixtures, _ = CORPORA[name]
    text = "\n".join(corpus(fixtures, 20_000, name=name))
    runners = []
    real = ingest.parsers.Runner.__init__

    def spy(self, *args, **kwargs):
        runners.append(weakref.ref(self))
        real(self, *args, **kwargs)
    gc.disable()
    try:
        with mock.patch.object(ingest.parsers.Runner, "__init__", spy):
            parse_text(text, source="s", kind=kind)
        assert runners and all(ref() is None for ref in runners)
    finally:
        gc.enable()
