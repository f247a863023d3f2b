"""The frontend's side of Triton: streamed requests to the served repository over gRPC, from asyncio:
its `tensorrt_llm_bls` (engine-flow repositories), or the LLM-API `tensorrt_llm` model (LLM-API
repositories: client/remote.py `model_info` detects the interface from the model's metadata, the
request tensors are that interface's, its cumulative text_output is turned into deltas).

tritonclient's gRPC stream is callback-based (one stream per InferenceServerClient), so the bridge keeps
a pool of clients (one gRPC channel each, opened on demand up to `pool_size`, reused across requests) and
hands each response to the request's asyncio queue from tritonclient's thread. A request whose HTTP
client goes away (or that hits a stop string) is cancelled on the server: its stream is stopped with
`cancel_requests`, which Triton turns into the request's cancellation (the BLS then ends within a round).
The request tensors, the response parsing and the per-step counters are the gRPC client's
(client/request.py, client/remote.py): one definition for bench, `generate --url` and this frontend.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from specbuild.client.remote import (
    LLMAPI_INTERFACE,
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
DEFAULT_TIMEOUT_S = 600.0  # the longest silence between two responses of one request


@dataclass(frozen=True)
class ServedModel:
    """What the frontend needs to know about the served repository (read once, at start)."""

    info: ModelInfo
    tokenizer_dir: str | None  # preprocessing's tokenizer_dir parameter (a local folder for local repos)
    max_prompt_tokens: int | None = None  # the served model's max_prompt_tokens parameter (the BLS's)

    @property
    def llmapi(self) -> bool:
        return self.info.interface == LLMAPI_INTERFACE

    @property
    def loop_k(self) -> int | None:
        """K of a request without num_draft_tokens when the BLS drafts per round, else None."""
        return self.info.repo.num_draft_tokens if self.info.repo.bls_drives_loop else None

    @property
    def fixed_k(self) -> int | None:
        """The K every round drafts when the engine runs a draft/target loop by itself (the LLM API's
        speculative_config.max_draft_len); None otherwise (Medusa trees: the drafts per step vary)."""
        repo = self.info.repo
        if (
            self.llmapi
            and not repo.context_chunk_first
            and repo.drafts_every_round
            and repo.num_draft_tokens > 0
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
    def __init__(self, url: str, served: ServedModel, *, pool_size: int = DEFAULT_POOL):
        self.url = normalize_url(url)
        self.served = served
        self.pool_size = pool_size
        self._idle: list = []
        self._opened = 0
        self._slots: asyncio.Semaphore | None = None

    async def _acquire(self):
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.pool_size)
        await self._slots.acquire()
        if self._idle:
            return self._idle.pop()
        self._opened += 1
        return grpcclient.InferenceServerClient(url=self.url)

    def _release(self, client, *, healthy: bool) -> None:
        if healthy:
            self._idle.append(client)
        else:
            client.close()
            self._opened -= 1
        self._slots.release()

    def close(self) -> None:
        for client in self._idle:
            client.close()
        self._idle.clear()

    async def stream(
        self,
        prompt: str,
        params: SamplingParams,
        *,
        num_draft_tokens: int | None,
        stop_words: tuple[str, ...] = (),
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> AsyncIterator[Chunk]:
        """The BLS's streamed responses of one request, as they arrive (the last one has `final`).
        Closing the iterator early cancels the request on the server."""
        info = self.served.info
        try:
            inputs = request_inputs(
                info, prompt, params, stream=True, num_draft_tokens=num_draft_tokens, stop_words=stop_words
            )
        except ClientError as exc:
            raise OpenAIError(exc.what, param="prompt") from None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def callback(result=None, error=None):  # tritonclient's thread
            loop.call_soon_threadsafe(queue.put_nowait, (result, error))

        cumulative = self.served.llmapi  # text_output holds the whole text so far
        previous = ""
        client = await self._acquire()
        finished = False
        try:
            client.start_stream(callback=callback)
            client.async_stream_infer(
                info.name, inputs, request_id=uuid.uuid4().hex, enable_empty_final_response=True
            )
            while not finished:
                try:
                    result, error = await asyncio.wait_for(queue.get(), timeout_s)
                except TimeoutError:
                    raise OpenAIError(
                        f"no response from the server within {timeout_s:g} s", status=504
                    ) from None
                if error is not None:
                    raise _openai_error(self.url, info.name, error, timeout_s)
                chunk = parse_response(result)
                if cumulative and chunk.text:
                    chunk.text, previous = text_delta(previous, chunk.text), chunk.text
                finished = chunk.final
                yield chunk
        finally:
            self._close(loop, client, cancel=not finished)

    def _close(self, loop: asyncio.AbstractEventLoop, client, *, cancel: bool) -> None:
        """Stop the client's stream (an unfinished request is cancelled on the server) in a thread, and
        give the client back to the pool after. Nothing here awaits: a caller that is being cancelled
        (its HTTP client went away; anyio cancels every await of a cancelled scope again) cannot skip
        the stop or leak the pool's slot."""

        def stop():  # a worker thread
            try:
                client.stop_stream(cancel_requests=cancel)
                healthy = True
            except Exception:  # noqa: BLE001 - a broken channel: drop this client, keep the pool going
                healthy = False
            try:
                loop.call_soon_threadsafe(lambda: self._release(client, healthy=healthy))
            except RuntimeError:  # the loop is closed (the frontend stopped): nothing to give back to
                client.close()

        loop.run_in_executor(None, stop)


def _openai_error(url: str, model: str, error, timeout_s: float) -> OpenAIError:
    text = getattr(error, "message", None)
    text = text() if callable(text) else str(error)
    try:
        raise_request_error(url, model, " ".join(str(text).split()), timeout_s)
    except ClientError as exc:
        # the BLS refuses bad requests (limits, sampling options) with an error: the client's fault
        request_fault = exc.what.startswith("the server answered")
        message = f"{exc.what}: {exc.found}" if exc.found else exc.what
        return OpenAIError(message, status=400 if request_fault else 503)
    return OpenAIError(str(text), status=500)  # unreachable: raise_request_error always raises
