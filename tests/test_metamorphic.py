"""Every real log (the pasted fixtures and tests/corpus/*) read again as other launchers, terminals,
editors and copies would have handed it over (tests/metamorphic.py) must give the facts its
original gives: the same verdict, the same missing and contradicted facts, the same kinds found and
no more unparsed lines, graded by benchmarks/real_logs.py ``score_file``. A family that legitimately
changes a fact says how (``metamorphic.Change``); interleaving two logs must give the facts of both.

A variant a parser still reads wrongly is listed once in XFAIL, with the reason (strict: the entry
must go when the parser is fixed). The failing ids today: ``pytest tests/test_metamorphic.py --runxfail``.
"""
from __future__ import annotations

import functools
import gzip
import re
import sys
from pathlib import Path

import pytest

from tests import metamorphic as mm

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import real_logs  # noqa: E402

CASES = {path: want for _, path, want in real_logs.load_cases() if want is not None}
_PARTNERS = ("01_nccl_oldfmt_busid_ib_2node.txt", "25_torchtitan_2025_rank0_prefix_gc_profiler.txt",
             "62_oom_msg_torch2.2plus_expandable_segments.txt")
_MERGEABLE = ("kind", "kinds", "transports", "events", "values", "warn", "min_records", "max_unparsed", "env", "source")

# Why a family's variants still fail, diagnosed per family from a sample of its failures (not yet per file).
_INTERLEAVE = "a block this file's parser reads across lines (table, traceback, config dump) is broken by the other log's lines, or a line of the other log is taken into it"
_WRAP116 = "a wrapped line's continuation looks like a record start (rule line, indented row, same head) and is not rejoined"
_WRAP80 = "a wrapped line's continuation looks like a record start (rule line, indented row, same head) and is not rejoined"

# (file name, family) -> why the variant is still read wrongly. Strict: an entry that passes fails.
XFAIL: dict[tuple[str, str], str] = {
    ('006_nanogpt_2023_quoted_timestamps_nan_loss_cut.txt', 'interleave'): _INTERLEAVE,
    ('014_fr_trace_analyzer_verbose_tables.txt', 'interleave'): _INTERLEAVE,
    ('028_nvsmi_q_2019_quoted_gt_prefix.txt', 'interleave'): _INTERLEAVE,
    ('033_profiler_table_2025_rocm_memory_cols_gb.txt', 'wrap116'): _WRAP116,
    ('037_oom_allocator_memory_fraction_summary_table.txt', 'interleave'): _INTERLEAVE,
    ('038_nccl_tests_hash_stripped_k8s_worker_pod_ssh_warning.txt', 'wrap80'): _WRAP80,
    ('038_nsys_2019.5_legacy_qdrep_import_export_stats.txt', 'interleave'): _INTERLEAVE,
    ('046_deepspeed_comms_logger_2022_summary_pr.txt', 'interleave'): _INTERLEAVE,
    ('047_deepspeed_comms_logger_2025_leading_backtick_gb.txt', 'interleave'): _INTERLEAVE,
    ('050_accelerate_env_2024_nested_default_config.txt', 'interleave'): _INTERLEAVE,
    ('050_collect_env_2023_torch2.0.1_h100_userwarning.txt', 'interleave'): _INTERLEAVE,
    ('35_nsys_nvprof_2021_legacy_api_stats.txt', 'interleave'): _INTERLEAVE,
    ('36_flight_recorder_dump_unpickled_v2.5.txt', 'interleave'): _INTERLEAVE,
}


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8", "surrogateescape")


def _kinds(want: dict) -> set[str]:
    return set(want.get("kinds") or [want["kind"]])


def _partner(path: Path, want: dict) -> Path | None:
    """A fixture of other kinds whose facts do not overlap this file's: its lines are interleaved."""
    for name in _PARTNERS:
        other = next((p for p in CASES if p.name == name), None)
        if other is None or other.name == path.name:
            continue
        theirs = CASES[other]
        if _kinds(theirs) & _kinds(want) or set(theirs.get("env", {})) & set(want.get("env", {})):
            continue
        if set(want) - set(_MERGEABLE) and set(theirs) - set(_MERGEABLE):
            continue  # both state a world size or steps: the merged file could not say whose
        return other
    return None


def _merged(want: dict, theirs: dict) -> dict:
    """The facts of two logs interleaved: each fact of both (counts added, lists joined)."""
    out = {k: v for k, v in {**theirs, **want}.items() if k not in ("kind", "kinds", "source")}
    out["kind"] = want.get("kind") or sorted(want["kinds"])[0]
    for key in ("transports", "events", "values", "warn"):
        out[key] = [*want.get(key, []), *theirs.get(key, [])]
    out["min_records"] = {t: want.get("min_records", {}).get(t, 0) + theirs.get("min_records", {}).get(t, 0)
                          for t in {*want.get("min_records", {}), *theirs.get("min_records", {})}}
    out["env"] = {**theirs.get("env", {}), **want.get("env", {})}
    out["max_unparsed"] = want.get("max_unparsed", 0) + theirs.get("max_unparsed", 0)
    return out


def _variant(path: Path, family: str) -> str | None:
    text = _read(path)
    if family == mm.INTERLEAVE:
        other = _partner(path, CASES[path])
        return None if other is None else mm.interleave(text, _read(other))
    return mm.FAMILIES[family][0](text)


def _params():
    out = []
    for path, want in CASES.items():
        for family in mm.FAMILIES:
            if not mm.applies(family, _kinds(want)) or _variant(path, family) is None:
                continue
            marks = ()
            why = XFAIL.get((path.name, family))
            if why:
                marks = (pytest.mark.xfail(reason=why, strict=True),)
            out.append(pytest.param(path, family, id=f"{path.parent.name}/{path.name}-{family}", marks=marks))
    return out


_UNPARSED = re.compile(r"^\d+ unparsed lines, expected at most \d+$")


def _outcome(score: dict, *, interleaved: bool = False) -> dict:
    """What must not change: verdict, kinds found, the facts missing or contradicted (an unparsed
    count over the file's noise as one fact, whatever the count)."""
    facts = sorted("unparsed lines over the noise" if _UNPARSED.match(m) else m
                   for m in score["missing"] + score["contradicted"]
                   # interleaved with another log, a file is no longer of unknown kind as a whole
                   if not (interleaved and (m.startswith("kind") or m == "no records and no warning"
                                            or "unknown kind" in m))
                   )
    out = {"kinds": sorted(score["kinds"]), "facts": facts}
    if not interleaved:
        out["verdict"] = score["verdict"]
    return out


@functools.lru_cache(maxsize=None)
def _original(path: Path) -> dict:
    return real_logs.score_file(path, CASES[path])


def _score(text: str, want: dict, where: Path, *, compress: bool = False) -> dict:
    where.write_bytes(gzip.compress(text.encode("utf-8", "surrogateescape"), mtime=0) if compress
                      else text.encode("utf-8", "surrogateescape"))
    return real_logs.score_file(where, want)


@pytest.mark.parametrize("path, family", _params())
def test_variant_gives_the_facts_of_its_original(path: Path, family: str, tmp_path: Path):
    want = CASES[path]
    text = _variant(path, family)
    if family == mm.INTERLEAVE:
        other = _partner(path, want)
        mine, theirs = _original(path), _original(other)
        got = _score(text, _merged(want, CASES[other]), tmp_path / path.name)
        expect = {"kinds": sorted({*mine["kinds"], *theirs["kinds"]}),
                  "facts": sorted(_outcome(mine, interleaved=True)["facts"] + _outcome(theirs, interleaved=True)["facts"])}
        assert _outcome(got, interleaved=True) == expect
        assert got["unparsed"] <= mine["unparsed"] + theirs["unparsed"]
        return
    change = mm.FAMILIES[family][1]
    if change.reference is None:
        ref = _original(path)
    else:
        ref = _score(change.reference(_read(path)), (change.reference_adjust or dict)(want), tmp_path / f"ref_{path.name}")
    adjusted = change.adjust(want) if change.adjust else want
    name = path.name + (".gz" if family == mm.GZIP else "")
    got = _score(text, adjusted, tmp_path / name, compress=family == mm.GZIP)
    assert _outcome(got) == _outcome(ref)
    assert got["unparsed"] <= ref["unparsed"] + adjusted.get("max_unparsed", 0) - want.get("max_unparsed", 0)
