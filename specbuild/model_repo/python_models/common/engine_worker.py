"""What both local engine models (tensorrt_llm_local: the C++ backend's interface; tensorrt_llm_llmapi_local:
the
LLM-API model's) share: the decoupled worker that runs the requests `execute` handed over, the registry
of running requests that `stop` requests name, and the per-request timing and KV-block counters of
their perf outputs (each model spells those outputs its own way: local_core.Perf, llmapi_core.Perf).

Plain Python (no Triton, no torch): copied into every model folder like responder.py and words.py
(model_repo/generate.py copies python_models/common/*.py), unit-tested directly.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class Scheduler(Protocol):
    """What an EngineWorker drives, step by step (in-flight batching)."""

    def admit(self, jobs: list) -> None:
        """Take new jobs (they start now: a plain request's prefill runs here)."""

    def step(self) -> list:
        """Run one step of everything admitted; return the jobs that ended in it (each is answered now)."""

    def active(self) -> int:
        """Jobs admitted and not ended yet (they count against max_batch)."""

    def drain(self) -> list:
        """Stop every running job where it is; return them (the caller answers them)."""


class WholeJobs:
    """The Scheduler of a `run(jobs)` that generates its jobs to the end in one call: each step runs
    every admitted job to completion (no job joins a running batch)."""

    def __init__(self, run: Callable[[list], None]):
        self._run, self._jobs = run, []

    def admit(self, jobs: list) -> None:
        self._jobs += jobs

    def step(self) -> list:
        jobs, self._jobs = self._jobs, []
        if jobs:
            self._run(jobs)
        return jobs

    def active(self) -> int:
        return len(self._jobs)

    def drain(self) -> list:
        jobs, self._jobs = self._jobs, []
        return jobs


class EngineWorker:
    """One thread that runs the waiting jobs, up to `max_batch` of them together, until close().

    Step by step, as TensorRT-LLM's batch manager: before every step it admits waiting jobs while
    fewer than max_batch run (so a request arriving while others run joins at the next step), then
    runs one step of the scheduler and sends the final response of every job that ended in it at once
    (finish(job)), not when the longest job of its batch ends. `run(jobs)` instead of a scheduler:
    jobs run to completion in one call (WholeJobs). `submit` returns at once, so `execute` reads later
    requests (new ones, and `stop` requests for running ones) while the engine works, as the C++
    backend's enqueue does."""

    def __init__(
        self,
        name: str,
        max_batch: int,
        run: Callable[[list], None] | None = None,
        finish: Callable[[object], None] | None = None,
        *,
        scheduler: Scheduler | None = None,
    ):
        if (run is None) == (scheduler is None) or finish is None:
            raise ValueError("EngineWorker takes finish and one of run / scheduler")
        self.max_batch = max(1, int(max_batch))
        self._sched = scheduler if scheduler is not None else WholeJobs(run)
        self._finish = finish
        self._pending: list = []  # read, not started yet
        self._wake = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, jobs: list) -> None:
        if not jobs:
            return
        with self._wake:
            self._pending += jobs
            self._wake.notify()

    def close(self, timeout_s: float = 10.0) -> list:
        """Stop after the running step; returns the jobs that never ended (never started, or stopped
        where they were): the caller answers them."""
        with self._wake:
            self._closing = True
            left, self._pending = self._pending, []
            self._wake.notify()
        self._thread.join(timeout=timeout_s)
        return left + (self._sched.drain() if not self._thread.is_alive() else [])

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self._sched.active() and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
                room = max(0, self.max_batch - self._sched.active())
                new, self._pending = self._pending[:room], self._pending[room:]
            if new:
                self._sched.admit(new)
            for job in self._sched.step():
                self._finish(job)


class Outbox:
    """One thread that runs what is put on it (a response to build and send: a callable), in the order put.

    The engine thread puts a streamed step's response here and goes on with the next step, so that
    building the response (detokenizing, the output tensors) and its IPC (the Python backend's
    cancellation ask and send, each a round trip from the stub to the
    server) overlap the engine's next step instead of
    adding to it. One FIFO for all requests: a request's responses, its final one last, go out in the
    order the engine produced them. A callable that raises is reported through `on_error` and the outbox
    goes on. `close` runs what was put before it, then stops the thread; what is put after close runs on
    the caller's thread (never dropped)."""

    _STOP = object()

    def __init__(self, name: str, on_error: Callable[[BaseException], None] | None = None):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._on_error = on_error
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def put(self, send: Callable[[], None]) -> None:
        if self._closed:  # after close (model unloading): run it here, never drop a response
            self._run(send)
            return
        self._queue.put(send)

    def close(self, timeout_s: float = 10.0) -> bool:
        """Run everything put so far, then stop; False if the thread did not end within timeout_s."""
        if not self._closed:
            self._closed = True
            self._queue.put(self._STOP)
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()

    def _run(self, send: Callable[[], None]) -> None:
        try:
            send()
        except BaseException as exc:  # noqa: BLE001 - one failed response never stops the others
            if self._on_error is not None:
                self._on_error(exc)

    def _loop(self) -> None:
        while True:
            send = self._queue.get()
            if send is self._STOP:
                return
            self._run(send)


class ActiveRequests:
    """Request id -> its running jobs, for `stop` requests (several jobs may share an id)."""

    def __init__(self):
        self._jobs: dict[str, list] = {}
        self._lock = threading.Lock()

    def add(self, request_id: str, job) -> None:
        if request_id:
            with self._lock:
                self._jobs.setdefault(request_id, []).append(job)

    def named(self, request_id: str) -> list:
        """The running jobs with this id (a copy: the caller marks them)."""
        with self._lock:
            return list(self._jobs.get(request_id, []))

    def remove(self, request_id: str, job) -> None:
        with self._lock:
            same = self._jobs.get(request_id, [])
            same[:] = [j for j in same if j is not job]
            if not same:
                self._jobs.pop(request_id, None)


@dataclass
class RequestCounters:
    """One request's times and counters behind its perf outputs (times: time.time_ns())."""

    arrival_ns: int
    scheduled_ns: int = 0  # when its generation started (0: arrival)
    first_token_ns: int = 0
    last_token_ns: int = 0
    accepted: int = 0  # draft tokens accepted / drafted over the whole request
    drafted: int = 0
    reused_blocks: int = 0  # KV blocks of the prompt found in the prefix cache / newly allocated
    new_blocks: int = 0

    def token(self, now_ns: int | None = None) -> None:
        """A step's tokens were made now (or at now_ns: the engine's clock, time.time_ns())."""
        now = time.time_ns() if now_ns is None else now_ns
        self.first_token_ns = self.first_token_ns or now
        self.last_token_ns = now

    def scheduled(self) -> None:
        self.scheduled_ns = self.scheduled_ns or time.time_ns()

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    def blocks(self, *, reused_tokens: int, total_tokens: int, tokens_per_block: int) -> None:
        """KV blocks of a finished request: whole reused blocks, and the rest of its sequence's blocks."""
        self.reused_blocks = reused_tokens // tokens_per_block
        self.new_blocks = max(0, -(-total_tokens // tokens_per_block) - self.reused_blocks)
