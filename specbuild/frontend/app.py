"""The OpenAI-compatible HTTP app (FastAPI): /v1/models, /v1/completions, /v1/chat/completions, /health.

Every request goes to the served repository's `tensorrt_llm_bls`, or to the LLM-API `tensorrt_llm` model
of an LLM-API repository (streamed from Triton even when the HTTP answer is not, so that each
verification round is seen). Responses follow vLLM 0.33.0's shapes: `usage` with the server's token
counts (prompt: the BLS's num_input_tokens, or through the LLM-API interface, which returns none, the
prompt as the repository's tokenizer encodes it; completion: the tokens the engines generated);
streams are SSE `data: {json}` chunks ending with `data: [DONE]`; with `stream_options.include_usage`
a last chunk with `choices: []` carries `usage` and `metrics`, and with
`continuous_usage_stats` too every content chunk carries the cumulative `usage` (vLLM's extension, what
AIPerf's --per-chunk-usage reads). `metrics.speculative_decoding` at the root of a response (or of the
final usage chunk) is vLLM's per-request spec-decode object (`--per-request-spec-decode-metrics
detailed`), which AIPerf 0.13.0 turns into its SpecDecodeAcceptanceRecord; it is null when the request
drafted nothing. The other PerRequestMetrics fields stay null, as vLLM's without --enable-per-request-metrics.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from specbuild.client.remote import request_steps
from specbuild.core.formats.spec_records import vllm_spec_metrics
from specbuild.core.sampling_params import SamplingParams
from specbuild.frontend import protocol as P
from specbuild.frontend import schema as S
from specbuild.frontend.chat import ChatTemplate
from specbuild.frontend.openapi import errors_doc, generation_doc, openapi_document
from specbuild.frontend.protocol import GenerationRequest, OpenAIError
from specbuild.frontend.triton import TritonBridge

MAX_BODY_BYTES = 8 * 2**20  # a request body is read whole: bound it
MAX_METRICS_BYTES = 16 * 2**20  # Triton's metrics page is tens of KB
NO_END_ID = -1  # ignore_eos: an end id no token has (the backend's "no end token")
PER_REQUEST_METRIC_FIELDS = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms")


def _error(exc: OpenAIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _body(request: Request) -> bytes:
    """The request body, read whole up to MAX_BODY_BYTES (any content type: it is parsed as JSON)."""
    size = request.headers.get("content-length") or "0"
    if not size.isdigit() or int(size) > MAX_BODY_BYTES:
        raise OpenAIError(f"the request body is larger than {MAX_BODY_BYTES // 2**20} MiB", status=413)
    data = bytearray()
    async for part in request.stream():
        data += part
        if len(data) > MAX_BODY_BYTES:
            raise OpenAIError(f"the request body is larger than {MAX_BODY_BYTES // 2**20} MiB", status=413)
    return bytes(data)


async def _until_disconnect(request: Request) -> None:
    """Returns when the HTTP client goes away (the body was read whole: the next ASGI message is the
    disconnect, or comes after the response)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_gone(request: Request, work):
    """Await `work` while watching the connection: a client that goes away cancels it (the bridge then
    cancels the request on Triton) and raises ClientGone."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_until_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # also when this handler is cancelled: the work is then stopped in the background
        watch.cancel()
        stopping = None if task.done() else _stop_in_background(task)
    if stopping is None:
        return task.result()
    await asyncio.shield(stopping)  # the bridge closes the request before the handler answers
    raise ClientGone


# A cancel can be lost: a library may take it for a result (asyncio.wait_for before Python 3.12, CPython
# gh-86296), and the request then ran to its end after its client had gone. `_stop` cancels again until
# the work has ended, as the anyio cancel scope that Starlette cancels a streamed response's body with does.
CANCEL_AGAIN_S = 0.05
_STOPPING: set[asyncio.Future] = set()  # the tasks running `_stop`, referenced until they end


def _stop_in_background(task: asyncio.Future) -> asyncio.Future:
    stopping = asyncio.ensure_future(_stop(task))
    _STOPPING.add(stopping)
    stopping.add_done_callback(_STOPPING.discard)
    return stopping


async def _stop(task: asyncio.Future) -> None:
    """Cancel `task` every CANCEL_AGAIN_S until it has ended (its result or error is dropped)."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CANCEL_AGAIN_S)
    if not task.cancelled():
        task.exception()  # retrieved: no "exception was never retrieved" warning


class ClientGone(Exception):
    """The HTTP client went away before its answer: nothing to send."""


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - Triton's own metrics address
        data = response.read(MAX_METRICS_BYTES + 1)
    if len(data) > MAX_METRICS_BYTES:
        raise OSError("the metrics page is larger than 16 MiB")
    return data.decode("utf-8", errors="replace")


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


def _longest_token(tokenizer) -> int | None:
    """Characters of the tokenizer's longest vocabulary entry: byte-level entries spell each byte as one
    character, SentencePiece ones each character as itself, so no token covers more of a text."""
    if tokenizer is None:
        return None
    return max(map(len, tokenizer.get_vocab()), default=None)


class Frontend:
    """The app's state: the served model, the Triton bridge, the chat template."""

    def __init__(
        self, bridge: TritonBridge, chat: ChatTemplate, model_id: str, metrics_url: str | None = None
    ):
        self.bridge, self.chat, self.model_id = bridge, chat, model_id
        self.metrics_url = metrics_url  # Triton's Prometheus page, served again at /metrics
        self.created = P.now()
        self.max_total = bridge.served.info.max_total_tokens
        self.max_prompt_tokens = bridge.served.max_prompt_tokens or self.max_total
        self.longest_token = _longest_token(chat.tokenizer)
        self.max_prompt_chars = (
            self.max_prompt_tokens * self.longest_token
            if self.max_prompt_tokens and self.longest_token
            else None
        )

    # ---- request -> Triton ----------------------------------------------------------------------
    def _k(self, req: GenerationRequest) -> int | None:
        served = self.bridge.served
        if req.num_draft_tokens is not None and served.loop_k is None:
            how = (
                "through the LLM-API interface, whose engine drafts its speculative_config.max_draft_len"
                if served.llmapi
                else "whose engine drafts itself"
            )
            raise OpenAIError(
                "'num_draft_tokens' is for draft/target repositories (the BLS drafts per round); this "
                f"one serves {served.info.repo.title} {how}",
                param="num_draft_tokens",
            )
        return req.num_draft_tokens

    def _prompt_tokens(self, prompt: str) -> int:
        """Before the server's count arrives (the BLS's num_input_tokens replaces it): 0; the LLM-API
        interface returns none, so there the prompt as that model tokenizes it (the repository's
        tokenizer, special tokens added, as the local LLM-API model and the LLM API encode)."""
        if not self.bridge.served.llmapi or self.chat.tokenizer is None:
            return 0
        return len(self.chat.tokenizer(prompt)["input_ids"])

    def _params(self, req: GenerationRequest) -> SamplingParams:
        return SamplingParams(
            max_tokens=req.max_tokens,
            temperature=req.temperature,
            top_k=req.top_k,
            top_p=req.top_p,
            seed=req.seed,
            end_id=NO_END_ID if req.ignore_eos else None,
        )

    def _fit(self, req: GenerationRequest) -> GenerationRequest:
        """A chat request without max tokens gets what fits the engines' limit after its prompt."""
        if not req.fit or self.max_total is None or self.chat.tokenizer is None:
            return req
        n = len(self.chat.tokenizer(req.prompt, add_special_tokens=True)["input_ids"])
        room = self.max_total - n
        if room < 1:
            raise OpenAIError(
                f"the prompt has {n} tokens: no room for output within {self.max_total}", param="messages"
            )
        return GenerationRequest(**{**req.__dict__, "max_tokens": min(req.max_tokens, room)})

    def _check_length(self, req: GenerationRequest) -> None:
        """Refuse a prompt that cannot fit by its characters alone, before anything tokenizes it: each
        token covers at most `longest token` characters of the text, so more than limit x that many
        characters are more than `limit` tokens."""
        if self.max_prompt_chars is not None and len(req.prompt) > self.max_prompt_chars:
            raise OpenAIError(
                f"the prompt has {len(req.prompt)} characters; at most {self.max_prompt_tokens} tokens fit "
                f"(the engines' input limit), which no text over {self.max_prompt_chars} characters makes "
                f"with this tokenizer (no token covers more than {self.longest_token})",
                param="messages" if req.kind == "chat" else "prompt",
                code="context_length_exceeded",
            )

    def parse(self, body: bytes, kind: str) -> GenerationRequest:
        if kind == "completion":
            req = P.parse_completion(body, self.model_id, self.max_total)
        else:
            req = P.parse_chat(body, self.model_id, self.max_total, self.chat.render)
        self._check_length(req)
        return self._fit(req)

    def _spec(self, chunks, k: int | None, max_tokens: int) -> dict[str, Any]:
        served = self.bridge.served
        steps = (
            request_steps(
                chunks,
                self_speculating=served.self_speculating,
                context_first=served.info.repo.context_chunk_first,
                k=served.fixed_k,
                max_tokens=max_tokens,
            )
            or []
        )
        spec = vllm_spec_metrics(steps, k)
        metrics: dict[str, Any] = dict.fromkeys(PER_REQUEST_METRIC_FIELDS)
        metrics["tokens_per_second"] = None
        metrics["speculative_decoding"] = spec if spec["num_spec_steps"] else None
        return metrics

    def _num_spec_tokens(self, k: int | None) -> int | None:
        served = self.bridge.served
        return k if k is not None else (served.loop_k if served.loop_k is not None else served.fixed_k)

    # ---- answers --------------------------------------------------------------------------------
    async def complete(self, req: GenerationRequest) -> dict[str, Any]:
        k = self._k(req)
        stopper = P.StopText(req.stop)
        chunks, text, tokens = [], [], 0
        prompt_tokens = self._prompt_tokens(req.prompt)
        stream = self.bridge.stream(req.prompt, self._params(req), num_draft_tokens=k, stop_words=req.stop)
        async with aclosing(stream):  # leaving early (a stop string, a client gone) cancels it on the server
            async for c in stream:
                chunks.append(c)
                tokens += len(c.token_ids)
                prompt_tokens = c.counts.get("num_input_tokens", prompt_tokens)
                text.append(stopper.push(c.text))
                if stopper.stopped:
                    break
        text.append(stopper.flush())
        body = ("" if not req.echo else req.prompt) + "".join(text)
        return P.full_response(
            req,
            P.new_id(req.kind),
            P.now(),
            text=body,
            finish=_finish(stopper, tokens, req),
            stop_reason=stopper.matched,
            usage_=P.usage(prompt_tokens, tokens),
            metrics=self._spec(chunks, self._num_spec_tokens(k), req.max_tokens),
        )

    async def stream(self, req: GenerationRequest) -> AsyncIterator[str]:
        """The SSE events of one request. Nothing is yielded before Triton's first response, so a
        request the server refuses still gets an HTTP error (the caller awaits the first event)."""
        k = self._k(req)
        rid, created = P.new_id(req.kind), P.now()
        stopper = P.StopText(req.stop)
        chunks, tokens = [], 0
        prompt_tokens = self._prompt_tokens(req.prompt)

        def usage():
            return P.usage(prompt_tokens, tokens) if req.continuous_usage else None

        stream = self.bridge.stream(req.prompt, self._params(req), num_draft_tokens=k, stop_words=req.stop)
        async with aclosing(stream):  # a client that goes away, or a stop string: cancelled on the server
            first = True
            async for c in stream:
                if first:
                    first = False
                    if req.kind == "chat":  # the role first, as OpenAI and vLLM stream it
                        yield _sse(P.chunk(req, rid, created, text="", role=True))
                    if req.echo:
                        yield _sse(P.chunk(req, rid, created, text=req.prompt))
                chunks.append(c)
                tokens += len(c.token_ids)
                prompt_tokens = c.counts.get("num_input_tokens", prompt_tokens)
                piece = stopper.push(c.text)
                if piece:
                    yield _sse(P.chunk(req, rid, created, text=piece, usage_=usage()))
                if stopper.stopped:
                    break
        tail = stopper.flush()
        last = tail if (req.kind == "completion" or tail) else None
        finish = _finish(stopper, tokens, req)
        yield _sse(
            P.chunk(req, rid, created, text=last, finish=finish, stop_reason=stopper.matched, usage_=usage())
        )
        if req.include_usage:
            yield _sse(
                P.chunk(
                    req,
                    rid,
                    created,
                    empty=True,
                    usage_=P.usage(prompt_tokens, tokens),
                    metrics=self._spec(chunks, self._num_spec_tokens(k), req.max_tokens),
                )
            )
        yield "data: [DONE]\n\n"


def _finish(stopper: P.StopText, tokens: int, req: GenerationRequest) -> str:
    return "stop" if stopper.stopped or tokens < req.max_tokens else "length"


def create_app(frontend: Frontend) -> FastAPI:
    app = FastAPI(
        title="specbuild OpenAI-compatible frontend",
        version="1",
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.openapi = lambda: openapi_document(app)

    @app.exception_handler(OpenAIError)
    async def openai_error(request: Request, exc: OpenAIError):  # noqa: ARG001 - FastAPI's signature
        return _error(exc)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):  # noqa: ARG001
        """Routing's own answers (no such route, wrong method) in OpenAI's error shape."""
        error = OpenAIError(str(exc.detail), status=exc.status_code)
        return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):  # noqa: ARG001
        """A bug of the frontend: OpenAI's 500 object (the traceback goes to the server's log)."""
        return _error(OpenAIError(f"internal error of the frontend: {type(exc).__name__}", status=500))

    @app.get("/health", response_model=None, responses={200: {"model": S.Health}})
    async def health():
        return {"status": "ok"}

    @app.get(
        "/metrics",
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {}}}, **errors_doc(404, 503)},
    )
    async def metrics():
        """Triton's Prometheus page (its nv_* series and the engines' trtllm_spec_decode_* ones) at the
        frontend's own address, as vLLM serves /metrics next to /v1: AIPerf scrapes <url>/metrics."""
        if frontend.metrics_url is None:
            raise OpenAIError("no metrics endpoint is configured", status=404)
        try:
            text = await asyncio.to_thread(_fetch, frontend.metrics_url)
        except OSError as exc:
            raise OpenAIError(f"cannot read Triton's metrics: {exc}", status=503) from None
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    @app.get("/v1/models", response_model=None, responses={200: {"model": S.ModelList}})
    async def models():
        card = P.model_card(frontend.model_id, frontend.created, frontend.max_total)
        return {"object": "list", "data": [card]}

    async def generate(request: Request, kind: str):
        req = frontend.parse(await _body(request), kind)
        try:
            if not req.stream:
                return JSONResponse(await _unless_gone(request, frontend.complete(req)))
            events = frontend.stream(req)
            # the first event is produced before answering: a request the server refuses gets a 400
            first = await _unless_gone(request, events.__anext__())
        except ClientGone:
            return Response(status_code=499)  # nobody reads it (nginx's "client closed request")

        async def body():
            yield first
            try:
                async for event in events:
                    yield event
            except OpenAIError as exc:  # after the 200: the error in a data event (the openai client raises)
                yield _sse(exc.body())
                yield "data: [DONE]\n\n"

        # Starlette's streaming response watches the connection too: a client gone cancels the body
        return StreamingResponse(
            body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    @app.post("/v1/completions", **generation_doc(S.CompletionRequest, S.CompletionResponse))
    async def completions(request: Request):
        return await generate(request, "completion")

    @app.post("/v1/chat/completions", **generation_doc(S.ChatCompletionRequest, S.ChatCompletionResponse))
    async def chat_completions(request: Request):
        return await generate(request, "chat")

    return app
