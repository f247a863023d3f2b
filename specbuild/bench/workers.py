"""Bench workers: a thread pool whose threads each own one connection (`Session`), and one request
through it turned into a RequestRecord (bench.py and multiturn.py send through these)."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from specbuild.bench.metrics import RequestRecord
from specbuild.bench.options import BenchConfig
from specbuild.client.remote import Session
from specbuild.core.generation import GenerationResult
from specbuild.core.perf import theory
from specbuild.core.sampling_params import SamplingParams


class Workers:
    """A thread pool whose threads each own one Session (opened on first use, closed at the end)."""

    def __init__(self, url: str, size: int):
        self.url = url
        self.size = size
        self._local = threading.local()
        self._sessions: list[Session] = []
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def session(self) -> tuple[Session, int]:
        if not hasattr(self._local, "session"):
            session = Session(self.url)
            with self._lock:
                self._sessions.append(session)
                self._local.session, self._local.worker = session, next(self._ids)
        return self._local.session, self._local.worker

    def map(self, task, items):
        with ThreadPoolExecutor(max_workers=self.size) as pool:
            return list(pool.map(task, items))

    @property
    def opened(self) -> int:
        return len(self._sessions)

    def close(self) -> None:
        for session in self._sessions:
            session.close()
        self._sessions.clear()


def record_of(
    result: GenerationResult,
    *,
    k: int | None,
    max_tokens: int,
    start_ns: int,
    worker: int,
    rounds_known: bool = True,
) -> RequestRecord:
    """k: the K the request's rounds were drafted with (None: it did not speculate, or K is unknown);
    rounds_known False: a round drafts 0..K (n-gram), so the rounds are not rebuilt from K."""
    t = result.timings
    stats = result.stats
    if stats.steps:  # exact (accepted, drafted) per round from the server's running totals
        rounds = tuple(stats.steps)
    elif k and rounds_known:
        rounds = tuple(theory.rounds_from_steps(stats.accepted_per_step, k, max_tokens))
    else:
        rounds = ()
    return RequestRecord(
        ttft_s=t.get("ttft", t["total"]),
        latency_s=t["total"],
        output_tokens=len(result.token_ids),
        target_passes=int(t.get("chunks", 0)),
        drafted=stats.drafted,
        accepted=stats.accepted,
        accepted_per_step=tuple(stats.accepted_per_step),
        rounds=rounds,
        ttst_s=t.get("ttst"),
        first_chunk_tokens=int(t.get("first_chunk_tokens", 1)),
        prompt_tokens=result.prompt_tokens,
        start_ns=start_ns,
        end_ns=start_ns + int(t["total"] * 1e9),
        worker=worker,
        kv_cache=dict(result.kv_cache),
    )


def send(
    workers: Workers,
    config: BenchConfig,
    prompt: str,
    index: int,
    *,
    temperature: float,
    k: int | None,
    stream: bool = True,
    stats_k: int | None = None,
    rounds_known: bool = True,
) -> tuple[RequestRecord, GenerationResult]:
    """One request (streamed unless `stream` is false) over the calling worker's session. k: the request's
    num_draft_tokens (None: the engine's own); stats_k: the K its rounds were drafted with when the engine
    drafts by itself (an LLM-API repository's speculative_config.max_draft_len), default k."""
    session, worker = workers.session()
    params = SamplingParams(
        max_tokens=config.max_tokens,
        temperature=temperature,
        seed=config.seed + index if temperature > 0 else None,
    )
    start_ns = time.time_ns()
    result = session.generate(prompt, params, stream=stream, num_draft_tokens=k, timeout_s=config.timeout_s)
    rounds_k = k if stats_k is None else stats_k
    record = record_of(
        result,
        k=rounds_k,
        max_tokens=config.max_tokens,
        start_ns=start_ns,
        worker=worker,
        rounds_known=rounds_known,
    )
    return record, result
