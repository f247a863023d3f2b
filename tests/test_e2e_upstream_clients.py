"""Upstream's example clients and tools that failed against local repositories (issue 38), their requests
rebuilt here with tritonclient from the sources they were read at (the code is not copied into this
repository): tensorrtllm_backend branch r25.05, commit c2e65b88d85255be30cf50440a91662abeb497dd,

* inflight_batcher_llm/client/end_to_end_grpc_client.py `-S --return-perf-metrics --model-name
  tensorrt_llm_bls`: prepare_inputs (text_input [[p]], max_tokens [[n]], stream, beam_width [[1]],
  temperature [[1.0]], exclude_input_in_output [[False]], return_perf_metrics [[True]]), text_output and
  the ten perf outputs requested, and every response read with `as_numpy(name)[0][0]` (run_inference);
  `--check-outputs`: the streamed deltas concatenated equal the expected text;
* tools/inflight_batcher_llm/end_to_end_test.py `--test-bls` (`-i http` and `-i grpc`):
  test_functionality_ifb's manual preprocessing -> tensorrt_llm -> postprocessing, the ensemble, then
  the BLS by unary `client.infer` (text_input, max_tokens, bad_words [[""]], stop_words [[""]], text_output
  requested); the three texts must be equal;
* tools/inflight_batcher_llm/end_to_end_test.py `--test-llmapi --model-name tensorrt_llm` (upstream's
  docs/llmapi.md runs it; `-i http`, its default): test_functionality_llmapi's `client.infer` of
  text_input [p] per prompt (text_output non-empty), then test_performance(use_llmapi=True): text_input
  + sampling_param_max_tokens [n], warm-up `infer` and `async_infer`;
* tools/inflight_batcher_llm/benchmark_core_model.py `--test-llmapi -i grpc` (its dataset workload): the
  same test_performance over gRPC (`infer`, `async_infer` with a callback): unary ModelInfer.

They need a repository whose entry model is not decoupled (upstream's LLM-API default; `repo
--no-decoupled` for the engine flow): the decoupled ones answer these unary calls with HTTP 501 and gRPC
UNIMPLEMENTED, as before (checked here too). The greedy text is the target alone's, in-process.
"""

from __future__ import annotations

import queue
from functools import partial

import numpy as np
import pytest
from test_repo_models import UPSTREAM_PERF as UPSTREAM_PERF_TYPES

pytestmark = pytest.mark.slow

PROMPTS = ["The quick brown fox", "def main():"]
N = 10
UPSTREAM_PERF = tuple(UPSTREAM_PERF_TYPES)  # run_inference's requested outputs, in its order


@pytest.fixture(scope="module")
def unary_servers(tmp_path_factory, e2e_builds, tiny_target, tiny_draft):
    """{"bls": the draft/target repository written with --no-decoupled, "llmapi": the LLM-API repository
    with its default policy} on tritonservers of their own."""
    from e2e_fixtures import _llmapi_repo, _llmapi_server

    from specbuild.demo.pipeline import local_server
    from specbuild.model_repo.generate import generate_repo

    build = e2e_builds["draft_target"][0]
    repo = generate_repo(
        build, tmp_path_factory.mktemp("unary-bls") / "repo", backend="python", decoupled=False
    )
    bls = local_server(repo).launch()
    llmapi = _llmapi_server(
        *_llmapi_repo(
            tmp_path_factory.mktemp("unary-llmapi"),
            "draft-target.yaml",
            {"target": tiny_target, "draft": tiny_draft},
            decoupled=False,
        )
    )
    try:
        _, _, llmapi_server = next(llmapi)
        bls.wait_ready()
        yield {"bls": bls, "llmapi": llmapi_server}
    finally:
        bls.stop()
        llmapi.close()  # the generator's finally stops its server


def _client(protocol: str, server):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url.removeprefix("http://"))
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def _tensor(lib, name, array):
    from tritonclient.utils import np_to_triton_dtype

    t = lib.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    t.set_data_from_numpy(array)
    return t


# ---- end_to_end_grpc_client.py -S --return-perf-metrics, tensorrt_llm_bls ---------------------------


@pytest.mark.parametrize("mode", ["draft_target", "medusa"])
def test_end_to_end_grpc_client_streams_every_perf_output_from_the_bls(e2e_servers, greedy, mode):
    """draft_target: the BLS's own loop; medusa: the BLS forwards each streamed response of tensorrt_llm
    (its local engine sent the perf outputs on its final response only: TypeError on the first chunk)."""
    import tritonclient.grpc as grpcclient

    server = e2e_servers[mode]  # its BLS is decoupled (the engine flow's default): it streams
    for prompt in PROMPTS:
        expected, _, _ = greedy(prompt, N)
        values = {
            "text_input": np.array([[prompt]]).astype(object),
            "max_tokens": np.ones_like([[prompt]]).astype(np.int32) * N,
            "stream": np.array([[True]], dtype=bool),
            "beam_width": np.array([[1]], dtype=np.int32),
            "temperature": np.array([[1.0]], dtype=np.float32),
            "exclude_input_in_output": np.array([[False]], dtype=bool),
            "return_perf_metrics": np.array([[True]], dtype=bool),
        }
        inputs = [_tensor(grpcclient, k, v) for k, v in values.items()]
        outputs = [grpcclient.InferRequestedOutput(n) for n in ("text_output", *UPSTREAM_PERF)]
        got = queue.Queue()
        client = grpcclient.InferenceServerClient(server.grpc_url)
        client.start_stream(callback=lambda result, error, got=got: got.put(error or result))
        client.async_stream_infer("tensorrt_llm_bls", inputs, outputs=outputs, request_id="")
        client.stop_stream()
        client.close()
        text, responses = "", 0
        while not got.empty():
            result = got.get()
            assert not isinstance(result, Exception), result
            responses += 1
            batch_index = result.as_numpy("batch_index")  # not requested: None -> 0, as upstream
            assert batch_index is None
            text += result.as_numpy("text_output")[0].decode("utf-8")
            perf = {name: result.as_numpy(name)[0][0] for name in UPSTREAM_PERF}  # TypeError before the fix
            assert perf["total_accepted_draft_tokens"] <= perf["total_draft_tokens"]
        assert responses > 1 and text == expected  # --check-outputs, streamed: no prompt in front


def test_a_streamed_medusa_engine_sends_every_perf_output_on_every_response(e2e_servers, e2e_engine):
    """tensorrt_llm of a Medusa repository (its local engine, in its own process behind tritonserver),
    streamed with return_perf_metrics, as upstream's inflight_batcher_llm_client.py asks it: every
    response carries every perf output with the C++ backend's type; the running draft counts never go
    back and the final response's are the request's totals (its last chunk's)."""
    import tritonclient.grpc as grpcclient

    server = e2e_servers["medusa"]
    from specbuild.core.sampling_params import SamplingParams

    prompt_ids = e2e_engine.encode(PROMPTS[0])  # no end_id: TensorRT-LLM's -1, no end token (greedy alike)
    expected_ids = e2e_engine.generate(prompt_ids, SamplingParams(max_tokens=N, end_id=-1), speculative=False)
    expected_ids = expected_ids.token_ids
    values = {
        "input_ids": np.array([prompt_ids], dtype=np.int32),
        "input_lengths": np.array([[len(prompt_ids)]], dtype=np.int32),
        "request_output_len": np.array([[N]], dtype=np.int32),
        "streaming": np.array([[True]], dtype=bool),
        "return_perf_metrics": np.array([[True]], dtype=bool),
    }
    inputs = [_tensor(grpcclient, k, v) for k, v in values.items()]
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error, got=got: got.put(error or result))
    client.async_stream_infer(
        "tensorrt_llm", inputs, request_id="medusa-perf", enable_empty_final_response=True
    )
    client.stop_stream()
    client.close()
    seen, tokens = [], []
    while not got.empty():
        result = got.get()
        assert not isinstance(result, Exception), result
        out = {name: result.as_numpy(name) for name in ("output_ids", *UPSTREAM_PERF)}
        for name, dtype in UPSTREAM_PERF_TYPES.items():
            assert out[name] is not None, (name, len(seen))  # the old engine: None on every chunk
            assert out[name].shape == (1, 1) and out[name].dtype == dtype, (name, out[name].dtype)
        tokens += out["output_ids"].reshape(-1).tolist()
        seen.append({name: out[name][0][0].item() for name in UPSTREAM_PERF})
    assert (
        tokens == expected_ids and len(seen) > 2
    )  # the chunks (the root token, the tree's steps), the final
    for before, after in zip(seen, seen[1:], strict=False):
        assert before["total_draft_tokens"] <= after["total_draft_tokens"]
        assert before["total_accepted_draft_tokens"] <= after["total_accepted_draft_tokens"]
        assert before["first_token_time_ns"] == after["first_token_time_ns"] > 0
    assert seen[-1] == seen[-2] and seen[-1]["total_draft_tokens"] > 0  # the totals, on the final response


# ---- end_to_end_test.py --test-bls -----------------------------------------------------------------


def _functionality_ifb(lib, client, prompt: str, n: int) -> tuple:
    """test_functionality_ifb: (manual pipeline text, ensemble text, BLS text), each [1] bytes."""
    pre = client.infer(
        "preprocessing",
        [
            _tensor(lib, "QUERY", np.array([[prompt]]).astype(object)),
            _tensor(lib, "BAD_WORDS_DICT", np.array([[""]], dtype=object)),
            _tensor(lib, "STOP_WORDS_DICT", np.array([[""]], dtype=object)),
            _tensor(lib, "REQUEST_OUTPUT_LEN", np.ones_like([[prompt]]).astype(np.int32) * n),
        ],
    )
    engine_in = {
        "input_ids": pre.as_numpy("INPUT_ID"),
        "decoder_input_ids": pre.as_numpy("DECODER_INPUT_ID"),
        "input_lengths": pre.as_numpy("REQUEST_INPUT_LEN"),
        "request_output_len": pre.as_numpy("REQUEST_OUTPUT_LEN"),
        "end_id": pre.as_numpy("OUT_END_ID"),
        "pad_id": pre.as_numpy("OUT_PAD_ID"),
    }
    engine = client.infer("tensorrt_llm", [_tensor(lib, k, v) for k, v in engine_in.items()])
    post = client.infer(
        "postprocessing",
        [
            _tensor(lib, "TOKENS_BATCH", engine.as_numpy("output_ids").astype(np.int32)),
            _tensor(lib, "SEQUENCE_LENGTH", engine.as_numpy("sequence_length")),
        ],
    )
    text_in = [
        _tensor(lib, "text_input", np.array([[prompt]]).astype(object)),
        _tensor(lib, "max_tokens", np.ones_like([[prompt]]).astype(np.int32) * n),
        _tensor(lib, "bad_words", np.array([[""]], dtype=object)),
        _tensor(lib, "stop_words", np.array([[""]], dtype=object)),
    ]
    outputs = [lib.InferRequestedOutput("text_output")]  # utils.prepare_outputs without flags
    ensemble = client.infer("ensemble", text_in, outputs=outputs)
    bls = client.infer("tensorrt_llm_bls", text_in, outputs=outputs)
    return post.as_numpy("OUTPUT"), ensemble.as_numpy("text_output"), bls.as_numpy("text_output")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_end_to_end_test_bls_on_a_unary_bls(unary_servers, greedy, protocol):
    lib, client = _client(protocol, unary_servers["bls"])
    for prompt in PROMPTS:
        manual, ensemble, bls = _functionality_ifb(lib, client, prompt, N)
        assert manual == ensemble and manual == bls  # upstream's two asserts
        assert bls[0].decode() == prompt + greedy(prompt, N)[0]  # without exclude_input_in_output
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unary_calls_to_the_decoupled_bls_are_refused_by_triton(e2e_servers, protocol):
    """What the same tool met before: a decoupled BLS refuses unary calls (Triton's own errors)."""
    from tritonclient.utils import InferenceServerException

    lib, client = _client(protocol, e2e_servers["draft_target"])
    with pytest.raises(InferenceServerException) as err:
        _functionality_ifb(lib, client, PROMPTS[0], N)
    message = str(err.value)
    assert ("decoupled" in message) if protocol == "grpc" else ("501" in message or "decoupled" in message)
    client.close()


# ---- end_to_end_test.py --test-llmapi / benchmark_core_model.py --test-llmapi ---------------------------


def _llmapi_inputs(lib, prompt: str, n: int | None):
    inputs = [_tensor(lib, "text_input", np.array([prompt], dtype=object))]
    if n is not None:  # create_inputs(use_llmapi=True)
        inputs.append(_tensor(lib, "sampling_param_max_tokens", np.array([n], dtype=np.int32)))
    return inputs


def _performance(lib, client, protocol: str, prompts: list[str], n: int) -> list[str]:
    """end_to_end_test.test_performance(use_llmapi=True), not streaming: warm-up `infer`, then
    `async_infer` of every prompt (gRPC: with a callback), and the results read back."""
    outputs = [lib.InferRequestedOutput("text_output")]
    for i in range(min(10, len(prompts))):
        client.infer("tensorrt_llm", _llmapi_inputs(lib, prompts[0], n), outputs=outputs, request_id=str(i))
    if protocol == "http":
        pending = [
            client.async_infer("tensorrt_llm", _llmapi_inputs(lib, p, n), outputs=outputs, request_id=str(i))
            for i, p in enumerate(prompts)
        ]
        results = [r.get_result() for r in pending]
    else:
        done: queue.Queue = queue.Queue()
        for i, p in enumerate(prompts):
            client.async_infer(
                "tensorrt_llm",
                _llmapi_inputs(lib, p, n),
                outputs=outputs,
                callback=partial(lambda q, result, error: q.put((result, error)), done),
                request_id=str(i),
            )
        results = []
        for _ in prompts:
            result, error = done.get(timeout=120)
            assert error is None, error
            results.append(result)
    return [r.as_numpy("text_output")[0].decode("utf-8") for r in results]


@pytest.mark.parametrize(
    "protocol", ["http", "grpc"]
)  # end_to_end_test (-i http), benchmark_core_model -i grpc
def test_llmapi_tools_on_the_default_llmapi_repository(unary_servers, greedy, protocol):
    lib, client = _client(protocol, unary_servers["llmapi"])
    for i, prompt in enumerate(PROMPTS):  # test_functionality_llmapi
        result = client.infer("tensorrt_llm", _llmapi_inputs(lib, prompt, None), request_id=str(i))
        assert result.as_numpy("text_output")[0].decode("utf-8"), "Text output should not be empty."
    texts = _performance(lib, client, protocol, PROMPTS, N)
    # sampling_param_exclude_input_from_output is left out (false): the prompt, then the target's greedy text
    # (gRPC callbacks may come in any order)
    assert sorted(texts) == sorted(p + greedy(p, N)[0] for p in PROMPTS)
    client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unary_calls_to_a_decoupled_llmapi_model_are_refused_by_triton(e2e_llmapi, protocol):
    from tritonclient.utils import InferenceServerException

    lib, client = _client(protocol, e2e_llmapi[2])
    with pytest.raises(InferenceServerException) as err:
        client.infer("tensorrt_llm", _llmapi_inputs(lib, PROMPTS[0], N))
    message = str(err.value)
    assert ("decoupled" in message) if protocol == "grpc" else ("501" in message or "decoupled" in message)
    client.close()
