"""`DecodeSession`: plain decode of requests that join and leave between steps (in-flight batching).

Shape legend: L layers, B rows in the session, C cache capacity, nkv KV heads, D head size, H hidden.

TensorRT-LLM's batch manager schedules per step: a new request joins the running batch at the next
step, and a request that ends is answered at once, not when the longest one of its batch ends. A
session does the same for the reference engine's plain (non-speculative) decode:

* `add(prompt, params)` takes the prefix-cache sequence sharing the longest prefix with the prompt
  (held by the row until it leaves, so no other request takes it) and prefills the rest of the prompt
  in that row's own pass, which yields its first token; the row then joins the session's batched KV
  cache (one copy of its KV, once per request);
* `step()` runs ONE batched decode pass of one token for every row and returns the rows that ended
  in it (end id, stop tokens, max_tokens, or their stop hook: a cancelled request ends within a
  step); an ended row leaves at once: its KV goes back to its prefix-cache sequence (later requests
  that extend it reuse it) and the batch is compacted.

Every row samples from its own generator (seeded with its params.seed, as a request alone does), so a
row's tokens do not depend on which rows shared its steps (tests: tests/test_decode_session.py).
Not thread-safe: the engine's lock is held around each call (ReferenceEngine.session).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.cached_decode import CachedSequence, PrefixCache
from specbuild.engines.reference.model import KVCache, LlamaModel
from specbuild.engines.reference.sampling import make_generator, probs_from_logits, sample
from specbuild.engines.reference.speculative import StopHook, emit, stop_ids

FIRST_CAPACITY = 256  # slots of a session's first batched cache (it doubles as rows grow)
SHORT_TAIL = 16  # prompt tails up to this many tokens share one prefill pass (a longer one would pad them)


@dataclass
class Row:
    """One request of a session: its prompt, what it produced, and how it ends."""

    prompt: list[int]
    params: SamplingParams
    on_tokens: object = None  # on_tokens(list[int]): the tokens of each step, as they come
    stop: StopHook | None = None
    tokens: list[int] = field(default_factory=list)
    done: bool = False
    cached_prompt_tokens: int = 0  # prompt tokens taken from the prefix cache
    passes: int = 0  # forward passes this row took part in
    seq: CachedSequence | None = None
    generator: torch.Generator | None = None
    stops: frozenset[int] = frozenset()
    last: torch.Tensor | None = None  # [H] hidden state of the row's last fed position


class DecodeSession:
    """Rows of plain decode that join and leave between steps (see the module docstring)."""

    def __init__(self, model: LlamaModel, prefix_cache: PrefixCache):
        self.model, self.prefix_cache = model, prefix_cache
        self.rows: list[Row] = []  # the rows in the batched cache, in its row order
        self.cache: KVCache | None = None  # [L,B,C,nkv,D] the rows' KV
        self.passes = 0  # batched decode passes

    def __len__(self) -> int:
        return len(self.rows)

    @torch.inference_mode()
    def add(self, prompt: list[int], params: SamplingParams, *, on_tokens=None, stop=None) -> Row:
        """Admit a request: prefill it from its prefix-cache sequence and take its first token. A row
        that ends on that token (max_tokens 1, an end id) never joins: check `row.done`."""
        return self.add_many([(prompt, params, on_tokens, stop)])[0]

    @torch.inference_mode()
    def add_many(self, requests: list[tuple]) -> list[Row]:
        """add() for several (prompt, params, on_tokens, stop) at once: their prefills share batched passes
        (short tails, up to SHORT_TAIL tokens, in one; longer ones in another), so the per-token calls of
        concurrent requests (the BLS's draft calls and streamed baseline) cost one pass, not one each."""
        rows = []
        taken: set[int] = set()
        for prompt, params, on_tokens, stop in requests:
            row = Row(list(prompt), params, on_tokens=on_tokens, stop=stop)
            row.generator, row.stops = make_generator(params.seed), stop_ids(params)
            before = self.prefix_cache.reused_tokens
            row.seq = self.prefix_cache.acquire(row.prompt, exclude=frozenset(taken))
            row.cached_prompt_tokens = self.prefix_cache.reused_tokens - before
            self.prefix_cache.hold(row.seq)
            taken.add(id(row.seq))
            rows.append(row)
        tails = {id(r): len(r.prompt) - min(r.seq.common_prefix(r.prompt), len(r.prompt) - 1) for r in rows}
        short = [r for r in rows if tails[id(r)] <= SHORT_TAIL]
        for group in (short, [r for r in rows if tails[id(r)] > SHORT_TAIL]):
            if group:
                self._prefill(group)
        for row in rows:
            row.passes = 1
            self._take(row)
            if row.done:
                self.prefix_cache.release(row.seq)
            else:
                self._join(row)
        return rows

    def _prefill(self, rows: list[Row]) -> None:
        """Feed each row's prompt tail (what its prefix-cache sequence does not hold) in one pass; leave
        the prompt's KV in its sequence and its last hidden state [H] in row.last."""
        if len(rows) == 1:
            rows[0].last = rows[0].seq.feed(rows[0].prompt, 1)[0]  # [H]
            return
        keep = [min(r.seq.common_prefix(r.prompt), len(r.prompt) - 1) for r in rows]
        cache = self.model.new_cache(len(rows), max(len(r.prompt) for r in rows) + 1)
        for i, (row, k) in enumerate(zip(rows, keep, strict=True)):
            cache.k[:, i, :k] = row.seq.cache.k[:, 0, :k]  # [L,keep,nkv,D]
            cache.v[:, i, :k] = row.seq.cache.v[:, 0, :k]
            cache.lengths[i] = k
        tails = [r.prompt[k:] for r, k in zip(rows, keep, strict=True)]
        tokens = torch.zeros(
            len(rows), max(len(t) for t in tails), dtype=torch.long, device=self.model.device
        )
        for i, t in enumerate(tails):
            tokens[i, : len(t)] = torch.tensor(t)  # [B,T] right-padded
        hidden = self.model.forward(tokens, cache, n_new=[len(t) for t in tails])  # [B,T,H]
        for i, (row, k, t) in enumerate(zip(rows, keep, tails, strict=True)):
            n = len(row.prompt)
            seq = row.seq
            seq.cache.reserve(n)
            seq.cache.truncate(0, k)
            seq.cache.k[:, 0, k:n] = cache.k[:, i, k:n]  # the tail's KV
            seq.cache.v[:, 0, k:n] = cache.v[:, i, k:n]
            seq.cache.lengths[0] = n
            seq.tokens = list(row.prompt)
            seq.forward_passes += 1
            row.last = hidden[i, len(t) - 1]  # [H]

    @torch.inference_mode()
    def step(self) -> list[Row]:
        """One decode pass for every row; returns the rows that ended in it (they have left)."""
        if not self.rows:
            return []
        fed = torch.tensor([[r.tokens[-1]] for r in self.rows], device=self.model.device)  # [B,1]
        hidden = self.model.forward(fed, self.cache)[:, 0]  # [B,H]
        self.passes += 1
        for row, h in zip(self.rows, hidden, strict=True):
            row.last, row.passes = h, row.passes + 1
            self._take(row)
        ended = [r for r in self.rows if r.done]
        if ended:
            self._leave(ended)
        return ended

    def close(self) -> list[Row]:
        """End every row where it is (their KV goes back to the prefix cache); returns them."""
        rows = list(self.rows)
        if rows:
            self._leave(rows)
        return rows

    # ---- pieces ---------------------------------------------------------------------------------
    def _take(self, row: Row) -> None:
        """Sample the row's next token from its last hidden state and record it."""
        probs = probs_from_logits(self.model.logits(row.last), row.params)  # [V]
        tok = sample(probs, row.generator)
        taken, row.done = emit(row.tokens, [tok], row.params, row.stops, row.stop)
        if row.on_tokens is not None and taken:
            row.on_tokens(taken)

    def _join(self, row: Row) -> None:
        """Copy the row's KV (its prompt) into a new row of the batched cache."""
        n = row.seq.cache.lengths[0]  # the prompt (its last token's KV included)
        if self.cache is not None:
            self.cache.reserve(n + 1)
        cap = self.cache.capacity if self.cache is not None else max(n + 1, FIRST_CAPACITY)
        one = self.model.new_cache(1, cap)
        one.k[:, 0, :n] = row.seq.cache.k[:, 0, :n]  # [L,n,nkv,D]
        one.v[:, 0, :n] = row.seq.cache.v[:, 0, :n]
        one.lengths[0] = n
        if self.cache is None:
            self.cache = one
        else:
            self.cache.k = torch.cat([self.cache.k, one.k], 1)  # [L,B+1,C,nkv,D]
            self.cache.v = torch.cat([self.cache.v, one.v], 1)
            self.cache.lengths.append(n)
        self.rows.append(row)

    def _leave(self, ended: list[Row]) -> None:
        gone = {id(r) for r in ended}
        for i, row in enumerate(self.rows):
            if id(row) not in gone:
                continue
            held = (row.prompt + row.tokens)[: self.cache.lengths[i]]  # the last token was never fed
            seq = row.seq
            seq.cache.reserve(len(held))
            seq.cache.k[:, 0, : len(held)] = self.cache.k[:, i, : len(held)]
            seq.cache.v[:, 0, : len(held)] = self.cache.v[:, i, : len(held)]
            seq.cache.lengths[0] = len(held)
            seq.tokens = held
            self.prefix_cache.release(seq)
        keep = [i for i, r in enumerate(self.rows) if id(r) not in gone]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache = None
            return
        index = torch.tensor(keep, device=self.model.device)
        lengths = [self.cache.lengths[i] for i in keep]
        self.cache.k = self.cache.k.index_select(1, index)  # [L,B',C,nkv,D]
        self.cache.v = self.cache.v.index_select(1, index)
        self.cache.lengths = lengths
