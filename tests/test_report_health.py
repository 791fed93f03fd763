"""Training health in the note: planted loss spikes, divergences and gradient explosions of known
size and step are flagged at exactly those steps, the run is called unhealthy, marked in the metric
table and never recommended; healthy runs (the committed GPU campaigns) are not flagged.

Two sources of truth, both apart from the rule judged: step rows written with the tool's own
records (core.records.StepRow) around a planted value, and real CPU runs whose learning rate the
runner multiplies at one step (the matrix's ``plant.lr_spike_*``), the step recorded in the run's
own rows (StepRow.lr).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from core.errors import ConfigError
from core.records import Plant, StepRow, run_spec_from_dict, to_dict
from ingest.io import load_campaign
from report.health import build_health_section, compute_trailing_stats
from report.render import build_report
from report.rules import THRESHOLDS
from runner.matrix import resolve_matrix
from synthetic_campaign import write_synthetic_campaign

ROOT = Path(__file__).resolve().parent.parent
STEPS, WARMUP = 60, 5
NOISE_NATS = 0.02  # the healthy curve's step-to-step noise (SD)
SPIKE_STEP, SPIKE_NATS = 30, 0.8
NAN_STEP = 44
RISE_FROM, RISE_NATS_PER_STEP = 40, 0.25
BOOM_STEP, BOOM_NORM = 35, 40.0
# every run the same layout; the unhealthy ones the fastest, so the ranking would pick them if it could
LAYOUTS = {name: ("ddp", "torch-ddp", 1, 1, 1, 8, 1, base_s) for name, base_s in (
    ("clean", 0.10), ("spike", 0.11), ("nan", 0.05), ("rise", 0.06), ("boom", 0.07))}


def _healthy_loss(step: int) -> float:
    """A falling curve (ln 500 to ~4.2 nats) plus seeded noise of NOISE_NATS."""
    noise = np.random.default_rng(step).normal(0.0, NOISE_NATS)
    return math.log(500) - 2.0 * (1 - math.exp(-step / 10)) + float(noise)


def _rows(run: str) -> list[StepRow]:
    """The run's step rows: the healthy curve with its planted cause (LAYOUTS' names)."""
    out = []
    for step in range(STEPS):
        loss, grad_norm = _healthy_loss(step), 1.0 + 0.1 * math.sin(step)
        if run == "spike" and step == SPIKE_STEP:
            loss += SPIKE_NATS
        if run == "spike":
            grad_norm = None  # as DeepSpeed with CPU offload: no norm reported
        if run == "nan" and step >= NAN_STEP:
            loss, grad_norm = float("nan"), float("inf")
        if run == "rise" and step >= RISE_FROM:
            loss += RISE_NATS_PER_STEP * (step - RISE_FROM + 1)
        if run == "boom" and step == BOOM_STEP:
            grad_norm = BOOM_NORM
        out.append(StepRow(run=run, rank=0, step=step, step_time_s=LAYOUTS[run][-1] * (1 + 0.01 * (step % 3)),
                           tokens=256, loss=loss, lr=6e-4, grad_norm=grad_norm, mem_peak_allocated_gib=None,
                           mem_peak_reserved_gib=None, data_wait_s=0.001, wall_time_s=step * 0.1))
    return out


def _rise_diverged_at() -> int:
    """The first step whose planted loss is more than loss_diverge_nats above step 0's."""
    first, rows = _healthy_loss(0), _rows("rise")
    return next(s for s in range(STEPS) if rows[s].loss > first + THRESHOLDS["loss_diverge_nats"])


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Path:
    root = write_synthetic_campaign(tmp_path_factory.mktemp("health") / "health", steps=STEPS, warmup_steps=WARMUP,
                                    failed=(), layouts=LAYOUTS)
    for run in LAYOUTS:
        lines = [json.dumps(to_dict(r)) for r in _rows(run)]
        (root / run / "metrics" / "rank0.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def health(campaign):
    c = load_campaign(campaign)
    section = build_health_section(c.steps, list(c.runs["run"]), warmup_steps=WARMUP, thresholds=THRESHOLDS)
    return {h.run: h for h in section.runs}


@pytest.fixture(scope="module")
def note(campaign, tmp_path_factory) -> tuple[str, dict]:
    out = tmp_path_factory.mktemp("note")
    build_report(campaign, out_dir=out, formats=("md", "html"))
    return (out / "note.md").read_text(), json.loads((out / "summary.json").read_text())


# ------------------------------------------------------------------ the rule on planted rows
def test_a_healthy_noisy_curve_is_not_flagged(health):
    h = health["clean"]
    assert (h.verdict, h.spike_steps, h.explosion_steps, h.diverged_at_step) == ("healthy", (), (), None)


def test_a_planted_loss_spike_is_flagged_at_its_step_only(health):
    h = health["spike"]
    assert h.spike_steps == (SPIKE_STEP,)
    (s,) = h.spikes
    assert s.loss == pytest.approx(_healthy_loss(SPIKE_STEP) + SPIKE_NATS)
    # the planted size, against the median of a falling curve's last 20 steps (~0.1 nats above it)
    assert s.excess_nats == pytest.approx(SPIKE_NATS, abs=0.15)
    assert h.verdict == "healthy" and h.reasons == ()  # a spike that recovers is flagged, not a breakdown
    assert not h.grad_norm_recorded


def test_a_non_finite_loss_is_divergence_from_its_first_step(health):
    h = health["nan"]
    assert (h.verdict, h.diverged_at_step, h.divergence) == ("unhealthy", NAN_STEP, "non_finite")
    assert h.reasons == ("loss_non_finite", "grad_norm_non_finite")
    assert h.explosion_steps == tuple(range(NAN_STEP, STEPS))
    assert h.spike_steps == ()  # nothing flagged before the planted step, NaN is no spike


def test_a_loss_rising_past_its_start_is_divergence(health):
    h = health["rise"]
    assert (h.verdict, h.diverged_at_step, h.divergence, h.reasons) == (
        "unhealthy", _rise_diverged_at(), "above_start", ("loss_above_start",))
    assert h.spike_steps and h.spike_steps[0] == RISE_FROM  # the rise is flagged from its first step
    assert all(s >= RISE_FROM for s in h.spike_steps)


def test_an_exploding_gradient_norm_is_flagged_at_its_step(health):
    h = health["boom"]
    assert (h.verdict, h.reasons, h.explosion_steps) == ("unhealthy", ("grad_norm_explosion",), (BOOM_STEP,))
    (e,) = h.explosions
    assert e.grad_norm == BOOM_NORM and e.ratio == pytest.approx(BOOM_NORM / e.rolling_median)
    assert h.spike_steps == ()


@pytest.mark.parametrize("step, nats, flagged", [(25, 0.8, True), (50, 0.8, True), (30, 0.4, True), (30, 0.09, False),
                                                  (3, 2.0, False), (10, 0.3, False)])
def test_spike_position_and_size(step, nats, flagged):
    """The planted step moves with the plant. Not spikes: a bump within 6 noise SDs (0.12 nats)
    or below loss_spike_min_nats; one before the window holds loss_spike_min_window_steps losses;
    one that leaves the loss under the median of the 20 steps before it (step 10 of a curve
    falling ~0.7 nats over those steps)."""
    import pandas as pd

    rows = [dict(to_dict(r), loss=r.loss + (nats if r.step == step else 0.0)) for r in _rows("clean")]
    h, = build_health_section(pd.DataFrame(rows), ["clean"], warmup_steps=WARMUP, thresholds=THRESHOLDS).runs
    assert h.spike_steps == ((step,) if flagged else ())


def test_trailing_window_excludes_the_step_itself():
    median, mad = compute_trailing_stats(np.array([1.0, 2.0, 4.0, 7.0, 100.0]), window_steps=3, min_window_steps=2)
    assert np.isnan(median[:2]).all()
    assert median[2:].tolist() == [1.5, 2.0, 4.0]  # [1, 2], [1, 2, 4], [2, 4, 7]: never the value judged
    assert mad[2:].tolist() == [0.0, 0.5, 0.5]  # differences [1], [1, 2], [2, 3]


def test_committed_gpu_campaigns_are_healthy():
    """Every run of every committed example trains soundly (looked at: losses fall from ln V to
    ~6.5 nats, gradient norms from ~33 to ~0.2, no step above 3x the norms before it)."""
    for example in sorted(p.parent for p in (ROOT / "examples").glob("h*/campaign.json")):
        c = load_campaign(example)
        section = build_health_section(c.steps, list(c.runs["run"]), warmup_steps=c.campaign.fixed.warmup_steps,
                                       thresholds=THRESHOLDS)
        for h in section.runs:
            assert (h.verdict, h.spike_steps, h.explosion_steps) == ("healthy", (), ()), (example.name, h.run)


# ------------------------------------------------------------------ the note and summary.json
def test_note_marks_unhealthy_runs_and_never_recommends_them(note):
    md, summary = note
    section4 = md.split("## 4. Metrics", 1)[1].split("## 5.", 1)[0]
    table = section4.split("### Speed and memory", 1)[1]
    status = {c[0]: c[1] for c in ([x.strip() for x in line.strip().strip("|").split("|")]
                                   for line in table.splitlines()) if c and c[0] in LAYOUTS}
    assert status == {"clean": "ok", "spike": "ok", "nan": "ok (unhealthy training: not ranked)",
                      "rise": "ok (unhealthy training: not ranked)", "boom": "ok (unhealthy training: not ranked)"}
    fastest = next(f for f in summary["findings"] if f["kind"] == "fastest")
    assert fastest["runs"] == ["clean"]  # the three unhealthy runs were faster
    assert {f["runs"][0] for f in summary["findings"] if f["kind"] == "excluded_unhealthy"} == {"nan", "rise", "boom"}
    summary_line = md.split("## Executive summary", 1)[1].split("## 1.", 1)[0]
    assert "Recommendation: **clean**" in summary_line and "section 4): nan, rise, boom." in summary_line
    conclusion = md.split("## 6. Conclusion", 1)[1]
    assert f"**nan** trained unhealthily: its loss is non-finite from step {NAN_STEP} on" in conclusion
    assert f"**boom** trained unhealthily: its gradient norm reached 40 at step {BOOM_STEP}" in conclusion


def test_note_states_the_rule_and_the_flagged_steps(note):
    md, _ = note
    health = md.split("### Training health", 1)[1].split("### Speed and memory", 1)[0]
    assert "by more than 6.0 standard deviations of its step-to-step noise" in health
    assert "and by more than 0.1 nats" in health and "more than 1 nats above its first step's" in health
    rows = {c[0]: c for c in ([x.strip() for x in line.strip().strip("|").split("|")] for line in health.splitlines())
            if c and c[0] in LAYOUTS}
    assert rows["spike"][1] == "healthy" and rows["spike"][3].startswith(f"{SPIKE_STEP}: ")
    assert rows["spike"][5] == "not recorded" and rows["spike"][6] == "not recorded"
    assert rows["nan"][1] == "**unhealthy**" and rows["nan"][4] == f"{NAN_STEP} (non-finite)"
    assert rows["clean"][3] == "none" and rows["clean"][4] == "—" and rows["clean"][6] == "none"
    assert "![Loss and gradient norm vs step, flagged steps](figures/health.svg)" in health


def test_summary_json_carries_the_verdict_and_flagged_steps(note):
    _, summary = note
    runs = {r["run"]: r["health"] for r in summary["runs"]}
    assert runs["clean"]["verdict"] == "healthy" and runs["clean"]["loss_spike_steps"] == []
    assert runs["spike"]["loss_spike_steps"] == [SPIKE_STEP] and runs["spike"]["grad_norm_recorded"] is False
    assert (runs["nan"]["verdict"], runs["nan"]["diverged_at_step"], runs["nan"]["divergence"]) == (
        "unhealthy", NAN_STEP, "non_finite")
    assert runs["rise"]["diverged_at_step"] == _rise_diverged_at()
    assert runs["boom"]["grad_norm_explosion_steps"] == [BOOM_STEP]
    assert summary["health_rule"]["spike_k"] == THRESHOLDS["loss_spike_k"]


def test_chinese_note_words_the_health_section(campaign, tmp_path):
    build_report(campaign, out_dir=tmp_path / "zh", formats=("md",), lang="zh")
    md = (tmp_path / "zh" / "note.md").read_text()
    assert "### 训练健康度" in md and "（训练不健康：未排名）" in md and "训练不健康：其损失从第 44 步起为非有限值" in md


# ------------------------------------------------------------------ the lr_spike plant
def _matrix(plant) -> dict:
    return {"campaign": {"name": "t", "preset": "tiny"}, "fixed": {"steps": 20},
            "runs": [{"name": "p", "strategy": "ddp", "world_size": 1, "plant": plant}]}


@pytest.mark.parametrize("plant, fragment", [
    ({"lr_spike_step": 5}, "plant lr_spike_step and lr_spike_factor go together"),
    ({"lr_spike_factor": 10}, "plant lr_spike_step and lr_spike_factor go together"),
    ({"lr_spike_step": 20, "lr_spike_factor": 10}, "plant lr_spike_step must be a step in [0, 20) (0-based), got 20"),
    ({"lr_spike_step": -1, "lr_spike_factor": 10}, "plant lr_spike_step must be a step in [0, 20)"),
    ({"lr_spike_step": 2.0, "lr_spike_factor": 10}, "plant lr_spike_step must be a step in [0, 20)"),
    ({"lr_spike_step": 2, "lr_spike_factor": 0}, "plant lr_spike_factor must be a finite number > 0, got 0"),
    ({"lr_spike_step": 2, "lr_spike_factor": float("inf")}, "plant lr_spike_factor must be a finite number > 0"),
])
def test_bad_lr_spike_plant_is_refused_naming_the_field(plant, fragment):
    with pytest.raises(ConfigError) as err:
        resolve_matrix(_matrix(plant), source="m.toml", num_gpus=0)
    assert any(fragment in line and line.startswith("m.toml run 1 ('p')") for line in str(err.value).splitlines())


LR_SPIKE_STEP, LR_SPIKE_FACTOR = 25, 1000.0
LR_MATRIX = f"""
[campaign]
name = "lr"
preset = "tiny"
[fixed]
steps = 40
warmup_steps = 5
profile_num_steps = 0
[[runs]]
name = "clean"
strategy = "ddp"
world_size = 1
[[runs]]
name = "lr-spike"
strategy = "ddp"
world_size = 1
plant = {{ lr_spike_step = {LR_SPIKE_STEP}, lr_spike_factor = {LR_SPIKE_FACTOR} }}
"""


@pytest.fixture(scope="module")
def lr_campaign(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("lr")
    (tmp / "m.toml").write_text(LR_MATRIX)
    res = subprocess.run([sys.executable, "-m", "runner.cli", "all", "--matrix", str(tmp / "m.toml"), "--out",
                          str(tmp / "camp")], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return tmp / "camp"


def test_real_lr_spike_diverges_from_the_next_step(lr_campaign):
    """CPU, gloo, the tiny GPT: the learning rate of step 25 times 1000 (recorded in the run's
    rows) sends the loss of step 26 -- the first computed with the spiked update -- from ~4.6
    to ~50 nats; the run is unhealthy from there, the unplanted twin is not flagged at all."""
    spec = run_spec_from_dict(json.loads((lr_campaign / "lr-spike" / "spec.json").read_text()))
    assert spec.plant == Plant(lr_spike_step=LR_SPIKE_STEP, lr_spike_factor=LR_SPIKE_FACTOR)
    rows = {r: [json.loads(x) for x in (lr_campaign / r / "metrics" / "rank0.jsonl").read_text().splitlines()]
            for r in ("clean", "lr-spike")}
    lr = {r: {x["step"]: x["lr"] for x in v} for r, v in rows.items()}
    assert lr["lr-spike"][LR_SPIKE_STEP] == pytest.approx(LR_SPIKE_FACTOR * lr["clean"][LR_SPIKE_STEP])
    assert all(lr["lr-spike"][s] == lr["clean"][s] for s in lr["clean"] if s != LR_SPIKE_STEP)
    c = load_campaign(lr_campaign)
    health = {h.run: h for h in build_health_section(c.steps, list(c.runs["run"]), warmup_steps=5,
                                                      thresholds=THRESHOLDS).runs}
    assert (health["clean"].verdict, health["clean"].spike_steps, health["clean"].explosion_steps) == ("healthy", (), ())
    h = health["lr-spike"]
    assert h.verdict == "unhealthy" and h.diverged_at_step == LR_SPIKE_STEP + 1
    assert h.spike_steps[0] == LR_SPIKE_STEP + 1 and h.explosion_steps[0] == LR_SPIKE_STEP + 1


def test_trailing_windows_never_reach_into_the_run_before():
    """All runs' windows are built in one pass: a run's first steps have no window (too few of its
    own values), never the previous run's last values."""
    values = np.array([1.0, 1.0, 1.0, 1.0, 5.0, 5.0, 5.0, 5.0])
    median, _ = compute_trailing_stats(values, window_steps=3, min_window_steps=2, groups=np.array(list("aaaabbbb")))
    assert np.isnan(median[[0, 1, 4, 5]]).all()
    assert median[[2, 3, 6, 7]].tolist() == [1.0, 1.0, 5.0, 5.0]


def test_a_run_starting_above_the_previous_runs_end_is_not_a_spike():
    """Run b's flat loss at 5 nats after run a's flat 1 nat: judged against a's values, each of b's
    first steps would be a 4-nat spike."""
    import pandas as pd

    rows = [dict(run=run, rank=0, step=s, loss=level + 0.001 * (s % 2), grad_norm=1.0 + 0.01 * (s % 3),
                 step_time_s=0.1) for run, level in (("a", 1.0), ("b", 5.0)) for s in range(30)]
    health = build_health_section(pd.DataFrame(rows), ["a", "b"], warmup_steps=WARMUP, thresholds=THRESHOLDS)
    assert [(h.run, h.verdict, h.spike_steps, h.explosion_steps) for h in health.runs] == [
        ("a", "healthy", (), ()), ("b", "healthy", (), ())]
    # and a spike in b is still found at its step, with b's own median
    rows[30 + 20]["loss"] = 9.0
    b = build_health_section(pd.DataFrame(rows), ["a", "b"], warmup_steps=WARMUP, thresholds=THRESHOLDS).runs[1]
    assert b.spike_steps == (20,) and b.spikes[0].rolling_median == pytest.approx(5.0005)
