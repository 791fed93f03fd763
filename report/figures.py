"""SVG figures for the note's evidence section (matplotlib, Agg backend).

Inputs are tables already computed by report.metrics; this module only plots them. Files
are written through ingest.io (atomic). Deliberately not here: any statistic, any profiler
timeline (not captured yet).
"""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ingest.io import write_bytes_atomic  # noqa: E402

plt.rcParams.update({"svg.hashsalt": "report", "svg.fonttype": "none", "font.size": 9})


def _svg(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return buf.getvalue()


def render_loss_figure(loss_curve: pd.DataFrame, *, loss_floor_nats: float | None = None) -> bytes:
    """Loss vs step, one line per run. loss_curve: columns run, step, loss (nats). -> SVG bytes."""
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    for run, df in loss_curve.groupby("run", sort=False):
        ax.plot(df["step"], df["loss"], label=str(run), linewidth=1.2)
    if loss_floor_nats is not None:
        ax.axhline(loss_floor_nats, color="grey", linestyle=":", linewidth=1, label="data entropy (floor)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats)")
    ax.grid(alpha=0.3)
    if not loss_curve.empty:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no run reported a loss", ha="center", va="center", transform=ax.transAxes)
    return _svg(fig)


def render_step_time_figure(step_times: pd.DataFrame, *, runs: list[str]) -> bytes:
    """Box plot + strip of per-step times per run. step_times: columns run, step,
    step_time_s (max over ranks, measured steps). runs: order of the boxes. -> SVG bytes."""
    fig, ax = plt.subplots(figsize=(6.0, 3.2))
    present = [r for r in runs if (step_times["run"] == r).any()]
    data = [step_times.loc[step_times["run"] == r, "step_time_s"].to_numpy() for r in present]
    if data:
        ax.boxplot(data, tick_labels=present, showfliers=False, widths=0.5)
        for i, values in enumerate(data, start=1):
            offsets = [(j % 7 - 3) * 0.03 for j in range(len(values))]  # deterministic jitter
            ax.scatter([i + o for o in offsets], values, s=6, alpha=0.5, color="tab:blue")
    else:
        ax.text(0.5, 0.5, "no measured steps", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("step time (s)")
    ax.grid(alpha=0.3, axis="y")
    return _svg(fig)


def write_figures(loss_curve: pd.DataFrame, step_times: pd.DataFrame, *, runs: list[str], out_dir: Path,
                  loss_floor_nats: float | None = None) -> dict[str, Path]:
    """Write loss.svg and step_time.svg into out_dir; returns {"loss": path, "step_time": path}."""
    return {
        "loss": write_bytes_atomic(out_dir / "loss.svg", render_loss_figure(loss_curve, loss_floor_nats=loss_floor_nats)),
        "step_time": write_bytes_atomic(out_dir / "step_time.svg", render_step_time_figure(step_times, runs=runs)),
    }
