"""What a Hugging Face checkpoint is, read from its config.json (transformers 4 and 5 styles).

`HFModelConfig.from_hf(path)` is the one place that reads an HF config; everything else (convert,
check, memory plan, reference engine) uses the frozen result. Architecture and dtype come from the
config, never from folder or file names.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specbuild.core.errors import CheckpointError
from specbuild.core.formats.safe_io import InputFileError, read_json

# architectures[0] -> family. Mistral and Qwen2 share the Llama block (Qwen2 adds qkv bias).
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}
DTYPE_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
}  # the float dtypes every stage accepts, and their size
FLOAT_DTYPES = tuple(DTYPE_BYTES)
_TORCH_DTYPE_NAMES = {
    "float": "float32",
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
}


@dataclass(frozen=True)
class HFModelConfig:
    """Shapes and settings of a Llama-family checkpoint. Derived values are properties."""

    architecture: str  # e.g. "LlamaForCausalLM"
    model_type: str  # e.g. "llama", "qwen2"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # transformers-4 shaped dict ("rope_type", "factor", ...) or None
    tie_word_embeddings: bool
    attention_bias: bool  # qkv bias (Qwen2 always; Llama when attention_bias)
    hidden_act: str
    dtype: str  # float32 | float16 | bfloat16 (the checkpoint's stored dtype)
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    sliding_window: int | None = None  # Mistral-style local attention window; None = full attention

    @classmethod
    def from_hf(cls, source: str | Path | dict[str, Any]) -> HFModelConfig:
        """Read a folder, a config.json path or an already-loaded dict."""
        raw, where = _load(source)
        archs = raw.get("architectures") or []
        if not archs:
            raise CheckpointError(
                f"{where}: config.json has no 'architectures'",
                expected="architectures: [LlamaForCausalLM | MistralForCausalLM | Qwen2ForCausalLM]",
                found="none",
                fix="add the architecture the checkpoint was saved with",
            )
        arch = archs[0]
        model_type = raw.get("model_type", SUPPORTED_ARCHITECTURES.get(arch, "unknown"))
        heads = _req(raw, "num_attention_heads", where)
        hidden = _req(raw, "hidden_size", where)
        theta, scaling = rope_settings(raw)
        eos = raw.get("eos_token_id")
        return cls(
            architecture=arch,
            model_type=model_type,
            vocab_size=_req(raw, "vocab_size", where),
            hidden_size=hidden,
            intermediate_size=raw.get("intermediate_size") or 4 * hidden,
            num_hidden_layers=_req(raw, "num_hidden_layers", where),
            num_attention_heads=heads,
            num_key_value_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            max_position_embeddings=raw.get("max_position_embeddings", 2048),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=model_type == "qwen2" or bool(raw.get("attention_bias", False)),
            hidden_act=raw.get("hidden_act", "silu"),
            dtype=_dtype(raw),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
            # Qwen2 configs carry a sliding_window value but switch it off with use_sliding_window: false
            sliding_window=raw.get("sliding_window") if raw.get("use_sliding_window", True) else None,
        )

    # ---- derived ----------------------------------------------------------------------------------
    @property
    def family(self) -> str | None:
        """llama | mistral | qwen2, or None when unsupported."""
        return SUPPORTED_ARCHITECTURES.get(self.architecture)

    @property
    def supported(self) -> bool:
        return self.family is not None

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def eos_ids(self) -> tuple[int, ...]:
        if self.eos_token_id is None:
            return ()
        return self.eos_token_id if isinstance(self.eos_token_id, tuple) else (self.eos_token_id,)

    @property
    def num_parameters(self) -> int:
        """Parameter count from the shapes (embedding counted once when tied)."""
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * self.q_size + 2 * h * self.kv_size + self.q_size * h
        if self.attention_bias:
            attn += self.q_size + 2 * self.kv_size
        layer = attn + 3 * h * i + 2 * h
        head = 0 if self.tie_word_embeddings else v * h
        return v * h + self.num_hidden_layers * layer + h + head

    def weight_bytes(self, dtype: str | None = None) -> int:
        return self.num_parameters * DTYPE_BYTES[dtype or self.dtype]

    def kv_bytes_per_token(self, dtype: str | None = None) -> int:
        """K and V of every layer for one token (all ranks together)."""
        return 2 * self.num_hidden_layers * self.kv_size * DTYPE_BYTES[dtype or self.dtype]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if isinstance(self.eos_token_id, tuple):
            d["eos_token_id"] = list(self.eos_token_id)
        return d


def _load(source: str | Path | dict[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(source, dict):
        return source, "<config>"
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists() and not path.is_symlink():
        raise CheckpointError(
            f"no config.json at {path}",
            expected="a Hugging Face model folder with config.json",
            found="missing file",
            fix="point at the folder that holds config.json (and *.safetensors)",
        )

    try:
        return read_json(path, what="model config.json"), str(path)
    except InputFileError as exc:  # too large, not a file, not JSON, a list, a repeated key
        raise CheckpointError(
            exc.what, expected=exc.expected, found=exc.found, fix="re-download or re-save the config"
        ) from None


def _req(raw: dict[str, Any], key: str, where: str) -> int:
    if key not in raw:
        raise CheckpointError(
            f"{where}: config.json lacks {key!r}",
            expected=f"an integer {key}",
            found="missing",
            fix="re-save the config with transformers",
        )
    value = raw[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise CheckpointError(
            f"{where}: config.json has an impossible {key}",
            expected="a positive integer",
            found=repr(value),
            fix="re-save the config with transformers",
        )
    return value


def rope_settings(raw: dict[str, Any]) -> tuple[float, dict | None]:
    """rope_theta and rope_scaling from either style.

    transformers 4: rope_theta + rope_scaling {rope_type|type, factor, ...};
    transformers 5: rope_parameters {rope_theta, rope_type, factor, ...}.
    """
    params = raw.get("rope_parameters")
    if isinstance(params, dict):
        theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        if scaling.get("rope_type", "default") == "default" and set(scaling) <= {"rope_type"}:
            return theta, None
        return theta, scaling
    scaling = raw.get("rope_scaling")
    if isinstance(scaling, dict):
        scaling = dict(scaling)
        if "rope_type" not in scaling and "type" in scaling:
            scaling["rope_type"] = scaling["type"]
        if scaling.get("rope_type") == "default":
            scaling = None
    else:
        scaling = None
    return float(raw.get("rope_theta", 10000.0)), scaling


def _dtype(raw: dict[str, Any]) -> str:
    value = raw.get("dtype") or raw.get("torch_dtype") or "float32"
    value = str(value).replace("torch.", "")
    value = _TORCH_DTYPE_NAMES.get(value, value)
    return value if value in DTYPE_BYTES else "float32"
