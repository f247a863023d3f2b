"""PrefixCache with several growing sequences that share a prefix (the BLS's per-token target calls of
concurrent requests with one system prompt): no sequence loses its KV to another, so every call after
a sequence's first recomputes only its last token, and the tokens are those of decoding alone.

Before the fix a new prompt sharing only the system prompt took over a running sequence's entry,
whose next call then took over another one's, and so on: each per-token call recomputed its whole
prefix (the c=4 collapse of the streamed baseline on the real model)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specbuild.core.sampling_params import SamplingParams  # noqa: E402

SYSTEM = [11, 23, 5, 87, 40, 9, 61, 14]  # the shared prefix (a chat system prompt)
USERS = [[101, 7, 33], [150, 2, 2, 19], [77, 31], [64, 90, 12, 8, 3]]
STEPS = 10

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.numeric]


@pytest.fixture(scope="module")
def model(tiny_target_model):
    return tiny_target_model


def _alone(model, prompt: list[int], n: int) -> list[int]:
    from specbuild.engines.reference.engine import ReferenceEngine

    return ReferenceEngine(model).generate(prompt, SamplingParams(max_tokens=n, end_id=-1)).token_ids


# the order the calls of one "round" reach the engine: single calls and batches, as Triton's dynamic
# batcher forms them (a new sequence joins in round 0 alone, the other three in one batch)
ROUNDS = [[[0], [1, 2, 3]], [[3], [0, 1], [2]], [[1, 2, 3, 0]], [[2], [1], [0], [3]]]


def test_interleaved_growing_sequences_keep_their_own_prefix(model):
    from specbuild.engines.reference.engine import ReferenceEngine

    engine = ReferenceEngine(model)
    cache = engine.prefix_cache
    params = SamplingParams(max_tokens=1, end_id=-1)
    seqs = [SYSTEM + u for u in USERS]
    for step in range(STEPS):
        for part in ROUNDS[step % len(ROUNDS)]:
            before = cache.reused_tokens
            if len(part) == 1:
                out = [engine.generate(seqs[part[0]], params, speculative=False)]
            else:
                out = engine.generate_batch([seqs[i] for i in part], params, speculative=False)
            reused = cache.reused_tokens - before
            if step == 0:  # first calls: at most the shared system prompt comes from the cache
                assert reused <= len(SYSTEM) * len(part)
            else:  # later calls recompute only their last token
                assert reused == sum(len(seqs[i]) - 1 for i in part), (step, part)
            for i, r in zip(part, out, strict=True):
                seqs[i] = seqs[i] + r.token_ids
    for user, seq in zip(USERS, seqs, strict=True):
        assert seq[len(SYSTEM + user) :] == _alone(model, SYSTEM + user, STEPS)


def test_a_new_prompt_copies_the_shared_prefix_and_leaves_the_running_sequence(model):
    from specbuild.engines.reference.engine import ReferenceEngine

    engine = ReferenceEngine(model)
    cache = engine.prefix_cache
    params = SamplingParams(max_tokens=1, end_id=-1)
    first = SYSTEM + USERS[0]
    engine.generate(first, params, speculative=False)  # entry: `first`
    copied = cache.copied_tokens
    engine.generate(SYSTEM + USERS[1], params, speculative=False)  # shares only SYSTEM
    assert cache.copied_tokens - copied == len(SYSTEM)  # the shared prefix came from the first's entry
    before = cache.reused_tokens
    engine.generate(first + [5], params, speculative=False)  # the first sequence's next call
    assert cache.reused_tokens - before == len(first)  # its entry is intact: only the new token is fed


def test_a_verify_round_after_a_rejected_draft_tail_reuses_its_own_entry(model):
    """The next BLS round's prefix matches its entry up to its last token (the entry's later tokens are
    the rejected drafts): it takes that entry over, with no copy."""
    from specbuild.engines.reference.engine import ReferenceEngine

    engine = ReferenceEngine(model)
    cache = engine.prefix_cache
    params = SamplingParams(max_tokens=8, end_id=-1)
    prefix = SYSTEM + USERS[3]
    greedy = _alone(model, prefix, 4)
    wrong = [(t + 1) % model.cfg.vocab_size for t in greedy[1:4]]
    got = engine.verify_external(prefix, [greedy[0], *wrong], params=params)
    assert got == greedy[:2]  # one accepted draft + the target's token
    copied, before = cache.copied_tokens, cache.reused_tokens
    nxt = prefix + got
    assert engine.verify_external(nxt, greedy[2:4], params=params) == greedy[2:4] + [
        _alone(model, prefix, 5)[4]
    ]
    assert cache.copied_tokens == copied and cache.reused_tokens - before == len(nxt) - 1
    assert len(cache._entries) == 1
