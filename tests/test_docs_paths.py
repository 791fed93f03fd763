"""Every repository path the README and docs/ name exists (after a move, the docs follow).

A path is a word starting with one of the repository's top-level folders and a slash
(``report/view.py``, ``examples/matrices/``) or a root file (``hardware.toml``). Placeholders
(``examples/<name>``, ``tests/corpus/<group>/``) and names inside a campaign directory that
`report build` writes (``report/note.pdf``) are not repository paths.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("core", "runner", "ingest", "report", "templates", "examples", "tests", "benchmarks", "docs")
PATH = re.compile(r"(?<![\w./<>~$-])((?:%s)/[\w.@/-]*|hardware\.toml|pyproject\.toml|Makefile)(?![\w<*{/])" % "|".join(TOP))
CAMPAIGN_OUTPUTS = ("report/note", "report/summary.json")  # under runs/<campaign>/, written by `report build`


def named_paths(text: str) -> set[str]:
    """The repository paths a Markdown text names (trailing punctuation dropped)."""
    found = {m.group(1).rstrip(".,:;") for m in PATH.finditer(text)}
    return {p for p in found if not p.startswith(CAMPAIGN_OUTPUTS)}


def test_the_pattern_finds_paths_and_placeholders_are_not_paths():
    text = ("see `report/view.py`, examples/<name> and (tests/corpus/<group>/), runs/x/report/note.pdf; "
            "the root's hardware.toml. ~/core/x and $HOME/tests/y are not ours")
    assert named_paths(text) == {"report/view.py", "hardware.toml"}


def test_every_path_the_docs_name_exists():
    missing, count = [], 0
    for doc in DOCS:
        paths = named_paths(doc.read_text(encoding="utf-8"))
        count += len(paths)
        missing += [f"{doc.relative_to(ROOT)}: {p}" for p in sorted(paths) if not (ROOT / p).exists()]
    assert count >= 40, count  # the docs name dozens of paths: a pattern that finds few is broken
    assert not missing, "paths named in the docs that the repository lacks:\n" + "\n".join(missing)
