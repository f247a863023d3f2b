"""Benchmark arithmetic: percentiles, genai-perf style summaries, speculative figures, reports."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from specbuild.bench.metrics import (
    RequestRecord,
    accepted_length_per_position,
    attach_speedups,
    percentile,
    summarize,
    summarize_run,
)
from specbuild.bench.report import PLOTS, table, write_report


def test_percentile_matches_numpy_linear():
    xs = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0]
    for q in (0, 10, 50, 90, 99, 100):
        assert percentile(xs, q) == pytest.approx(
            np.percentile(xs, q)
        )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert math.isnan(percentile([], 50))


def test_summarize_scales_to_ms():
    s = summarize([0.1, 0.2, 0.3], 1000.0)
    assert (
        s["avg"] == pytest.approx(200.0)
        and s["p50"] == pytest.approx(200.0)
        and s["p99"] == pytest.approx(298.0)
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound


def test_inter_token_latency_is_genai_perf_definition():
    r = RequestRecord(ttft_s=0.1, latency_s=1.0, output_tokens=10, target_passes=10)
    assert r.itl_s == pytest.approx(
        0.9 / 9
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert RequestRecord(ttft_s=0.1, latency_s=0.1, output_tokens=1, target_passes=1).itl_s is None


def test_accepted_length_per_position():
    # steps accepted 0, 2, 3 of K=3: position 1 accepted in 2 of 3 steps, 2 in 2, 3 in 1
    assert accepted_length_per_position([0, 2, 3], 3) == pytest.approx(
        [2 / 3, 2 / 3, 1 / 3]
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert accepted_length_per_position([], 3) == []


def _runs():
    base = [RequestRecord(ttft_s=0.05, latency_s=1.0, output_tokens=20, target_passes=20) for _ in range(4)]
    spec = [
        RequestRecord(
            ttft_s=0.05,
            latency_s=0.5,
            output_tokens=20,
            target_passes=8,
            drafted=24,
            accepted=12,
            accepted_per_step=(1, 2, 3, 0, 1, 2, 3, 0),
        )
        for _ in range(4)
    ]
    runs = [
        summarize_run(
            base, mode="baseline", temperature=0.0, concurrency=2, num_draft_tokens=0, duration_s=2.0
        ),
        summarize_run(
            spec, mode="speculative", temperature=0.0, concurrency=2, num_draft_tokens=3, duration_s=1.0
        ),
    ]
    attach_speedups(runs, cost_ratio=0.1)
    return runs


def test_run_summary_and_speedups():
    base, spec = _runs()
    assert base.metrics["output_token_throughput"] == pytest.approx(
        40.0
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert base.metrics["request_throughput"] == pytest.approx(2.0)  # float64, as above
    assert spec.metrics["acceptance_rate"] == pytest.approx(0.5)  # float64, as above
    assert spec.metrics["mean_accepted_tokens_per_pass"] == pytest.approx(80 / 32)  # float64, as above
    assert spec.metrics["speedup_measured"] == pytest.approx(2.0)  # float64, as above
    # rounds accepting 1, 2, 3, 0 of K = 3 test 2, 3, 3, 1 positions: alpha = 6 / 9 (core/perf/theory.py),
    # then (1 - alpha^4) / (1 - alpha) tokens per pass / (3 * 0.1 + 1)
    alpha = 6 / 9
    assert spec.metrics["alpha"] == pytest.approx(alpha)  # float64, as above
    assert spec.metrics["speedup_predicted"] == pytest.approx(
        (1 - alpha**4) / (1 - alpha) / 1.3
    )  # float64, as above
    assert "acceptance_rate" not in base.metrics and "speedup_measured" not in base.metrics


def test_medusa_positions_come_from_the_deepest_path():
    spec = [
        RequestRecord(
            ttft_s=0.1,
            latency_s=1.0,
            output_tokens=9,
            target_passes=4,
            drafted=8,
            accepted=5,
            accepted_per_step=(2, 1, 2, 0),
        )
    ]
    run = summarize_run(
        spec, mode="speculative", temperature=0.0, concurrency=1, num_draft_tokens=0, duration_s=1.0
    )
    assert run.num_draft_tokens == 2 and len(run.metrics["accepted_length_per_position"]) == 2


def test_reports_are_written(tmp_path):
    runs = _runs()
    files = write_report(runs, {"url": "x:1", "cost_ratio": 0.1}, tmp_path)
    # no per-request records in these runs: the AIPerf files are written, no speculation profile
    assert [f.name for f in files] == [
        "bench.json",
        "bench.csv",
        "aiperf_metrics.json",
        "records.jsonl",
        *PLOTS,
    ]
    data = json.loads((tmp_path / "bench.json").read_text())
    assert data["context"]["cost_ratio"] == 0.1
    spec = data["runs"][1]
    assert spec["mode"] == "speculative" and spec["metrics"]["time_to_first_token"]["p90"] == pytest.approx(
        50.0
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    with open(tmp_path / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    assert (
        rows[0]["request_latency_p99"]
        and rows[1]["speedup_measured"] == "2.0"
        and rows[0]["speedup_measured"] == ""
    )
    for name in PLOTS:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert table(runs).row_count == 2
