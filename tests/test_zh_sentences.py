"""The Chinese note holds no English sentence: every sentence the note prints, from the templates,
report, ingest (the triage, the parsers' warnings) and the runner's recorded causes, comes from the
catalogue and is translated (issue 32, item 4).

Rendered in zh (Markdown and HTML): the demo campaign (`make demo`), every committed example
under examples/ (examples/h200-nccl-hang is a campaign with a hang: its triage section) and the
triage note of a folder of real failure logs (tests/fixtures/real, the logs path). What is
English by nature is taken out first: code spans and preformatted blocks, tags, URLs,
identifiers (digits, ``_``, ``/``, ``.``, ``=``, camelCase, ACRONYMS), run, job, file and host
names, the kernel settings' names, the log lines the triage quotes (data: printed as the tool
wrote them) and the technical terms of TECH_TERMS (kept in English in the zh catalogue). A run
of MIN_WORDS or more English words that is left is a sentence the catalogue lacks or does not
translate.
"""
from __future__ import annotations

import html as htmlmod
import json
import re
import shutil
from pathlib import Path

import pytest

from report.render import LogsNote, load_note, render_html, render_logs, render_markdown
from runner.kernels import ATTENTION, COMPILE_SCOPES, KERNEL_MODES, LOSSES

ROOT = Path(__file__).resolve().parent.parent
REAL = Path(__file__).parent / "fixtures" / "real"
EXAMPLES = tuple(sorted(p.name for p in (ROOT / "examples").iterdir() if (p / "campaign.json").is_file()))
# real failure logs of several jobs: torchrun failures, NCCL errors, watchdog timeouts, a
# flight-recorder dump, py-spy stacks, OOMs, a truncated file (the parsers' warnings)
TRIAGE_LOGS = ("14_nccl_socket_error_unwind_abort_watchdog.txt", "36_flight_recorder_dump_unpickled_v2.5.txt",
               "38_pyspy_dump_zero3_allgather_hang.txt", "51_torchrun_childfailed_multi_failures_sigabrt.txt",
               "53_torchrun_childfailed_sigkill_py311_carets.txt", "54_watchdog_2022_legacy_no_numel.txt",
               "56_watchdog_2025_lineno_and_rank_prefix.txt", "58_watchdog_fr_dump_trigger_torchx_glog_prefix.txt",
               "60_oom_msg_torch2.0_style_then_app_output.txt", "62_oom_msg_torch2.2plus_expandable_segments.txt",
               "31_chrome_trace_nccl_profiler_plugin_v1.json.txt", "15_nccl_ras_client_mismatch_2.26.txt")
MIN_WORDS = 4
# Terms of the trade the zh catalogue keeps in English (lower case; a hyphenated term is one word)
TECH_TERMS = frozenset({"rank", "ranks", "torch", "torchrun", "eager", "watchdog", "py-spy", "flight", "recorder",
                        "flight-recorder", "all-reduce", "all-gather", "reduce-scatter", "megatron", "deepspeed"})
_WORD = re.compile(r"[A-Za-z]+(?:[-'’][A-Za-z]+)*")
_EDGE = "()[]{}.,;:!?\"'“”‘’*_#>«»…"


def _is_english_word(token: str, names: frozenset[str]) -> bool:
    core = token.strip(_EDGE)
    return (_WORD.fullmatch(core) is not None and core.lower() not in TECH_TERMS and core not in names
            and not (core.isupper() and len(core) > 1) and re.search(r"[a-z][A-Z]", core) is None)


def english_runs(text: str, *, html: bool, names: frozenset[str] = frozenset(),
                 quotes: frozenset[str] = frozenset()) -> list[str]:
    """The runs of MIN_WORDS+ consecutive English words of a rendered note, after taking out
    quoted data (``quotes``: exact strings, longest first), code, markup, URLs, identifiers,
    ``names`` (exact words) and TECH_TERMS. A table cell, a tag or a non-word ends a run."""
    for q in sorted((q for q in quotes if q), key=len, reverse=True):
        text = text.replace(q, " \x00 ")
        if html:
            text = text.replace(htmlmod.escape(q, quote=False), " \x00 ").replace(htmlmod.escape(q), " \x00 ")
    if html:
        text = re.sub(r"<(code|pre|script|style|svg)\b.*?</\1\s*>", " \x00 ", text, flags=re.S | re.I)
        text = re.sub(r"<[^>]*>", " \x00 ", text)
        text = htmlmod.unescape(text)
    text = re.sub(r"```.*?```", " \x00 ", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", " \x00 ", text)
    text = re.sub(r"\\(.)", r"\1", text)  # Markdown escapes
    text = re.sub(r"(https?://|www\.)\S+", " \x00 ", text)
    text = re.sub(r"[\u2e80-\uffff]+", " \x00 ", text)  # CJK text and full-width punctuation end a run
    out = []
    for line in text.splitlines():
        for cell in line.split("|"):
            run: list[str] = []
            for token in [*cell.split(), ""]:
                if token and _is_english_word(token, names):
                    run.append(token.strip(_EDGE))
                    continue
                if len(run) >= MIN_WORDS:
                    out.append(" ".join(run))
                run = []
    return out


def _names(note) -> frozenset[str]:
    """Run names and the kernel settings' names of a campaign note (data, not words)."""
    words = {*KERNEL_MODES, *LOSSES, *COMPILE_SCOPES, ATTENTION}
    for r in getattr(note, "runs", ()) or ():
        words |= {str(getattr(r, a, "") or "") for a in ("name", "run", "strategy", "engine")}
    for p in getattr(note, "parity", ()) or ():
        words |= {str(p.run), str(p.mode)}
    return frozenset(w for w in words if w)


def _triage_quotes(note) -> tuple[frozenset[str], frozenset[str]]:
    """(names, quotes) of a note's triage: job, file and host names; the log lines it quotes."""
    names, quotes = set(), set()
    triage = getattr(note, "triage", None)
    for j in getattr(triage, "jobs", ()) or ():
        names.add(j.name)
        quotes |= {j.name, *(Path(s).name for s in j.sources)}
        for e in (*j.chain, *([j.first_failure] if j.first_failure else [])):
            quotes |= {e.detail, e.source}
            names |= {e.host or ""}
    for f in getattr(note, "files", ()) or ():
        quotes.add(f.name)
    return frozenset(n for n in names if n), frozenset(q for q in quotes if q)


def _zh_texts(note) -> dict[str, str]:
    if isinstance(note, LogsNote):
        return {"md": render_logs(note, html=False, lang="zh"), "html": render_logs(note, html=True, lang="zh")}
    return {"md": render_markdown(note, lang="zh"), "html": render_html(note, lang="zh")}


def _untranslated(note) -> dict[str, list[str]]:
    names, quotes = _triage_quotes(note)
    names |= _names(note)
    return {fmt: runs for fmt, text in _zh_texts(note).items()
            if (runs := english_runs(text, html=fmt == "html", names=names, quotes=quotes))}


# ------------------------------------------------------------------ the check itself
def test_the_check_finds_an_english_sentence_and_passes_what_is_english_by_nature():
    zh = "运行 ddp 完成：{}。"
    assert english_runs(zh.format("the run had ended before the dump"), html=False) == [
        "the run had ended before the dump"]
    assert english_runs("<p>结果：<b>no step</b> row for 60 s</p>", html=True) == []  # a tag ends the run
    assert english_runs("<p>原因：the process that never entered it</p>", html=True) == ["the process that never entered it"]
    for fine in ("`runner all --resume camp --kill-orphans` 之后", "见 https://pytorch.org/docs/stable/distributed.html",
                 "rank 0 all-reduce torch eager watchdog", "ZeRO-3 TP PP NCCL_IB_DISABLE fsdp2 tp_pp nn.Module",
                 "| parity | liger-cross-entropy | sdpa-causal | adamw-fused | per-block |",
                 "<pre>Traceback (most recent call last): raise RuntimeError</pre>"):
        assert english_runs(fine, html=fine.startswith("<")) == [], fine
    assert english_runs("rank 3: the file may be cut there", html=False, quotes=frozenset({"the file may be cut there"})) == []
    assert english_runs("host clean data delay extra", html=False, names=frozenset({"clean", "data", "delay", "extra"})) == []


# ------------------------------------------------------------------ the notes
@pytest.mark.parametrize("name", EXAMPLES)
def test_a_committed_examples_zh_note_has_no_english_sentence(name):
    _, _, note = load_note(ROOT / "examples" / name)
    assert _untranslated(note) == {}


def test_the_zh_triage_note_of_real_failure_logs_has_no_english_sentence(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    for f in TRIAGE_LOGS:
        shutil.copy(REAL / f, logs / f)
    _, _, note = load_note(logs)
    assert isinstance(note, LogsNote) and len(note.triage.failed_jobs) >= 6  # the logs path, failures found
    assert _untranslated(note) == {}


def test_the_demo_campaigns_zh_note_has_no_english_sentence(demo_campaign):
    _, _, note = load_note(demo_campaign)
    assert _untranslated(note) == {}


# ------------------------------------------------------------------ English recorded in files
def test_recorded_english_prints_translated_and_data_stays_as_recorded():
    """translate_recorded: the catalogue message a recorded text was built from, found by its fixed
    parts, in Chinese with its parameters (themselves translated where they are messages)."""
    from report.i18n import load_language, translate_recorded

    zh = load_language("zh")
    status = json.loads((ROOT / "examples" / "h200-nccl-hang" / "ddp-gpu-hang" / "status.json").read_text())
    assert status["cause"] == ("no step row for 60 s; collective #125 (nccl:all_reduce) scheduled on every rank: it was "
                               "enqueued but never finished (a stuck kernel or peer)")  # as the runner recorded it
    assert translate_recorded(status["cause"], zh) == (
        "60 秒没有新的步记录；集合通信 #125（nccl:all_reduce）在每个 rank 上的状态都是 scheduled：已入队但从未完成（卡住的 kernel 或对端）")
    # a parser's warning as the tables store it, and one a trace caveat prefixes with its file
    line = "line 14: the last line leaves a record, block or bracket open: the file may be cut (truncated) there"
    assert translate_recorded(line, zh) == "第 14 行：最后一行留下了未结束的记录、块或括号：文件可能在此处被截断"
    assert translate_recorded(f"ddp/trace/rank0.json: {line}", zh).startswith("ddp/trace/rank0.json: 第 14 行：")
    # items joined by "; ", each translated
    assert translate_recorded("no stack; process state not recorded", zh) == "无调用栈；未记录进程状态"
    # data and text no message makes print as recorded; English is never touched
    for text in ("RuntimeError: injected fault: crash on rank 0 at step 3", "ddp-gpu-hang", "", "42"):
        assert translate_recorded(text, zh) == text
    assert translate_recorded(line, load_language("en")) == line


def test_every_message_recorded_text_can_come_from_is_found_again():
    """For each catalogue message with parameters that translate_recorded matches, the English text
    it makes (placeholder values that are no message) is matched back to that message, not to
    another whose fixed parts it also holds."""
    from report.i18n import _recorded_pattern, load_language, translate_recorded

    zh = load_language("zh")
    checked, wrong = 0, []
    for msgid in zh.translations._catalog:
        if not isinstance(msgid, str) or "\x04" in msgid or "%(" not in msgid or _recorded_pattern(msgid) is None:
            continue
        params = {k: f"v{i}x" for i, k in enumerate(dict.fromkeys(re.findall(r"%\((\w+)\)s", msgid)))}
        checked += 1
        if translate_recorded(msgid % params, zh) != zh.gettext(msgid) % params:
            wrong.append(msgid)
    assert checked > 100 and wrong == []
