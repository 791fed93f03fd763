"""Suite-wide fixtures and checks.

``--clean-checkout`` (what `make test` passes): the suite must leave the checkout as it found it.
Before the first test and after the last, the untracked files git does not ignore, every file
under the ignored output folders (runs/, notes/, build/, dist/) and the tracked files that differ
from the index (git status) are listed; a path that appeared fails the session, naming it. Tests
write into their tmp_path (or chdir there) instead. (In a tree others edit during the run, their
new files show up too: the check is for a checkout only the suite touches, as in CI.)
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
    """Untracked, not ignored paths and modified tracked ones (git) plus every file under root's
    ignored output folders."""
    found: set[str] = set()
    for argv in (["git", "ls-files", "--others", "--exclude-standard", "-z"], ["git", "diff", "--name-only", "-z"]):
        res = subprocess.run(argv, cwd=root, capture_output=True, timeout=120)
        found |= {p for p in res.stdout.decode(errors="replace").split("\0") if p} if res.returncode == 0 else set()
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


# ---------------------------------------------------------------- campaigns and notes shared by tests
# Built once per session and read by every test that needs them; a test that would change one
# copies it first.

@pytest.fixture(scope="session")
def demo_campaign(tmp_path_factory) -> Path:
    """What `make demo` makes: `runner all` on this CPU machine's default matrix (the real engines
    over gloo, the tiny preset), then `report build` (md, html, pdf) into CAMPAIGN/report."""
    import sys

    out = tmp_path_factory.mktemp("demo") / "camp"
    res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--out", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    res = subprocess.run([sys.executable, "-m", "report.cli", "build", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def example_note(tmp_path_factory):
    """name -> the folder of a committed example's note (note.md, note.html, summary.json,
    figures/), built once per session with report.render.build_report."""
    from report.render import build_report

    built: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in built:
            out = tmp_path_factory.mktemp(f"note-{name}") / "report"
            build_report(ROOT / "examples" / name, out_dir=out, formats=("md", "html"))
            built[name] = out
        return built[name]

    return build
