"""Triton Python model standing in for Triton's LLM-API `tensorrt_llm` model: the reference engine behind
the LLM-API tensor interface (what each input does: llmapi_core.py).

* model.yaml (next to this file, or $LLM_CONFIG_PATH) holds the LLM() options and triton_config, as
  upstream: `auto_complete_config` sets max_batch_size and the decoupled policy from triton_config; the
  options give the limits (max_seq_len, max_num_tokens, enable_chunked_prefill), the batch size and
  `speculative_config` (its decoding_type must be what the reference engine's build runs, its
  max_draft_len the K of every request; without it the target decodes alone, as
  the LLM API does without speculation). The config.pbtxt parameter `reference_engine` names the
  `compile --flow llmapi --engine reference` build the engine loads.
* decoupled (specbuild's repositories): `execute` hands the requests to one worker thread and returns,
  so concurrent requests reach the engine together: requests waiting when a batch starts decode
  together (up to max_batch_size; the engine's lockstep batch, draft/target included), later ones in the
  next batch. This is the reference engine's batching, not TensorRT-LLM's in-flight batching, which
  admits requests between steps.
* responses (decoupled): one thread of their own (engine_worker.Outbox) builds and sends them, in the
  order the engine produced them: a streamed step's response (its cumulative text detokenized, the
  tensors, the cancellation ask and the send, each ask and send an IPC round trip to the server) is
  built and sent while the engine runs the next step; the final response goes the same way, after the
  request's last step. A streamed request's stop hook reads the answer of its last send's ask instead
  of asking again (each step's send asks afresh); a request that is not streamed is asked at most
  every cancellation_check_period_ms (triton_config; 100 as upstream's cancellation loop).
* not decoupled: each request runs inside `execute`.
* cancellation: Triton's (the client gone) ends the work within a step and writes nothing but the final
  flag (writing outputs for a gone client is what the 2.51 frontend can crash on, responder.py); a
  `stop` request ends the requests with its id within a step: they end with what they produced and
  finish_reason "cancelled" (the LLM API's CompletionOutput value for an aborted request; whether
  upstream's model sends that final output or an error is UNVERIFIED), and the stop request itself is
  answered "Request cancelled by client" (CANCELLED), as upstream.
* EAGLE-3 is not run by the reference engine: such a repository fails to load here (serve it on a GPU).
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

from engine_worker import ActiveRequests, EngineWorker, Outbox  # noqa: E402
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
from words import param, stop_at_words  # noqa: E402

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
        import torch

        from specbuild.core.llmapi_facts import DECODINGS, release
        from specbuild.engines.reference.engine import ReferenceEngine

        torch.set_num_threads(int(os.environ.get("SPECBUILD_TORCH_THREADS", DEFAULT_TORCH_THREADS)))
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        options = _read_options()
        self.options = options
        path = param(config, "reference_engine")
        if not path:
            raise pb_utils.TritonModelException("parameter reference_engine is required by the local model")
        self.engine = ReferenceEngine.load(path)
        spec_cfg = options.get("speculative_config") or {}
        version = param(config, "trtllm_version", "1.2.1")
        want = None
        if self.engine.method is not None and self.engine.method.value in DECODINGS:
            cls = release(version).classes[DECODINGS[self.engine.method.value].config_class]
            want = cls.decoding_type
        if spec_cfg and spec_cfg.get("decoding_type") != want:
            raise pb_utils.TritonModelException(
                f"model.yaml speculative_config.decoding_type {spec_cfg.get('decoding_type')!r} is "
                "not what the "
                ""
                f"reference engine at {path} runs ({want or 'no speculation'}); the reference engine "
                "does not "
                "run EAGLE-3"
            )
        # No speculative_config: the LLM API decodes with the target alone (a deployment without
        # speculation), even when the reference build has a draft.
        self.speculate = bool(spec_cfg) and self.engine.speculates
        self.k = int(spec_cfg.get("max_draft_len") or 0)
        if self.engine.speculates and self.k > self.engine.num_draft_tokens:
            raise pb_utils.TritonModelException(
                f"speculative_config.max_draft_len {self.k} exceeds the build's "
                f"{self.engine.num_draft_tokens}"
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
        self._warm_up()
        self._worker = self._outbox = None
        if self.decoupled:  # decoupled: one worker runs the requests execute() read, one thread answers
            self._outbox = Outbox("llmapi-responses", on_error=self._send_failed)
            self._worker = EngineWorker(
                "llmapi-engine",
                self.max_batch,
                self._run,
                lambda job: self._outbox.put(lambda: job.responder.finish(self._final(job))),
            )

    def _warm_up(self) -> None:
        from specbuild.core.sampling_params import SamplingParams

        self.engine.generate([0], SamplingParams(max_tokens=2, end_id=-1), speculative=self.speculate)

    def finalize(self):
        if self._worker is not None:
            left = self._worker.close()
            self._outbox.close()  # the responses the engine produced go out first, in order
            for job in left:  # never leave a request without its final response
                job.responder.finish(self._error("the model is being unloaded"))
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
        tok = self.engine.tokenizer
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
            reused_before=self.engine.prefix_cache.reused_tokens,
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

    def _hook(self, job: Job):
        words = stop_at_words(job.req.stop_sequences)
        # A streamed request's every step is sent, and each send asks Triton afresh (on the outbox's
        # thread): the hook reads that answer instead of asking again. Otherwise it asks at most every
        # cancellation_check_period_ms, as upstream's model checks its requests: asking every POLL_S
        # (10 ms) cost a one-call request 4.5% of the engine thread's time on this machine (py-spy,
        # 2026-12-03).
        max_age_s = float("inf") if job.req.streaming and self.decoupled else self.check_period_s

        def stop(out, start):
            if job.stopped or job.responder.ended(max_age_s=max_age_s):
                return len(out)
            return words(out, start) if words else None

        return stop

    def _run(self, jobs: list[Job]) -> None:
        for job in jobs:
            job.perf.scheduled()
        live = [j for j in jobs if not j.responder.ended()]
        for job in jobs:
            if job not in live:
                job.ran = True
        plain = [j for j in live if not j.req.stop_sequences]
        try:
            if len(plain) > 1:
                hooks = [self._hook(j) for j in plain]
                try:
                    results = self.engine.generate_batch(
                        [j.req.prompt_ids for j in plain],
                        [self._params(j.req) for j in plain],
                        speculative=self.speculate,
                        num_draft_tokens=self.k if self.speculate else None,
                        on_tokens=lambda i, new: self._on_tokens(plain[i], new),
                        stop=lambda i, out, start: hooks[i](out, start),
                    )
                except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error
                    for job in plain:
                        job.error, job.ran = exc, True
                else:
                    for job, result in zip(plain, results, strict=True):
                        self._done(job, result)
            for job in live:
                if not job.ran:
                    try:
                        result = self.engine.generate(
                            job.req.prompt_ids,
                            self._params(job.req),
                            speculative=self.speculate,
                            num_draft_tokens=self.k if self.speculate else None,
                            on_tokens=lambda new, job=job: self._on_tokens(job, new),
                            stop=self._hook(job),
                        )
                    except Exception as exc:  # noqa: BLE001 - the request's error response
                        job.error = exc
                        job.ran = True
                    else:
                        self._done(job, result)
        finally:
            for job in jobs:
                self._active.remove(job.req.request_id, job)

    def _done(self, job: Job, result) -> None:
        # the engine's counter is read here, on the engine's thread (the final response is built on the
        # outbox's thread while the engine runs the next request)
        job.reused = self.engine.prefix_cache.reused_tokens - job.reused_before
        job.tokens, job.ran = list(result.token_ids), True
        job.perf.accepted, job.perf.drafted = result.stats.accepted, result.stats.drafted
        job.steps = result.stats.steps  # (accepted, drafted) per verification step, for the metrics
        job.finish = result.finish_reason

    def _text(self, job: Job, tokens: list[int]) -> str:
        text = self.engine.decode(tokens)
        return (job.req.prompt + text) if not job.req.exclude_input else text

    def _on_tokens(self, job: Job, new: list[int]) -> None:
        job.perf.token()
        job.tokens += list(new)
        if job.req.streaming and new and not job.stopped:
            # built and sent on the outbox's thread while the engine runs its next step (streaming is
            # decoupled only): the cumulative text of the tokens so far, the step's new tokens
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
