"""The served cost model of one run (`tune --schedule --url`, `bench --calibrate`, `make bench-load`).

`calibrate` takes what the prediction needs of a run through the server on the calibration (tune)
prompts: tokens and latency per request; streamed runs also the median time to the first token, the
median round time ((latency - TTFT) / (rounds - 1): the BLS's draft and verify calls with their IPC,
the engines' passes, all of it) and each request's rounds. `predicted_tokens_per_s` turns it into the
tokens/s of n such requests sent by c closed-loop workers (core/perf/concurrency: the expected makespan).
`with_rounds_of` keeps a calibration's times and takes another run's rounds and tokens: its prediction
is the cost model's alone, without the difference between the two prompt sets' acceptance (a speculative
run's rounds per request are what its prompts accept; the times are what the model claims to know).
"""

from __future__ import annotations

import statistics
from typing import Any

from specbuild.bench.metrics import UNARY_MODES
from specbuild.core.perf.concurrency import closed_loop_durations_s, closed_loop_s


def calibrate(run) -> dict[str, Any]:
    """What the prediction needs of one run (a RunSummary with records): tokens and latency per request;
    streamed: the median TTFT, the median round time and each request's rounds."""
    recs = run.records
    point: dict[str, Any] = {
        "throughput": run.metrics["output_token_throughput"],
        "tokens": [r.output_tokens for r in recs],
        "latency_s": [r.latency_s for r in recs],
    }
    if run.mode not in UNARY_MODES:
        point["ttft_s"] = statistics.median(r.ttft_s for r in recs)
        point["rounds"] = [r.target_passes for r in recs]
        per_round = [(r.latency_s - r.ttft_s) / (r.target_passes - 1) for r in recs if r.target_passes > 1]
        point["round_s"] = statistics.median(per_round) if per_round else 0.0
    return point


def predicted_tokens_per_s(point: dict[str, Any], concurrency: int, requests: int) -> float:
    """Tokens/s of `requests` requests like the calibrated ones, sent by `concurrency` closed-loop workers."""
    if "round_s" in point:
        seconds = closed_loop_s(
            point["rounds"],
            workers=concurrency,
            requests=requests,
            first_s=point["ttft_s"],
            round_s=point["round_s"],
        )
    else:
        seconds = closed_loop_durations_s(point["latency_s"], workers=concurrency, requests=requests)
    return requests * statistics.fmean(point["tokens"]) / seconds


def with_rounds_of(point: dict[str, Any], run_point: dict[str, Any]) -> dict[str, Any] | None:
    """The calibrated point with the rounds and tokens of another run's (both streamed: None otherwise)."""
    if "round_s" not in point or "rounds" not in run_point:
        return None
    return {**point, "rounds": run_point["rounds"], "tokens": run_point["tokens"]}
