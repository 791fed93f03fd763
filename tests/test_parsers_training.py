"""Megatron-LM, DeepSpeed and torchtitan parsers on the real fixtures (+ format variants not
captured in the corpus, written from the formats' source)."""
from __future__ import annotations

from pathlib import Path

import pytest

from ingest.parsers.deepspeed import parse_deepspeed
from ingest.parsers.megatron import parse_megatron
from ingest.parsers.torchtitan import parse_torchtitan

FIXTURES = Path(__file__).parent / "fixtures" / "real"


def read(name):
    return (FIXTURES / name).read_text(encoding="utf-8")


def table(result, name):
    return [r for r in result.records if r["table"] == name]


def pick(rec, *keys):
    return tuple(rec.get(k) for k in keys)


def test_megatron_2022_bert_skipped_iteration_timers_memory():
    r = parse_megatron(read("17_megatron_2022_bert_timers_memory.txt"), source="m")
    steps = table(r, "steps")
    first, mem, last = steps
    assert pick(first, "step", "num_steps_total", "consumed_samples", "lr", "global_batch_size", "loss",
                "loss_scale", "num_skipped_iterations") == (10, 1000000, 40, 0.0, 4, None, 8388608.0, 10)
    assert first["step_time_s"] == pytest.approx(0.3562)
    assert pick(last, "step", "loss", "sop_loss", "num_skipped_iterations") == (30, 10.12573, 0.6911852, 1)
    assert last["step_time_s"] == pytest.approx(0.1234)
    assert pick(mem, "rank", "step") == (0, 20)
    assert mem["mem_allocated_gib"] == pytest.approx(6245.033203125 / 1024)
    assert mem["mem_max_reserved_gib"] == pytest.approx(6554.0 / 1024)
    timers = table(r, "timers")
    assert pick(timers[0], "name", "step") == ("model-and-optimizer-setup", None)
    assert timers[0]["time_s"] == pytest.approx(0.294)
    fwd = [t for t in timers if t["name"] == "forward-compute"]
    assert [(t["step"], round(t["time_s"], 5)) for t in fwd] == [(10, 0.19377), (10, 0.05816)]
    assert r.unparsed_lines == (1, 2, 3, 4, 5, 13)


def test_megatron_llm_fork_first_and_last_iteration():
    r = parse_megatron(read("19_megatron_llm_fork_iteration_plain.txt"), source="m")
    steps = table(r, "steps")
    assert [s["step"] for s in steps] == [122, 123, 124, 125]
    assert pick(steps[0], "consumed_samples", "lr", "global_batch_size", "loss", "grad_norm") == \
        (124928, 9.150e-06, 1024, 2.504220, 0.231)
    assert steps[0]["step_time_s"] == pytest.approx(86.5452)
    assert pick(steps[-1], "consumed_samples", "loss", "grad_norm") == (128000, 2.477393, 0.356)
    assert steps[-1]["step_time_s"] == pytest.approx(89.0752)
    assert r.unparsed == 0 and r.warnings == []


def test_megatron_newer_variants_args_tee_prefix_and_deepspeed_tflops():
    text = "\n".join([
        "------------------------ arguments ------------------------",
        "  num_layers ...................................... 24",
        "  hidden_size ..................................... 2048",
        "-------------------- end of arguments ---------------------",
        "[default7]: [2024-03-01 10:00:00] iteration      100/    5000 | consumed samples:        51200 | elapsed time per iteration (ms):"
        " 1234.5 | throughput per GPU (TFLOP/s/GPU): 401.2 | learning rate: 1.420000E-05 | global batch size:   512 |"
        " lm loss: 3.123400E+00 | load_balancing_loss: 1.010000E+00 | loss scale: 1.0 | grad norm: 0.812 | num zeros: 0.0 |"
        " number of skipped iterations:   0 | number of nan iterations:   0 |",
        " iteration        2/     100 | consumed samples:            8 | elapsed time per iteration (ms): 500.0 | learning rate: 1.000E-05 |"
        " global batch size:     4 | lm loss: 9.000000E+00 | loss scale: 1.0 | TFLOPs: 12.34 | samples per second: 8.000 | brand new key: 7 |",
        "(min, max) time across ranks (ms):",
        "    forward-backward ...............................: (1200.50, 1210.25)",
    ])
    r = parse_megatron(text, source="m")
    env = {x["key"]: x["value"] for x in table(r, "env")}
    assert env == {"megatron.num_layers": "24", "megatron.hidden_size": "2048"}
    s100, s2 = table(r, "steps")
    assert pick(s100, "rank", "step", "time", "framework_tflops_per_gpu", "lr", "loss", "load_balancing_loss", "grad_norm") == \
        (7, 100, "2024-03-01 10:00:00", 401.2, 1.42e-05, 3.1234, 1.01, 0.812)
    assert pick(s2, "framework_tflops_per_gpu", "samples_per_s") == (12.34, 8.0)
    assert r.warnings == ["line 6: iteration field 'brand new key' not in the pattern table"]
    (t,) = table(r, "timers")
    assert pick(t, "name", "step") == ("forward-backward", 2) and t["time_max_s"] == pytest.approx(1.21025)
    assert r.unparsed == 0


def test_deepspeed_2022_step_and_timer_merge_into_one_row():
    r = parse_deepspeed(read("21_deepspeed_2022_timer_samplespersec_notebook.txt"), source="d")
    steps = table(r, "steps")
    assert [pick(s, "rank", "step", "num_skipped_iterations", "lr", "samples_per_s") for s in steps] == [
        (0, 40, 2, 5e-05, 83.48609168106144), (0, 50, 2, 5e-05, 83.73838805358588), (0, 60, 2, 5e-05, None)]
    assert pick(steps[0], "mem_allocated_gib", "mem_max_allocated_gib", "time") == (0.26, 9.02, "2022-03-11 02:06:58,985")
    assert r.unparsed == 20  # <IPython.core.display.HTML object>


def test_deepspeed_2024_launcher_truncated_command():
    r = parse_deepspeed(read("23_deepspeed_2024_launcher_free_output.txt"), source="d")
    (cmd,) = table(r, "env")
    assert cmd["key"] == "launch_command" and cmd["value"].startswith("/opt/conda/bin/python -u -m deepspeed.launcher.launch")
    assert cmd["value"].endswith("--pe")
    assert r.unparsed_lines == (1, 2, 3)  # free -h; the DeepSpeed logger lines are read (a warning: an event)


def test_deepspeed_new_timer_pipeline_memory_triplet_breakdown_config():
    p = "[2024-05-01 10:00:00,123] [INFO] "
    text = "\n".join([
        p + "[config.py:967:print]   train_batch_size ............. 32",
        p + "[logging.py:96:log_dist] [Rank 0] step=10, skipped=0, lr=[0.0001], mom=[(0.9, 0.95)]",
        p + "[timer.py:260:stop] epoch=0/micro_step=10/global_step=10, RunningAvgSamplesPerSec=45.5, CurrSamplesPerSec=46.1, "
            "MemAllocated=3.2GB, MaxMemAllocated=7.5GB",
        p + "[logging.py:96:log_dist] [Rank 0] time (ms) | fwd_microstep: 120.50 | bwd_microstep: 240.25 | step_microstep: 10.00",
        p + "[utils.py:800:see_memory_usage] After forward",
        "MA 1.5 GB         Max_MA 2.25 GB         CA 3.0 GB         Max_CA 3 GB ",
        "CPU Virtual Memory:  used = 50.1 GB, percent = 10.2%",
        p + "[engine.py:2100:_report_progress] steps: 20 loss: 5.4321 iter time (s): 1.234 samples/sec: 25.93",
    ])
    r = parse_deepspeed(text, source="d")
    s10, s20 = table(r, "steps")
    assert pick(s10, "rank", "step", "lr", "samples_per_s", "samples_per_s_running_avg", "mem_max_allocated_gib") == \
        (0, 10, 0.0001, 46.1, 45.5, 7.5)
    assert pick(s20, "step", "loss", "step_time_s", "samples_per_s") == (20, 5.4321, 1.234, 25.93)
    assert [(t["name"], t["step"], round(t["time_s"], 5)) for t in table(r, "timers")] == [
        ("fwd_microstep", 10, 0.1205), ("bwd_microstep", 10, 0.24025), ("step_microstep", 10, 0.01)]
    (mem,) = table(r, "memory")
    assert pick(mem, "label", "mem_allocated_gib", "mem_max_allocated_gib", "mem_reserved_gib", "cpu_mem_used_gib", "cpu_mem_pct") == \
        ("After forward", 1.5, 2.25, 3.0, 50.1, 10.2)
    assert {x["key"]: x["value"] for x in table(r, "env")} == {"deepspeed.train_batch_size": "32"}
    assert r.unparsed == 0


def test_torchtitan_2025_rank_prefix_thousands_and_events():
    r = parse_torchtitan(read("25_torchtitan_2025_rank0_prefix_gc_profiler.txt"), source="t")
    steps = table(r, "steps")
    assert [s["step"] for s in steps] == [200, 210, 220, 230, 240, 250]
    assert pick(steps[0], "rank", "loss", "mem_max_reserved_gib", "mem_max_reserved_pct", "tokens_per_s_per_gpu",
                "framework_tflops_per_gpu") == (0, 6.1384, 49.66, 52.28, 5856.0, 339.16)
    assert steps[0]["framework_mfu"] == pytest.approx(0.3429)
    assert pick(steps[-1], "loss", "tokens_per_s_per_gpu") == (5.8383, 5862.0)
    assert [(e["event"], e["line"]) for e in table(r, "events")] == [
        ("gc", 1), ("profiler_dump", 3), ("profiler_dump_done", 4), ("gc", 9)]


def test_torchtitan_grad_norm_colour_no_prefix_and_wps():
    text = ("\x1b[31m[titan] 2025-01-01 00:00:01,000 - root - INFO - \x1b[36mstep:  1  \x1b[32mloss:  9.5  \x1b[38;2;180;60;0m"
            "grad_norm:  3.25  \x1b[33mmemory: 10.00GiB(25.00%)  \x1b[34mtps: 12,345  \x1b[36mtflops: 100.5  \x1b[35mmfu: 10.16%\x1b[39m\n"
            "2024-06-01 00:00:01,000 - root - INFO - step: 2  loss: 9.1000  memory: 10.00GiB(25.00%)  wps: 1,000  mfu: 1.00%\n")
    a, b = table(parse_torchtitan(text, source="t"), "steps")
    assert pick(a, "step", "loss", "grad_norm", "tokens_per_s_per_gpu", "framework_tflops_per_gpu") == (1, 9.5, 3.25, 12345.0, 100.5)
    assert pick(b, "step", "tokens_per_s_per_gpu", "framework_mfu") == (2, 1000.0, 0.01)


CORPUS = Path(__file__).parent / "corpus" / "training"


def test_deepspeed_autotuning_summary_tables():
    """The autotuner's pipe tables (tests/corpus/training/052: fast and full mode) -> one row per
    tuning space, and the closing line -> its duration and experiment count."""
    from ingest.parsers.dispatch import parse_text
    r = parse_text((CORPUS / "052_deepspeed_autotuning_fast_and_full_mode_tables.txt").read_text(encoding="utf-8"),
                   source="t")
    rows = [pick(x, "tuning_space", "num_experiments", "best_metric_val", "best_exp_name") for x in table(r, "autotuning")]
    assert rows[:2] == [("z0", 1, 0.0, "z0_gas1_tmbspg1"), ("z1", 6, 177.843, "z1_gas1_tmbspg11")]
    assert rows[-1] == ("global", 24, 193.577, "z1_rbs5.0e+07_abs1.0e+09_gas1_tmbspg11") and len(rows) == 11
    done = [pick(x, "num_experiments", "duration_s") for x in table(r, "events") if x["event"] == "autotuning_done"]
    assert done == [(12, pytest.approx(39 * 60 + 25.253998)), (24, pytest.approx(3600 + 2 * 60 + 32.759424))]
    assert r.kinds == ("deepspeed",) and r.unparsed_lines == (10,)  # "[trimmed]"


def test_nanogpt_family_and_hf_trainer_lines():
    """nanoGPT iter lines (ms -> s, its -100% warm-up mfu not a number), nanochat step rows,
    llama2.c pipe rows and Hugging Face Trainer dicts, each as step rows of its own kind."""
    from ingest.parsers.dispatch import parse_text
    text = "\n".join([
        "iter 100: loss 4.2345, time 120.53ms, mfu -100.00%",
        "iter 110: loss 4.1000, time 121.00ms, mfu 30.12%",
        "step 00004/21400 (0.02%) | loss: 8.893647 | lrm: 1.00 | dt: 989.44ms | tok/sec: 529,882 | mfu: 74.13 | total time: 0.00m",
        "490 | loss 5.7543 | lr 4.900000e-05 | 8060.78ms | mfu 0.21%",
        "  4%|▎ | 1294/36234 [11:25<5:08:51,  1.89it/s]{'loss': 1.0692, 'grad_norm': nan, 'learning_rate': 0.00029, 'epoch': 0.53}",
    ]) + "\n"
    r = parse_text(text, source="t")
    steps = [pick(x, "kind", "step", "loss", "step_time_s", "framework_mfu") for x in table(r, "steps")]
    assert steps[:4] == [("nanogpt", 100, 4.2345, pytest.approx(0.12053), None),
                         ("nanogpt", 110, 4.1, pytest.approx(0.121), pytest.approx(0.3012)),
                         ("nanogpt", 4, 8.893647, pytest.approx(0.98944), pytest.approx(0.7413)),
                         ("nanogpt", 490, 5.7543, pytest.approx(8.06078), pytest.approx(0.0021))]
    (hf,) = [x for x in table(r, "steps") if x["kind"] == "hf_trainer"]
    assert pick(hf, "step", "step_is_index", "loss", "lr", "epoch") == (1, True, 1.0692, 0.00029, 0.53)
    assert hf["grad_norm"] != hf["grad_norm"]  # nan, as printed
    assert r.unparsed == 0 and set(r.kinds) == {"nanogpt", "hf_trainer"}


def test_autotuning_table_goes_on_across_another_process_line():
    """A line of another log between the autotuner's header and its rows does not end the table."""
    from ingest.parsers.dispatch import parse_text
    nccl = "nodeb:65671:65858 [5] NCCL INFO Channel 01 : 13[92000] -> 4[89000] [send] via NET/IB/0/GDRDMA"
    text = "\n".join(["| tuning_space | num_experiments | best_metric_val | best_exp_name   |", nccl,
                      "| :----------- | --------------: | --------------: | :-------------- |",
                      "| z1           |               3 |         40.1749 | z1_gas1_tmbspg1 |"])
    r = parse_text(text, source="t")
    rows = [x for x in r.records if x["table"] == "autotuning"]
    assert r.unparsed == 0 and [(x["tuning_space"], x["num_experiments"], x["best_metric_val"]) for x in rows] == [("z1", 3, 40.1749)]
