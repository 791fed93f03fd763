"""NCCL and nvidia-smi topology summaries from the parsers' ``comm_topology`` records (pure).

Deliberately not here: parsing (ingest.parsers.nccl, nvidia_smi) and file access (ingest.io).
"""
from __future__ import annotations

from core.i18n import Message, MessageList, N_

# a communicator's line: (nodes known, ranks per node known) -> its catalogue message
_COMM_LINE = {
    (False, False): N_("NCCL communicator (%(key)s): %(num)s ranks; ranks in the log: %(seen)s"),
    (True, False): N_("NCCL communicator (%(key)s): %(num)s ranks, %(nodes)s nodes; ranks in the log: %(seen)s"),
    (False, True): N_("NCCL communicator (%(key)s): %(num)s ranks, %(local)s ranks per node; ranks in the log: %(seen)s"),
    (True, True): N_("NCCL communicator (%(key)s): %(num)s ranks, %(nodes)s nodes, %(local)s ranks per node; ranks in "
                     "the log: %(seen)s"),
}


def nccl_transports(recs: list[dict]) -> list[str]:
    """Transport names (P2P/CUMEM, SHM, NET/IB...) of the ``transport`` records, sorted."""
    return sorted({r["transport"] for r in recs if r.get("record") == "transport"})


def summarize_nccl_topology(recs: list[dict]) -> list[str]:
    """Lines describing NCCL communicators, transports, rings and channels (and an
    nvidia-smi topology matrix) from ``comm_topology`` records of the parsers (sentences as
    core.i18n Messages). [] if none."""
    if not recs:
        return []
    lines = []
    comms: dict[str, list[dict]] = {}  # comm pointers are per rank: group by commId, else by shape
    for r in recs:
        if r.get("record") in ("comm_init", "init_complete"):
            key = f"commId {r['comm_id']}" if r.get("comm_id") else f"nRanks {r.get('num_ranks')}"
            comms.setdefault(key, []).append(r)
    for key, rs in list(comms.items())[:8]:
        nodes = next((x.get("num_nodes") for x in rs if x.get("num_nodes") is not None), None)
        local = next((x.get("num_local_ranks") for x in rs if x.get("num_local_ranks") is not None), None)
        seen = sorted({x["rank"] for x in rs if x.get("rank") is not None})
        lines.append(Message(_COMM_LINE[(nodes is not None, bool(local))], key=key, num=rs[0].get("num_ranks"),
                             nodes=nodes, local=local, seen=", ".join(map(str, seen))))
    edges = [r for r in recs if r.get("record") == "transport"]
    if edges:
        kinds: dict[str, list[int]] = {}
        for e in edges:
            k = kinds.setdefault(e["transport"], [0, 0])
            k[0] += 1
            k[1] += e["num_channels"]
        lines.append(Message(N_("NCCL transports seen: %(transports)s"), transports=MessageList(
            (Message(N_("%(transport)s (%(num)s edges, %(channels)s channel connections)"), transport=t, num=n, channels=c)
             for t, (n, c) in sorted(kinds.items())), "; ")))
    rings = [r for r in recs if r.get("record") == "ring"]
    if rings:
        lines.append(Message(N_("NCCL rings: %(num)s channel rings logged, e.g. channel %(channel)s: %(ring)s"), num=len(rings),
                             channel=rings[0]["channel"], ring=rings[0]["ring"]))
    ch = [r for r in recs if r.get("record") == "channels"]
    if ch:
        c = ch[0]
        lines.append(Message(N_("NCCL channels: %(coll)s coll, %(nvls)s nvls, %(collnet)s collnet, %(p2p)s p2p"),
                             coll=c.get("num_coll_channels"), nvls=c.get("num_nvls_channels"),
                             collnet=c.get("num_collnet_channels"), p2p=c.get("num_p2p_channels")))
    links = [r for r in recs if r.get("record") == "smi_link"]
    if links:
        devs = list(dict.fromkeys(r["device"] for r in links))
        peers = list(dict.fromkeys(r["peer"] for r in links))
        cell = {(r["device"], r["peer"]): r["link"] for r in links}
        lines.append("nvidia-smi topo -m:")
        lines.append("\t" + "\t".join(peers))
        lines.extend(d + "\t" + "\t".join(cell.get((d, p), "") for p in peers) for d in devs)
    return lines
