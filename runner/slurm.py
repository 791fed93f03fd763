"""`runner slurm`: an sbatch script that runs a campaign on N nodes through torchrun's c10d rendezvous.

Shape of the job: ONE job step (``srun --ntasks-per-node 1``) starts one ``runner all --nnodes N
--node-rank $SLURM_NODEID`` per node, and each of those iterates the matrix, launching one
torchrun agent per run; the agents of a run meet at the first node of the allocation on port
``--port`` + run index. Why not one ``srun`` step per run: the runner's per-run isolation (own
torchrun process group, stall watchdog with py-spy stacks, deadline derived from the observed
step time, status.json with the cause) is what a step per run would buy, and it already exists
in `runner all`; a step per run would instead need the campaign set-up (env record,
campaign.json) split from the runs, and a failed step would stop the script under ``set -e``.
The cost: ``sacct`` shows one step, not one per run (status.json per run has the detail).

The campaign directory must be on a filesystem every node sees (node 0 writes campaign.json,
env.json and status.json; every node writes env_node<K>.json and its own ranks' files).
Deliberately not here: running anything (the CLI submits with sbatch when it exists).
"""
from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from ingest.errors import LaunchError
from runner.launch import build_command
from runner.matrix import Campaign
from runner.nodes import NodeLaunch

HEAD_NODE = '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)'


def build_sbatch_script(campaign: Campaign, *, nodes: int, gpus_per_node: int, partition: str | None,
                        time_limit: str | None, matrix: Path, out: Path, port: int, python: str,
                        workdir: Path) -> str:
    """The sbatch script text (bash). matrix/out are passed to every node's `runner all` as
    given (relative paths resolve from ``workdir``, where the job cd's first); python: the
    interpreter that has the tool installed on the compute nodes."""
    sbatch = [f"--job-name=runner-{campaign.name}", f"--nodes={nodes}", "--ntasks-per-node=1",
              f"--gpus-per-node={gpus_per_node}", "--exclusive", f"--output={out}.slurm-%j.log"]
    if partition:
        sbatch.append(f"--partition={partition}")
    if time_limit:
        sbatch.append(f"--time={time_limit}")
    runner = [python, "-m", "runner.cli", "all", "--matrix", str(matrix), "--out", str(out), "--nnodes", str(nodes)]
    # what every node's runner will launch per run (node rank 0 shown; the others differ only in spec file)
    example = NodeLaunch(nnodes=nodes, node_rank=0, rdzv_host="$head_node", rdzv_port=port)
    torchrun_lines = []
    for i, spec in enumerate(campaign.runs):
        cmd = build_command(spec, run_dir=out / spec.name, master_port=port, node=example, run_index=i)
        torchrun_lines.append(f"#   {spec.name}: {' '.join(cmd)}")
    lines = [
        "#!/bin/bash",
        f"# Campaign {campaign.name}: {len(campaign.runs)} runs on {nodes} nodes x {gpus_per_node} GPUs "
        "(written by `runner slurm`).",
        *(f"#SBATCH {a}" for a in sbatch),
        "set -euo pipefail",
        f"cd {shlex.quote(str(workdir))}",
        f"head_node={HEAD_NODE}",
        f"export RUNNER_RDZV_ENDPOINT=\"$head_node:{port}\"",
        "# Each node runs `runner all` over the whole matrix; every run is its own torchrun per node,",
        f"# rendezvous c10d at $head_node, port {port} + run index:",
        *torchrun_lines,
        "cmd=(" + " ".join(shlex.quote(a) for a in runner) + ' --rdzv-endpoint "$RUNNER_RDZV_ENDPOINT")',
        f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=0 \\",
        "    bash -c 'exec \"$@\" --node-rank \"$SLURM_NODEID\"' runner \"${cmd[@]}\"",
        f"echo \"campaign written to {out}: report build {out}\"",
    ]
    return "\n".join(lines) + "\n"


def submit_sbatch(script: str, *, path: Path) -> int:
    """Write the script to ``path`` and submit it with sbatch when sbatch exists (else say how).
    Returns the exit code for the CLI. Raises LaunchError when sbatch refuses the job."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script, encoding="utf-8")
    sbatch = shutil.which("sbatch")
    if sbatch is None:
        print(f"wrote {path}; sbatch not found on this machine: submit it with `sbatch {path}` on the cluster")
        return 0
    done = subprocess.run([sbatch, str(path)], capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise LaunchError(f"sbatch {path} failed (exit {done.returncode}): {done.stderr.strip()[:500]}")
    print(f"wrote {path}; {done.stdout.strip()}")
    return 0
