"""`runner status CAMPAIGN_DIR`: where each run of a campaign stands, from the files it has written.

State comes from <run>/status.json when the run ended; otherwise "running" once the run has
logs or metrics, "not started" before. Steps done and median tokens/s come from the lowest
rank's metrics file. This module reads only; it does not tell a running run from one whose
runner died (both lack status.json; `runner all --resume` finishes either).
"""
from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from ingest.errors import NoDataError
from runner.launch import load_json
from runner.progress import MetricsTail, format_rate


@dataclass(frozen=True, kw_only=True)
class RunState:
    run: str
    state: str  # a RunStatus status, "running" or "not started"
    num_steps_done: int
    num_steps_total: int | None
    tokens_per_s: float | None  # median over the unprofiled post-warm-up steps
    cause: str | None


def load_run_state(run_dir: Path, *, name: str, warmup_steps: int = 0) -> RunState:
    """RunState of one run directory (any of its files may be missing)."""
    spec = load_json(run_dir / "spec.json") if (run_dir / "spec.json").is_file() else {}
    total = spec.get("fixed", {}).get("steps") if isinstance(spec, dict) else None
    status = {}
    if (run_dir / "status.json").is_file():
        try:
            status = json.loads((run_dir / "status.json").read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            status = {"status": "unknown", "cause": "status.json is not valid JSON"}
    tail = MetricsTail(run_dir)
    rows = tail.poll()
    times = [r["tokens"] / r["step_time_s"] for r in rows
             if not r.get("profiled") and isinstance(r.get("step_time_s"), (int, float)) and r["step_time_s"] > 0
             and isinstance(r.get("tokens"), (int, float)) and r.get("step", 0) >= warmup_steps]
    if status:
        state = str(status.get("status"))
    elif (run_dir / "logs").is_dir() or tail.num_rows:
        state = "running"
    else:
        state = "not started"
    return RunState(run=name, state=state, num_steps_done=tail.num_rows, num_steps_total=total,
                    tokens_per_s=statistics.median(times) if times else None,
                    cause=status.get("cause") if state not in ("ok", "running", "not started") else None)


def load_campaign_status(root: Path) -> tuple[dict, list[RunState]]:
    """(campaign.json, one RunState per run in the campaign's order). NoDataError when ``root``
    is not a campaign directory."""
    if not root.is_dir() or not (root / "campaign.json").is_file():
        why = "no such directory" if not root.exists() else (
            "is a file" if not root.is_dir() else "not a campaign directory (no campaign.json)")
        raise NoDataError(f"{root}: {why}; pass a directory written by `runner all`")
    meta = load_json(root / "campaign.json")
    names = meta.get("runs") or sorted(p.parent.name for p in root.glob("*/spec.json"))
    warmup = (meta.get("fixed") or {}).get("warmup_steps") or 0
    return meta, [load_run_state(root / n, name=n, warmup_steps=warmup) for n in names]


def render_status(root: Path, meta: dict, states: list[RunState]) -> str:
    """Lines: campaign header, one per run, then where the note is."""
    width = max((len(s.run) for s in states), default=0)
    lines = [f"campaign {meta.get('name', '?')} in {root} ({len(states)} runs)"]
    for s in states:
        steps = f"{s.num_steps_done}/{s.num_steps_total if s.num_steps_total is not None else '?'} steps"
        line = f"  {s.run:<{width}}  {s.state:<11}  {steps:>13}  {format_rate(s.tokens_per_s)}"
        lines.append(line + (f"  cause: {s.cause.splitlines()[0]}" if s.cause else ""))
    note = next((root / "report" / f"note.{ext}" for ext in ("pdf", "html", "md")
                 if (root / "report" / f"note.{ext}").is_file()), None)
    lines.append(f"note: {note}" if note else f"note: not built yet (report build {root})")
    return "\n".join(lines)
