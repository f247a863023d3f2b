"""The reference engine's n-gram speculator: the n-gram drafter (ngram.py) in the one speculative loop.

The target verifies by token equality (`ModelVerifier` / `BatchModelVerifier` without draft
probabilities: TensorRT-LLM's draft_tokens_external without draft logits), so greedy output is the
target's and sampled output follows the target's distribution. A round whose suffix matches no pattern
drafts nothing and is a plain decode step.

`is_public_pool`: the speculator keeps one pool for its lifetime, shared by every request it runs
(batched requests see each other's updates within a round, in row order, as upstream's requests in
batch order); otherwise each request has its own pool, gone when it finishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specbuild.core.engine_limits import EngineLimits
from specbuild.engines.reference.cached_decode import ModelVerifier, lockstep_batch
from specbuild.engines.reference.model import LlamaModel
from specbuild.engines.reference.ngram import NGramConfig, NGramRequest, PatternPool
from specbuild.engines.reference.sampling import make_generator
from specbuild.engines.reference.speculative import speculative_generate

if TYPE_CHECKING:
    from specbuild.engines.reference.engine import ReferenceEngine


class NGramDrafter:
    """Drafter of the shared loop over one request's n-gram state (no model: no forward passes)."""

    forward_passes = 0

    def __init__(self, request: NGramRequest):
        self.request = request

    def propose(self, ids, k, params):
        return self.request.propose(list(ids), k), None


class BatchNGramDrafter:
    """BatchDrafter: each row's n-gram state, asked in row order (a public pool sees earlier rows)."""

    passes_per_draft_token = 0

    def __init__(self, requests: list[NGramRequest]):
        self.requests = requests

    def propose_batch(self, rows, ids, ks, params):
        return [
            (self.requests[row].propose(list(seq), k), None)
            for row, seq, k in zip(rows, ids, ks, strict=True)
        ]


@dataclass
class NGramSpeculator:
    target: LlamaModel
    config: NGramConfig = field(default_factory=NGramConfig)
    pool: PatternPool = field(default_factory=PatternPool)  # the public pool (is_public_pool)
    batched: bool = True

    def request(self, num_draft_tokens: int) -> NGramRequest:
        return NGramRequest(self.config, num_draft_tokens, self.pool)

    def generate(
        self, prompt_ids, params, *, num_draft_tokens, on_tokens=None, stop=None, guard=None, stats=None
    ):
        return speculative_generate(
            NGramDrafter(self.request(num_draft_tokens)),
            ModelVerifier(self.target, generator=make_generator(params.seed)),
            prompt_ids,
            params,
            num_draft_tokens=num_draft_tokens,
            on_tokens=on_tokens,
            stop=stop,
            guard=guard,
            stats=stats,
        )

    def generate_batch(self, prompts, params, *, num_draft_tokens, prefix_cache=None, **loop):
        """Lockstep rounds (cached_decode.lockstep_batch); `loop`: on_tokens, stop, schedule, guard."""
        return lockstep_batch(
            BatchNGramDrafter([self.request(num_draft_tokens) for _ in prompts]),
            self.target,
            prompts,
            params,
            prefix_cache=prefix_cache,
            num_draft_tokens=num_draft_tokens,
            **loop,
        )

    def drafts_per_step(self, num_draft_tokens: int, limits: EngineLimits) -> int:
        return num_draft_tokens


def ngram_speculator(engine: ReferenceEngine) -> NGramSpeculator:
    """The speculator of an engine whose method is n-gram: the build's `ngram:` section configures it."""
    return NGramSpeculator(engine.target, NGramConfig.of(engine.method_options))
