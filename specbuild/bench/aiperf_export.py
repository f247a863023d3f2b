"""`bench`'s records under AIPerf's names, units and shapes, so AIPerf's readers (and people who know
them) read specbuild's figures without a translation table.

Definitions are AIPerf 0.13.0's (aiperf/metrics/types/*.py, read from the PyPI wheel 2026-12); time
metrics are computed from the client's clock and stored in AIPerf's display units (ms, s):

* time_to_first_token (ms): first content response - request start;
* time_to_second_token (ms): second content response - first;
* inter_token_latency (ms): (request_latency - TTFT) / (OSL - tokens of the first content response),
  AIPerf's formula with `--per-chunk-usage` (a speculative round streams several tokens at once);
* request_latency (ms): last content response - request start;
* input_sequence_length, output_sequence_length (tokens): the server's counts (AIPerf
  `--use-server-token-count`);
* output_token_throughput (tokens/sec): sum of OSL / benchmark duration;
* output_token_throughput_per_user (tokens/sec/user): 1 / inter_token_latency per request;
* e2e_output_token_throughput (tokens/sec/user): OSL / request_latency per request;
* prefill_throughput_per_user (tokens/sec/user): ISL / TTFT per request;
* request_throughput (requests/sec), request_count, benchmark_duration (sec, first send to last answer);
* spec_decode_* per request from its SpecDecodeAcceptanceRecord (core/formats/spec_records.py), and pooled
over
  the run: token_weighted_acceptance_length = 1 + sum(accepted) / sum(steps) (ratio),
  overall_draft_acceptance_rate = sum(accepted) / sum(drafted) x 100 (%).
inter_chunk_latency is not recorded (bench keeps no per-chunk times).

A record metric is summarised as AIPerf's JsonMetricResult: {unit, avg, p1, p5, p10, p25, p50, p75, p90,
p95, p99, min, max, std, count, sum}, percentiles linearly interpolated and std the population one
(numpy, ddof 0), as AIPerf's metric_result_from_array; a derived metric has {unit, avg} only.
Per request (`records.jsonl`) the shape of AIPerf's profile_export.jsonl: {"metadata": {...},
"metrics": {tag: {"value", "unit"}}, "spec_decode_acceptance": record or null}.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from specbuild.bench.metrics import RequestRecord, percentile
from specbuild.core.formats.spec_records import aiperf_acceptance_record

AIPERF_VERSION = "0.13.0"  # the release whose definitions these follow
ENGINE = "specbuild"  # SpecDecodeAcceptanceRecord.engine: the served engine is specbuild's
QUANTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)


def metric_result(values: Sequence[float], unit: str) -> dict[str, Any]:
    """AIPerf's JsonMetricResult of a record metric (empty: only the unit)."""
    xs = [float(v) for v in values if v is not None and not math.isnan(v)]
    if not xs:
        return {"unit": unit}
    n = len(xs)
    mean = sum(xs) / n
    out: dict[str, Any] = {"unit": unit, "avg": mean}
    out.update({f"p{q}": percentile(xs, q) for q in QUANTILES})
    out.update(
        min=min(xs),
        max=max(xs),
        std=math.sqrt(sum((x - mean) ** 2 for x in xs) / n),
        count=n,
        sum=sum(xs),
    )
    return out


def _derived(value: float, unit: str) -> dict[str, Any]:
    return {"unit": unit, "avg": value}


def acceptance_record(record: RequestRecord, num_spec_tokens: int | None) -> dict | None:
    return aiperf_acceptance_record(
        record.rounds, num_spec_tokens, engine=ENGINE, completion_tokens=record.output_tokens
    )


def request_metrics(record: RequestRecord) -> dict[str, tuple[float | None, str]]:
    """tag -> (value, unit) of one request (None: AIPerf would record no value)."""
    ms = 1000.0
    itl = record.itl_aiperf_s
    values: dict[str, tuple[float | None, str]] = {
        "time_to_first_token": (record.ttft_s * ms, "ms"),
        "time_to_second_token": (record.ttst_s * ms if record.ttst_s is not None else None, "ms"),
        "inter_token_latency": (itl * ms if itl is not None else None, "ms"),
        "request_latency": (record.latency_s * ms, "ms"),
        "input_sequence_length": (
            float(record.prompt_tokens) if record.prompt_tokens is not None else None,
            "tokens",
        ),
        "output_sequence_length": (float(record.output_tokens), "tokens"),
        "output_token_throughput_per_user": (1.0 / itl if itl else None, "tokens/sec/user"),
        "e2e_output_token_throughput": (
            record.output_tokens / record.latency_s if record.latency_s > 0 else None,
            "tokens/sec/user",
        ),
        "prefill_throughput_per_user": (
            record.prompt_tokens / record.ttft_s if record.prompt_tokens and record.ttft_s > 0 else None,
            "tokens/sec/user",
        ),
    }
    return values


def spec_metrics(spec: dict | None) -> dict[str, tuple[float | None, str]]:
    if spec is None:
        return {}
    steps = spec["num_spec_steps"]
    drafted = spec["num_draft_tokens"]
    return {
        "spec_decode_acceptance_length": (spec["mean_acceptance_length"], "ratio"),
        "spec_decode_draft_acceptance_rate": (spec["draft_acceptance_rate"] * 100.0, "%"),
        "spec_decode_accepted_per_verified": (
            (spec["num_accepted_draft_tokens"] + steps) / (drafted + steps) if drafted + steps else None,
            "ratio",
        ),
        "spec_decode_steps": (float(steps), "count"),
        "spec_decode_accepted_draft_tokens": (float(spec["num_accepted_draft_tokens"]), "tokens"),
        "spec_decode_draft_tokens": (float(drafted), "tokens"),
    }


def run_export(
    records: Sequence[RequestRecord], *, duration_s: float, num_spec_tokens: int | None
) -> dict[str, Any]:
    """One run's summary in AIPerf's profile_export_aiperf.json shape (metric tags at the top level)."""
    per_request = [request_metrics(r) for r in records]
    specs = [acceptance_record(r, num_spec_tokens) for r in records]
    spec_values = [spec_metrics(s) for s in specs]
    out: dict[str, Any] = {"aiperf_version": AIPERF_VERSION}
    tags = dict.fromkeys(t for m in per_request + spec_values for t in m)
    for tag in tags:
        unit = next(m[tag][1] for m in per_request + spec_values if tag in m)
        out[tag] = metric_result([m[tag][0] for m in per_request + spec_values if tag in m], unit)
    total_osl = sum(r.output_tokens for r in records)
    total_isl = sum(r.prompt_tokens or 0 for r in records)
    if duration_s > 0:
        out["output_token_throughput"] = _derived(total_osl / duration_s, "tokens/sec")
        out["total_token_throughput"] = _derived((total_osl + total_isl) / duration_s, "tokens/sec")
        out["request_throughput"] = _derived(len(records) / duration_s, "requests/sec")
    out["benchmark_duration"] = _derived(duration_s, "sec")
    out["request_count"] = _derived(float(len(records)), "requests")
    done = [s for s in specs if s is not None]
    if done:
        steps = sum(s["num_spec_steps"] for s in done)
        accepted = sum(s["num_accepted_draft_tokens"] for s in done)
        drafted = sum(s["num_draft_tokens"] for s in done)
        out["total_spec_decode_steps"] = _derived(float(steps), "count")
        out["total_accepted_draft_tokens"] = _derived(float(accepted), "tokens")
        out["total_draft_tokens"] = _derived(float(drafted), "tokens")
        out["spec_decode_token_weighted_acceptance_length"] = _derived(1.0 + accepted / steps, "ratio")
        out["spec_decode_overall_draft_acceptance_rate"] = _derived(accepted / drafted * 100.0, "%")
        pooled: dict[int, int] = {}
        for s in done:
            for j, n in s["acceptance_histogram"].items():
                pooled[int(j)] = pooled.get(int(j), 0) + n
        out["pooled_spec_decode_acceptance_histogram"] = {str(j): pooled[j] for j in sorted(pooled)}
    return out


def record_lines(
    records: Sequence[RequestRecord], *, run: dict[str, Any], num_spec_tokens: int | None
) -> list[dict[str, Any]]:
    """One AIPerf-shaped per-request record per request (profile_export.jsonl)."""
    lines = []
    for i, r in enumerate(records):
        metrics = {**request_metrics(r)}
        spec = acceptance_record(r, num_spec_tokens)
        metrics.update(spec_metrics(spec))
        lines.append(
            {
                "metadata": {
                    **run,
                    "session_num": i,
                    "request_start_ns": r.start_ns,
                    "request_end_ns": r.end_ns,
                    "worker_id": f"bench-worker-{r.worker}",
                    "benchmark_phase": "profiling",
                },
                "metrics": {
                    tag: {"value": value, "unit": unit}
                    for tag, (value, unit) in metrics.items()
                    if value is not None
                },
                "spec_decode_acceptance": spec,
            }
        )
    return lines
