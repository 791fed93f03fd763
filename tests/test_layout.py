"""The note as a reader meets it: the PDF's pages and the HTML in a real browser.

The demo campaign (`runner all` on this CPU machine, as `make demo` makes it) and every committed
example under examples/ are rendered once per session (conftest: demo_campaign, example_note,
shared with the tests that read the same notes); the PDF is laid out by WeasyPrint from the same
note.html and print.css `report build` uses (render_pdf), and its layout tree is kept so that the
checks can name the box at fault:

- nothing runs past the right edge of the page's text block: no table, figure or line of text;
- no two labels of a figure overprint each other (the figures' SVG text, measured with the font
  the figures are drawn in);
- no literal Markdown reaches the reader: no backtick or ``**`` outside code, in the HTML text
  or on the PDF's pages;

- no figure is taller than the page's text block or runs past its foot, and its caption is
  on the same page;
- no table leaves its header alone at a page foot or one or no row on either side of a page
  break, and its header repeats on every page it spans;
- no page is less than a fifth full (ink measured on the page image from `pdftoppm`), except
  the last page of a section (the next page starts with a heading) or of the note;
- every HTML table has a ``<thead>``;
- the HTML in headless Chromium (Debian package ``chromium``) at 1280 px: a screenshot is
  taken, every ``<img>`` loaded, no error reached the page (script or resource), no table or
  figure wider than the window.

Chromium and pdftoppm tests skip (with how to install) only where the binary is absent;
.ci/run installs both.
"""
from __future__ import annotations

import collections
import html
import html.parser
import json
import math
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = tuple(sorted(p.name for p in (ROOT / "examples").iterdir() if (p / "campaign.json").is_file()))
NOTES = ("demo", *EXAMPLES)
SCREENSHOTS = ("demo", "h200-2gpu")  # Chromium paints print.css's page (not blank): the same for every note
MIN_FILL = 0.2  # a page holds at least a fifth of its text block, unless it ends a section
MM = 96 / 25.4  # CSS px per mm (WeasyPrint lays out in CSS px)
PAGE_MARGIN_TOP_MM, PAGE_MARGIN_BOTTOM_MM = 16, 14  # templates/print.css @page
PDFTOPPM = shutil.which("pdftoppm")
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser")) if p), None)


@dataclass
class Rendered:
    name: str  # "demo" or the example's folder name
    out: Path  # report build's output dir (note.html, figures/)
    pdf: Path
    pages: list  # WeasyPrint page objects, in order


@pytest.fixture(scope="module", params=NOTES)
def rendered(request, tmp_path_factory) -> Rendered:
    """The note's folder (shared: read it, write nothing into it) and its PDF, laid out here."""
    import weasyprint

    if request.param == "demo":
        out = request.getfixturevalue("demo_campaign") / "report"
    else:
        out = request.getfixturevalue("example_note")(request.param)
    document = weasyprint.HTML(filename=str(out / "note.html"), base_url=str(out)).render()
    pdf = tmp_path_factory.mktemp(f"pdf-{request.param}") / "note.pdf"
    document.write_pdf(pdf)
    return Rendered(name=request.param, out=out, pdf=pdf, pages=document.pages)


def _walk(box, ancestors=()):
    """Depth-first boxes of a page (margin boxes left out), each with its ancestors' element tags."""
    from weasyprint.formatting_structure import boxes as B

    if isinstance(box, B.MarginBox):
        return
    yield box, ancestors
    for child in getattr(box, "children", None) or []:
        yield from _walk(child, ancestors + (box.element_tag,))


def _text_block(page) -> tuple[float, float]:
    """(top, bottom) of the page's text block in CSS px."""
    box = page._page_box
    top = box.content_box_y()
    return top, top + box.height


def _label(box) -> str:
    from weasyprint.formatting_structure import boxes as B

    text = "".join(b.text for b, _ in _walk(box) if isinstance(b, B.TextBox))
    return " ".join(text.split())[:60]


# ------------------------------------------------------------------ PDF: figures
def test_no_figure_is_taller_than_the_page_and_its_caption_stays_with_it(rendered):
    from weasyprint.formatting_structure import boxes as B

    figure_pages = collections.defaultdict(set)
    images = 0
    for number, page in enumerate(rendered.pages, start=1):
        top, bottom = _text_block(page)
        for box, ancestors in _walk(page._page_box):
            if box.element_tag == "figure":
                figure_pages[id(box.element)].add(number)
            if isinstance(box, B.ReplacedBox):
                images += 1
                src = box.element.get("src")
                assert box.margin_height() <= bottom - top, (number, src, box.margin_height(), bottom - top)
                assert box.position_y + box.margin_height() <= bottom + 0.5, (number, src, "runs past the foot")
    # every figure of the note was laid out (a hang campaign has no profiler figure: two)
    assert images == (rendered.out / "note.html").read_text().count("<img ") >= 2
    split = [sorted(p) for p in figure_pages.values() if len(p) > 1]
    assert not split, f"a figure and its caption on different pages: {split}"


# ------------------------------------------------------------------ PDF: the right edge
def test_nothing_runs_past_the_right_edge_of_the_text_block(rendered):
    from weasyprint.formatting_structure import boxes as B

    bad = []
    for number, page in enumerate(rendered.pages, start=1):
        left = page._page_box.content_box_x()
        right = left + page._page_box.width
        for box, _ in _walk(page._page_box):
            if isinstance(box, (B.TableBox, B.ReplacedBox, B.TextBox)):
                end = box.position_x + box.margin_width()
                if end > right + 1:
                    what = box.element.get("src") if isinstance(box, B.ReplacedBox) else _label(box)
                    bad.append(f"page {number}: {type(box).__name__} {end - right:.0f} px past the edge: {what}")
    assert not bad, "\n".join(dict.fromkeys(bad))


# ------------------------------------------------------------------ figures: overprinted labels
def _label_corners(attrs: dict, text: str, font) -> list[tuple[float, float]]:
    """The four corners of an SVG <text>'s box (matplotlib: x, y baseline, text-anchor, rotate)."""
    size = float(re.search(r"font-size:\s*([\d.]+)px", attrs["style"]).group(1))
    width = font.getlength(text) * size / font.size
    x, y = float(attrs["x"]), float(attrs["y"])
    anchor = re.search(r"text-anchor:\s*(\w+)", attrs["style"])
    x0 = x - {"start": 0, "middle": width / 2, "end": width}[anchor.group(1) if anchor else "start"]
    ascent, descent = 0.76 * size, 0.24 * size  # DejaVu Sans
    corners = [(x0, y - ascent), (x0 + width, y - ascent), (x0 + width, y + descent), (x0, y + descent)]
    rotate = re.search(r"rotate\((-?[\d.]+)", attrs.get("transform", ""))
    angle = math.radians(float(rotate.group(1))) if rotate else 0.0
    cos, sin = math.cos(angle), math.sin(angle)
    return [(x + (cx - x) * cos - (cy - y) * sin, y + (cx - x) * sin + (cy - y) * cos) for cx, cy in corners]


def _overlap(a: list, b: list, *, slack: float = 0.5) -> bool:
    """Whether two convex quadrilaterals overlap by more than ``slack`` along every separating axis."""
    for quad in (a, b):
        for i in range(4):
            (x1, y1), (x2, y2) = quad[i], quad[(i + 1) % 4]
            nx, ny = y2 - y1, x1 - x2
            norm = math.hypot(nx, ny) or 1.0
            pa = [(px * nx + py * ny) / norm for px, py in a]
            pb = [(px * nx + py * ny) / norm for px, py in b]
            if min(max(pa), max(pb)) - max(min(pa), min(pb)) <= slack:
                return False
    return True


def overprinted_labels(svg: str) -> list[tuple[str, str]]:
    """Pairs of text labels of a matplotlib SVG (svg.fonttype none) whose boxes overlap."""
    import matplotlib
    from PIL import ImageFont

    font = ImageFont.truetype(str(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"), 100)
    labels = []
    for match in re.finditer(r"<text ([^>]*)>([^<]*)</text>", svg):
        attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', match.group(1)))
        text = html.unescape(match.group(2))
        if text.strip() and "x" in attrs and "y" in attrs:
            labels.append((text, _label_corners(attrs, text, font)))
    return [(a, b) for i, (a, qa) in enumerate(labels) for b, qb in labels[i + 1:] if _overlap(qa, qb)]


def test_overprint_check_sees_labels_that_collide():
    style = 'style="font-size: 9px; text-anchor: end"'
    close = f'<text {style} x="30" y="50">rank 0</text><text {style} x="30" y="45">rank 1</text>'
    apart = f'<text {style} x="30" y="50">rank 0</text><text {style} x="30" y="38">rank 1</text>'
    slanted = ('<text style="font-size: 9px; text-anchor: end" x="50" y="60" transform="rotate(-35 50 60)">zero3-fsdp2</text>'
               '<text style="font-size: 9px; text-anchor: end" x="70" y="60" transform="rotate(-35 70 60)">tp2-pp2</text>')
    assert overprinted_labels(close) == [("rank 0", "rank 1")]
    assert overprinted_labels(apart) == [] and overprinted_labels(slanted) == []


def test_no_figure_label_overprints_another(rendered):
    bad = {}
    for svg in sorted((rendered.out / "figures").glob("*.svg")):
        pairs = overprinted_labels(svg.read_text())
        if pairs:
            bad[svg.name] = pairs[:5]
    assert not bad, bad


# ------------------------------------------------------------------ literal Markdown
MARKDOWN = re.compile(r"`|\*\*")


class _ProseText(html.parser.HTMLParser):
    """The text of an HTML page outside <code>, <pre>, <script> and <style>."""

    def __init__(self):
        super().__init__()
        self.skip = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.skip += tag in ("code", "pre", "script", "style")

    def handle_endtag(self, tag):
        self.skip -= tag in ("code", "pre", "script", "style") and self.skip > 0

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def test_no_literal_markdown_in_the_html_or_the_pdf(rendered):
    parser = _ProseText()
    parser.feed((rendered.out / "note.html").read_text())
    in_html = [m.string[max(0, m.start() - 40):m.end() + 40] for m in
               (MARKDOWN.search(" ".join(p.split())) for p in parser.parts) if m]
    from weasyprint.formatting_structure import boxes as B

    in_pdf = []
    for number, page in enumerate(rendered.pages, start=1):
        for box, ancestors in _walk(page._page_box):
            if isinstance(box, B.TextBox) and MARKDOWN.search(box.text) and not {"code", "pre"} & set(ancestors):
                in_pdf.append(f"page {number}: {box.text[:80]}")
    assert not in_html and not in_pdf, {"html": in_html[:10], "pdf": in_pdf[:10]}


# ------------------------------------------------------------------ PDF: tables
def test_no_table_leaves_a_header_or_a_single_row_at_a_page_break(rendered):
    from weasyprint.formatting_structure import boxes as B

    fragments = collections.defaultdict(list)  # table element -> [(page, body rows, has header)]
    for number, page in enumerate(rendered.pages, start=1):
        for box, _ in _walk(page._page_box):
            if isinstance(box, B.TableBox):
                rows = [r for g in box.children if not g.is_header for r in g.children]
                header = any(g.is_header for g in box.children)
                fragments[id(box.element)].append((number, len(rows), header, _label(box)))
    assert fragments
    bad = []
    for parts in fragments.values():
        if len(parts) == 1:
            continue
        for number, num_rows, header, label in parts:
            if num_rows < 2 or not header:
                bad.append(f"page {number}: {num_rows} row(s), header {'repeated' if header else 'missing'}: {label}")
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------ PDF: near-empty pages
def _ink_fill(pdf: Path, tmp: Path, num_pages: int) -> list[float]:
    """Per page: the lowest inked row inside the text block, as a fraction of the block's height
    (pdftoppm at 30 dpi, greyscale; running headers and page numbers sit in the margins)."""
    from PIL import Image

    subprocess.run([PDFTOPPM, "-gray", "-r", "30", str(pdf), str(tmp / "page")], check=True, timeout=300,
                   capture_output=True)
    images = sorted(tmp.glob("page-*.pgm"))
    assert len(images) == num_pages
    fills = []
    for path in images:
        image = Image.open(path)
        width, height = image.size
        px_per_mm = height / 210.0  # landscape A4
        top = int(PAGE_MARGIN_TOP_MM * px_per_mm) + 1
        bottom = height - int(PAGE_MARGIN_BOTTOM_MM * px_per_mm) - 1
        pixels = image.load()
        last = top
        for y in range(top, bottom):
            if any(pixels[x, y] < 200 for x in range(width)):
                last = y
        fills.append((last - top) / (bottom - top))
    return fills


def _starts_with_heading(page) -> bool:
    """Whether the first content on the page (a line, image or table row) is inside h1-h3."""
    from weasyprint.formatting_structure import boxes as B

    for box, ancestors in _walk(page._page_box):
        if isinstance(box, (B.LineBox, B.ReplacedBox, B.TableRowBox)):
            return bool({"h1", "h2", "h3"} & set(ancestors + (box.element_tag,)))
    return False


@pytest.mark.skipif(not PDFTOPPM, reason="pdftoppm not found: apt-get install poppler-utils (.ci/run installs it)")
def test_no_page_is_less_than_a_fifth_full_unless_it_ends_a_section(rendered, tmp_path):
    fills = _ink_fill(rendered.pdf, tmp_path, len(rendered.pages))
    short = [(number, round(fill, 2)) for number, fill in enumerate(fills, start=1)
             if fill < MIN_FILL and number < len(fills) and not _starts_with_heading(rendered.pages[number])]
    assert not short, f"pages (number, fill) less than {MIN_FILL:.0%} full in mid-section: {short}"


# ------------------------------------------------------------------ HTML
class _Tables(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.tables: list[dict] = []
        self.open: list[dict] = []

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.open.append({"thead": False, "line": self.getpos()[0]})
            self.tables.append(self.open[-1])
        elif tag == "thead" and self.open:
            self.open[-1]["thead"] = True

    def handle_endtag(self, tag):
        if tag == "table" and self.open:
            self.open.pop()


def _tables_without_thead(text: str) -> list[int]:
    parser = _Tables()
    parser.feed(text)
    assert parser.tables
    return [t["line"] for t in parser.tables if not t["thead"]]


def test_every_html_table_has_a_thead(rendered):
    missing = _tables_without_thead((rendered.out / "note.html").read_text())
    assert not missing, f"note.html tables without <thead> at lines {missing}"


def test_every_diff_table_has_a_thead(tmp_path):
    from report.render import build_diff_report

    build_diff_report(ROOT / "examples" / "h200-1gpu", ROOT / "examples" / "h200-1gpu", out_dir=tmp_path,
                      formats=("html",))
    missing = _tables_without_thead((tmp_path / "diff.html").read_text())
    assert not missing, f"diff.html tables without <thead> at lines {missing}"


# ------------------------------------------------------------------ HTML in a browser
# Runs first in <head>: records script errors and failed resource loads (capture phase sees
# an <img>'s error), then on load writes what it found into the DOM that --dump-dom prints.
PROBE = """<script>
window.__errors = [];
window.addEventListener("error", function (e) {
  window.__errors.push(e.message || ("failed to load " + (e.target && (e.target.src || e.target.href))));
}, true);
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var tables = Array.prototype.slice.call(document.querySelectorAll("table"));
  var width = document.documentElement.clientWidth;
  var wide = Array.prototype.slice.call(document.querySelectorAll("table, img, figure, pre, svg")).filter(function (e) {
    return e.getBoundingClientRect().right > width + 1;
  }).map(function (e) { return e.tagName + ": " + (e.getAttribute("src") || e.textContent || "").trim().slice(0, 60); });
  var result = {
    overflow: wide,
    scroll_width: document.documentElement.scrollWidth,
    images: imgs.length,
    not_loaded: imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); }).map(function (i) { return i.getAttribute("src"); }),
    tables: tables.length,
    no_thead: tables.filter(function (t) { return !t.tHead; }).length,
    errors: window.__errors,
    width: document.documentElement.clientWidth,
  };
  var pre = document.createElement("pre");
  pre.id = "layout-probe";
  pre.textContent = JSON.stringify(result);
  document.body.appendChild(pre);
});
</script>"""


def _chromium(args: list[str], profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--no-first-run", f"--user-data-dir={profile}", "--window-size=1280,2000",
                           "--hide-scrollbars", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not CHROMIUM, reason="chromium not found: apt-get install chromium (.ci/run installs it)")
def test_html_note_in_headless_chromium(rendered, tmp_path):
    from PIL import Image

    note = (rendered.out / "note.html").read_text()
    probe = tmp_path / "note-probe.html"  # the shared note folder is not written into: <base> resolves figures/
    probe.write_text(note.replace("<head>", f'<head>\n<base href="{rendered.out.as_uri()}/">\n' + PROBE, 1))
    res = _chromium(["--virtual-time-budget=10000", "--dump-dom", probe.as_uri()], tmp_path / "profile")
    assert res.returncode == 0, res.stderr[-2000:]
    match = re.search(r'<pre id="layout-probe">(.*?)</pre>', res.stdout, re.S)
    assert match, res.stderr[-2000:]
    result = json.loads(html.unescape(match.group(1)))
    assert result["width"] == 1280
    assert not result["overflow"] and result["scroll_width"] <= 1280, result["overflow"]
    assert result["images"] == note.count("<img ") >= 2 and not result["not_loaded"], result
    assert result["tables"] == note.count("<table") >= 3 and result["no_thead"] == 0, result
    assert not result["errors"], result["errors"]

    if rendered.name not in SCREENSHOTS:
        return
    shot = tmp_path / "note.png"
    res = _chromium([f"--screenshot={shot}", (rendered.out / "note.html").as_uri()], tmp_path / "profile2")
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    image = Image.open(shot).convert("L")
    assert image.size == (1280, 2000)
    low, high = image.getextrema()
    assert low < 100 and high > 200  # text on a light page, not a blank or black frame


# ------------------------------------------------------------------ figures on their own
LONG_RUNS = ["ddp", "zero3", "zero3-fsdp2", "zero3-deepspeed", "megatron-tp2-pp2", "zero3-fsdp2tp2-pp2",
             "torch-tp1-pp1", "ddp-real"]


def _svg_height_pt(svg: bytes) -> float:
    return float(re.search(rb'<svg[^>]*\bheight="([\d.]+)pt"', svg).group(1))


def test_timeline_of_many_runs_fits_a_page():
    """Eight runs of two ranks (the CPU demo's size) stay within the page's 125 mm image height
    at the note's 12.5 cm width (a 6-inch-wide figure is scaled by 12.5 cm / 6 in)."""
    import pandas as pd

    from report.figures import render_timeline_figure

    rows = [dict(run=run, rank=rank, step=3, category=cat, start_s=0.012 * i, end_s=0.012 * i + 0.01)
            for run in LONG_RUNS for rank in (0, 1) for i, cat in enumerate(["compute", "exposed_comm", "other"])]
    svg = render_timeline_figure(pd.DataFrame(rows), runs=LONG_RUNS)
    scale = 125 / (6 * 25.4)
    assert _svg_height_pt(svg) * scale <= 125 / 25.4 * 72


@pytest.mark.parametrize("runs, slanted", [(LONG_RUNS, True), (["ddp", "zero3"], False)])
def test_step_time_labels_slant_only_when_they_would_collide(runs, slanted):
    import pandas as pd

    from report.figures import render_step_time_figure

    steps = pd.DataFrame([dict(run=r, step=s, step_time_s=0.1 + 0.001 * s) for r in runs for s in range(5)])
    svg = render_step_time_figure(steps, runs=runs).decode()
    assert ("rotate(-35" in svg) is slanted


def test_a_code_span_in_a_messages_data_becomes_code_in_html_only():
    """An error quoted in the note (`runner commbench` in a ConfigError) reads as code in the HTML,
    as the Markdown note shows it; its other characters stay escaped."""
    from markupsafe import Markup

    from report.i18n import Message, N_, load_language, translate

    EN = load_language()

    message = Message(N_("%(how)s; this run cannot be modelled: %(error)s"), how="x",
                      error="no `runner commbench` table <b>")
    assert translate(message, EN, escape=Markup) == Markup(
        "x; this run cannot be modelled: no <code>runner commbench</code> table &lt;b&gt;")
    assert translate(message, EN) == "x; this run cannot be modelled: no `runner commbench` table <b>"
