"""One bidirectional gRPC stream that a `Session` keeps open across its requests.

tritonclient opens a stream with a thread of its own (`start_stream`) and closes it with a round trip to
the server that joins that thread (`stop_stream`), about a millisecond together, paid by every streamed
request when each opens its own (lab/notebook/2026-12-03-engine-process.md). A Session sends one request
at a time, so one stream serves them all: each request's responses go to the callback of the request
that is running (requests are sequential, and a request is over only at its final response).

A request that does not end cleanly (an error, or no final response within its timeout) closes the
stream with `cancel_requests=True`, as a stream per request did: Triton cancels what is still running,
and the next request opens a fresh stream, so it never shares one with a request that went wrong.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable

from tritonclient.utils import InferenceServerException

Callback = Callable[..., None]  # tritonclient's stream callback: keyword arguments result=, error=


class SessionStream:
    """The stream of one connection (InferenceServerClient), opened on first use."""

    def __init__(self, client):
        self._client = client
        self._open = False
        self._lock = threading.Lock()
        self._current: Callback | None = None  # the running request's callback

    @property
    def is_open(self) -> bool:
        return self._open

    def _dispatch(self, result=None, error=None) -> None:
        """tritonclient's thread: hands each response (or the stream's error) to the running request."""
        with self._lock:
            current = self._current
        if current is not None:  # none: nothing runs (a closed request's last words are dropped)
            current(result=result, error=error)

    def send(self, model: str, inputs, callback: Callback) -> None:
        """Send one request on the stream (opened here if needed); its responses go to `callback`. A
        stream that broke while idle (the server restarted between requests) is replaced once; a request
        that still cannot be sent is reported to `callback` as its error."""
        with self._lock:
            self._current = callback
        reused = self._open
        try:
            self._send(model, inputs)
        except InferenceServerException as exc:
            if not reused:
                callback(error=exc)
                return
            self.close(cancel=True)
            try:
                self._send(model, inputs)
            except InferenceServerException as again:
                callback(error=again)

    def _send(self, model: str, inputs) -> None:
        if not self._open:
            self._client.start_stream(callback=self._dispatch)
            self._open = True
        self._client.async_stream_infer(
            model, inputs, request_id=uuid.uuid4().hex, enable_empty_final_response=True
        )

    def release(self, *, clean: bool) -> None:
        """The running request is over: keep the stream for the next one when it ended cleanly (its final
        response, no error), else close it and cancel what still runs on it."""
        with self._lock:
            self._current = None
        if not clean:
            self.close(cancel=True)

    def close(self, *, cancel: bool = False) -> None:
        if self._open:
            self._open = False
            self._client.stop_stream(cancel_requests=cancel)
