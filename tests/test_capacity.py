"""Capacity probe: bisection over a size ladder with real trials under a per-process memory budget
(runner.capacity, runner.membudget), the offload paths of both ZeRO-3 engines on CPU, and the
matrix section's errors."""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from core.errors import ConfigError
from core.memory import compute_offloaded_fraction
from core.records import CapacityResult, RankMemory, record_problems
from runner.capacity import bisect_ladder, build_capacity_config, build_ladder, predict_trial_memory
from runner.cli import main as runner_main
from runner.model import count_gpt_params

PROBE_MATRIX = """
[campaign]
name = "cap-test"
preset = "tiny"
[fixed]
steps = 3
warmup_steps = 1
[capacity]
ladder = [[2, 128], [2, 512]]
probe_steps = 2
probe_warmup_steps = 1
memory_budget_gib = 0.14
[[runs]]
name = "ddp"
strategy = "ddp"
world_size = 2
[[runs]]
name = "zero3-fsdp2"
strategy = "zero3"
engine = "fsdp2"
world_size = 2
"""


@pytest.mark.parametrize("num_rungs", [1, 2, 5, 8])
def test_bisection_finds_every_boundary_in_log_trials(num_rungs):
    for largest in [None, *range(num_rungs)]:
        tried = []

        def fits(rung: int) -> bool:
            tried.append(rung)
            return largest is not None and rung <= largest

        assert bisect_ladder(num_rungs, fits) == largest
        assert len(tried) <= math.ceil(math.log2(num_rungs + 1)) and len(set(tried)) == len(tried)


def test_offload_moves_the_stated_share_of_model_states():
    assert compute_offloaded_fraction(sharding="zero3", offload="none") == 0.0
    assert compute_offloaded_fraction(sharding="zero3", offload="optimizer") == 12 / 16
    assert compute_offloaded_fraction(sharding="zero3", offload="optimizer+param") == 1.0
    with pytest.raises(ConfigError, match="needs the zero3 sharding"):
        compute_offloaded_fraction(sharding="ddp", offload="optimizer")


def test_pinned_host_bytes_round_each_tensor_to_a_power_of_two():
    from core.memory import compute_fsdp2_offload_host_bytes, list_gpt_param_shapes, round_pinned_bytes
    from core.perfmodel import build_shape
    from runner.presets import PRESETS, build_model_config

    assert [round_pinned_bytes(n) for n in (0, 1, 4096, 4097, 3 << 20)] == [0, 1, 4096, 8192, 4 << 20]
    cfg = build_model_config(PRESETS["gpt-125m"], max_tp_degree=1)
    shape = build_shape(cfg, name="gpt-125m")
    shapes = list_gpt_param_shapes(shape)
    assert sum(a * b for a, b in shapes) == count_gpt_params(cfg)
    expected = sum(2 * round_pinned_bytes(4 * a * b) + 8 * a * b for a, b in shapes)
    assert compute_fsdp2_offload_host_bytes(shape, shard_degree=1) == expected
    # over 2 ranks each tensor's rows are split (dim 0 padded up), so a rank holds about half
    half = compute_fsdp2_offload_host_bytes(shape, shard_degree=2)
    assert expected / 2 <= half < expected / 2 * 1.01 + 2 * 4 * 50304 * 768


def test_ladder_keeps_the_head_size_and_mlp_ratio():
    from runner.presets import PRESETS, build_model_config

    base = build_model_config(PRESETS["gpt-125m"], max_tp_degree=1)
    ladder = build_ladder(base, ((12, 768), (24, 1024), (32, 2560)), where="m.toml")
    assert [(m.num_heads, m.ffn_hidden_size) for m in ladder] == [(12, 3072), (16, 4096), (40, 10240)]
    assert count_gpt_params(ladder[0]) == 124_475_904  # GPT-2 small, vocab padded to 50304
    with pytest.raises(ConfigError, match=r"ladder\[0\]: hidden_size 100 is not a multiple of the head size 64"):
        build_ladder(base, ((2, 100),), where="m.toml")
    with pytest.raises(ConfigError, match="must grow in parameters"):
        build_ladder(base, ((24, 1024), (12, 768)), where="m.toml")


def test_capacity_section_errors_name_every_field():
    with pytest.raises(ConfigError) as e:
        build_capacity_config({"ladder": [[2, 64], [2]], "probe_steps": 1, "budget": 1}, where="m.toml", device="cpu")
    lines = str(e.value).splitlines()
    assert lines == [
        "m.toml [capacity]: unknown key 'budget' (valid: ladder, memory_budget_gib, probe_steps, probe_warmup_steps)",
        "m.toml [capacity] ladder[1]: must be [num_layers, hidden_size], positive integers, got [2]",
        "m.toml [capacity] probe_steps: must be an integer >= 2, got 1",
        "m.toml [capacity] probe_steps (1) must exceed probe_warmup_steps (2), or no step is timed",
        "m.toml [capacity] memory_budget_gib: required on CPU (a per-process limit for the probe to find; e.g. 0.5), "
        "or plan a GPU matrix here with --dry-run --gpus N",
    ]


def test_bad_matrix_is_one_line_per_problem_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(PROBE_MATRIX.replace("memory_budget_gib = 0.14", "memory_budget_gib = -1"), encoding="utf-8")
    assert runner_main(["capacity", "--matrix", str(bad), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err == f"runner: error: {bad} [capacity] memory_budget_gib: must be a number > 0, got -1\n"


def test_offload_keeps_states_off_the_device_in_the_prediction(tmp_path, capsys):
    matrix = tmp_path / "m.toml"
    matrix.write_text(PROBE_MATRIX + '[[runs]]\nname = "off"\nstrategy = "zero3"\nworld_size = 2\n'
                      "options = {offload_optimizer = true, offload_param = true}\n", encoding="utf-8")
    assert runner_main(["capacity", "--matrix", str(matrix), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "rung 1: 2 layers x hidden 512 (32 heads, ffn 2048): 6.9M params" in out
    assert "trials: ceil(log2(2 + 1)) = 2 per layout" in out
    from runner.matrix import load_matrix, resolve_matrix

    runs = {s.name: s for s in resolve_matrix(load_matrix(matrix), source="m", num_gpus=0).runs}
    fsdp2, off = predict_trial_memory(runs["zero3-fsdp2"]), predict_trial_memory(runs["off"])
    assert off[0] == pytest.approx(fsdp2[0]) and off[3] == pytest.approx(off[0])  # all states on the host
    assert off[2] == pytest.approx(fsdp2[1])  # the device keeps the activations only


# One rank of a real engine, in its own process: DeepSpeed and FSDP2 patch process-wide state
# (torch functions, environment variables) that later tests in the same process would inherit.
_OFFLOAD_TRAIN = """
import json, math, os, socket, sys
import torch
import torch.distributed as dist
from runner.matrix import resolve_matrix
from runner.strategies import RankContext, build_trainer

engine, options = sys.argv[1], json.loads(sys.argv[2])
raw = {"campaign": {"name": "off", "preset": "tiny", "kernels": "engine-best"},
       "runs": [{"name": "z", "strategy": "zero3", "engine": engine, "world_size": 1, "options": options}]}
spec = resolve_matrix(raw, source="m", num_gpus=0).runs[0]
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
try:
    trainer = build_trainer(spec, ctx=RankContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu")))
    if engine == "deepspeed":
        offloaded = bool(trainer.engine.zero_offload_optimizer() and trainer.engine.zero_offload_param())
    else:
        from torch.distributed.fsdp import CPUOffloadPolicy
        offloaded = isinstance(trainer.model._get_fsdp_state()._fsdp_param_group.offload_policy, CPUOffloadPolicy)
    x = torch.randint(0, 1000, (4, spec.fixed.model.seq_length))
    out = trainer.train_step([(x, x)], lr=1e-3)
    print(json.dumps({"offloaded": offloaded, "loss": float(out.loss),
                      "fused": [bool(g.get("fused")) for g in trainer.optimizer.param_groups],
                      "grad_norm": None if out.grad_norm is None else float(out.grad_norm)}))
finally:
    dist.destroy_process_group()
"""


@pytest.mark.parametrize("engine,options", [
    ("fsdp2", {"offload": True}),
    ("fsdp2", {"offload": True, "fused_adamw": True}),
    ("deepspeed", {"offload_optimizer": True, "offload_param": True,
                   "zero": {"reduce_bucket_size": 500_000, "stage3_prefetch_bucket_size": 500_000}}),
    ("deepspeed", {"offload_optimizer": True, "offload_param": True, "fused_adamw": True,
                   "zero": {"reduce_bucket_size": 500_000, "stage3_prefetch_bucket_size": 500_000}}),
])
def test_offload_engines_train_on_cpu(engine, options):
    """The real engines take their CPU offload path (one rank, gloo) and train a step, with the
    host optimizer foreach or fused (``fused_adamw``: a CUDA run's offloaded AdamW steps fused)."""
    import subprocess
    import sys
    from pathlib import Path

    res = subprocess.run([sys.executable, "-c", _OFFLOAD_TRAIN, engine, json.dumps(options)], capture_output=True,
                         text=True, timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["offloaded"] and math.isfinite(out["loss"])
    assert set(out["fused"]) == {bool(options.get("fused_adamw"))}
    if engine == "fsdp2":  # DeepSpeed's offload path leaves its engine's global grad norm unset (None)
        assert out["grad_norm"] > 0


def test_weights_drawn_on_the_device_are_created_there():
    """build_gpt(on_device=True) creates the fp32 GPT on the device itself ('meta' here: no data,
    so nothing can have been drawn on the host and copied), the LM head still tied to the embedding
    and every parameter counted; the default path draws on the host and moves the weights."""
    import torch

    from runner.model import build_gpt
    from runner.presets import PRESETS, build_model_config

    cfg = build_model_config(PRESETS["tiny"], max_tp_degree=1)
    model = build_gpt(cfg, device=torch.device("meta"), on_device=True)
    assert all(p.is_meta for p in model.parameters()) and model.lm_head.weight is model.wte.weight
    assert sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) == count_gpt_params(cfg)
    torch.manual_seed(0)
    host = build_gpt(cfg, device=torch.device("cpu"))
    torch.manual_seed(0)
    drawn = build_gpt(cfg, device=torch.device("cpu"), on_device=True)  # the CPU's generator either way
    assert all(torch.equal(a, b) for a, b in zip(host.parameters(), drawn.parameters()))


def test_probe_finds_the_boundary_under_a_real_budget(tmp_path, capsys):
    """DDP (16 bytes/param per rank) runs out of the 0.14 GiB budget at 6.9M parameters, ZeRO-3
    over 2 ranks (8 bytes/param) does not: each boundary from real trials, OOMs classified."""
    matrix = tmp_path / "m.toml"
    matrix.write_text(PROBE_MATRIX, encoding="utf-8")
    out = tmp_path / "cap"
    assert runner_main(["capacity", "--matrix", str(matrix), "--out", str(out)]) == 0
    data = json.loads((out / "capacity.json").read_text(encoding="utf-8"))
    assert record_problems(CapacityResult, data) == []
    got = {(t["layout"], t["rung"]): t for t in data["trials"]}
    assert {k: t["status"] for k, t in got.items()} == {
        ("ddp", 0): "ok", ("ddp", 1): "oom", ("zero3-fsdp2", 0): "ok", ("zero3-fsdp2", 1): "ok"}
    assert "DefaultCPUAllocator: can't allocate memory" in got[("ddp", 1)]["cause"]
    for t in (t for t in data["trials"] if t["status"] == "ok"):
        assert all(0 < m < 0.14 for m in t["mem_peak_gib"]) and t["tokens_per_s"] > 0
        for r in range(2):
            mem = json.loads((out / t["run_dir"] / "memory" / f"rank{r}.json").read_text(encoding="utf-8"))
            assert record_problems(RankMemory, mem) == [] and mem["limit_mechanism"] == "RLIMIT_DATA"
            assert mem["mem_peak_gib"] == t["mem_peak_gib"][r]
    # every trial draws its weights on its device (runner.model.build_gpt)
    for t in data["trials"]:
        spec = json.loads((out / t["run_dir"] / "spec.json").read_text(encoding="utf-8"))
        assert spec["options"]["init_on_device"] is True
    # ZeRO-3 at the larger rung holds less per rank than DDP would: its states are halved
    assert got[("zero3-fsdp2", 1)]["predicted_state_gib"] == pytest.approx(
        16 * 6_884_608 / 2 / 2**30, rel=0.02)


def _trial(layout, rung, params, status, *, tps=None, peak=(), offload="none", engine="deepspeed", pred=1.0):
    from core.records import CapacityTrial

    return CapacityTrial(layout=layout, strategy="zero3" if engine != "torch-ddp" else "ddp", engine=engine,
                         offload=offload, world_size=1, tp_degree=1, pp_degree=1, dp_degree=1, rung=rung,
                         num_params=params, run_dir=f"{layout}/rung{rung}", status=status,
                         cause="CUDA out of memory" if status == "oom" else None, duration_s=10.0,
                         mem_peak_gib=peak, mem_measure="cuda max_memory_allocated" if peak else None,
                         host_peak_rss_gib=(), tokens_per_s=tps, step_time_s=None, predicted_state_gib=pred,
                         predicted_activation_gib=0.0, predicted_device_gib=pred if offload == "none" else 0.1,
                         predicted_host_gib=0.0 if offload == "none" else pred)


def test_note_capacity_section_prints_the_recorded_trials(tmp_path):
    """Largest measured per layout, predicted fit, offload's step-time ratio: each from capacity.json."""
    import dataclasses

    from core.atomic import write_json_atomic
    from core.records import CapacityResult, ModelConfig, to_dict
    from report.cli import main as report_main
    from tests.synthetic_campaign import write_synthetic_campaign

    camp = write_synthetic_campaign(tmp_path / "c", device_name="NVIDIA H100 80GB HBM3")
    base = ModelConfig(num_layers=12, hidden_size=768, num_heads=12, ffn_hidden_size=3072, seq_length=1024,
                       vocab_size=50257, padded_vocab_size=50304)
    ladder = (base, dataclasses.replace(base, num_layers=24, hidden_size=1024, num_heads=16, ffn_hidden_size=4096))
    p0, p1 = count_gpt_params(ladder[0]), count_gpt_params(ladder[1])
    result = CapacityResult(
        name="cap", created_at="2026-01-01T00:00:00+00:00", device="cuda", device_name="NVIDIA H100 80GB HBM3",
        memory_limit_gib=79.2, limit_kind="gpu", probe_steps=3, probe_warmup_steps=1, micro_batch_size=1,
        global_batch_size=8, ladder=ladder, layouts=("zero3", "zero3-offload"), trials=(
            _trial("zero3", 0, p0, "ok", tps=400_000.0, peak=(2.5,), pred=2.0),
            _trial("zero3", 1, p1, "oom", pred=90.0),
            _trial("zero3-offload", 0, p0, "ok", tps=100_000.0, peak=(0.5,), offload="optimizer+param", pred=2.0),
            _trial("zero3-offload", 1, p1, "ok", tps=50_000.0, peak=(0.9,), offload="optimizer+param", pred=90.0)))
    write_json_atomic(camp / "capacity" / "capacity.json", to_dict(result))
    out = tmp_path / "note"
    assert report_main(["build", str(camp), "--out", str(out), "--format", "md,html"]) == 0
    md = (out / "note.md").read_text(encoding="utf-8")
    assert "| zero3 | deepspeed | none | 1 × 1 × 1 | 124 M | 124 M | 400 k | 2.50 GiB | 355 M: oom |" in md
    # predicted: the offloaded states live on the host, so 354M fits the GPU by the model too
    assert "| zero3-offload | deepspeed | optimizer+param | 1 × 1 × 1 | 355 M (top of the ladder) | 355 M | 50 k |" in md
    assert ("zero3-offload at 124 M: 100 k tokens/s against 400 k for zero3, 4.00× the step time, largest trained"
            " +230 M parameters beyond it") in md
    assert "| zero3 | 124 M | ok | 2.50 GiB | 2.00 GiB | +25.0% |" in md
    html = (out / "note.html").read_text(encoding="utf-8")
    assert "Capacity: the largest model each layout trains" in html and "4.00×" in html


def test_a_damaged_capacity_file_is_one_line_in_the_note(tmp_path):
    from report.cli import main as report_main
    from tests.synthetic_campaign import write_synthetic_campaign

    camp = write_synthetic_campaign(tmp_path / "c")
    (camp / "capacity").mkdir()
    (camp / "capacity" / "capacity.json").write_text('{"name": 3}', encoding="utf-8")
    assert report_main(["build", str(camp), "--out", str(tmp_path / "n"), "--format", "md"]) == 0
    md = (tmp_path / "n" / "note.md").read_text(encoding="utf-8")
    assert "Capacity probe not shown: capacity/capacity.json: does not match CapacityResult (" in md
    assert "### Capacity" not in md


def test_a_stopped_probe_keeps_the_interrupted_trial(tmp_path):
    """SIGTERM during a trial: the launcher marks it 'interrupted', capacity.json keeps it as such
    (not as a size that did not fit), and the command exits 130."""
    import signal
    import subprocess
    import time

    matrix = tmp_path / "m.toml"
    matrix.write_text(PROBE_MATRIX, encoding="utf-8")
    out = tmp_path / "cap"
    proc = subprocess.Popen([sys.executable, "-m", "runner.cli", "capacity", "--matrix", str(matrix), "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(out.glob("*/rung*/metrics/rank0.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-2000:]
    data = json.loads((out / "capacity.json").read_text(encoding="utf-8"))
    assert record_problems(CapacityResult, data) == []
    assert data["trials"] and data["trials"][-1]["status"] == "interrupted", data["trials"]


def test_a_dry_run_and_its_errors_do_not_import_torch():
    """`runner capacity --dry-run` plans with core's formulas only: no torch import, so it and its
    errors answer at once; a negative --gpus is one line."""
    import subprocess

    code = ("import sys; from runner.cli import main; rc = main(['capacity', '--matrix', "
            "'examples/matrices/1gpu-capacity-h100-quick.toml', '--dry-run', '--gpus', '1']); "
            "assert rc == 0 and 'torch' not in sys.modules, (rc, 'torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "5,118.0M params" in res.stdout
    bad = subprocess.run([sys.executable, "-m", "runner.cli", "capacity", "--dry-run", "--gpus", "-2"],
                         cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.strip() == "runner: error: --gpus -2: must be 0 (CPU) or more"
