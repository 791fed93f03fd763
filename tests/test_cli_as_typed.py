"""The command line as a user types it: a mistake in a subcommand prints that subcommand's usage,
errors and dry runs answer before the heavy libraries load, collecting nothing is an error, a
missing input is named as missing, and a committed example's note is not written into the tree.
(The time these take is measured in benchmarks/bench_cli_startup.py, not asserted here.)"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "numpy", "pandas", "pyarrow", "matplotlib", "deepspeed", "megatron")

# each answers with an error or a dry run; none may need a heavy library to do so
QUICK = [
    ["runner", "all", "--matrix", "nope.toml", "--dry-run"],
    ["runner", "all", "--dry-run", "--gpus", "0"],
    ["runner", "all", "--dry-run", "--gpus", "2"],
    ["runner", "status", "nope"],
    ["runner", "collect", "nope", "nope2"],
    ["runner", "plan", "--gpus", "0"],
    ["ingest", "MISSING.log"],
    ["report", "build", "nope"],
    ["report", "diff", "nope", "nope2"],
]

PROBE = """
import contextlib, importlib, io, json, sys
out = []
for argv in json.loads(sys.argv[1]):
    main = importlib.import_module(argv[0] + ".cli").main
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(argv[1:])
    out.append([argv, code, sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules), err.getvalue()])
print(json.dumps(out))
"""


def test_errors_and_dry_runs_load_no_heavy_library(tmp_path):
    res = subprocess.run([sys.executable, "-c", PROBE, json.dumps(QUICK), json.dumps(HEAVY)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads(res.stdout.splitlines()[-1])
    for argv, code, heavy, err in results:  # in order: the first command that loads one is named
        assert heavy == [], (argv, heavy)
        expected = 0 if "--dry-run" in argv and "nope.toml" not in argv else 2
        assert code == expected, (argv, code, err)
    assert "nope.toml: matrix file not found" in results[0][3]


@pytest.mark.parametrize("program, argv, usage", [
    ("runner", ["all", "--dry-rn"], "usage: runner all "),
    ("runner", ["plan", "--gpus", "2", "--bogus"], "usage: runner plan "),
    ("report", ["build", "x", "--formt", "md"], "usage: report build "),
])
def test_a_subcommands_mistake_prints_its_usage(program, argv, usage, capsys):
    from report.cli import main as report_main
    from runner.cli import main as runner_main

    with pytest.raises(SystemExit) as e:
        {"runner": runner_main, "report": report_main}[program](argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(usage), err
    assert f"{program} {argv[0]}: error: unrecognized arguments: {argv[-2] if argv[-1] == 'md' else argv[-1]}" in err


def test_collecting_nothing_is_an_error(tmp_path, capsys):
    from runner.cli import main

    campaign, node = tmp_path / "node0", tmp_path / "node1"
    campaign.mkdir()
    node.mkdir()
    (campaign / "campaign.json").write_text(json.dumps({"runs": ["ddp"]}))
    (node / "env_node1.json").write_text("{}")
    assert main(["collect", str(campaign), str(node)]) == 0  # its env_node1.json is copied
    assert (campaign / "env_node1.json").is_file()
    capsys.readouterr()
    assert main(["collect", str(campaign), str(node)]) == 2  # nothing left to copy
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("runner: error: collected nothing: "), err


def test_a_missing_log_is_named_as_missing(tmp_path, capsys):
    from ingest.cli import main

    assert main([str(tmp_path / "MISSING.log")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"ingest: error: {tmp_path / 'MISSING.log'}: no such file or directory; pass a campaign directory "
                   "written by `runner all`, or log files / folders"]


def test_a_committed_examples_note_goes_under_runs_not_into_the_tree(tmp_path):
    from report.render import default_note_out

    assert default_note_out(ROOT / "examples" / "h200-2gpu") == Path("runs") / "h200-2gpu" / "report"
    assert default_note_out(ROOT / "runs" / "demo") == ROOT / "runs" / "demo" / "report"  # ignored runs/: as before
    assert default_note_out(tmp_path / "camp") == tmp_path / "camp" / "report"
