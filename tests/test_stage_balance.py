"""The pipeline balancing split as a prediction: the per-layer model (report.evidence) on stages of
known cost, and its error on a run of another split."""
from __future__ import annotations

import pytest

from report import evidence as ev

def _stages(compute_s: tuple[float, ...], layers: tuple[int, ...]) -> ev.StageBalance:
    return ev.StageBalance(stage_compute_s=compute_s, layers=layers)


# per-layer compute 10 ms, the last stage's LM head and loss 30 ms
EVEN = _stages((0.040, 0.070), (4, 4))


def test_balanced_split_minimises_the_slowest_stage():
    split, slowest_s = ev.balance_layers(EVEN)
    # last stage n layers: max((8 - n) x 10, n x 10 + 30) ms is 60 ms at n = 2 (and 3); the first wins
    assert split == (6, 2) and slowest_s == pytest.approx(0.060)


def test_prediction_of_another_split_and_its_error():
    assert ev.predict_stage_compute(EVEN, [2, 6]) == pytest.approx([0.020, 0.090])
    assert ev.check_stage_prediction(EVEN, _stages((0.020, 0.090), (2, 6))) == pytest.approx(0)
    # the second stage measured 100 ms where 90 were predicted: 10% off
    assert ev.check_stage_prediction(EVEN, _stages((0.020, 0.100), (2, 6))) == pytest.approx(0.1)
    assert ev.predict_stage_imbalance(EVEN, [2, 6]) == pytest.approx((0.090 - 0.055) / 0.055)


def test_no_cost_no_prediction():
    assert ev.balance_layers(_stages((0.04, 0.07), (0, 8))) == (None, None)
    assert ev.check_stage_prediction(EVEN, _stages((0.02, 0.05, 0.03), (2, 3, 3))) is None
