"""A file parsed in shards on several processes (ingest.sharded) gives exactly the serial parse:
same records in the same order (keys in the same order), same unparsed count and line
numbers, same line count, warnings and kind, wherever the cuts land. Real parsers, real
worker processes (one pool per module, forked), real files."""
from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ingest.errors import ParseError
from ingest.io import iter_text_blocks, plan_text_shards
from ingest.parsers import SHARD_KINDS, detect_kind, parse_text
from ingest.sharded import parse_file_sharded
from ingest.cli import main
from ingest.thirdparty import SHARD_MIN_BYTES, ingest_file, ingest_files

FIXTURES = Path(__file__).parent / "fixtures"
TEXTS = {p.name: p.read_text(encoding="utf-8") for p in sorted((FIXTURES / "real").glob("*.txt"))}
CONSTRUCTED = (FIXTURES / "deepspeed_flops_profiler_comms_logger_constructed.txt").read_text(encoding="utf-8")
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KINDS = SHARD_KINDS + ("unknown",)


@pytest.fixture(scope="module")
def pool():
    with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("fork")) as p:
        yield p


def outcome(result):
    return ([list(r.items()) for r in result.records], result.unparsed, result.unparsed_lines, result.num_lines,
            result.warnings, result.kind)


def serial(path, kind):
    return parse_text(iter_text_blocks(path), source="s", kind=kind or "unknown")


def assert_sharded_equal(path, kind, pool, *, num_shards=5, plan=None, steal=False):
    """The sharded result equals the serial one (and as ParseResult); returns the ShardStats.
    (steal=False: every shard after the first is read by a worker, so which are redone is known;
    probe=False: shards even where the probe would predict no gain on this machine.)"""
    want = serial(path, kind)
    got, stats = parse_file_sharded(path, kind=kind, source="s", num_shards=num_shards, plan=plan, pool=pool, steal=steal,
                                    probe=False)
    assert outcome(got) == outcome(want)
    assert got == want
    assert stats.failed == ()
    return stats


def write(tmp_path, name, text, *, newline="\n"):
    path = tmp_path / name
    path.write_bytes(text.replace("\n", newline).encode("utf-8", errors="surrogateescape"))
    return path


# ---------------------------------------------------------------- cut plan and span reading

def lines_of(blocks):
    return [line for block in blocks for line in block.split("\n")]


@settings(max_examples=150, deadline=None)
@given(data=st.lists(st.sampled_from(["a", "NCCL", " ", "\n", "\r", "\r\n", "\n\n", "é", "€", "\udcff", "\udce2\udc82",
                                      "2024-12-04T05:27:45.082Z\n", "[rank0]:"]), max_size=80),
       near=st.lists(st.integers(0, 400), max_size=8), avoid=st.booleans(), block_chars=st.sampled_from([1, 3, 1 << 20]),
       num_shards=st.integers(0, 9), start_at=st.integers(0, 400))
def test_shards_hold_the_files_lines(tmp_path_factory, data, near, avoid, block_chars, num_shards, start_at):
    """Cut anywhere (\\r\\n, lone \\r, invalid UTF-8, no trailing newline): the shards' lines,
    one after another, are the file's lines, and each shard's first line number is right; so
    too for a plan of the rest of the file after a first cut."""
    path = tmp_path_factory.mktemp("plan") / "log.txt"
    path.write_bytes("".join(data).encode("utf-8", errors="surrogateescape"))
    whole = lines_of(iter_text_blocks(path))
    shards = plan_text_shards(path, num_shards, near=near or None, avoid_timestamps=avoid)
    first = plan_text_shards(path, 0, near=[start_at], avoid_timestamps=avoid)
    if len(first) > 1:  # the rest after the first cut, in about num_shards equal shards
        rest = plan_text_shards(path, num_shards, start=first[1].start, avoid_timestamps=avoid)
        assert rest[0].start == first[1].start and rest[0].first_lineno == first[1].first_lineno
        shards = [first[0], *rest]
    assert shards[0].start == 0 and shards[-1].end == path.stat().st_size
    assert all(a.end == b.start and a.start < a.end for a, b in zip(shards, shards[1:]))
    raw = path.read_bytes()
    assert all(raw[s.start - 1:s.start] == b"\n" for s in shards[1:])
    got, lineno = [], 1
    for s in shards:
        assert s.first_lineno == lineno
        part = lines_of(iter_text_blocks(path, span=(s.start, s.end), block_chars=block_chars))
        got += part
        lineno += len(part)
    assert got == whole


def test_cuts_near_equal_parts_and_not_after_a_timestamp_line(tmp_path):
    text = "".join(f"2024-12-04T05:27:45.{i:03d}Z\nhost:1:1 [0] NCCL INFO line {i}\n" for i in range(2000))
    path = write(tmp_path, "cw.log", text)
    size = path.stat().st_size
    shards = plan_text_shards(path, 4)
    assert len(shards) == 4
    assert all(abs(s.start - size * i / 4) < 200 for i, s in enumerate(shards))
    assert all(path.read_bytes()[s.start:s.start + 4] == b"2024" for s in shards)  # the timestamp starts the shard
    after_ts = [len(text.encode()) // 2 + i for i in range(0, 60, 3)]
    starts = {path.read_bytes()[s.start:s.start + 4] for s in plan_text_shards(path, 0, near=after_ts, avoid_timestamps=False)}
    assert starts == {b"2024", b"host"}


def test_one_huge_line_is_one_shard(tmp_path, pool):
    path = write(tmp_path, "huge.log", "x NCCL INFO " * 20000)
    assert len(plan_text_shards(path, 4)) == 1
    for kind in ("nccl", None):
        assert_sharded_equal(path, kind, pool, num_shards=4)


def test_unreadable_file_is_a_parse_error(tmp_path, pool):
    with pytest.raises(ParseError, match="cannot read"):
        parse_file_sharded(tmp_path / "missing.log", kind="nccl", source="s", num_shards=3, pool=pool)
    with pytest.raises(ParseError, match="cannot read"):
        plan_text_shards(tmp_path, 3)


# ---------------------------------------------------------------- fixtures, forced small shards

@pytest.mark.parametrize("name", sorted(TEXTS))
def test_fixture_repeated_sharded_equals_serial(tmp_path, pool, name):
    """Each real fixture repeated to ~300 KB, cut into 4 and 7 shards (the cuts land on every
    kind of line of it across the repetitions)."""
    text = TEXTS[name]
    path = write(tmp_path, name, (text.rstrip("\n") + "\n") * max(2, 300_000 // max(len(text), 1)))
    kind = detect_kind(text)
    for num_shards, steal in ((4, False), (7, True)):
        assert_sharded_equal(path, kind, pool, num_shards=num_shards, steal=steal)


@pytest.mark.parametrize("kind", KINDS)
def test_all_fixtures_as_every_shardable_kind(tmp_path, pool, kind):
    """Every fixture, one after another, read as each kind that shards (most lines unparsed)."""
    path = write(tmp_path, "all.log", "\n".join(TEXTS.values()) + "\n" + CONSTRUCTED)
    stats = assert_sharded_equal(path, kind, pool, num_shards=6)
    assert stats.num_shards == 6


# ---------------------------------------------------------------- random cuts on mixed text

PREFIX = "[2024-05-01 10:00:00,123] [INFO] "
SNIPPETS = [  # multi-line shapes whose state spans lines (step rows, blocks, tables), and their parts
    "\n".join([PREFIX + "[logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)]",
               PREFIX + "[timer.py:260:stop] epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=45.5, "
                        "CurrSamplesPerSec=46.1, MemAllocated=3.2GB, MaxMemAllocated=7.5GB",
               PREFIX + "[logging.py:96:log_dist] [Rank 0] time (ms) | fwd_microstep: 120.50 | bwd_microstep: 240.25"]),
    PREFIX + "[logging.py:96:log_dist] step=11, skipped=1, lr=[0.0002]",
    PREFIX + "[logging.py:96:log_dist] [Rank 1] step=11, skipped=1, lr=[0.0002]",
    PREFIX.replace("00,123", "09,999") + "[timer.py:260:stop] epoch=0/micro_step=11/global_step=11, RunningAvgSamplesPerSec=1.5, "
                                         "CurrSamplesPerSec=2.5",
    PREFIX + "[timer.py:189:stop] 0/11, SamplesPerSec=12.5, MemAllocated=0.26GB, MaxMemAllocated=9.02GB",
    PREFIX + "[engine.py:2100:_report_progress] steps: 11 loss: nan iter time (s): 1.234 samples/sec: 25.93",
    PREFIX + "[engine.py:2100:_report_progress] steps: 11 loss: 5.4321 iter time (s): 1.5 samples/sec: 20.0",
    "\n".join([PREFIX + "[utils.py:800:see_memory_usage] After forward",
               "MA 1.5 GB         Max_MA 2.25 GB         CA 3.0 GB         Max_CA 3 GB ",
               "CPU Virtual Memory:  used = 50.1 GB, percent = 10.2%"]),
    PREFIX + "[utils.py:800:see_memory_usage] Before step",
    "MA 2.5 GB         Max_MA 3.25 GB         CA 4.0 GB         Max_CA 4 GB ",
    "CPU Virtual Memory:  used = 51.0 GB, percent = 11.0%",
    " iteration       20/  100 | consumed samples: 640 | elapsed time per iteration (ms): 1234.5 | lm loss: 5.0E+00 | "
    "new thing: 3 |",
    " iteration       20/  100 | consumed samples: 640 | elapsed time per iteration (ms): 1300.0 | loss scale: 1.0 |",
    "[2022-10-31 10:00:00] iteration       21/  100 | lm loss: 4.5 | other field: 1 |",
    "[Rank 0] (after 20 iterations) memory (MB) | allocated: 1024.0 | max allocated: 2048.0",
    "time (ms) | forward-compute: 100.5 | backward-compute: 200.25",
    "    forward-compute ...............................: (100.12, 110.34)",
    "\n".join(TEXTS["51_torchrun_childfailed_multi_failures_sigabrt.txt"].split("\n")[3:22]),
    "\n".join(TEXTS["53_torchrun_childfailed_sigkill_py311_carets.txt"].split("\n")[-16:]),
    'File "/x/train.py", line 3, in main',
    "    main()",
    "2024-12-04T05:27:45.082Z",
    "[rank0]:2024-12-04T05:27:45+00:00",
    "",
    "\n".join(CONSTRUCTED.split("\n")[5:30]),
    "\n".join(CONSTRUCTED.split("\n")[-25:]),
]
LINES = sorted({line for text in TEXTS.values() for line in text.split("\n")})


@st.composite
def mixed_logs(draw):
    """Real fixture lines and stateful multi-line snippets in random order, some prefixed."""
    out = []
    for _ in range(draw(st.integers(1, 80))):
        piece = draw(st.sampled_from(SNIPPETS)) if draw(st.booleans()) else draw(st.sampled_from(LINES))
        prefix = draw(st.sampled_from(["", "", "", "[rank1]:", "[rank0]:", "  "]))
        out.append("\n".join(prefix + line for line in piece.split("\n")))
    return "\n".join(out) + draw(st.sampled_from(["", "\n", "\r\n", "\n\n"]))


@SETTINGS
@given(text=mixed_logs(), kind=st.sampled_from(KINDS), data=st.data(), avoid=st.booleans(), steal=st.booleans(),
       newline=st.sampled_from(["\n", "\n", "\r\n", "\r"]))
def test_random_cuts_on_mixed_text(tmp_path_factory, pool, text, kind, data, avoid, steal, newline):
    path = write(tmp_path_factory.mktemp("mixed"), "log.txt", text, newline=newline)
    size = path.stat().st_size
    near = data.draw(st.lists(st.integers(0, max(size - 1, 0)), min_size=1, max_size=8))
    plan = plan_text_shards(path, 0, near=near, avoid_timestamps=avoid)
    assert_sharded_equal(path, kind, pool, plan=plan, steal=steal)


@SETTINGS
@given(name=st.sampled_from(sorted(TEXTS)), kind=st.sampled_from(KINDS), noise=st.binary(max_size=300), data=st.data())
def test_random_cuts_with_binary_noise(tmp_path_factory, pool, name, kind, noise, data):
    path = tmp_path_factory.mktemp("noise") / "log.txt"
    path.write_bytes(TEXTS[name].encode() + noise + TEXTS[name].encode())
    near = data.draw(st.lists(st.integers(0, path.stat().st_size), min_size=1, max_size=6))
    assert_sharded_equal(path, kind, pool, plan=plan_text_shards(path, 0, near=near), steal=True)


# ---------------------------------------------------------------- state across a cut

def cut_before(path, marker: str, *, avoid_timestamps=True):
    """A plan with one cut just before the line holding ``marker``."""
    at = path.read_bytes().index(marker.encode())
    return plan_text_shards(path, 0, near=[path.read_bytes().rindex(b"\n", 0, at) + 1], avoid_timestamps=avoid_timestamps)


def test_child_failed_block_across_a_cut_is_read_again(tmp_path, pool):
    text = TEXTS["51_torchrun_childfailed_multi_failures_sigabrt.txt"]
    path = write(tmp_path, "fail.log", text * 3)
    stats = assert_sharded_equal(path, "failures", pool, plan=cut_before(path, "exitcode  : -6 (pid: 2385923)"))
    assert stats.redone == (1,)
    # blocks that start after the cut merge (their script filled in from the first block)
    closed = text + "=" * 56 + "\napp output\n"
    path = write(tmp_path, "fail.log", closed * 3)
    plan = plan_text_shards(path, 0, near=[len(closed.encode()), 2 * len(closed.encode())])
    assert len(plan) == 3 and assert_sharded_equal(path, "failures", pool, plan=plan).redone == ()
    script = {r.get("script") for r in serial(path, "failures").records if r.get("event") == "child_failed"}
    assert script == {"tools/train.py"}


def test_first_child_failed_block_in_a_later_shard_is_read_again(tmp_path, pool):
    """No script named before the cut and a block after it: the serial parse names the script there."""
    text = "some app output\n" * 50 + TEXTS["51_torchrun_childfailed_multi_failures_sigabrt.txt"] * 2
    path = write(tmp_path, "fail.log", text)
    stats = assert_sharded_equal(path, "failures", pool, plan=plan_text_shards(path, 0, near=[400]))
    assert stats.redone == (1,)


def test_deepspeed_memory_triplet_across_a_cut_merges(tmp_path, pool):
    """A see_memory_usage label, its MA line and its CPU line on two sides of a cut: the label and
    the CPU values reach the right record without reading anything twice."""
    head = PREFIX + "[logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001]\n"
    text = head + SNIPPETS[7] + "\n" + head.replace("step=10", "step=11") + SNIPPETS[7].replace("After forward", "After step") + "\n"
    path = write(tmp_path, "ds.log", text * 3)
    for marker in ("MA 1.5 GB", "CPU Virtual"):
        stats = assert_sharded_equal(path, "deepspeed", pool, plan=cut_before(path, marker))
        assert stats.redone == ()
    result, _ = parse_file_sharded(path, kind="deepspeed", source="s", num_shards=2, plan=cut_before(path, "CPU Virtual"),
                                   pool=pool)
    mem = [r for r in result.records if r["table"] == "memory"]
    assert [(m["label"], m["step"], m["cpu_mem_used_gib"]) for m in mem[:2]] == [("After forward", 10, 50.1),
                                                                                ("After step", 11, 50.1)]


def test_deepspeed_rows_of_an_unknown_rank_join_the_later_rows_of_that_rank(tmp_path, pool):
    """After the cut, lines without a rank (the last rank: unknown in the shard) and then lines
    naming rank 0 make one row per step, as in the serial parse: a timer's time (setdefault)
    gives way to a step line's, never the other way round."""
    text = "\n".join([PREFIX + "[logging.py:96:log_dist] [Rank 0] step=4, skipped=0, lr=[0.1]",
                      SNIPPETS[3].replace("11", "5"),  # timer, no rank: time 10:00:09,999 (setdefault)
                      PREFIX.replace("00:00", "00:05") + "[logging.py:96:log_dist] step=7, skipped=0, lr=[0.1]",
                      PREFIX.replace("00:00", "00:07") + "[logging.py:96:log_dist] [Rank 0] step=5, skipped=0, lr=[0.1]",
                      SNIPPETS[3].replace("11", "7"),  # rank 0 now: setdefault keeps step 7's time
                      SNIPPETS[3].replace("11", "6"), ""])
    path = write(tmp_path, "ds.log", text)
    assert assert_sharded_equal(path, "deepspeed", pool, plan=cut_before(path, "global_step=5")).redone == ()
    result, _ = parse_file_sharded(path, kind="deepspeed", source="s", num_shards=2, plan=cut_before(path, "global_step=5"),
                                   pool=pool)
    steps = [r for r in result.records if r["table"] == "steps"]
    assert [(r["rank"], r["step"], r["time"], r["line"]) for r in steps] == [
        (0, 4, "2024-05-01 10:00:00,123", 1), (0, 5, "2024-05-01 10:00:07,123", 2), (0, 7, "2024-05-01 10:00:05,123", 3),
        (0, 6, "2024-05-01 10:00:09,999", 6)]


def test_megatron_rows_and_warnings_across_cuts(tmp_path, pool):
    """The same iteration in two shards keeps the first line and a real loss (a later line without
    one only sets a default); an unknown field is warned about once, at its first line."""
    lines = [SNIPPETS[11], SNIPPETS[14], SNIPPETS[15], SNIPPETS[12], SNIPPETS[11], SNIPPETS[16]]
    path = write(tmp_path, "m.log", "\n".join(lines * 4) + "\n")
    for num_shards in (2, 3, 5, 9):
        assert_sharded_equal(path, "megatron", pool, num_shards=num_shards)
    result = serial(path, "megatron")
    assert sum("new thing" in w for w in result.warnings) == 1
    (row,) = [r for r in result.records if r["table"] == "steps" and r["rank"] is None]
    assert (row["line"], row["loss"], row["step_time_s"]) == (1, 5.0, 1.2345)


def test_timestamp_line_before_a_cut(tmp_path, pool):
    """A cut right after a CloudWatch timestamp line (which belongs to the next line) is read
    again; the planner moves cuts past such lines when it can."""
    path = tmp_path / "cw.log"
    path.write_text(TEXTS["08_nccl_cumem_read_cloudwatch_ts_lines.txt"] * 4, encoding="utf-8")
    raw = path.read_bytes()
    after_ts = raw.index(b"Z\n", len(raw) // 2) + 2
    plan = plan_text_shards(path, 0, near=[after_ts], avoid_timestamps=False)
    assert raw[plan[1].start - 2:plan[1].start] == b"Z\n"
    assert assert_sharded_equal(path, "nccl", pool, plan=plan).redone == (1,)
    plan = plan_text_shards(path, 0, near=[after_ts])
    assert assert_sharded_equal(path, "nccl", pool, plan=plan).redone == ()


def test_flops_profile_across_a_cut_is_read_again(tmp_path, pool):
    path = write(tmp_path, "ds.log", CONSTRUCTED * 3)
    assert assert_sharded_equal(path, "deepspeed", pool, plan=cut_before(path, "fwd latency")).redone == (1,)
    assert assert_sharded_equal(path, "deepspeed", pool, plan=cut_before(path, "Comm. Op")).redone == ()


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_crlf_and_lone_cr_files(tmp_path, pool, newline):
    for name in ("01_nccl_oldfmt_busid_ib_2node.txt", "17_megatron_2022_bert_timers_memory.txt",
                 "21_deepspeed_2022_timer_samplespersec_notebook.txt", "08_nccl_cumem_read_cloudwatch_ts_lines.txt"):
        path = write(tmp_path, name, TEXTS[name] * 20, newline=newline)
        if newline == "\r":  # no \n byte to cut after: one shard, read serially
            assert len(plan_text_shards(path, 5)) == 1
        assert assert_sharded_equal(path, detect_kind(TEXTS[name]), pool, num_shards=5).num_shards == (
            1 if newline == "\r" else 5)
    mixed = write(tmp_path, "mixed.log", (TEXTS["17_megatron_2022_bert_timers_memory.txt"].replace("\n", "\r", 7) + "\r\n") * 30)
    assert_sharded_equal(mixed, "megatron", pool, num_shards=6)


def test_no_trailing_newline(tmp_path, pool):
    text = TEXTS["25_torchtitan_2025_rank0_prefix_gc_profiler.txt"] * 30
    path = write(tmp_path, "tt.log", text.rstrip("\n"))
    assert assert_sharded_equal(path, "torchtitan", pool, num_shards=4).num_shards == 4


# ---------------------------------------------------------------- the probe

@pytest.mark.parametrize("name", ["17_megatron_2022_bert_timers_memory.txt", "04_nccl_ib_2node_rings_trees_mnnvl.txt",
                                  "23_deepspeed_2024_launcher_free_output.txt", "51_torchrun_childfailed_multi_failures_sigabrt.txt"])
def test_probe_then_shards_or_serial_equal_serial(tmp_path, pool, name):
    """The first part read alone, then the rest in shards (or serially, when shipping the
    records back is predicted to cost more than it saves): the serial parse either way."""
    text = TEXTS[name]
    path = write(tmp_path, name, text * max(2, 200_000 // len(text)))
    kind = detect_kind(text)
    want = outcome(serial(path, kind))
    sharded, stats = parse_file_sharded(path, kind=kind, source="s", num_shards=3, pool=pool, min_speedup=0)
    assert outcome(sharded) == want and stats.num_shards == 3 and stats.predicted_speedup > 0
    alone, stats = parse_file_sharded(path, kind=kind, source="s", num_shards=3, pool=pool, min_speedup=float("inf"))
    assert outcome(alone) == want and stats.num_shards == 1 and stats.predicted_speedup > 0


def test_probe_predicts_record_dense_logs_do_not_pay(tmp_path, pool):
    """A log with a record per line and a fast parser (torchtitan) is predicted below a log
    whose lines mostly make no record (NCCL init with its aggregated edges)."""
    def predicted(name):
        path = write(tmp_path, name, TEXTS[name] * (2_000_000 // len(TEXTS[name])))
        kind = detect_kind(TEXTS[name])
        return parse_file_sharded(path, kind=kind, source="s", num_shards=2, pool=pool,
                                  min_speedup=float("inf"))[1].predicted_speedup
    assert predicted("25_torchtitan_2025_rank0_prefix_gc_profiler.txt") < predicted("02_nccl_busid_p2p_ipc_read_container.txt")


# ---------------------------------------------------------------- ingest_file

@pytest.fixture
def python_path(monkeypatch):
    """The parsers' Python path (compiled scanners off), where ingest_file shards big files."""
    import ingest.parsers
    monkeypatch.setattr(ingest.parsers, "NATIVE", False)


def test_files_of_natively_scanned_kinds_are_not_sharded(tmp_path, monkeypatch):
    """With a compiled scanner built, one process reads faster than shards whose records travel
    back pickled (benchmarks/results/parsers.json), so ingest_file does not shard."""
    import ingest.sharded
    from ingest.thirdparty import scanned_natively
    path = write(tmp_path, "m.log", TEXTS["17_megatron_2022_bert_timers_memory.txt"] * 60)
    if not scanned_natively("megatron"):
        pytest.skip("the compiled training-log scanner is not built here")
    calls = []
    monkeypatch.setattr("ingest.thirdparty.parse_file_sharded", lambda *a, **k: calls.append(a))
    ingest_file(path, max_workers=3, shard_min_bytes=0)
    assert calls == [] and ingest.sharded.can_shard("megatron")


def test_ingest_file_shards_big_files_and_can_be_told_not_to(tmp_path, python_path):
    text = TEXTS["17_megatron_2022_bert_timers_memory.txt"]
    path = write(tmp_path, "m.log", text * 60)
    plain = ingest_file(path, max_workers=1)
    assert plain.result == parse_text(iter_text_blocks(path), source=str(path), kind="megatron")
    sharded = ingest_file(path, max_workers=3, shard_min_bytes=0)
    assert outcome(sharded.result) == outcome(plain.result) and sharded.path == plain.path
    assert ingest_file(path, shard_min_bytes=0).result == plain.result  # one shard per CPU
    with pytest.raises(ParseError, match="cannot read"):
        ingest_file(tmp_path / "missing.log", max_workers=3, shard_min_bytes=0)



def test_ingest_files_and_cli_jobs(tmp_path, capsys, python_path):
    """A file of SHARD_MIN_BYTES, alone, is sharded by ingest_files on the Python path; the CLI's
    --jobs 1 parses in one process; the tables are the same either way."""
    logs = tmp_path / "logs"
    logs.mkdir()
    text = TEXTS["08_nccl_cumem_read_cloudwatch_ts_lines.txt"]
    big = write(logs, "cw.log", text * (SHARD_MIN_BYTES // len(text) + 1))
    (got,) = ingest_files([big], max_workers=2)
    assert outcome(got.result) == outcome(ingest_file(big, max_workers=1).result)
    for jobs in ("1", "2"):
        assert main([str(logs), "--out", str(tmp_path / f"out{jobs}"), "--jobs", jobs]) == 0
    for table in (tmp_path / "out1").iterdir():
        assert pd.read_parquet(table).equals(pd.read_parquet(tmp_path / "out2" / table.name)), table.name
    assert main([str(logs), "--jobs", "0"]) == 2
    assert "--jobs: must be at least 1, got 0" in capsys.readouterr().err
