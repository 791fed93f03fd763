"""Suite-wide fixtures and checks.

``--clean-checkout`` (what `make test` passes): the suite must leave the checkout as it found it.
Before the first test and after the last, the untracked files git does not ignore and every file
under the ignored output folders (runs/, notes/, build/, dist/) are listed; a path that appeared
fails the session, naming it. Tests write into their tmp_path (or chdir there) instead.
Caches of the test tools themselves (.hypothesis/, .pytest_cache/, __pycache__/) are not outputs.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_DIRS = ("runs", "notes", "build", "dist")


def pytest_addoption(parser):
    parser.addoption("--clean-checkout", action="store_true",
                     help="fail the session if the tests left a new file in the checkout (untracked or under runs/)")


def list_checkout_outputs(root: Path) -> set[str]:
    """Untracked, not ignored paths (git) plus every file under root's ignored output folders."""
    res = subprocess.run(["git", "ls-files", "--others", "--exclude-standard", "-z"], cwd=root, capture_output=True,
                         timeout=120)
    found = {p for p in res.stdout.decode(errors="replace").split("\0") if p} if res.returncode == 0 else set()
    for name in OUTPUT_DIRS:
        for top, _, files in os.walk(root / name):
            found.update((Path(top) / f).relative_to(root).as_posix() for f in files)
    return found


def pytest_sessionstart(session):
    if session.config.getoption("--clean-checkout"):
        session.config.stash[_BEFORE] = list_checkout_outputs(ROOT)


def pytest_sessionfinish(session, exitstatus):
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    left = sorted(list_checkout_outputs(ROOT) - before)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"--clean-checkout: the suite left {len(left)} new file(s) in the checkout:", red=True)
            for path in left[:50]:
                reporter.write_line(f"  {path}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_BEFORE = pytest.StashKey[set]()
