"""Matrix validation: every bad matrix is refused with one line per problem, exit code 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError
from runner.matrix import resolve_matrix

ROOT = Path(__file__).resolve().parent.parent


def _matrix(*runs: dict, fixed: dict | None = None) -> dict:
    return {"campaign": {"name": "t", "preset": "tiny"}, "fixed": fixed or {}, "runs": list(runs)}


def test_cpu_matrix_resolves_to_layouts_with_same_fixed_variables():
    import tomllib

    raw = tomllib.loads((ROOT / "examples/matrices/cpu.toml").read_text())
    campaign = resolve_matrix(raw, source="cpu.toml", num_gpus=0)
    # two data rounds (issue 5): the synthetic round keeps the layout's name, the real one is <name>-real
    assert [s.name for s in campaign.runs] == ["ddp", "zero3", "zero3-fsdp2", "tp2-pp2",
                                               "ddp-real", "zero3-real", "zero3-fsdp2-real", "tp2-pp2-real"]
    assert [s.engine for s in campaign.runs][:4] == ["torch-ddp", "deepspeed", "fsdp2", "torch"]
    assert len({s.fixed for s in campaign.runs}) == 1
    for s in campaign.runs:
        assert s.tp_degree * s.pp_degree * s.dp_degree == s.world_size
        assert s.micro_batch_size * s.num_microbatches * s.dp_degree == s.fixed.global_batch_size
    tp_pp = campaign.runs[3]
    assert (tp_pp.engine, tp_pp.backend) == ("torch", "gloo")
    assert tp_pp.num_microbatches >= 4 * tp_pp.pp_degree  # Megatron guidance m >= 4p
    # vocab padded once for the campaign's largest TP (Megatron-LM: multiple of 128 * tp)
    assert tp_pp.fixed.model.padded_vocab_size % (128 * 2) == 0


def test_gpu_matrices_resolve():
    import tomllib

    for name, gpus in (("1gpu", 1), ("2gpu", 2), ("8gpu", 8)):
        raw = tomllib.loads((ROOT / f"examples/matrices/{name}.toml").read_text())
        campaign = resolve_matrix(raw, source=name, num_gpus=gpus)
        assert campaign.preset == "gpt-125m"
        assert campaign.fixed.global_batch_size == 128 and campaign.fixed.model.seq_length == 1024
        assert all(s.backend == "nccl" for s in campaign.runs)


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        (_matrix({"name": "a", "strategy": "fsdp9"}), "unknown strategy 'fsdp9'"),
        (_matrix({"name": "a", "strategy": "tp_pp", "tp_degree": 3, "world_size": 4}), "does not divide world_size 4"),
        (_matrix({"name": "a", "strategy": "ddp", "world_size": 3}), "global_batch_size 16 is not divisible by dp_degree 3"),
        (_matrix({"name": "a", "strategy": "ddp", "seq_length": 128}), "sets 'seq_length', a fixed variable"),
        (_matrix({"name": "a", "strategy": "ddp", "lr": 1.0}), "sets 'lr', a fixed variable"),
        (_matrix({"name": "a", "strategy": "ddp", "colour": 1}), "unknown key 'colour'"),
        (_matrix({"name": "a", "strategy": "tp_pp", "engine": "megatron"}), "engine 'megatron' needs CUDA"),
        (_matrix({"name": "a", "strategy": "ddp", "tp_degree": 2}), "apply only to strategy 'tp_pp'"),
        (_matrix({"name": "a", "strategy": "ddp", "micro_batch_size": 3}), "not divisible by micro_batch_size 3"),
        (_matrix({"name": "a", "strategy": "ddp"}, fixed={"dtype": "fp8"}), "dtype 'fp8' is not supported"),
    ],
)
def test_bad_matrix_names_the_field(raw, fragment):
    with pytest.raises(ConfigError) as err:
        resolve_matrix(raw, source="m.toml", num_gpus=0)
    assert fragment in str(err.value)


def test_all_problems_reported_at_once():
    raw = _matrix({"name": "a", "strategy": "nope"}, {"name": "b", "strategy": "ddp", "steps": 3})
    with pytest.raises(ConfigError) as err:
        resolve_matrix(raw, source="m.toml", num_gpus=0)
    assert len(str(err.value).splitlines()) == 2


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_cli_bad_matrix_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[campaign]\nname="x"\n[[runs]]\nname="a"\nstrategy="ddp"\nglobal_batch_size=7\n')
    res = _cli("all", "--matrix", str(bad), "--dry-run", cwd=tmp_path)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert res.stderr.strip() == (f"runner: error: {bad} run 1 ('a') sets 'global_batch_size', a fixed variable: "
                                  "only the parallel layout may vary; set it once under [fixed]")


def test_cli_missing_and_broken_matrix(tmp_path):
    res = _cli("all", "--matrix", str(tmp_path / "nope.toml"), cwd=tmp_path)
    assert res.returncode == 2 and "matrix file not found" in res.stderr and "Traceback" not in res.stderr
    broken = tmp_path / "broken.toml"
    broken.write_text("[campaign\n")
    res = _cli("all", "--matrix", str(broken), cwd=tmp_path)
    assert res.returncode == 2 and "not valid TOML" in res.stderr and "Traceback" not in res.stderr


def test_dry_run_prints_each_run_and_its_command(tmp_path):
    res = _cli("all", "--dry-run", "--out", str(tmp_path / "c"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    for name in ("ddp", "zero3", "tp2-pp2"):
        assert f"- {name}: strategy=" in res.stdout
        assert f"--run-dir {tmp_path / 'c' / name}" in res.stdout
    assert "--nproc-per-node=4" in res.stdout
    assert not (tmp_path / "c").exists()  # a dry run writes nothing


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"runs": {"name": "a"}}, "runs must be an array of tables"),
        ({"runs": ["ddp"]}, "runs must be an array of tables"),
        ({"campaign": "x", "runs": []}, "[campaign] must be a table"),
        ({"fixed": 3, "runs": []}, "[fixed] must be a table"),
        (_matrix({"strategy": "ddp"}), "'name' must be letters"),
        (_matrix({"name": "a", "strategy": ["ddp"]}), "unknown strategy ['ddp']"),
        (_matrix({"name": "a", "strategy": "ddp", "options": "x"}), "'options' must be a table"),
        (_matrix({"name": "a", "strategy": "ddp", "options": {"bucket_cap": 10}}), "unknown key 'bucket_cap'"),
        (_matrix({"name": "a", "strategy": "ddp"}, fixed={"global_batch_size": "16"}), "global_batch_size must be an integer"),
        (_matrix({"name": "a", "strategy": "ddp"}, fixed={"steps": 0}), "steps must be >= 1"),
        (_matrix({"name": "a", "strategy": "ddp"}, fixed={"steps": 5, "warmup_steps": 5}), "must exceed warmup_steps"),
        (_matrix({"name": "a", "strategy": "ddp"}, fixed={"lr": "fast"}), "lr must be a number"),
        (_matrix({"name": "a", "strategy": "ddp", "micro_batch_size": 0}), "micro_batch_size must be an integer >= 1"),
        ({"campaign": {"name": "../../etc"}, "runs": [{"name": "a", "strategy": "ddp"}]}, "[campaign] name must be"),
        ({"campaign": {"run_timeout_s": "ten"}, "runs": [{"name": "a", "strategy": "ddp"}]}, "run_timeout_s must be a positive"),
    ],
)
def test_malformed_matrix_shapes_and_types(raw, fragment):
    with pytest.raises(ConfigError) as err:
        resolve_matrix(raw, source="m.toml", num_gpus=0)
    assert fragment in str(err.value)


def test_cli_overrides_are_validated(tmp_path):
    res = _cli("all", "--dry-run", "--steps", "0", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip() == "runner: error: --steps must be >= 1, got 0"
    res = _cli("all", "--dry-run", "--preset", "huge", cwd=tmp_path)
    assert res.returncode == 2 and res.stderr.strip() == "runner: error: --preset 'huge' is unknown (valid: gpt-125m, tiny)"
    res = _cli("all", "--matrix", str(tmp_path), cwd=tmp_path)
    assert res.returncode == 2 and "is a directory" in res.stderr and "Traceback" not in res.stderr
    (tmp_path / "afile").write_text("x")
    res = _cli("all", "--out", str(tmp_path / "afile"), cwd=tmp_path)
    assert res.returncode == 2 and "not an empty directory" in res.stderr


def test_dry_run_resolves_gpu_matrix_without_gpus(tmp_path):
    res = _cli("all", "--dry-run", "--gpus", "8", "--matrix", str(ROOT / "examples/matrices/8gpu.toml"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "megatron-tp2-pp2-dp2: strategy=tp_pp engine=megatron world_size=8 tp=2 pp=2 dp=2" in res.stdout
    assert "NCCL_DEBUG=INFO" in res.stdout and "TORCH_NCCL_DUMP_ON_TIMEOUT=1" in res.stdout


def test_profiler_window_defaults_to_mid_run_and_rejects_a_window_that_does_not_fit(tmp_path):
    from runner.matrix import resolve_matrix
    raw = {"runs": [{"name": "ddp", "strategy": "ddp"}]}
    fixed = resolve_matrix(raw, source="m.toml", num_gpus=0).fixed
    # tiny: 30 steps, 5 warm-up: 8 traced steps, ending before the last 10 (the loop-overhead replay's)
    assert (fixed.profile_start_step, fixed.profile_num_steps) == (12, 8)
    long = resolve_matrix(raw, source="m.toml", num_gpus=0, overrides={"steps": 60}).fixed
    assert (long.profile_start_step, long.profile_num_steps) == (32, 8)  # mid-run where the run allows
    shorter = resolve_matrix(raw, source="m.toml", num_gpus=0, overrides={"steps": 20}).fixed
    assert (shorter.profile_start_step, shorter.profile_num_steps) == (6, 4)  # 10 measured steps stay outside
    short = resolve_matrix(raw, source="m.toml", num_gpus=0, overrides={"steps": 16}).fixed
    assert (short.profile_start_step, short.profile_num_steps) == (0, 0)  # a default window that does not fit is dropped
    explicit = resolve_matrix({"fixed": {"profile_num_steps": 3}, **raw}, source="m.toml", num_gpus=0).fixed
    assert (explicit.profile_start_step, explicit.profile_num_steps) == (17, 3)  # configurable
    bad = {"fixed": {"profile_start_step": 29, "profile_num_steps": 3}, **raw}
    with pytest.raises(ConfigError, match="profiler window"):
        resolve_matrix(bad, source="m.toml", num_gpus=0)


def test_nsys_wraps_torchrun_and_needs_nsys_on_path(tmp_path):
    from runner.launch import build_command
    matrix = tmp_path / "m.toml"
    matrix.write_text('[campaign]\nname = "n"\nnsys = true\n[[runs]]\nname = "ddp"\nstrategy = "ddp"\n')
    campaign = resolve_matrix({"campaign": {"name": "n", "nsys": True}, "runs": [{"name": "ddp", "strategy": "ddp"}]},
                              source="m.toml", num_gpus=1)
    cmd = build_command(campaign.runs[0], run_dir=tmp_path / "ddp", master_port=1)
    assert cmd[:2] == ["nsys", "profile"] and f"--output={tmp_path / 'ddp' / 'trace' / 'nsys_node0'}" in cmd
    assert cmd.index("torch.distributed.run") > cmd.index("profile")
    with pytest.raises(ConfigError, match="nsys must be true or false"):
        resolve_matrix({"campaign": {"nsys": "yes"}, "runs": [{"name": "ddp", "strategy": "ddp"}]}, source="m.toml",
                       num_gpus=0)
    env = {"PATH": str(tmp_path)}  # no nsys there: refused before anything is written, exit 2
    res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--matrix", str(matrix), "--out",
                          str(tmp_path / "out")], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 2 and "`nsys` is not on PATH" in res.stderr and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()
