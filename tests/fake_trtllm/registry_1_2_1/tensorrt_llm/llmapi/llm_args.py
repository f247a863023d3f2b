"""The 1.2.1 parser style, reproduced for specbuild's keys (not upstream's code).

Read from: tensorrt_llm/llmapi/llm_args.py, code-index id 1090804222 (the from_dict registry, ClassVar
decoding_type, StrictBaseModel extra="forbid", the acceptance_window / acceptance_length_threshold
validators, update_llm_args_with_extra_dict converting speculative_config with from_dict and
kv_cache_config with KvCacheConfig(**)); the third-party 1.2.1 transcripts, code-index ids 59958270572
and 59783186067 (DecodingBaseConfig: speculative_model with the speculative_model_dir alias,
max_concurrency, draft_len_schedule 'batch_size >= key' with key 1 required and == max_draft_len;
EagleDecodingConfig.eagle3_one_model default True; BaseLlmArgs fields); TorchLlmArgs'
validate_speculative_config asserts (max_draft_len > 0, the draft model required).
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator, model_validator


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: int | None = None
    max_total_draft_tokens: int | None = None
    speculative_model: str | Path | None = Field(
        default=None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir")
    )
    max_concurrency: int | None = None
    draft_len_schedule: dict[int, int] | None = None
    load_format: str | None = None
    acceptance_window: int | None = None
    acceptance_length_threshold: float | None = None

    @field_validator("acceptance_window")
    @classmethod
    def _window(cls, v):
        if v is not None and v < 0:
            raise ValueError(f"acceptance_window must be >= 0 (0 disables), got {v}")
        return v

    @field_validator("acceptance_length_threshold")
    @classmethod
    def _threshold(cls, v):
        if v is not None and v < 0:
            raise ValueError(f"acceptance_length_threshold must be >= 0, got {v}")
        return v

    @model_validator(mode="after")
    def _schedule(self):
        s = self.draft_len_schedule
        if s is None:
            return self
        if 1 not in s:
            raise ValueError("draft_len_schedule must include batch_size=1")
        if s[1] != self.max_draft_len:
            raise ValueError("draft_len_schedule[1] must equal max_draft_len")
        if any(k < 1 or v < 0 or v > (self.max_draft_len or 0) for k, v in s.items()):
            raise ValueError("draft_len_schedule: batch sizes >= 1, draft lengths in 0..max_draft_len")
        return self

    @classmethod
    def from_dict(cls, data: dict):
        decoding_type = data.get("decoding_type")
        config_classes = {
            "MTP": MTPDecodingConfig,
            "Medusa": MedusaDecodingConfig,
            "Eagle": EagleDecodingConfig,
            "Lookahead": LookaheadDecodingConfig,
            "NGram": NGramDecodingConfig,
            "DraftTarget": DraftTargetDecodingConfig,
            "SaveState": SaveHiddenStatesDecodingConfig,
            "UserProvided": UserProvidedDecodingConfig,
            "AUTO": AutoDecodingConfig,
        }
        config_class = config_classes.get(decoding_type)
        if config_class is None:
            raise ValueError(f"Invalid decoding type: {decoding_type}")
        data.pop("decoding_type")
        return config_class(**data)


class MedusaDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "Medusa"


class LookaheadDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "Lookahead"


class MTPDecodingConfig(DecodingBaseConfig):
    num_nextn_predict_layers: int = 1
    mtp_eagle_one_model: bool = True
    decoding_type: ClassVar[str] = "MTP"


class SaveHiddenStatesDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "SaveState"


class UserProvidedDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "User_Provided"


class AutoDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "AUTO"


class EagleDecodingConfig(DecodingBaseConfig):
    eagle_choices: list[list[int]] | None = None
    greedy_sampling: bool | None = True
    posterior_threshold: float | None = None
    use_dynamic_tree: bool | None = False
    dynamic_tree_max_topK: int | None = None
    num_eagle_layers: int | None = None
    max_non_leaves_per_layer: int | None = None
    eagle3_one_model: bool | None = True
    eagle3_layers_to_capture: set[int] | None = None
    eagle3_model_arch: Literal["llama3", "mistral_large3"] = "llama3"
    decoding_type: ClassVar[str] = "Eagle"


class NGramDecodingConfig(DecodingBaseConfig):
    max_matching_ngram_size: int = 0
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True
    decoding_type: ClassVar[str] = "NGram"


class DraftTargetDecodingConfig(DecodingBaseConfig):
    decoding_type: ClassVar[str] = "Draft_Target"  # the ClassVar; the registry key is "DraftTarget"


class KvCacheConfig(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = 0.9
    dtype: str = "auto"


SpeculativeConfig = (  # the 1.2 union: from_dict already built the instance
    DraftTargetDecodingConfig
    | EagleDecodingConfig
    | LookaheadDecodingConfig
    | MedusaDecodingConfig
    | MTPDecodingConfig
    | NGramDecodingConfig
    | UserProvidedDecodingConfig
    | SaveHiddenStatesDecodingConfig
    | AutoDecodingConfig
    | None
)


class TorchLlmArgs(StrictBaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    model: str | Path
    backend: Literal["pytorch"] = "pytorch"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    dtype: str = "auto"
    trust_remote_code: bool = False
    max_batch_size: int | None = None
    max_num_tokens: int | None = 8192
    max_seq_len: int | None = None
    enable_chunked_prefill: bool = False
    disable_overlap_scheduler: bool = False
    return_perf_metrics: bool = False
    enable_iter_perf_stats: bool = False
    kv_cache_config: KvCacheConfig = Field(default_factory=KvCacheConfig)
    speculative_config: SpeculativeConfig = None

    @model_validator(mode="after")
    def validate_speculative_config(self):
        spec = self.speculative_config
        if isinstance(spec, DraftTargetDecodingConfig):
            assert spec.max_draft_len > 0
            assert spec.speculative_model is not None, "Path to draft model must be specified."
        elif isinstance(spec, EagleDecodingConfig):
            assert spec.max_draft_len > 0
            assert spec.speculative_model is not None, "Path to EAGLE3 weights must be specified."
        elif isinstance(spec, NGramDecodingConfig):
            assert spec.max_draft_len > 0 and spec.max_matching_ngram_size > 0
        return self


def update_llm_args_with_extra_dict(llm_args: dict, llm_args_dict: dict, extra_llm_api_options=None) -> dict:
    field_mapping = {"kv_cache_config": KvCacheConfig, "speculative_config": DecodingBaseConfig}
    for field_name, field_type in field_mapping.items():
        if field_name in llm_args_dict:
            if field_name == "speculative_config":
                llm_args_dict[field_name] = field_type.from_dict(llm_args_dict[field_name])
            else:
                llm_args_dict[field_name] = field_type(**llm_args_dict[field_name])
    return llm_args | llm_args_dict
