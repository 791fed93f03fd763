"""ingest.whatif's replay on hand-built two-rank chains (CPU-style: no launches, no syncs):
a rank whose chain ends in a collective that the other rank reaches later waits for it, and the
replayed step is the later rank's arrival plus the transfer."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from ingest.traces import NO_LAUNCH
from ingest.whatif import Scenario, replay_step_s

I64 = np.int64


def chain(work_ns: int, coll_start: int, coll_end: int):
    """One rank: work [0, work_ns), then a wait for collective 0 [coll_start, coll_end): the chain's last item."""
    replay = SimpleNamespace(
        start=np.array([0, coll_start], I64), end=np.array([work_ns, coll_end], I64), kind=np.array([0, 1], I64),
        cat=np.array([0, 0], I64), coll=np.array([-1, 0], I64), launch=np.array([NO_LAUNCH, NO_LAUNCH], I64),
        step=np.array([0, 0], I64), coll_launch=np.array([NO_LAUNCH], I64), sync_start=np.array([], I64),
        sync_end=np.array([], I64), data_start=np.array([], I64), data_end=np.array([], I64))
    return SimpleNamespace(replay=replay, steps=np.array([0], I64), coll_start=np.array([coll_start], I64),
                           coll_end=np.array([coll_end], I64), coll_group=("dp",))


def test_a_chain_ending_in_a_collective_waits_for_the_late_rank():
    # rank 0 works 10 us and waits in the all-reduce until rank 1 arrives at 40 us; transfer 5 us
    timelines = {0: chain(10_000, 10_000, 45_000), 1: chain(40_000, 40_000, 45_000)}
    keys = {(0, "dp", "all_reduce", 0): {0: 0, 1: 0}}
    step_s, forced = replay_step_s(timelines, keys, {0: 0, 1: 0}, Scenario())
    assert forced == 0
    assert step_s == 45_000 / 1e9  # both ranks end when the collective does: 40 us + 5 us
