"""The n-gram drafter (engines/reference/ngram.py) behaves as TensorRT-LLM 1.2's NGramPoolManager
(`_torch/speculative/ngram.py` @ c4dc529f): worked examples of each rule, plus specbuild's bounds."""

from __future__ import annotations

import pytest

from specbuild.engines.reference.ngram import NGramConfig, NGramRequest, PatternPool, add_match


def request(k=3, n=2, *, keep_all=True, oldest=True, public=None, **pool):
    config = NGramConfig(n, keep_all, oldest, public is not None)
    return NGramRequest(config, k, public)


def test_longest_suffix_first_and_the_oldest_continuation():
    r = request(k=3, n=2)
    # suffix (1, 2) occurs at 0 followed by 3 7 1; (2,) alone would also match at 4 (followed by 8)
    assert r.propose([1, 2, 3, 7, 1, 2, 8, 9, 1, 2], 3) == [3, 7, 1]
    assert request(k=3, n=2, oldest=False).propose([1, 2, 3, 7, 1, 2, 8, 9, 1, 2], 3) == [8, 9, 1]


def test_draft_is_cut_to_this_rounds_k_and_k_bounds_what_is_stored():
    assert request(k=3).propose([1, 2, 3, 4, 5, 1, 2], 2) == [3, 4]
    assert request(k=2).propose([1, 2, 3, 4, 5, 1, 2], 5) == [3, 4]  # continuations hold at most K tokens


def test_no_match_drafts_nothing():
    r = request()
    assert r.propose([1, 2, 3, 4], 3) == []
    assert r.propose([5], 3) == []  # one token: no pattern with a following token
    assert (r.lookups, r.hits) == (2, 0)
    assert request().propose([1, 2, 1], 0) == []  # no room this round


def test_shorter_patterns_are_tried_after_longer_ones():
    r = request(k=2, n=3)
    assert r.propose([4, 5, 6, 9, 6], 2) == [9, 6]  # (9, 6), (6,) -> only (6,) was seen, followed by 9 6


def test_truncated_continuations_are_extended_by_the_rescan():
    r = request(k=3, n=1)
    assert r.propose([1, 2, 3], 3) == []  # (3,) never seen with a follower
    # the next update starts K + N - 1 = 3 tokens before the end, so (2,) -> (3,) is seen again with
    # more tokens after it: the longer continuation replaces the truncated one
    assert r.propose([1, 2, 3, 9, 2], 3) == [3, 9, 2]


def test_keep_all_false_replaces_only_with_a_longer_continuation():
    # upstream's rule, quirk included: an equally long new continuation is appended even with keep_all off
    assert add_match({(2, 3): None}, (4, 5), keep_all=False, use_oldest=True, max_matches=8) == {
        (2, 3): None,
        (4, 5): None,
    }
    assert add_match({(2,): None, (5,): None}, (4, 5), keep_all=False, use_oldest=True, max_matches=8) == {
        (4, 5): None
    }
    assert add_match({(2, 3): None}, (2, 3), keep_all=True, use_oldest=True, max_matches=8) is None


def test_dropping_shorter_continuations_skips_the_one_after_each_drop():
    # upstream removes from the ordered set while iterating it: (2,) is dropped, (3,) skipped and kept
    got = add_match(
        {(1, 1): None, (2,): None, (3,): None}, (4, 4), keep_all=True, use_oldest=True, max_matches=8
    )
    assert list(got) == [(1, 1), (3,), (4, 4)]


def test_private_pools_are_per_request_and_the_public_pool_is_shared():
    seen = [7, 8, 9, 7]
    assert request(k=2, n=1).propose([1, 7], 2) == []  # private: nothing from other requests
    shared = PatternPool()
    request(k=2, n=1, public=shared).propose(seen, 2)
    assert request(k=2, n=1, public=shared).propose([1, 7], 2) == [8, 9]


def test_pool_bounds():
    pool = PatternPool(max_patterns=2)
    pool.put((1,), {(2,): None})
    pool.put((3,), {(4,): None})
    assert pool.get((1,)) is not None  # used: (3,) is now the least recently used
    pool.put((5,), {(6,): None})
    assert pool.get((3,)) is None and len(pool) == 2
    full = {(1,): None, (2,): None}
    assert list(add_match(dict(full), (3,), keep_all=True, use_oldest=True, max_matches=2)) == [(1,), (2,)]
    assert list(add_match(dict(full), (3,), keep_all=True, use_oldest=False, max_matches=2)) == [(2,), (3,)]
    with pytest.raises(ValueError):
        PatternPool(max_patterns=0)


def test_config_of_a_section_or_a_dict():
    assert NGramConfig.of(None) == NGramConfig(2, True, True, True)
    assert NGramConfig.of({"max_matching_ngram_size": 4, "is_public_pool": False}) == NGramConfig(
        4, True, True, False
    )
    with pytest.raises(ValueError):
        NGramConfig(0)
