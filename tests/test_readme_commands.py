"""Every CLI command of the README runs as a user types it: exit code and first line checked.

The README's command lines (indented code, starting with ``runner``, ``report`` or ``ingest``;
a trailing ``# comment`` is the user's note, not part of the command) are run from a scratch
working directory that sees the repository's examples/ (a symlink), so the relative paths read
as typed and whatever a command writes by default lands under that directory's runs/, never in
the checkout. A command added to the README without an entry in EXPECTED fails the test: say what
it should print. (`make demo` / `make test` are not run here: minutes of CPU.)
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CLI_MODULES = {"runner": "runner.cli", "report": "report.cli", "ingest": "ingest.cli"}

# command as typed -> (exit code, regex the first line of stdout must match)
EXPECTED: dict[str, tuple[int, str]] = {
    "runner --help": (0, r"usage: runner "),
    "runner all --dry-run": (0, r"campaign \S+: preset \S+, device \S+, global batch \d+ x seq \d+"),
    "runner all --dry-run --gpus 4": (0, r"campaign gpu-4: preset gpt-125m, device cuda, global batch 128 x seq 1024"),
    "runner plan --model llama2-70b --seq 4096 --global-batch 1024 --gpus 64": (0, r"plan: llama2-70b \(69 B params"),
    "runner search --model gpt-125m --gpus 1 --dry-run --out runs/search":
        (0, r"search gpt-125m on 1 x NVIDIA H100 \S+: \d+ candidates, \d+ pruned"),
    "runner status examples/h200-1gpu": (0, r"campaign h200-1gpu in examples/h200-1gpu \(3 runs\)"),
    "report build examples/h200-1gpu --out runs/h200-1gpu-note --format md,html":
        (0, r"wrote runs/h200-1gpu-note/summary\.json"),
    "report diff examples/h200-1gpu examples/h200-2gpu --format md":
        (0, r"wrote runs/diff-h200-1gpu-vs-h200-2gpu/diff\.json"),
}


def readme_commands() -> list[str]:
    commands = []
    for line in README.read_text(encoding="utf-8").splitlines():
        m = re.match(r"^ {4}((?:runner|report|ingest)(?: .*)?)$", line)
        if m:
            commands.append(re.sub(r"\s{2,}#.*$", "", m.group(1)).strip())
    return commands


def test_the_readme_has_commands_and_each_has_an_expectation():
    commands = readme_commands()
    assert len(commands) >= 5
    assert set(commands) == set(EXPECTED), {"not in EXPECTED": sorted(set(commands) - set(EXPECTED)),
                                            "no longer in the README": sorted(set(EXPECTED) - set(commands))}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("readme")
    (work / "examples").symlink_to(ROOT / "examples", target_is_directory=True)
    return work


def _argv(command: str) -> list[str]:
    """The console script the install put beside this interpreter, else `python -m` its module."""
    program, *args = shlex.split(command)
    script = Path(sys.executable).parent / program
    return [str(script), *args] if script.is_file() else [sys.executable, "-m", CLI_MODULES[program], *args]


@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_runs_as_typed(command, workdir):
    code, first_line = EXPECTED[command]
    before = sorted((ROOT / "examples").glob("*/*"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    res = subprocess.run(_argv(command), cwd=workdir, capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == code, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    lines = res.stdout.splitlines()
    assert lines and re.match(first_line, lines[0]), (lines[:1], res.stderr[-500:])
    assert sorted((ROOT / "examples").glob("*/*")) == before  # nothing written into examples/
