"""The BLS's engine calls per round, counted through the fake Python backend (fake_triton): a K=0 round
of the load-aware schedule is ONE target call for up to plain_round_tokens tokens (not one call per
token), and greedy output stays the target's."""

from __future__ import annotations

import math

import pytest
from fake_triton import FakeServer, collect, text_request
from repo_builds import cached_build

from specbuild.core.sampling_params import SamplingParams
from specbuild.core.schedule import PLAIN_ROUND_TOKENS
from specbuild.model_repo.generate import generate_repo

pytestmark = pytest.mark.numeric  # float results through CPU kernels (greedy equality)

PROMPT = "def add(a, b):"
N = 12  # new tokens: more than one plain step, cheap


@pytest.fixture(scope="module")
def off_server(tmp_path_factory, tiny_target, tiny_draft):
    """A draft/target repository whose schedule says K=0 from one request in flight on."""
    import torch

    threads = torch.get_num_threads()  # the local engine model pins its threads; restore after
    build = cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft)
    repo = generate_repo(build, tmp_path_factory.mktemp("off") / "repo", backend="python", schedule="1:0")
    yield FakeServer(repo)
    torch.set_num_threads(threads)


def _calls(server, model: str) -> int:
    return sum(1 for name, _ in server.calls if name == model)


@pytest.mark.parametrize("stream", [False, True])
def test_a_k0_round_is_one_target_call_for_many_tokens(off_server, stream):
    s = off_server
    before_target, before_draft = _calls(s, "tensorrt_llm"), _calls(s, "tensorrt_llm_draft")
    # num_draft_tokens left out: the schedule applies (K=0 here); stream=True is the streamed baseline path
    got = collect(
        s.infer("tensorrt_llm_bls", text_request(PROMPT, N, stream=stream, return_perf_metrics=True))
    )
    ids = s.models["preprocessing"].tokenizer.encode(PROMPT)
    want = s.models["tensorrt_llm"].engine.generate(ids, SamplingParams(max_tokens=N)).token_ids
    assert got["tokens"] == want
    assert _calls(s, "tensorrt_llm_draft") == before_draft  # no drafting at K=0
    # K=0 rounds ask for plain_round_tokens target tokens per call (before the fix: one call per token)
    assert _calls(s, "tensorrt_llm") - before_target == math.ceil(N / PLAIN_ROUND_TOKENS)
    assert got["perf"]["total_draft_tokens"] == 0
