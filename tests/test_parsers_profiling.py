"""Profiler tables, nsys stats, flight recorder, py-spy, NCCL RAS and DeepSpeed's flops-profiler /
comms-logger tables (issue 3): exact records and unparsed-line counts on the real fixtures, plus
constructed inputs where no real capture exists (each says where its format comes from)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ingest.parsers.dispatch import parse_text
from ingest.parsers.deepspeed import parse_deepspeed
from ingest.parsers.flight_recorder import parse_flight_recorder
from ingest.parsers.nccl_ras import parse_nccl_ras
from ingest.parsers.nsys_stats import parse_nsys_stats
from ingest.parsers.profiler_table import parse_profiler_table
from ingest.parsers.pyspy import parse_pyspy

FIXTURES = Path(__file__).parent / "fixtures"
REAL = FIXTURES / "real"


def read(name):
    return (REAL / name).read_text(encoding="utf-8")


def table(result, name):
    return [r for r in result.records if r["table"] == name]


def strip(rec, *drop):
    return {k: v for k, v in rec.items() if k not in ("source",) + drop}


def approx(rec):
    return {k: pytest.approx(v) if isinstance(v, float) else v for k, v in rec.items()}


def test_profiler_table_2020_old_left_aligned_columns():
    r = parse_profiler_table(read("27_profiler_table_2020_left_aligned_old_cols.txt"), source="p")
    cols = ("Name|Self CPU total %|Self CPU total|CPU total %|CPU total|CPU time avg|CUDA total %|CUDA total|"
            "CUDA time avg|Number of Calls")
    assert [strip(x) for x in r.records] == [approx(x) for x in [
        {"table": "kernels", "line": 4, "record": "profiler_row", "kind": "profiler_table", "rank": None, "columns": cols,
         "name": "aten::matmul", "self_cpu_pct": 0.17, "self_cpu_s": 890.805e-6, "cpu_total_pct": 99.05,
         "cpu_total_s": 0.523401, "cpu_avg_s": 5.234e-3, "cuda_total_pct": 49.91, "cuda_total_s": 0.791184,
         "cuda_avg_s": 7.912e-3, "num_calls": 100, "self_cuda_s": None},
        {"table": "kernels", "line": 5, "record": "profiler_row", "kind": "profiler_table", "rank": None, "columns": cols,
         "name": "aten::mm", "self_cpu_pct": 98.09, "self_cpu_s": 0.518336, "cpu_total_pct": 98.88,
         "cpu_total_s": 0.522511, "cpu_avg_s": 5.225e-3, "cuda_total_pct": 49.89, "cuda_total_s": 0.790885,
         "cuda_avg_s": 7.909e-3, "num_calls": 100, "self_cuda_s": None},
    ]]
    assert r.unparsed == 0 and r.warnings == []


def test_profiler_table_2021_right_aligned_self_cuda():
    r = parse_profiler_table(read("28_profiler_table_2021_right_aligned_self_cuda.txt"), source="p")
    (row,) = r.records
    assert strip(row, "columns") == approx({
        "table": "kernels", "line": 4, "record": "profiler_row", "kind": "profiler_table", "rank": None,
        "name": "cudaFree", "self_cpu_pct": 8.95, "self_cpu_s": 0.134888, "cpu_total_pct": 8.95, "cpu_total_s": 0.134888,
        "cpu_avg_s": 0.134888, "self_cuda_s": 0.0, "self_cuda_pct": 0.0, "cuda_total_s": 0.0, "cuda_avg_s": 0.0,
        "num_calls": 1})
    assert row["columns"].startswith("Name|Self CPU %|Self CPU|") and row["columns"].endswith("|# of Calls")
    assert r.unparsed == 0


def test_profiler_table_memory_flops_shapes_footer_and_row_before_header():
    # Constructed from torch/autograd/profiler_util.py _build_table's formats (memory in Gb/Mb/Kb/b,
    # "--" for missing FLOPs, input shapes, negative self memory, the two footers).
    text = "\n".join([
        "aten::orphan  1.00%  1.000us  1",  # a row before any header: unparsed
        "-" * 30 + "  " + "-" * 12,
        "Name  Self CPU %  Self CPU  CPU Mem  Self CPU Mem  CUDA Mem  # of Calls  Total MFLOPs  Input Shapes  ",
        "-" * 30 + "  " + "-" * 12,
        "aten::addmm  12.50%  1.500ms  1.50 Mb  -512 b  2.00 Gb  10  262.144  [[128], [128, 64], [64, 128]]  ",
        "my  spaced  op  0.50%  2.000s  0 b  0 b  --  1  --  []  ",
        "-" * 30 + "  " + "-" * 12,
        "Self CPU time total: 12.000ms",
        "Self CUDA time total: 1.203s",
        "aten::after_footer  1.00%  1.000us  0 b  0 b  0 b  1  --  []",  # table ended: unparsed
    ])
    r = parse_profiler_table(text, source="p")
    addmm, spaced = table(r, "kernels")
    assert (addmm["name"], addmm["self_cpu_s"], addmm["cpu_mem_bytes"], addmm["self_cpu_mem_bytes"], addmm["cuda_mem_bytes"],
            addmm["num_calls"], addmm["input_shapes"]) == ("aten::addmm", pytest.approx(1.5e-3), 1572864, -512, 2 * 2**30, 10,
                                                          "[[128], [128, 64], [64, 128]]")
    assert addmm["total_flops"] == pytest.approx(262.144e6)
    assert (spaced["name"], spaced["self_cpu_s"], spaced["cuda_mem_bytes"], spaced["total_flops"]) == ("my  spaced  op", 2.0, None, None)
    assert [(e["device"], e["duration_s"]) for e in table(r, "events")] == [("cpu", pytest.approx(0.012)), ("cuda", pytest.approx(1.203))]
    assert r.unparsed_lines == (1, 10)


NSYS_API = dict(table="kernels", record="nsys_row", kind="nsys_stats", rank=None, report=None, title=None, time_pct=0.0)


def test_nsys_stats_2025_text_nvtx_and_headerless_rows_after_gap():
    r = parse_nsys_stats(read("33_nsys_stats_2025_text_nvtx_osrt_api.txt"), source="n")
    nvtx, *api = r.records
    assert strip(nvtx) == approx({
        "table": "kernels", "line": 12, "record": "nsys_row", "kind": "nsys_stats", "rank": None, "report": "nvtx_sum",
        "title": "NVTX Range Summary", "time_pct": 100.0, "total_s": 2.272780509, "num_calls": 1, "avg_s": 2.272780509,
        "med_s": 2.272780509, "min_s": 2.272780509, "max_s": 2.272780509, "stddev_s": 0.0, "style": "PushPop",
        "name": "NCCL:ncclCommInitAll"})
    # the cuda_api_sum title and header were cut from the paste ("[trimmed]"): rows kept, report unknown
    assert [(a["line"], a["name"], a["num_calls"]) for a in api] == [
        (19, "cudaGraphExecDestroy_v10000", 886), (20, "cudaGraphExecUpdate_v10020", 2618),
        (21, "cudaStreamBeginCapture_v10000", 2618), (22, "cuMemCreate", 151), (23, "cudaStreamEndCapture_v10000", 2618),
        (24, "cudaMemset", 450), (25, "cuMemAddressReserve", 90), (26, "cudaMemsetAsync", 80)]
    assert strip(api[0]) == approx({**NSYS_API, "line": 19, "total_s": 29_190_202e-9, "num_calls": 886, "avg_s": 32_946.1e-9,
                                    "med_s": 28_269.5e-9, "min_s": 5_380e-9, "max_s": 186_469e-9, "stddev_s": 14_872.1e-9,
                                    "name": "cudaGraphExecDestroy_v10000"})
    assert r.unparsed_lines == (18,)  # "[trimmed]"
    assert len(r.warnings) == 1 and "report unknown" in r.warnings[0]


def test_nsys_legacy_nvprof_api_statistics():
    r = parse_nsys_stats(read("35_nsys_nvprof_2021_legacy_api_stats.txt"), source="n")
    assert [strip(x) for x in r.records] == [approx(x) for x in [
        {"table": "kernels", "line": 22, "record": "nsys_row", "kind": "nsys_stats", "rank": None, "report": "cuda_api_sum",
         "title": "CUDA API Statistics", "time_pct": 69.4, "total_s": 0.180806031, "num_calls": 1, "avg_s": 0.180806031,
         "min_s": 0.180806031, "max_s": 0.180806031, "med_s": None, "stddev_s": None, "name": "cuCtxCreate_v2"},
        {"table": "kernels", "line": 23, "record": "nsys_row", "kind": "nsys_stats", "rank": None, "report": "cuda_api_sum",
         "title": "CUDA API Statistics", "time_pct": 24.7, "total_s": 0.064331526, "num_calls": 1, "avg_s": 0.064331526,
         "min_s": 0.064331526, "max_s": 0.064331526, "med_s": None, "stddev_s": None, "name": "cuCtxDestroy_v2"},
    ]]
    assert r.unparsed_lines == (1, 5, 15)  # shell prompt, app output, exported path (nsys's WARNING is its own)


# Constructed, not captured (no real paste found): `nsys stats --format csv` output. Column names
# are those of nsys's reports/cuda_gpu_kern_sum.py ("Time:ratio_%" -> "Time (%)", "Total Time:dur_ns"
# -> "Total Time (ns)", "Instances", "Avg/Med/Min/Max/StdDev (ns)", "Name") and cuda_api_sum ("Num Calls").
NSYS_CSV = (FIXTURES / "nsys_stats_csv_constructed.txt")


def test_nsys_stats_csv_format():
    text = NSYS_CSV.read_text(encoding="utf-8")
    r = parse_text(text, source="c")
    assert r.kind == "nsys_stats" and r.kinds == ("nsys_stats",) and r.unparsed == 0
    rows = [(x["report"], x["name"], x["num_calls"], round(x["total_s"], 9), x["med_s"]) for x in r.records]
    assert rows == [
        ("cuda_gpu_kern_sum", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn", 1200, 1.5,
         pytest.approx(1.2e-3)),
        ("cuda_gpu_kern_sum", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 400, 0.5,
         pytest.approx(1.1e-3)),
        ("cuda_api_sum", "cudaLaunchKernel", 52000, 0.26, pytest.approx(4.1e-6)),
    ]
    # a bare CSV file (nsys stats --output writes one per report): no report name in the text
    bare = "\n".join(text.split("\n")[2:5])
    r = parse_text(bare, source="c")
    assert [(x["report"], x["name"]) for x in r.records] == [
        (None, "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn"),
        (None, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)")]


def test_flight_recorder_dump_unpickled():
    r = parse_flight_recorder(read("36_flight_recorder_dump_unpickled_v2.5.txt"), source="f")
    entry, status, config = r.records
    assert strip(entry) == {
        "table": "collectives", "line": 18, "record": "fr_entry", "kind": "flight_recorder", "rank": None,
        "fr_version": "2.5", "pg_id": 0, "record_id": 0, "collective_seq_id": 1, "p2p_seq_id": 0, "op_id": 1,
        "profiling_name": "nccl:all_reduce", "state": "completed", "time_created_ns": 1724779239936775119,
        "time_discovered_started_ns": None, "time_discovered_completed_ns": 1724779239975811724, "duration_s": None,
        "timeout_s": 600.0, "is_p2p": False, "retired": True, "pg": "0", "pg_desc": "default_pg",
        "collective": "all_reduce", "input_sizes": "[[3, 4]]", "output_sizes": "[[3, 4]]", "input_dtypes": "['Float']",
        "output_dtypes": "['Float']", "num_frames": 3,
        "top_frame": "test_short_pickle (pytorch/test/distributed/test_c10d_nccl.py:3647)"}
    assert strip(status) == {"table": "events", "line": 11, "event": "fr_pg_status", "kind": "flight_recorder", "rank": None,
                             "fr_version": "2.5", "pg_id": "0", "last_enqueued_collective": 2,
                             "last_started_collective": -1, "last_completed_collective": 2,
                             "detail": "pg 0: last enqueued #2, started #-1, completed #2"}
    assert strip(config) == {"table": "events", "line": 4, "event": "fr_pg_config", "kind": "flight_recorder", "rank": None,
                             "fr_version": "2.5", "pg_id": "0", "pg": "0", "pg_desc": "default_pg", "ranks": "[0, 1]",
                             "detail": "pg 0 (default_pg): ranks [0, 1]"}
    assert r.unparsed == 0 and r.warnings == ["1 entry elided ('...') in the dump"]


def test_flight_recorder_truncated_json_style_with_noise_around():
    lines = read("36_flight_recorder_dump_unpickled_v2.5.txt").split("\n")
    text = "dumping trace for rank 3:\n" + "\n".join(lines[:48])  # cut inside the entry, after "state"
    r = parse_flight_recorder(text, source="f")
    (entry,) = table(r, "collectives")
    assert (entry["collective_seq_id"], entry["state"], entry["num_frames"], entry["retired"]) == (1, "completed", 3, None)
    assert r.unparsed_lines == (1,) and r.warnings == ["line 49: dump cut short (truncated); entries up to here kept"]
    r = parse_flight_recorder(text.replace("dumping", "{not a dict"), source="f")
    assert r.records == [] and r.unparsed == 49 and "no complete dict literal" in r.warnings[0]


def test_pyspy_dump_threads_states_and_collectives():
    r = parse_pyspy(read("38_pyspy_dump_zero3_allgather_hang.txt"), source="s")
    got = [(x["line"], x["thread_id"], x["thread_name"], x["state"], x["num_frames"], x["top_frame"], x["collective"])
           for x in r.records]
    assert got == [
        (1, "42", "MainThread", "idle", 13, "backward (torch/autograd/__init__.py:266)", None),
        (15, "928", "Thread-1", "idle", 5, "wait (threading.py:324)", None),  # a Condition.wait is not a collective
        (21, "4076", None, "idle", 0, None, None),
        (22, "4077", None, "idle", 0, None, None),
        (23, "4078", None, "idle", 0, None, None),
        (24, "4079", None, "active", 6, "all_gather_into_tensor (torch/distributed/distributed_c10d.py:2709)",
         "all_gather_into_tensor"),
        (32, "3291", "MainThread", "active", 21, "all_gather_coalesced (deepspeed/runtime/zero/partition_parameters.py:1254)",
         "all_gather_coalesced"),
    ]
    t = r.records[5]
    assert t["collective_frame"] == t["top_frame"] and t["pid"] is None and t["table"] == "stacks"
    assert t["frames"].split(" <- ")[-1] == "log_wrapper (deepspeed/comm/comm.py:117)"
    assert r.unparsed_lines == (31,)  # "[trimmed]"


def test_pyspy_process_header_native_frames_locals_and_dist_wait():
    text = "\n".join([
        "Process 1234: python -m torch.distributed.run train.py",
        "Python v3.10.12 (/usr/bin/python3.10)",
        "",
        'Thread 0x7F3A2B (active+gil): "MainThread"',
        "    0x7f3a2b1c (libc.so.6)",
        "    wait (torch/distributed/distributed_c10d.py:4321)",
        "        Arguments:",
        "            self: <Work at 0x7f>",
        "    train_step (train.py:88)",
        "garbage between dumps",
    ])
    r = parse_pyspy(text, source="s")
    (t,) = r.records
    assert (t["pid"], t["thread_id"], t["state"], t["num_frames"], t["top_frame"], t["collective"]) == \
        (1234, "0x7F3A2B", "active+gil", 3, "0x7f3a2b1c (libc.so.6)", "wait")
    assert r.unparsed_lines == (10,)


def test_nccl_ras_mismatch_report():
    r = parse_nccl_ras(read("15_nccl_ras_client_mismatch_2.26.txt"), source="r")
    env = {x["key"]: x["value"] for x in table(r, "env")}
    assert env == {"nccl_version": "2.26.2", "cuda_build_version": "12.6", "cuda_runtime_version": "12060",
                   "cuda_driver_version": "12060"}
    job, group = table(r, "comm_topology")
    assert strip(job) == {"table": "comm_topology", "line": 9, "record": "ras_job", "kind": "nccl_ras", "num_nodes": 4,
                          "num_processes_per_node": 8, "num_gpus_per_process": 1, "num_processes": 32, "num_gpus": 32}
    assert strip(group) == {"table": "comm_topology", "line": 16, "record": "ras_comm_group", "kind": "nccl_ras",
                            "comm_group": 0, "num_comms": 1, "num_nodes_per_comm": 4, "ranks_per_node": 8,
                            "num_ranks_per_comm": 32, "num_ranks_in_group": 32, "status": "RUNNING", "errors": "MISMATCH"}
    block, r12, r13 = table(r, "events")
    assert strip(block) == {"table": "events", "line": 24, "record": "ras_block", "kind": "nccl_ras", "event": "ras_mismatch",
                            "status": "MISMATCH", "comm_group": "0-0", "comm_hash": "fa93daea854b060b", "section": "Warnings",
                            "rank": None, "detail": "Communicator ranks have different AllGather operation counts; "
                            "30 ranks have launched up to operation 640; 2 ranks have launched up to operation 641"}
    assert strip(r12) == {"table": "events", "line": 28, "record": "rank", "event": "ras_rank", "rank": 12, "gpu": "4",
                          "pid": 323032, "node": "192.0.2.24", "kind": "nccl_ras", "status": "MISMATCH",
                          "comm_hash": "fa93daea854b060b", "section": "Warnings"}
    assert (r13["rank"], r13["gpu"], r13["pid"]) == (13, "5", 323033)
    assert r.unparsed == 0 and r.warnings == []


def test_nccl_ras_errors_section_incomplete_dead_processes():
    # Constructed from NCCL src/ras/client_support.cc (rasClientRunComms) format strings.
    text = "\n".join([
        "Errors", "======", "",
        "INCOMPLETE", "  Missing communicator data from 1 job process",
        "  Process 4242 on node 192.0.2.7 managing GPUs 0,1",
        "#0-0 (00000000deadbeef) INCOMPLETE", "  Missing communicator data from 1 rank",
        "  Rank 3 -- [process information not found]",
    ])
    r = parse_nccl_ras(text, source="r")
    got = [(x["event"], x.get("rank"), x.get("pid"), x.get("gpu"), x.get("status")) for x in r.records]
    assert got == [("ras_incomplete", None, None, None, "INCOMPLETE"), ("ras_process", None, 4242, "0,1", "INCOMPLETE"),
                   ("ras_incomplete", None, None, None, "INCOMPLETE"), ("ras_rank", 3, None, None, "INCOMPLETE")]
    assert r.unparsed == 0


DS_FIXTURE = FIXTURES / "deepspeed_flops_profiler_comms_logger_constructed.txt"


def test_deepspeed_flops_profiler_and_comms_logger_tables():
    # Constructed from DeepSpeed's format strings: deepspeed/profiling/flops_profiler/profiler.py
    # (FlopsProfiler.print_model_profile) and deepspeed/utils/comms_logging.py (CommsLogger.append, log_all).
    r = parse_deepspeed(DS_FIXTURE.read_text(encoding="utf-8"), source="d")
    assert [s["step"] for s in table(r, "steps")] == [5, 6]
    (prof,) = table(r, "flops_profile")
    assert strip(prof) == approx({
        "table": "flops_profile", "line": 6, "record": "ds_flops_profile", "kind": "deepspeed", "rank": None, "step": 5,
        "world_size": 8, "dp_degree": 8, "mp_degree": 1, "micro_batch_size": 4, "device": "cuda:0", "input_shape": "(4, 1024)",
        "num_params_per_gpu": 124.44e6, "num_params": 124.44e6, "fwd_macs_per_gpu": 436.5e9, "fwd_flops_per_gpu": 873.11e9,
        "fwd_flops": 873.11e9, "fwd_latency_s": 25.4e-3, "fwd_flops_per_s_per_gpu": 34.37e12, "bwd_latency_s": 61.2e-3,
        "bwd_flops_per_s_per_gpu": 28.53e12, "fwd_bwd_flops_per_s_per_gpu": 30.24e12, "step_latency_s": 10.3e-3,
        "iter_latency_s": 96.9e-3, "flops_per_s_per_gpu": 27.03e12, "samples_per_s": 330.23})
    op, ar, ag0, ag1, straggler = table(r, "collectives")
    base = {"table": "collectives", "kind": "deepspeed"}
    assert strip(op) == approx({**base, "line": 44, "record": "ds_comm_op", "rank": 0, "collective": "all_reduce",
                                "caller": None, "msg_size_bytes": round(474.7 * 2**20), "num_calls": 1,
                                "algbw_gbps": 3172.37, "busbw_gbps": 2775.82, "latency_s": 2.51e-3})
    assert strip(ar) == approx({**base, "line": 47, "record": "ds_comms_summary", "rank": None, "collective": "all_reduce",
                                "caller": None, "msg_size_bytes": round(474.7 * 2**20), "num_calls": 20,
                                "total_latency_s": 50.2e-3, "avg_latency_s": 2.51e-3, "algbw_gbps": 3172.37,
                                "busbw_gbps": 2775.82})
    assert (ag0["collective"], ag0["caller"], ag0["msg_size_bytes"], ag0["num_calls"]) == \
        ("all_gather_into_tensor", "fetch_sub_module", 0, 3)
    assert (ag1["msg_size_bytes"], ag1["num_calls"], ag1["busbw_gbps"]) == (1536, 64, 53.76)
    assert strip(straggler) == approx({**base, "line": 56, "record": "ds_comms_straggler", "rank": None,
                                       "collective": "all_reduce", "caller": None, "msg_size_bytes": round(474.7 * 2**20),
                                       "num_calls": 20, "total_latency_s": 40e-3, "total_straggler_s": 10.2e-3,
                                       "avg_latency_s": 2e-3, "avg_straggler_s": 0.51e-3})
    assert r.unparsed_lines == (1, 2)  # the fixture's provenance comment


def test_hang_triage_reads_pyspy_through_the_parser():
    """ingest.hangs reads py-spy dumps with the one py-spy parser: Python frames innermost first,
    native frames left out; the innermost frame a collective when nothing is (threading's wait)."""
    from ingest.hangs import parse_pyspy_dump, summarize_stack
    text = "\n".join([
        'Thread 0x7F3A2B (active+gil): "MainThread"',
        "    0x7f3a2b1c (libc.so.6)",
        "    wait (torch/distributed/distributed_c10d.py:4321)",
        "    all_reduce (torch/distributed/distributed_c10d.py:2050)",
        "    train_step (runner/train.py:88)",
        'Thread 928 (idle): "Thread-1"',
        "    wait (threading.py:324)",
    ])
    main, other = parse_pyspy_dump(text)
    assert (main["tid"], main["state"], main["name"]) == ("0x7F3A2B", "active+gil", "MainThread")
    assert [f["func"] for f in main["frames"]] == ["wait", "all_reduce", "train_step"]
    assert summarize_stack([main, other]) == {
        "blocked_in": "wait", "frame": "wait (torch/distributed/distributed_c10d.py:4321)",
        "user_frame": "train_step (runner/train.py:88)"}
    waiting = summarize_stack([{**other, "name": "MainThread"}])
    assert waiting["blocked_in"] == "wait" and waiting["frame"] == "wait (threading.py:324)"
    threads = parse_pyspy_dump(read("38_pyspy_dump_zero3_allgather_hang.txt"))
    assert [t["tid"] for t in threads][:3] == ["42", "928", "4076"]
    assert summarize_stack(threads[-1:])["blocked_in"] == "all_gather_coalesced"


def test_table_row_or_memory_figures_cut_short_at_the_end_are_said_cut():
    """A profiler row with fewer cells than its header and the rows before it, or a see_memory_usage
    figure line without its figures, at the end of a text: 'may be cut'; the figure line is no label."""
    head = ("Name        Self CPU %   Self CPU    CPU total %   CPU total   CPU time avg   # of Calls\n"
            "aten::mm        41.00%     1.200ms      41.00%     1.200ms      0.300ms            4\n")
    cut = [w for w in parse_profiler_table(head + "aten::add       12.00%     0.350ms\n", source="t").warnings if "cut" in w]
    assert cut and "line 3" in cut[0]
    assert not [w for w in parse_profiler_table(head, source="t").warnings if "cut" in w]
    ds = ("[2025-01-02 03:04:05,006] [INFO] [utils.py:781:see_memory_usage] Before forward\n"
          "[2025-01-02 03:04:05,006] [INFO] [utils.py:782:see_memory_usage] MA 2.5 GB         Max_MA 3.0 GB         CA 4.0 GB         Max_CA 4 GB\n"
          "[2025-01-02 03:04:05,006] [INFO] [utils.py:789:see_memory_usage] CPU Virtual Memory:  used =\n")
    r = parse_deepspeed(ds, source="t")
    assert [m["label"] for m in r.records if m["table"] == "memory"] == ["Before forward"]
    assert [w for w in r.warnings if "line 3" in w and "cut" in w]
