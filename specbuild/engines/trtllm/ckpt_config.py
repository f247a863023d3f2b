"""The TensorRT-LLM checkpoint config.json (PretrainedConfig + LLaMAConfig / QWenConfig keys).

Every key whose loader default would be wrong for a Llama-family model is written explicitly
(trtllm.md §2.2: `hidden_act` defaults to gelu, `position_embedding_type` to learned_absolute).
Medusa adds the MedusaForCausalLM keys (§3.2).

`mapping.gpus_per_node` is the GPUs of one node of the deployment (spec.gpus_per_node), not TensorRT-LLM's
default of 8: trtllm-build 1.x keeps the checkpoint's mapping in the engine, and the executor takes GPUs per
node from there, refuses device ids not below it and runs rank r on gpu_device_ids[r % len]
(core/facts/deploy_sources.py names the upstream files and commits). With 8 on a deployment of 2 pods of 1
GPU,
rank 1 would ask for device 1 of a pod that has one GPU.
"""

from __future__ import annotations

from typing import Any

from specbuild.core.formats.hf_config import HFModelConfig

WEIGHT_ONLY_ALGO = {"none": None, "int8": "W8A16", "int4": "W4A16"}  # trtllm-build quantizes float weights
GROUP_SIZE = 128  # QuantConfig.group_size code default (the doc table's 64 is wrong)


def mapping_dict(tp: int, pp: int, gpus_per_node: int | None = None) -> dict[str, Any]:
    """gpus_per_node: the GPUs of one node of the deployment (None: tp x pp, one node)."""
    # attn_tp_size / attn_cp_size are left out on purpose: Mapping derives them from tp/cp.
    return {
        "world_size": tp * pp,
        "gpus_per_node": gpus_per_node or tp * pp,
        "cp_size": 1,
        "tp_size": tp,
        "pp_size": pp,
        "moe_tp_size": tp,
        "moe_ep_size": 1,
        "moe_cluster_size": 1,
    }


def quantization_dict(weight_only: str) -> dict[str, Any]:
    return {
        "quant_algo": WEIGHT_ONLY_ALGO[weight_only],
        "kv_cache_quant_algo": None,
        "group_size": GROUP_SIZE,
        "smoothquant_val": 0.5,
        "clamp_val": None,
        "use_meta_recipe": False,
        "has_zero_point": False,
        "pre_quant_scale": False,
        "exclude_modules": None,  # None: TRT-LLM's default exclusions (lm_head, embeddings) apply
    }


def rotary_scaling(cfg: HFModelConfig) -> dict[str, Any] | None:
    """HF rope scaling passed through; both `type` and `rope_type` are set because TRT-LLM versions
    differ in which one they read."""
    if not cfg.rope_scaling:
        return None
    out = dict(cfg.rope_scaling)
    kind = out.get("rope_type") or out.get("type")
    out["type"] = kind
    out["rope_type"] = kind
    return out


def checkpoint_config(
    cfg: HFModelConfig, *, dtype: str, tp: int, pp: int, weight_only: str, gpus_per_node: int | None = None
) -> dict[str, Any]:
    """config.json for the base model (LLaMAForCausalLM or QWenForCausalLM in TRT-LLM's MODEL_MAP)."""
    out: dict[str, Any] = {
        "architecture": cfg.architecture,
        "dtype": dtype,
        "logits_dtype": "float32",
        "vocab_size": cfg.vocab_size,  # unpadded; only lm_head rows are padded
        "max_position_embeddings": cfg.max_position_embeddings,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_size": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "norm_epsilon": cfg.rms_norm_eps,
        "position_embedding_type": "rope_gpt_neox",
        "hidden_act": cfg.hidden_act,  # "silu" for the Llama family; the loader default is gelu
        "rotary_base": cfg.rope_theta,
        "rotary_scaling": rotary_scaling(cfg),
        "rotary_pct": 1.0,
        "use_parallel_embedding": False,
        "embedding_sharding_dim": 0,
        "share_embedding_table": False,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "attn_bias": cfg.attention_bias,
        "mlp_bias": False,
        "qk_layernorm": False,
        "mapping": mapping_dict(tp, pp, gpus_per_node),
        "quantization": quantization_dict(weight_only),
        "disable_weight_only_quant_plugin": False,
        "residual_mlp": False,
        "remove_duplicated_kv_heads": False,
        "fc_after_embed": False,
        "use_input_layernorm_in_first_layer": True,
        "use_last_layernorm": True,
        "layer_idx_offset": 0,
        "embedding_multiplier": 1.0,
        "attention_multiplier": 1.0,
        "residual_multiplier": 1.0,
        "output_multiplier_scale": 1.0,
        "model_type": cfg.model_type,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_id) if isinstance(cfg.eos_token_id, tuple) else cfg.eos_token_id,
    }
    if cfg.family == "qwen2":
        out["qwen_type"] = "qwen2"
        out["use_logn_attn"] = False
        out["seq_length"] = cfg.max_position_embeddings
    return out


def medusa_config(
    base: dict[str, Any], *, num_heads: int, num_layers: int, max_draft_len: int
) -> dict[str, Any]:
    """MedusaForCausalLM wraps the base model; MedusaConfig picks QWen when 'qwen' is in model_type."""
    return {
        **base,
        "architecture": "MedusaForCausalLM",
        "max_draft_len": max_draft_len,
        "num_medusa_heads": num_heads,
        "num_medusa_layers": num_layers,
    }
