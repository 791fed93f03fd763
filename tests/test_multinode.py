"""Multi-node campaigns on one machine: two `runner all` processes (--nnodes 2, --node-rank 0/1)
meet through torchrun's c10d rendezvous on loopback, 2 processes each, with the real engines
(torch DDP, torch TP+PP over gloo), into one shared --out; then `report build` and `runner
collect`. Plus the pure placement arithmetic and the CLI's refusals."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from core.records import RankPlacement
from report.placement import build_groups, compute_run_placement

MATRIX = """
[campaign]
name = "two-nodes"
preset = "tiny"

[fixed]
steps = 8
warmup_steps = 2

[[runs]]
name = "ddp"
strategy = "ddp"
world_size = 4

[[runs]]
name = "tp2-pp2"
strategy = "tp_pp"
engine = "torch"
tp_degree = 2
pp_degree = 2
world_size = 4
"""
RUNS = ("ddp", "tp2-pp2")


def _free_base_port(count: int = 2) -> int:
    """A base port with `count` consecutive free ports (run i uses base + i), below Linux's
    ephemeral range (32768-60999): a port from that range can be taken between this check and
    the rendezvous by any outgoing connection, e.g. the gloo pairs of the ranks themselves."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - count)
        try:
            for p in range(base, base + count):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
    raise RuntimeError("no free port range")


def _cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("multinode")
    (root / "m.toml").write_text(MATRIX)
    out = root / "camp"
    endpoint = f"127.0.0.1:{_free_base_port(len(RUNS))}"
    procs = [subprocess.Popen([sys.executable, "-m", "runner.cli", "all", "--matrix", str(root / "m.toml"),
                               "--out", str(out), "--nnodes", "2", "--node-rank", str(k), "--rdzv-endpoint", endpoint],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
             for k in (0, 1)]
    outputs = []
    try:
        for p in procs:
            try:
                outputs.append(p.communicate(timeout=300)[0])
            except subprocess.TimeoutExpired:
                for q in procs:  # each node's runner with its torchrun and ranks, then what they printed
                    if q.poll() is None:
                        os.killpg(q.pid, signal.SIGKILL)
                pytest.fail("a node did not finish in 300 s:\n---\n"
                            + "\n---\n".join(q.communicate()[0][-3000:] for q in procs))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
    assert [p.returncode for p in procs] == [0, 0], "\n---\n".join(outputs)
    res = subprocess.run([sys.executable, "-m", "report.cli", "build", str(out), "--format", "md,html"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    return out


def test_every_run_ok_on_both_nodes_with_rows_from_every_rank(campaign):
    for name in RUNS:
        assert json.loads((campaign / name / "status.json").read_text())["status"] == "ok"
        assert json.loads((campaign / name / "status_node1.json").read_text())["status"] == "ok"
        assert sorted(p.name for p in (campaign / name / "metrics").glob("*.jsonl")) == [
            f"rank{r}.jsonl" for r in range(4)]
        rows = [ln for p in (campaign / name / "metrics").glob("*.jsonl") for ln in p.read_text().splitlines()]
        assert len(rows) == 4 * 8
        cmd = json.loads((campaign / name / "status.json").read_text())["command"]
        assert "--nproc-per-node=2" in cmd and "--rdzv-backend=c10d" in cmd and "--nnodes=2" in cmd


def test_node1_writes_only_its_own_files(campaign):
    meta = json.loads((campaign / "campaign.json").read_text())
    assert "--node-rank" in meta["launch_command"]
    assert meta["launch_command"][meta["launch_command"].index("--node-rank") + 1] == "0"
    assert meta["nodes"]["nnodes"] == 2
    for k in (0, 1):
        assert json.loads((campaign / f"env_node{k}.json").read_text())["node_rank"] == k
    for name in RUNS:  # node 1's ranks read the same spec node 0 wrote
        assert json.loads((campaign / name / "spec_node1.json").read_text()) == \
            json.loads((campaign / name / "spec.json").read_text())
        assert (campaign / name / "logs" / "launcher_node1.log").is_file()


def test_placement_two_ranks_per_node_and_in_env_record(campaign):
    env = json.loads((campaign / "env.json").read_text())
    assert env["num_nodes"] == 2 and [n["node_rank"] for n in env["nodes"]] == [0, 1]
    for name in RUNS:
        ranks = json.loads((campaign / name / "placement.json").read_text())["ranks"]
        assert sorted(ranks, key=int) == ["0", "1", "2", "3"]
        per_node = {}
        for r, rec in ranks.items():
            per_node.setdefault(rec["node_rank"], set()).add(int(r))
        assert sorted(per_node) == [0, 1] and sorted(map(len, per_node.values())) == [2, 2]
        assert env["placement"][name] == ranks
        # torchrun gives each node a contiguous block of global ranks
        assert all(max(s) - min(s) == 1 for s in per_node.values())


def test_note_shows_two_nodes_and_tp_inside_a_node(campaign):
    md = (campaign / "report" / "note.md").read_text()
    env_section = md.split("## 1. Environment", 1)[1].split("## 2.", 1)[0]
    assert "| Nodes | 2 |" in env_section
    node_rows = [ln for ln in env_section.splitlines() if ln.startswith(("| 0 |", "| 1 |"))]
    assert len(node_rows) == 2
    tp_row = next(ln for ln in env_section.splitlines() if ln.startswith("| tp2-pp2 |"))
    cells = [c.strip() for c in tp_row.strip("|").split("|")]
    assert cells[2] == "tp-pp" and cells[3] == "2 of 2" and cells[4] == "2 of 2", tp_row
    assert "TP crosses nodes" not in md and "span more than one node" not in md
    html = (campaign / "report" / "note.html").read_text()
    assert "<th>Nodes</th><td>2</td>" in html


def test_collect_merges_node_dirs_and_refuses_conflicts(campaign, tmp_path):
    """As if the nodes had no shared filesystem: node 1's ranks' files only in its own dir."""
    ranks_node1 = {r for r, rec in json.loads((campaign / "tp2-pp2" / "placement.json").read_text())["ranks"].items()
                   if rec["node_rank"] == 1}
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    shutil.copytree(campaign, node0, ignore=shutil.ignore_patterns("report"))
    node1.mkdir()
    moved = []
    for path in sorted(node0.rglob("*")):
        rel = path.relative_to(node0)
        mine = (path.is_file() and (path.name.endswith("_node1.json") or path.name == "launcher_node1.log"
                                    or path.stem.removeprefix("rank") in ranks_node1))
        if mine:
            (node1 / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.move(path, node1 / rel)
            moved.append(rel)
    assert any(r.name == "env_node1.json" for r in moved) and any(r.suffix == ".jsonl" for r in moved)
    bad = tmp_path / "bad"
    shutil.copytree(node1, bad)
    conflict = next(p for p in sorted(bad.rglob("*.jsonl")))
    conflict.write_text("{}\n")
    (node0 / conflict.relative_to(bad)).write_text("not the same\n")
    res = _cli("collect", str(node0), str(bad))
    assert res.returncode == 2 and "refusing to merge" in res.stderr and str(conflict.relative_to(bad)) in res.stderr
    assert not (node0 / "env_node1.json").exists()  # nothing copied
    (node0 / conflict.relative_to(bad)).unlink()
    res = _cli("collect", str(node0), str(node1))
    assert res.returncode == 0, res.stderr
    assert f"collected {len(moved)} file(s)" in res.stdout
    for rel in moved:
        assert (node0 / rel).read_bytes() == (node1 / rel).read_bytes()
    env = json.loads((node0 / "env.json").read_text())
    assert env["num_nodes"] == 2 and len(env["nodes"]) == 2
    res = _cli("collect", str(node0), str(node1))  # identical files are skipped: nothing left is an error
    assert res.returncode == 2 and res.stderr.startswith("runner: error: collected nothing: "), res.stderr
    assert len(res.stderr.splitlines()) == 1


def test_groups_follow_each_engines_rank_order():
    # torch mesh (dp, pp, tp): TP innermost, then PP, then DP
    g = build_groups(world_size=8, degrees={"tp": 2, "pp": 2, "dp": 2}, order=("tp", "pp", "dp"))
    assert g["tp"] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert g["pp"] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert g["dp"] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # Megatron "tp-cp-ep-dp-pp": TP innermost, then DP, then PP
    g = build_groups(world_size=8, degrees={"tp": 2, "pp": 2, "dp": 2}, order=("tp", "dp", "pp"))
    assert g["dp"] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert g["pp"] == [(0, 4), (1, 5), (2, 6), (3, 7)]


def _ranks(nodes: list[int]) -> dict:
    return {str(r): {"node_rank": n, "hostname": f"h{n}", "local_rank": 0} for r, n in enumerate(nodes)}


def test_placement_flags_tp_groups_that_cross_nodes():
    run = {"run": "x", "strategy": "tp_pp", "engine": "megatron", "world_size": 8, "tp_degree": 4, "pp_degree": 2,
           "dp_degree": 1}

    def placed(nodes: list[int]):
        ranks = {r: RankPlacement(**rec) for r, rec in _ranks(nodes).items()}
        return compute_run_placement(**run, ranks=ranks)

    ok = placed([0, 0, 0, 0, 1, 1, 1, 1])
    assert (ok.num_tp_groups, ok.num_tp_groups_crossing, ok.num_pp_groups_crossing) == (2, 0, 4)
    bad = placed([0, 0, 1, 1, 0, 0, 1, 1])  # 2 GPUs per node, TP=4
    assert (bad.num_tp_groups, bad.num_tp_groups_crossing, bad.num_nodes) == (2, 2, 2)
    assert placed([0, 0, 0]) is None  # incomplete record: unknown, not guessed


def test_world_size_must_divide_over_nodes(tmp_path):
    (tmp_path / "m.toml").write_text(MATRIX)
    res = _cli("all", "--matrix", str(tmp_path / "m.toml"), "--out", str(tmp_path / "c"), "--nnodes", "3",
               "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:29500", "--dry-run")
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 2 and all("is not divisible by --nnodes 3" in ln for ln in lines), res.stderr


def test_multinode_flags_validated_together(tmp_path):
    res = _cli("all", "--nnodes", "2", "--dry-run", "--out", str(tmp_path / "c"))
    assert res.returncode == 2
    assert "--node-rank K is required" in res.stderr and "--rdzv-endpoint HOST:PORT is required" in res.stderr
    res = _cli("all", "--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1", "--dry-run")
    assert res.returncode == 2 and "--out DIR is required with --nnodes" in res.stderr


def test_print_node_commands_and_dry_run(tmp_path):
    (tmp_path / "m.toml").write_text(MATRIX)
    common = ["--matrix", str(tmp_path / "m.toml"), "--out", str(tmp_path / "c"), "--nnodes", "2",
              "--rdzv-endpoint", "node001:29500"]
    res = _cli("all", *common, "--print-node-commands")
    assert res.returncode == 0, res.stderr
    cmds = [ln for ln in res.stdout.splitlines() if not ln.startswith("#")]
    assert len(cmds) == 2 and all("--print-node-commands" not in c for c in cmds)
    assert cmds[0].endswith("--node-rank 0") and cmds[1].endswith("--node-rank 1")
    res = _cli("all", *common, "--node-rank", "1", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "--rdzv-endpoint=node001:29500" in res.stdout and "--rdzv-endpoint=node001:29501" in res.stdout
    assert "--rdzv-id=two-nodes-tp2-pp2" in res.stdout and "spec_node1.json" in res.stdout
    assert "RUNNER_NODE_RANK=1" in res.stdout and "--nproc-per-node=2" in res.stdout


def test_node0_refuses_another_campaigns_dir_but_node1_may_arrive_first(tmp_path):
    (tmp_path / "m.toml").write_text(MATRIX)
    out = tmp_path / "c"
    out.mkdir()
    (out / "stray.txt").write_text("x")
    res = _cli("all", "--matrix", str(tmp_path / "m.toml"), "--out", str(out), "--nnodes", "2", "--node-rank", "0",
               "--rdzv-endpoint", "127.0.0.1:1")
    assert res.returncode == 2 and "not an empty directory" in res.stderr
    # what node 1 writes when it starts first on a shared directory does not stop node 0
    from runner.cli import _may_start_in
    from runner.matrix import resolve_matrix
    from runner.nodes import NodeLaunch
    import tomllib

    camp = resolve_matrix(tomllib.loads(MATRIX), source="m.toml", num_gpus=0)
    node0 = NodeLaunch(nnodes=2, node_rank=0, rdzv_host="h", rdzv_port=1)
    (out / "stray.txt").unlink()
    (out / "env_node1.json").write_text("{}")
    (out / "ddp").mkdir()
    (out / "ddp" / "spec_node1.json").write_text("{}")
    assert _may_start_in(out, camp, node0)
    (out / "ddp" / "spec.json").write_text("{}")  # node 0 already ran here
    assert not _may_start_in(out, camp, node0)
    assert not _may_start_in(out, camp, None)  # single node: empty directories only, as before


def test_missing_node_is_named_as_an_incomplete_rendezvous(tmp_path):
    """Node 0 alone: torchrun waits in the rendezvous; the startup watchdog says so instead of
    blaming training."""
    (tmp_path / "m.toml").write_text(MATRIX.replace('preset = "tiny"', 'preset = "tiny"\nstartup_timeout_s = 8')
                                     .split("[[runs]]")[0] + "[[runs]]" + MATRIX.split("[[runs]]")[1])
    port = _free_base_port(1)
    res = _cli("all", "--matrix", str(tmp_path / "m.toml"), "--out", str(tmp_path / "c"), "--nnodes", "2",
               "--node-rank", "0", "--rdzv-endpoint", f"127.0.0.1:{port}", timeout=120)
    assert res.returncode == 1, res.stdout + res.stderr
    status = json.loads((tmp_path / "c" / "ddp" / "status.json").read_text())
    assert status["status"] == "hang" and "rendezvous" in status["cause"] and "all 2 nodes" in status["cause"]


def test_note_warns_when_a_tp_group_crosses_nodes(campaign, tmp_path):
    """Same campaign, placement record rewritten as if ranks alternated between nodes."""
    copy = tmp_path / "camp"
    shutil.copytree(campaign, copy, ignore=shutil.ignore_patterns("report"))
    env = json.loads((copy / "env.json").read_text())
    env["placement"]["tp2-pp2"] = _ranks([0, 1, 0, 1])
    (copy / "env.json").write_text(json.dumps(env))
    res = subprocess.run([sys.executable, "-m", "report.cli", "build", str(copy), "--format", "md"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    md = (copy / "report" / "note.md").read_text()
    assert "0 of 2 (**TP crosses nodes**)" in md
    assert "tp2-pp2: 2 of 2 TP groups span more than one node (2 nodes)" in md
