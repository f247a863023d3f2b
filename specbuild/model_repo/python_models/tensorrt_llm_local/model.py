"""Triton Python model standing in for the C++ `tensorrt_llm` backend: runs specbuild's reference engine.

Same tensor interface as the C++ backend (config.pbtxt from specbuild.model_repo.tensors), so the
ensemble, pre/postprocessing and BLS are identical in local and production repositories. Loads
`gpt_model_path` (a reference engine folder) with ReferenceEngine; `medusa_choices` (backend form)
selects the Medusa tree. What each input does: local_core.py.

* scheduling, per step as TensorRT-LLM's batch manager (in-flight batching): `execute` only reads the
  requests and hands them to one worker thread (engine_worker.EngineWorker), so it returns at once
  and later requests (new ones, and `stop` requests for running ones) are read while the engine works,
  as the C++ backend's enqueue is. Before every step the worker admits waiting requests while fewer
  than max_batch_size run (step_scheduler.StepScheduler): a plain request becomes a row of the engine's
  DecodeSession (prefilled from the prefix cache when admitted, one token per step, answered the step it
  ends in), verification requests (draft_input_ids: the BLS rounds of concurrent requests) admitted
  together run as one batched target pass between steps (ReferenceEngine.verify_external_batch: rows of
  their own length), and a generation-logits request runs alone between steps. On an engine that
  speculates by itself (Medusa's tree) a request is a plain row when the repository's draft_len_schedule
  (a specbuild parameter) gives K=0 for the requests the model holds (read, not yet answered, queued ones
  included) at its admission, else its tree runs between steps, one request after another, and goes on as
  a plain row after the step in which that count turns K to 0 (step_scheduler.py);
* responses: each request's responses go through its response sender. Decoupled (Medusa
  repositories): each generated chunk is sent as it is produced when `streaming` is true; the last
  response carries COMPLETE_FINAL (and the perf outputs). A streamed request's chunks and its final
  response go out on a thread of their own (engine_worker.Outbox), in the order the engine produced them,
  while the engine runs its next step (each send and its cancellation ask is an IPC round trip); a
  streamed request's stop hook reads the answer of its last send's ask instead of asking again. A request
  that does not stream is answered on the engine's thread (its one response: nothing to order it after,
  and no hand-over to another thread, _answer). Not decoupled
  (draft/target repositories: the BLS calls round by round): exactly one response per request, with the
  final flag, as the Python backend of tritonserver 2.51 lets a non-decoupled model answer (its stub
  refuses more: "Non-decoupled model cannot send more than one response");
* cancellation: a request is asked about (responder.py: an IPC round trip each) when it starts, reusing
  an answer younger than POLL_S (its arrival counts as one: Triton hands over no request it knows
  cancelled), so a short call (a BLS draft or verify round) does not ask at its start; a running request
  is asked at most every `cancellation_check_period_ms` (this model's parameter, 100 by default, as the
  C++ backend checks), so a cancelled one ends within that period or a step, a stopped one (a `stop`
  request: no ask) at the next step. A cancelled decoupled request gets a
  flags-only final response, a cancelled non-decoupled one a CANCELLED error; no outputs are written for
  either;
* draft_input_ids: external verification through the engine's prefix cache, so the BLS's growing
  prefix is not recomputed each round (enable_kv_cache_reuse);
* limits: the engine folder's config.json build_config (specbuild.core.engine_limits, with this model's
  `enable_chunked_context` parameter), enforced as the backend does.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time

import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from engine_worker import ActiveRequests, EngineWorker, Outbox  # noqa: E402
from local_core import Job, Perf, cut, is_stop_request, parse_request, token_outputs  # noqa: E402
from responder import POLL_S, Responder, cancelled_error  # noqa: E402
from spec_metrics import SpecMetrics  # noqa: E402
from step_scheduler import StepScheduler, plain_k  # noqa: E402
from words import find_stop, param, stop_at_words  # noqa: E402

from specbuild.core.schedule import INFLIGHT_HOLD_MS, held_count, record_end  # noqa: E402

DEFAULT_TORCH_THREADS = "1"  # per engine model process; SPECBUILD_TORCH_THREADS overrides
DEFAULT_TOKENS_PER_BLOCK = 32  # KV block size the perf counters are reported in (TRT-LLM's default)
# A request without end_id has no end token: TensorRT-LLM's decoder takes `mEndId.value_or(-1)`
# (batch_manager createNewDecoderRequests / generateRequestOptions), so it never stops at the model's eos.
NO_END_ID = -1


class TritonPythonModel:
    def initialize(self, args):
        import torch

        from specbuild.core.engine_limits import EngineLimits
        from specbuild.engines.reference.engine import ReferenceEngine

        # Several stub processes (draft, target, BLS, pre/post) share the CPU: torch's default of one
        # thread per core in each of them oversubscribes it (measured 50x slower on 2 loaded cores).
        torch.set_num_threads(int(os.environ.get("SPECBUILD_TORCH_THREADS", DEFAULT_TORCH_THREADS)))

        config = json.loads(args["model_config"])
        self.name = config.get("name", "tensorrt_llm")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        path = param(config, "gpt_model_path")
        choices = param(config, "medusa_choices") or None
        self.engine = ReferenceEngine.load(path, medusa_choices=choices)
        # specbuild addition (the C++ backend has no such parameter): on a self-drafting engine (Medusa) a
        # request admitted while the schedule's K for the requests in flight is 0 decodes as a plain row
        # (core/schedule.py, step_scheduler.py)
        schedule = param(config, "draft_len_schedule")
        # the count a request is admitted with stays this long at what it was when a request was answered
        self.hold_ms = float(param(config, "inflight_hold_ms", str(INFLIGHT_HOLD_MS)))
        if schedule and self.engine.speculates:
            from specbuild.core.schedule import DraftSchedule

            self.engine.schedule = DraftSchedule.from_text(
                schedule, max_draft_len=self.engine.num_draft_tokens
            )
        self.exclude_default = param(config, "exclude_input_in_output", "false").lower() == "true"
        # how often a row asks Triton whether its request was cancelled, as the C++ backend checks its
        # requests every cancellation_check_period_ms (its default 100 when the parameter is absent)
        self.row_poll_s = int(param(config, "cancellation_check_period_ms", "") or 100) / 1000
        names = {t["name"] for t in config["input"]}
        self.seed_name = "seed" if "seed" in names else "random_seed"
        self.min_tokens_name = "min_tokens" if "min_tokens" in names else "min_length"
        from specbuild.core.safe_io import read_json

        build = read_json(os.path.join(path, "config.json"), kind="config").get("build_config") or {}
        self.tokens_per_block = int(
            (build.get("plugin_config") or {}).get("tokens_per_block") or DEFAULT_TOKENS_PER_BLOCK
        )
        chunked = param(config, "enable_chunked_context", "false").lower() == "true"
        self.limits = (
            EngineLimits.from_build_config(build, enable_chunked_context=chunked)
            if build.get("max_seq_len")
            else None
        )
        # draft tokens a self-drafting engine (Medusa's tree) adds per step; 0 when drafts come in the request
        self.engine_draft_len = self.engine.draft_per_step() if self.limits else 0
        self.metrics = SpecMetrics(self.name)
        self._active = ActiveRequests()  # request id -> its running jobs (for stop requests)
        self._warm_up()
        self.max_batch = max(1, int(config.get("max_batch_size") or 1))  # rows the worker decodes together
        # One worker runs the requests execute() read, step by step (in-flight batching: StepScheduler);
        # on an engine that speculates by itself (Medusa's tree) a request whose tree is on at admission
        # runs whole between steps, one with K=0 is a plain row. Decoupled, a streamed request's chunks
        # and final response go out on a thread of their own, in the order the engine produced them,
        # while the engine runs its next step (engine_worker.Outbox); a request that does not stream
        # (decoupled or not) gets its one response through its response sender on the engine's thread
        # (_answer; not decoupled, the Python backend allows exactly one, with the final flag).
        self._holding, self._holding_lock = 0, threading.Lock()  # requests read and not answered yet
        self._end = (0, 0)  # (last answered at ns, holding then): core/schedule.record_end
        self._outbox = None
        if self.decoupled:
            self._outbox = Outbox(f"{self.name}-responses", on_error=self._send_failed)
        self._worker = EngineWorker(
            f"{self.name}-engine",
            self.max_batch,
            finish=self._answer,
            scheduler=StepScheduler(
                self,
                tree_k=self._tree_k if self.engine.speculates else plain_k,
                in_flight=self._in_flight,
            ),
        )

    def _in_flight(self) -> int:
        """Requests this model holds: read by execute and not answered yet (queued for the worker, rows,
        whole jobs), or what it held when a request was answered less than hold_ms ago if more
        (core/schedule.held_count: a request that replaces one just answered sees the load it replaces)."""
        with self._holding_lock:
            return held_count(self._holding, [self._end], time.monotonic_ns(), self.hold_ms)

    def _tree_k(self, in_flight: int) -> int:
        """K of a request admitted with `in_flight` requests in flight (step_scheduler.py): the repository's
        draft_len_schedule (core/schedule.py), else always the engine's tree (TensorRT-LLM's Medusa engines
        cannot switch it off)."""
        schedule = self.engine.schedule
        return self.engine.num_draft_tokens if schedule is None else schedule.k_for(in_flight)

    def _warm_up(self) -> None:
        """One tiny generation and verification at load: the first request must not pay for torch's
        lazy initialisation (seconds on a busy CPU, which would distort TTFT measurements)."""
        from specbuild.core.sampling_params import SamplingParams

        params = SamplingParams(max_tokens=2, end_id=-1)
        self.engine.generate([0], params, speculative=True)
        if not self.engine.speculates:  # an engine the BLS drives verifies drafts
            self.engine.verify_external([0], [0], None, params=params)

    def finalize(self):
        left = self._worker.close()
        if self._outbox is not None:
            self._outbox.close()  # the responses the engine produced go out first, in order
        self.metrics.close()  # what is still pending goes out
        for job in left:  # never leave a request without its final response
            self._send_final(job.responder, self._error(RuntimeError("the model is being unloaded")))

    def _answer(self, job: Job) -> None:
        """A job that ended: its final response. A streamed one's goes on the outbox, after its chunks; a
        request that streamed nothing (not decoupled, or decoupled and not streaming) is answered here,
        on the engine's thread, as the non-decoupled model answers: its one response waits behind no other
        request's streamed chunks on the outbox, and its client (a closed loop's worker) can send its next
        request sooner (docs/serving.md, "The Medusa c=8 lead measured apart")."""
        with self._holding_lock:
            self._end = record_end(self._end, self._holding, time.monotonic_ns(), self.hold_ms)
            self._holding -= 1
        if self._outbox is None or not job.req.streaming:
            self._send_final(job.responder, self._final(job))
        else:
            self._outbox.put(lambda: self._send_final(job.responder, self._final(job)))

    @staticmethod
    def _send_failed(exc: BaseException) -> None:
        pb_utils.Logger.log_error(f"tensorrt_llm (local): a response could not be sent: {exc}")

    # ---- Triton entry point ---------------------------------------------------------------------
    def execute(self, requests):
        """Read the requests and hand them to the worker; every response goes out through its request's
        response sender, so execute returns at once and Triton hands over the next requests while the
        engine runs (they join the running batch at its next step)."""
        jobs = []
        for request in requests:
            responder = Responder(request, request.get_response_sender()).handed_over()
            try:
                get = _getter(request)
                if is_stop_request(get):
                    self._stop(request, responder)
                    continue
                job = self._parse(request, get, responder)
            except Exception as exc:  # the request's error response, as the backend reports bad requests
                self._send_final(responder, self._error(exc))
                continue
            jobs.append(job)
        with self._holding_lock:
            self._holding += len(jobs)
        self._worker.submit(jobs)
        return None

    def _final(self, job: Job):
        try:
            return self._finish(job)
        except Exception as exc:  # noqa: BLE001 - report, never leave a request without its response
            return self._error(exc)

    def _send_final(self, responder: Responder, response) -> None:
        """A request's final response: decoupled, with the final flag (flags only when there is nothing to
        write); not decoupled, its one response (a cancelled request's is the CANCELLED error)."""
        if self.decoupled:
            responder.finish(response)
        else:
            responder.finish_one(response)

    def _stop(self, request, responder: Responder):
        """A `stop` request: end the running request with this id (there may be none: it may have finished)
        and answer with an empty response, as the backend's handleStopRequest does."""
        request_id = request.request_id()
        if not request_id:
            return self._send_final(
                responder, self._error(ValueError("Trying to stop a request but request ID is not provided"))
            )
        for job in self._active.named(request_id):
            job.responder.stopped = True
        return self._send_final(responder, pb_utils.InferenceResponse(output_tensors=[]))

    def _error(self, exc: Exception):
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{self.name} (local): {exc}"))

    def _parse(self, request, get, responder: Responder) -> Job:
        req = parse_request(
            get,
            seed_name=self.seed_name,
            min_tokens_name=self.min_tokens_name,
            exclude_default=self.exclude_default,
            default_end_id=NO_END_ID,
            limits=self.limits,
            engine_draft_len=self.engine_draft_len,
            request_id=request.request_id(),
        )
        if req.streaming and not self.decoupled:
            raise ValueError("Streaming is only supported if model is deployed using decoupled mode.")
        if req.max_new < req.requested_len:
            pb_utils.Logger.log_warn(
                f"{self.name}: prompt ({len(req.prompt_ids)}) + requested output ({req.requested_len}) "
                "exceeds max_seq_len "
                f"({self.limits.max_seq_len}); output length lowered to {req.max_new}, as TensorRT-LLM does"
            )
        job = Job(
            req=req,
            responder=responder,
            perf=Perf(arrival_ns=req.arrival_ns),
        )
        self._active.add(req.request_id, job)
        return job

    # ---- running requests -----------------------------------------------------------------------
    def _run_jobs(self, jobs: list[Job]) -> None:
        """The one-pass and whole jobs of a step (StepScheduler): the verifications in one batched pass,
        then every other job alone, to its end, one after another."""
        try:
            # several verifications (the BLS rounds of concurrent requests): one batched target pass
            verify = [j for j in jobs if j.req.draft_ids is not None and not j.req.generation_logits]
            if len(verify) > 1:
                self._run_verify_batch(verify)
            for job in jobs:
                if not job.ran and job.error is None:
                    self._run_one(job)
        finally:
            for job in jobs:
                self._active.remove(job.req.request_id, job)

    def _ended(self, job: Job) -> None:
        """Mark the request ended early (cancelled by Triton, or stopped by a `stop` request)."""
        job.cancelled = True

    def _log_end(self, job: Job) -> None:
        how = "cancelled" if job.responder.cancelled() else "stopped"
        pb_utils.Logger.log_info(
            f"{self.name}: request '{job.req.request_id}' {how} after {len(job.tokens)} tokens"
        )

    def _stop_hook(self, job: Job):
        """The engine's stop hook for `job` (speculative.StopHook), asked after every step: a cancelled or
        stopped request (one Triton round trip per step, so it ends within a step) keeps what it produced;
        a multi-token stop word ends it right after the word."""
        words = stop_at_words(job.req.stop_sequences)
        # A streamed request's every step is sent, and each send asks Triton afresh (on the outbox's thread):
        # the hook reads that answer instead of asking again. Otherwise it asks at most every
        # cancellation_check_period_ms (row_poll_s), as the C++ backend does: an ask is an IPC round trip
        # on the engine's thread, and asking every POLL_S (about every step) cost the decoupled Medusa model
        # 5-10% at c = 2-4 (docs/model_repo.md).
        max_age_s = float("inf") if job.req.streaming else self.row_poll_s

        def stop(out: list[int], start: int) -> int | None:
            if job.cancelled or job.responder.ended(max_age_s=max_age_s):
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
        try:
            self._run(job)
            job.reused_tokens = self.engine.prefix_cache.reused_tokens - before
        except Exception as exc:  # noqa: BLE001 - the request's error response
            job.error = exc
        if job.cancelled:
            self._log_end(job)
        job.ran = True

    def _on_tokens(self, job: Job, new: list[int]) -> None:
        job.perf.token()
        if job.req.streaming and new and not job.cancelled:  # streaming: decoupled only (_parse)
            chunk = token_outputs(new, job.req, with_prompt=False)
            self._outbox.put(functools.partial(self._send_chunk, job, chunk))

    def _send_chunk(self, job: Job, chunk: dict) -> None:
        """One streamed chunk (on the outbox's thread): a stopped request's chunks go out (what it produced
        before the stop), a cancelled one's do not (Responder.send asks Triton afresh)."""
        if not job.responder.send(
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in chunk.items()])
        ):
            self._ended(job)  # the client is gone: the stop hook ends the generation at the next step

    def _run_verify_batch(self, jobs: list[Job]) -> None:
        """Verification requests of one execute() in one target pass (ReferenceEngine.verify_external_batch:
        rows of their own length, each from its own prefix-cache entry; the same tokens as one by one)."""
        live = [j for j in jobs if not j.responder.ended(max_age_s=POLL_S)]
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
        if job.responder.ended(max_age_s=POLL_S):  # cancelled while it waited
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
                req.prompt_ids, req.params, speculative=True, on_tokens=on_tokens, stop=stop
            )
        job.tokens = result.token_ids
        perf.accepted, perf.drafted = result.stats.accepted, result.stats.drafted
        job.steps = result.stats.steps
        return job

    def _finish(self, job: Job):
        """The request's final response: its outputs, its error, or (cancelled) nothing to write."""
        req, perf = job.req, job.perf
        if job.responder.cancelled(max_age_s=POLL_S):  # the client is gone: write nothing
            return None if self.decoupled else cancelled_error(self.name)
        if job.cancelled:  # stopped by a `stop` request: what it produced so far, as the backend answers
            return self._outputs(job, job.tokens)
        if job.error is not None:
            return self._error(job.error)
        try:  # a completed request's steps (trtllm-serve logs finished ones); never fails the request
            self.metrics.record(job.steps)
        except Exception as exc:  # noqa: BLE001 - metrics are best effort
            pb_utils.Logger.log_warn(f"{self.name}: speculative metrics not updated: {exc}")
        perf.blocks(
            reused_tokens=job.reused_tokens,
            total_tokens=len(req.prompt_ids) + len(job.tokens),
            tokens_per_block=self.tokens_per_block,
        )
        return self._outputs(job, job.tokens)

    def _outputs(self, job: Job, tokens: list[int]):
        req = job.req
        if req.streaming:  # the chunks went out already; the final response carries no new tokens
            outputs = token_outputs([], req, with_prompt=False)
        else:
            outputs = token_outputs(tokens, req, with_prompt=not req.exclude_input)
        outputs.update(job.extra)
        if req.perf:
            outputs.update(job.perf.outputs())
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])


def _getter(request):
    def get(name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    return get
