"""The n-gram (prompt lookup) drafter: TensorRT-LLM 1.2's pattern -> continuations pool, re-implemented.

Upstream: `tensorrt_llm/_torch/speculative/ngram.py`, `NGramPoolManager.get_draft_tokens` @ c4dc529f
(the same algorithm, with `max_total_draft_tokens` for K, in the later 1.2-line file that adds the
one-model worker). For each request, every round, with the whole sequence so far (prompt + accepted):

1. update: every pattern of `size` = N'..1 tokens (N' = min(N, len - 1)) in the not yet scanned tail
   that has at least one token after it maps to the (up to K) tokens that followed it. A new pattern
   gets that one continuation. Otherwise, when `is_keep_all` is false and the new continuation is longer
   than the first stored one, it replaces them all; else, when it is not stored yet, the stored ones
   shorter than it are dropped (upstream iterates the set while removing, so the one after each
   dropped continuation is skipped and kept: reproduced here) and it is appended (newest last);
2. lookup: the longest suffix of the sequence (N'..1 tokens) that is a pattern gives the draft: its
   oldest continuation (`is_use_oldest`) or its newest, cut to this round's k. No pattern: no draft
   (the round is a plain decode step, never padding);
3. the next update starts K + N - 1 tokens before the end (continuations cut short by the end of
   the sequence are re-scanned and so extended).

`is_public_pool`: one pool for every request (`PatternPool` shared by the caller), else one per
request (`NGramRequest` owns it; it is gone with the request). Differences from upstream, on purpose
(docs/ngram.md): pools are bounded (upstream's public pool grows forever): at most `max_patterns`
patterns (the least recently used go first) and `max_matches` continuations per pattern (when full,
with is_use_oldest the new one is not added, else the oldest is dropped, so a lookup answers as
upstream's would).

Pure Python (no torch, no numpy): vendored as-is into the production Triton BLS (model_repo
VENDORED_MODULES), used by the reference engine's n-gram speculator and by `specbuild tune`.
Shape legend: L tokens so far, N max_matching_ngram_size, K max_draft_len.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol

Pattern = tuple[int, ...]
Matches = dict[Pattern, None]  # an ordered set of continuations: oldest first, newest last

DEFAULT_MAX_PATTERNS = 1 << 16  # per pool; ~30 MB of Python objects at N 2, K 5
DEFAULT_MAX_MATCHES = 32  # continuations per pattern


@dataclass(frozen=True)
class NGramConfig:
    """NGramDecodingConfig's fields (the spec's `ngram:` section); K comes per request."""

    max_matching_ngram_size: int = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    def __post_init__(self) -> None:
        if self.max_matching_ngram_size < 1:
            raise ValueError(f"max_matching_ngram_size must be >= 1, got {self.max_matching_ngram_size}")

    @classmethod
    def of(cls, section: object) -> NGramConfig:
        """From the spec's NGramSection, a dict of its keys, or None (upstream's defaults)."""
        if section is None:
            return cls()
        if isinstance(section, dict):
            return cls(**{k: section[k] for k in cls.__dataclass_fields__ if k in section})
        return cls(**{k: getattr(section, k) for k in cls.__dataclass_fields__})


class PatternStore(Protocol):
    """Where patterns live: `PatternPool` in memory, or a store shared by processes (the BLS's)."""

    def get(self, pattern: Pattern) -> Matches | None: ...

    def put(self, pattern: Pattern, matches: Matches) -> None: ...

    def session(self):  # a context manager: one round's reads and writes, atomic for shared stores
        ...


class PatternPool:
    """An in-memory pool, bounded: an LRU of at most `max_patterns` patterns."""

    def __init__(self, *, max_patterns: int = DEFAULT_MAX_PATTERNS, max_matches: int = DEFAULT_MAX_MATCHES):
        if max_patterns < 1 or max_matches < 1:
            raise ValueError("a pool holds at least one pattern and one continuation per pattern")
        self.max_patterns, self.max_matches = max_patterns, max_matches
        self._items: OrderedDict[Pattern, Matches] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, pattern: Pattern) -> Matches | None:
        matches = self._items.get(pattern)
        if matches is not None:
            self._items.move_to_end(pattern)
        return matches

    def put(self, pattern: Pattern, matches: Matches) -> None:
        self._items[pattern] = matches
        self._items.move_to_end(pattern)
        while len(self._items) > self.max_patterns:
            self._items.popitem(last=False)  # least recently used

    @contextmanager
    def session(self) -> Iterator[PatternPool]:
        yield self


def add_match(
    matches: Matches | None, new: Pattern, *, keep_all: bool, use_oldest: bool, max_matches: int
) -> Matches | None:
    """Upstream's update of one pattern's continuations with `new`; returns the continuations to store,
    or None when nothing changed. `matches` may be changed in place."""
    if matches is None or (not keep_all and len(new) > len(next(iter(matches)))):
        return {new: None}
    if new in matches:
        return None
    skip = False  # upstream removes from the list it iterates: the element after a removed one is skipped
    for old in list(matches):
        if skip:
            skip = False
            continue
        if len(old) < len(new):
            del matches[old]
            skip = True
    if len(matches) >= max_matches:
        if use_oldest:
            return matches  # the oldest stay what a lookup returns; the new one is not kept
        del matches[next(iter(matches))]
    matches[new] = None
    return matches


class NGramRequest:
    """One request's drafter state: where its next pool update starts, and its private pool."""

    def __init__(self, config: NGramConfig, max_draft_len: int, public: PatternStore | None = None):
        if max_draft_len < 0:
            raise ValueError(f"max_draft_len must be >= 0 (0: never draft), got {max_draft_len}")
        if config.is_public_pool and public is None:
            raise ValueError("is_public_pool needs the shared pool")
        self.config, self.k = config, max_draft_len
        self.pool: PatternStore = public if config.is_public_pool else PatternPool()
        self.start = 0  # upstream's start_index
        self.lookups = self.hits = 0

    def propose(self, ids: list[int], k: int) -> list[int]:
        """Up to k draft tokens after `ids` (prompt + accepted so far); [] without a match or room."""
        if k < 1 or self.k < 1:  # upstream: no room for drafts -> [] before touching the pool
            return []
        with self.pool.session() as pool:
            self._update(pool, ids)
            draft = self._lookup(pool, ids, k)
        self.start = max(0, len(ids) - (self.k + self.config.max_matching_ngram_size - 1))
        self.lookups += 1
        self.hits += bool(draft)
        return draft

    def privately(self) -> NGramRequest:
        """This request with a pool of its own from now on (the shared one could not be used): empty, so
        its next round scans the whole sequence again; the counts carry on."""
        own = NGramRequest(replace(self.config, is_public_pool=False), self.k)
        own.lookups, own.hits = self.lookups, self.hits
        return own

    def _sizes(self, length: int) -> range:
        return range(min(self.config.max_matching_ngram_size, length - 1), 0, -1)

    def _update(self, pool: PatternStore, ids: list[int]) -> None:
        seq = ids[self.start :]
        cfg, max_matches = self.config, getattr(pool, "max_matches", DEFAULT_MAX_MATCHES)
        for size in self._sizes(len(ids)):
            for left in range(len(seq) - size):
                pattern = tuple(seq[left : left + size])
                new = tuple(seq[left + size : min(left + size + self.k, len(seq))])
                stored = add_match(
                    pool.get(pattern),
                    new,
                    keep_all=cfg.is_keep_all,
                    use_oldest=cfg.is_use_oldest,
                    max_matches=max_matches,
                )
                if stored is not None:
                    pool.put(pattern, stored)

    def _lookup(self, pool: PatternStore, ids: list[int], k: int) -> list[int]:
        for size in self._sizes(len(ids)):
            matches = pool.get(tuple(ids[-size:]))
            if matches:
                match = next(iter(matches)) if self.config.is_use_oldest else next(reversed(matches))
                return list(match[:k])
        return []
