"""Live progress of one run while `runner all` supervises it, and the per-run summary `runner status` prints.

MetricsTail follows the lowest rank's metrics/rank<r>.jsonl by offset, so each poll reads only
the bytes appended since the last one; where those rows carry no loss (a pipeline's first
stage), the highest rank's file (the last stage) supplies it. summarize_progress turns the rows seen into a
RunProgress (step k/N, tokens/s from the median of recent step times, last loss, ETA).
Two reporters show it: a tqdm bar on a terminal, plain `[runner] ...` lines every 10 % of the
steps or every 30 s otherwise (logs, CI). This module does not classify how a run ended
(runner.launch does) and never writes into the campaign.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from ingest.io import open_regular
from ingest.paths import is_inside

RECENT_STEPS = 20  # step times the tokens/s median and the ETA are taken over


class MetricsTail:
    """Incremental reader of the lowest rank's metrics file in ``run_dir/metrics``.

    poll() -> rows (dicts) completed since the previous poll; a partial last line is kept
    until its newline arrives. num_rows counts every complete row seen; num_steps the distinct
    step numbers among them (what `runner status` shows: duplicated rows are not progress). A
    malformed row is counted but not returned (the ingest stage reports it; progress is best
    effort). A file that is not a regular file (a FIFO) is not read.
    """

    def __init__(self, run_dir: Path) -> None:
        self._dir = Path(run_dir) / "metrics"
        self._path: Path | None = None
        self._offset = 0
        self._partial = b""
        self.num_rows = 0
        # under PP only the last stage computes the loss: the highest rank's file supplies it
        self._loss_path: Path | None = None
        self._loss_offset = 0
        self._loss_partial = b""
        self._last_loss: float | None = None
        self._steps: set[int] = set()

    def _rank_files(self) -> dict[int, Path]:
        # a link out of the run folder is not the run's (ingest.io says so in the note)
        return {int(p.stem[4:]): p for p in self._dir.glob("rank*.jsonl")
                if p.stem[4:].isdigit() and (not p.is_symlink() or is_inside(p, self._dir.parent))}

    @property
    def num_steps(self) -> int:
        return len(self._steps)

    def _lowest_rank_file(self) -> Path | None:
        files = self._rank_files()
        return files[min(files)] if files else None

    def _poll_last_loss(self) -> float | None:
        """The latest loss in the highest rank's file (read incrementally), or None."""
        files = self._rank_files()
        if not files:
            return self._last_loss
        path = files[max(files)]
        if path != self._loss_path:
            self._loss_path, self._loss_offset, self._loss_partial = path, 0, b""
        try:
            with open_regular(path) as f:
                f.seek(self._loss_offset)
                data = f.read()
        except FileNotFoundError:
            return self._last_loss
        self._loss_offset += len(data)
        *lines, self._loss_partial = (self._loss_partial + data).split(b"\n")
        for line in lines:
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):  # bad JSON or UTF-8, or an integer past 4,300 digits
                continue
            if isinstance(row, dict) and isinstance(row.get("loss"), (int, float)):
                self._last_loss = row["loss"]
        return self._last_loss

    def poll(self) -> list[dict]:
        path = self._lowest_rank_file()
        if path is None:
            return []
        if path != self._path:  # a lower rank's file appeared: start over on it
            self._path, self._offset, self._partial, self.num_rows = path, 0, b"", 0
            self._steps = set()
        try:
            with open_regular(path) as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:  # gone, or not a regular file
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        rows = []
        for line in lines:
            if not line.strip():
                continue
            self.num_rows += 1
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):  # bad JSON or UTF-8, or an integer past 4,300 digits
                continue
            if isinstance(row, dict):
                rows.append(row)
                step = row.get("step")
                if isinstance(step, int) and not isinstance(step, bool) and step >= 0:
                    self._steps.add(step)
        if rows and not any(isinstance(r.get("loss"), (int, float)) for r in rows):
            # a pipeline's first stage has no loss: show the last stage's latest on the newest row
            loss = self._poll_last_loss()
            if loss is not None:
                rows[-1] = {**rows[-1], "loss": loss}
        return rows


@dataclass(frozen=True, kw_only=True)
class RunProgress:
    """Where one run stands. Missing values are None."""

    run: str
    num_steps_done: int
    num_steps_total: int
    tokens_per_s: float | None
    loss: float | None
    eta_s: float | None


def summarize_progress(rows: list[dict], *, run: str, num_steps_done: int, num_steps_total: int) -> RunProgress:
    """RunProgress from the most recent rows (oldest first; RECENT_STEPS of them suffice).

    tokens_per_s = tokens per step / median step_time_s over the recent unprofiled rows (the
    profiler inflates its steps); eta_s = remaining steps x that median step time.
    """
    recent = [r for r in rows[-RECENT_STEPS:] if not r.get("profiled")
              and isinstance(r.get("step_time_s"), (int, float)) and r["step_time_s"] > 0] or \
        [r for r in rows[-RECENT_STEPS:] if isinstance(r.get("step_time_s"), (int, float)) and r["step_time_s"] > 0]
    step_time_s = statistics.median(r["step_time_s"] for r in recent) if recent else None
    tokens = recent[-1].get("tokens") if recent else None
    loss = next((r["loss"] for r in reversed(rows) if isinstance(r.get("loss"), (int, float))), None)
    return RunProgress(
        run=run, num_steps_done=num_steps_done, num_steps_total=num_steps_total,
        tokens_per_s=tokens / step_time_s if step_time_s and isinstance(tokens, (int, float)) else None,
        loss=loss,
        eta_s=max(num_steps_total - num_steps_done, 0) * step_time_s if step_time_s is not None else None,
    )


def format_rate(tokens_per_s: float | None) -> str:
    """'340k tok/s', '1.2M tok/s', '-' when unknown."""
    if tokens_per_s is None:
        return "- tok/s"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if tokens_per_s >= div:
            v = tokens_per_s / div
            return f"{v:.1f}{suffix} tok/s" if v < 10 else f"{v:.0f}{suffix} tok/s"
    return f"{tokens_per_s:.0f} tok/s"


def format_eta(eta_s: float | None) -> str:
    if eta_s is None:
        return "-"
    if eta_s < 90:
        return f"{eta_s:.0f} s"
    if eta_s < 5400:
        return f"{eta_s / 60:.0f} min"
    return f"{eta_s / 3600:.1f} h"


def render_progress_fields(p: RunProgress) -> str:
    """'340k tok/s  loss 6.52  ETA 31 s' (no step counter)."""
    loss = f"loss {p.loss:.2f}" if p.loss is not None else "loss -"
    return f"{format_rate(p.tokens_per_s)}  {loss}  ETA {format_eta(p.eta_s)}"


def render_progress_line(p: RunProgress) -> str:
    """'[runner] ddp step 120/200  340k tok/s  loss 6.52  ETA 31 s'."""
    return f"[runner] {p.run} step {p.num_steps_done}/{p.num_steps_total}  {render_progress_fields(p)}"


class ProgressReporter(Protocol):
    def update(self, p: RunProgress) -> None: ...
    def close(self) -> None: ...


class PlainProgress:
    """Plain lines for logs and CI: one whenever the run passes another ``every_fraction`` of its
    steps or ``every_s`` seconds have gone by with new steps, and one at the end if the last
    line did not already show the final step."""

    def __init__(self, stream: IO[str], *, every_fraction: float = 0.1, every_s: float = 30.0,
                 clock=time.monotonic) -> None:
        self._stream, self._fraction, self._every_s, self._clock = stream, every_fraction, every_s, clock
        self._last_step, self._last_at = 0, clock()
        self._last: RunProgress | None = None

    def update(self, p: RunProgress) -> None:
        self._last = p
        if p.num_steps_done <= self._last_step:
            return
        step_every = max(1, int(p.num_steps_total * self._fraction))
        crossed = p.num_steps_done // step_every > self._last_step // step_every
        if crossed or self._clock() - self._last_at >= self._every_s:
            self._emit(p)

    def _emit(self, p: RunProgress) -> None:
        print(render_progress_line(p), file=self._stream, flush=True)
        self._last_step, self._last_at = p.num_steps_done, self._clock()

    def close(self) -> None:
        if self._last is not None and self._last.num_steps_done > self._last_step:
            self._emit(self._last)


class BarProgress:
    """A tqdm bar per run on a terminal: step k/N, then tokens/s, loss and our ETA (from the
    recent step times, not tqdm's rate, which would count the start-up)."""

    BAR_FORMAT = "{desc} step {n_fmt}/{total_fmt} |{bar}|{postfix}"

    def __init__(self, stream: IO[str], *, run: str, num_steps_total: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=num_steps_total, desc=f"    {run}", file=stream, bar_format=self.BAR_FORMAT,
                         dynamic_ncols=True, leave=False, mininterval=0.5)

    def update(self, p: RunProgress) -> None:
        self._bar.n = p.num_steps_done
        self._bar.set_postfix_str(render_progress_fields(p), refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()


def build_progress(*, run: str, num_steps_total: int, stream: IO[str] | None = None) -> ProgressReporter:
    """BarProgress when ``stream`` (default stdout) is a terminal, PlainProgress otherwise."""
    stream = sys.stdout if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return BarProgress(stream, run=run, num_steps_total=num_steps_total)
    return PlainProgress(stream)
