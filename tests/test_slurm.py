"""`runner slurm`: the sbatch script for 2 nodes x 8 GPUs against the expected #SBATCH, srun and
torchrun lines; `bash -n` accepts it; with stand-ins for scontrol and srun (no Slurm here) the
script hands each node the right `runner all` command line; submission with and without sbatch."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from runner.matrix import load_matrix, resolve_matrix
from runner.slurm import build_sbatch_script

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "examples" / "matrices" / "8gpu.toml"


def _cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd or ROOT)


@pytest.fixture(scope="module")
def script() -> str:
    res = _cli("slurm", "--nodes", "2", "--gpus-per-node", "8", "--partition", "h200", "--time", "02:00:00",
               "--matrix", str(MATRIX), "--out", "/shared/runs/gpu-8", "--dry-run")
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_sbatch_header(script):
    sbatch = [ln for ln in script.splitlines() if ln.startswith("#SBATCH")]
    assert sbatch == [
        "#SBATCH --job-name=runner-gpu-8",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --exclusive",
        "#SBATCH --output=/shared/runs/gpu-8.slurm-%j.log",
        "#SBATCH --partition=h200",
        "#SBATCH --time=02:00:00",
    ]
    assert script.startswith("#!/bin/bash\n")


def test_rendezvous_on_first_node_and_one_srun_step(script):
    lines = script.splitlines()
    i = lines.index('head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST")')  # no pipe into head: no SIGPIPE
    assert lines[i + 1] == "head_node=${head_node%%$'\\n'*}"
    assert 'export RUNNER_RDZV_ENDPOINT="$head_node:29500"' in lines
    py = sys.executable
    assert (f"cmd=({py} -m runner.cli all --matrix {MATRIX} --out /shared/runs/gpu-8 --nnodes 2"
            ' --rdzv-endpoint "$RUNNER_RDZV_ENDPOINT")') in lines
    i = lines.index("srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=0 \\")
    assert lines[i + 1] == "    bash -c 'exec \"$@\" --node-rank \"$SLURM_NODEID\"' runner \"${cmd[@]}\""
    assert sum(ln.startswith("srun") for ln in lines) == 1


def test_torchrun_line_per_run(script):
    py = sys.executable
    expected = {
        "ddp": 29500, "zero3": 29501, "megatron-tp2-pp2-dp2": 29502,
    }
    for name, port in expected.items():
        line = (f"#   {name}: {py} -m torch.distributed.run --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d "
                f"--rdzv-endpoint=$head_node:{port} --rdzv-id=gpu-8-{name} --max-restarts=0 -m runner.train "
                f"--run-dir /shared/runs/gpu-8/{name} --spec /shared/runs/gpu-8/{name}/spec.json")
        assert line in script.splitlines(), line


def test_bash_accepts_it(script, tmp_path):
    path = tmp_path / "job.sbatch"
    path.write_text(script)
    res = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr


def _exe(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_each_node_gets_its_runner_command(tmp_path):
    """Run the script with stand-ins: scontrol lists two hosts; srun starts its command once per
    node with SLURM_NODEID set; `python` is `echo`, so each node prints its command line."""
    campaign = resolve_matrix(load_matrix(MATRIX), source=str(MATRIX), num_gpus=16)
    text = build_sbatch_script(campaign, nodes=2, gpus_per_node=8, partition=None, time_limit=None,
                               matrix=Path("m dir/8gpu.toml"), out=Path("/shared/runs/gpu 8"), port=29600,
                               python="echo", workdir=tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "scontrol", "#!/bin/bash\nprintf 'node001\\nnode002\\n'\n")
    _exe(bin_dir / "srun", '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                           'for id in 0 1; do SLURM_NODEID=$id "$@"; done\n')
    (tmp_path / "job.sh").write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[001-002]"}
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, timeout=30, env=env)
    assert res.returncode == 0, res.stderr
    out = res.stdout.splitlines()
    base = ("-m runner.cli all --matrix m dir/8gpu.toml --out /shared/runs/gpu 8 --nnodes 2 "
            "--rdzv-endpoint node001:29600")
    assert out[:2] == [f"{base} --node-rank 0", f"{base} --node-rank 1"]


def test_submit_without_and_with_sbatch(tmp_path):
    path_wo = ":".join(p for p in os.environ["PATH"].split(":") if not (Path(p) / "sbatch").exists())
    env = {**os.environ, "PATH": path_wo}
    args = ("slurm", "--nodes", "2", "--gpus-per-node", "8", "--matrix", str(MATRIX), "--out", str(tmp_path / "c"))
    res = _cli(*args, env=env)
    assert res.returncode == 0, res.stderr
    assert "sbatch not found" in res.stdout and (tmp_path / "c.sbatch").is_file()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "sbatch", '#!/bin/bash\necho "Submitted batch job 4242 ($1)"\n')
    res = _cli(*args, env={**env, "PATH": f"{bin_dir}:{path_wo}"})
    assert res.returncode == 0, res.stderr
    assert f"Submitted batch job 4242 ({tmp_path / 'c.sbatch'})" in res.stdout
    _exe(bin_dir / "sbatch", '#!/bin/bash\necho "sbatch: error: invalid partition" >&2; exit 1\n')
    res = _cli(*args, env={**env, "PATH": f"{bin_dir}:{path_wo}"})
    assert res.returncode == 2 and "invalid partition" in res.stderr


def test_bad_layout_for_the_nodes_is_refused():
    res = _cli("slurm", "--nodes", "3", "--gpus-per-node", "8", "--matrix", str(MATRIX), "--dry-run")
    assert res.returncode == 2
    assert all("not divisible by --nnodes 3" in ln for ln in res.stderr.strip().splitlines())
    assert shutil.which("bash")


def test_two_node_matrix_resolves_for_2x8():
    res = _cli("slurm", "--nodes", "2", "--gpus-per-node", "8", "--matrix",
               str(ROOT / "examples" / "matrices" / "2x8gpu.toml"), "--out", "/shared/r", "--dry-run")
    assert res.returncode == 0, res.stderr
    runs = [ln for ln in res.stdout.splitlines() if ln.startswith("#   ")]
    assert len(runs) == 4 and all("--nproc-per-node=8" in ln for ln in runs)


def test_head_node_survives_a_long_node_list_under_pipefail(tmp_path):
    """With `| head -n1`, scontrol writing many hostnames gets SIGPIPE and `set -o pipefail` ends
    the job with exit 141 before srun; the script must reach srun with the first host."""
    campaign = resolve_matrix(load_matrix(MATRIX), source=str(MATRIX), num_gpus=16)
    text = build_sbatch_script(campaign, nodes=2, gpus_per_node=8, partition=None, time_limit=None,
                               matrix=MATRIX, out=Path("/shared/x"), port=29600, python="echo", workdir=tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "scontrol", "#!/bin/bash\nfor i in $(seq 1 200000); do echo node$i; done\n")
    _exe(bin_dir / "srun", '#!/bin/bash\necho "srun reached, endpoint $RUNNER_RDZV_ENDPOINT"\n')
    (tmp_path / "job.sh").write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node[1-200000]"}
    res = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, (res.returncode, res.stderr)
    assert "srun reached, endpoint node1:29600" in res.stdout


def test_command_substitution_in_out_is_not_executed(tmp_path):
    """A --out holding $(...) or backticks reaches the script quoted: running it creates nothing."""
    out = tmp_path / "runs" / "x$(touch PWNED)`touch PWNED2`"
    res = _cli("slurm", "--nodes", "2", "--gpus-per-node", "8", "--matrix", str(MATRIX), "--out", str(out),
               "--dry-run", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "scontrol", "#!/bin/bash\necho node001\n")
    _exe(bin_dir / "srun", "#!/bin/bash\ntrue\n")
    (tmp_path / "job.sh").write_text(res.stdout.replace(f"cd {ROOT}", f"cd {tmp_path}"))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "node001"}
    run = subprocess.run(["bash", str(tmp_path / "job.sh")], capture_output=True, text=True, timeout=60,
                         env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"campaign written to {out}: report build {out}" in run.stdout
    assert not list(tmp_path.rglob("PWNED*"))


@pytest.mark.parametrize("args, needle", [
    (("--partition", "h200\n#SBATCH --uid=0"), "--partition 'h200\\n#SBATCH --uid=0': has a newline"),
    (("--partition", "gpu; rm -rf ~"), "must be a partition name (no spaces)"),
    (("--time", "soon"), "--time 'soon': not a Slurm time"),
    (("--time", "02:00:00\nrm -rf ~"), "has a newline"),
    (("--out", "/shared/a\nrm -rf ~"), "--out"),
    (("--port", "0"), "--port must be a TCP port 1..65535, got 0"),
])
def test_unsafe_or_malformed_values_are_refused(args, needle):
    res = _cli("slurm", "--nodes", "2", "--gpus-per-node", "8", "--matrix", str(MATRIX), *args, "--dry-run")
    assert res.returncode == 2, res.stdout
    assert needle in res.stderr and "Traceback" not in res.stderr and res.stdout == ""


@pytest.mark.parametrize("value", ["30", "30:00", "02:00:00", "1-12", "1-12:30", "2-00:00:00", "UNLIMITED"])
def test_slurm_time_formats_are_accepted(value):
    res = _cli("slurm", "--nodes", "2", "--gpus-per-node", "8", "--matrix", str(MATRIX), "--time", value,
               "--out", "/shared/x", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert f"#SBATCH --time={value}" in res.stdout.splitlines()
