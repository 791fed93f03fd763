"""Issue 5 on CPU: `runner prepare-data` into a Megatron indexed dataset, the real-text loader's
sample order across layouts (same tokens per global batch, disjoint DP ranks, identical TP
ranks), data rounds and checkpoints in the matrix, bad data input refused before any process
group, and a deliberately starved loader showing up as a data-stall finding in the note.

Real libraries throughout: HF tokenizers, megatron-core's IndexedDataset(Builder), torch's
DataLoader with worker processes, torchrun + gloo for the starved-loader campaign."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import ConfigError
from runner.corpus import EOD_TOKEN, load_tokenizer, validate_dataset
from runner.data import RealBatches, SampleOrder, TokenWindows
from runner.matrix import resolve_matrix

REPO = Path(__file__).resolve().parents[1]
TEXT = ("def add(a, b):\n    return a + b\n\n" * 40, "The quick brown fox jumps over the lazy dog. " * 60,
        "import os\nprint(os.getcwd())\n" * 50)


def _runner(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """txt + jsonl + parquet sources tokenized by `runner prepare-data` (tokenizer fitted here)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("corpus")
    (d / "a.txt").write_text(TEXT[0])
    (d / "b.jsonl").write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(TEXT[1:])) + "\n")
    pq.write_table(pa.table({"text": [TEXT[0][:500], None, TEXT[2][:300]]}), d / "c.parquet")
    res = _runner("prepare-data", str(d / "a.txt"), str(d / "b.jsonl"), str(d / "c.parquet"),
                  "--out", str(d / "out" / "corpus"), "--vocab-size", "400")
    assert res.returncode == 0, res.stderr
    return d / "out" / "corpus"


def test_prepare_data_writes_a_megatron_indexed_dataset_that_decodes_back(corpus):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    record = json.loads(Path(f"{corpus}.json").read_text())
    ds = IndexedDataset(str(corpus))
    assert len(ds) == record["num_documents"] == 1 + 2 + 2  # txt: 1, jsonl: 2 lines, parquet: 2 non-null rows
    assert int(ds.sequence_lengths.sum()) == record["num_tokens"]
    assert record["token_dtype"] == "uint16" and record["tokenizer_trained"] and record["vocab_size"] <= 400
    tok = load_tokenizer(Path(record["tokenizer"]))
    eod = tok.token_to_id(EOD_TOKEN)
    for i, text in enumerate(TEXT[:3]):  # document order: a.txt, then the jsonl lines
        ids = ds[i].tolist()
        assert ids[-1] == eod and eod not in ids[:-1]
        assert tok.decode(ids[:-1]) == text


def test_sample_order_is_the_same_global_batch_for_every_layout_with_disjoint_dp_ranks(corpus):
    """Strategies differ only in (dp_rank, dp_degree) and in how many TP/PP ranks share a DP
    rank: DDP/ZeRO-3 on 2 processes have dp 2, TP=2 x PP=2 on 4 has dp 1 (4 ranks, one loader
    each). Every loader here is a real DataLoader with a worker process."""
    info = validate_dataset(corpus, model_vocab_size=400, seq_length=16)
    windows = TokenWindows(prefix=str(corpus), token_dtype=info.token_dtype, num_tokens=info.num_tokens, seq_length=16)
    gbs, steps = 8, range(6)  # 6 x 8 samples walk past the end of an epoch when the corpus is small
    order = SampleOrder(num_samples=len(windows), global_batch_size=gbs, seed=1234)

    def read(dp_rank: int, dp_degree: int) -> dict[int, tuple[np.ndarray, torch.Tensor]]:
        loader = RealBatches(windows, SampleOrder(num_samples=len(windows), global_batch_size=gbs, seed=1234),
                             dp_rank=dp_rank, dp_degree=dp_degree, steps=steps, num_workers=1, pin_memory=False,
                             prefetch_factor=2, audit_steps=len(steps))
        try:
            out = {s: loader.rows(s, dp_rank=dp_rank, dp_degree=dp_degree) for s in steps}
        finally:
            loader.close()
        return {s: (np.array(loader.consumed[s]["sample_ids"]), t) for s, t in out.items()}

    ddp = [read(r, 2) for r in range(2)]  # DDP / ZeRO-3: 2 DP ranks
    tp_pp = [read(0, 1) for _ in range(4)]  # TP=2 x PP=2: 4 ranks, all DP rank 0 of 1
    for s in steps:
        want = order.global_indices(s)
        glob_ddp = torch.cat([ddp[r][s][1] for r in range(2)])
        assert np.array_equal(np.concatenate([ddp[r][s][0] for r in range(2)]), want)
        assert not set(ddp[0][s][0]) & set(ddp[1][s][0])  # DP ranks see disjoint samples
        for rank in tp_pp:  # identical batches on every TP/PP rank of one DP rank
            assert np.array_equal(rank[s][0], want) and torch.equal(rank[s][1], tp_pp[0][s][1])
        assert torch.equal(glob_ddp, tp_pp[0][s][1])  # the same tokens in the global batch across strategies
        assert torch.equal(glob_ddp, torch.stack([windows.window(int(i)) for i in want]))
    other_seed = SampleOrder(num_samples=len(windows), global_batch_size=gbs, seed=99)
    assert not np.array_equal(other_seed.global_indices(0), order.global_indices(0))


def _matrix(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "m.toml"
    path.write_text('[campaign]\nname = "t"\npreset = "tiny"\n' + body)
    return path


def test_matrix_rounds_expand_each_layout_with_loader_knobs_on_the_real_round():
    raw = {"campaign": {"name": "t", "preset": "tiny"}, "fixed": {"data": ["synthetic", "real"]}, "checkpoint": {},
           "runs": [{"name": "ddp", "strategy": "ddp", "options": {"loader": {"num_workers": 0}}},
                    {"name": "tp", "strategy": "tp_pp", "tp_degree": 2, "pp_degree": 2, "world_size": 4}]}
    camp = resolve_matrix(raw, source="m", num_gpus=0)
    assert [(s.name, s.data_round, s.layout) for s in camp.runs] == [
        ("ddp", "synthetic", "ddp"), ("tp", "synthetic", "tp"), ("ddp-real", "real", "ddp"), ("tp-real", "real", "tp")]
    assert camp.fixed.data == "synthetic+real"
    assert "loader" not in camp.runs[0].options
    assert camp.runs[2].options["loader"] == {"num_workers": 0, "pin_memory": False, "prefetch_factor": 2,
                                              "sample_delay_s": 0.0}
    assert camp.runs[3].options["loader"]["num_workers"] == 1  # CPU default
    assert {s.checkpoint_step for s in camp.runs} == {30 - 2 - 1} and {s.checkpoint_verify_steps for s in camp.runs} == {2}
    bad = dict(raw, fixed={"data": ["real", "real"]}, checkpoint={"step": 29, "bogus": 1},
               runs=[{"name": "ddp", "strategy": "ddp", "options": {"loader": {"num_workers": -1, "x": 1}}},
                     {"name": "ddp-real", "strategy": "ddp"}])
    with pytest.raises(ConfigError) as e:
        resolve_matrix(bad, source="m", num_gpus=0)
    msg = str(e.value)
    assert "data ['real', 'real']" in msg and "unknown key 'bogus'" in msg


def _error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert lines and all(ln.startswith("runner: error: ") for ln in lines), res.stderr  # no traceback
    return res.stderr


@pytest.mark.parametrize("kind", ["empty", "binary"])
def test_prepare_data_refuses_an_empty_corpus_and_a_binary_file_naming_it(tmp_path, kind):
    src = tmp_path / f"{kind}.txt"
    src.write_bytes(b"" if kind == "empty" else bytes(range(256)) * 4)
    err = _error_line(_runner("prepare-data", str(src), "--out", str(tmp_path / "o")))
    assert str(src) in err and ("empty corpus" if kind == "empty" else "binary") in err
    assert not list(tmp_path.glob("o*"))


def test_runner_all_refuses_bad_data_before_any_process_group(corpus, tmp_path):
    """A .idx that does not match its .bin, and a tokenizer larger than the model's vocabulary:
    one error line naming the file, exit 2, no run launched (no campaign directory left)."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copy(f"{corpus}.idx", f"{broken}.idx")
    Path(f"{broken}.bin").write_bytes(Path(f"{corpus}.bin").read_bytes()[:-10])
    run = '[[runs]]\nname = "ddp"\nstrategy = "ddp"\n'
    out = tmp_path / "camp"
    m = _matrix(tmp_path, f'[fixed]\ndata = ["real"]\n[data]\npath = "{broken}"\n{run}')
    err = _error_line(_runner("all", "--matrix", str(m), "--out", str(out)))
    assert f"{broken}.idx: does not match broken.bin" in err and not out.exists()

    # a tokenizer fitted with a 1500-token cap on varied text: more than the tiny model's 1000 ...
    src = tmp_path / "big.txt"
    src.write_text(" ".join(f"word{i} token{i * 7} x{i * 13}" for i in range(3000)))
    res = _runner("prepare-data", str(src), "--out", str(tmp_path / "big"), "--vocab-size", "1500")
    assert res.returncode == 0, res.stderr
    tok = json.loads((tmp_path / "big.json").read_text())["tokenizer"]
    assert load_tokenizer(Path(tok)).get_vocab_size() > 1000
    # ... refused as the campaign's tokenizer: named, before anything runs
    m = _matrix(tmp_path, f'[fixed]\ndata = ["synthetic", "real"]\n[data]\nsources = ["{src}"]\ntokenizer = "{tok}"\n{run}')
    err = _error_line(_runner("all", "--matrix", str(m), "--out", str(out)))
    assert f"{tok}: tokenizer vocabulary" in err and "> the model's vocab_size 1000" in err and not out.exists()
    # a prepared dataset tokenized with the larger vocabulary: its .bin is named
    m = _matrix(tmp_path, f'[fixed]\ndata = ["real"]\n[data]\npath = "{tmp_path / "big"}"\n{run}')
    err = _error_line(_runner("all", "--matrix", str(m), "--out", str(out)))
    assert f"{tmp_path / 'big'}.bin: token id" in err and not out.exists()


def test_starved_loader_is_a_data_stall_finding_with_its_share(tmp_path):
    """num_workers = 0 and a per-sample delay: the prefetch thread loads each step's 8 rows
    itself at 40 ms a row (320 ms a step), longer than a tiny DDP step, so the step waits."""
    m = _matrix(tmp_path, '[fixed]\ndata = ["real"]\nsteps = 12\nwarmup_steps = 2\nprofile_num_steps = 0\n'
                '[[runs]]\nname = "ddp"\nstrategy = "ddp"\nworld_size = 2\n'
                '[runs.options.loader]\nnum_workers = 0\nsample_delay_s = 0.04\n')
    out = tmp_path / "camp"
    res = _runner("all", "--matrix", str(m), "--out", str(out), timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [json.loads(ln) for p in (out / "ddp-real" / "metrics").glob("rank*.jsonl") for ln in p.read_text().splitlines()]
    slowest = [max(r["data_wait_s"] for r in rows if r["step"] == s) for s in range(2, 12)]
    assert min(slowest) > 0.05 and float(np.median(slowest)) > 0.1  # measured, most of a 320 ms load per step
    res = subprocess.run([sys.executable, "-m", "report.cli", "build", str(out), "--format", "md"],
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr
    md = (out / "report" / "note.md").read_text()
    conclusion = md.split("## 6. Conclusion", 1)[1]
    line = next(ln for ln in conclusion.splitlines() if ln.startswith("- Data stall in **ddp-real**"))
    share = float(line.split("waited for its batch ", 1)[1].split("%", 1)[0]) / 100
    per_step = {}
    for r in rows:
        if r["step"] >= 2:
            prev = per_step.get(r["step"], (0.0, 0.0))
            per_step[r["step"]] = (max(prev[0], r["data_wait_s"]), max(prev[1], r["step_time_s"]))
    want = sum(w for w, _ in per_step.values()) / sum(t for _, t in per_step.values())
    assert share == pytest.approx(want, abs=0.0006) and share > 0.05
    assert "sample_delay_s=0.04" in md  # the knob is shown in the note
    summary = json.loads((out / "report" / "summary.json").read_text())
    assert any(f["kind"] == "data_stall" and f["runs"] == ["ddp-real"] for f in summary["findings"])


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="Megatron's schedules need CUDA")


@needs_cuda
def test_gpu_checkpoint_restore_for_the_three_default_engines(tmp_path):
    """On a GPU: DDP (DCP), ZeRO-3 (DeepSpeed) and Megatron TP1xPP1 (dist_checkpointing), bf16, real
    round: every restore replays the next steps' losses within the bf16 tolerance."""
    m = _matrix(tmp_path, 'world_size = 1\n[fixed]\ndata = ["real"]\ndtype = "bf16"\nsteps = 12\nwarmup_steps = 2\n'
                'profile_num_steps = 0\n[checkpoint]\n'
                '[[runs]]\nname = "ddp"\nstrategy = "ddp"\n[[runs]]\nname = "zero3"\nstrategy = "zero3"\n'
                '[[runs]]\nname = "mcore"\nstrategy = "tp_pp"\nengine = "megatron"\n')
    out = tmp_path / "camp"
    res = _runner("all", "--matrix", str(m), "--out", str(out), timeout=1200)
    assert res.returncode == 0, res.stdout + res.stderr
    formats = {"ddp-real": "torch.distributed.checkpoint", "zero3-real": "deepspeed",
               "mcore-real": "megatron.dist_checkpointing"}
    for run, fmt in formats.items():
        assert json.loads((out / run / "status.json").read_text())["status"] == "ok", run
        record = json.loads((out / run / "checkpoint.json").read_text())
        assert record["format"] == fmt and record["ok"] is True, record
        assert record["bytes_written"] > 0 and record["save_s"] > 0 and record["load_s"] > 0


def test_data_wait_share_and_round_rules():
    """report.data_rounds on hand-made rows: the share is total wait / total step time over the
    measured steps (slowest rank per step); a layout is data-bound on a large wait share or on a
    slowdown beyond both the threshold and the step-time noise."""
    import pandas as pd

    from report.data_rounds import DATA_THRESHOLDS, RoundRow, compute_data_wait_share, rule_data_bound

    steps = pd.DataFrame([
        {"run": "a", "rank": r, "step": s, "step_time_s": 1.0 + r, "data_wait_s": 0.1 * r, "profiled": s == 3}
        for r in (0, 1) for s in range(5)])
    share = compute_data_wait_share(steps, warmup_steps=1).set_index("run").loc["a"]
    assert share["num_steps"] == 3  # steps 1, 2, 4 (0 is warm-up, 3 profiled)
    assert share["data_wait_share"] == pytest.approx(0.1 / 2.0)

    def row(delta, noise, wait):
        return RoundRow(layout="l", strategy="ddp", engine="torch-ddp", synthetic_run="l", real_run="l-real",
                        synthetic_data_wait_median_s=0.0, real_data_wait_median_s=0.0, synthetic_data_wait_share=0.0,
                        real_data_wait_share=wait, synthetic_tokens_per_s=100.0, real_tokens_per_s=100 * (1 + delta),
                        tokens_per_s_delta=delta, synthetic_mfu=None, real_mfu=None, mfu_delta_points=None,
                        noise=noise, loader=None)

    kinds = [f.kind for f in rule_data_bound([row(-0.2, 0.05, 0.01), row(-0.2, 0.3, 0.01), row(0.0, 0.01, 0.2),
                                              row(-0.02, 0.0, 0.0)], DATA_THRESHOLDS)]
    assert kinds == ["data_bound", "data_not_bound", "data_bound", "data_not_bound"]
