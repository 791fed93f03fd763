"""Shared parser machinery: normaliser, line routing and the unparsed count of every real fixture."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from ingest.parsers import ParseResult, detect_kind, iter_lines
from ingest.parsers.dispatch import WHOLE_TEXT_KINDS, parse_text

FIXTURES = Path(__file__).parent / "fixtures" / "real"

# file -> (detected kind, records, unparsed lines). Every file of the real corpus is listed;
# kinds without a parser yet report all their non-blank lines unparsed (issue 3, remaining work).
EXPECTED = {
    "01_nccl_oldfmt_busid_ib_2node.txt": ("nccl", 9, 0),
    "02_nccl_busid_p2p_ipc_read_container.txt": ("nccl", 6, 0),
    "04_nccl_ib_2node_rings_trees_mnnvl.txt": ("nccl", 11, 0),
    "06_nccl_nvls_shm_h800_devremap.txt": ("nccl", 12, 1),  # "[trimmed]"
    "08_nccl_cumem_read_cloudwatch_ts_lines.txt": ("nccl", 5, 0),
    "10_nccl_topo_graph_dump_h100.txt": ("nccl", 16, 0),
    "11_nccl_topo_v100_indented_paste.txt": ("nccl", 11, 0),
    "12_nccl_tests_h20_cumem_ib_2node.txt": ("nccl", 20, 2),  # two "[trimmed]"
    "14_nccl_socket_error_unwind_abort_watchdog.txt": ("nccl", 14, 0),
    "15_nccl_ras_client_mismatch_2.26.txt": ("nccl_ras", 9, 0),
    "17_megatron_2022_bert_timers_memory.txt": ("megatron", 30, 6),  # dataset chatter + "[trimmed]"
    "19_megatron_llm_fork_iteration_plain.txt": ("megatron", 4, 0),
    "21_deepspeed_2022_timer_samplespersec_notebook.txt": ("deepspeed", 3, 20),  # IPython noise
    "23_deepspeed_2024_launcher_free_output.txt": ("deepspeed", 2, 3),  # free -h; the hostfile warning: an event
    "25_torchtitan_2025_rank0_prefix_gc_profiler.txt": ("torchtitan", 10, 0),
    "27_profiler_table_2020_left_aligned_old_cols.txt": ("profiler_table", 2, 0),
    "28_profiler_table_2021_right_aligned_self_cuda.txt": ("profiler_table", 1, 0),
    "30_chrome_trace_kineto_ncclDevKernel_fragment.json.txt": ("chrome_trace", 0, 7),
    "31_chrome_trace_nccl_profiler_plugin_v1.json.txt": ("chrome_trace", 0, 5),
    "33_nsys_stats_2025_text_nvtx_osrt_api.txt": ("nsys_stats", 9, 1),  # "[trimmed]"
    "35_nsys_nvprof_2021_legacy_api_stats.txt": ("nsys_stats", 2, 3),  # shell prompt, app output, a path
    "36_flight_recorder_dump_unpickled_v2.5.txt": ("flight_recorder", 3, 0),
    "38_pyspy_dump_zero3_allgather_hang.txt": ("pyspy", 7, 1),  # "[trimmed]"
    "40_topo_dgx2_nv6_16gpu_mlx5_no_numa.txt": ("nvidia_smi_topo", 108, 0),
    "41_topo_2017_mlx4_trailing_whitespace.txt": ("nvidia_smi_topo", 50, 0),
    "43_topo_nic_legend_mangled_42nics.txt": ("nvidia_smi_topo", 40, 3),  # mangled NIC0/NIC1, ulimit
    "45_nvsmi_q_2020_driver450_mig_field.txt": ("nvidia_smi_q", 25, 0),
    "47_collect_env_2020_torch1.7.txt": ("collect_env", 13, 0),
    "48_collect_env_2025_torch2.7_8xh100.txt": ("collect_env", 17, 0),
    "50_collect_env_vllm_sectioned_2025.txt": ("collect_env", 16, 1),  # "warnings.warn("
    "51_torchrun_childfailed_multi_failures_sigabrt.txt": ("failures", 4, 0),  # + the traceback
    "53_torchrun_childfailed_sigkill_py311_carets.txt": ("failures", 2, 0),  # + the traceback
    "54_watchdog_2022_legacy_no_numel.txt": ("failures", 5, 0),
    "56_watchdog_2025_lineno_and_rank_prefix.txt": ("failures", 4, 0),
    "58_watchdog_fr_dump_trigger_torchx_glog_prefix.txt": ("failures", 2, 0),  # "Profiler start dump": a glog info line
    "60_oom_msg_torch2.0_style_then_app_output.txt": ("failures", 1, 1),  # app output
    "62_oom_msg_torch2.2plus_expandable_segments.txt": ("failures", 1, 0),
    "64_nccl_2.28_h200_nvlink_tuning_names_graph.txt": ("nccl", 59, 1),  # "[trimmed]" (the torch warning: an event)
}


def test_every_fixture_is_listed():
    assert sorted(p.name for p in FIXTURES.glob("*.txt")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_kind_records_unparsed(name):
    text = (FIXTURES / name).read_text(encoding="utf-8")
    kind, num_records, unparsed = EXPECTED[name]
    assert detect_kind(text) == (kind if kind in ("chrome_trace", *WHOLE_TEXT_KINDS) else None)
    result = parse_text(text, source=name)
    assert (result.kind, len(result.records), result.unparsed) == (kind, num_records, unparsed)
    assert len(result.unparsed_lines) == unparsed
    assert all(r["source"] == name and r["line"] >= 1 for r in result.records)


def test_parse_result_is_frozen():
    r = ParseResult(records=[], unparsed=0, warnings=[], kind="nccl")
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.unparsed = 1  # type: ignore[misc]


@pytest.mark.parametrize("line, body, rank", [
    ("[rank3]: iteration 1/ 2 |", "iteration 1/ 2 |", 3),
    ("[1,3]<stdout>:host:1:2 [0] NCCL INFO x", "host:1:2 [0] NCCL INFO x", 3),
    ("[0] host:1:2 [0] NCCL INFO x", "host:1:2 [0] NCCL INFO x", None),
    ("trainer/0 [0]:E0927 12:07:22.643702 1 a.cpp:1] m", "E0927 12:07:22.643702 1 a.cpp:1] m", None),
    ("[default3]:hello", "hello", 3),
    ("\x1b[32m[rank0]:[titan] x\x1b[0m", "[titan] x", 0),
    ("      node-0:1:2 [3] NCCL INFO y   ", "node-0:1:2 [3] NCCL INFO y", None),
    ("[80746] [rank0]:[E321 x", "[E321 x", 0),
    ("(RayWorkerWrapper pid=626, ip=192.0.2.1) h:1:2 [0] NCCL INFO z", "h:1:2 [0] NCCL INFO z", None),
    # a tqdm bar whose redraw had no newline, another line glued after it (with or without the bar)
    ("[rank1]:Train:  41%|####1     | 410/1000 [02:03<02:57,  3.33it/s, loss=1.2][E x.cpp:1] m", "[E x.cpp:1] m", 1),
    ("Shards:  50% 1/2 [00:01<00:01,  1.10s/it]ERROR:root:y", "ERROR:root:y", None),
    ("Train:  41%|####1     | 410/1000 [02:03<02:57,  3.33it/s]", "Train:  41%|####1     | 410/1000 [02:03<02:57,  3.33it/s]", None),
    # a timestamp before a '- key: value' list item is a prefix; before Python logging's ' - name - LEVEL - ' it is the record's
    ("2024-05-01 12:00:00,123 - Python version: 3.10.13", "- Python version: 3.10.13", None),
    ("2024-05-01 12:00:00,123 - root - INFO - step: 1", "2024-05-01 12:00:00,123 - root - INFO - step: 1", None),
    ("[0m NCCL version 2.7.8+cuda11.1", "NCCL version 2.7.8+cuda11.1", None),  # a colour code whose ESC a paste lost
])
def test_normaliser_strips_prefixes(line, body, rank):
    assert [(b, r) for _, b, _, r in iter_lines(line)] == [(body, rank)]


def test_normaliser_strips_a_slurm_label_before_a_row_of_numbers_once_log_lines_carry_it():
    """'0:    32   8' alone may be a row whose first cell is '0:'; behind the label the text's log lines
    carry, it is that label."""
    rows = "  Nodes  Processes\n(total)   per node\n     32          8\n"
    assert [b for _, b, _, _ in iter_lines("0:    32          8")] == ["0:    32          8"]
    labelled = "".join("0: " + line + "\n" for line in rows.splitlines())
    assert [(b, r) for _, b, _, r in iter_lines(labelled)] == [("Nodes  Processes", 0), ("(total)   per node", 0), ("32          8", 0)]


def test_normaliser_strips_cat_n_numbers_before_a_markdown_table_and_from_two_lines():
    table = ["| a | b |", "| :- | -: |", "| z1 | 3 |"]
    assert [b for _, b, _, _ in iter_lines("\n".join(f"{i:>6}\t{line}" for i, line in enumerate(table, 1)))] == table
    assert [b for _, b, _, _ in iter_lines("    41 | first\n    42 | second")] == ["first", "second"]
    assert [(b, r) for _, b, _, r in iter_lines("1: first\n2: second")] == [("first", 1), ("second", 2)]  # Slurm labels


def test_normaliser_attaches_own_line_timestamp_to_next_line():
    text = "2024-12-04T05:27:45.082Z\nhost:1:2 [0] NCCL INFO Connected all rings\n\nplain"
    assert list(iter_lines(text)) == [
        (2, "host:1:2 [0] NCCL INFO Connected all rings", "2024-12-04T05:27:45.082Z", None),
        (4, "plain", None, None),
    ]


def test_normaliser_reads_a_tab_as_a_cell_gap_and_never_as_a_wrap():
    """A tab reads as the 2+ spaces the table grammars split on; a line holding one is not taken for
    a hard wrap although its length is a terminal width (its width on a terminal is not its length)."""
    header = " " * 8 + "\t".join(["GPU0"] * 40)[:152]  # 160 characters: a wrap width
    text = "\n".join([header, "GPU0\tX\tNV12", "GPU1\tNV12\tX"])
    assert [(n, b[:12]) for n, b, _, _ in iter_lines(text)] == [(1, "GPU0  GPU0  "), (2, "GPU0  X  NV1"), (3, "GPU1  NV12  ")]
    wrapped = "\n".join(["x" * 80, "tail", "x" * 79])  # a line of the width without tabs: rejoined
    assert [(n, len(b)) for n, b, _, _ in iter_lines(wrapped)] == [(1, 84), (3, 79)]


def test_wrap_joiner_tells_rows_padded_to_the_width_from_wrapped_rows():
    """Rows padded with blanks to a wrap width (each followed by another such row) stay rows; a wrapped
    table row whose full-width piece ends between cells is rejoined, indented continuation or not."""
    cell = lambda text: f"{text:<20}"  # noqa: E731 (DeepSpeed's comms logger: 20-character cells)
    padded = ["".join(cell(c) for c in ("Comm. Op", "Size", "Count", "Latency(ms)")) + " " * 40,
              "broadcast", *[" " * 20 + "".join(cell(c) for c in (f"{k}.0 KB", "2", "0.19")) + " " * 40 for k in (1, 2, 3)]]
    assert {len(line) for line in padded} == {120, 9}
    assert [n for n, _, _, _ in iter_lines("\n".join(padded))] == [1, 2, 3, 4, 5]
    row = "           8             2     float     sum      -1    135.8    0.00    0.00      0    123.5    0.00    0.00      0"
    wrapped = [row[:80], row[80:], row.replace("   8   ", "  16   ")[:80], row[80:]]
    assert [(n, b) for n, b, _, _ in iter_lines("\n".join(wrapped))] == [(1, row.strip()), (3, row.replace("   8   ", "  16   ").strip())]


def test_a_launcher_prefix_that_brings_a_padded_row_to_a_wrap_width_joins_nothing():
    """topo rows padded to 181 characters; a 39-character Ray prefix makes a row or two 220 long (a wrap
    width): they stay rows (found by test_parsers_properties' random prefixes)."""
    from ingest.parsers.dispatch import parse_text
    text = (FIXTURES / "41_topo_2017_mlx4_trailing_whitespace.txt").read_text(encoding="utf-8")
    plain = parse_text(text, source="t")
    ray = "(RayWorkerWrapper pid=1, ip=192.0.2.1) "
    for prefixed in ({0}, {4, 5}, {5}):
        lines = [ray + line if i in prefixed else line for i, line in enumerate(text.split("\n"))]
        got = parse_text("\n".join(lines), source="t")
        assert (got.unparsed, len(got.records)) == (plain.unparsed, len(plain.records)), prefixed


def test_wrap_joiner_reads_pieces_that_look_like_a_record_start():
    """A cut just before a word that repeats the line's first word, before NCCL's '[N] ' tree entries,
    or between the cells of a header whose cells look alike is rejoined; a line longer than the width
    never continues one; a single line wrapped in two pieces is rejoined too."""
    it = " iteration      122/  250000 | consumed samples:       124928 | elapsed time per iteration (ms): 86545.2 |"
    trees = "h:1:2 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1 [2] 1/-1/-1->0->-1 [3] 1/-1/-1->0->-1"
    head = "".join(f"{c:<8}" for c in [f"GPU{i}" for i in range(8)] + [f"NIC{i}" for i in range(4)]) + "CPU Affinity"
    for line in (it, trees, head):
        text = "\n".join([line[:80], line[80:], line[:80], line[80:]])
        assert [b for _, b, _, _ in iter_lines(text)] == [line.strip()] * 2, line
    from ingest.parsers import TextBlocks
    assert [n for n, _, _, _ in iter_lines(TextBlocks(["short\n" + "x" * 80, "y" * 90 + "\nz"]))] == [1, 2, 3, 4]
    ray = ("(RayTrainWorker pid=615, ip=192.0.2.10) r00-01-01-00-00-0001-raycluster-a1b2c-worker-l4-8-aaaaa:615:18953"
           " [2] NCCL INFO AllReduce: opCount 139d sendbuff 0x78d056200000 count 7382228")  # cut inside its host name
    bar = "  8%|" + "#" * 13 + " " * 150 + "| 1999/24128 [1:52:09<20:27:23,  3.33s/it]"  # a tqdm bar: a piece of blanks
    assert [b for _, b, _, _ in iter_lines("\n".join([bar[i:i + 80] for i in range(0, len(bar), 80)] + ["x" * 80, "y"]))][0] == bar.strip()
    pieces = [ray[i:i + 80] for i in range(0, len(ray), 80)]
    assert [b for _, b, _, _ in iter_lines("\n".join(pieces * 2))] == [ray[40:]] * 2
    rows = [f"{size:>12}{size // 4:>14}     float     sum      -1    131.6    0.06    0.12      0    130.6    0.06    0.12      0"
            for size in (2048, 4096, 8192, 16384)]  # right-aligned rows as wide as the width: rows, whatever follows
    assert {len(r) for r in rows} == {116}
    assert [n for n, _, _, _ in iter_lines("\n".join([*rows, "# Out of bounds values : 0 OK"]))] == [1, 2, 3, 4, 5]
    head = "h:1:2 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->1 [2] 1/-1/-1->0->1"  # 80 characters
    cont = head + "\n [3] 1/-1/-1->0->-1"  # the rest of NCCL's Trees list, from the blank before '[3] '
    assert [b for _, b, _, _ in iter_lines(cont + "\n" + cont)] == [head + " [3] 1/-1/-1->0->-1"] * 2
    assert [b for _, b, _, _ in iter_lines(it[:80] + "\n" + it[80:])] == [it.strip()]


def test_detect_kind_ignores_names_and_unknown_text():
    assert detect_kind("hello world\nnothing here\n") is None
    result = parse_text("hello\n\nworld\n", source="x.nccl.log")
    assert (result.kind, result.unparsed, result.unparsed_lines) == ("unknown", 2, (1, 3))


def test_rule_table_gate_rejects_exactly_what_no_rule_matches():
    """match_rules rejects a line with one alternation of the table's regexes; it must answer as
    trying the rules one by one does, and a table whose regexes cannot be joined (flags) is tried
    rule by rule."""
    import re

    from ingest.parsers import Col, Rule, match_rules, rule
    from ingest.parsers.failures import _LINE_RULES
    table = (rule("a", r"step (?P<n>\d+)$", "steps", Col("n", "step", int)), rule("b", r"(?P<k>NCCL_\w+)=", None))
    flagged = (Rule("c", re.compile(r"loss (?P<v>[\d.]+)", re.I), "steps"),) + table
    backref = (rule("d", r"(a)(b)x", None), rule("e", r"(?P<q>\w)(\w)\2", None))  # numbering would shift if joined
    lines = ["step 12", "step x", "NCCL_ALGO=ring", "LOSS 1.5", "", "kzz", "Traceback (most recent call last):",
             '  File "x.py", line 3, in f', "frame #3: foo", "failed (exitcode: 1) local_rank: 0 (pid: 7) of binary: t"]
    for rules in (table, flagged, backref, list(table), _LINE_RULES):
        for line in lines:
            one_by_one = next(((r, m) for r in rules for m in [r.regex.match(line)] if m), (None, None))
            got = match_rules(rules, line)
            assert (got[0], got[1] and got[1].group(0)) == (one_by_one[0], one_by_one[1] and one_by_one[1].group(0))
    assert match_rules(flagged, "LOSS 1.5")[0].name == "c"
    assert match_rules(table, "step x") == (None, None) and match_rules(backref, "kzz")[0].name == "e"


def test_chain_gate_reads_as_feeding_every_line(monkeypatch):
    """A chain whose parsers all have gates leaves unread the lines no gate passes while no parser
    is inside a block; the result must be what feeding every line gives: every fixture, and the
    fixtures' lines shuffled together (blocks cut, noise inside tables and tracebacks)."""
    import random

    from ingest.parsers import LineParser, deepspeed, deepspeed_tables, failures
    gated = [deepspeed.DeepSpeedParser, deepspeed_tables.FlopsProfileParser, deepspeed_tables.CommsLogParser,
             failures.FailureScanner]
    assert all(cls.gate for cls in gated)
    texts = {p.name: p.read_text(encoding="utf-8") for p in sorted(FIXTURES.parent.rglob("*.txt"))}
    rng = random.Random(7)
    pool = [line for name, text in texts.items() if any(k in name for k in ("deepspeed", "torchrun", "oom", "watchdog", "traceback"))
            for line in text.splitlines()]
    assert len(pool) > 150
    texts.update({f"shuffled{i}": "\n".join(rng.sample(pool, len(pool))) for i in range(20)})
    kinds = {name: ("deepspeed" if i % 2 else "failures") if name.startswith("shuffled") else None
             for i, name in enumerate(texts)}

    def parse_all():
        return {name: parse_text(text, source="s", kind=kinds[name]) for name, text in texts.items()}
    with_gates = parse_all()
    for cls in gated:
        monkeypatch.setattr(cls, "gate", LineParser.gate)
    assert parse_all() == with_gates
