"""The load-aware draft length: `speculation.schedule` (concurrency thresholds -> K) and the acceptance
guard (`speculation.guard`). One home for their semantics; every place that applies them asks here.

Schedule semantics (the spec's spelling, the same as TensorRT-LLM 1.2's `draft_len_schedule`):
`{1: 4, 3: 2, 6: 0}` means "from 1 request in flight draft K=4, from 3 K=2, from 6 no speculation":
a round with n requests in flight drafts `k_for(n)` = the value of the largest key <= n. Key 1 is
required and maps to `max_draft_len` (TensorRT-LLM requires the same of its schedule), values lie in
0..max_draft_len. K=0 rounds are plain target steps. The one exception is `{1: 0}` (OFF): speculation off
at every load, what `tune --schedule --write` leaves when no K > 0 pays.

Where n comes from:
* the reference engine's in-process batch: the rows still decoding in that round;
* the Triton BLS (engine flow): the requests being handled by all instances of the BLS at the start of
  the round (a counter shared between the instances' processes, model_repo/python_models/
  tensorrt_llm_bls/inflight.py), held for `inflight_hold_ms` at what it was when a request ended
  (`held_count`); requests still queued in Triton are not counted (the engines do not see them either);
* the local engine model of an engine that speculates by itself (Medusa's tree; model_repo/python_models/
  tensorrt_llm_local/step_scheduler.py): the requests the model holds (read, not answered: queued ones
  included; held as the BLS's count), when a request is admitted and after each step of a running tree.
  Admitted at K=0: a plain row of the in-flight batch to its end; K>0: its tree runs between steps until
  a step ends at K=0, then the request goes on as a plain row (never back to the tree);
* the LLM-API flow: the runtime's active batch size (TensorRT-LLM applies `draft_len_schedule` itself);
  `llmapi_schedule` spells the schedule for the targeted version.

The acceptance guard: per request, once `window` drafted rounds exist and the acceptance rate
(accepted / drafted) over the last `window` drafted rounds is below `min_acceptance`, the request
stops drafting (its remaining rounds are plain target steps) and says so (SpecStats.guard_stopped).
Off unless the spec has a `guard` section: a short run of rejections can stop drafting that would have
paid off later in the request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MAX_THRESHOLD = 65536  # = spec.MAX_BATCH_SIZE: no server has more requests in flight
# Target tokens one K=0 round of the Triton BLS asks for in one call before it reads the in-flight count
# again: each call re-sends the sequence through the Python backend's IPC, so a plain round of one token
# would cost a round trip per token, while the target alone makes one call per request (and the local
# engine batches concurrent plain calls). 16 measured 0.55x of the one-call baseline at concurrency 8 on
# the demo family; 64 lets a request under load finish in about one call, at the price of reacting to a
# falling load only every 64 tokens (and those tokens arrive together).
PLAIN_ROUND_TOKENS = 64
# A streamed request's K=0 rounds ask 1, g, g^2, ... tokens (up to PLAIN_ROUND_TOKENS): the first token after
# one target step (its TTFT, as without speculation), then few calls. Every call costs the BLS a round trip
# through the Python backend and the engine a request to admit, so g = 2 (6 calls for 48 tokens) lost
# throughput to g = 8 (lab/notebook/2026-12-03-plain-round-growth.md).
PLAIN_ROUND_GROWTH = 8
# How long the count a schedule reads stays at least what it was when a request ended (`held_count`). A
# closed-loop client answers a finished request with its next one a few milliseconds later; requests that
# finish together (same length, batched in one step) all leave before any replacement arrives, and the
# first to arrive would read the load as lower than it is and draft a round (a Medusa request would start
# a tree). 50 ms covers a client's turnaround here many times over and delays the schedule's reaction to
# a load that really falls by at most that long.
INFLIGHT_HOLD_MS = 50
# A schedule that never drafts: `specbuild repo --schedule 1:0`, or the spec's `speculation.schedule:
# {1: 0}` (OFF). What `tune --schedule --write` leaves when no K > 0 beats the target alone even at one
# request in flight: the engine flow's BLS drafts 0 at every load, the LLM-API options have no
# speculative_config (TensorRT-LLM's draft_len_schedule cannot say "off at 1": its key 1 is max_draft_len).
SERVED_OFF = "1:0"
OFF = {1: 0}


def record_end(
    last: tuple[int, int], count: int, now_ns: int, hold_ms: float = INFLIGHT_HOLD_MS
) -> tuple[int, int]:
    """The (end time ns, count then) to keep when a request ends with `count` in flight (it included),
    given the last one kept (0, 0 for none): the larger count when the last end is within the hold, so
    requests that end together one after the other keep the count before the first of them left."""
    last_ns, last_count = last
    if last_ns and now_ns - last_ns < hold_ms * 1e6:
        count = max(count, last_count)
    return now_ns, count


def held_count(
    live: int, ends: Sequence[tuple[int, int]], now_ns: int, hold_ms: float = INFLIGHT_HOLD_MS
) -> int:
    """The in-flight count a schedule reads: the live count, or, when larger, the count just before a request
    ended (that request included) for `ends` = (end time ns, count then) no older than hold_ms. A request
    that replaces one that just ended thus sees the load it replaces; a lone client (count 1 before its
    request ended) still reads 1."""
    hold_ns = hold_ms * 1e6
    recent = [count for end_ns, count in ends if 0 <= now_ns - end_ns < hold_ns]
    return max([live, *recent])


class ScheduleError(ValueError):
    """A schedule that cannot be applied (the spec loader turns it into a SpecError)."""


@dataclass(frozen=True)
class DraftSchedule:
    """K per number of requests in flight: `steps` = ((from_n, K), ...) sorted, the first from 1."""

    steps: tuple[tuple[int, int], ...]

    @classmethod
    def parse(cls, raw: Any, *, max_draft_len: int, first_is_max: bool = True) -> DraftSchedule:
        """From the spec's mapping (YAML int keys, or the digit strings a JSON manifest holds).

        first_is_max=False (a repository's `--schedule`, a serving decision on an engine flow build): K at
        1 may be below max_draft_len (the engines' cap); the spec itself keeps TensorRT-LLM's rule."""
        if isinstance(raw, DraftSchedule):
            raw = raw.to_dict()
        if not isinstance(raw, Mapping) or not raw:
            raise ScheduleError(
                f"a mapping of concurrency thresholds to K, e.g. {{1: {max_draft_len}, 4: 0}}"
            )
        steps: dict[int, int] = {}
        for key, value in raw.items():
            n = _int(key, what="a threshold")
            k = _int(value, what=f"the K of threshold {n}")
            if not 1 <= n <= MAX_THRESHOLD:
                raise ScheduleError(f"threshold {n}: thresholds are request counts in 1..{MAX_THRESHOLD}")
            if not 0 <= k <= max_draft_len:
                raise ScheduleError(
                    f"threshold {n} -> K={k}: K must lie in 0..max_draft_len ({max_draft_len})"
                )
            if n in steps:
                raise ScheduleError(f"threshold {n} appears twice")
            steps[n] = k
        if 1 not in steps:
            raise ScheduleError(f"no threshold 1: add 1: {max_draft_len} (one request in flight)")
        if steps == {1: 0}:  # OFF: speculation off at every load (`tune --schedule` when none pays)
            return cls(((1, 0),))
        if first_is_max and steps[1] != max_draft_len:
            raise ScheduleError(
                f"threshold 1 -> K={steps[1]}: one request in flight must use max_draft_len "
                f"({max_draft_len}), "
                "as TensorRT-LLM requires of draft_len_schedule; lower max_draft_len instead"
            )
        return cls(tuple(sorted(steps.items())))

    @classmethod
    def fixed(cls, k: int) -> DraftSchedule:
        return cls(((1, k),))

    @property
    def off(self) -> bool:
        """K=0 at every load: the target alone (the LLM-API options then leave out speculative_config)."""
        return all(k == 0 for _, k in self.steps)

    def k_for(self, in_flight: int) -> int:
        """K for a round with `in_flight` requests (counting this one; below 1 counts as 1)."""
        k = self.steps[0][1]
        for n, value in self.steps:
            if n > max(in_flight, 1):
                break
            k = value
        return k

    def to_dict(self) -> dict[int, int]:
        return dict(self.steps)

    def to_text(self) -> str:
        """A compact spelling for repository parameters and tables: '1:4,3:2,6:0'."""
        return ",".join(f"{n}:{k}" for n, k in self.steps)

    @classmethod
    def from_text(cls, text: str, *, max_draft_len: int, first_is_max: bool = True) -> DraftSchedule:
        pairs: dict[int, str] = {}
        for part in text.split(","):
            n, sep, k = part.partition(":")
            if not sep:
                raise ScheduleError(f"schedule {text!r}: expected 'n:K,n:K'")
            threshold = _int(n.strip(), what="a threshold")
            if threshold in pairs:  # a dict would keep the last one silently
                raise ScheduleError(f"threshold {threshold} appears twice")
            pairs[threshold] = k.strip()
        return cls.parse(pairs, max_draft_len=max_draft_len, first_is_max=first_is_max)

    @property
    def max_concurrency(self) -> int | None:
        """The most requests in flight that still draft, when every larger count has K=0 (else None)."""
        first_off = None
        for n, k in reversed(self.steps):
            if k != 0:
                break
            first_off = n
        return None if first_off is None else first_off - 1

    def upper_bounds(self, max_batch_size: int) -> dict[int, int]:
        """The same schedule as "up to n requests: K" (TensorRT-LLM 1.3+ `draft_len_schedule`: batch size
        <= the smallest key >= it; above the largest key speculation is off). Thresholds from
        max_batch_size on can never be reached and are dropped; a K>0 tail ends at max_batch_size."""
        steps = [(n, k) for n, k in self.steps if n <= max_batch_size]
        tiers = [
            (steps[i + 1][0] - 1 if i + 1 < len(steps) else max_batch_size, k)
            for i, (_, k) in enumerate(steps)
        ]
        while tiers and tiers[-1][1] == 0:  # K=0 to the end: the implicit "off" past the largest key
            tiers.pop()
        return dict(tiers)

    def ranges(self, max_batch_size: int) -> list[tuple[int, int, int]]:
        """The same schedule as inclusive batch-size ranges [(start, end, K), ...] covering 1..max_batch_size
        (vLLM's `num_speculative_tokens_per_batch_size`): the first starts at 1, none overlap, the last ends
        at max_batch_size; thresholds above max_batch_size can never be reached and are dropped."""
        steps = [(n, k) for n, k in self.steps if n <= max_batch_size]
        return [
            (n, steps[i + 1][0] - 1 if i + 1 < len(steps) else max_batch_size, k)
            for i, (n, k) in enumerate(steps)
        ]


def schedule_steps(sizes: Sequence[int], chosen: dict[int, int]) -> dict[int, int]:
    """{threshold: K} from the K chosen at each measured size: where K changes between two measured sizes
    the threshold is their midpoint, rounded up (the requests in flight of a closed loop at concurrency c
    are often fewer than c: between requests, and while the client reads)."""
    steps, last = {1: chosen[sizes[0]]}, chosen[sizes[0]]
    for lower, upper in zip(sizes, sizes[1:], strict=False):
        if chosen[upper] != last:
            steps[max(math.ceil((lower + upper) / 2), lower + 1)] = chosen[upper]
            last = chosen[upper]
    return steps


def _int(value: Any, *, what: str) -> int:
    if isinstance(value, bool):
        raise ScheduleError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():  # not "²"
        return int(value.strip())
    raise ScheduleError(f"{what} must be an integer, got {value!r}")


@dataclass(frozen=True)
class AcceptanceGuard:
    """Stop drafting for a request whose acceptance over its last `window` drafted rounds is below
    `min_acceptance` (accepted / drafted)."""

    window: int = 8
    min_acceptance: float = 0.3

    def trips(self, rounds: list[tuple[int, int]]) -> bool:
        """`rounds`: (accepted, drafted) of the request's drafted rounds so far. True once the last `window`
        of them accepted less than min_acceptance of what they drafted."""
        if len(rounds) < self.window:
            return False
        last = rounds[-self.window :]
        drafted = sum(d for _, d in last)
        return sum(a for a, _ in last) < self.min_acceptance * drafted


def schedule_of(spec) -> DraftSchedule | None:
    """The spec's schedule (validated by the loader), or None (fixed K)."""
    raw = spec.speculation.schedule
    return None if raw is None else DraftSchedule.parse(raw, max_draft_len=spec.speculation.max_draft_len)


def guard_text(guard: AcceptanceGuard) -> str:
    """The BLS parameter spelling 'window:min_acceptance'."""
    return f"{guard.window}:{guard.min_acceptance:g}"


def guard_of(spec) -> AcceptanceGuard | None:
    g = spec.speculation.guard
    return None if g is None else AcceptanceGuard(window=g.window, min_acceptance=g.min_acceptance)
