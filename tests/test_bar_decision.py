"""The schedule's bars read with the exact sign test over the rounds (bench/load_bench.bar_decision), and
`bench --max-rounds`: one more round only where a bar is still undecided (bench/bench._more_rounds)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specbuild.bench.load_bench import (
    FIXED_K_BAR,
    ONE_CALL_BAR,
    SCHEDULE_MODE,
    bar_decision,
    load_summary,
)
from specbuild.bench.metrics import UNARY_BASELINE, UNARY_SCHEDULE


def _ratio(values):
    return {"median": sorted(values)[len(values) // 2], "ratios": list(values)}


@pytest.mark.parametrize(
    ("values", "verdict", "p"),
    [
        ([1.0] * 5, "met", 1 / 32),  # the fewest rounds that decide
        ([1.0] * 4 + [0.9], "undecided", 6 / 32),  # one round below: P(S >= 4) = 6/32
        ([0.9] * 5, "missed", 1 / 32),
        ([1.0] * 3, "undecided", 1 / 8),  # 3 rounds never decide at 5%
        ([1.0] * 9 + [0.8], "met", 11 / 1024),
        ([0.97] * 5, "met", 1 / 32),  # at the bar counts as at or above it
    ],
)
def test_the_sign_test_decides_a_bar_only_when_the_rounds_agree(values, verdict, p):
    d = bar_decision(_ratio(values), ONE_CALL_BAR)
    assert d["verdict"] == verdict and d["p"] == pytest.approx(p)
    assert d["rounds"] == len(values) and d["bar"] == ONE_CALL_BAR
    assert bar_decision(None, ONE_CALL_BAR) is None


def _run(mode, c, round_, tok_s, k=None):
    return SimpleNamespace(
        mode=mode,
        temperature=0.0,
        concurrency=c,
        num_draft_tokens=k,
        metrics={"output_token_throughput": tok_s, "request_latency": {"avg": 1.0}, "round": round_},
    )


def _rounds(n, *, c, sched_over_base):
    """n rounds at concurrency c: one-call baseline 100 tok/s, one-call schedule 100 x ratio, K=4 50."""
    runs = []
    for r in range(n):
        runs += [
            _run(UNARY_BASELINE, c, r, 100.0),
            _run(UNARY_SCHEDULE, c, r, 100.0 * sched_over_base[r % len(sched_over_base)]),
            _run(SCHEDULE_MODE, c, r, 100.0),
            _run("speculative", c, r, 50.0, k=4),
        ]
    return runs


def test_load_summary_reports_each_bars_decision():
    rows = load_summary(_rounds(5, c=2, sched_over_base=[1.01]))
    bars = rows[0]["bars"]
    assert bars["one_call"]["verdict"] == "met" and bars["one_call"]["bar"] == ONE_CALL_BAR
    assert bars["fixed_k"]["verdict"] == "met" and bars["fixed_k"]["bar"] == FIXED_K_BAR


def test_more_rounds_go_only_where_a_bar_is_undecided_and_stop_at_max_rounds():
    from specbuild.bench.bench import _more_rounds
    from specbuild.bench.options import BenchConfig

    repo = SimpleNamespace(has_baseline=True, draft_len_schedule="1:4,2:0")
    config = BenchConfig(url="127.0.0.1:8001", prompts=("p",), concurrency=(1, 2), rounds=5, max_rounds=7)
    # c=1: every round well above both bars (decided); c=2: the one-call ratio alternates around 0.97
    runs = _rounds(5, c=1, sched_over_base=[1.02]) + _rounds(5, c=2, sched_over_base=[1.0, 0.9])
    plan = _more_rounds(config, repo, 4, runs, 5)
    assert plan and {p[2] for p in plan} == {2} and {p[0] for p in plan} == {5}
    assert {p[3] for p in plan} >= {UNARY_BASELINE, UNARY_SCHEDULE, SCHEDULE_MODE}
    assert _more_rounds(config, repo, 4, runs, 7) == []  # --max-rounds reached
    assert (
        _more_rounds(BenchConfig(url="127.0.0.1:8001", prompts=("p",), rounds=5), repo, 4, runs, 5) == []
    )  # off
