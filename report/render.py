"""Render the note (Markdown, HTML, PDF) from the one view-model.

Jinja2 with StrictUndefined (a missing field fails loudly) and autoescape for HTML. All
number formatting lives in the filters below; templates only loop and print. PDF is
WeasyPrint applied to the HTML with templates/print.css. Files are written atomically via
ingest.io. Deliberately not here: any metric computation.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup

from ingest.errors import ConfigError, NoDataError
from ingest.io import Campaign, load_campaign, load_trace_tables, write_bytes_atomic
from report import metrics
from report.summary import build_summary, render_summary_json
from report.figures import render_breakdown_figure, render_timeline_figure, write_figures
from report.view import Figure, Note, build_note

TEMPLATES_DIR = Path(__file__).resolve().parent.parent / "templates"
FORMATS = ("md", "html", "pdf")
NA = "n/a"
_PREFIXES = {-4: "p", -3: "n", -2: "µ", -1: "m", 0: "", 1: "k", 2: "M", 3: "G", 4: "T", 5: "P", 6: "E"}


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def pct(x: float | None, digits: int = 1) -> str:
    """0.4312 -> '43.1%'; None -> 'n/a'."""
    return NA if _missing(x) else f"{x * 100:.{digits}f}%"


def si(x: float | None, unit: str = "", digits: int = 3) -> str:
    """SI-prefixed, ``digits`` significant digits: 855166464, 'FLOP' -> '855 MFLOP'; None -> 'n/a'."""
    if _missing(x):
        return NA
    exp3 = 0 if x == 0 else max(min(math.floor(math.log10(abs(x)) / 3), 6), -4)
    mantissa = float(f"{x / 1000 ** exp3:.{digits}g}")
    if abs(mantissa) >= 1000 and exp3 < 6:  # rounding carried into the next prefix
        exp3, mantissa = exp3 + 1, mantissa / 1000
    return f"{mantissa:.{digits}g} {_PREFIXES[exp3]}{unit}".rstrip()


def gib(x: float | None) -> str:
    """3.5 -> '3.50 GiB'; None -> 'n/a'."""
    return NA if _missing(x) else f"{x:.2f} GiB"


def duration(seconds: float | None) -> str:
    """Seconds -> 'µs' / 'ms' / 's' / 'min s' text; None -> 'n/a'."""
    if _missing(seconds):
        return NA
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    if seconds < 120:
        return f"{seconds:.2f} s"
    return f"{int(seconds // 60)} min {seconds % 60:.0f} s"


def sci(x: float | None, digits: int = 2) -> str:
    """Plain number, scientific below 0.01: 0.000378 -> '3.8e-4', 0.0412 -> '0.041', 0 -> '0'; None -> 'n/a'."""
    if _missing(x):
        return NA
    if x == 0:
        return "0"
    if abs(x) < 0.01 or abs(x) >= 1e6:
        mantissa, exp = f"{x:.{digits - 1}e}".split("e")
        return f"{mantissa}e{int(exp)}"
    return f"{x:.{digits}g}"


def nbytes(x: float | None) -> str:
    """Bytes in binary units, three significant digits: 8.2e6 -> '7.82 MiB', 2e9 -> '1.86 GiB'; None -> 'n/a'."""
    if _missing(x):
        return NA
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def margin(m: float | None) -> str:
    """Relative tokens/s margin (ratio - 1) as the reader reads it: 0.078 -> '+7.8% tokens/s',
    2.09 -> '3.09× the tokens/s'; None -> 'n/a'."""
    if _missing(m):
        return NA
    return f"+{m * 100:.1f}% tokens/s" if m < 0.5 else f"{1 + m:.2f}× the tokens/s"


def count(n: int | None) -> str:
    """124439808 -> '124,439,808'; None -> 'n/a'."""
    return NA if _missing(n) else f"{int(n):,}"


def text(v: Any) -> str:
    """Any value as text; None -> 'n/a'."""
    return NA if _missing(v) else str(v)


def md_cell(v: Any) -> str:
    """Text safe inside a Markdown table cell (pipes escaped, newlines flattened); None -> 'n/a'."""
    return NA if _missing(v) else str(v).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


def ratio(x: float | None, digits: int = 2) -> str:
    """0.9987 -> '1.00×', 3.146 -> '3.15×'; None -> 'n/a'."""
    return NA if _missing(x) else f"{float(x):.{digits}f}×"


def kernel_name(name: Any, width: int = 60) -> str:
    """A CUDA kernel's name without return type, template arguments and parameter list
    ('void at::native::elementwise_kernel<128, 4, ...>(int, ...)' ->
    'at::native::elementwise_kernel'), cut to ``width`` characters (HTA shorten_name does
    the same for its tables)."""
    if _missing(name):
        return NA
    s = str(name)
    if s.startswith("void "):
        s = s[5:]
    out, depth = [], 0
    for ch in s:
        if ch in "<(":
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    short = "".join(out).replace("::::", "::").strip() or s
    return short if len(short) <= width else short[: width - 1] + "…"


def metric_value(x: float | None, unit: str) -> str:
    """A report.diff metric in its unit: tokens_per_s -> si, fraction/share -> pct, s -> duration,
    gib -> gib; None -> 'n/a'."""
    if unit == "tokens_per_s":
        return si(x)
    if unit in ("fraction", "share"):
        return pct(x)
    return duration(x) if unit == "s" else gib(x) if unit == "gib" else text(x)


def metric_delta(x: float | None, unit: str) -> str:
    """A signed change in the metric's unit: -84000 tokens/s -> '−84 k', +0.012 share -> '+1.2 pp',
    +0.05 s -> '+50.0 ms'; None -> 'n/a'."""
    if _missing(x):
        return NA
    sign = "+" if x >= 0 else "−"
    if unit in ("fraction", "share"):
        return f"{sign}{abs(x) * 100:.1f} pp"
    return sign + metric_value(abs(x), unit)


def signed_pct(x: float | None, digits: int = 1) -> str:
    """0.0523 -> '+5.2%', -0.1667 -> '−16.7%'; None -> 'n/a'."""
    return NA if _missing(x) else ("+" if x >= 0 else "−") + pct(abs(x), digits)


FILTERS = {"metric_value": metric_value, "metric_delta": metric_delta, "signed_pct": signed_pct,
           "pct": pct, "kernel_name": kernel_name, "ratio": ratio, "si": si, "gib": gib, "duration": duration, "count": count, "text": text, "md_cell": md_cell,
           "sci": sci, "nbytes": nbytes, "margin": margin}


def build_environment(*, html: bool) -> jinja2.Environment:
    """Jinja environment over templates/ with StrictUndefined, the filters, autoescape iff html."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR), undefined=jinja2.StrictUndefined,
                             autoescape=html, keep_trailing_newline=True)
    env.filters.update(FILTERS)
    return env


def render_markdown(note: Note) -> str:
    return build_environment(html=False).get_template("note.md.j2").render(note=note)


def render_html(note: Note) -> str:
    env = build_environment(html=True)
    css = env.loader.get_source(env, "print.css")[0]
    return env.get_template("note.html.j2").render(note=note, css=Markup(css))


def render_pdf(html: str, *, base_url: Path) -> bytes:
    """HTML -> PDF bytes with WeasyPrint; relative figure paths resolve against base_url.
    Raises ConfigError when WeasyPrint or its system libraries are missing."""
    try:
        import weasyprint
    except (ImportError, OSError) as e:
        raise ConfigError(f"PDF output needs WeasyPrint and its system libraries ({e}); use --format md,html") from None
    return weasyprint.HTML(string=html, base_url=str(base_url)).write_pdf()


def build_figures(campaign: Campaign, out_dir: Path, *, loss_floor_nats: float) -> tuple[Figure, ...]:
    """Compute the figure tables (report.metrics), plot them into out_dir/figures."""
    warmup = campaign.campaign["fixed"]["warmup_steps"]
    paths = write_figures(metrics.compute_loss_curve(campaign.steps),
                          metrics.compute_step_times(campaign.steps, warmup_steps=warmup),
                          runs=list(campaign.runs["run"]), out_dir=out_dir / "figures", loss_floor_nats=loss_floor_nats)
    return (
        Figure(title="Loss vs step", path=paths["loss"].relative_to(out_dir).as_posix(),
               caption="Mean over the ranks that compute the loss; dotted: the data's entropy, the expected loss floor "
                       "(a model can dip below it on a finite batch). Layouts trained on the same tokens should "
                       "overlap."),
        Figure(title="Step-time distribution", path=paths["step_time"].relative_to(out_dir).as_posix(),
               caption=f"Per measured step (after {warmup} warm-up steps), the slowest rank's step time; "
                       "box: quartiles and median, whiskers 1.5 IQR, dots: individual steps."),
    )


def build_evidence_figures(note: Note, trace_tables, out_dir: Path) -> tuple[Figure, ...]:
    """Section 5's stacked bar (one bar per traced run) and one-step timeline (ranks as rows)."""
    if trace_tables is None or not note.evidence.rows:
        return ()
    summary = pd.DataFrame([dataclasses.asdict(b) for b in note.evidence.rows])
    runs = [b.run for b in note.evidence.rows]
    bar = write_bytes_atomic(out_dir / "figures" / "breakdown.svg", render_breakdown_figure(summary))
    timeline = write_bytes_atomic(out_dir / "figures" / "timeline.svg",
                                  render_timeline_figure(trace_tables.spans, runs=runs))
    return (
        Figure(title="Where the step time goes", path=bar.relative_to(out_dir).as_posix(),
               caption="Mean over the traced steps and ranks of each run: compute, exposed communication, pipeline "
                       "bubble, data stall and other partition the step's interval on its timeline (GPU kernels, or "
                       "the training thread's host ops on CPU runs)."),
        Figure(title="One traced step per run", path=timeline.relative_to(out_dir).as_posix(),
               caption="The median-length traced step of each rank, merged busy spans per category (thin pink lane: "
                       "communication hidden under compute); spans shorter than 0.2% of the step are not drawn, so "
                       "read the shares from the table, not from the picture."),
    )


def load_any(source: str | Path) -> Campaign:
    """A campaign or tables dir (ingest.io), or a folder of third-party logs (ingest.thirdparty)."""
    from ingest.thirdparty import is_thirdparty_folder, load_thirdparty_campaign

    return load_thirdparty_campaign(source) if is_thirdparty_folder(source) else load_campaign(source)


def load_note(source: str | Path) -> tuple[Campaign, Any, Note]:
    """Load a campaign dir, tables dir or third-party folder and build its view-model (no
    figures). Returns (campaign, trace tables or None, note). Raises ToolError subclasses."""
    campaign = load_any(source)
    if "fixed" not in campaign.campaign:
        raise ConfigError(f"{source}: campaign.json has no 'fixed' section; regenerate it with `runner all`")
    trace_tables = load_trace_tables(campaign)
    return campaign, trace_tables, build_note(campaign, trace_tables=trace_tables)


def _check_formats(formats: Sequence[str]) -> None:
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ConfigError(f"unknown --format {','.join(bad) or '(empty)'}; choose from {','.join(FORMATS)}")


def build_report(source: str | Path, *, out_dir: str | Path | None = None,
                 formats: Sequence[str] = FORMATS) -> list[Path]:
    """Load a campaign or tables dir, write summary.json and note.<fmt> (+ figures/) into
    out_dir (default SOURCE/report). Returns written paths. Raises ToolError subclasses."""
    _check_formats(formats)
    campaign, trace_tables, note = load_note(source)
    out = Path(out_dir) if out_dir else Path(source) / "report"
    figures = build_figures(campaign, out, loss_floor_nats=note.model.loss_floor_nats)
    figures += build_evidence_figures(note, trace_tables, out)
    note = dataclasses.replace(note, figures=figures)
    written = [write_bytes_atomic(out / "summary.json", render_summary_json(build_summary(note)))]
    if "md" in formats:
        written.append(write_bytes_atomic(out / "note.md", render_markdown(note).encode()))
    if "html" in formats or "pdf" in formats:
        html = render_html(note)
        if "html" in formats:
            written.append(write_bytes_atomic(out / "note.html", html.encode()))
        if "pdf" in formats:
            written.append(write_bytes_atomic(out / "note.pdf", render_pdf(html, base_url=out)))
    return written


def build_diff_report(old_source: str | Path, new_source: str | Path, *, out_dir: str | Path | None = None,
                      threshold: float = 0.05, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Compare two campaigns (each a campaign dir, tables dir or third-party folder): write
    diff.json (report.diff's records) and diff.<fmt> into out_dir (default NEW/report-diff).
    threshold: relative change beyond which a worse move is flagged. Returns written paths.
    Raises ToolError subclasses."""
    from report.diff import build_diff

    _check_formats(formats)
    if not (threshold >= 0):
        raise ConfigError(f"--threshold {threshold}: must be a relative change >= 0 (0.05 = 5%)")
    for source in (old_source, new_source):
        if not Path(source).is_dir():
            raise NoDataError(f"{source}: not a directory; give a campaign dir (`runner all`), a tables dir "
                              "(`ingest`) or a folder of third-party logs")
    summaries = [build_summary(load_note(source)[2]) for source in (old_source, new_source)]
    diff = build_diff(*summaries, threshold=threshold, old_source=str(old_source), new_source=str(new_source))
    out = Path(out_dir) if out_dir else Path(new_source) / "report-diff"
    written = [write_bytes_atomic(out / "diff.json", render_summary_json(dataclasses.asdict(diff)))]
    if "md" in formats:
        written.append(write_bytes_atomic(
            out / "diff.md", build_environment(html=False).get_template("diff.md.j2").render(diff=diff).encode()))
    if "html" in formats or "pdf" in formats:
        env = build_environment(html=True)
        html = env.get_template("diff.html.j2").render(diff=diff, css=Markup(env.loader.get_source(env, "print.css")[0]))
        if "html" in formats:
            written.append(write_bytes_atomic(out / "diff.html", html.encode()))
        if "pdf" in formats:
            written.append(write_bytes_atomic(out / "diff.pdf", render_pdf(html, base_url=out)))
    return written
