"""The note's Search section from <campaign>/search.json (runner.search): every candidate (tried,
pruned, untried) with its predicted and measured step time and peak memory per rank, the model's
error per category before and after the refit, and why the chosen layout beats the runner-up.

Per-category errors need measured categories, which only the traces have: section 5's breakdown
of each traced trial (report.predict's grouping: compute; transfer; bubble + imbalance; the rest
is host time, which the search's model does not price and so is left out) against the search's
predictions of the same categories at the prior compute rate (before) and at the refit's rate from
the other trials (after, leave-one-out). The ranking is explained by the what-if savings of both
runs (ingest.whatif: what removing each cause would save per step); where a run has no what-if
numbers for a category, its section-5 time stands in (as the executive summary's why does), and
where a run has no traces the section says so. Deliberately not here: wording (templates), reading
files beyond ingest.io.read_regular_text.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from report.evidence import compute_category_separations
from report.i18n import Message, N_

SEARCH_FILE = "search.json"
# reasons earlier versions of runner search recorded in search.json (catalogue messages, so a note built from
# such a file prints them translated: report.i18n.translate_recorded)
RECORDED_REASONS = (N_("not runnable: no activation-recomputation switch in the campaign runner"),)
PRICED_CATEGORIES = ("compute", "transfer", "bubble")  # the search model's categories (report.predict's, less host)
MAX_SEARCH_BYTES = 64 << 20


@dataclass(frozen=True, kw_only=True)
class SearchRow:
    """One candidate. Times in ms per step, memory in GiB on the fullest rank (predicted) and the
    largest over ranks (measured). state: pruned | untried | a run status."""

    name: str
    layout: str
    engine: str
    state: str
    reason: str | None
    trial_index: int | None
    predicted_before_ms: float | None
    predicted_after_ms: float | None
    measured_ms: float | None
    measured_p10_ms: float | None
    measured_p90_ms: float | None
    predicted_mem_gib: float | None
    measured_mem_gib: float | None
    mem_error: float | None  # predicted / measured - 1


@dataclass(frozen=True, kw_only=True)
class CategoryError:
    """Largest |predicted / measured - 1| over the traced ok trials of one category (None: no
    trial measured 1 ms or more of it), before and after the refit."""

    category: str
    before: float | None
    after: float | None
    num_runs: int


@dataclass(frozen=True, kw_only=True)
class RankingWhy:
    """Why ``winner`` beats ``runner_up`` by margin_ms (their measured median steps). winner_cat:
    the category the winner pays more for, by winner_cat_ms; runner_cat: the one the runner-up pays
    more for, by runner_cat_ms (None when there is none). source: "whatif" (every compared number
    a what-if saving) or "mixed" (section-5 times where no what-if applies). missing: runs with no
    traced evidence (then no category is named). within_spread: the two trials' p10-p90 step
    ranges overlap, so the measured order is not distinguishable from step-to-step noise."""

    winner: str
    runner_up: str
    margin_ms: float
    winner_cat: str | None
    winner_cat_ms: float | None
    runner_cat: str | None
    runner_cat_ms: float | None
    source: str
    missing: tuple[str, ...]
    within_spread: bool = False


@dataclass(frozen=True, kw_only=True)
class SearchSection:
    """The section; problem: why search.json was left out (then nothing else is set)."""

    problem: str | None = None
    device: str = ""
    preset: str = ""
    num_gpus: int = 0
    num_candidates: int = 0
    num_pruned: int = 0
    num_tried: int = 0
    memory_limit_gib: float | None = None
    usable_fraction: float = 1.0
    budget_min: float = 0.0
    top_k: int = 0
    wall_s: float | None = None
    stop_reason: str | None = None
    choice: str | None = None
    choice_step_ms: float | None = None
    rows: tuple[SearchRow, ...] = ()
    step_error_before: float | None = None
    step_error_after: float | None = None
    category_errors: tuple[CategoryError, ...] = ()
    memory_error_max: float | None = None
    why: RankingWhy | None = None


def load_search(source: str | Path) -> tuple[dict | None, str | None]:
    """(<source>/search.json parsed, None) or (None, why it was left out); (None, None) without one."""
    from core.errors import ToolError
    from ingest.io import read_regular_text

    path = Path(source) / SEARCH_FILE
    if not path.is_file():
        return None, None
    try:
        data = json.loads(read_regular_text(path, max_bytes=MAX_SEARCH_BYTES))
    except (ToolError, OSError, ValueError) as e:
        return None, Message(N_("%(file)s: unreadable (%(error)s)"), file=path, error=str(e)[:120])
    if not isinstance(data, dict) or not isinstance(data.get("candidates"), list) or data.get("schema_version") != 1:
        return None, Message(N_("%(file)s: not a search record of schema version 1"), file=path)
    return data, None


def _ms(pred: Mapping[str, Any] | None, key: str = "step_ms") -> float | None:
    return None if not pred else pred.get(key)


def build_rows(data: Mapping[str, Any]) -> tuple[SearchRow, ...]:
    rows = []
    for c in data["candidates"]:
        measured_mem = max(c.get("measured_mem_peak_gib") or [], default=None)
        pred_mem = c.get("mem_peak_gib")
        rows.append(SearchRow(
            name=c["name"], layout=c.get("layout", c["name"]), engine=c["engine"], state=c["state"],
            reason=c.get("reason"), trial_index=c.get("trial_index"), predicted_before_ms=_ms(c.get("before")),
            predicted_after_ms=_ms(c.get("after")), measured_ms=c.get("measured_step_ms"),
            measured_p10_ms=c.get("measured_step_p10_ms"), measured_p90_ms=c.get("measured_step_p90_ms"),
            predicted_mem_gib=pred_mem, measured_mem_gib=measured_mem,
            mem_error=pred_mem / measured_mem - 1 if pred_mem is not None and measured_mem else None))
    return tuple(rows)


def compute_category_errors(data: Mapping[str, Any],
                            breakdowns: Mapping[str, Mapping[str, float]]) -> tuple[CategoryError, ...]:
    """Per PRICED_CATEGORIES category: the largest error over traced ok trials, before and after
    the refit. breakdowns: run -> section 5's breakdown_ms (the eight categories)."""
    from report.predict import _measured_groups

    out = []
    trials = [c for c in data["candidates"] if c["state"] == "ok" and c["name"] in breakdowns]
    for cat in PRICED_CATEGORIES:
        errs: dict[str, list[float]] = {"before": [], "after": []}
        n = 0
        for c in trials:
            measured = _measured_groups(breakdowns[c["name"]])[cat]
            if measured < 1.0:  # under 1 ms an error ratio says nothing
                continue
            n += 1
            for when in errs:
                pred = _ms(c.get(when), f"{cat}_ms")
                if pred is not None:
                    errs[when].append(abs(pred / measured - 1))
        out.append(CategoryError(category=cat, before=max(errs["before"], default=None),
                                 after=max(errs["after"], default=None), num_runs=n))
    return tuple(out)


def explain_ranking(rows: Sequence[SearchRow], attribution: Mapping[str, Any]) -> RankingWhy | None:
    """The winner (fastest measured trial) against the runner-up (the next), from their what-if
    savings per category (attribution: run -> report.attribution.AttributionView); None with
    fewer than two measured trials."""
    ok = sorted((r for r in rows if r.state == "ok" and r.measured_ms is not None), key=lambda r: r.measured_ms)
    if len(ok) < 2:
        return None
    a, b = ok[0], ok[1]
    margin = b.measured_ms - a.measured_ms
    within = a.measured_p90_ms is not None and b.measured_p10_ms is not None and a.measured_p90_ms >= b.measured_p10_ms
    va, vb = attribution.get(a.name), attribution.get(b.name)
    missing = tuple(r.name for r, v in ((a, va), (b, vb)) if v is None)
    if missing:
        return RankingWhy(winner=a.name, runner_up=b.name, margin_ms=margin, winner_cat=None, winner_cat_ms=None,
                          runner_cat=None, runner_cat_ms=None, source="none", missing=missing,
                          within_spread=within)
    diffs, mixed = compute_category_separations(va, vb)  # the executive summary's comparison, the same numbers
    runner_cat = max(diffs, key=diffs.get)
    winner_cat = min(diffs, key=diffs.get)
    return RankingWhy(
        winner=a.name, runner_up=b.name, margin_ms=margin,
        winner_cat=winner_cat if diffs[winner_cat] < 0 else None,
        winner_cat_ms=-diffs[winner_cat] if diffs[winner_cat] < 0 else None,
        runner_cat=runner_cat if diffs[runner_cat] > 0 else None,
        runner_cat_ms=diffs[runner_cat] if diffs[runner_cat] > 0 else None,
        source="mixed" if mixed else "whatif", missing=(), within_spread=within)


def build_search_section(data: Mapping[str, Any], *, attribution: Mapping[str, Any]) -> SearchSection:
    """The section from search.json's content and section 5's per-run attribution views."""
    req = data.get("request") or {}
    rows = build_rows(data)
    breakdowns = {run: dict(v.breakdown_ms) for run, v in attribution.items()}
    errors = data.get("step_error_max") or {}
    margin = data.get("margin") or {}
    return SearchSection(
        device=str(req.get("device")), preset=str(req.get("preset")), num_gpus=int(req.get("num_gpus") or 0),
        num_candidates=int(data.get("num_candidates") or len(rows)), num_pruned=int(data.get("num_pruned") or 0),
        num_tried=int(data.get("num_tried") or 0), memory_limit_gib=margin.get("memory_limit_gib"),
        usable_fraction=float(margin.get("usable_fraction") or 1.0), budget_min=float(req.get("budget_s") or 0) / 60,
        top_k=int(req.get("top_k") or 0), wall_s=data.get("search_wall_s"), stop_reason=data.get("stop_reason"),
        choice=data.get("choice"), choice_step_ms=data.get("choice_step_ms"), rows=rows,
        step_error_before=errors.get("before"), step_error_after=errors.get("after"),
        category_errors=compute_category_errors(data, breakdowns), memory_error_max=data.get("memory_error_max"),
        why=explain_ranking(rows, attribution))


def build_search_note(source: Any, evidence: Any) -> SearchSection | None:
    """The note's ``search`` field: the section from <source>/search.json with section 5's
    attribution (evidence: the note's EvidenceSection), a section holding only the problem when
    the file is unreadable, None without one."""
    if not isinstance(source, (str, Path)):
        return None
    data, problem = load_search(source)
    if problem:
        return SearchSection(problem=problem)
    if data is None:
        return None
    attribution = {b.run: b.attribution for b in evidence.rows if b.attribution is not None}
    try:
        return build_search_section(data, attribution=attribution)
    except (KeyError, TypeError, ValueError) as e:
        return SearchSection(problem=f"{Path(source) / SEARCH_FILE}: malformed ({type(e).__name__}: {str(e)[:100]})")
