"""The frontend's side of Triton: streamed requests to the served repository over gRPC, from asyncio:
its `tensorrt_llm_bls` (engine-flow repositories), or the LLM-API `tensorrt_llm` model (LLM-API
repositories: client/remote.py `model_info` detects the interface from the model's metadata, the
request tensors are that interface's, its cumulative text_output is turned into deltas).

Requests go over one asyncio gRPC channel (grpc.aio with tritonclient's protobufs and its request
builder), each a ModelStreamInfer call of its own, at most `pool_size` at a time: no thread per stream and
no hop between threads per response (tritonclient's callback stream costs both). A request whose HTTP
client goes away (or that hits a stop string) is cancelled on the server: its call is cancelled, which
Triton turns into the request's cancellation (the BLS then ends within a round).
The request tensors, the response parsing and the per-step counters are the gRPC client's
(client/request.py, client/remote.py): one definition for bench, `generate --url` and this frontend.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
from tritonclient.grpc import InferResult, service_pb2_grpc
from tritonclient.grpc._utils import _get_inference_request  # tritonclient's own request builder
from tritonclient.utils import InferenceServerException

from specbuild.client.remote import (
    ModelInfo,
    connect,
    model_info,
    normalize_url,
    raise_request_error,
    request_inputs,
    text_delta,
)
from specbuild.client.request import Chunk, parse_response
from specbuild.core.errors import ClientError
from specbuild.core.sampling_params import SamplingParams
from specbuild.frontend.protocol import OpenAIError

DEFAULT_POOL = 64  # concurrent requests in flight (each holds one gRPC stream while it runs)
# the message size limits tritonclient's channel sets (grpc/_client.py MAX_GRPC_MESSAGE_SIZE: Triton's)
MAX_MESSAGE = 2**31 - 1
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
]
DEFAULT_TIMEOUT_S = 600.0  # the longest silence between two responses of one request


@dataclass(frozen=True)
class ServedModel:
    """What the frontend needs to know about the served repository (read once, at start)."""

    info: ModelInfo
    tokenizer_dir: str | None  # preprocessing's tokenizer_dir parameter (a local folder for local repos)
    max_prompt_tokens: int | None = None  # the served model's max_prompt_tokens parameter (the BLS's)

    @property
    def llmapi(self) -> bool:
        return self.info.kind.llmapi

    @property
    def loop_k(self) -> int | None:
        """K of a request without num_draft_tokens when the BLS drafts per round, else None."""
        return self.info.repo.num_draft_tokens if self.info.repo.bls_drives_loop else None

    @property
    def fixed_k(self) -> int | None:
        """The K every round drafts when the engine runs a draft/target loop or an EAGLE-3 chain by itself
        (the LLM API's speculative_config.max_draft_len); None otherwise (Medusa trees: the drafts per
        step vary)."""
        repo = self.info.repo
        if (
            self.llmapi
            and repo.num_draft_tokens > 0
            and ((not repo.context_chunk_first and repo.drafts_every_round) or repo.chain_after_context)
        ):
            return repo.num_draft_tokens
        return None

    @property
    def self_speculating(self) -> bool:
        return self.info.repo.always_speculates


def describe(url: str) -> ServedModel:
    client = connect(url)
    try:
        info = model_info(client, None)
        tokenizer = _parameter(client, "preprocessing", "tokenizer_dir")
        prompt_limit = _parameter(client, info.name, "max_prompt_tokens")
    finally:
        client.close()
    limit = int(prompt_limit) if prompt_limit and prompt_limit.isdigit() else None
    return ServedModel(info, tokenizer, limit)


def _parameter(client, model: str, key: str) -> str | None:
    try:
        params = client.get_model_config(model, as_json=True)["config"].get("parameters", {})
    except InferenceServerException:
        return None
    return (params.get(key) or {}).get("string_value") or None


class TritonBridge:
    """Streams requests to Triton over one asyncio gRPC channel (grpc.aio, tritonclient's protobufs):
    each request is one bidirectional ModelStreamInfer call on it, at most `pool_size` at a time."""

    def __init__(self, url: str, served: ServedModel, *, pool_size: int = DEFAULT_POOL):
        self.url = normalize_url(url)
        self.served = served
        self.pool_size = pool_size
        self._channel: grpc.aio.Channel | None = None
        self._stub = None
        self._slots: asyncio.Semaphore | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _connect(self):
        """The channel, opened on the first request (on the serving event loop, which grpc.aio needs)."""
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.url, options=CHANNEL_OPTIONS)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
            self._slots = asyncio.Semaphore(self.pool_size)
            self._loop = asyncio.get_running_loop()
        return self._stub

    async def aclose(self) -> None:
        if self._channel is not None:
            channel, self._channel, self._stub = self._channel, None, None
            await channel.close()

    def close(self) -> None:
        """From another thread, while the serving loop runs: close the channel on it (cancelling what
        still runs). A no-op before the first request."""
        loop = self._loop
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(self.aclose(), loop).result(timeout=10)

    async def stream(
        self,
        prompt: str,
        params: SamplingParams,
        *,
        num_draft_tokens: int | None,
        stop_words: tuple[str, ...] = (),
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> AsyncIterator[Chunk]:
        """The BLS's streamed responses of one request, as they arrive (the last one has `final`; a model
        that is not decoupled sends one).
        Closing the iterator early cancels the request on the server (its gRPC call is cancelled, which
        Triton turns into the request's cancellation: the BLS then ends within a round)."""
        info = self.served.info
        try:
            inputs = request_inputs(
                # a model that is not decoupled answers once: the whole text as one chunk
                info,
                prompt,
                params,
                stream=info.decoupled,
                num_draft_tokens=num_draft_tokens,
                stop_words=stop_words,
            )
        except ClientError as exc:
            raise OpenAIError(exc.what, param="prompt") from None
        request = _get_inference_request(
            model_name=info.name,
            inputs=inputs,
            model_version="",
            request_id=uuid.uuid4().hex,
            outputs=None,
            sequence_id=0,
            sequence_start=False,
            sequence_end=False,
            priority=0,
            timeout=None,
            parameters=None,
        )
        # a flags-only final response is sent too (what `enable_empty_final_response=True` sets)
        request.parameters["triton_enable_empty_final_response"].bool_param = True
        cumulative = self.served.llmapi  # text_output holds the whole text so far
        previous = ""
        stub = self._connect()
        async with self._slots:
            call = stub.ModelStreamInfer()
            finished = False
            try:
                await call.write(request)  # the stream stays open for writing: no half-close mid-request
                while not finished:
                    response = await self._read(call, info.name, timeout_s)
                    chunk = parse_response(InferResult(response.infer_response))
                    if cumulative and chunk.text:
                        chunk.text, previous = text_delta(previous, chunk.text), chunk.text
                    finished = chunk.final
                    yield chunk
            finally:
                call.cancel()  # no await: an unfinished request is cancelled on the server; a finished
                # one's call ends (a cancelled caller's awaits would be cancelled again by anyio)

    async def _read(self, call, model: str, timeout_s: float):
        """The call's next response within `timeout_s`. A cancel of the caller always ends it (and the read:
        grpc.aio then cancels the call). Not `asyncio.wait_for`: before Python 3.12 it returns the result
        instead of raising when the cancel lands as the read completes (CPython gh-86296), and the request
        then ran on to its end after its client had gone."""
        read = asyncio.ensure_future(call.read())
        try:
            done, _ = await asyncio.wait({read}, timeout=timeout_s)
        finally:  # the caller was cancelled, or no response in time
            if not read.done():
                read.cancel()
        if not done:
            raise OpenAIError(f"no response from the server within {timeout_s:g} s", status=504)
        try:
            response = read.result()
        except grpc.aio.AioRpcError as exc:
            raise _openai_error(self.url, model, exc.details() or str(exc.code()), timeout_s) from None
        if response is grpc.aio.EOF:
            raise OpenAIError("the server ended the stream before the request's final response", status=503)
        if response.error_message:
            raise _openai_error(self.url, model, response.error_message, timeout_s)
        return response


def _openai_error(url: str, model: str, text: str, timeout_s: float) -> OpenAIError:
    try:
        raise_request_error(url, model, " ".join(str(text).split()), timeout_s)
    except ClientError as exc:
        # the BLS refuses bad requests (limits, sampling options) with an error: the client's fault
        request_fault = exc.what.startswith("the server answered")
        message = f"{exc.what}: {exc.found}" if exc.found else exc.what
        return OpenAIError(message, status=400 if request_fault else 503)
    return OpenAIError(str(text), status=500)  # unreachable: raise_request_error always raises
