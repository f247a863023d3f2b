"""The speedup theory of speculative decoding: one definition of each quantity, pure functions.

A round drafts K tokens; the target verifies them in one pass and adds one token of its own
(Leviathan et al. 2023, Chen et al. 2023). Per draft position i = 1..K of a round:

* acceptance rate = accepted / drafted: TensorRT-LLM's `acceptance_rate` (what the backend reports).
  It undercounts the per-token acceptance for K > 1: position i is only *tested* when 1..i-1 were
  accepted.
* conditional acceptance a_i = accepted_i / reached_i, reached_i = drafted_1 for i = 1, else
  min(accepted_{i-1}, drafted_i) (near the end of a request fewer positions are drafted).
* alpha = sum_i accepted_i / sum_i reached_i: the per-token acceptance of the i.i.d. model, the
  maximum-likelihood estimate of a geometric acceptance length.
* tokens per target pass with K drafts: E(K) = 1 + sum_{k<=K} prod_{i<=k} a_i (per position);
  with one alpha, E(K) = (1 - alpha^(K+1)) / (1 - alpha) (i.i.d.).
* speedup over the target alone with cost ratio c = draft pass / target pass: S = E / (K c + 1).

Both benchmarks (`specbuild bench` through Triton, `make bench-reference` in-process) and `tune`
use these functions, so the same measurements give the same predicted speedup everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence


def acceptance_rate(accepted: int, drafted: int) -> float:
    """accepted / drafted (0 when nothing was drafted)."""
    return accepted / drafted if drafted else 0.0


def reached_per_position(
    accepted_per_position: Sequence[int], drafted_per_position: Sequence[int]
) -> list[int]:
    """How often each draft position was tested (see the module docstring)."""
    return [d if i == 0 else min(accepted_per_position[i - 1], d) for i, d in enumerate(drafted_per_position)]


def conditional_acceptance(
    accepted_per_position: Sequence[int], drafted_per_position: Sequence[int]
) -> list[float]:
    """[K]: a_i = P(draft position i accepted | the earlier ones were)."""
    reached = reached_per_position(accepted_per_position, drafted_per_position)
    return [a / r if r else 0.0 for a, r in zip(accepted_per_position, reached, strict=True)]


def alpha(accepted_per_position: Sequence[int], drafted_per_position: Sequence[int]) -> float:
    """Per-token acceptance of the i.i.d. model: accepted / positions actually tested."""
    tested = sum(reached_per_position(accepted_per_position, drafted_per_position))
    return sum(accepted_per_position) / tested if tested else 0.0


def positions_from_rounds(rounds: Sequence[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """(accepted_per_position, drafted_per_position) from (accepted, drafted) of each round."""
    depth = max((d for _, d in rounds), default=0)
    accepted, drafted = [0] * depth, [0] * depth
    for n_accepted, n_drafted in rounds:
        for i in range(n_drafted):
            drafted[i] += 1
            accepted[i] += i < n_accepted
    return accepted, drafted


def rounds_from_steps(accepted_per_step: Sequence[int], k: int, max_tokens: int) -> list[tuple[int, int]]:
    """(accepted, drafted) of each round of one request from its accepted drafts per round, when the
    loop drafted min(K, tokens still allowed - 1) each round (engines/reference/speculative.py)."""
    rounds, produced = [], 0
    for n in accepted_per_step:
        drafted = max(0, min(k, max_tokens - produced - 1))
        rounds.append((min(n, drafted), drafted))
        produced += n + 1
    return rounds


def tokens_per_pass_iid(alpha: float, k: int) -> float:
    """(1 - alpha^(K+1)) / (1 - alpha); K + 1 when alpha == 1."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def tokens_per_pass_chain(acceptance: Sequence[float], k: int) -> float:
    """1 + sum_{j<=K} prod_{i<=j} a_i. Positions past the measured ones reuse the last measured rate."""
    if k > 0 and not acceptance:
        raise ValueError("tokens_per_pass_chain: no acceptance rates for K > 0")
    total, survive = 1.0, 1.0
    for j in range(k):
        survive *= acceptance[min(j, len(acceptance) - 1)]
        total += survive
    return total


def speedup(tokens_per_pass: float, k: int, cost_ratio: float) -> float:
    """Wall-time factor over the target alone: E / (K c + 1)."""
    return tokens_per_pass / (k * cost_ratio + 1.0)


def predicted_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """The i.i.d. prediction: (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1))."""
    return speedup(tokens_per_pass_iid(alpha, k), k, cost_ratio)
