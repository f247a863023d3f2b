"""The entry model's transaction policy is a repository option (model_repo/transaction.py): the flow's
default (engine: decoupled, the BLS streams; LLM-API: not, as upstream's model.yaml), the spec's
serving.decoupled, `repo --decoupled / --no-decoupled`; `repo` says what the choice serves; a BLS or
LLM-API model that is not decoupled answers each request once and refuses to stream with the backend's
own words. Through the fake Python backend; tests/test_e2e_upstream_clients.py runs upstream's unary
clients against real servers."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from fake_triton import FakeServer, Request, collect, text_request
from repo_builds import EXAMPLES, cached_build, compile_tiny_llmapi
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.core.spec import spec_from_dict
from specbuild.model_repo.configs import parse_text
from specbuild.model_repo.generate import generate_repo
from specbuild.model_repo.transaction import decoupled_of

PROMPT = "def add(a, b):"
N = 8


def _spec(flow: str, decoupled):
    raw = yaml.safe_load((EXAMPLES / "draft-target.yaml").read_text())
    raw["flow"] = flow
    if decoupled is not None:
        raw.setdefault("serving", {})["decoupled"] = decoupled
    return spec_from_dict(raw, source=EXAMPLES / "draft-target.yaml")


@pytest.mark.parametrize(
    ("flow", "spec_value", "flag", "want"),
    [
        ("engine", None, None, True),  # the BLS streams (upstream's template has no default)
        ("llmapi", None, None, False),  # upstream model.yaml: decoupled: False
        ("engine", False, None, False),
        ("llmapi", True, None, True),
        ("engine", True, False, False),  # the repo flag wins over the spec
        ("llmapi", False, True, True),
    ],
)
def test_policy_per_flow_spec_and_flag(flow, spec_value, flag, want):
    assert decoupled_of(_spec(flow, spec_value), flag) is want


def test_the_spec_key_is_a_bool():
    from specbuild.core.errors import SpecError

    with pytest.raises(SpecError, match="serving.decoupled has the wrong type"):
        _spec("engine", "yes")


@pytest.fixture(scope="module")
def dt_build(tmp_path_factory, tiny_target, tiny_draft):
    return cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft)


def _bls_decoupled(repo) -> bool:
    config = parse_text((repo / "tensorrt_llm_bls" / "config.pbtxt").read_text())
    return config.model_transaction_policy.decoupled


@pytest.mark.parametrize(
    ("args", "want"), [((), True), (("--no-decoupled",), False), (("--decoupled",), True)]
)
def test_repo_writes_the_policy_and_says_what_it_serves(dt_build, tmp_path, args, want):
    result = CliRunner().invoke(app, ["repo", str(dt_build), "--out", str(tmp_path / "r"), *args])
    assert result.exit_code == 0, result.output
    assert _bls_decoupled(tmp_path / "r") is want
    text = " ".join(result.output.split())
    if want:
        assert "tensorrt_llm_bls: decoupled - streams" in text and "HTTP /infer are refused" in text
    else:
        assert "tensorrt_llm_bls: not decoupled - one response per request" in text and "no streaming" in text


@pytest.fixture(scope="module")
def unary_bls(tmp_path_factory, dt_build):
    """A draft/target repository whose BLS is not decoupled, and the usual (decoupled) one."""
    import torch

    threads = torch.get_num_threads()  # the local engine model pins its threads; restore after
    root = tmp_path_factory.mktemp("unary-bls")
    yield (
        FakeServer(generate_repo(dt_build, root / "unary", backend="python", decoupled=False)),
        FakeServer(generate_repo(dt_build, root / "streaming", backend="python")),
    )
    torch.set_num_threads(threads)


def test_a_bls_that_is_not_decoupled_answers_once_and_refuses_to_stream(unary_bls):
    unary, streaming = unary_bls
    kw = dict(num_draft_tokens=3, return_perf_metrics=True)
    # FakeServer checks the Python backend's rule: one response, with the final flag, through the sender
    (one,) = unary.infer("tensorrt_llm_bls", text_request(PROMPT, N, **kw))
    got, want = collect([one]), collect(streaming.infer("tensorrt_llm_bls", text_request(PROMPT, N, **kw)))
    assert got["tokens"] == want["tokens"] and len(got["tokens"]) == N and got["text"] == want["text"]
    assert got["perf"]["total_draft_tokens"] > 0
    (refused,) = unary.infer("tensorrt_llm_bls", text_request(PROMPT, N, stream=True, **kw))
    assert refused.has_error()
    assert (
        "Streaming is only supported if model is deployed using decoupled mode" in refused.error().message()
    )


def test_a_cancelled_request_to_a_unary_bls_gets_the_cancelled_error(unary_bls):
    unary, _ = unary_bls
    request = Request(text_request(PROMPT, N, num_draft_tokens=3))
    request.sender.is_cancelled = lambda: True  # the client is gone before the first round
    ((response,),) = unary.infer_batch("tensorrt_llm_bls", [], requests=[request])
    assert response.has_error() and "cancelled" in response.error().message()


@pytest.fixture(scope="module")
def unary_llmapi(tmp_path_factory, tiny_target, tiny_draft):
    """The local LLM-API model with upstream's default policy (not decoupled)."""
    import torch

    threads = torch.get_num_threads()
    root = tmp_path_factory.mktemp("unary-llmapi")
    build = compile_tiny_llmapi(root, target=tiny_target, draft=tiny_draft)
    repo = generate_repo(build, root / "repo", backend="llmapi-local")  # the default
    assert (
        yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())["triton_config"]["decoupled"]
        is False
    )
    server = FakeServer(repo)  # no policy in config.pbtxt (as upstream): not decoupled
    yield server
    server.models["tensorrt_llm"].finalize()
    torch.set_num_threads(threads)


def test_the_llmapi_model_by_default_answers_unary_requests_and_refuses_streaming(unary_llmapi):
    inputs = {
        "text_input": np.array([PROMPT.encode()], dtype=object),
        "sampling_param_max_tokens": np.array([N], dtype=np.int32),
    }
    (response,) = unary_llmapi.infer("tensorrt_llm", inputs)
    assert not response.has_error(), response.error().message()
    text = next(t.as_numpy() for t in response.output_tensors if t.name() == "text_output")
    assert text.shape == (1,) and text[0]
    (refused,) = unary_llmapi.infer("tensorrt_llm", {**inputs, "streaming": np.array([True])})
    assert (
        refused.has_error() and "Streaming is only supported in decoupled mode." in refused.error().message()
    )
