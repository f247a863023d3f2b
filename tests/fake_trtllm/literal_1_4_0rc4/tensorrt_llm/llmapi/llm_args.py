"""The 1.4.0rc4 parser style, reproduced for specbuild's keys (not upstream's code).

Read from: the 1.4.0rc4 API reference signatures (nvidia.github.io/TensorRT-LLM/1.4.0rc4/llm-api/
reference/{TorchLlmArgs,KvCacheConfig,NGramDecodingConfig,Eagle3DecodingConfig}.html: decoding_type a
Literal field, max_concurrency PositiveInt, acceptance_rate_window_size >= 0, acceptance_rate_threshold
in [0, 1], use_rejection_sampling, spec_dec_variant; no eagle3_one_model / eagle_choices /
num_eagle_layers on Eagle3); tensorrt_llm/llmapi/llm_args.py @0004396720054fd8e205cbf616f21f0b57c6b412
(update_llm_args_with_extra_dict builds kv_cache_config and leaves speculative_config a dict) and
code-index id 7019226376 (SpeculativeConfig = Annotated[Union[...], Field(discriminator="decoding_type")];
the Draft_Target / NGram after-validators; draft_len_schedule "batch size <= key", smallest key ==
max_draft_len, exclusive with max_concurrency).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    model_validator,
)


class StrictBaseModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DecodingBaseConfig(StrictBaseModel):
    max_draft_len: NonNegativeInt | None = None
    max_total_draft_tokens: int | None = None
    speculative_model: str | Path | None = Field(
        default=None, validation_alias=AliasChoices("speculative_model", "speculative_model_dir")
    )
    max_concurrency: PositiveInt | None = None
    draft_len_schedule: dict[int, int] | None = None
    load_format: str | None = None
    acceptance_rate_window_size: NonNegativeInt | None = None
    acceptance_rate_threshold: Annotated[float | None, Field(ge=0.0, le=1.0)] = None
    use_rejection_sampling: bool = False

    @model_validator(mode="after")
    def _schedule(self):
        s = self.draft_len_schedule
        if s is None:
            return self
        if self.max_concurrency is not None:
            raise ValueError("max_concurrency and draft_len_schedule are mutually exclusive")
        if s[min(s)] != self.max_draft_len:
            raise ValueError("draft_len_schedule at its smallest batch size must equal max_draft_len")
        if any(k < 1 or v < 0 or v > (self.max_draft_len or 0) for k, v in s.items()):
            raise ValueError("draft_len_schedule: batch sizes >= 1, draft lengths in 0..max_draft_len")
        return self


class DraftTargetDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Draft_Target"] = "Draft_Target"

    @model_validator(mode="after")
    def validate_draft_target_config(self):
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for DraftTarget")
        if self.speculative_model is None:
            raise ValueError("Draft model must be specified.")
        return self


class NGramDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["NGram"] = "NGram"
    max_matching_ngram_size: PositiveInt = 2
    is_keep_all: bool = True
    is_use_oldest: bool = True
    is_public_pool: bool = True

    @model_validator(mode="after")
    def validate_ngram_config(self):
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for NGram")
        return self


class EagleDecodingConfig(DecodingBaseConfig):
    decoding_type: Literal["Eagle"] = "Eagle"
    use_dynamic_tree: bool | None = False
    dynamic_tree_max_topK: int | None = None
    max_non_leaves_per_layer: int | None = None
    eagle3_layers_to_capture: set[int] | None = None
    eagle3_model_arch: Literal["llama3", "mistral_large3"] = "llama3"


class Eagle3DecodingConfig(EagleDecodingConfig):
    decoding_type: Literal["Eagle3"] = "Eagle3"
    spec_dec_variant: PositiveInt = 3

    @model_validator(mode="after")
    def validate_eagle3_config(self):
        if self.max_draft_len is None or self.max_draft_len <= 0:
            raise ValueError("max_draft_len must be > 0 for Eagle3")
        if self.speculative_model is None:
            raise ValueError("Draft model must be provided for EAGLE")
        return self


SpeculativeConfig = Annotated[
    DraftTargetDecodingConfig | Eagle3DecodingConfig | EagleDecodingConfig | NGramDecodingConfig,
    Field(discriminator="decoding_type"),
]


class KvCacheConfig(StrictBaseModel):
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = 0.9
    dtype: str = "auto"


class TorchLlmArgs(StrictBaseModel):
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
    speculative_config: SpeculativeConfig | None = None


def update_llm_args_with_extra_dict(
    llm_args: dict, llm_args_dict: dict, extra_llm_api_options=None, explicit_cli_keys=None
) -> dict:
    llm_args_dict = dict(llm_args_dict)
    for field_name, field_type in {"kv_cache_config": KvCacheConfig}.items():
        if field_name in llm_args_dict:
            llm_args_dict[field_name] = field_type(**llm_args_dict[field_name])
    return llm_args | llm_args_dict
