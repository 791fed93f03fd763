"""Which parallel group lives inside a node: rank placement of multi-node runs, as plain records.

Input is the environment record's ``placement`` (EnvRecord.placement: {run: {"<global rank>":
RankPlacement}}, gathered by rank 0 after init: runner.train.write_placement) and the run's layout. The engines' rank orders (innermost first):

- torch engine: ``init_device_mesh(..., (dp, pp, tp))`` -> rank = (dp·P + pp)·T + tp: TP, PP, DP
  (runner/strategies/tp_pp_torch.py);
- Megatron-core: ``parallel_state`` default order "tp-cp-ep-dp-pp" -> TP, (CP, EP,) DP, PP
  (megatron/core/parallel_state.py, initialize_model_parallel ``order``);
- DDP / ZeRO-3: one data-parallel group of every rank.

The placement recipe (DESIGN.md): TP inside a node (its all-reduces are on the critical path
every layer), PP across nodes. Deliberately not here: wording (templates) and file access.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.records import LoadedRun, RankPlacement

# innermost first
RANK_ORDERS = {"torch": ("tp", "pp", "dp"), "megatron": ("tp", "dp", "pp")}


@dataclass(frozen=True, kw_only=True)
class NodeRanks:
    node_rank: int | None
    hostname: str | None
    ranks: tuple[int, ...]


@dataclass(frozen=True, kw_only=True)
class RunPlacement:
    run: str
    order: str  # e.g. "tp-pp-dp" (innermost first); "dp" for DDP / ZeRO-3
    nodes: tuple[NodeRanks, ...]
    num_nodes: int
    num_tp_groups: int
    num_tp_groups_crossing: int  # TP groups with ranks on more than one node (the note warns)
    num_pp_groups: int
    num_pp_groups_crossing: int
    num_dp_groups: int
    num_dp_groups_crossing: int


def build_groups(*, world_size: int, degrees: Mapping[str, int], order: Sequence[str]) -> dict[str, list[tuple[int, ...]]]:
    """{dim: [group ranks...]} for a rank layout given innermost-first ``order`` of dims with
    ``degrees`` (product = world_size). Raises ValueError when the degrees do not multiply up."""
    size = 1
    for d in order:
        size *= degrees[d]
    if size != world_size:
        raise ValueError(f"degrees {dict(degrees)} multiply to {size}, not world_size {world_size}")
    strides, s = {}, 1
    for d in order:
        strides[d] = s
        s *= degrees[d]
    groups: dict[str, list[tuple[int, ...]]] = {}
    for d in order:
        seen: dict[tuple[int, ...], None] = {}
        for r in range(world_size):
            base = r - ((r // strides[d]) % degrees[d]) * strides[d]
            seen[tuple(base + i * strides[d] for i in range(degrees[d]))] = None
        groups[d] = list(seen)
    return groups


def compute_run_placement(*, run: str, strategy: str, engine: str, world_size: int, tp_degree: int, pp_degree: int,
                          dp_degree: int, ranks: Mapping[str, RankPlacement]) -> RunPlacement | None:
    """One run's placement from its layout and its placement record (global rank as text -> where
    it lived); None when the record does not cover every rank (unknown placement)."""
    world = int(world_size)
    node_of: dict[int, tuple[Any, Any]] = {}
    for key, rec in ranks.items():
        if str(key).isdigit():
            node_of[int(key)] = (rec.node_rank, rec.hostname)
    if sorted(node_of) != list(range(world)):
        return None
    if strategy == "tp_pp":
        order = RANK_ORDERS.get(str(engine), RANK_ORDERS["torch"])
        degrees = {"tp": int(tp_degree), "pp": int(pp_degree), "dp": int(dp_degree)}
    else:
        order, degrees = ("tp", "pp", "dp"), {"tp": 1, "pp": 1, "dp": world}
    groups = build_groups(world_size=world, degrees=degrees, order=order)

    def crossing(dim: str) -> int:
        return sum(1 for g in groups[dim] if len({node_of[r] for r in g}) > 1)

    by_node: dict[tuple[Any, Any], list[int]] = {}
    for r in range(world):
        by_node.setdefault(node_of[r], []).append(r)
    nodes = tuple(NodeRanks(node_rank=k[0], hostname=k[1], ranks=tuple(v))
                  for k, v in sorted(by_node.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))))
    return RunPlacement(
        run=str(run), order="-".join(d for d in order if degrees[d] > 1) or "dp", nodes=nodes,
        num_nodes=len(nodes),
        num_tp_groups=len(groups["tp"]) if degrees["tp"] > 1 else 0, num_tp_groups_crossing=crossing("tp") if degrees["tp"] > 1 else 0,
        num_pp_groups=len(groups["pp"]) if degrees["pp"] > 1 else 0, num_pp_groups_crossing=crossing("pp") if degrees["pp"] > 1 else 0,
        num_dp_groups=len(groups["dp"]) if degrees["dp"] > 1 else 0, num_dp_groups_crossing=crossing("dp") if degrees["dp"] > 1 else 0,
    )


def compute_placements(runs: Sequence[LoadedRun],
                       placement: Mapping[str, Mapping[str, RankPlacement]]) -> tuple[RunPlacement, ...]:
    """Placement of every run that has a record (EnvRecord.placement), in run order."""
    out = []
    for r in runs:
        ranks, spec = placement.get(r.name), r.spec
        if ranks is not None:
            p = compute_run_placement(run=r.name, strategy=spec.strategy, engine=spec.engine, world_size=spec.world_size,
                                      tp_degree=spec.tp_degree, pp_degree=spec.pp_degree, dp_degree=spec.dp_degree,
                                      ranks=ranks)
            if p is not None:
                out.append(p)
    return tuple(out)
