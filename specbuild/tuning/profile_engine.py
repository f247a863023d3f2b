"""Offline profiling on the reference engine: greedy acceptance, pass cost, measured tokens per pass.

Everything here runs the engine's own loops (speculative_generate for draft/target, medusa_generate
for trees) at temperature 0 over held-out prompts, so "measured" means what serving would do.

Shape legend: T tokens, H hidden size, nH Medusa heads, V vocabulary.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specbuild.core.formats.medusa_choices import MedusaChoices
from specbuild.core.generation import SpecStats
from specbuild.core.perf.theory import conditional_acceptance
from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.cached_decode import CachedSequence
from specbuild.engines.reference.medusa import TreeBuffers, medusa_generate
from specbuild.tuning.progress import Reporter

TIMING_REPEATS = 15  # single-token passes timed per model for the cost ratio (median taken)


def greedy_params(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


# ---- draft/target ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ChainProfile:
    acceptance: list[float]  # [K]: P(draft position k accepted | earlier ones accepted)
    cost_ratio: float  # one draft pass / one target pass (median single-token decode times)
    target_pass_s: float
    draft_pass_s: float
    stats: SpecStats
    requests: tuple[tuple[tuple[int, int], ...], ...] = ()  # (accepted, drafted) per step, per prompt


def profile_chain(
    engine, prompts: Sequence[list[int]], *, k_max: int, max_tokens: int, reporter: Reporter | None = None
) -> ChainProfile:
    rep = reporter or Reporter()
    stats = SpecStats()
    requests = []
    rep.start("profile", len(prompts))
    for p in prompts:
        res = engine.generate(list(p), greedy_params(max_tokens), speculative=True, num_draft_tokens=k_max)
        stats.merge(res.stats)
        requests.append(tuple(res.stats.steps))
        rep.advance("profile", 1)
    rep.stop("profile")
    t = pass_times(
        {"target": decode_pass(engine.target, prompts[0]), "draft": draft_pass(engine, prompts[0])}
    )
    t_target, t_draft = t["target"], t["draft"]
    return ChainProfile(
        acceptance=conditional_acceptance(stats.accepted_per_position, stats.drafted_per_position),
        cost_ratio=t_draft / t_target,
        target_pass_s=t_target,
        draft_pass_s=t_draft,
        stats=stats,
        requests=tuple(requests),
    )


def pass_times(
    passes: dict[str, Callable[[], None]],
    *,
    repeats: int = TIMING_REPEATS,
    on_round: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Median seconds of each pass, timed in interleaved rounds so load changes hit all of them alike;
    `on_round` is called after each of the repeats + 2 rounds (a progress bar)."""
    times: dict[str, list[float]] = {name: [] for name in passes}
    for round_ in range(repeats + 2):
        for name, run in passes.items():
            start = time.perf_counter()
            run()
            if round_ >= 2:  # the first rounds warm up allocators
                times[name].append(time.perf_counter() - start)
        if on_round is not None:
            on_round()
    return {name: statistics.median(v) for name, v in times.items()}


def pass_times_shown(passes: dict[str, Callable[[], None]], rep: Reporter) -> dict[str, float]:
    """pass_times with its rounds as the reporter's "timing rounds" bar (tens of seconds on a loaded CPU)."""
    rep.start("timing rounds", TIMING_REPEATS + 2)
    try:
        return pass_times(passes, on_round=lambda: rep.advance("timing rounds"))
    finally:
        rep.stop("timing rounds")


def draft_pass(engine, prompt: list[int], rows: int = 1) -> Callable[[], None] | None:
    """A callable running one draft pass of `rows` rows after `prompt`: the draft model's decode pass, or the
    speculator's own drafting pass (EAGLE-3's draft layer); None when nothing drafts with a model."""
    if engine.draft is not None:
        return decode_pass(engine.draft, prompt) if rows == 1 else None
    own = getattr(engine.speculator, "draft_pass", None)
    return own(list(prompt), rows) if own is not None else None


def decode_pass(model, prompt: list[int]) -> Callable[[], None]:
    """A callable running one single-token decode pass after `prompt` (the prompt stays cached)."""
    seq = CachedSequence(model, capacity=len(prompt) + 4)
    seq.feed(list(prompt))
    ids = list(prompt) + [int(prompt[-1])]
    return lambda: seq.feed(ids)


@dataclass(frozen=True)
class KMeasurement:
    k: int
    tokens_per_pass: float  # measured: (accepted + verification steps) / steps
    seconds: float  # wall time of the run over all prompts


def sweep_k(
    engine, prompts: Sequence[list[int]], ks: Sequence[int], *, max_tokens: int
) -> list[KMeasurement]:
    """Run the speculative loop at each K over the prompts (greedy) and measure tokens per pass."""
    out = []
    for k in ks:
        stats, start = SpecStats(), time.perf_counter()
        for p in prompts:
            stats.merge(
                engine.generate(
                    list(p), greedy_params(max_tokens), speculative=True, num_draft_tokens=k
                ).stats
            )
        out.append(
            KMeasurement(
                k=k, tokens_per_pass=stats.mean_accepted_per_step, seconds=time.perf_counter() - start
            )
        )
    return out


# ---- Medusa ----------------------------------------------------------------------------------------


class ReferenceMedusa:
    """The MedusaRunner protocol (profile_medusa) over a ReferenceEngine with Medusa heads."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.num_heads = engine.speculator.heads.num_heads

    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        return list(
            self.engine.generate(list(prompt), greedy_params(max_new_tokens), speculative=False).token_ids
        )

    def head_logits(self, ids: list[int]) -> torch.Tensor:
        seq = CachedSequence(self.engine.target, capacity=len(ids) + 1)
        hidden = seq.feed(list(ids), len(ids))  # [T, H]
        return self.engine.speculator.heads.logits(hidden)  # [nH, T, V]


def measure_tree(
    engine, choices: MedusaChoices, prompts: Sequence[list[int]], *, max_tokens: int
) -> SpecStats:
    """Greedy Medusa generation with `choices` over the prompts; stats.mean_accepted_per_step is
    tokens/pass."""
    tree = TreeBuffers.from_choices(choices, num_heads=engine.speculator.heads.num_heads)
    params = engine.resolve(greedy_params(max_tokens))
    stats = SpecStats()
    for p in prompts:
        _, s = medusa_generate(engine.target, engine.speculator.heads, tree, list(p), params)
        stats.merge(s)
    return stats


def tree_pass(engine, choices: MedusaChoices, prompt: list[int]) -> Callable[[], None]:
    """A callable running one tree verification pass (heads + root + nodes) after `prompt`."""
    tree = TreeBuffers.from_choices(choices, num_heads=engine.speculator.heads.num_heads)
    seq = CachedSequence(engine.target, capacity=len(prompt) + tree.num_nodes + 2)
    hidden = seq.feed(list(prompt))[0]  # [H]

    def run() -> None:
        tokens = tree.candidates(int(prompt[-1]), engine.speculator.heads.logits(hidden))  # [N+1]
        engine.target.forward(
            tokens[None], seq.cache, new_mask=tree.attention_mask, depths=tree.position_offsets
        )
        seq.cache.truncate(0, len(prompt))

    return run
