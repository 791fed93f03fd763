"""`runner --help` and `report --help` answer without importing the heavy libraries (torch,
DeepSpeed, Megatron, pandas, matplotlib): those load inside the commands that use them.
(Start-up time itself is measured, not asserted: see benchmarks/.)"""
from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "deepspeed", "megatron", "pandas", "matplotlib", "weasyprint")


@pytest.mark.parametrize("module, argv", [("runner.cli", ["--help"]), ("runner.cli", ["all", "--help"]),
                                          ("runner.cli", ["plan", "--help"]), ("report.cli", ["--help"]),
                                          ("report.cli", ["build", "--help"])])
def test_help_imports_nothing_heavy(module, argv):
    code = (f"import sys, {module} as m\n"
            f"try:\n    m.build_parser().parse_args({argv!r})\nexcept SystemExit:\n    pass\n"
            f"print(sorted(x for x in {HEAVY!r} if x in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == "[]", res.stdout
