"""`tune --schedule --url`: the cost curve measured through the server that will serve.

The in-process cost curve (tuning/cost_curve.py) models the reference engine's lockstep batch; a served
round costs more and scales differently (the BLS's draft and verify calls through the Python backend's
IPC, and engines that batch some calls and not others). So, through the running server, for each
concurrency c and each K in 1..max_draft_len, one short closed-loop run of the tune prompts (greedy,
streamed, num_draft_tokens = K) measures (`calibrate`)

* the round time: per request (latency - time to the first token) / (rounds - 1), rounds = its
  streamed responses (one per round: the BLS's draft and verify calls, their IPC, the engines' passes
  at the real lengths, all of it), median over the run's requests;
* the time to the first token (preprocessing, prefill and the first round), median;
* each request's rounds (the acceptance as it is, the last round drafting less included);

and one unary run with num_draft_tokens = 0 (one call per request) measures the baseline: each
request's latency. The prediction for n requests sent by c closed-loop workers (the bench's load) is
the expected makespan of requests drawn from those (core/load_model.closed_loop_s: a request lasts
ttft + (R - 1) x round, the baseline's its measured latency), throughput = n x mean tokens / makespan.
The schedule takes, per c, the K (0: the baseline's rate) with the best predicted throughput,
thresholds at the midpoints (core/schedule.schedule_steps).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from specbuild.client.bench import run_once
from specbuild.client.metrics import UNARY_BASELINE
from specbuild.client.options import BenchConfig
from specbuild.core.load_model import closed_loop_durations_s, closed_loop_s
from specbuild.core.schedule import DraftSchedule, schedule_steps
from specbuild.core.theory import tokens_per_pass_chain

TIE = 0.03  # as tuning/cost_curve.py: predicted rates within 3% tie


def calibrate(run) -> dict[str, Any]:
    """What the prediction needs of one run (a RunSummary with records): tokens and latency per request;
    streamed: the median TTFT, the median round time and each request's rounds."""
    recs = run.records
    point: dict[str, Any] = {
        "throughput": run.metrics["output_token_throughput"],
        "tokens": [r.output_tokens for r in recs],
        "latency_s": [r.latency_s for r in recs],
    }
    if run.mode != UNARY_BASELINE:
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


def measure_served(
    url: str, prompts: Sequence[str], *, ks: Sequence[int], concurrency: Sequence[int], max_tokens: int
) -> dict[str, Any]:
    config = BenchConfig(
        url=url,
        prompts=tuple(prompts),
        concurrency=tuple(concurrency),
        temperatures=(0.0,),
        max_tokens=max_tokens,
        timeout_s=600,
    )
    points: dict[str, Any] = {}
    for c in concurrency:
        for k in (0, *ks):  # interleaved: every K of one concurrency back to back
            run = run_once(
                config,
                # the target alone in one call per request (a streamed baseline pays one BLS -> target call
                # per token, which the schedule's plain rounds do not)
                mode=UNARY_BASELINE if k == 0 else "speculative",
                temperature=0.0,
                concurrency=c,
                k=k,
                advance=lambda: None,
            )
            points[f"{c}/{k}"] = calibrate(run)
    return {
        "kind": "served",
        "url": url,
        "max_tokens": max_tokens,
        "requests": len(prompts),
        "concurrency": list(concurrency),
        "ks": list(ks),
        "points": points,
    }


def predict_served(
    curve: dict[str, Any],
    acceptance: Sequence[float],
    *,
    mode: str = "throughput",
    tokens: dict[int, float] | None = None,
) -> dict:
    """The prediction and schedule in the shape of tuning/cost_curve.SchedulePrediction.to_dict()."""
    requests = curve["requests"]
    table, baseline, chosen = [], {}, {}
    for c in curve["concurrency"]:
        baseline[c] = predicted_tokens_per_s(curve["points"][f"{c}/0"], c, requests)
        rates = {0: baseline[c]}
        table.append(
            {
                "batch": c,
                "k": 0,
                "tokens_per_round": 1.0,
                "round_ms": float("nan"),
                "tokens_per_s": baseline[c],
                "measured_tokens_per_s": curve["points"][f"{c}/0"]["throughput"],
            }
        )
        for k in curve["ks"]:
            p = curve["points"][f"{c}/{k}"]
            rates[k] = predicted_tokens_per_s(p, c, requests)
            table.append(
                {
                    "batch": c,
                    "k": k,
                    "tokens_per_round": statistics.fmean(p["tokens"]) / statistics.fmean(p["rounds"]),
                    "tokens_per_round_chain": tokens[k] if tokens else tokens_per_pass_chain(acceptance, k),
                    "round_ms": p["round_s"] * 1e3,
                    "tokens_per_s": rates[k],
                    "measured_tokens_per_s": p["throughput"],
                }
            )
        best = max(rates.values())
        near = [k for k, r in rates.items() if r >= best * (1 - TIE)]
        if c == min(curve["concurrency"]) and any(
            k > 0 for k in near
        ):  # one request in flight: a tie speculates
            near = [max(near)]  # with the larger K: no other request pays for it
        chosen[c] = min(near) if mode == "throughput" else max(near)
        if chosen:  # more load never drafts more (and K at 1 stays the largest: max_draft_len)
            chosen[c] = min(chosen[c], min(chosen.values()))
    sizes = sorted(curve["concurrency"])
    notes = []
    if chosen[sizes[0]] == 0:
        notes.append("no K > 0 beats the baseline at the smallest concurrency: speculation does not pay here")
        schedule = None
    else:
        steps = schedule_steps(sizes, chosen)
        schedule = DraftSchedule.parse(steps, max_draft_len=chosen[sizes[0]]).to_dict()
    return {
        "mode": mode,
        "acceptance": list(acceptance),
        "curve": curve,
        "table": table,
        "baseline": baseline,
        "chosen": chosen,
        "schedule": schedule,
        "notes": notes,
        "median_round_ms": statistics.median(
            p["round_s"] * 1e3 for p in curve["points"].values() if "round_s" in p
        ),
    }
