"""A user's own torch.profiler traces in a logs folder: the same cross-rank attribution as a
campaign's section 5, the straggler among the ranks given, what cannot be attributed when ranks
are missing, and a trace without ProfilerStep marks read as one window."""
from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from ingest.thirdparty import load_thirdparty_jobs
from report.render import build_report, load_note

ROOT = Path(__file__).resolve().parents[1]
DDP = ROOT / "examples" / "h200-2gpu" / "ddp" / "trace"


@pytest.fixture(scope="module")
def campaign_ddp():
    """The campaign note's section-5 view of the ddp run (the reference)."""
    _, _, note = load_note(ROOT / "examples" / "h200-2gpu")
    return next(b.attribution for b in note.evidence.rows if b.run == "ddp")


def _folder(tmp_path: Path, ranks: list[int]) -> Path:
    d = tmp_path / "logs"
    d.mkdir()
    for r in ranks:
        shutil.copy(DDP / f"profile_rank{r}.json.gz", d / f"profile_rank{r}.json.gz")
    return d


def test_two_ranks_give_the_campaigns_shares_and_straggler(tmp_path, campaign_ddp):
    folder = _folder(tmp_path, [0, 1])
    _, tables, jobs = load_thirdparty_jobs(folder)
    assert len(jobs) == 1 and set(tables["files"]["kind"]) == {"chrome_trace"}
    assert (tables["files"]["num_unparsed_lines"] == 0).all()
    _, _, note = load_note(folder)
    (t,) = note.traces
    assert t.ranks == (0, 1) and t.world_size == 2 and t.missing_ranks == ()
    for k, share in campaign_ddp.shares.items():
        assert t.attribution.shares[k] == pytest.approx(share, abs=5e-4), k
    assert t.attribution.straggler["rank"] == campaign_ddp.straggler["rank"]
    assert t.attribution.straggler["named"] == campaign_ddp.straggler["named"]
    md = (Path(build_report(folder, out_dir=tmp_path / "out", formats=["md", "html"])[0])).read_text()
    assert f"wait for rank {campaign_ddp.straggler['rank']} in 2 of 2 traced steps" in md
    shares = re.findall(r"\((\d+\.\d)%\)", md.split("Profiler traces")[1].split("\n- ")[0])
    want = [f"{100 * campaign_ddp.shares[k]:.1f}" for k in ("compute", "transfer", "skew_wait", "bubble", "imbalance",
                                                             "launch_gaps", "data_stall", "other")]
    assert shares == want


def test_one_rank_of_two_says_what_cannot_be_attributed(tmp_path):
    folder = _folder(tmp_path, [0])
    _, _, note = load_note(folder)
    (t,) = note.traces
    assert t.ranks == (0,) and t.world_size == 2 and t.missing_ranks == (1,)
    md = Path(build_report(folder, out_dir=tmp_path / "out", formats=["md"])[0]).read_text()
    assert "The traces say the job had 2 ranks; 1 given (rank(s) 0)" in md
    assert "cannot be split into transfer and skew wait" in md
    assert "One rank: no collective to match" not in md


def test_trace_without_profiler_steps_is_one_window(tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    for r in (0, 1):
        doc = json.loads(gzip.decompress((DDP / f"profile_rank{r}.json.gz").read_bytes()))
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
        (folder / f"trace_rank{r}.json").write_text(json.dumps(doc))
    _, tables, jobs = load_thirdparty_jobs(folder)
    assert len(jobs) == 1
    meta = tables["traces"]
    assert meta["whole_trace"].all() and (meta["num_steps"] == 1).all()
    _, _, note = load_note(folder)
    (t,) = note.traces
    assert t.whole_trace_ranks == (0, 1)
    assert t.attribution.shares["compute"] > 0.3  # the GPU worked most of the window
    assert abs(sum(t.attribution.shares.values()) - 1) < 1e-9
    md = Path(build_report(folder, out_dir=tmp_path / "out", formats=["md"])[0]).read_text()
    assert "No ProfilerStep marks in the trace of rank(s) 0, 1: the whole trace is analysed as one window" in md


def test_two_traces_of_one_rank_are_two_jobs(tmp_path):
    folder = tmp_path / "logs"
    (folder / "a").mkdir(parents=True)
    (folder / "b").mkdir()
    shutil.copy(DDP / "profile_rank0.json.gz", folder / "a" / "profile_rank0.json.gz")
    shutil.copy(DDP / "profile_rank0.json.gz", folder / "b" / "profile_rank0.json.gz")
    _, _, jobs = load_thirdparty_jobs(folder)
    assert len(jobs) == 2
    assert any("both hold a profiler trace of rank(s) 0" in n for j in jobs for n in j.not_joined)
