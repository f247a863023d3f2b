"""The OpenAI request bodies the frontend accepts and the response objects.

Shapes follow the OpenAI API as vLLM 0.33.0 serves it (vllm/entrypoints/openai/{completion,chat_completion}/
protocol.py) and as the official `openai` client (3.57.0) reads it. A body is validated by its pydantic
model (schema.py: the fields, their ranges, the defaults-only ones); every field it sets is either
accepted or refused with HTTP 400 and OpenAI's error object {"error": {"message", "type":
"invalid_request_error", "param", "code"}} -- a field specbuild cannot honour is never silently ignored,
except `user` (an end-user id: no effect on the output). Every value an error echoes is bounded.

`stop_reason` is the stop string that ended the text, null otherwise (the end token, the length), as
vLLM 0.33.0 sets it (vllm/v1/engine/output_processor.py: `stop_reason = stop_string`; the field's
description in vllm/entrypoints/openai/completion/protocol.py, CompletionResponseChoice; read in the
vllm-0.33.0 wheel, pinned).
"""

from __future__ import annotations

import reprlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from specbuild.frontend.schema import (
    DEFAULT_ONLY,
    INT32_MAX,
    MAX_STOP,
    MAX_STOP_CHARS,
    ChatCompletionRequest,
    CompletionRequest,
)

DEFAULT_MAX_TOKENS = 16  # vLLM's CompletionRequest.max_tokens default (OpenAI's completions default)


class _Bounded(reprlib.Repr):
    """repr with a few items per level and long strings cut: an error echoes what it refuses, bounded (a
    100,000-key logit_bias is shown by its first keys)."""

    def __init__(self):
        super().__init__()
        self.maxlevel, self.maxdict, self.maxlist, self.maxtuple = 2, 4, 4, 4
        self.maxstring = self.maxother = 80
        self.maxlong = 40

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 128:  # repr of a huge int is slow, and refused past 4300 digits
            return f"<an integer of {x.bit_length()} bits>"
        return super().repr_int(x, level)


_SHOWN = _Bounded()
MAX_NAME_CHARS = 64  # a field name echoed in a message or as `param`
MAX_NAMES_SHOWN = 4  # unknown fields listed by name; the rest counted
# the accepted value of each default-only field, as its error names it
DEFAULT_TEXT = {
    "n": "1",
    "best_of": "1",
    "logprobs": "false or 0",
    "top_logprobs": "0",
    "frequency_penalty": "0",
    "presence_penalty": "0",
    "logit_bias": "null",
    "suffix": '""',
    "tools": "null",
    "tool_choice": '"none"',
    "parallel_tool_calls": "null",
    "response_format": '{"type": "text"}',
}


# fields whose type is a union, described whole
ONE_OF = {
    "prompt": "a non-empty string or a list of one (token-id prompts and batches are not supported)",
    "stop": f"a non-empty string or a list of at most {MAX_STOP}, each at most {MAX_STOP_CHARS} characters",
}


def shown(value: Any) -> str:
    """repr(value), bounded (a few items per level, long strings cut in the middle)."""
    return _SHOWN.repr(value)


def _name(key: Any) -> str:
    text = str(key)
    return text if len(text) <= MAX_NAME_CHARS else text[: MAX_NAME_CHARS - 3] + "..."


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
    fit: bool = False  # chat without max tokens: the app lowers max_tokens to what fits after the prompt


def _path(loc: tuple) -> str:
    """A pydantic error location as a field path: messages[0].role (union branch tags left out)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).isidentifier():
            out += f".{_name(part)}" if out else _name(part)
    return out


def _unknown(model: type[BaseModel], names: list, endpoint: str) -> OpenAIError:
    shown_names = ", ".join(repr(_name(k)) for k in names[:MAX_NAMES_SHOWN])
    more = f" and {len(names) - MAX_NAMES_SHOWN} more" if len(names) > MAX_NAMES_SHOWN else ""
    fields = [f for f in model.model_fields if f not in DEFAULT_ONLY]
    fixed = [f for f in model.model_fields if f in DEFAULT_ONLY]
    return _fail(
        f"{endpoint}: unsupported parameter(s) {shown_names}{more}; specbuild's frontend accepts "
        f"{', '.join(fields)}; and {', '.join(fixed)} only at their defaults",
        _name(names[0]),
        "unsupported_parameter",
    )


def _invalid(exc: ValidationError) -> OpenAIError:
    """A refused body as OpenAI's 400: a default-only field first, else the first problem (of a union's
    failures, the one that is not a type mismatch). Every echoed value is bounded."""
    errors = exc.errors(include_url=False, include_context=False)
    located = [e for e in errors if e["loc"]]
    if not located:  # the body itself: not JSON, nested too deep, or not an object
        e = errors[0]
        if e["type"] == "json_invalid":
            return _fail(f"the request body is not valid JSON: {e['msg'].removeprefix('Invalid JSON: ')}")
        return _fail(f"the request body must be a JSON object, got {shown(e.get('input'))}")
    first = next((e for e in located if e["loc"][0] in DEFAULT_ONLY), located[0])
    key = str(first["loc"][0])
    if key in DEFAULT_ONLY and len(first["loc"]) <= 2:
        return _fail(
            f"'{_path(first['loc'])}' = {shown(first.get('input'))} is not supported (only its default: "
            f"{DEFAULT_TEXT[key]}, or leave it out)",
            key,
            "unsupported_value",
        )
    if key in ONE_OF:  # a union: say what it takes, not why its first branch failed
        got = shown(first.get("input")) if len(first["loc"]) == 2 else "something else"
        return _fail(f"'{key}' must be {ONE_OF[key]}, got {got}", key)
    same = [e for e in located if e["loc"][0] == first["loc"][0]]
    first = next((e for e in same if not e["type"].endswith("_type")), first)
    more = f" ({len(located) - 1} more problem(s) in this body)" if len(located) > 1 else ""
    got = shown(first.get("input"))
    return _fail(f"'{_path(first['loc'])}': {first['msg']}, got {got}{more}", _name(key))


def _validate(model: type[BaseModel], body: Any, endpoint: str):
    """The body (JSON bytes, or an already-parsed object) as `model`, or OpenAI's 400. From bytes the
    parser is pydantic-core's, whose nesting limit (200 levels) refuses a deeper body with a 400."""
    try:
        if isinstance(body, bytes | bytearray | str):
            req = model.model_validate_json(body)
        else:
            req = model.model_validate(body)
    except ValidationError as exc:
        raise _invalid(exc) from None
    if req.model_extra:
        raise _unknown(model, list(req.model_extra), endpoint)
    return req


def _common(req, kind: str, served: str, prompt: str, max_tokens: int, **extra) -> GenerationRequest:
    if req.model != served:
        raise OpenAIError(
            f"The model `{_name(req.model)}` does not exist; this server serves `{served}` (GET /v1/models)",
            status=404,
            param="model",
            code="model_not_found",
        )
    stream = bool(req.stream)
    options = req.stream_options
    if options is not None and not stream:
        raise _fail("'stream_options' is only allowed when 'stream' is true", "stream_options")
    include = bool(options and options.include_usage)
    stop = req.stop if req.stop is not None else ()
    return GenerationRequest(
        kind=kind,
        model=req.model,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=float(req.temperature if req.temperature is not None else 1.0),
        top_p=float(req.top_p if req.top_p is not None else 1.0),
        top_k=max(0, req.top_k or 0),  # -1: off
        seed=req.seed,
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        stream=stream,
        include_usage=include,
        # vLLM: per-chunk usage only when both are set (api_utils.should_include_usage)
        continuous_usage=include and bool(options.continuous_usage_stats),
        ignore_eos=bool(req.ignore_eos),
        num_draft_tokens=req.num_draft_tokens,
        **extra,
    )


def parse_completion(body: Any, served: str, max_context_tokens: int | None) -> GenerationRequest:
    """A /v1/completions body (JSON bytes or a parsed object) -> the checked request, or OpenAIError."""
    req = _validate(CompletionRequest, body, "/v1/completions")
    prompt = req.prompt if isinstance(req.prompt, str) else req.prompt[0]
    max_tokens = _max_tokens(req.max_tokens, "max_tokens", max_context_tokens)
    return _common(req, "completion", served, prompt, max_tokens, echo=bool(req.echo))


def parse_chat(body: Any, served: str, max_context_tokens: int | None, render) -> GenerationRequest:
    """`render(messages) -> prompt text` applies the chat template (raises OpenAIError without one)."""
    req = _validate(ChatCompletionRequest, body, "/v1/chat/completions")
    clean = [
        {
            "role": m.role,
            "content": m.content if isinstance(m.content, str) else "".join(p.text for p in m.content),
        }
        for m in req.messages
    ]
    key = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    value = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = _max_tokens(value, key, max_context_tokens, default=None)
    return _common(req, "chat", served, render(clean), max_tokens, messages=tuple(clean), fit=value is None)


def _max_tokens(
    value: int | None, key: str, limit: int | None, default: int | None = DEFAULT_MAX_TOKENS
) -> int:
    high = (limit - 1) if limit else INT32_MAX
    if value is None:  # chat: OpenAI's default is "as many as fit"; the engines' limit bounds it
        return default if default is not None else high
    if value > high:
        raise _fail(f"'{key}' must be in 1 .. {high}, got {shown(value)}", key)
    return value


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
    stop_reason: str | None = None,
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
    choice["stop_reason"] = stop_reason
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
    stop_reason: str | None,
    usage_: dict,
    metrics: dict,
) -> dict[str, Any]:
    if req.kind == "completion":
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": stop_reason,
        }
        obj = "text_completion"
    else:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": stop_reason,
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
    could be the start of one is held back until it is known not to be. `matched`: the stop string found
    (the earliest in the text; of two at one place, the first listed)."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.buffer = ""
        self.matched: str | None = None

    @property
    def stopped(self) -> bool:
        return self.matched is not None

    def push(self, text: str) -> str:
        if self.stopped or not self.stops:
            return "" if self.stopped else text
        self.buffer += text
        found = [(i, n) for n, i in enumerate(self.buffer.find(s) for s in self.stops) if i >= 0]
        if found:
            cut, n = min(found)
            out, self.buffer, self.matched = self.buffer[:cut], "", self.stops[n]
            return out
        split = max(0, len(self.buffer) - self.hold)
        out, self.buffer = self.buffer[:split], self.buffer[split:]
        return out

    def flush(self) -> str:
        out, self.buffer = ("" if self.stopped else self.buffer), ""
        return out
