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
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ingest.errors import ParseError
from ingest.io import TextShard, iter_text_blocks, plan_text_shards
from ingest.parsers import (PARSED_KINDS, ParseResult, Runner, ShardState, build_chain, iter_blocks, no_parser_result,
                            parse_text, run_shard)


@dataclass(frozen=True, kw_only=True)
class ShardStats:
    """How a sharded parse went. num_shards: shards the file was cut into (1: read serially);
    redone: indexes of the shards the calling process read again itself (the state before
    them was not at rest, or their merge would not have been exact); failed: indexes whose
    worker raised or died (read again too, so also in redone)."""

    num_shards: int
    redone: tuple[int, ...] = ()
    failed: tuple[int, ...] = ()


def can_shard(kind: str | None) -> bool:
    """Whether files of ``kind`` (a detected kind, None for unknown) can be read in shards."""
    return build_chain(kind or "unknown", source="") is not None


def parse_file_sharded(path: str | os.PathLike[str], *, kind: str | None, source: str, num_shards: int,
                       plan: list[TextShard] | None = None, pool: Executor | None = None,
                       max_workers: int | None = None) -> tuple[ParseResult, ShardStats]:
    """Parse a text file of a known ``kind`` (None: unknown) in ``num_shards`` shards on
    parallel processes; the result equals ``parse_text(iter_text_blocks(path), kind=kind)``.

    plan: the shards to use (``plan_text_shards``; tests force cut points with it), instead
    of about ``num_shards`` equal ones. pool: an executor to run the shards after the first
    on (default: a process pool made for this call, forked where the platform can, of
    ``max_workers`` processes, default one per shard after the first). A kind whose parsers
    cannot be sharded, or a file with no place to cut, is parsed serially. Returns the result
    and ``ShardStats``. Raises ParseError if the file cannot be read; a worker that fails
    otherwise only costs time (its shard is read by this process).
    """
    kind = kind or "unknown"
    shards = plan if plan is not None else plan_text_shards(path, num_shards)
    if len(shards) < 2 or not can_shard(kind):
        return parse_text(iter_text_blocks(path), source=source, kind=kind), ShardStats(num_shards=1)
    own = pool is None
    if own:
        pool = ProcessPoolExecutor(max_workers=min(max_workers or len(shards) - 1, len(shards) - 1),
                                   mp_context=_fork_context())
    try:
        futures = [pool.submit(_read_shard, str(path), shard, kind, source) for shard in shards[1:]]
        runner = Runner(build_chain(kind, source=source), kind=kind)
        _read_on(runner, path, shards[0])
        redone, failed = [], []
        for k, (shard, future) in enumerate(zip(shards[1:], futures), start=1):
            state = _state(future)
            if state is None:
                failed.append(k)
            if state is None or not runner.absorb(state):
                runner.lineno = shard.first_lineno - 1  # (already so: the lines before were all read)
                _read_on(runner, path, shard)
                redone.append(k)
    finally:
        if own:
            pool.shutdown(wait=True, cancel_futures=True)
    result = runner.result()
    if kind not in PARSED_KINDS:
        result = no_parser_result(result)
    return result, ShardStats(num_shards=len(shards), redone=tuple(redone), failed=tuple(failed))


def _read_shard(path: str, shard: TextShard, kind: str, source: str) -> ShardState:
    """A worker's job: one shard read by a fresh chain (pickled back to the caller)."""
    text = iter_text_blocks(path, span=(shard.start, shard.end))
    return run_shard(text, kind=kind, source=source, first_lineno=shard.first_lineno)


def _read_on(runner: Runner, path: str | os.PathLike[str], shard: TextShard) -> None:
    """The runner reads the shard's lines on from its state, as the serial parse would."""
    for block in iter_blocks(iter_text_blocks(Path(path), span=(shard.start, shard.end))):
        runner.chunk_text(block)


def _state(future: Future) -> ShardState | None:
    """A worker's shard state; None if the worker failed (its shard is then read here)."""
    try:
        return future.result()
    except ParseError:
        raise  # the file went away or became unreadable: the caller's one-line error
    except Exception:  # a dead worker (BrokenProcessPool), an unpicklable state, MemoryError...
        return None


def _fork_context():
    """Fork where there is one (workers start in milliseconds, with the modules loaded)."""
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("fork" if "fork" in methods else None)
