"""In-process runners over `LlamaModel`: cached sequences, the prefix cache, Drafter / Verifier, batched
decode.

Shape legend: V vocab, H hidden, K draft tokens, B batch rows, T tokens in one pass.

A `CachedSequence` is one sequence's KV cache plus the token ids in it. `feed(ids, n_out)` makes the
cache hold exactly `ids`: it keeps the longest prefix it already shares with `ids` (at most
len(ids) - n_out tokens, so the last n_out positions are recomputed and their hidden states
returned), rolls back the rest and runs the new tail in one pass. That one mechanism is the KV
rollback after a rejected draft and the token-prefix reuse of repeated verify calls.

`PrefixCache` keeps the most recently used sequences (LRU) and hands out the one sharing the longest
prefix with a request, so a BLS that calls verify with a growing prefix reuses the prompt's KV.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.model import LlamaModel
from specbuild.engines.reference.sampling import accept_draft, make_generator, probs_from_logits, sample
from specbuild.engines.reference.speculative import (
    StopHook,
    Verified,
    emit,
    speculative_generate_batch,
    stop_ids,
)

DEFAULT_PREFIX_CACHE_ENTRIES = 8  # sequences kept by PrefixCache (each holds one KV cache)


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (one C-level comparison when one list
    continues the other, the usual case of a growing sequence)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)


def next_token(model: LlamaModel, hidden: torch.Tensor, params: SamplingParams, generator) -> int:
    """The target's own next token after a position's hidden state [H] (a plain decode step)."""
    return sample(probs_from_logits(model.logits(hidden), params), generator)  # logits, probs [V]


@dataclass(frozen=True)
class FedStates:
    """The target's captured states (LlamaModel.forward_capture) of the positions one pass fed:
    positions start .. start + T - 1 of the sequence. What a capturing verifier hands a head drafter."""

    start: int
    aux: torch.Tensor  # [T,A]


class CachedSequence:
    """One sequence (batch row of 1) in a KV cache, with the token ids it holds."""

    def __init__(self, model: LlamaModel, capacity: int = 256):
        self.model = model
        self.cache = model.new_cache(1, capacity)
        self.tokens: list[int] = []
        self.forward_passes = 0

    def common_prefix(self, ids: list[int]) -> int:
        return common_prefix(self.tokens, ids)

    def feed(self, ids: list[int], n_out: int = 1) -> torch.Tensor:
        """Make the cache hold `ids`; return the hidden states of the last n_out positions [n_out,H]."""
        return self.feed_capture(ids, n_out)[0]

    def feed_capture(
        self, ids: list[int], n_out: int = 1, capture: tuple[int, ...] = ()
    ) -> tuple[torch.Tensor, FedStates | None]:
        """feed(), plus the states of layers `capture` of every position this pass fed (None without)."""
        assert 1 <= n_out <= len(ids), f"n_out={n_out} for {len(ids)} ids"
        keep = min(self.common_prefix(ids), len(ids) - n_out)
        self.cache.truncate(0, keep)
        tail = torch.tensor([ids[keep:]], dtype=torch.long, device=self.model.device)  # [1,T]
        if capture:  # [1,T,H], [1,T,A]
            hidden, aux = self.model.forward_capture(tail, self.cache, capture=capture)
        else:  # the plain pass is `forward`, the one entry point of every uncaptured pass
            hidden, aux = self.model.forward(tail, self.cache), None  # [1,T,H]
        self.tokens = list(ids)
        self.forward_passes += 1
        return hidden[0, -n_out:], FedStates(keep, aux[0]) if capture else None  # [n_out,H]


class PrefixCache:
    """LRU of CachedSequence keyed by their tokens: `acquire(ids)` returns the best match (or a fresh one).

    A request takes the matching entry over (its KV is then overwritten by the request's) only when it
    continues that entry's sequence: it holds all of the entry's tokens, or all of its own tokens but the
    last (the entry's later tokens are a rejected draft tail: the next round of a BLS verify or draft
    call). A request that only shares a shorter prefix with the entry (a new prompt sharing a system
    prompt, or another sequence) gets a fresh entry with a copy of that shared prefix's KV, and the
    entry stays for the sequence that owns it, as TensorRT-LLM's block reuse shares prefix blocks without
    freeing the other sequence's. Taking it over instead made concurrent growing sequences that share a
    prefix evict each other on every call, each call then recomputing its whole prefix (the c=4 collapse
    of the streamed baseline on the real model: lab/notebook/2026-12-01-inflight-batching.md)."""

    def __init__(self, model: LlamaModel, *, max_entries: int = DEFAULT_PREFIX_CACHE_ENTRIES):
        self.model = model
        self.max_entries = max_entries
        self._entries: OrderedDict[int, CachedSequence] = OrderedDict()
        self._next = 0
        self.reused_tokens = 0  # prompt tokens not recomputed thanks to the cache (for tests / metrics)
        self.copied_tokens = 0  # prefix tokens copied into a fresh entry from a shared one (for tests)
        self._held: set[int] = set()  # id() of entries a DecodeSession row owns until it leaves

    def hold(self, seq: CachedSequence) -> None:
        """`seq` belongs to a running request (a session row) until release(): never handed out or
        evicted meanwhile (its prefix may still be copied)."""
        self._held.add(id(seq))

    def release(self, seq: CachedSequence) -> None:
        self._held.discard(id(seq))

    def acquire(self, ids: list[int], *, exclude: frozenset[int] = frozenset()) -> CachedSequence:
        """The entry sharing the longest prefix with `ids` (a fresh one when none shares any, or when the
        best one is another sequence's: then with that shared prefix copied in); entries whose id() is in
        `exclude` are never handed out (a batch hands each row a sequence of its own), though their
        prefix may be copied."""
        best_key, best_len, source = None, 0, None
        exclude = exclude | frozenset(self._held)
        for key, seq in self._entries.items():
            n = seq.common_prefix(ids)
            if id(seq) in exclude:
                if n > (source[1] if source else 0):
                    source = (seq, n)
                continue
            if n > best_len:
                best_key, best_len = key, n
        if best_key is not None:
            held = len(self._entries[best_key].tokens)
            if best_len < held and best_len < len(ids) - 1:  # another sequence's: share, do not take
                source = (self._entries[best_key], best_len)
                best_key = None
        if best_key is None:
            fresh = CachedSequence(self.model)
            if source is not None and source[1] > 0:
                seq, n = source
                best_len = n
                fresh.cache.reserve(n)
                fresh.cache.k[:, 0, :n] = seq.cache.k[:, 0, :n]  # [L,n,nkv,D] the shared prefix's KV
                fresh.cache.v[:, 0, :n] = seq.cache.v[:, 0, :n]
                fresh.cache.lengths[0] = n
                fresh.tokens = list(seq.tokens[:n])
                self.copied_tokens += n
            held = exclude | ({id(source[0])} if source else frozenset())
            while len(self._entries) >= self.max_entries:  # the least recently used one
                victims = [k for k, s in self._entries.items() if id(s) not in held] or [
                    k for k, s in self._entries.items() if id(s) not in exclude
                ]  # not one a batch holds; the shared one only when nothing else is left
                if not victims:
                    break
                self._entries.pop(victims[0])
            best_key, self._next = self._next, self._next + 1
            self._entries[best_key] = fresh
        self._entries.move_to_end(best_key)
        self.reused_tokens += min(best_len, max(len(ids) - 1, 0))
        return self._entries[best_key]


class ModelDrafter:
    """Drafter over a draft LlamaModel: k autoregressive passes (the first also catches up on new ids)."""

    def __init__(self, model: LlamaModel, *, generator: torch.Generator | None = None):
        self.seq = CachedSequence(model)
        self.generator = generator

    @property
    def forward_passes(self) -> int:
        return self.seq.forward_passes

    def propose(self, ids: list[int], k: int, params: SamplingParams) -> tuple[list[int], torch.Tensor]:
        drafts: list[int] = []
        rows = []
        hidden = self.seq.feed(ids, 1)  # [1,H]
        for i in range(k):
            probs = probs_from_logits(self.seq.model.logits(hidden), params)  # [1,V]
            drafts.append(sample(probs[0], self.generator))
            rows.append(probs)
            if i + 1 < k:
                hidden = self.seq.feed(ids + drafts, 1)  # [1,H]
        return drafts, torch.cat(rows, 0)  # [k,V]


class ModelVerifier:
    """Verifier over a target LlamaModel: one pass over the new ids + drafts, then `accept_draft`.

    With a PrefixCache, each call picks the cached sequence sharing the longest prefix (external
    verification from the BLS); without, it owns one sequence (the in-process loop): `seq` when given
    (a prefix-cache entry the caller holds), else a fresh one. With `capture` (target layer ids) it
    returns `Verified` answers carrying the captured states of every position its pass fed (`FedStates`).
    """

    def __init__(
        self,
        model: LlamaModel,
        *,
        generator: torch.Generator | None = None,
        prefix_cache: PrefixCache | None = None,
        seq: CachedSequence | None = None,
        capture: tuple[int, ...] = (),
    ):
        self.model = model
        self.generator = generator
        self.prefix_cache = prefix_cache
        self._own = None if prefix_cache else seq or CachedSequence(model)
        self.capture = capture
        self.forward_passes = 0

    def verify(
        self,
        ids: list[int],
        draft_tokens: list[int],
        draft_probs: torch.Tensor | None,
        params: SamplingParams,
    ) -> list[int]:
        k = len(draft_tokens)
        seq = self._own or self.prefix_cache.acquire(ids)
        hidden, fed = seq.feed_capture(list(ids) + list(draft_tokens), k + 1, self.capture)  # [K+1,H]
        self.forward_passes += 1
        target_probs = probs_from_logits(self.model.logits(hidden), params)  # [K+1,V]
        n, nxt = accept_draft(draft_tokens, draft_probs, target_probs, self.generator)
        tokens = list(draft_tokens[:n]) + [nxt]
        return Verified(tokens, fed) if self.capture else tokens


class SequenceBatch:
    """B sequences in one KV cache (row = request index); `feed` runs every given row's new tail in
    one pass."""

    def __init__(self, model: LlamaModel, rows: int, capacity: int = 256):
        self.model = model
        self.cache = model.new_cache(rows, capacity)
        self.tokens: list[list[int]] = [[] for _ in range(rows)]
        self.forward_passes = 0

    def feed(self, rows: list[int], ids: list[list[int]], n_out: list[int]) -> list[torch.Tensor]:
        """Like CachedSequence.feed for several rows at once; returns [n_out_i,H] per given row."""
        return self.feed_capture(rows, ids, n_out)[0]

    def feed_capture(
        self, rows: list[int], ids: list[list[int]], n_out: list[int], capture: tuple[int, ...] = ()
    ) -> tuple[list[torch.Tensor], list[FedStates] | None]:
        """feed(), plus each given row's captured states of the positions this pass fed (None without)."""
        tails, starts = [], []
        for row, seq, n in zip(rows, ids, n_out, strict=True):
            assert 1 <= n <= len(seq)
            keep = min(common_prefix(self.tokens[row], seq), len(seq) - n)
            self.cache.truncate(row, keep)
            tails.append(seq[keep:])
            starts.append(keep)
            self.tokens[row] = list(seq)
        width = max(len(t) for t in tails)
        padded = [[0] * width for _ in self.tokens]  # rows not given this pass write only dead slots
        n_new = [0] * len(self.tokens)
        for row, tail in zip(rows, tails, strict=True):
            padded[row][: len(tail)] = tail
            n_new[row] = len(tail)
        tokens = torch.tensor(padded, dtype=torch.long, device=self.model.device)  # [B,T] right-padded
        if capture:  # [B,T,H], [B,T,A]
            hidden, aux = self.model.forward_capture(tokens, self.cache, capture=capture, n_new=n_new)
        else:
            hidden, aux = self.model.forward(tokens, self.cache, n_new=n_new), None  # [B,T,H]
        self.forward_passes += 1
        out = [
            hidden[row, len(t) - n : len(t)] for row, t, n in zip(rows, tails, n_out, strict=True)
        ]  # [n,H]
        if not capture:
            return out, None
        return out, [FedStates(k, aux[row, : len(t)]) for row, t, k in zip(rows, tails, starts, strict=True)]


class BatchModelDrafter:
    """BatchDrafter over a draft LlamaModel: draft position i of every row in one batched pass."""

    passes_per_draft_token = 1

    def __init__(self, model: LlamaModel, rows: int, generators: list[torch.Generator | None]):
        self.batch = SequenceBatch(model, rows)
        self.generators = generators

    def propose_batch(self, rows, ids, ks, params):
        drafts: list[list[int]] = [[] for _ in rows]
        probs: list[list[torch.Tensor]] = [[] for _ in rows]
        live = [j for j, k in enumerate(ks) if k > 0]
        step = 0
        while live:
            hidden = self.batch.feed(
                [rows[j] for j in live], [ids[j] + drafts[j] for j in live], [1] * len(live)
            )  # [1,H] each
            for j, h in zip(live, hidden, strict=True):
                p = probs_from_logits(self.batch.model.logits(h), params[j])  # [1,V]
                drafts[j].append(sample(p[0], self.generators[rows[j]]))
                probs[j].append(p)
            step += 1
            live = [j for j in live if ks[j] > step]
        return [(d, torch.cat(p, 0) if p else None) for d, p in zip(drafts, probs, strict=True)]  # [k,V] each


class BatchModelVerifier:
    """BatchVerifier over a target LlamaModel: every row's drafts scored in one batched pass.

    With a PrefixCache (the engine's), a row starts from the KV of the cached sequence sharing the
    longest prefix with its prompt (only the rest is prefilled) and `store()` leaves its final KV there,
    exactly as the plain `generate_batch` does, so a lockstep batch and a plain batch over the same
    prompts compute the same prompt tokens. `plain_batch` is a K=0 round: one target token per row,
    generate_batch's decode step (no draft model involved).

    With `capture` (target layer ids) the answers are `Verified`, with each row's captured states of the
    positions the pass fed (`FedStates`); `keep_at_most[row]` then caps the prompt tokens a row takes from
    the prefix cache, so the pass computes the states a head drafter does not hold yet."""

    def __init__(
        self,
        model: LlamaModel,
        rows: int,
        generators: list[torch.Generator | None],
        *,
        prefix_cache: PrefixCache | None = None,
        capture: tuple[int, ...] = (),
        keep_at_most: list[int] | None = None,
    ):
        self.batch = SequenceBatch(model, rows)
        self.generators = generators
        self.prefix_cache = prefix_cache
        self.capture, self.keep_at_most = capture, keep_at_most
        self.entries: dict[int, CachedSequence] = {}  # row -> the prefix-cache sequence it came from
        self.cached_prompt_tokens = [0] * rows  # prompt tokens each row took from the prefix cache

    def _seed(self, rows: list[int], ids: list[list[int]]) -> None:
        """A row's first call: copy the KV of its prompt's longest cached prefix (never its last token:
        its hidden state is needed) from the prefix cache, one entry of its own per row."""
        if self.prefix_cache is None:
            return
        for row, seq in zip(rows, ids, strict=True):
            if row in self.entries:
                continue
            taken = frozenset(id(e) for e in self.entries.values())
            entry = self.entries[row] = self.prefix_cache.acquire(list(seq), exclude=taken)
            n = min(entry.common_prefix(seq), len(seq) - 1)
            if self.keep_at_most is not None:
                n = min(n, self.keep_at_most[row])
            if n:
                self.batch.cache.copy_slots(row, entry.cache, 0, 0, n)
                self.batch.tokens[row] = list(seq[:n])
            self.cached_prompt_tokens[row] = n

    def store(self, sequences: list[list[int]]) -> None:
        """After the batch: leave each row's KV (what it shares with its final sequence, prompt + output)
        in the prefix-cache sequence it came from, for later requests."""
        for row, entry in self.entries.items():
            n = min(common_prefix(self.batch.tokens[row], sequences[row]), self.batch.cache.lengths[row])
            entry.cache.copy_slots(0, self.batch.cache, row, 0, n)
            entry.tokens = list(sequences[row][:n])

    def plain_batch(self, rows, ids, params) -> list[int]:
        """A round with K=0 for every row: one batched pass feeding each row's new tokens, then each
        row's own next token (next_token, as generate_batch samples)."""
        self._seed(rows, ids)
        hidden, fed = self.batch.feed_capture(rows, ids, [1] * len(rows), self.capture)  # [1,H] each
        tokens = [
            next_token(self.batch.model, h[0], p, self.generators[row])
            for row, h, p in zip(rows, hidden, params, strict=True)
        ]
        return [Verified([t], f) for t, f in zip(tokens, fed, strict=True)] if fed is not None else tokens

    def verify_batch(self, rows, ids, drafts, draft_probs, params):
        self._seed(rows, ids)
        hidden, fed = self.batch.feed_capture(
            rows,
            [i + d for i, d in zip(ids, drafts, strict=True)],
            [len(d) + 1 for d in drafts],
            self.capture,
        )  # [k+1,H] each
        out = []
        for row, h, d, dp, p in zip(rows, hidden, drafts, draft_probs, params, strict=True):
            target_probs = probs_from_logits(self.batch.model.logits(h), p)  # [k+1,V]
            n, nxt = accept_draft(d, dp, target_probs, self.generators[row])
            out.append(d[:n] + [nxt])
        return [Verified(t, f) for t, f in zip(out, fed, strict=True)] if fed is not None else out


@torch.inference_mode()  # the prefix cache's sequences hold inference tensors
def lockstep_batch(
    drafter,
    target: LlamaModel,
    prompts: list[list[int]],
    params: list[SamplingParams],
    *,
    prefix_cache,
    capture: tuple[int, ...] = (),
    keep_at_most: list[int] | None = None,
    **loop,
):
    """speculative_generate_batch of `drafter` and the target's BatchModelVerifier (seeded per request,
    over `prefix_cache` when given: rows start from their cached prompt KV and leave their final KV
    there, as generate_batch does; `capture` / `keep_at_most`: a head drafter's, see BatchModelVerifier);
    `loop`: the loop's keyword arguments. Returns its (tokens, stats)."""
    verifier = BatchModelVerifier(
        target,
        len(prompts),
        [make_generator(q.seed) for q in params],
        prefix_cache=prefix_cache,
        capture=capture,
        keep_at_most=keep_at_most,
    )
    prompts = [list(p) for p in prompts]
    done = speculative_generate_batch(drafter, verifier, prompts, params, **loop)
    verifier.store([p + out for p, (out, _) in zip(prompts, done, strict=True)])
    return done


def generate_cached(
    seq: CachedSequence,
    prompt: list[int],
    params: SamplingParams,
    *,
    on_tokens=None,
    keep_logits: bool = False,
    generator: torch.Generator | None = None,
    stop: StopHook | None = None,
) -> tuple[list[int], list[torch.Tensor], int]:
    """Plain decode of one request on a (possibly reused) CachedSequence.

    Returns (new tokens, per-token float32 logits [V] when keep_logits, forward passes). The
    generator defaults to one seeded with params.seed.
    """
    gen = generator or make_generator(params.seed)
    stops = stop_ids(params)
    out: list[int] = []
    logits_rows: list[torch.Tensor] = []
    start = seq.forward_passes
    finished = False
    while not finished:
        logits = seq.model.logits(seq.feed(list(prompt) + out, 1)[0])  # [V]
        tok = sample(probs_from_logits(logits, params), gen)
        taken, finished = emit(out, [tok], params, stops, stop)
        if keep_logits:
            logits_rows.append(logits)
            del logits_rows[len(out) :]  # a stop hook may have cut the token these logits produced
        if on_tokens is not None and taken:
            on_tokens(taken)
    return out, logits_rows, seq.forward_passes - start


@torch.inference_mode()  # the prefix cache's sequences hold inference tensors (grown inside forward passes)
def generate_batch(
    model: LlamaModel,
    prompts: list[list[int]],
    params: list[SamplingParams],
    *,
    on_tokens=None,
    stop=None,
    prefix_cache: PrefixCache | None = None,
) -> tuple[list[list[int]], list[str], int, list[int]]:
    """Plain (non-speculative) decode of several prompts of different lengths in one batch.

    Prefill runs all prompts right-padded in one pass; each decode step feeds one token per
    unfinished row. on_tokens(row, [token]) streams; stop(row, out, start) is each row's stop hook
    (speculative.StopHook): a row it ends stops there, the others go on. Returns (tokens per row,
    finish reasons, passes, prompt tokens each row took from the prefix cache).

    With a prefix_cache each row starts from the KV of the cached sequence sharing the longest prefix
    with its prompt (only the rest is prefilled) and leaves its final KV there, as single requests do.
    """
    b = len(prompts)
    assert b == len(params) and all(prompts), "one non-empty prompt and one SamplingParams per row"
    gens = [make_generator(p.seed) for p in params]
    stops = [stop_ids(p) for p in params]
    cached: list[CachedSequence | None] = [None] * b
    keep = [0] * b
    if prefix_cache is not None:
        taken: set[int] = set()
        for row, p in enumerate(prompts):
            cached[row] = seq = prefix_cache.acquire(list(p), exclude=frozenset(taken))
            taken.add(id(seq))
            keep[row] = min(seq.common_prefix(list(p)), len(p) - 1)
    tails = [p[k:] for p, k in zip(prompts, keep, strict=True)]
    lengths = [len(t) for t in tails]
    width = max(lengths)
    cache = model.new_cache(b, max(len(p) for p in prompts) + max(p.max_tokens for p in params) + 1)
    for row, seq in enumerate(cached):
        if seq is not None and keep[row]:
            cache.copy_slots(row, seq.cache, 0, 0, keep[row])
    tokens = torch.zeros(b, width, dtype=torch.long, device=model.device)  # [B,T] right-padded
    for row, t in enumerate(tails):
        tokens[row, : len(t)] = torch.tensor(t)
    hidden = model.forward(tokens, cache, n_new=lengths)  # [B,T,H]
    last = hidden[torch.arange(b), torch.tensor(lengths) - 1]  # [B,H] each row's last real position
    outs: list[list[int]] = [[] for _ in range(b)]
    done = [False] * b
    passes = 1
    while True:
        next_ids = []
        for row in range(b):
            tok = 0
            if not done[row]:
                tok = next_token(model, last[row], params[row], gens[row])
                hook = (lambda out, start, row=row: stop(row, out, start)) if stop else None
                taken, done[row] = emit(outs[row], [tok], params[row], stops[row], hook)
                if on_tokens is not None and taken:
                    on_tokens(row, taken)
            next_ids.append(tok)
        if all(done):
            break
        step = torch.tensor(next_ids, device=model.device)[:, None]  # [B,1]
        last = model.forward(step, cache, n_new=[0 if d else 1 for d in done])[:, 0]  # [B,H]
        passes += 1
    for row, seq in enumerate(cached):  # leave each row's KV in its cached sequence for later requests
        if seq is not None:
            held = (list(prompts[row]) + outs[row])[: cache.lengths[row]]
            seq.cache.copy_slots(0, cache, row, 0, len(held))
            seq.tokens = held
    reasons = ["stop" if o and o[-1] in s else "length" for o, s in zip(outs, stops, strict=True)]
    return outs, reasons, passes, keep


@torch.inference_mode()  # the prefix cache's sequences hold inference tensors
def verify_batch_cached(
    model: LlamaModel,
    prefix_cache: PrefixCache,
    ids: list[list[int]],
    drafts: list[list[int]],
    draft_probs: list[torch.Tensor | None],
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
) -> list[tuple[list[int], int]]:
    """External verification of several requests in ONE target pass: row i scores drafts[i] after
    ids[i] (rows of their own length), each from the prefix-cache sequence sharing the longest prefix
    with it, and leaves its KV (ids + drafts) there, exactly as ModelVerifier.verify does one by one.
    Returns per row (its accepted drafts + one target token, the prefix tokens it took from the cache)."""
    b = len(ids)
    assert b == len(drafts) == len(draft_probs) == len(params) == len(generators) and b
    full = [list(i) + list(d) for i, d in zip(ids, drafts, strict=True)]
    n_out = [len(d) + 1 for d in drafts]
    taken: set[int] = set()
    seqs: list[CachedSequence] = []
    keep, reused = [], []
    for prefix, seq_ids, n in zip(ids, full, n_out, strict=True):
        before = prefix_cache.reused_tokens
        seq = prefix_cache.acquire(list(prefix), exclude=frozenset(taken))  # as ModelVerifier.verify
        reused.append(prefix_cache.reused_tokens - before)
        taken.add(id(seq))
        seqs.append(seq)
        keep.append(min(seq.common_prefix(seq_ids), len(seq_ids) - n))
    cache = model.new_cache(b, max(len(f) for f in full) + 1)
    for row, (seq, k) in enumerate(zip(seqs, keep, strict=True)):
        if k:
            cache.k[:, row, :k] = seq.cache.k[:, 0, :k]  # [L,keep,nkv,D]
            cache.v[:, row, :k] = seq.cache.v[:, 0, :k]
            cache.lengths[row] = k
    tails = [f[k:] for f, k in zip(full, keep, strict=True)]
    width = max(len(t) for t in tails)
    tokens = torch.zeros(b, width, dtype=torch.long, device=model.device)  # [B,T] right-padded
    for row, t in enumerate(tails):
        tokens[row, : len(t)] = torch.tensor(t)
    hidden = model.forward(tokens, cache, n_new=[len(t) for t in tails])  # [B,T,H]
    out = []
    for row, (seq, f, k, t, n) in enumerate(zip(seqs, full, keep, tails, n_out, strict=True)):
        seq.cache.reserve(len(f))
        seq.cache.truncate(0, k)
        seq.cache.k[:, 0, k : len(f)] = cache.k[:, row, k : len(f)]  # the new tail's KV
        seq.cache.v[:, 0, k : len(f)] = cache.v[:, row, k : len(f)]
        seq.cache.lengths[0] = len(f)
        seq.tokens = f
        seq.forward_passes += 1
        target_probs = probs_from_logits(
            model.logits(hidden[row, len(t) - n : len(t)]), params[row]
        )  # [k+1,V]
        accepted, nxt = accept_draft(drafts[row], draft_probs[row], target_probs, generators[row])
        out.append((list(drafts[row][:accepted]) + [nxt], reused[row]))
    return out
