"""The note's predicted block on the committed H200 campaign (examples/h200-1gpu): leave-one-out
predictions of the runs it made within 15% of the measured step time, printed in the note, and
the layouts it did not run marked as predictions."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from core.records import FixedConfig, ModelConfig
from report.predict import _Rate, build_comm, choose_rate
from core.perfmodel import build_run_layout, build_shape, solve_rate, predict_run
from report.render import load_note, render_html, render_markdown
from runner.cli import main as runner_main
from core.perfmodel import Layout, build_comm_model, load_links

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "h200-1gpu"
RUNS = ("ddp", "zero3", "megatron-tp1-pp1")


@pytest.fixture(scope="module")
def note():
    return load_note(EXAMPLE)[2]


def test_runs_predicted_within_15_percent_without_their_own_measurement(note):
    p = note.predicted
    assert [c.run for c in p.checks] == list(RUNS)
    for c in p.checks:
        assert c.error is not None and abs(c.error) <= 0.15, (c.run, c.error)
        assert c.predicted_step_time_s == pytest.approx(c.measured_step_time_s * (1 + c.error))
        assert f"{c.run} (" not in c.calibration  # leave-one-out: never calibrated on itself
    by_run = {c.run: c for c in p.checks}
    # DDP is the only compiled run: its rate is the eager runs' carried by the separately measured speed-up
    assert "torch.compile speed-up 1.46" in by_run["ddp"].calibration
    assert by_run["zero3"].calibration == "other eager engines: megatron-tp1-pp1 (megatron, eager)"
    assert p.max_abs_error == max(abs(c.error) for c in p.checks)
    # one GPU, no communication: the solved rate is the run's MFU x the H200's dense peak
    mfu = {m.run: m.mfu for m in note.metrics}
    for c in p.checks:
        assert c.rate_flops == pytest.approx(mfu[c.run] * 989.4e12, rel=1e-4)


def test_unrun_layouts_are_predicted_on_2_and_8_gpus(note):
    layouts = note.predicted.layouts
    keys = {(l.num_gpus, l.strategy, l.tp_degree, l.pp_degree, l.dp_degree) for l in layouts}
    assert {(8, "zero3", 1, 1, 8), (8, "tp_pp", 2, 2, 2), (2, "ddp", 1, 1, 2), (2, "tp_pp", 1, 2, 1)} <= keys
    assert all(l.num_gpus in (2, 8) for l in layouts)  # the campaign's own 1-GPU layouts are not "predicted"
    tp2pp2 = next(l for l in layouts if (l.num_gpus, l.tp_degree, l.pp_degree) == (8, 2, 2))
    assert tp2pp2.bubble_fraction == pytest.approx(1 / 9)  # (p-1)/(m+p-1), m = 8 = the runner's m >= 4p at mb 8
    assert tp2pp2.micro_batch_size == 8 and tp2pp2.num_microbatches == 8
    assert tp2pp2.exposed_comm_s > 0 and tp2pp2.comm_bytes_per_step > 0
    zero3 = next(l for l in layouts if (l.num_gpus, l.strategy) == (8, "zero3"))
    # ZeRO-3 moves 3 x the bf16 parameters per micro-batch (ZeRO s7: 1.5 x DDP's 2)
    ddp = next(l for l in layouts if (l.num_gpus, l.strategy) == (8, "ddp"))
    assert zero3.comm_bytes_per_step == pytest.approx(3 * ddp.comm_bytes_per_step)
    assert "nominal NVLink 4" in note.predicted.comm_source


def test_note_prints_the_errors_and_marks_predictions(note):
    md = render_markdown(note)
    block = md.split("## Predictions (performance model, not measurements)", 1)[1].split("## Appendix", 1)[0]
    for c in note.predicted.checks:
        line = next(x for x in block.splitlines() if x.startswith(f"| {c.run} |"))
        sign = "+" if c.error >= 0 else "−"
        assert f"{sign}{abs(c.error) * 100:.1f}%" in line
    assert "PREDICTED, not measured" in block and "Largest step-time error" in block
    assert "benchmarks/results/h200-tuning/bench_gpu.json" in block  # the calibration source is stated
    html = render_html(note)
    assert "<h2>Predictions (performance model, not measurements)</h2>" in html and "PREDICTED, not measured" in html


def test_choose_rate_rule():
    pool = [_Rate(run="a", engine="megatron", compiled=False, rate=3.0),
            _Rate(run="b", engine="deepspeed", compiled=False, rate=1.0),
            _Rate(run="c", engine="megatron", compiled=False, rate=5.0)]
    kw = dict(speedup=2.0, speedup_source="s")
    assert choose_rate(pool, engine="megatron", compiled=False, exclude="a", **kw)[0] == 5.0
    assert choose_rate(pool, engine="torch-ddp", compiled=False, exclude=None, **kw)[0] == 3.0
    rate, how = choose_rate(pool, engine="torch-ddp", compiled=True, exclude=None, **kw)
    assert rate == 6.0 and "x torch.compile speed-up 2" in how
    assert choose_rate(pool[:1], engine="megatron", compiled=False, exclude="a", **kw) == (
        None, "no other run to calibrate from")


def test_solve_rate_inverts_a_multi_gpu_prediction():
    model = ModelConfig(num_layers=12, hidden_size=768, num_heads=12, ffn_hidden_size=3072, seq_length=1024,
                        vocab_size=50257, padded_vocab_size=50304)
    fixed = FixedConfig(preset="gpt-125m", model=model, global_batch_size=128, dtype="bf16", seed=0, steps=10,
                        warmup_steps=1, lr=6e-4, min_lr=6e-5, lr_warmup_steps=1, weight_decay=0.1, adam_beta1=0.9,
                        adam_beta2=0.95, grad_clip=1.0, data="synthetic")
    shape = build_shape(fixed.model, name="gpt-125m")
    links = load_links()
    comm = build_comm_model([], intra=links["pcie4"], inter=None, gpus_per_node=8)
    lay = Layout(tp_degree=2, pp_degree=2, dp_degree=2, micro_batch_size=8, num_microbatches=8,
                 sharding="megatron-distopt", sequence_parallel=True)
    step = predict_run(shape, lay, fixed=fixed, comm=comm, rate=200e12, num_gpus_per_node=8,
                    memory_limit_bytes=float("inf")).step_time_s
    assert solve_rate(shape, lay, fixed=fixed, comm=comm, step_time_s=step, num_gpus_per_node=8) == pytest.approx(
        200e12, rel=1e-6)
    # faster than communication alone allows: no rate reproduces it
    assert solve_rate(shape, lay, fixed=fixed, comm=comm, step_time_s=1e-6, num_gpus_per_node=8) is None


def test_campaign_commbench_table_replaces_nominal_links(tmp_path):
    rows = [{"op": op, "nbytes": n, "world_size": 2, "num_nodes": 1, "dtype": "float32", "num_iters": 5,
             "time_us": n / 100e9 * 1e6 * f, "algbw_gbps": 100 / f, "busbw_gbps": 100.0, "backend": "nccl",
             "device": "cuda", "device_name": "NVIDIA H200"}
            for op, f in (("all_reduce", 1.0), ("all_gather", 0.5), ("reduce_scatter", 0.5), ("send_recv", 1.0))
            for n in (1 << 20, 1 << 26)]
    (tmp_path / "commbench").mkdir()
    (tmp_path / "commbench" / "commbench.json").write_text(json.dumps({"kind": "commbench", "schema_version": 1,
                                                                       "rows": rows}))
    comm, source = build_comm(tmp_path, gpu_name="NVIDIA H200", device="cuda", gpus_per_node=8)
    assert source.startswith("measured: runner commbench, all_gather on 2 ranks")
    assert comm.curve("all_reduce", "intra").measured
    _, nominal = build_comm(tmp_path / "nothing", gpu_name="NVIDIA H200", device="cuda", gpus_per_node=8)
    assert nominal.startswith("nominal NVLink 4")


def test_run_layouts_follow_the_specs():
    from synthetic_campaign import make_run

    spec = dataclasses.replace(make_run("m", strategy="tp_pp", engine="megatron", world_size=8, tp_degree=2, pp_degree=2,
                                        dp_degree=2, options={"use_distributed_optimizer": True}).spec,
                               micro_batch_size=4, num_microbatches=8)
    lay = build_run_layout(spec, compiled=None)
    assert (lay.sharding, lay.sequence_parallel, lay.logits_bytes) == ("megatron-distopt", True, 4)
    eager = build_run_layout(dataclasses.replace(make_run("d", world_size=2).spec, micro_batch_size=4,
                                                 num_microbatches=8), compiled=False)
    assert (eager.sharding, eager.logits_bytes) == ("ddp", 10)


def test_plan_calibrated_on_the_campaign(capsys, tmp_path):
    code = runner_main(["plan", "--model", "gpt-125m", "--gpus", "8", "--gpu", "h200_sxm", "--calibration",
                        str(EXAMPLE), "--out", str(tmp_path / "p.json")])
    assert code == 0, capsys.readouterr().err
    data = json.loads((tmp_path / "p.json").read_text())
    eff = data["request"]["efficiency"]
    assert eff["torch-ddp"]["efficiency"] == pytest.approx(0.436, abs=0.001)
    assert eff["deepspeed"]["efficiency"] == pytest.approx(0.298, abs=0.001)
    assert eff["megatron"]["efficiency"] == pytest.approx(0.301, abs=0.001)
    assert all(q["compute_efficiency"] == eff[q["layout"]["engine"]]["efficiency"] for q in data["layouts"])


def test_cpu_campaign_needs_a_gloo_commbench_then_predicts(tmp_path):
    """A CPU campaign (SYNTHETIC step rows, tests/synthetic_campaign.py) has no nominal link: the
    block says to run commbench; with a gloo table beside it the multi-process runs are calibrated
    and predicted leave-one-out (no unrun layouts: those are for GPU campaigns)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from synthetic_campaign import write_synthetic_campaign

    root = write_synthetic_campaign(tmp_path)
    p = load_note(root)[2].predicted
    assert p.layouts == () and p.reason.startswith("No layouts predicted: this is a CPU campaign")
    assert all(c.predicted_step_time_s is None for c in p.checks)
    assert "runner commbench --device cpu --out CAMPAIGN/commbench" in p.checks[0].calibration
    rows = [{"op": op, "nbytes": n, "world_size": 2, "num_nodes": 1, "dtype": "float32", "num_iters": 3,
             "time_us": 100 + n / 1e3, "algbw_gbps": n / ((100 + n / 1e3) * 1e3), "busbw_gbps": 0.0,
             "backend": "gloo", "device": "cpu"} for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
            for n in (4096, 65536, 1 << 20)]
    for r in rows:
        r["busbw_gbps"] = r["algbw_gbps"] * (1.0 if r["op"] == "all_reduce" else 0.5 if r["op"] != "send_recv" else 1.0)
    (root / "commbench").mkdir()
    (root / "commbench" / "commbench.json").write_text(json.dumps({"kind": "commbench", "schema_version": 1,
                                                                   "rows": rows}))
    p = load_note(root)[2].predicted
    assert p.comm_source.startswith("measured: runner commbench")
    checks = {c.run: c for c in p.checks}
    assert checks["ddp"].calibration == "other eager engines: zero3 (deepspeed, eager)"
    assert checks["ddp"].error is not None and checks["zero3"].error is not None
    assert checks["tp_pp"].measured_step_time_s is None  # the OOM run: nothing measured, nothing checked


def test_category_checks_scale_transfer_and_bubble_by_runs_of_the_same_pattern():
    """Planted breakdowns on the committed 2-GPU campaign's PP2 and TP2 specs: a twin of PP2 whose
    measured transfer is 3x and bubble 2x what the model gives at its own traced rate makes PP2's
    predicted transfer 3x and bubble 2x its modelled ones; TP2 (another pattern, 10x transfer)
    scales nothing of PP2's; PP2's host time is the median of the other megatron runs', and TP2 has
    no other run of its pattern, so its transfer is the model's, unscaled."""
    import math

    from ingest.io import load_campaign
    from report.predict import _modelled, build_category_checks

    example = EXAMPLE.parent / "h200-2gpu"
    campaign = load_campaign(example)
    fixed = campaign.campaign.fixed
    by_name = {r.name: r for r in campaign.run_records()}
    pp2, tp2 = by_name["megatron-pp2"], by_name["megatron-tp2"]
    twin = dataclasses.replace(pp2, spec=dataclasses.replace(pp2.spec, name="megatron-pp2-twin"))
    runs = [pp2, twin, tp2]
    shape = build_shape(fixed.model, name="gpt-125m")
    comm, _ = build_comm(example, gpu_name="NVIDIA H200", device="cuda", gpus_per_node=8)
    layouts = {r.name: build_run_layout(r.spec, compiled=r.compiled) for r in runs}
    rate = 2.0e14  # FLOP/s: the twin's traced compute is what the model gives at this rate
    twin_model = _modelled(shape, layouts[twin.name], fixed=fixed, comm=comm, rate=rate, per_node=2)
    tp2_model = _modelled(shape, layouts[tp2.name], fixed=fixed, comm=comm, rate=rate, per_node=2)
    assert twin_model["transfer"] >= 0.5 and twin_model["bubble"] >= 0.5 and tp2_model["transfer"] >= 0.5

    def breakdown(compute: float, transfer: float, bubble: float, host: float) -> dict:
        return {"compute": compute, "transfer": transfer, "bubble": bubble, "imbalance": 0.0, "skew_wait": host / 2,
                "launch_gaps": host / 2, "data_stall": 0.0, "other": 0.0}

    measured = {twin.name: breakdown(twin_model["compute"], 3 * twin_model["transfer"], 2 * twin_model["bubble"], 40.0),
                pp2.name: breakdown(150.0, 1.0, 30.0, 10.0),
                tp2.name: breakdown(tp2_model["compute"], 10 * tp2_model["transfer"], 0.0, 300.0)}
    checks = {c.run: c for c in build_category_checks(shape, fixed=fixed, runs=runs, layouts=layouts, comm=comm,
                                                      per_node=2, measured=measured, speedup=1.0)}
    k = checks[pp2.name]
    # PP2 is predicted at the mean rate of the other megatron runs: the twin's and TP2's (both `rate`)
    mine = _modelled(shape, layouts[pp2.name], fixed=fixed, comm=comm, rate=rate, per_node=2)
    assert k.predicted_ms["compute"] == pytest.approx(mine["compute"], rel=1e-6)
    assert k.predicted_ms["transfer"] == pytest.approx(3 * mine["transfer"], rel=1e-6)
    assert k.predicted_ms["bubble"] == pytest.approx(2 * mine["bubble"], rel=1e-6)
    assert k.transfer_from == (twin.name,) and k.bubble_from == (twin.name,)
    assert k.predicted_ms["other"] == pytest.approx(170.0)  # the median of the twin's 40 and TP2's 300
    assert k.host_same_engine and set(k.host_from) == {twin.name, tp2.name}
    t = checks[tp2.name]
    assert t.transfer_from == () and t.predicted_ms["transfer"] == pytest.approx(tp2_model["transfer"], rel=1e-6)
    assert math.isclose(t.step_predicted_ms, sum(t.predicted_ms.values()))


def test_category_checks_on_the_committed_campaigns():
    """One H200, five engines: every run's step predicted from the others within 25% (the issue's
    target). Two H200s: DDP, DeepSpeed and FSDP2 are each their engine's only run, so their host
    time comes from other engines and is marked so; the two Megatron runs calibrate each other."""
    engines = load_note(EXAMPLE.parent / "h200-1gpu-engines")[2].predicted
    assert len(engines.category_checks) == 5
    assert all(abs(k.step_error) <= 0.25 for k in engines.category_checks), \
        [(k.run, k.step_error) for k in engines.category_checks]
    two = {k.run: k for k in load_note(EXAMPLE.parent / "h200-2gpu")[2].predicted.category_checks}
    assert {r for r, k in two.items() if not k.host_same_engine} == {"ddp", "zero3", "zero3-fsdp2"}
    assert two["megatron-tp2"].host_from == ("megatron-pp2",) and two["megatron-pp2"].host_from == ("megatron-tp2",)
    assert not two["ddp"].calibrated  # +175%: shown, never used
