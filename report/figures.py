"""SVG figures for the note's evidence section (matplotlib, Agg backend).

Inputs are tables already computed by report.metrics; this module only plots them. Files
are written through ingest.io (atomic). Text is SVG text (``svg.fonttype: none``): vector in
the PDF, searchable, set in the note's fonts (a CJK family after DejaVu Sans, so translated
labels render). Labels are English messages (``N_``) passed through ``gettext`` (the note
language's, report.i18n). Deliberately not here: any statistic.
"""
from __future__ import annotations

import io
import warnings
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from core.atomic import write_bytes_atomic
from core.records import BREAKDOWN_CATEGORIES  # noqa: E402
from report.i18n import N_  # noqa: E402

Gettext = Callable[[str], str]

# one colour per category, the same in both profiler figures
CATEGORY_COLORS = {"compute": "tab:green", "exposed_comm": "tab:red", "bubble": "tab:purple",
                   "data_stall": "tab:orange", "other": "tab:gray", "hidden_comm": "tab:pink"}
CATEGORY_LABELS = {"compute": N_("compute"), "exposed_comm": N_("exposed comm"), "bubble": N_("pipeline bubble"),
                   "data_stall": N_("data stall"), "other": N_("other (memcpy, launch gaps, host)"),
                   "hidden_comm": N_("comm hidden under compute")}

# the SVG names the families; the PDF renderer picks each glyph's font (CJK after Latin)
plt.rcParams.update({"svg.hashsalt": "report", "svg.fonttype": "none", "font.size": 9, "font.family": "sans-serif",
                     "font.sans-serif": ["DejaVu Sans", "Noto Sans CJK SC"]})


def _identity(message: str) -> str:
    return message


def _labels_collide(labels: list[str], *, width_in: float, font_pt: float = 9.0) -> bool:
    """Whether horizontal tick labels of ``labels``, evenly spread over ``width_in`` inches,
    would touch (an average character is about 0.6 em wide in DejaVu Sans)."""
    if not labels:
        return False
    slot_in = 0.8 * width_in / len(labels)  # the axes take about 80% of the figure's width
    return max(len(x) for x in labels) * 0.6 * font_pt / 72 > 0.9 * slot_in


def _svg(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():  # layout metrics come from DejaVu Sans; CJK glyphs are drawn by the reader
        warnings.filterwarnings("ignore", message="Glyph .* missing from font")
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def render_loss_figure(loss_curve: pd.DataFrame, *, loss_floor_nats: float | None = None,
                       band: pd.DataFrame | None = None, gettext: Gettext = _identity) -> bytes:
    """Loss vs step, one line per run. loss_curve: columns run, step, loss (nats), the runs
    drawn; band: columns step, loss_min, loss_max (report.metrics.compute_loss_band over every
    run), drawn as a grey band under the lines, or None. -> SVG bytes."""
    _ = gettext
    fig, ax = plt.subplots(figsize=(6.0, 3.2), layout="constrained")
    if band is not None and not band.empty:
        ax.fill_between(band["step"], band["loss_min"], band["loss_max"], color="0.85", linewidth=0,
                        label=_(N_("every run: lowest to highest loss")))
    for run, df in loss_curve.groupby("run", sort=False):
        ax.plot(df["step"], df["loss"], label=str(run), linewidth=1.2)
    if loss_floor_nats is not None:
        ax.axhline(loss_floor_nats, color="grey", linestyle=":", linewidth=1, label=_(N_("data entropy (floor)")))
    ax.set_xlabel(_(N_("step")))
    ax.set_ylabel(_(N_("loss (nats)")))
    ax.grid(alpha=0.3)
    if not loss_curve.empty:
        # outside the axes, to the right: the curves start high and fall, so any corner inside hides some
        fig.legend(fontsize=7, loc="outside right upper", frameon=False)
    else:
        ax.text(0.5, 0.5, _(N_("no run reported a loss")), ha="center", va="center", transform=ax.transAxes)
    return _svg(fig)


def render_step_time_figure(step_times: pd.DataFrame, *, runs: list[str], gettext: Gettext = _identity) -> bytes:
    """Box plot + strip of per-step times per run. step_times: columns run, step,
    step_time_s (max over ranks, measured steps). runs: order of the boxes. -> SVG bytes."""
    _ = gettext
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    by_run = {r: g["step_time_s"].to_numpy() for r, g in step_times.groupby("run", sort=False)}  # one pass
    present = [r for r in runs if r in by_run]
    data = [by_run[r] for r in present]
    if data:
        ax.boxplot(data, tick_labels=present, showfliers=False, widths=0.5)
        if _labels_collide(present, width_in=6.0):
            # slanted, anchored at their right end under their box: long run names never overlap
            ax.tick_params(axis="x", labelsize=7)
            plt.setp(ax.get_xticklabels(), rotation=35, ha="right", rotation_mode="anchor")
        # one scatter of every run's points (one per run re-scaled the axes over all earlier ones: quadratic)
        xs = [i + (j % 7 - 3) * 0.03 for i, values in enumerate(data, start=1) for j in range(len(values))]
        ax.scatter(xs, np.concatenate(data), s=6, alpha=0.5, color="tab:blue")  # deterministic jitter
    else:
        ax.text(0.5, 0.5, _(N_("no measured steps")), ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel(_(N_("step time (s)")))
    ax.grid(alpha=0.3, axis="y")
    return _svg(fig)


def write_figures(loss_curve: pd.DataFrame, step_times: pd.DataFrame, *, runs: list[str], out_dir: Path,
                  loss_floor_nats: float | None = None, loss_band: pd.DataFrame | None = None,
                  gettext: Gettext = _identity) -> dict[str, Path]:
    """Write loss.svg and step_time.svg into out_dir (render_loss_figure, render_step_time_figure:
    the runs of the tables given); returns {"loss": path, "step_time": path}."""
    return {
        "loss": write_bytes_atomic(out_dir / "loss.svg", render_loss_figure(
            loss_curve, loss_floor_nats=loss_floor_nats, band=loss_band, gettext=gettext)),
        "step_time": write_bytes_atomic(out_dir / "step_time.svg", render_step_time_figure(
            step_times, runs=runs, gettext=gettext)),
    }


def render_breakdown_figure(summary: pd.DataFrame, *, gettext: Gettext = _identity) -> bytes:
    """Stacked horizontal bar per run: mean step interval split into BREAKDOWN_CATEGORIES.
    summary: report.evidence.summarize_breakdown (columns run, <category>_s). -> SVG bytes."""
    _ = gettext
    fig, ax = plt.subplots(figsize=(6.0, 1.1 + 0.45 * max(1, len(summary))), layout="constrained")
    runs = list(summary["run"])[::-1]
    left = [0.0] * len(runs)
    rows = summary.set_index("run").loc[runs] if runs else summary
    for c in BREAKDOWN_CATEGORIES:
        widths = [float(v) * 1e3 for v in rows[f"{c}_s"]] if runs else []
        ax.barh(runs, widths, left=left, color=CATEGORY_COLORS[c], label=_(CATEGORY_LABELS[c]), height=0.6)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel(_(N_("mean step time on the profiled steps (ms)")))
    ax.grid(alpha=0.3, axis="x")
    # below the axis label, outside the axes: constrained layout makes room (never over the label)
    fig.legend(fontsize=7, ncol=3, loc="outside lower center", frameon=False)
    return _svg(fig)


MIN_SPAN_FRACTION = 0.002  # of the step's length: narrower spans are left out of the timeline figure
# the timeline's height in inches at most: at the note's 12.5 cm width this is about 11 cm on the page,
# so the figure and its caption fit on one landscape A4 page; more rows get thinner lanes instead
MAX_TIMELINE_HEIGHT_IN = 5.6


def render_timeline_figure(spans: pd.DataFrame, *, runs: list[str], gettext: Gettext = _identity) -> bytes:
    """One representative step per run, ranks as rows: merged busy spans per category.
    spans: TimelineSpanRow columns (run, rank, step, category, start_s, end_s). -> SVG bytes."""
    _ = gettext
    present = [r for r in runs if (spans["run"] == r).any()]
    rows_per_run = [max(1, int(spans.loc[spans["run"] == r, "rank"].nunique())) for r in present]
    num_rows = sum(rows_per_run)
    height_in = min(0.9 + 0.32 * max(1, num_rows) + 0.45 * len(present), MAX_TIMELINE_HEIGHT_IN)
    # each run's panel as tall as its ranks need (a 4-rank run twice a 2-rank one), and the rank
    # labels no taller than a lane, so they never overprint when many rows share the height
    row_pt = (height_in - 0.9 - 0.45 * len(present)) * 72 / max(1, num_rows)
    label_pt = max(4.0, min(9.0, 0.75 * row_pt))
    fig, axes = plt.subplots(len(present) or 1, 1, figsize=(6.0, height_in), squeeze=False, sharex=True,
                             layout="constrained", height_ratios=rows_per_run or None)
    for ax, run in zip(axes[:, 0], present):
        df = spans[spans["run"] == run]
        # spans narrower than MIN_SPAN_FRACTION of the step are not drawn: thousands of
        # sub-pixel gaps between kernels would otherwise paint the bar in their colour
        length = float(df["end_s"].max() - df["start_s"].min()) if not df.empty else 0.0
        df = df[(df["end_s"] - df["start_s"]) >= MIN_SPAN_FRACTION * length]
        ranks = sorted(df["rank"].unique())
        for y, rank in enumerate(ranks):
            r = df[df["rank"] == rank]
            for cat, c in r.groupby("category"):
                lane = (y - 0.3, 0.6) if cat != "hidden_comm" else (y - 0.3, 0.15)
                ax.broken_barh(list(zip(c["start_s"] * 1e3, (c["end_s"] - c["start_s"]) * 1e3)), lane,
                               facecolors=CATEGORY_COLORS.get(cat, "black"))
        step = int(df["step"].iloc[0])
        ax.set_yticks(range(len(ranks)), [_(N_("rank %(rank)s")) % {"rank": k} for k in ranks], fontsize=label_pt)
        ax.set_ylim(-0.5, len(ranks) - 0.5)
        ax.set_title(_(N_("%(run)s (step %(step)s)")) % {"run": run, "step": step}, fontsize=8, loc="left")
        ax.grid(alpha=0.3, axis="x")
    axes[-1, 0].set_xlabel(_(N_("ms from the step's start")))
    handles = [plt.Rectangle((0, 0), 1, 1, color=CATEGORY_COLORS[c]) for c in CATEGORY_COLORS]
    fig.legend(handles, [_(CATEGORY_LABELS[c]) for c in CATEGORY_COLORS], fontsize=7, ncol=3,
               loc="outside lower center", frameon=False)
    if not present:
        axes[0, 0].text(0.5, 0.5, _(N_("no profiler timeline")), ha="center", va="center", transform=axes[0, 0].transAxes)
    return _svg(fig)

# runs drawn, the first of ``runs`` (the caller puts the flagged ones first): past these a
# campaign of thousands of runs took minutes per figure (a panel or legend entry each) and no
# reader could tell its lines apart
MAX_HEALTH_FIGURE_RUNS = 20
MAX_RANK_STEP_TIME_PANELS = 8


def render_health_figure(curves: pd.DataFrame, *, runs: list[str], gettext: Gettext = _identity) -> bytes:
    """Loss (top) and gradient norm (bottom, log scale) vs step, one line per run; flagged loss
    spikes and gradient explosions as red markers, non-finite values as red ticks on the top edge.
    curves: report.health.compute_flagged_curves columns (run, step, loss, loss_non_finite, spike,
    grad_norm, grad_norm_non_finite, explosion). runs: line order; the first MAX_HEALTH_FIGURE_RUNS
    in ``curves`` are drawn. -> SVG bytes."""
    _ = gettext
    fig, (ax_loss, ax_grad) = plt.subplots(2, 1, figsize=(6.0, 4.6), sharex=True, layout="constrained")
    by_run = dict(tuple(curves.groupby("run", sort=False)))  # one pass, not one scan per run
    present = [r for r in runs if r in by_run][:MAX_HEALTH_FIGURE_RUNS]
    flagged_label = {"loss": _(N_("loss spike (flagged)")), "grad": _(N_("gradient explosion (flagged)"))}
    for run in present:
        df = by_run[run]
        line, = ax_loss.plot(df["step"], df["loss"], label=str(run), linewidth=1.1)
        ax_grad.plot(df["step"], df["grad_norm"], linewidth=1.1, color=line.get_color())
        for ax, flag, value, non_finite, key in ((ax_loss, "spike", "loss", "loss_non_finite", "loss"),
                                                 (ax_grad, "explosion", "grad_norm", "grad_norm_non_finite", "grad")):
            hit = df[df[flag].astype(bool) & df[value].notna()]
            if not hit.empty:
                ax.scatter(hit["step"], hit[value], s=22, facecolors="none", edgecolors="tab:red", linewidths=1.2,
                           zorder=3, label=flagged_label.pop(key, None))
            bad = df[df[non_finite].astype(bool)]
            if not bad.empty:  # a value off the scale: a tick on the top edge
                ax.scatter(bad["step"], [1.0] * len(bad), marker="|", s=60, color="tab:red",
                           transform=ax.get_xaxis_transform(), clip_on=False, zorder=3)
    ax_loss.set_ylabel(_(N_("loss (nats)")))
    ax_grad.set_ylabel(_(N_("gradient norm")))
    ax_grad.set_xlabel(_(N_("step")))
    if curves["grad_norm"].notna().any():
        ax_grad.set_yscale("log")
    else:
        ax_grad.text(0.5, 0.5, _(N_("gradient norm not recorded")), ha="center", va="center",
                     transform=ax_grad.transAxes)
    for ax in (ax_loss, ax_grad):
        ax.grid(alpha=0.3)
    if present:
        fig.legend(fontsize=7, loc="outside right upper", frameon=False)
    else:
        ax_loss.text(0.5, 0.5, _(N_("no run reported a loss")), ha="center", va="center", transform=ax_loss.transAxes)
    return _svg(fig)


def render_rank_step_time_figure(rank_times: pd.DataFrame, *, runs: list[str], gettext: Gettext = _identity) -> bytes:
    """Per-rank step time vs step, one panel per run, one line per rank.
    rank_times: report.health.compute_rank_step_times columns (run, rank, step, step_time_s; the
    measured steps). runs: panel order; the first MAX_RANK_STEP_TIME_PANELS with steps are drawn.
    -> SVG bytes."""
    _ = gettext
    by_run = dict(tuple(rank_times.groupby("run", sort=False)))
    present = [r for r in runs if r in by_run][:MAX_RANK_STEP_TIME_PANELS]
    height_in = min(0.8 + 1.0 * max(1, len(present)), MAX_TIMELINE_HEIGHT_IN)  # one page with its caption
    fig, axes = plt.subplots(max(1, len(present)), 1, figsize=(6.0, height_in), squeeze=False, sharex=True,
                             layout="constrained")
    for ax, run in zip(axes[:, 0], present):
        df = by_run[run]
        steps = range(int(df["step"].min()), int(df["step"].max()) + 1)
        if len(steps) > 4 * len(df) + 100:  # sparse step numbers (a forged 1e9): the steps there are, no gaps
            steps = sorted(df["step"].unique())
        for rank, g in df.groupby("rank"):
            # every step on the axis: a left-out (profiled) step is a gap in the line, not a slope across it
            ms = g.set_index("step")["step_time_s"].reindex(steps) * 1e3
            ax.plot(ms.index, ms.to_numpy(), linewidth=0.9, label=_(N_("rank %(rank)s")) % {"rank": rank})
        ax.set_title(str(run), fontsize=8, loc="left")
        ax.grid(alpha=0.3)
        # a short panel (eight runs share the page's height) holds three y labels without overprinting
        ax.locator_params(axis="y", nbins=3)
        ax.tick_params(axis="y", labelsize=7)
        if df["rank"].nunique() > 1:
            ax.legend(fontsize=6, loc="upper right", frameon=False, ncol=min(4, int(df["rank"].nunique())))
    axes[-1, 0].set_xlabel(_(N_("step")))
    fig.supylabel(_(N_("step time (ms)")), fontsize=9)
    if not present:
        axes[0, 0].text(0.5, 0.5, _(N_("no measured steps")), ha="center", va="center", transform=axes[0, 0].transAxes)
    return _svg(fig)
