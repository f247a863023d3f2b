"""The cost model's load arithmetic (core/perf/concurrency.py), the in-process prediction from loop timings
(tuning/cost_curve.py), the served calibration (bench/serve_curve.py) and bench-load's measured /
predicted (median of per-round ratios): small cases with answers worked by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specbuild.core.perf.concurrency import closed_loop_durations_s, closed_loop_s, expected_max, lockstep_s


def test_expected_max_of_draws():
    assert expected_max([1, 2], 1) == pytest.approx(1.5)
    # two draws of {1, 2}: max is 1 only when both are 1 (1/4)
    assert expected_max([1, 2], 2) == pytest.approx(0.25 * 1 + 0.75 * 2)
    assert expected_max([5, 5, 5], 8) == pytest.approx(5)


def test_lockstep_batches_wait_for_their_slowest_row():
    # two batches of 4 rows, each 1 s to its first tokens then 9 later rounds of 0.5 s
    assert lockstep_s([10], batch=4, requests=8, first_s=1.0, round_s=0.5) == pytest.approx(2 * 5.5)
    # one slow prompt in eight: a batch of 8 always has it only if it draws it; E[max] > mean
    rounds = [10] * 7 + [20]
    one_batch = lockstep_s(rounds, batch=8, requests=8, first_s=0.0, round_s=1.0)
    assert one_batch == pytest.approx(expected_max(rounds, 8) - 1)
    assert one_batch > sum(rounds) / len(rounds) - 1


def test_closed_loop_makespan():
    # equal requests of 2 s, 2 workers, 5 requests: 3 waves
    assert closed_loop_durations_s([2.0], workers=2, requests=5) == pytest.approx(6.0)
    assert closed_loop_s([3], workers=5, requests=5, first_s=1.0, round_s=0.5) == pytest.approx(2.0)
    # seeded: the same measurement gives the same prediction
    a = closed_loop_s([3, 9, 4], workers=2, requests=8, first_s=0.1, round_s=0.01)
    assert a == closed_loop_s([3, 9, 4], workers=2, requests=8, first_s=0.1, round_s=0.01)
    with pytest.raises(ValueError):
        closed_loop_durations_s([], workers=1, requests=1)


def test_predict_from_loop_timings():
    from specbuild.tuning.cost_curve import CostCurve, predict

    sizes = [1, 2]
    curve = CostCurve(
        batch_sizes=sizes,
        max_k=1,
        verify_s={b: [1e-3, 1e-3] for b in sizes},
        draft_s=dict.fromkeys(sizes, 1e-4),
        loop_s=dict.fromkeys(sizes, 0.0),
        plain_step_s={1: 0.010, 2: 0.012},
        prefill_s=dict.fromkeys(sizes, 0.02),
        loop_round_s={1: [0.010, 0.015], 2: [0.012, 0.020]},
        first_s={1: [0.02, 0.03], 2: [0.03, 0.04]},
        plain_first_s={1: 0.02, 2: 0.03},
        rounds={0: [8, 8], 1: [4, 6]},
        tokens=[8, 8],
    )
    pred = predict(curve, [0.5], max_tokens=8)
    rate = {(r["batch"], r["k"]): r["tokens_per_s"] for r in pred.table}
    assert rate[1, 1] == pytest.approx(8 / (0.03 + (5 - 1) * 0.015))  # E[R] over one row = mean
    # two rows in lockstep: E[max] of {4, 6} over 2 draws = 5.5
    assert rate[2, 1] == pytest.approx(16 / (0.04 + (5.5 - 1) * 0.020))
    assert pred.baseline[2] == pytest.approx(16 / (0.03 + 7 * 0.012))
    assert curve.round_s(2, 1) == 0.020  # the measured round, not the pass sum


def test_in_process_speculation_under_load_needs_a_win_in_every_repeat():
    from specbuild.tuning.cost_curve import CostCurve, predict

    def curve(round_reps):  # b=1, 2; K=0 and 1; rounds: K=1 halves them
        sizes = [1, 2]
        med = {b: [sorted(r)[len(r) // 2] for r in reps] for b, reps in round_reps.items()}
        return CostCurve(
            batch_sizes=sizes,
            max_k=1,
            verify_s={b: [1e-3, 1e-3] for b in sizes},
            draft_s=dict.fromkeys(sizes, 1e-4),
            loop_s=dict.fromkeys(sizes, 0.0),
            plain_step_s=dict.fromkeys(sizes, 0.01),
            prefill_s=dict.fromkeys(sizes, 0.0),
            loop_round_s=med,
            first_s={b: [0.0, 0.0] for b in sizes},
            plain_first_s=dict.fromkeys(sizes, 0.0),
            rounds={0: [9, 9], 1: [5, 5]},
            tokens=[8, 8],
            loop_round_reps=round_reps,
            first_reps={b: [[0.0] * 3, [0.0] * 3] for b in sizes},
        )

    # b=2: K=0 rounds of 10 ms (8 later rounds: 80 ms) vs K=1 rounds of 21 ms (4: 84 ms), but one K=1
    # repeat at 18 ms (72 ms): K=1 does not beat the target alone in every repeat, so K=0
    noisy = {1: [[0.01] * 3, [0.01] * 3], 2: [[0.010] * 3, [0.021, 0.018, 0.021]]}
    pred = predict(curve(noisy), [0.9], max_tokens=8)
    assert pred.chosen == {1: 1, 2: 0} and any("no K > 0 beat the target alone" in n for n in pred.notes)
    assert next(r for r in pred.table if (r["batch"], r["k"]) == (2, 1))["predicted"]["n"] == 3
    clear = {1: noisy[1], 2: [[0.010] * 3, [0.015, 0.016, 0.015]]}  # K=1 wins every repeat by > 3%
    assert predict(curve(clear), [0.9], max_tokens=8).chosen == {1: 1, 2: 1}


def _record(ttft, latency, passes, tokens):
    from specbuild.bench.metrics import RequestRecord

    return RequestRecord(ttft_s=ttft, latency_s=latency, output_tokens=tokens, target_passes=passes)


def test_served_calibration_predicts_the_closed_loop():
    from specbuild.bench.metrics import UNARY_BASELINE
    from specbuild.bench.serve_curve import calibrate, predicted_tokens_per_s

    recs = [_record(0.1, 0.1 + 9 * 0.05, 10, 40), _record(0.1, 0.1 + 19 * 0.05, 20, 40)]
    run = SimpleNamespace(mode="speculative", records=recs, metrics={"output_token_throughput": 1.0})
    point = calibrate(run)
    assert point["round_s"] == pytest.approx(0.05) and point["ttft_s"] == pytest.approx(0.1)
    assert point["rounds"] == [10, 20]
    # one worker: requests one after another, mean duration 0.1 + 14 x 0.05 = 0.8 s
    assert predicted_tokens_per_s(point, 1, 4) == pytest.approx(4 * 40 / (4 * 0.8), rel=0.05)
    unary = calibrate(SimpleNamespace(mode=UNARY_BASELINE, records=recs, metrics=run.metrics))
    assert "round_s" not in unary
    # two workers, two requests: the makespan is the larger of two draws of {0.55, 1.05} s
    assert predicted_tokens_per_s(unary, 2, 2) == pytest.approx(80 / (0.25 * 0.55 + 0.75 * 1.05), rel=0.03)


def test_the_cost_model_alone_takes_the_runs_own_rounds():
    """A held-out run whose prompts accept more (fewer rounds a request) than the calibration's: the
    prediction with the run's own rounds keeps the calibration's times and removes exactly that difference."""
    from specbuild.bench.cost_model import calibrate, predicted_tokens_per_s, with_rounds_of
    from specbuild.bench.metrics import UNARY_BASELINE

    cal_metrics = {"output_token_throughput": 1.0}
    cal = calibrate(
        SimpleNamespace(
            mode="speculative",
            records=[_record(0.1, 0.1 + 11 * 0.05, 12, 40)] * 2,
            metrics={"output_token_throughput": 1.0},
        )
    )
    # held out: the same times, 10 rounds a request instead of 12
    held = calibrate(
        SimpleNamespace(
            mode="speculative",
            records=[_record(0.1, 0.1 + 9 * 0.05, 10, 40)] * 2,
            metrics={"output_token_throughput": 1.0},
        )
    )
    measured = 2 * 40 / (2 * (0.1 + 9 * 0.05))  # one worker, two requests
    assert measured / predicted_tokens_per_s(cal, 1, 2) == pytest.approx(0.65 / 0.55)  # the prompts' part
    own = with_rounds_of(cal, held)
    assert own["round_s"] == cal["round_s"] and own["rounds"] == [10, 10]
    assert measured / predicted_tokens_per_s(own, 1, 2) == pytest.approx(1.0)  # the cost model: exact
    unary = calibrate(
        SimpleNamespace(mode=UNARY_BASELINE, records=[_record(0.1, 0.6, 1, 40)], metrics=cal_metrics)
    )
    assert with_rounds_of(unary, held) is None and with_rounds_of(cal, unary) is None  # no rounds: none


def test_load_summary_ratio_is_the_median_of_per_round_ratios():
    from specbuild.bench.load_bench import load_summary

    def run(r, thr, pred):
        return SimpleNamespace(
            mode="speculative",
            num_draft_tokens=2,
            concurrency=4,
            temperature=0.0,
            metrics={
                "round": r,
                "output_token_throughput": thr,
                "predicted_tokens_per_s": pred,
                "request_latency": {"avg": 1.0},
            },
        )

    rows = load_summary([run(0, 90, 100), run(1, 120, 100), run(2, 50, 50)])
    m = rows[0]["modes"]["K=2"]
    assert m["measured_over_predicted"] == pytest.approx(1.0)
    assert (m["ratio_min"], m["ratio_max"]) == (pytest.approx(0.9), pytest.approx(1.2))
    assert "measured_over_cost_model" not in m  # no run carried the own-rounds prediction
    runs = [run(0, 90, 100), run(1, 120, 100)]
    for r, own in zip(runs, (90, 100), strict=True):
        r.metrics["predicted_own_rounds_tokens_per_s"] = own
    own = load_summary(runs)[0]["modes"]["K=2"]["measured_over_cost_model"]
    assert (own["median"], own["min"], own["max"], own["n"]) == (pytest.approx(1.1), 1.0, 1.2, 2)
    # runs without a prediction (no --calibrate) have no ratio
    plain = run(0, 90, None)
    assert "measured_over_predicted" not in load_summary([plain])[0]["modes"]["K=2"]


def _round_run(mode: str, r: int, thr: float, *, k: int, c: int):
    """A bench run of round r as load_summary reads it (throughput only)."""
    return SimpleNamespace(
        mode=mode,
        num_draft_tokens=k,
        concurrency=c,
        temperature=0.0,
        metrics={"round": r, "output_token_throughput": thr, "request_latency": {"avg": 1.0}},
    )


def test_the_schedule_in_one_call_is_compared_with_the_one_call_baseline():
    """Medusa's like-for-like: the schedule sent unary (its K=0 batches answer once per request) over the
    target alone in one call, the median of per-round ratios; a unary run calibrates from latencies."""
    from specbuild.bench.cost_model import calibrate
    from specbuild.bench.load_bench import load_summary
    from specbuild.bench.metrics import UNARY_BASELINE, UNARY_MODES, UNARY_SCHEDULE

    def run(mode, r, thr):
        return _round_run(mode, r, thr, k=8, c=8)

    runs = [run(UNARY_BASELINE, 0, 100), run(UNARY_SCHEDULE, 0, 95), run("schedule", 0, 60)]
    runs += [run(UNARY_BASELINE, 1, 50), run(UNARY_SCHEDULE, 1, 55), run("schedule", 1, 30)]
    (row,) = load_summary(runs)
    ratio = row["schedule_unary_over_baseline_unary"]
    assert ratio["median"] == pytest.approx((0.95 + 1.1) / 2) and ratio["rounds"] == 2
    assert row["schedule_over_baseline_unary"]["median"] == pytest.approx(0.6)
    assert UNARY_SCHEDULE in UNARY_MODES  # bench sends it without a stream
    recs = [_record(0.5, 0.5, 1, 40)]
    point = calibrate(
        SimpleNamespace(mode=UNARY_SCHEDULE, records=recs, metrics={"output_token_throughput": 80})
    )
    assert "round_s" not in point and point["latency_s"] == [0.5]


def test_the_a_a_ratio_is_the_one_call_baseline_again_over_itself_per_round():
    """bench --aa-baseline: the second one-call baseline run of each round over the first, the median of
    the per-round ratios (the spread of two runs of one configuration), sent unary like the first; it is
    never the reference of another ratio."""
    from specbuild.bench.load_bench import load_summary, load_table_lines
    from specbuild.bench.metrics import UNARY_BASELINE, UNARY_BASELINE_AGAIN, UNARY_MODES

    def run(mode, r, thr):
        return _round_run(mode, r, thr, k=0, c=2)

    runs = [run(UNARY_BASELINE, 0, 100), run(UNARY_BASELINE_AGAIN, 0, 90), run("schedule-unary", 0, 99)]
    runs += [run(UNARY_BASELINE, 1, 50), run(UNARY_BASELINE_AGAIN, 1, 60), run("schedule-unary", 1, 50)]
    runs += [run(UNARY_BASELINE, 2, 80), run(UNARY_BASELINE_AGAIN, 2, 80), run("schedule-unary", 2, 76)]
    (row,) = load_summary(runs)
    assert row["a_a"]["median"] == pytest.approx(1.0) and row["a_a"]["rounds"] == 3
    assert (row["a_a"]["min"], row["a_a"]["max"]) == (pytest.approx(0.9), pytest.approx(1.2))
    assert "schedule_unary_over_baseline_unary" not in row  # no schedule in this bench: nothing else
    assert UNARY_BASELINE_AGAIN in UNARY_MODES
    assert any(line.strip().startswith("A/A") and "1.000" in line for line in load_table_lines([row]))


def test_a_bar_is_read_against_the_a_a_spread():
    from specbuild.bench.load_bench import bar_verdict

    a_a = {"median": 1.0, "min": 0.94, "max": 1.08}  # two runs of one configuration: 0.94, and 1/1.08 = 0.926
    assert bar_verdict({"median": 0.98}, a_a) == "met"
    assert bar_verdict({"median": 0.93}, a_a) == "within A/A"  # 1/1.08 < 0.93: no measured difference
    assert bar_verdict({"median": 0.90}, a_a) == "missed"
    assert bar_verdict({"median": 0.95}, None) == "missed"  # no A/A measured: the bar alone
    assert bar_verdict(None, a_a) == ""


def test_machine_noise_spread_of_runs_of_equal_work():
    from lab.benchmarks.machine_noise import spread

    times = [1.0, 1.0, 2.0, 2.0, 1.0, 1.0]  # a slow patch in the middle
    one = spread(times, 1)
    assert one["runs"] == 6 and (one["next_over_this_min"], one["next_over_this_max"]) == (0.5, 2.0)
    two = spread(times, 2)  # runs 2, 4, 2 s: ratios 2 and 0.5
    assert two["runs"] == 3 and two["run_s"] == pytest.approx(8 / 3)
    assert two["abs_diff_median"] == pytest.approx(0.75)  # |1 - 2| and |1 - 0.5|
    assert spread(times, 4) is None  # one run: nothing to compare
    assert spread([1.0] * 8, 2)["cv"] == 0.0
