"""The local `tensorrt_llm` model's engine host: the reference engine and its in-flight batching
(step_scheduler.py), run by the engine process (engine_common/engine_host.py: why a process, the protocol,
the lifecycle) as the C++ backend's executor runs its requests: one request a job, rows joining and
leaving the batch at each step.

What this host adds to the common protocol: a job's `req` is local_core.request_to_wire(...); its events
are {"e": "tok", "jid", "new"} for each step's tokens of a streamed request (with return_perf_metrics,
"perf": the request's counters so far, _perf_so_far), {"e": "done", "jid", ...its result: _done_event}
when a request ended, and {"e": "log", "msg"} when one was cancelled or stopped; `stop` and `cancel` name
the request (one row a job).
The same StepHost also runs inside the model's process (host_link.ThreadHost: the `engine_process`
parameter "false"), with the events handed over directly: what the fake-Triton tests drive.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from child_channel import pack_array  # noqa: E402
from engine_worker import EngineWorker  # noqa: E402
from local_core import Job, Perf, cut, request_from_wire  # noqa: E402
from step_scheduler import StepScheduler, plain_k  # noqa: E402
from words import find_stop, stop_at_words  # noqa: E402

from specbuild.core.generation import SpecStats  # noqa: E402
from specbuild.core.perf.schedule import INFLIGHT_HOLD_MS, held_count, record_end  # noqa: E402


class Flags:
    """A running request's end flags on the engine's side (the Triton side asks Triton and says so):
    what the scheduler and the stop hooks read where the in-process model asked its Responder."""

    def __init__(self):
        self.stopped = False  # a `stop` request named it (its outputs so far still go out)
        self.gone = False  # Triton cancelled it (no outputs)

    def ended(self) -> bool:
        return self.stopped or self.gone

    def cancelled(self) -> bool:
        return self.gone


class StepHost:
    """The engine and the requests it runs. `emit(event)` hands each event to the Triton side (a pipe
    write in the engine process; a call in ThreadHost), from the engine's thread."""

    def __init__(
        self,
        engine,
        emit: Callable[[dict], None],
        *,
        name: str = "tensorrt_llm",
        max_batch: int = 1,
        hold_ms: float = INFLIGHT_HOLD_MS,
    ):
        self.engine, self.emit, self.name = engine, emit, name
        self.hold_ms = hold_ms  # the count a request is admitted with stays this long at what it was
        self._jobs: dict[int, Job] = {}  # jid -> a job received and not done (`stop` and `cancel` name jids)
        self._lock = threading.Lock()
        self._holding = 0  # requests received and not done (queued for admission included)
        self._end = (0, 0)  # (last done at ns, holding then): core/perf/schedule.record_end
        self._worker = EngineWorker(
            f"{name}-engine",
            max(1, int(max_batch)),
            finish=self._done,
            scheduler=StepScheduler(
                self,
                tree_k=self._tree_k if engine.speculates else plain_k,
                in_flight=self._in_flight,
            ),
        )

    # ---- commands ---------------------------------------------------------------------------------
    def submit(self, jid: int, wire: dict) -> None:
        req = request_from_wire(wire)
        job = Job(req=req, responder=Flags(), perf=Perf(arrival_ns=req.arrival_ns))
        job.jid = jid
        with self._lock:
            self._jobs[jid] = job
            self._holding += 1
        self._worker.submit([job])

    def stop(self, jid: int, row: int = 0) -> None:  # one row a job
        job = self._jobs.get(jid)
        if job is not None:
            job.responder.stopped = True

    def cancel(self, jid: int, row: int = 0) -> None:
        job = self._jobs.get(jid)
        if job is not None:
            job.responder.gone = True

    def close(self) -> None:
        """Stop after the running step; the jobs that never ended are done with an error."""
        for job in self._worker.close():
            job.error = RuntimeError("the model is being unloaded")
            self._done(job)

    # ---- the schedule -----------------------------------------------------------------------------
    def _in_flight(self) -> int:
        """Requests this engine holds: received and not done (queued for admission, rows, whole jobs), or
        what it held when a request was done less than hold_ms ago if more (core/perf/schedule.held_count: a
        request that replaces one just answered sees the load it replaces)."""
        with self._lock:
            return held_count(self._holding, [self._end], time.monotonic_ns(), self.hold_ms)

    def _tree_k(self, in_flight: int) -> int:
        """K of a request admitted with `in_flight` requests in flight (step_scheduler.py): the repository's
        draft_len_schedule (core/perf/schedule.py), else always the engine's tree (TensorRT-LLM's Medusa
        engines
        cannot switch it off)."""
        schedule = self.engine.schedule
        return self.engine.num_draft_tokens if schedule is None else schedule.k_for(in_flight)

    # ---- a request's end ----------------------------------------------------------------------------
    def _done(self, job: Job) -> None:
        """A job ended (EngineWorker's finish, on the engine's thread): its result to the Triton side."""
        with self._lock:
            self._end = record_end(self._end, self._holding, time.monotonic_ns(), self.hold_ms)
            self._holding -= 1
            self._jobs.pop(job.jid, None)
        self.emit(_done_event(job))

    # ---- what the scheduler calls (step_scheduler.StepScheduler's `model`) ------------------------------
    def _run_jobs(self, jobs: list[Job]) -> None:
        """The one-pass and whole jobs of a step: the verifications in one batched pass, then every other
        job alone, to its end, one after another."""
        # several verifications (the BLS rounds of concurrent requests): one batched target pass
        verify = [j for j in jobs if j.req.draft_ids is not None and not j.req.generation_logits]
        if len(verify) > 1:
            self._run_verify_batch(verify)
        for job in jobs:
            if not job.ran and job.error is None:
                self._run_one(job)

    def _ended(self, job: Job) -> None:
        """Mark the request ended early (cancelled by Triton, or stopped by a `stop` request)."""
        job.cancelled = True

    def _log_end(self, job: Job) -> None:
        how = "cancelled" if job.responder.cancelled() else "stopped"
        self.emit(
            {
                "e": "log",
                "msg": f"{self.name}: request '{job.req.request_id}' {how} after {len(job.tokens)} tokens",
            }
        )

    def _stop_hook(self, job: Job):
        """The engine's stop hook for `job` (speculative.StopHook), asked after every step: a cancelled or
        stopped request keeps what it produced; a multi-token stop word ends it right after the word."""
        words = stop_at_words(job.req.stop_sequences)

        def stop(out: list[int], start: int) -> int | None:
            if job.cancelled or job.responder.ended():
                self._ended(job)
                return len(out)
            if not words:
                return None
            head = job.head  # a row that goes on after its tree: a word may begin in the tree's tokens
            end = words(head + out, len(head) + start)
            return None if end is None else end - len(head)

        return stop

    def _run_one(self, job: Job) -> None:
        before = self.engine.prefix_cache.reused_tokens  # this request's own prefix reuse: its run only
        job.live = (SpecStats(), before)  # what its streamed chunks report while it runs (_on_tokens)
        try:
            self._run(job)
            job.reused_tokens = self.engine.prefix_cache.reused_tokens - before
        except Exception as exc:  # noqa: BLE001 - the request's error response
            job.error = exc
        finally:
            job.live = None
        if job.cancelled:
            self._log_end(job)
        job.ran = True

    def _on_tokens(self, job: Job, new: list[int]) -> None:
        """A step's tokens of `job` (the engine's thread); streamed, they go out now, or once its
        admission ends (a row's first token: job.held, see _admitted)."""
        job.perf.token()
        if job.live is not None:  # a whole job (a tree): its counts so far
            stats, reuse_before = job.live
            job.perf.accepted, job.perf.drafted = stats.accepted, stats.drafted
            job.reused_tokens = self.engine.prefix_cache.reused_tokens - reuse_before
        if job.req.streaming and new and not job.cancelled:
            if job.held is not None:
                job.held += [int(t) for t in new]
            else:
                self._stream(job, [int(t) for t in new])

    def _admitted(self, job: Job, reused_tokens: int | None) -> None:
        """A row's admission ended (step_scheduler._add): its prefix reuse (None: keep what its tree
        reused) and the tokens it held meanwhile go out."""
        if reused_tokens is not None:
            job.reused_tokens = reused_tokens
        held, job.held = job.held, None
        if held and not job.cancelled:
            self._stream(job, held)

    def _stream(self, job: Job, new: list[int]) -> None:
        event = {"e": "tok", "jid": job.jid, "new": new}
        if job.req.perf:
            event["perf"] = _perf_so_far(job)
        self.emit(event)

    def _run_verify_batch(self, jobs: list[Job]) -> None:
        """Verification requests admitted together in one target pass (ReferenceEngine.verify_external_batch:
        rows of their own length, each from its own prefix-cache entry; the same tokens as one by one)."""
        live = [j for j in jobs if not j.responder.ended()]
        for job in jobs:
            if job not in live:  # cancelled while it waited
                self._ended(job)
                job.ran = True
        if not live:
            return
        for job in live:
            job.perf.token()
        try:
            results = self.engine.verify_external_batch(
                [j.req.prompt_ids for j in live],
                [j.req.draft_ids for j in live],
                [j.req.draft_logits for j in live],
                params=[j.req.params for j in live],
            )
        except Exception as exc:  # noqa: BLE001 - every request of the pass gets the error
            for job in live:
                job.error, job.ran = exc, True
            return
        for job, (tokens, reused) in zip(live, results, strict=True):
            self._verified(job, tokens)
            job.reused_tokens, job.ran = reused, True

    def _verified(self, job: Job, tokens: list[int]) -> None:
        """Record a verification's result: the accepted drafts + one target token, cut like the backend."""
        req, perf = job.req, job.perf
        tokens = cut(tokens, req.params, req.max_new)
        end = find_stop(tokens, req.stop_sequences) if req.stop_sequences else None
        job.tokens = tokens[:end] if end is not None else tokens
        perf.token()
        perf.drafted = len(req.draft_ids)
        perf.accepted = min(max(0, len(job.tokens) - 1), perf.drafted)
        job.steps = [(perf.accepted, perf.drafted)]

    def _pausing(self, job: Job, stop):
        """A tree request's stop hook under a schedule: after each tree step, once the requests in flight
        have the schedule's K at 0, the tree stops there (job.paused) and the request goes on as a plain
        row (step_scheduler.py); it never goes back to the tree."""

        def pausing(out: list[int], start: int) -> int | None:
            end = stop(out, start)
            if end is None and self._tree_k(self._in_flight()) == 0:
                job.paused = True
                return len(out)
            return end

        return pausing

    def _run(self, job: Job) -> Job:
        req, perf = job.req, job.perf
        if job.responder.ended():  # cancelled while it waited
            self._ended(job)
            return job
        if req.draft_ids is not None:
            perf.token()
            tokens = self.engine.verify_external(
                req.prompt_ids, req.draft_ids, req.draft_logits, params=req.params
            )
            self._verified(job, tokens)
            return job
        stop = self._stop_hook(job)
        if not req.generation_logits and self.engine.schedule is not None:
            stop = self._pausing(job, stop)
        on_tokens = lambda new: self._on_tokens(job, new)  # noqa: E731
        if req.generation_logits:
            result, logits = self.engine.generate_with_logits(
                req.prompt_ids, req.params, on_tokens=on_tokens, stop=stop
            )
            job.extra["generation_logits"] = logits.float().numpy()[None, None]  # [1, 1, n, V]
        else:
            result = self.engine.generate(
                req.prompt_ids,
                req.params,
                speculative=True,
                on_tokens=on_tokens,
                stop=stop,
                stats=job.live[0] if job.live is not None else None,
            )
        job.tokens = result.token_ids
        perf.accepted, perf.drafted = result.stats.accepted, result.stats.drafted
        job.steps = result.stats.steps
        return job


def _done_event(job: Job) -> dict:
    """A job's result as the Triton side reads it (host_link.apply_done)."""
    perf = job.perf
    return {
        "e": "done",
        "jid": job.jid,
        "tokens": [int(t) for t in job.tokens],
        "cancelled": job.cancelled,
        "error": None if job.error is None else f"{job.error}",
        "reused_tokens": int(job.reused_tokens),
        "steps": [[int(a), int(d)] for a, d in job.steps],
        "accepted": int(perf.accepted),
        "drafted": int(perf.drafted),
        "scheduled_ns": perf.scheduled_ns,
        "first_token_ns": perf.first_token_ns,
        "last_token_ns": perf.last_token_ns,
        "extra": {name: pack_array(value) for name, value in job.extra.items()},
    }


def _perf_so_far(job: Job) -> dict:
    """The counters behind a streamed chunk's perf outputs (the model adds the tokens streamed so far):
    the C++ backend fills every perf output on every response, with the request's figures so far
    (model_instance_state.cc fillTritonResponse; TensorRT-LLM's LlmRequest::createResult hands each
    streamed result the request's perf metrics)."""
    perf = job.perf
    return {
        "accepted": int(perf.accepted),
        "drafted": int(perf.drafted),
        "reused_tokens": int(job.reused_tokens),
        "scheduled_ns": perf.scheduled_ns,
        "first_token_ns": perf.first_token_ns,
        "last_token_ns": perf.last_token_ns,
    }


def make_host(engine, emit: Callable[[dict], None], options: dict) -> StepHost:
    """The host engine_common/engine_host.py runs for this model (options: host_link.host_options)."""
    return StepHost(
        engine,
        emit,
        name=options.get("name", "tensorrt_llm"),
        max_batch=int(options.get("max_batch", 1)),
        hold_ms=float(options.get("hold_ms", INFLIGHT_HOLD_MS)),
    )
