"""`runner status CAMPAIGN_DIR`: where each run of a campaign stands, from the files it has written.

State comes from <run>/status.json when the run ended; otherwise "running" once the run has
logs or metrics and a live runner holds the campaign's lock (runner.owner), "runner dead" when
none does (the lock's pid is gone, or there is no lock: `runner all --resume` finishes it),
"not started" before. Steps done (distinct step numbers, not lines) and tokens/s is the note's
(measured_tokens_per_s). Run names must be plain names, run folders and their records inside
the campaign (a symlink out is refused, naming it) and status.json a JSON object: a damaged
campaign is a ConfigError naming the file, never a traceback. This module
reads only.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from core.errors import ConfigError, NoDataError, ToolError
from ingest.paths import check_run_inside, check_run_name
from runner.launch import load_json
from runner.owner import LockState, describe_orphans, find_orphans, lock_path, read_lock
from runner.progress import MetricsTail, format_rate


@dataclass(frozen=True, kw_only=True)
class RunState:
    run: str
    state: str  # a RunStatus status, "running", "runner dead" or "not started"
    num_steps_done: int
    num_steps_total: int | None
    tokens_per_s: float | None  # median over the unprofiled post-warm-up steps
    cause: str | None


def load_run_state(run_dir: Path, *, name: str, warmup_steps: int = 0, runner_alive: bool = True) -> RunState:
    """RunState of one run directory (any of its files may be missing). runner_alive: a live
    runner holds the campaign (else a run without status.json is "runner dead").
    ConfigError naming the file for a spec.json / status.json that is not a JSON object."""
    spec = load_json(run_dir / "spec.json") if (run_dir / "spec.json").exists() else {}
    fixed = spec.get("fixed")
    total = fixed.get("steps") if isinstance(fixed, dict) else None
    total = total if isinstance(total, int) and not isinstance(total, bool) else None
    status = load_json(run_dir / "status.json") if (run_dir / "status.json").exists() else {}
    tail = MetricsTail(run_dir)
    tail.poll()
    if status:
        state = str(status.get("status"))[:40]
    elif (run_dir / "logs").is_dir() or tail.num_rows:
        state = "running" if runner_alive else "runner dead"
    else:
        state = "not started"
    cause = status.get("cause") if state not in ("ok", "running", "runner dead", "not started") else None
    return RunState(run=name, state=state, num_steps_done=tail.num_steps, num_steps_total=total,
                    tokens_per_s=measured_tokens_per_s(run_dir, warmup_steps=warmup_steps),
                    cause=str(cause) if cause is not None else None)


def measured_tokens_per_s(run_dir: Path, *, warmup_steps: int) -> float | None:
    """The note's tokens/s (one definition, core.formulas.compute_tokens_per_s): tokens per step
    over the median of the measured steps' slowest-rank step time, from every rank's validated
    metrics rows. None before the first measured step."""
    import pandas as pd

    from core.formulas import compute_tokens_per_s
    from ingest.io import load_metrics

    try:
        rows, _ = load_metrics(run_dir)
    except ToolError:
        return None
    if not rows:
        return None
    steps = pd.DataFrame(rows)
    tokens = steps["tokens"].dropna()
    if tokens.empty:
        return None
    return compute_tokens_per_s(steps.assign(run=run_dir.name), tokens_per_step=float(tokens.iloc[-1]),
                                warmup_steps=warmup_steps)


def load_campaign_status(root: Path) -> tuple[dict, list[RunState]]:
    """(campaign.json, one RunState per run in the campaign's order). NoDataError when ``root``
    is not a campaign directory."""
    if not root.is_dir() or not (root / "campaign.json").is_file():
        why = "no such directory" if not root.exists() else (
            "is a file" if not root.is_dir() else "not a campaign directory (no campaign.json)")
        raise NoDataError(f"{root}: {why}; pass a directory written by `runner all`")
    meta = load_json(root / "campaign.json")
    names = meta.get("runs") or sorted(p.parent.name for p in root.glob("*/spec.json"))
    if not isinstance(names, list):
        raise ConfigError(f"{root / 'campaign.json'}: runs: expected a list of run names; the campaign is damaged")
    names = [check_run_name(n, where=str(root / "campaign.json")) for n in names]
    for name in names:  # a run folder or record linked out of the campaign: one line naming the link
        check_run_inside(root, name)
    fixed = meta.get("fixed")
    warmup = fixed.get("warmup_steps") if isinstance(fixed, dict) else None
    warmup = warmup if isinstance(warmup, int) and not isinstance(warmup, bool) else 0
    owner = campaign_owner(root)
    alive = owner is not None and owner.state in ("held", "foreign")
    return meta, [load_run_state(root / n, name=n, warmup_steps=warmup, runner_alive=alive) for n in names]


def campaign_owner(root: Path) -> LockState | None:
    """The state of the campaign's main runner lock (runner.owner); None without one."""
    return read_lock(lock_path(root))


def render_status(root: Path, meta: dict, states: list[RunState]) -> str:
    """Lines: campaign header, one per run, then where the note is."""
    width = max((len(s.run) for s in states), default=0)
    lines = [f"campaign {str(meta.get('name', '?'))[:200]} in {root} ({len(states)} runs)"]
    owner = campaign_owner(root)
    if owner is not None and owner.state in ("held", "foreign"):
        lines.append(f"runner: running ({owner.describe()})")
    elif owner is not None or any(s.state == "runner dead" for s in states):
        # a runner killed with SIGKILL leaves its ranks writing: a plain --resume refuses to measure beside them
        orphans = find_orphans(root, stale=owner)
        resume = ["runner", "all", "--resume", str(root)] + (["--kill-orphans"] if orphans else [])
        lines.append(f"runner: dead ({f'its lock: {owner.describe()}' if owner else 'no runner holds the campaign'})"
                     + (f"; {len(orphans)} of its process(es) still run ({describe_orphans(orphans)})" if orphans else "")
                     + f"; finish with: {shlex.join(resume)}")
    for s in states:
        steps = f"{s.num_steps_done}/{s.num_steps_total if s.num_steps_total is not None else '?'} steps"
        line = f"  {s.run:<{width}}  {s.state:<11}  {steps:>13}  {format_rate(s.tokens_per_s)}"
        lines.append(line + (f"  cause: {s.cause.splitlines()[0]}" if s.cause else ""))
    note = next((root / "report" / f"note.{ext}" for ext in ("pdf", "html", "md")
                 if (root / "report" / f"note.{ext}").is_file()), None)
    lines.append(f"note: {note}" if note else f"note: not built yet ({shlex.join(['report', 'build', str(root)])})")
    return "\n".join(lines)
