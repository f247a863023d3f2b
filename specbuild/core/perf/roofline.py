"""A roofline prediction of one replica's decode throughput and latency, for `specbuild plan` when
nothing was measured. Every output built from it is labelled "predicted".

Model (per engine, TP t GPUs; PP stages run one after another, so PP does not shorten a step):
* a decode step over a batch of b sequences, each adding n tokens (n = 1 plain, K + 1 when the target
  verifies K drafts), at mean context L, takes the larger of
    memory:  (weight bytes + b * L * KV bytes per token) / (t * HBM bandwidth * BW_EFFICIENCY)
    compute: 2 * parameters * b * n / (t * dense BF16 FLOP/s * COMPUTE_EFFICIENCY);
* a prefill of P prompt tokens: the larger of one weight read and 2 * parameters * P FLOPs, same
  efficiencies; prefills are counted as time the replica does not decode (no chunked overlap: a
  conservative bound on throughput);
* speculation: a round = K draft steps (its own engine, its own TP) + one target step of K + 1
  tokens and yields E tokens per sequence (core/perf/theory.py: E from alpha, or from the acceptance per
  position); throughput = b * output_len / (output_len / E * round + b * prefills);
* latencies: ITL = round / E (plain: one step); TTFT = one prefill + one step, with no queueing (an
  optimistic bound); request latency = TTFT + (output_len - 1) * ITL.
Not modelled: TP all-reduce time, kernel launch overheads, attention FLOPs, scheduling gaps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from specbuild.core.perf import theory
from specbuild.core.perf.capacity import Point

# Achieved fractions of the datasheet peaks. 0.75 of HBM bandwidth is what tuned decode kernels reach on
# large GEMV-like reads; 0.5 of dense BF16 is a typical model-FLOPs utilisation for batched prefill.
BW_EFFICIENCY = 0.75
COMPUTE_EFFICIENCY = 0.5


@dataclass(frozen=True)
class Gpu:
    key: str
    name: str
    memory_gib: float
    hbm_bytes_per_s: float
    bf16_flops: float  # dense
    price_per_hour: float  # documented default (data/gpus.json source)


@cache
def _gpu_data() -> dict[str, Any]:
    return json.loads(resources.files("specbuild.data").joinpath("gpus.json").read_text())


def gpus() -> dict[str, Gpu]:
    return {
        key: Gpu(
            key,
            g["name"],
            g["memory_gib"],
            g["hbm_tb_s"] * 1e12,
            g["bf16_dense_tflops"] * 1e12,
            g["price_per_hour"],
        )
        for key, g in _gpu_data()["gpus"].items()
    }


def gpu_source() -> dict[str, str]:
    return dict(_gpu_data()["source"])


def gpu_for_memory(memory_gib: float) -> Gpu | None:
    """The listed GPU with this much memory (newest first: 80 GiB is an H100)."""
    found = [g for g in gpus().values() if abs(g.memory_gib - memory_gib) < 0.5]
    order = ("h200", "h100", "a100")
    found.sort(key=lambda g: order.index(g.key) if g.key in order else len(order))
    return found[0] if found else None


@dataclass(frozen=True)
class EngineCost:
    """What a step of one engine reads and computes."""

    parameters: int
    weight_bytes: int  # whole model (all ranks)
    kv_bytes_per_token: int  # whole model, one copy of each KV head
    tp: int

    def step_s(self, gpu: Gpu, batch: int, tokens_per_seq: int, context: float) -> float:
        memory = (self.weight_bytes + batch * context * self.kv_bytes_per_token) / (
            self.tp * gpu.hbm_bytes_per_s * BW_EFFICIENCY
        )
        flops = 2 * self.parameters * batch * tokens_per_seq
        compute = flops / (self.tp * gpu.bf16_flops * COMPUTE_EFFICIENCY)
        return max(memory, compute)

    def prefill_s(self, gpu: Gpu, prompt_tokens: int) -> float:
        return self.step_s(gpu, 1, max(prompt_tokens, 1), prompt_tokens / 2)


def baseline_points(
    target: EngineCost, gpu: Gpu, concurrencies: Sequence[int], *, input_len: int, output_len: int
) -> tuple[Point, ...]:
    ctx = input_len + output_len / 2
    prefill = target.prefill_s(gpu, input_len)
    out = []
    for b in concurrencies:
        step = target.step_s(gpu, b, 1, ctx)
        tps = b * output_len / (output_len * step + b * prefill)
        out.append(_point(b, tps, prefill + step, step, output_len))
    return tuple(out)


def speculative_points(
    target: EngineCost,
    draft: EngineCost | None,
    gpu: Gpu,
    concurrencies: Sequence[int],
    *,
    input_len: int,
    output_len: int,
    k: int,
    tokens_per_pass: float,
    verify_tokens: int | None = None,
) -> tuple[Point, ...]:
    """`draft` None: the target drafts itself (Medusa heads, n-gram lookup: no draft passes);
    `verify_tokens`: tokens per sequence in the verify pass (K + 1, or a Medusa tree's nodes + 1)."""
    ctx = input_len + output_len / 2
    n = verify_tokens or k + 1
    prefill = target.prefill_s(gpu, input_len) + (draft.prefill_s(gpu, input_len) if draft else 0.0)
    out = []
    for b in concurrencies:
        round_s = target.step_s(gpu, b, n, ctx) + (k * draft.step_s(gpu, b, 1, ctx) if draft else 0.0)
        itl = round_s / tokens_per_pass
        tps = b * output_len / (output_len * itl + b * prefill)
        out.append(_point(b, tps, prefill + round_s, itl, output_len))
    return tuple(out)


def predicted_cost_ratio(target: EngineCost, draft: EngineCost, gpu: Gpu, *, context: float) -> float:
    """c = draft step / target step at batch 1 (what the i.i.d. speedup formula takes)."""
    return draft.step_s(gpu, 1, 1, context) / target.step_s(gpu, 1, 1, context)


def tokens_per_pass(*, alpha: float | None, acceptance: Sequence[float] | None, k: int) -> float:
    """E(K): from the acceptance per position when known, else from one alpha (core/perf/theory.py)."""
    if acceptance:
        return theory.tokens_per_pass_chain(acceptance, k)
    assert alpha is not None
    return theory.tokens_per_pass_iid(alpha, k)


def _point(b: int, tps: float, ttft_s: float, itl_s: float, output_len: int) -> Point:
    return Point(
        concurrency=b,
        tokens_per_s=tps,
        ttft_p99_ms=ttft_s * 1e3,
        itl_p99_ms=itl_s * 1e3,
        latency_p99_ms=(ttft_s + (output_len - 1) * itl_s) * 1e3,
    )
