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

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from core.errors import LaunchError
from runner.launch import build_command
from runner.matrix import Campaign
from runner.nodes import NodeLaunch

# The first host of the allocation. Not `scontrol ... | head -n1`: head exits after one line, and
# under `set -o pipefail` scontrol's SIGPIPE (exit 141) would kill the job on a long node list.
HEAD_NODE_LINES = ('head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
                   "head_node=${head_node%%$'\\n'*}")
# Slurm's --time formats (sbatch(1)): M, M:S, H:M:S, D-H, D-H:M, D-H:M:S, or unlimited
SLURM_TIME = re.compile(r"(?:\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}(?::\d{1,2}(?::\d{1,2})?)?"
                        r"|UNLIMITED|unlimited|infinite|INFINITE)")


def slurm_field_problems(*, partition: str | None, time_limit: str | None, out: Path, job_name: str) -> list[str]:
    """Every reason the values that go into #SBATCH lines (one line each, not shell-quoted: sbatch
    reads them itself) cannot be written safely: control characters (a newline would inject
    #SBATCH or shell lines), a --time that is not a Slurm time. Empty when all are fine."""
    problems = []
    for flag, value in (("--partition", partition), ("--time", time_limit), ("--out", str(out)),
                        ("job name (the campaign name)", job_name)):
        if value is not None and any(not c.isprintable() for c in value):
            problems.append(f"{flag} {value!r:.80}: has a newline or another control character; "
                            "give a single-line value")
    if partition is not None and (not partition or any(c.isspace() for c in partition)):
        problems.append(f"--partition {partition!r:.80}: must be a partition name (no spaces)")
    if time_limit is not None and not SLURM_TIME.fullmatch(time_limit):
        problems.append(f"--time {time_limit!r:.80}: not a Slurm time; use MM, HH:MM:SS, D-HH:MM:SS or UNLIMITED")
    return problems


def build_sbatch_script(campaign: Campaign, *, nodes: int, gpus_per_node: int, partition: str | None,
                        time_limit: str | None, matrix: Path, out: Path, port: int, python: str,
                        workdir: Path) -> str:
    """The sbatch script text (bash). matrix/out are passed to every node's `runner all` as
    given (relative paths resolve from ``workdir``, where the job cd's first); python: the
    interpreter that has the tool installed on the compute nodes. Every value that reaches a
    shell line is quoted (shlex.quote); LaunchError when a #SBATCH value is unsafe
    (``slurm_field_problems``)."""
    problems = slurm_field_problems(partition=partition, time_limit=time_limit, out=out,
                                    job_name=f"runner-{campaign.name}")
    if problems:
        raise LaunchError("\n".join(problems))
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
        torchrun_lines.append(f"#   {spec.name}: {' '.join(cmd)}".replace("\n", " "))
    lines = [
        "#!/bin/bash",
        f"# Campaign {campaign.name}: {len(campaign.runs)} runs on {nodes} nodes x {gpus_per_node} GPUs "
        "(written by `runner slurm`).",
        *(f"#SBATCH {a}" for a in sbatch),
        "set -euo pipefail",
        f"cd {shlex.quote(str(workdir))}",
        *HEAD_NODE_LINES,
        f"export RUNNER_RDZV_ENDPOINT=\"$head_node:{port}\"",
        "# Each node runs `runner all` over the whole matrix; every run is its own torchrun per node,",
        f"# rendezvous c10d at $head_node, port {port} + run index:",
        *torchrun_lines,
        "cmd=(" + " ".join(shlex.quote(a) for a in runner) + ' --rdzv-endpoint "$RUNNER_RDZV_ENDPOINT")',
        f"srun --nodes={nodes} --ntasks-per-node=1 --kill-on-bad-exit=0 \\",
        "    bash -c 'exec \"$@\" --node-rank \"$SLURM_NODEID\"' runner \"${cmd[@]}\"",
        "printf '%s\\n' " + shlex.quote(f"campaign written to {out}: report build {out}"),
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
