"""Secrets by value (issue 33, item 5): core.redact's rule on credentials and on the ordinary
values it must keep, and a real CPU run (tiny preset, world 1) with credentials planted in
variables the environment record keeps by prefix: none reaches any file of the campaign, the
note, summary.json or the ingested tables; an old campaign's env.json is redacted when read."""
from __future__ import annotations

import json
import os
import random
import secrets
import string
import subprocess
import sys
from pathlib import Path

import pytest

from core.redact import REDACTED, redact_text, redact_value

HF = "hf_" + "Qw3rTy7UiOp9AsDfGh2JkLzXcVbNm4Ab1C"
AWS_ID = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
GH = "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5"
PLANTED = {
    "TORCH_HUB_URL": f"https://u:{HF}@hub.example.com/models",
    "NCCL_IB_HCA": HF,
    "TORCH_AWS_HINT": f"{AWS_ID}:{AWS_SECRET}",  # kept by its TORCH_ prefix; not a secret by its name
    "CUDA_CACHE_NOTE": f"token {GH} for the mirror",
}
SECRETS = (HF, AWS_ID, AWS_SECRET, GH)


@pytest.mark.parametrize("text, expected", [
    (f"https://u:{HF}@host/x", "https://<redacted>@host/x"),
    ("https://user:pa55w0rd@pypi.example.com/simple", "https://<redacted>@pypi.example.com/simple"),
    (HF, REDACTED),
    (f"mlx5_0:1,{HF}", f"mlx5_0:1,{REDACTED}"),
    (AWS_ID, REDACTED),
    (f"key={AWS_SECRET}", f"key={REDACTED}"),
    (GH, REDACTED),
    ("sk-proj-" + "Zx8Cv7Bn6Mq5Wr4Te3Yu2Io1Pa9Sd8Fg", REDACTED),
    ("xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", REDACTED),
    ("Bearer Zx8Cv7Bn6Mq5Wr4Te3Yu2Io1Pa9Sd8FgHjKl", f"Bearer {REDACTED}"),
])
def test_credentials_are_redacted(text, expected):
    assert redact_text(text) == expected


@pytest.mark.parametrize("text", [
    "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/run.py",
    "/home/User1/Data/Run42/checkpoints/Model7B_step000123",
    "runs/Model7B/Checkpoint01/LatestWeights2",  # 40 characters of the AWS secret's alphabet
    "gpu-node-017.cluster.example.com", "2.5.1+cu124", "12.4.127", "Linux-5.15.0-105-generic-x86_64-with-glibc2.35",
    "f2376b5ff374c687bf853eb572cbdd648037643f",  # a commit id
    "123e4567-e89b-12d3-a456-426614174000", "GPU-5f3b2c1a-9d8e-4f7a-b6c5-1234567890ab,MIG-5f3b2c1a-9d8e-4f7a-b6c5-1234567890ab",
    "expandable_segments:True,max_split_size_mb:128", "mlx5_0:1,mlx5_1:1", "hf_hub_download", "sk-learn",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "DeepSpeedZeroOptimizer_Stage3", "MegatronPretrainingSampler2024",
    "_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEENS_6detail5ArrayIPcLi1EEEEEvi",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
    "ssh://git@github.com/org/repo.git", "https://github.com/pytorch/pytorch.git",
    "--matrix=examples/matrices/1gpu-whatif.toml", "NVIDIA H100 80GB HBM3", "Intel(R) Xeon(R) Platinum 8480+",
    "torchrun --nproc-per-node=8 --rdzv-endpoint=node-001.cluster:29500 -m runner.train /runs/camp/ddp",
])
def test_ordinary_values_are_kept(text):
    assert redact_text(text) is text


def test_random_tokens_caught_at_the_stated_rates():
    """The docstring's numbers: random base62 of 32 characters caught >= 97%, of 24 >= 93%."""
    rng = random.Random(3)
    alphabet = string.ascii_letters + string.digits
    for n, floor in ((32, 0.97), (40, 0.97), (24, 0.93)):
        caught = sum(redact_text("".join(rng.choice(alphabet) for _ in range(n))) == REDACTED for _ in range(2000))
        assert caught / 2000 >= floor, (n, caught)
    assert sum(redact_text(secrets.token_urlsafe(32)) != "" and REDACTED in redact_text(secrets.token_urlsafe(32))
               for _ in range(500)) >= 400


def test_redact_value_walks_records_and_never_recurses_without_end():
    rec = {"env_vars": {"NCCL_IB_HCA": HF}, "launch_command": ("x", f"--token={GH}"), "n": 3, "none": None}
    assert redact_value(rec) == {"env_vars": {"NCCL_IB_HCA": REDACTED}, "launch_command": ("x", f"--token={REDACTED}"),
                                 "n": 3, "none": None}
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    assert redact_value(deep) is not None


def _matrix(tmp: Path) -> Path:
    path = tmp / "m.toml"
    path.write_text('[campaign]\nname = "sec"\npreset = "tiny"\n[fixed]\nsteps = 4\nwarmup_steps = 1\n'
                    '[[runs]]\nname = "ddp"\nstrategy = "ddp"\nworld_size = 1\n')
    return path


def _all_text(folder: Path) -> str:
    return "\n".join(p.read_bytes().decode("utf-8", errors="replace") for p in folder.rglob("*") if p.is_file())


def test_real_cpu_run_records_no_planted_secret(tmp_path):
    out, note, tables = tmp_path / "camp", tmp_path / "note", tmp_path / "tables"
    env = {**os.environ, **PLANTED}
    run = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--matrix", str(_matrix(tmp_path)), "--out",
                          str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    recorded = json.loads((out / "env.json").read_text())["env_vars"]
    assert recorded["TORCH_HUB_URL"] == "https://<redacted>@hub.example.com/models"
    assert recorded["NCCL_IB_HCA"] == REDACTED and recorded["TORCH_AWS_HINT"] == f"{REDACTED}:{REDACTED}"
    for cmd in ([sys.executable, "-m", "report.cli", "build", str(out), "--out", str(note)],
                [sys.executable, "-m", "ingest.cli", str(out), "--out", str(tables)]):
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
    files = _all_text(out) + _all_text(note) + _all_text(tables)
    assert (note / "summary.json").is_file() and (tables / "runs.parquet").is_file()
    assert not [s for s in SECRETS if s in files]


def test_old_campaign_redacted_when_read(tmp_path):
    """A campaign recorded before value redaction (secrets in env.json and campaign.json's launch
    command) gives a note and tables without them."""
    import shutil

    from ingest.io import load_campaign

    src = Path(__file__).resolve().parent.parent / "examples" / "h200-1gpu"
    camp = tmp_path / "camp"
    shutil.copytree(src, camp, ignore=shutil.ignore_patterns("trace", "tables"))
    env = json.loads((camp / "env.json").read_text())
    env["env_vars"] = {**env.get("env_vars", {}), **PLANTED}
    (camp / "env.json").write_text(json.dumps(env))
    meta = json.loads((camp / "campaign.json").read_text())
    meta["launch_command"] = [*meta.get("launch_command", []), f"--hub=https://me:{HF}@h"]
    (camp / "campaign.json").write_text(json.dumps(meta))
    loaded = load_campaign(camp)
    text = json.dumps(loaded.campaign_json) + repr(loaded.env) + repr(loaded.campaign)
    assert not [s for s in SECRETS if s in text]
    assert "https://<redacted>@hub.example.com/models" in text
