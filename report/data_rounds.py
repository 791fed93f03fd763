"""The data rounds and the checkpoint cost: numbers, rules and the note's view of them.

Issue 5's route: a synthetic round first (tokens drawn in memory: rules the input pipeline
out), then a real-text round through the DataLoader; "if the two rounds' MFU differ a lot, the
bottleneck is on the data side". Per layout (RunSpec.layout) this pairs the rounds' runs and
computes the data wait (median and share of step time) and the throughput / MFU change from the
synthetic to the real round. A run whose data wait is a large share of its step time is a data
stall, whatever its round. Checkpoint cost comes from each run's checkpoint.json.

Pure: tables and records in, frozen records out; thresholds in DATA_THRESHOLDS (overridable by
the caller like report.rules.THRESHOLDS). Deliberately not here: wording (templates), files.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from core.formulas import select_measured
from core.records import DatasetRecord, EnvRecord, FixedConfig, LoadedRun, RunSpec, RunSummary
from report.metrics import compute_step_spread
from report.rules import THRESHOLDS, Evidence, Finding, LossEvidence, evidence_items, rule_loss

DATA_THRESHOLDS: dict[str, float] = {
    # a run stalls on data when this share of its measured step time is spent waiting for batches
    "data_stall_min_share": 0.05,
    # the real round is data-bound when its throughput falls by more than this fraction vs the
    # synthetic round AND by more than the step-time noise (report.rules.rule_fastest's measure)
    "data_round_slowdown_min": 0.05,
}


def compute_data_wait_share(steps: pd.DataFrame, *, warmup_steps: int) -> pd.DataFrame:
    """Per run: data_wait_total_s / step_time_total_s over the measured steps (see
    core.formulas.select_measured), each step's values the max over ranks (the slowest rank
    gates the step). Columns run, num_steps, data_wait_total_s, step_time_total_s,
    data_wait_share (NA when the step time sums to 0)."""
    cols = ["run", "num_steps", "data_wait_total_s", "step_time_total_s", "data_wait_share"]
    if steps.empty:
        return pd.DataFrame(columns=cols)
    per_step = select_measured(steps, warmup_steps=warmup_steps).groupby(["run", "step"]).agg(
        step_time_s=("step_time_s", "max"), data_wait_s=("data_wait_s", "max"))
    out = per_step.groupby("run").agg(num_steps=("step_time_s", "size"), data_wait_total_s=("data_wait_s", "sum"),
                                      step_time_total_s=("step_time_s", "sum")).reset_index()
    out["data_wait_share"] = (out["data_wait_total_s"] / out["step_time_total_s"]).where(out["step_time_total_s"] > 0)
    return out[cols]


@dataclass(frozen=True, kw_only=True)
class RoundRow:
    """One layout's rounds side by side (None where a round did not run or has no measured steps).
    *_delta: real over synthetic minus 1 (tokens/s, MFU); mfu_delta_points: real minus synthetic MFU."""

    layout: str
    strategy: str
    engine: str
    synthetic_run: str | None
    real_run: str | None
    synthetic_data_wait_median_s: float | None
    real_data_wait_median_s: float | None
    synthetic_data_wait_share: float | None
    real_data_wait_share: float | None
    synthetic_tokens_per_s: float | None
    real_tokens_per_s: float | None
    tokens_per_s_delta: float | None
    synthetic_mfu: float | None
    real_mfu: float | None
    mfu_delta_points: float | None
    noise: float | None  # the larger relative (p90 - median) / median step-time spread of the two runs
    loader: str | None  # the real run's loader knobs, "num_workers=2, pin_memory=True, ..."


@dataclass(frozen=True, kw_only=True)
class CheckpointRow:
    """One run's checkpoint.json: seconds, size, files and the restore check."""

    run: str
    format: str
    step: int
    save_s: float
    load_s: float | None
    size_gib: float
    num_files: int
    verify_steps: tuple[int, ...]
    loss_uninterrupted: tuple[float, ...]
    loss_restored: tuple[float, ...]
    max_abs_diff_nats: float | None
    tolerance_nats: float | None
    ok: bool | None


@dataclass(frozen=True, kw_only=True)
class StorageRow:
    role: str
    path: str
    fstype: str | None
    kind: str | None
    free_gib: float | None
    total_gib: float | None


@dataclass(frozen=True, kw_only=True)
class DataRoundSection:
    """What the note shows about data and checkpoints. rounds: the campaign's rounds in order;
    dataset: campaign.json's "dataset" record (None without a real round); rows: one per layout
    that ran a real round; checkpoints: runs with a checkpoint.json; storage: env.json's storage
    record; findings: data_stall / data_bound / data_not_bound / restore_failed, and
    round_loss_agrees / round_loss_disagrees for the rounds after the first (report.rules.rule_loss)."""

    rounds: tuple[str, ...]
    dataset: DatasetRecord | None
    num_epochs: float | None  # how many times a real run walks the corpus's samples
    rows: tuple[RoundRow, ...]
    checkpoints: tuple[CheckpointRow, ...]
    storage: tuple[StorageRow, ...]
    findings: tuple[Finding, ...]


def _num(v: Any) -> Any:
    return None if v is None or (isinstance(v, float) and v != v) else v


def build_round_rows(runs: Sequence[LoadedRun], summary: Sequence[RunSummary],
                     shares: Mapping[str, float | None]) -> list[RoundRow]:
    """Pair each layout's synthetic and real runs (RunSpec.layout and data_round; campaigns from
    before rounds read as synthetic). summary: report.metrics.summarize_runs records (same
    order); shares: run -> data_wait_share."""
    by_layout: dict[str, dict[str, tuple[RunSpec, RunSummary]]] = {}
    for r, s in zip(runs, summary):
        by_layout.setdefault(r.spec.layout or r.name, {})[r.spec.data_round or "synthetic"] = (r.spec, s)
    rows = []
    for layout, rounds in by_layout.items():
        if "real" not in rounds:
            continue
        (rr, rs), syn = rounds["real"], rounds.get("synthetic")
        sr, ss = syn if syn else (None, None)
        loader = rr.options.get("loader") or {}
        t_syn, t_real = (ss.tokens_per_s if ss else None), rs.tokens_per_s
        m_syn, m_real = (ss.mfu if ss else None), rs.mfu
        noises = [x for x in (compute_step_spread(ss) if ss else None, compute_step_spread(rs)) if x is not None]
        rows.append(RoundRow(
            layout=layout, strategy=rr.strategy, engine=rr.engine, synthetic_run=sr.name if sr else None, real_run=rr.name,
            synthetic_data_wait_median_s=ss.data_wait_median_s if ss else None,
            real_data_wait_median_s=rs.data_wait_median_s,
            synthetic_data_wait_share=shares.get(sr.name) if sr else None,
            real_data_wait_share=shares.get(rr.name),
            synthetic_tokens_per_s=t_syn, real_tokens_per_s=t_real,
            tokens_per_s_delta=t_real / t_syn - 1 if t_syn and t_real else None,
            synthetic_mfu=m_syn, real_mfu=m_real,
            mfu_delta_points=m_real - m_syn if m_syn is not None and m_real is not None else None,
            noise=max(noises) if noises else None,
            loader=", ".join(f"{k}={v}" for k, v in sorted(loader.items())) or None))
    return rows


@dataclass(frozen=True, kw_only=True)
class DataStallEvidence(Evidence):
    """data_stall: the run's data wait as a share of its measured step time, its median data
    wait and median step (s)."""

    data_wait_share: float
    data_wait_median_s: float | None
    step_time_median_s: float | None


@dataclass(frozen=True, kw_only=True)
class DataBoundEvidence(Evidence):
    """data_bound / data_not_bound: the layout, the real round's tokens/s change against the
    synthetic one, why it is bound ("wait", "slowdown" or None), the MFU change (points), the
    step-time noise, both rounds' data wait shares and the threshold share."""

    layout: str
    tokens_per_s_delta: float
    cause: str | None
    mfu_delta_points: float | None
    noise: float | None
    real_data_wait_share: float | None
    synthetic_data_wait_share: float | None
    data_stall_min_share: float


@dataclass(frozen=True, kw_only=True)
class RestoreEvidence(Evidence):
    """restore_failed: the largest loss difference after the restore (nats) and the checkpoint format."""

    max_abs_diff_nats: float | None
    format: str


@dataclass(frozen=True, kw_only=True)
class RoundLossEvidence(LossEvidence):
    """round_loss_agrees / round_loss_disagrees: rule_loss's evidence over a later data round's runs."""

    round: str


def rule_data_stall(summary: Sequence[RunSummary], shares: Mapping[str, float | None],
                    t: Mapping[str, float]) -> list[Finding]:
    """Runs whose data wait is at least ``data_stall_min_share`` of their measured step time."""
    out = []
    for s in summary:
        share = shares.get(s.run)
        if share is not None and share >= t["data_stall_min_share"]:
            out.append(Finding(kind="data_stall", runs=(s.run,), threshold=t["data_stall_min_share"],
                               evidence=DataStallEvidence(data_wait_share=share, data_wait_median_s=s.data_wait_median_s,
                                                          step_time_median_s=s.step_time_median_s)))
    return out


def rule_data_bound(rows: Sequence[RoundRow], t: Mapping[str, float]) -> list[Finding]:
    """Per layout with both rounds measured: data-bound when the real round's tokens/s fell by
    more than ``data_round_slowdown_min`` and more than the two runs' step-time noise, or when
    its data wait share reaches ``data_stall_min_share``; otherwise not data-bound."""
    out = []
    for r in rows:
        if r.tokens_per_s_delta is None:
            continue
        slower = -r.tokens_per_s_delta
        waits = r.real_data_wait_share is not None and r.real_data_wait_share >= t["data_stall_min_share"]
        slowdown = slower > t["data_round_slowdown_min"] and slower > (r.noise or 0.0)
        bound = waits or slowdown
        out.append(Finding(kind="data_bound" if bound else "data_not_bound", runs=(r.synthetic_run, r.real_run),
                           threshold=t["data_round_slowdown_min"], evidence=DataBoundEvidence(
                               layout=r.layout, tokens_per_s_delta=r.tokens_per_s_delta,
                               cause="wait" if waits else "slowdown" if slowdown else None,
                               mfu_delta_points=r.mfu_delta_points, noise=r.noise,
                               real_data_wait_share=r.real_data_wait_share,
                               synthetic_data_wait_share=r.synthetic_data_wait_share,
                               data_stall_min_share=t["data_stall_min_share"])))
    return out


def rule_restore(checkpoints: Sequence[CheckpointRow]) -> list[Finding]:
    """Checkpoint restores whose replayed losses did not match the uninterrupted run."""
    return [Finding(kind="restore_failed", runs=(c.run,), threshold=c.tolerance_nats,
                    evidence=RestoreEvidence(max_abs_diff_nats=c.max_abs_diff_nats, format=c.format))
            for c in checkpoints if c.ok is False]


def build_checkpoint_rows(runs: Sequence[LoadedRun]) -> list[CheckpointRow]:
    """CheckpointRows from the runs' checkpoint records, for runs that have one."""
    out = []
    for r in runs:
        c = r.checkpoint
        if c is None or _num(c.save_s) is None:
            continue
        out.append(CheckpointRow(
            run=r.name, format=c.format or "?", step=int(c.step), save_s=float(c.save_s),
            load_s=_num(c.load_s), size_gib=float(c.bytes_written) / 2**30,
            num_files=int(c.num_files), verify_steps=c.verify_steps,
            loss_uninterrupted=c.loss_uninterrupted, loss_restored=c.loss_restored,
            max_abs_diff_nats=_num(c.max_abs_diff_nats), tolerance_nats=_num(c.tolerance_nats),
            ok=None if _num(c.ok) is None else bool(c.ok)))
    return out


def build_storage_rows(env: EnvRecord) -> list[StorageRow]:
    return [StorageRow(role=str(s.role), path=str(s.path), fstype=s.fstype, kind=s.kind, free_gib=s.free_gib,
                       total_gib=s.total_gib) for s in env.storage or ()]


def build_data_round_section(*, fixed: FixedConfig, dataset: DatasetRecord | None, env: EnvRecord,
                             runs: Sequence[LoadedRun], summary: Sequence[RunSummary],
                             steps: pd.DataFrame, thresholds: Mapping[str, float] | None = None) -> DataRoundSection:
    """The section from campaign.json's fixed variables and dataset record, env.json, the runs'
    records, the metric summary (same order as runs) and the step rows."""
    t = {**DATA_THRESHOLDS, **{k: v for k, v in (thresholds or {}).items() if k in DATA_THRESHOLDS}}
    share_df = compute_data_wait_share(steps, warmup_steps=int(fixed.warmup_steps))
    shares = {r: _num(v) for r, v in zip(share_df["run"], share_df["data_wait_share"])}
    rows = build_round_rows(runs, summary, shares)
    checkpoints = build_checkpoint_rows(runs)
    ok_summary = [s for s, r in zip(summary, runs) if r.status_name == "ok"]
    rounds = tuple(str(fixed.data).split("+"))
    findings = rule_data_stall(ok_summary, shares, t) + rule_data_bound(rows, t) + rule_restore(checkpoints)
    if len(rounds) > 1:  # the note's ranking and loss check cover the first round; the later ones agree too?
        for later in rounds[1:]:
            same = [s for s, r in zip(ok_summary, [r for r in runs if r.status_name == "ok"])
                    if (r.spec.data_round or "synthetic") == later]
            t_loss = {**THRESHOLDS, **{k: v for k, v in (thresholds or {}).items() if k in THRESHOLDS}}
            findings += [Finding(kind=f"round_{f.kind}", runs=f.runs, threshold=f.threshold,
                                 evidence=RoundLossEvidence(**evidence_items(f), round=later))
                         for f in rule_loss(same, t_loss)]
    epochs = None
    if dataset and dataset.num_tokens:
        samples = (int(dataset.num_tokens) - 1) // int(fixed.model.seq_length)
        epochs = int(fixed.steps) * int(fixed.global_batch_size) / samples if samples else None
    return DataRoundSection(rounds=rounds, dataset=dataset,
                            num_epochs=epochs, rows=tuple(rows), checkpoints=tuple(checkpoints),
                            storage=tuple(build_storage_rows(env)), findings=tuple(findings))
