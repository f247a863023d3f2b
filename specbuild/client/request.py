"""Request tensors for the ensemble / tensorrt_llm_bls, and what one response carries (pure numpy).

Names and dtypes come from `specbuild.model_repo.tensors` (the tables the repository is
generated from); the client sends only inputs the served model declares (read from its
metadata), so one client talks to both template generations (`seed` vs `random_seed`).

Token ids: the repository's ensemble and BLS return `output_ids` (tokens of this response,
prompt excluded: this client sets `exclude_input_in_output`, whose default is false as upstream) and
`sequence_length` next to `text_output` (flat: one string per request). Streaming responses carry the new
tokens of one engine step (draft/target: one
verification round; Medusa: one tree step), so their sizes give the accepted length per step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specbuild.core.errors import ClientError
from specbuild.core.facts.trtllm import LEGACY_NAMES
from specbuild.core.sampling_params import SamplingParams
from specbuild.model_repo import tensors
from specbuild.model_repo.tensors import BLS

TEXT_OUTPUT = "text_output"
TOKEN_OUTPUT = "output_ids"
LENGTH_OUTPUT = "sequence_length"
FINAL_PARAM = "triton_final_response"  # bool response parameter on every streamed response
PERF_TIMES = ("arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns")
# KV-cache figures (the backend's, and the BLS's draft_ ones: each engine's first call of the request)
KV = tuple(
    f"{prefix}kv_cache_{name}"
    for prefix in ("", "draft_")
    for name in ("alloc_new_blocks", "reused_blocks", "alloc_total_blocks")
)


def _interface(model: str, declared: set[str]):
    """The table of `model`, in the template generation its declared inputs show (seed vs random_seed)."""
    legacy = "random_seed" in declared  # TensorRT-LLM < 0.20 names
    names = LEGACY_NAMES if legacy else tensors.names_for(None)
    return tensors.bls_interface(names) if model == BLS else tensors.ensemble_interface(names)


def request_values(
    prompt: str,
    params: SamplingParams,
    *,
    stream: bool,
    num_draft_tokens: int | None,
    seed_name: str,
    stop_words: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Input name -> python value (one request, batch of one) before dtype/shape are applied."""
    values: dict[str, Any] = {
        "text_input": prompt,
        "max_tokens": params.max_tokens,
        "stream": stream,
        "exclude_input_in_output": True,
        "beam_width": 1,
        "temperature": params.temperature,
        "return_perf_metrics": True,
        "return_num_input_tokens": True,  # 1.2-era templates: the prompt's token count comes back
        "return_num_output_tokens": True,
    }
    if not params.greedy:  # the backends ignore top_k/top_p at T=0; send them only when they matter
        if params.top_k:
            values["top_k"] = params.top_k
        values["top_p"] = params.top_p
    if params.seed is not None:
        values[seed_name] = params.seed
    if params.end_id is not None:
        values["end_id"] = params.end_id
    if num_draft_tokens is not None:
        values["num_draft_tokens"] = num_draft_tokens
    if stop_words:  # the BLS's stop_words: the engines end the request after any of them
        values["stop_words"] = tuple(stop_words)
    return values


def build_inputs(
    model: str,
    prompt: str,
    params: SamplingParams,
    *,
    stream: bool,
    num_draft_tokens: int | None,
    declared: set[str],
    stop_words: tuple[str, ...] = (),
) -> list[tuple[str, Any, str]]:
    """[(name, array [1, ...], wire dtype)] for the inputs `model` declares; raises on a missing one."""

    iface = _interface(model, declared)
    seed_name = "random_seed" if "random_seed" in declared else "seed"
    values = request_values(
        prompt,
        params,
        stream=stream,
        num_draft_tokens=num_draft_tokens,
        seed_name=seed_name,
        stop_words=stop_words,
    )
    if num_draft_tokens is not None and not 0 <= num_draft_tokens <= 2**31 - 1:
        raise ClientError(
            f"num_draft_tokens must be >= 0, got {num_draft_tokens}",
            expected="0 (the target alone) .. max_draft_len",
            found=str(num_draft_tokens),
            fix="pass --num-draft-tokens 4",
        )
    if num_draft_tokens is not None and "num_draft_tokens" not in declared:
        raise ClientError(
            f"model {model!r} does not take num_draft_tokens",
            expected=f"draft/target speculation through {BLS}",
            found=f"{model} inputs: {', '.join(sorted(declared))}",
            fix=f"pass --model {BLS} (a draft/target repository), or drop --num-draft-tokens for Medusa",
        )
    out = []
    for name, value in values.items():
        if name not in declared:
            continue  # an optional input this generation of the templates does not have
        tensor = iface.input(name)
        if tensor.data_type == "TYPE_STRING":
            words = value if isinstance(value, tuple) else (value,)
            try:
                array = np.array([[w.encode("utf-8") for w in words]], dtype=object)  # [1, 1] or [1, n]
            except UnicodeEncodeError as exc:  # a str from bytes that were not UTF-8 (surrogate escapes)
                raise ClientError(
                    f"the {name} is not valid UTF-8 text",
                    expected="UTF-8 text",
                    found=f"an undecodable byte at position {exc.start}",
                    fix="re-encode the prompt as UTF-8",
                ) from None
        else:
            _check_range(name, value, tensor.numpy_dtype)
            array = np.array([[value]], dtype=tensor.numpy_dtype)  # [1, 1]
        out.append((name, array, tensor.wire_dtype))
    return out


_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "uint64": (0, 2**64 - 1)}


def _check_range(name: str, value, dtype: str) -> None:
    """Refuse a value its wire type would wrap (numpy casts silently: 2^31 becomes -2^31)."""
    bounds = _INT_RANGES.get(dtype)
    if bounds is not None and not bounds[0] <= int(value) <= bounds[1]:
        raise ClientError(
            f"{name} {value} does not fit its wire type {dtype.upper()}",
            expected=f"[{bounds[0]}, {bounds[1]}]",
            found=str(value),
            fix=f"pass a smaller {name}",
        )


def build_llmapi_inputs(
    prompt: str,
    params: SamplingParams,
    *,
    stream: bool,
    declared: set[str],
    trtllm_version: str | None = None,
    stop_words: tuple[str, ...] = (),
) -> list[tuple[str, Any, str]]:
    """[(name, array, wire dtype)] for Triton's LLM-API model (tensors.llmapi_interface: no batch dimension,
    every scalar a [1] tensor). The prompt is excluded from text_output, perf metrics and the finish reason
    are asked for; the end token is the model's (this interface has no end_id input); stop_words go in
    sampling_param_stop (SamplingParams.stop: the text ends before the first one)."""
    if params.end_id is not None:
        raise ClientError(
            "the LLM-API interface has no end_id input",
            expected="the model's own end token",
            found=f"end_id {params.end_id}",
            fix="leave end_id unset for an LLM-API server",
        )
    iface = tensors.llmapi_interface(trtllm_version, local=True)
    values: dict[str, Any] = {
        "text_input": prompt,
        "streaming": stream,
        "sampling_param_max_tokens": params.max_tokens,
        "sampling_param_temperature": params.temperature,
        "sampling_param_exclude_input_from_output": True,
        "sampling_param_return_perf_metrics": True,
        "return_finish_reason": True,
    }
    if not params.greedy:
        if params.top_k:
            values["sampling_param_top_k"] = params.top_k
        values["sampling_param_top_p"] = params.top_p
    if params.seed is not None:
        values["sampling_param_seed"] = params.seed
    out = []
    for name, value in values.items():
        if name not in declared:
            continue
        tensor = iface.input(name)
        if tensor.data_type == "TYPE_STRING":
            try:
                array = np.array([value.encode("utf-8")], dtype=object)  # [1]
            except UnicodeEncodeError as exc:
                raise ClientError(
                    "the text_input is not valid UTF-8 text",
                    expected="UTF-8 text",
                    found=f"an undecodable byte at position {exc.start}",
                    fix="re-encode the prompt as UTF-8",
                ) from None
        else:
            _check_range(name, value, tensor.numpy_dtype)
            array = np.array([value], dtype=tensor.numpy_dtype)  # [1]
        out.append((name, array, tensor.wire_dtype))
    if stop_words and "sampling_param_stop" in declared:
        tensor = iface.input("sampling_param_stop")
        try:
            array = np.array([w.encode("utf-8") for w in stop_words], dtype=object)  # [n]
        except UnicodeEncodeError as exc:
            raise ClientError(
                "a stop word is not valid UTF-8 text",
                expected="UTF-8 text",
                found=f"an undecodable character at position {exc.start}",
                fix="re-encode the stop words as UTF-8",
            ) from None
        out.append(("sampling_param_stop", array, tensor.wire_dtype))
    return out


@dataclass
class Chunk:
    """What one response carries (streaming: one engine step; unary: the whole continuation)."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    final: bool = True
    perf: dict[str, float] = field(default_factory=dict)  # return_perf_metrics outputs present
    counts: dict[str, int] = field(default_factory=dict)  # num_input_tokens / num_output_tokens when present
    finish_reason: str | None = None  # the LLM-API interface's finish_reason output, when present


def parse_response(result) -> Chunk:
    """A tritonclient InferResult -> Chunk (`output_ids` [1, beam, T] or [1, T]; beam 0 used)."""
    response = result.get_response()
    final = True
    if FINAL_PARAM in response.parameters:
        final = response.parameters[FINAL_PARAM].bool_param
    names = {o.name for o in response.outputs}
    chunk = Chunk(final=final)
    if TEXT_OUTPUT in names:
        texts = result.as_numpy(TEXT_OUTPUT).reshape(-1)  # [1] per beam; beam 0
        chunk.text = texts[0].decode("utf-8", errors="replace") if len(texts) else ""
    if TOKEN_OUTPUT in names:
        ids = result.as_numpy(TOKEN_OUTPUT)
        ids = ids.reshape(-1, ids.shape[-1])[0] if ids.size else ids.reshape(-1)  # [T] of beam 0
        if LENGTH_OUTPUT in names:
            n = int(result.as_numpy(LENGTH_OUTPUT).reshape(-1)[0])
            ids = ids[:n]
        chunk.token_ids = [int(t) for t in ids]
    for name in ("acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens", *PERF_TIMES, *KV):
        if name in names:
            # numbers, or (real LLM-API servers build them with text_output's dtype) their text
            chunk.perf[name] = float(result.as_numpy(name).reshape(-1)[0])
    if "speculation_stopped" in names:  # the BLS's acceptance guard (specbuild addition)
        chunk.perf["speculation_stopped"] = float(bool(result.as_numpy("speculation_stopped").reshape(-1)[0]))
    for name in ("num_input_tokens", "num_output_tokens"):
        if name in names:
            chunk.counts[name] = int(result.as_numpy(name).reshape(-1)[0])
    if "finish_reason" in names:
        reason = result.as_numpy("finish_reason").reshape(-1)
        if len(reason):
            chunk.finish_reason = reason[0].decode() if isinstance(reason[0], bytes) else str(reason[0])
    return chunk
