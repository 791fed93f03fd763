"""`report build` on a folder holding only a Megatron-LM log and an NCCL log (issue 3, done-when 4)."""
from __future__ import annotations

import statistics
import shutil
from pathlib import Path

import pandas as pd
import pytest

from ingest.cli import main as ingest_main
from core.errors import ConfigError
from ingest.thirdparty import count_params
from report.cli import main as report_main
from core.hardware import lookup_peak

FIXTURES = Path(__file__).parent / "fixtures" / "real"
ARGS = """------------------------ arguments ------------------------
  num_layers ...................................... 32
  hidden_size ..................................... 4096
  num_attention_heads ............................. 32
  ffn_hidden_size ................................. 11008
  seq_length ...................................... 4096
  padded_vocab_size ............................... 32000
  tensor_model_parallel_size ...................... 2
  pipeline_model_parallel_size .................... 1
  position_embedding_type ......................... rope
  bf16 ............................................ True
  world_size ...................................... 4
-------------------- end of arguments ---------------------
"""
STEP_TIMES = [86.5452, 87.8716, 89.4748, 89.0752]  # fixture 19's iterations 122-125


def folder(tmp_path: Path, *, args: bool) -> Path:
    d = tmp_path / "job"
    d.mkdir()
    megatron = (FIXTURES / "19_megatron_llm_fork_iteration_plain.txt").read_text(encoding="utf-8")
    (d / "train.out").write_text((ARGS if args else "") + megatron, encoding="utf-8")
    nccl = (FIXTURES / "12_nccl_tests_h20_cumem_ib_2node.txt").read_text(encoding="utf-8")
    (d / "nccl.txt").write_text("host-a:1789224:1789224 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n" + nccl, encoding="utf-8")
    return d


def expected_mfu(*, layers, hidden, ffn, vocab, seq, gbs, world, learned, peak):
    n, pos = count_params(num_layers=layers, hidden_size=hidden, ffn_hidden_size=ffn, vocab_size=vocab,
                          seq_length=seq, learned_positions=learned)
    tokens_per_s = gbs * seq / statistics.median(STEP_TIMES)
    fpt = 6 * (n - pos) + 12 * layers * hidden * seq
    return tokens_per_s, tokens_per_s * fpt / (world * peak)


def test_report_build_on_raw_folder_reads_shape_from_argument_dump(tmp_path, capsys):
    d = folder(tmp_path, args=True)
    assert report_main(["build", str(d), "--format", "md"]) == 0
    note = (d / "report" / "note.md").read_text(encoding="utf-8")
    # the NCCL log shares nothing with the training log (no commId, host or pid in common): it is
    # another job, described on its own in the triage section, and lends the run nothing (issue 20)
    triage, rest = note.split("## Executive summary", 1)
    assert "### Job nccl: unknown (no training or failure lines)" in triage
    assert "| NCCL | 2.21.5+cuda12.4 | nccl.txt:1 |" in triage and "| World size | 4 | train.out:" in triage
    assert "2.21.5" not in rest and "NCCL transports seen" not in rest
    assert "| train | ok | 4 | 88.47 s | 89.35 s | 47.4 k |" in note
    # no GPU name in these logs: MFU is n/a with a caveat, never a fallback peak
    row = next(line for line in note.splitlines() if line.startswith("| train | ok"))
    assert row.split("|")[8].strip() == "n/a"
    assert "32 layers, hidden 4096, 32 heads, FFN 11008, seq 4096" in note
    assert "i.i.d. Zipf" not in note
    capsys.readouterr()
    assert report_main(["build", str(d), "--format", "md"]) == 0  # its own report/ output is not read back as a log
    from ingest.thirdparty import find_artifacts
    assert [p.name for p in find_artifacts([str(d)])] == ["nccl.txt", "train.out"]


def test_ingest_with_model_flags_then_report_build_tables(tmp_path, capsys):
    d = folder(tmp_path, args=False)
    flags = "num_layers=32,hidden_size=4096,num_heads=32,ffn_hidden_size=11008,seq_length=4096,vocab_size=32000," \
            "dtype=bf16,gpu_name=NVIDIA H100 80GB HBM3,world_size=8"
    assert ingest_main([str(d), "--model", flags, "--out", str(d / "tables")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {d / 'tables' / 'runs.parquet'}" in out
    steps = pd.read_parquet(d / "tables" / "steps.parquet")
    assert steps["step_time_s"].round(4).tolist() == STEP_TIMES and set(steps["run"]) == {"train"}
    assert steps["consumed_samples"].tolist() == [124928, 125952, 126976, 128000]  # raw columns kept
    assert report_main(["build", str(d / "tables"), "--format", "md"]) == 0
    note = (d / "tables" / "report" / "note.md").read_text(encoding="utf-8")
    peak = lookup_peak("NVIDIA H100 80GB HBM3", "bf16").flops
    tps, mfu = expected_mfu(layers=32, hidden=4096, ffn=11008, vocab=32000, seq=4096, gbs=1024, world=8, learned=True, peak=peak)
    row = next(line for line in note.splitlines() if line.startswith("| train | ok")).split("|")
    assert row[6].strip() == "47.4 k" and tps == pytest.approx(47407.5, rel=1e-4)
    assert row[8].strip() == f"{mfu * 100:.1f}%"
    assert "| NCCL | 2.21.5+cuda12.4 |" in note


def test_raw_folder_without_shape_says_how_to_pass_it(tmp_path, capsys, monkeypatch):
    d = folder(tmp_path, args=False)
    monkeypatch.chdir(tmp_path)  # ingest's default out is runs/NAME/tables under the current directory
    assert report_main(["build", str(d), "--format", "md"]) == 2
    err = capsys.readouterr().err
    assert "ingest ... --model KEY=VALUE" in err and "num_layers" in err
    assert ingest_main([str(d)]) == 0  # ingest alone still writes the raw tables, with a note
    assert "note: no runs table for `report build`" in capsys.readouterr().out
    assert (tmp_path / "runs" / d.name / "tables" / "files.parquet").is_file()
    with pytest.raises(ConfigError):
        from ingest.thirdparty import parse_model_flags
        parse_model_flags("layers=3")
    shutil.rmtree(d)


def test_folder_of_unrelated_files_keeps_the_campaign_error(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    (tmp_path / "data.bin").write_bytes(bytes(range(256)))
    assert report_main(["build", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a campaign" in err and "run `runner all`" in err and len(err.strip().splitlines()) == 1


def test_folder_with_only_an_nccl_log_gives_a_note_of_what_it_says(tmp_path, capsys):
    shutil.copy(FIXTURES / "04_nccl_ib_2node_rings_trees_mnnvl.txt", tmp_path / "nccl.log")
    assert report_main(["build", str(tmp_path), "--format", "md"]) == 0
    note = (tmp_path / "report" / "note.md").read_text(encoding="utf-8")
    assert "1 files read, 1 jobs found" in note and "| World size | 16 | nccl.log:1 (the largest NCCL communicator" in note
    assert "Tokens/s" in note.split("Unknown (not in this job's files):", 1)[1]


PROFILING = ("15_nccl_ras_client_mismatch_2.26.txt", "27_profiler_table_2020_left_aligned_old_cols.txt",
             "33_nsys_stats_2025_text_nvtx_osrt_api.txt", "36_flight_recorder_dump_unpickled_v2.5.txt",
             "38_pyspy_dump_zero3_allgather_hang.txt")


def test_report_build_with_profiler_nsys_fr_pyspy_ras_files_in_the_folder(tmp_path, capsys):
    """New tables (kernels, stacks, flops_profile...) must not break `report build`; the note is
    built from the training log, the other files are ingested alongside (issue 3)."""
    d = folder(tmp_path, args=True)
    for n in PROFILING:
        shutil.copy(FIXTURES / n, d / f"artifact_{n[:2]}.log")
    assert report_main(["build", str(d), "--format", "md"]) == 0
    note = (d / "report" / "note.md").read_text(encoding="utf-8")
    assert "| train | ok | 4 | 88.47 s | 89.35 s | 47.4 k |" in note
    # the profiler and nsys files share nothing with the training log: separate jobs, listed in the
    # triage section, and never section 5's evidence for the training run (issue 20)
    section5 = note.split("## 5. Evidence", 1)[1].split("## 6.", 1)[0]
    assert "Lower-resolution evidence — " not in section5
    for n in PROFILING:
        assert f"### Job artifact_{n[:2]}:" in note
    capsys.readouterr()
    assert ingest_main([str(d), "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    for line in ("artifact_15.log: nccl_ras, 9 records, 0 unparsed lines", "artifact_27.log: profiler_table, 2 records, 0 unparsed",
                 "artifact_33.log: nsys_stats, 9 records, 1 unparsed lines", "artifact_36.log: flight_recorder, 3 records, 0 unparsed",
                 "artifact_38.log: pyspy, 7 records, 1 unparsed lines"):
        assert line in out
    kernels = pd.read_parquet(tmp_path / "t" / "kernels.parquet")
    assert sorted(kernels["kind"].value_counts().items()) == [("nsys_stats", 9), ("profiler_table", 2)]
    stacks = pd.read_parquet(tmp_path / "t" / "stacks.parquet")
    assert stacks["collective"].dropna().tolist() == ["all_gather_into_tensor", "all_gather_coalesced"]
    assert ingest_main([str(d), "--strict", "--out", str(tmp_path / "s")]) == 1
    err = capsys.readouterr().err
    assert f"{d / 'artifact_33.log'}:18: unparsed (nsys_stats)" in err
    assert f"{d / 'artifact_38.log'}:31: unparsed (pyspy)" in err


def test_torchtitan_log_alone_gives_a_metric_row_from_its_tps(tmp_path, capsys):
    """torchtitan prints no iteration time: the step time is derived from its tps (tokens/s per
    GPU) and the note says so; our MFU is computed from it with our formula and peak."""
    d = tmp_path / "titan"
    d.mkdir()
    shutil.copy(FIXTURES / "25_torchtitan_2025_rank0_prefix_gc_profiler.txt", d / "titan.log")
    flags = ("num_layers=32,hidden_size=4096,num_heads=32,seq_length=8192,vocab_size=128256,global_batch_size=8,"
             "world_size=8,dtype=bf16,gpu_name=NVIDIA H100 80GB HBM3")
    assert ingest_main([str(d), "--model", flags, "--out", str(d / "tables")]) == 0
    steps = pd.read_parquet(d / "tables" / "steps.parquet")
    tps = steps.set_index("step")["tokens_per_s_per_gpu"]
    assert steps.set_index("step")["step_time_s"].tolist() == pytest.approx((8 * 8192 / (tps * 8)).tolist())
    assert report_main(["build", str(d / "tables"), "--format", "md"]) == 0
    note = (d / "tables" / "report" / "note.md").read_text(encoding="utf-8")
    row = next(line for line in note.splitlines() if line.startswith("| titan | ok")).split("|")
    median_tps = statistics.median(tps.tolist())
    assert row[7].strip() == f"{median_tps / 1e3:.2f} k"  # tokens/s per GPU restates the log's median tps
    assert "step time derived from torchtitan's tps" in note


def test_a_logs_note_prints_what_the_logs_do_not_say_as_na(tmp_path, capsys):
    """A Megatron log with its shape passed by --model but no micro-batch size, dtype, seed or GPU
    name: the note says n/a (never Python's None or "0 × n/a") and why there are no predictions."""
    d = tmp_path / "job"
    d.mkdir()
    shutil.copy(FIXTURES / "19_megatron_llm_fork_iteration_plain.txt", d / "train.log")
    assert report_main(["build", str(d), "--format", "md,html", "--model", "num_layers=24,hidden_size=1024,"
                        "num_heads=16,seq_length=1024,global_batch_size=8,vocab_size=50304,world_size=8"]) == 0
    for name in ("note.md", "note.html"):
        assert "None" not in (d / "report" / name).read_text(encoding="utf-8"), name
    note = (d / "report" / "note.md").read_text(encoding="utf-8")
    assert "Hardware: n/a." in note and "| dtype | n/a |" in note
    assert ("Predictions unavailable (the logs do not give the micro-batch size of train; pass it with --model "
            "micro_batch_size=N).") in note
