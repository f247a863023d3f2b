"""The reference engine's n-gram speculation is lossless: greedy output == the target alone for every K,
batched and not; at temperature > 0 the output follows the target's distribution (chi-square).

The tiny random target rarely repeats itself, so the public pool is what makes drafts accepted here:
a request seen before left its continuation in the pool (upstream's pool is shared by all requests).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specbuild.core.methods import Method  # noqa: E402
from specbuild.core.sampling_params import SamplingParams  # noqa: E402

PROMPTS = [[5, 17, 99, 3, 44, 12], [7, 7, 8], [200, 31, 64, 90, 11, 2, 150, 42, 77, 19]]
MAX_TOKENS = 20

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.numeric]


@pytest.fixture(scope="module")
def target(tiny_target_model):
    return tiny_target_model


@pytest.fixture(scope="module")
def baseline(target):
    from specbuild.engines.reference.engine import ReferenceEngine

    engine = ReferenceEngine(target)
    return [
        engine.generate(p, SamplingParams(max_tokens=MAX_TOKENS), speculative=False).token_ids
        for p in PROMPTS
    ]


def ngram_engine(target, **options):
    from specbuild.engines.reference.engine import ReferenceEngine

    return ReferenceEngine(target, method=Method.NGRAM, method_options=options or None)


@pytest.mark.parametrize("k", range(1, 9))
def test_greedy_equals_target_for_every_k(target, baseline, k):
    engine = ngram_engine(target)
    params = SamplingParams(max_tokens=MAX_TOKENS)
    for repeat in range(2):  # the second time, the public pool holds the first run's continuation
        accepted = 0
        for prompt, want in zip(PROMPTS, baseline, strict=True):
            result = engine.generate(prompt, params, num_draft_tokens=k)
            assert result.token_ids == want and result.speculative
            s = result.stats
            assert s.draft_passes == 0 and s.drafted == sum(s.drafted_per_position)
            assert s.target_passes == len(want) - s.accepted  # each pass: its accepted drafts + one token
            accepted += s.accepted
        if repeat:
            assert accepted >= len(PROMPTS) * (MAX_TOKENS - 1) * k // (k + 1) - len(PROMPTS) * k


@pytest.mark.parametrize("k", [1, 4, 8])
def test_batched_greedy_equals_target_and_streams_in_order(target, baseline, k):
    engine = ngram_engine(target, max_matching_ngram_size=3)
    engine.generate_batch(
        PROMPTS, SamplingParams(max_tokens=MAX_TOKENS), num_draft_tokens=k
    )  # seeds the pool
    streamed: dict[int, list[int]] = {}
    results = engine.generate_batch(
        PROMPTS,
        SamplingParams(max_tokens=MAX_TOKENS),
        num_draft_tokens=k,
        on_tokens=lambda i, toks: streamed.setdefault(i, []).extend(toks),
    )
    assert [r.token_ids for r in results] == baseline
    assert [streamed[i] for i in range(len(PROMPTS))] == baseline
    assert all(r.stats.accepted > 0 and r.stats.draft_passes == 0 for r in results)


def test_no_match_is_a_plain_decode_step_and_private_pools_forget(target, baseline):
    engine = ngram_engine(target, is_public_pool=False)
    for _ in range(2):  # a private pool is gone with its request: the repeat finds nothing either
        r = engine.generate(PROMPTS[1], SamplingParams(max_tokens=MAX_TOKENS), num_draft_tokens=4)
        assert r.token_ids == baseline[1] and r.stats.drafted == 0 and r.stats.target_passes == MAX_TOKENS


def test_stop_tokens_and_max_tokens_cut_accepted_drafts(target, baseline):
    engine = ngram_engine(target)
    want = baseline[0]
    engine.generate(PROMPTS[0], SamplingParams(max_tokens=MAX_TOKENS), num_draft_tokens=4)
    stop = want[6]
    r = engine.generate(
        PROMPTS[0], SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=(stop,)), num_draft_tokens=4
    )
    assert r.token_ids == want[: want.index(stop) + 1] and r.finish_reason == "stop"
    r = engine.generate(PROMPTS[0], SamplingParams(max_tokens=3), num_draft_tokens=8)
    assert r.token_ids == want[:3] and r.finish_reason == "length"


def test_batched_sampling_equals_unbatched_with_the_same_seeds(target):
    engine = ngram_engine(target, is_public_pool=False)  # private pools: both runs draft the same
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.7, seed=s) for s in (1, 2, 3)]
    prompts = [p + p for p in PROMPTS]  # repeated text: the prompt itself has patterns
    batched = engine.generate_batch(prompts, params, num_draft_tokens=3)
    alone = [engine.generate(p, q, num_draft_tokens=3) for p, q in zip(prompts, params, strict=True)]
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]


# ---- lossless at T > 0 -------------------------------------------------------------------------

TEMPERATURE = 0.5  # the tiny target's first token then has p ~ 0.44: drafts are accepted and rejected
TRIALS = 2000


def _chi2_pvalue(counts: list[float], probs: list[float]) -> float:
    c, p = torch.tensor(counts, dtype=torch.float64), torch.tensor(probs, dtype=torch.float64)
    expected = p * c.sum()
    stat = ((c - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((len(counts) - 1) / 2.0), stat / 2.0))


def _first_two_tokens(engine, prompt, trials, offset=0):
    counts: dict[tuple[int, int], int] = {}
    accepted = 0
    for seed in range(trials):
        params = SamplingParams(max_tokens=3, temperature=TEMPERATURE, seed=seed + offset)
        r = engine.generate(prompt, params, num_draft_tokens=2)
        key = tuple(r.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        accepted += r.stats.accepted
    return counts, accepted


def _exact_joint(target, prompt):
    """P(t1, t2) = p(t1 | prompt) p(t2 | prompt, t1) from the target's own logits at TEMPERATURE."""
    from specbuild.core.sampling_params import SamplingParams as P
    from specbuild.engines.reference.cached_decode import CachedSequence
    from specbuild.engines.reference.sampling import probs_from_logits

    params = P(max_tokens=1, temperature=TEMPERATURE)

    def dist(ids):
        return probs_from_logits(target.logits(CachedSequence(target).feed(ids, 1)), params)[0]  # [V]

    first = dist(prompt)
    joint = {}
    for t1 in first.topk(12).indices.tolist():
        second = dist(prompt + [t1])
        for t2 in second.topk(12).indices.tolist():
            joint[(t1, t2)] = float(first[t1] * second[t2])
    return joint


def _binned(counts, joint, trials):
    """Categories expected >= 5 times, the rest (and everything outside `joint`) pooled as one."""
    keys = [k for k, p in joint.items() if p * trials >= 5]
    got = [counts.get(k, 0) for k in keys]
    probs = [joint[k] for k in keys]
    return got + [trials - sum(got)], probs + [1.0 - sum(probs)]


def test_sampled_output_follows_the_target(target):
    prompt = PROMPTS[0]
    engine = ngram_engine(target)
    engine.generate(
        prompt, SamplingParams(max_tokens=MAX_TOKENS), num_draft_tokens=4
    )  # greedy text in the pool
    counts, accepted = _first_two_tokens(engine, prompt, TRIALS)
    assert 0.2 * TRIALS < accepted < 1.2 * TRIALS  # drafts were both accepted and rejected, often
    observed, probs = _binned(counts, _exact_joint(target, prompt), TRIALS)
    assert _chi2_pvalue(observed, probs) > 1e-3  # seeded: a false alarm would be 1 in 1000

    # The same test catches an engine that keeps its drafts without checking them.
    import specbuild.engines.reference.cached_decode as cached_decode

    real = cached_decode.accept_draft
    cached_decode.accept_draft = (
        lambda drafts, probs_, target_probs, gen=None: (  # noqa: ARG005
            len(drafts),
            real([], None, target_probs[len(drafts) :], gen)[1],
        )
    )
    try:
        bad, _ = _first_two_tokens(engine, prompt, 300, offset=TRIALS)
    finally:
        cached_decode.accept_draft = real
    observed, probs = _binned(bad, _exact_joint(target, prompt), 300)
    assert _chi2_pvalue(observed, probs) < 1e-6
