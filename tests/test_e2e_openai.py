"""The OpenAI-compatible frontend, judged by the official `openai` client, against the session's real
tritonservers (draft/target and Medusa): /v1/models, completions and chat, streaming with [DONE],
usage (also per chunk), vLLM's per-request speculative metrics, stop strings, and the clear refusals."""

from __future__ import annotations

import json
import urllib.request

import pytest

pytestmark = pytest.mark.slow

PROMPT = "The quick brown fox"
N = 12
K = 3
# a minimal Hugging Face chat template (the tiny tokenizer has none)
TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def frontends(e2e_servers, tmp_path_factory):
    from specbuild.frontend.run import FrontendOptions, start_frontend
    from specbuild.serve.tritonserver import free_port

    template = tmp_path_factory.mktemp("chat") / "template.jinja"
    template.write_text(TEMPLATE)
    dt = e2e_servers["draft_target"]
    metrics = f"http://{dt.options.host}:{dt.options.metrics_port}/metrics"
    started = {
        "plain": start_frontend(
            dt.grpc_url, FrontendOptions(port=free_port(), metrics_url=metrics), default_name="dt"
        ),
        "chat": start_frontend(
            e2e_servers["draft_target"].grpc_url,
            FrontendOptions(port=free_port(), chat_template=template),
            default_name="dt",
        ),
        "medusa": start_frontend(
            e2e_servers["medusa"].grpc_url, FrontendOptions(port=free_port()), default_name="medusa"
        ),
    }
    yield started
    for frontend in started.values():
        frontend.stop()


def client(frontend):
    import openai

    return openai.OpenAI(base_url=frontend.url, api_key="unused", max_retries=0, timeout=120)


def spec_of(response) -> dict | None:
    return (response.model_extra.get("metrics") or {}).get("speculative_decoding")


def test_models_and_completion_equal_the_greedy_baseline(frontends, greedy):
    text, tokens, prompt_ids = greedy(PROMPT, N)
    c = client(frontends["plain"])
    assert [m.id for m in c.models.list().data] == ["dt"]
    r = c.completions.create(
        model="dt", prompt=PROMPT, max_tokens=N, temperature=0, extra_body={"num_draft_tokens": K}
    )
    assert (
        r.choices[0].text == text and r.choices[0].finish_reason == "length" and r.object == "text_completion"
    )
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt_ids), N)
    spec = spec_of(r)  # vLLM's per-request spec-decode object, at the response's root
    assert spec["num_spec_tokens"] == K and len(spec["acceptance_histogram"]) == K + 1
    assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"] == len(spec["per_step_accepted"])
    assert sum(j * n for j, n in enumerate(spec["acceptance_histogram"])) == spec["num_accepted_draft_tokens"]
    assert spec["mean_acceptance_length"] == pytest.approx(
        1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"]
    )  # float64 ratio of small integers: default rel 1e-6
    with urllib.request.urlopen(frontends["plain"].url.removesuffix("/v1") + "/metrics", timeout=30) as page:
        metrics = page.read().decode()  # Triton's page at the frontend's address (AIPerf scrapes it)
    assert (
        'trtllm_spec_decode_num_draft_tokens_total{model="tensorrt_llm"}' in metrics
        and "nv_inference_count" in metrics
    )
    off = c.completions.create(
        model="dt", prompt=PROMPT, max_tokens=N, temperature=0, extra_body={"num_draft_tokens": 0}
    )
    assert off.choices[0].text == text and spec_of(off) is None  # the target alone drafted nothing


def test_streamed_completion_with_per_chunk_usage(frontends, greedy):
    text, _, prompt_ids = greedy(PROMPT, N)
    stream = client(frontends["plain"]).completions.create(
        model="dt",
        prompt=PROMPT,
        max_tokens=N,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={
            "num_draft_tokens": K,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    chunks = list(stream)  # the client stops at `data: [DONE]`
    content = [ch for ch in chunks if ch.choices]
    assert "".join(ch.choices[0].text for ch in content) == text
    assert content[-1].choices[0].finish_reason == "length"
    counts = [ch.usage.completion_tokens for ch in content]
    assert counts == sorted(counts) and counts[-1] == N and content[0].usage.prompt_tokens == len(prompt_ids)
    assert len(content) > 1 and counts[0] >= 1  # one chunk per round (its accepted drafts + one)
    final = chunks[-1]
    assert final.choices == [] and final.usage.completion_tokens == N
    assert spec_of(final)["num_spec_steps"] > 0


def test_raw_sse_ends_with_done(frontends):
    body = json.dumps({"model": "dt", "prompt": PROMPT, "max_tokens": 4, "temperature": 0, "stream": True})
    request = urllib.request.Request(
        frontends["plain"].url + "/completions",
        data=body.encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.read().decode().splitlines() if line]
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)


def test_chat_needs_a_template_and_works_with_one(frontends, greedy):
    import openai

    messages = [{"role": "user", "content": "hello"}]
    with pytest.raises(openai.BadRequestError) as err:
        client(frontends["plain"]).chat.completions.create(model="dt", messages=messages, max_tokens=4)
    assert (
        err.value.body["code"] == "chat_template_missing" and "--chat-template" in err.value.body["message"]
    )
    c = client(frontends["chat"])
    r = c.chat.completions.create(model="dt", messages=messages, max_tokens=N, temperature=0)
    expected = greedy("user: hello\nassistant:", N)[0]
    assert r.choices[0].message.content == expected and r.choices[0].message.role == "assistant"
    stream = c.chat.completions.create(
        model="dt", messages=messages, max_completion_tokens=N, temperature=0, stream=True
    )
    parts = list(stream)
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == expected


def test_stop_strings_end_the_text_before_them(frontends, greedy):
    text = greedy(PROMPT, N)[0]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    if not stop.strip():
        pytest.skip("the greedy text has no usable stop string here")
    c = client(frontends["plain"])
    r = c.completions.create(model="dt", prompt=PROMPT, max_tokens=N, temperature=0, stop=[stop])
    assert r.choices[0].text == text[: text.index(stop)] and r.choices[0].finish_reason == "stop"
    s = c.completions.create(model="dt", prompt=PROMPT, max_tokens=N, temperature=0, stop=stop, stream=True)
    assert "".join(ch.choices[0].text for ch in s if ch.choices) == text[: text.index(stop)]


def test_unsupported_parameters_are_refused_clearly(frontends):
    import openai

    c = client(frontends["plain"])
    cases = [
        ({"logprobs": 2}, "logprobs"),
        ({"n": 2}, "n"),
        ({"presence_penalty": 0.5}, "presence_penalty"),
        ({"extra_body": {"guided_json": {}}}, "guided_json"),
        ({"temperature": -1}, "temperature"),
    ]
    for kwargs, param in cases:
        with pytest.raises(openai.BadRequestError) as err:
            c.completions.create(model="dt", prompt=PROMPT, max_tokens=4, **kwargs)
        assert err.value.body["param"] == param and err.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="nope", prompt=PROMPT, max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="tokens"):  # the engines' length limit, from the BLS
        c.completions.create(model="dt", prompt=PROMPT, max_tokens=100_000)


def test_medusa_reports_its_own_steps_and_refuses_num_draft_tokens(frontends, greedy):
    import openai

    c = client(frontends["medusa"])
    r = c.completions.create(model="medusa", prompt=PROMPT, max_tokens=N, temperature=0)
    assert r.choices[0].text == greedy(PROMPT, N)[0]
    spec = spec_of(r)
    assert spec["num_spec_tokens"] is None and spec["num_spec_steps"] > 0
    with pytest.raises(openai.BadRequestError) as err:
        c.completions.create(model="medusa", prompt=PROMPT, max_tokens=4, extra_body={"num_draft_tokens": 2})
    assert err.value.body["param"] == "num_draft_tokens"


def test_the_llmapi_interface_behind_the_same_api(e2e_llmapi, greedy):
    """An LLM-API repository (Triton's LLM-API `tensorrt_llm` model): the frontend detects the interface,
    counts the prompt with the repository's tokenizer (the model returns no count), turns the cumulative
    text_output into deltas, and reports the engine's rounds (K = speculative_config.max_draft_len)."""
    import openai

    from specbuild.client.remote import generate_remote
    from specbuild.core.sampling_params import SamplingParams
    from specbuild.frontend.run import FrontendOptions, start_frontend
    from specbuild.serve.tritonserver import free_port

    _, repo, server = e2e_llmapi
    frontend = start_frontend(
        server.grpc_url, FrontendOptions(port=free_port(), repo=repo), default_name="llm"
    )
    try:
        c = client(frontend)
        text, ids, prompt_ids = greedy(PROMPT, N)
        r = c.completions.create(model="llm", prompt=PROMPT, max_tokens=N, temperature=0)
        assert r.choices[0].text == text and r.choices[0].finish_reason == "length"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(prompt_ids), N)
        spec = spec_of(r)
        direct = generate_remote(server.grpc_url, PROMPT, SamplingParams(max_tokens=N), stream=True)
        assert spec["num_spec_tokens"] == 4 and len(spec["acceptance_histogram"]) == 5  # the repository's K
        assert (spec["num_draft_tokens"], spec["num_accepted_draft_tokens"]) == (
            direct.stats.drafted,
            direct.stats.accepted,
        )
        assert spec["per_step_drafted"] == direct.stats.drafted_per_step
        assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"] == len(spec["per_step_accepted"])
        stream = c.completions.create(
            model="llm",
            prompt=PROMPT,
            max_tokens=N,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        )
        chunks = list(stream)
        content = [ch for ch in chunks if ch.choices]
        assert content[0].usage.prompt_tokens == len(prompt_ids) and content[-1].usage.completion_tokens == N
        assert len(content) > 1  # one chunk per engine round
        assert chunks[-1].choices == [] and spec_of(chunks[-1]) == spec  # greedy: the same rounds
        with pytest.raises(openai.BadRequestError) as err:  # K is the repository's, not a request option
            c.completions.create(model="llm", prompt=PROMPT, max_tokens=4, extra_body={"num_draft_tokens": 2})
        assert err.value.body["param"] == "num_draft_tokens" and "LLM-API" in err.value.body["message"]
    finally:
        frontend.stop()
