"""The repositories as upstream's clients see them, through a real tritonserver: the request shapes of
tensorrtllm_backend's example clients (end_to_end_grpc_client.py, inflight_batcher_llm_client.py,
e2e_grpc_speculative_decoding_client.py, tools/inflight_batcher_llm/*; read at r25.05), written here
with tritonclient (never copied): only `text_output` requested, flat string outputs, no
exclude_input_in_output (the backend's default, false), the `stop` input, the 1.2-era token counts,
and Triton's HTTP generate endpoints.
"""

from __future__ import annotations

import json
import queue
import urllib.request
import uuid

import numpy as np
import pytest
from e2e_fixtures import K

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox"
N = 12


def tensor(name, array):
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import np_to_triton_dtype

    t = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    t.set_data_from_numpy(array)
    return t


def text_inputs(prompt=PROMPT, n=N, **extra):
    """What end_to_end_grpc_client.prepare_inputs sends ([[prompt]], [[n]], stream, beam 1,
    temperature 1.0)."""
    values = {
        "text_input": np.array([[prompt]]).astype(object),
        "max_tokens": np.array([[n]], dtype=np.int32),
        "stream": np.array([[extra.pop("stream", False)]], dtype=bool),
        "beam_width": np.array([[1]], dtype=np.int32),
        "temperature": np.array([[1.0]], dtype=np.float32),
    }
    for key, value in extra.items():
        dtype = bool if isinstance(value, bool) else np.int32 if isinstance(value, int) else np.float32
        values[key] = np.array([[value]], dtype=dtype)
    return [tensor(k, v) for k, v in values.items()]


def stream_call(server, model, inputs, outputs=("text_output",), request_id="1"):
    """start_stream / async_stream_infer / stop_stream, as upstream's clients do; returns the results."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    got = queue.Queue()
    client.start_stream(callback=lambda result=None, error=None: got.put((result, error)))
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
    client.async_stream_infer(model, inputs, outputs=requested, request_id=request_id)
    client.stop_stream()  # waits for the server to close the stream
    client.close()
    results = []
    while not got.empty():
        result, error = got.get()
        assert error is None, error
        results.append(result)
    return results


def texts(results):
    return [r.as_numpy("text_output")[0].decode("utf-8") for r in results]  # upstream's read: flat strings


@pytest.mark.parametrize(
    "mode, model, stream",
    [
        ("draft_target", "ensemble", False),
        ("draft_target", "tensorrt_llm_bls", False),
        ("draft_target", "tensorrt_llm_bls", True),
        ("medusa", "ensemble", False),
        ("medusa", "ensemble", True),
        ("medusa", "tensorrt_llm_bls", True),
    ],
)
def test_text_output_alone_flat_and_with_the_prompt_by_default(e2e_servers, greedy, mode, model, stream):
    """Only text_output requested: no ensemble deadlock; text_output is flat; without exclude_input_in_output
    a non-streamed answer starts with the prompt, a streamed one carries new text only."""
    text, _, _ = greedy(PROMPT, N)
    results = stream_call(e2e_servers[mode], model, text_inputs(stream=stream))
    assert results and all(r.as_numpy("text_output").shape == (1,) for r in results)
    assert "".join(texts(results)) == (text if stream else PROMPT + text)
    if stream:
        assert len(results) > 1


def test_upstream_speculative_client_loop_terminates_and_matches(e2e_servers, greedy):
    """e2e_grpc_speculative_decoding_client's loop: preprocessing, then draft (k tokens) and target
    (draft_input_ids, k + 1 tokens) calls without exclude_input_in_output, slicing the prompt off the
    draft's output_ids; the target's output_ids (prompt included) are the next round's input."""
    import tritonclient.grpc as grpcclient

    server = e2e_servers["draft_target"]
    text, tokens, prompt_ids = greedy(PROMPT, N)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    pre = client.infer(
        "preprocessing",
        [
            tensor("QUERY", np.array([[PROMPT]]).astype(object)),
            tensor("REQUEST_OUTPUT_LEN", np.array([[N]], dtype=np.int32)),
        ],
    )
    ids = np.squeeze(pre.as_numpy("INPUT_ID").astype(np.int32), axis=0)
    end_id, pad_id = pre.as_numpy("OUT_END_ID")[0][0], pre.as_numpy("OUT_PAD_ID")[0][0]
    assert ids.tolist() == prompt_ids

    def engine(model, ids, n, draft=None):
        inputs = [
            tensor("input_ids", ids[None, :]),
            tensor("input_lengths", np.array([[len(ids)]], dtype=np.int32)),
            tensor("request_output_len", np.array([[n]], dtype=np.int32)),
            tensor("end_id", np.array([[end_id]], dtype=np.int32)),
            tensor("pad_id", np.array([[pad_id]], dtype=np.int32)),
        ]
        if draft is not None:
            inputs.append(tensor("draft_input_ids", np.array([draft], dtype=np.int32)))
        out = client.infer(model, inputs)
        return np.squeeze(out.as_numpy("output_ids"), axis=(0, 1)), int(out.as_numpy("sequence_length")[0, 0])

    rounds = 0
    while (
        len(ids) < len(prompt_ids) + N and rounds < 4 * N
    ):  # upstream's length stop; rounds bounds a regression
        rounds += 1
        k = min(K, len(prompt_ids) + N - len(ids) - 1)
        draft = None
        if k > 0:
            out, n = engine("tensorrt_llm_draft", ids, k)
            draft = out[len(ids) : n].tolist()  # the prompt is in the draft's output_ids
            assert len(draft) == k
        out, n = engine("tensorrt_llm", ids, len(draft) + 1 if draft else 1, draft)
        assert n > len(
            ids
        )  # progress every round (the old fixed exclude_input_in_output=true looped forever)
        ids = out[:n]
    client.close()
    assert (
        ids[len(prompt_ids) :].tolist() == tokens[: len(ids) - len(prompt_ids)]
        and len(ids) == len(prompt_ids) + N
    )


def test_stop_input_ends_the_request_with_that_id(e2e_servers, greedy):
    """inflight_batcher_llm_client's stop: a second request with the same request id and stop = true
    (input_ids [[0]], input_lengths 0, request_output_len 0) ends the first; both answer without error."""
    import threading

    import tritonclient.grpc as grpcclient

    server = e2e_servers["medusa"]
    _, _, prompt_ids = greedy(PROMPT, N)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    got, first = queue.Queue(), threading.Event()

    def callback(result=None, error=None):
        got.put((result, error))
        first.set()

    client.start_stream(callback=callback)
    rid = uuid.uuid4().hex
    client.async_stream_infer(
        "tensorrt_llm",
        [
            tensor("input_ids", np.array([prompt_ids], dtype=np.int32)),
            tensor("input_lengths", np.array([[len(prompt_ids)]], dtype=np.int32)),
            tensor("request_output_len", np.array([[400]], dtype=np.int32)),
            tensor("end_id", np.array([[-1]], dtype=np.int32)),
            tensor("streaming", np.array([[True]])),
        ],
        request_id=rid,
    )
    assert first.wait(60)
    client.async_stream_infer(
        "tensorrt_llm",
        [
            tensor("input_ids", np.zeros((1, 1), dtype=np.int32)),
            tensor("input_lengths", np.zeros((1, 1), dtype=np.int32)),
            tensor("request_output_len", np.zeros((1, 1), dtype=np.int32)),
            tensor("stop", np.array([[True]])),
        ],
        request_id=rid,
        parameters={"Streaming": True},
    )
    client.stop_stream()
    client.close()
    tokens = []
    while not got.empty():
        result, error = got.get()
        assert error is None, error
        ids = result.as_numpy("output_ids")
        if ids is not None and ids.size:
            tokens += ids[0][0].tolist()
    assert 0 < len(tokens) < 400
    assert f"tensorrt_llm: request '{rid}' stopped after" in server.log_text()


@pytest.mark.parametrize(
    "mode, model",
    [("draft_target", "ensemble"), ("draft_target", "tensorrt_llm_bls"), ("medusa", "tensorrt_llm_bls")],
)
def test_token_counts_of_the_12_era_interface(e2e_servers, greedy, mode, model):
    _, tokens, prompt_ids = greedy(PROMPT, N)
    results = stream_call(
        e2e_servers[mode],
        model,
        text_inputs(return_num_input_tokens=True, return_num_output_tokens=True),
        outputs=("text_output", "num_input_tokens", "num_output_tokens"),
    )
    final = results[-1]
    assert final.as_numpy("num_input_tokens")[0][0] == len(prompt_ids)
    assert final.as_numpy("num_output_tokens")[0][0] == len(prompt_ids) + len(
        tokens
    )  # output_ids hold the prompt too


def test_tensorrt_llm_token_counts_direct(e2e_servers, greedy):
    import tritonclient.grpc as grpcclient

    _, tokens, prompt_ids = greedy(PROMPT, N)
    client = grpcclient.InferenceServerClient(e2e_servers["draft_target"].grpc_url)
    out = client.infer(
        "tensorrt_llm",
        [
            tensor("input_ids", np.array([prompt_ids], dtype=np.int32)),
            tensor("input_lengths", np.array([[len(prompt_ids)]], dtype=np.int32)),
            tensor("request_output_len", np.array([[N]], dtype=np.int32)),
            tensor("end_id", np.array([[1]], dtype=np.int32)),
            tensor("exclude_input_in_output", np.array([[True]])),
            tensor("return_num_input_tokens", np.array([[True]])),
            tensor("return_num_output_tokens", np.array([[True]])),
        ],
    )
    client.close()
    assert out.as_numpy("output_ids")[0][0].tolist() == tokens
    assert out.as_numpy("num_input_tokens")[0][0] == len(prompt_ids) and out.as_numpy("num_output_tokens")[0][
        0
    ] == len(tokens)


def _post(url: str, body: dict) -> str:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(req, timeout=60) as resp:
        return resp.read().decode()


def test_http_generate_endpoints(e2e_servers, greedy):
    """Triton's generate extension: one JSON object; generate_stream: server-sent events, one per response."""
    text, _, _ = greedy(PROMPT, N)
    dt, medusa = e2e_servers["draft_target"], e2e_servers["medusa"]
    one = json.loads(
        _post(f"{dt.http_url}/v2/models/ensemble/generate", {"text_input": PROMPT, "max_tokens": N})
    )
    assert one["text_output"] == PROMPT + text
    for server, body in ((dt, {"num_draft_tokens": K}), (medusa, {})):
        events = _post(
            f"{server.http_url}/v2/models/tensorrt_llm_bls/generate_stream",
            {"text_input": PROMPT, "max_tokens": N, "stream": True, **body},
        )
        chunks = [
            json.loads(line[len("data: ") :]) for line in events.splitlines() if line.startswith("data: ")
        ]
        assert len(chunks) > 1 and "".join(c["text_output"] for c in chunks) == text
    events = _post(
        f"{medusa.http_url}/v2/models/ensemble/generate_stream",
        {"text_input": PROMPT, "max_tokens": N, "stream": True},
    )
    chunks = [json.loads(line[len("data: ") :]) for line in events.splitlines() if line.startswith("data: ")]
    assert "".join(c["text_output"] for c in chunks) == text
