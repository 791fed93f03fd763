"""Render the note (Markdown, HTML, PDF) from the one view-model.

Jinja2 with StrictUndefined (a missing field fails loudly) and autoescape for HTML. All
number formatting lives in the filters below, in the note's language (report.i18n: Python
rounds, Babel writes the locale's symbols); the fixed text is gettext messages; templates only
loop and print. PDF is WeasyPrint applied to the HTML with report/templates/print.css. Files are
written atomically via ingest.io. Deliberately not here: any metric computation.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import math
from collections.abc import Callable, Sequence
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jinja2
import pandas as pd
from markupsafe import Markup

from core.records import ATTRIBUTION_CATEGORIES
from core.errors import ConfigError, NoDataError
from ingest.io import Campaign, load_campaign, load_trace_tables
from core.atomic import check_staged_folder, staged_folder, write_bytes_atomic
from core.formulas import compute_step_times
from report import FORMATS, metrics
from report.i18n import (DEFAULT_LANGUAGE, N_, Language, Message, MessageList, load_language, translate,
                         translate_recorded)
from report.summary import build_campaign_summary, build_summary, render_summary_json
from report.figures import (MAX_HEALTH_FIGURE_RUNS, MAX_RANK_STEP_TIME_PANELS, render_breakdown_figure,
                            render_health_figure, render_rank_step_time_figure, render_timeline_figure, write_figures)
from report.health import compute_flagged_curves, compute_rank_step_times
from report.view import Figure, Note, build_note

if TYPE_CHECKING:
    from report.triage import FileRow, TraceJob, TriageSection

TEMPLATES_DIR = Path(files("report") / "templates")  # package data (pyproject.toml), found through the package
NA = N_("n/a")
_PREFIXES = {-4: "p", -3: "n", -2: "µ", -1: "m", 0: "", 1: "k", 2: "M", 3: "G", 4: "T", 5: "P", 6: "E"}


def _missing(x: Any) -> bool:
    """None, NaN or +-inf: printed 'n/a' by every filter (a diverged loss of inf has no digits)."""
    return x is None or (isinstance(x, float) and not math.isfinite(x))


EN = load_language(DEFAULT_LANGUAGE)


def _na(lang: Language) -> str:
    return lang.gettext(NA)


def pct(x: float | None, digits: int = 1, *, lang: Language = EN) -> str:
    """0.4312 -> '43.1%'; None -> 'n/a'."""
    return _na(lang) if _missing(x) else lang.percent(x, digits)


def si(x: float | None, unit: str = "", digits: int = 3, *, lang: Language = EN) -> str:
    """SI-prefixed, ``digits`` significant digits: 855166464, 'FLOP' -> '855 MFLOP'; None -> 'n/a'."""
    if _missing(x):
        return _na(lang)
    if x != 0 and not 1e-12 <= abs(x) < 1e21:  # past the prefixes (p..E): '1.00e308', never '1e+290 E'
        return sci(x, digits, lang=lang) + (f" {unit}" if unit else "")
    exp3 = 0 if x == 0 else max(min(math.floor(math.log10(abs(x)) / 3), 6), -4)
    mantissa = float(f"{x / 1000 ** exp3:.{digits}g}")
    if abs(mantissa) >= 1000 and exp3 < 6:  # rounding carried into the next prefix
        exp3, mantissa = exp3 + 1, mantissa / 1000
    return f"{lang.number(f'{mantissa:.{digits}g}')} {_PREFIXES[exp3]}{unit}".rstrip()


def gib(x: float | None, *, lang: Language = EN) -> str:
    """3.5 -> '3.50 GiB'; None -> 'n/a'."""
    return _na(lang) if _missing(x) else f"{lang.number(f'{x:.2f}')} GiB"


def duration(seconds: float | None, *, lang: Language = EN) -> str:
    """Seconds -> 'µs' / 'ms' / 's' / 'min s' text; None -> 'n/a'. A negative duration (a
    difference) is its magnitude's text after a minus sign: -0.047 -> '−47.0 ms'."""
    if _missing(seconds):
        return _na(lang)
    if seconds < 0:
        return "−" + duration(-seconds, lang=lang)
    if seconds < 1e-3:
        return f"{lang.number(f'{seconds * 1e6:.0f}')} µs"
    if seconds < 1:
        return f"{lang.number(f'{seconds * 1e3:.1f}')} ms"
    if seconds < 120:
        return f"{lang.number(f'{seconds:.2f}')} s"
    return lang.gettext(N_("%(min)s min %(s)s s")) % {"min": int(seconds // 60), "s": lang.number(f"{seconds % 60:.0f}")}


def sci(x: float | None, digits: int = 2, *, lang: Language = EN) -> str:
    """Plain number, scientific below 0.01: 0.000378 -> '3.8e-4', 0.0412 -> '0.041', 0 -> '0'; None -> 'n/a'."""
    if _missing(x):
        return _na(lang)
    if x == 0:
        return "0"
    if abs(x) < 0.01 or abs(x) >= 1e6:
        mantissa, exp = f"{x:.{digits - 1}e}".split("e")
        return f"{lang.number(mantissa)}e{int(exp)}"
    return lang.number(f"{x:.{digits}g}")


def nbytes(x: float | None, *, lang: Language = EN) -> str:
    """Bytes in binary units, three significant digits: 8.2e6 -> '7.82 MiB', 2e9 -> '1.86 GiB'; None -> 'n/a'."""
    if _missing(x):
        return _na(lang)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= scale:
            return f"{lang.number(f'{x / scale:.3g}')} {unit}"
    return f"{lang.number(f'{x:.0f}')} B"


def margin(m: float | None, *, lang: Language = EN) -> str:
    """Relative tokens/s margin (ratio - 1) as the reader reads it: 0.078 -> '+7.8% tokens/s',
    2.09 -> '3.09× the tokens/s'; None -> 'n/a'."""
    if _missing(m):
        return _na(lang)
    if m < 0.5:
        return lang.gettext(N_("+%(pct)s tokens/s")) % {"pct": lang.percent(m, 1)}
    return lang.gettext(N_("%(ratio)s the tokens/s")) % {"ratio": ratio(1 + m, lang=lang)}


def count(n: int | None, *, lang: Language = EN) -> str:
    """124439808 -> '124,439,808'; None -> 'n/a'."""
    return _na(lang) if _missing(n) else lang.number(f"{int(n):,}")


def text(v: Any, *, lang: Language = EN) -> str:
    """Any value as text (a report.i18n.Message in ``lang``); None -> 'n/a'."""
    return _na(lang) if _missing(v) else str(translate(v, lang))


def md_cell(v: Any, *, lang: Language = EN) -> str:
    """A value (a Message in ``lang``) as inert Markdown text, safe inside a table cell or a
    sentence: escape_md; None -> 'n/a'."""
    return _na(lang) if _missing(v) else escape_md(str(translate(v, lang)))


def recorded(v: Any, *, lang: Language = EN) -> str:
    """Text recorded in a file (a parser's warning, a status cause) in ``lang`` where the catalog
    worded it (report.i18n.translate_recorded), else as recorded; None -> 'n/a'. Plain text."""
    return _na(lang) if _missing(v) else str(translate_recorded(v, lang))


def ratio(x: float | None, digits: int = 2, *, lang: Language = EN) -> str:
    """0.9987 -> '1.00×', 3.146 -> '3.15×'; None -> 'n/a'."""
    return _na(lang) if _missing(x) else f"{lang.number(f'{float(x):.{digits}f}')}×"


def num(x: float | None, digits: int = 2, *, lang: Language = EN) -> str:
    """Fixed-point number in the language's symbols: 1.75 -> '1.75', (2, 0) -> '2'; None -> 'n/a'."""
    return _na(lang) if _missing(x) else lang.number(f"{float(x):.{digits}f}")


def date(iso: str | None, *, lang: Language = EN) -> str:
    """'2026-11-29T12:45:30+00:00' -> 'November 29, 2026 12:45 UTC' (the language's long date); None -> 'n/a'."""
    return _na(lang) if _missing(iso) else lang.date(str(iso))


def kernel_name(name: Any, width: int = 60, *, lang: Language = EN) -> str:
    """A CUDA kernel's name without return type, template arguments and parameter list
    ('void at::native::elementwise_kernel<128, 4, ...>(int, ...)' ->
    'at::native::elementwise_kernel'), cut to ``width`` characters (HTA shorten_name does
    the same for its tables)."""
    if _missing(name):
        return _na(lang)
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


def metric_value(x: float | None, unit: str, *, lang: Language = EN) -> str:
    """A report.diff metric in its unit: tokens_per_s -> si, fraction/share -> pct, s -> duration,
    gib -> gib; None -> 'n/a'."""
    if unit == "tokens_per_s":
        return si(x, lang=lang)
    if unit in ("fraction", "share"):
        return pct(x, lang=lang)
    return duration(x, lang=lang) if unit == "s" else gib(x, lang=lang) if unit == "gib" else text(x, lang=lang)


def metric_delta(x: float | None, unit: str, *, lang: Language = EN) -> str:
    """A signed change in the metric's unit: -84000 tokens/s -> '−84 k', +0.012 share -> '+1.2 pp',
    +0.05 s -> '+50.0 ms'; None -> 'n/a'."""
    if _missing(x):
        return _na(lang)
    sign = "+" if x >= 0 else "−"
    if unit in ("fraction", "share"):
        return f"{sign}{lang.number(f'{abs(x) * 100:.1f}')} pp"
    return sign + metric_value(abs(x), unit, lang=lang)


def signed_pct(x: float | None, digits: int = 1, *, lang: Language = EN) -> str:
    """0.0523 -> '+5.2%', -0.1667 -> '−16.7%'; None -> 'n/a'."""
    return _na(lang) if _missing(x) else ("+" if x >= 0 else "−") + pct(abs(x), digits, lang=lang)


FILTERS = {"metric_value": metric_value, "metric_delta": metric_delta, "signed_pct": signed_pct,
           "pct": pct, "kernel_name": kernel_name, "ratio": ratio, "si": si, "gib": gib, "duration": duration,
           "count": count, "text": text, "md_cell": md_cell, "sci": sci, "nbytes": nbytes, "margin": margin,
           "date": date, "num": num, "basename": lambda p, *, lang=EN: Path(str(p)).name}


# Markdown's inline punctuation: emphasis, code, link and image brackets, tables, strikes; a "#"
# (heading) or ">" (quote) where the text starts a line, a "!" before "[" (an image). "(x)", a_b,
# "#1580" and "->" inside a line stay as they are: without "[" no "(" opens a link
_MD_SPECIAL = re.compile(r"([\\`*\[\]|~]|^[#>]|!(?=\[)|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9]))")


def escape_md(s: str) -> str:
    """Text from a file (a campaign, host or GPU name, a command, a cause, a log line) as inert
    Markdown, the one escape every recorded string printed in a .md goes through: one line
    (whitespace runs, newlines included, made one space: no heading, list, block or table row),
    Markdown punctuation backslash-escaped (no emphasis, image, link, heading or code span:
    ``![x](u)`` is no image), ``&<>`` as entities where a ``<`` could open raw HTML or a
    ``<url>`` autolink (escape_md_html), and ``://`` / ``www.`` broken so viewers do not
    autolink a bare URL."""
    s = escape_md_html(" ".join(s.split()))
    return _MD_SPECIAL.sub(r"\\\1", s).replace("://", ":\\/\\/").replace("www.", "www\\.")


def md_untrusted(v: Any, *, lang: Language = EN) -> str:
    """Text recorded in a file (a status.json ``cause``, a log line) in ``lang`` where the
    catalog worded it (report.i18n.translate_recorded), as inert Markdown: escape_md. None -> 'n/a'."""
    return _na(lang) if _missing(v) else escape_md(str(translate_recorded(v, lang)))


_BACKTICK_RUN = re.compile(r"`+")


def md_code(v: Any) -> str:
    """A Markdown code span of ``v`` (shown literally): on one line (a newline would end the
    paragraph and let the rest be read as Markdown), fenced by one backtick more than the
    longest backtick run inside it, so no text can close the span early (CommonMark 6.1)."""
    s = " ".join(str(v).split())
    if not s:
        return ""
    fence = "`" * (max((len(m) for m in _BACKTICK_RUN.findall(s)), default=0) + 1)
    pad = " " if s[0] == "`" or s[-1] == "`" else ""  # "`` `x` ``": a space keeps the fence apart from the text
    return f"{fence}{pad}{s}{pad}{fence}"


def md_fence(v: Any) -> str:
    """The fence of a Markdown code block holding ``v`` verbatim: three backticks, or one more
    than the longest backtick run in ``v``, so no line of ``v`` closes the block (CommonMark 4.5)."""
    return "`" * max(3, max((len(m) for m in _BACKTICK_RUN.findall(str(v))), default=0) + 1)


def _markup(html: bool) -> dict[str, Any]:
    """Inline markup the wording macros use, so one macro serves Markdown and HTML:
    strong(x) and code(x), x escaped in HTML."""
    if html:
        return {"strong": lambda s: Markup("<b>%s</b>") % s, "code": lambda s: Markup("<code>%s</code>") % s}
    return {"strong": lambda s: f"**{s}**", "code": md_code}


_MD_HTML_START = re.compile(r"<(?=[A-Za-z/!?])")  # where CommonMark starts raw HTML (a tag, comment, PI)


def escape_md_html(value: Any) -> Any:
    """Markdown output: a printed value that could open raw HTML (``<script>``, ``<img
    onerror=...>`` from a log or a crash cause) gets ``&``, ``<`` and ``>`` escaped as entities,
    so viewers that render HTML in Markdown show it as text. Other values pass unchanged
    (``< 1 ms`` stays readable)."""
    if isinstance(value, str) and _MD_HTML_START.search(value):
        return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return value


class _MemoryBytecodeCache(jinja2.BytecodeCache):
    """Compiled templates kept for the process: a process that renders many notes (report diff,
    the tests, the fuzz benchmark) compiles each template once, not once per note. Jinja keys a
    bucket by template name and source checksum, so an edited template is compiled again."""

    def __init__(self) -> None:
        self._code: dict[str, bytes] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        if bucket.key in self._code:
            bucket.bytecode_from_string(self._code[bucket.key])

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self._code[bucket.key] = bucket.bytecode_to_string()


_BYTECODE_CACHES = {True: _MemoryBytecodeCache(), False: _MemoryBytecodeCache()}  # by html


def build_environment(*, html: bool, lang: Language | str = DEFAULT_LANGUAGE) -> jinja2.Environment:
    """Jinja environment over report/templates/ with StrictUndefined, autoescape iff html, the
    filters formatting numbers for ``lang``, and gettext (``_``, ``ngettext``, ``pgettext``,
    new style: ``_("%(n)s runs", n=x)``; ``_(value)`` of a report.i18n.Message prints it
    translated) from its catalog. Globals: ``strong``, ``code``,
    ``lang`` (the Language), ``categories`` (ATTRIBUTION_CATEGORIES, section 5's order). Raises ConfigError for an unknown language."""
    lang = load_language(lang) if isinstance(lang, str) else lang
    missing = lang.translations.gettext(NA)

    def finalize(value: Any) -> Any:  # a value the source did not give prints as "n/a", never "None"
        return missing if value is None else value if html else escape_md_html(value)

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES_DIR), undefined=jinja2.StrictUndefined,
                             autoescape=html, keep_trailing_newline=True, extensions=["jinja2.ext.i18n"],
                             bytecode_cache=_BYTECODE_CACHES[html], finalize=finalize)
    env.install_gettext_translations(lang.translations, newstyle=True)
    newstyle = env.globals["gettext"]

    @jinja2.pass_context
    def gettext(context: Any, message: Any, /, **variables: Any) -> str:
        """Newstyle gettext; a report.i18n.Message from Python (``_(value)``) prints translated
        with its own parameters; a parameter that is None prints as "n/a"."""
        escape = Markup if context.eval_ctx.autoescape else None
        if isinstance(message, (Message, MessageList)) and not variables:
            return translate(message, lang, escape=escape)
        return newstyle(context, message, **{k: missing if v is None else translate(v, lang, escape=escape)
                                             for k, v in variables.items()})

    env.globals.update(gettext=gettext, _=gettext)
    env.filters.update({name: functools.partial(fn, lang=lang) for name, fn in FILTERS.items()})
    env.globals.update(_markup(html), lang=lang, categories=ATTRIBUTION_CATEGORIES, fence=md_fence)
    # text from status files: inert Markdown in .md; in HTML plain text, which autoescape makes inert; in
    # the note's language where it is a catalog message
    env.filters["untrusted"] = functools.partial(recorded if html else md_untrusted, lang=lang)
    env.filters["recorded"] = functools.partial(recorded, lang=lang)
    return env


def render_markdown(note: Note, *, lang: Language | str = DEFAULT_LANGUAGE) -> str:
    return build_environment(html=False, lang=lang).get_template("note.md.j2").render(note=note)


def render_html(note: Note, *, lang: Language | str = DEFAULT_LANGUAGE) -> str:
    env = build_environment(html=True, lang=lang)
    css = env.loader.get_source(env, "print.css")[0]
    return env.get_template("note.html.j2").render(note=note, css=Markup(css))


class PdfUnavailableError(ConfigError):
    """WeasyPrint or the system libraries it loads (Pango) are missing: no PDF can be made."""


PANGO_HINT = ("Debian/Ubuntu: apt-get install libpango-1.0-0 libpangoft2-1.0-0 (the PDF's system libraries), "
              "then `report build DIR --format pdf`")
# the fonts a language's PDF needs beyond DejaVu (Latin): (fontconfig language, family, how to install)
PDF_FONTS = {"zh": ("zh", "Noto Sans CJK SC", "Debian/Ubuntu: apt-get install fonts-noto-cjk")}


def find_font_family(fc_lang: str) -> list[str] | None:
    """Font families fontconfig (``fc-list :lang=X family``, the library WeasyPrint draws with)
    offers for a language; None when fc-list is not installed (cannot tell)."""
    import shutil
    import subprocess

    fc_list = shutil.which("fc-list")
    if fc_list is None:
        return None
    res = subprocess.run([fc_list, f":lang={fc_lang}", "family"], capture_output=True, text=True, timeout=60)
    return [family for line in res.stdout.splitlines() for family in line.split(",") if family.strip()]


def check_pdf_fonts(lang: Language) -> None:
    """Raise ConfigError (with how to install) when the language's PDF needs a font that is not
    installed: WeasyPrint would draw every glyph as an empty box and still succeed."""
    need = PDF_FONTS.get(lang.code)
    if need is None:
        return
    fc_lang, family, install = need
    families = find_font_family(fc_lang)
    if families is not None and not families:
        raise ConfigError(f"--lang {lang.code}: the PDF needs a {lang.code} font ({family}) and fontconfig has none, "
                          f"so every character would print as an empty box; {install}, or leave out the PDF "
                          f"with --format md,html")


# WeasyPrint lays out the whole document before it writes a page: ~1 GB of memory per MB of a
# note's HTML, ~2 min per MB on one core (benchmarks/results/report_scale.json: 1,000 runs, 2.4 MB,
# 1.5 GB). A note's HTML is ~90 KB; past this (~400 runs) the PDF is not laid out.
MAX_PDF_HTML_BYTES = 1 << 20


def render_pdf(html: str, *, base_url: Path) -> bytes:
    """HTML -> PDF bytes with WeasyPrint; relative figure paths resolve against base_url.
    Raises PdfUnavailableError when WeasyPrint or its system libraries are missing, or when the
    HTML is larger than MAX_PDF_HTML_BYTES (its layout would need gigabytes)."""
    num_bytes = len(html.encode())
    if num_bytes > MAX_PDF_HTML_BYTES:
        raise PdfUnavailableError(
            f"the HTML is {num_bytes / 2**20:.1f} MiB, more than the {MAX_PDF_HTML_BYTES >> 20} MiB a PDF is laid out "
            "from (about 1 GB of memory per MB); print the HTML from a browser, or use --format md,html")
    try:
        import weasyprint
    except (ImportError, OSError) as e:
        raise PdfUnavailableError(f"PDF output needs WeasyPrint and its system libraries ({' '.join(str(e).split())}); "
                                  f"{PANGO_HINT}, or use --format md,html") from None
    return weasyprint.HTML(string=html, base_url=str(base_url)).write_pdf()


def build_figures(campaign: Campaign, out_dir: Path, *, loss_floor_nats: float,
                  lang: Language = EN) -> tuple[Figure, ...]:
    """Compute the figure tables (report.metrics), plot them into out_dir/figures (labels in ``lang``)."""
    warmup = campaign.campaign.fixed.warmup_steps
    loss_curve, step_times = (metrics.compute_loss_curve(campaign.steps),
                              compute_step_times(campaign.steps, warmup_steps=warmup))
    runs = list(campaign.runs["run"])
    drawn, band, subset = metrics.select_figure_runs(step_times, runs), None, {}
    if drawn != runs:  # the fastest and slowest runs, over the band of every run's loss (the caption says so)
        band, subset = metrics.compute_loss_band(loss_curve), {"num_drawn": len(drawn), "num_runs": len(runs)}
        loss_curve, step_times = loss_curve[loss_curve["run"].isin(drawn)], step_times[step_times["run"].isin(drawn)]
    paths = write_figures(loss_curve, step_times, runs=drawn, out_dir=out_dir / "figures", loss_floor_nats=loss_floor_nats,
                          loss_band=band, gettext=lang.gettext)
    return tuple(Figure(kind=kind, path=paths[kind].relative_to(out_dir).as_posix(), **subset)
                 for kind in ("loss", "step_time"))


def build_evidence_figures(note: Note, trace_tables, out_dir: Path, *, lang: Language = EN) -> tuple[Figure, ...]:
    """Section 5's stacked bar (one bar per traced run) and one-step timeline (ranks as rows)."""
    if trace_tables is None or not note.evidence.rows:
        return ()
    summary = pd.DataFrame([dataclasses.asdict(b) for b in note.evidence.rows])
    runs = [b.run for b in note.evidence.rows]
    bar = write_bytes_atomic(out_dir / "figures" / "breakdown.svg",
                             render_breakdown_figure(summary, gettext=lang.gettext))
    timeline = write_bytes_atomic(out_dir / "figures" / "timeline.svg",
                                  render_timeline_figure(trace_tables.spans, runs=runs, gettext=lang.gettext))
    return (Figure(kind="breakdown", path=bar.relative_to(out_dir).as_posix()),
            Figure(kind="timeline", path=timeline.relative_to(out_dir).as_posix()))


def build_health_figures(campaign: Campaign, note: Note, out_dir: Path, *, lang: Language = EN) -> Note:
    """The training-health figures (loss and gradient norm with the flagged steps; per-rank step
    time), from the same report.health tables the health section was built from; the note with
    them in ``health.figures``."""
    if note.health is None or not note.health.runs:
        return note
    runs = [h.run for h in sorted(note.health.runs, key=lambda h: h.verdict != "unhealthy")]  # flagged first
    steps = campaign.steps  # of the runs drawn only (per-run tables: the same rows as the section's)
    curves = compute_flagged_curves(steps[steps["run"].isin(runs[:MAX_HEALTH_FIGURE_RUNS])], note.health.rule)
    health = write_bytes_atomic(out_dir / "figures" / "health.svg",
                                render_health_figure(curves, runs=runs, gettext=lang.gettext))
    rank_times = compute_rank_step_times(steps[steps["run"].isin(runs[:MAX_RANK_STEP_TIME_PANELS])],
                                         warmup_steps=campaign.campaign.fixed.warmup_steps)
    ranks = write_bytes_atomic(out_dir / "figures" / "rank_step_time.svg", render_rank_step_time_figure(
        rank_times, runs=runs, gettext=lang.gettext))
    # past the figures' limits the captions say how many runs they draw
    drawn = {"health": curves["run"].nunique(), "rank_step_time": rank_times["run"].nunique()}
    figures = tuple(Figure(kind=kind, path=path.relative_to(out_dir).as_posix(),
                           **({"num_drawn": drawn[kind], "num_runs": len(runs)} if len(runs) > limit else {}))
                    for kind, path, limit in (("health", health, MAX_HEALTH_FIGURE_RUNS),
                                              ("rank_step_time", ranks, MAX_RANK_STEP_TIME_PANELS)))
    return dataclasses.replace(note, health=dataclasses.replace(note.health, figures=figures))


@dataclasses.dataclass(frozen=True, kw_only=True)
class LogsNote:
    """A folder of logs that is not one training job: its jobs side by side, failures first."""

    folder: str
    triage: TriageSection
    files: tuple[FileRow, ...]
    traces: tuple[TraceJob, ...] = ()


def build_logs_note(folder: str, tables: dict[str, pd.DataFrame], jobs: Sequence[Any]) -> LogsNote:
    """The triage note's view-model from the ingest tables and the jobs found in them."""
    from report.triage import build_file_rows, build_trace_jobs, build_triage_section

    return LogsNote(folder=folder, triage=build_triage_section(jobs), files=build_file_rows(tables.get("files")),
                    traces=build_trace_jobs(tables, jobs, folder=folder))


def render_logs(note: LogsNote, *, html: bool, lang: Language | str = DEFAULT_LANGUAGE) -> str:
    env = build_environment(html=html, lang=lang)
    if not html:
        return env.get_template("logs.md.j2").render(note=note)
    return env.get_template("logs.html.j2").render(note=note, css=Markup(env.loader.get_source(env, "print.css")[0]))


def load_any(source: str | Path) -> Campaign:
    """A campaign or tables dir (ingest.io), or a folder of third-party logs (ingest.thirdparty)."""
    from ingest.thirdparty import is_thirdparty_folder, load_thirdparty_campaign

    return load_thirdparty_campaign(source) if is_thirdparty_folder(source) else load_campaign(source)


def load_note(source: str | Path, *, model: dict | None = None) -> tuple[Campaign | None, Any, Note | LogsNote]:
    """Load a campaign dir, tables dir or third-party folder and build its view-model (no
    figures). Returns (campaign, trace tables or None, note); a folder of logs that is not one
    training job gives (None, None, LogsNote). Raises ToolError subclasses."""
    from ingest.thirdparty import is_thirdparty_folder, load_thirdparty_jobs
    from report.triage import build_triage_section

    jobs = None
    if is_thirdparty_folder(source):
        campaign, tables, jobs = load_thirdparty_jobs(source, model=model)
        if campaign is None:
            check_some_record(source, tables.get("files"))
            return None, None, build_logs_note(Path(source).resolve().name, tables, jobs)
    else:
        campaign = load_live_campaign(source)
    trace_tables = load_trace_tables(campaign)
    note = build_note(campaign, trace_tables=trace_tables)
    if jobs is not None:
        note = dataclasses.replace(note, triage=dataclasses.replace(build_triage_section(jobs), runs=()))
    return campaign, trace_tables, note


def load_live_campaign(source: str | Path) -> Campaign:
    """load_campaign, except that a campaign whose runner is still running and has finished no
    run yet (each unfinished run's rows are left out of a note, so none is left) is refused as
    such: NoDataError saying the runs are still running, not that no run has metrics."""
    import shlex

    from ingest.io import live_runner

    try:
        return load_campaign(source)
    except NoDataError:
        live = live_runner(Path(source))
        if live is None:
            raise
        raise NoDataError(f"{source}: no run has finished yet: the campaign's runner is still running ({live}) and "
                          "a run's step rows are left out of the note until the run ends; build the note again once "
                          f"`{shlex.join(['runner', 'status', str(source)])}` shows a run done") from None


def check_some_record(source: str | Path, files: pd.DataFrame | None) -> None:
    """Raise NoDataError when no file of a folder of logs gave a record: every line of every
    file was in no format the parsers know, or only looked like one (a line of dashes, as a
    torchrun failure banner draws) and held nothing; its note would list every file as a job
    of which nothing is known."""
    if files is None or not len(files) or not (files["num_records"] > 0).any():
        num_files = 0 if files is None else len(files)
        raise NoDataError(f"{source}: none of its {num_files} file(s) holds a record of a log, trace or table the "
                          "report reads; pass a campaign dir (`runner all`), a tables dir (`ingest`) or a folder of "
                          "NCCL / Megatron-LM / DeepSpeed / torchtitan logs, profiler traces or tables")


def _check_formats(formats: Sequence[str]) -> None:
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise ConfigError(f"unknown --format {','.join(bad) or '(empty)'}; choose from {','.join(FORMATS)}")


# A note folder (--out) holds one build's files: written as one set (core.atomic.staged_folder),
# into a folder that is new, empty or marked as a note's by NOTE_MARKER (also the build's lock)
NOTE_MARKER = ".report-note"
NOTE_ENTRIES = ("summary.json", "note.md", "note.html", "note.pdf", "figures")
NOTE_OUT_HINT = ("choose a new or empty --out (a note is written only into a folder `report build` made, so it "
                 "never overwrites your files)")


def build_report(source: str | Path, *, out_dir: str | Path | None = None,
                 formats: Sequence[str] = FORMATS, lang: str = DEFAULT_LANGUAGE,
                 warn: Callable[[str], None] | None = None, model: dict | None = None) -> list[Path]:
    """Load a campaign or tables dir, write summary.json and note.<fmt> (+ figures/) into
    out_dir (default: default_note_out). lang: the note's language (report.i18n; summary.json
    is the same in every language). warn: given, a PDF that cannot be made (no WeasyPrint or
    Pango) is skipped with one line to it, the other formats written; else PdfUnavailableError.
    A language whose font is missing fails before anything is written (check_pdf_fonts).
    out_dir must be new, empty or a note folder an earlier build made (NOTE_MARKER); the files
    are built in a staging folder and replace the previous build's as one set, one build at a
    time (core.atomic.staged_folder), so a stopped or concurrent build never leaves a mix.
    Returns written paths. Raises ToolError subclasses."""
    _check_formats(formats)
    language = load_language(lang)
    if "pdf" in formats:
        check_pdf_fonts(language)
    out = Path(out_dir) if out_dir else default_note_out(source)
    check_staged_folder(out, marker=NOTE_MARKER, hint=NOTE_OUT_HINT)  # before the long load: say it at once
    campaign, trace_tables, note = load_note(source, model=model)
    with staged_folder(out, marker=NOTE_MARKER, entries=NOTE_ENTRIES, hint=NOTE_OUT_HINT) as stage:
        if isinstance(note, LogsNote):
            written = write_logs_note(note, stage, formats=formats, lang=language, warn=warn)
        else:
            figures = build_figures(campaign, stage, loss_floor_nats=note.model.loss_floor_nats, lang=language)
            figures += build_evidence_figures(note, trace_tables, stage, lang=language)
            note = build_health_figures(campaign, dataclasses.replace(note, figures=figures), stage, lang=language)
            written = [write_bytes_atomic(stage / "summary.json", render_summary_json(build_summary(note)))]
            written += write_note_files(stage, formats=formats, warn=warn,
                                        markdown=lambda: render_markdown(note, lang=language),
                                        html=lambda: render_html(note, lang=language))
    return [out / Path(p).relative_to(stage) for p in written]


def write_logs_note(note: LogsNote, out: Path, *, formats: Sequence[str], lang: Language,
                    warn: Callable[[str], None] | None) -> list[Path]:
    """note.md / note.html / note.pdf of a logs folder's triage note. Returns written paths."""
    return write_note_files(out, formats=formats, warn=warn, markdown=lambda: render_logs(note, html=False, lang=lang),
                            html=lambda: render_logs(note, html=True, lang=lang))


def write_note_files(out: Path, *, formats: Sequence[str], warn: Callable[[str], None] | None,
                     markdown: Callable[[], str], html: Callable[[], str]) -> list[Path]:
    """note.md / note.html / note.pdf for the requested formats from the note's renderers (the
    PDF is WeasyPrint over the HTML). warn: given, a PDF that cannot be made is skipped with one
    line to it; else PdfUnavailableError. Returns written paths."""
    written = []
    if "md" in formats:
        written.append(write_bytes_atomic(out / "note.md", markdown().encode()))
    if "html" in formats or "pdf" in formats:
        page = html()
        if "html" in formats:
            written.append(write_bytes_atomic(out / "note.html", page.encode()))
        if "pdf" in formats:
            try:
                written.append(write_bytes_atomic(out / "note.pdf", render_pdf(page, base_url=out)))
            except PdfUnavailableError as e:
                if warn is None:
                    raise
                warn(f"no PDF: {e}")
    return written


CHECKOUT = Path(__file__).resolve().parent.parent  # the tool's own tree (site-packages when installed)


def default_note_out(source: str | Path) -> Path:
    """SOURCE/report, except for a folder inside the tool's own checkout outside its ignored runs/
    (a committed example): runs/NAME/report under the current directory, so rebuilding an
    example's note leaves the tracked tree as it was."""
    resolved = Path(source).resolve()
    if resolved.is_relative_to(CHECKOUT) and not resolved.is_relative_to(CHECKOUT / "runs"):
        return Path("runs") / resolved.name / "report"
    return Path(source) / "report"


# A diff folder (report diff --out) is kept as a note folder is (NOTE_MARKER above), with its own marker
DIFF_MARKER = ".report-diff"
DIFF_ENTRIES = ("diff.json", "diff.md", "diff.html", "diff.pdf")
DIFF_OUT_HINT = ("choose a new or empty --out (a diff is written only into a folder `report diff` made, so it "
                 "never overwrites your files)")


def default_diff_out(old_source: str | Path, new_source: str | Path) -> Path:
    """runs/diff-OLD-vs-NEW under the current directory (OLD, NEW the folders' names): a diff is
    never written into either input (one may be a committed example or someone else's logs)."""
    return Path("runs") / f"diff-{Path(old_source).resolve().name}-vs-{Path(new_source).resolve().name}"


# A relative change past 10x (1000%) flags nothing a reader would call a regression; larger values
# are typos (1e400 reads as inf, which JSON cannot hold)
MAX_DIFF_THRESHOLD = 10.0


def build_diff_report(old_source: str | Path, new_source: str | Path, *, out_dir: str | Path | None = None,
                      threshold: float = 0.05, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Compare two campaigns (each a campaign dir, tables dir or third-party folder): write
    diff.json (report.diff's records) and diff.<fmt> into out_dir (default runs/diff-OLD-vs-NEW).
    threshold: relative change beyond which a worse move is flagged, 0 to MAX_DIFF_THRESHOLD
    (else ConfigError). out_dir must be new, empty
    or a diff folder an earlier diff made (DIFF_MARKER); its files replace the previous diff's as
    one set, one diff at a time (core.atomic.staged_folder). Returns written paths. Raises
    ToolError subclasses."""
    from report.diff import build_diff

    _check_formats(formats)
    if not 0 <= threshold <= MAX_DIFF_THRESHOLD:  # also NaN and inf (1e400): diff.json has no digits for them
        raise ConfigError(f"--threshold {threshold}: must be a relative change from 0 to {MAX_DIFF_THRESHOLD:g} "
                          f"(0.05 = 5%, {MAX_DIFF_THRESHOLD:g} = {MAX_DIFF_THRESHOLD:.0%}); the default is 0.05")
    for source in (old_source, new_source):
        if not Path(source).is_dir():
            raise NoDataError(f"{source}: not a directory; give a campaign dir (`runner all`), a tables dir "
                              "(`ingest`) or a folder of third-party logs")
    out = Path(out_dir) if out_dir else default_diff_out(old_source, new_source)
    check_staged_folder(out, marker=DIFF_MARKER, hint=DIFF_OUT_HINT)  # before the long loads: say it at once
    summaries = []
    for source in (old_source, new_source):
        note = load_note(source)[2]
        if isinstance(note, LogsNote):  # logs of several jobs (or none that trained): no runs to compare
            raise NoDataError(f"{source}: a folder of logs of {len(note.triage.jobs)} job(s), not one training job, "
                              f"so no campaign to compare; `report diff` takes two campaign dirs (`runner all`), "
                              f"tables dirs (`ingest`) or folders of one training job's logs (`report build {source}` "
                              "writes this folder's triage note)")
        summaries.append(build_campaign_summary(note))
    diff = build_diff(*summaries, threshold=threshold, old_source=str(old_source), new_source=str(new_source))
    with staged_folder(out, marker=DIFF_MARKER, entries=DIFF_ENTRIES, hint=DIFF_OUT_HINT) as stage:
        written = [write_bytes_atomic(stage / "diff.json", render_summary_json(dataclasses.asdict(diff)))]
        if "md" in formats:
            written.append(write_bytes_atomic(
                stage / "diff.md", build_environment(html=False).get_template("diff.md.j2").render(diff=diff).encode()))
        if "html" in formats or "pdf" in formats:
            env = build_environment(html=True)
            html = env.get_template("diff.html.j2").render(diff=diff,
                                                           css=Markup(env.loader.get_source(env, "print.css")[0]))
            if "html" in formats:
                written.append(write_bytes_atomic(stage / "diff.html", html.encode()))
            if "pdf" in formats:
                written.append(write_bytes_atomic(stage / "diff.pdf", render_pdf(html, base_url=stage)))
    return [out / Path(p).relative_to(stage) for p in written]
