"""`specbuild check` rows for a draft trained elsewhere: its format, its tokenizer, the layers it was
trained on (builder/eagle3_checks.py runs them beside the shape rows)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from specbuild.builder.check_rows import FAIL, PASS, WARN, CheckResult, LoadedModel, short_path
from specbuild.builder.tokenizer_compare import compare_tokenizers, read_tokenizer
from specbuild.core.formats.eagle3 import to_vllm_ids

if TYPE_CHECKING:
    from specbuild.builder.eagle3_checks import Eagle3Draft


def format_row(draft: Eagle3Draft) -> CheckResult:
    """A speculators folder: who reads it."""
    folder = draft.folder
    return CheckResult(
        "eagle3: format",
        WARN,
        "speculators format (`layers.0.*`, transformer_layer_config): vLLM 0.33.0 reads it; SGLang "
        "0.5.23 loads by architectures (LlamaForCausalLMEagle3) and TensorRT-LLM's loader reads the "
        "HF layout (1.2.1: inferred, its loader was not read at that release)",
        f"for TensorRT-LLM or SGLang: specbuild eagle3 convert {short_path(folder)} --to hf "
        "--out DIR, and point eagle3.model at DIR",
    )


def tokenizer_row(draft: Eagle3Draft, target: LoadedModel) -> CheckResult:
    """The draft's tokenizer, when its folder ships one, is the target's (ids index the same embedding)."""
    name = "eagle3: tokenizer"
    if read_tokenizer(draft.folder) is None:
        return CheckResult(
            name,
            PASS,
            "the draft folder has no tokenizer: it reads the target's token ids (vocab_size compared above)",
        )
    cmp = compare_tokenizers(target.folder, draft.folder)
    if cmp.status == "different":
        return CheckResult(
            name,
            FAIL,
            "the draft's tokenizer differs from the target's: " + " | ".join(cmp.differences[:4]),
            "use the EAGLE-3 draft trained for this target's tokenizer",
        )
    if cmp.status == "skipped":
        return CheckResult(name, WARN, f"not compared: {cmp.reason}", "add the target's tokenizer files")
    return CheckResult(name, PASS, "the draft folder's tokenizer is the target's")


def trained_layers_row(
    given: list[int] | None, draft: Eagle3Draft, target_layers: int, default: tuple[int, ...] | None
) -> CheckResult | None:
    """The layers the draft's config names (trained on) against the target and the spec's capture
    (`given`: eagle3.layers_to_capture; `default`: TensorRT-LLM's for this target, None when it has none);
    None when they agree or the draft names none."""
    name = "eagle3: layers captured"
    trained = draft.aux_layers
    if trained is None:
        return None
    both = f"{list(trained)} (layer outputs; vLLM / speculators ids {list(to_vllm_ids(trained))})"
    outside = [i for i in trained if not 0 <= i < target_layers]
    if outside:
        return CheckResult(
            name,
            FAIL,
            f"the draft's config.json names aux layers {both}; {outside} are not layers of the "
            f"{target_layers}-layer target",
            "use the EAGLE-3 draft trained for this target (eagle_config ids count layer outputs from 0; the "
            "top-level vLLM key counts the embedding as 0)",
        )
    if given is not None and sorted(given) != list(trained):
        return CheckResult(
            name,
            FAIL,
            f"eagle3.layers_to_capture is {list(given)}, the draft was trained on {both}",
            f"set eagle3.layers_to_capture: {list(trained)} (the draft's)",
        )
    if given is None and default != trained:
        return CheckResult(
            name,
            FAIL,
            f"eagle3.layers_to_capture is unset: TensorRT-LLM captures "
            f"{list(default) if default else 'nothing by default'} (it does not read the draft's ids), the "
            f"draft was trained on {both}",
            f"set eagle3.layers_to_capture: {list(trained)}",
        )
    return None
