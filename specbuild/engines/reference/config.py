"""What the reference engine runs, read from a TensorRT-LLM checkpoint's config.json.

`RefModelConfig.from_checkpoint(dict)` is the one place that interprets that file (trtllm.md §2.2,
§3.2): the Llama keys, the tp/pp mapping and the Medusa keys. Missing keys take TensorRT-LLM's own
defaults except `hidden_act` and `position_embedding_type`, whose upstream defaults (gelu,
learned_absolute) are not Llama: those must be present and right, or loading fails.
Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specbuild.core.errors import CheckpointError
from specbuild.core.formats.hf_config import FLOAT_DTYPES
from specbuild.core.formats.hf_config import SUPPORTED_ARCHITECTURES as HF_ARCHITECTURES
from specbuild.core.formats.trtllm_layout import Parallel

# a converted checkpoint's `architecture`: the HF families specbuild converts (the one list, hf_config), and
# a TensorRT-LLM Medusa checkpoint (convert writes MedusaForCausalLM for a target with heads)
SUPPORTED_ARCHITECTURES = (*HF_ARCHITECTURES, "MedusaForCausalLM")
DTYPES = FLOAT_DTYPES
ROPE_TYPES = (None, "default", "llama3", "linear")


@dataclass(frozen=True)
class RefModelConfig:
    """Shapes and settings of one Llama-family model (all tp/pp shards together)."""

    architecture: str
    dtype: str  # float32 | float16 | bfloat16: the stored weights' dtype, and the compute dtype
    vocab_size: int  # unpadded; lm_head rows beyond it are tp padding and are dropped
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    norm_epsilon: float
    rotary_base: float
    rotary_scaling: dict | None  # HF rope_scaling dict (rope_type/type, factor, ...) or None
    max_position_embeddings: int
    attn_bias: bool  # fused qkv bias present (Qwen2)
    tie_word_embeddings: bool
    tp_size: int = 1
    pp_size: int = 1
    use_parallel_embedding: bool = False
    embedding_sharding_dim: int = 0
    num_medusa_heads: int = 0  # 0: no Medusa heads
    num_medusa_layers: int = 0  # ResBlocks per head
    max_draft_len: int = 0

    @classmethod
    def from_checkpoint(cls, raw: dict[str, Any], *, where: str = "config.json") -> RefModelConfig:
        arch = raw.get("architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise CheckpointError(
                f"{where}: unsupported architecture {arch!r}",
                expected=" | ".join(SUPPORTED_ARCHITECTURES),
                found=str(arch),
                fix="convert a Llama, Mistral or Qwen2 model with `specbuild convert`",
            )
        _expect(raw, "hidden_act", "silu", where)
        _expect(raw, "position_embedding_type", "rope_gpt_neox", where)
        dtype = raw.get("dtype")
        if dtype not in DTYPES:
            raise CheckpointError(
                f"{where}: dtype {dtype!r} not supported",
                expected=" | ".join(DTYPES),
                found=str(dtype),
                fix="convert with --dtype float16|bfloat16|float32",
            )
        heads = _req(raw, "num_attention_heads", where)
        hidden = _req(raw, "hidden_size", where)
        mapping = raw.get("mapping") or {}
        scaling = raw.get("rotary_scaling")
        rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
        if rope_type not in ROPE_TYPES:
            raise CheckpointError(
                f"{where}: rotary_scaling type {rope_type!r} is not supported by the reference engine",
                expected="none, linear or llama3",
                found=str(scaling),
                fix="use a model with default, linear or llama3 RoPE scaling",
            )
        is_medusa = arch == "MedusaForCausalLM"
        return cls(
            architecture=arch,
            dtype=dtype,
            vocab_size=_req(raw, "vocab_size", where),
            hidden_size=hidden,
            intermediate_size=raw.get("intermediate_size") or 4 * hidden,
            num_layers=_req(raw, "num_hidden_layers", where),
            num_heads=heads,
            num_kv_heads=raw.get("num_key_value_heads") or heads,
            head_size=raw.get("head_size") or hidden // heads,
            norm_epsilon=float(raw.get("norm_epsilon", 1e-5)),
            rotary_base=float(raw.get("rotary_base", 10000.0)),
            rotary_scaling=None if rope_type in (None, "default") else dict(scaling),
            max_position_embeddings=int(raw.get("max_position_embeddings") or 2048),
            attn_bias=bool(raw.get("attn_bias", raw.get("bias", False))),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            tp_size=int(mapping.get("tp_size", 1)),
            pp_size=int(mapping.get("pp_size", 1)),
            use_parallel_embedding=bool(raw.get("use_parallel_embedding", False)),
            embedding_sharding_dim=int(raw.get("embedding_sharding_dim", 0)),
            num_medusa_heads=int(raw.get("num_medusa_heads", 0)) if is_medusa else 0,
            num_medusa_layers=int(raw.get("num_medusa_layers", 1)) if is_medusa else 0,
            max_draft_len=int(raw.get("max_draft_len", 0)),
        )

    # ---- derived ------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_size

    @property
    def parallel(self) -> Parallel:
        return Parallel(tp=self.tp_size, pp=self.pp_size)


def _req(raw: dict[str, Any], key: str, where: str) -> Any:
    if key not in raw:
        raise CheckpointError(
            f"{where}: missing {key!r}",
            expected=f"{key} in the TensorRT-LLM checkpoint config",
            found="missing",
            fix="re-run `specbuild convert`",
        )
    return raw[key]


def _expect(raw: dict[str, Any], key: str, value: str, where: str) -> None:
    if raw.get(key) != value:
        raise CheckpointError(
            f"{where}: {key} is {raw.get(key)!r}",
            expected=f"{key}: {value!r} (TensorRT-LLM's default for a missing key is not Llama's)",
            found=repr(raw.get(key)),
            fix="re-run `specbuild convert`, which writes it explicitly",
        )
