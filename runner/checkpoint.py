"""Checkpoint cost and restore check, per strategy, in each engine's own sharded format.

Inside a run (runner.train): after step ``spec.checkpoint_step`` every rank calls its trainer's
``save_checkpoint`` (torch distributed checkpoint for the torch engines, DeepSpeed's
``save_checkpoint`` for ZeRO-3, Megatron's ``dist_checkpointing`` for Megatron TP+PP), timed
from a barrier before to a barrier after; the step clock restarts afterwards, so no step time
holds the save. The run then goes on uninterrupted. After its last step, ``load_checkpoint``
(timed the same way) rewinds every rank to the saved state and the next
``checkpoint_verify_steps`` steps are replayed on the same batches and learning rates; their
losses must equal the uninterrupted run's within ``RESTORE_TOLERANCE_NATS`` of the campaign's
dtype. Rank 0 writes ``<run>/checkpoint.json`` (core.records.CheckpointRecord) and, unless
``checkpoint_keep``, deletes the files once measured.

Bytes and files are what rank 0 sees under the checkpoint directory after the save (on several
nodes with node-local directories, node 0's share only). Deliberately not here: asynchronous
saves, resharding on load (a restore here is into the same layout).
"""
from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from core.records import CheckpointRecord, RunSpec, to_dict

# A restore must reproduce the next steps' losses within this many nats. fp32 on CPU replays
# bit for bit (measured: 0); on GPU, reduction order in backward (atomics) may differ by ulps,
# which bf16 compounds over the replayed updates.
RESTORE_TOLERANCE_NATS = {"fp32": 1e-4, "bf16": 2e-2}


def checkpoint_path(spec: RunSpec, *, run_dir: Path) -> Path:
    """Where this run's checkpoint lives: <run>/checkpoint, or <checkpoint_dir>/<campaign>/<run>."""
    if spec.checkpoint_dir:
        return Path(spec.checkpoint_dir).expanduser() / spec.campaign / spec.name
    return run_dir / "checkpoint"


def measure_directory(path: Path) -> tuple[int, int]:
    """(bytes, files) of every regular file under ``path``."""
    total = files = 0
    for root, _, names in os.walk(path):
        for n in names:
            p = Path(root) / n
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
                files += 1
    return total, files


def _timed_collective(fn: Callable[[], None], *, device: torch.device) -> float:
    """Seconds from a barrier before ``fn`` to a barrier after it (device work included)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier()
    return time.perf_counter() - t0


class CheckpointProbe:
    """Save once mid-run, restore after the run, replay and compare (module docstring).

    ``save(step)`` is called by the training loop after the checkpoint step; ``verify(...)``
    after the loop, with the recorder's per-step losses and a function giving a step's
    micro-batches on the device."""

    def __init__(self, spec: RunSpec, trainer, *, run_dir: Path, rank: int, device: torch.device) -> None:
        self.spec, self.trainer, self.rank, self.device = spec, trainer, rank, device
        self.path = checkpoint_path(spec, run_dir=run_dir)
        self.run_dir = run_dir
        self.save_s: float | None = None
        self.bytes_written = self.num_files = 0

    def save(self, step: int) -> None:
        """Save after ``step``; a failing engine save is reported on the rank's log and leaves
        ``save_s`` None (no restore check), so the run's measurements survive it."""
        try:
            self._save(step)
        except Exception as e:  # noqa: BLE001 -- an engine's checkpoint bug must not cost the run's metrics
            self.save_s = None
            print(f"[runner] {self.spec.name}: checkpoint save failed after step {step} ({type(e).__name__}: {e});"
                  " no checkpoint columns for this run", flush=True)

    def _save(self, step: int) -> None:
        if self.rank == 0:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        self.save_s = _timed_collective(lambda: self.trainer.save_checkpoint(self.path), device=self.device)
        if self.rank == 0:
            self.bytes_written, self.num_files = measure_directory(self.path)
            print(f"[runner] {self.spec.name}: checkpoint after step {step}: {self.bytes_written / 2**20:.1f} MiB in "
                  f"{self.num_files} files, {self.save_s:.2f} s", flush=True)

    def verify(self, *, losses: dict[int, float | None], batches: Callable[[int], list],
               lr_at: Callable[[int], float]) -> CheckpointRecord | None:
        """Restore, replay the verify steps, compare; rank 0 returns (and writes) the record."""
        spec = self.spec
        steps = list(range(spec.checkpoint_step + 1, spec.checkpoint_step + 1 + spec.checkpoint_verify_steps))
        load_s = _timed_collective(lambda: self.trainer.load_checkpoint(self.path), device=self.device)
        restored: dict[int, float | None] = {}
        for s in steps:
            out = self.trainer.train_step(batches(s), lr=lr_at(s))
            restored[s] = None if out.loss is None else float(out.loss.item() if torch.is_tensor(out.loss) else out.loss)
        mine = [(s, losses.get(s), restored[s]) for s in steps if restored[s] is not None]
        gathered: list = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, mine)
        dist.barrier()
        if self.rank != 0:
            return None
        record = build_checkpoint_record(spec, engine_format=self.trainer.checkpoint_format, path=self.path,
                                         save_s=self.save_s, load_s=load_s, bytes_written=self.bytes_written,
                                         num_files=self.num_files, steps=steps, per_rank=gathered)
        if not spec.checkpoint_keep:
            shutil.rmtree(self.path, ignore_errors=True)
        from core.atomic import write_json_atomic

        write_json_atomic(self.run_dir / "checkpoint.json", to_dict(record))
        return record


def build_checkpoint_record(spec: RunSpec, *, engine_format: str, path: Path, save_s: float, load_s: float,
                            bytes_written: int, num_files: int, steps: Sequence[int],
                            per_rank: Sequence[Sequence[tuple[int, float | None, float]]]) -> CheckpointRecord:
    """The record from every rank's (step, uninterrupted loss, restored loss) triples. Losses per
    step: mean over the ranks that compute one; max_abs_diff_nats: the largest per-rank gap
    (a rank's replay is compared with that rank's own uninterrupted row); ok: a gap on every
    step and all within the dtype's tolerance."""
    tolerance = RESTORE_TOLERANCE_NATS.get(spec.fixed.dtype, RESTORE_TOLERANCE_NATS["bf16"])
    triples = [t for rank in per_rank for t in rank]
    gaps = [abs(r - u) for _, u, r in triples if u is not None]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    unint = tuple(mean([u for s2, u, _ in triples if s2 == s and u is not None]) for s in steps)
    rest = tuple(mean([r for s2, _, r in triples if s2 == s]) for s in steps)
    covered = {s for s, u, _ in triples if u is not None} == set(steps)
    max_gap = max(gaps) if gaps else None
    return CheckpointRecord(
        run=spec.name, engine=spec.engine, format=engine_format, path=str(path), step=spec.checkpoint_step,
        save_s=save_s, load_s=load_s, bytes_written=bytes_written, num_files=num_files, verify_steps=tuple(steps),
        loss_uninterrupted=unint, loss_restored=rest, max_abs_diff_nats=max_gap, tolerance_nats=tolerance,
        ok=bool(covered and max_gap is not None and max_gap <= tolerance), kept=spec.checkpoint_keep)
