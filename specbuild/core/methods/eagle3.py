"""EAGLE-3 (Li et al. 2025): one (or a few) draft decoder layers read the target's hidden states of
three layers (low, middle, high), fused by `fc`, and draft K tokens autoregressively over their own
(possibly reduced, `draft_vocab_size`) vocabulary, mapped to target ids by `d2t`. LLM-API flow only:
`speculative_config: {decoding_type: Eagle3, speculative_model: <draft>, max_draft_len: K}` on the
PyTorch backend (one-model: the draft layers run inside the target's forward and share its KV cache
manager). There is no engine path (TrtLlmArgs refuses Eagle3). specbuild checks the checkpoint against
the target, plans its memory and writes the options and the Triton LLM-API repository for a GPU host
(builder/eagle3_checks.py); the reference engine runs it one-model (engines/reference/eagle3_speculator.py:
`compile --flow llmapi --engine reference`, `generate --engine`, `tune`) and `train-eagle3` trains one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specbuild.core.facts.llmapi import LINE_1_2, LINE_1_4, Decoding
from specbuild.core.facts.trtllm import SpeculativeDecodingMode
from specbuild.core.methods.base import SpeculationMethod, Tunable, require

if TYPE_CHECKING:
    from specbuild.core.spec import BuildSpec

DEFAULT_K = 3  # draft tokens per step when the spec leaves speculation.max_draft_len out
MAX_LAYER_INDEX = 4096  # a capture index beyond any model's depth is a typo


@dataclass(frozen=True)
class Eagle3Section:
    """An EAGLE-3 draft checkpoint (LLM-API flow only): one or a few decoder layers that read the target's
    hidden states of `layers_to_capture` (None: TensorRT-LLM's default (1, L//2 - 1, L - 4) of an L-layer
    target), with its own lm_head over `draft_vocab_size` tokens and a `d2t` map to the target's ids."""

    model: str  # folder with config.json (+ safetensors) of the EAGLE-3 draft
    layers_to_capture: Any = None  # target layer indices whose hidden states feed the draft (a list)


class Eagle3(SpeculationMethod):
    def engine_refusal(self) -> tuple[str, str] | None:
        return (
            "EAGLE-3 runs only on the PyTorch backend (TrtLlmArgs refuses it: 'only supported on the "
            "PyTorch backend')",
            f'flow: llmapi (trtllm_version "{LINE_1_2}" or "{LINE_1_4}")',
        )

    def capture_layers(self, spec: BuildSpec) -> list[int] | None:
        return spec.eagle3.layers_to_capture

    def vllm_unmapped(self, spec: BuildSpec) -> list[str]:
        if spec.eagle3.layers_to_capture is None:
            return []
        return [
            "eagle3.layers_to_capture (no --speculative-config key: vLLM reads "
            "eagle_aux_hidden_state_layer_ids from the draft's config.json, in its own layer numbering; "
            "checked when that file is readable)"
        ]

    def validate(self, spec: BuildSpec, where: str, *, validate_tree: bool = True) -> None:
        layers = spec.eagle3.layers_to_capture
        if layers is None:
            return
        require(
            isinstance(layers, list)
            and 0 < len(layers) <= 64
            and all(isinstance(i, int) and not isinstance(i, bool) for i in layers)
            and all(-1 <= i < MAX_LAYER_INDEX for i in layers)
            and len(set(layers)) == len(layers),
            where,
            "eagle3.layers_to_capture",
            "a list of distinct target layer indices (0-based; -1 = the last layer), or leave it out for "
            "TensorRT-LLM's default (1, L//2 - 1, L - 4)",
            layers,
            "write layers_to_capture: [1, 39, 76] (as the draft was trained), or remove the key",
        )


EAGLE3 = Eagle3(
    name="eagle3",
    title="EAGLE-3",
    section="eagle3",
    section_type=Eagle3Section,
    section_example="eagle3: {model: <EAGLE-3 draft folder>}",
    model_key="model",
    model_label="EAGLE-3 draft model",
    # EAGLE is the closest engine-flow mode (EAGLE-1/2); the matrix refuses EAGLE-3 on the engine flow,
    # so no engine is ever built with it.
    target_mode=SpeculativeDecodingMode.EAGLE,
    draft_model=False,
    bls_drafter=None,
    reference_decoder="specbuild.engines.reference.eagle3_speculator:eagle3_speculator",
    tunes=Tunable.DRAFT_LEN,
    tuner="specbuild.tuning.tune:tune_draft_len",
    default_k=DEFAULT_K,
    # the first round of a request only prefills (no target state to draft from yet): 0 drafts
    drafts_every_round=False,
    llmapi=Decoding(section_keys={"layers_to_capture": "eagle3_layers_to_capture"}, model_section="eagle3"),
    vllm_method="eagle3",
    sglang_algorithm="EAGLE3",
)
