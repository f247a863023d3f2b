"""`tune --schedule --url`: the cost curve measured through the server that will serve.

The in-process cost curve (tuning/cost_curve.py) models the reference engine's lockstep batch; a served
round costs more and scales differently (the BLS's draft and verify calls through the Python backend's
IPC, and engines that batch some calls and not others). So, through the running server, for each
concurrency c and each K in 1..max_draft_len, one short closed-loop run of the tune prompts (greedy,
streamed, num_draft_tokens = K) measures

* the round time: (request latency - time to the first token) / (rounds - 1), rounds = the streamed
  responses per request (one per round), medians over the run's requests;
* the time to the first token (preprocessing, prefill and the first round);

and one unary run with num_draft_tokens = 0 (one call per request) measures the baseline's
throughput (the target alone: nothing in it depends on acceptance). The prediction for requests of N
tokens combines that cost with the acceptance per draft position profiled by `tune` (E(K) tokens per
round): latency = ttft + (N / E(K) - 1) x round, throughput = c N / latency. The schedule takes, per c,
the K (0: the baseline's rate) with the best predicted throughput, thresholds at the midpoints
(core/schedule.schedule_steps).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from specbuild.client.bench import run_once
from specbuild.client.metrics import UNARY_BASELINE
from specbuild.client.options import BenchConfig
from specbuild.core.schedule import DraftSchedule, schedule_steps
from specbuild.core.theory import tokens_per_pass_chain

TIE = 0.03  # as tuning/cost_curve.py: predicted rates within 3% tie


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
            m = run.metrics
            point = {
                "throughput": m["output_token_throughput"],
                "ttft_s": m["time_to_first_token"]["p50"] / 1e3,
            }
            if k:
                tokens = m["output_sequence_length"]["avg"]
                rounds = tokens / m["mean_accepted_tokens_per_pass"]
                point["rounds"] = rounds
                point["round_s"] = (m["request_latency"]["p50"] / 1e3 - point["ttft_s"]) / max(rounds - 1, 1)
            points[f"{c}/{k}"] = point
    return {
        "kind": "served",
        "url": url,
        "max_tokens": max_tokens,
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
    n = curve["max_tokens"]
    table, baseline, chosen = [], {}, {}
    for c in curve["concurrency"]:
        baseline[c] = curve["points"][f"{c}/0"]["throughput"]
        rates = {0: baseline[c]}
        table.append(
            {
                "batch": c,
                "k": 0,
                "tokens_per_round": 1.0,
                "round_ms": float("nan"),
                "tokens_per_s": baseline[c],
            }
        )
        for k in curve["ks"]:
            p = curve["points"][f"{c}/{k}"]
            e = tokens[k] if tokens else tokens_per_pass_chain(acceptance, k)
            latency = p["ttft_s"] + max(n / e - 1.0, 0.0) * p["round_s"]
            rates[k] = c * n / latency
            table.append(
                {
                    "batch": c,
                    "k": k,
                    "tokens_per_round": e,
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
