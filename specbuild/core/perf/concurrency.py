"""Expected wall time of a set of requests under load, from measured per-round costs and a measured
distribution of rounds per request (the cost model of `tune --schedule`, in-process and served).

A request of the measured kind needs R rounds (speculative: one verified round each; plain: one step
per token); R varies from prompt to prompt with the acceptance, and the last round drafts less (both
are in a measured R, not in a mean E(K)). A round's cost is measured per (concurrency, K) on real runs
of the tune prompts, so the passes at the rows' real lengths and the loop's own work are inside it.

Two ways requests share the engine:

* `lockstep`: the reference engine's in-process batch: requests in batches of c, each batch runs until
  its slowest row is done (rows that finished early still ride in every pass), so a batch costs
  first + (max_i R_i - 1) x round;
* `closed_loop`: the served bench: c workers each send the next request when their last one ends;
  a request costs first + (R - 1) x round and the run lasts until the last one ends (the makespan).

Both are expectations over R drawn from the measured distribution (the tune prompts); `lockstep` is
exact (the max of c draws), `closed_loop` a seeded Monte Carlo (the makespan has no closed form).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence

SAMPLES = 400  # Monte Carlo draws for closed_loop: the makespan's mean to ~1% on 8 requests
SEED = 0  # fixed: the same measurement always gives the same prediction


def expected_max(values: Sequence[float], n: int) -> float:
    """E[max of n independent draws from the empirical distribution `values`] (exact)."""
    if not values:
        raise ValueError("expected_max: no measured values")
    xs = sorted(values)
    m = len(xs)
    total, below = 0.0, 0.0
    for i, x in enumerate(xs, 1):
        cdf = (i / m) ** n  # P(max <= xs[i-1]) over draws of the empirical distribution
        total += x * (cdf - below)
        below = cdf
    return total


def lockstep_s(
    rounds: Sequence[float], *, batch: int, requests: int, first_s: float, round_s: float
) -> float:
    """Expected seconds of `requests` requests in lockstep batches of `batch` (the last one smaller)."""
    total, left = 0.0, requests
    while left > 0:
        b = min(batch, left)
        total += first_s + max(expected_max(rounds, b) - 1.0, 0.0) * round_s
        left -= b
    return total


def closed_loop_s(
    rounds: Sequence[float], *, workers: int, requests: int, first_s: float, round_s: float
) -> float:
    """Expected makespan of `requests` requests of first_s + (R - 1) x round_s seconds each (R drawn from
    `rounds`) sent by `workers` closed-loop workers (seeded)."""
    return closed_loop_durations_s(
        [first_s + max(r - 1.0, 0.0) * round_s for r in rounds], workers=workers, requests=requests
    )


def closed_loop_durations_s(durations: Sequence[float], *, workers: int, requests: int) -> float:
    """Expected makespan of `requests` requests whose durations are drawn from `durations` (seeded)."""
    if not durations:
        raise ValueError("closed_loop: no measured requests")
    rng = random.Random(SEED)
    total = 0.0
    for _ in range(SAMPLES):
        free = [0.0] * min(workers, requests)  # when each worker is next free
        end = 0.0
        for _ in range(requests):
            done = heapq.heappop(free) + rng.choice(durations)
            end = max(end, done)
            heapq.heappush(free, done)
        total += end
    return total / SAMPLES
