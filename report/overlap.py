"""Overlap measured: each layout's run beside its twin with the engine's overlap switches off
(runner.matrix ``overlap_pairs`` / a run's ``overlap = "pair"``), step time and exposed
communication with and without, and what section 5's what-if said overlap could save.

What is compared. Measured: the no-overlap twin's median step time minus the overlapped run's
(the metric table's medians: measured steps, profiled ones left out), and the same difference of
their exposed communication (section 5: transfer + skew wait per traced step, across ranks).
Predicted: the twin's what-if saving for removing its transfer (ingest.whatif, per traced step):
with overlap off nothing hides the transfer, so this is the most any overlap of it can save. The
overlapped run's own what-if cannot say what turning overlap off costs, and none is read from it.
The verdict: the measured step-time saving lies within that bound (plus the step-time noise of
the two runs, the larger p90 - median, times report.rules.THRESHOLDS ``noise_multiple``), beyond
it (overlap changed more than the twin's transfer: other work moved too), or overlap saved
nothing measurable (a saving no larger than that noise).

Records in, frozen records out. Deliberately not here: wording, file access, the pairing rule
(runner.matrix makes the twins; this module only finds them by ``options.overlap_off_of``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from core.records import LoadedRun
from report.evidence import AttributionView
from report.rules import flat_options

# section 5's categories that are communication left exposed on the critical path
EXPOSED_COMM_CATEGORIES = ("transfer", "skew_wait")
# the what-if category overlap can at most remove: the collectives' transfer
HIDEABLE_CATEGORY = "transfer"
OVERLAP_VERDICTS = ("within_bound", "beyond_bound", "no_saving", "no_prediction", "no_data")


@dataclass(frozen=True, kw_only=True)
class OverlapPair:
    """One layout with its overlap switches on (``run``) and off (``twin``).

    switches: (knob, value on, value off), nested knobs flattened ("zero.overlap_comm").
    step_time_*_s: median step time (s); step_time_saved_s = off - on (> 0: overlap is faster).
    exposed_comm_*_s: transfer + skew wait per traced step (s), None where the run has no
    attribution; exposed_comm_hidden_s = off - on. predicted_most_saved_s: the twin's what-if
    saving for its transfer (s per traced step; None: no what-if), predicted_method its
    method ("replay" | "analytic"); bound_share = step_time_saved_s / predicted_most_saved_s (how
    much of what overlap could save it saved; None without both, or a bound <= 0). noise_s: the
    larger p90 - median step time of the two runs x noise_multiple (s). verdict: one of
    OVERLAP_VERDICTS (module docstring)."""

    layout: str
    run: str
    twin: str
    engine: str
    data_round: str
    switches: tuple[tuple[str, str, str], ...]
    step_time_on_s: float | None
    step_time_off_s: float | None
    step_time_saved_s: float | None
    exposed_comm_on_s: float | None
    exposed_comm_off_s: float | None
    exposed_comm_hidden_s: float | None
    predicted_most_saved_s: float | None
    predicted_method: str | None
    bound_share: float | None
    noise_s: float | None
    verdict: str


@dataclass(frozen=True, kw_only=True)
class OverlapSection:
    """Every pair of the campaign, in run order; unpaired: twins whose overlapped run is missing."""

    pairs: tuple[OverlapPair, ...]
    unpaired: tuple[str, ...]
    noise_multiple: float


def compute_switches(on: Mapping[str, Any], off: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """(knob, value on, value off) for every resolved option that differs, the pairing key left out."""
    a, b = flat_options(on), flat_options(off)
    keys = sorted((set(a) | set(b)) - {"overlap_off_of"})
    return tuple((k, str(a.get(k)), str(b.get(k))) for k in keys if a.get(k) != b.get(k))


def _exposed_s(att: AttributionView | None) -> float | None:
    if att is None:
        return None
    parts = [att.traced_ms.get(c) for c in EXPOSED_COMM_CATEGORIES]
    return None if any(p is None for p in parts) else sum(parts) / 1e3


def _diff(off: float | None, on: float | None) -> float | None:
    return None if off is None or on is None else off - on


def judge_overlap(*, saved_s: float | None, most_s: float | None, noise_s: float | None) -> str:
    """The verdict of one pair (OVERLAP_VERDICTS): no_data without both step times; no_saving
    when the measured saving is within the noise; no_prediction without the twin's what-if;
    within_bound when saving <= predicted most + noise, beyond_bound otherwise."""
    if saved_s is None:
        return "no_data"
    noise = noise_s or 0.0
    if saved_s <= noise:
        return "no_saving"
    if most_s is None:
        return "no_prediction"
    return "within_bound" if saved_s <= most_s + noise else "beyond_bound"


def build_overlap_section(runs: Sequence[LoadedRun], *, step_times_s: Mapping[str, tuple[float | None, float | None]],
                          attribution: Mapping[str, AttributionView], noise_multiple: float) -> OverlapSection | None:
    """The campaign's overlap pairs; None when no run is a no-overlap twin.

    step_times_s: run -> (median, p90) step time (s), the metric table's; attribution: run ->
    report.attribution.AttributionView (traced runs only)."""
    twins = [r for r in runs if r.spec.options.get("overlap_off_of") is not None]
    if not twins:
        return None
    key = {(r.spec.layout, r.spec.data_round, r.spec.options.get("repeat")): r for r in runs}
    pairs, unpaired = [], []
    for twin in twins:
        o = twin.spec.options
        run = key.get((o["overlap_off_of"], twin.spec.data_round, o.get("repeat")))
        if run is None:
            unpaired.append(twin.name)
            continue
        (on_s, on_p90), (off_s, off_p90) = (step_times_s.get(n, (None, None)) for n in (run.name, twin.name))
        spreads = [p - m for m, p in ((on_s, on_p90), (off_s, off_p90)) if m is not None and p is not None]
        noise = noise_multiple * max(spreads) if spreads else None
        att_on, att_off = attribution.get(run.name), attribution.get(twin.name)
        exposed_on, exposed_off = _exposed_s(att_on), _exposed_s(att_off)
        most_ms = att_off.saving_ms.get(HIDEABLE_CATEGORY) if att_off is not None else None
        most = most_ms / 1e3 if most_ms is not None else None
        saved = _diff(off_s, on_s)
        pairs.append(OverlapPair(
            layout=run.spec.layout, run=run.name, twin=twin.name, engine=run.spec.engine,
            data_round=run.spec.data_round, switches=compute_switches(run.spec.options, o),
            step_time_on_s=on_s, step_time_off_s=off_s, step_time_saved_s=saved,
            exposed_comm_on_s=exposed_on, exposed_comm_off_s=exposed_off,
            exposed_comm_hidden_s=_diff(exposed_off, exposed_on), predicted_most_saved_s=most,
            predicted_method=att_off.saving_method.get(HIDEABLE_CATEGORY) if att_off is not None else None,
            bound_share=saved / most if saved is not None and most is not None and most > 0 else None,
            noise_s=noise, verdict=judge_overlap(saved_s=saved, most_s=most, noise_s=noise)))
    return OverlapSection(pairs=tuple(pairs), unpaired=tuple(unpaired), noise_multiple=noise_multiple)
