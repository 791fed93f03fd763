"""The triage view of a folder of logs (and of a campaign's failed runs): jobs side by side, each
with the facts its own files state (cited file:line, "unknown" otherwise), what failed first, the
chain that followed and, for hangs, the missing rank.

View-model only: the grouping and the facts are ingest.jobs's, the wording is the templates'.
Unrelated jobs are never ranked against each other: this section carries no recommendation.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

if TYPE_CHECKING:
    import pandas as pd

    from report.attribution import AttributionView

from core.records import LoadedRun
from ingest.hangs import rank_evidence
from ingest.jobs import Evidence, HangView, Job
from report.i18n import Message, N_

# (fact, label, filter the template formats it with): the rows of each job's fact list; labels and
# status words are catalogue messages (the note translates them)
FACT_ROWS = tuple((fact, Message(label), fmt) for fact, label, fmt in (
    ("world_size", N_("World size"), "text"), ("global_batch_size", N_("Global batch (samples)"), "text"),
    ("seq_length", N_("Sequence length"), "text"), ("num_steps", N_("Iterations logged"), "text"),
    ("step_time_median_s", N_("Step time (median)"), "duration"), ("samples_per_s", N_("Samples/s"), "num"),
    ("tokens_per_s", N_("Tokens/s"), "si"), ("hosts", N_("Hosts"), "text"), ("ranks_seen", N_("Ranks in the files"), "text"),
    ("gpus", N_("GPUs (collect_env)"), "text"), ("time_range", N_("Time range"), "text"),
    ("nccl_version", N_("NCCL"), "text"), ("torch_version", N_("torch"), "text"),
    ("step_time_by_rank", N_("Step time per rank (median)"), "text"), ("timers_ms", N_("Timers (mean)"), "text"),
    ("nccl_transports", N_("NCCL transports"), "text"), ("nccl_socket", N_("NCCL over sockets"), "text")))
STATUS_TEXT = {status: Message(words) for status, words in (
    ("oom", N_("failed: out of memory")), ("hang", N_("failed: hang")), ("failed", N_("failed")),
    ("no failure logged", N_("no failure in these files")), ("unknown", N_("unknown (no training or failure lines)")))}


@dataclass(frozen=True, kw_only=True)
class TriageRun:
    """A campaign run that did not end ok, from its status.json (cause, exit code, diagnosis)."""

    run: str
    status: str
    cause: str | None
    exit_code: int | None
    failed_at_step: int | None
    hang: HangView | None
    source: str  # "<run>/status.json"


@dataclass(frozen=True, kw_only=True)
class TriageSection:
    jobs: tuple[Job, ...] = ()
    runs: tuple[TriageRun, ...] = ()  # campaign notes: the failed runs
    unrelated: bool = False  # several jobs: described side by side, never compared
    fact_rows: tuple[tuple[str, str, str], ...] = FACT_ROWS
    status_text: Mapping[str, str] = None  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.status_text is None:
            object.__setattr__(self, "status_text", STATUS_TEXT)

    @property
    def failed_jobs(self) -> tuple[Job, ...]:
        return tuple(j for j in self.jobs if j.chain or j.hang)


def build_triage_section(jobs: Sequence[Job]) -> TriageSection:
    """Jobs of a logs folder -> the section (failed jobs first, then the rest in folder order)."""
    order = sorted(jobs, key=lambda j: (not (j.chain or j.hang), 0))
    return TriageSection(jobs=tuple(order), unrelated=len(jobs) > 1)


def build_triage_runs(runs: Sequence[LoadedRun], *,
                      failed_at_step: Mapping[str, int | None] | None = None) -> tuple[TriageRun, ...]:
    """A campaign's runs that did not end ok -> what status.json says failed, with the hang view
    of its diagnosis (py-spy stacks or flight recorder) when there is one. failed_at_step: run ->
    first step not completed by every rank (report.metrics.compute_failed_at_step)."""
    out = []
    for r in runs:
        status = r.status_name
        if status in (None, "ok", "skipped"):
            continue
        d = r.status.diagnosis or {}
        hang = None
        if d.get("source") == "py-spy" and d.get("ranks"):
            ranks = {int(k): v for k, v in d["ranks"].items()}
            odd = tuple(d.get("odd_ranks") or ())
            waiting = tuple(sorted(set(ranks) - set(odd)))
            fix = None
            called = [k for k in odd if ranks[k].get("blocked_in")]  # odd ranks with a stack (a stopped one has none)
            if called and d.get("majority_blocked_in"):
                where = ranks[called[0]].get("user_frame") or ranks[called[0]].get("frame")
                from ingest.jobs import describe_fix
                fix = describe_fix(odd=called, collective=ranks[called[0]]["blocked_in"], where=where, waiting=waiting,
                                   majority=d["majority_blocked_in"])
            hang = HangView(source="py-spy", cause=str(r.status.cause or ""), odd_ranks=odd, waiting_ranks=waiting,
                            odd_collective=ranks[called[0]]["blocked_in"] if called else None,
                            waiting_collective=d.get("majority_blocked_in"),
                            frames=tuple((k, *rank_evidence(v))
                                         for k, v in sorted(ranks.items(), key=lambda kv: (kv[0] not in odd, kv[0]))),
                            fix=fix, evidence=(f"{r.name}/status.json",))
        code = r.status.exit_code
        out.append(TriageRun(run=r.name, status=str(status), cause=r.status.cause,
                             exit_code=None if code is None else int(code),
                             failed_at_step=(failed_at_step or {}).get(r.name), hang=hang, source=f"{r.name}/status.json"))
    return tuple(out)


@dataclass(frozen=True, kw_only=True)
class FileRow:
    name: str
    kind: str
    num_records: int
    num_unparsed: int
    warnings: tuple[str, ...]


def build_file_rows(files: Any) -> tuple[FileRow, ...]:
    """The ``files`` table -> one row per input file (nothing read is left out of the note)."""
    if files is None or files.empty:
        return ()
    from pathlib import Path
    return tuple(FileRow(name=Path(str(f["source"])).name, kind=str(f["kind"]), num_records=int(f["num_records"]),
                         num_unparsed=int(f["num_unparsed_lines"]),
                         warnings=tuple(json.loads(f["warnings"]) if isinstance(f.get("warnings"), str) else ()))
                 for f in files.to_dict("records"))


@dataclass(frozen=True, kw_only=True)
class TraceJob:
    """A job's own torch.profiler traces, attributed across the ranks given as a campaign's
    section 5 (report.attribution.build_attribution). run: the job's name; num_ranks: ranks given;
    world_size: what the traces' distributedInfo says (None: unknown); missing_ranks: ranks of
    that world with no trace here; whole_trace_ranks: ranks whose trace had no ProfilerStep
    marks (the whole trace is one window); warnings: the attribution's own caveats."""

    run: str
    num_ranks: int
    ranks: tuple[int, ...]
    world_size: int | None
    missing_ranks: tuple[int, ...]
    whole_trace_ranks: tuple[int, ...]
    attribution: AttributionView
    sources: tuple[str, ...]
    warnings: tuple[str, ...] = ()


def build_trace_jobs(tables: Mapping[str, pd.DataFrame], jobs: Sequence[Job], *, folder: str) -> tuple[TraceJob, ...]:
    """Jobs with profiler traces (``attribution`` table of ingest.thirdparty.compute_trace_attribution)
    -> TraceJob views, in job order."""
    from types import SimpleNamespace

    from report.attribution import build_attribution, commbench_rows

    att = tables.get("attribution")
    if att is None or att.empty:
        return ()
    meta = tables.get("traces")
    warn = tables.get("trace_warnings")
    trace_tables = SimpleNamespace(attribution=att, collectives=tables.get("trace_collectives"),
                                   whatif=tables.get("trace_whatif"))
    bench = commbench_rows(folder)
    out = []
    for j in jobs:
        rows = att[att["run"] == j.name]
        if rows.empty:
            continue
        ranks = tuple(sorted(int(r) for r in rows["rank"].unique()))
        m = meta[meta["source"].isin(j.sources)] if meta is not None and not meta.empty else None
        world = None
        whole: tuple[int, ...] = ()
        if m is not None and not m.empty:
            sizes = m["world_size"].dropna()
            world = int(sizes.max()) if len(sizes) else None
            whole = tuple(sorted(int(r) for r in m[m["whole_trace"].astype(bool)]["rank"].dropna()))
        # no campaign: no layout beyond the ranks given, no host map
        view = build_attribution(trace_tables, run=j.name, pp_degree=1, world_size=len(ranks), num_layers=0, plant=None,
                                 host=None, commbench=bench, median_step_s=None)
        if view is None:
            continue
        missing = tuple(r for r in range(world) if r not in ranks) if world and world > len(ranks) else ()
        out.append(TraceJob(run=j.name, num_ranks=len(ranks), ranks=ranks, world_size=world, missing_ranks=missing,
                            whole_trace_ranks=whole, attribution=view,
                            sources=tuple(s for s in j.sources if m is not None and s in set(m["source"])),
                            warnings=tuple(warn[warn["run"] == j.name]["warning"]) if warn is not None else ()))
    return tuple(out)
