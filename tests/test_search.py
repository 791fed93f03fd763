"""`runner search`: the candidate table and its memory pruning (checked against core.memory's
formulas evaluated here, apart from the search's path through core.perfmodel), a real tiny CPU
search on 2 gloo ranks with a planted failing trial, its resume after an interruption, and bad
input."""
from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core import memory as mem
from core.formulas import ModelShape
from core.hardware import lookup_gpu
from core.perfmodel import load_assumptions
from runner.presets import PRESETS, pad_vocab

REPO = Path(__file__).resolve().parent.parent
GIB = 2**30


def runner(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def table_rows(text: str) -> dict[str, str]:
    """candidate name -> its table line."""
    return {m.group(1): line for line in text.splitlines() if (m := re.match(r"\s*\d+ (\S+)\s", line))}


def gpt125m_peak_gib(*, micro_batch_size: int, sharding: str, logits_bytes: int, extra_bytes_per_param: float = 0.0,
                     recompute: str = "selective") -> float:
    """Peak bytes of gpt-125m on one GPU (one stage, dp 1), from core.memory's formulas: model
    states (+ an engine's extra bytes per parameter) + 12 layers of activations (flash attention:
    scores never stored; "full" recomputation: each layer's input only) + the output layer."""
    p = PRESETS["gpt-125m"]
    shape = ModelShape(name="gpt-125m", num_layers=p.num_layers, hidden_size=p.hidden_size, num_heads=p.num_heads,
                       num_kv_heads=p.num_heads, ffn_hidden_size=p.ffn_hidden_size,
                       vocab_size=pad_vocab(p.vocab_size, max_tp_degree=1), max_position_embeddings=p.seq_length)
    params = mem.compute_stage_params(shape, stage=0, layers=(p.num_layers,), tp_degree=1)
    state = mem.compute_model_state_bytes(params, sharding=sharding, dp_degree=1)
    state += (params.dense + params.expert) * extra_bytes_per_param
    act = p.num_layers * mem.compute_activation_bytes_per_layer(
        shape, seq_length=p.seq_length, micro_batch_size=micro_batch_size, recompute=recompute)
    out = mem.compute_output_activation_bytes(shape, seq_length=p.seq_length, micro_batch_size=micro_batch_size,
                                              logits_bytes=logits_bytes)
    return (state + act + out) / GIB


def test_dry_run_prunes_by_memory_on_one_gpu():
    """gpt-125m on one H100: memory decides between micro-batch and engine. The eager DeepSpeed
    loss keeps 10 bytes per logit, the compiled DDP one 4: at micro-batch 128 DDP fits, ZeRO-3 on
    DeepSpeed does not, and with full recomputation it does (the runner's recompute switch);
    nothing is launched."""
    r = runner("search", "--model", "gpt-125m", "--gpus", "1", "--gpu", "h100_sxm", "--dry-run", "--out",
               "/nonexistent/search", timeout=60)
    assert r.returncode == 0, r.stderr
    rows = table_rows(r.stdout)
    limit_gib = lookup_gpu("h100_sxm").memory_gib * load_assumptions().memory_usable_fraction
    assert f"memory limit {limit_gib:.2f} GiB per rank" in r.stdout
    # torch DDP under bf16 autocast also holds the cached bf16 weight copies (one micro-batch: no
    # accumulated fp32 gradients)
    ddp = gpt125m_peak_gib(micro_batch_size=128, sharding="ddp", logits_bytes=4, extra_bytes_per_param=mem.
                           compute_torch_ddp_extra_bytes_per_param(autocast_bf16=True, num_microbatches=1))
    ds = gpt125m_peak_gib(micro_batch_size=128, sharding="zero3", logits_bytes=10)
    assert ddp < limit_gib < ds  # the case is one where memory decides
    assert f"{ddp:9.3f}" in rows["ddp-dp1-mb128"] and rows["ddp-dp1-mb128"].endswith("untried")
    assert f"{ds:9.3f}" in rows["zero3-ds-dp1-mb128"]
    assert (f"pruned (predicted {ds:.2f} GiB on its fullest rank > {limit_gib:.2f} GiB usable"
            in rows["zero3-ds-dp1-mb128"])
    small = gpt125m_peak_gib(micro_batch_size=16, sharding="zero3", logits_bytes=10)
    assert f"{small:9.3f}" in rows["zero3-ds-dp1-mb16"] and "pruned" not in rows["zero3-ds-dp1-mb16"]
    ds_full = gpt125m_peak_gib(micro_batch_size=128, sharding="zero3", logits_bytes=10, recompute="full")
    assert ds_full < limit_gib and f"{ds_full:9.3f}" in rows["zero3-ds-dp1-mb128-full"]
    assert rows["zero3-ds-dp1-mb128-full"].endswith("untried")
    assert not Path("/nonexistent/search").exists()
    # every candidate is listed once: runnable ones with a prediction, pruned ones with a reason
    assert all(("pruned (" in line) or line.endswith("untried") for line in rows.values())


def test_dry_run_does_not_import_torch():
    code = ("import sys; from runner.cli import main; main(['search', '--model', 'tiny', '--gpus', '4', '--device', "
            "'cpu', '--dry-run', '--out', '/nonexistent/x']); assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "torch-tp2-pp2-dp1-mb" in r.stdout and "megatron' needs CUDA" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--model", "nope", "--gpus", "2"], "--model 'nope': unknown preset"),
    (["--model", "tiny", "--gpus", "0", "--device", "cpu"], "--gpus 0: must be in 1..1024"),
    (["--model", "tiny", "--gpus", "2", "--device", "cpu", "--budget", "nan"], "--budget nan: must be minutes"),
    (["--model", "tiny", "--gpus", "2", "--device", "cpu", "--fault", "x"], "--fault 'x': must be CANDIDATE:KIND"),
    (["--model", "gpt-125m", "--gpus", "1", "--gpu", "h2000"], "--gpu 'h2000': unknown"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    r = runner("search", *args, "--dry-run", "--out", "/nonexistent/x", timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"runner: error: {r.stderr.strip().split('error: ', 1)[1]}"]
    assert message in r.stderr and "Traceback" not in r.stderr


def test_out_that_is_another_directory_is_refused(tmp_path):
    (tmp_path / "other.txt").write_text("x")
    r = runner("search", "--model", "tiny", "--gpus", "2", "--device", "cpu", "--out", str(tmp_path), timeout=60)
    assert r.returncode == 2 and "not a search directory" in r.stderr and "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def cpu_search(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, str]:
    """A real search: tiny preset, 2 gloo ranks, 3 trials, the first one planted to crash."""
    out = tmp_path_factory.mktemp("search") / "s"
    plan = runner("search", "--model", "tiny", "--gpus", "2", "--device", "cpu", "--dry-run", "--out", str(out),
                  timeout=60)
    first = next(iter(table_rows(plan.stdout)))  # the first trial: the best predicted candidate
    r = runner("search", "--model", "tiny", "--gpus", "2", "--device", "cpu", "--top", "3", "--max-trials", "3",
               "--fault", f"{first}:crash", "--out", str(out))
    return out, r, first


def test_cpu_search_survives_a_failing_trial(cpu_search):
    out, r, first = cpu_search
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    data = json.loads((out / "search.json").read_text())
    assert data["tried"][0] == first and len(data["tried"]) == 3
    by_name = {c["name"]: c for c in data["candidates"]}
    assert by_name[first]["state"] == "crash"
    ok = [by_name[n] for n in data["tried"][1:]]
    assert all(c["state"] == "ok" and c["measured_step_ms"] > 0 for c in ok)
    assert all(c["measured_step_p10_ms"] <= c["measured_step_ms"] <= c["measured_step_p90_ms"] for c in ok)
    assert all(len(c["measured_mem_peak_gib"]) == 2 for c in ok)  # one peak per rank
    assert data["choice"] == min(ok, key=lambda c: c["measured_step_ms"])["name"]
    # one progress line per trial, with its state and the best so far
    lines = [line for line in r.stdout.splitlines() if line.startswith("trial ")]
    assert len(lines) == 3 and " crash " in lines[0] and "no trial ok yet" in lines[0]
    assert all("best so far" in line for line in lines[1:])
    # a normal campaign directory: campaign.json lists the trials, each with its spec and status
    meta = json.loads((out / "campaign.json").read_text())
    assert meta["runs"] == data["tried"]
    assert json.loads((out / first / "status.json").read_text())["status"] == "crash"
    # every candidate is in search.json: tried, pruned with a reason, untried with a refit prediction
    assert {c["state"] for c in data["candidates"]} >= {"ok", "crash", "pruned", "untried"}
    assert all(c["reason"] for c in data["candidates"] if c["state"] == "pruned")
    untried = [c for c in data["candidates"] if c["state"] == "untried"]
    assert untried and all(c["after"] and c["after"]["rate_from"].startswith("refit") for c in untried)


def test_interrupted_search_resumes(cpu_search, tmp_path):
    """The second trial marked interrupted (what SIGINT leaves): a new start on the same --out
    keeps the first and third trials and runs the second again."""
    src, r, _ = cpu_search
    assert r.returncode == 0
    out = tmp_path / "s"
    shutil.copytree(src, out)
    data = json.loads((out / "search.json").read_text())
    second, third = data["tried"][1], data["tried"][2]
    status = json.loads((out / second / "status.json").read_text())
    (out / second / "status.json").write_text(json.dumps(status | {"status": "interrupted"}))
    r2 = runner("search", "--model", "tiny", "--gpus", "2", "--device", "cpu", "--top", "3", "--max-trials", "3",
                "--out", str(out))
    assert r2.returncode == 0, r2.stdout[-3000:] + r2.stderr[-3000:]
    log = (out / "search-runner.log").read_text()
    assert f"{third}: already ok, kept" in log
    trials = {line.split()[2].rstrip(":"): line for line in r2.stdout.splitlines() if line.startswith("trial ")}
    assert "ok (kept from an earlier start, where it took" in trials[third]  # not "ok in 0.3 s"
    assert " ok in " in trials[second]  # run again
    assert (out / second / "attempt-1").is_dir()  # the interrupted attempt is archived, the run made again
    again = json.loads((out / "search.json").read_text())
    assert again["tried"] == data["tried"]
    assert json.loads((out / "campaign.json").read_text())["runs"] == data["tried"]
    assert {c["name"]: c["state"] for c in again["candidates"]}[second] == "ok"


def test_note_has_the_search_section(cpu_search, tmp_path):
    """`report build` on the search's campaign: every candidate in the Search section, the choice,
    and the runner-up comparison with the measured margin."""
    out, r, _ = cpu_search
    assert r.returncode == 0
    r2 = subprocess.run([sys.executable, "-m", "report.cli", "build", str(out), "--out", str(tmp_path / "note"),
                         "--format", "md"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r2.returncode == 0, r2.stderr[-3000:]
    note = (tmp_path / "note" / "note.md").read_text()
    section = note.split("### Search: candidates planned, tried and refitted", 1)[1].split("\n## ", 1)[0]
    data = json.loads((out / "search.json").read_text())
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| #")]
    assert {line.split(" | ")[1] for line in rows} >= {c["name"] for c in data["candidates"]}
    ok = sorted((c for c in data["candidates"] if c["state"] == "ok"), key=lambda c: c["measured_step_ms"])
    margin_ms = ok[1]["measured_step_ms"] - ok[0]["measured_step_ms"]
    assert f"{ok[0]['name']} beats {ok[1]['name']} by " in section
    said = re.search(r"beats \S+ by ([\d.]+) (ms|µs|s) per step", section)
    value = float(said.group(1)) * {"ms": 1, "µs": 1e-3, "s": 1e3}[said.group(2)]
    assert value == pytest.approx(margin_ms, rel=0.06, abs=0.06)
    assert f"Chosen: {data['choice']}" in section


def test_ranking_is_explained_from_both_runs_whatif():
    """Planted what-if numbers: the winner pays 3 ms more bubble, the runner-up 7 ms more transfer;
    compute has no what-if, so its section-5 times are compared (equal here)."""
    from types import SimpleNamespace

    from report.search import SearchRow, explain_ranking

    def row(name: str, ms: float) -> SearchRow:
        return SearchRow(name=name, layout=name, engine="torch", state="ok", reason=None, trial_index=1,
                         predicted_before_ms=None, predicted_after_ms=None, measured_ms=ms, measured_p10_ms=ms,
                         measured_p90_ms=ms, predicted_mem_gib=None, measured_mem_gib=None, mem_error=None)

    def view(bubble: float, transfer: float):
        cats = ("compute", "transfer", "bubble")
        return SimpleNamespace(traced_ms=dict.fromkeys(cats, 1.0), breakdown_ms={"compute": 20.0, "transfer": 9.0,
                                                                                 "bubble": 5.0},
                               saving_ms={"compute": None, "transfer": transfer, "bubble": bubble})

    rows = [row("tp2", 30.0), row("pp2", 26.0), row("ddp", 50.0)]
    why = explain_ranking(rows, {"pp2": view(bubble=4.0, transfer=1.0), "tp2": view(bubble=1.0, transfer=8.0)})
    assert (why.winner, why.runner_up, why.margin_ms) == ("pp2", "tp2", 4.0)
    assert (why.winner_cat, why.winner_cat_ms, why.runner_cat, why.runner_cat_ms) == ("bubble", 3.0, "transfer", 7.0)
    assert why.source == "mixed" and why.missing == ()
    plain = explain_ranking(rows, {"pp2": view(bubble=4.0, transfer=1.0)})
    assert plain.missing == ("tp2",) and plain.winner_cat is None
    assert not why.within_spread  # 26 ms every step vs 30 ms every step

    def spread(name: str, ms: float, p10: float, p90: float) -> SearchRow:
        return dataclasses.replace(row(name, ms), measured_p10_ms=p10, measured_p90_ms=p90)

    noisy = explain_ranking([spread("tp2", 27.0, 25.0, 29.0), spread("pp2", 26.0, 24.0, 28.0)],
                            {"pp2": view(bubble=4.0, transfer=1.0), "tp2": view(bubble=1.0, transfer=8.0)})
    assert noisy.winner == "pp2" and noisy.within_spread  # 24-28 ms overlaps 25-29 ms: not distinguishable


def test_an_engine_that_does_not_import_is_pruned(monkeypatch):
    """The GPU machine has no DeepSpeed: its candidates are pruned with that reason, the rest stay."""
    from runner import search

    monkeypatch.setitem(search.ENGINE_MODULES, "deepspeed", "no_such_engine_module")
    req = search.SearchRequest(preset="gpt-125m", num_gpus=1, num_nodes=1, device="cuda", gpu_key="h100_sxm",
                               gpu_name="NVIDIA H100 SXM5", peak_flops=989.4e12, memory_gib=79.6,
                               usable_fraction=0.9, budget_s=360, top_k=3, kernels=("parity",))
    candidates, campaign, _ = search.plan_search(req, name="t")
    ds = [c for c in candidates if c.engine == "deepspeed" and c.recompute != "full"]  # full: unrunnable anyway
    assert ds and all(c.state == "pruned" and c.reason == "engine deepspeed is not importable here "
                      "(no_such_engine_module)" for c in ds)
    assert {s.engine for s in campaign.runs} >= {"torch-ddp", "fsdp2", "torch"}


@pytest.mark.parametrize("args, message", [
    (["--micro-batches", "3"], "no candidate: the planner gives no layout"),
    (["--fault", "nope:oom"], "--fault: no candidate named nope"),
])
def test_a_search_with_nothing_to_run_is_one_line_and_leaves_no_folder(tmp_path, args, message):
    out = tmp_path / "s"
    r = runner("search", "--model", "tiny", "--gpus", "2", "--device", "cpu", "--budget", "1", *args, "--out", str(out),
               timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == f"runner: error: {r.stderr.strip().split('error: ', 1)[1]}"
    assert message in r.stderr and not out.exists()


def test_a_resume_that_changes_the_candidate_set_is_refused(tmp_path):
    """A search.json of micro-batches 2 and 4: resuming with --micro-batches 2 would drop the
    measured micro-batch-4 trials from the record, so it is refused before anything runs."""
    out = tmp_path / "s"
    out.mkdir()
    request = {"preset": "tiny", "num_gpus": 2, "num_nodes": 1, "device": "cpu", "gpu_key": None, "kernels": ["eager"],
               "memory_gib": None, "micro_batch_sizes": [2, 4]}
    (out / "search.json").write_text(json.dumps({"request": request}), encoding="utf-8")
    r = runner("search", "--model", "tiny", "--gpus", "2", "--device", "cpu", "--micro-batches", "2", "--out", str(out),
               timeout=60)
    assert r.returncode == 2 and "a search of another request" in r.stderr and "micro_batch_sizes" in r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["search.json"]


def test_ctrl_c_marks_the_running_trial_interrupted(tmp_path):
    """SIGINT to the search's whole process group (a terminal's Ctrl-C) during a trial: the trial's
    status.json says 'interrupted' and the search exits 130. The trial is planted to hang after its
    warm-up, so it is still running whenever the signal comes."""
    import os
    import signal
    import time

    out = tmp_path / "s"
    plan = runner("search", "--model", "tiny", "--gpus", "2", "--device", "cpu", "--dry-run", "--out", str(out),
                  timeout=60)
    first = next(iter(table_rows(plan.stdout)))  # the first trial: the best predicted candidate
    proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "search", "--model", "tiny", "--gpus", "2", "--device",
                             "cpu", "--max-trials", "1", "--fault", f"{first}:hang", "--out", str(out)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # a terminal's job gets SIGINT's default action even where this test's own process
                            # was started with SIGINT ignored (Python then keeps it ignored)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while not list(out.glob("*/metrics/rank0.jsonl")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    trial = next(out.glob("*/metrics/rank0.jsonl")).parents[1]
    assert trial.name == first and not (trial / "status.json").exists()
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err[-3000:]
    assert json.loads((trial / "status.json").read_text())["status"] == "interrupted"
