"""The OpenAI frontend's app over a fake Triton bridge, served by uvicorn on loopback: the HTTP layer
(bodies, errors, disconnects, the OpenAPI document) tested in seconds, without a tritonserver. The fake
streams one token a `step_s` and counts what it produced and whether its request was closed, as the
real bridge cancels a closed request on Triton."""

from __future__ import annotations

import asyncio
import http.client
import json
import threading

from specbuild.client.remote import ModelInfo, RepoInfo
from specbuild.client.request import Chunk
from specbuild.core.methods import Method
from specbuild.frontend.app import Frontend, create_app
from specbuild.frontend.chat import ChatTemplate
from specbuild.frontend.run import serve_app
from specbuild.frontend.triton import ServedModel
from specbuild.serve.tritonserver import free_port

MODEL = "fake"


class FakeBridge:
    """Streams `tokens` chunks of text "t{i} " (one token each), one every `step_s` seconds."""

    def __init__(
        self,
        *,
        max_total: int | None = 4096,
        max_prompt: int | None = None,
        step_s: float = 0.0,
        swallow_cancels: int = 0,
    ):
        info = ModelInfo(
            "tensorrt_llm_bls",
            frozenset({"text_input"}),
            True,
            RepoInfo(Method.DRAFT_TARGET, 3),
            max_total_tokens=max_total,
        )
        self.served = ServedModel(info, None, max_prompt)
        self.step_s = step_s
        self.produced = 0  # chunks yielded, all requests
        self.open = 0  # requests running
        self.closed = threading.Event()  # set when a request ends (finished or closed early)
        # cancels taken for a result, as asyncio.wait_for can before Python 3.12 (CPython gh-86296)
        self.swallow_cancels = swallow_cancels
        self.swallowed = 0

    async def stream(self, prompt, params, *, num_draft_tokens, stop_words=()):
        self.open += 1
        try:
            for i in range(params.max_tokens):
                if self.step_s:
                    try:
                        await asyncio.sleep(self.step_s)
                    except asyncio.CancelledError:
                        if self.swallowed >= self.swallow_cancels:
                            raise
                        self.swallowed += 1
                self.produced += 1
                yield Chunk(text=f"t{i} ", token_ids=[i], final=i == params.max_tokens - 1)
        finally:
            self.open -= 1
            self.closed.set()

    def close(self):
        pass


class FakeServer:
    def __init__(self, bridge: FakeBridge, tokenizer=None):
        chat = ChatTemplate(None)
        chat.tokenizer = tokenizer
        self.bridge = bridge
        self.app = create_app(Frontend(bridge, chat, MODEL))
        self.port = free_port()
        self.server, self.thread = serve_app(self.app, "127.0.0.1", self.port)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def post(self, path: str, body, *, timeout: float = 30) -> tuple[int, bytes]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, data, {"Content-Type": "application/json"})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()
