"""What ingest extracts, checked against committed golden tables (tests/golden, see tests/golden.py):
every fixture through ``ingest_file``, the whole fixture set through ``ingest_files`` in worker
processes, plus exact records for line shapes and multi-line states no golden shows on its own
(repeated content, rows assembled from several lines, warnings given once, file newlines)."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from golden import fixture_paths, golden_path, ingest_outcome, load_golden, outcome
from ingest.io import iter_text_blocks
from ingest.parsers.dispatch import parse_text
from ingest.thirdparty import ingest_files

FIXTURES = fixture_paths()
REAL = Path(__file__).parent / "fixtures" / "real"
TEXTS = {p.name: p.read_text(encoding="utf-8") for p in FIXTURES}
HOW = "regenerate with `python -m tests.golden --update NAME` and read the diff before committing"


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name)
def test_fixture_matches_its_golden_tables(path):
    assert golden_path(path).is_file(), f"no golden for {path.name}: {HOW}"
    got, want = ingest_outcome(path), load_golden(path)
    for key in ("kind", "num_lines", "num_unparsed_lines", "unparsed_lines", "warnings", "num_records"):
        assert got[key] == want[key], f"{path.name}: {key} changed ({HOW})"
    for table, rows in want["tables"].items():
        for i, (g, w) in enumerate(zip(got["tables"][table], rows)):
            assert g == w, f"{path.name}: {table} record {i} (line {w.get('line')}) changed ({HOW})"
    assert got == want


def test_every_golden_has_its_fixture():
    names = {golden_path(p).name for p in FIXTURES}
    stale = sorted(p.name for p in golden_path(FIXTURES[0]).parent.glob("*.json") if p.name not in names)
    assert not stale, f"goldens without a fixture: {stale}; delete them"


def test_the_fixture_set_in_worker_processes_gives_the_goldens_in_input_order():
    """``ingest_files`` (a process pool, one file per task) returns each file's result in the
    order of the paths, each equal to its golden."""
    files = ingest_files(FIXTURES, max_workers=2)
    assert [f.path for f in files] == [str(p) for p in FIXTURES]
    assert [outcome(f, path=p) for f, p in zip(files, FIXTURES)] == [load_golden(p) for p in FIXTURES]


def test_a_file_gone_before_its_worker_reads_it_is_a_parse_error(tmp_path):
    from core.errors import ParseError
    paths = []
    for name in ("a.log", "b.log", "c.log"):
        paths.append(tmp_path / name)
        paths[-1].write_text(TEXTS["02_nccl_busid_p2p_ipc_read_container.txt"], encoding="utf-8")
    paths[1].unlink()
    with pytest.raises(ParseError, match=f"{paths[1]}: cannot read"):
        ingest_files(paths, max_workers=2)


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_crlf_and_lone_cr_files_give_the_golden_records(tmp_path, newline):
    for name in ("17_megatron_2022_bert_timers_memory.txt", "08_nccl_cumem_read_cloudwatch_ts_lines.txt"):
        path = tmp_path / name
        path.write_bytes(TEXTS[name].replace("\n", newline).encode("utf-8"))
        want = load_golden(REAL / name)
        got = outcome(parse_text(iter_text_blocks(path, block_chars=500), source=str(REAL / name), kind=want["kind"]),
                      path=REAL / name)
        assert got == want, name


@settings(max_examples=60, deadline=None)
@given(data=st.lists(st.sampled_from(["a", "NCCL", " ", "\n", "\r", "\r\n", "\n\n", "é", "\udcff"]), max_size=60),
       block_chars=st.sampled_from([1, 2, 3, 7, 1 << 20]))
def test_file_blocks_split_lines_as_python_does(tmp_path_factory, data, block_chars):
    """iter_text_blocks cuts lines where Python's universal newlines do (\\n, \\r\\n, lone \\r)."""
    path = tmp_path_factory.mktemp("blocks") / "log.txt"
    path.write_bytes("".join(data).encode("utf-8", errors="surrogateescape"))
    with open(path, encoding="utf-8", errors="replace", newline="") as f:
        want = [line.rstrip("\r\n") for line in f]
    got = [line for block in iter_text_blocks(path, block_chars=block_chars) for line in block.split("\n")]
    assert got == want


# ---------------------------------------------------------------- exact records of stateful shapes

def test_repeated_content_keeps_aggregated_tables_bounded():
    """Edges and calls repeat in long logs: their rows stay one per distinct key, counting."""
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


def test_per_call_lines_count_into_one_row_per_call_shape():
    shapes = ["h:1:1 [0] NCCL INFO AllReduce: opCount {i:x} sendbuff 0x7f{i:x} recvbuff 0x7f{j:x} count 1048576 "
              "datatype 7 op 0 root 0 comm 0x55 [nranks=8] stream 0x9",
              "h:1:1 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo 1 proto 2 time {i}.5",
              "h:2:2 [1] NCCL INFO Broadcast: opCount {i:x} sendbuff 0x{i:x} recvbuff 0x{j:x} count 240 datatype 0 op 0 root 0 comm 0x66"]
    lines = [shapes[i % 3].format(i=i, j=2 * i) for i in range(3000)]
    calls = [(r["record"], r["line"], r["num_calls"]) for r in parse_text("\n".join(lines), source="s", kind="nccl").records]
    assert calls == [("coll", 1, 1000), ("tuning", 2, 1000), ("coll", 3, 1000)]


def test_unknown_iteration_key_warned_once():
    lines = [f" iteration {i:8d}/ 100 | lm loss: 1.0 | new field: {i} | other: x |" for i in range(1, 200)]
    result = parse_text("\n".join(lines), source="s", kind="megatron")
    assert [w for w in result.warnings if "not in the pattern table" in w] == [
        "line 1: iteration field 'new field' not in the pattern table", "line 1: iteration field 'other' not in the pattern table"]
    assert len([r for r in result.records if r["table"] == "steps"]) == 199


def test_unknown_key_first_seen_empty_is_warned_when_it_has_a_value():
    text = "\n".join([" iteration 1/ 10 | lm loss: 1.0 | foo: |", " iteration 2/ 10 | lm loss: 1.0 | foo: 5 |",
                      " iteration 3/ 10 | lm loss: 1.0 | foo: 6 |"])
    assert parse_text(text, source="s", kind="megatron").warnings == ["line 2: iteration field 'foo' not in the pattern table"]


def test_separators_float_keeps_around_values():
    """float() and int() strip spaces, tabs and line ends, not \\x1c-\\x1f, which str.strip()
    takes as whitespace: the values are read all the same."""
    text = "\n".join([" iteration 1/ 10 | lm loss: 1.5 | consumed samples: 8 |",
                      " iteration 2/ 10 | lm loss: \x1c2.5\x1f | consumed samples: \x1c16 |",
                      " iteration 3/ 10 | lm loss: 3.5\x0b | consumed samples: 1,024\x1c |"])
    assert [(r["loss"], r["consumed_samples"]) for r in parse_text(text, source="s", kind="megatron").records] == [
        (1.5, 8), (2.5, 16), (3.5, 1024)]


def test_megatron_same_iteration_twice_keeps_its_first_line_and_real_loss():
    """A later line of the same iteration without a loss only sets a default; the row keeps the
    line it was made at; an unknown field is warned about once, at its first line."""
    a = " iteration       20/  100 | consumed samples: 640 | elapsed time per iteration (ms): 1234.5 | lm loss: 5.0E+00 | new thing: 3 |"
    b = " iteration       20/  100 | consumed samples: 640 | elapsed time per iteration (ms): 1300.0 | loss scale: 1.0 |"
    result = parse_text("\n".join([a, b, a, b]), source="s", kind="megatron")
    assert result.warnings == ["line 1: iteration field 'new thing' not in the pattern table"]
    (row,) = [r for r in result.records if r["table"] == "steps"]
    assert (row["line"], row["loss"], row["step_time_s"], row["loss_scale"]) == (1, 5.0, 1.3, 1.0)


PREFIX = "[2024-05-01 10:00:00,123] [INFO] "
TIMER = (PREFIX.replace("00,123", "09,999") + "[timer.py:260:stop] epoch=0/micro_step=11/global_step=11, "
         "RunningAvgSamplesPerSec=1.5, CurrSamplesPerSec=2.5")


def test_deepspeed_memory_triplets_reach_their_labels_and_steps():
    head = PREFIX + "[logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001]\n"
    triplet = "\n".join([PREFIX + "[utils.py:800:see_memory_usage] After forward",
                         "MA 1.5 GB         Max_MA 2.25 GB         CA 3.0 GB         Max_CA 3 GB ",
                         "CPU Virtual Memory:  used = 50.1 GB, percent = 10.2%"])
    text = head + triplet + "\n" + head.replace("step=10", "step=11") + triplet.replace("After forward", "After step") + "\n"
    mem = [r for r in parse_text(text, source="s", kind="deepspeed").records if r["table"] == "memory"]
    assert [(m["label"], m["step"], m["cpu_mem_used_gib"]) for m in mem] == [("After forward", 10, 50.1), ("After step", 11, 50.1)]


def test_deepspeed_rows_without_a_rank_join_the_last_named_rank():
    """Lines without a rank take the last rank named; a timer's time (setdefault) gives way to
    a step line's, never the other way round."""
    text = "\n".join([PREFIX + "[logging.py:96:log_dist] [Rank 0] step=4, skipped=0, lr=[0.1]",
                      TIMER.replace("11", "5"),
                      PREFIX.replace("00:00", "00:05") + "[logging.py:96:log_dist] step=7, skipped=0, lr=[0.1]",
                      PREFIX.replace("00:00", "00:07") + "[logging.py:96:log_dist] [Rank 0] step=5, skipped=0, lr=[0.1]",
                      TIMER.replace("11", "7"), TIMER.replace("11", "6"), ""])
    steps = [r for r in parse_text(text, source="s", kind="deepspeed").records if r["table"] == "steps"]
    assert [(r["rank"], r["step"], r["time"], r["line"]) for r in steps] == [
        (0, 4, "2024-05-01 10:00:00,123", 1), (0, 5, "2024-05-01 10:00:07,123", 2), (0, 7, "2024-05-01 10:00:05,123", 3),
        (0, 6, "2024-05-01 10:00:09,999", 6)]


def test_child_failed_script_is_carried_to_later_blocks():
    closed = TEXTS["51_torchrun_childfailed_multi_failures_sigabrt.txt"] + "=" * 56 + "\napp output\n"
    records = parse_text(closed * 3, source="s", kind="failures").records
    script = [r.get("script") for r in records if r.get("event") == "child_failed"]
    assert len(script) >= 3 and set(script) == {"tools/train.py"}


def test_parsers_freed_without_the_cycle_collector():
    """No reference cycle through the parser chain: its parsers (and their records) go when the
    parse returns, not at the next full collection."""
    import gc
    import weakref
    from unittest import mock

    import ingest.parsers
    parsers = []
    real = ingest.parsers.LineParser.__init__

    def spy(self, *args, **kwargs):
        parsers.append(weakref.ref(self))
        real(self, *args, **kwargs)
    gc.disable()
    try:
        with mock.patch.object(ingest.parsers.LineParser, "__init__", spy):
            for name in ("17_megatron_2022_bert_timers_memory.txt", "21_deepspeed_2022_timer_samplespersec_notebook.txt",
                         "25_torchtitan_2025_rank0_prefix_gc_profiler.txt", "02_nccl_busid_p2p_ipc_read_container.txt"):
                parse_text(TEXTS[name], source="s")
        assert len(parsers) >= 8 and all(ref() is None for ref in parsers)
    finally:
        gc.enable()
