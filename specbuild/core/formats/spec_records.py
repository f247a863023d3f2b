"""One request's speculative statistics in the shapes the ecosystem reads (torch-free, stdlib only).

A request's verification steps are `(accepted, drafted)` pairs, one per target pass that checked drafts
(a pass that checked none, e.g. the last token of a request, is not a step: vLLM and AIPerf count only
steps that drafted). Two shapes are built from them:

* `vllm_spec_metrics`: vLLM's per-request `SpeculativeDecodingMetrics`, the object vLLM 0.33.0 puts in
  `metrics.speculative_decoding` at the root of an OpenAI response (`--per-request-spec-decode-metrics
  detailed`; `RequestSpecDecodeMetrics.to_dict()` in vllm/v1/metrics/stats.py): the histogram is dense,
  of length num_spec_tokens + 1, `histogram[j]` = steps that accepted exactly j drafts (the bonus token
  excluded); mean_acceptance_length = 1 + accepted / steps (1.0 without steps); draft_acceptance_rate =
  accepted / drafted (0.0 without drafts). AIPerf 0.13.0's vLLM adapter reads exactly this object.
* `aiperf_acceptance_record`: AIPerf 0.13.0's `SpecDecodeAcceptanceRecord`
  (aiperf/common/models/spec_decode_models.py): the same counters with a sparse histogram {j: steps}
  (zero buckets left out), `engine`, `completion_tokens` and the per-step arrays. Its validators hold by
  construction: sum(hist) == steps, sum(j * hist[j]) == accepted, accepted <= drafted, per-step arrays of
  length steps summing to the totals, each step accepted <= drafted.

`num_spec_tokens` is K, the fixed per-step bound (None when it varies, e.g. a Medusa tree).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Step = tuple[int, int]  # (accepted drafts, drafted tokens) of one verification step


def spec_steps(steps: Sequence[Step]) -> list[Step]:
    """The steps that drafted (a target pass without drafts is no speculative step)."""
    return [(int(a), int(d)) for a, d in steps if d > 0]


def _totals(steps: Sequence[Step]) -> tuple[int, int, int]:
    accepted = sum(a for a, _ in steps)
    drafted = sum(d for _, d in steps)
    return len(steps), accepted, drafted


def vllm_spec_metrics(steps: Sequence[Step], num_spec_tokens: int | None, *, detailed: bool = True) -> dict:
    """vLLM's `speculative_decoding` object of one request (see the module docstring)."""
    steps = spec_steps(steps)
    n, accepted, drafted = _totals(steps)
    depth = num_spec_tokens if num_spec_tokens is not None else max((d for _, d in steps), default=0)
    histogram = [0] * (max(depth, max((a for a, _ in steps), default=0)) + 1)
    for a, _ in steps:
        histogram[a] += 1
    out: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted / n if n else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": n,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": num_spec_tokens,
        "per_step_accepted": None,
        "per_step_drafted": None,
    }
    if detailed and steps:  # vLLM fills them at `detailed` only, and only when non-empty
        out["per_step_accepted"] = [a for a, _ in steps]
        out["per_step_drafted"] = [d for _, d in steps]
    return out


def aiperf_acceptance_record(
    steps: Sequence[Step],
    num_spec_tokens: int | None,
    *,
    engine: str,
    completion_tokens: int | None,
) -> dict | None:
    """AIPerf's SpecDecodeAcceptanceRecord of one request (None: it never drafted, as AIPerf's adapters
    return no record for such a request)."""
    steps = spec_steps(steps)
    if not steps:
        return None
    n, accepted, drafted = _totals(steps)
    histogram: dict[int, int] = {}
    for a, _ in steps:
        histogram[a] = histogram.get(a, 0) + 1
    return {
        "engine": engine,
        "mean_acceptance_length": 1.0 + accepted / n,
        "draft_acceptance_rate": accepted / drafted,
        "acceptance_histogram": {str(j): histogram[j] for j in sorted(histogram)},  # jsonl: string keys
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_steps": n,
        "num_spec_tokens": num_spec_tokens,
        "completion_tokens": completion_tokens,
        "per_step_accepted": [a for a, _ in steps],
        "per_step_drafted": [d for _, d in steps],
    }
