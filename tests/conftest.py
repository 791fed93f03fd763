"""Suite-wide fixtures and checks.

``--clean-checkout`` (what `make test` passes): the suite must leave the checkout as it found it.
Before the first test and after the last, the untracked files git does not ignore, every file
under the ignored output folders (runs/, notes/, build/, dist/) and the tracked files that differ
from the index (git status) are listed; a path that appeared fails the session, naming it. Tests
write into their tmp_path (or chdir there) instead. (In a tree others edit during the run, their
new files show up too: the check is for a checkout only the suite touches, as in CI.)
Caches of the test tools themselves (.hypothesis/, .pytest_cache/, __pycache__/) are not outputs.

Two processes (`make test`: pytest-xdist, ``-n 2``). The tests that launch real engines or runs
(torchrun, `runner all`, a real search or probe, the shared campaigns: ENGINE_MODULES) are one unit
of work, so they run one after another in one worker, as they would alone; each other module is a
unit of its own (its module fixtures built once) and runs in the other worker beside them
(pytest_xdist_make_scheduler). A campaign whose timings are judged (the demo campaign's
trace-vs-recorder check, the planted causes, the faults campaign's straggler) is built inside
``cpu_alone()``: the other worker finishes its current test and starts no other until the campaign
is built. In one process all of this is a no-op.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tempfile
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
    if session.config.getoption("--clean-checkout") and not hasattr(session.config, "workerinput"):
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


# ---------------------------------------------------------------- two processes: what may run beside what

# Modules whose tests launch real engines or runs (torchrun, `runner all`, `runner search`, a probe,
# commbench, gloo process groups) or read a shared campaign: one unit of work for xdist. A module
# that starts doing so belongs here.
ENGINE_MODULES = frozenset({
    "test_attribution", "test_bounded_input", "test_commbench", "test_data_round", "test_e2e_cpu",
    "test_engines_cpu", "test_faults", "test_hang_e2e", "test_megatron_engine", "test_overlap", "test_plants",
    "test_progress", "test_redact", "test_report_health", "test_tp_pp_torch", "test_true_words", "test_recompute",
    "test_zh_sentences",
})
# Modules that read the demo campaign only in the tests of their "demo" parameter (the note
# rendered from it): those tests run with the engines, the module's others in the other worker.
DEMO_PARAM_MODULES = frozenset({"test_layout"})
# Modules that launch real runs but judge no timing and read no shared campaign (a search's trial
# choice, a memory probe's boundary, two nodes' rendezvous, runner ownership and orphans, kernel
# parity, the tuner's memory-limited search, the data preparer's signals): they run beside the
# engine tests in the other worker, pausing like any test there while a timed campaign is built
# (cpu_alone). test_hostile_input: report build and the runner's refusals on synthetic campaigns.
# The session's shared real campaigns (below): only tests of ENGINE_MODULES may read them.
SHARED_CAMPAIGNS = ("demo_campaign", "cpu_planted_campaign")


def is_engine_nodeid(nodeid: str) -> bool:
    """Whether the test ``nodeid`` (path::name[params]) runs in the engines' worker."""
    module = Path(nodeid.split("::", 1)[0]).stem
    return module in ENGINE_MODULES or (module in DEMO_PARAM_MODULES and "[demo]" in nodeid)


def is_engine_test(item: pytest.Item) -> bool:
    return is_engine_nodeid(item.nodeid)


class CpuShare:
    """A readers-writer lock between the xdist workers of one run, on two flock'ed files in
    ``directory``: readers (the tests beside the engines) share the room; a writer (a timed
    campaign being built) has it alone. The turnstile, taken first by both, makes a waiting writer
    stop new readers."""

    def __init__(self, directory: Path):
        self._turnstile = open(directory / "turnstile.lock", "a+b")  # open for the session
        self._room = open(directory / "room.lock", "a+b")

    @contextlib.contextmanager
    def shared(self):
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        fcntl.flock(self._room, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(self._room, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def alone(self):
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._room, fcntl.LOCK_UN)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)


_CPU_SHARE = pytest.StashKey[CpuShare]()
_LOCK_DIR = pytest.StashKey[str]()


def pytest_configure(config):
    worker = getattr(config, "workerinput", None)
    if worker is not None and worker.get("cpu_lock_dir"):
        config.stash[_CPU_SHARE] = CpuShare(Path(worker["cpu_lock_dir"]))
    elif worker is None and config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        config.stash[_LOCK_DIR] = tempfile.mkdtemp(prefix="pytest-cpu-share-")


def pytest_unconfigure(config):
    lock_dir = config.stash.get(_LOCK_DIR, None)
    if lock_dir is not None:
        shutil.rmtree(lock_dir, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist, in the controller: every worker gets the folder of this run's lock files."""
    lock_dir = node.config.stash.get(_LOCK_DIR, None)
    if lock_dir is not None:
        node.workerinput["cpu_lock_dir"] = lock_dir


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist, in the controller: xdist's load-scope scheduling with the engines' tests
    (is_engine_nodeid) as one scope and every other module a scope of its own; whatever --dist
    says. (xdist's own --dist loadgroup does not group under pytest 9.2: it renames items through
    an attribute pytest no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class EngineScopeScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "engines" if is_engine_nodeid(nodeid) else nodeid.split("::", 1)[0]

    return EngineScopeScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    strays = sorted({item.path.name for item in items
                     if not is_engine_test(item) and any(name in item.fixturenames for name in SHARED_CAMPAIGNS)})
    if strays:
        raise pytest.UsageError(f"{', '.join(strays)} read(s) a shared real campaign ({', '.join(SHARED_CAMPAIGNS)}): "
                                "add the module to ENGINE_MODULES in tests/conftest.py")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    share = item.config.stash.get(_CPU_SHARE, None)
    if share is None or is_engine_test(item):
        return (yield)
    with share.shared():
        return (yield)


@pytest.fixture(scope="session")
def cpu_alone(pytestconfig):
    """``with cpu_alone(): ...`` builds a campaign whose timings tests judge with no test of the
    other xdist worker running beside it (a no-op in one process)."""
    share = pytestconfig.stash.get(_CPU_SHARE, None)
    return share.alone if share is not None else contextlib.nullcontext


# ---------------------------------------------------------------- campaigns and notes shared by tests
# Built once per session and read by every test that needs them; a test that would change one
# copies it first.

@pytest.fixture(scope="session")
def demo_campaign(tmp_path_factory, cpu_alone) -> Path:
    """What `make demo` makes: `runner all` on this CPU machine's default matrix (the real engines
    over gloo, the tiny preset), then `report build` (md, html, pdf) into CAMPAIGN/report."""
    import sys

    out = tmp_path_factory.mktemp("demo") / "camp"
    with cpu_alone():  # test_e2e_cpu holds its traces to the recorder's step times within 2%
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


@pytest.fixture(scope="session")
def cpu_planted_campaign(tmp_path_factory, cpu_alone) -> Path:
    """tests/planted_campaign.py's matrix run by `runner all` (the real engines over gloo) into
    ROOT/camp, and its note (`report build --format md`) into ROOT/rep; returns ROOT. Read by
    test_attribution and test_plants."""
    import sys

    from planted_campaign import MATRIX

    root = tmp_path_factory.mktemp("planted")
    (root / "m.toml").write_text(MATRIX)
    with cpu_alone():  # the plants' sizes and the what-if savings are judged against measured costs
        res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--matrix", str(root / "m.toml"), "--out",
                              str(root / "camp")], capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    res = subprocess.run([sys.executable, "-m", "report.cli", "build", str(root / "camp"), "--out", str(root / "rep"),
                          "--format", "md"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return root
