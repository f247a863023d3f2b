"""EAGLE-3's rounds rebuilt from a stream of Triton's LLM-API model: the first response is the context
phase's token (no drafts), every later one a round of a chain of min(K, tokens left - 1) drafts whose
accepted ones come back with the target's token; the final response carries only the totals. Medusa's
tree keeps the old rule (drafts per step from the total when it divides evenly)."""

from __future__ import annotations

from specbuild.client.remote import LLMAPI_INTERFACE, RepoInfo, request_steps
from specbuild.client.request import Chunk
from specbuild.core.methods import Method


def _stream(sizes: list[int], accepted: int, drafted: int) -> list[Chunk]:
    chunks = [Chunk(token_ids=list(range(n)), final=False) for n in sizes]
    totals = {"total_accepted_draft_tokens": float(accepted), "total_draft_tokens": float(drafted)}
    return [*chunks, Chunk(final=True, perf=totals)]


def test_eagle3_rounds_follow_the_responses_sizes():
    # K = 3, max_tokens 12: context 1 token; rounds of 4 (3 accepted), 2 (1), 4 (3), then 1 token left:
    # the last round drafts min(3, 12 - 11 - 1) = 0 (no step)
    chunks = _stream([1, 4, 2, 4, 1], accepted=7, drafted=9)
    steps = request_steps(chunks, self_speculating=True, context_first=True, k=3, max_tokens=12)
    assert steps == [(3, 3), (1, 3), (3, 3)]
    # totals that do not add up (a round cut by a stop word): not guessed
    cut = _stream([1, 4, 2, 4, 1], accepted=7, drafted=10)
    assert request_steps(cut, self_speculating=True, context_first=True, k=3, max_tokens=12) != steps


def test_only_a_chain_after_the_context_gets_k():
    def info(method: Method, k: int) -> RepoInfo:
        return RepoInfo(interface=LLMAPI_INTERFACE, method=method, num_draft_tokens=k)

    assert info(Method.EAGLE3, 3).chain_after_context and info(Method.EAGLE3, 3).rounds_k == 3
    assert info(Method.DRAFT_TARGET, 4).rounds_k == 4 and not info(Method.DRAFT_TARGET, 4).chain_after_context
    assert info(Method.MEDUSA, 4).rounds_k is None  # a tree: drafts per step vary
    assert info(Method.NGRAM, 4).rounds_k is None  # 0..K per round
