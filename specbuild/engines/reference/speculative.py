"""The one draft/target speculative loop, over two small protocols.

Callers: the reference engine (in-process `ModelDrafter` / `ModelVerifier`, specbuild.engines.
reference.runners) and the Triton BLS (a Drafter that calls `tensorrt_llm_draft` and a Verifier that
calls `tensorrt_llm` with `draft_input_ids` / `draft_logits`). The boundary is deliberately
torch-light so the BLS can implement it with Triton tensors:

* token ids are plain `list[int]`;
* `draft_probs` is a float tensor [k, V] (torch) or None (token-equality verification);
* counters are plain ints (`forward_passes`), read by the loop before and after each call.

Each round: the drafter proposes up to k = min(num_draft_tokens, tokens still allowed - 1) tokens (a
drafter may offer fewer, even none: the n-gram drafter without a match; the round is then a plain
decode step); the verifier scores them in one target pass and returns the accepted drafts plus one
token of its own (`sampling.accept_draft`). The loop appends them, stops at the end id, a stop token
or max_tokens (never emits past max_tokens), and records SpecStats. Each call gets the whole sequence so far;
implementations keep their KV caches and roll them back to the longest prefix they share with it.

`speculative_generate_batch` runs the same rounds (`SpecRequest`) for several in-process requests in
lockstep over `BatchDrafter` / `BatchVerifier` (one batched pass per draft position, one per verify).

Vendored as-is into the production Triton BLS (model_repo VENDORED_MODULES): import only
specbuild.core.errors, sampling_params, generation and the reference sampling/speculative modules.

Stop tokens are included in the returned ids (like HF `generate`); `params.end_id` must already be
resolved by the caller (None: no end id).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from specbuild.core.generation import SpecStats
from specbuild.core.sampling_params import SamplingParams

OnTokens = Callable[[list[int]], None]
# stop(out, start) after tokens out[start:] were appended: None to go on, or the length to cut `out` at
# (len(out) keeps everything) to end the request there.
StopHook = Callable[[list[int], int], "int | None"]


@runtime_checkable
class Drafter(Protocol):
    """Proposes draft tokens after `ids` (prompt + everything generated so far)."""

    forward_passes: int  # draft-model forward passes so far (the loop reports the difference)

    def propose(self, ids: list[int], k: int, params: SamplingParams) -> tuple[list[int], object | None]:
        """Return (at most k draft tokens, draft_probs [len(drafts), V] or None)."""
        ...


@runtime_checkable
class Verifier(Protocol):
    """Scores `draft_tokens` after `ids` in one target pass."""

    forward_passes: int  # target-model forward passes so far

    def verify(
        self, ids: list[int], draft_tokens: list[int], draft_probs: object | None, params: SamplingParams
    ) -> list[int]:
        """Return the accepted drafts followed by one target token (1..k+1 tokens)."""
        ...


class BatchDrafter(Protocol):
    """In-process batched drafting: rows are request indices (stable across rounds)."""

    passes_per_draft_token: int  # draft-model passes a row takes part in per draft token (n-gram: 0)

    def propose_batch(
        self, rows: list[int], ids: list[list[int]], ks: list[int], params: list[SamplingParams]
    ) -> list[tuple[list[int], object | None]]: ...


class BatchVerifier(Protocol):
    def verify_batch(
        self,
        rows: list[int],
        ids: list[list[int]],
        drafts: list[list[int]],
        draft_probs: list[object | None],
        params: list[SamplingParams],
    ) -> list[list[int]]: ...


def stop_ids(params: SamplingParams) -> frozenset[int]:
    """Tokens that end a request: the end id and the extra stop tokens."""
    ids = set(params.stop_token_ids)
    if params.end_id is not None:
        ids.add(params.end_id)
    return frozenset(ids)


def emit(
    out: list[int],
    new: list[int],
    params: SamplingParams,
    stops: frozenset[int],
    stop: StopHook | None = None,
) -> tuple[list[int], bool]:
    """Append `new` to `out` up to max_tokens and the first stop token; return (appended, finished).

    `stop` then may end the request: out is cut at the length it returns and only what is left of
    the appended tokens counts as appended."""
    start = len(out)
    taken: list[int] = []
    finished = False
    for tok in new:
        if len(out) >= params.max_tokens:
            break
        out.append(tok)
        taken.append(tok)
        if tok in stops:
            finished = True
            break
    finished = finished or len(out) >= params.max_tokens
    if stop is not None:
        end = stop(out, start)
        if end is not None:
            del out[max(end, start) :]
            del taken[max(end - start, 0) :]
            finished = True
    return taken, finished


class SpecRequest:
    """One request's place in the loop: the next draft length, and what a verified round appends."""

    def __init__(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        num_draft_tokens: int,
        on_tokens: OnTokens | None = None,
        stop: StopHook | None = None,
    ):
        if num_draft_tokens < 0:
            raise ValueError(f"num_draft_tokens must be >= 0, got {num_draft_tokens}")
        self.prompt = [int(t) for t in prompt_ids]
        self.params, self.num_draft_tokens, self.on_tokens, self.stop = (
            params,
            num_draft_tokens,
            on_tokens,
            stop,
        )
        self.out: list[int] = []
        self.stats = SpecStats()
        self.stops = stop_ids(params)
        self.finished = False

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.out

    def next_k(self) -> int:
        # The verifier always adds one token, so draft at most (room - 1): never past max_tokens.
        return min(self.num_draft_tokens, self.params.max_tokens - len(self.out) - 1)

    def take(self, drafts: list[int], accepted: list[int]) -> None:
        """Record one verified round: `accepted` = the kept drafts + the verifier's token."""
        assert 1 <= len(accepted) <= len(drafts) + 1, (
            f"verifier returned {len(accepted)} tokens for {len(drafts)} drafts"
        )
        assert accepted[:-1] == list(drafts[: len(accepted) - 1]), "verifier changed an accepted draft token"
        if drafts:
            self.stats.record_step(len(accepted) - 1, len(drafts))
        taken, self.finished = emit(self.out, accepted, self.params, self.stops, self.stop)
        if self.on_tokens is not None and taken:
            self.on_tokens(taken)


def speculative_generate(
    drafter: Drafter,
    verifier: Verifier,
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    num_draft_tokens: int,
    on_tokens: OnTokens | None = None,
    stop: StopHook | None = None,
) -> tuple[list[int], SpecStats]:
    """Generate up to params.max_tokens tokens after prompt_ids; return (new token ids, stats)."""
    req = SpecRequest(prompt_ids, params, num_draft_tokens=num_draft_tokens, on_tokens=on_tokens, stop=stop)
    draft_start, target_start = drafter.forward_passes, verifier.forward_passes
    while not req.finished:
        k = req.next_k()
        drafts, draft_probs = drafter.propose(req.ids, k, params) if k > 0 else ([], None)
        req.take(list(drafts), verifier.verify(req.ids, list(drafts), draft_probs, params))
    req.stats.draft_passes = drafter.forward_passes - draft_start
    req.stats.target_passes = verifier.forward_passes - target_start
    return req.out, req.stats


def speculative_generate_batch(
    drafter: BatchDrafter,
    verifier: BatchVerifier,
    prompts: list[list[int]],
    params: list[SamplingParams],
    *,
    num_draft_tokens: int,
    on_tokens: Callable[[int, list[int]], None] | None = None,
    stop: Callable[[int, list[int], int], int | None] | None = None,
) -> list[tuple[list[int], SpecStats]]:
    """The same rounds for several requests in lockstep: one batched draft pass per draft position and
    one batched verify pass per round for all unfinished requests (rows keep their own lengths).
    `stop(row, out, start)` is each row's stop hook: a row it ends stops there, the others go on."""
    reqs = [
        SpecRequest(
            p,
            q,
            num_draft_tokens=num_draft_tokens,
            on_tokens=(lambda toks, i=i: on_tokens(i, toks)) if on_tokens else None,
            stop=(lambda out, start, i=i: stop(i, out, start)) if stop else None,
        )
        for i, (p, q) in enumerate(zip(prompts, params, strict=True))
    ]
    while active := [i for i, r in enumerate(reqs) if not r.finished]:
        ks = [reqs[i].next_k() for i in active]
        proposals = drafter.propose_batch(
            active, [reqs[i].ids for i in active], ks, [reqs[i].params for i in active]
        )
        drafts = [list(d) for d, _ in proposals]
        accepted = verifier.verify_batch(
            active,
            [reqs[i].ids for i in active],
            drafts,
            [p for _, p in proposals],
            [reqs[i].params for i in active],
        )
        for i, k, d, a in zip(active, ks, drafts, accepted, strict=True):
            # k batched passes in which this row took part (none for a drafter without a model)
            reqs[i].stats.draft_passes += max(k, 0) * drafter.passes_per_draft_token
            reqs[i].stats.target_passes += 1
            reqs[i].take(d, a)
    return [(r.out, r.stats) for r in reqs]
