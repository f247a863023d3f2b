"""Triton Python model standing in for Triton's LLM-API `tensorrt_llm` model: the reference engine behind
the LLM-API tensor interface (what each input does: llmapi_core.py).

* model.yaml (next to this file, or $LLM_CONFIG_PATH) holds the LLM() options and triton_config, as
  upstream: `auto_complete_config` sets max_batch_size and the decoupled policy from triton_config; the
  options give the limits (max_seq_len, max_num_tokens, enable_chunked_prefill), the batch size and
  `speculative_config` (its decoding_type must be what the reference engine's build runs, its
  max_draft_len the K of every request; without it the target decodes alone, as
  the LLM API does without speculation). The config.pbtxt parameter `reference_engine` names the
  `compile --flow llmapi --engine reference` build the engine loads.
* the engine runs in a process of its own (engine_common/engine_host.py running batch_host.py, started and
  spoken to by engine_process.py), as the LLM API runs its executor in a worker process on one GPU:
  this process only reads requests, tokenizes, detokenizes and sends responses, so none of that stalls
  the engine (in one process, each response's IPC hand-overs of the GIL slowed the engine:
  lab/notebook/2026-12-03-engine-process.md).
* decoupled (triton_config.decoupled: the repository's choice): `execute` hands the requests to one
  worker thread and returns, so concurrent requests reach the engine together: requests waiting when a
  batch starts decode together (up to max_batch_size; the engine's lockstep batch, draft/target
  included), later ones in the next batch. This is the reference engine's batching, not TensorRT-LLM's
  in-flight batching, which admits requests between steps. The worker thread sends each batch to the
  engine process and reads its steps as they come.
* responses (decoupled): one thread of their own (engine_worker.Outbox) builds and sends them, in the
  order the engine produced them: a streamed step's response (its cumulative text detokenized, the
  tensors, the cancellation ask and the send, each ask and send an IPC round trip to the server) is
  built and sent while the engine runs the next step; the final response goes the same way, after the
  request's last step. After each step the worker asks whether the request should stop (`_ended`): a
  streamed request reads the answer of its last send's ask instead of asking again (each step's send
  asks afresh); a request that is not streamed is asked at most every cancellation_check_period_ms
  (triton_config; 100 as upstream's cancellation loop). A request that should stop is aborted in the
  engine process, which ends it at its next step.
* not decoupled (upstream model.yaml's default): each request runs inside `execute` and gets its one
  response from it; a streaming request is refused with upstream's message.
* cancellation: Triton's (the client gone) ends the work within a step or two and writes nothing but the final
  flag (writing outputs for a gone client is what the 2.51 frontend can crash on, responder.py); a
  `stop` request ends the requests with its id within a step or two: they end with what they produced and
  finish_reason "cancelled" (the LLM API's CompletionOutput value for an aborted request; whether
  upstream's model sends that final output or an error is UNVERIFIED), and the stop request itself is
  answered "Request cancelled by client" (CANCELLED), as upstream.
* EAGLE-3 (`Eagle` + eagle3_one_model on 1.2.1, `Eagle3` on 1.4): the reference engine runs the draft
  one-model, as the LLM API does (the target's pass captures the aux hidden states; docs/eagle3.md).
"""

from __future__ import annotations

import functools
import json
import os
import sys

import triton_python_backend_utils as pb_utils
import yaml

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from child_channel import RestartBudget  # noqa: E402
from engine_process import EngineProcess, EngineProcessError  # noqa: E402
from engine_worker import ActiveRequests, EngineWorker, Outbox  # noqa: E402
from lifeline import start_in_stub  # noqa: E402
from llmapi_core import (  # noqa: E402
    Job,
    LlmApiLimits,
    Perf,
    cut_at_stop,
    is_stop_request,
    parse_request,
    reason_outputs,
    text_outputs,
)
from responder import Responder  # noqa: E402
from spec_metrics import SpecMetrics  # noqa: E402
from words import param  # noqa: E402

from specbuild.engines.reference.text import decode  # noqa: E402

DEFAULT_TORCH_THREADS = "1"
DEFAULT_TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block default
DEFAULT_CHECK_PERIOD_MS = 100  # upstream's cancellation_check_period_ms when triton_config has none
CANCELLED_MESSAGE = "Request cancelled by client"


def _options_path() -> str:
    return os.environ.get("LLM_CONFIG_PATH") or os.path.join(_HERE, "model.yaml")


def _read_options() -> dict:
    with open(_options_path(), encoding="utf-8") as f:
        options = yaml.safe_load(f)
    if not isinstance(options, dict) or not isinstance(options.get("triton_config"), dict):
        raise pb_utils.TritonModelException(f"{_options_path()}: a mapping with triton_config is required")
    return options


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        triton = _read_options()["triton_config"]
        auto_complete_model_config.set_max_batch_size(int(triton["max_batch_size"]))
        auto_complete_model_config.set_model_transaction_policy({"decoupled": bool(triton["decoupled"])})
        return auto_complete_model_config

    def initialize(self, args):
        start_in_stub(args["model_name"])  # ends this process if tritonserver dies (lifeline.py)
        from specbuild.core.facts.llmapi import decoding_class
        from specbuild.engines.reference.text import load_tokenizer

        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        options = _read_options()
        self.options = options
        path = param(config, "reference_engine")
        if not path:
            raise pb_utils.TritonModelException("parameter reference_engine is required by the local model")
        # the engine runs in a process of its own (engine_common/engine_host.py: why), warmed up first
        threads = int(os.environ.get("SPECBUILD_TORCH_THREADS", DEFAULT_TORCH_THREADS))
        try:
            self.engine = EngineProcess(path, threads=threads)
        except EngineProcessError as exc:
            raise pb_utils.TritonModelException(f"tensorrt_llm: {exc}") from None
        self._restarts = RestartBudget()  # the restart rule (_restart_if_gone)
        info = self.engine.info
        self.tokenizer = load_tokenizer(info.tokenizer_dir)
        spec_cfg = options.get("speculative_config") or {}
        version = param(config, "trtllm_version", "1.2.1")
        want = None
        cls = decoding_class(info.method, version) if info.method is not None else None
        if cls is not None:
            want = cls.decoding_type
        if spec_cfg and spec_cfg.get("decoding_type") != want:
            raise pb_utils.TritonModelException(
                f"model.yaml speculative_config.decoding_type {spec_cfg.get('decoding_type')!r} is "
                f"not what the reference engine at {path} runs ({want or 'no speculation'})"
            )
        # No speculative_config: the LLM API decodes with the target alone (a deployment without
        # speculation), even when the reference build has a draft.
        self.speculate = bool(spec_cfg) and info.speculates
        self.k = int(spec_cfg.get("max_draft_len") or 0)
        if info.speculates and self.k > info.num_draft_tokens:
            raise pb_utils.TritonModelException(
                f"speculative_config.max_draft_len {self.k} exceeds the build's {info.num_draft_tokens}"
            )
        self.limits = LlmApiLimits.from_options(options)
        kv = options.get("kv_cache_config") or {}
        self.tokens_per_block = int(kv.get("tokens_per_block") or DEFAULT_TOKENS_PER_BLOCK)
        self.max_batch = max(1, int(options.get("max_batch_size") or 1))
        # how often a running request that is not streamed asks Triton whether it was cancelled (an IPC
        # round trip on the engine's thread): triton_config's cancellation_check_period_ms, upstream's
        # period for its cancellation loop (100 when absent)
        period_ms = options["triton_config"].get("cancellation_check_period_ms")
        self.check_period_s = (DEFAULT_CHECK_PERIOD_MS if period_ms is None else int(period_ms)) / 1000
        self._active = ActiveRequests()  # request id -> its running jobs (for stop requests)
        self.metrics = SpecMetrics(config.get("name", "tensorrt_llm"))  # trtllm-serve's spec-decode series
        self._worker = self._outbox = None
        if self.decoupled:  # decoupled: one worker runs the requests execute() read, one thread answers
            self._outbox = Outbox("llmapi-responses", on_error=self._send_failed)
            self._worker = EngineWorker(
                "llmapi-engine",
                self.max_batch,
                self._run,
                lambda job: self._outbox.put(lambda: job.responder.finish(self._final(job))),
            )

    @property
    def restarts(self) -> int:
        """Times the engine process was started again after it died."""
        return self._restarts.used

    def finalize(self):
        if self._worker is not None:
            left = self._worker.close()
            self._outbox.close()  # the responses the engine produced go out first, in order
            for job in left:  # never leave a request without its final response
                job.responder.finish(self._error("the model is being unloaded"))
        self.engine.close()
        self.metrics.close()  # what is still pending goes out

    @staticmethod
    def _send_failed(exc: BaseException) -> None:
        pb_utils.Logger.log_error(f"tensorrt_llm: a response could not be sent: {exc}")

    # ---- requests -------------------------------------------------------------------------------
    def execute(self, requests):
        jobs, responses = [], []
        for request in requests:
            responder = Responder(request, request.get_response_sender() if self.decoupled else None)

            def get(name, request=request):
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                return None if tensor is None else tensor.as_numpy()

            try:
                if is_stop_request(get):
                    responses.append(self._reply(responder, self._stop(request)))
                    continue
                job = self._parse(request, get, responder)
            except Exception as exc:  # noqa: BLE001 - the request's error response
                responses.append(self._reply(responder, self._error(f"Error generating request: {exc}")))
                continue
            jobs.append(job)
            responses.append(job)
        if self.decoupled:
            self._worker.submit(jobs)
            return None
        self._run(jobs)
        return [self._final(r) if isinstance(r, Job) else r for r in responses]

    def _reply(self, responder: Responder, response):
        if self.decoupled:
            responder.finish(response)
            return None
        return response

    @staticmethod
    def _error(message: str, code=None):
        if code is None:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))
        return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, code))

    def _cancelled_error(self):
        return self._error(CANCELLED_MESSAGE, getattr(pb_utils.TritonError, "CANCELLED", 1))

    def _stop(self, request):
        request_id = request.request_id()
        if not request_id:
            return self._error("A request id must be provided for request cancellation")
        for job in self._active.named(request_id):
            job.stopped = True
            job.responder.stopped = True
        return self._cancelled_error()

    def _parse(self, request, get, responder: Responder) -> Job:
        tok = self.tokenizer
        req = parse_request(
            get,
            encode=lambda text: list(tok(text)["input_ids"]),
            encode_stop=lambda text: list(tok(text, add_special_tokens=False)["input_ids"]),
            limits=self.limits,
            request_id=request.request_id(),
        )
        if req.streaming and not self.decoupled:
            raise ValueError("Streaming is only supported in decoupled mode.")
        job = Job(
            req=req,
            responder=responder,
            perf=Perf(arrival_ns=req.arrival_ns),
            reused_before=self.engine.reused,
        )
        self._active.add(req.request_id, job)
        return job

    def _params(self, req):
        from specbuild.core.sampling_params import SamplingParams

        if req.greedy:
            return SamplingParams(max_tokens=req.max_new, temperature=0.0, seed=req.seed)
        return SamplingParams(
            max_tokens=req.max_new,
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            seed=req.seed,
        )

    def _ended(self, job: Job) -> bool:
        """Should the job's row stop (asked after each of its steps; the engine process ends it at its next
        step): a `stop` request named it, or Triton cancelled it. A streamed request's every step is sent,
        and each send asks Triton afresh (on the outbox's thread): this reads that answer instead of asking
        again. Otherwise it asks at most every cancellation_check_period_ms, as upstream's model checks its
        requests: asking every POLL_S (10 ms) cost a one-call request engine time
        (lab/notebook/2026-12-03-engine-process.md)."""
        max_age_s = float("inf") if job.req.streaming and self.decoupled else self.check_period_s
        return job.stopped or job.responder.ended(max_age_s=max_age_s)

    def _run(self, jobs: list[Job]) -> None:
        """The jobs the worker took together: the ones without stop strings as one batch (they decode
        together), the others one by one (the engine process ends each at its stop words)."""
        for job in jobs:
            job.perf.scheduled()
        live = [j for j in jobs if not j.responder.ended()]
        for job in jobs:
            if job not in live:
                job.ran = True
        plain = [j for j in live if not j.req.stop_sequences]
        batches = [plain] if len(plain) > 1 else []
        batches += [[j] for j in live if not any(j in b for b in batches)]
        try:
            for batch in batches:
                self._run_batch(batch)
        finally:
            for job in jobs:
                self._active.remove(job.req.request_id, job)

    def _run_batch(self, batch: list[Job]) -> None:
        rows = [
            {
                "ids": list(j.req.prompt_ids),
                "params": self._params(j.req).to_dict(),
                "stops": [list(words) for words in j.req.stop_sequences],
            }
            for j in batch
        ]
        try:
            self._restart_if_gone()
            results = self.engine.run(
                rows,
                speculative=self.speculate,
                k=self.k if self.speculate else None,
                on_tokens=lambda i, new, ns: self._on_tokens(batch[i], new, ns),
                stop=lambda i: self._ended(batch[i]),
            )
        except EngineProcessError as exc:  # every request of the batch gets the error, now
            for job in batch:
                job.error, job.ran = exc, True
        else:
            for job, result in zip(batch, results, strict=True):
                self._done(job, result)

    def _restart_if_gone(self) -> None:
        """Before a batch: a dead engine process is started again (child_channel.RestartBudget: a crash
        that repeats leaves every later request with the error). Not when its batch failed: the
        requests it was running get their error first, at once, instead of after the engine loaded."""
        if self.engine.alive:
            return
        pb_utils.Logger.log_error("tensorrt_llm: " + self._restarts.take(self.engine.child.gone()))
        self.engine.close()
        self.engine = EngineProcess(self.engine.engine_path, threads=self.engine.threads)

    def _done(self, job: Job, result: dict) -> None:
        # the engine's counter as its last batch reported it, read on the worker's thread (the final
        # response is built on the outbox's thread while the engine runs the next request)
        job.reused = max(0, self.engine.reused - job.reused_before)  # >= 0 across a restarted engine
        job.tokens, job.ran = list(result["tokens"]), True
        job.perf.accepted, job.perf.drafted = int(result["accepted"]), int(result["drafted"])
        job.steps = [tuple(step) for step in result["steps"]]  # (accepted, drafted) per step, for the metrics
        job.finish = result["finish"]

    def _text(self, job: Job, tokens: list[int]) -> str:
        text = decode(self.tokenizer, tokens)
        return (job.req.prompt + text) if not job.req.exclude_input else text

    def _on_tokens(self, job: Job, new: list[int], ns: int) -> None:
        job.perf.token(ns)
        job.tokens += list(new)
        if job.req.streaming and new and not job.stopped:
            # built and sent on the outbox's thread while the worker reads the engine's next step
            # (streaming is decoupled only): the cumulative text of the tokens so far, the step's new tokens
            self._outbox.put(functools.partial(self._send_step, job, len(job.tokens), list(new)))

    def _send_step(self, job: Job, n: int, new: list[int]) -> None:
        """One engine step's streamed response: text_output = the text of the first n tokens (cumulative, as
        upstream's `output.text`), output_ids = the step's new tokens."""
        if job.stopped:
            return
        outputs = text_outputs(self._text(job, job.tokens[:n]), new)
        if not job.responder.send(
            pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])
        ):
            job.stopped = True  # the client is gone: the stop hook ends it at the next step

    def _final(self, job: Job):
        req = job.req
        # decoupled: finish() asks afresh before it writes, so the last answer decides what to build
        if job.responder.cancelled(max_age_s=float("inf") if self.decoupled else 0.0):
            return None if self.decoupled else self._cancelled_error()
        if job.error is not None:
            return self._error(f"Error generating request: {job.error}")
        try:  # a completed request's steps (trtllm-serve logs finished ones); never fails the request
            self.metrics.record(job.steps)
        except Exception as exc:  # noqa: BLE001 - metrics are best effort
            pb_utils.Logger.log_warn(f"tensorrt_llm: speculative metrics not updated: {exc}")
        tokens, stop_string = cut_at_stop(job.tokens, req)
        finish = "cancelled" if job.stopped else ("stop" if stop_string is not None else job.finish)
        job.perf.blocks(
            reused_tokens=job.reused,
            total_tokens=len(req.prompt_ids) + len(tokens),
            tokens_per_block=self.tokens_per_block,
        )
        outputs = text_outputs(self._text(job, tokens), [] if req.streaming else tokens)
        outputs.update(reason_outputs(req, finish, stop_string))
        if req.perf:
            outputs.update(job.perf.outputs())
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])
