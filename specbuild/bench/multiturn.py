"""`bench --workload multiturn`: conversations whose turns extend the previous context, after one shared
system prompt, and the prefix reuse the server reports for them.

Conversation c, turn t sends `system + (User: u_i / Assistant: a_i for the earlier turns) + User: u_t /
Assistant:` where the a_i are the server's own answers, so every turn's prompt starts with the whole
previous request (prompt + answer) and every conversation starts with the system prompt. The user turns
are the bench prompts, in order. A worker (one connection) runs one conversation at a time, its turns in
order; `--concurrency` conversations run at once.

Reuse: with return_perf_metrics the BLS returns, per request, the KV-cache figures of each engine's first
call (the prompt's prefill): `kv_cache_reused_blocks` / `kv_cache_alloc_total_blocks` of the target and
`draft_kv_cache_*` of the draft (blocks of the backend's tokens_per_block), as the TensorRT-LLM backend
reports kv_cache_reused_blocks per request. The summary gives reused / allocated blocks per engine and
per turn index; `compare_reuse` states whether speculation reduced the target's reuse, and by how much.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from specbuild.bench.metrics import RequestRecord, RunSummary, summarize_run
from specbuild.bench.options import BenchConfig
from specbuild.bench.workers import Workers, send

TURN = "\nUser: {user}\nAssistant:"


def user_turns(prompts: tuple[str, ...], conversations: int, turns: int) -> list[list[str]]:
    """[conversation][turn] -> the user's text (the prompts in order, cycling)."""
    return [[prompts[(c * turns + t) % len(prompts)] for t in range(turns)] for c in range(conversations)]


def render(system: str, history: list[tuple[str, str]], user: str) -> str:
    """The prompt of one turn: the system prompt, the earlier turns with their answers, the new turn."""
    return system + "".join(TURN.format(user=u) + a for u, a in history) + TURN.format(user=user)


def _figures(records: list[tuple[int, RequestRecord]], prefix: str) -> dict[str, Any] | None:
    key = f"{prefix}kv_cache_reused_blocks"
    rows = [(t, r) for t, r in records if key in r.kv_cache]
    if not rows:
        return None
    reused = sum(r.kv_cache[key] for _, r in rows)
    total = sum(r.kv_cache.get(f"{prefix}kv_cache_alloc_total_blocks", 0) for _, r in rows)
    by_turn: dict[int, list[int]] = {}
    for t, r in rows:
        by_turn.setdefault(t, []).append(r.kv_cache[key])
    return {
        "reused_blocks": reused,
        "alloc_total_blocks": total,
        "reuse_ratio": reused / total if total else 0.0,
        "reused_blocks_by_turn": {str(t): sum(v) for t, v in sorted(by_turn.items())},
    }


def reuse_summary(records: list[tuple[int, RequestRecord]]) -> dict[str, Any]:
    """Prefix reuse of one run: (turn index, record) of every request."""
    return {
        "requests": len(records),
        "prompt_tokens": sum(r.prompt_tokens or 0 for _, r in records),
        "target": _figures(records, ""),
        "draft": _figures(records, "draft_"),
    }


def run_multiturn(
    config: BenchConfig,
    *,
    mode: str,
    temperature: float,
    concurrency: int,
    k: int | None,
    advance: Callable[[], None],
    stats_k: int | None = None,
    rounds_known: bool = True,
) -> RunSummary:
    """Every conversation once, `concurrency` at a time; duration = first send to last answer. k, stats_k:
    as workers.send."""
    lock = threading.Lock()
    workers = Workers(config.url, concurrency)
    conversations = user_turns(config.prompts, config.conversations, config.turns)

    def converse(item: tuple[int, list[str]]) -> list[tuple[int, RequestRecord]]:
        index, users = item
        history: list[tuple[str, str]] = []
        out = []
        for t, user in enumerate(users):
            prompt = render(config.system_prompt, history, user)
            record, result = send(
                workers,
                config,
                prompt,
                index * config.turns + t,
                temperature=temperature,
                k=k,
                stats_k=stats_k,
                rounds_known=rounds_known,
            )
            history.append((user, result.text))
            out.append((t, record))
            with lock:
                advance()
        return out

    try:
        t0 = time.monotonic()
        turns = [row for rows in workers.map(converse, enumerate(conversations)) for row in rows]
        duration = time.monotonic() - t0
    finally:
        connections = workers.opened
        workers.close()
    records = [r for _, r in turns]
    run = summarize_run(
        records,
        mode=mode,
        temperature=temperature,
        concurrency=concurrency,
        num_draft_tokens=(k if stats_k is None else stats_k) or 0,
        duration_s=duration,
        rounds_known=rounds_known,
    )
    run.records = records
    run.metrics["connections"] = connections
    run.metrics["prefix_reuse"] = reuse_summary(turns)
    return run


def compare_reuse(runs: list[RunSummary]) -> list[dict[str, Any]]:
    """Per (temperature, concurrency): the target's reused blocks with speculation off and on, and the
    change; the draft's reuse (it runs only with speculation on)."""
    base = {(r.temperature, r.concurrency): r for r in runs if r.mode == "baseline"}
    out = []
    for run in runs:
        ref = base.get((run.temperature, run.concurrency))
        reuse = run.metrics.get("prefix_reuse")
        if run.mode != "speculative" or ref is None or reuse is None:
            continue
        on, off = reuse["target"] or {}, ref.metrics["prefix_reuse"]["target"] or {}
        a, b = off.get("reused_blocks", 0), on.get("reused_blocks", 0)
        change = (b - a) / a if a else None
        verdict = (
            "no reuse to compare"
            if not a and not b
            else "speculation reduced the target's prefix reuse"
            if b < a
            else "speculation did not reduce the target's prefix reuse"
        )
        row = {
            "temperature": run.temperature,
            "concurrency": run.concurrency,
            "target_reused_blocks_off": a,
            "target_reused_blocks_on": b,
            "target_reuse_ratio_off": off.get("reuse_ratio"),
            "target_reuse_ratio_on": on.get("reuse_ratio"),
            "change": change,
            "draft_reused_blocks_on": (reuse["draft"] or {}).get("reused_blocks"),
            "draft_reuse_ratio_on": (reuse["draft"] or {}).get("reuse_ratio"),
            "verdict": verdict + (f" ({change:+.1%} reused blocks)" if change is not None else ""),
        }
        run.metrics["prefix_reuse_vs_baseline"] = row
        out.append(row)
    return out
