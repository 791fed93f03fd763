"""The note's languages: gettext message catalogs and locale-aware numbers and dates.

Fixed text is written in English in the templates (``_("...")``, ``ngettext``, ``pgettext``)
and in Python (marked ``N_("...")``, built into ``Message`` values: core.i18n, so ingest and
runner word sentences without importing report; translated when printed): the English text
is the message id, so English needs no catalog and any message a catalog does not translate
(a string added later, a fuzzy entry) prints in English. Other languages live in
``report/locale/<lang>/LC_MESSAGES/messages.po``, read directly with Babel at render time
(no compile step to forget). ``python -m report.i18n update`` re-extracts
``report/locale/messages.pot`` from templates/ and the Python of core/, ingest/, runner/ and
report/ and merges it into every ``.po``; ``python -m report.i18n check`` lists what each
catalog leaves untranslated.

Text recorded in files is English (a status.json cause, a parser's warning in the tables):
``translate_recorded`` finds the catalog message it was built from (its literal parts, in
order, with the parameters between them) and prints it translated; text no message matches
prints as recorded.

Numbers: Python rounds (the same digits in every language, the digits the tests compute),
Babel writes them with the locale's CLDR symbols and patterns (decimal and group
separators, minus sign, percent pattern). Deliberately not here: which text is said (the
templates) and any metric computation.
"""
from __future__ import annotations

import argparse
import gettext
import io
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, getcontext, localcontext
from functools import cache
from importlib.resources import files
from pathlib import Path
from typing import Any

from babel import Locale
from babel.dates import format_date, format_time
from babel.messages.catalog import Catalog
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po, write_po
from babel.numbers import format_decimal, format_percent

from core.errors import ConfigError
from core.i18n import Message, MessageList, N_  # noqa: F401 - re-exported: report's modules import them from here

ROOT = Path(__file__).resolve().parent.parent
LOCALE_DIR = Path(files("report") / "locale")  # package data (pyproject.toml)
DOMAIN = "messages"
DEFAULT_LANGUAGE = "en"
# note language -> the Babel (CLDR) locale of its numbers and dates
BABEL_LOCALES = {"en": "en", "zh": "zh_Hans_CN"}
# what `update` extracts: (method, glob relative to the repository root)
EXTRACT_MAPPING = [("core/**.py", "python"), ("ingest/**.py", "python"), ("runner/**.py", "python"),
                   ("report/**.py", "python"), ("templates/**.j2", "jinja2.ext:babel_extract")]
EXTRACT_KEYWORDS = {"_": None, "gettext": None, "ngettext": (1, 2), "pgettext": ((1, "c"), 2),
                    "npgettext": ((1, "c"), 2, 3), "N_": None}
_PLACEHOLDER = re.compile(r"%\((\w+)\)[sd]")


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def _html_param(value: Any, escape: Any) -> Any:
    """A data parameter for HTML: escaped, its Markdown code spans (`runner commbench`, as the
    Markdown note shows them) as <code> rather than literal backticks."""
    if not isinstance(value, str) or hasattr(value, "__html__") or "`" not in value:
        return value  # already markup (a translated Message) or nothing to convert
    return escape("").join(escape("<code>{}</code>").format(part) if i % 2 else escape.escape(part)
                           for i, part in enumerate(_CODE_SPAN.split(value)))


def translate(value: Any, lang: "Language", *, escape: Any = None) -> Any:
    """A Message / MessageList in ``lang`` (recursively); anything else unchanged. ``escape``:
    markupsafe.Markup for HTML (the translated message is trusted markup, data parameters are
    escaped by Markup's %, their Markdown code spans made <code>), None for plain text."""
    if isinstance(value, Message):
        text = lang.gettext(value.msgid)
        if escape is not None:  # the message is text (escaped), its Markdown code spans (`runner commbench`) <code>
            text = escape("").join(escape("<code>{}</code>").format(part) if i % 2 else escape.escape(part)
                                   for i, part in enumerate(_CODE_SPAN.split(text)))
            return text % {k: _html_param(translate(v, lang, escape=escape), escape) for k, v in value.params.items()}
        return text % {k: translate(v, lang, escape=escape) for k, v in value.params.items()}
    if isinstance(value, MessageList):
        sep = lang.pgettext("list separator", value.sep)
        items = [translate(i, lang, escape=escape) for i in value.items]
        return escape(sep).join(items) if escape is not None else sep.join(str(i) for i in items)
    return value


_RECORDED_MIN_LITERAL = 8  # a message with fewer fixed characters would match any text ("%(a)s: %(b)s")
_RECORDED_DEPTH = 3  # parameters of parameters, e.g. a cause inside a hang inside a status
_RECORDED_WHERE = re.compile(r"(?P<where>[^\s:]+): (?P<what>.+)", re.S)


def _recorded_pattern(msgid: str) -> tuple[re.Pattern, tuple[str, ...], int] | None:
    """msgid -> (a regex matching the English text it makes, its literal parts, their length), or
    None for a message with too few fixed characters to be told apart from data, with a %d
    placeholder (recorded text gives strings) or with two placeholders side by side (no fixed
    text between them to tell where one ends)."""
    pieces = re.split(r"(%\(\w+\)[sd]|%%)", msgid)
    if any(p.endswith(")d") for p in pieces[1::2]) or re.search(r"%\(\w+\)s%\(", msgid):
        return None
    literals = tuple(p for i, p in enumerate(pieces) if i % 2 == 0 and p)
    literal = "".join(p for i, p in enumerate(pieces) if i % 2 == 0)
    if len(literal.strip()) < _RECORDED_MIN_LITERAL or not re.search(r"[A-Za-z]{2}", literal):
        return None
    seen: set[str] = set()
    parts = []
    for i, p in enumerate(pieces):
        if i % 2 == 0:
            parts.append(re.escape(p))
        elif p == "%%":
            parts.append("%")
        else:
            name = p[2:-2]
            parts.append(f"(?P={name})" if name in seen else f"(?P<{name}>.+?)")
            seen.add(name)
    return re.compile("".join(parts), re.S), literals, len(literal)


@cache
def _recorded_patterns(lang: "Language") -> tuple[tuple[re.Pattern, tuple[str, ...], str], ...]:
    """The catalog's messages with parameters as recorded-text patterns, most fixed text first
    (the most specific message wins)."""
    out = []
    catalog = getattr(lang.translations, "_catalog", {})  # GNUTranslations' msgid -> msgstr (no public listing)
    for msgid in catalog:
        if not isinstance(msgid, str) or not msgid or "\x04" in msgid or "%(" not in msgid:
            continue  # plural forms are tuples (msgid, n); pgettext ids carry a context
        compiled = _recorded_pattern(msgid)
        if compiled is not None:
            out.append((compiled[0], compiled[1], msgid, compiled[2]))
    out.sort(key=lambda t: -t[3])
    return tuple((rx, literals, msgid) for rx, literals, msgid, _ in out)


def translate_recorded(text: Any, lang: "Language", *, _depth: int = 0) -> Any:
    """English text recorded in a file (a status.json cause, a parser's warning stored in the
    tables), in ``lang``: a catalog message as such, or the message with parameters whose fixed
    parts, in order, make the whole text (its parameters translated the same way); items
    joined by "; " one by one. Anything else (data, text of an older version) is returned as
    is; a Message is translated directly (report.i18n.translate). Plain text in, plain text out:
    the caller escapes it as the untrusted text it is."""
    if isinstance(text, (Message, MessageList)):
        return str(translate(text, lang))
    if not isinstance(text, str) or not text.strip() or lang.code == DEFAULT_LANGUAGE:
        return text
    exact = lang.gettext(text)
    if exact != text:
        return exact
    for rx, literals, msgid in _recorded_patterns(lang):
        at = 0
        for lit in literals:  # cheap test first: every fixed part, in order
            at = text.find(lit, at)
            if at < 0:
                break
            at += len(lit)
        else:
            m = rx.fullmatch(text)
            if m:
                params = {k: (translate_recorded(v, lang, _depth=_depth + 1) if _depth < _RECORDED_DEPTH else v)
                          for k, v in m.groupdict().items()}
                return lang.gettext(msgid) % params
    where = _RECORDED_WHERE.fullmatch(text)  # "<file>: <sentence>", as the trace caveats name their file
    if where and _depth < _RECORDED_DEPTH:
        said = translate_recorded(where["what"], lang, _depth=_depth + 1)
        if said != where["what"]:
            return f"{where['where']}: {said}"
    if _depth < _RECORDED_DEPTH and "; " in text:
        items = text.split("; ")
        done = [translate_recorded(i, lang, _depth=_depth + 1) for i in items]
        if done != items:
            return lang.pgettext("list separator", "; ").join(done)
    return text


def _exact(value: Decimal):
    """A decimal context keeping every digit of ``value``: babel quantizes in the current context
    (28 digits by default), which raises InvalidOperation on a longer number (a 1e300 GiB peak)."""
    ctx = getcontext().copy()
    ctx.prec = max(ctx.prec, len(value.as_tuple().digits) + 4)
    return localcontext(ctx)


@dataclass(frozen=True)
class Language:
    """One note language: ``code`` ("en", "zh"), its Babel ``locale`` and its ``translations``
    (gettext; English messages for anything the catalog lacks). ``problems``: catalog entries
    dropped at load (a translation whose placeholders differ from its message's)."""

    code: str
    locale: Locale
    translations: gettext.NullTranslations
    problems: tuple[str, ...] = field(default=())

    def gettext(self, message: str) -> str:
        return self.translations.gettext(message)

    def ngettext(self, singular: str, plural: str, n: int) -> str:
        return self.translations.ngettext(singular, plural, n)

    def pgettext(self, context: str, message: str) -> str:
        return self.translations.pgettext(context, message)

    @property
    def html_lang(self) -> str:
        return {"zh": "zh-Hans"}.get(self.code, self.code)

    # ------------------------------------------------------------------ numbers
    def number(self, text: str) -> str:
        """A number already rounded by Python (``f"{x:,.2f}"``, ``f"{x:.3g}"``: digits, one '.',
        ',' groups, leading '-') written with the locale's symbols; the digits never change."""
        value = Decimal(text.replace(",", ""))
        digits = -value.as_tuple().exponent if value.as_tuple().exponent < 0 else 0
        pattern = ("#,##0" if "," in text else "0") + ("." + "0" * digits if digits else "")
        with _exact(value):
            return format_decimal(value, format=pattern, locale=self.locale, decimal_quantization=False)

    def percent(self, x: float, digits: int) -> str:
        """Fraction -> the locale's percent pattern with ``digits`` decimals (Python rounds)."""
        rounded = Decimal(f"{x * 100:.{digits}f}")
        if not rounded:
            rounded = abs(rounded)  # '-0.0%' reads as a sign error
        pattern = re.sub(r"[#,0]+", lambda m: m.group(0) + ("." + "0" * digits if digits else ""),
                         self.locale.percent_formats[None].pattern, count=1)
        with _exact(rounded):
            return format_percent(rounded / 100, format=pattern, locale=self.locale, decimal_quantization=False)

    def date(self, iso: str) -> str:
        """An ISO-8601 timestamp -> the locale's long date and the time in UTC (or as written
        when it has no zone); unparseable text is returned as is."""
        try:
            when = datetime.fromisoformat(iso.replace("Z", "+00:00"))
        except (TypeError, ValueError):
            return iso
        zone = " UTC" if when.utcoffset() is not None and not when.utcoffset() else (
            f" {when.strftime('%z')}" if when.utcoffset() is not None else "")
        return f"{format_date(when, 'long', locale=self.locale)} {format_time(when, 'HH:mm', locale=self.locale)}{zone}"


def catalog_path(code: str) -> Path:
    return LOCALE_DIR / code / "LC_MESSAGES" / f"{DOMAIN}.po"


def available_languages() -> tuple[str, ...]:
    """English plus every language with a catalog under report/locale and a Babel locale."""
    found = sorted(p.parent.parent.name for p in LOCALE_DIR.glob(f"*/LC_MESSAGES/{DOMAIN}.po"))
    return (DEFAULT_LANGUAGE, *(c for c in found if c != DEFAULT_LANGUAGE and c in BABEL_LOCALES))


def placeholders(message: str) -> set[str]:
    return set(_PLACEHOLDER.findall(message))


def _usable(catalog: Catalog) -> tuple[Catalog, list[str]]:
    """The catalog without the entries gettext must not see: untranslated plurals (they would
    print an empty string) and translations whose %(name)s placeholders differ from the
    message's (they would fail at render time); those print in English."""
    problems = []
    for m in list(catalog)[1:]:
        ids = m.id if isinstance(m.id, tuple) else (m.id,)
        strings = m.string if isinstance(m.string, tuple) else (m.string,)
        if not any(strings):
            catalog.delete(m.id, context=m.context)
            continue
        want = set().union(*(placeholders(i) for i in ids))
        if m.pluralizable:  # ngettext always passes %(num)s
            ok = all(placeholders(s) <= want | {"num"} for s in strings if s)
        else:
            ok = all(placeholders(s) == want for s in strings if s)
        if not ok:
            problems.append(f"{catalog.locale}: {ids[0][:60]!r}: placeholders {sorted(want)}, the translation has "
                            f"{sorted(set().union(*(placeholders(s) for s in strings)))}; printed in English")
            catalog.delete(m.id, context=m.context)
    return catalog, problems


@cache
def load_language(code: str = DEFAULT_LANGUAGE) -> Language:
    """The Language for ``code``; raises ConfigError naming the available ones."""
    if code not in available_languages():
        raise ConfigError(f"unknown --lang {code!r}; choose from {', '.join(available_languages())} "
                          "(a new language needs report/locale/<lang>/LC_MESSAGES/messages.po and an entry in "
                          "report.i18n.BABEL_LOCALES)")
    locale = Locale.parse(BABEL_LOCALES[code])
    if code == DEFAULT_LANGUAGE:
        return Language(code=code, locale=locale, translations=gettext.NullTranslations())
    with catalog_path(code).open("rb") as f:
        catalog = read_po(f, locale=locale, domain=DOMAIN)
    catalog, problems = _usable(catalog)
    buf = io.BytesIO()
    write_mo(buf, catalog, use_fuzzy=False)
    buf.seek(0)
    return Language(code=code, locale=locale, translations=gettext.GNUTranslations(buf), problems=tuple(problems))


# ---------------------------------------------------------------------------- maintenance
def extract_template() -> Catalog:
    """Every message of templates/ and the Python of core/, ingest/, runner/ and report/ (the .pot)."""
    from babel.messages.extract import extract_from_dir

    catalog = Catalog(project="tradeoff-runner", domain=DOMAIN, charset="utf-8", fuzzy=False)
    for filename, lineno, message, comments, context in extract_from_dir(
            str(ROOT), method_map=EXTRACT_MAPPING, keywords=EXTRACT_KEYWORDS, strip_comment_tags=True,
            comment_tags=("TRANSLATORS:",)):
        catalog.add(message, None, [(filename, lineno)], auto_comments=comments, context=context)
    return catalog


def init_catalog(code: str) -> Path:
    """Start report/locale/<code>/LC_MESSAGES/messages.po from the current messages (all
    untranslated, so the note prints in English until they are translated). ``code`` must be
    in BABEL_LOCALES. Returns the path; refuses to overwrite."""
    if code not in BABEL_LOCALES:
        raise ConfigError(f"add {code!r} to report.i18n.BABEL_LOCALES (its Babel locale) first")
    path = catalog_path(code)
    if path.exists():
        raise ConfigError(f"{path} exists; use `update`")
    catalog = Catalog(locale=BABEL_LOCALES[code], domain=DOMAIN, project="tradeoff-runner", charset="utf-8",
                      fuzzy=False)
    catalog.update(extract_template(), no_fuzzy_matching=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as f:
        write_po(f, catalog, width=110)
    return path


def update_catalogs() -> list[Path]:
    """Write report/locale/messages.pot and merge it into every language's .po (new messages
    untranslated, vanished ones marked obsolete). Returns the written paths."""
    template = extract_template()
    written = [LOCALE_DIR / f"{DOMAIN}.pot"]
    with written[0].open("wb") as f:
        write_po(f, template, width=110, sort_output=False, omit_header=False)
    for code in available_languages()[1:]:
        path = catalog_path(code)
        with path.open("rb") as f:
            catalog = read_po(f, locale=BABEL_LOCALES.get(code, code), domain=DOMAIN)
        catalog.update(template, no_fuzzy_matching=True)
        with path.open("wb") as f:
            write_po(f, catalog, width=110, ignore_obsolete=True)
        written.append(path)
    return written


def untranslated(code: str) -> list[str]:
    """The messages of the current templates and code that ``code``'s catalog leaves in English."""
    with catalog_path(code).open("rb") as f:
        catalog = read_po(f, locale=BABEL_LOCALES.get(code, code), domain=DOMAIN)
    out = []
    for m in list(extract_template())[1:]:
        have = catalog.get(m.id, context=m.context)
        strings = () if have is None else (have.string if isinstance(have.string, tuple) else (have.string,))
        if have is None or have.fuzzy or not all(strings):
            out.append(m.id[0] if isinstance(m.id, tuple) else m.id)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m report.i18n", description="Maintain the note's message catalogs.")
    parser.add_argument("command", choices=("update", "check", "init"),
                        help="update: re-extract messages.pot and merge it into every .po; "
                             "check: list the messages each catalog leaves in English; "
                             "init LANG: start a new language's .po")
    parser.add_argument("lang", nargs="?", help="init: the new language's code (a key of BABEL_LOCALES)")
    args = parser.parse_args(argv)
    if args.command == "init":
        try:
            print(f"wrote {init_catalog(args.lang or '').relative_to(ROOT)}")
        except ConfigError as e:
            print(f"{parser.prog}: error: {e}", file=sys.stderr)
            return 2
        return 0
    if args.command == "update":
        for path in update_catalogs():
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    status = 0
    for code in available_languages()[1:]:
        missing = untranslated(code)
        problems = load_language(code).problems
        print(f"{code}: {len(missing)} message(s) in English, {len(problems)} bad translation(s)")
        for m in missing:
            print(f"  untranslated: {m[:100]!r}")
        for p in problems:
            print(f"  {p}")
        status |= bool(problems)
    return status


if __name__ == "__main__":
    sys.exit(main())
