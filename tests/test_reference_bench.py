"""The bench's arithmetic: the speedup formula and the per-token acceptance estimator."""

from __future__ import annotations

import pytest

from specbuild.engines.reference.bench import conditional_alpha, predicted_speedup
from specbuild.generation import SpecStats


def test_predicted_speedup_formula():
    assert predicted_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert predicted_speedup(1.0, 4, 0.0) == pytest.approx(5.0)  # float64, as above
    assert predicted_speedup(0.8, 4, 0.05) == pytest.approx((1 - 0.8**5) / (0.2 * 1.2))  # float64, as above


def test_conditional_alpha_counts_only_tested_positions():
    stats = SpecStats()
    for n in (4, 0, 2, 1):  # accepted per round with K = 4: tested positions 4, 1, 3, 2
        stats.record_step(n, 4)
    assert stats.acceptance_rate == pytest.approx(7 / 16)  # float64, as above
    assert conditional_alpha(stats) == pytest.approx(7 / 10)  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert conditional_alpha(SpecStats()) == 0.0
