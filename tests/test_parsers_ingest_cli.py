"""`ingest PATH... [--out DIR] [--strict]` on third-party artifacts (in-process, real fixtures)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import pyarrow.parquet as pq

from ingest.cli import main
from core.records import SCHEMA_VERSION

FIXTURES = Path(__file__).parent / "fixtures" / "real"
FILES = ("19_megatron_llm_fork_iteration_plain.txt", "12_nccl_tests_h20_cumem_ib_2node.txt",
         "54_watchdog_2022_legacy_no_numel.txt", "47_collect_env_2020_torch1.7.txt", "36_flight_recorder_dump_unpickled_v2.5.txt")


def folder(tmp_path, names=FILES):
    d = tmp_path / "logs"
    d.mkdir()
    for n in names:
        # neutral names: the kind must come from the content
        shutil.copy(FIXTURES / n, d / f"artifact_{n[:2]}.log")
    return d


def test_folder_of_logs_to_tables(tmp_path, capsys):
    d = folder(tmp_path)
    assert main([str(d), "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"{d / 'artifact_19.log'}: megatron, 4 records, 0 unparsed lines" in out
    assert f"{d / 'artifact_12.log'}: nccl, 20 records, 2 unparsed lines" in out
    assert f"{d / 'artifact_36.log'}: flight_recorder, 3 records, 0 unparsed lines, 1 warnings" in out
    assert "warning: 1 entry elided ('...') in the dump" in out
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["collectives.parquet", "comm_topology.parquet", "env.parquet", "events.parquet", "files.parquet",
                     "steps.parquet"]
    for p in (tmp_path / "out").iterdir():
        assert json.loads(pq.read_schema(p).metadata[b"schema_version"]) == SCHEMA_VERSION
    steps = pd.read_parquet(tmp_path / "out" / "steps.parquet")
    assert steps["step"].tolist() == [122, 123, 124, 125]
    assert steps["step_time_s"].round(4).tolist() == [86.5452, 87.8716, 89.4748, 89.0752]
    env = pd.read_parquet(tmp_path / "out" / "env.parquet")
    assert env.set_index("key").loc["torch_version", "value"] == "1.7.0+cu101"
    events = pd.read_parquet(tmp_path / "out" / "events.parquet")
    assert events["event"].tolist() == ["fr_pg_status", "fr_pg_config"] + ["nccl_timeout"] * 5  # files sorted by name
    files = pd.read_parquet(tmp_path / "out" / "files.parquet")
    assert files.set_index("kind").loc["nccl", "num_unparsed_lines"] == 2


def test_strict_lists_file_and_line(tmp_path, capsys):
    d = folder(tmp_path, FILES[:2])
    assert main([str(d / "artifact_12.log"), str(d / "artifact_19.log"), "--strict", "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert f"{d / 'artifact_12.log'}:13: unparsed (nccl)" in err and f"{d / 'artifact_12.log'}:28: unparsed (nccl)" in err
    assert main([str(d / "artifact_19.log"), "--strict", "--out", str(tmp_path / "o2")]) == 0


def test_default_out_and_binary_garbage_file(tmp_path, capsys, monkeypatch):
    """Without --out the tables go under runs/ of the working directory, never into the input."""
    d = tmp_path / "g"
    d.mkdir()
    (d / "noise.bin").write_bytes(bytes(range(256)) * 10 + b"\n\xff\xfe plain\n")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main([str(d)]) == 0
    assert "unknown, 0 records" in capsys.readouterr().out
    assert (work / "runs" / "g" / "tables" / "files.parquet").is_file()
    assert sorted(p.name for p in d.iterdir()) == ["noise.bin"]


def test_missing_path_is_one_line_error(tmp_path, capsys):
    assert main([str(tmp_path / "a.log"), str(tmp_path / "b.log")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ingest: error:") and "no such file or directory" in err[0]


def test_files_parsed_in_parallel_processes_equal_one_by_one(tmp_path):
    """Files go to a process pool, one file per task: same results, same order as --jobs 1."""
    from ingest import thirdparty
    paths = thirdparty.find_artifacts([str(folder(tmp_path))])
    serial = thirdparty.ingest_files(paths, max_workers=1)
    parallel = thirdparty.ingest_files(paths, max_workers=2)
    assert [f.path for f in parallel] == [str(p) for p in paths]
    assert parallel == serial


def test_gzipped_logs_in_a_folder_are_found_and_read_decompressed(tmp_path):
    """A folder's ``rank0.log.gz`` is ingested like its plain ``rank1.log``: found, detected
    and parsed from the decompressed text (same records but for the source); a stream cut
    short is a parse error naming the file."""
    import gzip
    from core.errors import ParseError
    from ingest import thirdparty
    d = tmp_path / "logs"
    d.mkdir()
    text = (FIXTURES / "19_megatron_llm_fork_iteration_plain.txt").read_bytes()
    (d / "rank0.log.gz").write_bytes(gzip.compress(text))
    (d / "rank1.log").write_bytes(text)
    paths = thirdparty.find_artifacts([str(d)])
    assert [p.name for p in paths] == ["rank0.log.gz", "rank1.log"]
    gz, plain = thirdparty.ingest_files(paths, max_workers=1)
    assert (gz.result.kind, gz.num_records, gz.result.unparsed) == ("megatron", 4, 0)
    assert [{**r, "source": None} for r in gz.records()] == [{**r, "source": None} for r in plain.records()]
    (d / "rank0.log.gz").write_bytes(gzip.compress(text * 2000)[:-4000])
    with pytest.raises(ParseError, match="rank0.log.gz: truncated gzip stream"):
        thirdparty.ingest_files(paths, max_workers=1)


def test_cli_jobs(tmp_path, capsys):
    import pandas as pd
    logs = folder(tmp_path)
    for jobs in ("1", "2"):
        assert main([str(logs), "--out", str(tmp_path / f"out{jobs}"), "--jobs", jobs]) == 0
    for table in (tmp_path / "out1").iterdir():
        assert pd.read_parquet(table).equals(pd.read_parquet(tmp_path / "out2" / table.name)), table.name
    assert main([str(logs), "--jobs", "0"]) == 2
    assert "--jobs: must be at least 1, got 0" in capsys.readouterr().err


def test_packed_tables_are_the_records_as_dataframes():
    """build_tables over packed records gives, table by table, what pd.DataFrame makes of the records
    as dicts (keys in first-appearance order, a missing key NaN, ``run`` after each record's own keys
    unless it has one): tables of one key layout and of several, random layouts and values."""
    import random

    import pandas as pd

    from ingest.parsers import ParseResult
    from ingest.thirdparty import _ingested, build_tables
    rng = random.Random(3)
    keys = ["source", "line", "kind", "rank", "step", "name", "time_s", "loss", "detail"]  # parsers set no run
    values = [None, 0, 7, 2.5, float("nan"), "x", "", True, 10**20]
    for trial in range(200):
        files = []
        for i in range(rng.randint(1, 3)):
            layouts = [rng.sample(keys, rng.randint(1, 6)) for _ in range(rng.randint(1, 3))]
            records = [{"table": rng.choice(["steps", "timers"]), **{k: rng.choice(values) for k in rng.choice(layouts)}}
                       for _ in range(rng.randint(1, 40))]
            files.append((f"/d/rank{i}.log", records))
        tables = build_tables([_ingested(path, ParseResult(records=recs, unparsed=0, warnings=[], kind="x"))
                               for path, recs in files])
        for table in ("steps", "timers"):
            rows = [{**{k: v for k, v in r.items() if k != "table"}, **({} if "run" in r else {"run": f"rank{i}"})}
                    for i, (_, recs) in enumerate(files) for r in recs if r["table"] == table]
            if rows:
                pd.testing.assert_frame_equal(tables[table], pd.DataFrame(rows), check_exact=True)
            else:
                assert table not in tables


def test_a_log_that_ends_in_an_oom_gives_a_run_that_ended_oom(tmp_path):
    """torchtitan steps then a CUDA OOM in one file: `ingest --out` writes the run's status and
    cause from the logs' failure, as `report build` on the folder of logs says it, not 'ok'."""
    log = tmp_path / "job.log"
    log.write_bytes((FIXTURES / "25_torchtitan_2025_rank0_prefix_gc_profiler.txt").read_bytes()
                    + (FIXTURES / "62_oom_msg_torch2.2plus_expandable_segments.txt").read_bytes())
    out = tmp_path / "job" / "tables"
    assert main([str(log), "--out", str(out), "--model", "num_layers=24,hidden_size=2048,num_heads=16,seq_length=2048,"
                 "global_batch_size=8,vocab_size=50304,world_size=8"]) == 0
    runs = pd.read_parquet(out / "runs.parquet")
    assert list(runs["status"]) == ["oom"] and runs["cause"].iat[0].startswith("CUDA out of memory")


def test_out_among_a_strangers_files_is_refused(tmp_path, capsys):
    """--out that holds files other than tables: one line, exit 2, nothing written there."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "note.md").write_text("my notes", encoding="utf-8")
    assert main([str(FIXTURES / "19_megatron_llm_fork_iteration_plain.txt"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ingest: error: {out}: --out holds files that are not tables (note.md); choose a new or empty folder"
    assert sorted(p.name for p in out.iterdir()) == ["note.md"]


def test_report_build_on_tables_without_a_run_says_what_they_are(tmp_path, capsys):
    """`ingest LOG --out T` of a log with no training lines writes tables but no runs table;
    `report build T` says so and what to do, not 'no files to ingest'."""
    from report.cli import main as report_main

    out = tmp_path / "job" / "tables"
    assert main([str(FIXTURES / "56_watchdog_2025_lineno_and_rank_prefix.txt"), "--out", str(out)]) == 0
    capsys.readouterr()
    assert report_main(["build", str(out)]) == 2
    err = capsys.readouterr().err
    assert "tables of logs without a runs table" in err and "no files to ingest" not in err
