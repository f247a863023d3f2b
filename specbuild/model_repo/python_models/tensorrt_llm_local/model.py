"""Triton Python model standing in for the C++ `tensorrt_llm` backend: runs specbuild's reference engine.

Same tensor interface as the C++ backend (config.pbtxt from specbuild.model_repo.tensors), so the
ensemble, pre/postprocessing and BLS are identical in local and production repositories. Loads
`gpt_model_path` (a reference engine folder) with ReferenceEngine; `medusa_choices` (backend form)
selects the Medusa tree. What each input does: local_core.py.

* the engine runs in a process of its own (engine_common/engine_host.py: why; step_host.py: what runs there;
  host_link.py: the link; the parameter `engine_process` "false" keeps it in this process). This
  process reads the requests, answers them and asks Triton about cancellation; the engine process runs
  them;
* scheduling, per step as TensorRT-LLM's batch manager (in-flight batching): `execute` only reads the
  requests and hands them to the engine host, so it returns at once and later requests (new ones, and
  `stop` requests for running ones) are read while the engine works, as the C++ backend's enqueue is.
  Before every step the host admits waiting requests while fewer than max_batch_size run
  (step_scheduler.StepScheduler): a plain request becomes a row of the engine's DecodeSession (prefilled
  from the prefix cache when admitted, one token per step, answered the step it ends in), verification
  requests (draft_input_ids: the BLS rounds of concurrent requests) admitted together run as one batched
  target pass between steps (ReferenceEngine.verify_external_batch: rows of their own length), and a
  generation-logits request runs alone between steps. On an engine that speculates by itself (Medusa's
  tree) a request is a plain row when the repository's draft_len_schedule (a specbuild parameter) gives
  K=0 for the requests the engine holds (received, not yet done, queued ones included) at its admission,
  else its tree runs between steps, one request after another, and goes on as a plain row after the step
  in which that count turns K to 0 (step_scheduler.py);
* responses: each request's responses go through its response sender. Decoupled (Medusa
  repositories): each generated chunk is sent as it is produced when `streaming` is true, with every perf
  output (return_perf_metrics: the request's counters so far, as the C++ backend fills them on each
  response); the last response carries COMPLETE_FINAL (and the perf outputs: the totals). A streamed
  request's chunks and its final response go out on a thread of their own (engine_worker.Outbox), in the
  order the engine produced them.
  A request that does not stream is answered on the thread that reads the engine's events (its one
  response: nothing to order it after). Not decoupled (draft/target repositories: the BLS calls round by
  round): exactly one response per request, with the final flag, as the Python backend of tritonserver
  2.51 lets a non-decoupled model answer (its stub refuses more: "Non-decoupled model cannot send more
  than one response");
* cancellation: a request is asked about (responder.py: an IPC round trip each) when it is answered,
  reusing an answer younger than POLL_S (its arrival counts as one: Triton hands over no request it knows
  cancelled), so a short call (a BLS draft or verify round) asks nothing; a running request is asked at
  most every `cancellation_check_period_ms` (this model's parameter, 100 by default, as the C++ backend
  checks) by a watcher thread, and a streamed one at each send; a cancelled one ends at the engine's next
  step after that, a stopped one (a `stop` request: no ask) at the next step. A cancelled decoupled
  request gets a flags-only final response, a cancelled non-decoupled one a CANCELLED error; no outputs
  are written for either;
* draft_input_ids: external verification through the engine's prefix cache, so the BLS's growing
  prefix is not recomputed each round (enable_kv_cache_reuse);
* limits: the engine folder's config.json build_config (specbuild.core.engine_limits, with this model's
  `enable_chunked_context` parameter), enforced as the backend does.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import sys
import threading

import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from child_channel import ChildError, RestartBudget, unpack_array  # noqa: E402
from engine_worker import ActiveRequests, Outbox  # noqa: E402
from host_link import ProcessHost, ThreadHost  # noqa: E402
from lifeline import start_in_stub  # noqa: E402
from local_core import Job, Perf, is_stop_request, parse_request, request_to_wire, token_outputs  # noqa: E402
from responder import POLL_S, Responder, cancelled_error  # noqa: E402
from spec_metrics import SpecMetrics  # noqa: E402
from words import param  # noqa: E402

from specbuild.core.perf.schedule import INFLIGHT_HOLD_MS  # noqa: E402

DEFAULT_TORCH_THREADS = "1"  # per engine process; SPECBUILD_TORCH_THREADS overrides
DEFAULT_TOKENS_PER_BLOCK = 32  # KV block size the perf counters are reported in (TRT-LLM's default)
# A request without end_id has no end token: TensorRT-LLM's decoder takes `mEndId.value_or(-1)`
# (batch_manager createNewDecoderRequests / generateRequestOptions), so it never stops at the model's eos.
NO_END_ID = -1


class TritonPythonModel:
    def initialize(self, args):
        start_in_stub(args["model_name"])  # ends this process if tritonserver dies (lifeline.py)
        from specbuild.core.engine_limits import EngineLimits
        from specbuild.core.formats.safe_io import read_json

        config = json.loads(args["model_config"])
        self.name = config.get("name", "tensorrt_llm")
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        path = param(config, "gpt_model_path")
        self.max_batch = max(1, int(config.get("max_batch_size") or 1))  # rows the engine decodes together
        # what the engine host is started with (engine_common/engine_host.load_engine, step_host.make_host)
        self.host_options = {
            "host": "steps",
            "name": self.name,
            "path": path,
            "medusa_choices": param(config, "medusa_choices") or None,
            # specbuild addition (the C++ backend has no such parameter): on a self-drafting engine (Medusa)
            # a request admitted while the schedule's K for the requests in flight is 0 decodes as a plain
            # row (core/perf/schedule.py, step_scheduler.py)
            "schedule": param(config, "draft_len_schedule") or None,
            # the count a request is admitted with stays this long at what it was when one was answered
            "hold_ms": float(param(config, "inflight_hold_ms", str(INFLIGHT_HOLD_MS))),
            "max_batch": self.max_batch,
            "threads": int(os.environ.get("SPECBUILD_TORCH_THREADS", DEFAULT_TORCH_THREADS)),
            "warm_verify": True,  # a target the BLS drives verifies drafts: warmed up too
        }
        self.engine_process = param(config, "engine_process", "true").lower() != "false"
        self.exclude_default = param(config, "exclude_input_in_output", "false").lower() == "true"
        # how often a running request is asked whether Triton cancelled it, as the C++ backend checks its
        # requests every cancellation_check_period_ms (its default 100 when the parameter is absent)
        self.row_poll_s = int(param(config, "cancellation_check_period_ms", "") or 100) / 1000
        names = {t["name"] for t in config["input"]}
        self.seed_name = "seed" if "seed" in names else "random_seed"
        self.min_tokens_name = "min_tokens" if "min_tokens" in names else "min_length"
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
        self.metrics = SpecMetrics(self.name)
        self._active = ActiveRequests()  # request id -> its running jobs (for stop requests)
        self._jobs: dict[int, Job] = {}  # jid -> a job handed to the engine host and not answered yet
        self._jids = itertools.count(1)
        self._lock = threading.Lock()  # _jobs, the host and its restarts
        self._running = threading.Condition(self._lock)  # notified when a job is handed over, and at close
        # Decoupled, a streamed request's chunks and final response go out on a thread of their own, in the
        # order the engine produced them (engine_worker.Outbox); a request that does not stream (decoupled
        # or not) gets its one response through its response sender on the thread that read its end
        # (_answer; not decoupled, the Python backend allows exactly one, with the final flag).
        self._outbox = (
            Outbox(f"{self.name}-responses", on_error=self._send_failed) if self.decoupled else None
        )
        self._restarts = RestartBudget()  # the restart rule (_live_host)
        self._host_no = 0  # which start of the engine host is the live one (a job's `host`)
        try:
            self.host = self._start_host()
        except ChildError as exc:
            raise pb_utils.TritonModelException(f"{self.name}: {exc}") from None
        info = self.host.info
        self.speculates = bool(info["speculates"])
        # draft tokens a self-drafting engine (Medusa's tree) adds per step; 0 when drafts come in the request
        self.engine_draft_len = int(info["draft_per_step"]) if self.limits else 0
        self._closing = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name=f"{self.name}-cancellation", daemon=True)
        self._watcher.start()

    @property
    def restarts(self) -> int:
        """Times the engine process was started again after it died."""
        return self._restarts.used

    @property
    def engine(self):
        """The engine, where it runs in this process (engine_process "false"); None in the engine process."""
        return getattr(self.host, "engine", None)

    def _start_host(self):
        """A new engine host, numbered: its events are told from an earlier one's (whose "gone" is late)."""
        kind = ProcessHost if self.engine_process else ThreadHost
        self._host_no += 1
        return kind(self.host_options, functools.partial(self._on_event, host=self._host_no))

    def finalize(self):
        self._closing.set()
        with self._running:
            self._running.notify_all()
        self.host.close()  # its unfinished requests are done with an error, answered here
        if self._outbox is not None:
            self._outbox.close()  # the responses the engine produced go out first, in order
        self.metrics.close()  # what is still pending goes out
        with self._lock:
            left, self._jobs = list(self._jobs.values()), {}
        for job in left:  # never leave a request without its final response
            self._send_final(job.responder, self._error(RuntimeError("the model is being unloaded")))

    # ---- Triton entry point ---------------------------------------------------------------------
    def execute(self, requests):
        """Read the requests and hand them to the engine host; every response goes out through its
        request's response sender, so execute returns at once and Triton hands over the next requests
        while the engine runs (they join the running batch at its next step)."""
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
        for job in jobs:
            self._submit(job)
        return None

    def _submit(self, job: Job) -> None:
        wire = request_to_wire(job.req)
        with self._lock:
            try:
                self._hand_over(job, wire)
                return
            except ChildError as exc:
                error = exc
        self._active.remove(job.req.request_id, job)
        self._send_final(job.responder, self._error(error))

    def _hand_over(self, job: Job, wire: dict) -> None:
        """Give the job to a live engine host. A host found dead, or whose pipe breaks on this job (it died
        since it was last seen), is started again first: a request read after the engine died is run by
        the new one, and fails (ChildError) only when the engine cannot be started again. Called with _lock
        held."""
        for attempt in range(2):
            host = self._live_host()
            job.jid, job.host = next(self._jids), self._host_no
            self._jobs[job.jid] = job
            self._running.notify()
            try:
                host.submit(job.jid, wire)
                return
            except ChildError:  # the process is gone (reaped by the failed write: not alive any more)
                self._jobs.pop(job.jid, None)
                if attempt:
                    raise

    def _live_host(self):
        """The engine host, started again if its process died (child_channel.RestartBudget: a crash that
        repeats leaves every later request with the error). The dead host's requests get their error
        first, at once, whether or not its "gone" event was handled yet: never after the new engine loaded.
        Called with _lock held."""
        if self.host.alive:
            return self.host
        self._fail(self._taken(self._host_no), self.host.child.gone())  # ThreadHost is always alive
        pb_utils.Logger.log_error(f"{self.name}: " + self._restarts.take("the engine process died"))
        self.host.close()
        self.host = self._start_host()
        return self.host

    def _taken(self, host: int) -> list[Job]:
        """The requests handed to engine host `host` (its start: _start_host) and not answered yet, taken
        from _jobs (with _lock held: each is answered once, by whoever takes it)."""
        jobs = [job for job in self._jobs.values() if job.host == host]
        for job in jobs:
            del self._jobs[job.jid]
        return jobs

    def _fail(self, jobs: list[Job], message: str) -> None:
        for job in jobs:
            job.error = ChildError(message)
            self._active.remove(job.req.request_id, job)
            self._answer(job)

    # ---- the engine's events (the host's reader thread; in ThreadHost, the engine's thread) -------------
    def _on_event(self, event: dict, *, host: int) -> None:
        """An event of engine host `host` (the start it came from: _start_host)."""
        kind = event.get("e")
        if kind == "tok":
            job = self._jobs.get(event["jid"])
            if job is not None and self._outbox is not None:
                chunk = token_outputs(event["new"], job.req, with_prompt=False)
                job.streamed += len(event["new"])
                if "perf" in event:  # return_perf_metrics: every perf output, the request's so far
                    chunk.update(self._perf_so_far(job, event["perf"]))
                self._outbox.put(functools.partial(self._send_chunk, job, chunk))
        elif kind == "done":
            with self._lock:
                job = self._jobs.pop(event["jid"], None)
            if job is not None:
                _apply_done(job, event)
                self._active.remove(job.req.request_id, job)
                self._answer(job)
        elif kind == "log":
            pb_utils.Logger.log_info(event["msg"])
        elif kind == "gone":  # the engine process died: every request it held fails, saying so (the
            # requests handed to a host started since are not its own)
            pb_utils.Logger.log_error(f"{self.name}: {event['msg']}")
            with self._lock:
                jobs = self._taken(host)
            self._fail(jobs, event["msg"])

    def _perf_so_far(self, job: Job, counters: dict) -> dict:
        """A streamed chunk's perf outputs: the engine's counters so far (step_host._perf_so_far), the KV
        blocks of the sequence so far (the final response's, once the request ends)."""
        perf = job.perf
        perf.accepted, perf.drafted = int(counters["accepted"]), int(counters["drafted"])
        perf.scheduled_ns = int(counters["scheduled_ns"])
        perf.first_token_ns, perf.last_token_ns = (
            int(counters["first_token_ns"]),
            int(counters["last_token_ns"]),
        )
        perf.blocks(
            reused_tokens=int(counters["reused_tokens"]),
            total_tokens=len(job.req.prompt_ids) + job.streamed,
            tokens_per_block=self.tokens_per_block,
        )
        return perf.outputs()

    def _watch(self) -> None:
        """Ask Triton about each running request whose last answer is older than
        cancellation_check_period_ms (a streamed request's sends ask afresh), and end the cancelled ones at
        the engine's next step. While requests run the loop looks every POLL_S, so a request is asked within
        POLL_S of its period's end (looking is free; each ask is an IPC round trip); with none it sleeps."""
        period = min(POLL_S, self.row_poll_s)
        while not self._closing.is_set():
            with self._running:
                while not self._jobs and not self._closing.is_set():
                    self._running.wait()
                jobs = [job for job in self._jobs.values() if not job.cancelled]
            for job in jobs:
                if job.responder.cancelled(max_age_s=self.row_poll_s):
                    self._cancel(job)
            self._closing.wait(period)

    def _cancel(self, job: Job) -> None:
        job.cancelled = True
        try:
            self.host.cancel(job.jid)
        except ChildError:  # the process is gone: its "gone" event answers the request
            pass

    def _answer(self, job: Job) -> None:
        """A job that ended: its final response. A streamed one's goes on the outbox, after its chunks; a
        request that streamed nothing (not decoupled, or decoupled and not streaming) is answered here, as
        the non-decoupled model answers: its one response waits behind no other request's streamed chunks
        on the outbox, and its client (a closed loop's worker) can send its next request sooner
        (lab/notebook/2026-12-02-bench-load-medusa-0623.md, "The Medusa c=8 lead measured apart")."""
        if self._outbox is None or not job.req.streaming:
            self._send_final(job.responder, self._final(job))
        else:
            self._outbox.put(lambda: self._send_final(job.responder, self._final(job)))

    @staticmethod
    def _send_failed(exc: BaseException) -> None:
        pb_utils.Logger.log_error(f"tensorrt_llm (local): a response could not be sent: {exc}")

    def _send_chunk(self, job: Job, chunk: dict) -> None:
        """One streamed chunk (on the outbox's thread): a stopped request's chunks go out (what it produced
        before the stop), a cancelled one's do not (Responder.send asks Triton afresh)."""
        if not job.responder.send(
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in chunk.items()])
        ):
            self._cancel(job)  # the client is gone: the engine ends the request at its next step

    def _final(self, job: Job):
        try:
            return self._finish(job)
        except Exception as exc:  # noqa: BLE001 - report, never leave a request without its response
            return self._error(exc)

    def _send_final(self, responder: Responder, response) -> None:
        """A request's final response: decoupled, with the final flag (flags only when there is nothing to
        write); not decoupled, its one response (a cancelled request's is the CANCELLED error).

        Decoupled, an error after streamed chunks goes out as a response of its own and the final flag alone
        after it: tritonserver 2.51 does not deliver an error response that follows data responses to a BLS
        caller's response iterator, and with it lost the final flag too (the BLS waited for ever). The flag
        alone reaches it; the BLS fails a stream that ends without outputs (tensorrt_llm_bls/model.py)."""
        if self.decoupled:
            if response is not None and response.has_error() and responder.sent:
                responder.send(response)
                responder.finish(None)
                return
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
            try:
                self.host.stop(job.jid)
            except ChildError:  # the process is gone: its "gone" event answers the request
                pass
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
        job = Job(req=req, responder=responder, perf=Perf(arrival_ns=req.arrival_ns))
        self._active.add(req.request_id, job)
        return job

    # ---- the final response ---------------------------------------------------------------------
    def _finish(self, job: Job):
        """The request's final response: its outputs, its error, or (cancelled) nothing to write."""
        req, perf = job.req, job.perf
        if job.responder.cancelled(max_age_s=POLL_S):  # the client is gone: write nothing
            return None if self.decoupled else cancelled_error(self.name)
        if job.cancelled and job.error is None:  # stopped by a `stop` request: what it produced so far
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


def _apply_done(job: Job, event: dict) -> None:
    """A job's result from the engine host (step_host._done_event)."""
    perf = job.perf
    job.tokens = list(event["tokens"])
    job.cancelled = job.cancelled or bool(event["cancelled"])
    if event["error"] is not None:
        job.error = RuntimeError(event["error"])
    job.reused_tokens = int(event["reused_tokens"])
    job.steps = [tuple(step) for step in event["steps"]]
    perf.accepted, perf.drafted = int(event["accepted"]), int(event["drafted"])
    perf.scheduled_ns = int(event["scheduled_ns"])
    perf.first_token_ns, perf.last_token_ns = int(event["first_token_ns"]), int(event["last_token_ns"])
    job.extra = {name: unpack_array(packed) for name, packed in event["extra"].items()}


def _getter(request):
    def get(name):
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    return get
