"""`runner plan`: golden numbers for the memory formulas and the worked examples, and the
explanations it gives for impossible requests.

The worked examples ("v7 seed": 70B on 64 GPUs, Llama 3 405B at 8K and 128K, a 1T model on
8192 H100s) are reproduced from published configurations; each test's docstring states the
assumptions that reproduce the seed's figure. GB here is 1e9 bytes, as the seed writes it.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from core import memory as mem
from runner.cli import main as runner_main
from runner.model import count_gpt_params
from core.perfmodel import (
    CommModel, Layout, build_comm_model, compute_collective_time_s, compute_layout_memory, compute_time_to_train_s, load_links, predict_layout,
)
from core.formulas import compute_bus_factor
from runner.presets import PRESETS, build_model_config
from runner.shapes import SHAPES
from core.formulas import compute_model_flops_per_token, count_params

GB = 1e9
DAY_S = 86400.0
H100_BF16 = 989.4e12


def _comm() -> CommModel:
    links = load_links()
    return build_comm_model([], intra=links["nvlink4"], inter=links["ib_ndr"], gpus_per_node=8)


def test_gpt125m_matches_the_campaign_model():
    """The planner's closed form equals the torch model's count and the note's FLOPs/token."""
    shape = SHAPES["gpt-125m"]
    assert count_params(shape) == count_gpt_params(build_model_config(PRESETS["gpt-125m"], max_tp_degree=1)) == 124_475_904
    assert compute_model_flops_per_token(shape, seq_length=1024) == 855_383_040


def test_published_parameter_counts():
    """Llama 2 70B ≈ 69.0B, Llama 3 405B ≈ 405.9B (Dubey et al. 2024: "405B"), the 1T GPT ≈ 1.008T
    (Narayanan et al. 2021 Table 1: 1008 B), GPT-3 ≈ 174.6B (Brown et al. 2020: "175B")."""
    assert count_params(SHAPES["llama2-70b"]) == 68_976_648_192
    assert count_params(SHAPES["llama3-405b"]) == 405_853_388_800
    assert round(count_params(SHAPES["gpt-1t"]) / 1e9) == 1008
    assert round(count_params(SHAPES["gpt3-175b"]) / 1e9, 1) == 174.6


def test_zero_paper_figure1_golden():
    """ZeRO (Rajbhandari et al. 2020) Figure 1: Ψ = 7.5B on N_d = 64 GPUs, K = 12: baseline
    120 GB, Pos 31.4 GB, Pos+g 16.6 GB, Pos+g+p 1.9 GB per GPU."""
    psi, d = 7.5e9, 64
    got = {s: psi * mem.compute_state_bytes_per_param(sharding=s, shard_degree=d) / GB
           for s in ("ddp", "zero1", "zero2", "zero3")}
    assert got == pytest.approx({"ddp": 120.0, "zero1": 31.4, "zero2": 16.6, "zero3": 1.875}, abs=0.05)


def test_megatron_distributed_optimizer_bytes():
    """Megatron-LM dist_optimizer.md, "bf16 param, fp32 grads": 18 bytes/param without, 6 + 12/d with."""
    assert mem.compute_state_bytes_per_param(sharding="megatron", shard_degree=8) == 18
    assert mem.compute_state_bytes_per_param(sharding="megatron-distopt", shard_degree=8) == 6 + 12 / 8
    assert mem.compute_state_bytes_per_param(sharding="megatron-distopt", shard_degree=1) == 18


def test_korthikanti_activation_golden():
    """Korthikanti et al. 2022 on GPT-3 175B (s = 2048, b = 1, h = 12288, a = 96), t = 8, bytes per layer:
    eq. 1 sbh(34 + 5as/h); eq. 2 (TP) sbh(10 + 24/t + 5as/(ht)); eq. 4 (TP+SP) sbh(34/t + 5as/(ht));
    selective recompute + SP sbh·34/t; full recompute 2sbh (with SP / t)."""
    shape, s, b, h, a, t = SHAPES["gpt3-175b"], 2048, 1, 12288, 96, 8
    sbh = s * b * h
    f = lambda **kw: mem.compute_activation_bytes_per_layer(shape, seq_length=s, micro_batch_size=b, **kw)  # noqa: E731
    assert f() == sbh * (34 + 5 * a * s / h) == 2_868_903_936
    assert f(tp_degree=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert f(tp_degree=t, sequence_parallel=True) == pytest.approx(sbh * (34 / t + 5 * a * s / (h * t)))
    assert f(tp_degree=t, sequence_parallel=True, recompute="selective") == pytest.approx(sbh * 34 / t)
    assert f(tp_degree=t, recompute="full") == 2 * sbh
    assert f(tp_degree=t, sequence_parallel=True, recompute="full") == 2 * sbh / t


def test_llama2_70b_on_64_gpus_is_39_gb_of_model_state():
    """Seed: ≈ 39 GB/GPU of model state for a 70B model on 64 GPUs. Reproduced by Llama 2 70B
    (80 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672, vocab 32000: Ψ = 68.98B) with TP 8
    inside the node, PP 2 across nodes, DP 4, and Megatron's distributed optimizer with fp32 main
    gradients: Ψ/(TP·PP) x (6 + 12/DP) = 4.31B x 9 B = 38.8 GB (70e9 exactly: 39.4 GB). The plain
    16Ψ/(TP·PP) readings do not give it: TP8 x PP4 is 34.5 GB, TP8 x PP2 69 GB."""
    shape = SHAPES["llama2-70b"]
    lay = Layout(tp_degree=8, pp_degree=2, dp_degree=4, micro_batch_size=1, num_microbatches=256,
                 sharding="megatron-distopt", sequence_parallel=True)
    state, _ = compute_layout_memory(shape, lay, seq_length=4096)
    assert state / GB == pytest.approx(38.8, abs=0.1)
    assert 70e9 / 16 * mem.compute_state_bytes_per_param(sharding="megatron-distopt", shard_degree=4) / GB == \
        pytest.approx(39.4, abs=0.05)
    assert 16 * count_params(shape) / 32 / GB == pytest.approx(34.5, abs=0.1)


def test_gpt_1t_on_8192_h100_is_48_gb_and_43_days():
    """Seed: the trillion-parameter design on 8192 H100s: ≈ 48 GB model state per GPU, ≈ 43 days.
    Assumptions that reproduce both: the 1T GPT of Narayanan et al. 2021 (128 layers, hidden 25600,
    160 heads, Ψ = 1.008T); TP 8 in the node, PP 16 across nodes, DP 64; Megatron distributed
    optimizer (6 + 12/64 = 6.19 B/param): Ψ/128 x 6.19 = 48.7 GB on a middle stage (1e12: 48.3 GB; the
    first stage, with the embedding, 49.7 GB). Time: 6ND with D = 2T tokens (Llama 2's budget) at
    40% MFU of the H100's dense 989.4 TFLOP/s: 43.2 days (42.9 for N = 1e12)."""
    shape = SHAPES["gpt-1t"]
    layers = mem.split_layers(num_layers=128, pp_degree=16)
    middle = mem.compute_stage_params(shape, stage=5, layers=layers, tp_degree=8)
    per_param = mem.compute_state_bytes_per_param(sharding="megatron-distopt", shard_degree=64)
    assert middle.dense * per_param / GB == pytest.approx(48.3, abs=0.5)
    lay = Layout(tp_degree=8, pp_degree=16, dp_degree=64, micro_batch_size=1, num_microbatches=48,
                 sharding="megatron-distopt", recompute="full", sequence_parallel=True)
    state, act = compute_layout_memory(shape, lay, seq_length=2048)
    assert 47 < state / GB < 50
    days = compute_time_to_train_s(num_params=count_params(shape), num_tokens=2e12, num_gpus=8192,
                                   peak_flops=H100_BF16, mfu=0.40) / DAY_S
    assert days == pytest.approx(43.2, abs=0.1)
    assert compute_time_to_train_s(num_params=1e12, num_tokens=2e12, num_gpus=8192, peak_flops=H100_BF16,
                                   mfu=0.40) / DAY_S == pytest.approx(42.8, abs=0.1)


def test_llama3_405b_at_8k_and_128k():
    """Llama 3 405B (Dubey et al. 2024): 6ND = 3.8e25 FLOPs for 15.6T tokens (s3.2.1); its layouts
    (Table 4) TP8 x PP16 x DP128 at 8K and TP8 x CP16 x PP16 x DP8 at 131K, 126 layers split
    7 + 14 x 8 + 7 (s3.3.2). With the distributed optimizer sharded over DP x CP = 128 both hold
    8 layers / TP8 x (6 + 12/128) = 3.19B x 6.09 B = 19.4 GB of model state on a middle stage
    (Ψ/128 x 6.09 = 19.3 GB on average). At 131K one layer's
    activations for one sequence are 8.5 GB even with TP8 + SP + flash attention, so without
    CP even one sequence in flight (DP 128, m = 1) needs 87.7 GB on the fullest stage; CP 16 brings the
    layer to 0.53 GB and the stage to 83 GB -- 4% over an 80 GB H100 by this accounting, which
    stores SwiGLU's gate, up and product (6sbF) where an implementation may recompute some (Meta
    ran it); with full recomputation it fits with room to spare."""
    shape = SHAPES["llama3-405b"]
    assert 6 * count_params(shape) * 15.6e12 == pytest.approx(3.8e25, rel=0.01)
    assert mem.split_layers(num_layers=126, pp_degree=16, uneven=True) == (7,) + (8,) * 14 + (7,)
    layers = mem.split_layers(num_layers=126, pp_degree=16, uneven=True)
    middle = mem.compute_stage_params(shape, stage=3, layers=layers, tp_degree=8)
    for cp, dp in ((1, 128), (16, 8)):
        state = mem.compute_model_state_bytes(middle, sharding="megatron-distopt", dp_degree=dp, cp_degree=cp)
        assert state / GB == pytest.approx(19.4, abs=0.05)
    per_layer = lambda s: mem.compute_activation_bytes_per_layer(  # noqa: E731
        shape, seq_length=s, micro_batch_size=1, tp_degree=8, sequence_parallel=True, recompute="selective")
    assert per_layer(131072) / GB == pytest.approx(8.52, abs=0.01)
    assert per_layer(131072 // 16) / GB == pytest.approx(0.533, abs=0.001)
    no_cp = Layout(tp_degree=8, pp_degree=16, dp_degree=128, micro_batch_size=1, num_microbatches=1,
                   sharding="megatron-distopt", sequence_parallel=True, uneven_pp=True)
    with_cp = Layout(tp_degree=8, pp_degree=16, cp_degree=16, dp_degree=8, micro_batch_size=1, num_microbatches=16,
                     sharding="megatron-distopt", sequence_parallel=True, uneven_pp=True)
    assert sum(compute_layout_memory(shape, no_cp, seq_length=131072)) / GB == pytest.approx(87.7, abs=0.1)
    assert sum(compute_layout_memory(shape, with_cp, seq_length=131072)) / GB == pytest.approx(83.3, abs=0.1)
    full = dataclasses.replace(with_cp, recompute="full")
    assert sum(compute_layout_memory(shape, full, seq_length=131072)) < 40 * GB


def test_bubble_and_interleaving():
    """1F1B idle fraction (p-1)/(m+p-1); interleaved (p-1)/(v·m + p - 1) (Narayanan et al. 2021 s2.2)."""
    shape = SHAPES["gpt-125m"]
    kw = dict(seq_length=1024, global_batch_size=64, gpus_per_node=8, peak_flops=H100_BF16, compute_efficiency=0.5,
              comm=_comm(), memory_limit_bytes=80 * GB)
    one = predict_layout(shape, Layout(pp_degree=4, micro_batch_size=4, num_microbatches=16), **kw)
    assert one.bubble_fraction == pytest.approx(3 / 19)
    two = predict_layout(shape, Layout(pp_degree=4, num_virtual_stages=2, micro_batch_size=4, num_microbatches=16), **kw)
    assert two.bubble_fraction == pytest.approx(3 / 35)
    # the last stage carries the LM head: 3 layers + a 50k-vocab head outweigh 3 layers alone
    assert one.stage_imbalance > 1.3


def test_nccl_tests_bus_factors_and_nominal_time():
    """nccl-tests PERFORMANCE.md: all-reduce 2(n-1)/n, all-gather / reduce-scatter (n-1)/n."""
    assert compute_bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert compute_bus_factor("all_gather", 8) == compute_bus_factor("reduce_scatter", 8) == 7 / 8
    assert compute_bus_factor("send_recv", 2) == 1
    curve = _comm().curve("all_reduce", "intra")
    # 1 GiB over 8 GPUs on nominal NVLink 4 (450 GB/s): 10 us + 1.75 x 2^30 / 450e9 s
    assert compute_collective_time_s(curve, nbytes=2**30, group_size=8) == pytest.approx(10e-6 + 1.75 * 2**30 / 450e9)
    assert compute_collective_time_s(curve, nbytes=2**30, group_size=1) == 0


def test_measured_curve_interpolates_and_carries_over_group_sizes():
    rows = [{"op": "all_reduce", "nbytes": n, "world_size": 2, "num_nodes": 1, "time_us": t, "busbw_gbps": bw}
            for n, t, bw in ((1 << 20, 20.0, 52.4), (1 << 24, 100.0, 167.8), (1 << 28, 1000.0, 268.4))]
    comm = build_comm_model(rows, intra=None, inter=None, gpus_per_node=8)
    curve = comm.curve("all_reduce", "intra")
    assert curve.measured and curve.world_size == 2
    # at a measured size and group size the measured time comes back
    assert compute_collective_time_s(curve, nbytes=1 << 24, group_size=2) == pytest.approx(
        1.0 * (1 << 24) / 167.8e9)
    # at 8 ranks the same bus bandwidth moves 2(n-1)/n = 1.75 x the bytes
    assert compute_collective_time_s(curve, nbytes=1 << 24, group_size=8) == pytest.approx(1.75 * (1 << 24) / 167.8e9)
    # below the smallest size: the measured latency floor
    assert compute_collective_time_s(curve, nbytes=8, group_size=2) == pytest.approx(20e-6)


def _plan(capsys, tmp_path, *args: str) -> tuple[int, str, str, dict | None]:
    out = tmp_path / "plan.json"
    code = runner_main(["plan", *args, "--out", str(out)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err, json.loads(out.read_text()) if out.exists() else None


def test_plan_cli_ranks_layouts_and_writes_json(capsys, tmp_path):
    code, out, err, data = _plan(capsys, tmp_path, "--model", "gpt-125m", "--gpus", "8", "--gpu", "h200_sxm")
    assert code == 0, err
    assert "Layouts that fit, fastest first" in out and "Model states per GPU" in out
    times = [q["step_time_s"] for q in data["layouts"]]
    assert times == sorted(times) and len(times) == 10
    assert data["schema_version"] == 1 and data["num_params"] == 124_475_904
    assert {r["sharding"] for r in data["model_states_dp"]} == set(mem.SHARDINGS)
    assert all(q["fits"] for q in data["layouts"])
    kinds = {c["kind"] for q in data["layouts"] for c in q["comm"]}
    assert {"dp", "tp", "pp"} <= kinds


def test_plan_heads_not_divisible_by_tp(capsys, tmp_path):
    code, _, err, data = _plan(capsys, tmp_path, "--model", "gpt-125m", "--gpus", "8", "--tp", "8")
    assert code == 2 and data is None
    assert "--tp 8: num_heads 12 (KV heads 12) is not divisible by 8" in err
    assert "1, 2, 3, 4, 6" in err


def test_plan_layers_not_divisible_by_pp(capsys, tmp_path):
    code, _, err, _ = _plan(capsys, tmp_path, "--model", "gpt-125m", "--gpus", "10", "--pp", "5")
    assert code == 2
    assert "--pp 5: num_layers 12 is not divisible by 5; use --pp 4 or 6" in err and "--uneven-pp" in err


def test_plan_model_that_cannot_fit_says_the_smallest_change(capsys, tmp_path):
    code, out, err, data = _plan(capsys, tmp_path, "--model", "llama3-405b", "--seq", "8192", "--global-batch", "64",
                                 "--gpus", "8")
    assert code == 2
    assert "llama3-405b does not fit 8 x NVIDIA H100 SXM5" in err
    assert "smallest change: GPUs with >=" in err
    # 126 layers have no power-of-two divisor beyond 2: the fit needs PP 16 with an uneven split
    assert "smallest change: 128 GPUs (16 node(s)) with --uneven-pp, e.g. TP8 x PP16" in err
    assert err.count("does not fit") == 1 and "smallest change" not in out  # the reasons are said once
    assert data is None  # exit 2 writes no plan file


def test_plan_bad_shape_is_one_line(capsys, tmp_path):
    code, _, err, _ = _plan(capsys, tmp_path, "--layers", "4", "--hidden", "100", "--heads", "3", "--ffn", "400",
                            "--vocab", "1000", "--seq", "128", "--global-batch", "8", "--gpus", "1")
    assert code == 2 and err.count("\n") == 1 and "--hidden 100 is not divisible by --heads 3" in err
