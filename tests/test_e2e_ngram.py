"""End to end, n-gram: the local tritonserver's BLS drafts from its pool (two BLS processes sharing the
public pool file) and the local tensorrt_llm model verifies draft_input_ids; greedy output equals the
target alone for every K, unary, streamed and concurrent; per-request acceptance comes back."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
PROMPTS = ["def main():", "The quick brown fox", "Once upon a time", "In the morning"]


@pytest.fixture(scope="module")
def server(e2e_servers):
    return e2e_servers["ngram"]


@pytest.fixture(scope="module")
def baseline(greedy):
    return {p: greedy(p, MAX_TOKENS)[:2] for p in PROMPTS}


def _remote(server, prompt, **kw):
    from specbuild.client.remote import generate_remote
    from specbuild.core.sampling_params import SamplingParams

    return generate_remote(
        server.grpc_url, prompt, SamplingParams(max_tokens=MAX_TOKENS), timeout_s=120, **kw
    )


def test_repository_says_ngram(server, e2e_builds):
    import tritonclient.grpc as grpcclient

    from specbuild.client.remote import repo_info
    from specbuild.core.methods import Method

    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        info = repo_info(client)
        assert info.method == Method.NGRAM and info.num_draft_tokens == 4  # examples/tiny/ngram.yaml's K
        assert not client.is_model_ready("tensorrt_llm_draft")
    finally:
        client.close()


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_greedy_equals_the_target_for_every_k(server, baseline, k):
    prompt = PROMPTS[0]
    runs = [_remote(server, prompt, num_draft_tokens=k, stream=stream) for stream in (False, True, False)]
    for result in runs:
        assert (result.text, result.token_ids) == baseline[prompt]
        assert 0 <= result.stats.accepted <= result.stats.drafted
    # the pool is public and shared by the server's BLS processes: a request seen before is drafted from it
    assert runs[2].stats.drafted > 0 and runs[2].stats.accepted > 0
    assert runs[2].stats.acceptance_rate == pytest.approx(runs[2].stats.accepted / runs[2].stats.drafted)


def test_concurrent_requests_equal_the_target(server, baseline):
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda p: _remote(server, p, num_draft_tokens=3, stream=True), PROMPTS * 2))
    for prompt, result in zip(PROMPTS * 2, results, strict=True):
        assert (result.text, result.token_ids) == baseline[prompt], prompt


def test_generate_cli_and_bench_show_the_method(server, baseline, tmp_path):
    from typer.testing import CliRunner

    from specbuild.cli import app

    prompt = PROMPTS[1]
    result = CliRunner().invoke(
        app,
        ["generate", "--url", server.grpc_url, "--prompt", prompt, "--max-tokens", str(MAX_TOKENS), "--json"],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["text"], data["token_ids"]) == baseline[prompt]

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS[:2]) + "\n")
    args = [
        "bench",
        "--url",
        server.grpc_url,
        "--prompts",
        str(prompts),
        "--concurrency",
        "1",
        "--temperature",
        "0",
    ]
    result = CliRunner().invoke(app, [*args, "--max-tokens", "8", "--out", str(tmp_path / "bench")])
    assert result.exit_code == 0, result.output
    assert "method: ngram, K = 4" in result.output
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert report["context"]["mode"] == "ngram" and report["context"]["cost_ratio"] == 0.0
    runs = report["runs"]
    assert [r["mode"] for r in runs] == ["baseline", "baseline-unary", "speculative"]
    spec = runs[2]["metrics"]
    assert spec["speedup_measured"] > 0 and spec["mean_accepted_tokens_per_pass"] >= 1
    assert "speedup_predicted" not in spec  # rounds draft 0..K: no i.i.d. prediction


def test_the_bls_instances_share_one_pool_file(server, e2e_builds):
    """Both BLS processes (bls_instance_count 2) open the same pool: one file for this server's model, in
    the user's private pool folder (test_e2e_ngram_pool.py checks its modes)."""
    from test_e2e_ngram_pool import pool_file

    assert pool_file(e2e_builds["ngram"][1]).stat().st_size > 0


def test_the_llmapi_interface_serves_ngram(e2e_llmapi_ngram, baseline):
    """flow: llmapi + mode: ngram -> NGramDecodingConfig in model.yaml, served by the local LLM-API model over
    the reference engine's n-gram drafter: greedy equals the target alone, acceptance comes back."""
    import yaml

    from specbuild.bench.bench import run_bench
    from specbuild.bench.options import BenchConfig
    from specbuild.client.remote import LLMAPI_INTERFACE, connect, model_info
    from specbuild.core.methods import Method

    _, repo, server = e2e_llmapi_ngram
    options = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert options["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": 4,
        "max_matching_ngram_size": 3,
        "is_keep_all": True,
        "is_use_oldest": True,
        "is_public_pool": True,
    }
    assert options["disable_overlap_scheduler"] is True  # what the PyTorch executor does for NGram anyway
    client = connect(server.grpc_url)
    try:
        info = model_info(client, None)
    finally:
        client.close()
    assert info.interface == LLMAPI_INTERFACE and info.repo.method is Method.NGRAM
    assert info.repo.num_draft_tokens == 4 and not info.repo.has_baseline
    for prompt in PROMPTS:
        for stream in (False, True):
            result = _remote(server, prompt, stream=stream)
            assert (result.text, result.token_ids) == baseline[prompt], (prompt, stream)
            assert result.speculative and 0 <= result.stats.accepted <= result.stats.drafted
    again = _remote(server, PROMPTS[0])  # the public pool has seen this continuation: drafted from it
    assert again.stats.drafted > 0 and again.stats.accepted > 0

    runs, context = run_bench(
        BenchConfig(
            url=server.grpc_url, prompts=PROMPTS[:2], concurrency=(1,), temperatures=(0.0,), max_tokens=8
        )
    )
    assert [r.mode for r in runs] == ["speculative"]
    assert (
        context["interface"] == "llmapi" and context["mode"] == "ngram" and context["num_draft_tokens"] == 4
    )
    m = runs[0].metrics
    assert m["acceptance_rate"] == m["acceptance_rate"] and m["mean_accepted_tokens_per_pass"] >= 1.0
    assert m["alpha"] != m["alpha"]  # rounds draft 0..K tokens: no i.i.d. alpha
