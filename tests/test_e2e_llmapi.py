"""End to end on the LLM-API interface: the tiny draft/target family compiled with `--flow llmapi
--engine reference`, laid out as Triton's LLM-API model (`repo --backend llmapi-local`) and served by a
real tritonserver. Greedy text equals the engine-flow repository's and the target alone's; the perf
outputs report acceptance; `bench` and `repo check` work on it; a stop request cancels."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
PROMPTS = ["The quick brown fox", "def main():", "Once upon a time"]


def _generate(server, prompt, **kw):
    from specbuild.client.remote import generate_remote
    from specbuild.core.sampling_params import SamplingParams

    return generate_remote(
        server.grpc_url, prompt, SamplingParams(max_tokens=MAX_TOKENS), timeout_s=120, **kw
    )


def test_greedy_text_equals_engine_flow_and_target_alone(e2e_llmapi, e2e_servers, greedy):
    _, _, server = e2e_llmapi
    for prompt in PROMPTS:
        text, ids, _ = greedy(prompt, MAX_TOKENS)
        llmapi = _generate(server, prompt)
        streamed = _generate(server, prompt, stream=True)
        engine_flow = _generate(e2e_servers["draft_target"], prompt, num_draft_tokens=4)
        assert llmapi.token_ids == ids and llmapi.text == text, prompt
        assert streamed.token_ids == ids and streamed.text == text, prompt
        assert engine_flow.text == text, prompt
        # acceptance comes back in the perf outputs: K=4 drafts per step, none beyond the output
        s = llmapi.stats
        assert llmapi.speculative and s.drafted > 0 and 0 <= s.accepted <= s.drafted
        # each streamed response is one engine round: its tokens are the accepted drafts + 1; the rounds
        # (drafted min(K, room - 1); a last one that could draft nothing is no step) add up to the totals
        st = streamed.stats
        assert sum(st.accepted_per_step) + st.target_passes == len(ids)
        assert sum(st.accepted_per_step) == st.accepted and sum(st.drafted_per_step) == st.drafted > 0


def test_interface_detected_from_metadata(e2e_llmapi):
    from specbuild.client.remote import LLMAPI_INTERFACE, connect, model_info
    from specbuild.core.methods import Method

    _, _, server = e2e_llmapi
    client = connect(server.grpc_url)
    try:
        info = model_info(client, None)
    finally:
        client.close()
    assert info.name == "tensorrt_llm" and info.interface == LLMAPI_INTERFACE
    assert info.repo.method is Method.DRAFT_TARGET and info.repo.num_draft_tokens == 4
    assert not info.repo.has_baseline and info.token_ids


def test_bench_runs_unchanged(e2e_llmapi, tmp_path):
    from specbuild.bench.bench import run_bench
    from specbuild.bench.options import BenchConfig
    from specbuild.bench.report import write_report

    _, _, server = e2e_llmapi
    config = BenchConfig(
        url=server.grpc_url,
        prompts=PROMPTS[:2],
        concurrency=(1, 2),
        temperatures=(0.0,),
        max_tokens=8,
        metrics_url=f"http://{server.options.host}:{server.options.metrics_port}/metrics",
    )
    runs, context = run_bench(config)
    assert [r.mode for r in runs] == ["speculative", "speculative"]
    assert context["interface"] == "llmapi" and context["num_draft_tokens"] == 4
    for run in runs:
        m = run.metrics
        assert m["output_sequence_length"]["avg"] == 8
        assert m["acceptance_rate"] == m["acceptance_rate"]  # measured (not NaN)
        assert m["mean_accepted_tokens_per_pass"] >= 1.0
        assert m["connections"] <= run.concurrency
        # the LLM-API model exports trtllm-serve's spec-decode series too: they agree with the requests
        check = m["prometheus_check"]
        assert check["agree"] and check["prometheus"]["drafted"] == sum(r.drafted for r in run.records) > 0
        # the rounds (one per streamed response, drafted min(K, room - 1)) add up to the server's totals
        for r in run.records:
            assert sum(d for _, d in r.rounds) == r.drafted and sum(a for a, _ in r.rounds) == r.accepted
    # the records others read, through this interface too
    write_report(runs, context, tmp_path)
    lines = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    record = lines[0]["spec_decode_acceptance"]
    assert record["num_spec_tokens"] == 4 and record["num_draft_tokens"] == runs[0].records[0].drafted
    assert sum(record["acceptance_histogram"].values()) == record["num_spec_steps"]
    profile = json.loads((tmp_path / "speculation_profile.json").read_text())
    assert profile["num_speculative_tokens"] == 4 and profile["method"] == "draft_model"


def test_repo_check_accepts_it(e2e_llmapi):
    from specbuild.model_repo.check import check_repo

    _, repo, _ = e2e_llmapi
    assert check_repo(repo) == []


def test_stop_request_cancels_a_running_request(e2e_llmapi):
    import tritonclient.grpc as grpcclient

    _, _, server = e2e_llmapi

    def tensor(name, value, dtype):
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=object if dtype == "BYTES" else None))
        return t

    results, errors, done, running = [], [], threading.Event(), threading.Event()

    def callback(result, error):
        (errors if error is not None else results).append(error or result)
        running.set()
        final = result is not None and result.get_response().parameters["triton_final_response"].bool_param
        if final:  # the stopped request's last response
            done.set()

    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=callback)
    try:
        inputs = [
            tensor("text_input", b"The quick brown fox", "BYTES"),
            tensor("streaming", True, "BOOL"),
            tensor("sampling_param_max_tokens", np.int32(400), "INT32"),
            tensor("return_finish_reason", True, "BOOL"),
        ]
        client.async_stream_infer("tensorrt_llm", inputs, request_id="stop-me")
        assert running.wait(60), "the request never streamed its first token"
        # upstream's stop input: the same request id, on the stream (decoupled model), sent while it runs
        stop = [tensor("text_input", b"", "BYTES"), tensor("stop", True, "BOOL")]
        client.async_stream_infer("tensorrt_llm", stop, request_id="stop-me")
        assert done.wait(60), "the stopped request never ended"
        time.sleep(0.5)
    finally:
        client.stop_stream()
        client.close()
    assert [e.message() for e in errors] == ["Request cancelled by client"]  # the stop request's answer
    assert results[-1].as_numpy("finish_reason")[0] == b"cancelled"
    # it ended by the stop, not by its length: fewer chunks than max_tokens (a chunk holds >= 1 token); how
    # many rounds ran before the stop landed depends on the machine's speed, so no tighter bound is honest
    assert len(results) < 400
