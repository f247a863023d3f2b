"""Benchmark arithmetic: latency statistics with genai-perf's names, and the speculative figures.

Definitions (genai-perf `llm_metrics.py`, triton.md §6.2), all from the client's clock:
* time_to_first_token (ms): first streamed response with tokens - request send;
* inter_token_latency (ms), per request: (request_latency - TTFT) / (output tokens - 1);
* request_latency (ms): send -> final response;
* output_token_throughput (tokens/s): all output tokens / benchmark duration;
* request_throughput (requests/s): requests / benchmark duration.

Speculative figures (core/perf/theory.py, one definition for every benchmark): acceptance rate =
accepted / drafted (the backend's); alpha = accepted / positions tested, from the accepted length of
each streamed round; mean accepted tokens per target pass = output tokens / target passes (accepted
drafts + the token the target adds); predicted speedup with K drafts and draft/target cost ratio c:
(1 - alpha^(K+1)) / ((1 - alpha) (K c + 1)).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specbuild.core.perf import theory

STATS = ("avg", "p50", "p90", "p99")
# bench's run of the target alone in one unary request each: the BLS calls the target once for all tokens
# (no per-token call, no stream), the throughput a deployment of the target alone reaches; its TTFT is the
# whole request. Its throughput is the reference of speedup_measured_vs_unary.
UNARY_BASELINE = "baseline-unary"
# the schedule (num_draft_tokens left out) in one unary request each: a Medusa repository's K=0 rounds then
# answer once per request like the one-call baseline, instead of one streamed response per token
UNARY_SCHEDULE = "schedule-unary"
# the one-call baseline a second time in every round, at the other end of the round's order (bench
# --aa-baseline): two runs of one configuration, as far apart as any two modes of the round. Their ratio
# (load_bench: "a_a") is what this machine and server make of no difference at all: a schedule / baseline
# ratio inside its range is not a measured difference.
UNARY_BASELINE_AGAIN = "baseline-unary-again"
UNARY_MODES = (UNARY_BASELINE, UNARY_SCHEDULE, UNARY_BASELINE_AGAIN)  # runs sent without a stream


@dataclass(frozen=True)
class RequestRecord:
    """One request as the client saw it."""

    ttft_s: float
    latency_s: float
    output_tokens: int
    target_passes: int  # streamed responses with tokens (one per engine step)
    drafted: int = 0
    accepted: int = 0
    accepted_per_step: tuple[int, ...] = ()
    rounds: tuple[tuple[int, int], ...] = ()  # (accepted, drafted) per round when K per round is known
    # what the AIPerf-named records need (bench/aiperf_export.py)
    ttst_s: float | None = None  # second content response - first
    first_chunk_tokens: int = 1  # tokens of the first content response (a speculative round: several)
    prompt_tokens: int | None = None  # the server's count (num_input_tokens)
    start_ns: int = 0  # wall clock (time.time_ns) at send, and at the last response
    end_ns: int = 0
    worker: int = 0  # the bench worker (one connection each) that sent it
    kv_cache: dict[str, int] = field(default_factory=dict)  # the server's kv_cache_* / draft_kv_cache_*

    @property
    def itl_s(self) -> float | None:
        if self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)

    @property
    def itl_aiperf_s(self) -> float | None:
        """AIPerf 0.13.0's inter_token_latency with per-chunk usage: (latency - TTFT) / (output tokens -
        tokens of the first chunk); None when nothing follows the first chunk."""
        rest = self.output_tokens - self.first_chunk_tokens
        return (self.latency_s - self.ttft_s) / rest if rest > 0 else None


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return float("nan")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summarize(values: list[float], scale: float = 1.0) -> dict[str, float]:
    """avg, p50, p90, p99 of `values` times `scale` (1000: seconds -> ms)."""
    if not values:
        return {k: float("nan") for k in STATS}
    scaled = [v * scale for v in values]
    return {
        "avg": sum(scaled) / len(scaled),
        "p50": percentile(scaled, 50),
        "p90": percentile(scaled, 90),
        "p99": percentile(scaled, 99),
    }


def accepted_length_per_position(steps: list[int], k: int) -> list[float]:
    """[k]: fraction of verification steps whose first i+1 drafts were all accepted."""
    if not steps or k <= 0:
        return []
    return [sum(1 for s in steps if s > i) / len(steps) for i in range(k)]


@dataclass
class RunSummary:
    """One (mode, temperature, concurrency) run."""

    mode: str  # baseline | speculative
    temperature: float
    concurrency: int
    num_draft_tokens: int
    requests: int
    duration_s: float
    metrics: dict[str, Any] = field(default_factory=dict)
    records: list[RequestRecord] = field(default_factory=list, repr=False)  # per request (the exports)

    def row(self) -> dict[str, Any]:
        """Flat record for CSV: name_stat columns."""
        flat: dict[str, Any] = {
            "mode": self.mode,
            "temperature": self.temperature,
            "concurrency": self.concurrency,
            "num_draft_tokens": self.num_draft_tokens,
            "requests": self.requests,
            "duration_s": round(self.duration_s, 4),
        }
        for key, value in self.metrics.items():
            if isinstance(value, dict):
                if all(not isinstance(v, dict | list) for v in value.values()):  # statistics: name_stat
                    flat.update({f"{key}_{s}": v for s, v in value.items()})
            elif not isinstance(value, list):
                flat[key] = value
        return flat


def summarize_run(
    records: list[RequestRecord],
    *,
    mode: str,
    temperature: float,
    concurrency: int,
    num_draft_tokens: int,
    duration_s: float,
    rounds_known: bool = True,
) -> RunSummary:
    """rounds_known False (n-gram: a round drafts 0..K tokens, not what the client can rebuild): no alpha
    and so no predicted speedup; acceptance_rate (the server's counts) and tokens per pass stay exact."""
    tokens = sum(r.output_tokens for r in records)
    metrics: dict[str, Any] = {
        "time_to_first_token": summarize([r.ttft_s for r in records], 1000.0),
        "inter_token_latency": summarize([r.itl_s for r in records if r.itl_s is not None], 1000.0),
        "request_latency": summarize([r.latency_s for r in records], 1000.0),
        "output_sequence_length": summarize([float(r.output_tokens) for r in records]),
        "output_token_throughput": tokens / duration_s if duration_s > 0 else float("nan"),
        "request_throughput": len(records) / duration_s if duration_s > 0 else float("nan"),
    }
    if mode == "speculative":
        drafted = sum(r.drafted for r in records)
        accepted = sum(r.accepted for r in records)
        passes = sum(r.target_passes for r in records)
        steps = [s for r in records for s in r.accepted_per_step]
        # an engine that speculates by itself (Medusa) has no K per request: the deepest accepted path
        # stands in for the tree depth, and every step is taken to have offered that many drafts
        num_draft_tokens = num_draft_tokens or max(steps, default=0)
        rounds = [r for rec in records for r in rec.rounds] or [(s, num_draft_tokens) for s in steps]
        metrics["acceptance_rate"] = accepted / drafted if drafted else float("nan")
        known = rounds and rounds_known
        metrics["alpha"] = theory.alpha(*theory.positions_from_rounds(rounds)) if known else float("nan")
        metrics["mean_accepted_tokens_per_pass"] = tokens / passes if passes else float("nan")
        metrics["accepted_length_per_position"] = accepted_length_per_position(steps, num_draft_tokens)
    return RunSummary(mode, temperature, concurrency, num_draft_tokens, len(records), duration_s, metrics)


def attach_speedups(runs: list[RunSummary], *, cost_ratio: float | None) -> None:
    """Measured speedup (throughput vs the baseline at the same T and concurrency) and predicted speedup."""
    base = {(r.temperature, r.concurrency): r for r in runs if r.mode == "baseline"}
    unary = {(r.temperature, r.concurrency): r for r in runs if r.mode == UNARY_BASELINE}
    for run in runs:
        if run.mode != "speculative":
            continue
        ref = base.get((run.temperature, run.concurrency))
        if ref is not None and ref.metrics["output_token_throughput"] > 0:
            run.metrics["speedup_measured"] = (
                run.metrics["output_token_throughput"] / ref.metrics["output_token_throughput"]
            )
        # against the target alone in one call per request (no per-token BLS -> target call)
        ref = unary.get((run.temperature, run.concurrency))
        if ref is not None and ref.metrics["output_token_throughput"] > 0:
            run.metrics["speedup_measured_vs_unary"] = (
                run.metrics["output_token_throughput"] / ref.metrics["output_token_throughput"]
            )
        alpha = run.metrics.get("alpha", float("nan"))
        if cost_ratio is not None and alpha == alpha:  # not NaN
            run.metrics["cost_ratio"] = cost_ratio
            run.metrics["speedup_predicted"] = theory.predicted_speedup(
                alpha, run.num_draft_tokens, cost_ratio
            )
