"""In-process speculators: how the reference engine speculates for each method.

A method (core/methods) names its factory as "module:function"; `ReferenceEngine` resolves it with
the loaded models. A speculator generates one request (`generate`) or several (`generate_batch`:
lockstep rounds when `batched`, else the engine runs them one after the other). Draft/target is
here; Medusa's lives with its tree code in medusa.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from specbuild.core.engine_limits import EngineLimits
from specbuild.core.errors import EngineError
from specbuild.core.generation import SpecStats
from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.cached_decode import (
    BatchModelDrafter,
    ModelDrafter,
    ModelVerifier,
    lockstep_batch,
)
from specbuild.engines.reference.model import LlamaModel
from specbuild.engines.reference.sampling import make_generator
from specbuild.engines.reference.speculative import OnTokens, StopHook, speculative_generate

if TYPE_CHECKING:
    from specbuild.engines.reference.engine import ReferenceEngine


class Speculator(Protocol):
    batched: bool  # generate_batch runs several requests in lockstep

    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        num_draft_tokens: int,
        on_tokens: OnTokens | None = None,
        stop: StopHook | None = None,
        guard=None,
        stats: SpecStats | None = None,
    ) -> tuple[list[int], SpecStats]:
        """stats: the SpecStats to count in, updated before each step's on_tokens (None: a fresh one)."""
        ...

    def generate_batch(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        *,
        num_draft_tokens: int,
        on_tokens=None,
        stop=None,
        schedule=None,
        guard=None,
        prefix_cache=None,
    ) -> list[tuple[list[int], SpecStats]]:
        """prefix_cache: the engine's target PrefixCache (cached_decode.lockstep_batch), or None."""
        ...

    def drafts_per_step(self, num_draft_tokens: int, limits: EngineLimits) -> int:
        """Draft tokens one step adds to the sequence (the runtime counts them against max_seq_len)."""
        ...


@dataclass(frozen=True)
class DraftModelSpeculator:
    """Draft/target: the draft model proposes K tokens per round, the target verifies them
    (speculative.py)."""

    target: LlamaModel
    draft: LlamaModel
    batched: bool = True

    def generate(
        self, prompt_ids, params, *, num_draft_tokens, on_tokens=None, stop=None, guard=None, stats=None
    ):
        # The draft samples from its own stream (offset 1) so drafts and verification draws stay independent.
        drafter = ModelDrafter(self.draft, generator=make_generator(params.seed, offset=1))
        verifier = ModelVerifier(self.target, generator=make_generator(params.seed))
        return speculative_generate(
            drafter,
            verifier,
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
        # The target's rows start from (and go back to) the engine's prefix cache as a plain batch's do;
        # the draft model's rows catch up on their whole sequence in the first round that drafts.
        return lockstep_batch(
            BatchModelDrafter(self.draft, len(prompts), [make_generator(q.seed, offset=1) for q in params]),
            self.target,
            prompts,
            params,
            prefix_cache=prefix_cache,
            num_draft_tokens=num_draft_tokens,
            **loop,
        )

    def drafts_per_step(self, num_draft_tokens: int, limits: EngineLimits) -> int:
        return num_draft_tokens


def draft_model_speculator(engine: ReferenceEngine) -> DraftModelSpeculator:
    if engine.draft is None:
        raise EngineError(
            "draft/target speculation needs a draft model",
            expected="a build with a draft engine",
            found="a target alone",
            fix="load the `specbuild compile` output folder, not one engine",
        )
    return DraftModelSpeculator(engine.target, engine.draft)
