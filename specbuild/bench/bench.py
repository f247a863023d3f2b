"""`specbuild bench`: the same prompts with speculation off (target alone) and on, per temperature
and concurrency, through a running tritonserver (streaming requests, as genai-perf / AIPerf measure).

The repository says its method and K (client/remote.py `repo_info`, or the LLM-API model's parameters
through that interface: `llmapi_repo_info`). Baseline: when the BLS runs
the loop (draft/target), the same requests with `num_draft_tokens = 0` (the BLS then streams the target
alone, token by token); without --num-draft-tokens the speculative runs use the repository's K (what
`tune --write` chose and `repo` recorded). An engine that speculates by itself (Medusa) has no baseline
run here (measured speedup is left empty; the predicted one is still reported).

Connections: each worker thread opens one `Session` (one gRPC channel, the model's description read
once) and sends its requests over it; nothing reconnects per request.

Cost ratio c (draft pass / target pass): with a draft model, measured through the same server by
timing the `tensorrt_llm_draft` and `tensorrt_llm` models directly on the first prompt's token ids,
generating n tokens and 1 token each; c = (t_draft(n) - t_draft(1)) / (t_target(n) - t_target(1)),
which cancels the prefill and the request overhead. Without one (Medusa heads ride on the target
pass) c = 0.

Workloads: `single` (every prompt once per run) and `multiturn` (bench/multiturn.py: conversations
whose turns extend the previous context after a shared system prompt; the server's KV-cache figures
give the prefix reuse of the target and of the draft).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import tritonclient.grpc as grpcclient
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from tritonclient.utils import InferenceServerException

from specbuild.bench.cost_model import calibrate, predicted_tokens_per_s, with_rounds_of
from specbuild.bench.load_bench import (
    BASELINE_MODE,
    SCHEDULE_MODE,
    bench_modes,
    load_summary,
    undecided_points,
)
from specbuild.bench.metrics import (
    UNARY_BASELINE,
    UNARY_BASELINE_AGAIN,
    UNARY_MODES,
    UNARY_SCHEDULE,
    RequestRecord,
    RunSummary,
    attach_speedups,
    summarize_run,
)
from specbuild.bench.multiturn import run_multiturn
from specbuild.bench.options import BenchConfig, run_prompts
from specbuild.bench.prometheus import quiet_scrape, settled_check
from specbuild.bench.workers import Workers, send
from specbuild.client.remote import connect, model_info
from specbuild.core.errors import ClientError
from specbuild.core.perf.schedule_choice import round_order
from specbuild.model_repo.tensors import DRAFT_MODEL, TARGET_MODEL

COST_TOKENS = 16  # tokens generated per timing call when measuring c
COST_REPEATS = 3  # best of N per timing (less noise from other work on the host)


def run_once(
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
    """All prompts at one concurrency; duration = first send to last answer."""
    lock = threading.Lock()
    workers = Workers(config.url, concurrency)

    stream = mode not in UNARY_MODES

    def task(item: tuple[int, str]) -> RequestRecord:
        record, _ = send(
            workers,
            config,
            item[1],
            item[0],
            temperature=temperature,
            k=k,
            stream=stream,
            stats_k=stats_k,
            rounds_known=rounds_known,
        )
        with lock:
            advance()
        return record

    try:
        t0 = time.monotonic()
        records = workers.map(task, enumerate(run_prompts(config.prompts, concurrency, config.waves)))
        duration = time.monotonic() - t0
    finally:
        connections = workers.opened
        workers.close()
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
    return run


def _plan(config: BenchConfig, repo, k: int):
    """(round, T, concurrency, mode, K) of every run. Without a baseline on the same server (the engine
    speculates by itself: Medusa, every LLM-API repository), K is not a request option: speculative runs
    only. Load-aware benches (bench/load_bench.py): every --fixed-k, and `schedule` when the repository
    has one, and with the one-call baseline the schedule in one call as well (`schedule-unary`: a
    streamed schedule pays a response per token that the one-call baseline does not), and with
    --aa-baseline the one-call baseline again at the round's other end (A/A); --rounds repeats
    the plan, every mode of a (T, c) once per round (interleaved, in reverse order every other round)."""
    modes = bench_modes(repo, k, config.fixed_ks)
    if repo.has_baseline and config.unary_baseline and config.workload == "single":
        modes.insert(1, (UNARY_BASELINE, 0))
        if (SCHEDULE_MODE, None) in modes:  # the schedule in one call too: like against like
            modes.append((UNARY_SCHEDULE, None))
        if config.aa_baseline:  # last: round_order puts it at the other end of the round from the first
            modes.append((UNARY_BASELINE_AGAIN, 0))
    if not config.streamed_baseline:
        modes = [(m, kk) for m, kk in modes if m != BASELINE_MODE]
    # the modes of a (T, c) in reverse order every other round (core/perf/schedule_choice.round_order)
    return [
        (r, t, c, m, kk)
        for r in range(config.rounds)
        for t in config.temperatures
        for c in config.concurrency
        for m, kk in round_order(modes, r)
    ]


def _more_rounds(config: BenchConfig, repo, k: int, runs: list[RunSummary], done: int) -> list:
    """The next round's plan, for the (T, c) points whose schedule bars are still undecided by the sign
    test (load_bench.bar_decision) after `done` rounds; empty at --max-rounds or when all are decided."""
    if done >= config.max_rounds:
        return []
    open_points = undecided_points(load_summary(runs))
    plan = _plan(replace(config, rounds=done + 1), repo, k)
    return [p for p in plan if p[0] == done and p[1:3] in open_points]


def run_bench(config: BenchConfig, *, console=None) -> tuple[list[RunSummary], dict]:
    """Every (temperature, concurrency, mode) run with a progress bar; returns runs and context."""
    client = connect(config.url)
    try:
        info = model_info(client, None)
        repo = info.repo
        if not info.token_ids:
            raise ClientError(
                f"the {info.name!r} model answers with text only: bench counts tokens from output_ids",
                expected="a repository from `specbuild repo` (its LLM-API model adds output_ids)",
                found=f"{info.interface} interface outputs: {', '.join(sorted(info.outputs))}",
                fix="bench a specbuild repository, or use trtllm-serve's own benchmark for upstream's model",
            )
        if config.num_draft_tokens is not None and not repo.bls_drives_loop:
            raise ClientError(
                "--num-draft-tokens is for repositories whose BLS drafts per round",
                expected="a draft/target repository with the BLS interface",
                found=f"{repo.title} through the {info.interface} interface (K = the repository's "
                f"{repo.num_draft_tokens})",
                fix="drop --num-draft-tokens",
            )
        cost_ratio = measure_cost_ratio(client, config.prompts[0]) if repo.draft_model else 0.0
        if (
            info.kind.llmapi
            and repo.speculation is not None
            and (repo.speculation.draft_model or repo.chain_after_context)
        ):
            # one LLM-API model: the draft (a draft model, or EAGLE-3's draft layer, one pass per draft
            # token: not free as Medusa's heads) cannot be timed alone through this interface
            cost_ratio = None
    finally:
        client.close()
    k = config.num_draft_tokens if config.num_draft_tokens is not None else repo.num_draft_tokens
    plan = _plan(config, repo, k)
    # an engine that drafts by itself (Medusa, every LLM-API repository): its rounds were drafted with the
    # repository's K (the LLM API's speculative_config.max_draft_len), not a request option
    stats_k = None if repo.bls_drives_loop else (repo.num_draft_tokens or None)
    # every round drafts min(K, tokens left - 1) (EAGLE-3: after the context phase), so a client can rebuild
    # the rounds and alpha predicts the speedup; n-gram: 0..K (records keep the rounds the BLS streams
    # exactly; no i.i.d. prediction)
    rounds_known = repo.speculation is None or repo.speculation.drafts_every_round or repo.chain_after_context

    def per_run(c: int) -> int:
        if config.workload == "multiturn":
            return config.conversations * config.turns
        return len(run_prompts(config.prompts, c, config.waves))

    runs: list[RunSummary] = []

    def one(round_: int, temperature: float, concurrency: int, mode: str, kk: int | None, advance) -> None:
        before = quiet_scrape(config.metrics_url) if config.metrics_url else None
        common = dict(
            mode=mode,
            temperature=temperature,
            concurrency=concurrency,
            k=kk,
            stats_k=stats_k,
            rounds_known=rounds_known,
        )
        if config.workload == "multiturn":
            run = run_multiturn(config, **common, advance=advance)
        else:
            cal_point = None
            if config.calibration_prompts:  # right before the run: the machine's speed of that moment
                cal = run_once(
                    replace(config, prompts=config.calibration_prompts), **common, advance=lambda: None
                )
                cal_point = calibrate(cal)
            run = run_once(config, **common, advance=advance)
            if cal_point is not None:
                run.metrics["predicted_tokens_per_s"] = predicted_tokens_per_s(
                    cal_point, concurrency, per_run(concurrency)
                )
                own = with_rounds_of(cal_point, calibrate(run))  # the cost model alone (cost_model.py)
                if own is not None:
                    run.metrics["predicted_own_rounds_tokens_per_s"] = predicted_tokens_per_s(
                        own, concurrency, per_run(concurrency)
                    )
        if before is not None:
            run.metrics["prometheus_check"] = settled_check(
                config.metrics_url,
                before,
                drafted=sum(r.drafted for r in run.records),
                accepted=sum(r.accepted for r in run.records),
                steps=sum(len(r.rounds) for r in run.records) if repo.bls_drives_loop else None,
            )
        if mode in (SCHEDULE_MODE, UNARY_SCHEDULE):  # K per round follows the load: the largest K
            run.num_draft_tokens = repo.num_draft_tokens
        if config.rounds > 1 or config.max_rounds > 1:
            run.metrics["round"] = round_
        runs.append(run)

    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task("bench", total=sum(per_run(p[2]) for p in plan))
        done_rounds = config.rounds
        while plan:
            for round_, temperature, concurrency, mode, kk in plan:
                progress.update(bar, description=f"{mode:11s} T={temperature:g} c={concurrency} r={round_}")
                one(round_, temperature, concurrency, mode, kk, lambda: progress.advance(bar))
            plan = _more_rounds(config, repo, k, runs, done_rounds)
            if plan:
                done_rounds += 1
                progress.update(bar, total=progress.tasks[0].total + sum(per_run(p[2]) for p in plan))
    attach_speedups(runs, cost_ratio=cost_ratio)
    context = {
        "url": config.url,
        "model": info.name,
        "mode": repo.mode,
        "method": repo.speculation.ecosystem_name if repo.speculation else None,
        "interface": info.interface,
        "workload": config.workload,
        "cost_ratio": cost_ratio,
        "cost_ratio_method": "draft-only vs target-only timing"
        if repo.draft_model
        else (
            "LLM-API interface: one model, the draft cannot be timed alone (c unknown)"
            if cost_ratio is None
            else f"{repo.title}: no draft model, c = 0"
        ),
        "prompts": len(config.prompts),
        "waves": config.waves,  # a run at concurrency c sends max(prompts, waves x c) requests
        "max_tokens": config.max_tokens,
        "num_draft_tokens": k if repo.bls_drives_loop else (repo.num_draft_tokens or None),
        "metrics_url": config.metrics_url,
        "draft_len_schedule": repo.draft_len_schedule or None,
        "rounds": done_rounds,
        "max_rounds": config.max_rounds or config.rounds,
    }
    return runs, context


def _infer(client, model: str, inputs, decoupled: bool) -> None:
    """One request to `model`, to its final response (a decoupled model answers only on a stream)."""
    if not decoupled:
        client.infer(model, inputs)
        return
    done, errors = threading.Event(), []

    def callback(result=None, error=None):
        if error is not None:
            errors.append(error)
            done.set()
        elif result.get_response().parameters["triton_final_response"].bool_param:
            done.set()

    client.start_stream(callback=callback)
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        if not done.wait(120.0):
            raise InferenceServerException(f"no final response from {model} within 120 s")
    finally:
        client.stop_stream()
    if errors:
        raise errors[0]


def _time_generate(client, model: str, ids, n: int) -> float:
    def tensor(name, array):
        t = grpcclient.InferInput(name, list(array.shape), "INT32")
        t.set_data_from_numpy(array)
        return t

    inputs = [
        tensor("input_ids", ids[None, :]),
        tensor("input_lengths", np.array([[len(ids)]], dtype=np.int32)),
        tensor("request_output_len", np.array([[n]], dtype=np.int32)),
    ]
    config = client.get_model_config(model, as_json=True).get("config", {})
    decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
    best = float("inf")
    for _ in range(COST_REPEATS):
        t0 = time.perf_counter()
        _infer(client, model, inputs, decoupled)
        best = min(best, time.perf_counter() - t0)
    return best


def measure_cost_ratio(client, prompt: str) -> float | None:
    """c = draft pass / target pass time, from direct calls to both models (None if unmeasurable)."""
    try:
        q = grpcclient.InferInput("QUERY", [1, 1], "BYTES")
        q.set_data_from_numpy(np.array([[prompt.encode()]], dtype=object))
        n = grpcclient.InferInput("REQUEST_OUTPUT_LEN", [1, 1], "INT32")
        n.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        ids = client.infer("preprocessing", [q, n]).as_numpy("INPUT_ID").reshape(-1).astype(np.int32)  # [L]
        draft = _time_generate(client, DRAFT_MODEL, ids, COST_TOKENS) - _time_generate(
            client, DRAFT_MODEL, ids, 1
        )
        target = _time_generate(client, TARGET_MODEL, ids, COST_TOKENS) - _time_generate(
            client, TARGET_MODEL, ids, 1
        )
    except InferenceServerException:
        return None
    if target <= 0:
        return None
    return max(draft, 0.0) / target
