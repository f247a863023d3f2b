"""The speedup theory (core/perf/theory.py) and that both benchmarks use it the same way."""

from __future__ import annotations

import pytest

from lab.benchmarks.reference import _row
from specbuild.bench.metrics import RequestRecord, attach_speedups, summarize_run
from specbuild.core.generation import SpecStats
from specbuild.core.perf import theory


def test_predicted_speedup_formula():
    assert theory.predicted_speedup(0.0, 4, 0.1) == pytest.approx(
        1 / 1.4
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert theory.predicted_speedup(1.0, 4, 0.0) == pytest.approx(
        5.0
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert theory.predicted_speedup(0.8, 4, 0.05) == pytest.approx(
        (1 - 0.8**5) / (0.2 * 1.2)
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound


def test_alpha_counts_only_tested_positions():
    stats = SpecStats()
    for n in (4, 0, 2, 1):  # accepted per round with K = 4: tested positions 4, 1, 3, 2
        stats.record_step(n, 4)
    assert stats.acceptance_rate == pytest.approx(
        7 / 16
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert theory.alpha(stats.accepted_per_position, stats.drafted_per_position) == pytest.approx(
        7 / 10
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert theory.alpha([], []) == 0.0
    # the same counts rebuilt from (accepted, drafted) rounds
    assert theory.positions_from_rounds([(4, 4), (0, 4), (2, 4), (1, 4)]) == (
        stats.accepted_per_position,
        stats.drafted_per_position,
    )


def test_rounds_from_steps_follow_the_loop_near_max_tokens():
    # K = 4, max_tokens 12: rounds draft 4, 4, then min(4, 12 - 10 - 1) = 1
    assert theory.rounds_from_steps([4, 4, 1], 4, 12) == [(4, 4), (4, 4), (1, 1)]


def test_both_benches_predict_the_same_speedup_for_the_same_measurements():
    """One request's rounds as the in-process loop records them (SpecStats) and as the Triton client
    sees them (the streamed accepted length of each round): the same alpha, the same prediction."""
    k, max_tokens, c = 4, 20, 0.15
    steps = [3, 0, 4, 1, 2, 3]  # accepted drafts per round; rounds draft min(K, room - 1)
    stats = SpecStats()
    produced = 0
    for n in steps:
        drafted = min(k, max_tokens - produced - 1)
        stats.record_step(min(n, drafted), drafted)
        produced += min(n, drafted) + 1
    assert produced == 19 and stats.drafted_per_position == [6, 6, 6, 6]
    reference = _row("draft_target", k, stats, c, tps=2.0, base_tps=1.0, v=1.0)
    record = RequestRecord(
        ttft_s=0.1,
        latency_s=1.0,
        output_tokens=produced,
        target_passes=len(steps),
        drafted=stats.drafted,
        accepted=stats.accepted,
        accepted_per_step=tuple(stats.accepted_per_step),
        rounds=tuple(theory.rounds_from_steps(stats.accepted_per_step, k, max_tokens)),
    )
    run = summarize_run(
        [record], mode="speculative", temperature=0.0, concurrency=1, num_draft_tokens=k, duration_s=1.0
    )
    attach_speedups([run], cost_ratio=c)
    assert run.metrics["alpha"] == pytest.approx(
        reference.alpha
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert run.metrics["speedup_predicted"] == pytest.approx(
        reference.predicted
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert run.metrics["acceptance_rate"] == pytest.approx(
        reference.rate
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
