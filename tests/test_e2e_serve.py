"""End to end: tiny models -> reference engines -> Python-backend repositories -> a real tritonserver
(the library `specbuild serve` calls) -> the gRPC client, compared with the in-process greedy baseline.

The servers are the session's shared ones (e2e_fixtures.py); the destructive tests are in
test_e2e_serve_faults.py, which runs last.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
K = 3
PROMPTS = [
    "The quick brown fox",
    "Once upon a time",
    "def main():",
    "Speculative decoding is",
    "A recipe for bread",
    "In the morning",
    "Dear team,",
    "The weather tomorrow",
]


@pytest.fixture(scope="module")
def servers(e2e_servers):
    return e2e_servers


@pytest.fixture(scope="module")
def builds(e2e_builds):
    return e2e_builds


@pytest.fixture(scope="module")
def baseline(greedy):
    """prompt -> (text, token_ids) of the target alone, greedy, in-process (both modes share the target)."""
    return {p: greedy(p, MAX_TOKENS)[:2] for p in PROMPTS}


def _remote(server, prompt, timeout_s=120.0, **kw):
    from specbuild.client.remote import generate_remote
    from specbuild.core.sampling_params import SamplingParams

    return generate_remote(
        server.grpc_url, prompt, SamplingParams(max_tokens=MAX_TOKENS), timeout_s=timeout_s, **kw
    )


def test_draft_target_unary_and_streaming_equal_greedy_baseline(servers, baseline):
    server = servers["draft_target"]
    prompt = PROMPTS[0]
    expected = baseline[prompt]
    unary = _remote(server, prompt, num_draft_tokens=K)
    streamed_text: list[str] = []
    stream = _remote(server, prompt, num_draft_tokens=K, stream=True, on_text=streamed_text.append)
    alone = _remote(server, prompt, num_draft_tokens=0)
    for result in (unary, stream, alone):
        assert (result.text, result.token_ids) == expected
    assert "".join(streamed_text) == expected[0] and len(streamed_text) > 1
    assert unary.speculative and unary.stats.drafted > 0 and not alone.speculative
    assert stream.stats.target_passes >= 1 and stream.timings["ttft"] <= stream.timings["total"]


def test_medusa_unary_and_streaming_equal_greedy_baseline(servers, baseline):
    server = servers["medusa"]
    for prompt in PROMPTS[:2]:
        unary = _remote(server, prompt)
        stream = _remote(server, prompt, stream=True)
        assert (unary.text, unary.token_ids) == baseline[prompt]
        assert (stream.text, stream.token_ids) == baseline[prompt]
        assert unary.speculative and unary.stats.drafted > 0


def test_generate_cli_json_through_triton(servers, baseline, greedy):
    from typer.testing import CliRunner

    from specbuild.cli import app

    url = servers["medusa"].grpc_url
    result = CliRunner().invoke(
        app,
        [
            "generate",
            "--url",
            url,
            "--prompt",
            PROMPTS[1],
            "--max-tokens",
            str(MAX_TOKENS),
            "--json",
            "--model",
            "ensemble",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert (data["text"], data["token_ids"]) == baseline[PROMPTS[1]]
    assert set(data) >= {"text", "token_ids", "finish_reason", "speculative", "stats", "timings"}
    assert data["prompt_tokens"] == len(
        greedy(PROMPTS[1], MAX_TOKENS)[2]
    )  # num_input_tokens, the 1.2-era output


def test_eight_concurrent_streams_complete_unmixed(servers, baseline):
    server = servers["draft_target"]
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(lambda p: _remote(server, p, num_draft_tokens=K, stream=True), PROMPTS))
    assert len(results) == 8
    for prompt, result in zip(PROMPTS, results, strict=True):
        assert (result.text, result.token_ids) == baseline[prompt], prompt


def test_wrong_model_is_a_clear_error(servers):
    from specbuild.core.errors import ClientError

    with pytest.raises(ClientError, match="model 'nope' is not served here") as err:
        _remote(servers["medusa"], "x", model="nope")
    assert "ensemble" in err.value.expected


def test_timeout_is_a_clear_error(servers, baseline):
    from specbuild.core.errors import ClientError

    with pytest.raises(ClientError, match="no complete answer from 'tensorrt_llm_bls' within 0.01 s") as err:
        _remote(servers["medusa"], PROMPTS[3], timeout_s=0.01)
    assert "--timeout" in err.value.fix
    # the abandoned request does not disturb the next one
    assert _remote(servers["medusa"], PROMPTS[0]).token_ids == baseline[PROMPTS[0]][1]


def test_serve_refuses_a_busy_port(servers, builds):
    from typer.testing import CliRunner

    from specbuild.cli import app

    busy = servers["medusa"].options.grpc_port
    result = CliRunner().invoke(app, ["serve", str(builds["medusa"][1]), "--grpc-port", str(busy)])
    assert result.exit_code == 2
    assert f"grpc port 127.0.0.1:{busy} is busy" in result.output


def test_bench_through_triton_writes_the_report(servers, tmp_path):
    from specbuild.bench.bench import run_bench
    from specbuild.bench.options import BenchConfig
    from specbuild.bench.report import PLOTS, write_report

    server = servers["draft_target"]
    config = BenchConfig(
        url=server.grpc_url,
        prompts=tuple(PROMPTS[:2]),
        concurrency=(1, 2),
        temperatures=(0.0,),
        max_tokens=8,
        num_draft_tokens=K,
        metrics_url=f"http://{server.options.host}:{server.options.metrics_port}/metrics",
    )
    runs, context = run_bench(config)
    assert [(r.mode, r.concurrency) for r in runs] == [
        ("baseline", 1),
        ("baseline-unary", 1),
        ("speculative", 1),
        ("baseline", 2),
        ("baseline-unary", 2),
        ("speculative", 2),
    ]
    assert context["cost_ratio"] is not None and context["cost_ratio"] >= 0
    for run in runs:
        assert run.requests == 2 and run.metrics["output_sequence_length"]["avg"] == 8
        assert 0 < run.metrics["time_to_first_token"]["p50"] <= run.metrics["request_latency"]["p50"]
    spec = runs[2].metrics
    assert (
        spec["speedup_measured"] > 0 and spec["speedup_predicted"] > 0 and 0 <= spec["acceptance_rate"] <= 1
    )
    assert spec["speedup_measured_vs_unary"] > 0
    # the one-call baseline answers once: no stream (TTFT is the whole request)
    assert all(r.target_passes == 1 and r.first_chunk_tokens == r.output_tokens == 8 for r in runs[1].records)
    assert spec["mean_accepted_tokens_per_pass"] >= 1
    for run in runs:
        assert run.metrics["connections"] <= run.concurrency  # one connection per worker, not per request
    # the baseline streams token by token: one response per token, the first one well before the end
    for record in runs[0].records:
        assert record.target_passes == record.output_tokens == 8 and record.first_chunk_tokens == 1
        assert record.ttft_s < record.latency_s and record.itl_s > 0
    # the server's Prometheus counters (trtllm-serve's names) agree with the requests' own counts, exactly
    for run in runs:
        check = run.metrics["prometheus_check"]
        assert check["agree"], check
        if run.mode == "speculative":
            assert check["prometheus"]["drafted"] == sum(r.drafted for r in run.records) > 0
            assert check["prometheus"]["steps"] == sum(len(r.rounds) for r in run.records)
        else:
            assert check["prometheus"]["drafted"] == 0
    # the rounds streamed with their counters are exact: they add up to the server's totals
    for record in runs[2].records:
        assert sum(a for a, _ in record.rounds) == record.accepted and sum(d for _, d in record.rounds) == (
            record.drafted
        )
        assert all(d <= K for _, d in record.rounds)
    files = write_report(runs, context, tmp_path)
    assert {f.name for f in files} == {
        "bench.json",
        "bench.csv",
        "aiperf_metrics.json",
        "records.jsonl",
        "speculation_profile.json",
        *PLOTS,
    }
    aiperf = json.loads((tmp_path / "aiperf_metrics.json").read_text())
    spec_run = aiperf["runs"][2]
    assert spec_run["time_to_first_token"]["unit"] == "ms" and spec_run["time_to_first_token"]["count"] == 2
    assert spec_run["spec_decode_overall_draft_acceptance_rate"]["avg"] == pytest.approx(
        100 * spec["acceptance_rate"]
    )  # float64 ratios of the same integer counts: default rel 1e-6
    lines = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert len(lines) == 12 and all(line["spec_decode_acceptance"] is None for line in lines[:4])
    record = lines[4]["spec_decode_acceptance"]
    assert sum(record["acceptance_histogram"].values()) == record["num_spec_steps"]
    profile = json.loads((tmp_path / "speculation_profile.json").read_text())
    assert profile["num_speculative_tokens"] == K and profile["method"] == "draft_model"
    assert len(profile["conditional_accept_rates"]) == K


def test_bench_without_num_draft_tokens_uses_the_repository_k(servers, builds):
    """K is what the build recorded (tune --write's choice): the BLS's default_num_draft_tokens."""
    import tritonclient.grpc as grpcclient

    from specbuild.bench.bench import run_bench
    from specbuild.bench.options import BenchConfig
    from specbuild.client.remote import repo_info
    from specbuild.core.artifacts import read_build_manifest
    from specbuild.core.methods import Method

    recorded = read_build_manifest(builds["draft_target"][0]).spec.speculation.max_draft_len
    assert recorded != K  # the other bench test passes K explicitly
    client = grpcclient.InferenceServerClient(servers["draft_target"].grpc_url)
    try:
        assert (
            repo_info(client).method == Method.DRAFT_TARGET and repo_info(client).num_draft_tokens == recorded
        )
    finally:
        client.close()
    config = BenchConfig(
        url=servers["draft_target"].grpc_url,
        prompts=tuple(PROMPTS[:1]),
        concurrency=(1,),
        temperatures=(0.0,),
        max_tokens=6,
        unary_baseline=False,
    )
    runs, context = run_bench(config)
    assert context["num_draft_tokens"] == recorded and [r.num_draft_tokens for r in runs] == [0, recorded]


def test_multiturn_workload_reports_prefix_reuse_of_target_and_draft(servers):
    """Conversations whose turns extend the previous context: the BLS reports each engine's prompt reuse
    (kv_cache_reused_blocks of the target, draft_kv_cache_reused_blocks of the draft)."""
    from specbuild.bench.bench import run_bench
    from specbuild.bench.multiturn import compare_reuse, render, user_turns
    from specbuild.bench.options import BenchConfig

    assert user_turns(("a", "b", "c"), 2, 2) == [["a", "b"], ["c", "a"]]
    assert render("S", [("u1", " a1")], "u2") == "S\nUser: u1\nAssistant: a1\nUser: u2\nAssistant:"
    config = BenchConfig(
        url=servers["draft_target"].grpc_url,
        prompts=tuple(PROMPTS[:4]),
        concurrency=(1,),
        temperatures=(0.0,),
        max_tokens=6,
        num_draft_tokens=K,
        workload="multiturn",
        conversations=2,
        turns=3,
    )
    runs, _ = run_bench(config)
    base, spec = (r.metrics["prefix_reuse"] for r in runs)
    assert base["requests"] == spec["requests"] == 6
    assert base["draft"] is None and spec["draft"] is not None  # the draft runs only with speculation
    for reuse in (base["target"], spec["target"], spec["draft"]):
        # later turns start with the whole previous request: their prompts reuse cached blocks
        assert reuse["reused_blocks_by_turn"]["2"] > 0 and 0 < reuse["reuse_ratio"] < 1
    (row,) = compare_reuse(runs)
    assert row["target_reused_blocks_off"] == base["target"]["reused_blocks"]
    assert row["verdict"].startswith("speculation")


def test_a_session_keeps_one_stream_and_opens_a_fresh_one_after_a_timeout(servers, baseline):
    """Streamed requests of one Session share one gRPC stream (session_stream.py); a request that times
    out closes it (cancelling its work) and the next request opens a fresh one and gets exact tokens."""
    from specbuild.client.remote import Session
    from specbuild.core.errors import ClientError
    from specbuild.core.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS)
    with Session(servers["medusa"].grpc_url) as session:  # decoupled: every request goes on the stream
        opened = []
        start = session.client.start_stream

        def counted(**kw):
            opened.append(True)
            return start(**kw)

        session.client.start_stream = counted
        for prompt in PROMPTS[:3]:
            result = session.generate(prompt, params, stream=True)
            assert result.token_ids == baseline[prompt][1]
        assert len(opened) == 1 and session.stream.is_open
        with pytest.raises(ClientError, match="no complete answer"):
            session.generate(PROMPTS[3], params, timeout_s=0.01)
        assert not session.stream.is_open
        assert session.generate(PROMPTS[0], params).token_ids == baseline[PROMPTS[0]][1]
        assert len(opened) == 2
