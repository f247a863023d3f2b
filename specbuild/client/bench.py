"""`specbuild bench`: the same prompts with speculation off (target alone) and on, per temperature
and concurrency, through a running tritonserver (streaming requests, as genai-perf measures).

The repository says its method and K (client/remote.py `repo_info`). Baseline: when the BLS runs
the loop (draft/target), the same requests with `num_draft_tokens = 0` (the BLS then calls the target
alone); without --num-draft-tokens the speculative runs use the repository's K (what `tune --write`
chose and `repo` recorded). An engine that speculates by itself (Medusa) has no baseline run here
(measured speedup is left empty; the predicted one is still reported).

Cost ratio c (draft pass / target pass): with a draft model, measured through the same server by
timing the `tensorrt_llm_draft` and `tensorrt_llm` models directly on the first prompt's token ids,
generating n tokens and 1 token each; c = (t_draft(n) - t_draft(1)) / (t_target(n) - t_target(1)),
which cancels the prefill and the request overhead. Without one (Medusa heads ride on the target
pass) c = 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.grpc as grpcclient
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from tritonclient.utils import InferenceServerException

from specbuild.client.load_bench import SCHEDULE_MODE, bench_modes
from specbuild.client.metrics import RequestRecord, RunSummary, attach_speedups, summarize_run
from specbuild.client.options import BenchConfig
from specbuild.client.remote import LLMAPI_INTERFACE, connect, generate_remote, model_info
from specbuild.core import theory
from specbuild.core.errors import ClientError
from specbuild.core.sampling_params import SamplingParams
from specbuild.model_repo.tensors import DRAFT_MODEL, TARGET_MODEL

COST_TOKENS = 16  # tokens generated per timing call when measuring c
COST_REPEATS = 3  # best of N per timing (less noise from other work on the host)


def _one_request(
    config: BenchConfig,
    prompt: str,
    index: int,
    *,
    temperature: float,
    k: int | None,
    stats_k: int | None = None,
    rounds_known: bool = True,
) -> RequestRecord:
    """k: the request's num_draft_tokens (None: the engine's own); stats_k: the K the rounds were drafted with
    (an LLM-API repository's speculative_config.max_draft_len), default k."""
    stats_k = k if stats_k is None else stats_k
    params = SamplingParams(
        max_tokens=config.max_tokens,
        temperature=temperature,
        seed=config.seed + index if temperature > 0 else None,
    )
    result = generate_remote(
        config.url, prompt, params, stream=True, num_draft_tokens=k, timeout_s=config.timeout_s
    )
    t = result.timings
    steps = tuple(result.stats.accepted_per_step)
    return RequestRecord(
        ttft_s=t.get("ttft", t["total"]),
        latency_s=t["total"],
        output_tokens=len(result.token_ids),
        target_passes=int(t.get("chunks", 0)),
        drafted=result.stats.drafted,
        accepted=result.stats.accepted,
        accepted_per_step=steps,
        rounds=tuple(theory.rounds_from_steps(steps, stats_k, config.max_tokens))
        if stats_k and rounds_known
        else (),
    )


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

    def task(item: tuple[int, str]) -> RequestRecord:
        record = _one_request(
            config,
            item[1],
            item[0],
            temperature=temperature,
            k=k,
            stats_k=stats_k,
            rounds_known=rounds_known,
        )
        with lock:
            advance()
        return record

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        records = list(pool.map(task, enumerate(config.prompts)))
    duration = time.monotonic() - t0
    return summarize_run(
        records,
        mode=mode,
        temperature=temperature,
        concurrency=concurrency,
        num_draft_tokens=(k if stats_k is None else stats_k) or 0,
        duration_s=duration,
        rounds_known=rounds_known,
    )


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
            info.interface == LLMAPI_INTERFACE
            and repo.speculation is not None
            and repo.speculation.draft_model
        ):
            cost_ratio = None  # one LLM-API model: the draft cannot be timed alone through this interface
    finally:
        client.close()
    k = config.num_draft_tokens if config.num_draft_tokens is not None else repo.num_draft_tokens
    modes = bench_modes(repo, k, config.fixed_ks)
    plan = [
        (r, t, c, m, mk)
        for r in range(config.rounds)  # interleaved repeats: every mode of a (T, c) runs once per round
        for t in config.temperatures
        for c in config.concurrency
        for m, mk in modes
    ]
    runs: list[RunSummary] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        bar = progress.add_task("bench", total=len(plan) * len(config.prompts))
        for round_, temperature, concurrency, mode, mk in plan:
            progress.update(bar, description=f"{mode:11s} T={temperature:g} c={concurrency}")
            run = run_once(
                config,
                mode=mode,
                temperature=temperature,
                concurrency=concurrency,
                k=mk,
                advance=lambda: progress.advance(bar),
                stats_k=None if repo.bls_drives_loop else (repo.num_draft_tokens or None),
                rounds_known=repo.speculation is None or repo.speculation.drafts_every_round,
            )
            if mode == SCHEDULE_MODE:  # K per round follows the load: labelled with the largest K
                run.num_draft_tokens = repo.num_draft_tokens
            if config.rounds > 1:
                run.metrics["round"] = round_
            runs.append(run)
    attach_speedups(runs, cost_ratio=cost_ratio)
    context = {
        "url": config.url,
        "model": info.name,
        "mode": repo.mode,
        "interface": info.interface,
        "cost_ratio": cost_ratio,
        "cost_ratio_method": "draft-only vs target-only timing"
        if repo.draft_model
        else (
            "LLM-API interface: one model, the draft cannot be timed alone (c unknown)"
            if cost_ratio is None
            else f"{repo.title}: no draft model, c = 0"
        ),
        "prompts": len(config.prompts),
        "max_tokens": config.max_tokens,
        "num_draft_tokens": k if repo.bls_drives_loop else (repo.num_draft_tokens or None),
        "draft_len_schedule": repo.draft_len_schedule or None,
        "rounds": config.rounds,
    }
    return runs, context


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
    best = float("inf")
    for _ in range(COST_REPEATS):
        t0 = time.perf_counter()
        client.infer(model, inputs)
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
