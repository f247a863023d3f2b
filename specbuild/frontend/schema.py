"""The frontend's OpenAI request and response bodies as pydantic models: one source for the checks
(protocol.py validates every body with them) and for the OpenAPI document the app publishes at
/openapi.json (as vLLM's server publishes its own from its request models).

Requests are strict (no coercion: `"5"` or `true` is not a number) and closed (no other fields): a field
specbuild cannot honour is refused, never ignored. Fields it refuses unless they carry their default are
typed to that default alone (DEFAULT_ONLY), so the schema says which value is accepted. Limits that depend
on the served repository (max_tokens against the engines' limit, the prompt's length) are checked by the
app after validation. Responses are documented, not validated per request (extra fields allowed: the
`metrics` object is vLLM's).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_STOP = 4  # OpenAI's limit on stop sequences
MAX_STOP_CHARS = 256  # a stop string longer than this is a mistake (and bounds the held-back text)
ROLES = ("system", "user", "assistant", "developer")
INT32_MAX = 2**31 - 1

StopWord = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]
Text = Annotated[str, Field(min_length=1)]
Zero = Annotated[float, Field(ge=0, le=0)]  # a penalty at its default
One = Annotated[int, Field(ge=1, le=1)]  # n / best_of at their default


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Closed):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = Field(
        None, description="vLLM's extension: cumulative usage on every content chunk (with include_usage)"
    )


class _Generation(BaseModel):
    """The fields both endpoints take. Closed too, but unknown fields are collected (`model_extra`) and
    refused by protocol.py in one error: one validation error per unknown key would cost seconds on a
    body of 500,000 keys."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra={"additionalProperties": False})

    model: str = Field(min_length=1, description="the served model id (GET /v1/models)")
    max_tokens: int | None = Field(None, ge=1, description="at most the engines' limit - 1")
    temperature: float | None = Field(None, ge=0, le=2, allow_inf_nan=False)
    top_p: float | None = Field(None, ge=1e-9, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=-1, le=INT32_MAX, description="vLLM's extra; -1 or 0: off")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: StopWord | Annotated[list[StopWord], Field(max_length=MAX_STOP)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    ignore_eos: bool | None = Field(None, description="vLLM's extra: the end token does not stop the request")
    num_draft_tokens: int | None = Field(
        None, ge=0, le=INT32_MAX, description="specbuild's: K of this request (draft/target repositories)"
    )
    user: str | None = Field(None, description="an end-user id; no effect on the output")
    # refused unless at their default
    n: One | None = None
    logprobs: Literal[False, 0] | None = None
    frequency_penalty: Zero | None = None
    presence_penalty: Zero | None = None
    logit_bias: None = None


class CompletionRequest(_Generation):
    prompt: Text | Annotated[list[Text], Field(min_length=1, max_length=1)] = Field(
        description="a string, or a list of one string (no token ids, no batches)"
    )
    echo: bool | None = None
    best_of: One | None = None
    suffix: Literal[""] | None = None


class TextPart(_Closed):
    type: Literal["text"]
    text: str


class Message(_Closed):
    role: Literal[ROLES]  # type: ignore[valid-type]
    content: str | list[TextPart]
    name: str | None = None


class ResponseFormat(_Closed):
    type: Literal["text"]


class ChatCompletionRequest(_Generation):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: int | None = Field(None, ge=1, description="at most the engines' limit - 1")
    top_logprobs: Annotated[int, Field(ge=0, le=0)] | None = None
    response_format: ResponseFormat | None = None
    tools: None = None
    tool_choice: Literal["none"] | None = None
    parallel_tool_calls: None = None


# Fields refused unless they carry their default: their error says so (code "unsupported_value").
DEFAULT_ONLY = frozenset(
    {"n", "best_of", "logprobs", "top_logprobs", "frequency_penalty", "presence_penalty", "logit_bias"}
    | {"suffix", "tools", "tool_choice", "parallel_tool_calls", "response_format"}
)


# ---- responses (documentation) ------------------------------------------------------------------


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class ErrorBody(_Open):
    message: str
    type: Literal["invalid_request_error", "server_error"]
    param: str | None
    code: str | None


class ErrorResponse(_Open):
    """OpenAI's error object, for every 4xx and 5xx."""

    error: ErrorBody


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(_Open):
    index: int
    text: str
    logprobs: None
    finish_reason: Literal["stop", "length"] | None
    stop_reason: str | None = Field(description="the stop string that ended the text (vLLM's)")


class AssistantMessage(_Open):
    role: Literal["assistant"]
    content: str


class ChatChoice(_Open):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: Literal["stop", "length"] | None
    stop_reason: str | None


class CompletionResponse(_Open):
    """A whole answer; `stream: true` answers text/event-stream chunks ending with `data: [DONE]`."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage
    metrics: dict[str, Any] | None = None


class ChatCompletionResponse(_Open):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    metrics: dict[str, Any] | None = None


class ModelCard(_Open):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int | None


class ModelList(_Open):
    object: Literal["list"]
    data: list[ModelCard]


class Health(_Open):
    status: Literal["ok"]
