"""The OpenAI frontend's HTTP layer over a fake Triton bridge (tests/frontend_fakes.py): hostile bodies get
OpenAI's 400 with bounded messages, a client that goes away stops its request (non-streamed and streamed),
a prompt too long by its characters is refused before anything tokenizes it, stop_reason names the stop
string, and the app publishes its OpenAPI document."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from types import SimpleNamespace

import pytest
from frontend_fakes import MODEL, FakeBridge, FakeServer

MAX_ERROR_BYTES = 2048  # an error body echoes bounded values: a few hundred bytes, never the input


@pytest.fixture(scope="module")
def server():
    s = FakeServer(FakeBridge())
    yield s
    s.stop()


def error_of(status: int, body: bytes, expected_status: int = 400) -> dict:
    assert status == expected_status, body[:300]
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
    return error


def test_a_body_nested_100000_deep_is_a_400(server):
    deep = b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b', "prompt": "p"}'
    error = error_of(*server.post("/v1/completions", deep))
    assert "recursion limit" in error["message"]
    deep_object = (
        b'{"model": "fake", "prompt": "p", "user": ' + b'{"a":' * 100_000 + b"1" + b"}" * 100_000 + b"}"
    )
    error_of(*server.post("/v1/chat/completions", deep_object))


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"logit_bias": {str(i): 1.0 for i in range(100_000)}}, "logit_bias", "unsupported_value"),
        ({f"field_{i}": i for i in range(100_000)}, "field_0", "unsupported_parameter"),
        ({"user": "u" * 1_000_000}, None, None),  # accepted: no echo at all
        ({"stop": ["x" * 1_000_000]}, "stop", None),
        ({"model": "m" * 1_000_000}, "model", "model_not_found"),
        ({"x" * 1_000_000: 1}, "x" * 61 + "...", "unsupported_parameter"),
        ({"seed": "9" * 100_000}, "seed", None),
    ],
)
def test_every_echoed_value_is_bounded(server, extra, param, code):
    body = {"model": MODEL, "prompt": "p", "max_tokens": 2, **extra}
    status, answer = server.post("/v1/completions", body)
    if param is None:
        assert status == 200
        return
    assert len(answer) < MAX_ERROR_BYTES
    error = error_of(status, answer, 404 if code == "model_not_found" else 400)
    assert (error["param"], error["code"]) == (param, code)


def test_the_unsupported_field_message_says_which_fields_need_their_defaults(server):
    error = error_of(*server.post("/v1/completions", {"model": MODEL, "prompt": "p", "guided_json": {}}))
    assert error["code"] == "unsupported_parameter" and "honours" not in error["message"]
    assert (
        "n, logprobs, frequency_penalty, presence_penalty, logit_bias, best_of, suffix only at their defaults"
        in (error["message"])
    )
    error = error_of(*server.post("/v1/completions", {"model": MODEL, "prompt": "p", "n": 2}))
    assert error["message"] == "'n' = 2 is not supported (only its default: 1, or leave it out)"


def test_stop_reason_names_the_stop_string(server):
    body = {"model": MODEL, "prompt": "p", "max_tokens": 10, "stop": ["zz", "t3"]}
    status, answer = server.post("/v1/completions", body)
    choice = json.loads(answer)["choices"][0]
    assert status == 200 and choice["text"] == "t0 t1 t2 " and choice["finish_reason"] == "stop"
    assert choice["stop_reason"] == "t3"
    status, answer = server.post("/v1/completions", {**body, "stream": True})
    events = [json.loads(line[6:]) for line in answer.decode().splitlines() if line.startswith("data: {")]
    assert (
        events[-1]["choices"][0]["finish_reason"] == "stop"
        and events[-1]["choices"][0]["stop_reason"] == "t3"
    )
    status, answer = server.post("/v1/completions", {**body, "stop": None})
    choice = json.loads(answer)["choices"][0]
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None


def test_routing_errors_have_openai_shape(server):
    error_of(*server.get("/v1/nothing"), expected_status=404)
    error_of(*server.get("/v1/completions"), expected_status=405)


def test_the_openapi_document_is_published_from_the_request_models(server):
    status, body = server.get("/openapi.json")
    doc = json.loads(body)
    assert status == 200 and doc["openapi"].startswith("3.")
    schemas = doc["components"]["schemas"]
    for path, model in (
        ("/v1/completions", "CompletionRequest"),
        ("/v1/chat/completions", "ChatCompletionRequest"),
    ):
        request = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert request == {"$ref": f"#/components/schemas/{model}"}
        assert schemas[model]["additionalProperties"] is False
        assert set(doc["paths"][path]["post"]["responses"]) >= {"200", "400", "404", "413", "503"}
    assert "prompt" in schemas["CompletionRequest"]["required"]
    assert schemas["ErrorResponse"]["properties"]["error"]["$ref"] == "#/components/schemas/ErrorBody"
    refs = {m for m in json.dumps(doc).split('"#/components/schemas/')[1:]}
    assert {r.split('"')[0] for r in refs} <= set(schemas)  # every reference resolves


class TokenizerThatMustNotRun:
    """A tokenizer whose longest vocabulary entry has 2 characters; tokenizing fails the test."""

    chat_template = None

    def get_vocab(self):
        return {"a": 0, "bb": 1, "c": 2}

    def __call__(self, *args, **kwargs):
        raise AssertionError("the prompt was tokenized before its length was checked")


def test_a_prompt_too_long_by_its_characters_is_refused_before_tokenizing():
    bridge = FakeBridge(max_prompt=10)
    s = FakeServer(bridge, tokenizer=TokenizerThatMustNotRun())
    try:
        status, _ = s.post("/v1/completions", {"model": MODEL, "prompt": "a" * 20, "max_tokens": 2})
        assert status == 200  # 20 characters can be 10 tokens of 2
        started = time.perf_counter()
        status, body = s.post(
            "/v1/completions", {"model": MODEL, "prompt": "a" * (7 * 2**20), "max_tokens": 2}
        )
        error = error_of(status, body)
        assert error["code"] == "context_length_exceeded" and error["param"] == "prompt"
        assert time.perf_counter() - started < 5  # reading 7 MiB, no tokenizer: well under a second here
        assert bridge.produced == 2
    finally:
        s.stop()


def _abandon(port: int, body: dict, after_s: float) -> None:
    """Send a request and close the connection `after_s` later without reading the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    time.sleep(after_s)
    conn.sock.close()
    conn.close()


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_goes_away_stops_its_request(stream):
    bridge = FakeBridge(step_s=0.01)  # 2,000 tokens: 20 s when nobody stops it
    s = FakeServer(bridge)
    try:
        _abandon(s.port, {"model": MODEL, "prompt": "p", "max_tokens": 2000, "stream": stream}, 0.3)
        assert bridge.closed.wait(5), "the request ran on after its client went away"
        assert bridge.produced < 1000 and bridge.open == 0
        # the server still answers
        status, body = s.post("/v1/completions", {"model": MODEL, "prompt": "p", "max_tokens": 2})
        assert status == 200 and json.loads(body)["choices"][0]["text"] == "t0 t1 "
    finally:
        s.stop()


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_whose_first_cancel_is_lost_is_cancelled_again(stream):
    """A cancel taken for a result (asyncio.wait_for before Python 3.12 does that when it lands as a
    response arrives) used to leave a non-streamed request running to its end after its client left."""
    bridge = FakeBridge(step_s=0.01, swallow_cancels=2)  # 2,000 tokens: 20 s when nobody stops it
    s = FakeServer(bridge)
    try:
        _abandon(s.port, {"model": MODEL, "prompt": "p", "max_tokens": 2000, "stream": stream}, 0.3)
        assert bridge.closed.wait(5), "the request ran on after its client went away"
        assert bridge.swallowed == 2 and bridge.produced < 1000 and bridge.open == 0
    finally:
        s.stop()


def test_a_cancel_that_lands_as_a_response_arrives_ends_the_bridges_read():
    """The bridge's read with a timeout raises the caller's cancel even when the response arrived in the
    same turn of the event loop (asyncio.wait_for returned the response there before Python 3.12)."""
    from specbuild.frontend.triton import TritonBridge

    async def main():
        arrived = asyncio.get_running_loop().create_future()

        class Call:
            async def read(self):
                return await arrived

        bridge = TritonBridge("127.0.0.1:8001", FakeBridge().served)
        reading = asyncio.ensure_future(bridge._read(Call(), MODEL, 10.0))
        for _ in range(3):  # the read is waiting for its response
            await asyncio.sleep(0)
        arrived.set_result(SimpleNamespace(error_message=""))  # the response and the cancel: one turn
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading

    asyncio.run(main())


def test_bench_serve_reads_the_frontends_stream_and_refuses_a_different_answer(server):
    from lab.benchmarks.serve_frontend import FrontendClient, _check_same
    from specbuild.core.errors import SpecbuildError
    from specbuild.core.sampling_params import SamplingParams

    client = FrontendClient(f"http://127.0.0.1:{server.port}/v1", model=MODEL)
    answers = [client.complete("p", SamplingParams(max_tokens=n), 0) for n in (3, 5)]  # one connection
    assert answers == [("t0 t1 t2 ", 3), ("t0 t1 t2 t3 t4 ", 5)]
    _check_same({"direct": answers, "frontend": answers}, ["a", "b"])
    with pytest.raises(SpecbuildError, match="answered otherwise"):
        _check_same({"direct": answers, "frontend": [answers[0], ("t0", 1)]}, ["a", "b"])
