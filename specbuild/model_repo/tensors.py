"""The tensor tables of the Triton models: the ONE place where tensor names, types and dims live.

The repository generator builds every `config.pbtxt` input/output from these tables, the Python
models read their tensors by these names, and the client (`specbuild.client`) imports them to build
requests. They follow the TensorRT-LLM backend templates (`inflight_batcher_llm`) of the 1.2 era, the
generation the r26.04-r26.07 containers ship (NVIDIA/TensorRT-LLM `triton_backend/all_models/
inflight_batcher_llm/*/config.pbtxt`; the commits read are in tests/data/triton_backend_contract.json and
docs/model_repo.md). Dims exclude the batch dimension (every model has max_batch_size > 0).

Two inputs were renamed with TensorRT-LLM 0.20: `min_length` -> `min_tokens` and `random_seed` ->
`seed`. `names_for(trtllm_version)` picks the generation; every table takes the resulting `Names`.

Torch-free and numpy-free at import (data types are the protobuf enum names, as strings).
"""

from __future__ import annotations

from dataclasses import dataclass

from specbuild.core.facts.trtllm import TritonInputNames, facts_for

# Protobuf DataType names -> the KServe wire name (tritonclient InferInput datatype) and numpy dtype.
WIRE_DTYPE = {
    "TYPE_BOOL": "BOOL",
    "TYPE_UINT8": "UINT8",
    "TYPE_UINT16": "UINT16",
    "TYPE_UINT32": "UINT32",
    "TYPE_UINT64": "UINT64",
    "TYPE_INT8": "INT8",
    "TYPE_INT16": "INT16",
    "TYPE_INT32": "INT32",
    "TYPE_INT64": "INT64",
    "TYPE_FP16": "FP16",
    "TYPE_FP32": "FP32",
    "TYPE_FP64": "FP64",
    "TYPE_STRING": "BYTES",
    "TYPE_BF16": "BF16",
}
NUMPY_DTYPE = {
    "TYPE_BOOL": "bool",
    "TYPE_UINT8": "uint8",
    "TYPE_UINT16": "uint16",
    "TYPE_UINT32": "uint32",
    "TYPE_UINT64": "uint64",
    "TYPE_INT8": "int8",
    "TYPE_INT16": "int16",
    "TYPE_INT32": "int32",
    "TYPE_INT64": "int64",
    "TYPE_FP16": "float16",
    "TYPE_FP32": "float32",
    "TYPE_FP64": "float64",
    "TYPE_STRING": "object",
}
# An engine's logits dtype (its config.json) as the Triton type of generation_logits / draft_logits.
LOGITS_DTYPE_OF = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16"}
DEFAULT_LOGITS_DTYPE = "TYPE_FP32"

# The models of a repository. Engine models are named by their build role.
ENSEMBLE, BLS, PREPROCESSING, POSTPROCESSING = (
    "ensemble",
    "tensorrt_llm_bls",
    "preprocessing",
    "postprocessing",
)
TARGET_MODEL, DRAFT_MODEL = "tensorrt_llm", "tensorrt_llm_draft"
ROLE_MODELS = {"target": TARGET_MODEL, "draft": DRAFT_MODEL}
PROMPT_TABLE_DTYPES = ("TYPE_FP16", "TYPE_BF16", "TYPE_FP32")  # `prompt_embedding_table_data_type` values
DEFAULT_PROMPT_TABLE_DTYPE = "TYPE_FP16"  # the value every tensorrtllm_backend r26.07 docs example fills in


@dataclass(frozen=True)
class Tensor:
    """One config.pbtxt input or output."""

    name: str
    data_type: str  # protobuf DataType name, e.g. "TYPE_INT32"
    dims: tuple[int, ...]  # batch dim excluded; -1 = variable
    optional: bool = False  # inputs only: may be omitted by the caller
    reshape: bool = False  # inputs only: `reshape: { shape: [ ] }` (a scalar per batch item)
    ragged: bool = False  # inputs only: `allow_ragged_batch: true`

    @property
    def wire_dtype(self) -> str:
        """The datatype string a tritonclient InferInput uses (TYPE_STRING -> BYTES)."""
        return WIRE_DTYPE[self.data_type]

    @property
    def numpy_dtype(self) -> str:
        return NUMPY_DTYPE[self.data_type]


Names = TritonInputNames  # the input names that depend on the TensorRT-LLM version (core/facts/trtllm.py)


def names_for(trtllm_version: str | None = None) -> Names:
    """The input-name generation for a TensorRT-LLM version (None: the project's default version)."""
    return facts_for(trtllm_version).input_names


@dataclass(frozen=True)
class Interface:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]

    def input(self, name: str) -> Tensor:
        return _find(self.inputs, name, "input")

    def output(self, name: str) -> Tensor:
        return _find(self.outputs, name, "output")

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.outputs)


def _find(tensors: tuple[Tensor, ...], name: str, kind: str) -> Tensor:
    for t in tensors:
        if t.name == name:
            return t
    raise KeyError(f"no {kind} tensor named {name!r}")


def _t(name: str, dtype: str, dims: tuple[int, ...], flags: str = "") -> Tensor:
    """Compact table row: flags is a subset of 'opt r rag' (optional, reshape [], ragged)."""
    f = set(flags.split())
    assert f <= {"opt", "r", "rag"}, flags
    return Tensor(
        name, "TYPE_" + dtype, tuple(dims), optional="opt" in f, reshape="r" in f, ragged="rag" in f
    )


# ---- tensorrt_llm (the C++ backend's interface; the local Python model implements the same) --------


def tensorrt_llm_interface(
    names: Names,
    *,
    logits_dtype: str = DEFAULT_LOGITS_DTYPE,
    prompt_table_dtype: str = DEFAULT_PROMPT_TABLE_DTYPE,
) -> Interface:
    """prompt_table_dtype: the template's `${prompt_embedding_table_data_type}` (the engine's dtype)."""
    lg = logits_dtype.removeprefix("TYPE_")
    inputs = [
        _t("input_ids", "INT32", (-1,), "opt rag"),
        _t("encoder_input_features", "FP16", (-1, -1), "opt rag"),
        _t("encoder_output_lengths", "INT32", (1,), "opt r"),
        _t("input_lengths", "INT32", (1,), "r"),
        _t("request_output_len", "INT32", (1,), "r"),
        _t("num_return_sequences", "INT32", (1,), "opt r"),
        _t("draft_input_ids", "INT32", (-1,), "opt rag"),
        _t("decoder_input_ids", "INT32", (-1,), "opt rag"),
        _t("decoder_input_lengths", "INT32", (1,), "opt r"),
        _t("draft_logits", lg, (-1, -1), "opt rag"),
        _t("draft_acceptance_threshold", "FP32", (1,), "opt r"),
        _t("end_id", "INT32", (1,), "opt r"),
        _t("pad_id", "INT32", (1,), "opt r"),
        _t("stop_words_list", "INT32", (2, -1), "opt rag"),
        _t("bad_words_list", "INT32", (2, -1), "opt rag"),
        _t("embedding_bias", "FP32", (-1,), "opt rag"),
        *(
            _t(n, d, (1,), "opt r")
            for n, d in [
                ("beam_width", "INT32"),
                ("temperature", "FP32"),
                ("runtime_top_k", "INT32"),
                ("runtime_top_p", "FP32"),
                ("runtime_top_p_min", "FP32"),
                ("runtime_top_p_decay", "FP32"),
                ("runtime_top_p_reset_ids", "INT32"),
                ("len_penalty", "FP32"),
                ("early_stopping", "BOOL"),
                ("repetition_penalty", "FP32"),
                (names.min_tokens, "INT32"),
                ("beam_search_diversity_rate", "FP32"),
                ("presence_penalty", "FP32"),
                ("frequency_penalty", "FP32"),
                (names.seed, "UINT64"),
                ("return_log_probs", "BOOL"),
                ("return_context_logits", "BOOL"),
                ("return_generation_logits", "BOOL"),
                ("return_perf_metrics", "BOOL"),
                ("return_num_input_tokens", "BOOL"),
                ("return_num_output_tokens", "BOOL"),
                ("exclude_input_in_output", "BOOL"),
                ("stop", "BOOL"),
                ("streaming", "BOOL"),
            ]
        ),
        _t("prompt_embedding_table", prompt_table_dtype.removeprefix("TYPE_"), (-1, -1), "opt rag"),
        _t("prompt_table_extra_ids", "UINT64", (-1,), "opt rag"),
        _t("prompt_vocab_size", "INT32", (1,), "opt r"),
        _t("cross_attention_mask", "BOOL", (-1, -1), "opt rag"),
        _t("mrope_rotary_cos_sin", "FP32", (-1,), "opt"),
        _t("mrope_position_deltas", "INT64", (1,), "opt"),
        _t("lora_task_id", "UINT64", (1,), "opt r"),
        _t("lora_weights", "FP16", (-1, -1), "opt rag"),
        _t("lora_config", "INT32", (-1, 3), "opt rag"),
        _t("context_phase_params", "UINT8", (-1,), "opt rag"),
        _t("skip_cross_attn_blocks", "BOOL", (1,), "opt rag"),
        *(
            _t(f"retention_token_range_{s}", "INT32", (-1,), "opt rag")
            for s in ("starts", "ends", "priorities", "durations_ms")
        ),
        _t("retention_decode_priority", "INT32", (1,), "opt rag"),
        _t("retention_decode_duration_ms", "INT32", (1,), "opt rag"),
        _t("guided_decoding_guide_type", "STRING", (1,), "opt rag"),
        _t("guided_decoding_guide", "STRING", (1,), "opt rag"),
        _t("lookahead_window_size", "INT32", (1,), "opt rag"),
        _t("lookahead_ngram_size", "INT32", (1,), "opt rag"),
        _t("lookahead_verification_set_size", "INT32", (1,), "opt rag"),
    ]
    outputs = [
        _t("output_ids", "INT32", (-1, -1)),  # (beam, tokens)
        _t("sequence_length", "INT32", (-1,)),  # (beam,)
        _t("cum_log_probs", "FP32", (-1,)),
        _t("output_log_probs", "FP32", (-1, -1)),
        _t("context_logits", lg, (-1, -1)),  # (prompt tokens, vocab)
        _t("generation_logits", lg, (-1, -1, -1)),  # (beam, new tokens, vocab)
        _t("batch_index", "INT32", (1,)),
        _t("sequence_index", "INT32", (1,)),
        _t("context_phase_params", "UINT8", (-1,)),
        *_perf_outputs(),
        *_token_count_outputs(),
    ]
    return Interface(tuple(inputs), tuple(outputs))


# The request's times and draft counters, named alike by tensorrt_llm and the LLM-API model (dims [1]).
REQUEST_PERF_OUTPUTS = (
    _t("arrival_time_ns", "INT64", (1,)),
    _t("first_scheduled_time_ns", "INT64", (1,)),
    _t("first_token_time_ns", "INT64", (1,)),
    _t("last_token_time_ns", "INT64", (1,)),
    _t("acceptance_rate", "FP32", (1,)),
    _t("total_accepted_draft_tokens", "INT32", (1,)),
    _t("total_draft_tokens", "INT32", (1,)),
)
# tensorrt_llm's (and the BLS's, the ensemble's) perf outputs: filled only when the request sets
# return_perf_metrics (times: ns since the epoch). The local engine model fills them from this table and
# the BLS forwards them by these names (it is vendored into the BLS for that: generate.VENDORED_MODULES).
PERF_OUTPUTS = (
    _t("kv_cache_alloc_new_blocks", "INT32", (1,)),
    _t("kv_cache_reused_blocks", "INT32", (1,)),
    _t("kv_cache_alloc_total_blocks", "INT32", (1,)),
    *REQUEST_PERF_OUTPUTS,
)
PERF_OUTPUT_NAMES = tuple(t.name for t in PERF_OUTPUTS)
KV_OUTPUT_NAMES = tuple(n for n in PERF_OUTPUT_NAMES if n.startswith("kv_cache_"))  # per engine: summed


def _perf_outputs() -> list[Tensor]:
    return list(PERF_OUTPUTS)


def _token_count_outputs() -> list[Tensor]:
    """Filled only when the request sets return_num_input_tokens / return_num_output_tokens (1.2-era
    templates): the prompt's token count, and the token count of that response's output_ids."""
    return [_t("num_input_tokens", "INT32", (1,)), _t("num_output_tokens", "INT32", (1,))]


# ---- preprocessing / postprocessing ---------------------------------------------------------------


def preprocessing_interface() -> Interface:
    inputs = [
        _t("QUERY", "STRING", (1,)),
        _t("DECODER_QUERY", "STRING", (1,), "opt"),
        _t("IMAGE_BYTES", "UINT8", (-1, -1, -1, -1), "opt"),
        _t("IMAGE_URL", "STRING", (1,), "opt"),
        _t("IMAGES", "STRING", (-1,), "opt"),  # 1.2-era templates (pixtral); multimodal is refused here
        _t("VIDEO_BYTES", "UINT8", (-1, -1, -1, -1), "opt"),
        _t("REQUEST_OUTPUT_LEN", "INT32", (1,)),
        _t("BAD_WORDS_DICT", "STRING", (-1,), "opt"),
        _t("STOP_WORDS_DICT", "STRING", (-1,), "opt"),
        _t("EMBEDDING_BIAS_WORDS", "STRING", (-1,), "opt"),
        _t("EMBEDDING_BIAS_WEIGHTS", "FP32", (-1,), "opt"),
        _t("END_ID", "INT32", (1,), "opt"),
        _t("PAD_ID", "INT32", (1,), "opt"),
        _t("PROMPT_TABLE_EXTRA_ID", "UINT64", (1,), "opt"),
    ]
    outputs = [
        _t("INPUT_ID", "INT32", (-1,)),
        _t("REQUEST_INPUT_LEN", "INT32", (1,)),
        _t("DECODER_INPUT_ID", "INT32", (-1,)),
        _t("REQUEST_DECODER_INPUT_LEN", "INT32", (1,)),
        _t("BAD_WORDS_IDS", "INT32", (2, -1)),  # row 0: ids, row 1: end offsets (-1 padded)
        _t("STOP_WORDS_IDS", "INT32", (2, -1)),
        _t("EMBEDDING_BIAS", "FP32", (-1,)),
        _t("REQUEST_OUTPUT_LEN", "INT32", (-1,)),
        _t("OUT_END_ID", "INT32", (1,)),
        _t("OUT_PAD_ID", "INT32", (1,)),
        _t("OUT_PROMPT_TABLE_EXTRA_IDS", "UINT64", (-1,)),
        # Multimodal outputs: declared for interface parity; this project never fills them.
        _t("PIXEL_VALUES", "FP16", (-1, -1, -1, -1)),
        _t("ASPECT_RATIO_IDS", "INT64", (-1,)),
        _t("ASPECT_RATIO_MASK", "INT64", (-1, -1)),
        _t("CROSS_ATTENTION_MASK", "INT64", (-1, -1, -1)),
        _t("IMAGE_SIZES", "INT64", (-1, 2)),
        _t("IS_VIDEO_INPUT", "BOOL", (1,)),
        _t("ATTENTION_MASK", "INT64", (-1,)),
        _t("IMAGE_GRID_THW", "INT64", (3,)),
        _t("VISION_INPUT_ID", "INT32", (-1,)),
    ]
    return Interface(tuple(inputs), tuple(outputs))


def postprocessing_interface() -> Interface:
    """OUTPUT is flat: one string per batch item and beam ([b * beams] with the batch dim), as upstream."""
    return Interface(
        (_t("TOKENS_BATCH", "INT32", (-1, -1)), _t("SEQUENCE_LENGTH", "INT32", (-1,))),
        (_t("OUTPUT", "STRING", (-1,)), *POSTPROCESSING_EXTRA_OUTPUTS),
    )


# specbuild additions to postprocessing (not in the upstream templates): the token ids it detokenized,
# passed through so the ensemble can return them (EXTRA_TEXT_OUTPUTS) without exposing a tensorrt_llm
# output that also feeds a later step (Triton prunes such a step when the client does not ask for it).
POSTPROCESSING_EXTRA_OUTPUTS = (
    _t("OUTPUT_IDS", "INT32", (-1, -1)),
    _t("OUTPUT_SEQUENCE_LENGTH", "INT32", (-1,)),
)


# ---- the external interfaces: ensemble and tensorrt_llm_bls ---------------------------------------

# specbuild additions to the ensemble and BLS outputs (not in the upstream templates): the token ids of
# each response (streamed: that response's new tokens), so clients get token ids and can count tokens
# per step. The ensemble takes them from postprocessing's pass-through (POSTPROCESSING_EXTRA_OUTPUTS);
# tensorrt_llm's output_ids / sequence_length reach postprocessing through the internal _TOKENS_BATCH /
# _SEQUENCE_LENGTH tensors, as upstream, so a client that asks for text_output alone gets it.
EXTRA_TEXT_OUTPUTS = ("output_ids", "sequence_length")


def _text_outputs(lg: str) -> list[Tensor]:
    return [
        _t("text_output", "STRING", (-1,)),
        _t("cum_log_probs", "FP32", (-1,)),
        _t("output_log_probs", "FP32", (-1, -1)),
        _t("context_logits", lg, (-1, -1)),
        _t("generation_logits", lg, (-1, -1, -1)),
        _t("batch_index", "INT32", (1,)),
        _t("sequence_index", "INT32", (1,)),
        *_perf_outputs(),
        *_token_count_outputs(),
        _t("output_ids", "INT32", (-1, -1)),  # specbuild addition, see EXTRA_TEXT_OUTPUTS
        _t("sequence_length", "INT32", (-1,)),  # specbuild addition
    ]


def ensemble_interface(names: Names, *, logits_dtype: str = DEFAULT_LOGITS_DTYPE) -> Interface:
    scalars = [
        ("num_return_sequences", "INT32"),
        ("exclude_input_in_output", "BOOL"),
        ("end_id", "INT32"),
        ("pad_id", "INT32"),
        ("top_k", "INT32"),
        ("top_p", "FP32"),
        ("temperature", "FP32"),
        ("length_penalty", "FP32"),
        ("repetition_penalty", "FP32"),
        (names.min_tokens, "INT32"),
        ("presence_penalty", "FP32"),
        ("frequency_penalty", "FP32"),
        (names.seed, "UINT64"),
        ("return_log_probs", "BOOL"),
        ("return_context_logits", "BOOL"),
        ("return_generation_logits", "BOOL"),
        ("return_perf_metrics", "BOOL"),
        ("return_num_input_tokens", "BOOL"),
        ("return_num_output_tokens", "BOOL"),
        ("beam_width", "INT32"),
        ("stream", "BOOL"),
    ]
    inputs = [
        _t("text_input", "STRING", (1,)),
        _t("decoder_text_input", "STRING", (1,), "opt"),
        _t("max_tokens", "INT32", (1,)),
        *(_t(n, d, (1,), "opt") for n, d in scalars[:1]),
        _t("bad_words", "STRING", (-1,), "opt"),
        _t("stop_words", "STRING", (-1,), "opt"),
        *(_t(n, d, (1,), "opt") for n, d in scalars[1:]),
        _t("prompt_embedding_table", "FP16", (-1, -1), "opt"),
        _t("prompt_table_extra_id", "UINT64", (1,), "opt"),
        _t("prompt_vocab_size", "INT32", (1,), "opt"),
        _t("embedding_bias_words", "STRING", (-1,), "opt"),
        _t("embedding_bias_weights", "FP32", (-1,), "opt"),
        _t("lora_task_id", "UINT64", (1,), "opt"),
        _t("lora_weights", "FP16", (-1, -1), "opt rag"),
        _t("lora_config", "INT32", (-1, 3), "opt rag"),
        _t("guided_decoding_guide_type", "STRING", (1,), "opt rag"),
        _t("guided_decoding_guide", "STRING", (1,), "opt rag"),
    ]
    return Interface(tuple(inputs), tuple(_text_outputs(logits_dtype.removeprefix("TYPE_"))))


# specbuild additions to the BLS (not in the upstream templates): with return_perf_metrics, the draft
# engine's KV-cache figures of its first call of the request (how much of the prompt the draft reused),
# next to the target's in kv_cache_* (the BLS reports each engine's first call: the prompt's prefix reuse).
BLS_EXTRA_OUTPUTS = (
    _t("draft_kv_cache_alloc_new_blocks", "INT32", (1,)),
    _t("draft_kv_cache_reused_blocks", "INT32", (1,)),
    _t("draft_kv_cache_alloc_total_blocks", "INT32", (1,)),
    # with return_perf_metrics: true when the acceptance guard stopped drafting for the request
    # (core/perf/schedule.py AcceptanceGuard)
    _t("speculation_stopped", "BOOL", (1,)),
)


def bls_interface(names: Names, *, logits_dtype: str = DEFAULT_LOGITS_DTYPE) -> Interface:
    inputs = [
        _t("text_input", "STRING", (1,)),
        _t("decoder_text_input", "STRING", (1,), "opt"),
        _t("image_input", "FP16", (-1, 3, -1, -1), "opt"),
        _t("image_bytes_input", "UINT8", (-1, -1, -1, -1), "opt"),
        _t("image_url_input", "STRING", (1,), "opt"),
        _t("video_bytes_input", "UINT8", (-1, -1, -1, -1), "opt"),
        _t("max_tokens", "INT32", (1,)),
        _t("bad_words", "STRING", (-1,), "opt"),
        _t("stop_words", "STRING", (-1,), "opt"),
        *(
            _t(n, d, (1,), "opt")
            for n, d in [
                ("exclude_input_in_output", "BOOL"),
                ("end_id", "INT32"),
                ("pad_id", "INT32"),
                ("top_k", "INT32"),
                ("top_p", "FP32"),
                ("temperature", "FP32"),
                ("length_penalty", "FP32"),
                ("repetition_penalty", "FP32"),
                (names.min_tokens, "INT32"),
                ("presence_penalty", "FP32"),
                ("frequency_penalty", "FP32"),
                (names.seed, "UINT64"),
            ]
        ),
        *(
            _t(n, d, (1,), "opt r")
            for n, d in [
                ("return_log_probs", "BOOL"),
                ("return_context_logits", "BOOL"),
                ("return_generation_logits", "BOOL"),
                ("num_return_sequences", "INT32"),
            ]
        ),
        _t("beam_width", "INT32", (1,), "opt"),
        _t("stream", "BOOL", (1,), "opt"),
        _t("prompt_embedding_table", "FP16", (-1, -1), "opt"),
        _t("prompt_vocab_size", "INT32", (1,), "opt"),
        _t("prompt_table_extra_id", "UINT64", (1,), "opt"),
        _t("embedding_bias_words", "STRING", (-1,), "opt"),
        _t("embedding_bias_weights", "FP32", (-1,), "opt"),
        _t("num_draft_tokens", "INT32", (1,), "opt"),  # > 0: draft/target speculation in the BLS
        _t("use_draft_logits", "BOOL", (1,), "opt r"),  # lossless rejection sampling on draft logits
        _t("lora_task_id", "UINT64", (1,), "opt r"),
        _t("lora_weights", "FP16", (-1, -1), "opt rag"),
        _t("lora_config", "INT32", (-1, 3), "opt rag"),
        _t("return_perf_metrics", "BOOL", (1,), "opt r"),
        _t("return_num_input_tokens", "BOOL", (1,), "opt r"),
        _t("return_num_output_tokens", "BOOL", (1,), "opt r"),
        _t("guided_decoding_guide_type", "STRING", (1,), "opt"),
        _t("guided_decoding_guide", "STRING", (1,), "opt"),
    ]
    outputs = (*_text_outputs(logits_dtype.removeprefix("TYPE_")), *BLS_EXTRA_OUTPUTS)
    return Interface(tuple(inputs), outputs)


# ---- Triton's LLM-API model (triton_backend/all_models/llmapi/tensorrt_llm) ------------------------

LLMAPI_MODEL = "tensorrt_llm"  # the LLM-API repository's one model
LLMAPI_OPTIONS = "model.yaml"  # in its version folder: the LLM() kwargs plus triton_config
# specbuild additions of the local LLM-API model (not upstream): the token ids of each response (streamed:
# that step's new tokens), so a client can count tokens and tokens per step; upstream returns text only.
LLMAPI_EXTRA_OUTPUTS = (_t("output_ids", "INT32", (-1,)),)
# The generation of the upstream table per TensorRT-LLM version (tests/data/triton_llmapi_contract.json):
# "2025" = @c8c6df08 (text, sampling, perf outputs), "2026" = @0a710573 (+ image_url, lora_*).
LLMAPI_TABLES = {"1.2.1": "2025", "1.4.0rc4": "2026"}


def llmapi_interface(trtllm_version: str | None = None, *, local: bool = False) -> Interface:
    """The LLM-API model's tensors (dims without a batch dimension: its max_batch_size is 0). `local`: with
    the specbuild additions the local model fills (LLMAPI_EXTRA_OUTPUTS)."""
    table = LLMAPI_TABLES.get(str(trtllm_version or "1.2.1"), "2026")
    sampling = [
        ("best_of", "INT32"),
        ("temperature", "FP32"),
        ("top_k", "INT32"),
        ("top_p", "FP32"),
        ("frequency_penalty", "FP32"),
        ("presence_penalty", "FP32"),
        ("max_tokens", "INT32"),
    ]
    inputs = [
        _t("text_input", "STRING", (-1,)),
        *([_t("image_url", "STRING", (-1,), "opt")] if table == "2026" else []),
        _t("streaming", "BOOL", (1,), "opt"),
        *(_t(f"sampling_param_{n}", d, (1,), "opt") for n, d in sampling),
        _t("sampling_param_stop", "STRING", (-1,), "opt"),
        _t("sampling_param_seed", "UINT64", (1,), "opt"),
        _t("sampling_param_exclude_input_from_output", "BOOL", (1,), "opt"),
        _t("sampling_param_return_perf_metrics", "BOOL", (1,), "opt"),
        _t("return_finish_reason", "BOOL", (1,), "opt"),
        _t("return_stop_reason", "BOOL", (1,), "opt"),
        _t("return_cumulative_logprob", "BOOL", (1,), "opt"),
        _t("stop", "BOOL", (1,), "opt"),
    ]
    if table == "2026":
        inputs += [
            _t("lora_id", "UINT64", (1,), "opt"),
            _t("lora_name", "STRING", (1,), "opt"),
            _t("lora_path", "STRING", (1,), "opt"),
            _t("lora_ckpt_source", "STRING", (1,), "opt"),
        ]
    outputs = [
        _t("text_output", "STRING", (-1,)),
        _t("finish_reason", "STRING", (-1,)),
        _t("stop_reason", "STRING", (-1,)),
        _t("cumulative_logprob", "FP32", (-1,)),
        *LLMAPI_PERF_OUTPUTS,
        *(LLMAPI_EXTRA_OUTPUTS if local else ()),
    ]
    return Interface(tuple(inputs), tuple(outputs))


# Filled when the request sets sampling_param_return_perf_metrics (and the LLM return_perf_metrics).
LLMAPI_PERF_OUTPUTS = (
    _t("kv_cache_reused_block", "INT32", (-1,)),
    _t("kv_cache_missed_block", "INT32", (-1,)),
    _t("kv_cache_alloc_new_blocks", "INT32", (-1,)),
    _t("kv_cache_alloc_total_blocks", "INT32", (-1,)),
    _t("kv_cache_hit_rate", "FP32", (-1,)),
    *REQUEST_PERF_OUTPUTS,
)


def is_llmapi_interface(input_names) -> bool:
    """Whether a model's inputs are the LLM-API model's (text_input + sampling_param_*), not the BLS's."""
    names = set(input_names)
    return "text_input" in names and "sampling_param_max_tokens" in names


# ---- the ensemble's three steps: (model, input_map model<-ensemble, output_map model->ensemble) ------


@dataclass(frozen=True)
class Step:
    model_name: str
    input_map: tuple[tuple[str, str], ...]  # (step-model input, ensemble tensor)
    output_map: tuple[tuple[str, str], ...]  # (step-model output, ensemble tensor)


def ensemble_steps(names: Names, *, llm_model: str = "tensorrt_llm") -> tuple[Step, ...]:
    pre = Step(
        "preprocessing",
        (
            ("QUERY", "text_input"),
            ("DECODER_QUERY", "decoder_text_input"),
            ("REQUEST_OUTPUT_LEN", "max_tokens"),
            ("BAD_WORDS_DICT", "bad_words"),
            ("STOP_WORDS_DICT", "stop_words"),
            ("EMBEDDING_BIAS_WORDS", "embedding_bias_words"),
            ("EMBEDDING_BIAS_WEIGHTS", "embedding_bias_weights"),
            ("END_ID", "end_id"),
            ("PAD_ID", "pad_id"),
            ("PROMPT_TABLE_EXTRA_ID", "prompt_table_extra_id"),
        ),
        (
            ("REQUEST_INPUT_LEN", "_REQUEST_INPUT_LEN"),
            ("INPUT_ID", "_INPUT_ID"),
            ("REQUEST_DECODER_INPUT_LEN", "_REQUEST_DECODER_INPUT_LEN"),
            ("DECODER_INPUT_ID", "_DECODER_INPUT_ID"),
            ("REQUEST_OUTPUT_LEN", "_REQUEST_OUTPUT_LEN"),
            ("STOP_WORDS_IDS", "_STOP_WORDS_IDS"),
            ("BAD_WORDS_IDS", "_BAD_WORDS_IDS"),
            ("EMBEDDING_BIAS", "_EMBEDDING_BIAS"),
            ("OUT_END_ID", "_PREPROCESSOR_END_ID"),
            ("OUT_PAD_ID", "_PREPROCESSOR_PAD_ID"),
            ("OUT_PROMPT_TABLE_EXTRA_IDS", "_OUT_PROMPT_TABLE_EXTRA_IDS"),
        ),
    )
    same = [
        "temperature",
        "repetition_penalty",
        names.min_tokens,
        "presence_penalty",
        "frequency_penalty",
        names.seed,
        "return_log_probs",
        "return_context_logits",
        "return_generation_logits",
        "return_perf_metrics",
        "return_num_input_tokens",
        "return_num_output_tokens",
        "num_return_sequences",
        "beam_width",
        "prompt_embedding_table",
        "prompt_vocab_size",
        "lora_task_id",
        "lora_weights",
        "lora_config",
        "guided_decoding_guide_type",
        "guided_decoding_guide",
        "exclude_input_in_output",
    ]
    llm_inputs = (
        ("input_ids", "_INPUT_ID"),
        ("decoder_input_ids", "_DECODER_INPUT_ID"),
        ("input_lengths", "_REQUEST_INPUT_LEN"),
        ("decoder_input_lengths", "_REQUEST_DECODER_INPUT_LEN"),
        ("request_output_len", "_REQUEST_OUTPUT_LEN"),
        ("end_id", "_PREPROCESSOR_END_ID"),
        ("pad_id", "_PREPROCESSOR_PAD_ID"),
        ("embedding_bias", "_EMBEDDING_BIAS"),
        ("runtime_top_k", "top_k"),
        ("runtime_top_p", "top_p"),
        ("len_penalty", "length_penalty"),
        ("streaming", "stream"),
        ("stop_words_list", "_STOP_WORDS_IDS"),
        ("bad_words_list", "_BAD_WORDS_IDS"),
        ("prompt_table_extra_ids", "_OUT_PROMPT_TABLE_EXTRA_IDS"),
        *((n, n) for n in same),
    )
    # As upstream: output_ids / sequence_length feed postprocessing through internal tensors no client can
    # request (an ensemble output that also feeds a step is pruned when not requested: a deadlock), every
    # other tensorrt_llm output goes to the same-named ensemble output.
    internal = {"output_ids": "_TOKENS_BATCH", "sequence_length": "_SEQUENCE_LENGTH"}
    llm_outputs = tuple(internal.items()) + tuple(
        (t.name, t.name) for t in _text_outputs("FP32") if t.name != "text_output" and t.name not in internal
    )
    llm = Step(llm_model, llm_inputs, llm_outputs)
    post = Step(
        "postprocessing",
        (("TOKENS_BATCH", "_TOKENS_BATCH"), ("SEQUENCE_LENGTH", "_SEQUENCE_LENGTH")),
        (
            ("OUTPUT", "text_output"),
            ("OUTPUT_IDS", "output_ids"),
            ("OUTPUT_SEQUENCE_LENGTH", "sequence_length"),
        ),
    )
    return (pre, llm, post)


def interface(
    model: str,
    *,
    trtllm_version: str | None = None,
    logits_dtype: str = DEFAULT_LOGITS_DTYPE,
    prompt_table_dtype: str = DEFAULT_PROMPT_TABLE_DTYPE,
) -> Interface:
    """The interface of one model kind: tensorrt_llm (also the draft), preprocessing, postprocessing,
    ensemble or tensorrt_llm_bls."""
    names = names_for(trtllm_version)
    if model in ("tensorrt_llm", "tensorrt_llm_draft"):
        return tensorrt_llm_interface(names, logits_dtype=logits_dtype, prompt_table_dtype=prompt_table_dtype)
    if model == "preprocessing":
        return preprocessing_interface()
    if model == "postprocessing":
        return postprocessing_interface()
    if model == "ensemble":
        return ensemble_interface(names, logits_dtype=logits_dtype)
    if model == "tensorrt_llm_bls":
        return bls_interface(names, logits_dtype=logits_dtype)
    raise KeyError(f"unknown model kind {model!r}")
