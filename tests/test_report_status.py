"""The conclusion agrees with the table: runs that did not end ok (SYNTHETIC campaigns,
tests/synthetic_campaign.py) show partial numbers that are never ranked, and each status is
worded for what it is (failure finding, user interrupt, stopped runner, unknown value)."""
from __future__ import annotations

from pathlib import Path

from ingest.io import load_campaign
from report.render import render_markdown
from report.view import build_note
from synthetic_campaign import LAYOUTS, write_synthetic_campaign


def _note(tmp_path: Path, **kw):
    note = build_note(load_campaign(write_synthetic_campaign(tmp_path / "camp", **kw)))
    return note, render_markdown(note)


def _conclusion(md: str) -> str:
    return md.split("## 6. Conclusion", 1)[1]


def test_crash_with_measured_steps_is_partial_and_not_ranked(tmp_path):
    note, md = _note(tmp_path, failed=(), statuses={"ddp": "crash"}, stop_step=6)
    ddp = next(m for m in note.metrics if m.run == "ddp")
    assert ddp.partial and ddp.num_steps_measured == 4 and ddp.failed_at_step == 6 and ddp.tokens_per_s
    assert "| ddp | crash | 4 (partial: crash at step 6) |" in md
    concl = _conclusion(md)
    assert "**zero3** at" in concl  # ddp is faster per step but did not finish: zero3 ranks first
    assert "Excluded from the ranking: ddp (crash at step 6)" in concl
    assert "Run **ddp** crashed at step 6 (exit code 1): rank 0 raised `RuntimeError: boom (synthetic)`" in concl
    assert "No run" not in concl and "Only" not in concl
    assert "(partial)" in md.split("Loss (nats", 1)[1].split("\n", 1)[0]


def test_only_partial_numbers_do_not_read_as_no_measured_steps(tmp_path):
    _, md = _note(tmp_path, failed=(), statuses={"ddp": "crash", "zero3": "hang", "tp_pp": "oom"})
    concl = _conclusion(md)
    assert "No run ended ok with measured steps" in concl
    assert "Excluded from the ranking: ddp (crash at step 6), zero3 (hang at step 6), tp_pp (oom at step 6)" in concl


def test_missing_status_json_is_unfinished_not_a_failure(tmp_path):
    note, md = _note(tmp_path, failed=(), statuses={"zero3": None})
    assert next(m for m in note.metrics if m.run == "zero3").status == "unfinished"
    assert "| zero3 | unfinished | 4 (partial: unfinished at step 6) |" in md
    assert "zero3: unfinished (no status recorded — runner stopped?); its 4 measured steps (up to step 5) are " \
           "partial and not ranked. Resume with `runner all --resume`." in md
    assert "does not run as configured" not in md and "failure" not in _conclusion(md).split("### Caveats")[0]


def test_interrupted_is_a_caveat_with_the_resume_command(tmp_path):
    note, md = _note(tmp_path, failed=(), statuses={"tp_pp": "interrupted"})
    assert not any(f.runs == ("tp_pp",) and f.kind != "excluded_partial" for f in note.findings)
    assert "tp_pp: interrupted by the user at step 6; resume with `runner all --resume`." in md


def test_oom_names_layout_micro_batch_rank_and_allocator_message(tmp_path):
    _, md = _note(tmp_path, failed=(), statuses={"zero3": "oom"}, device_name="NVIDIA H200")
    assert ("Run **zero3** ran out of memory at step 6: the zero3 layout (world 2 = TP 1 × PP 1 × DP 2, deepspeed) "
            "does not fit at micro-batch 4 on this hardware. Rank 1: `CUDA out of memory. Tried to allocate 2.00 GiB "
            "(synthetic)`.") in md


def test_hang_shows_cause_and_per_rank_table(tmp_path):
    note, md = _note(tmp_path, failed=(), statuses={"ddp": "hang"})
    assert [(h.rank, h.blocked_in) for h in note.hang_ranks] == [
        (0, "all_gather"), (1, "backward (gradient all-reduce/reduce-scatter hooks)")]
    assert "Run **ddp** hung at step 6: hang (synthetic) (per-rank evidence from py-spy in the table below)." in md
    assert "| ddp | 0 | all_gather | inject (runner/faults.py:70) |" in md


def test_unknown_status_is_a_caveat_treated_as_unfinished(tmp_path):
    note, md = _note(tmp_path, failed=(), statuses={"zero3": "exploded"})
    assert next(m for m in note.metrics if m.run == "zero3").status == "unknown"
    assert "zero3: unknown status `exploded` in status.json (known: ok, oom, crash, hang, timeout, interrupted, " \
           "skipped); treated as unfinished, its numbers partial and not ranked." in md
    assert not any(f.kind in ("crash", "oom", "hang") for f in note.findings)


def test_different_world_sizes_and_oversubscription_on_cpu(tmp_path):
    layouts = dict(LAYOUTS, tp_pp=("tp_pp", "torch", 2, 2, 1, 2, 4, 0.16))
    _, md = _note(tmp_path, failed=(), layouts=layouts, cores_logical=2)
    assert "| Tokens/s/process |" in md and "Tokens/s/GPU" not in md
    assert "Tokens/s compared across different process counts (ddp 2, zero3 2, tp_pp 4)" in md
    assert "Oversubscribed: 4 processes (tp_pp) on 2 cores; CPU timings rank engines' overheads, not layouts." in md
    assert "Memory headroom: not recorded on CPU." in md and "Interconnect" not in md


def test_ranking_wording_is_readable_and_honest(tmp_path):
    _, md = _note(tmp_path, failed=(), device_name="NVIDIA H200")
    concl = _conclusion(md)
    assert "vs zero3: +" in concl and "% tokens/s (median step" in concl
    assert "beyond this run's step-to-step spread" in concl or "within this run's step-to-step spread" in concl
    assert "One run per layout, no repeat" in concl or "one run per layout, no repeat" in concl
    assert "the ranking is not noise" not in concl


def test_conditions_are_labelled_and_correct(tmp_path):
    _, md = _note(tmp_path, failed=(), device_name="NVIDIA H200")
    concl = _conclusion(md)
    assert "grows with the data-parallel degree" not in concl
    assert "Rule of thumb, not measured here: a ring all-reduce sends ≈ 2(n−1)/n·Ψ" in concl
    assert "(n = 2: 1.00Ψ, n = 8: 1.75Ψ), nearly constant in n" in concl and "§7.2.2" in concl
    assert "Interconnect — rule of thumb, not measured here" in concl and "Shoeybi et al. 2019" in concl
    assert "Recorded here: no topology." in concl
    # 120,000 + 2048 params x 16 B = 1.86 MiB, not "0.00 GiB"; bf16 -> mixed-precision breakdown
    assert "× 16 B/param (mixed-precision Adam: 2 B weights + 2 B grads + 12 B fp32 master weights, m and v" in concl
    assert "= 1.86 MiB of model states" in concl
    assert "Losses are identical at every step (spread 0 nats, ≤ 0.05 nats)" in concl


def test_title_block_shows_tool_commit_and_loss_floor_wording(tmp_path):
    _, md = _note(tmp_path)
    assert "tool version 0.1, tool commit `abc1234`." in md.splitlines()[2]
    assert "is the expected loss floor (the loss of the true distribution, in expectation over an infinitely " \
           "large sample); a model can dip below it on a finite batch." in md
