"""One large text file parsed on several CPU cores, with exactly the serial parse's result.

The file is cut at line ends into shards (``ingest.io.plan_text_shards``). The calling process
reads shard 0 with the kind's parser chain, as the serial parse does; worker processes read
shards 1.. each with a fresh chain (``ingest.parsers.run_shard``), its lines numbered from the
shard's first line, and send back the parsers before ``finish`` (records and carried state).
The shards are then merged in order, verify or redo: shard k's reading is merged
(``Runner.absorb``) only if the merged state after shard k-1 is at rest (no timestamp line
waiting for its next line, no multi-line block open, nothing carried that the merge cannot
fill in: ``LineParser.at_rest`` / ``can_absorb``); otherwise the calling process reads shard
k's text on from the merged state itself, which is what the serial parse does. So the result
is the serial one by construction; parallelism only decides how much is read twice.

Deliberately not here: choosing when to shard (ingest.thirdparty.ingest_file), file reading
(ingest.io), the per-format merge rules (each parser's ``absorb``).
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import shutil
import tempfile
import time
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ingest.errors import ParseError
from ingest.io import TextShard, file_size, iter_text_blocks, load_spill, plan_text_shards, write_spill
from ingest.parsers import (PARSED_KINDS, ParseResult, Runner, ShardState, build_chain, iter_blocks, no_parser_result,
                            parse_text, run_shard)


@dataclass(frozen=True, kw_only=True)
class ShardStats:
    """How a sharded parse went. num_shards: shards the file was cut into (1: read serially);
    redone: indexes of the shards this process read again itself (the state before them was
    not at rest, or their merge would not have been exact); failed: indexes whose worker
    raised or died (read again too, so also in redone); read_here: indexes this process read
    while waiting instead of a worker (in order on the merged state, or ahead with a fresh
    chain), whose workers had not started them; predicted_speedup: from the probe (see
    ``parse_file_sharded``), None without one."""

    num_shards: int
    redone: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()
    read_here: tuple[int, ...] = ()
    predicted_speedup: float | None = None


# Shards per process: more than one lets the faster side take more of them (the caller steals
# queued shards), but each shard starts its parsers afresh and costs a merge; on a 2-CPU machine
# one each was fastest for every benchmark corpus (2 shards beat 4 and 8 at 16 MB).
SHARDS_PER_WORKER = 1
MIN_SHARD_BYTES = 2 << 20
# The probe: the first PROBE_BYTES (at most 1/16 of the file) read serially before any worker
# starts, to tell whether shipping a worker's records back costs more than reading them here.
PROBE_BYTES = 1 << 20
MIN_SPEEDUP = 1.25  # predicted: below it, the file is read on serially (pool start, merges, a busy machine)
_SAMPLE = 2000  # records pickled to time what shipping one costs
# A whole shard's state costs more per record to ship than the sample pickled alone (unpickled
# into this process's larger heap, through a file): 1.2 to 3 times on this 2-CPU machine.
SHIP_FACTOR = 2.0


def count_shards(num_bytes: int, num_workers: int) -> int:
    """How many shards to cut a file of ``num_bytes`` into for ``num_workers`` processes (this
    one included): at least one each, up to SHARDS_PER_WORKER each, none under MIN_SHARD_BYTES."""
    return max(num_workers, min(SHARDS_PER_WORKER * num_workers, num_bytes // MIN_SHARD_BYTES))


def can_shard(kind: str | None) -> bool:
    """Whether files of ``kind`` (a detected kind, None for unknown) can be read in shards."""
    return build_chain(kind or "unknown", source="") is not None


def parse_file_sharded(path: str | os.PathLike[str], *, kind: str | None, source: str, num_shards: int,
                       plan: list[TextShard] | None = None, pool: Executor | None = None,
                       max_workers: int | None = None, steal: bool = True, probe: bool = True,
                       min_speedup: float = MIN_SPEEDUP) -> tuple[ParseResult, ShardStats]:
    """Parse a text file of a known ``kind`` (None: unknown) in ``num_shards`` shards on
    parallel processes; the result equals ``parse_text(iter_text_blocks(path), kind=kind)``.

    probe (without ``plan``): first read the file's first PROBE_BYTES here, and go on
    serially unless the predicted speedup on ``max_workers + 1`` processes (from the probe's
    parse time per byte, and the time to pickle and unpickle a sample of its records, times
    its records per byte) is at least ``min_speedup``: a log that makes a record per line or
    more (torchtitan, Megatron timers) costs about as much to ship back as to parse. Then
    this process reads the first shard, and merges the shards in order (verify or redo, see
    the module doc). The others go to ``pool`` (default: a process pool made for this call,
    forked where the platform can, of ``max_workers`` processes, default one per shard after
    the first). steal: while waiting for shard k, read shards no worker has started yet
    here: k itself on the merged state, else the last one with a fresh chain (no pickling),
    so a slow or busy worker costs no idle time. plan: the shards to use
    (``plan_text_shards``; tests force cut points with it; no probe), instead of about
    ``num_shards`` equal ones. A kind whose parsers cannot be sharded, or a file with no
    place to cut, is parsed serially. Returns the result and ``ShardStats``. Raises
    ParseError if the file cannot be read; a worker that fails otherwise only costs time
    (its shard is read by this process).
    """
    kind = kind or "unknown"
    if not can_shard(kind):
        return parse_text(iter_text_blocks(path), source=source, kind=kind), ShardStats(num_shards=1)
    runner = Runner(build_chain(kind, source=source), kind=kind)
    predicted = None
    if plan is None and probe:
        head = plan_text_shards(path, 0, near=[min(PROBE_BYTES, file_size(path) // 16)])
        t0 = time.process_time()
        _read_on(runner, path, head[0])
        if len(head) > 1:
            predicted = _predicted_speedup(runner, seconds=time.process_time() - t0, num_bytes=head[0].end,
                                           num_workers=min((max_workers or num_shards - 1) + 1, num_shards))
            plan = plan_text_shards(path, num_shards, start=head[1].start)
        if len(head) < 2 or predicted < min_speedup:
            for shard in plan or ():
                _read_on(runner, path, shard)
            return _finish(runner, kind), ShardStats(num_shards=1, predicted_speedup=predicted)
    shards = plan if plan is not None else plan_text_shards(path, num_shards)
    if len(shards) < 2:
        for shard in shards:
            _read_on(runner, path, shard)
        return _finish(runner, kind), ShardStats(num_shards=1, predicted_speedup=predicted)
    own = pool is None
    if own:
        pool = ProcessPoolExecutor(max_workers=min(max_workers or len(shards) - 1, len(shards) - 1),
                                   mp_context=_fork_context())
    spill = tempfile.mkdtemp(prefix="ingest-shards-")
    try:
        futures = [None] + [pool.submit(_spill_shard, str(path), shard, kind, source, os.path.join(spill, f"{k}.pickle"))
                            for k, shard in enumerate(shards[1:], start=1)]
        _read_on(runner, path, shards[0])
        ahead: dict[int, ShardState] = {}  # shards read here with a fresh chain, before their turn
        redone, failed, here = [], [], []
        for k in range(1, len(shards)):
            state = ahead.pop(k, None)
            if state is None and steal:
                if futures[k].cancel():  # no worker took it: read it on here, as the serial parse does
                    _read_on(runner, path, shards[k])
                    here.append(k)
                    continue
                while not futures[k].done() and (j := _last_queued(futures, ahead, k)) is not None:
                    ahead[j] = _read_shard(str(path), shards[j], kind, source)
                    here.append(j)
            if state is None:
                state = _state(futures[k])
                if state is None:
                    failed.append(k)
            if state is None or not runner.absorb(state):
                runner.lineno = shards[k].first_lineno - 1  # (already so: the lines before were all read)
                _read_on(runner, path, shards[k])
                redone.append(k)
    finally:
        if own:
            pool.shutdown(wait=True, cancel_futures=True)
        shutil.rmtree(spill, ignore_errors=True)
    return _finish(runner, kind), ShardStats(num_shards=len(shards), redone=tuple(redone), failed=tuple(failed),
                                             read_here=tuple(sorted(here)), predicted_speedup=predicted)


def _finish(runner: Runner, kind: str) -> ParseResult:
    result = runner.result()
    return result if kind in PARSED_KINDS else no_parser_result(result)


def _predicted_speedup(runner: Runner, *, seconds: float, num_bytes: int, num_workers: int) -> float:
    """Serial time / predicted sharded time on ``num_workers`` processes, for text like the
    ``num_bytes`` the runner has read in ``seconds`` (CPU). Per byte: parsing p; shipping q (the
    records and step rows read so far, each at the cost of pickling and unpickling a sample
    of them, times SHIP_FACTOR); a worker parses and pickles its 1/W, this process parses its
    1/W and unpickles the other (W-1)/W: p/W + q/2W + q/2 (W-1)/W."""
    objects = [o for p in runner.parsers for o in (*p.records[-_SAMPLE:], *list(getattr(p, "_steps", {}).values())[-_SAMPLE:])]
    num_objects = sum(len(p.records) + len(getattr(p, "_steps", ())) for p in runner.parsers)
    t0 = time.process_time()
    pickle.loads(pickle.dumps(objects, protocol=pickle.HIGHEST_PROTOCOL))
    ship = (time.process_time() - t0) / max(len(objects), 1) * num_objects * SHIP_FACTOR
    w = max(num_workers, 1)
    sharded = seconds / w + ship / (2 * w) + ship / 2 * (w - 1) / w
    return seconds / sharded if sharded > 0 else float(w)


def _last_queued(futures: list, ahead: dict, k: int) -> int | None:
    """The last shard after k that no worker has started, now taken from the pool (cancelled);
    None if there is none (workers take shards in order: a started one ends the search)."""
    for j in range(len(futures) - 1, k, -1):
        if j in ahead:
            continue
        return j if futures[j].cancel() else None
    return None


def _read_shard(path: str, shard: TextShard, kind: str, source: str) -> ShardState:
    """One shard read by a fresh chain."""
    text = iter_text_blocks(path, span=(shard.start, shard.end))
    return run_shard(text, kind=kind, source=source, first_lineno=shard.first_lineno)


def _spill_shard(path: str, shard: TextShard, kind: str, source: str, spill: str) -> str:
    """A worker's job: one shard read by a fresh chain, its state pickled into the file
    ``spill``, whose name is the result. (A state of many MB sent through the pool's pipe goes
    in pipe-sized pieces, each waiting for the caller's result thread to get the GIL from its
    parsing thread: the worker would stall for as long as it took to read the shard.)"""
    return str(write_spill(_read_shard(path, shard, kind, source), spill))


def _read_on(runner: Runner, path: str | os.PathLike[str], shard: TextShard) -> None:
    """The runner reads the shard's lines on from its state, as the serial parse would."""
    for block in iter_blocks(iter_text_blocks(Path(path), span=(shard.start, shard.end))):
        runner.chunk_text(block)


def _state(future: Future) -> ShardState | None:
    """A worker's shard state; None if the worker failed (its shard is then read here)."""
    try:
        return load_spill(future.result())
    except ParseError:
        raise  # the file went away or became unreadable: the caller's one-line error
    except Exception:  # a dead worker (BrokenProcessPool), an unpicklable state, MemoryError...
        return None


def _fork_context():
    """Fork where there is one (workers start in milliseconds, with the modules loaded)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)
