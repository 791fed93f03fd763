"""Overlap measured: a matrix's ``overlap_pairs`` resolves each run with a twin whose overlap
switches alone are off; on CPU (gloo, tiny, world 2) the DDP pair runs, the twin's all-reduce
leaves backward, and the note's pair row equals the numbers recomputed here from the JSONL and
the recorded section-5 tables."""
from __future__ import annotations

import dataclasses
import gzip
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.records import run_spec_from_dict
from report.render import duration
from runner.matrix import resolve_matrix

MATRIX = """
[campaign]
name = "overlap"
preset = "tiny"
world_size = 2
overlap_pairs = true

[fixed]
steps = 10
warmup_steps = 2
profile_start_step = 4
profile_num_steps = 3

[[runs]]
name = "ddp"
strategy = "ddp"
options = { bucket_cap_mb = 1 }

[[runs]]
name = "fsdp2"
strategy = "zero3"
engine = "fsdp2"
"""
PAIR = ("ddp", "ddp-no-overlap")


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Path:
    """`runner all` on the DDP and FSDP2 pairs, then `report build`."""
    root = tmp_path_factory.mktemp("overlap")
    (root / "m.toml").write_text(MATRIX)
    out = root / "c"
    for argv in (["runner.cli", "all", "--matrix", str(root / "m.toml"), "--out", str(out)],
                 ["report.cli", "build", str(out), "--format", "md,html"]):
        res = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out


def _resolve(runs: list[dict]) -> dict:
    raw = {"campaign": {"name": "x", "overlap_pairs": True}, "fixed": {"steps": 14}, "runs": runs}
    return {s.name: s for s in resolve_matrix(raw, source="m.toml", num_gpus=0).runs}


def test_each_twin_differs_from_its_run_only_in_the_overlap_switch():
    specs = _resolve([{"name": "ddp", "strategy": "ddp"}, {"name": "ds", "strategy": "zero3"},
                      {"name": "fs", "strategy": "zero3", "engine": "fsdp2", "options": {"prefetch_num_blocks": 2}},
                      {"name": "tp", "strategy": "tp_pp", "tp_degree": 2}])
    # torch TP+PP has no switch: no twin; every other run has one, right after it
    assert list(specs) == ["ddp", "ddp-no-overlap", "ds", "ds-no-overlap", "fs", "fs-no-overlap", "tp"]
    expected = {"ddp": {"overlap_grad_reduce": (True, False)},
                "ds": {"zero": ({"overlap_comm": True}, {"overlap_comm": False})},
                "fs": {"prefetch": (True, False), "prefetch_num_blocks": (2, 0)}}
    for name, switch in expected.items():
        on, off = dataclasses.asdict(specs[name]), dataclasses.asdict(specs[f"{name}-no-overlap"])
        assert off.pop("options").pop("overlap_off_of") == name
        off_opts, on_opts = dataclasses.asdict(specs[f"{name}-no-overlap"])["options"], on.pop("options")
        assert {k: v for k, v in off.items() if k not in ("name", "layout")} == \
               {k: v for k, v in on.items() if k not in ("name", "layout")}
        assert off["name"] == off["layout"] == f"{name}-no-overlap" and on["layout"] == name
        differing = {k for k in (set(on_opts) | set(off_opts)) - {"overlap_off_of"} if on_opts.get(k) != off_opts.get(k)}
        assert differing == set(switch), name
        for k, (a, b) in switch.items():
            if k == "zero":
                assert {x: v for x, v in on_opts[k].items() if on_opts[k][x] != off_opts[k][x]} == a
                assert {x: v for x, v in off_opts[k].items() if on_opts[k][x] != off_opts[k][x]} == b
            else:
                assert (on_opts[k], off_opts[k]) == (a, b)


def test_a_pair_request_the_engine_cannot_honour_is_one_line_exit_2(tmp_path):
    (tmp_path / "m.toml").write_text('[[runs]]\nname = "tp"\nstrategy = "tp_pp"\ntp_degree = 2\noverlap = "pair"\n')
    res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--dry-run", "--matrix", str(tmp_path / "m.toml")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if "overlap" in ln]
    assert len(lines) == 1 and "m.toml run 1 ('tp') overlap" in lines[0] and "no overlap switch" in lines[0]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for p in sorted((run_dir / "metrics").glob("rank*.jsonl"))
            for line in p.read_text().splitlines()]


def test_both_runs_complete_and_train_the_same_loss(campaign):
    losses = {}
    for name in PAIR:
        assert json.loads((campaign / name / "status.json").read_text())["status"] == "ok"
        rows = _rows(campaign / name)
        spec = run_spec_from_dict(json.loads((campaign / name / "spec.json").read_text()))
        assert len(rows) == spec.world_size * spec.fixed.steps
        losses[name] = [r["loss"] for r in sorted(rows, key=lambda r: (r["step"], r["rank"]))]
    # the twin averages the same gradients after backward: the same training, step by step
    np.testing.assert_allclose(losses["ddp-no-overlap"], losses["ddp"], rtol=1e-5)


def _allreduce_after_backward_us(run_dir: Path) -> list[float]:
    """Per traced step of rank 0: first all-reduce's start minus the end of backward's last autograd op (µs)."""
    with gzip.open(run_dir / "trace" / "profile_rank0.json.gz", "rt") as fp:
        events = [e for e in json.load(fp)["traceEvents"] if e.get("ph") == "X"]
    out = []
    for step in (e for e in events if str(e["name"]).startswith("ProfilerStep#")):
        inside = [e for e in events if step["ts"] <= e["ts"] < step["ts"] + step["dur"]]
        first = min(e["ts"] for e in inside if e["name"] == "c10d::allreduce_")
        last = max(e["ts"] + e["dur"] for e in inside if str(e["name"]).startswith("autograd::engine::evaluate_function"))
        out.append(first - last)
    return out


def test_overlap_off_moves_the_all_reduce_after_backward(campaign):
    on, off = (_allreduce_after_backward_us(campaign / name) for name in PAIR)
    assert len(on) == len(off) == 3
    assert all(d < 0 for d in on), on  # DDP's bucket hook fires inside backward
    assert all(d > 0 for d in off), off  # the twin's one flat all-reduce waits for all of it


def _prefetched_all_gathers(run_dir: Path) -> int:
    """FSDP all-gathers rank 0 issued inside a backward-prefetch range, over the traced steps."""
    with gzip.open(run_dir / "trace" / "profile_rank0.json.gz", "rt") as fp:
        events = [e for e in json.load(fp)["traceEvents"] if e.get("ph") == "X"]
    prefetch = [e for e in events if str(e["name"]).startswith("FSDP::backward_prefetch")]
    return sum(1 for a in events if str(a["name"]).startswith("FSDP::all_gather (") and any(
        p["tid"] == a["tid"] and p["ts"] <= a["ts"] < p["ts"] + p["dur"] for p in prefetch))


def test_fsdp2_prefetch_off_issues_no_all_gather_ahead(campaign):
    assert json.loads((campaign / "fsdp2-no-overlap" / "status.json").read_text())["status"] == "ok"
    # 4 blocks resharded after forward: each backward prefetches the next blocks' all-gathers (3 traced steps)
    assert _prefetched_all_gathers(campaign / "fsdp2") >= 3 * 3
    assert _prefetched_all_gathers(campaign / "fsdp2-no-overlap") == 0
    a, b = ([json.loads(ln)["loss"] for ln in (campaign / n / "metrics" / "rank0.jsonl").read_text().splitlines()]
            for n in ("fsdp2", "fsdp2-no-overlap"))
    np.testing.assert_allclose(b, a, rtol=1e-5)


def _pair_row(note_md: str) -> list[str]:
    section = note_md.split("### Overlap measured", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| ddp / ddp-no-overlap |")]
    assert len(rows) == 1, section
    return [c.strip() for c in rows[0].strip("|").split("|")]


def test_note_pair_row_equals_recomputation(campaign):
    medians, noise = {}, []
    for name in PAIR:
        spec = run_spec_from_dict(json.loads((campaign / name / "spec.json").read_text()))
        rows = [r for r in _rows(campaign / name) if r["step"] >= spec.fixed.warmup_steps and not r["profiled"]]
        steps = sorted({r["step"] for r in rows})
        times = [max(r["step_time_s"] for r in rows if r["step"] == s) for s in steps]
        medians[name] = statistics.median(times)
        noise.append(float(np.percentile(times, 90)) - medians[name])
    summary = {r["run"]: r for r in json.loads((campaign / "report" / "summary.json").read_text())["runs"]}
    exposed = {n: (summary[n]["breakdown_ms"]["transfer"] + summary[n]["breakdown_ms"]["skew_wait"]) / 1e3 for n in PAIR}
    most = summary["ddp-no-overlap"]["whatif_saving_ms"]["transfer"] / 1e3
    cells = _pair_row((campaign / "report" / "note.md").read_text())
    saved = medians["ddp-no-overlap"] - medians["ddp"]
    assert cells[2] == "overlap_grad_reduce: True → False"
    assert cells[3] == f"{duration(medians['ddp'])} / {duration(medians['ddp-no-overlap'])}"
    assert cells[4] == duration(saved)
    assert cells[5] == f"{duration(exposed['ddp'])} / {duration(exposed['ddp-no-overlap'])}"
    assert cells[6] == duration(exposed["ddp-no-overlap"] - exposed["ddp"])
    assert cells[7] == duration(most) and most > 0  # the twin's all-reduce is exposed: removing it saves time
    verdict = ("no saving" if saved <= max(noise) else "within" if saved <= most + max(noise) else "beyond")
    assert cells[8].startswith(verdict), (cells[8], saved, most, noise)
    record = json.loads((campaign / "report" / "summary.json").read_text())["overlap_pairs"]
    assert [(p["run"], p["twin"], p["switches"]) for p in record] == [
        ("ddp", "ddp-no-overlap", [["overlap_grad_reduce", "True", "False"]]),
        ("fsdp2", "fsdp2-no-overlap", [["prefetch", "True", "False"]])]
    assert record[0]["step_time_saved_s"] == pytest.approx(saved)
    assert record[0]["predicted_most_saved_s"] == pytest.approx(most)
    assert "<h3>Overlap measured: each switch off and on</h3>" in (campaign / "report" / "note.html").read_text()


@pytest.mark.parametrize("saved_s, most_s, noise_s, verdict", [
    (None, 0.010, 0.001, "no_data"),
    (0.0005, 0.010, 0.001, "no_saving"),  # within the noise
    (-0.004, 0.010, 0.001, "no_saving"),  # overlap slower
    (0.005, None, 0.001, "no_prediction"),
    (0.005, 0.010, 0.001, "within_bound"),
    (0.0105, 0.010, 0.001, "within_bound"),  # past the bound by less than the noise
    (0.012, 0.010, 0.001, "beyond_bound"),
])
def test_verdict_rule(saved_s, most_s, noise_s, verdict):
    from report.overlap import judge_overlap

    assert judge_overlap(saved_s=saved_s, most_s=most_s, noise_s=noise_s) == verdict


@pytest.mark.parametrize("strategy, engine, options, line", [
    ("zero3", "fsdp2", {"prefetch": False, "prefetch_num_blocks": 2},
     "w: 'prefetch' false turns every all-gather prefetch off; drop prefetch_num_blocks (2) or set prefetch = true"),
    ("zero3", "fsdp2", {"prefetch": False, "prefetch_num_blocks": "2"}, "w: 'prefetch_num_blocks' must be int, got '2'"),
    ("ddp", "torch-ddp", {"overlap_grad_reduce": "off"}, "w: 'overlap_grad_reduce' must be bool, got 'off'"),
    ("tp_pp", "megatron", {"overlap_param_gather": True, "use_distributed_optimizer": False},
     "w: 'overlap_param_gather' needs use_distributed_optimizer (its all-gather is the one overlapped); drop it or"
     " set use_distributed_optimizer = true"),
    ("tp_pp", "torch", {"overlap_grad_reduce": False}, "w: unknown key 'overlap_grad_reduce' (valid: "),
])
def test_overlap_knob_problems_are_one_line_each(strategy, engine, options, line):
    from runner.knobs import resolve_knobs

    _, problems = resolve_knobs(strategy, engine, options, device="cuda", dp_degree=2, where="w")
    assert len(problems) == 1 and problems[0].startswith(line), problems
