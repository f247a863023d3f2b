"""What `tune` chooses, from measured acceptance: pure functions on plain numbers (no torch, no models).

Draft/target: the K with the best predicted speedup E(K) / (K*c + 1), E(K) from the per-position
conditional acceptance (the definitions are core/perf/theory.py's).

Medusa trees (Cai et al. 2024): depth_probs[d][i] = P(rank-i candidate of head d is the true token |
the path above it is right). A node (i_0, ..., i_d) is accepted with prob prod_j depth_probs[j][i_j];
tokens per pass = 1 + sum over nodes. Greedy growth by path probability picks the best tree for a
node budget: a child never beats its parent, so the top-N nodes are prefix-closed by construction.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from specbuild.core.formats.medusa_choices import MedusaChoices
from specbuild.core.formats.speculation_profile import SpeculationProfile
from specbuild.core.perf.theory import speedup, tokens_per_pass_chain

# ---- draft/target: K from the per-position acceptance (core/perf/theory.py) ------------------------


@dataclass(frozen=True)
class KChoice:
    k: int
    tokens_per_pass: float
    speedup: float


def k_table(acceptance: Sequence[float], cost_ratio: float, k_max: int) -> list[KChoice]:
    """Predicted tokens per pass and speedup for K = 1..k_max."""
    rows = []
    for k in range(1, k_max + 1):
        e = tokens_per_pass_chain(acceptance, k)
        rows.append(KChoice(k=k, tokens_per_pass=e, speedup=speedup(e, k, cost_ratio)))
    return rows


def choose_k(acceptance: Sequence[float], cost_ratio: float, k_max: int) -> KChoice:
    """The K in 1..k_max with the highest predicted speedup (the smaller K on a tie)."""
    return max(k_table(acceptance, cost_ratio, k_max), key=lambda r: (round(r.speedup, 12), -r.k))


def choose_k_from_profile(
    profile: SpeculationProfile, cost_ratio: float, k_max: int | None = None
) -> KChoice:
    """The K a speculation profile measured elsewhere supports best: within its measured positions (rates
    past them would be extrapolated from the last one), at most its max_supported_k and k_max. `tune
    --profile` and `plan --profile` both choose with this."""
    limit = min(profile.num_speculative_tokens, profile.max_supported_k)
    if k_max:
        limit = min(limit, k_max)
    return choose_k(profile.acceptance, cost_ratio, limit)


# ---- Medusa trees --------------------------------------------------------------------------------


def path_probability(path: Sequence[int], depth_probs: Sequence[Sequence[float]]) -> float:
    p = 1.0
    for depth, rank in enumerate(path):
        if depth >= len(depth_probs) or rank >= len(depth_probs[depth]):
            return 0.0
        p *= depth_probs[depth][rank]
    return p


def tree_tokens_per_pass(choices: MedusaChoices, depth_probs: Sequence[Sequence[float]]) -> float:
    """Expected tokens per pass of a tree: the root token plus each node's path probability."""
    return 1.0 + sum(path_probability(p, depth_probs) for p in choices.paths)


def grow_tree_from_ranks(
    ranks: Sequence[Sequence[int]], *, topk: int, budget: int, num_heads: int, prior_weight: float = 1e-3
) -> MedusaChoices:
    """Greedy growth on the measured joint path probability (the fraction of positions whose ranks start
    with the path), plus `prior_weight` times the factorised one from conditional_depth_probs so that
    paths never seen still rank sensibly. Both terms shrink from parent to child, so the top nodes are
    prefix-closed. Unlike the factorised model, this keeps the correlation between heads.
    """
    counts: Counter[tuple[int, ...]] = Counter()
    for r in ranks:
        for d in range(1, min(len(r), num_heads) + 1):
            if r[d - 1] >= topk:
                break
            counts[tuple(r[:d])] += 1
    n = max(1, len(ranks))
    probs = conditional_depth_probs(ranks, topk=topk)
    factored = grow_tree(
        probs, budget=budget * 4, num_heads=num_heads
    ).paths  # candidates beyond the seen ones
    candidates = set(counts) | set(factored)
    score = {p: counts[p] / n + prior_weight * path_probability(p, probs) for p in candidates}
    ordered = sorted(candidates, key=lambda p: (-score[p], len(p), p))
    chosen: list[tuple[int, ...]] = []
    taken: set[tuple[int, ...]] = set()
    for p in ordered:
        if len(chosen) >= budget:
            break
        if score[p] > 0 and (len(p) == 1 or p[:-1] in taken):
            chosen.append(p)
            taken.add(p)
    return MedusaChoices(tuple(chosen))


def grow_tree(
    depth_probs: Sequence[Sequence[float]], *, budget: int, num_heads: int | None = None
) -> MedusaChoices:
    """The tree of at most `budget` nodes (depth <= num_heads) with the largest expected length.

    Greedy growth: keep a frontier of children of chosen nodes, always take the most probable one.
    Nodes of probability 0 are never added, so the tree may be smaller than the budget.
    """
    depth_max = min(len(depth_probs), num_heads if num_heads is not None else len(depth_probs))
    frontier: list[tuple[float, int, tuple[int, ...]]] = []  # (-prob, depth, path): shallow first on ties

    def push_children(path: tuple[int, ...], prob: float) -> None:
        d = len(path)
        if d >= depth_max:
            return
        for rank, p in enumerate(depth_probs[d]):
            if prob * p > 0.0:
                heapq.heappush(frontier, (-prob * p, d + 1, path + (rank,)))

    push_children((), 1.0)
    chosen: list[tuple[int, ...]] = []
    while frontier and len(chosen) < budget:
        neg, _, path = heapq.heappop(frontier)
        chosen.append(path)
        push_children(path, -neg)
    return MedusaChoices(tuple(chosen))


# ---- from measured ranks -------------------------------------------------------------------------


def conditional_depth_probs(ranks: Sequence[Sequence[int]], *, topk: int) -> list[list[float]]:
    """depth_probs from samples: ranks[n][d] = rank of the true token in head d's list (>= topk: absent).

    depth_probs[d][i] = #(rank_d == i and every earlier rank < topk) / #(every earlier rank < topk):
    head d's top-k accuracy, conditional on the path being right so far.
    """
    depth = max((len(r) for r in ranks), default=0)
    probs = []
    for d in range(depth):
        alive = [r for r in ranks if len(r) > d and all(x < topk for x in r[:d])]
        counts = [0] * topk
        for r in alive:
            if r[d] < topk:
                counts[r[d]] += 1
        probs.append([c / len(alive) if alive else 0.0 for c in counts])
    return probs


def accepted_lengths(choices: MedusaChoices, ranks: Sequence[Sequence[int]]) -> list[int]:
    """Tokens each sample would emit in one greedy tree pass: 1 + the longest tree path matching it."""
    nodes = set(choices.paths)
    out = []
    for r in ranks:
        n = 0
        while n < len(r) and tuple(r[: n + 1]) in nodes:
            n += 1
        out.append(1 + n)
    return out
