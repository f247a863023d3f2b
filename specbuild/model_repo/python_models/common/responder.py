"""One request's responses, sent so that the server never writes outputs for a request that is gone.

Copied into every Python model of a generated repository. A decoupled model's responses go through a
`Responder`:
* never after the final flag (the stub refuses it; a model must not try);
* no data response once the request is cancelled: Triton's cancellation (the client closed the stream,
  `stop_stream(cancel_requests=True)`, a deadline) or a `stop` request for the same request id. A
  cancelled request gets only a flags-only final response, which allocates no output buffer. Writing
  outputs for a request whose client is gone is what the tritonserver 2.51 gRPC frontend can crash on
  (signal 11 in TRITONBACKEND_OutputBuffer, seen after a cancelled Medusa stream; server issues
  #7840 / #8034 fix races of this family in later releases).

`cancelled()` asks Triton (`response_sender.is_cancelled()` / `request.is_cancelled()`, what the 2.51
Python backend stub offers). **No ask after the final response, and none while it is sent**: the Python
backend's server side deletes the request's response factory as it handles the final flag (python_be.cc,
ResponseSendDecoupled), and an ask names that factory (TRITONBACKEND_ResponseFactoryIsCancelled), so an ask
from another thread (a model's cancellation watcher) that lands after the final send reads freed memory:
tritonserver 2.51 dies of signal 11 in TRITONBACKEND_ResponseFactoryIsCancelled
(lab/notebook/2026-12-03-engine-process.md). The asks and the sends take one lock, and once closed the last
answer stands.

Each ask is an IPC round trip from the stub to the server, so the hot loops ask with `max_age_s` (the
answer of an ask younger than that is reused): the engine models' per-step stop hooks at most every POLL_S
(a local engine model counts a request's arrival as an answer: `handed_over`; the LLM-API model's streamed
requests reuse their sends' answers), the BLS once per round (before the round's first engine call).
`send` always asks afresh, so no data response is written for a request known cancelled.
Cancelled work stops within one round (BLS) or POLL_S (an engine call).
"""

from __future__ import annotations

import threading
import time

import triton_python_backend_utils as pb_utils

# Longest reuse of a cancellation answer inside one engine call (per-step stop hooks): a step of the
# reference engine takes ~1-10 ms here, and every ask costs the Python backend an IPC round trip.
POLL_S = 0.01


class Responder:
    """Wraps a request and (decoupled) its response sender."""

    def __init__(self, request, sender=None):
        self.request, self.sender = request, sender
        self.closed = False  # the final response went out
        self.stopped = (
            False  # a `stop` request named this request's id (its client still reads: outputs allowed)
        )
        self._cancelled = False
        self._asked = float("-inf")  # time.monotonic() of the last ask
        self.asks = 0  # asks that went to Triton (each one an IPC round trip)
        self.sent = 0  # non-final responses sent
        # asks and sends take turns, and no ask follows the final send (module docstring)
        self._lock = threading.Lock()

    def handed_over(self) -> Responder:
        """Triton just handed the request to `execute`: count that as an answer "not cancelled" for the
        asks that reuse a young answer (max_age_s), so a short call does not ask right after it arrived.
        Triton core checks for cancelled requests where the dynamic batcher releases them (Triton's
        request_cancellation docs); a plain ask (max_age_s 0: `send`, `finish`) still goes to Triton."""
        self._asked = time.monotonic()
        return self

    def ended(self, max_age_s: float = 0.0) -> bool:
        """Should the work stop: a `stop` request, or Triton's cancellation."""
        return self.stopped or self.cancelled(max_age_s)

    def cancelled(self, max_age_s: float = 0.0) -> bool:
        """Triton cancelled the request (its client is gone or gave up): no outputs may be written.
        max_age_s > 0: the last answer is reused when it is younger than that."""
        if self._cancelled:
            return True
        if max_age_s > 0 and time.monotonic() - self._asked < max_age_s:
            return False
        with self._lock:
            return self._ask()

    def _ask(self) -> bool:
        """One ask to Triton, with the lock held; none once the final response went out (the last answer)."""
        if self.closed or self._cancelled:
            return self._cancelled
        self._asked = time.monotonic()
        self.asks += 1
        try:
            source = self.sender if self.sender is not None else self.request
            self._cancelled = bool(source.is_cancelled())
        except Exception:  # noqa: BLE001 - a stub without cancellation support: never cancelled
            self._cancelled = False
        return self._cancelled

    def send(self, response) -> bool:
        """A non-final data response; nothing is sent (False) once cancelled or closed."""
        if self._cancelled:
            return False
        with self._lock:
            if self.closed or self._ask():
                return False
            self.sender.send(response)
            self.sent += 1
            return True

    def finish(self, response=None) -> None:
        """The final response (at most once): flags only when there is nothing to send or the request is
        cancelled."""
        with self._lock:
            if self.closed:
                return
            write = response is not None and not self._ask()
            self.closed = True
            if write:
                self.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                self.sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finish_one(self, response) -> None:
        """A non-decoupled request's one response, with the final flag (at most once): the Python backend
        lets a non-decoupled model answer through the response sender, exactly one response each (a
        cancelled request's is its CANCELLED error, which writes no outputs)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def cancelled_error(model: str):
    """The error a non-decoupled model returns for a cancelled request (no outputs are written)."""
    return pb_utils.InferenceResponse(
        error=pb_utils.TritonError(
            f"{model}: the request was cancelled", getattr(pb_utils.TritonError, "CANCELLED", 1)
        )
    )
