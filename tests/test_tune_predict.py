"""The pure speculation math of `tune`, on hand-built numbers."""

from __future__ import annotations

import itertools

import pytest

from specbuild.core.formats.medusa_choices import MedusaChoices
from specbuild.core.perf.theory import speedup as predicted_speedup
from specbuild.core.perf.theory import tokens_per_pass_chain as chain_tokens_per_pass
from specbuild.core.perf.theory import tokens_per_pass_iid as iid_tokens_per_pass
from specbuild.tuning.predict import (
    accepted_lengths,
    choose_k,
    conditional_depth_probs,
    grow_tree,
    k_table,
    tree_tokens_per_pass,
)


def test_iid_formula_matches_the_landscape_table():
    # landscape.md §1 worked values: alpha 0.8, gamma 4 -> 3.36 tokens/step, speedup 2.80 at c=0.05.
    e = iid_tokens_per_pass(0.8, 4)
    assert e == pytest.approx(
        1 + 0.8 + 0.64 + 0.512 + 0.4096
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert round(e, 2) == 3.36
    assert round(predicted_speedup(e, 4, 0.05), 2) == 2.80
    assert round(predicted_speedup(iid_tokens_per_pass(0.9, 8), 8, 0.2), 2) == 2.36
    assert iid_tokens_per_pass(1.0, 5) == 6.0


def test_chain_with_constant_acceptance_equals_the_iid_formula():
    for alpha in (0.3, 0.7, 0.95):
        for k in (1, 3, 8):
            assert chain_tokens_per_pass([alpha] * k, k) == pytest.approx(
                iid_tokens_per_pass(alpha, k)
            )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound


def test_chain_uses_per_position_rates():
    acc = [0.9, 0.5, 0.1]
    assert chain_tokens_per_pass(acc, 0) == 1.0
    assert chain_tokens_per_pass(acc, 1) == pytest.approx(
        1.9
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    assert chain_tokens_per_pass(acc, 2) == pytest.approx(1 + 0.9 + 0.45)  # float64, as above
    assert chain_tokens_per_pass(acc, 3) == pytest.approx(1 + 0.9 + 0.45 + 0.045)  # float64, as above
    # past the measured positions the last rate is reused
    assert chain_tokens_per_pass(acc, 4) == pytest.approx(
        1 + 0.9 + 0.45 + 0.045 + 0.0045
    )  # float64, as above


@pytest.mark.parametrize(
    ("alpha", "c", "best"), [(0.7, 0.02, 8), (0.7, 0.2, 3), (0.8, 0.05, 8), (0.8, 0.1, 6), (0.9, 0.2, 7)]
)
def test_choose_k_matches_brute_force_values(alpha, c, best):
    # landscape.md §1: "alpha=0.7 -> gamma 8/6/4/3 for c=0.02/0.05/0.1/0.2; alpha=0.8 -> 11/8/6/4" (K in
    # 1..30)
    assert choose_k([alpha], c, 30).k == best


def test_choose_k_with_falling_acceptance_stops_early():
    # first draft is easy, later ones almost never accepted: K = 1 wins at c = 0.3
    rows = k_table([0.9, 0.1, 0.1], 0.3, 3)
    assert [round(r.speedup, 3) for r in rows] == [
        round(1.9 / 1.3, 3),
        round(1.99 / 1.6, 3),
        round(1.999 / 1.9, 3),
    ]
    assert choose_k([0.9, 0.1, 0.1], 0.3, 3).k == 1


def _brute_force_best(depth_probs, budget, num_heads):
    """Best expected length over every prefix-closed tree of <= budget nodes (small cases only)."""
    universe = [
        p
        for d in range(1, num_heads + 1)
        for p in itertools.product(*(range(len(depth_probs[i])) for i in range(d)))
    ]
    best = 1.0
    for n in range(1, budget + 1):
        for nodes in itertools.combinations(universe, n):
            tree = MedusaChoices(tuple(nodes))
            if not tree.problems():
                best = max(best, tree_tokens_per_pass(tree, depth_probs))
    return best


def test_grow_tree_hand_built():
    probs = [[0.6, 0.3, 0.1], [0.5, 0.2]]
    tree = grow_tree(probs, budget=3, num_heads=2)
    assert tree.to_lists() == [[0], [1], [0, 0]]  # 0.6, then the 0.3 tie resolved shallow-first
    assert tree_tokens_per_pass(tree, probs) == pytest.approx(
        1 + 0.6 + 0.3 + 0.3
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    tree5 = grow_tree(probs, budget=5, num_heads=2)
    assert tree5.to_lists() == [[0], [1], [0, 0], [1, 0], [0, 1]]
    assert tree_tokens_per_pass(tree5, probs) == pytest.approx(
        2.2 + 0.15 + 0.12
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    # depth is capped by the number of heads
    assert grow_tree(probs, budget=10, num_heads=1).to_lists() == [[0], [1], [2]]


@pytest.mark.parametrize("budget", [1, 2, 4, 5])
def test_grow_tree_is_optimal_and_valid(budget):
    probs = [[0.5, 0.25, 0.1], [0.7, 0.1], [0.4, 0.3]]
    tree = grow_tree(probs, budget=budget, num_heads=3)
    assert tree.problems(num_heads=3, max_draft_len=budget) == []
    assert tree.size == budget
    assert tree_tokens_per_pass(tree, probs) == pytest.approx(
        _brute_force_best(probs, budget, 3)
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound


def test_grow_tree_skips_impossible_nodes():
    tree = grow_tree([[1.0, 0.0], [0.0, 0.0]], budget=8, num_heads=2)
    assert tree.to_lists() == [[0]]


def test_conditional_depth_probs_and_accepted_lengths():
    # four positions, two heads, top-2; rank 2 means "not in the top 2"
    ranks = [[0, 0], [0, 1], [1, 2], [2, 0]]
    probs = conditional_depth_probs(ranks, topk=2)
    assert probs[0] == [0.5, 0.25]  # over all four
    # head 1 counted only where head 0 was in its top 2 (first three rows): ranks 0, 1, 2
    assert probs[1] == pytest.approx(
        [1 / 3, 1 / 3]
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    chain = MedusaChoices.parse("chain_2")
    assert accepted_lengths(chain, ranks) == [3, 2, 1, 1]
    tree = MedusaChoices.parse([[0], [1], [0, 0], [0, 1], [1, 0]])
    assert accepted_lengths(tree, ranks) == [3, 3, 2, 1]


def test_grow_tree_from_ranks_keeps_head_correlation():
    from specbuild.tuning.predict import grow_tree_from_ranks

    # head 1 is right exactly when head 0 is (correlated); the factorised model cannot see that
    ranks = [[0, 0]] * 6 + [[1, 3]] * 3 + [[2, 3]]
    tree = grow_tree_from_ranks(ranks, topk=3, budget=3, num_heads=2)
    assert tree.problems(num_heads=2, max_draft_len=3) == []
    assert tree.to_lists() == [[0], [0, 0], [1]]
    assert sum(accepted_lengths(tree, ranks)) / len(ranks) == pytest.approx(
        1 + 0.6 + 0.6 + 0.3
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    # never larger than the budget, always prefix-closed
    big = grow_tree_from_ranks(ranks, topk=3, budget=10, num_heads=2)
    assert big.size <= 10 and big.problems(num_heads=2) == []


def test_ngram_verify_costs_are_made_non_decreasing():
    from specbuild.tuning.tune_ngram import non_decreasing

    assert non_decreasing([1.0, 1.2, 1.5, 1.4, 2.0]) == pytest.approx([1.0, 1.2, 1.45, 1.45, 2.0])
    assert non_decreasing([1.0, 3.0, 1.0, 1.0]) == pytest.approx([1.0, 5 / 3, 5 / 3, 5 / 3])
    assert non_decreasing([1.0, 2.0]) == [1.0, 2.0]


def test_n_max_is_for_ngram_specs(tmp_path):
    from specbuild.core.errors import TrainingError
    from specbuild.core.spec import spec_from_dict
    from specbuild.tuning.tune_options import TuneOptions

    dt = spec_from_dict(
        {"name": "t", "mode": "draft_target", "target": {"model": "t"}, "draft": {"model": "d"}}
    )
    with pytest.raises(TrainingError, match="--n-max is for n-gram specs"):
        TuneOptions(prompts=tmp_path / "p.txt", n_max=3).validate(dt)
    ngram = spec_from_dict({"name": "t", "mode": "ngram", "target": {"model": "t"}})
    TuneOptions(prompts=tmp_path / "p.txt", n_max=3).validate(ngram)
    with pytest.raises(TrainingError, match="out of range"):
        TuneOptions(prompts=tmp_path / "p.txt", n_max=0).validate(ngram)
