"""The in-process half of `make demo`'s load table: `tune --schedule`'s prediction checked on held-out
prompts on the same reference engine.

`tune --schedule` predicts, per batch size b and K, the tokens/s of requests of its --max-tokens in
lockstep batches of b (tuning/cost_curve.py, calibrated on the tune prompts). `check` runs other
prompts (the demo's bench prompts) through the compiled engine the same way — lockstep batches of c
(`time_loop`), one torch thread as served — for the target alone (the plain loop), a fixed K and the
schedule the build carries, in `rounds` interleaved rounds (every mode of one c back to back, then the
next c; then the next round), and reports per (c, mode) the median tokens/s with its range, measured /
predicted (median of the rounds' ratios: the prediction is one number, so a slow round shows as a low
ratio) and, per round, the schedule over the fixed K: where the schedule IS that K (c = 1) it should
read ~1.00, the size of the noise.

The schedule's prediction is tune's rate at the K it chose for b; in the run, a lockstep batch's K
follows the rows still decoding (K can rise as rows finish), so the schedule's ratio can read a little
high at the larger c.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from specbuild.core.schedule_choice import spread
from specbuild.tuning.cost_curve import time_loop

BASELINE = "baseline"  # the plain batch loop: the target alone
SCHEDULE = "schedule"


def predicted_rates(prediction: dict[str, Any]) -> dict[tuple[int, str], float]:
    """(b, label) -> predicted tokens/s from a `tune --schedule` report's schedule part (JSON keys are
    strings): labels baseline, K=k, schedule (the rate at the K chosen for b)."""
    rates = {(int(r["batch"]), f"K={r['k']}"): r["tokens_per_s"] for r in prediction["table"]}
    for b, rate in prediction["baseline"].items():
        rates[int(b), BASELINE] = rate
    for b, k in prediction["chosen"].items():
        rates[int(b), SCHEDULE] = rates[int(b), BASELINE] if k == 0 else rates.get((int(b), f"K={k}"))
    return rates


def check(
    engine,
    prompts: Sequence[list[int]],
    prediction: dict[str, Any],
    *,
    fixed_k: int,
    concurrency: Sequence[int],
    rounds: int,
    max_tokens: int,
    log=print,
) -> dict[str, Any]:
    """{"points": {"c/label": {...}}, "schedule_over_fixed": {c: spread}, "seconds": s} (see the module
    docstring); `prediction`: tune's schedule report (tune.json's details.schedule)."""
    predicted = predicted_rates(prediction)
    has_schedule = prediction.get("schedule") is not None
    modes: list[tuple[str, bool, int | None]] = [(BASELINE, False, None), (f"K={fixed_k}", True, fixed_k)]
    if has_schedule:
        modes.append((SCHEDULE, True, None))  # num_draft_tokens None: the build's schedule
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the served engine processes and tune's cost curve
    measured: dict[tuple[int, str], list[float]] = {}
    try:
        time_loop(engine, [list(p) for p in prompts[:2]], 2, fixed_k, 4)  # warm-up
        start = time.monotonic()
        for r in range(rounds):
            for c in concurrency:
                for label, speculative, k in modes:
                    run = time_loop(
                        engine, [list(p) for p in prompts], c, k, max_tokens, speculative=speculative
                    )
                    measured.setdefault((c, label), []).append(run.tokens_per_s)
            log(f"in-process round {r + 1}/{rounds} done")
        seconds = time.monotonic() - start
    finally:
        torch.set_num_threads(threads)
    points: dict[str, Any] = {}
    for (c, label), values in measured.items():
        p = predicted.get((c, label))
        points[f"{c}/{label}"] = {
            "tokens_per_s": spread(values),
            "predicted_tokens_per_s": p,
            "measured_over_predicted": spread([v / p for v in values]) if p else None,
        }
    over_fixed = {}
    if has_schedule:
        for c in concurrency:
            per_round = zip(measured[c, SCHEDULE], measured[c, f"K={fixed_k}"], strict=True)
            over_fixed[c] = spread([s / f for s, f in per_round])
    return {
        "rounds": rounds,
        "max_tokens": max_tokens,
        "prompts": len(prompts),
        "fixed_k": fixed_k,
        "points": points,
        "schedule_over_fixed": over_fixed,
        "seconds": seconds,
    }
