"""NCCL parser on the real fixtures: exact records of interest."""
from __future__ import annotations

from pathlib import Path

from ingest.parsers.dispatch import parse_text
from ingest.parsers.nccl import parse_nccl

FIXTURES = Path(__file__).parent / "fixtures" / "real"


def parse(name):
    return parse_nccl((FIXTURES / name).read_text(encoding="utf-8"), source=name)


def of(result, record):
    return [r for r in result.records if r.get("record") == record or r.get("event") == record]


def transports(result):
    return sorted({(r["transport"], r["transport_kind"], r["direction"]) for r in of(result, "transport")})


def test_old_format_busid_brackets_direct_pointer_and_ib():
    r = parse("01_nccl_oldfmt_busid_ib_2node.txt")
    assert transports(r) == [("NET/IB/0/GDRDMA", "NET/IB", "receive"), ("NET/IB/0/GDRDMA", "NET/IB", "send"),
                             ("P2P/direct pointer/read", "P2P/direct", None)]
    edge = next(e for e in of(r, "transport") if (e["rank"], e["peer"]) == (8, 15))
    assert (edge["rank_id"], edge["peer_id"], edge["num_channels"], edge["channels"], edge["host"]) == \
        ("20000", "cf000", 2, "00,01", "nodeb")
    assert of(r, "thread_thresholds")[0]["thread_thresholds"] == "8/8/64 | 128/8/64 | 8/8/512"


def test_p2p_ipc_channel_slash_conn():
    r = parse("02_nccl_busid_p2p_ipc_read_container.txt")
    assert transports(r) == [("P2P/IPC/read", "P2P/IPC", None)]
    edge = next(e for e in of(r, "transport") if (e["rank"], e["peer"]) == (4, 3))
    assert (edge["channels"], edge["host"], edge["rank_id"]) == ("14,15,16", "0123456789ab", "901c0")


def test_comm_init_rings_trees():
    r = parse("04_nccl_ib_2node_rings_trees_mnnvl.txt")
    first = of(r, "comm_init")[0]
    assert {k: first[k] for k in ("comm", "rank", "num_ranks", "num_nodes", "num_local_ranks", "local_rank", "mnnvl")} == \
        {"comm": "0x8ec0ac0", "rank": 6, "num_ranks": 16, "num_nodes": 2, "num_local_ranks": 8, "local_rank": 6, "mnnvl": 0}
    rings = of(r, "ring")
    assert [(x["channel"], x["num_channels"]) for x in rings] == [(0, 8), (1, 8), (2, 8), (3, 8), (4, 8)]
    assert rings[0]["ring"] == "0 5 4 7 6 3 2 1 8 13 12 15 14 11 10 9"
    assert of(r, "tree")[0]["trees"].startswith("[0] 2/-1/-1->1->0 [1] -1/-1/-1->1->0")
    assert of(r, "p2p_chunksize")[0]["p2p_chunk_size_b"] == 131072


def test_nvls_channels_and_shm_without_conn():
    r = parse("06_nccl_nvls_shm_h800_devremap.txt")
    nvls = of(r, "nvls")[0]
    assert (nvls["nvls_head_rank"], nvls["nvls_num_heads"], nvls["nvls_total_size_b"]) == (3, 4, 805306368)
    ch = of(r, "channels")[0]
    assert (ch["num_coll_channels"], ch["num_collnet_channels"], ch["num_nvls_channels"], ch["num_p2p_channels"],
            ch["num_p2p_channels_per_peer"]) == (16, 0, 16, 16, 2)
    edges = {(e["rank"], e["peer"], e["rank_id"], e["cuda_dev"]): e["num_channels"] for e in of(r, "transport")}
    # the bracket is the device index and differs from the [cudaDev] prefix (device remap)
    assert edges == {(2, 3, "6", 2): 9, (3, 2, "7", 3): 3}
    assert transports(r) == [("SHM/direct/direct", "SHM", None)]
    assert r.unparsed_lines == (11,)


def test_cloudwatch_timestamps_and_cumem():
    r = parse("08_nccl_cumem_read_cloudwatch_ts_lines.txt")
    assert transports(r) == [("P2P/CUMEM/read", "P2P/CUMEM", None)]
    assert sum(e["num_channels"] for e in of(r, "transport")) == 12
    assert r.unparsed == 0


def test_graph_dumps():
    r = parse("10_nccl_topo_graph_dump_h100.txt")
    nodes = [(x["topo_link"], x["topo_link_bw_gbps"], x["topo_node_type"], x["topo_node_id"], x.get("topo_node_info"))
             for x in of(r, "topo_node")]
    assert nodes[1] == ("PCI", 24.0, "GPU", "84000", "4")
    assert nodes[2] == ("NVL", 370.8, "NVS", "0", None)
    assert nodes[6] == ("NET", 25.0, "NET", "5", "5/0/25.000000")
    r = parse("11_nccl_topo_v100_indented_paste.txt")
    assert of(r, "topo_system")[0]["topo_total_bw_gbps"] == 132.0
    assert [x["topo_link_bw_gbps"] for x in of(r, "topo_node") if x["topo_link"] == "NVL"] == [44.0, 44.0, 22.0, 22.0, 44.0]


def test_nccl_tests_header_env_and_init_complete():
    r = parse("12_nccl_tests_h20_cumem_ib_2node.txt")
    env = {x["key"]: x["value"] for x in r.records if x["table"] == "env"}
    assert env["cuda_driver_version"] == "12040"
    assert env["nccl_bootstrap"] == "ibs1130f0:192.0.2.11<0>"
    assert env["gpu.rank2"] == "NVIDIA H20-3e [0000:18:00] on host-b device 0"
    assert env["nccl_net_plugin"].startswith("dlerror=libnccl-net.so")
    done = of(r, "init_complete")
    assert [(x["rank"], x["num_ranks"], x["cuda_dev"], x["bus_id"], x["comm_id"]) for x in done][0] == \
        (1, 4, 1, "38000", "0xf021d9037f9243d8")
    assert transports(r) == [("NET/IB/2/GDRDMA", "NET/IB", "receive"), ("NET/IB/2/GDRDMA", "NET/IB", "send"),
                             ("NET/IB/3/GDRDMA", "NET/IB", "receive"), ("P2P/CUMEM", "P2P/CUMEM", None)]


def test_unwind_abort_and_watchdog_with_glued_tqdm_and_truncation():
    r = parse("14_nccl_socket_error_unwind_abort_watchdog.txt")
    unwind = of(r, "error_unwind")
    assert len(unwind) == 10
    assert (unwind[0]["loc_file"], unwind[0]["loc_line"], unwind[0]["nccl_result"], unwind[0]["line"]) == \
        ("misc/socket.cc", 829, 3, 1)  # glued behind a tqdm bar
    abort = of(r, "abort_complete")[0]
    assert (abort["rank"], abort["cuda_dev"], abort["detail"]) == (6, 2, "Abort COMPLETE")
    term = of(r, "watchdog_terminated")[0]
    assert (term["rank"], term["pg_id"], term["time"]) == (6, 1, "624 04:14:29.225547137")
    assert term["detail"] == "[Rank 6] Watchdog caught co"  # truncated last line kept as is


def test_synthetic_warn_tuning_coll_versions_and_plugins():
    text = "\n".join([
        "h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
        "h:1:1 [0] NCCL INFO Using network IB",
        "",
        "h:1:1 [0] transport/net_ib.cc:818 NCCL WARN NET/IB : Got completion with error 4, opcode 8983, len 0, vendor err 81",
        "",
        "h:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo 1 proto 2 time 25.874907",
        "h:1:1 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo 1 proto 2 time 26.0",
        "h:1:1 [0] NCCL INFO Broadcast: opCount 0 sendbuff 0x7f recvbuff 0x7f count 240 datatype 0 op 0 root 0 comm 0x55 [nranks=1] stream 0x9",
        "h:1:1 [0] NCCL INFO Broadcast: opCount 1 sendbuff 0x7f recvbuff 0x7f count 240 datatype 0 op 0 root 0 comm 0x55 [nranks=1] stream 0x9",
        "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/2",
        "h:1:1 [0] NCCL INFO CollNet 05/0 : 5 [receive] via COLLNET/SHARP/5/GDRDMA",
        "h:1:1 [0] NCCL INFO Channel 01/1 : 0[0] -> 1[1] via P2P/CUMEM/read",
        "h:1:1 [0] NCCL INFO Channel 02/0 : 0[0] -> 1[1] via NET/Socket/0",
        "[2026-05-05 06:16:47] node-01:189884:189884 [3] plugin/net.cc:334 NCCL WARN Failed to initialize any NET plugin",
        "h:1:1 [0] NCCL INFO NCCL_IB_HCA set by environment to mlx5_0",
        "h:1:1 [0] NCCL INFO something new in 2.29",
        "h:1:1 [0] NCCL INFO Using network IB",  # (an unread last line like the lines before it: named 'may be cut')
    ])
    r = parse_nccl(text, source="s")
    env = {x["key"]: x["value"] for x in r.records if x["table"] == "env"}
    assert env == {"nccl_version": "2.21.5+cuda12.4", "nccl_network": "IB", "NCCL_IB_HCA": "mlx5_0"}
    warns = of(r, "nccl_warn")
    assert [(w["loc_file"], w["loc_line"], w["line"]) for w in warns] == [("transport/net_ib.cc", 818, 4), ("plugin/net.cc", 334, 14)]
    tuning = of(r, "tuning")
    assert [(t["func"], t["size_b"], t["algo"], t["proto"], t["num_calls"]) for t in tuning] == [("AllReduce", 4096, 1, 2, 2)]
    coll = of(r, "coll")
    assert [(c["func"], c["count"], c["num_ranks"], c["num_calls"], c["first_op_count"]) for c in coll] == [("Broadcast", 240, 1, 2, 0)]
    assert transports(r) == [("COLLNET/SHARP/5/GDRDMA", "COLLNET/SHARP", "receive"), ("NET/IBext_v8/2", "NET/IBext_v8", "send"),
                             ("NET/Socket/0", "NET/Socket", None), ("P2P/CUMEM/read", "P2P/CUMEM", None)]
    assert r.unparsed_lines == (16,)


def test_streamed_lines_equal_the_text():
    for p in sorted(FIXTURES.glob("*nccl*.txt")):
        text = p.read_text(encoding="utf-8")
        whole, streamed = parse_nccl(text, source="s"), parse_nccl(iter(text.split("\n")), source="s")
        assert (streamed.records, streamed.unparsed_lines, streamed.num_lines) == (whole.records, whole.unparsed_lines,
                                                                                  whole.num_lines), p.name

def test_nccl_2_28_tuning_names_init_api_prefix_graph_and_timings():
    """NCCL 2.28 on two H200s (this project's examples/h200-2gpu): TUNING by name with a
    channel range, `ncclCommInitRankConfig comm ... - Init COMPLETE`, `Init timings`, the graph
    search's Pattern lines; the per-call lines aggregate by (func, bytes, algo, proto)."""
    r = parse("64_nccl_2.28_h200_nvlink_tuning_names_graph.txt")
    env = {x["key"]: x["value"] for x in r.records if x["table"] == "env"}
    assert env["nccl_version"] == "2.28.9+cuda13.0" and env["cuda_driver_version"] == "13000"
    assert env["nccl_network"] == "Socket" and env["NCCL_NVLS_ENABLE"] == "0."
    done = of(r, "init_complete")
    assert [(x["comm"], x["rank"], x["num_ranks"], x["cuda_dev"], x["bus_id"], x["comm_id"]) for x in done] == \
        [("0xc30d700", 0, 2, 0, "60", "0x972042f681bc850f")]
    assert [(x["rank"], x["num_ranks"], x["init_time_s"]) for x in of(r, "init_timings")] == [(0, 2, 0.52)]
    assert [(g["graph_pattern"], g["num_channels"], g["graph_bw_gbps"], g["graph_link_type"], g["graph_link_type_inter"])
            for g in of(r, "graph")] == [(4, 12, 30.0, "NVL", "PIX"), (1, 12, 60.0, "NVL", "PIX")]
    assert transports(r) == [("P2P/CUMEM", "P2P/CUMEM", None)]
    tuning = {(t["func"], t["size_b"]): t for t in of(r, "tuning_named")}
    rs = tuning[("ReduceScatter", 124574208)]
    assert (rs["algo_name"], rs["proto_name"], rs["algo"], rs["proto"], rs["channel_lo"], rs["channel_hi"],
            rs["num_calls"]) == ("RING", "SIMPLE", 1, 2, 0, 23, 2)
    assert (tuning[("Broadcast", 1536)]["proto_name"], tuning[("Broadcast", 1536)]["proto"],
            tuning[("Broadcast", 1536)]["num_calls"]) == ("LL", 0, 2)
    assert sum(t["num_calls"] for t in of(r, "tuning_named")) == 11
    assert r.unparsed == 1 and r.warnings == []  # "[trimmed]" (the torch W-line is a warning event)


def test_message_shapes_of_other_subsystems_versions_and_writers():
    """Classes: ALLOC messages after their 'file:line' (include/alloc.h), [Proxy Progress] cores,
    NCCL <= 2.6's 'Threads per block' and its network known only from 'NET/IB : Using' (no 'Using
    network'), two writers' lines glued (the first cut short), a log whose every head was stripped."""
    text = "\n".join([
        "n7:20:21 [1] NCCL INFO NET/IB : Using [0]mlx5_2:1/IB ; OOB ib0:192.0.2.3<0>",
        "n7:20:21 [1] NCCL INFO enqueue.cc:99 Cuda Alloc Size 2097152 pointer 0x7f00aa000000",
        "n7:20:21 [1] NCCL INFO proxy.cc:1 cuMem Alloc Size 4096 pointer 0x7f00ab000000 handle 0x1",
        "n7:20:22 [1] NCCL INFO [Proxy Progress] Device 1 CPU core 33",
        "n7:20:22 [1] NCCL INFO Threads per block : 256/640/256",
        "n7:20:22 [1] NCCL INFO n7:23:23 [3] NCCL INFO AllGather: opCount 5 sendbuff 0x1 recvbuff 0x2 count 8 datatype 7 op 0 root 0 comm 0x9 [nranks=4] stream 0x3",
    ])
    r = parse_nccl(text, source="s")
    assert r.unparsed == 0
    assert [(x["key"], x["value"]) for x in r.records if x["table"] == "env" and x["key"] == "nccl_network"] == [("nccl_network", "IB")]
    assert [(c["func"], c["pid"], c["cuda_dev"], c["count"]) for c in of(r, "coll")] == [("AllGather", 23, 3, 8)]
    assert "nccl_network" not in {x["key"] for x in parse_nccl(text + "\nn7:20:21 [1] NCCL INFO Using network Socket",
                                                                  source="s").records if x.get("value") == "IB"}
    bare = "NCCL_IB_GID_INDEX set by environment to 3\nBootstrap: Using eth1:192.0.2.4<0>\ncudaDriverVersion 12080\n" \
           "Comm config Blocking set to 0\nncclCommInitRankConfig comm 0x55aa rank 3 nranks 16 cudaDev 3 nvmlDev 3 busId 9b000 commId 0x1 - Init START\n" \
           "Setting affinity for GPU 3 to ffff0000\nBroadcast: opCount 2 sendbuff 0x1 recvbuff 0x1 count 9 datatype 0 op 0 root 0 comm 0x55aa [nranks=16] stream 0x2\n"
    r = parse_text(bare, source="s")
    assert r.unparsed == 0 and r.kinds == ("nccl",)
    assert {x.get("num_ranks") for x in r.records} >= {16}
    assert not parse_text("Setting affinity for GPU 3 to ffff0000\nUsing network IB\n", source="s").kinds  # no NCCL seen
