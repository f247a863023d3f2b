"""The served schedule's decision rule (core/perf/schedule_choice.py) and its use in
bench/serve_curve.predict_served: K changes from the default (the largest K at the smallest
concurrency, the target alone at the others) only on a win in every interleaved repeat by more than 3%."""

from __future__ import annotations

import pytest

from specbuild.core.perf.schedule_choice import choose


def chosen(rates):
    return {d.concurrency: d.chosen for d in choose(rates)}


def test_a_difference_inside_the_spread_keeps_the_incumbent():
    # c=1 (speculation is the default): K=3 is better in the median but loses one repeat: K stays at 4
    rates = {1: {0: [100, 100, 100], 3: [150, 180, 120], 4: [140, 140, 140]}}
    assert chosen(rates) == {1: 4}
    # a median gain under 3% in every repeat does not switch either
    rates = {1: {0: [100] * 3, 3: [142, 143, 144], 4: [140] * 3}}
    assert chosen(rates) == {1: 4}
    # c=2 (the target alone is the default): K=4 ahead in the median (x1.06) but behind in one repeat,
    # the demo's 00:51 served curve: K=0
    rates = {1: {0: [87, 87, 85], 4: [106, 93, 89]}, 2: {0: [139, 130, 133], 4: [147, 125, 141]}}
    decisions = choose(rates)
    assert [d.chosen for d in decisions] == [4, 0]
    assert decisions[1].incumbent == 0 and "no K > 0 beat the target alone" in decisions[1].reason
    # ... and a gain under 3% in every repeat is not enough either
    rates[2][4] = [141, 132, 135]
    assert chosen(rates) == {1: 4, 2: 0}


def test_a_clear_win_switches_and_more_load_never_drafts_more():
    rates = {
        1: {0: [100, 90, 110], 2: [150, 140, 160], 4: [170, 150, 190]},
        # c=4: K=2 and K=4 both beat the target alone in every repeat; K=2 by more (x1.18 vs x1.07)
        4: {0: [200, 180, 220], 2: [240, 210, 260], 4: [215, 190, 235]},
        # c=8: K=2 loses to the target alone; K=4 would win but K never rises with load
        8: {0: [300, 280, 320], 2: [250, 240, 270], 4: [400, 390, 410]},
    }
    decisions = choose(rates)
    assert {d.concurrency: d.chosen for d in decisions} == {1: 4, 4: 2, 8: 0}
    assert [d.incumbent for d in decisions] == [4, 0, 0]
    assert sorted(decisions[2].ratios) == [2]  # K=4 > the K chosen at c=4 is not a candidate
    assert max(decisions[2].ratios[2]) < 1


def test_one_noisy_repeat_cannot_switch_speculation_off_at_one_request_or_keep_it_on_under_load():
    # c=1: a load spike in one K=4 repeat does not switch speculation off where no other request pays
    rates = {1: {0: [100] * 3, 4: [150, 95, 150]}}
    assert chosen(rates) == {1: 4}
    # c=8: a load spike during one baseline repeat makes K=4 look better in the median, but K=4 loses
    # the other two repeats: the target alone stays
    rates = {1: {0: [100] * 3, 4: [150] * 3}, 8: {0: [260, 140, 255], 4: [230, 230, 230]}}
    assert chosen(rates) == {1: 4, 8: 0}
    # a load spike in one K=4 repeat where K=4 wins the others by 15%: not a win in every repeat
    rates[8] = {0: [200] * 3, 4: [230, 150, 230]}
    assert chosen(rates) == {1: 4, 8: 0}
    rates[8][4] = [230, 215, 230]  # a win in every repeat, median x1.15
    assert chosen(rates) == {1: 4, 8: 4}


def test_equal_challengers_take_the_smaller_k():
    rates = {1: {0: [100] * 2, 4: [150] * 2}, 4: {0: [100] * 2, 2: [120] * 2, 4: [120] * 2}}
    assert chosen(rates) == {1: 4, 4: 2}


def test_choose_checks_its_input():
    with pytest.raises(ValueError):
        choose({1: {0: [1.0, 2.0], 4: [1.0]}})


def _point(throughput, round_s=None, rounds=None):
    p = {"throughput": throughput, "tokens": [40, 40], "latency_s": [40 / throughput] * 2}
    if round_s is not None:
        p.update(ttft_s=round_s, round_s=round_s, rounds=rounds)
    return p


def test_predict_served_reports_medians_spread_and_the_rule():
    from specbuild.bench.serve_curve import predict_served

    # c=1: one-call baseline 1 s per request; K=1: 20 rounds of 40 ms (0.8 s) in two repeats, one
    # repeat slowed to 60 ms; K=2 10 rounds of 50 ms in both (0.5 s): wins every repeat
    curve = {
        "kind": "served",
        "requests": 2,
        "concurrency": [1],
        "ks": [1, 2],
        "repeats": 2,
        "points": {
            "1/0": [_point(40.0), _point(40.0)],
            "1/1": [_point(50.0, 0.04, [20, 20]), _point(33.0, 0.06, [20, 20])],
            "1/2": [_point(80.0, 0.05, [10, 10]), _point(80.0, 0.05, [10, 10])],
        },
    }
    pred = predict_served(curve, [0.9, 0.9])
    row = {r["k"]: r for r in pred["table"]}
    assert row[2]["tokens_per_s"] == pytest.approx(80 / 1.0)  # two requests of 0.5 s, one worker
    assert row[1]["predicted"]["min"] < row[1]["predicted"]["max"]
    assert row[1]["tokens_per_s"] == pytest.approx((80 / 1.6 + 80 / 2.4) / 2)  # median of two = mean
    assert pred["chosen"] == {1: 2} and pred["schedule"] == {1: 2}
    assert "every repeat" in pred["decisions"][0]["reason"]


def test_a_server_where_no_k_pays_at_one_request_is_served_with_speculation_off():
    """The served curve finds K=0 (the one-call target alone) faster than every K at c=1, as on a fast CPU
    where each BLS round pays two IPC calls (make demo, 2026-12-03: x1.22): the spec keeps no schedule
    (TensorRT-LLM's draft_len_schedule keeps K at 1 at max_draft_len) and the repository is to serve
    SERVED_OFF, so requests that leave num_draft_tokens out never draft, instead of the fixed K."""
    from specbuild.bench.serve_curve import predict_served
    from specbuild.core.perf.schedule import SERVED_OFF, DraftSchedule

    curve = {
        "requests": 2,
        "concurrency": [1, 2],
        "ks": [2],
        "repeats": 2,
        "points": {
            "1/0": [_point(80.0), _point(82.0)],
            "1/2": [_point(50.0, 0.08, [10, 10]), _point(52.0, 0.08, [10, 10])],  # 0.8 s against 0.5
            "2/0": [_point(150.0), _point(150.0)],
            "2/2": [_point(90.0, 0.05, [10, 10]), _point(90.0, 0.05, [10, 10])],
        },
    }
    pred = predict_served(curve, [0.9, 0.9])
    assert pred["chosen"] == {1: 0, 2: 0} and pred["schedule"] is None
    assert pred["repository_schedule"] == SERVED_OFF and SERVED_OFF in pred["notes"][0]
    served = DraftSchedule.from_text(SERVED_OFF, max_draft_len=2, first_is_max=False)
    assert [served.k_for(n) for n in (1, 2, 8, 64)] == [0, 0, 0, 0]
    # where a K pays at c=1, the repository serves the spec's own schedule
    curve["points"]["1/2"] = [_point(120.0, 0.02, [10, 10]), _point(121.0, 0.02, [10, 10])]
    pred = predict_served(curve, [0.9, 0.9])
    assert pred["schedule"] == {1: 2, 2: 0} and pred["repository_schedule"] == "1:2,2:0"


def test_predict_served_predicts_the_requests_the_measured_runs_sent():
    from specbuild.bench.cost_model import predicted_tokens_per_s
    from specbuild.bench.serve_curve import predict_served

    # --waves 3 at c=2 with 2 prompts: each measured run sent 6 requests (three per worker); requests of
    # 1 s or 3 s: the makespan of 2 such requests on 2 workers is not a third of 6's
    point = {"throughput": 40.0, "tokens": [40, 40], "latency_s": [1.0, 3.0]}
    two, six = predicted_tokens_per_s(point, 2, 2), predicted_tokens_per_s(point, 2, 6)
    assert abs(two - six) > 0.05 * six
    points = {"2/0": [point], "2/1": [_point(40.0, 0.05, [20, 20])]}
    curve = {"requests": 2, "concurrency": [2], "ks": [1], "repeats": 1, "points": points}
    assert predict_served(curve, [0.9])["table"][0]["tokens_per_s"] == pytest.approx(two)  # no waves: 1
    curve["waves"] = 3
    assert predict_served(curve, [0.9])["table"][0]["tokens_per_s"] == pytest.approx(six)


def test_interleaved_rounds_alternate_their_order():
    from types import SimpleNamespace

    from specbuild.bench.bench import _plan
    from specbuild.bench.options import BenchConfig
    from specbuild.core.perf.schedule_choice import round_order

    assert round_order("abc", 0) == ["a", "b", "c"] and round_order("abc", 1) == ["c", "b", "a"]
    # a load that grows through every round by 1 per run: each mode's mean position over two rounds is
    # the same, so the drift favours none
    pos = {m: [round_order("abc", r).index(m) for r in (0, 1)] for m in "abc"}
    assert {sum(v) for v in pos.values()} == {2}
    # bench's plan: the modes of one concurrency reversed in the second round
    repo = SimpleNamespace(has_baseline=True, draft_len_schedule="1:2,4:0")
    config = BenchConfig(url="127.0.0.1:8001", prompts=("p",), concurrency=(1,), rounds=2, fixed_ks=(1, 2))
    plan = _plan(config, repo, 2)
    first = [(m, k) for r, _, _, m, k in plan if r == 0]
    second = [(m, k) for r, _, _, m, k in plan if r == 1]
    assert len(first) > 2 and second == first[::-1]
    # with the one-call baseline, the schedule runs in one call as well (like against like)
    assert (
        ("baseline-unary", 0) in first and ("schedule", None) in first and ("schedule-unary", None) in first
    )
    no_unary = _plan(
        BenchConfig(url="127.0.0.1:8001", prompts=("p",), concurrency=(1,), unary_baseline=False), repo, 2
    )
    assert "schedule-unary" not in {m for _, _, _, m, _ in no_unary}
    # --aa-baseline: the one-call baseline again, at the other end of each round from the first (A/A)
    one_t = dict(url="127.0.0.1:8001", prompts=("p",), concurrency=(1,), temperatures=(0.0,), rounds=2)
    aa = _plan(BenchConfig(**one_t, aa_baseline=True), repo, 2)
    for r in (0, 1):
        order = [m for rr, _, _, m, _ in aa if rr == r]
        # as far apart as the round allows: only the streamed baseline sits beyond the first
        assert abs(order.index("baseline-unary-again") - order.index("baseline-unary")) == len(order) - 2
        assert {order[0], order[-1]} == {"baseline", "baseline-unary-again"}
    assert "baseline-unary-again" not in {m for _, _, _, m, _ in plan}  # off by default
