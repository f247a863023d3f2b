"""What an EAGLE-3 draft folder must hold for vLLM and for SGLang, and the check when its config.json is
readable.

Layer numbering (the residual stream h(k) after k decoder layers, h(0) the embedding output):
* the spec's `eagle3.layers_to_capture` and TensorRT-LLM's `eagle3_layers_to_capture`: id i = h(i + 1);
  unset, TensorRT-LLM captures (1, L//2 - 1, L - 4) = h(2), h(L//2), h(L - 3) of an L-layer target;
* vLLM (core/facts/vllm.py `eagle3_layer_ids`): reads the draft's top-level
  `eagle_aux_hidden_state_layer_ids` first, then `eagle_config.eagle_aux_hidden_state_layer_ids`, both as
  id j = h(j); none: (2, L//2, L - 3);
* SGLang (core/facts/sglang.py `eagle3_layer_ids`): reads `eagle_config.eagle_aux_hidden_state_layer_ids`
  only and adds 1 for Llama/Qwen targets, so id i = h(i + 1) as TensorRT-LLM; none: h(2), h(L//2),
  h(L - 3); it loads the draft by its `architectures` (LlamaForCausalLMEagle3).
All three defaults are the same three layers. One config.json serves both engines with the top-level key in
vLLM's numbering and the nested one in SGLang's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from specbuild.builder.eagle3_checks import capture_layers
from specbuild.builder.resolve import resolve_model
from specbuild.core.errors import DeployError, SpecbuildError
from specbuild.core.formats.eagle3_speculators import is_speculators
from specbuild.core.formats.safe_io import read_json
from specbuild.core.spec import BuildSpec

TOP_KEY = "eagle_aux_hidden_state_layer_ids"
SGLANG_ARCH = "LlamaForCausalLMEagle3"

DRAFT_CONTENTS = {
    "vllm": "the EAGLE-3 draft's config.json: `eagle_aux_hidden_state_layer_ids` at the top level in "
    "vLLM's numbering (id j = the hidden state after j decoder layers, the spec's ids + 1); without it vLLM "
    "reads `eagle_config.eagle_aux_hidden_state_layer_ids` as-is (one layer off for an SGLang-style draft), "
    "and without either its default (2, L//2, L-3) = TensorRT-LLM's default",
    "sglang": "the EAGLE-3 draft's config.json: `architectures: [LlamaForCausalLMEagle3]` (SGLang loads a "
    "draft by class name; `LlamaForCausalLM` loads a plain Llama) and, unless the default layers are meant, "
    "`eagle_config: {eagle_aux_hidden_state_layer_ids: [...]}` in TensorRT-LLM's numbering (the spec's "
    "layers_to_capture; SGLang adds 1 for Llama/Qwen targets and ignores a top-level key)",
}


@dataclass(frozen=True)
class DraftConfig:
    architectures: tuple[str, ...]
    top_level: tuple[int, ...] | None
    nested: tuple[int, ...] | None
    speculators: bool = False  # the speculators format (core/formats/eagle3_speculators.py)


def read_draft(spec: BuildSpec) -> DraftConfig | None:
    """The draft's config.json as the engines read it; None when it is not readable here (a hub id not in
    the cache, a folder without config.json)."""
    if spec.eagle3 is None:
        return None
    try:
        folder = resolve_model(spec.eagle3.model, base=spec.base_dir, what="eagle3 model")
        raw = read_json(folder / "config.json", what="EAGLE-3 draft config.json")
    except SpecbuildError:
        return None
    nested = raw.get("eagle_config")
    return DraftConfig(
        architectures=tuple(raw.get("architectures") or ()),
        top_level=_ids(raw.get(TOP_KEY)),
        nested=_ids(nested.get(TOP_KEY)) if isinstance(nested, dict) else None,
        speculators=is_speculators(raw),
    )


def _ids(value: Any) -> tuple[int, ...] | None:
    return tuple(int(v) for v in value) if isinstance(value, list | tuple) and value else None


def _target_layers(spec: BuildSpec) -> int | None:
    try:
        folder = resolve_model(spec.target.model, base=spec.base_dir, what="target model")
        return int(read_json(folder / "config.json", what="target config.json")["num_hidden_layers"])
    except (SpecbuildError, KeyError, TypeError, ValueError):
        return None


def wanted(spec: BuildSpec) -> tuple[int, ...] | None:
    """h(k) the spec asks for, ascending (None: unknown, the target's config is not readable)."""
    assert spec.eagle3 is not None
    layers = _target_layers(spec)
    if spec.eagle3.layers_to_capture is None and layers is None:
        return None
    try:
        return tuple(sorted(i + 1 for i in capture_layers(spec.eagle3.layers_to_capture, layers or 0)))
    except ValueError:
        return None


def _default(layers: int | None) -> tuple[int, ...] | None:
    return None if layers is None else (2, layers // 2, layers - 3)


def engine_layers(spec: BuildSpec, draft: DraftConfig, engine: str) -> tuple[tuple[int, ...] | None, str]:
    """(h(k) the engine will capture, from which key) for this draft."""
    if engine == "vllm":
        if draft.top_level:
            return tuple(sorted(draft.top_level)), f"top-level {TOP_KEY}"
        if draft.nested:
            return tuple(sorted(draft.nested)), f"eagle_config.{TOP_KEY} read as vLLM ids"
    elif draft.nested:
        return tuple(sorted(i + 1 for i in draft.nested)), f"eagle_config.{TOP_KEY} + 1"
    return _default(_target_layers(spec)), "the engine's default (2, L//2, L-3)"


def check_draft(spec: BuildSpec, engine: str) -> None:
    """Refuse a readable EAGLE-3 draft that `engine` (vllm | sglang) would feed other target layers than the
    spec's, or that SGLang would not load as an EAGLE-3 draft."""
    draft = read_draft(spec)
    if draft is None:
        return
    section = spec.eagle3  # read_draft: an EAGLE-3 spec
    if engine == "sglang" and draft.speculators:  # "Eagle3Speculator" is no SGLang model class
        raise DeployError(
            "SGLang would not load a speculators-format EAGLE-3 draft",
            expected=f"the HF layout (architectures [{SGLANG_ARCH}], eagle_config ids; SGLang 0.5.23 loads "
            "a draft by its architectures)",
            found=f"a speculators config.json (architectures {list(draft.architectures)})",
            fix=f"specbuild eagle3 convert {section.model} --to hf --out DIR, and point eagle3.model at DIR",
        )
    if engine == "sglang" and not any("Eagle3" in a for a in draft.architectures):
        raise DeployError(
            "SGLang would not load the draft as an EAGLE-3 model",
            expected=f"architectures: [{SGLANG_ARCH}] in the draft's config.json (SGLang picks the model "
            "class by this name)",
            found=f"architectures: {list(draft.architectures)}",
            fix=f'set "architectures": ["{SGLANG_ARCH}"] in {section.model}/config.json',
        )
    want = wanted(spec)
    got, where = engine_layers(spec, draft, engine)
    if want is None or got is None or want == got:
        return
    if engine == "vllm":
        fix = f'add "{TOP_KEY}": {json.dumps(list(want))} at the top level of {section.model}/config.json'
    else:
        fix = f'set "eagle_config": {{"{TOP_KEY}": {json.dumps([k - 1 for k in want])}}} in ' + (
            f"{section.model}/config.json"
        )
    raise DeployError(
        f"{engine} would feed the EAGLE-3 draft other target layers than the spec's",
        expected=f"the hidden states after decoder layers {list(want)} (eagle3.layers_to_capture "
        f"{section.layers_to_capture or 'unset: the default'}, TensorRT-LLM's numbering + 1)",
        found=f"after layers {list(got)} ({where})",
        fix=fix,
    )
