"""NCCL_DEBUG=INFO/WARN output (NCCL 2.10 -> 2.28), plus nccl-tests headers and result rows.

Lines ``host:pid:tid [dev] NCCL INFO msg``, dispatched on the message's first word (_RULES).
Records: ``env`` (versions, network, NCCL_* settings, nccl-tests devices), ``comm_topology``
(the rules' rows; one ``transport`` row per distinct edge (host, pid, rank, peer, direction,
transport) with ``num_channels`` (lines) and ``channels`` (distinct ids, first-seen order)),
``collectives`` (TUNING and COLL lines, one per distinct call shape with ``num_calls``, so
memory is bounded by distinct shapes, not log size; nccl-tests rows), ``events`` (WARN lines,
``file.cc:N -> code`` unwind lines, Abort COMPLETE). Deliberately not here: RAS reports (nccl_ras).
"""
from __future__ import annotations

import re

from ingest.parsers import INT, NUM, Col, LineParser, ParseResult, apply_rule, match_rules, rule, run_parsers, to_int, to_num
from ingest.parsers.failures import FailureScanner

_HEADER = re.compile(r"(?:\[(?P<ts>[\d\-: .T]+)\] )?(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\](?: (?P<loc>[\w./\-]+:\d+))?$")
# a head the poster (or a log collector) stripped: nothing, or only the WARN location left
_BARE = re.compile(r"(?P<host>)(?P<pid>)(?P<tid>)(?P<dev>)(?P<loc>[\w./\-]+:\d+)?$")
_HEADER_SEARCH = re.compile(r"(?P<host>[\w.\-]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\](?: (?P<loc>[\w./\-]+:\d+))?$")

_EDGE = re.compile(
    r"(?P<kind>Channel|CollNet|Ring) (?P<channel>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)(?:\[(?P<src_id>[0-9a-fA-F]+)\])?"
    r"(?: -> (?P<dst>\d+)(?:\[(?P<dst_id>[0-9a-fA-F]+)\])?)?(?: \[(?P<dir>send|receive)\])? via (?P<transport>.+)$"
)

I, S, F = int, str, float
# Pattern table for the message after "NCCL INFO ". First word -> candidate rules (fast dispatch).
_RULES = {
    "NCCL": (rule("nccl_version", r"NCCL version (?P<value>\S+)", "env", Col("value", "value", S), key="nccl_version"),),
    "cudaDriverVersion": (rule("cuda_driver_version", r"cudaDriverVersion (?P<value>\d+)", "env", Col("value", "value", S),
                               key="cuda_driver_version"),),
    "Bootstrap": (rule("bootstrap", r"Bootstrap ?: Using (?P<value>.+)", "env", Col("value", "value", S), key="nccl_bootstrap"),
                  rule("bootstrap_timings", r"Bootstrap timings total (?P<t>[\d.]+) ", "comm_topology",
                       Col("t", "bootstrap_time_s", F))),
    "Setting": (rule("affinity", r"Setting affinity for GPU (?P<gpu>\d+) to (?P<mask>\S+)$", "comm_topology",
                     Col("gpu", "affinity_gpu", I), Col("mask", "cpu_affinity", S)),),
    "CUDA": (rule("nic_distance", r"CUDA Dev (?P<dev>\d+)\[\w+\], (?P<what>[\w ]+?) NIC distance : +(?P<d>\S+)$",
                  "comm_topology", Col("dev", "nic_distance_dev", I), Col("what", "nic_kind", S), Col("d", "nic_distance", S)),),
    "NET": (rule("net_interface", r"NET : Using interface (?P<value>.+)", "env", Col("value", "value", S),
                 key="nccl_net_interface"),),
    "rank": (rule("rank_nranks", r"rank (?P<rank>\d+) nranks (?P<nranks>\d+)$", "comm_topology",  # NCCL <= 2.3
                  Col("rank", "rank", I), Col("nranks", "num_ranks", I)),),
    "DMA-BUF": (rule("dmabuf", r"DMA-BUF is available on GPU device (?P<dev>\d+)$", "comm_topology",
                     Col("dev", "dmabuf_gpu", I), dmabuf=True),),
    "Plugin": (rule("plugin_path", r"Plugin Path : (?P<value>.+)", "env", Col("value", "value", S), key="nccl_net_plugin_path"),),
    "Using": (rule("network", r"Using network (?P<value>.+)", "env", Col("value", "value", S), key="nccl_network"),
              rule("nccl_using", r"Using .*", None)),
    "NET/Plugin": (rule("net_plugin", r"NET/Plugin ?: (?P<value>.+)", "env", Col("value", "value", S), key="nccl_net_plugin"),),
    "NET/IB": (rule("net_ib", r"NET/IB ?: (?:Using |\[\d+\] )(?P<value>.+)", "env", Col("value", "value", S), key="nccl_net_ib"),
               rule("net_ib_qp", r"NET/IB ?: IbDev \d+ Port \d+ qpn \d+ .*", None),
               rule("net_ib_none", r"NET/IB ?: No device found\.?$", None)),
    "NET/Socket": (rule("net_socket", r"NET/Socket ?: Using (?P<value>.+)", "env", Col("value", "value", S), key="nccl_net_socket"),
                   rule("net_socket_found", r"NET/Socket ?: \d+ interfaces? found$", None)),
    "comm": (
        rule("comm_init", r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
             r"localRanks (?P<lranks>\d+) localRank (?P<lrank>\d+)(?: MNNVL (?P<mnnvl>\d+))?", "comm_topology",
             Col("comm", "comm", S), Col("rank", "rank", I), Col("nranks", "num_ranks", I), Col("nnodes", "num_nodes", I),
             Col("lranks", "num_local_ranks", I), Col("lrank", "local_rank", I), Col("mnnvl", "mnnvl", I)),
        rule("init_complete", r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cdev>\d+)"
             r"(?: nvmlDev (?P<nvml>\d+))?(?: busId (?P<bus>[0-9a-fA-F]+))?(?: commId (?P<commid>0x[0-9a-f]+))?"
             r"(?: localSize \d+)? - Init COMPLETE", "comm_topology",
             Col("comm", "comm", S), Col("rank", "rank", I), Col("nranks", "num_ranks", I), Col("cdev", "cuda_dev", I),
             Col("nvml", "nvml_dev", I), Col("bus", "bus_id", S), Col("commid", "comm_id", S)),
        rule("abort_complete", r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cdev>\d+)"
             r"(?: busId (?P<bus>[0-9a-fA-F]+))? - (?P<detail>(?:Abort|Destroy) COMPLETE)", "events",
             Col("comm", "comm", S), Col("rank", "rank", I), Col("cdev", "cuda_dev", I), Col("detail", "detail", S)),
        rule("init_start", r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cdev>\d+)"
             r"(?: nvmlDev (?P<nvml>\d+))?(?: busId (?P<bus>[0-9a-fA-F]+))?(?: commId (?P<commid>0x[0-9a-f]+))?"
             r" - Init START", "comm_topology",
             Col("comm", "comm", S), Col("rank", "rank", I), Col("nranks", "num_ranks", I), Col("cdev", "cuda_dev", I),
             Col("nvml", "nvml_dev", I), Col("bus", "bus_id", S), Col("commid", "comm_id", S)),
        rule("comm_other", r"comm 0x[0-9a-f]+ .*", None),
    ),
    "Channel": (rule("ring", r"Channel (?P<channel>\d+)/(?P<num>\d+) :(?P<ring>(?:\s+\d+)+)$", "comm_topology",
                     Col("channel", "channel", I), Col("num", "num_channels", I), Col("ring", "ring", lambda t: " ".join(t.split()))),),
    "CollNet": (),  # CollNet lines other than transport edges: not known
    "Trees": (rule("tree", r"Trees (?P<trees>.+)", "comm_topology", Col("trees", "trees", S)),),
    "NVLS": (rule("nvls", r"NVLS comm (?P<comm>0x[0-9a-f]+) headRank (?P<head>-?\d+) nHeads (?P<nheads>\d+) buffSize (?P<buff>\d+)"
                  r"(?: memSize (?P<mem>\d+))?(?: nvlsPerRankSize (?P<per>\d+))?(?: nvlsTotalSize (?P<tot>\d+))?", "comm_topology",
                  Col("comm", "comm", S), Col("head", "nvls_head_rank", I), Col("nheads", "nvls_num_heads", I),
                  Col("buff", "nvls_buff_size_b", I), Col("mem", "nvls_mem_size_b", I), Col("per", "nvls_per_rank_size_b", I),
                  Col("tot", "nvls_total_size_b", I)),
             rule("nvls_head", r"NVLS Head +(?P<head>\d+): +(?P<ranks>[\d ]+)$", "comm_topology",
                  Col("head", "nvls_head", I), Col("ranks", "nvls_head_ranks", lambda t: " ".join(t.split()))),
             rule("nvls_other", r"NVLS .*", None)),
    "threadThresholds": (rule("thread_thresholds", r"threadThresholds (?P<t>.+)", "comm_topology", Col("t", "thread_thresholds", S)),),
    "P2P": (rule("p2p_chunksize", r"P2P Chunksize set to (?P<n>\d+)", "comm_topology", Col("n", "p2p_chunk_size_b", I)),
            rule("p2p_other", r"P2P .*", None)),
    "Connected": (rule("connected", r"Connected (?:all rings|all trees|NVLS tree|binomial trees|collnet)", None),),
    # NCCL 2.28 (GRAPH, INIT, plugins): the graph search's result per pattern, then recognised lines
    "Pattern": (rule("graph", r"Pattern (?P<pattern>\d+), crossNic (?P<cross>\d+), nChannels (?P<n>\d+), "
                     r"bw (?P<bw>[\d.]+)/(?P<bw_inter>[\d.]+), type (?P<type>\S+?)/(?P<type_inter>\S+?), "
                     r"sameChannels (?P<same>\d+)$", "comm_topology",
                     Col("pattern", "graph_pattern", I), Col("cross", "graph_cross_nic", I), Col("n", "num_channels", I),
                     Col("bw", "graph_bw_gbps", F), Col("bw_inter", "graph_bw_inter_gbps", F),
                     Col("type", "graph_link_type", S), Col("type_inter", "graph_link_type_inter", S),
                     Col("same", "graph_same_channels", I)),),
    "Ring": (rule("graph_ring", r"Ring \d+ : -?\d+ -> \d+ -> -?\d+$", None),),
    "Tree": (rule("graph_tree", r"Tree \d+ : -?\d+ -> \d+ -> -?\d+/-?\d+/-?\d+$", None),),
    "graph_channel": (rule("graph_channel", r"\d+ :(?: [A-Z]+/[\w\-]+)+$", None),),
    "Init": (rule("init_timings", r"Init timings(?: - \w+)?: rank (?P<rank>\d+) nranks (?P<nranks>\d+) total (?P<t>[\d.]+)\b",
                  "comm_topology", Col("rank", "rank", I), Col("nranks", "num_ranks", I), Col("t", "init_time_s", F)),),
    "CC": (rule("cc_mode", r"CC (?:On|Off), workFifoBytes \d+$", None),),
    "topo_path": (rule("topo_path", r"[A-Z]+/[\w\-]+ :(?:[A-Z]+/[\w\-]+ \([^)]*\) ?)+$", None),),
    "tuning_table": (rule("tuning_table", r"[A-Za-z][A-Za-z ]* \|(?:[^|]*\|)+$", None),),
    "Comm": (rule("comm_config", r"Comm config \w+ set to .*", None),),
    "RAS": (rule("ras_socket", r"RAS client listening socket at .*", None),),
    "MNNVL": (rule("mnnvl", r"MNNVL busId .*", None),),
    "Topology": (rule("topo_detect", r"Topology detection ?: .*", None),),
    "Could": (rule("topo_path", r"Could not find real path of .*", None),),
    "TOPO/NET": (rule("topo_net", r"TOPO/NET : .*", None),),
    "ncclTopoPopulateNics": (rule("topo_nics", r"ncclTopoPopulateNics : .*", None),),
    "ncclTopoGetCpuAffinity:": (rule("topo_affinity", r"ncclTopoGetCpuAffinity: .*", None),),
    "ncclP2pSchedule:": (rule("p2p_schedule", r"ncclP2pSchedule: .*", None),),
    "Check": (rule("p2p_check", r"Check P2P Type .*", None),),
    "[Proxy": (rule("proxy_core", r"\[Proxy (?:Service(?: UDS)?|Progress)\] Device \d+ CPU core \d+$", None),),
    "Threads": (rule("threads_per_block", r"Threads per block : [\d/]+$", None),),  # NCCL <= 2.6
    # NCCL_DEBUG_SUBSYS=ALLOC (include/alloc.h), after the "file:line" it names (_msg strips it)
    "Cuda": (rule("alloc", r"(?:Cuda (?:Host )?Alloc|cuMem Alloc|malloc|Mem Realloc|Mem Alloc) .*[Ss]ize .*", None),),
    "Initialized": (rule("net_plugin_init", r"Initialized NET plugin \S+$", None),),
    "Assigned": (rule("net_plugin_assigned", r"Assigned (?:NET|GIN|RMA) plugin \S+ to comm$", None),),
    "Failed": (rule("net_plugin_failed", r"Failed to (?:initialize NET plugin \S+|open libibverbs\.so.*)$", None),),
    "ENV/Plugin:": (rule("plugin_missing", r"(?:ENV|PROFILER|TUNER|GIN)/Plugin: Could not find: \S+$", None),),
    "Launch": (rule("launch_mode", r"Launch mode (?P<value>\w+)$", "env", Col("value", "value", S), key="nccl_launch_mode"),),
    # the Google fast-socket NET plugin's messages
    "NET/FastSocket": (rule("fastsocket", r"NET/FastSocket ?: .*", None),),
    "accept": (rule("fastsocket_accept", r"accept (?:qid: \d+, rqid: \d+|incoming cpu: \d+)$", None),),
    "connect": (rule("fastsocket_connect", r"connect (?:qid: \d+, rqid: \d+|incoming cpu: \d+)$", None),),
    "===": (rule("topo_end", r"=+$", None),
            rule("topo_system", r"=== System : maxBw (?P<max>[\d.]+) totalBw (?P<tot>[\d.]+) ===", "comm_topology",
                 Col("max", "topo_max_bw_gbps", F), Col("tot", "topo_total_bw_gbps", F)),),
    "+": (rule("topo_node", r"\+ (?P<link>[A-Z]+)\[(?P<bw>[\d.]+)\] - (?P<ntype>[A-Z]+)/(?P<nid>[0-9A-Fa-f\-]+)(?: \((?P<info>[^)]*)\))?$",
               "comm_topology", Col("link", "topo_link", S), Col("bw", "topo_link_bw_gbps", F), Col("ntype", "topo_node_type", S),
               Col("nid", "topo_node_id", S), Col("info", "topo_node_info", S)),),
    "CPU/": (rule("topo_cpu", r"CPU/(?P<nid>[\w\-]+) \((?P<info>[^)]*)\)$", "comm_topology", Col("nid", "topo_node_id", S),
                  Col("info", "topo_node_info", S), topo_node_type="CPU"),),
    # TUNING: ids and a time or channel count (NCCL <= 2.2x); names and a channel range (2.28:
    # ``AllReduce: 16 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}``), ids kept beside them
    "tuning": (rule("tuning_named", r"(?:(?P<func>[A-Za-z]+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>[A-Z][A-Z_]*) "
                    r"proto (?P<proto>[A-Z][A-Z0-9]*) channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\}$", "collectives",
                    Col("func", "func", S), Col("bytes", "size_b", I), Col("algo", "algo_name", S),
                    Col("proto", "proto_name", S), Col("lo", "channel_lo", I), Col("hi", "channel_hi", I)),
               rule("tuning", r"(?:(?P<func>[A-Za-z]+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>\d+) proto (?P<proto>\d+) "
                    r"(?:time|channels) (?P<t>[\d.]+)", "collectives", Col("func", "func", S), Col("bytes", "size_b", I),
                    Col("algo", "algo", I), Col("proto", "proto", I)),),
    "unwind": (rule("error_unwind", r"(?P<file>[\w./\-]+\.(?:cc|cpp|h|c)):(?P<ln>\d+) -> (?P<code>\d+)(?: \((?P<detail>.*)\))?"
                    r"(?: \[Async thread\])?$",
                    "events", Col("file", "loc_file", S), Col("ln", "loc_line", I), Col("code", "nccl_result", I)),),
    "env": (rule("nccl_setting", r"(?P<key>NCCL_\w+) set (?:by environment )?to (?P<value>.*)", "env",
                 Col("key", "key", S), Col("value", "value", S)),),
}
# First words that share another's rules: a glued colon, a CPU node or a path under it.
_RULES.update({"cuMem": _RULES["Cuda"], "malloc": _RULES["Cuda"], "Mem": _RULES["Cuda"], "NET/Plugin:": _RULES["NET/Plugin"], "Bootstrap:": _RULES["Bootstrap"], "NET/IB:": _RULES["NET/IB"],
               "NET/Socket:": _RULES["NET/Socket"], "PROFILER/Plugin:": _RULES["ENV/Plugin:"],
               "TUNER/Plugin:": _RULES["ENV/Plugin:"], "GIN/Plugin:": _RULES["ENV/Plugin:"], "CPU/": _RULES["CPU/"] + _RULES["topo_path"]})
_COLL = re.compile(
    r"(?P<func>[A-Za-z]+): opCount (?P<op>[0-9a-fA-F]+) sendbuff \S+ recvbuff \S+ count (?P<count>\d+) datatype (?P<dt>\d+) "
    r"op (?P<redop>\d+) root (?P<root>-?\d+) comm (?P<comm>0x[0-9a-f]+)(?: \[nranks=(?P<nranks>\d+)\])?"
)
_TEST_ROW = rule(  # an nccl-tests result row: out-of-place then in-place time and bandwidths
    "nccl_tests", rf"(?P<size>{INT})\s+(?P<count>{INT})\s+(?P<type>\w+)\s+(?P<redop>\w+)\s+(?:(?P<root>-?\d+)\s+)?(?P<t>{NUM})\s+"
    rf"(?P<alg>[\d.]+)\s+(?P<bus>[\d.]+)\s+(?P<wrong>\S+)\s+(?P<t2>{NUM})\s+(?P<alg2>[\d.]+)\s+(?P<bus2>[\d.]+)\s+(?P<wrong2>\S+)$",
    "collectives", Col("size", "size_b", to_int), Col("count", "count", to_int), Col("type", "dtype", S), Col("redop", "redop", S),
    Col("root", "root", I), Col("t", "time_us", to_num), Col("alg", "alg_bw_gbps", F), Col("bus", "bus_bw_gbps", F),
    Col("t2", "time_in_place_us", to_num), Col("alg2", "alg_bw_in_place_gbps", F), Col("bus2", "bus_bw_in_place_gbps", F))
_TEST_RANK = re.compile(rf"Rank\s+(?P<rank>\d+)(?: Group\s+\d+)? Pid\s+(?P<pid>{INT}) on\s+(?P<host>\S+) device\s+(?P<dev>\d+) \[(?P<bus>[^\]]+)\] (?P<name>.+)$")


# NCCL's topology dump (graph/topo.cc ncclTopoPrint) pasted without its "host:pid:tid [dev] NCCL INFO" heads
_TOPO_BARE = re.compile(r"=== System : maxBw |\+ [A-Z]+\[[\d.]+\] - [A-Z]+/|CPU/[\w\-]+ \(\d+/\d+/\d+\)$")
_NO_HEAD = (None, None, None)
# starts of NCCL messages no other tool prints, read without their head once NCCL lines are seen;
# the first three (NCCL's alone) even before: a log whose heads were all stripped
_BARE_MSG = re.compile(r"(?:NCCL_\w+ set (?:by environment )?to |Bootstrap ?: |cudaDriverVersion \d"
                   r"|(?:NET/(?:Plugin|IB|Socket) ?|ncclTopoGetCpuAffinity|ncclP2pSchedule|(?:PROFILER|TUNER|ENV|GIN)/Plugin): "
                   r"|comm 0x|ncclComm\w+ comm 0x|Channel \d|Trees |NVLS |threadThresholds |P2P |Connected |RAS |MNNVL "
                   r"|TOPO/NET |ncclTopoPopulateNics |DMA-BUF |Comm config |Plugin Path : |Using network |Setting affinity for GPU "
                   r"|Bootstrap timings |[A-Za-z]+: opCount )")
_SURE = ("NCCL_", "Bootstrap", "cudaDriverVersion")
_GLUED = re.compile(r".* NCCL (?:INFO|WARN) (?=[\w.\-]+:\d+:\d+ \[\d+\] )")  # two writers' lines glued


# nccl-tests' own header lines (src/common.cu, each printed after '#', which a markdown paste loses):
# the first opens its block, in which every '#' line is its header or a comment
_TEST_START = re.compile(r"(?:nThread |Collective test |Using devices|Rank\s+\d+ (?:Group\s+\d+ )?Pid )")
_TEST_TEXT = re.compile(r"(?:out-of-place|size\s+count\s+type|\(B\)\s+\(elements\)|Out of bounds values|Avg bus bandwidth"
                        r"|Blocking Enabled)")


class NcclParser(LineParser):
    kind = "nccl"
    gate = (" NCCL ", re.compile("NCCL version |NCCL (?:INFO|WARN) |#"), _TEST_ROW.regex, _TEST_START, _TEST_TEXT, _TOPO_BARE)
    _context = False  # an NCCL line or banner seen: a message whose head was stripped may follow
    fallback_gate = (_BARE_MSG,)
    _tests = False  # inside nccl-tests output: every '#' line is its header or comment
    _ib_line = 0  # "NET/IB : Using <devices>": the IB net initialised (the network, where NCCL <= 2.6 names none)

    def __init__(self, source: str) -> None:
        super().__init__(source)
        self._edges: dict[tuple, dict] = {}
        self._edge_channels: dict[tuple, dict[str, None]] = {}  # distinct channels per edge, first-seen order
        self._colls: dict[tuple, dict] = {}
        self._seen_env: set[tuple] = set()
        self._heads: dict[str, tuple] = {}
        self._test_ranks: dict[int, int] = {}  # nccl-tests rank -> the line listing it

    def _header(self, rec: dict, h: tuple) -> dict:
        rec["host"], rec["pid"] = h[0], h[1]
        rec.setdefault("cuda_dev", h[2])
        return rec

    def feed(self, lineno: int, body: str, ts, rank) -> bool:
        idx = body.find(" NCCL ")
        if idx >= 0 and body.count(" NCCL ", idx + 6) and (g := _GLUED.match(body)):
            body, idx = body[g.end():], body.find(" NCCL ", g.end()) - g.end()
        if idx < 0:
            if not body.startswith(("NCCL INFO ", "NCCL WARN ")):
                return self._other(lineno, body)
            idx = -1  # the head stripped
        head, msg = body[:max(idx, 0)], body[idx + 6:]
        h, hdr = self._heads.get(head) or self._head(head)
        if h is None:
            return False
        self._context = True
        level, _, msg = msg.partition(" ")
        if level == "WARN":
            file, _, ln = (h.group("loc") or "").rpartition(":")
            self.event("nccl_warn", lineno, rank, ts or h.groupdict().get("ts"), host=hdr[0], pid=hdr[1],
                       cuda_dev=hdr[2], loc_file=file or None, loc_line=int(ln) if ln else None,
                       detail=msg.strip()[:500])
            return True
        return level in ("INFO", "TRACE") and self._msg(lineno, hdr, msg.lstrip(), ts, rank)

    def _head(self, head: str) -> tuple[re.Match | None, tuple | None]:
        """``host:pid:tid [dev]``, read once per distinct text; search: text glued before it (a tqdm bar)."""
        h = _HEADER.match(head) or _HEADER_SEARCH.search(head) or _BARE.match(head)
        if len(self._heads) >= 4096:  # timestamped heads differ on every line
            self._heads.clear()
        hdr = h and h.group("host", "pid", "dev")
        self._heads[head] = out = (h, hdr and (hdr[0] or None, int(hdr[1]) if hdr[1] else None,
                                               int(hdr[2]) if hdr[2] else None))
        return out

    def _edge(self, lineno: int, hdr: tuple, m: re.Match) -> None:
        """A ``Channel c : src -> dst via transport`` line, counted into its edge's row."""
        kind, channel, src, src_id, dst, dst_id, direction, transport = m.group(
            "kind", "channel", "src", "src_id", "dst", "dst_id", "dir", "transport")
        key = (hdr[0], hdr[1], src, src_id, dst, dst_id, direction, transport)
        e = self._edges.get(key)
        if e is not None:
            e["num_channels"] += 1
            self._edge_channels[key][channel] = None
            return
        self._edges[key] = {
            "table": "comm_topology", "source": self.source, "line": lineno, "record": "transport",
            "host": hdr[0], "pid": hdr[1], "cuda_dev": hdr[2], "rank": int(src),
            "peer": int(dst) if dst else None, "rank_id": src_id or None, "peer_id": dst_id or None,
            "direction": direction or None, "transport": transport,
            "transport_kind": _transport_kind(transport), "via_collnet": kind == "CollNet",
            "num_channels": 1, "channels": channel}
        self._edge_channels[key] = {channel: None}

    def _msg(self, lineno: int, hdr: tuple, stripped: str, ts, rank) -> bool:
        if stripped.startswith(("Channel ", "CollNet ", "Ring ")):  # (NCCL <= 2.5 printed "Ring 00 : a -> b via")
            m = _EDGE.match(stripped)
            if m:
                self._edge(lineno, hdr, m)
                return True
        if stripped.startswith("[Rank "):  # 2.27+ tags init lines with the rank: "[Rank 5] ncclCommInitRankConfig comm .."
            stripped = stripped[stripped.find("] ") + 2:]
        word = stripped.split(" ", 1)[0]
        if word.startswith("ncclComm") and stripped[len(word):len(word) + 6] == " comm ":
            stripped = stripped[len(word) + 1:]  # 2.28 names the API first: "ncclCommInitRankConfig comm 0x.. - Init COMPLETE"
            word = "comm"
        rules = _RULES.get(word)
        if rules is None:
            if word.endswith(":") and " Bytes -> Algo " in stripped or stripped[:1].isdigit() and " Bytes -> " in stripped:
                return self._tuning(lineno, stripped)
            elif word.endswith(":") and " opCount " in stripped:
                return self._coll(lineno, stripped, hdr)
            elif " -> " in stripped and ".c" in word:
                rules = _RULES["unwind"]
            elif ":" in word and word[-1].isdigit() and word.count(":") == 1:  # "file.cc:N message"
                return self._msg(lineno, hdr, stripped[len(word) + 1:], ts, rank)
            elif " set by environment to " in stripped or word.startswith("NCCL_") and " set to " in stripped:
                rules = _RULES["env"]
            elif word.startswith("CPU/"):
                rules = _RULES["CPU/"]
            elif stripped[:1].isdigit() and " coll channels, " in stripped:
                return self._channels(lineno, stripped, hdr)
            elif word.isdigit():
                rules = _RULES["graph_channel"]
            elif word.strip("=") == "":
                rules = _RULES["==="]
            elif "/" in word and stripped[len(word):len(word) + 2] == " :":
                rules = _RULES["topo_path"]
            elif " |" in stripped:
                rules = _RULES["tuning_table"]
            else:
                return False
        for r in rules:
            m = r.regex.match(stripped)
            if m:
                rec = apply_rule(r, m, source=self.source, lineno=lineno)
                if rec is None:
                    return True
                if rec["table"] == "events":
                    rec["event"] = rec.pop("record")
                    rec.update(rank=rec.get("rank", rank), time=ts, detail=rec.get("detail") or stripped[:500])
                if rec["table"] == "env":
                    k = (rec["key"], rec["value"])
                    if k in self._seen_env:
                        return True
                    self._seen_env.add(k)
                    self._ib_line = self._ib_line or (r.name == "net_ib" and " Using " in stripped and lineno)
                    rec["kind"] = "nccl"
                elif rec["table"] != "events":
                    self._header(rec, hdr)
                self.records.append(rec)
                return True
        return False

    def _tuning(self, lineno: int, msg: str) -> bool:
        """A TUNING line, counted into its (function, size, algorithm, protocol) row: built on first sight."""
        r, m = match_rules(_RULES["tuning"], msg)
        if r is None:
            return False
        f, b, a, p = m.group("func", "bytes", "algo", "proto")
        key = (r.name, f, int(b), *((a, p) if r.name == "tuning_named" else (int(a), int(p))))
        have = self._colls.get(key)
        if have is not None:
            have["num_calls"] += 1
            return True
        rec = apply_rule(r, m, source=self.source, lineno=lineno)
        if r.name == "tuning_named":
            rec["algo"], rec["proto"] = ALGO_IDS.get(rec["algo_name"]), PROTO_IDS.get(rec["proto_name"])
        return self._agg(key, rec)

    def _agg(self, key: tuple, rec: dict) -> bool:
        have = self._colls.get(key)
        if have is None:
            rec["num_calls"] = 1
            self._colls[key] = rec
        else:
            have["num_calls"] += 1
        return True

    def _coll(self, lineno: int, msg: str, hdr: tuple) -> bool:
        m = _COLL.match(msg)
        if not m:
            return False
        g = m.groupdict()
        key = ("coll", hdr[0], hdr[1], g["comm"], g["func"], g["count"], g["dt"], g["redop"], g["root"])
        have = self._colls.get(key)
        if have is not None:  # a repeated call: no record built
            have["num_calls"] += 1
            return True
        rec = {"table": "collectives", "source": self.source, "line": lineno, "record": "coll", "host": hdr[0],
               "pid": hdr[1], "cuda_dev": hdr[2], "comm": g["comm"], "func": g["func"],
               "count": int(g["count"]), "datatype": int(g["dt"]), "redop": int(g["redop"]), "root": int(g["root"]),
               "num_ranks": int(g["nranks"]) if g["nranks"] else None, "first_op_count": int(g["op"], 16)}
        return self._agg(key, rec)

    def _channels(self, lineno: int, msg: str, hdr: tuple) -> bool:
        nums = dict((name, int(n)) for n, name in re.findall(r"(\d+) (coll|collnet|nvls|p2p) channels(?=,|$)", msg))
        per_peer = re.search(r"(\d+) p2p channels per peer", msg)
        self.records.append(self._header({
            "table": "comm_topology", "source": self.source, "line": lineno, "record": "channels",
            "num_coll_channels": nums.get("coll"), "num_collnet_channels": nums.get("collnet"),
            "num_nvls_channels": nums.get("nvls"), "num_p2p_channels": nums.get("p2p"),
            "num_p2p_channels_per_peer": int(per_peer.group(1)) if per_peer else None}, hdr))
        return True

    def fallback(self, lineno: int, body: str, ts, rank) -> bool:
        """A message whose head the poster stripped (``Bootstrap: Using ...``), once NCCL lines are seen."""
        if _BARE_MSG.match(body) is None or not (self._context or body.startswith(_SURE)):
            return False
        self._context = True
        return self._msg(lineno, _NO_HEAD, body, ts, rank)

    def _other(self, lineno: int, body: str) -> bool:
        """Lines without the NCCL prefix: a bare version banner, nccl-tests header and rows, a topology
        dump whose heads were stripped."""
        if _TOPO_BARE.match(body):
            self._context = True
            return self._msg(lineno, _NO_HEAD, body, None, None)
        if body.startswith("NCCL version ") and " compiled with " not in body:  # (the RAS client's banner)
            self._context = True
            v = body.split()[2]
            if ("nccl_version", v) not in self._seen_env:
                self._seen_env.add(("nccl_version", v))
                self.env(lineno, "nccl_version", v, record="nccl_version")
            return True
        text = body[1:].lstrip() if body[0] == "#" else body
        if text is not body or _TEST_START.match(text) or self._tests and _TEST_TEXT.match(text):
            if not self._tests and _TEST_START.match(text) is None and _TEST_TEXT.match(text) is None:
                return False
            self._tests = True
            m = _TEST_RANK.match(text)
            if m:
                self._test_ranks[int(m.group("rank"))] = lineno
                self.env(lineno, f"gpu.rank{m.group('rank')}", f"{m.group('name')} [{m.group('bus')}] on {m.group('host')} "
                         f"device {m.group('dev')}", record="nccl_tests_device")
            return True  # nccl-tests comments and table headers
        m = _TEST_ROW.regex.match(body)
        if m:
            self.records.append(apply_rule(_TEST_ROW, m, source=self.source, lineno=lineno))
        return m is not None

    def finish(self) -> None:
        if self._test_ranks:  # nccl-tests lists every rank of the job, 0 to n-1, under "Using devices"
            self.env(min(self._test_ranks.values()), "world_size", max(self._test_ranks) + 1, record="nccl_tests_ranks")
            self._test_ranks = {}
        for key, e in self._edges.items():
            e["channels"] = ",".join(self._edge_channels[key])
        if self._ib_line and not any(k == "nccl_network" for k, _ in self._seen_env):
            self.env(self._ib_line, "nccl_network", "IB", record="net_ib")
        self.records.extend(self._edges.values())
        self.records.extend(self._colls.values())
        self._edges, self._edge_channels, self._colls = {}, {}, {}


# NCCL's algorithm and protocol ids (src/include/device.h: NCCL_ALGO_*, NCCL_PROTO_*), the numbers
# older TUNING lines print where 2.28 prints the names.
ALGO_IDS = {"TREE": 0, "RING": 1, "COLLNET_DIRECT": 2, "COLLNET_CHAIN": 3, "NVLS": 4, "NVLS_TREE": 5, "PAT": 6}
PROTO_IDS = {"LL": 0, "LL128": 1, "SIMPLE": 2}


def _transport_kind(transport: str) -> str:
    """'P2P/CUMEM/read' -> 'P2P/CUMEM'; 'NET/IB/0/GDRDMA' -> 'NET/IB'; 'SHM/direct/direct' -> 'SHM'."""
    parts = transport.split("/")
    if parts[0].upper() in ("P2P", "NET", "COLLNET") and len(parts) > 1:
        return f"{parts[0]}/{parts[1].split(' ')[0]}"
    return parts[0].split(" ")[0]


def parse_nccl(text, *, source: str) -> ParseResult:
    """Parse NCCL_DEBUG output (a string or an iterable of lines; see module doc). Pure; never raises on content."""
    return run_parsers(text, [NcclParser(source), FailureScanner(source)], kind="nccl")
