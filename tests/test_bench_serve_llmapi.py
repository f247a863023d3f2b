"""bench-serve's LLM-API target-alone arm end to end: the speculative LLM-API repository without
speculative_config (`without_speculation`) is served by a real tritonserver and decodes with the target
alone (no drafts in the perf outputs, the local model never speculates), token for token the same
greedy answer as the speculative repository."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
PROMPTS = ["The quick brown fox", "def main():"]


def test_llmapi_repository_without_speculative_config_serves_the_target_alone(e2e_llmapi, greedy, tmp_path):
    from lab.benchmarks.serve_setup import llmapi_speculation, without_speculation
    from specbuild.client.remote import Session
    from specbuild.core.sampling_params import SamplingParams
    from specbuild.demo.pipeline import local_server

    _, repo, speculative = e2e_llmapi
    plain = without_speculation(repo, tmp_path / "plain")
    assert llmapi_speculation(plain) == {} and llmapi_speculation(repo)["max_draft_len"] == 4
    params = SamplingParams(max_tokens=MAX_TOKENS)
    with (
        local_server(plain) as server,
        Session(server.grpc_url) as alone,
        Session(speculative.grpc_url) as spec,
    ):
        assert alone.info.repo.num_draft_tokens == 0 and spec.info.repo.num_draft_tokens == 4
        for prompt in PROMPTS:
            _, ids, _ = greedy(prompt, MAX_TOKENS)
            for stream in (False, True):
                got = alone.generate(prompt, params, stream=stream, timeout_s=120)
                assert got.token_ids == ids, (prompt, stream)
                assert got.stats.drafted == 0 and got.stats.accepted == 0, got.stats
            drafted = spec.generate(prompt, params, stream=True, timeout_s=120)
            assert drafted.token_ids == ids and drafted.stats.drafted > 0


def test_the_local_llmapi_model_decodes_plainly_without_speculative_config(e2e_llmapi, greedy, tmp_path):
    """Without speculative_config the local LLM-API model runs the engine's plain decode (as the
    in-process baseline does), not the speculative loop at K=0; with it, the speculative loop at K."""
    import torch

    _, repo, _ = e2e_llmapi
    seen = []
    threads = torch.get_num_threads()  # the local model pins its threads: restored below
    try:
        _run_both(repo, tmp_path, seen, greedy)
    finally:
        torch.set_num_threads(threads)
    assert seen == [False, True]


def _run_both(repo, tmp_path, seen, greedy):
    import numpy as np
    from fake_triton import FakeServer

    from lab.benchmarks.serve_setup import without_speculation

    for folder, speculate in ((without_speculation(repo, tmp_path / "plain"), False), (repo, True)):
        model = FakeServer(folder).models["tensorrt_llm"]
        assert model.speculate is speculate
        run = model.engine.run  # what the engine process is asked to do
        model.engine.run = lambda *a, run=run, **kw: seen.append(kw["speculative"]) or run(*a, **kw)
        try:
            (response,) = model.execute([_fake_request(PROMPTS[0])])
        finally:
            model.finalize()
        ids = response.output_tensors[[t.name() for t in response.output_tensors].index("output_ids")]
        assert ids.as_numpy().tolist() == greedy(PROMPTS[0], MAX_TOKENS)[1]
        assert np.asarray(ids.as_numpy()).dtype == np.int32


def _fake_request(prompt: str):
    import numpy as np
    from fake_triton import Request

    return Request(
        {
            "text_input": np.array([prompt.encode()], dtype=object),
            "sampling_param_max_tokens": np.array([MAX_TOKENS], dtype=np.int32),
            "sampling_param_temperature": np.array([0.0], dtype=np.float32),
            "sampling_param_exclude_input_from_output": np.array([True]),
        }
    )
