"""Draft/target (Leviathan et al. 2023): a small draft model proposes K tokens, the target verifies
K + 1 in one pass. Engine flow: the target is built with `--speculative_decoding_mode
draft_tokens_external --max_draft_len K` (trtllm.md §4.1), the draft as an ordinary engine; the
Triton BLS runs the draft -> target rounds."""

from __future__ import annotations

from specbuild.core.facts.llmapi import Decoding
from specbuild.core.facts.trtllm import SpeculativeDecodingMode
from specbuild.core.methods.base import MODEL_RANGES, ModelSection, SpeculationMethod, Tunable

DEFAULT_K = 5  # draft tokens per round when the spec leaves speculation.max_draft_len out


DRAFT_TARGET = SpeculationMethod(
    name="draft_target",
    title="draft/target",
    section="draft",
    section_type=ModelSection,  # the draft is an engine of its own: model, tp_size, pp_size
    ranges=MODEL_RANGES,
    section_example="draft: {model: <folder>, tp_size: 1}",
    model_key="model",
    model_label="draft model",
    target_mode=SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL,
    draft_model=True,
    bls_drafter="bls_core:TritonDrafter",
    reference_decoder="specbuild.engines.reference.speculators:draft_model_speculator",
    tunes=Tunable.DRAFT_LEN,
    tuner="specbuild.tuning.tune:tune_draft_len",
    default_k=DEFAULT_K,
    profile_name="draft_model",  # vLLM's and ModelOpt's name of the method
    llmapi=Decoding(model_section="draft"),
    vllm_method="draft_model",
    sglang_algorithm="STANDALONE",
)
