"""The EAGLE-3 draft in the speculators format, its mapping to the HF layout (core/formats/eagle3.py), and
reading a draft folder in either format. Torch-free.

Facts, read in the release wheels (research note of issue 37 §0 has their sha256):
* speculators 0.9.0 `speculators/models/eagle3/config.py` (`Eagle3SpeculatorConfig`) and
  `speculators/config.py`: top level `speculators_model_type: "eagle3"`, `speculators_version`,
  `architectures: ["Eagle3Speculator"]`, `transformer_layer_config` (a LlamaConfig / Qwen3Config diff
  dict with its `model_type`: the layer's shapes, `vocab_size` = the target's), `draft_vocab_size`,
  `target_hidden_size`, `norm_before_residual`, `norm_before_fc`, `fc_norm`, `norm_output`, top-level
  `eagle_aux_hidden_state_layer_ids` (vLLM's numbering: 0 = the embedding), `speculators_config:
  {algorithm, proposal_methods: [{proposal_type: "greedy", speculative_tokens, verifier_accept_k,
  accept_tolerance}], default_proposal_method, verifier: {name_or_path, architectures}}`; `to_dict`
  drops the top-level `model_type`.
* Tensors: speculators 0.9.0 `convert/eagle/eagle3_converter.py` renames `midlayer.` to `layers.0.`;
  `models/eagle3/core.py` saves `embed_tokens.weight`, and `d2t` / `t2d` exist when the vocabulary is
  reduced. vLLM 0.33.0 `model_executor/models/llama_eagle3.py` (`WeightsMapper` `midlayer.` ->
  `layers.0.`) and SGLang 0.5.23 `srt/models/llama_eagle3.py` (`legacy_name_map`) load both names.
* vLLM 0.33.0 (git 4ba787ec9) `transformers_utils/configs/speculators/algos.py` `update_eagle3`: a
  missing `norm_before_residual` reads as **True** (speculators' default: False) and a layer config
  without `model_type` as `llama` (speculators: a Qwen3Config). Both are refused here as ambiguous.
  `configs/speculators/base.py` needs `proposal_methods[0].speculative_tokens`, `verifier.name_or_path`
  and a dict `transformer_layer_config`; `transformers_utils/config.py` takes a folder with a
  `speculators_config` for this format.
* speculators 0.9.0 layers are `llama` or `qwen3` (`models/eagle3/model_definitions.py`); the HF
  layout and the reference engine hold Llama layers, so a qwen3 layer is refused.
* speculators 0.9.0 requires transformers >= 5, whose `LlamaConfig.to_diff_dict` writes `dtype` and
  `rope_parameters` (how speculators spells the layer config: inferred, no file speculators wrote was
  read); both the transformers 4 and 5 spellings are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.core.errors import CheckpointError
from specbuild.core.formats.eagle3 import ARCHITECTURE as HF_ARCHITECTURE
from specbuild.core.formats.eagle3 import NORM_FLAGS, Eagle3DraftConfig, read_config, to_vllm_ids

MODEL_TYPE = "eagle3"  # speculators_model_type
ARCHITECTURE = "Eagle3Speculator"
VERSION_WRITTEN = "0.9.0"  # the speculators release whose format `to_speculators` writes
DEFAULT_SPECULATIVE_TOKENS = 3  # what speculators 0.9.0's converter writes
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
FORMATS = ("hf", "speculators")

# the decoder layer's tensors in the two layouts: HF `midlayer.` (one layer) or `midlayer.{i}.`;
# speculators `layers.{i}.`
_HF_LAYER = re.compile(r"^midlayer\.(?:(\d+)\.)?")
_SPEC_LAYER = re.compile(r"^layers\.(\d+)\.")


def is_speculators(raw: dict[str, Any]) -> bool:
    """A speculators config.json: a `speculators_config` (what vLLM 0.33.0 `transformers_utils/config.py`
    tests) or a `speculators_model_type`."""
    return raw.get("speculators_config") is not None or "speculators_model_type" in raw


@dataclass(frozen=True)
class Verifier:
    """`speculators_config.verifier`: the target the draft was trained for."""

    name_or_path: str | None
    architectures: tuple[str, ...] = ()


@dataclass(frozen=True)
class DraftFolder:
    """An EAGLE-3 draft folder's config in either format, as the HF-layout config (specbuild's aux-layer
    convention) plus what only the speculators format records."""

    folder: Path
    format: str  # "hf" | "speculators"
    config: Eagle3DraftConfig
    verifier: Verifier | None = None  # speculators only
    speculative_tokens: int | None = None  # speculators only: proposal_methods[0].speculative_tokens
    version: str | None = None  # speculators_version
    raw: dict[str, Any] = field(default_factory=dict, compare=False)  # config.json as read


def read_draft_folder(folder: str | Path) -> DraftFolder:
    """Read `folder`/config.json in either format."""
    file, raw = read_config(folder)
    folder = file.parent
    if not is_speculators(raw):
        return DraftFolder(folder, "hf", Eagle3DraftConfig.from_dict(raw, where=str(file)), raw=raw)
    return from_speculators(raw, folder=folder, where=str(file))


def from_speculators(raw: dict[str, Any], *, folder: Path, where: str) -> DraftFolder:
    """A speculators config.json -> the HF-layout config (ids: vLLM's numbering -> ours)."""
    kind = raw.get("speculators_model_type")
    if kind != MODEL_TYPE:
        raise CheckpointError(
            f"{where}: speculators_model_type {kind!r} is not an EAGLE-3 draft",
            expected=f"speculators_model_type: {MODEL_TYPE}",
            found=repr(kind),
            fix="point at an EAGLE-3 speculators checkpoint (or an HF-layout EAGLE-3 folder)",
        )
    layer = raw.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise CheckpointError(
            f"{where}: transformer_layer_config is missing or not an object",
            expected="transformer_layer_config: {model_type: llama, hidden_size: ..., vocab_size: ...}",
            found=repr(layer)[:80],
            fix="use the config.json speculators wrote for this draft",
        )
    layer_type = layer.get("model_type")
    if layer_type != "llama":
        raise CheckpointError(
            f"{where}: the draft's decoder layer is not named a Llama layer",
            expected="transformer_layer_config.model_type: llama (the HF layout's LlamaForCausalLMEagle3 "
            "layer, what specbuild reads, converts and runs)",
            found=f"model_type {layer_type}"
            if layer_type
            else "no model_type (speculators 0.9.0 reads a qwen3 layer, vLLM 0.33.0 a llama one)",
            fix="add model_type: llama if the layer is Llama's; serve a qwen3-layer draft with vLLM",
        )
    if "norm_before_residual" not in raw:
        raise CheckpointError(
            f"{where}: norm_before_residual is not set, and the engines disagree on its default",
            expected="norm_before_residual: true | false (speculators writes it)",
            found="no norm_before_residual key (speculators 0.9.0 reads false, vLLM 0.33.0 reads true)",
            fix="add the value the draft was trained with to config.json (false for specbuild, SpecForge "
            "and speculators' defaults)",
        )
    flat = {k: v for k, v in layer.items() if k not in ("architectures", IDS_KEY, "eagle_config")}
    flat["architectures"] = [HF_ARCHITECTURE]
    for key in ("draft_vocab_size", "target_hidden_size", IDS_KEY, *NORM_FLAGS):
        if raw.get(key) is not None:
            flat[key] = raw[key]
    if not (flat.get("torch_dtype") or flat.get("dtype")) and (raw.get("torch_dtype") or raw.get("dtype")):
        flat["torch_dtype"] = raw.get("torch_dtype") or raw.get("dtype")
    config = Eagle3DraftConfig.from_dict(flat, where=f"{where} (transformer_layer_config)")
    spec = raw.get("speculators_config") if isinstance(raw.get("speculators_config"), dict) else {}
    verifier = spec.get("verifier") if isinstance(spec.get("verifier"), dict) else {}
    methods = spec.get("proposal_methods") if isinstance(spec.get("proposal_methods"), list) else []
    tokens = methods[0].get("speculative_tokens") if methods and isinstance(methods[0], dict) else None
    return DraftFolder(
        folder=folder,
        format="speculators",
        config=config,
        verifier=Verifier(
            name_or_path=verifier.get("name_or_path"),
            architectures=tuple(str(a) for a in verifier.get("architectures") or ()),
        ),
        speculative_tokens=tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None,
        version=str(raw["speculators_version"]) if raw.get("speculators_version") else None,
        raw=raw,
    )


def to_speculators(
    config: Eagle3DraftConfig, *, verifier: Verifier, speculative_tokens: int = DEFAULT_SPECULATIVE_TOKENS
) -> dict[str, Any]:
    """The speculators 0.9.0 config.json of `config` (aux-layer ids written in vLLM's numbering; a draft
    without ids stays without: every engine's default names the same layers)."""
    c = config
    rope: dict[str, Any] = {"rope_type": "default", **(c.rope_scaling or {}), "rope_theta": c.rope_theta}
    layer = {
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.intermediate_size,
        "hidden_act": "silu",
        "vocab_size": c.vocab_size,
        "rms_norm_eps": c.rms_norm_eps,
        "rope_parameters": rope,
        "max_position_embeddings": c.max_position_embeddings,
        "tie_word_embeddings": False,
        "dtype": c.dtype,
    }
    out: dict[str, Any] = {
        "speculators_model_type": MODEL_TYPE,
        "speculators_version": VERSION_WRITTEN,
        "architectures": [ARCHITECTURE],
        "transformer_layer_config": layer,
        "draft_vocab_size": c.draft_vocab_size,
        "target_hidden_size": c.target_hidden_size,
        **{flag: flag in c.norm_flags for flag in NORM_FLAGS},  # all four explicit (vLLM's default differs)
        "speculators_config": {
            "algorithm": MODEL_TYPE,
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": speculative_tokens,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {
                "name_or_path": verifier.name_or_path,
                "architectures": list(verifier.architectures),
            },
        },
        "dtype": c.dtype,
    }
    if c.aux_layers is not None:
        out[IDS_KEY] = list(to_vllm_ids(c.aux_layers))
    return out


def tensor_name(name: str, *, to: str, num_layers: int) -> str:
    """One tensor's name in format `to` ("hf" | "speculators"); names outside the decoder layers are
    the same in both."""
    if to == "speculators":
        m = _HF_LAYER.match(name)
        return f"layers.{m.group(1) or 0}.{name[m.end() :]}" if m else name
    m = _SPEC_LAYER.match(name)
    if not m:
        return name
    where = "midlayer." if num_layers == 1 else f"midlayer.{m.group(1)}."
    return where + name[m.end() :]
