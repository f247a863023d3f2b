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
the expected makespan of requests drawn from those (core/perf/concurrency.closed_loop_s: a request lasts
ttft + (R - 1) x round, the baseline's its measured latency), throughput = n x mean tokens / makespan.

The whole sweep (every c, every K) is repeated `repeats` times (default 3), interleaved: repeat r of
every K at one c runs back to back, so a load change hits all of them alike. Each (c, K) gets the
median predicted tokens/s over the repeats and its range; the schedule is chosen by
core/perf/schedule_choice.choose: K at the smallest c is the largest unless a smaller K predicts more in
EVERY repeat and by more than 3% in the median; at each larger c it is 0 unless a K > 0 (no larger
than the K before) beats the target alone that way (never on a difference inside the spread);
thresholds at the midpoints (core/perf/schedule.schedule_steps). Its cost: repeats x concurrencies x (K + 1)
runs of the tune prompts (`seconds` in the curve; ~3 min for 3 x 4 x 5 runs of 8 prompts x
48 tokens on the demo family here).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

from specbuild.bench.bench import run_once
from specbuild.bench.cost_model import calibrate, predicted_tokens_per_s
from specbuild.bench.metrics import UNARY_BASELINE
from specbuild.bench.options import BenchConfig, run_length
from specbuild.core.perf.schedule import SERVED_OFF, DraftSchedule, schedule_steps
from specbuild.core.perf.schedule_choice import RULE, choose, round_order, spread
from specbuild.core.perf.theory import tokens_per_pass_chain

REPEATS = 3  # interleaved repeats of the whole sweep: medians, spread, and the choice rule


def measure_served(
    url: str,
    prompts: Sequence[str],
    *,
    ks: Sequence[int],
    concurrency: Sequence[int],
    max_tokens: int,
    repeats: int = REPEATS,
    waves: int = 1,
) -> dict[str, Any]:
    """points[f"{c}/{k}"]: one calibrated point per repeat (k = 0: the one-call baseline); each run at c
    sends max(len(prompts), waves x c) requests (bench/options.run_prompts)."""
    config = BenchConfig(
        url=url,
        prompts=tuple(prompts),
        concurrency=tuple(concurrency),
        temperatures=(0.0,),
        max_tokens=max_tokens,
        timeout_s=600,
        waves=waves,
    )
    points: dict[str, list[dict[str, Any]]] = {}
    start = time.monotonic()
    for r in range(repeats):  # the whole sweep once per repeat
        for c in concurrency:
            # interleaved: every K of one concurrency back to back, the order reversed every other repeat
            for k in round_order((0, *ks), r):
                run = run_once(
                    config,
                    # the target alone in one call per request (a streamed baseline pays one BLS -> target
                    # call per token, which the schedule's plain rounds do not)
                    mode=UNARY_BASELINE if k == 0 else "speculative",
                    temperature=0.0,
                    concurrency=c,
                    k=k,
                    advance=lambda: None,
                )
                points.setdefault(f"{c}/{k}", []).append(calibrate(run))
    return {
        "kind": "served",
        "url": url,
        "max_tokens": max_tokens,
        "requests": len(prompts),
        "waves": waves,
        "concurrency": list(concurrency),
        "ks": list(ks),
        "repeats": repeats,
        "seconds": time.monotonic() - start,
        "points": points,
    }


def _repeats(points: dict[str, Any] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    return points if isinstance(points, list) else [points]  # a curve of one repeat, written by hand


def predict_served(
    curve: dict[str, Any],
    acceptance: Sequence[float],
    *,
    mode: str = "throughput",
    tokens: dict[int, float] | None = None,
) -> dict:
    """The prediction and schedule in the shape of tuning/cost_curve.SchedulePrediction.to_dict(); each
    table row has the median over the repeats (`tokens_per_s`) and their range; `decisions`: why each
    concurrency got its K (core/perf/schedule_choice)."""
    table, baseline, per_repeat = [], {}, {}
    for c in curve["concurrency"]:
        # the requests one measured run sent at c (bench/options.run_prompts; curves written before
        # --waves: one per prompt)
        requests = run_length(curve["requests"], c, curve.get("waves", 1))
        base = _repeats(curve["points"][f"{c}/0"])
        rates = per_repeat[c] = {0: [predicted_tokens_per_s(p, c, requests) for p in base]}
        baseline[c] = statistics.median(rates[0])
        table.append(
            {
                "batch": c,
                "k": 0,
                "tokens_per_round": 1.0,
                "round_ms": float("nan"),
                "tokens_per_s": baseline[c],
                "predicted": spread(rates[0]),
                "measured_tokens_per_s": statistics.median(p["throughput"] for p in base),
            }
        )
        for k in curve["ks"]:
            ps = _repeats(curve["points"][f"{c}/{k}"])
            rates[k] = [predicted_tokens_per_s(p, c, requests) for p in ps]
            table.append(
                {
                    "batch": c,
                    "k": k,
                    "tokens_per_round": statistics.median(
                        statistics.fmean(p["tokens"]) / statistics.fmean(p["rounds"]) for p in ps
                    ),
                    "tokens_per_round_chain": tokens[k] if tokens else tokens_per_pass_chain(acceptance, k),
                    "round_ms": statistics.median(p["round_s"] for p in ps) * 1e3,
                    "tokens_per_s": statistics.median(rates[k]),
                    "predicted": spread(rates[k]),
                    "measured_tokens_per_s": statistics.median(p["throughput"] for p in ps),
                }
            )
    decisions = choose(per_repeat)
    chosen = {d.concurrency: d.chosen for d in decisions}
    sizes = sorted(curve["concurrency"])
    notes = []
    if chosen[sizes[0]] == 0:
        notes.append(
            "no K > 0 beats the baseline at the smallest concurrency: speculation does not pay on this "
            f"server at any load; serve it off: `specbuild repo BUILD --schedule {SERVED_OFF}` (requests "
            "that leave num_draft_tokens out get the target alone)"
        )
        schedule = None
        repository_schedule = SERVED_OFF
    else:
        steps = schedule_steps(sizes, chosen)
        parsed = DraftSchedule.parse(steps, max_draft_len=chosen[sizes[0]])
        schedule, repository_schedule = parsed.to_dict(), parsed.to_text()
    return {
        "mode": mode,
        "rule": RULE,
        "acceptance": list(acceptance),
        "curve": curve,
        "table": table,
        "baseline": baseline,
        "chosen": chosen,
        "decisions": [
            {"concurrency": d.concurrency, "incumbent": d.incumbent, "chosen": d.chosen, "reason": d.reason}
            for d in decisions
        ],
        "schedule": schedule,
        # what the repository that was measured should serve (`specbuild repo --schedule`): the spec's
        # schedule, or SERVED_OFF where the spec cannot say it (TensorRT-LLM's draft_len_schedule keeps K at
        # one request in flight at max_draft_len; an engine-flow repository's BLS may serve K=0 there)
        "repository_schedule": repository_schedule,
        "notes": notes,
        "median_round_ms": statistics.median(
            p["round_s"] * 1e3 for ps in curve["points"].values() for p in _repeats(ps) if "round_s" in p
        ),
    }
