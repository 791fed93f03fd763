"""Failure reports (torchrun, NCCL watchdog, CUDA OOM) as events."""
from __future__ import annotations

from pathlib import Path

import pytest

from ingest.parsers.failures import parse_failures

FIXTURES = Path(__file__).parent / "fixtures" / "real"


def events(name):
    r = parse_failures((FIXTURES / name).read_text(encoding="utf-8"), source=name)
    return r, [x for x in r.records if x["table"] == "events"]


def pick(rec, *keys):
    return tuple(rec.get(k) for k in keys)


def test_childfailed_multi_failures_and_root_cause_truncated():
    r, ev = events("51_torchrun_childfailed_multi_failures_sigabrt.txt")
    (tb,) = [e for e in ev if e["event"] == "traceback"]  # the excerpt starts inside the launcher's traceback
    assert pick(tb, "exception", "num_frames", "frame_user") == (
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError", 2, None)
    assert tb["frame_framework"].endswith("torch/distributed/launcher/api.py:246 (launch_agent)")
    ev = [e for e in ev if e["event"] != "traceback"]
    assert [pick(e, "event", "rank", "local_rank", "exitcode", "pid", "signal", "root_cause", "script") for e in ev] == [
        ("child_failed", 1, 1, -6, 2385923, "SIGABRT", False, "tools/train.py"),
        ("child_failed", 2, 2, -6, 2385924, "SIGABRT", False, "tools/train.py"),
        ("child_failed", 0, 0, -6, 2385922, None, True, "tools/train.py"),  # block ends before its traceback line
    ]
    assert ev[0]["time"] == "2023-06-14_22:36:10" and r.unparsed == 0


def test_childfailed_sigkill_py311_carets():
    r, ev = events("53_torchrun_childfailed_sigkill_py311_carets.txt")
    tb, e = ev  # the launcher's traceback (the excerpt starts inside it), then the failure entry
    assert pick(tb, "event", "exception", "num_frames") == (
        "traceback", "torch.distributed.elastic.multiprocessing.errors.ChildFailedError", 4)
    assert pick(e, "rank", "exitcode", "signal", "root_cause", "detail") == \
        (0, -9, "SIGKILL", True, "Signal 9 (SIGKILL) received by PID 14750")
    assert r.unparsed == 0


def test_watchdog_2022_legacy():
    _, ev = events("54_watchdog_2022_legacy_no_numel.txt")
    assert [e["rank"] for e in ev] == [1, 3, 2, 6, 7]
    assert pick(ev[0], "event", "seq_num", "op_type", "timeout_s", "ran_for_s", "numel_in", "time", "loc") == \
        ("nccl_timeout", 469508, "ALLREDUCE", 1800.0, 1802.212, None, None, "ProcessGroupNCCL.cpp:737")


def test_watchdog_2025_double_prefix_numel_and_work_counters():
    _, ev = events("56_watchdog_2025_lineno_and_rank_prefix.txt")
    assert [pick(e, "event", "rank") for e in ev] == [("nccl_timeout", 0), ("nccl_timeout", 4),
                                                      ("watchdog_exception", 0), ("watchdog_exception", 3)]
    assert pick(ev[0], "seq_num", "numel_in", "numel_out", "timeout_s", "ran_for_s", "time") == \
        (1580, 466119168, 466119168, 600.0, 600.06, "321 02:07:08.408271257")
    assert pick(ev[2], "pg_id", "seq_num", "last_enqueued_seq", "last_completed_seq") == (1, 1580, 1582, 1579)


def test_fr_dump_trigger_torchx_prefix():
    r, ev = events("58_watchdog_fr_dump_trigger_torchx_glog_prefix.txt")
    assert [pick(e, "event", "rank", "pg_id", "time") for e in ev] == [("fr_dump", 0, 0, "0927 12:07:22.643702")]
    env = [x for x in r.records if x["table"] == "env"]
    assert [(x["key"], x["value"]) for x in env] == [("NCCL_PROFILER_PLUGIN", "/data/users/user/src/scripts/plugin/libnccl_profiler_plugin.so")]
    assert r.unparsed_lines == ()  # the plugin's glog info line is read (no failure in it)


def test_oom_torch20_style():
    r, (e,) = events("60_oom_msg_torch2.0_style_then_app_output.txt")
    assert pick(e, "event", "gpu", "mem_tried_gib", "mem_total_gib", "mem_free_gib", "mem_reserved_gib") == \
        ("cuda_oom", 0, 1.69, 14.56, 1.31, 1.01)
    assert e["mem_allocated_gib"] == pytest.approx(649.97 / 1024)
    assert r.unparsed_lines == (2,)


def test_oom_torch22_expandable_segments():
    _, (e,) = events("62_oom_msg_torch2.2plus_expandable_segments.txt")
    assert pick(e, "gpu", "mem_total_gib", "mem_in_use_gib", "mem_allocated_gib", "hint") == \
        (0, 23.65, 23.6, 22.9, "expandable_segments")
    assert e["mem_tried_gib"] == pytest.approx(22 / 1024)
    assert e["mem_free_gib"] == pytest.approx(11.06 / 1024)


def test_pg_guid_generation_and_agent_lines_with_rank_prefix():
    text = "\n".join([
        "[rank1]:[E1105 10:00:00.000000000 ProcessGroupNCCL.cpp:1595] [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group "
        "watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation timeout: "
        "WorkNCCL(SeqNum=7, OpType=_ALLGATHER_BASE, NumelIn=16, NumelOut=32, Timeout(ms)=60000) ran for 60001 milliseconds before timing out.",
        "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f in /lib/libc10.so)",
        "W0726 10:59:50.786825 139 torch/distributed/elastic/multiprocessing/api.py:858] Sending process 1322 closing signal SIGTERM",
        "E0726 10:59:51.000000 139 torch/distributed/elastic/multiprocessing/api.py:826] failed (exitcode: -9) local_rank: 0 (pid: 1322) of binary: /usr/bin/python",
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which 1.00 GiB is free.",
    ])
    r = parse_failures(text, source="s")
    ev = [x for x in r.records if x["table"] == "events"]
    assert [pick(e, "event", "rank") for e in ev] == [("watchdog_terminated", 1), ("nccl_timeout", 1), ("closing_signal", None),
                                                       ("agent_failed", None), ("cuda_oom", 0)]  # the thread died of the timeout
    assert pick(ev[1], "pg_id", "seq_num", "op_type", "numel_out", "timeout_s") == (0, 7, "_ALLGATHER_BASE", 32, 60.0)
    assert r.unparsed == 0


def test_tracebacks_of_interleaved_ranks_are_records_with_their_exceptions():
    """Two ranks' tracebacks (launcher prefixes) interleaved line by line: one record each, with the
    exception, the innermost frame of the user's code and of the framework; frames and source lines read."""
    rank0 = ['Traceback (most recent call last):', '  File "/home/user/train.py", line 40, in <module>', '    main()',
             '  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py", line 81, in wrapper',
             '    return func(*args, **kwargs)', 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB']
    rank1 = ['Traceback (most recent call last):', '  File "/home/user/train.py", line 33, in step',
             '    loss.backward()', 'RuntimeError: boom']
    lines = []
    for i in range(max(len(rank0), len(rank1))):
        lines += [f"[rank0]: {rank0[i]}"] if i < len(rank0) else []
        lines += [f"[rank1]: {rank1[i]}"] if i < len(rank1) else []
    r = parse_failures("\n".join(lines) + "\n", source="t")
    tbs = sorted((e for e in r.records if e.get("event") == "traceback"), key=lambda e: e["rank"])
    assert [pick(e, "rank", "exception", "detail", "num_frames", "frame_user") for e in tbs] == [
        (0, "torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", 2, "/home/user/train.py:40 (<module>)"),
        (1, "RuntimeError", "boom", 1, "/home/user/train.py:33 (step)")]
    assert tbs[0]["frame_framework"].endswith("torch/distributed/c10d_logger.py:81 (wrapper)")
    assert [e["event"] for e in r.records if e.get("event") == "cuda_oom"] == ["cuda_oom"]  # the line is also the OOM
    assert r.unparsed == 0


def test_flight_recorder_analyzer_report_names_the_missing_rank():
    """torchfrtrace -v output (tests/corpus/failures/014): the collective not every rank joined, with its
    group, op, missing and expected ranks and stack; the Groups table as groups; progress lines read."""
    from ingest.parsers.dispatch import parse_text
    path = Path(__file__).parent / "corpus" / "failures" / "014_fr_trace_analyzer_verbose_tables.txt"
    r = parse_text(path.read_text(encoding="utf-8"), source="fr")
    (ev,) = [x for x in r.records if x["table"] == "events"]
    assert pick(ev, "event", "seq_num", "entry", "group", "collective", "missing_ranks", "num_ranks", "state", "detail") == (
        "fr_not_all_joined", 3, 2, "0:default_pg", "nccl:all_reduce", "{1}", 2, "scheduled",
        "<module> at /home/user/test/c.py:66")
    (group,) = [x for x in r.records if x.get("record") == "fr_group"]
    assert pick(group, "comm_group", "desc", "num_ranks_per_comm") == ("09000494312501845833", "default_pg", 2)
    assert r.kinds == ("flight_recorder",) and r.unparsed_lines == (1,)  # the torchfrtrace command line


def test_allocator_limit_oom_and_memory_summary():
    """The OOM torch raises under a memory fraction (figures one per line, the limit's value wrapped
    onto a line of its own) and memory_summary()'s box after it (tests/corpus/failures/037)."""
    from ingest.parsers.dispatch import parse_text
    path = Path(__file__).parent / "corpus" / "failures" / "037_oom_allocator_memory_fraction_summary_table.txt"
    r = parse_text(path.read_text(encoding="utf-8"), source="oom")
    (oom,) = [x for x in r.records if x.get("event") == "cuda_oom"]
    assert pick(oom, "gpu", "mem_allocated_gib", "mem_tried_gib", "mem_total_gib", "mem_free_gib", "mem_limit_gib") == (
        0, 10.48, 21.81, 15.93, 0.0, 17179869184.0)
    (summary,) = [x for x in r.records if x["table"] == "memory"]
    assert pick(summary, "label", "gpu", "mem_allocated_gib", "mem_max_allocated_gib") == (
        "memory_summary", 0, 10471 / 1024, 11303 / 1024)
    assert r.unparsed_lines == (1,)  # the source line above the exception, its frame header cut away


def _cut_warnings(text: str) -> list[str]:
    from ingest.parsers.dispatch import parse_text

    return [w for w in parse_text(text, source="t").warnings if "cut (truncated)" in w]


def test_text_ending_inside_a_record_or_block_is_said_cut():
    """The class: a text that ends where its grammar leaves something open (a glog head before its
    'file:line]', torchrun's report before its entries, an options block shorter than one before it,
    the watchdog's exception cut in its first words, a bracket left open) gets a 'may be cut' warning;
    the same texts whole get none."""
    glog = "[rank3]:[E ProcessGroupNCCL.cpp:1200] [PG 2 Rank 3] ProcessGroupNCCL preparing to dump debug info.\n"
    assert _cut_warnings(glog + "E0901 01:02:03.000004 4242 torch/distrib\n")  # (unread: not counted unparsed)
    assert parse_failures(glog + "E0901 01:02:03.000004 4242 torch/distrib\n", source="t").unparsed == 0
    assert not _cut_warnings(glog)
    report = "=" * 40 + "\ntrain.py FAILED\n" + "-" * 40 + "\nFailures:\n  <NO_OTHER_FAILURES>\n"
    r = parse_failures(report, source="t")
    assert [pick(e, "event", "script", "rank") for e in r.records] == [("child_failed", "train.py", None)]
    assert _cut_warnings(report)
    whole = report + "-" * 40 + "\nRoot Cause (first observed failure):\n[0]:\n  time      : 2024-01-02_03:04:05\n" \
        "  rank      : 5 (local_rank: 1)\n  exitcode  : -9 (pid: 777)\n  traceback : Signal 9 (SIGKILL) received by PID 777\n" + "=" * 40 + "\n"
    assert not _cut_warnings(whole)
    assert [pick(e, "event", "rank", "pid") for e in parse_failures(whole, source="t").records] == [("child_failed", 5, 777)]
    opts = "I0102 03:04:05.000006 11 ProcessGroupNCCL.cpp:700] [Rank {r}] ProcessGroupNCCL initialized with following options:\n"
    block = "NCCL_ASYNC_ERROR_HANDLING: 0\nNCCL_DESYNC_DEBUG: 1\nNCCL_BLOCKING_WAIT: 1\nTIMEOUT(ms): 900000\n"
    assert not _cut_warnings(opts.format(r=0) + block + opts.format(r=3) + block)
    assert _cut_warnings(opts.format(r=0) + block + opts.format(r=3) + block[:60])
    wd = "[E ProcessGroupNCCL.cpp:1500] [PG 0 Rank 2] NCCL watchdog thread terminated with exception: [Rank 2] Watchdog "
    assert _cut_warnings(wd + "caught collec\n")
    assert not _cut_warnings(wd + "caught collective operation timeout: WorkNCCL(SeqNum=3, OpType=ALLGATHER, "
                             "Timeout(ms)=60000) ran for 60001 milliseconds before timing out.\n")
    lines = "[2024-01-02 03:04:05,006] [INFO] [logging.py:96:log_dist] [Rank 0] step=7, skipped=0, lr=[0.5], mom=[(0.9, 0.99)]\n"
    assert not _cut_warnings(lines)
    assert _cut_warnings(lines + lines.replace("step=7", "step=8")[:-12] + "\n")


def test_deepspeed_launcher_kill_and_exit_and_engine_version():
    """DeepSpeed's launcher (launch.py sigkill_handler: 'Killing subprocess N', then '<argv> exits with
    return code = N') as events of both grammars; the engine's 'DeepSpeed info: version=' as env."""
    from ingest.parsers.dispatch import parse_text

    text = ("[2024-02-03 04:05:06,007] [INFO] [logging.py:96:log_dist] [Rank 0] DeepSpeed info: version=0.14.2, git-hash=abc, git-branch=main\n"
            "[2024-02-03 04:05:09,001] [INFO] [launch.py:316:sigkill_handler] Killing subprocess 4242\n"
            "[2024-02-03 04:05:09,002] [ERROR] [launch.py:322:sigkill_handler] ['/usr/bin/python', '-u', 'train.py', "
            "'--local_rank=1'] exits with return code = -11\n")
    r = parse_text(text, source="t")
    assert r.unparsed == 0 and set(r.kinds) == {"deepspeed", "failures"}
    assert [(x["key"], x["value"]) for x in r.records if x["table"] == "env"] == [("deepspeed_version", "0.14.2")]
    assert [(e["event"], e.get("exitcode")) for e in r.records if e["table"] == "events"] == [
        ("subprocess_killed", None), ("launcher_exit", -11)]


def test_another_process_line_between_a_frame_and_its_source_line():
    """An NCCL line without a rank written between a rank's traceback frame and its source line is
    NCCL's, and the source line is still the frame's."""
    from ingest.parsers.dispatch import parse_text
    nccl = "nodeb:65671:65858 [5] NCCL INFO Channel 01 : 13[92000] -> 4[89000] [send] via NET/IB/0/GDRDMA"
    text = "\n".join(["[rank0]: Traceback (most recent call last):", '[rank0]:   File "/x/sft.py", line 67, in <module>',
                      nccl, "[rank0]:     trainer.train()", "[rank0]: RuntimeError: boom"])
    r = parse_text(text, source="t")
    tb = [x for x in r.records if x.get("event") == "traceback"]
    assert r.unparsed == 0 and len(tb) == 1 and tb[0]["exception"] == "RuntimeError" and tb[0]["rank"] == 0
    assert any(x.get("transport") == "NET/IB/0/GDRDMA" for x in r.records)


def test_a_line_of_another_rank_after_a_frame_is_not_its_source_line():
    from ingest.parsers.dispatch import parse_text
    step = "[rank0]:[titan] 2025-06-16 22:31:46,869 - root - INFO - step: 240  loss:  5.8311  memory: 49.66GiB(52.28%)  tps: 5864"
    text = "\n".join(["[rank1]: Traceback (most recent call last):", '[rank1]:   File "/x/test.py", line 8, in <module>',
                      step, "[rank1]:     dist.all_reduce(data)", "[rank1]: RuntimeError: boom"])
    r = parse_text(text, source="t")
    assert [x["step"] for x in r.records if x["table"] == "steps"] == [240] and r.unparsed == 0


def test_nccl_last_error_message_joins_its_error():
    from ingest.parsers.dispatch import parse_text
    text = "\n".join(["torch.distributed.DistBackendError: NCCL error in: ../ProcessGroupNCCL.cpp:1333, unhandled system "
                      "error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.6", "Last error:",
                      "h:1:2 [0] NCCL INFO Bootstrap : Using eth0:192.0.2.1<0>",
                      "socketStartConnect: Connect to 192.0.2.14<52822> failed : No route to host"])
    r = parse_text(text, source="t")
    (err,) = [x for x in r.records if x.get("event") == "nccl_error"]
    assert err["last_error"] == "socketStartConnect: Connect to 192.0.2.14<52822> failed : No route to host"
    assert r.unparsed == 0


def test_source_line_under_another_ranks_prefix_right_after_its_frame():
    """Random launcher prefixes (tests/test_parsers_properties.py): a frame of one rank, the next line
    (code, no exception, no record) under another rank whose traceback is open is the frame's source line."""
    from ingest.parsers.dispatch import parse_text
    text = "\n".join(["[rank3]:Traceback (most recent call last):", '[80746] [rank0]:  File "/x/api.py", line 138, in __call__',
                      "[rank3]:    return launch_agent(self._config)", "[rank3]:RuntimeError: boom"])
    assert parse_text(text, source="t").unparsed == 0
