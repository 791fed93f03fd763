"""Hunt 33, the runner's bounds: integers past Python's 4,300-digit limit, matrices that expand
without end, corpora larger than memory, outputs that are not ours, stray files in node folders and
secrets in recorded values. Each test plants the hostile input as a real file and runs the real CLI
in a subprocess; the answer is one line and exit 2, never a traceback."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.synthetic_campaign import write_synthetic_campaign
from tests.test_bounded_input import _one_error_line

ROOT = Path(__file__).resolve().parent.parent
BIG = "9" * 5000  # past sys.get_int_max_str_digits() (4,300)


def _runner(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _resumable(camp: Path) -> Path:
    meta = json.loads((camp / "campaign.json").read_text())
    meta["supervision"] = {"run_timeout_s": 60, "stall_timeout_s": 30, "startup_timeout_s": 30}
    (camp / "campaign.json").write_text(json.dumps(meta))
    return camp


# ---- D. integers longer than 4,300 digits

def test_a_5000_digit_integer_in_spec_json_is_one_line(tmp_path):
    camp = _resumable(write_synthetic_campaign(tmp_path / "camp"))
    spec = camp / "ddp" / "spec.json"
    spec.write_text(re.sub(r'"world_size": *\d+', f'"world_size": {BIG}', spec.read_text()))
    assert BIG in spec.read_text()
    for cmd in (["status", str(camp)], ["all", "--resume", str(camp), "--dry-run"]):
        _one_error_line(_runner(*cmd), "ddp/spec.json", "more than 4,300 digits")


def test_a_5000_digit_step_in_a_metrics_row_is_skipped_by_the_progress_tail(tmp_path):
    """The row is counted, not returned (as any malformed row): what `runner status` and the live
    progress line read."""
    from runner.progress import MetricsTail

    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "rank0.jsonl").write_text(
        f'{{"step": 0, "loss": 2.5}}\n{{"step": {BIG}, "loss": 1.0}}\n{{"step": 1, "loss": 2.0}}\n')
    tail = MetricsTail(tmp_path)
    assert [r["step"] for r in tail.poll()] == [0, 1]
    assert tail.num_rows == 3 and tail.num_steps == 2


def test_a_5000_digit_integer_in_the_matrix_is_one_line(tmp_path):
    matrix = tmp_path / "bigint.toml"
    matrix.write_text(f'[campaign]\nname = "b"\npreset = "tiny"\n[fixed]\nsteps = {BIG}\n'
                      '[[runs]]\nname = "a"\nstrategy = "ddp"\nworld_size = 2\n')
    _one_error_line(_runner("all", "--matrix", str(matrix), "--dry-run"), str(matrix), "more than 4,300 digits")


# ---- E. a matrix that expands to millions of runs

def _matrix(path: Path, *, num_runs: int, campaign: str = "") -> Path:
    path.write_text(f'[campaign]\nname = "h"\npreset = "tiny"\n{campaign}\n'
                    + "".join(f'[[runs]]\nname = "r{i}"\nstrategy = "ddp"\n' for i in range(num_runs)))
    return path


@pytest.mark.parametrize("cmd", [["all", "--dry-run", "--gpus", "0"],
                                 ["slurm", "--nodes", "1", "--gpus-per-node", "2", "--dry-run"]])
def test_a_matrix_of_a_billion_runs_is_refused_before_it_is_built(tmp_path, cmd):
    """1 layout x 10^9 repeats: counted, not built (the timeout is the 72 s, 2 GB this guards against)."""
    matrix = _matrix(tmp_path / "rep.toml", num_runs=1, campaign="repeats = 1000000000")
    _one_error_line(_runner(*cmd, "--matrix", str(matrix), timeout=30), str(matrix),
                    "expands to 1,000,000,000 runs (1 [[runs]] x 1 data round(s) x 1,000,000,000 repeat(s))",
                    "more than the 10,000 a campaign may hold")


def test_overlap_twins_count_toward_the_run_limit(tmp_path):
    matrix = _matrix(tmp_path / "twins.toml", num_runs=5001, campaign="overlap_pairs = true")
    _one_error_line(_runner("all", "--dry-run", "--gpus", "0", "--matrix", str(matrix)), str(matrix),
                    "expands to 10,002 runs (overlap twins included)")


def test_capacity_without_a_capacity_table_says_so_before_resolving_runs(tmp_path):
    matrix = _matrix(tmp_path / "rep.toml", num_runs=1, campaign="repeats = 1000000000")
    _one_error_line(_runner("capacity", "--dry-run", "--gpus", "0", "--matrix", str(matrix), timeout=30),
                    str(matrix), "no [capacity] table")


# ---- M. runner collect copies only what a node writes

def _node_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Node 0's campaign (the synthetic one, ddp of 2 ranks) and node 1's folder holding rank 1's files."""
    node0 = write_synthetic_campaign(tmp_path / "node0")
    node1 = tmp_path / "node1"
    for sub in ("metrics", "logs", "extra"):
        (node1 / "ddp" / sub).mkdir(parents=True)
    (node1 / "env_node1.json").write_text('{"schema_version": 1, "node_rank": 1}\n')
    (node0 / "ddp" / "metrics" / "rank1.jsonl").rename(node1 / "ddp" / "metrics" / "rank1.jsonl")
    (node1 / "ddp" / "logs" / "rank1.log").write_text("rank 1\n")
    (node1 / "ddp" / "logs" / "launcher_node1.log").write_text("agent\n")
    (node1 / "ddp" / "status_node1.json").write_text("{}\n")
    return node0, node1


def test_collect_copies_only_the_files_a_node_writes_for_the_runs_ranks(tmp_path):
    node0, node1 = _node_pair(tmp_path)
    (node1 / "ddp" / "extra" / "x.txt").write_text("stray\n")
    (node1 / "ddp" / "logs" / "rank9.log").write_text("no such rank\n")  # ddp has ranks 0 and 1
    (node1 / "ddp" / "logs" / "rank1.log\nrank0.log").write_text("a newline in the name\n")
    (node1 / "ddp" / "metrics" / "rank01.jsonl").write_text("{}\n")
    (node1 / "ddp" / "notes.txt").write_text("stray\n")
    res = _runner("collect", str(node0), str(node1))
    assert res.returncode == 0, res.stderr
    assert "collected 5 file(s)" in res.stdout, res.stdout
    for rel in ("env_node1.json", "ddp/metrics/rank1.jsonl", "ddp/logs/rank1.log", "ddp/logs/launcher_node1.log",
                "ddp/status_node1.json"):
        assert (node0 / rel).read_bytes() == (node1 / rel).read_bytes(), rel
    for rel in ("ddp/extra", "ddp/logs/rank9.log", "ddp/logs/rank1.log\nrank0.log", "ddp/metrics/rank01.jsonl",
                "ddp/notes.txt"):
        assert not (node0 / rel).exists(), rel


def test_collect_refuses_a_hard_link_naming_it(tmp_path):
    node0, node1 = _node_pair(tmp_path)
    outside = tmp_path / "outside.txt"
    outside.write_text("another user's file\n")
    (node1 / "ddp" / "logs" / "rank1.log").unlink()
    os.link(outside, node1 / "ddp" / "logs" / "rank1.log")
    before = sorted(p.relative_to(node0) for p in node0.rglob("*"))
    res = _runner("collect", str(node0), str(node1))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "refusing to merge (nothing was copied)" in res.stderr
    assert f"{node1 / 'ddp' / 'logs' / 'rank1.log'}: a hard link (2 names for one file" in res.stderr
    assert sorted(p.relative_to(node0) for p in node0.rglob("*")) == before


def test_collect_says_a_node_dir_that_is_a_symlink_is_not_followed(tmp_path):
    node0, node1 = _node_pair(tmp_path)
    os.symlink(node1, tmp_path / "nnlink")
    _one_error_line(_runner("collect", str(node0), str(tmp_path / "nnlink")),
                    f"{tmp_path / 'nnlink'}: a symbolic link (to {node1}), not followed")


def test_a_node_file_swapped_for_a_link_after_the_check_is_not_opened(tmp_path):
    """The open itself refuses links (the walk's check happens earlier: a race), at the file and at
    any folder on the way."""
    from core.errors import ConfigError
    from runner.nodes import open_node_file

    node0, node1 = _node_pair(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret\n")
    with open_node_file(node1, Path("ddp/logs/rank1.log")) as f:
        assert f.read() == b"rank 1\n"
    (node1 / "ddp" / "logs" / "rank1.log").unlink()
    os.symlink(secret, node1 / "ddp" / "logs" / "rank1.log")
    with pytest.raises(ConfigError, match="rank1.log: a symbolic link on the way"):
        open_node_file(node1, Path("ddp/logs/rank1.log"))
    (node1 / "ddp" / "metrics").rename(tmp_path / "metrics-elsewhere")
    os.symlink(tmp_path / "metrics-elsewhere", node1 / "ddp" / "metrics")
    with pytest.raises(ConfigError, match="a symbolic link on the way"):
        open_node_file(node1, Path("ddp/metrics/rank1.jsonl"))
    os.mkfifo(node1 / "ddp" / "logs" / "rank0.log")
    with pytest.raises(ConfigError, match="rank0.log: not a regular file"):
        open_node_file(node1, Path("ddp/logs/rank0.log"))


# ---- N. secrets in HTTP shapes and in recorded paths

LOWER_BEARER = "abcdefghijklmnopqrstuvwxyzabcdef"  # all lower case: no value rule alone catches it
PATH_TOKEN = "hf_AbCdEfGhIjKlMnOpQrStUv12"


@pytest.mark.parametrize("text, expected", [
    (f"Authorization: Bearer {LOWER_BEARER}", "Authorization: <redacted>"),
    (f'{{"authorization": "token {LOWER_BEARER}"}}', '{"authorization": "<redacted>"}'),
    (f"curl -H 'Proxy-Authorization: Basic dXNlcjpwYXNz' x", "curl -H 'Proxy-Authorization: <redacted>' x"),
    (f"bearer {LOWER_BEARER}", "bearer <redacted>"),
    ("Basic dXNlcjpwYXNzd29yZA==", "Basic <redacted>"),
    ("https://mirror/x?token=abcdef123456&page=2", "https://mirror/x?token=<redacted>&page=2"),
    ("HF_TOKEN=plainlowercasevalue", "HF_TOKEN=<redacted>"),
    ('--api-key "sekretsekret" password="hunter2hunter"', '--api-key "sekretsekret" password="<redacted>"'),
    ("auth=abcdef", "auth=<redacted>"),
])
def test_http_credential_shapes_are_redacted_and_stay_redacted(text, expected):
    from core.redact import redact_text

    assert redact_text(text) == expected
    assert redact_text(expected) == expected  # read back (ingest redacts again): unchanged


@pytest.mark.parametrize("text", [
    "Basic Configuration", "basic setup of the mirror", "max_token=128", "num_tokens: 500000",
    "tokenizer=gpt2-large", 'eos_token="</s>"', "--auth=none", "Bearer tokens",
])
def test_words_near_credential_shapes_are_kept(text):
    from core.redact import redact_text

    assert redact_text(text) is text


def test_every_recorded_env_value_is_redacted(tmp_path):
    """A credential in an environment value, the launch command and the --out path (disk.path,
    storage[].path) reaches no field of env.json."""
    from core.records import to_dict
    from runner.env import collect_env, collect_env_vars, collect_storage

    out = tmp_path / f"run-{PATH_TOKEN}"
    out.mkdir()
    os.environ["PYTORCH_BASIC"] = f"Authorization: Bearer {LOWER_BEARER}"
    try:
        env = collect_env(launch_command=["runner", "all", "--out", str(out)], data_dir=out)
        env_vars = collect_env_vars()
    finally:
        del os.environ["PYTORCH_BASIC"]
    storage = collect_storage({"campaign": out, "checkpoints": out / "ckpt"})
    text = json.dumps([to_dict(env), env_vars, [to_dict(s) for s in storage]])
    assert PATH_TOKEN not in text and LOWER_BEARER not in text, text
    assert env.disk.path == str(tmp_path / "run-<redacted>") and env_vars["PYTORCH_BASIC"] == "Authorization: <redacted>"
    assert [s.path for s in storage] == [str(tmp_path / "run-<redacted>"), str(tmp_path / "run-<redacted>" / "ckpt")]
    assert env.launch_command[-1] == str(tmp_path / "run-<redacted>")


# ---- G. prepare-data never replaces a file it did not write

def _small_text(tmp_path: Path) -> Path:
    src = tmp_path / "small.txt"
    src.write_text("hello world this is text\nmore text here, and more words for the tokenizer to fit\n" * 20)
    return src


@pytest.mark.parametrize("user_files", [("settings.json", "settings.bin"), ("settings.bin",),
                                        ("settings.tokenizer.json",)])
def test_prepare_data_refuses_a_users_file_at_the_output_paths(tmp_path, user_files):
    src = _small_text(tmp_path)
    (tmp_path / "pd2").mkdir()
    for name in user_files:
        (tmp_path / "pd2" / name).write_text('{"theme": "dark"}\n')
    res = _runner("prepare-data", str(src), "--out", str(tmp_path / "pd2" / "settings"), "--vocab-size", "300")
    first = tmp_path / "pd2" / sorted(user_files, key=lambda n: ("bin", "idx", "json", "tokenizer.json").index(
        n.split(".", 1)[1]))[0]
    _one_error_line(res, f"{first} exists and was not written by `runner prepare-data`", "choose another --out")
    assert sorted(p.name for p in (tmp_path / "pd2").iterdir()) == sorted(user_files)  # no staging left either
    for name in user_files:
        assert (tmp_path / "pd2" / name).read_text() == '{"theme": "dark"}\n'


def test_prepare_data_rewrites_its_own_outputs_but_not_anothers_record(tmp_path):
    src = _small_text(tmp_path)
    out = tmp_path / "pd" / "corpus"
    for _ in range(2):  # the second run replaces the first's outputs
        res = _runner("prepare-data", str(src), "--out", str(out), "--vocab-size", "300")
        assert res.returncode == 0, res.stderr
    other = tmp_path / "pd" / "other"
    for ext in ("bin", "idx", "json"):  # our record, but written for another prefix: not this prefix's
        Path(f"{other}.{ext}").write_bytes(Path(f"{out}.{ext}").read_bytes())
    _one_error_line(_runner("prepare-data", str(src), "--out", str(other), "--vocab-size", "300"),
                    f"{other}.bin exists and was not written by `runner prepare-data`",
                    "no other.json record of ours")
    user_bin = tmp_path / "user.bin"  # our own record beside a .bin that links to a user's file
    user_bin.write_bytes(b"the user's")
    Path(f"{out}.bin").unlink()
    Path(f"{out}.bin").symlink_to(user_bin)
    _one_error_line(_runner("prepare-data", str(src), "--out", str(out), "--vocab-size", "300"),
                    f"{out}.bin exists and was not written by `runner prepare-data` (a symbolic link")
    assert user_bin.read_bytes() == b"the user's"


# ---- F. prepare-data's memory is bounded whatever the corpus size

def test_the_tokenizer_sample_is_bounded_and_spans_every_file(tmp_path):
    from runner.corpus import TOKENIZER_SAMPLE_CHARS, sample_documents

    a, b, c = tmp_path / "a.txt", tmp_path / "b.jsonl", tmp_path / "c.txt"
    a.write_text("alpha " * 2000 + "\n")  # 12,000 bytes
    b.write_text("".join(json.dumps({"text": f"beta {i} " * 20}) + "\n" for i in range(40)))
    c.write_text("gamma " * 1000 + "\n")  # 6,000 bytes
    whole = list(sample_documents([a, b, c]))
    assert "".join(whole).count("alpha") == 2000 and len(whole) == 42  # under the bound: the whole corpus
    sizes = [p.stat().st_size for p in (a, b, c)]
    sample = list(sample_documents([a, b, c], max_chars=3000))
    assert sum(map(len, sample)) <= 3000
    text = "".join(sample)
    for word, size in zip(("alpha", "beta", "gamma"), sizes):  # each file its share by size, from its start
        assert len(word) * text.count(word) <= 3000 * size // sum(sizes) + len(word), word
        assert text.count(word) > 0
    assert TOKENIZER_SAMPLE_CHARS == 4 << 20


def test_pieces_of_a_long_document_encode_as_the_whole(tmp_path):
    """Cut at a space after a non-space, no pre-token spans the cut: the ids are the same."""
    import random

    from runner.corpus import split_for_encoding, train_tokenizer

    rng = random.Random(5)
    words = ["the", "gradient", "all_reduce", "(rank", "3)", "\n", "\t", "   ", "ÄÖü", "1234", "x" * 40, ",", "  \n ",
             "it's", "'ll", "-->"]
    text = "".join(rng.choice(words) + rng.choice(["", " ", "  ", "\n"]) for _ in range(5000))
    assert max(map(len, re.split(r"\s", text))) < 97  # every window of the split has a place to cut
    tok = train_tokenizer([text[:20000]], vocab_size=400)
    pieces = split_for_encoding(text, max_chars=97)
    assert "".join(pieces) == text and len(pieces) > 100 and max(map(len, pieces)) <= 97
    whole = tok.encode(text, add_special_tokens=False).ids
    assert [i for p in pieces for i in tok.encode(p, add_special_tokens=False).ids] == whole
    assert split_for_encoding("x" * 250, max_chars=97) == ["x" * 97, "x" * 97, "x" * 56]  # no space: cut at the end


def test_prepare_data_of_a_7mb_line_holds_its_encoding_a_piece_at_a_time(tmp_path):
    """One 7 MB line (one document) with a given tokenizer: encoded whole it held 1.7 GB; by
    pieces of ENCODE_PIECE_CHARS the process stays under 1 GB (the interpreter, torch and the
    text are ~0.6 GB of it)."""
    import random

    from runner.corpus import train_tokenizer

    rng = random.Random(2)
    words = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9))) for _ in range(5000)]
    train_tokenizer([" ".join(rng.choices(words, k=20000))], vocab_size=400).save(str(tmp_path / "tok.json"))
    src = tmp_path / "line.txt"
    src.write_text(" ".join(rng.choices(words, k=1_100_000)))
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(r.returncode)")
    res = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "runner.cli", "prepare-data", str(src),
                          "--tokenizer", str(tmp_path / "tok.json"), "--vocab-size", "400", "--out",
                          str(tmp_path / "pd" / "line")], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    peak_mib = int(res.stdout.strip().splitlines()[-1]) // 1024
    assert "in 1 documents" in res.stdout and peak_mib < 1000, (peak_mib, res.stdout)


# ---- O. words: the user's paths, not ours

def test_prepare_data_into_a_folder_it_cannot_write_names_the_users_path(tmp_path):
    res = _runner("prepare-data", str(_small_text(tmp_path)), "--out", "/proc/foo")
    line = _one_error_line(res, "--out /proc/foo: cannot write /proc/foo.bin, .idx and .json in /proc")
    assert ".tmp" not in line


@pytest.mark.parametrize("out, shown", [(["--out", "/tmp/p.json"], "/tmp/p.json"),
                                        ([], "runs/plan-<model>-<N>gpu.json")])
def test_an_interrupted_plan_says_what_it_writes(out, shown):
    """`runner plan` writes its JSON (--out): an interrupt says the plan was not written, not that
    the command only reads and prints."""
    from core.argv import parse_args
    from runner.cli import build_parser, interrupted_text

    args = parse_args(build_parser(), ["plan", "--model", "gpt-125m", "--seq", "1024", "--global-batch", "8",
                                       "--gpus", "8", *out])
    text = interrupted_text(args)
    assert "only reads and prints" not in text
    assert text == (f"runner: interrupted; nothing was launched and no plan was written ({shown} is written whole "
                    "at the end: it is absent, or still the earlier plan)")


# ---- O. collect never writes through a link on the campaign side

def test_collect_refuses_a_campaign_folder_that_is_a_symlink_and_copies_nothing(tmp_path):
    """node 0's ddp/logs swapped for a link to a folder outside: the node's logs would land there."""
    import shutil

    node0, node1 = _node_pair(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.rmtree(node0 / "ddp" / "logs", ignore_errors=True)
    os.symlink(outside, node0 / "ddp" / "logs")
    before = sorted(p.relative_to(node0) for p in node0.rglob("*"))
    _one_error_line(_runner("collect", str(node0), str(node1)), "refusing to merge (nothing was copied)",
                    f"{node0 / 'ddp' / 'logs'}: a symbolic link (to {outside}) inside the campaign, not followed")
    assert list(outside.iterdir()) == []
    assert sorted(p.relative_to(node0) for p in node0.rglob("*")) == before  # env_node1.json not copied either


# ---- P. runner capacity's ladder and trial count are bounded before any run is resolved

def _capacity_matrix(path: Path, *, num_runs: int, num_rungs: int) -> Path:
    ladder = ", ".join(f"[{2 + i}, 64]" for i in range(num_rungs))
    return _matrix(path, num_runs=num_runs, campaign=f"[capacity]\nmemory_budget_gib = 0.5\nladder = [{ladder}]\n")


def test_capacity_refuses_a_ladder_longer_than_64_rungs(tmp_path):
    matrix = _capacity_matrix(tmp_path / "long.toml", num_runs=1, num_rungs=3000)
    _one_error_line(_runner("capacity", "--dry-run", "--gpus", "0", "--matrix", str(matrix), timeout=30),
                    f"{matrix} [capacity] ladder: 3,000 rungs, more than the 64 a probe bisects")


def test_capacity_refuses_more_trials_than_a_campaign_holds(tmp_path):
    """5,000 layouts x ceil(log2(10 + 1)) = 4 trials each: 20,000 > MAX_RUNS, refused before resolving."""
    matrix = _capacity_matrix(tmp_path / "wide.toml", num_runs=5000, num_rungs=10)
    _one_error_line(_runner("capacity", "--dry-run", "--gpus", "0", "--matrix", str(matrix), timeout=30),
                    f"{matrix}: 5,000 layouts x ceil(log2(10 + 1)) trials = 20,000 trials, more than the 10,000")


# ---- Q. campaign.json records the --matrix path redacted

def test_campaign_json_redacts_a_token_in_the_matrix_path(tmp_path):
    """campaign.json is written before the first run starts; the campaign is stopped once it is there."""
    import signal
    import time

    token = "sk-proj-QWERTYUIOPASDFGHJKLZXCVBNM1234"
    matrix = tmp_path / "sec3" / f"token={token}.toml"
    matrix.parent.mkdir()
    _matrix(matrix, num_runs=1)
    out = tmp_path / "C"
    proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "all", "--matrix", str(matrix),
                             "--out", str(out)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (out / "campaign.json").is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    text = (out / "campaign.json").read_text()
    assert token not in text, text
    assert json.loads(text)["matrix_path"] == str(tmp_path / "sec3" / "token=<redacted>.toml")
