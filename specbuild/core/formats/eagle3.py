"""The EAGLE-3 draft checkpoint in its HF layout (`LlamaForCausalLMEagle3`): config and tensor names.

Torch-free: what the reference engine loads and `train-eagle3` writes. Sources (the research note
of issue 37 quotes them): SpecForge 0.2.0 `modeling/draft/llama3_eagle.py` (wheel, release), vLLM 0.33.0
`model_executor/models/llama_eagle3.py` (wheel, release), SGLang 0.5.23 `models/llama_eagle3.py` (wheel,
release), TensorRT-LLM `_torch/models/modeling_speculative.py` @00679c66 (main, not a release).

Tensors (H draft hidden size, Ht target hidden size, n captured layers, V / Vd target / draft vocab):
`fc.weight` [H, n*Ht]; one decoder layer `midlayer.*` (vLLM/SGLang/TensorRT-LLM main also accept
`layers.0.*`) whose q/k/v read [input_layernorm(embed) | hidden_norm(fc out)] = 2H wide, plus
`hidden_norm`, `input_layernorm`, `post_attention_layernorm` and a gated MLP; `norm.weight` [H];
`lm_head.weight` [Vd, H]; `d2t` int [Vd] (target id = draft id + d2t[draft id]); `t2d` bool [V] (training
only). `embed_tokens.weight` [V, H] is optional: without it the draft shares the target's embedding.

Aux-layer ids. specbuild's one convention (AuxLayers, the spec's `eagle3.layers_to_capture`, the
reference engine's capture): **index i = the residual stream after decoder layer i, 0-based** (hidden +
residual, before the final norm) = TensorRT-LLM's `eagle3_layers_to_capture` = SGLang's and SpecForge's
`eagle_config.eagle_aux_hidden_state_layer_ids` = HF transformers `output_hidden_states[i + 1]`.
vLLM and speculators count the embedding as 0: their id j is our j - 1 (`from_vllm_ids` / `to_vllm_ids`).
The fc input is the captured states concatenated in ascending layer order (vLLM and TensorRT-LLM sort).
config.json carries them twice when specbuild writes it: nested `eagle_config` (our convention, what
SGLang reads) and top-level `eagle_aux_hidden_state_layer_ids` (vLLM's, what vLLM reads first).
The speculators format of the same draft, and reading a folder in either: core/formats/eagle3_speculators.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.core.errors import CheckpointError
from specbuild.core.formats.hf_config import FLOAT_DTYPES, rope_settings
from specbuild.core.formats.safe_io import InputFileError, read_json

ARCHITECTURE = "LlamaForCausalLMEagle3"  # what SpecForge writes and vLLM / SGLang dispatch on
ARCHITECTURES = (ARCHITECTURE, "LlamaForCausalLM")  # published yuhuili drafts say LlamaForCausalLM
LAYER_PREFIXES = ("midlayer.", "layers.0.")  # the HF layout's name, and the speculators one
FC, NORM, LM_HEAD, EMBED, D2T, T2D = (
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "embed_tokens.weight",
    "d2t",
    "t2d",
)
# the decoder layer's tensors, after its prefix
LAYER_TENSORS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "hidden_norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)
# config keys that change the layer's math; the reference engine runs the default (all false) only
NORM_FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """TensorRT-LLM's default capture (1, L//2 - 1, L - 4) of an L-layer target, which names the same
    states as vLLM's (2, L//2, L - 3) and SGLang's; (0,) for one layer; L <= 5 needs explicit ids
    (`Eagle3OneModelSpecMetadata`, `_torch/speculative/eagle3.py` @001e6700, main)."""
    if num_layers == 1:
        return (0,)
    if num_layers <= 5:
        raise CheckpointError(
            f"a {num_layers}-layer target has no default EAGLE-3 capture",
            expected="a target with more than 5 layers, or explicit aux-layer ids",
            found=f"{num_layers} layers",
            fix="set eagle3.layers_to_capture (0-based layer outputs), e.g. [0, 1]",
        )
    return (1, num_layers // 2 - 1, num_layers - 4)


def to_vllm_ids(layers: tuple[int, ...]) -> tuple[int, ...]:
    """Our ids (output of layer i) -> vLLM / speculators ids (0 = the embedding)."""
    return tuple(i + 1 for i in layers)


def from_vllm_ids(ids: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    """vLLM / speculators ids -> ours. vLLM's 0 (the embedding) has no equivalent: refused."""
    if any(int(j) < 1 for j in ids):
        raise CheckpointError(
            "vLLM aux-layer id 0 (the embedding output) cannot be captured by TensorRT-LLM",
            expected="vLLM ids >= 1 (id j = the output of layer j - 1)",
            found=str(list(ids)),
            fix="retrain the draft on layer outputs",
        )
    return tuple(int(j) - 1 for j in ids)


def check_aux_layers(layers: tuple[int, ...], num_target_layers: int, *, where: str) -> tuple[int, ...]:
    """Distinct ids in 0..L-1, returned ascending (the fc input order)."""
    bad = [i for i in layers if not 0 <= i < num_target_layers]
    if bad or len(set(layers)) != len(layers) or not layers:
        raise CheckpointError(
            f"{where}: aux-layer ids {list(layers)} do not fit a {num_target_layers}-layer target",
            expected=f"distinct ids in 0..{num_target_layers - 1} (the output of decoder layer i)",
            found=str(list(layers)),
            fix="use the ids the draft was trained with (0-based layer outputs)",
        )
    return tuple(sorted(layers))


@dataclass(frozen=True)
class Eagle3DraftConfig:
    """An EAGLE-3 draft's config.json (HF layout). `aux_layers` uses specbuild's convention (module
    docstring: i = the output of target decoder layer i, 0-based, ascending); None: the file names none
    (the engines then take their default, `default_aux_layers`)."""

    architecture: str
    hidden_size: int  # H: the draft layer's width
    target_hidden_size: int  # Ht: the width of each captured target state (the fc input is n * Ht)
    num_hidden_layers: int  # draft decoder layers (the reference engine runs 1)
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int  # the target's vocabulary (d2t maps into it)
    draft_vocab_size: int  # Vd: rows of the draft's lm_head
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    dtype: str  # torch_dtype: float32 | float16 | bfloat16
    aux_layers: tuple[int, ...] | None = None
    norm_flags: tuple[str, ...] = ()  # the NORM_FLAGS the file sets true (the reference engine refuses them)

    @property
    def num_aux(self) -> int:
        return len(self.aux_layers) if self.aux_layers is not None else 3

    @classmethod
    def from_hf(cls, path: str | Path) -> Eagle3DraftConfig:
        """Read `path`/config.json (or a config.json path)."""
        file, raw = read_config(path)
        return cls.from_dict(raw, where=str(file))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], *, where: str = "config.json") -> Eagle3DraftConfig:
        arch = (raw.get("architectures") or ["?"])[0]
        if arch not in ARCHITECTURES:
            raise CheckpointError(
                f"{where}: architecture {arch!r} is not an EAGLE-3 draft",
                expected=" | ".join(ARCHITECTURES),
                found=str(arch),
                fix="point eagle3.model at an EAGLE-3 draft folder (SpecForge, speculators-converted or "
                "`specbuild train-eagle3`)",
            )
        hidden, heads = _positive(raw, "hidden_size", where), _positive(raw, "num_attention_heads", where)
        vocab = _positive(raw, "vocab_size", where)
        draft_vocab = raw.get("draft_vocab_size") or vocab  # missing: the full vocabulary (all engines)
        dtype = str(raw.get("torch_dtype") or raw.get("dtype") or "bfloat16")
        rope_theta, rope_scaling = rope_settings(raw)  # transformers 4 or 5 style
        return cls(
            architecture=arch,
            hidden_size=hidden,
            target_hidden_size=int(raw.get("target_hidden_size") or hidden),
            num_hidden_layers=int(raw.get("num_hidden_layers") or 1),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            intermediate_size=_positive(raw, "intermediate_size", where),
            vocab_size=vocab,
            draft_vocab_size=int(draft_vocab),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings") or 2048),
            dtype=dtype if dtype in FLOAT_DTYPES else "bfloat16",
            aux_layers=_aux_layers_of(raw, where),
            norm_flags=tuple(k for k in NORM_FLAGS if _flag(raw, k)),
        )

    def to_hf(self, *, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """config.json for the HF layout: what vLLM, SGLang, TensorRT-LLM and SpecForge read."""
        out: dict[str, Any] = {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "target_hidden_size": self.target_hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": False,
            "torch_dtype": self.dtype,
        }
        if self.rope_scaling:
            out["rope_scaling"] = dict(self.rope_scaling)
        if self.aux_layers is not None:
            out["eagle_aux_hidden_state_layer_ids"] = list(to_vllm_ids(self.aux_layers))  # vLLM: top level
            out["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers)}  # SGLang
        return {**out, **(extra or {})}


def read_config(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(the file, its JSON) of `path`/config.json or a config.json path, bounded and checked."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        return file, read_json(file, what="EAGLE-3 config.json")
    except InputFileError as exc:
        raise CheckpointError(exc.what, expected=exc.expected, found=exc.found, fix=exc.fix) from None


def _aux_layers_of(raw: dict[str, Any], where: str) -> tuple[int, ...] | None:
    """The file's ids in our convention: nested eagle_config (ours) and top-level (vLLM's) must agree."""
    nested = (raw.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = raw.get("eagle_aux_hidden_state_layer_ids")
    ours = tuple(int(i) for i in nested) if isinstance(nested, list) else None
    theirs = from_vllm_ids(tuple(top)) if isinstance(top, list) else None
    if ours is not None and theirs is not None and sorted(ours) != sorted(theirs):
        raise CheckpointError(
            f"{where}: the two aux-layer id lists name different layers",
            expected="eagle_config.eagle_aux_hidden_state_layer_ids (layer outputs) = the top-level "
            "eagle_aux_hidden_state_layer_ids - 1 (vLLM counts the embedding as 0)",
            found=f"eagle_config {list(ours)}, top level {list(top)}",
            fix="keep the list the draft was trained with and delete the other",
        )
    found = ours if ours is not None else theirs
    return tuple(sorted(found)) if found is not None else None


def _positive(raw: dict[str, Any], key: str, where: str) -> int:
    value = raw.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointError(
            f"{where}: {key} is missing or not a positive integer",
            expected=f"{key}: <int> (a LlamaConfig field of the EAGLE-3 layer)",
            found=repr(value),
            fix="use the config.json the EAGLE-3 draft was trained with",
        )
    return value


def _flag(raw: dict[str, Any], key: str) -> bool:
    return bool(raw.get(key) or (raw.get("eagle_config") or {}).get(key))
