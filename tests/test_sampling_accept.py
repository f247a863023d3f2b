"""accept_draft follows the target distribution; hand-built cases; probs_from_logits filters.

The chi-square test is run on the real rule AND on deliberately broken rules (inverted ratio,
rejection resampled from the target instead of the residual, an unnormalised residual drawn by
inverse CDF, always-accept): the broken ones must fail with an astronomically small p-value, so the
test cannot pass by chance of a broken rule. Seeds are fixed, so the outcome is deterministic.
"""

from __future__ import annotations

import pytest
from tolerances import FEW_OPS_ULPS, assert_close, tol

torch = pytest.importorskip("torch")

from specbuild.engines.reference.sampling import accept_draft, probs_from_logits, residual_probs, sample  # noqa: E402
from specbuild.sampling_params import SamplingParams  # noqa: E402

TARGET = torch.tensor([
    [0.50, 0.20, 0.15, 0.10, 0.05, 0.00],
    [0.05, 0.05, 0.40, 0.30, 0.10, 0.10],
    [0.25, 0.25, 0.10, 0.10, 0.20, 0.10],
])  # [K+1,V]: target_probs
DRAFT = torch.tensor([
    [0.10, 0.40, 0.10, 0.10, 0.10, 0.20],
    [0.30, 0.10, 0.20, 0.10, 0.20, 0.10],
])  # [K,V]: draft_probs; draft puts mass on token 5, which the target never emits at position 0
TRIALS = 8000  # for the real rule; broken rules are caught with far fewer
BROKEN_TRIALS = 2000

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.numeric]



def _chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; zero-probability categories must have zero counts."""
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    n = counts.sum()
    expected = probs[support] * n
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


def _positional_counts(rule, trials=TRIALS):
    """Emitted token counts at positions 0, 1, 2 (position i counted when drafts 0..i-1 were kept)."""
    draw = torch.Generator().manual_seed(1234)
    accept_gen = torch.Generator().manual_seed(99)
    counts = torch.zeros(3, TARGET.shape[1])
    all_drafts = torch.multinomial(DRAFT, trials, replacement=True, generator=draw).T.tolist()  # [trials,K]
    for drafts in all_drafts:
        n, nxt = rule(drafts, DRAFT, TARGET, accept_gen)
        emitted = drafts[:n] + [nxt]
        for pos, tok in enumerate(emitted):
            counts[pos, tok] += 1
    return counts


def _pvalues(rule, trials=TRIALS):
    counts = _positional_counts(rule, trials)
    return [_chi2_pvalue(counts[i], TARGET[i]) for i in range(3)]


# ---- broken rules the test must reject -------------------------------------------------------

def _inverted_ratio(drafts, draft_probs, target_probs, gen):
    for i, x in enumerate(drafts):
        if torch.rand((), generator=gen) >= min(1.0, float(draft_probs[i, x] / max(target_probs[i, x], 1e-12))):
            return i, sample(residual_probs(target_probs[i], draft_probs[i]), gen)
    return len(drafts), sample(target_probs[-1], gen)


def _resample_from_target(drafts, draft_probs, target_probs, gen):
    for i, x in enumerate(drafts):
        if torch.rand((), generator=gen) >= min(1.0, float(target_probs[i, x] / draft_probs[i, x])):
            return i, sample(target_probs[i], gen)
    return len(drafts), sample(target_probs[-1], gen)


def _unnormalised_residual(drafts, draft_probs, target_probs, gen):
    for i, x in enumerate(drafts):
        if torch.rand((), generator=gen) >= min(1.0, float(target_probs[i, x] / draft_probs[i, x])):
            residual = (target_probs[i] - draft_probs[i]).clamp_min(0)  # not divided by its sum
            u = float(torch.rand((), generator=gen))
            tok = int((residual.cumsum(0) <= u).sum().clamp(max=len(residual) - 1))  # inverse CDF
            return i, tok
    return len(drafts), sample(target_probs[-1], gen)


def _always_accept(drafts, draft_probs, target_probs, gen):
    return len(drafts), sample(target_probs[-1], gen)


def test_accept_draft_follows_target_distribution():
    pvalues = _pvalues(accept_draft)
    assert min(pvalues) > 1e-3, pvalues  # chi-square: false alarm 1 in 1000 per test (seeded)


@pytest.mark.parametrize("broken", [_inverted_ratio, _resample_from_target, _unnormalised_residual, _always_accept])
def test_chi_square_rejects_broken_rules(broken):
    assert min(_pvalues(broken, BROKEN_TRIALS)) < 1e-6  # broken rules are off by far more than noise


def test_identical_distributions_accept_everything():
    gen = torch.Generator().manual_seed(0)
    probs = torch.tensor([[0.3, 0.3, 0.4]] * 4)  # [K+1,V]
    for _ in range(200):
        drafts = [int(torch.multinomial(probs[0], 1, generator=gen)) for _ in range(3)]
        n, nxt = accept_draft(drafts, probs[:3], probs, gen)
        assert n == 3 and 0 <= nxt < 3


def test_disjoint_distributions_accept_nothing_and_sample_the_target():
    gen = torch.Generator().manual_seed(0)
    draft = torch.tensor([[0.0, 0.0, 0.5, 0.5]] * 2)  # [K,V]
    target = torch.tensor([[0.7, 0.3, 0.0, 0.0]] * 3)  # [K+1,V]
    counts = torch.zeros(4)
    for _ in range(2000):
        n, nxt = accept_draft([2, 3], draft, target, gen)
        assert n == 0
        counts[nxt] += 1
    assert _chi2_pvalue(counts, target[0]) > 1e-3


def test_residual_is_normalised():
    r = residual_probs(TARGET[0], DRAFT[0])
    want = torch.tensor([0.4, 0.0, 0.05, 0.0, 0.0, 0.0]) / 0.45
    assert_close(r, want, ulps=FEW_OPS_ULPS)  # float32: a subtraction, a clamp and a normalisation each side
    assert abs(float(r.sum()) - 1.0) <= tol(torch.ones(1), FEW_OPS_ULPS)  # a float32 sum of 6 probabilities


def test_greedy_is_token_equality_with_argmax():
    params = SamplingParams(temperature=0.0)
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 0.0, 5.0]])  # argmax 1, 0, 2
    target = probs_from_logits(logits, params)  # [3,V] one-hot
    draft = probs_from_logits(torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]), params)  # drafts 1, 2
    assert accept_draft([1, 2], draft, target) == (1, 0)  # second draft rejected, argmax 0 follows
    assert accept_draft([1, 0], None, target) == (2, 2)  # token equality without draft probs, bonus = argmax
    assert accept_draft([0, 0], None, target) == (0, 1)
    assert accept_draft([], None, target[:1]) == (0, 1)


def test_equality_rule_without_draft_probs_follows_target():
    gen = torch.Generator().manual_seed(5)
    counts = torch.zeros(6)
    for _ in range(2000):
        n, nxt = accept_draft([1], None, TARGET[:2], gen)
        counts[1 if n == 1 else nxt] += 1
    assert _chi2_pvalue(counts, TARGET[0]) > 1e-3


def test_probs_from_logits_filters():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    assert probs_from_logits(logits, SamplingParams()).tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    t2 = probs_from_logits(logits, SamplingParams(temperature=2.0))
    assert_close(t2, (logits / 2.0).softmax(-1), ulps=FEW_OPS_ULPS)  # float32: scale + softmax of 5 values
    k2 = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert (k2[0, 2:] == 0).all()
    assert_close(k2[0, :2], logits[0, :2].softmax(-1), ulps=FEW_OPS_ULPS)  # float32: a masked softmax vs a short one
    full = logits.softmax(-1)[0]  # 0.636, 0.234, 0.086, ...
    p = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert (p[0] > 0).tolist() == [True, True, False, False, False]  # 0.636 < 0.8 <= 0.870
    assert_close(p[0, :2], full[:2] / full[:2].sum(), ulps=FEW_OPS_ULPS)  # float32: renormalised nucleus


def test_seeded_sampling_is_reproducible():
    from specbuild.engines.reference.sampling import make_generator

    probs = torch.full((50,), 1 / 50)
    a = [sample(probs, g) for g in [make_generator(7)] for _ in range(20)]
    b = [sample(probs, g) for g in [make_generator(7)] for _ in range(20)]
    assert a == b and len(set(a)) > 1
