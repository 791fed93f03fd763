"""The chunked fast path (one regex pass per chunk, bulk-counted unparsed runs) gives exactly
what the per-line path gives: same records in the same order (keys in the same order), same
unparsed count and line numbers, same line count and warnings, whatever the chunk size."""
from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import ingest.parsers
from ingest.parsers import PARSED_KINDS, parse_text

FIXTURES = Path(__file__).parent / "fixtures" / "real"
TEXTS = {p.name: p.read_text(encoding="utf-8") for p in sorted(FIXTURES.glob("*.txt"))}
SYNTHETIC = [  # documented line shapes no fixture holds (fixtures README: COLL and TUNING subsystems)
    "h:1:1 [0] NCCL INFO AllReduce: opCount 1a sendbuff 0x7f01 recvbuff 0x7f02 count 1048576 datatype 7 op 0 root 0 comm 0x55 [nranks=8] stream 0x9",
    "h:1:1 [0] NCCL INFO AllReduce: opCount 1b sendbuff 0x7f03 recvbuff 0x7f04 count 1048576 datatype 7 op 0 root 0 comm 0x55 [nranks=8] stream 0x9",
    "h:1:1 [0] NCCL INFO Broadcast: opCount 0 sendbuff 0x7f recvbuff 0x7f count 240 datatype 0 op 0 root 0 comm 0x55",
    "h:2:2 [1] NCCL INFO AllGather: opCount 3 sendbuff 0x1 recvbuff 0x2 count 0042 datatype 7 op 0 root -1 comm 0x66 [nranks=2] junk",
    "h:1:1 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo 1 proto 2 time 36.220001",
    "h:1:1 [0] NCCL INFO 4096 Bytes -> Algo 0 proto 0 time 25.874907",
    "h:1:1 [0] NCCL INFO 04096 Bytes -> Algo 0 proto 0 channels 2",
    "h:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo 1 proto 2 time 1.2.3 extra",
    # DeepSpeed step and throughput-timer lines (fast rows), new timer format, and odd values
    "[2024-01-02 03:04:05,678] [INFO] [timer.py:260:stop] epoch=0/micro_step=20/global_step=20, RunningAvgSamplesPerSec=12.5, "
    "CurrSamplesPerSec=13.1, MemAllocated=1.2GB, MaxMemAllocated=3.4GB",
    "[2024-01-02 03:04:05,678] [INFO] [timer.py:260:stop] epoch=0/micro_step=21/global_step=21, RunningAvgSamplesPerSec=12.5, "
    "CurrSamplesPerSec=1.2.3",
    "[2024-01-02 03:04:05,678] [INFO] [timer.py:260:stop] 0/\u0663, SamplesPerSec=3.0",
    "[2024-01-02 03:04:05,678] [INFO] [logging.py:96:log_dist] [Rank 3] step=20, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)]",
    "[2024-01-02 03:04:05,678] [INFO] [logging.py:96:log_dist] [Rank 3] step=22, skipped=0, lr=[abc]",
    "[2024-01-02 03:04:05,678] [INFO] [logging.py:96:see_memory_usage] step=20, skipped=0, lr=[1e-4]",
    "[2024-01-02 03:04:05,678] [INFO] [logging.py:96:log_dist]  [Rank 1] [Rank 2] step=23, skipped=1, lr=[2e-4]",
    # Megatron iteration lines of one learned shape with thousands separators, empty and bad values
    " iteration       10/     100 | consumed samples:        1,280 | elapsed time per iteration (ms): 1,234.5 | lm loss: "
    "| grad norm:  x | tokens/s/GPU: 12 34 |",
    " iteration       11/     100 | consumed samples:        2,560 | elapsed time per iteration (ms): 999.0 | lm loss: "
    "2.5E+00 | grad norm: \u0661.5 | tokens/s/GPU: 1_000 |",
    "time (ms) | forward-compute: 193.77 | \u00fcn\u00efcode-name: 1.0 | bad: x |",
]
LINES = sorted({line for text in TEXTS.values() for line in text.split("\n")} | set(SYNTHETIC))
KINDS = PARSED_KINDS + (None,)
PREFIXES = ["", "", "", "[rank3]:", "[1,3]<stdout>:", "[0] ", "trainer/0 [0]:", "[default3]:", "      ", "\t",
            "[80746] [rank0]:", "(RayWorkerWrapper pid=1, ip=192.0.2.1) ", "[rank1]: ", "\x1b[32m"]
SUFFIXES = ["", "", "", "  ", "\r", "\x1b[0m", " \t"]
TIMESTAMPS = ["2024-12-04T05:27:45.082Z", "2024-12-04 05:27:45", "[rank0]:2024-12-04T05:27:45+00:00", "  2024-12-04T05:27:45Z  "]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(result):
    return ([list(r.items()) for r in result.records], result.unparsed, result.unparsed_lines, result.num_lines,
            result.warnings, result.kind)


def assert_same(text, kind):
    general = outcome(parse_text(text, source="s", kind=kind, fast=False))
    assert outcome(parse_text(text, source="s", kind=kind)) == general
    if kind is not None:
        assert outcome(parse_text(iter(text.split("\n")), source="s", kind=kind)) == general


@pytest.mark.parametrize("name", sorted(TEXTS))
@pytest.mark.parametrize("kind", KINDS)
def test_fixtures_fast_equals_general(name, kind):
    assert_same(TEXTS[name], kind)


@pytest.mark.parametrize("chunk_lines", [1, 2, 7])
def test_chunk_boundaries_change_nothing(chunk_lines):
    for name, text in TEXTS.items():
        general = outcome(parse_text(text, source="s", fast=False))
        with mock.patch.object(ingest.parsers, "CHUNK_LINES", chunk_lines), \
                mock.patch.object(ingest.parsers, "CHUNK_CHARS", chunk_lines * 40):
            assert outcome(parse_text(text, source="s")) == general, name
            assert outcome(parse_text(iter(text.split("\n")), source="s", kind=general[5])) == general, name


@st.composite
def mangled_logs(draw):
    """Real lines, shuffled and mixed across formats, each possibly prefixed, coloured,
    indented, preceded by a timestamp line, glued to the next, cut short or blank."""
    out = []
    for _ in range(draw(st.integers(1, 60))):
        line = draw(st.sampled_from(LINES))
        how = draw(st.integers(0, 9))
        if how == 0:
            out.append(draw(st.sampled_from(TIMESTAMPS)))
        elif how == 1:
            line += draw(st.sampled_from(LINES))  # glued
        elif how == 2 and line:
            line = line[:draw(st.integers(0, len(line)))]  # truncated
        elif how == 3:
            line = draw(st.sampled_from(["", " ", "\t  ", "[rank0]:", "[0] "]))  # blank / prefix only
        out.append(draw(st.sampled_from(PREFIXES)) + line + draw(st.sampled_from(SUFFIXES)))
    return "\n".join(out)


@SETTINGS
@given(text=mangled_logs(), kind=st.sampled_from(KINDS), chunk_lines=st.sampled_from([3, 20000]))
def test_mangled_logs_fast_equals_general(text, kind, chunk_lines):
    with mock.patch.object(ingest.parsers, "CHUNK_LINES", chunk_lines), \
            mock.patch.object(ingest.parsers, "CHUNK_CHARS", chunk_lines * 50):
        assert_same(text, kind)


@SETTINGS
@given(name=st.sampled_from(sorted(TEXTS)), kind=st.sampled_from(KINDS), noise=st.binary(max_size=400))
def test_binary_noise_fast_equals_general(name, kind, noise):
    assert_same(TEXTS[name] + noise.decode("utf-8", errors="replace") + TEXTS[name], kind)


def test_huge_line_in_a_fast_chunk():
    edge = "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read"
    assert_same("\n".join([edge, edge + "x" * 70000, edge]), "nccl")


def test_repeated_content_keeps_aggregated_tables_bounded():
    """Edges and calls repeat in long logs: their rows stay one per distinct key."""
    text = TEXTS["08_nccl_cumem_read_cloudwatch_ts_lines.txt"] + "\n" + "\n".join([
        "h:1:1 [0] NCCL INFO AllReduce: opCount 1 sendbuff 0x7f recvbuff 0x7f count 240 datatype 7 op 0 root 0 comm 0x55 [nranks=8] stream 0x9",
        "h:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo 1 proto 2 time 25.874907"])

    def rows(times):
        return [r for r in parse_text("\n".join([text] * times), source="s", kind="nccl").records
                if r["table"] in ("collectives", "comm_topology")]
    once, many = rows(1), rows(50)
    assert len(once) == len(many)
    assert [r.get("channels") for r in once] == [r.get("channels") for r in many]  # distinct channels
    assert [r.get("num_calls") for r in many if "num_calls" in r] == [50, 50]


def test_synthetic_coll_tuning_repeated():
    lines = SYNTHETIC * 3
    for chunk_lines in (2, 20000):
        with mock.patch.object(ingest.parsers, "CHUNK_LINES", chunk_lines):
            assert_same("\n".join(lines), "nccl")


@pytest.mark.parametrize("chunk_lines", [5, 40])
def test_bulk_counted_lines_equal_general(chunk_lines):
    """Chunks whose edge lines are all known are counted in bulk (split + Counter)."""
    from ingest.parsers.nccl import NcclParser
    calls = []
    real = NcclParser.bulk

    def spy(self, counts):
        calls.append(real(self, counts))
        return calls[-1]
    for name, text in TEXTS.items():
        if "nccl" in name:
            for times in (1, 4):
                with mock.patch.object(ingest.parsers, "CHUNK_LINES", chunk_lines), \
                        mock.patch.object(ingest.parsers, "CHUNK_CHARS", chunk_lines * 50), \
                        mock.patch.object(NcclParser, "bulk", spy):
                    assert_same("\n".join([text] * times), "nccl")
    assert True in calls


_COLL_SHAPES = [("h:1:1 [0] NCCL INFO AllReduce: opCount {op:x} sendbuff 0x7f{a:x} recvbuff 0x7f{b:x} count 1048576 "
                 "datatype 7 op 0 root 0 comm 0x55 [nranks=8] stream 0x9"),
                "h:1:1 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo 1 proto 2 time {t}",
                ("h:2:2 [1] NCCL INFO Broadcast: opCount {op:x} sendbuff 0x{a:x} recvbuff 0x{b:x} count 240 datatype 0 "
                 "op 0 root 0 comm 0x66")]
_ODD = ["", "  ", "2024-12-04T05:27:45.082Z", "h:1:1 [0] NCCL INFO Connected all rings", "junk opCount 1 sendbuff x recvbuff y ",
        "h:1:1 [0] NCCL INFO AllGather: opCount 3 sendbuff 0x1 recvbuff 0x2 count 7 datatype 7 op 0 root -1 comm 0x55",
        "h:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo 1 proto 2 time 1.2.3 extra", "[rank1]:" + _COLL_SHAPES[1]]


@st.composite
def coll_logs(draw):
    """Per-call COLL/TUNING lines (opCount, buffers and timings varying per call), a few odd
    lines among them (timestamps, blanks, a new call shape, prefixed or malformed lines)."""
    out = []
    for i in range(draw(st.integers(50, 400))):
        if draw(st.integers(0, 40)) == 0:
            out.append(draw(st.sampled_from(_ODD)))
        out.append(draw(st.sampled_from(_COLL_SHAPES)).format(op=i, a=i * 7, b=i * 13, t=f"{draw(st.floats(0, 99)):.6f}")
                   + draw(st.sampled_from(["", "", " ", "\r"])))
    return "\n".join(out)


@SETTINGS
@given(text=coll_logs(), chunk_chars=st.sampled_from([300, 4000, 1 << 20]))
def test_per_call_lines_counted_in_bulk_equal_general(text, chunk_chars):
    """Chunks made only of known per-call lines are counted from their distinct normalised lines."""
    with mock.patch.object(ingest.parsers, "CHUNK_CHARS", chunk_chars), mock.patch.object(ingest.parsers, "CHUNK_LINES", chunk_chars // 100):
        assert_same(text, "nccl")


def test_pure_per_call_chunks_take_the_distinct_line_path():
    lines = [_COLL_SHAPES[i % 3].format(op=i, a=i, b=2 * i, t=f"{i % 97}.5") for i in range(3000)]
    taken = []
    real = ingest.parsers.Runner._bulk_only

    def spy(self, text, start):
        taken.append(real(self, text, start))
        return taken[-1]
    with mock.patch.object(ingest.parsers, "CHUNK_CHARS", 20000), mock.patch.object(ingest.parsers.Runner, "_bulk_only", spy):
        assert_same("\n".join(lines), "nccl")
    assert sum(taken) >= 5  # the later chunks, once every call shape has its row
    calls = [r["num_calls"] for r in parse_text("\n".join(lines), source="s", kind="nccl").records if r["table"] == "collectives"]
    assert sum(calls) == 3000


@SETTINGS
@given(data=st.lists(st.sampled_from(["a", "NCCL", " ", "\n", "\r", "\r\n", "\n\n", "é", "\udcff"]), max_size=60),
       block_chars=st.sampled_from([1, 2, 3, 7, 1 << 20]))
def test_file_blocks_split_lines_as_python_does(tmp_path_factory, data, block_chars):
    """iter_text_blocks cuts lines where Python's universal newlines do (\\n, \\r\\n, lone \\r)."""
    from ingest.io import iter_text_blocks
    path = tmp_path_factory.mktemp("blocks") / "log.txt"
    path.write_bytes("".join(data).encode("utf-8", errors="surrogateescape"))
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        want = [line.rstrip("\r\n") for line in f]
    got = [line for block in iter_text_blocks(path, block_chars=block_chars) for line in block.split("\n")]
    assert got == want


def test_parsing_a_file_equals_parsing_its_text(tmp_path):
    from ingest.io import iter_text_blocks
    for name, text in TEXTS.items():
        path = tmp_path / name
        path.write_text(text.replace("\n", "\r\n") if "megatron" in name else text, encoding="utf-8", newline="")
        general = outcome(parse_text(text, source="s", fast=False))
        assert outcome(parse_text(iter_text_blocks(path, block_chars=500), source="s", kind=general[5])) == general, name


@pytest.mark.parametrize("kind", KINDS)
def test_synthetic_lines_fast_equals_general(kind):
    """The documented shapes no fixture holds, each twice (a second line of a learned shape takes
    the fast reading), in every parser."""
    assert_same("\n".join(SYNTHETIC + SYNTHETIC), kind)
