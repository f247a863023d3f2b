"""The in-process half of `make demo`'s load table: the in-process cost model checked on held-out prompts
on the compiled reference engine.

The model (tuning/cost_curve.py `time_loop` / `LoopTiming.predicted_tokens_per_s`): requests in lockstep
batches of c, each batch lasting its first tokens plus (its slowest row's rounds - 1) rounds, with the
first-token time, the round time and each prompt's rounds measured on the calibration prompts (tune's
prompts, never a held-out one) at the same c and K. `check` runs, per round and per (c, mode), the
calibration prompts and right after them the held-out prompts (the demo's bench prompts) the same way
(one torch thread, as served), for the target alone (the plain loop), a fixed K and the schedule the
build carries; every mode of one c back to back, then the next c, then the next round. Calibrating
right before each held-out run, as `bench --calibrate` does through Triton, keeps a load change of the
shared machine between tune and the check out of the ratio: what is left is the model's own error
(lockstep and round costs, and the held-out prompts' acceptance against the calibration prompts').

Per (c, mode): the median tokens/s with its range, measured / predicted (median of the rounds' ratios,
range) and, per round, the schedule over the fixed K: where the schedule IS that K (c = 1) it reads
~1.00, the size of the noise.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch

from specbuild.core.perf.schedule_choice import spread
from specbuild.tuning.cost_curve import time_loop

BASELINE = "baseline"  # the plain batch loop: the target alone
SCHEDULE = "schedule"


def calibrated_run(
    engine,
    calibration: Sequence[list[int]],
    prompts: Sequence[list[int]],
    c: int,
    k: int | None,
    max_tokens: int,
    *,
    speculative: bool,
) -> tuple[float, float, float]:
    """(measured, predicted, predicted with the run's own rounds) tokens/s of `prompts` in lockstep batches of
    c, predicted by the lockstep model calibrated on `calibration` right before (same c, K and mode). The
    third keeps the calibration's times and takes the run's rounds and tokens: the cost model's own error,
    without the two prompt sets' difference in acceptance."""
    cal = time_loop(engine, [list(p) for p in calibration], c, k, max_tokens, speculative=speculative)
    run = time_loop(engine, [list(p) for p in prompts], c, k, max_tokens, speculative=speculative)
    own = replace(cal, rounds=run.rounds, tokens=run.tokens)
    return (
        run.tokens_per_s,
        cal.predicted_tokens_per_s(c, len(prompts)),
        own.predicted_tokens_per_s(c, len(prompts)),
    )


def check(
    engine,
    prompts: Sequence[list[int]],
    *,
    calibration: Sequence[list[int]],
    fixed_k: int,
    concurrency: Sequence[int],
    rounds: int,
    max_tokens: int,
    log=print,
) -> dict[str, Any]:
    """{"points": {"c/label": {...}}, "schedule_over_fixed": {c: spread}, "seconds": s} (see the module
    docstring); `calibration`: the prompts each held-out run's prediction is calibrated on."""
    has_schedule = engine.schedule is not None
    modes: list[tuple[str, bool, int | None]] = [(BASELINE, False, None), (f"K={fixed_k}", True, fixed_k)]
    if has_schedule:
        modes.append((SCHEDULE, True, None))  # num_draft_tokens None: the build's schedule
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the served engine processes and tune's cost curve
    # (measured, predicted, predicted with the run's own rounds) per round
    measured: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    try:
        time_loop(engine, [list(p) for p in prompts[:2]], 2, fixed_k, 4)  # warm-up
        start = time.monotonic()
        for r in range(rounds):
            for c in concurrency:
                for label, speculative, k in modes:
                    triple = calibrated_run(
                        engine, calibration, prompts, c, k, max_tokens, speculative=speculative
                    )
                    measured.setdefault((c, label), []).append(triple)
            log(f"in-process round {r + 1}/{rounds} done")
        seconds = time.monotonic() - start
    finally:
        torch.set_num_threads(threads)
    points: dict[str, Any] = {}
    for (c, label), runs in measured.items():
        points[f"{c}/{label}"] = {
            "tokens_per_s": spread([m for m, _, _ in runs]),
            "predicted_tokens_per_s": spread([p for _, p, _ in runs]),
            "measured_over_predicted": spread([m / p for m, p, _ in runs]),
            "measured_over_cost_model": spread([m / own for m, _, own in runs]),
        }
    over_fixed = {}
    if has_schedule:
        for c in concurrency:
            per_round = zip(measured[c, SCHEDULE], measured[c, f"K={fixed_k}"], strict=True)
            over_fixed[c] = spread([s[0] / f[0] for s, f in per_round])
    return {
        "rounds": rounds,
        "max_tokens": max_tokens,
        "prompts": len(prompts),
        "fixed_k": fixed_k,
        "points": points,
        "schedule_over_fixed": over_fixed,
        "seconds": seconds,
    }
