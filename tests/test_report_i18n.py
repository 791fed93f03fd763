"""The note in other languages (report build --lang) and its print quality.

The committed H200 campaign (examples/h200-1gpu) is rendered in English and Chinese; the PDFs'
extracted text must carry the section titles and the key numbers, the numbers must agree with
the metric table (and with summary.json, which is the same in every language), the Chinese
titles must be drawn with a CJK font (not tofu boxes that only *extract* as Chinese), figures
must be vector, and page 1 is rendered to an image and checked.
"""
from __future__ import annotations

import gettext
import json
import re
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
from babel import Locale
from babel.messages.catalog import Catalog

from report import render
from report.i18n import Language, _usable, available_languages, load_language
from report.render import build_environment, build_report

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-1gpu"
TEMPLATES = Path(__file__).resolve().parent.parent / "report" / "templates"
RUNS = ("ddp", "zero3", "megatron-tp1-pp1")
TITLES = {
    "en": ("Parallel layout trade-off: h200-1gpu", "Executive summary", "Contents", "1. Environment",
           "2. Model and data", "3. Configurations", "4. Metrics", "5. Evidence", "6. Conclusion",
           "Appendix: formulas", "Appendix: resolved configuration"),
    "zh": ("并行布局权衡：h200-1gpu", "摘要", "目录", "1. 环境", "2. 模型与数据", "3. 配置", "4. 指标", "5. 证据",
           "6. 结论", "附录：公式", "附录：解析后的完整配置"),
}


def _cjk_font_installed() -> bool:
    if not shutil.which("fc-list"):
        return False
    out = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True, timeout=60).stdout
    return "Noto Sans CJK" in out


CJK_FONT = _cjk_font_installed()
NO_CJK_FONT = "no CJK font (Noto Sans CJK): apt-get install fonts-noto-cjk (.ci/run installs it)"
# the Chinese PDF's text needs the CJK font: without it the glyphs are tofu and pypdf extracts garbage
LANGS = ["en", pytest.param("zh", marks=pytest.mark.skipif(not CJK_FONT, reason=NO_CJK_FONT))]


def _pdf_pages(path: Path) -> list[str]:
    from pypdf import PdfReader

    return [page.extract_text() for page in PdfReader(path).pages]


def _metric_rows(md: str) -> dict[str, list[str]]:
    """The section-4 table's rows by run (the header is translated, the rows start with the run)."""
    section = re.split(r"^## 4\. ", md, flags=re.M)[1].split("\n## 5.", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] in RUNS:
            rows[cells[0]] = cells
    return rows


@pytest.fixture(scope="module")
def notes(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for lang in ("en", "zh"):
        out[lang] = tmp_path_factory.mktemp(f"h200-{lang}")
        # without the CJK font a Chinese PDF is refused (report.render.check_pdf_fonts): md and html only
        build_report(EXAMPLE, out_dir=out[lang], lang=lang,
                     formats=render.FORMATS if lang == "en" or CJK_FONT else ("md", "html"))
    return out


@pytest.fixture(scope="module")
def pdf_text(notes) -> dict[str, list[str]]:
    return {lang: _pdf_pages(path / "note.pdf") for lang, path in notes.items() if (path / "note.pdf").exists()}


# ------------------------------------------------------------------ catalogs and filters
def test_filters_follow_the_locale():
    de = Language(code="de", locale=Locale.parse("de"), translations=gettext.NullTranslations())
    assert render.pct(0.4312, lang=de) == "43,1\xa0%" and render.count(124439808, lang=de) == "124.439.808"
    assert render.gib(3.5, lang=de) == "3,50 GiB" and render.si(6.2146, lang=de) == "6,21"
    assert render.duration(0.13, lang=de) == "130,0 ms" and render.ratio(3.146, lang=de) == "3,15×"
    assert render.date("2026-11-29T12:45:30+00:00", lang=de) == "29. November 2026 12:45 UTC"
    zh = load_language("zh")
    assert render.pct(0.4312, lang=zh) == "43.1%" and render.count(124439808, lang=zh) == "124,439,808"
    assert render.pct(None, lang=zh) == "不适用" and render.duration(200, lang=zh) == "3 分 20 秒"
    assert render.date("2026-11-29T12:45:30+00:00", lang=zh) == "2026年11月29日 12:45 UTC"
    # English is the default and unchanged
    assert render.pct(0.4312) == "43.1%" and render.date("2026-11-29T10:00:00Z") == "November 29, 2026 10:00 UTC"
    assert render.pct(-0.00001) == "0.0%"  # a rounded zero has no sign


def test_catalogs_load_without_bad_translations():
    assert available_languages()[0] == "en" and "zh" in available_languages()
    for code in available_languages():
        assert load_language(code).problems == (), code


@pytest.mark.parametrize("code", [c for c in available_languages() if c != "en"])
def test_every_message_of_the_templates_and_code_is_translated(code):
    """A message added to a template or marked in report/ without its translation prints in
    English in that language's note: `python -m report.i18n update`, then translate it."""
    from report.i18n import untranslated

    assert untranslated(code) == []


def test_bad_or_missing_translations_print_in_english():
    catalog = Catalog(locale="zh_Hans_CN")
    catalog.add("Run %(run)s crashed", "运行 %(name)s 崩溃")  # wrong placeholder: would fail at render time
    catalog.add("Environment", "环境")
    catalog.add(("%(num)s rank", "%(num)s ranks"), ("",))  # untranslated plural: would print ""
    kept, problems = _usable(catalog)
    assert [m.id for m in list(kept)[1:]] == ["Environment"]
    assert len(problems) == 1 and "Run %(run)s crashed" in problems[0]
    env = build_environment(html=False, lang="zh")
    text = env.from_string('{{ _("Environment") }} / {{ _("A message added later, %(n)s", n=3) }} / '
                           '{{ ngettext("%(num)s new thing", "%(num)s new things", 2) }}').render()
    assert text == "环境 / A message added later, 3 / 2 new things"


def test_unknown_language_is_a_user_error(tmp_path, capsys):
    from report.cli import main

    with pytest.raises(SystemExit):
        main(["build", str(EXAMPLE), "--out", str(tmp_path), "--lang", "xx"])
    assert "invalid choice: 'xx'" in capsys.readouterr().err


# Literal text the note templates may hold outside gettext calls: markup, table syntax, symbols
# and names that are the same in every language.
ALLOWED_WORDS = {"DOCTYPE", "html", "json", "TP", "PP", "DP", "MFU", "AdamW"}


NOTE_TEMPLATES = ["note.md.j2", "note.html.j2", "_words.j2",
                  "_data_source.md.j2", "_data_source.html.j2", "_data_rounds.md.j2", "_data_rounds.html.j2",
                  "_data_conclusion.md.j2", "_data_conclusion.html.j2", "_data_words.j2",
                  "_engines.j2", "_engines.md.j2", "_engines.html.j2", "_predicted.md.j2", "_predicted.html.j2",
                  "_parity.md.j2", "_parity.html.j2", "_capacity.md.j2", "_capacity.html.j2", "_search.md.j2", "_search.html.j2", "_health.md.j2", "_health.html.j2", "_overlap.md.j2", "_overlap.html.j2", "_overlap_words.j2", "_triage.md.j2", "_triage.html.j2", "_triage_macros.j2",
                  "logs.md.j2", "logs.html.j2"]


def test_every_note_partial_is_checked():
    assert {p.name for p in TEMPLATES.glob("_*.j2")} - {"_diff_words.j2"} <= set(NOTE_TEMPLATES)


@pytest.mark.parametrize("name", NOTE_TEMPLATES)
def test_templates_hold_no_untranslated_text(name):
    """Every word of fixed text in the note templates comes from a gettext call."""
    source = (TEMPLATES / name).read_text()
    jinja2.Environment(extensions=["jinja2.ext.i18n"]).parse(source)  # it is a template
    text = re.sub(r"\{#.*?#\}|\{%.*?%\}|\{\{.*?\}\}", " ", source, flags=re.S)  # Jinja code
    text = re.sub(r"<[^>]*>", " ", text)  # HTML tags and their attributes
    words = set(re.findall(r"[A-Za-z]{2,}", text))
    assert words <= ALLOWED_WORDS, sorted(words - ALLOWED_WORDS)


# ------------------------------------------------------------------ the H200 campaign in both languages
@pytest.mark.parametrize("lang", LANGS)
def test_pdf_has_titles_and_numbers_that_agree_with_the_tables(notes, pdf_text, lang):
    text = "\n".join(pdf_text[lang])
    flat = re.sub(r"\s+", " ", text)
    for title in TITLES[lang]:
        assert title in text, title
    summary = {r["run"]: r for r in json.loads((notes[lang] / "summary.json").read_text())["runs"]}
    rows = _metric_rows((notes[lang] / "note.md").read_text())
    language = load_language(lang)
    for run in RUNS:
        s = summary[run]
        tokens = render.si(s["tokens_per_s"], lang=language)
        mfu = render.pct(s["mfu"], lang=language)
        median = render.duration(s["step_time_median_s"], lang=language)
        assert (rows[run][5], rows[run][7], rows[run][3]) == (tokens, mfu, median), run  # md table = summary.json
        assert re.search(rf"{re.escape(run)} ok \d+ {re.escape(median)} .*? {re.escape(tokens)} {re.escape(tokens)} "
                         rf"{re.escape(mfu)}", flat), run  # the PDF's metric table row
    # the executive summary names the fastest run with the table's numbers
    best = max(RUNS, key=lambda r: summary[r]["tokens_per_s"])
    page1 = re.sub(r"\s+", " ", pdf_text[lang][0])
    assert best == "ddp"
    assert f"{rows[best][5]} tokens/s" in page1 and rows[best][7] in page1
    assert {"en": "Recommendation: ddp", "zh": "推荐：ddp"}[lang] in page1


@pytest.mark.parametrize("lang", LANGS)
def test_contents_page_numbers_point_at_the_sections(pdf_text, lang):
    page1 = pdf_text[lang][0]
    for title in TITLES[lang][3:9]:
        m = re.search(rf"^{re.escape(title)}\s*\.+\s*(\d+)\s*$", page1, flags=re.M)
        assert m, title
        page = int(m.group(1))
        assert re.search(rf"^{re.escape(title)}\s*$", pdf_text[lang][page - 1], flags=re.M), (title, page)


def _images(obj, seen=None) -> int:
    """Raster images (XObject /Subtype /Image) under a resource dictionary, forms included."""
    seen = set() if seen is None else seen
    count = 0
    for ref in (obj.get("/XObject") or {}).values():
        x = ref.get_object()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if x.get("/Subtype") == "/Image":
            count += 1
        elif x.get("/Resources"):
            count += _images(x["/Resources"].get_object(), seen)
    return count


@pytest.mark.parametrize("lang", LANGS)
def test_figures_are_vector(notes, pdf_text, lang):
    from pypdf import PdfReader

    reader = PdfReader(notes[lang] / "note.pdf")
    assert sum(_images(p["/Resources"]) for p in reader.pages) == 0
    assert all(p.suffix == ".svg" for p in (notes[lang] / "figures").iterdir())
    # SVG text stays text in the PDF: the axis labels, in the note's language
    assert {"en": "loss (nats)", "zh": "损失（nats）"}[lang] in "\n".join(pdf_text[lang])


@pytest.mark.skipif(not CJK_FONT, reason=NO_CJK_FONT)
def test_chinese_titles_are_drawn_with_a_cjk_font(notes):
    """Text extraction alone cannot tell: without a CJK font WeasyPrint draws tofu boxes from
    DejaVu whose ToUnicode map still says 环境. So every font that maps a title character must
    be a CJK font."""
    from pypdf import PdfReader

    chars = {c for t in TITLES["zh"] for c in t if ord(c) > 0x2E80}
    owners: dict[str, set[str]] = {c: set() for c in chars}
    for page in PdfReader(notes["zh"] / "note.pdf").pages[:3]:
        for ref in page["/Resources"]["/Font"].values():
            font = ref.get_object()
            if "/ToUnicode" not in font:
                continue
            cmap = font["/ToUnicode"].get_object().get_data().decode("latin-1").lower()
            for c in chars:
                if f"<{ord(c):04x}>" in cmap:
                    owners[c].add(str(font["/BaseFont"]))
    assert all(owners.values()), [c for c, f in owners.items() if not f]
    assert all("CJK" in f for fonts in owners.values() for f in fonts), owners


@pytest.mark.skipif(not shutil.which("pdftoppm"), reason="pdftoppm (poppler-utils) not installed")
@pytest.mark.parametrize("lang", LANGS)
def test_page_one_renders(notes, pdf_text, lang, tmp_path):
    from PIL import Image

    subprocess.run(["pdftoppm", "-r", "40", "-f", "1", "-l", "1", "-png", str(notes[lang] / "note.pdf"),
                    str(tmp_path / "p")], check=True, timeout=120)
    png = next(tmp_path.glob("p*.png"))
    with Image.open(png) as im:
        width, height = im.size
        gray = im.convert("L")
        ink = sum(gray.histogram()[:128]) / (width * height)
    assert abs(width / height - 297 / 210) < 0.01 and abs(width - 297 / 25.4 * 40) <= 2  # A4 landscape
    assert 0.005 < ink < 0.2  # text on it, not blank and not a black page
    page1 = pdf_text[lang][0]
    for title in TITLES[lang][:3]:
        assert title in page1
    assert {"en": "Hardware", "zh": "硬件"}[lang] in page1 and "NVIDIA H200" in page1


# ------------------------------------------------------------------ text built in Python (report.i18n.Message)
def test_messages_from_python_print_translated_and_stay_english_elsewhere():
    import copy
    import json

    from markupsafe import Markup

    from report.i18n import Message, MessageList, translate
    from report.memory import build_model_states

    states = build_model_states(strategy="zero3", engine="fsdp2", dtype="bf16", num_params=1000, tp_degree=1,
                                       pp_degree=1, dp_degree=4, options={"reshard_after_forward": False})
    assert states.formula == "(4 fp32 sharded weights + 4 fp32 grads + 8 m, v) Ψ/N = 16Ψ/N, N = 4"
    zh = load_language("zh")
    assert translate(states.formula, zh) == "（4 fp32 分片权重 + 4 fp32 梯度 + 8 m、v）Ψ/N = 16Ψ/N，N = 4"
    assert "reshard_after_forward" in translate(states.extra, zh) and "保留" in translate(states.extra, zh)
    names = MessageList([Message("%(run)s (%(engine)s, eager)", run="<a>", engine="torch")])
    assert translate(names, zh, escape=Markup) == "&lt;a&gt;（torch，eager）"  # data escaped, message trusted
    assert copy.deepcopy(names) == names and json.dumps({"x": names}) == '{"x": "<a> (torch, eager)"}'
    env = build_environment(html=False, lang="zh")
    assert env.from_string("{{ _(x) }}").render(x=states.formula).startswith("（4 fp32 分片权重")
