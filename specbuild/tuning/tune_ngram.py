"""`specbuild tune` for mode ngram: pick K (speculation.max_draft_len) and ngram.max_matching_ngram_size.

1. The target's greedy continuation of every prompt, once (the reference engine, target alone).
2. Every (K, N) in 1..k_max x 1..n_max is replayed exactly on those continuations: the n-gram drafter
   (engines/reference/ngram.py, the spec's is_keep_all / is_use_oldest / is_public_pool) drafts from
   prompt + accepted tokens; greedy token-equality verification accepts the longest prefix of the
   draft that equals the continuation, plus one token. No model runs: speculation is lossless, so the
   greedy continuation is what the loop would produce with any drafts, and the replay is what the
   engine's loop does (measured on held-out prompts with --eval-prompts).
3. The cost of a verify pass with j draft tokens relative to a plain decode pass, cost(j), is timed
   on the reference engine (interleaved rounds, medians; made non-decreasing and >= 1, as it is).
   There is no draft model: drafting costs ~nothing; but on a CPU a pass over j + 1 tokens costs
   more than over one (on a GPU, far less so).
4. Predicted speedup of (K, N) = tokens / sum over rounds of cost(drafts that round): a round without
   a match is a plain step. The best predicted speedup wins (smaller K, then N, on a tie).

Reported: the table, the conditional acceptance per draft position and the hit rate (rounds with a
draft) of the chosen and current settings.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from specbuild.core.generation import SpecStats
from specbuild.core.methods import Tunable
from specbuild.core.perf.theory import conditional_acceptance
from specbuild.engines.reference.cached_decode import CachedSequence
from specbuild.engines.reference.ngram import NGramConfig, NGramRequest, PatternPool
from specbuild.engines.reference.ngram_speculator import NGramSpeculator
from specbuild.tuning.profile_engine import greedy_params, pass_times_shown
from specbuild.tuning.progress import Reporter
from specbuild.tuning.tune_options import TuneOptions
from specbuild.tuning.tune_report import Setting, TuneReport

K_MAX = 8  # default largest K profiled (or the spec's K if larger)
N_MAX = 4  # default largest max_matching_ngram_size profiled (or the spec's if larger)


@dataclass(frozen=True)
class Replay:
    k: int
    n: int
    tokens: int
    rounds: int
    cost: float  # in plain decode passes
    stats: SpecStats

    @property
    def tokens_per_pass(self) -> float:
        return self.tokens / self.rounds if self.rounds else 0.0

    @property
    def speedup(self) -> float:
        return self.tokens / self.cost if self.cost else 0.0

    @property
    def hit_rate(self) -> float:
        return len(self.stats.accepted_per_step) / self.rounds if self.rounds else 0.0


def replay(
    prompts: Sequence[list[int]],
    continuations: Sequence[list[int]],
    config: NGramConfig,
    k: int,
    *,
    max_tokens: Sequence[int],
    cost: Sequence[float],
) -> Replay:
    """The greedy speculative loop of (K, config) on known greedy continuations (see the module docstring).
    Requests run one after another; a public pool carries over between them, as when serving."""
    public = PatternPool()
    stats, rounds, spent, tokens = SpecStats(), 0, 0.0, 0
    for prompt, want, limit in zip(prompts, continuations, max_tokens, strict=True):
        request = NGramRequest(config, k, public)
        out: list[int] = []
        while len(out) < len(want):
            room = min(k, limit - len(out) - 1)  # the loop's next_k (speculative.py)
            draft = request.propose(list(prompt) + out, room) if room > 0 else []
            rest = want[len(out) :]
            accepted = 0
            while accepted < len(draft) and accepted < len(rest) and draft[accepted] == rest[accepted]:
                accepted += 1
            if draft:
                stats.record_step(accepted, len(draft))
            out += rest[: accepted + 1]
            rounds += 1
            spent += cost[min(len(draft), len(cost) - 1)]
        tokens += len(want)
    stats.target_passes = rounds
    return Replay(k, config.max_matching_ngram_size, tokens, rounds, spent, stats)


def verify_costs(target, prompt: list[int], k_max: int, rep: Reporter | None = None) -> list[float]:
    """[k_max + 1]: time of one verify pass over 1 + j tokens after `prompt` / a plain one-token pass;
    `rep` shows the timing rounds (tens of seconds on a loaded CPU) as a bar."""
    seq = CachedSequence(target, capacity=len(prompt) + k_max + 2)
    seq.feed(list(prompt))

    def verify(j: int):
        ids = list(prompt) + [int(prompt[-1])] * (j + 1)
        return lambda: seq.feed(ids, j + 1)

    times = pass_times_shown({j: verify(j) for j in range(k_max + 1)}, rep or Reporter())
    return non_decreasing([max(times[j] / times[0], 1.0) for j in range(k_max + 1)])


def non_decreasing(values: Sequence[float]) -> list[float]:
    """The least-squares non-decreasing fit (pool adjacent violators): a pass over more tokens never
    costs less; what timing noise says otherwise is averaged with its neighbours."""
    blocks: list[list[float]] = []  # [sum, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


def tune_ngram(spec, engine, prompts, options: TuneOptions, rep: Reporter) -> TuneReport:
    current_k, current_n = spec.speculation.max_draft_len, spec.ngram.max_matching_ngram_size
    k_max = options.k_max or max(K_MAX, current_k)
    n_max = options.n_max or max(N_MAX, current_n)
    rep.start("greedy continuations", len(prompts))
    continuations, limits = [], []
    for p in prompts:
        result = engine.generate(list(p), greedy_params(options.max_tokens), speculative=False)
        continuations.append(list(result.token_ids))
        # the loop's max_tokens: the option, unless the engine's length limit cut the request shorter
        limits.append(options.max_tokens if result.finish_reason == "stop" else len(result.token_ids))
        rep.advance("greedy continuations", 1)
    rep.stop("greedy continuations")
    rep.log("timing verify passes of 1..k_max draft tokens")
    cost = verify_costs(engine.target, list(prompts[0]), max(k_max, current_k), rep)
    base = NGramConfig.of(spec.ngram)

    def run(k: int, n: int) -> Replay:
        config = dataclasses.replace(base, max_matching_ngram_size=n)
        return replay(prompts, continuations, config, k, max_tokens=limits, cost=cost)

    table = [run(k, n) for n in range(1, n_max + 1) for k in range(1, k_max + 1)]
    best = max(table, key=lambda r: (round(r.speedup, 12), -r.k, -r.n))
    current = next((r for r in table if (r.k, r.n) == (current_k, current_n)), None) or run(
        current_k, current_n
    )

    def setting(label: str, r: Replay) -> Setting:
        value = {"speculation.max_draft_len": r.k, "ngram.max_matching_ngram_size": r.n}
        return Setting(label, value, r.tokens_per_pass, r.speedup, r.k)

    def profile(r: Replay) -> dict:
        s = r.stats
        return {
            "acceptance_per_position": conditional_acceptance(
                s.accepted_per_position, s.drafted_per_position
            ),
            "acceptance_rate": s.acceptance_rate,
            "hit_rate": r.hit_rate,
            "drafted": s.drafted,
            "accepted": s.accepted,
            "rounds": r.rounds,
        }

    return TuneReport(
        mode=spec.mode.value,
        tunes=Tunable.NGRAM.name.lower(),
        chosen=setting("chosen", best),
        current=setting("current", current),
        details={
            "chosen_profile": profile(best),
            "current_profile": profile(current),
            "verify_cost": cost,  # pass over 1 + j tokens / plain pass, j = 0..k_max (this host)
            "profiled_tokens": sum(len(c) for c in continuations),
            "flags": {k: v for k, v in dataclasses.asdict(base).items() if k != "max_matching_ngram_size"},
            "table": [
                {
                    "k": r.k,
                    "n": r.n,
                    "tokens_per_pass": r.tokens_per_pass,
                    "speedup": r.speedup,
                    "hit_rate": r.hit_rate,
                }
                for r in table
            ],
        },
    )


def measure(report: TuneReport, engine, prompts, options: TuneOptions) -> dict:
    """The engine's own greedy speculative loop with the chosen and current (K, N) on held-out prompts:
    tokens per target pass and wall time (fresh pools for each setting)."""
    out = {}
    base = NGramConfig.of(engine.method_options)
    for s in (report.chosen, report.current):
        k, n = s.value["speculation.max_draft_len"], s.value["ngram.max_matching_ngram_size"]
        speculator = NGramSpeculator(engine.target, dataclasses.replace(base, max_matching_ngram_size=n))
        tokens = passes = 0
        start = time.perf_counter()
        for p in prompts:
            params = engine.resolve(greedy_params(options.max_tokens))
            ids, stats = speculator.generate(list(p), params, num_draft_tokens=k)
            tokens, passes = tokens + len(ids), passes + stats.target_passes
        out[s.label] = {
            "k": k,
            "n": n,
            "tokens_per_pass": tokens / passes if passes else 0.0,
            "seconds": time.perf_counter() - start,
        }
    return out
