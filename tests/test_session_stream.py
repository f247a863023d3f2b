"""SessionStream (client/session_stream.py) against a fake tritonclient: one stream for a session's
sequential requests, closed (cancelling) after a request that went wrong, replaced once when it broke
while idle; the end-to-end case is in test_e2e_serve.py."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from specbuild.client.session_stream import SessionStream


class FakeClient:
    """start_stream / async_stream_infer / stop_stream as tritonclient.grpc's, recording the calls."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.callback = None
        self.dead = False  # the stream broke (the server went away while no request ran)

    def start_stream(self, callback):
        assert self.callback is None, "tritonclient refuses a second stream on one client"
        self.callback, self.dead = callback, False
        self.calls.append(("start",))

    def async_stream_infer(self, model, inputs, request_id, enable_empty_final_response):
        if self.callback is None or self.dead:
            raise InferenceServerException("The stream is no longer in valid state")
        self.calls.append(("infer", model, inputs))

    def stop_stream(self, cancel_requests=False):
        self.callback = None
        self.calls.append(("stop", cancel_requests))


def _kinds(client):
    return [c[0] if c[0] != "stop" else f"stop(cancel={c[1]})" for c in client.calls]


def test_sequential_requests_share_one_stream_and_each_gets_its_own_responses():
    client, got = FakeClient(), {"a": [], "b": []}
    stream = SessionStream(client)
    stream.send("m", "in-a", lambda **kw: got["a"].append(kw))
    client.callback(result="a1", error=None)
    stream.release(clean=True)
    client.callback(result="late", error=None)  # nothing runs: dropped, never given to the next request
    stream.send("m", "in-b", lambda **kw: got["b"].append(kw))
    client.callback(result="b1", error=None)
    stream.release(clean=True)
    assert _kinds(client) == ["start", "infer", "infer"]
    assert [r["result"] for r in got["a"]] == ["a1"] and [r["result"] for r in got["b"]] == ["b1"]
    stream.close()
    assert _kinds(client)[-1] == "stop(cancel=False)" and not stream.is_open


def test_a_request_that_went_wrong_closes_the_stream_with_cancellation():
    client = FakeClient()
    stream = SessionStream(client)
    stream.send("m", "x", lambda **kw: None)
    stream.release(clean=False)  # an error or a timeout: Triton cancels what still runs on it
    assert _kinds(client) == ["start", "infer", "stop(cancel=True)"] and not stream.is_open
    stream.send("m", "y", lambda **kw: None)
    assert _kinds(client)[-2:] == ["start", "infer"]


def test_a_stream_that_broke_while_idle_is_replaced_once():
    client, errors = FakeClient(), []
    stream = SessionStream(client)
    stream.send("m", "x", lambda **kw: None)
    stream.release(clean=True)
    client.dead = True  # the server restarted between requests
    stream.send("m", "y", lambda **kw: errors.append(kw))
    assert errors == [] and _kinds(client)[-3:] == ["stop(cancel=True)", "start", "infer"]


@pytest.mark.parametrize("reused", [False, True])
def test_a_request_that_cannot_be_sent_is_reported_to_its_callback(reused, monkeypatch):
    client, errors = FakeClient(), []
    stream = SessionStream(client)
    if reused:
        stream.send("m", "x", lambda **kw: None)
        stream.release(clean=True)

    def refuse(*a, **kw):
        raise InferenceServerException("failed to connect")

    monkeypatch.setattr(client, "async_stream_infer", refuse)
    stream.send("m", "y", lambda **kw: errors.append(kw))
    assert len(errors) == 1 and isinstance(errors[0]["error"], InferenceServerException)
