"""The BLS's engine calls per round, counted through the fake Python backend (fake_triton): a K=0 round
of the load-aware schedule is ONE target call for up to plain_round_tokens tokens (not one call per
token; streamed, 1, g, g^2, ... tokens), and greedy output stays the target's."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from fake_triton import FakeServer, collect, text_request
from repo_builds import cached_build

from specbuild.core.perf.schedule import PLAIN_ROUND_GROWTH, PLAIN_ROUND_TOKENS
from specbuild.core.sampling_params import SamplingParams
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
    server = FakeServer(repo)
    yield server
    server.close()  # the BLS's in-flight counter file goes with it
    torch.set_num_threads(threads)


def _calls(server, model: str) -> int:
    return sum(1 for name, _ in server.calls if name == model)


@pytest.mark.parametrize(
    ("stream", "growth"), [(False, None), (True, None), (True, 2)]
)  # None: the repository's plain_round_growth
def test_a_k0_round_is_one_target_call_for_many_tokens(off_server, stream, growth, monkeypatch):
    s = off_server
    bls = s.models["tensorrt_llm_bls"]
    assert bls.plain_growth == PLAIN_ROUND_GROWTH  # the repository's parameter
    if growth is not None:
        monkeypatch.setattr(bls, "plain_growth", growth)
    before_target, before_draft = _calls(s, "tensorrt_llm"), _calls(s, "tensorrt_llm_draft")
    # num_draft_tokens left out: the schedule applies (K=0 here); stream=True is the streamed baseline path
    got = collect(
        s.infer("tensorrt_llm_bls", text_request(PROMPT, N, stream=stream, return_perf_metrics=True))
    )
    ids = s.models["preprocessing"].tokenizer.encode(PROMPT)
    want = s.models["tensorrt_llm"].engine.generate(ids, SamplingParams(max_tokens=N)).token_ids
    assert got["tokens"] == want
    assert _calls(s, "tensorrt_llm_draft") == before_draft  # no drafting at K=0
    # K=0 rounds ask for plain_round_tokens target tokens per call (before the fix: one call per token);
    # streamed, 1, g, g^2, ... of them: the first token after one target step (its TTFT), few calls in all
    if stream:
        sizes = _growing(N, PLAIN_ROUND_TOKENS, growth or PLAIN_ROUND_GROWTH)
        assert got["chunks"] == sizes
        assert sizes == ([1, 2, 4, 5] if growth == 2 else [1, 8, 3])  # N = 12; the default g is 8
        assert _calls(s, "tensorrt_llm") - before_target == len(sizes) < N
    else:
        assert _calls(s, "tensorrt_llm") - before_target == math.ceil(N / PLAIN_ROUND_TOKENS)
    assert got["perf"]["total_draft_tokens"] == 0


def _growing(n: int, limit: int, growth: int) -> list[int]:
    """Token counts of the K=0 rounds of a streamed request of n tokens: 1, g, g^2, ... up to limit."""
    sizes, size = [], 1
    while sum(sizes) < n:
        sizes.append(min(size, limit, n - sum(sizes)))
        size *= growth
    return sizes


# ---- batched verification in the local engine model ---------------------------------------------------

PROMPTS = ["def add(a, b):", "import numpy as np", "class Foo:"]


def _verify_request(ids, drafts, **extra):
    inputs = {
        "input_ids": np.array([ids], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[len(drafts) + 1]], dtype=np.int32),
        "exclude_input_in_output": np.array([[True]]),
        "draft_input_ids": np.array([drafts], dtype=np.int32),
        "return_perf_metrics": np.array([[True]]),
    }
    inputs.update({k: np.asarray(v) for k, v in extra.items()})
    return inputs


def _tokens(response):
    assert not response.has_error(), response.error().message()
    out = {t.name(): t.as_numpy() for t in response.output_tensors}
    return out["output_ids"].reshape(-1).tolist(), out


def _rounds(tokenizer, greedy):
    """Three rounds per prompt, each from the previous accepted prefix: right, half-right, wrong drafts."""
    rounds = []
    for p in PROMPTS:
        ids, g = tokenizer.encode(p), greedy[p]
        rounds.append(
            [
                (ids, g[:3]),  # all accepted
                (ids + g[:4], [g[4], (g[5] + 1) % 300]),  # first right, second wrong
                (ids + g[:6], [(g[6] + 7) % 300]),  # wrong at once
            ]
        )
    return rounds


def test_verification_requests_of_one_execute_share_one_target_pass(off_server, monkeypatch):
    """Verify calls that Triton's dynamic batcher hands over together run as ONE batched target pass, and
    every row gets exactly what it gets alone (tokens, acceptance, prefix reuse across rounds)."""
    s = off_server
    model = s.models["tensorrt_llm"]
    engine, tok = model.engine, s.models["preprocessing"].tokenizer
    greedy = {
        p: engine.generate(tok.encode(p), SamplingParams(max_tokens=8), speculative=False).token_ids
        for p in PROMPTS
    }
    rounds = _rounds(tok, greedy)
    alone = [
        [_tokens(s.infer("tensorrt_llm", _verify_request(ids, d))[0])[0] for ids, d in r] for r in rounds
    ]
    # what the one-by-one path gives is the target's greedy continuation (accepted drafts + its own token)
    assert alone[0][0] == greedy[PROMPTS[0]][:4]
    assert alone[0][1] == greedy[PROMPTS[0]][4:6] and alone[0][2] == [greedy[PROMPTS[0]][6]]

    engine.prefix_cache._entries.clear()  # start cold again: the batch must rebuild the prefixes itself
    passes = []
    forward = engine.target.forward
    monkeypatch.setattr(engine.target, "forward", lambda *a, **kw: passes.append(1) or forward(*a, **kw))
    together, reuse = [], []
    for step in range(3):
        before = len(passes)
        batch = [_verify_request(*r[step]) for r in rounds]
        got = [_tokens(rs[0]) for rs in s.infer_batch("tensorrt_llm", batch)]
        # one target pass per max_batch rows (the worker admits at most max_batch_size running requests,
        # as Triton's dynamic batcher hands over at most that many; one by one: three)
        assert len(passes) - before == -(-len(batch) // model.max_batch) < len(batch)
        together.append([t for t, _ in got])
        reuse.append([int(out["kv_cache_reused_blocks"].item()) for _, out in got])
        for (tokens, out), (_, drafts) in zip(got, [r[step] for r in rounds], strict=True):
            assert out["total_draft_tokens"].item() == len(drafts)
            assert out["total_accepted_draft_tokens"].item() == len(tokens) - 1
    assert [list(col) for col in zip(*together, strict=True)] == alone
    assert all(n >= 0 for row in reuse for n in row)


def test_batched_verify_equals_one_by_one_with_seeded_sampling_and_draft_logits(off_server):
    """T > 0 with draft logits (rejection sampling): the batched pass draws each row's random numbers as
    its own call would (seed + prefix length), so the accepted tokens are the same."""
    import torch

    s = off_server
    engine, tok = s.models["tensorrt_llm"].engine, s.models["preprocessing"].tokenizer
    vocab = engine.target.cfg.vocab_size
    g = torch.Generator().manual_seed(5)
    params = SamplingParams(max_tokens=4, temperature=0.9, top_p=0.95, seed=21)
    rows = [(tok.encode(p), [3, 17, 42]) for p in PROMPTS]
    logits = [torch.randn(3, vocab, generator=g) for _ in rows]
    alone = [
        engine.verify_external(ids, d, lg, params=params) for (ids, d), lg in zip(rows, logits, strict=True)
    ]
    engine.prefix_cache._entries.clear()
    together = engine.verify_external_batch(
        [ids for ids, _ in rows], [d for _, d in rows], logits, params=[params] * len(rows)
    )
    assert [t for t, _ in together] == alone


# ---- per-round IPC of the BLS -----------------------------------------------------------------------


def test_bls_rounds_ask_for_perf_outputs_once_and_for_cancellation_once_per_round(off_server):
    """Each output tensor and each is_cancelled() is an IPC round trip through the Python backend: only
    the first target call asks for the perf outputs, and a streamed round asks Triton about cancellation
    twice (before its first engine call, before its response), not before every call and hook."""
    from fake_triton import Request

    s = off_server
    start = len(s.calls)
    request = Request(text_request(PROMPT, N, num_draft_tokens=2, stream=True, return_perf_metrics=True))
    asks = []
    ask = request.sender.is_cancelled
    request.sender.is_cancelled = lambda: asks.append(1) or ask()
    (responses,) = s.infer_batch("tensorrt_llm_bls", [], requests=[request])
    got = collect(responses)
    ids = s.models["preprocessing"].tokenizer.encode(PROMPT)
    assert (
        got["tokens"] == s.models["tensorrt_llm"].engine.generate(ids, SamplingParams(max_tokens=N)).token_ids
    )
    target = [inputs for name, inputs in s.calls[start:] if name == "tensorrt_llm"]
    assert len(target) > 2 and got["perf"]["total_draft_tokens"] > 0
    assert "return_perf_metrics" in target[0] and not any("return_perf_metrics" in t for t in target[1:])
    assert "kv_cache_reused_blocks" in got["perf"]  # the request's perf outputs still carry the figures
    # rounds = target calls; + preprocessing's call, + the final response
    assert len(asks) <= 2 * len(target) + 2, (len(asks), len(target))


def test_bls_timers_account_for_every_engine_call_and_response(off_server, tmp_path):
    """SPECBUILD_BLS_TIMINGS: one row per request with its engine calls by model, its responses and its
    asks; what is left (the BLS's own code) is what bench-serve reports."""
    s = off_server
    bls = s.models["tensorrt_llm_bls"]
    start = len(s.calls)
    timing = sys.modules[type(bls).__module__].TimingObserver(str(tmp_path))  # what the env var installs
    saved, bls.observer = bls.observer, timing
    try:
        got = collect(s.infer("tensorrt_llm_bls", text_request(PROMPT, N, num_draft_tokens=2, stream=True)))
    finally:
        bls.observer = saved
    (path,) = tmp_path.glob("bls-*.jsonl")
    (row,) = [json.loads(line) for line in path.read_text().splitlines()]
    calls = {}
    for name, _ in s.calls[start:]:
        if name != "tensorrt_llm_bls":  # the request itself
            calls[name] = calls.get(name, 0) + 1
    assert row["calls"] == calls and set(row["exec_ns"]) == set(calls)
    assert row["sends"] == got["responses"] and row["asks"] >= 1
    assert row["handle_ns"] >= sum(row["exec_ns"].values()) + row["send_ns"] + row["ask_ns"]
