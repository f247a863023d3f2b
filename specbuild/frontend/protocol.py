"""The OpenAI request bodies the frontend honours, checked field by field, and the response objects.

Shapes follow the OpenAI API as vLLM 0.33.0 serves it (vllm/entrypoints/openai/{completion,chat_completion}/
protocol.py) and as the official `openai` client (3.57.0) reads it. A request is a JSON object; every
field it sets is either honoured (HONOURED_*: what it does is below) or refused with HTTP 400 and
OpenAI's error object {"error": {"message", "type": "invalid_request_error", "param", "code"}} -- a field
specbuild cannot honour is never silently ignored, except `user` (an end-user id for abuse monitoring:
no effect on the output) and the `null` / default value of a refused field (clients send defaults).

Honoured (both endpoints unless said): model (must be the served id), prompt (completions: a string, or a
list of one string), messages (chat: role system | user | assistant, string content or text parts),
max_tokens (default 16, as vLLM's completions) / max_completion_tokens (chat), temperature (>= 0), top_p,
top_k (vLLM extra), seed, stop (string or up to 4 strings: the text ends before the first one, as
OpenAI), stream, stream_options {include_usage, continuous_usage_stats (vLLM's extension: usage on every
chunk)}, n = 1, echo (completions: the prompt before the text), ignore_eos (vLLM extra: the end token
does not stop the request), logprobs false / null and frequency_penalty / presence_penalty 0 (their
defaults), and specbuild's `num_draft_tokens` (draft/target repositories: K for this request, 0 = the
target alone).
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_STOP_CHARS = 256  # a stop string longer than this is a mistake (and bounds the held-back text)
DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default (OpenAI's completions default)
COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "stream", "stream_options"}
COMMON |= {"n", "user", "ignore_eos", "logprobs", "frequency_penalty", "presence_penalty", "num_draft_tokens"}
HONOURED_COMPLETIONS = frozenset(COMMON | {"prompt", "echo", "best_of", "suffix", "logit_bias"})
HONOURED_CHAT = frozenset(
    COMMON
    | {"messages", "max_completion_tokens", "top_logprobs", "logit_bias", "response_format", "tools"}
    | {"tool_choice", "parallel_tool_calls"}
)
# refused unless they carry their default (value -> accepted defaults)
DEFAULT_ONLY = {
    "n": (1, None),
    "best_of": (1, None),
    "logprobs": (False, None, 0),
    "top_logprobs": (None, 0),
    "frequency_penalty": (0, 0.0, None),
    "presence_penalty": (0, 0.0, None),
    "suffix": (None, ""),
    "logit_bias": (None,),
    "tools": (None,),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None,),
}
ROLES = ("system", "user", "assistant", "developer")


class OpenAIError(Exception):
    """An error answered with OpenAI's error object."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.code = message, status, param, code
        self.type = "invalid_request_error" if status < 500 else "server_error"

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _fail(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(message, param=param, code=code)


@dataclass(frozen=True)
class GenerationRequest:
    """A checked request: what the frontend sends to Triton and how it answers."""

    kind: str  # "completion" | "chat"
    model: str
    prompt: str  # the text the BLS gets (chat: the rendered template)
    max_tokens: int
    temperature: float = 1.0  # OpenAI's default
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    echo: bool = False
    ignore_eos: bool = False
    num_draft_tokens: int | None = None
    messages: tuple[dict[str, str], ...] = field(default_factory=tuple)


def _number(body: dict, key: str, default, *, low=None, high=None, integer=False):
    value = body.get(key)
    if value is None:
        return default
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or (not integer and not math.isfinite(value)):
        raise _fail(f"'{key}' must be {'an integer' if integer else 'a number'}, got {value!r}", key)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"{low if low is not None else '-inf'} .. {high if high is not None else 'inf'}"
        raise _fail(f"'{key}' must be in {bounds}, got {value!r}", key)
    return value


def _flag(body: dict, key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _fail(f"'{key}' must be true or false, got {value!r}", key)
    return value


def _check_fields(body: dict, honoured: frozenset[str], endpoint: str) -> None:
    unknown = sorted(set(body) - honoured)
    if unknown:
        raise _fail(
            f"{endpoint}: unsupported parameter(s) {', '.join(unknown)}; specbuild's frontend honours "
            f"{', '.join(sorted(honoured))}",
            unknown[0],
            "unsupported_parameter",
        )
    for key, defaults in DEFAULT_ONLY.items():
        if key in body and not any(body[key] == d and type(body[key]) is type(d) for d in defaults):
            if body[key] is None and None in defaults:
                continue
            raise _fail(
                f"'{key}' = {body[key]!r} is not supported (only its default: "
                f"{', '.join(repr(d) for d in defaults)})",
                key,
                "unsupported_value",
            )
    if endpoint.endswith("chat/completions") and body.get("response_format") not in (None, {"type": "text"}):
        raise _fail(
            "'response_format' other than text is not supported", "response_format", "unsupported_value"
        )


def _stop(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    words = (stop,) if isinstance(stop, str) else stop
    if not isinstance(words, list | tuple) or not all(isinstance(w, str) and w for w in words):
        raise _fail("'stop' must be a non-empty string or a list of them", "stop")
    if len(words) > MAX_STOP or any(len(w) > MAX_STOP_CHARS for w in words):
        raise _fail(f"'stop' takes at most {MAX_STOP} strings of at most {MAX_STOP_CHARS} characters", "stop")
    return tuple(words)


def _stream_options(body: dict, stream: bool) -> tuple[bool, bool]:
    options = body.get("stream_options")
    if options is None:
        return False, False
    if not stream:
        raise _fail("'stream_options' is only allowed when 'stream' is true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage", "continuous_usage_stats"}:
        raise _fail(
            "'stream_options' takes include_usage and continuous_usage_stats (true / false)", "stream_options"
        )
    include = _flag(options, "include_usage")
    # vLLM: per-chunk usage only when both are set (api_utils.should_include_usage)
    return include, include and _flag(options, "continuous_usage_stats")


def _common(body: dict, kind: str, served: str, prompt: str, max_tokens: int, **extra) -> GenerationRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _fail("'model' is required", "model")
    if model != served:
        raise OpenAIError(
            f"The model `{model}` does not exist; this server serves `{served}` (GET /v1/models)",
            status=404,
            param="model",
            code="model_not_found",
        )
    stream = _flag(body, "stream")
    include, continuous = _stream_options(body, stream)
    return GenerationRequest(
        kind=kind,
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=float(_number(body, "temperature", 1.0, low=0.0, high=2.0)),
        top_p=float(_number(body, "top_p", 1.0, low=1e-9, high=1.0)),
        top_k=max(0, int(_number(body, "top_k", 0, low=-1, high=2**31 - 1, integer=True))),  # -1: off
        seed=_number(body, "seed", None, low=0, high=2**63 - 1, integer=True),
        stop=_stop(body),
        stream=stream,
        include_usage=include,
        continuous_usage=continuous,
        ignore_eos=_flag(body, "ignore_eos"),
        num_draft_tokens=_number(body, "num_draft_tokens", None, low=0, high=2**31 - 1, integer=True),
        **extra,
    )


def parse_completion(body: Any, served: str, max_context_tokens: int | None) -> GenerationRequest:
    if not isinstance(body, dict):
        raise _fail("the request body must be a JSON object")
    _check_fields(body, HONOURED_COMPLETIONS, "/v1/completions")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _fail(
            "'prompt' must be a string (or a list of one string; token-id prompts and batches are not "
            "supported)",
            "prompt",
        )
    if not prompt:
        raise _fail("'prompt' is empty", "prompt")
    return _common(
        body,
        "completion",
        served,
        prompt,
        _max_tokens(body, "max_tokens", max_context_tokens),
        echo=_flag(body, "echo"),
    )


def parse_chat(body: Any, served: str, max_context_tokens: int | None, render) -> GenerationRequest:
    """`render(messages) -> prompt text` applies the chat template (raises OpenAIError without one)."""
    if not isinstance(body, dict):
        raise _fail("the request body must be a JSON object")
    _check_fields(body, HONOURED_CHAT, "/v1/chat/completions")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _fail("'messages' must be a non-empty list", "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise _fail(f"messages[{i}] needs a role in {', '.join(ROLES)}", "messages")
        content = m.get("content")
        if isinstance(content, list):  # text parts: [{"type": "text", "text": ...}]
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise _fail(f"messages[{i}]: only text content parts are supported", "messages")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise _fail(f"messages[{i}].content must be a string or text parts", "messages")
        if set(m) - {"role", "content", "name"}:
            raise _fail(f"messages[{i}]: only role, content and name are supported", "messages")
        clean.append({"role": m["role"], "content": content})
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return _common(
        body,
        "chat",
        served,
        render(clean),
        _max_tokens(body, key, max_context_tokens, default=None),
        messages=tuple(clean),
    )


def _max_tokens(body: dict, key: str, limit: int | None, default: int | None = DEFAULT_MAX_TOKENS) -> int:
    high = (limit - 1) if limit else 2**31 - 1
    value = _number(body, key, None, low=1, high=high, integer=True)
    if value is None:  # chat: OpenAI's default is "as many as fit"; the engines' limit bounds it
        value = default if default is not None else min(high, 2**31 - 1)
    return int(value)


# ---- responses ---------------------------------------------------------------------------------------


def new_id(kind: str) -> str:
    return ("cmpl-" if kind == "completion" else "chatcmpl-") + uuid.uuid4().hex


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def model_card(model: str, created: int, max_model_len: int | None) -> dict[str, Any]:
    return {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "specbuild",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
    }


def chunk(
    req: GenerationRequest,
    rid: str,
    created: int,
    *,
    text: str | None = None,
    role: bool = False,
    finish: str | None = None,
    usage_: dict | None = None,
    metrics: dict | None = None,
    empty: bool = False,
) -> dict[str, Any]:
    """One SSE chunk (empty: the final usage chunk, choices [])."""
    if req.kind == "completion":
        obj, choice = "text_completion", {"index": 0, "text": text or "", "logprobs": None}
    else:
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        obj, choice = "chat.completion.chunk", {"index": 0, "delta": delta, "logprobs": None}
    choice["finish_reason"] = finish
    choice["stop_reason"] = None
    out: dict[str, Any] = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": req.model,
        "choices": [] if empty else [choice],
        "usage": usage_,
    }
    if metrics is not None:
        out["metrics"] = metrics
    return out


def full_response(
    req: GenerationRequest,
    rid: str,
    created: int,
    *,
    text: str,
    finish: str,
    usage_: dict,
    metrics: dict,
) -> dict[str, Any]:
    if req.kind == "completion":
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
        obj = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        obj = "chat.completion"
    return {
        "id": rid,
        "object": obj,
        "created": created,
        "model": req.model,
        "choices": [choice],
        "usage": usage_,
        "system_fingerprint": None,
        "metrics": metrics,
    }


def now() -> int:
    return int(time.time())


class StopText:
    """OpenAI's stop semantics on a text stream: the output ends before the first stop string; text that
    could be the start of one is held back until it is known not to be."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.buffer = ""
        self.stopped = False

    def push(self, text: str) -> str:
        if self.stopped or not self.stops:
            return "" if self.stopped else text
        self.buffer += text
        cut = min((i for i in (self.buffer.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.buffer, self.stopped = self.buffer[:cut], "", True
            return out
        split = max(0, len(self.buffer) - self.hold)
        out, self.buffer = self.buffer[:split], self.buffer[split:]
        return out

    def flush(self) -> str:
        out, self.buffer = ("" if self.stopped else self.buffer), ""
        return out
