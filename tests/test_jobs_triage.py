"""A folder of logs from several jobs: grouped into jobs by what the logs say, each described from
its own files, failures first, nothing ranked (issue 20, items 1-2)."""
from __future__ import annotations

import shutil
from pathlib import Path

from ingest.jobs import compute_jobs
from ingest.thirdparty import build_tables, find_artifacts, ingest_files
from report.cli import main as report_main

FIXTURES = Path(__file__).parent / "fixtures"
REAL = FIXTURES / "real"
MIXED = {"megatron_gbs128_8gpu_constructed.log": FIXTURES / "jobs" / "megatron_gbs128_8gpu_constructed.log",
         "megatron_gbs256_16gpu_constructed.log": FIXTURES / "jobs" / "megatron_gbs256_16gpu_constructed.log",
         "nccl_64rank_constructed.log": FIXTURES / "jobs" / "nccl_64rank_constructed.log",
         "collect_env.txt": REAL / "47_collect_env_2020_torch1.7.txt",
         "watchdog.log": REAL / "56_watchdog_2025_lineno_and_rank_prefix.txt",
         "torchrun.err": REAL / "51_torchrun_childfailed_multi_failures_sigabrt.txt",
         "oom.txt": REAL / "62_oom_msg_torch2.2plus_expandable_segments.txt"}


def mixed_folder(tmp_path: Path) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    for name, src in MIXED.items():
        shutil.copy(src, d / name)
    return d


def test_mixed_folder_jobs_keep_their_own_facts(tmp_path):
    d = mixed_folder(tmp_path)
    jobs = {j.name: j for j in compute_jobs(build_tables(ingest_files(find_artifacts([str(d)]), max_workers=1)))}
    assert len(jobs) == 7  # nothing in common between these files: no job borrows another's facts
    a, b = jobs["megatron_gbs128_8gpu_constructed"], jobs["megatron_gbs256_16gpu_constructed"]
    assert (a.facts["world_size"].value, a.facts["global_batch_size"].value) == (8, 128)
    assert (b.facts["world_size"].value, b.facts["global_batch_size"].value) == (16, 256)
    assert a.facts["world_size"].sources == ("megatron_gbs128_8gpu_constructed.log:12",)
    # 128 x 2048 / median(5.4702, 5.4809, 5.4683, 5.4750) s
    assert round(a.facts["tokens_per_s"].value) == round(128 * 2048 / 5.4726)
    assert round(b.facts["tokens_per_s"].value) == round(256 * 2048 / 5.47065)
    assert jobs["nccl_64rank_constructed"].facts["world_size"].value == 64
    assert jobs["collect_env"].facts["world_size"].value is None and jobs["collect_env"].facts["gpus"].value == "GPU 0: Tesla T4"
    assert jobs["oom"].status == "oom" and jobs["watchdog"].status == "hang" and jobs["torchrun"].status == "failed"
    first = jobs["torchrun"].first_failure
    assert (first.rank, first.host, first.time, first.line) == (0, "host-a.example.org", "2023-06-14_22:36:10", 26)
    hang = jobs["watchdog"].hang
    assert hang.source == "watchdog" and hang.seq_num == 1580 and hang.waiting_ranks == (0, 3, 4)


def test_mixed_folder_note_is_a_triage_note_without_ranking(tmp_path, capsys):
    d = mixed_folder(tmp_path)
    assert report_main(["build", str(d), "--format", "md,html"]) == 0
    note = (d / "report" / "note.md").read_text(encoding="utf-8")
    assert "7 files read, 7 jobs found" in note
    body = note.split("## Triage: what failed first", 1)[1]
    # failed jobs first
    assert body.index("### Job oom: failed: out of memory") < body.index("### Job megatron_gbs128")
    assert "| World size | 8 | megatron_gbs128_8gpu_constructed.log:12 |" in note
    assert "| World size | 16 | megatron_gbs256_16gpu_constructed.log:12 |" in note
    assert "| Global batch (samples) | 256 | megatron_gbs256_16gpu_constructed.log:14 |" in note
    assert "| Tokens/s | 47.9 k |" in note and "| Tokens/s | 95.8 k |" in note
    assert "| World size | 64 | nccl_64rank_constructed.log:2 (the largest NCCL communicator in the log) |" in note
    assert ("First failure: torchrun ChildFailedError, rank 0, host host-a.example.org, 2023-06-14_22:36:10 "
            "(torchrun's root cause: first observed failure): exitcode -6 [torchrun.err:26]") in note
    assert "Signal 6 (SIGABRT) received by PID 2385923 [torchrun.err:10]" in note
    assert "First failure: CUDA out of memory: torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.00 MiB" in note
    assert "Hang (watchdog): rank(s) 0, 3–4 timed out waiting in ALLREDUCE #1580" in note
    for word in ("We recommend", "Recommendation", "fastest", "| ok |", "Executive summary", "1 × "):
        assert word not in note
    html = (d / "report" / "note.html").read_text(encoding="utf-8")
    assert "Triage: what failed first" in html and "torchrun.err:26" in html


def test_folder_of_failure_logs_only_gives_a_triage_note(tmp_path, capsys):
    for name in ("watchdog.log", "torchrun.err"):
        shutil.copy(MIXED[name], tmp_path / name)
    shutil.copy(REAL / "14_nccl_socket_error_unwind_abort_watchdog.txt", tmp_path / "nccl_error.log")
    assert report_main(["build", str(tmp_path), "--format", "md"]) == 0
    note = (tmp_path / "report" / "note.md").read_text(encoding="utf-8")
    assert "3 files read, 3 jobs found" in note
    # the NCCL socket error is what failed first; its 10 unwind lines are folded into one citation
    assert "First failure: NCCL error unwind: misc/socket.cc:829 -> 3 [nccl_error.log:1–10, 10 lines]" in note
    assert "process taken down, rank 6" in note


def test_files_sharing_a_comm_id_or_pid_are_one_job_and_disagreeing_files_are_not(tmp_path):
    nccl = (FIXTURES / "jobs" / "nccl_64rank_constructed.log").read_text().splitlines()
    (tmp_path / "node0.log").write_text("\n".join(l for l in nccl if l.startswith("host-n00")) + "\n")
    (tmp_path / "node7.log").write_text("\n".join(l for l in nccl if l.startswith("host-n07")) + "\n")
    other = [l.replace("nRanks 64", "nRanks 32").replace("nranks 64", "nranks 32") for l in nccl if l.startswith("host-n01")]
    (tmp_path / "node1_other_world.log").write_text("\n".join(other) + "\n")
    jobs = compute_jobs(build_tables(ingest_files(find_artifacts([str(tmp_path)]), max_workers=1)))
    joined = next(j for j in jobs if len(j.sources) == 2)
    assert sorted(Path(s).name for s in joined.sources) == ["node0.log", "node7.log"]
    assert joined.joined_by == ("commId 0x5e1f2a3b4c5d6e7f",)
    assert any("world_size: 64" in n and "vs 32" in n for n in joined.not_joined)
    assert len(jobs) == 2
