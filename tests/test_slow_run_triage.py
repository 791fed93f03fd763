"""Slow-run triage from logs alone: timers, per-rank step times, NCCL over sockets, cited."""
from __future__ import annotations

import shutil
from pathlib import Path

from ingest.thirdparty import load_thirdparty_jobs

REAL = Path(__file__).resolve().parent / "fixtures" / "real"


def test_timers_transports_and_socket_are_job_facts(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    shutil.copy(REAL / "17_megatron_2022_bert_timers_memory.txt", folder / "train.log")
    (folder / "nccl.log").write_text(
        "host-a:11:12 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
        "host-b:21:22 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [receive] via NET/Socket/0\n")
    _, _, jobs = load_thirdparty_jobs(folder, model={"num_layers": 2, "hidden_size": 64, "num_heads": 2,
                                                      "seq_length": 128, "vocab_size": 1000, "world_size": 2})
    facts = {n: f for j in jobs for n, f in j.facts.items() if f.value is not None}
    assert "forward-compute" in facts["timers_ms"].value and facts["timers_ms"].sources[0].startswith("train.log:")
    assert facts["nccl_transports"].value == "NET/Socket/0"
    assert "NET/Socket (TCP) between 2 hosts" in facts["nccl_socket"].value
    assert facts["nccl_socket"].sources == ("nccl.log:1", "nccl.log:2")


def test_per_rank_step_times_name_the_straggler(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    line = (" iteration {s:8d}/    1000 | consumed samples: {c:12d} | elapsed time per iteration (ms): {t} | "
            "learning rate: 1.000E-04 | global batch size:     8 | lm loss: 2.000000E+00 | loss scale: 1.0 |\n")
    for rank, t in ((0, 100.0), (1, 101.0), (2, 140.0)):
        (folder / f"rank{rank}.log").write_text("".join(line.format(s=s, c=8 * s, t=t) for s in range(1, 5)))
    _, _, jobs = load_thirdparty_jobs(folder, model={"num_layers": 2, "hidden_size": 64, "num_heads": 2,
                                                      "seq_length": 128, "vocab_size": 1000, "world_size": 3})
    (job,) = jobs
    fact = job.facts["step_time_by_rank"]
    assert "straggler: rank 2" in fact.value, fact.value
    assert fact.sources[0] == "rank0.log:1"
