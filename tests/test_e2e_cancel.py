"""Cancelled and abandoned requests stop, through a real tritonserver: the BLS checks Triton's
cancellation before every engine call (draft/target: within one round) and ends a streamed Medusa
call with a `stop` request; the local engine models check it every step, for streamed, unary and
deadline-cancelled requests. Work is watched through the server's own counters (/metrics) and log."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
import uuid

import numpy as np
import pytest
from e2e_fixtures import K
from test_e2e_interface import PROMPT, tensor, text_inputs

pytestmark = pytest.mark.slow

LONG_OUTPUT = 400  # tokens: seconds of work, far more than is done before the cancel


def inference_count(server, model: str) -> int:
    """Triton's nv_inference_count for one model (requests it executed)."""
    with urllib.request.urlopen(
        f"http://{server.options.host}:{server.options.metrics_port}/metrics", timeout=10
    ) as resp:
        text = resp.read().decode()
    match = re.search(rf'^nv_inference_count{{model="{model}",version="1"}} (\d+)', text, re.MULTILINE)
    return int(match.group(1)) if match else 0


def cancel_after_first_response(server, model, inputs, *, request_id=None, wait=0.0):
    """Stream a request, cancel it (stop_stream(cancel_requests=True)) once a response arrived."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    first = threading.Event()
    client.start_stream(callback=lambda result=None, error=None: first.set())
    client.async_stream_infer(model, inputs, request_id=request_id or uuid.uuid4().hex)
    assert first.wait(60), "no first response"
    time.sleep(wait)
    client.stop_stream(cancel_requests=True)
    client.close()


def wait_for(predicate, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_cancelled_speculative_stream_stops_within_a_round(e2e_servers):
    server = e2e_servers["draft_target"]
    before = inference_count(server, "tensorrt_llm")
    rid = uuid.uuid4().hex
    cancel_after_first_response(
        server,
        "tensorrt_llm_bls",
        [
            *text_inputs(n=LONG_OUTPUT, stream=True, num_draft_tokens=K),
            tensor("end_id", np.array([[-1]], dtype=np.int32)),
        ],
        request_id=rid,
    )
    assert wait_for(lambda: f"tensorrt_llm_bls: request '{rid}' cancelled" in server.log_text())
    settled = inference_count(server, "tensorrt_llm")
    time.sleep(1.0)
    assert inference_count(server, "tensorrt_llm") == settled  # no engine call after the cancel took effect
    # a whole request would take >= LONG_OUTPUT / (K + 1) target calls; it stopped after a few
    assert settled - before < LONG_OUTPUT / (K + 1) / 4


def test_cancelled_medusa_stream_through_the_bls_stops_the_engine(e2e_servers):
    server = e2e_servers["medusa"]
    rid = uuid.uuid4().hex
    cancel_after_first_response(
        server,
        "tensorrt_llm_bls",
        [*text_inputs(n=LONG_OUTPUT, stream=True), tensor("end_id", np.array([[-1]], dtype=np.int32))],
        request_id=rid,
    )
    assert wait_for(lambda: f"tensorrt_llm_bls: request '{rid}' cancelled" in server.log_text())
    assert wait_for(
        lambda: re.findall(
            r"tensorrt_llm: request 'bls-[0-9a-f]+' stopped after (\d+) tokens", server.log_text()
        )
    )
    stopped = re.findall(
        r"tensorrt_llm: request 'bls-[0-9a-f]+' stopped after (\d+) tokens", server.log_text()
    )
    assert int(stopped[-1]) < LONG_OUTPUT


def _engine_inputs(greedy, *, streaming: bool):
    _, _, prompt_ids = greedy(PROMPT, 12)
    inputs = [
        tensor("input_ids", np.array([prompt_ids], dtype=np.int32)),
        tensor("input_lengths", np.array([[len(prompt_ids)]], dtype=np.int32)),
        tensor("request_output_len", np.array([[LONG_OUTPUT]], dtype=np.int32)),
        tensor("end_id", np.array([[-1]], dtype=np.int32)),
    ]
    if streaming:
        inputs.append(tensor("streaming", np.array([[True]])))
    return inputs


def test_cancelled_stream_to_a_decoupled_engine_model(e2e_servers, greedy):
    """inflight_batcher_llm_client --stop-via-request-cancel on the Medusa tensorrt_llm."""
    server = e2e_servers["medusa"]
    rid = uuid.uuid4().hex
    cancel_after_first_response(
        server, "tensorrt_llm", _engine_inputs(greedy, streaming=True), request_id=rid
    )
    pattern = rf"tensorrt_llm: request '{rid}' cancelled after (\d+) tokens"
    assert wait_for(lambda: re.search(pattern, server.log_text()))
    assert int(re.search(pattern, server.log_text()).group(1)) < LONG_OUTPUT


def test_a_client_that_gives_up_stops_the_engine(e2e_servers, greedy):
    """A unary request whose client deadline passes: Triton cancels it; the non-decoupled engine model
    stops."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    server = e2e_servers["draft_target"]
    rid = uuid.uuid4().hex
    client = grpcclient.InferenceServerClient(server.grpc_url)
    # The deadline is a quarter of what the whole request takes on this CPU, timed first: a fixed 0.3 s
    # outlasted the 400 tokens on a fast x86 (the request ended before it, and nothing was cancelled).
    started = time.perf_counter()
    client.infer("tensorrt_llm", _engine_inputs(greedy, streaming=False))
    whole_s = time.perf_counter() - started
    with pytest.raises(InferenceServerException, match="(?i)deadline"):
        client.infer(
            "tensorrt_llm",
            _engine_inputs(greedy, streaming=False),
            request_id=rid,
            client_timeout=whole_s / 4,
        )
    client.close()
    pattern = rf"tensorrt_llm: request '{rid}' cancelled after (\d+) tokens"
    assert wait_for(lambda: re.search(pattern, server.log_text()))
    assert int(re.search(pattern, server.log_text()).group(1)) < LONG_OUTPUT
