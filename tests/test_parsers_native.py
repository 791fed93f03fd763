"""The compiled-scanner protocol (``LineParser.native_scan``, ``Runner._native``): a scanner that
takes some lines and stops before others gives exactly what the Python path gives, wherever it
stops and wherever it says it may go on. The compiled scanners themselves are compared with the
Python path in tests/test_parsers_fastpath.py (they are on there whenever they are built)."""
from __future__ import annotations

import copy
import importlib.util
import itertools
import pickle
import re
import shutil
import sysconfig
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, strategies as st

import ingest.parsers
from ingest.parsers import parse_text
from ingest.parsers.nccl import NcclParser

from test_parsers_fastpath import SETTINGS, TEXTS, mangled_logs, outcome

_EDGE = re.compile(r"([\w.\-]+):([0-9]+):[0-9]+ \[([0-9]+)\] NCCL INFO Channel ([0-9]+)/[0-9]+ : ([0-9]+\[[0-9a-f]+\]) -> "
                   r"([0-9]+\[[0-9a-f]+\]) via (\S+)$")


class PyNative(NcclParser):
    """A stand-in for a compiled scanner, in Python: it takes blank lines and plain P2P edge
    lines, and says it may go on ``skip`` lines after where it stopped (0: it does not know)."""

    native = True
    skip = 0

    def native_scan(self, text, pos, lineno):
        last = 0
        while pos < len(text):
            end = text.find("\n", pos + 1)
            end = len(text) if end < 0 else end
            line = text[pos + 1:end]
            if line.strip(" "):
                m = _EDGE.match(line)
                if m is None or line != line.rstrip():
                    resume = pos
                    for _ in range(self.skip):
                        nxt = text.find("\n", resume + 1)
                        resume = len(text) if nxt < 0 else nxt
                    return pos, lineno, last, resume
                host, pid, dev, ch, src, dst, via = m.groups()
                self._add_edge(lineno + 1, (host, pid, dev), (host, pid, src, dst, "", via), ch, False)
                last = lineno + 1
            pos, lineno = end, lineno + 1
        return pos, lineno, last, pos


def native_outcome(text, skip):
    with mock.patch.object(PyNative, "skip", skip), mock.patch("ingest.parsers.nccl.NcclParser", PyNative):
        return outcome(parse_text(text, source="s", kind="nccl"))


@pytest.mark.parametrize("skip", [0, 1, 3])
@pytest.mark.parametrize("name", [n for n in sorted(TEXTS) if "nccl" in n])
def test_native_protocol_equals_python(name, skip):
    text = TEXTS[name]
    assert native_outcome(text, skip) == outcome(parse_text(text, source="s", kind="nccl", fast=False))


@SETTINGS
@given(text=mangled_logs(), skip=st.sampled_from([0, 2, 50]))
def test_native_protocol_on_mangled_logs(text, skip):
    assert native_outcome(text, skip) == outcome(parse_text(text, source="s", kind="nccl", fast=False))


def test_native_off_switch():
    """NATIVE = False: the Python path even where a scanner is built (tests compare the two)."""
    text = TEXTS["02_nccl_busid_p2p_ipc_read_container.txt"]
    calls = []
    with mock.patch.object(PyNative, "native_scan", lambda self, *a: calls.append(a) or (len(a[0]), 0, 0, len(a[0]))), \
            mock.patch("ingest.parsers.nccl.NcclParser", PyNative), mock.patch.object(ingest.parsers, "NATIVE", False):
        parse_text(text, source="s", kind="nccl")
    assert calls == []


# ---------------------------------------------------------------- the compiled NCCL scanner
# (ingest/parsers/_nccl_scan.pyx): the tests above check the protocol with a stand-in; these check
# the scanner itself against the Python path (NATIVE off, and the per-line path fast=False).

def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_parsers", Path(__file__).parent.parent / "benchmarks" / "bench_parsers.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BENCH = _bench_module()
NCCL_CORPORA = ["nccl_init_run", "nccl_transport_init", "nccl_cloudwatch_ts", "nccl_coll_tuning"]


def nccl_three_ways(text):
    """(compiled scanner, Python fast path, per-line path) outcomes of an NCCL text."""
    native = outcome(parse_text(text, source="s", kind="nccl"))
    with mock.patch.object(ingest.parsers, "NATIVE", False):
        python = outcome(parse_text(text, source="s", kind="nccl"))
    return native, python, outcome(parse_text(text, source="s", kind="nccl", fast=False))


def test_nccl_scanner_is_built():
    """Wherever a C compiler exists the scanner is built (pip install -e . or setup.py build_ext
    --inplace) and is the real one, not the stub."""
    try:
        from ingest.parsers import _nccl_scan
    except ImportError as err:
        cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
        if shutil.which(cc) is None:
            pytest.skip(f"no C compiler ({cc}): ingest.parsers._nccl_scan is not built, the Python path runs ({err})")
        raise AssertionError("ingest.parsers._nccl_scan is not built: run `python setup.py build_ext --inplace`") from err
    assert callable(getattr(_nccl_scan, "scan", None)) and hasattr(_nccl_scan, "Memo"), "the built scanner is a stub"
    assert NcclParser.native


needs_scanner = pytest.mark.skipif(not NcclParser.native, reason="the compiled NCCL scanner is not built")


@needs_scanner
@pytest.mark.parametrize("chunk_chars", [5000, 1 << 20])
@pytest.mark.parametrize("name", NCCL_CORPORA)
def test_benchmark_corpora_native_equals_python(name, chunk_chars):
    """The benchmark's corpora (a few hundred KB each): the scanner, the Python fast path and the
    per-line path give the same result."""
    kind, fixtures, _ = BENCH.CORPORA[name]
    text = "\n".join(BENCH.corpus(fixtures, 300_000, name=name))
    with mock.patch.object(ingest.parsers, "CHUNK_CHARS", chunk_chars):
        native, python, general = nccl_three_ways(text)
    assert native == general
    assert python == general


@needs_scanner
def test_scanner_takes_the_corpora_lines():
    """The scanner reads each line shape of the corpora itself: only the fixtures' "[trimmed]"
    lines (unparsed: counted by the Runner) are left to Python."""
    for name in NCCL_CORPORA:
        kind, fixtures, _ = BENCH.CORPORA[name]
        text = "\n" + "\n".join(BENCH.corpus(fixtures, 200_000, name=name))
        parser, pos, lineno, left = NcclParser("s"), 0, 0, []
        while pos < len(text):
            pos, lineno, last, resume = parser.native_scan(text, pos, lineno)
            if pos < len(text):
                end = text.find("\n", pos + 1)
                left.append(text[pos + 1:len(text) if end < 0 else end])
                pos, lineno = (len(text), lineno) if end < 0 else (end, lineno + 1)
        assert set(left) <= {"[trimmed]"}, (name, sorted(set(left))[:5])


_TS = "2024-12-04T05:27:45.082Z"
_INFO = "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"


@needs_scanner
def test_scanner_timestamp_lines():
    """A timestamp line is taken with the INFO line after it (blank lines between), and left to
    Python when it ends the chunk or the line after it is not taken."""
    refused = "h:1:2 [0] NCCL WARN Cuda failure 'out of memory'"
    for text, want_pos, want_last in [
        (f"\n{_TS}\n{_INFO}", None, 2),
        (f"\n{_TS}\n \t\r\n{_INFO}\n", None, 3),
        (f"\n{_INFO}\n{_TS}", len(f"\n{_INFO}"), 1),
        (f"\n{_INFO}\n{_TS}\n  ", len(f"\n{_INFO}"), 1),
        (f"\n{_INFO}\n{_TS}\n{refused}\n{_INFO}", len(f"\n{_INFO}"), 1),
        (f"\n{_TS}\n{_TS}\n{_INFO}", None, 3),
    ]:
        pos, lineno, last, resume = NcclParser("s").native_scan(text, 0, 0)
        assert (pos, last) == (len(text) if want_pos is None else want_pos, want_last), text
        assert lineno == text[:pos].count("\n")
        assert resume >= pos


# Line shapes the scanner takes (and near misses it must leave to Python), to mangle below.
_SHAPES = sorted({line for name, text in TEXTS.items() if "nccl" in name for line in text.split("\n") if line} | {
    line for line in itertools.islice(BENCH.nccl_init_jobs(num_nodes=2, gpus=2, channels=2), 60)} | {
    "h:1:1 [0] NCCL INFO AllReduce: opCount 1a sendbuff 0x7f01 recvbuff 0x7f02 count 1048576 datatype 7 op 0 root 0 comm 0x55 [nranks=8] stream 0x9",
    "h:1:1 [0] NCCL INFO Broadcast: opCount 0 sendbuff 0x7f recvbuff 0x7f count 240 datatype 0 op 0 root -1 comm 0x55",
    "h:1:1 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo 1 proto 2 time 36.220001",
    "h:1:1 [0] NCCL INFO 4096 Bytes -> Algo 0 proto 0 channels 2",
    "h:1:1 [0] NCCL INFO ReduceScatter: opCount 2 sendbuff 0x1 recvbuff 0x2 count 8 datatype 7 op 0 root 0 comm 0x55 [nranks=x] Bytes -> Algo 1",
    "h:1:1 [0] NCCL INFO CollNet 00/0 : 0 [send] via COLLNET/IB/0",
    "h:1:1 [0] NCCL INFO Channel 03 : 0[0] via P2P/IPC",
    "h:1:1 [0] NCCL INFO Channel 00/02 : 0 1 2 3",
    "h:1:1 [0] NCCL INFO Channel 01/0 : 1[1] -> 0[0] [receive] via NET/Socket/0",
    "h:1:1 [0] NCCL INFO NET/Socket : Using [0]eth0:192.0.2.1<0>",
    "h:1:1 [0] NCCL INFO Using network Socket",
    "h:1:1 [0] NCCL INFO Using non-device net plugin version 0",
    "h:1:1 [0] NCCL INFO comm 0x55 rank 0 nranks 8 cudaDev 0 busId 1000 localSize 8 - Init COMPLETE",
    "h:1:1 [0] NCCL INFO comm 0x55 rank 0 nranks 8 cudaDev 0 busId 1000 - Abort COMPLETE",
    "h:1:1 [0] NCCL INFO comm 0x55 rank 0 nranks 8 cudaDev 0 busId 1000 - Init START",
    "h:1:1 [0] NCCL INFO P2P plugin IBext",
    "h:1:1 [0] NCCL INFO NVLS multicast support is not available on dev 0",
    "h:1:1 [0] NCCL INFO NVLS comm 0x7f headRank -1 nHeads 4 buffSize 4194304 nvlsTotalSize 805306368",
    "h:1:1 [0] NCCL INFO 8 coll channels, 8 p2p channels, 2 p2p channels per peer",
    "h:1:1 [0] NCCL INFO 16 coll channels, 0 nvls channels, 16 coll channels, 1 p2p channels per peer, 2 p2p channels per peer",
    "h:1:1 [0] NCCL INFO Connected NVLS tree",
    "h:1:1 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to NVL",
    "h:1:1 [0] NCCL INFO   Trees [0] -1/-1/-1->0->1",
    "h:1:1 [0] NCCL TRACE Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    "#  Rank  0 Group  0 Pid 1 on h device  0 [0000:18:00] NVIDIA H100 80GB",
    "NCCL version 2.21.5+cuda12.4",
    "2024-12-04T05:27:45+05:30", "2024-12-04 05:27:45,123", "2024-12-04T05:27:45.123456789Z", "2024-12-04T05:27:45-0800",
})
_ODD = ["\u0663", "\uff10", "\u00b2", "\xa0", "\u2003", "\x85", "\x1c", "\x0b", "\t", "\r", " ", "  ", "\u00e9", "\u20ac",
        "\U0001d7d9", "\u2028", "\x00", "\x1b", "[", "]", ":", "/", "-", "."]


@st.composite
def tricky_nccl_lines(draw):
    """Lines of the scanner's shapes, mangled: Unicode digits and whitespace, odd spacing,
    trailing \\r or spaces, huge numbers, truncation, stray characters."""
    line = draw(st.sampled_from(_SHAPES))
    for _ in range(draw(st.integers(0, 3))):
        how, i = draw(st.integers(0, 5)), draw(st.integers(0, len(line)))
        if how == 0:
            line = line[:i] + draw(st.sampled_from(_ODD)) + line[i:]
        elif how == 1:  # a number made huge (past 18 digits, or past int()'s 4300; not a launcher
            # prefix's rank: Runner.raw's int() of it raises, whatever the parser)
            digits = [k for k, c in enumerate(line) if c.isdigit() and (" " in line[:k] or not line.startswith("["))]
            if digits:
                k = draw(st.sampled_from(digits))
                line = line[:k] + draw(st.sampled_from(["9" * 19, "1" * 4301, "00"])) + line[k:]
        elif how == 2:
            line = line[:i]
        elif how == 3:
            line = line.replace(" ", draw(st.sampled_from(["  ", "\t", " \xa0"])), 1)
        elif how == 4:
            line += draw(st.sampled_from(["\r", " ", "\t ", "\xa0", "\u3000", "\x0b"]))
        else:
            digits = [k for k, c in enumerate(line) if c.isdigit()]
            if digits:
                k = draw(st.sampled_from(digits))
                line = line[:k] + draw(st.sampled_from(["\u0663", "\uff11", "x"])) + line[k + 1:]
    return line


@SETTINGS
@given(lines=st.lists(st.one_of(tricky_nccl_lines(), st.sampled_from(_SHAPES), st.sampled_from(["", " ", "\r", _TS, _TS + " "])),
                      min_size=1, max_size=40),
       chunk_chars=st.sampled_from([100, 700, 1 << 20]))
def test_tricky_lines_native_equals_python(lines, chunk_chars):
    """Whatever the scanner takes or leaves, the result is the Python path's: same records (keys
    in order), unparsed lines, line count and warnings; chunks cut anywhere (a timestamp line
    may end one)."""
    text = "\n".join(lines + lines)  # (twice: the second sight of an edge or call shape counts into its row)
    with mock.patch.object(ingest.parsers, "CHUNK_CHARS", chunk_chars):
        native, python, general = nccl_three_ways(text)
    assert native == general
    assert python == general


@needs_scanner
def test_memo_pickles_empty():
    """The parser's memo is a cache: copied or pickled (sharded parsing), it starts empty."""
    parser = NcclParser("s")
    parser.native_scan("\n" + _INFO, 0, 0)
    assert len(parser._scan_memo) == 1
    assert len(pickle.loads(pickle.dumps(parser._scan_memo))) == 0
    assert len(copy.deepcopy(parser)._scan_memo) == 0
