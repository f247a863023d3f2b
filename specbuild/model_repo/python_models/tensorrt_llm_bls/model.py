"""Triton Python model `tensorrt_llm_bls`: text in, text out, draft/target speculation.

Decoupled or not, as the repository chose (model_repo/transaction.py): decoupled, a request may stream
(stream=true); not decoupled, each request gets exactly one response (unary gRPC ModelInfer, HTTP infer)
and stream=true is refused with the C++ backend's "Streaming is only supported if model is deployed
using decoupled mode." (a cancelled request's one response is a CANCELLED error).

* num_draft_tokens > 0 (or the repository's default when the request omits it) and a drafter
  configured (`bls_drafter`, named by the repository's method): the shared speculative loop
  (specbuild.engines.reference.speculative) runs with that Drafter (draft/target: calls to
  `tensorrt_llm_draft`) and a Verifier calling `tensorrt_llm` with draft_input_ids (+ draft_logits
  when use_draft_logits). acceptance_rate / total_accepted_draft_tokens / total_draft_tokens cover the
  whole request. With stream=true each round's accepted tokens are sent as they are accepted.
* otherwise the request goes to `tensorrt_llm` alone (streamed when that model is decoupled: Medusa);
  a streamed num_draft_tokens = 0 request of a draft/target repository (its target is not decoupled, as
  upstream's draft/target repositories) runs the loop without drafts: one target call per token, each
  token streamed as it comes (the baseline's TTFT and ITL are then measured like the speculative ones).

Responses: text_output is flat (one string per request: `as_numpy("text_output")[0]`); streamed chunks
are deltas (concatenate them); output_ids / sequence_length are the token ids of each response (the
prompt first in a non-streamed answer when exclude_input_in_output is false, upstream's default); the
last response carries the COMPLETE_FINAL flag, the remaining text and, with return_perf_metrics, the
perf outputs (return_num_input_tokens / return_num_output_tokens: the token counts). With
return_perf_metrics every streamed response carries every perf output too, as upstream's backend fills
them on each response (model_instance_state.cc fillTritonResponse): the loop's counters and times so
far, or (the target streams: Medusa) what tensorrt_llm sent with those tokens.

Limits: with the engines' limits in its parameters (`max_prompt_tokens`, `max_total_tokens`, from the
engines' build_config) the BLS refuses a prompt or prompt + max_tokens the engines would refuse or cut.
Cancellation: Triton's cancellation of the request (or the client gone) is checked before every engine
call and every response (responder.py), so work stops within one round; a streamed Medusa call is
ended with a `stop` request to tensorrt_llm (the 2.51 stub cannot cancel a BLS call). A cancelled
request gets a flags-only final response.
Production repositories ship the needed specbuild modules in ./vendor (no specbuild in the container).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from collections import deque

import numpy as np
import triton_python_backend_utils as pb_utils

_HERE = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.join(_HERE, "vendor"), _HERE):
    if os.path.isdir(_path) and _path not in sys.path:
        sys.path.insert(0, _path)

import bls_core  # noqa: E402
from bls_core import (  # noqa: E402
    NO_TIMERS,
    PERF_OUTPUTS,
    BlsOptions,
    NoTimers,
    RequestTimers,
    TextStream,
    detokenize,
    engine_inputs,
    new_tokens,
    perf_outputs,
    preprocess,
    speculate,
    streamed_perf,
)
from bls_metrics import FallbackCounter  # noqa: E402
from inflight import InflightCounter, counter_path, remove_stale  # noqa: E402
from lifeline import start_in_stub  # noqa: E402
from responder import POLL_S, Responder, cancelled_error  # noqa: E402
from words import flag, param  # noqa: E402

# A folder: each request's timers are appended to FOLDER/bls-<pid>.jsonl (TimingObserver; bench-serve reads
# them); unset: nothing is observed (Observer).
TIMINGS_ENV = "SPECBUILD_BLS_TIMINGS"
_NUMPY_LOGITS = {"TYPE_FP32": "float32", "TYPE_FP16": "float16", "TYPE_BF16": "float32"}  # no numpy bf16

# How long a finished decoupled call's response iterator is kept (StreamParking): the stub's own
# reference to it goes within milliseconds of the final response; seconds leave room for a starved CPU.
PARK_S = 5.0


class StreamParking:
    """Keeps each finished `exec(decoupled=True)` response iterator, and drops it PARK_S later on the
    model's own thread (it holds the GIL there).

    Why (tritonserver 2.51, python_backend r24.10, src/pb_stub.cc and src/pb_response_iterator.cc): the
    iterator keeps every response it delivered, and two references own it: the caller's and the stub's
    map of iterators, which the stub's utils thread erases after the final response
    (Stub::SendCleanupId). Whichever goes last destroys the iterator and, with it, the numpy array of
    each response's outputs. When the caller lets go first, that happens on the utils thread without
    the GIL (gdb on the demo's Medusa BLS: 1 destruction in 8 streamed requests), a race on Python's
    object allocator that corrupts it: the BLS stub's segfault in _PyObject_Malloc in a failed
    `make demo`, which Triton reported as "Stub process 'tensorrt_llm_bls_0_3' is not healthy".
    Upstream's fix (python_backend PR #390, r25.01: ~PbTensor takes the GIL) is not in 2.51."""

    def __init__(self, hold_s: float = PARK_S, clock=time.monotonic):
        self.hold_s, self.clock = hold_s, clock
        self._lot: deque = deque()  # (parked at, iterator), oldest first

    def park(self, iterator) -> None:
        self.release(older_than_s=self.hold_s)
        self._lot.append((self.clock(), iterator))

    def release(self, older_than_s: float = 0.0) -> None:
        """Drop the iterators parked more than older_than_s ago (0: all of them, the model's finalize)."""
        cutoff = self.clock() - older_than_s
        while self._lot and self._lot[0][0] <= cutoff:
            self._lot.popleft()

    def __len__(self) -> int:
        return len(self._lot)


class Cancelled(Exception):
    """The request was cancelled (its client is gone): stop the work, write nothing more."""


class RoundGate:
    """Asks Triton whether the request was cancelled once per round of the loop (before the round's
    first engine call; each ask is an IPC round trip); the other checks of the round reuse the answer.
    Responses still ask afresh (Responder.send). The round's ask is kept even right after a streamed
    response's: a cancellation that arrives in between stops the work before the next round's engine
    calls, and an ask costs ~0.06 ms here (bench-serve --floor)."""

    def __init__(self, responder: Responder):
        self.responder, self.fresh = responder, True

    def cancelled(self) -> bool:
        fresh, self.fresh = self.fresh, False
        return self.responder.cancelled(max_age_s=0.0 if fresh else float("inf"))

    def next_round(self) -> None:
        self.fresh = True


class TimedResponder(Responder):
    """A Responder that adds its Triton asks and sends to the request's timers (SPECBUILD_BLS_TIMINGS);
    a send's own ask counts as an ask."""

    def __init__(self, request, sender, timers: RequestTimers):
        super().__init__(request, sender)
        self.timers = timers

    def _ask(self) -> bool:
        asks, t0 = self.asks, time.perf_counter_ns()
        try:
            return super()._ask()
        finally:
            if self.asks != asks:
                self.timers.add_ask(time.perf_counter_ns() - t0)

    def send(self, response) -> bool:
        t0, asked = time.perf_counter_ns(), self.timers.ask_ns
        try:
            return super().send(response)
        finally:
            self.timers.add_send(time.perf_counter_ns() - t0 - (self.timers.ask_ns - asked))

    def finish(self, response=None) -> None:
        t0, asked = time.perf_counter_ns(), self.timers.ask_ns
        try:
            super().finish(response)
        finally:
            self.timers.add_send(time.perf_counter_ns() - t0 - (self.timers.ask_ns - asked))


class Observer:
    """The BLS's measurement hooks, one small interface: for each request, the responder that sends its
    responses and the timers its engine calls report to, and `done` when it ended. This one observes
    nothing (plain Responder, NO_TIMERS); TimingObserver is the SPECBUILD_BLS_TIMINGS one."""

    def request(self, request) -> tuple[Responder, RequestTimers | NoTimers]:
        return Responder(request, request.get_response_sender()), NO_TIMERS

    def done(self, timers) -> None:
        pass


class TimingObserver(Observer):
    """Times each request's engine calls, sends and asks (RequestTimers) and appends its row to
    FOLDER/bls-<pid>.jsonl (bench-serve's `bls_breakdown` reads them)."""

    def __init__(self, folder: str):
        self.path = os.path.join(folder, f"bls-{os.getpid()}.jsonl")

    def request(self, request) -> tuple[Responder, RequestTimers]:
        timers = RequestTimers()
        return TimedResponder(request, request.get_response_sender(), timers), timers

    def done(self, timers) -> None:
        timers.write(self.path)


def _token_outputs(tokens: list[int]) -> dict:
    """The response's token ids (specbuild addition): output_ids [1, 1, n], sequence_length [1, 1]."""
    return {
        "output_ids": np.array(tokens, dtype=np.int32).reshape(1, 1, -1),
        "sequence_length": np.array([[len(tokens)]], dtype=np.int32),
    }


def _text_output(text: str) -> np.ndarray:
    return np.array([text.encode()], dtype=object)  # [b * beams] = [1]: flat, as upstream


class TritonPythonModel:
    def initialize(self, args):
        # ends this process if tritonserver dies (lifeline.py), removing the server's in-flight counter
        start_in_stub(args["model_name"], on_gone=[remove_stale])
        config = json.loads(args["model_config"])
        self.target = param(config, "tensorrt_llm_model_name", "tensorrt_llm")
        self.draft = param(config, "tensorrt_llm_draft_model_name") or None
        # the repository's method names its BLS drafter ("bls_core:TritonDrafter"; empty: the target
        # speculates)
        drafter = param(config, "bls_drafter")
        self.fallbacks = FallbackCounter(args.get("model_name", "tensorrt_llm_bls"))
        self.drafter_factory = (
            bls_core.drafter_factory(
                drafter,
                lambda key, default: param(config, key, default),
                model_dir=args.get("model_repository", _HERE),
                log=pb_utils.Logger.log_warn,
                count=self.fallbacks.count,
            )
            if drafter
            else None
        )
        # decoupled (the repository's choice, model_repo/transaction.py): streams; else one response each
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.target_decoupled = flag(param(config, "tensorrt_llm_decoupled", "false"))
        self.default_k = int(param(config, "default_num_draft_tokens", "0"))
        self.default_use_logits = flag(param(config, "default_use_draft_logits", "false"))
        inputs = {t["name"] for t in config["input"]}
        self.seed_name = "seed" if "seed" in inputs else "random_seed"
        self.min_tokens_name = "min_tokens" if "min_tokens" in inputs else "min_length"
        from specbuild.core.engine_limits import RequestLimits

        prompt_limit, total_limit = param(config, "max_prompt_tokens"), param(config, "max_total_tokens")
        self.limits = (
            RequestLimits(int(prompt_limit), int(total_limit)) if prompt_limit and total_limit else None
        )
        outputs = {t["name"]: t["data_type"] for t in config["output"]}
        self.logits_dtype = _NUMPY_LOGITS.get(outputs.get("generation_logits", "TYPE_FP32"), "float32")
        if getattr(self.drafter_factory, "draft_logits", self.drafter_factory is not None):
            # torch (draft logits) now, not in the first request
            import specbuild.engines.reference.sampling  # noqa: F401
        # Load-aware K (core/perf/schedule.py): the schedule applies to requests that leave num_draft_tokens
        # out;
        # the in-flight count is shared by every instance of this model (inflight.py).
        from specbuild.core.perf.schedule import (
            INFLIGHT_HOLD_MS,
            PLAIN_ROUND_GROWTH,
            AcceptanceGuard,
            DraftSchedule,
        )

        schedule, guard = param(config, "draft_len_schedule"), param(config, "acceptance_guard")
        self.schedule = (
            DraftSchedule.from_text(schedule, max_draft_len=self.default_k, first_is_max=False)
            if schedule
            else None
        )
        window, _, floor = (guard or "").partition(":")
        self.guard = AcceptanceGuard(int(window), float(floor)) if guard else None
        self.plain_tokens = int(param(config, "plain_round_tokens", "1"))
        # a streamed request's K=0 rounds ask 1, g, g^2, ... tokens up to plain_tokens (core/perf/schedule.py)
        self.plain_growth = int(param(config, "plain_round_growth", str(PLAIN_ROUND_GROWTH)))
        # the count a round reads stays for this long at what it was when a request ended (inflight.py)
        self.hold_ms = float(param(config, "inflight_hold_ms", str(INFLIGHT_HOLD_MS)))
        # Detokenizing here (the postprocessing model's tokenizer and options, so the text is the same) saves
        # an IPC round trip to `postprocessing` per streamed round and per final response.
        self.tokenizer = None
        tokenizer_dir = param(config, "tokenizer_dir")
        if tokenizer_dir:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(
                tokenizer_dir, legacy=False, trust_remote_code=False
            )
            self.skip_special_tokens = flag(param(config, "skip_special_tokens", "true"))
        timings = os.environ.get(TIMINGS_ENV) or None
        self.observer = TimingObserver(timings) if timings else Observer()
        self.parking = StreamParking()
        self.inflight = None
        if self.schedule is not None:
            remove_stale()
            self.inflight = InflightCounter(counter_path(args["model_repository"], args["model_name"]))

    def finalize(self):
        self.parking.release()  # the stub dropped its references before finalize (its FinalizeRequest)
        self.fallbacks.close()
        if self.inflight is not None:
            self.inflight.close()

    # ---- Triton plumbing ------------------------------------------------------------------------
    def _caller(self, responder: Responder, rounds: RoundGate, timers: RequestTimers | NoTimers = NO_TIMERS):
        """call(model, inputs, output_names) for one request: refuses to start an engine call once the
        request is cancelled (asked before each round's first call: a round is at most one draft call
        and one target call). Each exec's wall time goes to the request's timers."""

        def call(model: str, inputs: dict, output_names: list[str]) -> dict:
            if rounds.cancelled():
                raise Cancelled
            request = pb_utils.InferenceRequest(
                model_name=model,
                requested_output_names=output_names,
                inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()],
            )
            t0 = time.perf_counter_ns()
            response = request.exec()
            timers.add_exec(model, time.perf_counter_ns() - t0)
            return self._outputs(model, response, output_names)

        return call

    def _stream(self, model: str, inputs: dict, output_names: list[str], responder: Responder):
        """A call to a decoupled model: yields each data response's outputs. When the request is cancelled
        (or the caller stops reading), a `stop` request with the call's request id ends the engine's work
        and the stream is drained to its final response. An error response ends the call (RuntimeError) with
        no `stop`: the engine's request ended with it (its final response), and a `stop` would wait in the
        model's queue, behind a restart of its engine process, before the error reached the client. A stream
        whose final response has no outputs and that this request did not cancel failed (RuntimeError):
        tensorrt_llm ends a stream with its outputs, and tritonserver 2.51 does not deliver to this iterator
        an error response that follows data responses (the local model sends the final flag alone after it:
        tensorrt_llm_local/model.py _send_final)."""
        inner_id = f"bls-{uuid.uuid4().hex}"
        request = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=output_names,
            request_id=inner_id,
            inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()],
        )
        responses = request.exec(decoupled=True)
        finished = False
        empty = True  # the last response carried no outputs
        try:
            for response in responses:
                if responder.cancelled(max_age_s=POLL_S):
                    break
                finished = response.has_error()  # raised just below: nothing left to stop or drain
                outputs = self._outputs(model, response, output_names)
                empty = outputs.get("output_ids") is None
                if not empty:
                    yield outputs
            else:
                finished = True
        finally:
            if not finished:
                self._send_stop(model, inner_id)
                for _ in responses:  # drain: the engine answers the stopped request with a final response
                    pass
            self.parking.park(responses)
        if not finished or (empty and responder.cancelled()):
            raise Cancelled
        if empty:
            raise RuntimeError(f"{model}: the stream ended without its outputs (see the server's log)")

    def _send_stop(self, model: str, request_id: str) -> None:
        """The backend's stop request: input stop = true with the request id to end (placeholder inputs)."""
        stop = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=[],
            request_id=request_id,
            inputs=[
                pb_utils.Tensor("input_ids", np.zeros((1, 1), dtype=np.int32)),
                pb_utils.Tensor("input_lengths", np.zeros((1, 1), dtype=np.int32)),
                pb_utils.Tensor("request_output_len", np.zeros((1, 1), dtype=np.int32)),
                pb_utils.Tensor("stop", np.ones((1, 1), dtype=bool)),
            ],
        )
        responses = stop.exec(decoupled=True)
        for _ in responses:
            pass
        self.parking.park(responses)

    @staticmethod
    def _outputs(model: str, response, output_names: list[str]) -> dict:
        if response.has_error():
            raise RuntimeError(f"{model}: {response.error().message()}")
        out = {}
        for name in output_names:
            tensor = pb_utils.get_output_tensor_by_name(response, name)
            if tensor is not None:
                out[name] = tensor.as_numpy()
        return out

    @staticmethod
    def _response(outputs: dict):
        return pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(k, v) for k, v in outputs.items()])

    def execute(self, requests):
        for request in requests:
            responder, timers = self.observer.request(request)
            try:
                if self.inflight is not None:
                    with self.inflight.handling(self.hold_ms):
                        final = self._handle(request, responder, timers)
                else:
                    final = self._handle(request, responder, timers)
            except Cancelled:
                pb_utils.Logger.log_info(f"tensorrt_llm_bls: request '{request.request_id()}' cancelled")
                final = None  # decoupled: flags only (the client is gone); else the CANCELLED error
            except Exception as exc:  # every failure becomes the request's error response
                final = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm_bls: {exc}"))
            if self.decoupled:
                responder.finish(final)
            else:  # the one response a non-decoupled model sends, through its response sender
                responder.finish_one(final if final is not None else cancelled_error("tensorrt_llm_bls"))
            self.observer.done(timers)
        return None

    # ---- one request ----------------------------------------------------------------------------
    def _handle(self, request, responder: Responder, timers: RequestTimers | NoTimers = NO_TIMERS):
        """One request, its streamed responses sent; returns its final response."""
        arrival = time.time_ns()

        def get(name):
            tensor = pb_utils.get_input_tensor_by_name(request, name)
            return None if tensor is None else tensor.as_numpy()

        opts = BlsOptions.from_inputs(
            get,
            default_num_draft_tokens=self.default_k,
            default_use_draft_logits=self.default_use_logits,
            seed_name=self.seed_name,
            min_tokens_name=self.min_tokens_name,
        )
        if opts.stream and not self.decoupled:  # the C++ backend's words for the same refusal
            raise ValueError("Streaming is only supported if model is deployed using decoupled mode.")
        if opts.k_given and self.drafter_factory is not None and opts.num_draft_tokens > self.default_k:
            # the engines refuse more drafts than their max_draft_len (the backend's words), but a round
            # drafts at most the tokens left: refuse now, quoting the number asked for
            raise ValueError(
                f"Draft tokens length ({opts.num_draft_tokens}) exceeds maximum draft tokens length "
                f"({self.default_k}): num_draft_tokens {opts.num_draft_tokens} asked for"
            )
        rounds = RoundGate(responder)
        call = self._caller(responder, rounds, timers)
        prep = preprocess(call, opts)
        if not prep.prompt_ids:
            raise ValueError("the prompt has no tokens (empty text_input)")
        if self.limits is not None:
            self.limits.check(len(prep.prompt_ids), opts.max_tokens)
        detok = self._detokenizer(call)
        text = TextStream(detok)
        times = {"first": None, "last": None}

        def counts(tokens: list[int]) -> dict:
            out = {}
            if opts.return_num_input_tokens:
                out["num_input_tokens"] = np.array([[len(prep.prompt_ids)]], dtype=np.int32)
            if opts.return_num_output_tokens:
                out["num_output_tokens"] = np.array([[len(tokens)]], dtype=np.int32)
            return out

        gone = [False]  # a streamed response could not be sent: the client is gone

        def ended() -> bool:  # the loop's stop hook, once per round: the next round asks Triton afresh
            rounds.next_round()
            return gone[0] or responder.cancelled(max_age_s=float("inf"))

        def on_tokens(tokens, shared=None, target_perf=None):
            """One round's (or the target's streamed response's) tokens; streamed, sent with every perf
            output as upstream's backend fills them on each response (the loop's counters so far, or
            what the streaming target sent with these tokens)."""
            times["first"] = times["first"] or time.time_ns()
            times["last"] = time.time_ns()
            if opts.stream and not gone[0]:
                delta = text.push(tokens)
                outputs = {"text_output": _text_output(delta), **_token_outputs(tokens), **counts(tokens)}
                if opts.return_perf_metrics:
                    if shared is not None:
                        outputs.update(
                            streamed_perf(
                                shared,
                                arrival_ns=arrival,
                                first_token_ns=times["first"],
                                last_token_ns=times["last"],
                            )
                        )
                    elif target_perf:
                        outputs.update(target_perf)
                gone[0] = not responder.send(self._response(outputs))

        scheduled = self.schedule is not None and not opts.k_given
        # A streamed target-alone request (num_draft_tokens 0) to a target that cannot stream (not
        # decoupled: the BLS calls it round by round) runs the same loop with no drafts: one target call
        # per token through its prefix cache, each token sent as it comes (a real baseline stream; every
        # token pays one BLS -> target call, docs/bench.md "Baseline stream overhead").
        stream_baseline = opts.stream and opts.num_draft_tokens == 0 and not self.target_decoupled
        if self.drafter_factory is not None and (opts.num_draft_tokens > 0 or stream_baseline):
            # the loop's stop hook asks after every round: a cancelled request ends within one round
            k_of = (
                (lambda: self.schedule.k_for(self.inflight.held_total(self.hold_ms))) if scheduled else None
            )
            tokens, stats, shared = speculate(
                call,
                opts,
                prep,
                drafter_factory=self.drafter_factory,
                draft_model=self.draft,
                target_model=self.target,
                seed_name=self.seed_name,
                logits_dtype=self.logits_dtype,
                on_tokens=on_tokens,
                stop=lambda out, start: len(out) if ended() else None,
                k_of=k_of,
                guard=self.guard,
                plain_tokens=self.plain_tokens,
                plain_growth=self.plain_growth,
            )
            perf = perf_outputs(
                accepted=stats.accepted,
                drafted=stats.drafted,
                guard_stopped=stats.guard_stopped,
                arrival_ns=arrival,
                first_scheduled_ns=shared.first_call_ns,
                first_token_ns=times["first"],
                last_token_ns=times["last"],
                kv=shared.first_perf.get("target", {}),
                draft_kv=shared.first_perf.get("draft"),  # None: the draft never ran (the baseline)
            )
        else:
            tokens, perf = self._plain(call, opts, prep, on_tokens, responder, ended)
        if ended():
            raise Cancelled  # nothing more to write: the client is gone
        if opts.stream:
            final_tokens, final_text = [], text.flush()
        elif not opts.exclude_input_in_output:
            final_tokens = prep.prompt_ids + tokens
            final_text = detok(final_tokens)
        else:
            final_tokens, final_text = tokens, detok(tokens)
        outputs = {
            "text_output": _text_output(final_text),
            **_token_outputs(final_tokens),
            **counts(final_tokens),
        }
        if opts.return_perf_metrics:
            outputs.update(perf)
        return self._response(outputs)

    def _detokenizer(self, call):
        """tokens -> text: the BLS's own tokenizer when it has one, else a call to `postprocessing`."""
        if self.tokenizer is None:
            return lambda tokens: detokenize(call, tokens)
        return lambda tokens: (
            self.tokenizer.decode(tokens, skip_special_tokens=self.skip_special_tokens) if tokens else ""
        )

    def _plain(self, call, opts: BlsOptions, prep, on_tokens, responder: Responder, ended):
        """No speculation in the BLS: tensorrt_llm alone (Medusa speculates inside it)."""
        stream = opts.stream and self.target_decoupled
        inputs = engine_inputs(
            prep.prompt_ids, opts.max_tokens, opts, prep, seed_name=self.seed_name, seed=opts.seed
        )
        inputs["streaming"] = np.array([[stream]])
        inputs["return_perf_metrics"] = np.array([[True]])
        wanted = ["output_ids", "sequence_length", *PERF_OUTPUTS]
        if self.target_decoupled:
            if responder.cancelled():
                raise Cancelled
            responses = self._stream(self.target, inputs, wanted, responder)
        else:
            responses = [call(self.target, inputs, wanted)]
        tokens, perf = [], {}
        for out in responses:
            new = new_tokens(out)
            tokens += new
            now = {name: out[name] for name in PERF_OUTPUTS if out.get(name) is not None}
            if new:
                on_tokens(new, target_perf=now)  # forwarded as upstream's BLS forwards each response
                if ended():
                    raise Cancelled
            perf.update(now)
        return tokens, perf
