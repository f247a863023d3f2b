"""The one draft/target speculative loop, over two small protocols.

Callers: the reference engine (in-process `ModelDrafter` / `ModelVerifier`, specbuild.engines.
reference.cached_decode) and the Triton BLS (a Drafter that calls `tensorrt_llm_draft` and a Verifier that
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

Load-aware K (core/perf/schedule.py): `k_of` gives each round's K before the room clamp (the BLS: the
schedule's K for the requests in flight now; the batch: `schedule(rows still decoding)`); a round with
K=0 is a plain target step (the verifier's `plain(ids, n, params)` when it has one: up to n target
tokens in one call, else verify() with no drafts: one token; in the batch, a round with K=0 for every
row is the batch verifier's `plain_batch`, the target's plain batched step). `guard` (an
AcceptanceGuard) stops a request's drafting once its recent rounds accept too little
(SpecStats.guard_stopped). Neither changes greedy output: every emitted token is the target's own
choice.

Head-based drafters (EAGLE-3) draft from the target's hidden states: their verifier returns `Verified`
(the tokens plus the hidden states of the positions its pass fed, opaque here) from `verify`, `plain`,
`verify_batch` or `plain_batch`, and the loop hands those to the drafter (`observe(hidden)`; a batch
drafter's `observe(row, hidden)`) before it drafts again. A plain list of tokens, what every other
verifier returns, involves no drafter call.

Vendored as-is into the production Triton BLS (model_repo VENDORED_MODULES): import only
specbuild.core.errors, sampling_params, generation and the reference sampling/speculative modules.

Stop tokens are included in the returned ids (like HF `generate`); `params.end_id` must already be
resolved by the caller (None: no end id).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from specbuild.core.generation import SpecStats
from specbuild.core.sampling_params import SamplingParams

OnTokens = Callable[[list[int]], None]
# stop(out, start) after tokens out[start:] were appended: None to go on, or the length to cut `out` at
# (len(out) keeps everything) to end the request there.
StopHook = Callable[[list[int], int], "int | None"]


@dataclass(frozen=True)
class Verified:
    """A verifier's answer with the target's hidden states of the positions its pass fed (for a drafter
    that drafts from them); `tokens` as a plain answer: the accepted drafts + one target token."""

    tokens: list[int]
    hidden: object  # opaque to the loop: the drafter's `observe` reads it


def observed(result, drafter, *row) -> list[int]:
    """The tokens of a verifier's answer; a `Verified` one's hidden states go to drafter.observe(*row, .)."""
    if isinstance(result, Verified):
        drafter.observe(*row, result.hidden)
        return list(result.tokens)
    return result


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
    """Batched verification. It may also have `plain_batch(rows, ids, params) -> list[int]` (one target
    token per row: a K=0 round, the target's plain batched decode step); without it such a round verifies
    no drafts, which takes the same one token per row."""

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
        guard=None,
        stats: SpecStats | None = None,
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
        self.stats = stats if stats is not None else SpecStats()  # the caller's: read while it runs
        self.stops = stop_ids(params)
        self.finished = False
        self.guard = guard  # core/perf/schedule.AcceptanceGuard or None
        self.rounds: list[tuple[int, int]] = []  # (accepted, drafted) of each drafted round

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.out

    def next_k(self, k: int | None = None) -> int:
        """This round's K: `k` (the schedule's; None: num_draft_tokens), 0 once the guard stopped drafting.
        The verifier always adds one token, so draft at most (room - 1): never past max_tokens."""
        k = self.num_draft_tokens if k is None else min(k, self.num_draft_tokens)
        if self.stats.guard_stopped:
            k = 0
        return max(0, min(k, self.params.max_tokens - len(self.out) - 1))

    @property
    def room(self) -> int:
        return self.params.max_tokens - len(self.out)

    def take(self, drafts: list[int], accepted: list[int]) -> None:
        """Record one verified round: `accepted` = the kept drafts + the verifier's token."""
        assert 1 <= len(accepted) <= len(drafts) + 1, (
            f"verifier returned {len(accepted)} tokens for {len(drafts)} drafts"
        )
        assert accepted[:-1] == list(drafts[: len(accepted) - 1]), "verifier changed an accepted draft token"
        self.stats.k_per_round.append(len(drafts))
        if drafts:
            self.stats.record_step(len(accepted) - 1, len(drafts))
            self.rounds.append((len(accepted) - 1, len(drafts)))
            if self.guard is not None and not self.stats.guard_stopped and self.guard.trips(self.rounds):
                self.stats.guard_stopped = True
        taken, self.finished = emit(self.out, accepted, self.params, self.stops, self.stop)
        if self.on_tokens is not None and taken:
            self.on_tokens(taken)

    def take_plain(self, tokens: list[int]) -> None:
        """Record a plain round (K=0): `tokens` = the target's own next tokens (at least one)."""
        assert tokens, "a plain round returned no tokens"
        self.stats.k_per_round.append(0)
        taken, self.finished = emit(self.out, list(tokens), self.params, self.stops, self.stop)
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
    k_of: Callable[[], int] | None = None,
    guard=None,
    plain_tokens: int = 1,
    plain_growth: int | None = None,
    stats: SpecStats | None = None,
) -> tuple[list[int], SpecStats]:
    """Generate up to params.max_tokens tokens after prompt_ids; return (new token ids, stats).

    k_of(): this round's K (None: num_draft_tokens every round); guard: an AcceptanceGuard; plain_tokens:
    target tokens a K=0 round asks of a verifier with `plain` (one call; the schedule is asked again
    after it). plain_growth g (a streamed request): the K=0 rounds ask 1, g, g^2, ... tokens, up to
    plain_tokens, so the first token comes after one target step, as without speculation, and a long
    answer still takes few calls (g = 8: 3 for 64 tokens, against 1 and 64). stats: the SpecStats to
    count in (updated before each round's on_tokens: a streaming caller reads the running totals there;
    None: a fresh one); the one returned."""
    req = SpecRequest(
        prompt_ids,
        params,
        num_draft_tokens=num_draft_tokens,
        on_tokens=on_tokens,
        stop=stop,
        guard=guard,
        stats=stats,
    )
    draft_start, target_start = drafter.forward_passes, verifier.forward_passes
    plain, plain_rounds = getattr(verifier, "plain", None), 0
    while not req.finished:
        k = req.next_k(k_of() if k_of is not None else None)
        if k == 0 and plain is not None and (k_of is not None or req.stats.guard_stopped):
            n = min(plain_tokens, plain_growth**plain_rounds) if plain_growth else plain_tokens
            plain_rounds += 1
            req.take_plain(observed(plain(req.ids, min(n, req.room), params), drafter))
            continue
        drafts, draft_probs = drafter.propose(req.ids, k, params) if k > 0 else ([], None)
        req.take(list(drafts), observed(verifier.verify(req.ids, list(drafts), draft_probs, params), drafter))
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
    schedule: Callable[[int], int] | None = None,
    guard=None,
) -> list[tuple[list[int], SpecStats]]:
    """The same rounds for several requests in lockstep: one batched draft pass per draft position and
    one batched verify pass per round for all unfinished requests (rows keep their own lengths).
    `stop(row, out, start)` is each row's stop hook: a row it ends stops there, the others go on.
    `schedule(n)`: K of a round with n rows still decoding (None: num_draft_tokens); K=0 rows verify no
    drafts (one plain target step in the same batched pass). A round in which every row has K=0 asks
    neither the drafter nor verify_batch: it is the verifier's `plain_batch` when it has one (a draft
    model then runs no pass; its cache catches up on the next round that drafts)."""
    reqs = [
        SpecRequest(
            p,
            q,
            num_draft_tokens=num_draft_tokens,
            on_tokens=(lambda toks, i=i: on_tokens(i, toks)) if on_tokens else None,
            stop=(lambda out, start, i=i: stop(i, out, start)) if stop else None,
            guard=guard,
        )
        for i, (p, q) in enumerate(zip(prompts, params, strict=True))
    ]
    plain = getattr(verifier, "plain_batch", None)
    while active := [i for i, r in enumerate(reqs) if not r.finished]:
        k = schedule(len(active)) if schedule is not None else None
        ks = [reqs[i].next_k(k) for i in active]
        ids, row_params = [reqs[i].ids for i in active], [reqs[i].params for i in active]
        if plain is not None and not any(ks):
            for i, tok in zip(active, plain(active, ids, row_params), strict=True):
                reqs[i].stats.target_passes += 1
                reqs[i].take_plain(observed(tok, drafter, i) if isinstance(tok, Verified) else [tok])
            continue
        proposals = drafter.propose_batch(active, ids, ks, row_params)
        drafts = [list(d) for d, _ in proposals]
        accepted = verifier.verify_batch(active, ids, drafts, [p for _, p in proposals], row_params)
        for i, d, a in zip(active, drafts, accepted, strict=True):
            # a batched pass per draft token in which this row took part (none for a drafter without a model)
            reqs[i].stats.draft_passes += len(d) * drafter.passes_per_draft_token
            reqs[i].stats.target_passes += 1
            reqs[i].take(d, observed(a, drafter, i))
    return [(r.out, r.stats) for r in reqs]
