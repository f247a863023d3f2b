"""Request limits and bad values through a real tritonserver: what the engines' build_config allows,
refused as TensorRT-LLM refuses it (prompt length, draft length, sampling values) with a clear error,
output lengths lowered to fit max_seq_len as the backend does, and the server unharmed afterwards.
The builds: max_seq_len 512 (+ K drafts in the target engine), so the runtime prompt limit is
min(max_seq_len - 1, max_num_tokens) = 511 for the draft and Medusa engines."""

from __future__ import annotations

import numpy as np
import pytest
from e2e_fixtures import MAX_SEQ_LEN
from test_e2e_interface import PROMPT, stream_call, tensor, text_inputs, texts

pytestmark = pytest.mark.slow

LONG = "The quick brown fox jumps over the lazy dog. " * 60  # ~2700 characters: far more than 511 tokens


def error_of(server, model, inputs):
    """The error a request gets (the stream's callback error), or None."""
    import queue

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    got = queue.Queue()
    client.start_stream(callback=lambda result=None, error=None: got.put((result, error)))
    client.async_stream_infer(model, inputs)
    client.stop_stream()
    client.close()
    errors = []
    while not got.empty():
        _, error = got.get()
        if error is not None:
            errors.append(str(error))
    return errors[0] if errors else None


def still_serves(server, greedy):
    text, _, _ = greedy(PROMPT, 12)
    assert "".join(texts(stream_call(server, "tensorrt_llm_bls", text_inputs(stream=True)))) == text


@pytest.mark.parametrize(
    "mode, model",
    [
        ("draft_target", "tensorrt_llm_bls"),
        ("draft_target", "ensemble"),
        ("medusa", "ensemble"),
        ("medusa", "tensorrt_llm_bls"),
    ],
)
def test_a_prompt_over_the_input_limit_is_refused(e2e_servers, greedy, mode, model):
    server = e2e_servers[mode]
    error = error_of(server, model, text_inputs(LONG, 8))
    assert error is not None and "exceeds maximum input length" in error, error
    still_serves(server, greedy)


def test_prompt_plus_max_tokens_over_the_sequence_limit(e2e_servers, greedy):
    """The BLS refuses what its engines would cut short; the ensemble's engine lowers the output length
    to fit max_seq_len (TensorRT-LLM's behaviour), so its answer stays within the engine's sequence."""
    dt = e2e_servers["draft_target"]
    error = error_of(dt, "tensorrt_llm_bls", text_inputs(n=MAX_SEQ_LEN, num_draft_tokens=3))
    assert (
        error is not None and "exceeds the engine's sequence limit" in error and "ask for at most" in error
    ), error
    _, _, prompt_ids = greedy(PROMPT, 12)
    results = stream_call(
        dt,
        "ensemble",
        [*text_inputs(n=MAX_SEQ_LEN * 4), tensor("end_id", np.array([[-1]], dtype=np.int32))],
        outputs=("text_output", "output_ids", "sequence_length"),
    )
    produced = int(
        results[-1].as_numpy("sequence_length")[0][0]
    )  # prompt included (exclude_input_in_output false)
    assert len(prompt_ids) < produced <= MAX_SEQ_LEN + 4  # the target engine's max_seq_len (spec + K)
    assert "output length lowered" in dt.log_text()


@pytest.mark.parametrize(
    "name, value, expect",
    [
        ("temperature", -0.5, "temperature must be"),
        ("temperature", float("nan"), "temperature must be"),
        ("top_p", 1.5, "top_p must be in (0, 1]"),
        ("top_k", -3, "top_k must be >= 0"),
        ("num_draft_tokens", 7, "Draft tokens length (7) exceeds maximum draft tokens length (4)"),
        ("num_draft_tokens", -2, "num_draft_tokens must be >= 0"),
    ],
)
def test_values_the_backend_refuses(e2e_servers, name, value, expect):
    error = error_of(e2e_servers["draft_target"], "tensorrt_llm_bls", text_inputs(n=8, **{name: value}))
    assert error is not None and expect in error, error


def test_the_client_refuses_before_sending(e2e_servers):
    from specbuild.client.remote import generate_remote
    from specbuild.core.errors import SpecbuildError
    from specbuild.core.sampling_params import SamplingParams

    url = e2e_servers["draft_target"].grpc_url
    with pytest.raises(SpecbuildError, match="cannot fit the engines' sequence limit"):
        generate_remote(url, PROMPT, SamplingParams(max_tokens=10_000))
    with pytest.raises(SpecbuildError, match="num_draft_tokens must be >= 0"):
        generate_remote(url, PROMPT, SamplingParams(max_tokens=4), num_draft_tokens=-1)
    with pytest.raises(
        SpecbuildError, match="num_draft_tokens 4294967296 does not fit|num_draft_tokens must be"
    ):
        generate_remote(url, PROMPT, SamplingParams(max_tokens=4), num_draft_tokens=2**32)


def test_the_servers_error_is_reported_not_the_local_cancellation(e2e_servers):
    """A streamed request the server refuses: the client shows the server's message (it used to show
    "Locally cancelled by application!" from its own stop_stream)."""
    from specbuild.client.remote import generate_remote
    from specbuild.core.errors import ClientError
    from specbuild.core.sampling_params import SamplingParams

    with pytest.raises(ClientError) as err:
        generate_remote(e2e_servers["medusa"].grpc_url, LONG, SamplingParams(max_tokens=4), stream=True)
    assert "exceeds maximum input length" in err.value.found and "cancelled" not in err.value.found.lower()
