"""Choosing K per concurrency from repeated, interleaved measurements, without switching on noise.

Input: for each concurrency c and each candidate K (0 = the target alone), the predicted (or measured)
tokens/s of R interleaved repeats, paired by repeat: repeat r of every K at one c ran back to back, so
the load of that minute hits all of them alike and the per-repeat ratio rate(K', r) / rate(K, r) cancels
most of it.

The rule (`choose`), concurrencies in ascending order. At each c there is a default, the incumbent:

* at the smallest c it is the largest K: one request in flight, no other request pays for the drafted
  tokens (and TensorRT-LLM wants K at 1 to be `max_draft_len`); a smaller K (0 included) must win;
* at every later c it is K = 0, the target alone: each drafted token now takes compute another request
  could use, so speculation must earn its place; the challengers are the K > 0 no larger than the K
  chosen at the c before (more load never drafts more);
* a challenger K' replaces the incumbent only when it is better in EVERY repeat (all paired ratios > 1)
  and its median paired ratio exceeds 1 + TIE; among the challengers that pass, the best median ratio
  wins (the smaller K on a tie);
* otherwise the incumbent stays: a difference inside the spread of the repeats (some repeat says the
  other way) or under TIE (3%, the spread of interleaved CPU timings) is not a reason to switch.

So a single noisy repeat can neither switch speculation off at one request in flight nor keep it on
under load, and a true win (> 3% in every repeat) always switches. Under load, where K > 0 and K = 0
are within the spread, the rule takes K = 0: the schedule then runs exactly the baseline's
configuration (the same work as the target alone), and gives up less than TIE plus the spread
against the best fixed K. With one repeat the rule degrades to "switch on a > 3% win". Each decision
is recorded with the ratios behind it (`Decision`).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

TIE = 0.03  # a median gain under 3% does not switch K (the spread of interleaved CPU timings)
RULE = (  # one line for reports and predictions
    "default K: the largest at the smallest concurrency, 0 (the target alone) at the others; another K "
    "replaces it only on a win in every repeat and > 3% in the median (core/perf/schedule_choice)"
)


@dataclass(frozen=True)
class Decision:
    concurrency: int
    incumbent: int  # the default at this c: the largest K at the first c, 0 at the others
    chosen: int
    # challenger K' -> the paired per-repeat ratios rate(K') / rate(incumbent)
    ratios: dict[int, list[float]] = field(default_factory=dict)
    reason: str = ""


def round_order(items: Sequence[T], r: int) -> list[T]:
    """The order of the modes in interleaved round (repeat) r: as given in even rounds, reversed in odd
    ones (A B C, C B A, ...). A load that rises or falls through a round then favours no mode over the
    rounds: the paired ratios above cancel a linear drift, not only a level."""
    return list(items) if r % 2 == 0 else list(reversed(items))


def spread(values: Sequence[float]) -> dict[str, float]:
    """median, min and max of the repeats."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def choose(rates: Mapping[int, Mapping[int, Sequence[float]]], *, tie: float = TIE) -> list[Decision]:
    """rates[c][K] = tokens/s per repeat (paired by index). One Decision per c, ascending."""
    decisions: list[Decision] = []
    cap: int | None = None  # the K chosen at the smaller concurrency (more load never drafts more)
    for c in sorted(rates):
        by_k = rates[c]
        if not by_k:
            raise ValueError(f"choose: no candidate K at concurrency {c}")
        repeats = {len(v) for v in by_k.values()}
        if len(repeats) != 1 or 0 in repeats:
            raise ValueError(f"choose: every K at concurrency {c} needs the same number (>= 1) of repeats")
        if cap is None:  # one request in flight: speculation is the default, a smaller K must win
            top = max(by_k)
            challengers = [k for k in by_k if k < top]
        else:  # under load the target alone is the default, speculation must win
            if 0 not in by_k:
                raise ValueError(f"choose: concurrency {c} needs K=0 (the target alone) measured")
            top = 0
            challengers = [k for k in by_k if 0 < k <= cap]
        ratios = {k: [a / b for a, b in zip(by_k[k], by_k[top], strict=True)] for k in challengers}
        medians = {k: statistics.median(q) for k, q in ratios.items()}
        clear = {k: m for k, m in medians.items() if min(ratios[k]) > 1.0 and m > 1 + tie}
        if clear:
            best = max(clear, key=lambda k: (clear[k], -k))
            reason = (
                f"K={best} beat K={top} in every repeat (median x{clear[best]:.3f}, "
                f"range {min(ratios[best]):.3f}-{max(ratios[best]):.3f})"
            )
        elif not ratios:
            best = top
            reason = f"K={top}: nothing to compare (more load never drafts more)"
        elif top == 0:
            best = 0
            near = max(medians, key=lambda k: (medians[k], -k))
            reason = (
                f"K=0: no K > 0 beat the target alone in every repeat by more than {tie:.0%} "
                f"(best K={near}: median x{medians[near]:.3f}, range "
                f"{min(ratios[near]):.3f}-{max(ratios[near]):.3f})"
            )
        else:
            best = top
            reason = f"kept K={top}: no smaller K beat it in every repeat by more than {tie:.0%}"
        decisions.append(Decision(concurrency=c, incumbent=top, chosen=best, ratios=ratios, reason=reason))
        cap = best
    return decisions
