"""The local LLM-API model without Triton: read a request as Triton's LLM-API `tensorrt_llm` model does,
apply the LLM API's limits, shape the outputs (plain Python + numpy; unit-tested with a fake getter).

What upstream does with each input (triton_backend/all_models/llmapi/tensorrt_llm/1/model.py, read at
b35ac1b6 (1.2.0rc2) and 044a90d2; docs/llmapi.md), and what this model does:
* text_input (required, 1-D): the prompt is its first element, tokenized with the target's tokenizer
  (special tokens added, as the LLM API's tokenizer call does);
* sampling_param_{temperature, top_k, top_p, seed, max_tokens}: SamplingParams kwargs. Greedy when
  temperature is 0, top_k is 1, or none of the three is given (UNVERIFIED for the PyTorch sampler's
  defaults; clients send temperature explicitly). max_tokens absent: 32 (SamplingParams' default,
  UNVERIFIED); above max_seq_len - prompt it is lowered to that (base_worker `_deduce_max_tokens`);
* sampling_param_stop: stop strings; the output ends before the first one (the LLM API's default
  include_stop_str_in_output=False), stop_reason names it;
* sampling_param_exclude_input_from_output (upstream default false): false puts the prompt text in
  front of text_output (UNVERIFIED what upstream's text holds; specbuild's client sends true);
* sampling_param_best_of != 1, frequency/presence penalties, image_url, lora_*, return_cumulative_logprob:
  refused (the reference engine has none of them);
* streaming (decoupled only, else "Streaming is only supported in decoupled mode."): one response per
  engine step with the cumulative text_output (upstream sends `output.text`, which is cumulative);
* return_finish_reason / return_stop_reason: str() of the value, as upstream;
* sampling_param_return_perf_metrics: kv_cache_* and *_time_ns and the speculative counters
  acceptance_rate / total_accepted_draft_tokens / total_draft_tokens of the whole request, as the
  container sends them: upstream's `_create_response` (model.py at b35ac1b6) builds each one with
  text_output's numpy dtype (object), so they go out as BYTES holding the value's str() ("0.0", "12"),
  although config.pbtxt declares INT32 / INT64 / FP32 for them (the Python backend sends what the model
  builds); times at the microseconds of the timedelta upstream converts;
* stop = true: ends the in-flight requests with the same request id (upstream aborts them);
* output_ids (specbuild addition): the token ids of the response (streamed: the step's new tokens).

Limits (model.yaml): without enable_chunked_prefill a prompt over max_num_tokens is refused with the
PyTorch backend's message; a prompt that leaves no room in max_seq_len is refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from engine_worker import RequestCounters
from words import scalar

from specbuild.model_repo.tensors import LLMAPI_PERF_OUTPUTS

Get = Callable[[str], "np.ndarray | None"]
DEFAULT_MAX_TOKENS = 32  # TensorRT-LLM SamplingParams.max_tokens default (UNVERIFIED for 1.4)
REFUSED = ("image_url", "lora_id", "lora_name", "lora_path", "lora_ckpt_source")


@dataclass(frozen=True)
class LlmApiLimits:
    """The LLM API's request limits from model.yaml."""

    max_seq_len: int
    max_num_tokens: int
    chunked_prefill: bool = False

    @classmethod
    def from_options(cls, options: dict) -> LlmApiLimits:
        return cls(
            max_seq_len=int(options.get("max_seq_len") or 0),
            max_num_tokens=int(options.get("max_num_tokens") or 8192),
            chunked_prefill=bool(options.get("enable_chunked_prefill", False)),
        )

    def check_prompt(self, n: int) -> None:
        if not self.chunked_prefill and n > self.max_num_tokens:
            raise ValueError(
                f"The sum of prompt length ({n}), query length (0) should not exceed max_num_tokens "
                f"({self.max_num_tokens})"
            )
        if self.max_seq_len and self.max_seq_len - n <= 0:
            raise ValueError(
                f"`default_max_tokens` ({self.max_seq_len - n}) must be greater than 0: max_seq_len "
                f"({self.max_seq_len}) - prompt length ({n})"
            )

    def output_len(self, n: int, requested: int) -> int:
        return min(requested, self.max_seq_len - n) if self.max_seq_len else requested


@dataclass(frozen=True)
class LlmApiRequest:
    prompt: str
    prompt_ids: list[int]
    max_new: int
    requested_len: int
    temperature: float
    top_k: int
    top_p: float
    seed: int | None
    streaming: bool = False
    exclude_input: bool = False
    perf: bool = False
    finish_reason: bool = False
    stop_reason: bool = False
    stop_strings: tuple[str, ...] = ()
    stop_sequences: tuple[tuple[int, ...], ...] = ()  # the stop strings as token ids
    request_id: str = ""
    arrival_ns: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0 or self.top_k == 1


def is_stop_request(get: Get) -> bool:
    return bool(scalar(get, "stop", bool, False))


def _strings(value) -> list[str]:
    if value is None:
        return []
    out = []
    for item in np.asarray(value).reshape(-1):
        out.append(item.decode("utf-8") if isinstance(item, bytes) else str(item))
    return out


def parse_request(
    get: Get,
    *,
    encode: Callable[[str], list[int]],
    encode_stop: Callable[[str], list[int]],
    limits: LlmApiLimits,
    request_id: str = "",
) -> LlmApiRequest:
    text = get("text_input")
    if text is None:
        raise ValueError("text_input is missing from the request")
    arr = np.asarray(text)
    if arr.ndim != 1:
        raise ValueError("the LLM-API model only supports text_input being a 1D tensor")
    first = arr.reshape(-1)[0] if arr.size else b""
    try:
        prompt = first.decode("utf-8") if isinstance(first, bytes) else str(first)
    except UnicodeDecodeError as exc:
        raise ValueError(f"text_input is not valid UTF-8 (byte {exc.start})") from None
    for name in ("sampling_param_frequency_penalty", "sampling_param_presence_penalty"):
        value = scalar(get, name, float)
        if value not in (None, 0.0):
            raise ValueError(f"{name} is not supported by the local LLM-API model")
    if scalar(get, "sampling_param_best_of", int, 1) != 1:
        raise ValueError("sampling_param_best_of other than 1 is not supported by the local LLM-API model")
    if scalar(get, "return_cumulative_logprob", bool, False):
        raise ValueError("return_cumulative_logprob is not supported by the local LLM-API model")
    for name in REFUSED:
        value = get(name)
        if value is not None and np.asarray(value).size:
            raise ValueError(f"{name} is not supported by the local LLM-API model")
    ids = encode(prompt)
    if not ids:
        raise ValueError("the prompt has no tokens (empty text_input)")
    limits.check_prompt(len(ids))
    requested = scalar(get, "sampling_param_max_tokens", int, DEFAULT_MAX_TOKENS)
    if requested < 1:
        raise ValueError(f"sampling_param_max_tokens must be >= 1, got {requested}")
    temperature = scalar(get, "sampling_param_temperature", float)
    top_k = scalar(get, "sampling_param_top_k", int)
    top_p = scalar(get, "sampling_param_top_p", float)
    if temperature is not None and not (temperature >= 0.0 and np.isfinite(temperature)):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature}")
    if top_k is not None and top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")
    if top_p is not None and not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    nothing = temperature is None and top_k is None and top_p is None
    stops = tuple(s for s in _strings(get("sampling_param_stop")) if s)
    return LlmApiRequest(
        prompt=prompt,
        prompt_ids=ids,
        max_new=limits.output_len(len(ids), requested),
        requested_len=requested,
        temperature=0.0 if nothing else (1.0 if temperature is None else float(temperature)),
        top_k=int(top_k or 0),
        top_p=float(top_p) if top_p is not None else 1.0,
        seed=scalar(get, "sampling_param_seed", int),
        streaming=bool(scalar(get, "streaming", bool, False)),
        exclude_input=bool(scalar(get, "sampling_param_exclude_input_from_output", bool, False)),
        perf=bool(scalar(get, "sampling_param_return_perf_metrics", bool, False)),
        finish_reason=bool(scalar(get, "return_finish_reason", bool, False)),
        stop_reason=bool(scalar(get, "return_stop_reason", bool, False)),
        stop_strings=stops,
        stop_sequences=tuple(tuple(encode_stop(s)) for s in stops),
        request_id=request_id,
        arrival_ns=time.time_ns(),
    )


def cut_at_stop(tokens: list[int], req: LlmApiRequest) -> tuple[list[int], str | None]:
    """The tokens before the first stop string (excluded, as the LLM API returns it) and that string."""
    for end in range(1, len(tokens) + 1):
        for text, seq in zip(req.stop_strings, req.stop_sequences, strict=True):
            if seq and end >= len(seq) and tuple(tokens[end - len(seq) : end]) == seq:
                return list(tokens[: end - len(seq)]), text
    return list(tokens), None


@dataclass
class Perf(RequestCounters):
    """The LLM-API model's perf outputs for one request (counters: common/engine_worker.py)."""

    def outputs(self) -> dict[str, np.ndarray]:
        """Each as upstream's model.py builds it: `np.asarray([value], dtype=self.output_dtype)`, the
        numpy dtype of text_output (TYPE_STRING: object), so the Python backend sends the value's str()
        as BYTES ("0.0", "1"), whatever config.pbtxt declares (module docstring)."""
        total = self.reused_blocks + self.new_blocks
        values = {
            "kv_cache_reused_block": self.reused_blocks,
            "kv_cache_hit_rate": self.reused_blocks / total if total else 0.0,
            "kv_cache_alloc_new_blocks": self.new_blocks,
            "kv_cache_alloc_total_blocks": total,
            "kv_cache_missed_block": self.new_blocks,
            # timing_metrics are datetime.timedelta (microseconds) turned into ns by pd.Timedelta(...).value
            "arrival_time_ns": _micros(self.arrival_ns),
            "first_scheduled_time_ns": _micros(self.scheduled_ns or self.arrival_ns),
            "first_token_time_ns": _micros(self.first_token_ns),
            "last_token_time_ns": _micros(self.last_token_ns),
            # a C++ float read through the bindings: its float32 value as a Python float
            "acceptance_rate": float(np.float32(self.acceptance_rate)),
            "total_accepted_draft_tokens": self.accepted,
            "total_draft_tokens": self.drafted,
        }
        # every perf output of the tensor table (model_repo/tensors.py), [1] BYTES each
        return {t.name: np.array([str(values[t.name])], dtype=object) for t in LLMAPI_PERF_OUTPUTS}


def _micros(ns: int) -> int:
    return int(ns) // 1000 * 1000


def text_outputs(text: str, token_ids: list[int]) -> dict[str, np.ndarray]:
    return {
        "text_output": np.array([text.encode("utf-8")], dtype=object),  # [1]
        "output_ids": np.array(token_ids, dtype=np.int32),  # [n] (specbuild addition)
    }


def reason_outputs(req: LlmApiRequest, finish: str | None, stop: str | None) -> dict[str, np.ndarray]:
    out = {}
    if req.finish_reason:
        out["finish_reason"] = np.array([str(finish).encode()], dtype=object)
    if req.stop_reason:
        out["stop_reason"] = np.array([str(stop).encode()], dtype=object)
    return out


@dataclass
class Job:
    req: LlmApiRequest
    responder: object
    perf: Perf
    reused_before: int = 0  # the engine's prefix-cache reuse counter when the request was read
    reused: int = 0  # prompt tokens the prefix cache held for it (read when it ended, on the engine thread)
    tokens: list = field(default_factory=list)  # what the engine generated (stop strings still in)
    sent: int = 0  # tokens already streamed
    ran: bool = False
    stopped: bool = False  # a `stop` request named it
    error: Exception | None = None
    finish: str | None = None
    steps: list = field(default_factory=list)  # (accepted, drafted) of each verification step
