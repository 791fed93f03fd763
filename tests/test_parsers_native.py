"""The compiled-scanner protocol (``LineParser.native_scan``, ``Runner._native``): a scanner that
takes some lines and stops before others gives exactly what the Python path gives, wherever it
stops and wherever it says it may go on. The compiled scanners themselves are compared with the
Python path in tests/test_parsers_fastpath.py (they are on there whenever they are built)."""
from __future__ import annotations

import re
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
