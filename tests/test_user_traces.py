"""A user's own torch.profiler traces in a logs folder: the same cross-rank attribution as a
campaign's section 5, the straggler among the ranks given, what cannot be attributed when ranks
are missing, traces with Unix-epoch timestamps, and traces without ProfilerStep marks split by a
repeating annotation or kernel pattern, or read as one window -- from the real torch profiler."""
from __future__ import annotations

import gzip
import json
import re
import shutil
import statistics
from pathlib import Path

import pytest

from core.records import ATTRIBUTION_CATEGORIES
from report.render import duration

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
    assert t.attribution.straggler.rank == campaign_ddp.straggler.rank
    assert t.attribution.straggler.named == campaign_ddp.straggler.named
    md = (Path(build_report(folder, out_dir=tmp_path / "out", formats=["md", "html"])[0])).read_text()
    assert f"wait for rank {campaign_ddp.straggler.rank} in 2 of 2 traced steps" in md
    row = next(ln for ln in md.split("Profiler traces")[1].splitlines() if ln.startswith("| ") and "---" not in ln
               and "Job" not in ln)
    cells = [c.strip() for c in row.strip("|").split("|")][3:11]
    want = [f"{duration(campaign_ddp.traced_ms[k] / 1000)} (p90 {duration(campaign_ddp.traced_p90_ms[k] / 1000)}) / "
            + (f"saves {duration(campaign_ddp.saving_ms[k] / 1000)}" if campaign_ddp.saving_ms.get(k) is not None
               else "—") for k in ATTRIBUTION_CATEGORIES]
    assert cells == want


def test_one_rank_of_two_says_what_cannot_be_attributed(tmp_path):
    folder = _folder(tmp_path, [0])
    _, _, note = load_note(folder)
    (t,) = note.traces
    assert t.ranks == (0,) and t.world_size == 2 and t.missing_ranks == (1,)
    md = Path(build_report(folder, out_dir=tmp_path / "out", formats=["md"])[0]).read_text()
    assert "The traces say the job had 2 ranks; 1 given (rank(s) 0)" in md
    assert "cannot be split into transfer and skew wait" in md
    assert "One rank: no collective to match" not in md


@pytest.mark.parametrize("clock", ["epoch", "relative"])
def test_unmarked_two_rank_traces_give_the_campaigns_shares(tmp_path, campaign_ddp, clock):
    """The user's case: both ranks' traces without ProfilerStep marks, with absolute Unix-epoch ts
    (older Kineto: no baseTimeNanoseconds) or relative ts of unknown origin. The steps come from
    the runner's repeating 'data' annotation; the attribution is the campaign's."""
    folder = tmp_path / "logs"
    folder.mkdir()
    for r in (0, 1):
        doc = _no_marks(json.loads(gzip.decompress((DDP / f"profile_rank{r}.json.gz").read_bytes())))
        doc = _to_epoch(doc) if clock == "epoch" else {k: v for k, v in doc.items() if k != "baseTimeNanoseconds"}
        (folder / f"trace_rank{r}.json").write_text(json.dumps(doc))
    _, tables, jobs = load_thirdparty_jobs(folder)
    assert len(jobs) == 1
    meta = tables["traces"]
    assert list(meta["step_split"]) == ["annotation"] * 2 and (meta["num_steps"] == 2).all()
    assert list(meta["epoch_clock"]) == [clock == "epoch"] * 2
    assert not any("ignored" in w for w in tables["files"]["warnings"])
    _, _, note = load_note(folder)
    (t,) = note.traces
    assert t.whole_trace_ranks == ()
    for k, share in campaign_ddp.shares.items():
        assert t.attribution.shares[k] == pytest.approx(share, abs=5e-4), k
    md = Path(build_report(folder, out_dir=tmp_path / "out", formats=["md"])[0]).read_text()
    assert "trace_rank1.json: no ProfilerStep marks: steps split by the repeating annotation 'data' (3 periods" in md
    said = ("the ranks' traces share the Unix-epoch clock" if clock == "epoch"
            else "steps are matched across ranks by their order in each trace")
    assert said in md


def test_two_traces_of_one_rank_are_two_jobs(tmp_path):
    folder = tmp_path / "logs"
    (folder / "a").mkdir(parents=True)
    (folder / "b").mkdir()
    shutil.copy(DDP / "profile_rank0.json.gz", folder / "a" / "profile_rank0.json.gz")
    shutil.copy(DDP / "profile_rank0.json.gz", folder / "b" / "profile_rank0.json.gz")
    _, _, jobs = load_thirdparty_jobs(folder)
    assert len(jobs) == 2
    assert any("both hold a profiler trace of rank(s) 0" in n for j in jobs for n in j.not_joined)


# --- traces as users bring them: Unix-epoch timestamps, no ProfilerStep marks ------------------

def _torch_cpu_trace(path: Path, *, num_steps: int, annotate: bool, schedule: bool) -> dict:
    """A real torch.profiler (Kineto) trace of a tiny MLP training loop on CPU, written to ``path``
    and returned as a dict. schedule: ProfilerStep#k marks (warm-up 1, then num_steps active);
    annotate: each iteration inside record_function("train_step")."""
    torch = pytest.importorskip("torch")
    from contextlib import nullcontext

    from torch.profiler import ProfilerActivity, profile, record_function
    from torch.profiler import schedule as make_schedule

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kwargs = {"schedule": make_schedule(wait=0, warmup=1, active=num_steps, repeat=1),
              "on_trace_ready": lambda p: p.export_chrome_trace(str(path))} if schedule else {}
    with profile(activities=[ProfilerActivity.CPU], **kwargs) as prof:
        for _ in range(num_steps + 1 if schedule else num_steps):
            with record_function("train_step") if annotate else nullcontext():
                x = torch.randn(256, 64)
                loss = model(x).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
            if schedule:
                prof.step()
    if not schedule:
        prof.export_chrome_trace(str(path))
    return json.loads(path.read_text())


def _breakdown(doc: dict, **kw):
    from ingest.traces import compute_step_breakdown

    return compute_step_breakdown(iter(doc["traceEvents"]), run="r", rank=0, pp_degree=1, unmarked="split", **kw)


def _to_epoch(doc: dict) -> dict:
    """The trace as older Kineto wrote it: every ts absolute Unix-epoch microseconds, no base."""
    base_us = doc.get("baseTimeNanoseconds", 0) / 1000 or 1.68e15
    out = {k: v for k, v in doc.items() if k != "baseTimeNanoseconds"}
    out["traceEvents"] = [dict(e, ts=e["ts"] + base_us) if isinstance(e.get("ts"), (int, float)) else e
                          for e in doc["traceEvents"]]
    return out


def _no_marks(doc: dict) -> dict:
    return {**doc, "traceEvents": [e for e in doc["traceEvents"]
                                   if not str(e.get("name", "")).startswith("ProfilerStep#")]}


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    return _torch_cpu_trace(tmp_path_factory.mktemp("t") / "marked.json", num_steps=5, annotate=True, schedule=True)


def test_epoch_timestamps_give_the_same_breakdown(cpu_trace, tmp_path):
    epoch = _to_epoch(cpu_trace)
    assert min(e["ts"] for e in epoch["traceEvents"] if e.get("ph") == "X") > 1e15
    rel, abs_ = _breakdown(cpu_trace), _breakdown(epoch)
    assert abs_.step_split == "marks" and [s.step for s in abs_.steps] == [1, 2, 3, 4, 5]
    assert not [w for w in abs_.warnings if "ignored" in w or "outlier" in w]
    for a, b in zip(rel.steps, abs_.steps, strict=True):
        for f in ("step_time_s", "compute_s", "exposed_comm_s", "data_stall_s", "other_s", "idle_s"):
            # epoch floats near 1.7e15 us hold 0.25 us: a few boundaries' worth
            assert getattr(b, f) == pytest.approx(getattr(a, f), abs=5e-6), f
    assert abs_.rank_timeline.epoch_origin_us > 1e15
    # the same through the user path (file name gives the rank; the header has no base time)
    (tmp_path / "trace_rank0.json").write_text(json.dumps(epoch))
    _, tables, _ = load_thirdparty_jobs(tmp_path)
    assert len(tables["breakdown"]) == 5 and bool(tables["traces"]["epoch_clock"].iloc[0])


def test_a_stray_clock_value_is_an_outlier_named_not_a_lost_trace(cpu_trace):
    epoch = _to_epoch(cpu_trace)
    stray = dict(next(e for e in epoch["traceEvents"] if e.get("cat") == "cpu_op"), ts=0.0, name="aten::stray")
    r = _breakdown({**epoch, "traceEvents": epoch["traceEvents"] + [stray]})
    assert len(r.steps) == 5
    (w,) = [w for w in r.warnings if "outlier" in w]
    assert w.startswith("1 event(s) more than 2 days") and "'aten::stray' at ts=0 us" in w


def _same_steps(marked, split) -> None:
    """The annotation's periods are the marks' steps: the same median step and compute within 5%.
    A step's two splits differ by how long the loop's own code outside the annotation took at its
    two ends (prof.step(), the loop), which one preemption on a loaded 2-core machine stretches by
    milliseconds (one step read 36.4 ms against 32.7), so steps are compared by their median, which
    a merged, split or shifted period still moves by a whole step."""
    for field in ("step_time_s", "compute_s"):
        a, b = (statistics.median(getattr(s, field) for s in steps) for steps in (marked, split))
        assert b == pytest.approx(a, rel=0.05, abs=3e-4), (field, [getattr(s, field) for s in marked],
                                                           [getattr(s, field) for s in split])


def test_unmarked_trace_is_split_by_its_repeating_annotation(cpu_trace):
    marked, split = _breakdown(cpu_trace), _breakdown(_no_marks(cpu_trace))
    assert split.step_split == "annotation" and split.step_split_name == "train_step"
    assert any(w.startswith("no ProfilerStep marks: steps split by the repeating annotation 'train_step' (5 periods")
               for w in split.warnings)
    assert len(split.steps) == len(marked.steps) == 5
    _same_steps(marked.steps, split.steps)


def test_unmarked_trace_without_own_annotation_is_split_by_the_optimizer_step(tmp_path):
    doc = _torch_cpu_trace(tmp_path / "t.json", num_steps=5, annotate=False, schedule=True)
    marked, split = _breakdown(doc), _breakdown(_no_marks(doc))
    assert split.step_split == "annotation" and split.step_split_name.startswith("Optimizer.")
    assert len(split.steps) == len(marked.steps) == 5
    _same_steps(marked.steps, split.steps)


def test_unmarked_trace_without_a_repeating_pattern_is_one_window(tmp_path):
    doc = _torch_cpu_trace(tmp_path / "t.json", num_steps=1, annotate=False, schedule=False)
    r = _breakdown(doc)
    assert r.step_split == "window" and [s.step for s in r.steps] == [0]
    assert any(w.startswith("no ProfilerStep marks, no repeating annotation and no repeating kernel pattern: "
                            "the whole trace is analysed as one window") for w in r.warnings)
    # no runner phase ranges on a user's CPU trace: its time is "other", but all of it is there
    assert r.steps[0].step_time_s > 0 and r.steps[0].num_kernels > 100
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "trace_rank0.json").write_text(json.dumps(doc))
    md = Path(build_report(tmp_path / "logs", out_dir=tmp_path / "out", formats=["md"])[0]).read_text()
    assert "No ProfilerStep marks in the trace of rank(s) 0: the whole trace is analysed as one window" in md


@pytest.mark.parametrize("rank", [0, 1])
def test_gpu_trace_without_host_ops_is_split_by_its_kernel_pattern(rank):
    """A real H200 DDP trace with its ProfilerStep marks and every host op removed: the steps come
    from the repeating kernel sequence, and are the marked ones."""
    doc = json.loads(gzip.decompress((DDP / f"profile_rank{rank}.json.gz").read_bytes()))
    marked = _breakdown(doc)
    bare = {**doc, "traceEvents": [e for e in doc["traceEvents"] if e.get("cat") not in ("cpu_op", "user_annotation")]}
    split = _breakdown(bare)
    assert split.step_split == "kernels"
    assert [s.step for s in split.steps] == [0, 1] and [s.step for s in marked.steps] == [85, 86]
    for a, b in zip(marked.steps, split.steps):
        assert b.step_time_s == pytest.approx(a.step_time_s, abs=2e-6)
        assert b.compute_s == pytest.approx(a.compute_s, abs=2e-6)
        assert b.exposed_comm_s == pytest.approx(a.exposed_comm_s, abs=2e-6)


def test_unmarked_ranks_on_the_epoch_clock_are_aligned_by_start_time():
    """Rank 1's trace starts one iteration later than rank 0's: on the shared epoch clock its
    first split step is rank 0's second, so the collectives of that iteration are matched."""
    from ingest.attribution import compute_attribution
    from ingest.traces import compute_step_breakdown

    timelines = {}
    for r in (0, 1):
        events = _to_epoch(_no_marks(json.loads(gzip.decompress((DDP / f"profile_rank{r}.json.gz").read_bytes()))))
        events = events["traceEvents"]
        if r == 1:
            data = sorted(e["ts"] for e in events if e.get("name") == "data" and e.get("cat") == "user_annotation")
            events = [e for e in events if not isinstance(e.get("ts"), (int, float)) or e["ts"] >= data[1] - 1]
        timelines[r] = compute_step_breakdown(iter(events), run="r", rank=r, pp_degree=1,
                                              unmarked="split").rank_timeline
    assert timelines[1].steps.tolist() == [0]
    att = compute_attribution(timelines, run="r", pp_degree=1, num_microbatches=1)
    assert "share the Unix-epoch clock" in att.warnings[0] and "rank 1 by +1" in att.warnings[0]
    assert sorted((a.rank, a.step) for a in att.rows) == [(0, 0), (0, 1), (1, 1)]
    assert att.collectives and {c.step for c in att.collectives} == {1}
    assert all(c.num_ranks == 2 for c in att.collectives)


FSDP2 = ROOT / "examples" / "h200-2gpu" / "zero3-fsdp2" / "trace"


def _as_rank(doc: dict, *, rank: int, world_size: int, group: str) -> dict:
    """A rank's trace relabelled as rank ``rank`` of a ``world_size`` job whose collectives run in
    process group ``group`` (every NCCL kernel's 'Process Group Name')."""
    events = [{**e, "args": {**e["args"], "Process Group Name": group}}
              if isinstance(e.get("args"), dict) and "Process Group Name" in e["args"] else e
              for e in doc["traceEvents"]]
    info = {**doc["distributedInfo"], "rank": rank, "world_size": world_size}
    return {**doc, "traceEvents": events, "distributedInfo": info}


def test_each_process_group_has_its_own_late_rank(tmp_path):
    """Four ranks in two process groups: ranks 0 and 1 are the real FSDP2 pair in group "0";
    ranks 2 and 3 the same pair with their roles swapped (rank 2 is the real rank 1) in group
    "1". Each group's late rank is named on its own, and both late ranks are charged in each step
    (a per-step late rank over all groups names only one)."""
    real = {r: json.loads(gzip.decompress((FSDP2 / f"profile_rank{r}.json.gz").read_bytes())) for r in (0, 1)}
    _, _, note = load_note(ROOT / "examples" / "h200-2gpu")
    late = next(b.attribution for b in note.evidence.rows if b.run == "zero3-fsdp2").straggler.rank
    copy_of = {0: 0, 1: 1, 2: 1, 3: 0}
    folder = tmp_path / "logs"
    folder.mkdir()
    for rank, src in copy_of.items():
        doc = _as_rank(real[src], rank=rank, world_size=4, group="0" if rank < 2 else "1")
        (folder / f"profile_rank{rank}.json").write_text(json.dumps(doc))
    _, _, note = load_note(folder)
    (t,) = note.traces
    groups = {g.group: g for g in t.attribution.groups}
    assert set(groups) == {"0", "1"} and all(g.num_ranks == 2 for g in groups.values())
    want = {"0": late, "1": next(r for r, src in copy_of.items() if r >= 2 and src == late)}
    assert {k: g.rank for k, g in groups.items()} == want
    assert groups["0"].wait_ms_median == pytest.approx(groups["1"].wait_ms_median, rel=1e-6)
    md = Path(build_report(folder, out_dir=tmp_path / "out", formats=["md"])[0]).read_text()
    assert "Each process group has its own late rank" in md
    # both late ranks are charged in every step, the same wait each (the attribution rows)
    _, tables, _ = load_thirdparty_jobs(folder)
    rows = tables["attribution"]
    assert set(rows[rows["late"]]["rank"]) == set(want.values())
    assert rows[rows["late"]].groupby("rank").size().tolist() == [2, 2]
    waits = rows[rows["late"]].groupby("step")["late_caused_wait_s"].agg(["min", "max"])
    assert (waits["min"] == waits["max"]).all()
