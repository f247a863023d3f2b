"""The one loop over plain-Python Drafter/Verifier (what the BLS implements), and Medusa tree acceptance.

The loop must never emit past max_tokens, stop at stop tokens, report passes from the protocol
counters; walk_tree must be lossless at T > 0 (chi-square on a hand-built tree) and greedy at T = 0.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specbuild.core.sampling_params import SamplingParams  # noqa: E402
from specbuild.engines.reference.speculative import Drafter, Verifier, speculative_generate  # noqa: E402

pytestmark = (
    pytest.mark.numeric
)  # float results through CPU kernels: `make test-isa` runs them per kernel family

TRUTH = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]  # the "target" continuation


class ScriptedDrafter:
    """Proposes the truth, but gets every third position wrong. No torch at the boundary."""

    def __init__(self, prompt_len):
        self.prompt_len, self.forward_passes = prompt_len, 0

    def propose(self, ids, k, params):
        self.forward_passes += k
        pos = len(ids) - self.prompt_len
        return [TRUTH[pos + i] if (pos + i) % 3 else 99 for i in range(k)], None


class ScriptedVerifier:
    def __init__(self, prompt_len):
        self.prompt_len, self.forward_passes = prompt_len, 0

    def verify(self, ids, draft_tokens, draft_probs, params):
        self.forward_passes += 1
        pos = len(ids) - self.prompt_len
        out = []
        for i, tok in enumerate(draft_tokens):
            if tok != TRUTH[pos + i]:
                break
            out.append(tok)
        return out + [TRUTH[pos + len(out)]]


@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("max_tokens", [1, 2, 7, 16])
def test_loop_never_passes_max_tokens(k, max_tokens):
    d, v = ScriptedDrafter(2), ScriptedVerifier(2)
    assert isinstance(d, Drafter) and isinstance(v, Verifier)
    streamed = []
    ids, stats = speculative_generate(
        d, v, [1, 2], SamplingParams(max_tokens=max_tokens), num_draft_tokens=k, on_tokens=streamed.extend
    )
    assert ids == TRUTH[:max_tokens] and streamed == ids
    assert stats.target_passes == v.forward_passes and stats.draft_passes == d.forward_passes
    assert stats.accepted + len(stats.accepted_per_step) <= max_tokens


def test_stop_hook_cuts_at_a_multi_token_word_with_the_rounds_statistics():
    """The hook sees each round's output; cutting ends the loop there, and the stats are those of the
    rounds that ran (no exception, nothing rebuilt)."""
    word = [13, 14, 15]
    seen = []

    def stop(out, start):
        seen.append((len(out), start))
        for end in range(start + 1, len(out) + 1):
            if out[max(0, end - len(word)) : end] == word:
                return end
        return None

    d, v = ScriptedDrafter(1), ScriptedVerifier(1)
    streamed = []
    ids, stats = speculative_generate(
        d, v, [1], SamplingParams(max_tokens=16), num_draft_tokens=4, on_tokens=streamed.extend, stop=stop
    )
    assert ids == TRUTH[: TRUTH.index(15) + 1] and streamed == ids
    assert stats.target_passes == v.forward_passes == len(seen) and stats.draft_passes == d.forward_passes
    assert len(stats.accepted_per_step) == len(seen) and stats.accepted + len(seen) >= len(ids)


def test_stop_hook_ends_a_cancelled_request_within_one_round():
    rounds = []

    def cancelled_after_two(out, start):
        rounds.append(len(out))
        return len(out) if len(rounds) == 2 else None

    d, v = ScriptedDrafter(1), ScriptedVerifier(1)
    ids, stats = speculative_generate(
        d, v, [1], SamplingParams(max_tokens=16), num_draft_tokens=4, stop=cancelled_after_two
    )
    assert len(rounds) == 2 and v.forward_passes == 2 and len(ids) == rounds[-1] and ids == TRUTH[: len(ids)]


def test_loop_stops_at_stop_token_and_end_id():
    ids, _ = speculative_generate(
        ScriptedDrafter(1),
        ScriptedVerifier(1),
        [1],
        SamplingParams(max_tokens=16, stop_token_ids=(14,)),
        num_draft_tokens=4,
    )
    assert ids == TRUTH[: TRUTH.index(14) + 1]
    ids, _ = speculative_generate(
        ScriptedDrafter(1),
        ScriptedVerifier(1),
        [1],
        SamplingParams(max_tokens=16, end_id=12),
        num_draft_tokens=8,
    )
    assert ids == [10, 11, 12]


def _tree():
    from specbuild.core.formats.medusa_choices import MedusaChoices
    from specbuild.engines.reference.medusa import TreeBuffers

    return TreeBuffers.from_choices(MedusaChoices.parse([[0], [1], [0, 0]]), num_heads=2)


def test_walk_tree_greedy_follows_argmax():
    from specbuild.engines.reference.medusa import walk_tree

    tree = _tree()  # nodes: 0 root, 1 = [0], 2 = [1], 3 = [0, 0]
    tokens = torch.tensor([0, 3, 2, 1])
    probs = torch.zeros(4, 5)
    probs[0, 2] = probs[2, 1] = probs[1, 4] = probs[3, 0] = 1.0  # argmax after root is 2 = node 2's token
    assert walk_tree(tree, tokens, probs) == ([2], 1)  # node 2 has no children: bonus from its row
    probs[0] = 0.0
    probs[0, 3] = 1.0
    probs[1] = 0.0
    probs[1, 1] = 1.0
    assert walk_tree(tree, tokens, probs) == ([1, 3], 0)  # [0] then [0, 0] accepted, bonus from node 3


def test_walk_tree_is_lossless_when_sampling():
    from specbuild.engines.reference.medusa import walk_tree

    tree = _tree()
    tokens = torch.tensor([0, 1, 2, 3])
    target = torch.tensor(
        [[0.1, 0.3, 0.2, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1], [0.4, 0.3, 0.2, 0.1]]
    )
    gen = torch.Generator().manual_seed(17)
    first = torch.zeros(4)
    for _ in range(6000):
        path, nxt = walk_tree(tree, tokens, target, gen)
        first[int(tokens[path[0]]) if path else nxt] += 1
    expected = target[0] * first.sum()
    stat = ((first - expected) ** 2 / expected).sum()
    pvalue = float(torch.special.gammaincc(torch.tensor(1.5), stat / 2))
    assert pvalue > 1e-3, (
        first.tolist(),
        pvalue,
    )  # a chi-square test: false alarm 1 in 1000 (seeded: deterministic per kernel)
