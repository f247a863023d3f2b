"""bench-serve's measurements (lab/benchmarks/serve.py): the arms (in-process and through Triton, one
prompt at a time, interleaved), the tokens check, Triton's per-model statistics and the BLS's own timers
per round."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import InferenceServerClient

from lab.benchmarks.serve_setup import BenchServeError
from specbuild.client.remote import Session
from specbuild.core.generation import GenerationResult
from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.api import generate_local
from specbuild.engines.reference.engine import ReferenceEngine

MODELS = ("tensorrt_llm_bls", "tensorrt_llm_draft", "tensorrt_llm")  # the BLS round's Triton models
STAT_PARTS = ("queue", "compute_input", "compute_infer", "compute_output")


def triton_stats(url: str) -> dict[str, dict[str, int]]:
    """model -> {calls, success_ns, queue_ns, compute_*_ns}: Triton's cumulative inference statistics."""
    client = InferenceServerClient(url)
    out = {}
    try:
        for model in MODELS:
            stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
            row = {
                "calls": int(stats["success"].get("count", 0)),
                "success_ns": int(stats["success"].get("ns", 0)),
            }
            row.update({f"{part}_ns": int(stats[part].get("ns", 0)) for part in STAT_PARTS})
            out[model] = row
    finally:
        client.close()
    return out


def breakdown(before: dict, after: dict, *, triton_s: float, in_process_s: float) -> dict:
    """Per speculative round (= one target call), in ms: where a Triton round's time goes.

    draft / target: each call's time in Triton (queue + compute: the Python backend's IPC to the model's
    stub, the model code and the engine); bls_rest: the BLS request's time beyond its engine calls
    (its own loop and bookkeeping, BLS -> model IPC not inside the callee's statistics, preprocessing,
    detokenizing, streaming its responses); client_rest: the client's wall time beyond the BLS request
    (gRPC, the frontend); in_process: the same rounds in the in-process engine (no IPC)."""
    d = {m: {key: after[m][key] - before[m].get(key, 0) for key in after[m]} for m in after}
    rounds = max(d["tensorrt_llm"]["calls"], 1)
    ms = 1e-6 / rounds

    def model_ms(m):
        return {part: round(d[m][f"{part}_ns"] * ms, 3) for part in STAT_PARTS} | {
            "total": round(d[m]["success_ns"] * ms, 3),
            "calls_per_round": round(d[m]["calls"] / rounds, 3),
        }

    draft, target = model_ms("tensorrt_llm_draft"), model_ms("tensorrt_llm")
    bls = d["tensorrt_llm_bls"]["success_ns"] * ms
    return {
        "rounds": rounds,
        "triton_round_ms": round(triton_s * 1e3 / rounds, 3),
        "in_process_round_ms": round(in_process_s * 1e3 / rounds, 3),
        "draft": draft,
        "target": target,
        "bls_rest_ms": round(bls - draft["total"] - target["total"], 3),
        "client_rest_ms": round(triton_s * 1e3 / rounds - bls, 3),
    }


@dataclass(frozen=True)
class Arm:
    """One (flow, mode) of the comparison: how each side answers one prompt. k: drafts per round (0: the
    target alone)."""

    flow: str
    mode: str
    k: int
    in_process: Callable[[str], GenerationResult]
    triton: Callable[[str], GenerationResult]


def check_tokens(arm: Arm, side: str, prompt: str, result: GenerationResult, expected: dict) -> None:
    """Greedy: every response of every arm and side is the same tokens as the first one seen for the
    prompt (the engine flow's in-process target alone when that flow runs): speculation is exact, and
    both flows serve the same weights. The first result seen for a prompt becomes its reference."""
    tokens = list(result.token_ids)
    want = expected.setdefault(prompt, (tokens, f"{arm.flow} {arm.mode} {side}"))
    if tokens != want[0]:
        n = next(
            (i for i, (a, b) in enumerate(zip(tokens, want[0], strict=False)) if a != b),
            min(len(tokens), len(want[0])),
        )
        raise BenchServeError(
            f"bench-serve: {arm.flow} {arm.mode} ({side}) answered other tokens than {want[1]} for "
            f"prompt {prompt[:40]!r} (greedy must be identical)",
            expected=f"{len(want[0])} tokens, from position {n}: {want[0][n : n + 8]}",
            found=f"{len(tokens)} tokens, from position {n}: {tokens[n : n + 8]}",
            fix="the two sides do not run the same models or sampling: rebuild OUT (delete it) and rerun",
        )


def run_arm(
    arm: Arm,
    prompts: list[str],
    *,
    repeats: int,
    expected: dict,
    after_warm_up: Callable[[], None] | None = None,
) -> dict:
    """Sequential requests (concurrency 1), in-process and through Triton interleaved prompt by prompt,
    so both see the same load on a shared machine; `repeats` passes over the prompts. Returns
    {in_process|triton: {tokens, seconds, passes: [tokens/s per pass], drafted, rounds}}; checks the
    tokens (check_tokens) and that each side drafted (speculative) or did not (baseline)."""
    sides = {"in_process": arm.in_process, "triton": arm.triton}
    for run in sides.values():  # warm-up both paths
        run(prompts[0])
    if after_warm_up is not None:  # e.g. the statistics before the measured passes
        after_warm_up()
    totals = {side: {"tokens": 0, "seconds": 0.0, "passes": [], "drafted": 0, "rounds": 0} for side in sides}
    for _ in range(repeats):
        done = {side: [0, 0.0] for side in sides}
        for prompt in prompts:
            for side, run in sides.items():
                t0 = time.perf_counter()
                result = run(prompt)
                done[side][1] += time.perf_counter() - t0
                done[side][0] += len(result.token_ids)
                check_tokens(arm, side, prompt, result, expected)
                totals[side]["drafted"] += result.stats.drafted
                totals[side]["rounds"] += result.stats.target_passes
        for side, (tokens, seconds) in done.items():
            totals[side]["tokens"] += tokens
            totals[side]["seconds"] += seconds
            totals[side]["passes"].append(tokens / seconds)
    for side, row in totals.items():
        if (row["drafted"] > 0) != (arm.k > 0):
            raise BenchServeError(
                f"bench-serve: {arm.flow} {arm.mode} ({side}) drafted {row['drafted']} tokens",
                expected="drafts in every speculative run, none in a baseline run",
                found=f"k={arm.k}, drafted={row['drafted']}",
                fix="check the repository's speculation settings (model.yaml / num_draft_tokens)",
            )
    return totals


def summarize(measured: dict) -> dict:
    """Tokens/s per side (median pass), the Triton / in-process ratio (median of the per-pass ratios)."""
    local_passes, triton_passes = measured["in_process"]["passes"], measured["triton"]["passes"]
    ratios = [t / i for t, i in zip(triton_passes, local_passes, strict=True)]
    rounds = max(measured["in_process"]["rounds"], 1)
    return {
        "in_process_tokens_per_s": round(statistics.median(local_passes), 2),
        "triton_tokens_per_s": round(statistics.median(triton_passes), 2),
        "ratio": round(statistics.median(ratios), 3),
        "ratio_per_pass": [round(r, 3) for r in ratios],
        "tokens": measured["in_process"]["tokens"],
        # per round (a target pass in-process; the same rounds through Triton: the tokens are identical)
        "in_process_round_ms": round(measured["in_process"]["seconds"] * 1e3 / rounds, 3),
        "triton_round_ms": round(measured["triton"]["seconds"] * 1e3 / rounds, 3),
    }


def local_side(engine: ReferenceEngine, params: SamplingParams, k: int) -> Callable[[str], GenerationResult]:
    def run(prompt: str) -> GenerationResult:
        return generate_local(engine, prompt, params, speculative=k > 0, num_draft_tokens=k if k else None)

    return run


def engine_arms(engine: ReferenceEngine, session: Session, params: SamplingParams, k: int) -> list[Arm]:
    """The engine flow: the BLS with num_draft_tokens 0 (the target alone, streamed) and K."""

    def remote(drafts: int):
        return lambda prompt: session.generate(
            prompt, params, num_draft_tokens=drafts, stream=True, timeout_s=300
        )

    return [
        Arm("engine", mode, drafts, local_side(engine, params, drafts), remote(drafts))
        for mode, drafts in (("baseline", 0), ("speculative", k))
    ]


def read_bls_timings(folder: Path) -> list[dict]:
    """The BLS's per-request timers (model.py, SPECBUILD_BLS_TIMINGS): one JSON object a line per file."""
    rows = []
    for path in sorted(folder.glob("bls-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def bls_breakdown(rows: list[dict], *, rounds: int, engine_ms: dict[str, float]) -> dict:
    """Per round (ms), from the BLS's own timers: its engine calls as the BLS waits for them (exec, by
    model) and beyond the callee's Triton time (the BLS-side hop), the streamed responses, the
    cancellation asks, and the BLS's own code (everything else inside the request)."""
    rounds = max(rounds, 1)
    total = sum(r["handle_ns"] for r in rows)
    execs: dict[str, int] = {}
    for r in rows:
        for model, ns in r["exec_ns"].items():
            execs[model] = execs.get(model, 0) + ns
    send, ask = sum(r["send_ns"] for r in rows), sum(r["ask_ns"] for r in rows)
    own = total - sum(execs.values()) - send - ask
    out = {
        "requests": len(rows),
        "handle_ms": round(total / 1e6 / rounds, 3),
        "exec_ms": {m: round(ns / 1e6 / rounds, 3) for m, ns in sorted(execs.items())},
        "sends_per_round": round(sum(r["sends"] for r in rows) / rounds, 3),
        "send_ms": round(send / 1e6 / rounds, 3),
        "asks_per_round": round(sum(r["asks"] for r in rows) / rounds, 3),
        "ask_ms": round(ask / 1e6 / rounds, 3),
        "own_code_ms": round(own / 1e6 / rounds, 3),
    }
    # a callee that returns from execute at once and answers from its own thread (the step-scheduled
    # local engine model) is not timed by Triton's statistics: then the hops below mean nothing
    out["statistics_time_the_calls"] = all(
        engine_ms[m] >= 0.5 * out["exec_ms"].get(model, 0.0)
        for m, model in (("draft", "tensorrt_llm_draft"), ("target", "tensorrt_llm"))
    )
    out["hop_ms"] = {
        m: round(out["exec_ms"].get(model, 0.0) - ms, 3)
        for m, (model, ms) in {
            "draft": ("tensorrt_llm_draft", engine_ms["draft"]),
            "target": ("tensorrt_llm", engine_ms["target"]),
        }.items()
    }
    return out
