"""N-gram (prompt lookup): no draft model; drafts are continuations of earlier occurrences of the text's
own last tokens, looked up in a pattern -> continuations pool. Engine flow: the target is built with
`--speculative_decoding_mode draft_tokens_external --max_draft_len K` (as for draft/target) and the
Triton BLS drafts from the pool and verifies through `draft_input_ids` (token equality: there is no
draft distribution).

The spec's `ngram:` section means what TensorRT-LLM's `NGramDecodingConfig` means
(`tensorrt_llm/llmapi/llm_args.py`, the 1.2 line; the four fields, their defaults and the
`max_draft_len > 0` validator are the same in the newest 1.x, docs 1.4.0rc4):

* `max_draft_len` (K) is `DecodingBaseConfig.max_draft_len`, common to every method upstream; here it is
  `speculation.max_draft_len`, the key every method shares (one home for K, also what `tune --write`
  edits and what the BLS and the engine plan read). NGram has no upstream default; left out, specbuild
  takes upstream's own draft-model-free suggestion (`_torch/speculative/auto_heuristic.py` @ 7274a594:
  5 for max_batch_size <= 4, else 3).
* `max_matching_ngram_size` (N, default 2): the longest pattern (suffix) looked up; shorter ones after.
* `is_keep_all` (True): keep every continuation seen after a pattern (False: one).
* `is_use_oldest` (True): draft the oldest continuation of a hit pattern (False: the newest).
* `is_public_pool` (True): one pool shared by all requests (False: one per request, freed at its end).

The drafter that gives them their meaning is the 1.2-era host pool (`_torch/speculative/ngram.py`,
`NGramPoolManager.get_draft_tokens` @ c4dc529f); specbuild's is engines/reference/ngram.py, and
docs/ngram.md lists where specbuild and newer TensorRT-LLM differ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specbuild.core.facts.llmapi import Decoding
from specbuild.core.facts.trtllm import SpeculativeDecodingMode
from specbuild.core.methods.base import SpeculationMethod, Tunable, require

if TYPE_CHECKING:
    from specbuild.core.spec import BuildSpec

# NGramDecodingConfig's defaults (llm_args.py, 1.2 line @ snapshot 7019226376 and newest @ 55143598664).
DEFAULT_MAX_MATCHING_NGRAM_SIZE = 2
DEFAULT_IS_KEEP_ALL = True
DEFAULT_IS_USE_OLDEST = True
DEFAULT_IS_PUBLIC_POOL = True
MAX_MATCHING_NGRAM_SIZE = 64  # upstream: any PositiveInt; longer patterns almost never recur
# auto_heuristic.suggest_spec_config: K 5 up to batch 4, else 3 (without a spec: the larger batches' 3)
SMALL_BATCH, K_SMALL_BATCH, K_LARGE_BATCH = 4, 5, 3


@dataclass(frozen=True)
class NGramSection:
    """TensorRT-LLM's NGramDecodingConfig fields (above); K is speculation.max_draft_len."""

    max_matching_ngram_size: int = DEFAULT_MAX_MATCHING_NGRAM_SIZE  # longest suffix looked up
    is_keep_all: bool = DEFAULT_IS_KEEP_ALL  # keep every continuation of a pattern (False: one)
    is_use_oldest: bool = DEFAULT_IS_USE_OLDEST  # draft the oldest continuation (False: newest)
    is_public_pool: bool = DEFAULT_IS_PUBLIC_POOL  # one pool for all requests (False: per request)


class NGram(SpeculationMethod):
    def default_max_draft_len(self, spec: BuildSpec) -> int:
        return K_SMALL_BATCH if spec.build.max_batch_size <= SMALL_BATCH else K_LARGE_BATCH

    def validate(self, spec: BuildSpec, where: str, *, validate_tree: bool = True) -> None:
        n = spec.ngram.max_matching_ngram_size
        require(
            1 <= n <= MAX_MATCHING_NGRAM_SIZE,
            where,
            "ngram.max_matching_ngram_size",
            f"an integer in 1..{MAX_MATCHING_NGRAM_SIZE} (NGramDecodingConfig: a positive int)",
            n,
            f"use {DEFAULT_MAX_MATCHING_NGRAM_SIZE} (upstream's default) or let `specbuild tune` pick it",
        )
        require(
            not spec.speculation.use_logits,
            where,
            "speculation.use_logits",
            "false for mode ngram (n-gram drafts have no draft distribution: the target accepts by "
            "token equality, which is lossless)",
            True,
            "remove speculation.use_logits",
        )

    def vllm_section_config(self, spec: BuildSpec) -> dict[str, Any]:
        # prompt lookup within the request (vLLM has no pool shared across requests); min 1 because
        # TensorRT-LLM's NGram tries every size from the largest down to 1
        return {"prompt_lookup_max": spec.ngram.max_matching_ngram_size, "prompt_lookup_min": 1}

    def vllm_unmapped(self, spec: BuildSpec) -> list[str]:
        return [
            "ngram.is_keep_all / is_use_oldest / is_public_pool (vLLM's n-gram proposer looks up the "
            "request's own tokens and has no pool options)"
        ]

    def sglang_unmapped(self, spec: BuildSpec) -> list[str]:
        return [
            f"ngram.max_matching_ngram_size {spec.ngram.max_matching_ngram_size} and the pool options "
            "(SGLang matches up to --speculative-ngram-max-trie-depth tokens in its own corpus)"
        ]

    def bls_parameters(self, spec: BuildSpec) -> dict[str, str]:
        """The section as the BLS's ngram_* parameters (bls_core.NGramDrafter.configure reads them)."""
        section = spec.ngram
        return {
            "ngram_max_matching_ngram_size": str(section.max_matching_ngram_size),
            **{
                f"ngram_{key}": "true" if getattr(section, key) else "false"
                for key in ("is_keep_all", "is_use_oldest", "is_public_pool")
            },
        }


NGRAM = NGram(
    name="ngram",
    title="n-gram",
    section="ngram",
    section_type=NGramSection,
    section_example=f"ngram: {{max_matching_ngram_size: {DEFAULT_MAX_MATCHING_NGRAM_SIZE}}}",
    section_required=False,  # every key has upstream's default
    drafts_every_round=False,  # a round drafts what the pool holds: 0..K tokens
    target_mode=SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL,
    draft_model=False,
    bls_drafter="bls_core:NGramDrafter",
    reference_decoder="specbuild.engines.reference.ngram_speculator:ngram_speculator",
    tunes=Tunable.NGRAM,
    tuner="specbuild.tuning.tune_ngram:tune_ngram",
    default_k=K_LARGE_BATCH,
    # K is speculation.max_draft_len; the section is NGramDecodingConfig's four fields, whose names and
    # defaults are the same in both lines read (above). NGram is not among the modes of
    # SpeculativeDecodingMode.support_overlap_scheduler in any _torch/speculative/interface.py read (index
    # ids 2550156383, 735060080, 10039271475, 55097849426, 57352998664, oldest to newest style): the
    # executor turns the overlap scheduler off for it, so the options say so.
    llmapi=Decoding(
        section_keys={
            k: k for k in ("max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool")
        },
        overlap_scheduler=False,
    ),
    vllm_method="ngram",  # prompt lookup within the request (vLLM has no pool shared across requests)
    sglang_algorithm="NGRAM",
)
