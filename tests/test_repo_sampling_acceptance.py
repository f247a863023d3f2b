"""Draft acceptance of the Triton BLS at temperature > 0 equals what the two models' distributions say.

At T > 0 the BLS's acceptance is a statistic, so a wrong sampling path (draft and target sharing
random numbers so that their samples are anti-correlated, the draft sampled with other params than
the target, drafts misaligned by one position, a seed replayed every round) does not break any
greedy test; it only moves the acceptance. These tests record every verification round of seeded
BLS requests (prefix, drafts, the tokens that came back) served in-process by fake_triton, and
compare the first draft's observed acceptance with its expectation at the same prefixes:

* token equality (use_draft_logits false): the target samples position i itself and keeps the
  draft x while they agree, so P(accept) = sum_x p_draft(x) p_target(x);
* rejection sampling (use_draft_logits true): P(accept) = sum_x min(p_draft(x), p_target(x)).

An identical draft makes the token-equality expectation large (sum_x p(x)^2 ~ 0.2 at T = 0.5 on
the tiny target), so a 10x gap (like the reported 0.01 vs 0.12) is many standard errors wide; the
mean of p_target(draft) over the rounds checks that the drafts themselves follow p_draft at that
prefix. Checked against injected faults: temperature sent to the target only, one seed for every
call, drafts shifted by one position all fail here. The in-process engine's acceptance is compared
too: it verifies with the draft's probabilities (rejection sampling), so it is comparable only with
the use_draft_logits requests (token equality is lossless too, but accepts far less at T > 0).
Seeds are fixed: the outcome is deterministic.
"""

from __future__ import annotations

import math

import pytest
from fake_triton import FakeServer, collect, text_request
from repo_builds import cached_build

from specbuild.core.sampling_params import SamplingParams
from specbuild.model_repo.generate import generate_repo

torch = pytest.importorskip("torch")

pytestmark = (
    pytest.mark.numeric
)  # float results through CPU kernels: `make test-isa` runs them per kernel family

K = 3  # drafts per round
NEW_TOKENS = 24  # per request
PROMPTS = ["def add(a, b):", "import os\nimport sys\n", "The quick brown fox", "Once upon a time"]
SEEDS = (0, 1)  # requests per prompt (seeded: reproducible)
# Token equality with the identical draft at T = 0.5: sum p^2 ~ 0.2 on the tiny target (0.06 at T = 0.8,
# which needs ~4x the rounds for the same power); rejection sampling with the tiny draft at T = 0.8
# (the reported temperature): sum min(p_d, p_t) ~ 0.2.
EQUALITY_TEMPERATURE = 0.5
REJECTION_TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_target, tiny_draft):
    root = tmp_path_factory.mktemp("acceptance")
    builds = {  # an identical draft: a large token-equality acceptance
        "same": cached_build(
            tmp_path_factory, "acc-same", "draft_target", target=tiny_target, draft=tiny_target
        ),
        "dt": cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft),
    }
    threads = torch.get_num_threads()  # the local engine model sets 1 thread per process; restore after
    servers = {n: FakeServer(generate_repo(b, root / n, backend="python")) for n, b in builds.items()}
    yield servers, builds
    for server in servers.values():
        server.close()
    torch.set_num_threads(threads)


def _rounds(server, *, use_draft_logits: bool, temperature: float):
    """Seeded BLS requests; returns (rounds [(prefix, drafts, returned tokens)], accepted, drafted)."""
    rounds, accepted, drafted = [], 0, 0
    for prompt in PROMPTS:
        for seed in SEEDS:
            server.calls.clear()
            out = collect(
                server.infer(
                    "tensorrt_llm_bls",
                    text_request(
                        prompt,
                        NEW_TOKENS,
                        num_draft_tokens=K,
                        temperature=temperature,
                        top_p=1.0,
                        seed=seed,
                        use_draft_logits=use_draft_logits,
                        return_perf_metrics=True,
                    ),
                )
            )
            accepted += out["perf"]["total_accepted_draft_tokens"]
            drafted += out["perf"]["total_draft_tokens"]
            prompt_ids = server.models["preprocessing"].tokenizer.encode(prompt)
            full = prompt_ids + out["tokens"]
            for model, inputs in server.calls:
                if model == "tensorrt_llm" and "draft_input_ids" in inputs:
                    prefix = inputs["input_ids"].reshape(-1).tolist()
                    assert full[: len(prefix)] == prefix, (
                        "a verification prefix is not a prefix of the output"
                    )
                    rounds.append(
                        (prefix, inputs["draft_input_ids"].reshape(-1).tolist(), full[len(prefix) :])
                    )
    return rounds, accepted, drafted


def _expectation(server, rounds, *, use_draft_logits: bool, temperature: float):
    """(observed first-draft acceptance, mean p_target(first draft), expected acceptance, its
    standard error)."""
    from specbuild.engines.reference.cached_decode import CachedSequence
    from specbuild.engines.reference.sampling import probs_from_logits

    target = server.models["tensorrt_llm"].engine.target
    draft = server.models["tensorrt_llm_draft"].engine.target
    params = SamplingParams(max_tokens=1, temperature=temperature, top_p=1.0)
    observed = p_of_draft = expected = variance = 0.0
    n = 0
    with torch.no_grad():
        for prefix, drafts, returned in rounds:
            if not returned:  # the request ended at max_tokens inside this round's answer: nothing to score
                continue
            pt = probs_from_logits(target.logits(CachedSequence(target).feed(prefix, 1)), params)[0]  # [V]
            pd = probs_from_logits(draft.logits(CachedSequence(draft).feed(prefix, 1)), params)[0]  # [V]
            p = float(torch.minimum(pt, pd).sum()) if use_draft_logits else float((pt * pd).sum())
            observed += float(returned[0] == drafts[0])
            p_of_draft += float(pt[drafts[0]])
            expected += p
            variance += p * (1 - p)
            n += 1
    print(
        f"rounds {n}: first-draft acceptance {observed / n:.3f}, p_target(draft) {p_of_draft / n:.3f}, "
        f"expected {expected / n:.3f} +- {math.sqrt(variance) / n:.3f}"
    )
    assert n >= 40, f"only {n} rounds: not enough for a stable estimate"
    return observed / n, p_of_draft / n, expected / n, math.sqrt(variance) / n


def _in_process_rate(build, temperature: float) -> float:
    """accepted / drafted of the in-process engine on the same prompts, seeds and K (rejection sampling)."""
    from specbuild.engines.reference.engine import ReferenceEngine

    engine = ReferenceEngine.load(build)
    accepted = drafted = 0
    for prompt in PROMPTS:
        for seed in SEEDS:
            params = SamplingParams(
                max_tokens=NEW_TOKENS, temperature=temperature, top_p=1.0, seed=seed, end_id=-1
            )
            stats = engine.generate(engine.tokenizer.encode(prompt), params, num_draft_tokens=K).stats
            accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
    print(f"in-process accepted / drafted {accepted / drafted:.3f}")
    return accepted / drafted


def test_token_equality_acceptance_matches_sum_of_draft_times_target(served):
    servers, _ = served
    t = EQUALITY_TEMPERATURE
    rounds, accepted, drafted = _rounds(servers["same"], use_draft_logits=False, temperature=t)
    observed, p_of_draft, expected, se = _expectation(
        servers["same"], rounds, use_draft_logits=False, temperature=t
    )
    assert expected > 0.1, f"expectation {expected:.3f} too small for the test to separate a gap"
    # The drafts follow p_draft at the verified prefix (same params, aligned): E[p_target(x)] = sum p_d p_t.
    assert abs(p_of_draft - expected) < 0.25 * expected, (
        p_of_draft,
        expected,
    )  # a sample mean over the rounds: sampling noise, not rounding
    # The target's own samples are independent of the draft's: accepted as often as sum p_d p_t says.
    assert abs(observed - expected) < 3 * se, f"observed {observed:.3f}, expected {expected:.3f} +- {se:.3f}"
    # The reported rate agrees (at most the first-draft rate: later drafts are tried only after an
    # acceptance).
    assert 0.25 * expected < accepted / drafted <= observed + 3 * se, (accepted / drafted, observed)


def test_rejection_sampling_acceptance_matches_sum_of_min_and_the_in_process_engine(served):
    servers, builds = served
    t = REJECTION_TEMPERATURE
    rounds, accepted, drafted = _rounds(servers["dt"], use_draft_logits=True, temperature=t)
    observed, _, expected, se = _expectation(servers["dt"], rounds, use_draft_logits=True, temperature=t)
    assert expected > 0.1, f"expectation {expected:.3f} too small for the test to separate a gap"
    assert abs(observed - expected) < 3 * se, f"observed {observed:.3f}, expected {expected:.3f} +- {se:.3f}"
    # Same verification rule in process and through the BLS: the same accepted / drafted within noise.
    in_process = _in_process_rate(builds["dt"], t)
    assert abs(accepted / drafted - in_process) < 0.5 * in_process, (
        accepted / drafted,
        in_process,
    )  # two independent samples of a rate: noise
