"""The generated repositories' Python models, served in-process by a fake Python backend (fake_triton):
preprocessing/postprocessing, the BLS running the shared speculative loop over the local tensorrt_llm
models, the local engine model's backend interface. Real serving: the client's tritonserver tests."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from fake_triton import FakeServer, collect, engine_request, stop_request, text_request
from repo_builds import cached_build

from specbuild.core.sampling_params import SamplingParams
from specbuild.model_repo.generate import generate_repo

pytestmark = (
    pytest.mark.numeric
)  # float results through CPU kernels: `make test-isa` runs them per kernel family

PROMPT = "def add(a, b):"
N = 8  # new tokens per request: enough for several speculative rounds, cheap on a loaded CPU


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_target, tiny_draft):
    root = tmp_path_factory.mktemp("served")
    same_draft = shutil.copytree(tiny_target, root / "same-draft")  # a draft identical to the target
    builds = {
        "dt": cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft),
        "same": cached_build(tmp_path_factory, "same", "draft_target", target=tiny_target, draft=same_draft),
        "medusa": cached_build(tmp_path_factory, "medusa", "medusa", target=tiny_target),
        "ngram": cached_build(tmp_path_factory, "ngram", "ngram", target=tiny_target),
    }
    import torch

    threads = torch.get_num_threads()  # the local engine model sets 1 thread per process; restore after
    servers = {n: FakeServer(generate_repo(b, root / n, backend="python")) for n, b in builds.items()}
    yield servers
    for server in servers.values():
        server.close()
    torch.set_num_threads(threads)


def greedy_baseline(server, n=N, speculative=False):
    ids = server.models["preprocessing"].tokenizer.encode(PROMPT)
    engine = server.models["tensorrt_llm"].engine
    return engine.generate(ids, SamplingParams(max_tokens=n), speculative=speculative).token_ids


def bls(server, **kw):
    return collect(server.infer("tensorrt_llm_bls", text_request(PROMPT, N, **kw)))


def test_bls_speculation_equals_plain_greedy(servers):
    s = servers["dt"]
    spec = bls(s, num_draft_tokens=3, return_perf_metrics=True)
    plain = bls(s, num_draft_tokens=0)
    ensemble = collect(s.infer("ensemble", text_request(PROMPT, N)))
    assert spec["tokens"] == plain["tokens"] == ensemble["tokens"] == greedy_baseline(s)
    assert spec["text"] == plain["text"] == ensemble["text"]
    perf = spec["perf"]
    assert (
        perf["total_draft_tokens"] > 0
        and 0 <= perf["total_accepted_draft_tokens"] <= perf["total_draft_tokens"]
    )
    assert perf["acceptance_rate"] == pytest.approx(
        perf["total_accepted_draft_tokens"] / perf["total_draft_tokens"]
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert perf["arrival_time_ns"] <= perf["first_token_time_ns"] <= perf["last_token_time_ns"]


def test_bls_uses_repository_default_num_draft_tokens(servers):
    s = servers["dt"]
    s.calls.clear()
    bls(s)  # no num_draft_tokens: the repository's default (the target's max_draft_len, 4)
    drafts = [inputs for model, inputs in s.calls if model == "tensorrt_llm_draft"]
    assert drafts and int(drafts[0]["request_output_len"].reshape(-1)[0]) == 4


def test_identical_draft_is_always_accepted(servers):
    out = bls(servers["same"], num_draft_tokens=3, return_perf_metrics=True)
    assert out["tokens"] == greedy_baseline(servers["same"])
    assert out["perf"]["acceptance_rate"] == 1.0
    assert out["perf"]["total_accepted_draft_tokens"] == out["perf"]["total_draft_tokens"] > 0


def test_bls_streams_accepted_tokens_per_round(servers):
    s = servers["same"]
    whole = bls(s, num_draft_tokens=3)
    stream = bls(s, num_draft_tokens=3, stream=True)
    assert stream["responses"] > 2 and whole["responses"] == 1
    assert stream["tokens"] == whole["tokens"] and stream["text"] == whole["text"]


def test_bls_sends_draft_logits_and_min_tokens(servers):
    s = servers["dt"]
    s.calls.clear()
    out = bls(s, num_draft_tokens=3, use_draft_logits=True)
    assert out["tokens"] == greedy_baseline(s)  # lossless: greedy output unchanged
    drafts = [inputs for model, inputs in s.calls if model == "tensorrt_llm_draft"]
    targets = [inputs for model, inputs in s.calls if model == "tensorrt_llm" and "draft_input_ids" in inputs]
    assert drafts and targets
    for d in drafts:
        assert (
            d["return_generation_logits"].all() and d["min_tokens"].item() == d["request_output_len"].item()
        )
    vocab = s.models["tensorrt_llm"].engine.target.cfg.vocab_size
    for t in targets:
        k = t["draft_input_ids"].shape[1]
        assert t["draft_logits"].shape == (1, k, vocab) and t["draft_logits"].dtype == np.float32
        assert t["request_output_len"].item() == k + 1


def test_bls_seeded_sampling_is_reproducible_with_fresh_seed_per_call(servers):
    s = servers["dt"]
    kw = dict(num_draft_tokens=3, temperature=0.9, top_p=1.0, seed=7)
    s.calls.clear()
    first = bls(s, **kw)
    seeds = [
        int(inputs["seed"].item())
        for model, inputs in s.calls
        if model.startswith("tensorrt_llm") and "seed" in inputs
    ]
    assert len(seeds) == len(set(seeds)) > 2  # a fixed seed per call would replay the same draws each round
    assert bls(s, **kw)["tokens"] == first["tokens"]


def test_medusa_streams_through_the_ensemble(servers):
    s = servers["medusa"]
    expected = greedy_baseline(s, speculative=True)
    assert expected == greedy_baseline(s)  # Medusa at T=0 is lossless
    stream = collect(s.infer("ensemble", text_request(PROMPT, N, stream=True, return_perf_metrics=True)))
    whole = collect(s.infer("ensemble", text_request(PROMPT, N)))
    assert stream["tokens"] == whole["tokens"] == expected and stream["text"] == whole["text"]
    assert stream["responses"] > 1 and stream["perf"]["total_draft_tokens"] > 0
    via_bls = bls(s, stream=True)  # BLS without a draft model: the Medusa engine alone, streamed
    assert via_bls["tokens"] == expected and via_bls["responses"] > 1


@pytest.mark.parametrize("stream", [False, True])
def test_ngram_bls_drafts_from_its_pool_and_verifies_with_draft_input_ids_only(servers, stream):
    s = servers["ngram"]
    assert "tensorrt_llm_draft" not in s.models  # no draft model in an n-gram repository
    want = greedy_baseline(s)
    runs = []
    for k in (1, 4):
        for _ in range(2):  # the second time, the public pool holds the first run's continuation
            s.calls.clear()
            out = bls(s, num_draft_tokens=k, stream=stream, return_perf_metrics=True)
            assert out["tokens"] == want
            engine_calls = [inputs for model, inputs in s.calls if model == "tensorrt_llm"]
            called = {model for model, _ in s.calls}
            assert called <= {"tensorrt_llm_bls", "preprocessing", "postprocessing", "tensorrt_llm"}
            for inputs in engine_calls:
                assert "draft_logits" not in inputs  # token equality: n-gram drafts have no distribution
                drafts = inputs.get("draft_input_ids")
                k_sent = 0 if drafts is None else drafts.shape[1]
                assert 0 <= k_sent <= k and inputs["request_output_len"].item() == k_sent + 1
            runs.append(out["perf"])
    assert all(p["total_accepted_draft_tokens"] <= p["total_draft_tokens"] for p in runs)
    assert runs[1]["total_accepted_draft_tokens"] > 0 and runs[3]["total_accepted_draft_tokens"] > 0
    assert runs[3]["acceptance_rate"] == pytest.approx(
        runs[3]["total_accepted_draft_tokens"] / runs[3]["total_draft_tokens"]
    )  # float32 output of a ratio of small ints: approx's rel 1e-6 is above float32's 6e-8


def test_ngram_bls_pool_is_shared_by_instances_of_one_server(servers):
    """Two instances (two BLS processes in Triton) of the model share the server's public pool."""
    s = servers["ngram"]
    first = s.models["tensorrt_llm_bls"]
    factory = first.drafter_factory
    assert factory.config.is_public_pool and factory.config.max_matching_ngram_size == 3  # the spec's
    assert type(factory.public).__name__ == "SharedPatternStore"
    again = type(first)()
    again.initialize(s.init_args("tensorrt_llm_bls"))
    assert again.drafter_factory.public.path == factory.public.path


def outputs(response):
    assert not response.has_error(), response.error().message()
    return {t.name(): t.as_numpy() for t in response.output_tensors}


def test_local_engine_model_verifies_external_drafts_with_prefix_reuse(servers):
    s = servers["dt"]
    ids = s.models["preprocessing"].tokenizer.encode(PROMPT)
    greedy = greedy_baseline(s, n=6)
    engine = s.models["tensorrt_llm"].engine
    reused = engine.prefix_cache.reused_tokens
    perf = {"return_perf_metrics": np.array([[True]])}
    (r,) = s.infer(
        "tensorrt_llm", engine_request(ids, 4, draft_input_ids=np.array([greedy[:3]], dtype=np.int32), **perf)
    )
    out = outputs(r)
    assert out["output_ids"].shape == (1, 1, 4) and out["output_ids"].reshape(-1).tolist() == greedy[:4]
    assert out["acceptance_rate"].item() == 1.0 and out["total_draft_tokens"].item() == 3
    wrong = [greedy[3], (greedy[4] + 1) % 300]  # first draft right, second wrong
    (r,) = s.infer(
        "tensorrt_llm",
        engine_request(ids + greedy[:3], 3, draft_input_ids=np.array([wrong], dtype=np.int32), **perf),
    )
    out = outputs(r)
    assert out["output_ids"].reshape(-1).tolist() == greedy[3:5]  # one accepted + the target's own token
    assert out["total_accepted_draft_tokens"].item() == 1
    assert engine.prefix_cache.reused_tokens - reused >= len(ids)  # the second call reused the prompt's KV


def test_local_engine_model_rejects_streaming_when_not_decoupled(servers):
    s = servers["dt"]
    (r,) = s.infer("tensorrt_llm", engine_request([1, 2, 3], 2, streaming=np.array([[True]])))
    assert r.has_error() and "decoupled" in r.error().message()


def test_trtllm_019_names_serve(tiny_target, tiny_draft, tmp_path_factory, servers):
    build = cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft)
    old = FakeServer(
        generate_repo(
            build, tmp_path_factory.mktemp("old") / "repo", backend="python", trtllm_version="0.19.0"
        )
    )
    old.calls.clear()
    inputs = text_request(PROMPT, N, num_draft_tokens=2)
    inputs["random_seed"] = np.array([[3]], dtype=np.uint64)
    out = collect(old.infer("tensorrt_llm_bls", inputs))
    assert out["tokens"] == greedy_baseline(servers["dt"])
    drafts = [i for m, i in old.calls if m == "tensorrt_llm_draft"]
    assert all("min_length" in d and "min_tokens" not in d and "random_seed" in d for d in drafts)


def test_draft_logits_make_an_identical_draft_lossless_at_temperature(servers):
    """T > 0: with draft logits (rejection sampling) an identical draft's tokens are accepted (draft_probs ==
    target_probs); with token equality they are accepted only when two independent samples agree."""
    s = servers["same"]
    kw = dict(num_draft_tokens=3, temperature=1.0, top_p=1.0, seed=11, return_perf_metrics=True)
    with_logits = bls(s, use_draft_logits=True, **kw)["perf"]
    without = bls(s, use_draft_logits=False, **kw)["perf"]
    assert with_logits["total_draft_tokens"] > 0 and without["total_draft_tokens"] > 0
    assert with_logits["acceptance_rate"] >= 0.9, with_logits
    assert without["acceptance_rate"] < with_logits["acceptance_rate"]


def test_preprocessing_word_lists_and_single_token_stop_words(servers):
    s = servers["dt"]
    tok = s.models["preprocessing"].tokenizer
    greedy = greedy_baseline(s)
    stop = next(
        i for i in range(1, N) if tok.encode(tok.decode([greedy[i]]), add_special_tokens=False) == [greedy[i]]
    )
    word = tok.decode([greedy[stop]])
    (pre,) = s.infer(
        "preprocessing",
        {
            "QUERY": np.array([[PROMPT.encode()]], dtype=object),
            "REQUEST_OUTPUT_LEN": np.array([[N]], dtype=np.int32),
            "STOP_WORDS_DICT": np.array([[word.encode(), b"def add"]], dtype=object),
        },
    )
    words = outputs(pre)["STOP_WORDS_IDS"]  # [1, 2, n]: ids, then cumulative end offsets padded with -1
    two = tok.encode("def add", add_special_tokens=False)
    assert words.shape == (1, 2, 1 + len(two))
    assert words[0, 0].tolist() == [greedy[stop], *two] and words[0, 1].tolist() == [1, 1 + len(two)] + [
        -1
    ] * (len(two) - 1)
    inputs = text_request(PROMPT, N)
    inputs["stop_words"] = np.array([[word.encode()]], dtype=object)
    out = collect(s.infer("ensemble", inputs))
    assert out["tokens"] == greedy[: greedy.index(greedy[stop]) + 1]  # stops at (and keeps) the stop token


@pytest.mark.parametrize("name", ["dt", "medusa"])
def test_local_engine_model_serves_a_batch_of_requests(servers, name):
    """Requests Triton batches into one execute(): each gets its own answer (plain ones decode together)."""
    s = servers[name]
    tok = s.models["preprocessing"].tokenizer
    prompts = [tok.encode(PROMPT), tok.encode("import numpy as np")]
    engine = s.models["tensorrt_llm"].engine
    expected = [
        engine.generate(p, SamplingParams(max_tokens=N), speculative=False).token_ids for p in prompts
    ]
    streaming = np.array([[name == "medusa"]])  # the Medusa model is decoupled: stream it
    batch = [engine_request(p, N, streaming=streaming) for p in prompts]
    got = []
    for responses in s.infer_batch("tensorrt_llm", batch):
        got.append([t for r in responses for t in outputs(r)["output_ids"].reshape(-1).tolist()])
    assert got == expected


@pytest.mark.parametrize("stream", [False, True])
def test_multi_token_stop_word_ends_the_request(servers, stream):
    s = servers["medusa"]  # decoupled: both unary and streamed requests
    tok = s.models["preprocessing"].tokenizer
    greedy = greedy_baseline(s)
    i = next(
        i
        for i in range(1, N - 1)
        if tok.encode(tok.decode(greedy[i : i + 2]), add_special_tokens=False) == greedy[i : i + 2]
    )
    seq = greedy[i : i + 2]
    first_end = next(e for e in range(2, N + 1) if greedy[e - 2 : e] == seq)
    inputs = text_request(PROMPT, N, stream=stream)
    inputs["stop_words"] = np.array([[tok.decode(seq).encode()]], dtype=object)
    out = collect(s.infer("ensemble", inputs))
    assert out["tokens"] == greedy[:first_end]


@pytest.mark.parametrize("length", [1, 2])
@pytest.mark.parametrize("stream", [False, True])
def test_bls_speculation_stops_at_stop_words(servers, length, stream):
    s = servers["same"]  # every draft accepted: a stop word usually lands inside a multi-token round
    tok = s.models["preprocessing"].tokenizer
    greedy = greedy_baseline(s)
    i = next(
        i
        for i in range(2, N - length)
        if tok.encode(tok.decode(greedy[i : i + length]), add_special_tokens=False) == greedy[i : i + length]
    )
    seq = greedy[i : i + length]
    first_end = next(e for e in range(length, N + 1) if greedy[e - length : e] == seq)
    inputs = text_request(PROMPT, N, num_draft_tokens=3, stream=stream, return_perf_metrics=True)
    inputs["stop_words"] = np.array([[tok.decode(seq).encode()]], dtype=object)
    out = collect(s.infer("tensorrt_llm_bls", inputs))
    assert out["tokens"] == greedy[:first_end]
    assert out["perf"]["total_draft_tokens"] > 0 and out["perf"]["total_accepted_draft_tokens"] > 0


def _cancel_after_first_data(request):
    """Triton's cancellation arrives once the first data response went out."""
    send = request.sender.send

    def sending(response=None, flags=0):
        send(response, flags)
        if response is not None and not flags:
            request.cancelled.set()

    request.sender.send = sending


def test_a_cancelled_stream_stops_and_writes_nothing_more(servers):
    """Decoupled engine model: after the cancel no data response, a flags-only final response, fewer
    tokens."""
    from fake_triton import Request

    s = servers["medusa"]
    ids = s.models["preprocessing"].tokenizer.encode(PROMPT)
    request = Request(
        engine_request(ids, 100, streaming=np.array([[True]]), end_id=np.array([[-1]], dtype=np.int32)),
        request_id="c1",
    )
    _cancel_after_first_data(request)
    s.infer_batch("tensorrt_llm", [], requests=[request])
    sent = request.sender.responses
    assert [flags for _, flags in sent] == [0, 1] and sent[-1][
        0
    ] is None  # one chunk, then the final flag alone


def test_a_cancelled_unary_request_gets_a_cancelled_error(servers):
    from fake_triton import Request

    s = servers["dt"]
    request = Request(engine_request([5, 6, 7], 50, end_id=np.array([[-1]], dtype=np.int32)))
    request.cancelled.set()
    (responses,) = s.infer_batch("tensorrt_llm", [], requests=[request])
    assert responses[0].has_error() and "cancelled" in responses[0].error().message()
    assert responses[0].error().code() == 1  # TritonError.CANCELLED: no outputs written


def test_a_stop_request_ends_the_running_request_with_its_id(servers):
    """The decoupled engine runs requests on a worker thread, so a stop arrives while it generates."""
    import threading

    from fake_triton import Request

    s = servers["medusa"]
    ids = s.models["preprocessing"].tokenizer.encode(PROMPT)
    running = Request(
        engine_request(ids, 100, streaming=np.array([[True]]), end_id=np.array([[-1]], dtype=np.int32)),
        request_id="r9",
    )
    first = threading.Event()
    send = running.sender.send
    running.sender.send = lambda response=None, flags=0: (send(response, flags), first.set())
    model = s.models["tensorrt_llm"]
    assert model.execute([running]) is None
    assert first.wait(60)
    stop = stop_request("r9")
    assert model.execute([stop]) is None
    assert stop.sender.done.wait(10) and running.sender.done.wait(60)
    ((answer, flags),) = stop.sender.responses
    assert flags == 1 and not answer.has_error() and answer.output_tensors == []
    chunks = [r for r, f in running.sender.responses if r is not None]
    tokens = sum(int(outputs(r)["sequence_length"].reshape(-1)[0]) for r in chunks)
    assert 0 < tokens < 100 and running.sender.responses[-1][1] == 1


def test_a_cancelled_bls_request_stops_between_rounds(servers):
    from fake_triton import Request

    s = servers["dt"]
    request = Request(text_request(PROMPT, 60, num_draft_tokens=3, stream=True, end_id=-1))
    _cancel_after_first_data(request)
    before = sum(1 for m, _ in s.calls if m == "tensorrt_llm")
    s.infer_batch("tensorrt_llm_bls", [], requests=[request])
    sent = request.sender.responses
    assert [flags for _, flags in sent] == [0, 1] and sent[-1][0] is None
    assert (
        sum(1 for m, _ in s.calls if m == "tensorrt_llm") - before == 1
    )  # no target call after the round that streamed


def test_the_backend_default_puts_the_prompt_in_unstreamed_answers(servers):
    s = servers["dt"]
    tok = s.models["preprocessing"].tokenizer
    ids = tok.encode(PROMPT)
    greedy = greedy_baseline(s)
    for model, extra in (("ensemble", {}), ("tensorrt_llm_bls", {"num_draft_tokens": 3})):
        out = collect(
            s.infer(
                model,
                text_request(
                    PROMPT,
                    N,
                    exclude_input_in_output=None,
                    return_num_input_tokens=True,
                    return_num_output_tokens=True,
                    **extra,
                ),
            )
        )
        assert out["tokens"] == ids + greedy and out["text"] == tok.decode(
            ids + greedy, skip_special_tokens=True
        ), model
    (r,) = s.infer(
        "tensorrt_llm",
        engine_request(
            ids,
            N,
            exclude_input_in_output=None,
            end_id=np.array([[1]], dtype=np.int32),
            return_num_input_tokens=np.array([[True]]),
            return_num_output_tokens=np.array([[True]]),
        ),
    )
    out = outputs(r)
    assert out["output_ids"].reshape(-1).tolist() == ids + greedy
    assert out["num_input_tokens"].item() == len(ids) and out["num_output_tokens"].item() == len(ids) + len(
        greedy
    )


def test_flat_text_output_and_the_bls_limits(servers):
    s = servers["dt"]
    (response,) = s.infer("tensorrt_llm_bls", text_request(PROMPT, N, num_draft_tokens=3))
    assert {t.name(): t.as_numpy() for t in response.output_tensors}["text_output"].shape == (1,)
    (response,) = s.infer("tensorrt_llm_bls", text_request("word " * 400, 4))
    assert response.has_error() and "exceeds maximum input length" in response.error().message()
    (response,) = s.infer("tensorrt_llm_bls", text_request(PROMPT, 200))
    assert response.has_error() and "exceeds the engine's sequence limit" in response.error().message()


def test_a_cancelled_row_of_a_medusa_batch_leaves_the_others_whole(servers):
    """Two streamed requests handed over together; one is cancelled: the other still gets all its tokens
    (a cancel used to end the whole sequential Medusa batch with an empty error)."""
    from fake_triton import Request

    s = servers["medusa"]
    tok = s.models["preprocessing"].tokenizer
    engine = s.models["tensorrt_llm"].engine
    prompts = [tok.encode(PROMPT), tok.encode("import numpy as np")]
    expected = engine.generate(prompts[1], SamplingParams(max_tokens=N), speculative=False).token_ids
    requests = [Request(engine_request(p, N, streaming=np.array([[True]]))) for p in prompts]
    _cancel_after_first_data(requests[0])
    results = s.infer_batch("tensorrt_llm", [], requests=requests)
    assert [f for _, f in requests[0].sender.responses] == [0, 1]
    assert [t for r in results[1] for t in outputs(r)["output_ids"].reshape(-1).tolist()] == expected


def test_a_finished_stream_iterator_is_dropped_later_on_the_models_thread(servers, monkeypatch):
    """tritonserver 2.51 destroys a decoupled BLS call's response iterator on the stub's utils thread,
    without the GIL, when the BLS let go of it first (tensorrt_llm_bls/model.py StreamParking): the BLS
    keeps each finished iterator and drops it itself, PARK_S later or at finalize."""
    import gc
    import weakref

    s = servers["medusa"]
    model = s.models["tensorrt_llm_bls"]
    pb_utils = type(model).execute.__globals__["pb_utils"]  # this server's fake backend module
    made: list = []

    class TrackedIterator:  # what exec(decoupled=True) returns, observable with a weak reference
        def __init__(self, responses):
            self._it = iter(responses)

        def __iter__(self):
            return self

        def __next__(self):
            return next(self._it)

    plain_exec = pb_utils.InferenceRequest.exec

    def exec_(self, decoupled=False):
        out = plain_exec(self, decoupled=decoupled)
        if decoupled:
            out = TrackedIterator(out)
            made.append(weakref.ref(out))
        return out

    monkeypatch.setattr(pb_utils.InferenceRequest, "exec", exec_)
    model.parking.release()  # earlier tests' streams
    now = [0.0]
    monkeypatch.setattr(model.parking, "clock", lambda: now[0])
    expected = greedy_baseline(s, speculative=True)
    assert bls(s, stream=True)["tokens"] == expected  # the Medusa engine streamed through the BLS
    assert len(made) == 1 and made[0]() is not None  # the request ended; its iterator is still held
    now[0] += model.parking.hold_s + 1
    assert bls(s, stream=True)["tokens"] == expected
    gc.collect()  # what other tests' frames may still hold in cycles: only the parking's hold counts
    assert made[0]() is None and made[1]() is not None  # the next stream dropped the old one, not its own
    model.parking.release()  # what finalize does
    gc.collect()
    assert made[1]() is None and len(model.parking) == 0


# Every perf output upstream's end_to_end_grpc_client.py reads, with `result.as_numpy(name)[0][0]`, from EVERY
# response when run with `--return-perf-metrics` (tensorrtllm_backend r25.05 c2e65b88,
# inflight_batcher_llm/client/end_to_end_grpc_client.py: a missing one is None[0] -> TypeError), with the
# type the C++ backend writes it in (model_instance_state.cc fillTritonResponse, processStats: int32 counts,
# int64 ns since the epoch, float32 rate; the same at r25.05 and at NVIDIA/TensorRT-LLM 0c8de69a).
UPSTREAM_PERF = {
    "kv_cache_alloc_new_blocks": np.int32,
    "kv_cache_reused_blocks": np.int32,
    "kv_cache_alloc_total_blocks": np.int32,
    "arrival_time_ns": np.int64,
    "first_scheduled_time_ns": np.int64,
    "first_token_time_ns": np.int64,
    "last_token_time_ns": np.int64,
    "acceptance_rate": np.float32,
    "total_accepted_draft_tokens": np.int32,
    "total_draft_tokens": np.int32,
}


# k 0: the streamed baseline; medusa: the BLS forwards each streamed response of tensorrt_llm (its tree)
@pytest.mark.parametrize(("name", "k"), [("dt", 3), ("ngram", 3), ("dt", 0), ("medusa", 3)])
def test_every_streamed_bls_response_carries_every_perf_output(servers, name, k):
    """The backend fills the perf outputs on every response it sends (fillTritonResponse runs for each),
    so each streamed BLS response carries all of them: the request's counters and times so far."""
    s = servers[name]
    responses = s.infer(
        "tensorrt_llm_bls", text_request(PROMPT, N, num_draft_tokens=k, stream=True, return_perf_metrics=True)
    )
    assert len(responses) > 2
    seen = []
    for r in responses:
        out = {t.name(): t.as_numpy() for t in r.output_tensors}
        for perf, dtype in UPSTREAM_PERF.items():
            assert perf in out, (perf, len(seen))
            assert out[perf].shape == (1, 1) and out[perf].dtype == dtype, (perf, out[perf].dtype)
        seen.append({perf: out[perf][0][0].item() for perf in UPSTREAM_PERF})
    for before, after in zip(seen, seen[1:], strict=False):  # running counters: they never go back
        assert before["total_draft_tokens"] <= after["total_draft_tokens"]
        assert before["total_accepted_draft_tokens"] <= after["total_accepted_draft_tokens"]
        assert before["first_token_time_ns"] == after["first_token_time_ns"] > 0
        assert before["last_token_time_ns"] <= after["last_token_time_ns"]
    final = seen[-1]
    assert seen[-2]["total_draft_tokens"] == final["total_draft_tokens"]  # the last round's are the totals
    if name != "ngram":  # (the n-gram pool drafts 0..k per round: maybe none for an unseen prompt)
        assert (final["total_draft_tokens"] > 0) == (k > 0)
    for row in seen:
        rate = (
            row["total_accepted_draft_tokens"] / row["total_draft_tokens"] if row["total_draft_tokens"] else 0
        )
        assert row["acceptance_rate"] == pytest.approx(rate)  # float32 of a ratio of small ints (rel 1e-6)
