"""The limits trtllm-build records in an engine's config.json `build_config`, and what they allow.

One place computes them, from the same rules as TensorRT-LLM 1.2 (read in `tensorrt_llm/builder.py`
@008b2b8d23af: `_init_max_seq_len`, `check_max_num_tokens` in `_common.py`, `build()`):

1. `max_input_len` is clipped to `max_seq_len`.
2. `check_max_num_tokens` (before any speculative change): `max_num_tokens` (CLI default 8192) is
   capped at `max_seq_len x max_batch_size`, then raised to `tokens_per_block` (context FMHA on);
   `opt_num_tokens` = min(max_batch_size x max_beam_width, max_num_tokens).
3. `build()` for a speculative engine: `max_seq_len += max_draft_len`, and `max_num_tokens` is raised
   to at least `max_batch_size x (max_draft_len + 1)`.

`BuildConfig.to_dict()` keeps `speculative_decoding_mode` as the `SpeculativeDecodingMode` IntFlag,
which json writes as its integer (`tensorrt_llm/models/modeling_utils.py` @01ea6d79d454:
NONE=1, DRAFT_TOKENS_EXTERNAL=2, MEDUSA=4, LOOKAHEAD_DECODING=8, EXPLICIT_DRAFT_TOKENS=16, EAGLE=32),
and `kv_cache_type` as its name.

The runtime's prompt limit (`cpp/tensorrt_llm/batch_manager/trtGptModel.h`, TrtGptModel constructor):
with chunked context `max_seq_len - 1`; otherwise, with packed input (remove_input_padding) and
context FMHA, both always on here, `min(max_seq_len - 1, max_num_tokens)`, where both are the
engine's recorded values. trtllm-build ignores `max_input_len` in that case ("padding removal and
fMHA are both enabled, max_input_len is not required and will be ignored").
"""

from __future__ import annotations

from enum import IntFlag
from typing import Any

DEFAULT_MAX_NUM_TOKENS = 8192  # trtllm-build --max_num_tokens default (BuildConfig.max_num_tokens)
TOKENS_PER_BLOCK = 32  # the 1.x PluginConfig default, recorded in build_config.plugin_config
MAX_BEAM_WIDTH = 1  # speculative decoding is beam-free in TensorRT-LLM


class SpeculativeDecodingMode(IntFlag):
    """TensorRT-LLM's IntFlag (modeling_utils.py); an engine's config.json holds the integer."""

    NONE = 1
    DRAFT_TOKENS_EXTERNAL = 2
    MEDUSA = 4
    LOOKAHEAD_DECODING = 8
    EXPLICIT_DRAFT_TOKENS = 16
    EAGLE = 32

    @classmethod
    def from_cli(cls, name: str | None) -> SpeculativeDecodingMode:
        """The `--speculative_decoding_mode` string (None: no speculation), as from_arguments maps it."""
        return cls.NONE if name is None else cls[name.upper()]

    @classmethod
    def from_recorded(cls, value: Any) -> SpeculativeDecodingMode | None:
        """What an engine's build_config holds: the integer (trtllm-build), or a CLI name / None
        (folders written by specbuild before it recorded the integer). None when unreadable."""
        if value is None:
            return cls.NONE
        if isinstance(value, bool):
            return None
        if isinstance(value, int):  # one defined mode only (an IntFlag would also take unknown bits)
            return cls._value2member_map_.get(value)
        if isinstance(value, str):
            name = value.split(".")[-1].upper()  # also "SpeculativeDecodingMode.MEDUSA"
            if name.isdigit():
                return cls.from_recorded(int(name))
            return cls.__members__.get(name)
        return None

    @property
    def cli_name(self) -> str | None:
        return None if self is SpeculativeDecodingMode.NONE else self.name.lower()


def engine_limits(
    *, max_batch_size: int, max_input_len: int, max_seq_len: int, max_num_tokens: int | None, max_draft_len: int,
    speculative: bool,
) -> dict[str, int]:
    """max_input_len, max_seq_len, max_num_tokens and opt_num_tokens as the built engine records them.

    `max_seq_len` is the value passed to trtllm-build (before the speculative increase).
    """
    input_len = min(max_input_len, max_seq_len)
    tokens = DEFAULT_MAX_NUM_TOKENS if max_num_tokens is None else max_num_tokens
    tokens = min(tokens, max_seq_len * max_batch_size)
    tokens = max(tokens, TOKENS_PER_BLOCK)  # context FMHA on
    opt = min(max_batch_size * MAX_BEAM_WIDTH, tokens)
    seq = max_seq_len
    if speculative:
        seq += max_draft_len
        tokens = max(tokens, max_batch_size * (max_draft_len + 1))
    return {"max_input_len": input_len, "max_seq_len": seq, "max_num_tokens": tokens, "opt_num_tokens": opt}


def prompt_limit(build_config: dict[str, Any], *, enable_chunked_context: bool) -> int:
    """The longest prompt (tokens) the runtime accepts for an engine with this build_config (the one
    rule lives in specbuild.engine_limits, which the serving side and the vendored BLS use too)."""
    from specbuild.engine_limits import EngineLimits

    return EngineLimits.from_build_config(build_config, enable_chunked_context=enable_chunked_context).max_input_len
