"""Issue 21: `runner prepare-data` stops cleanly on SIGTERM/SIGINT and leaves no output that looks
complete; the fitted tokenizer cuts huge pre-tokens (the fix of the quadratic fit). Timing against
input size lives in benchmarks/bench_prepare_data.py, not here."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_prepare_data_exits_with_a_clear_line_and_no_output(tmp_path, signum):
    src = tmp_path / "line.txt"
    rng = random.Random(0)  # one 4 MB line without spaces: seconds of tokenizer fitting to interrupt
    src.write_text("".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789", k=4 << 20)), encoding="utf-8")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "prepare-data", str(src), "--out", str(out / "corpus")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            # as from a terminal: a shell's background job inherits SIGINT ignored,
                            # and Python then installs no KeyboardInterrupt handler
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while not (out.is_dir() and any(out.iterdir())) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the staging directory appears once the sources are read, before the fit
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)  # a hang guard, not a timing assertion
    assert proc.returncode == 130, stdout + stderr
    assert stderr.strip() == ("runner: prepare-data interrupted; no output written (PREFIX.bin, .idx, .json and a "
                              "fitted tokenizer are renamed into place only once all are complete)")
    assert sorted(p.name for p in out.iterdir()) == []  # neither outputs nor the staging directory


def test_fitted_tokenizer_cuts_huge_pretokens_and_round_trips():
    from runner.corpus import MAX_PRETOKEN_CHARS, train_tokenizer

    line = "a" * 20_000 + " " * 5_000 + "".join(random.Random(1).choices("xyz0123", k=20_000))
    tok = train_tokenizer([line], vocab_size=400)
    pieces = tok.pre_tokenizer.pre_tokenize_str(line)
    assert max(len(p) for p, _ in pieces) == MAX_PRETOKEN_CHARS
    assert max(len(t) for t in tok.get_vocab()) <= MAX_PRETOKEN_CHARS
    ids = tok.encode(line, add_special_tokens=False).ids
    assert tok.decode(ids) == line
    words = "The gradient all_reduce of rank 3, then    four spaces.\n"  # ordinary text: GPT-2's pieces, uncut
    assert [p for p, _ in tok.pre_tokenizer.pre_tokenize_str(words)] == [
        "The", "Ġgradient", "Ġall", "_", "reduce", "Ġof", "Ġrank", "Ġ3", ",", "Ġthen", "ĠĠĠ", "Ġfour", "Ġspaces", ".", "Ċ"]
