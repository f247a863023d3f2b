"""Medusa (Cai et al. 2024): heads on the target's last hidden state propose a token tree
(`medusa.choices`), verified in one pass with a tree attention mask. Engine flow only: one engine
built with `--speculative_decoding_mode medusa` and a `--max_draft_len` that holds the tree
(trtllm.md §3.4); the engine speculates inside each call (the BLS forwards to it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specbuild.core.errors import SpecbuildError, SpecError
from specbuild.core.facts.llmapi import LINE_1_2, engine_flow_version
from specbuild.core.facts.trtllm import SpeculativeDecodingMode
from specbuild.core.formats.medusa_choices import DEFAULT_TREE, MedusaChoices
from specbuild.core.methods.base import SpeculationMethod, Tunable, require

if TYPE_CHECKING:
    from specbuild.core.spec import BuildSpec


@dataclass(frozen=True)
class MedusaSection:
    heads: str  # folder with the HF Medusa heads (config.json + medusa_lm_head.safetensors|.pt)
    num_heads: int = 4  # Medusa heads (head i drafts the token i + 1 ahead)
    num_layers: int = 1  # ResBlocks per head
    choices: Any = DEFAULT_TREE  # a named tree or a list of paths; see MedusaChoices


class Medusa(SpeculationMethod):
    def llmapi_refusal(self, version: str) -> tuple[str, str] | None:
        why = (
            "Medusa runs on the TensorRT engine backend only (MedusaDecodingConfig.supports_backend excludes "
            "pytorch)"
            if engine_flow_version(version)
            else f"Medusa was removed with the TensorRT backend: TensorRT-LLM {version} has no Medusa"
        )
        return (
            why + "; engine flow only in 1.2.x",
            f'flow: engine with trtllm_version: "{LINE_1_2}", or mode: eagle3 (the LLM API\'s head-based '
            "drafter)",
        )

    def default_max_draft_len(self, spec: BuildSpec) -> int:
        """The tree's size: every node is one draft token of the verify pass."""
        return MedusaChoices.parse(spec.medusa.choices if spec.medusa else DEFAULT_TREE).size

    def heads_of(self, spec: BuildSpec) -> MedusaSection | None:
        return spec.medusa

    def validate(self, spec: BuildSpec, where: str, *, validate_tree: bool = True) -> None:
        heads = spec.medusa
        require(
            heads.num_heads >= 1 and heads.num_layers >= 1,
            where,
            "medusa.num_heads/num_layers",
            "integers >= 1",
            (heads.num_heads, heads.num_layers),
            "use num_heads: 4, num_layers: 1",
        )
        try:  # parse errors always raise; consistency only when asked (check reports it as a row)
            choices = MedusaChoices.parse(heads.choices)
            if validate_tree:
                choices.validate(
                    num_heads=heads.num_heads,
                    max_draft_len=spec.speculation.max_draft_len,
                    where="medusa.choices",
                )
        except SpecError:
            raise
        except SpecbuildError as exc:
            what = exc.what if exc.what.startswith("medusa.choices") else f"medusa.choices: {exc.what}"
            raise SpecError(f"{where}: {what}", expected=exc.expected, found=exc.found, fix=exc.fix) from None


MEDUSA = Medusa(
    name="medusa",
    title="Medusa",
    section="medusa",
    section_type=MedusaSection,
    ranges={"num_heads": (1, 64, "4"), "num_layers": (1, 64, "1")},
    section_example=f"medusa: {{heads: <folder>, num_heads: 4, choices: {DEFAULT_TREE}}}",
    model_key="heads",
    model_label="Medusa heads",
    target_mode=SpeculativeDecodingMode.MEDUSA,
    draft_model=False,
    bls_drafter=None,
    reference_decoder="specbuild.engines.reference.medusa:medusa_speculator",
    tunes=Tunable.TREE,
    tuner="specbuild.tuning.tune:tune_tree",
)
