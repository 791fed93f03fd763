"""The corpus of real public artifacts (tests/corpus/<group>/: sanitised excerpts, facts written
from reading each file, its source in SOURCES.md) graded as benchmarks/real_logs.py grades it.

The scorecard committed in benchmarks/results/real_logs.json is the floor: a file graded right
there must stay right, and no verdict may get worse (right > partial > silent > wrong)."""
from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import real_logs  # noqa: E402

RANK = {"right": 3, "partial": 2, "silent": 1, "wrong": 0}
COMMITTED = json.loads((ROOT / "benchmarks" / "results" / "real_logs.json").read_text())
GROUPS = sorted(p.parent for p in real_logs.CORPUS.glob("*/facts.toml"))


@pytest.fixture(scope="module")
def graded() -> dict:
    return real_logs.grade(real_logs.load_cases())


def test_every_corpus_file_has_facts_and_a_source():
    for folder in GROUPS:
        facts = tomllib.loads((folder / "facts.toml").read_text())
        names = {p.name for p in folder.glob("*.txt")}
        assert names == set(facts), f"{folder.name}: files without facts {sorted(names - set(facts))}, " \
                                    f"facts without files {sorted(set(facts) - names)}"
        for name, want in facts.items():
            assert want.get("source", "").startswith("http") and want.get("kinds"), f"{folder.name}/{name}"
            assert (folder / name).stat().st_size <= 16 * 1024, f"{folder.name}/{name}: keep excerpts small"


def test_no_file_reads_worse_than_the_committed_scorecard(graded):
    before = {(r["group"], r["file"]): r["verdict"] for r in COMMITTED["files"]}
    worse = [f"{g}/{f}: {before[(g, f)]} -> {r['verdict']} ({'; '.join(r['contradicted'] + r['missing'])})"
             for r in graded["files"] for g, f in [(r["group"], r["file"])]
             if (g, f) in before and RANK[r["verdict"]] < RANK[before[(g, f)]]]
    assert not worse, "\n".join(worse)
    assert graded["right"] >= COMMITTED["right"]


def test_the_pasted_fixtures_read_right_or_partial_never_wrong(graded):
    fixtures = [r for r in graded["files"] if r["group"] == "fixtures"]
    assert len(fixtures) >= 38
    assert not [r["file"] for r in fixtures if r["verdict"] in ("wrong", "silent")]


def test_no_file_reads_as_nothing(graded):
    """No silent loss: every real file gives records or a warning saying what was not read."""
    assert not [f"{r['group']}/{r['file']}" for r in graded["files"] if r["verdict"] == "silent"]
