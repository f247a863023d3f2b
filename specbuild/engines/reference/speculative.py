"""The one draft/target speculative loop, over two small protocols.

Callers: the reference engine (in-process `ModelDrafter` / `ModelVerifier`, specbuild.engines.
reference.runners) and the Triton BLS (a Drafter that calls `tensorrt_llm_draft` and a Verifier that
calls `tensorrt_llm` with `draft_input_ids` / `draft_logits`). The boundary is deliberately
torch-light so the BLS can implement it with Triton tensors:

* token ids are plain `list[int]`;
* `draft_probs` is a float tensor [k, V] (torch) or None (token-equality verification);
* counters are plain ints (`forward_passes`), read by the loop before and after each call.

Each round: the drafter proposes k = min(num_draft_tokens, tokens still allowed - 1) tokens; the
verifier scores them in one target pass and returns the accepted drafts plus one token of its own
(`sampling.accept_draft`). The loop appends them, stops at the end id, a stop token or max_tokens
(never emits past max_tokens), and records SpecStats. Each call gets the whole sequence so far;
implementations keep their KV caches and roll them back to the longest prefix they share with it.

Stop tokens are included in the returned ids (like HF `generate`); `params.end_id` must already be
resolved by the caller (None: no end id).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from specbuild.generation import SpecStats
from specbuild.sampling_params import SamplingParams

OnTokens = Callable[[list[int]], None]


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens after `ids` (prompt + everything generated so far)."""

    forward_passes: int  # draft-model forward passes so far (the loop reports the difference)

    def propose(self, ids: list[int], k: int, params: SamplingParams) -> tuple[list[int], object | None]:
        """Return (k draft tokens, draft_probs [k, V] or None)."""
        ...


@runtime_checkable
class Verifier(Protocol):
    """Scores `draft_tokens` after `ids` in one target pass."""

    forward_passes: int  # target-model forward passes so far

    def verify(self, ids: list[int], draft_tokens: list[int], draft_probs: object | None, params: SamplingParams) -> list[int]:
        """Return the accepted drafts followed by one target token (1..k+1 tokens)."""
        ...


def stop_ids(params: SamplingParams) -> frozenset[int]:
    """Tokens that end a request: the end id and the extra stop tokens."""
    ids = set(params.stop_token_ids)
    if params.end_id is not None:
        ids.add(params.end_id)
    return frozenset(ids)


def emit(out: list[int], new: list[int], params: SamplingParams, stops: frozenset[int]) -> tuple[list[int], bool]:
    """Append `new` to `out` up to max_tokens and the first stop token; return (appended, finished)."""
    taken: list[int] = []
    for tok in new:
        if len(out) >= params.max_tokens:
            break
        out.append(tok)
        taken.append(tok)
        if tok in stops:
            return taken, True
    return taken, len(out) >= params.max_tokens


def speculative_generate(
    drafter: Drafter,
    verifier: Verifier,
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    num_draft_tokens: int,
    on_tokens: OnTokens | None = None,
) -> tuple[list[int], SpecStats]:
    """Generate up to params.max_tokens tokens after prompt_ids; return (new token ids, stats)."""
    if num_draft_tokens < 0:
        raise ValueError(f"num_draft_tokens must be >= 0, got {num_draft_tokens}")
    prompt = [int(t) for t in prompt_ids]
    out: list[int] = []
    stats = SpecStats()
    stops = stop_ids(params)
    draft_start, target_start = drafter.forward_passes, verifier.forward_passes
    finished = False
    while not finished:
        # The verifier always adds one token, so draft at most (room - 1): never past max_tokens.
        k = min(num_draft_tokens, params.max_tokens - len(out) - 1)
        ids = prompt + out
        drafts, draft_probs = drafter.propose(ids, k, params) if k > 0 else ([], None)
        accepted = verifier.verify(ids, list(drafts), draft_probs, params)
        assert 1 <= len(accepted) <= len(drafts) + 1, f"verifier returned {len(accepted)} tokens for {len(drafts)} drafts"
        assert accepted[:-1] == list(drafts[: len(accepted) - 1]), "verifier changed an accepted draft token"
        if drafts:
            stats.record_step(len(accepted) - 1, len(drafts))
        taken, finished = emit(out, accepted, params, stops)
        if on_tokens is not None and taken:
            on_tokens(taken)
    stats.draft_passes = drafter.forward_passes - draft_start
    stats.target_passes = verifier.forward_passes - target_start
    return out, stats
