"""Start the OpenAI-compatible frontend next to a running tritonserver: uvicorn in a thread of the
`specbuild serve` process, bound to loopback unless asked otherwise; `stop()` ends it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from specbuild.core.artifacts import read_repo_manifest
from specbuild.core.errors import ServerError, SpecbuildError
from specbuild.frontend.app import Frontend, create_app
from specbuild.frontend.chat import ChatTemplate
from specbuild.frontend.triton import DEFAULT_POOL, TritonBridge, describe

START_TIMEOUT_S = 30.0


@dataclass(frozen=True, kw_only=True)
class FrontendOptions:
    host: str = "127.0.0.1"
    port: int = 9000
    model_name: str | None = None  # the served model id (default: the repository folder's name)
    chat_template: Path | None = None  # a Jinja chat template file (default: the tokenizer's, if any)
    tokenizer: Path | None = None  # default: the repository's preprocessing tokenizer_dir (else `repo`'s)
    pool_size: int = DEFAULT_POOL
    metrics_url: str | None = None  # Triton's metrics page, proxied at the frontend's /metrics
    # the served repository: its manifest names the tokenizer when no preprocessing model does (LLM-API)
    repo: Path | None = None


class RunningFrontend:
    def __init__(
        self, server: uvicorn.Server, thread: threading.Thread, bridge: TritonBridge, url: str, model: str
    ):
        self._server, self._thread, self._bridge = server, thread, bridge
        self.url, self.model = url, model

    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        try:
            self._bridge.close()  # on the serving loop, before it ends
        except Exception:  # noqa: BLE001 - stopping goes on: the channel dies with the loop
            pass
        self._server.should_exit = True
        self._thread.join(timeout=10)


def _manifest_tokenizer(repo: Path | None) -> str | None:
    if repo is None:
        return None
    try:
        folder = read_repo_manifest(repo).tokenizer_dir_host
    except SpecbuildError:
        return None
    return str(folder) if folder is not None and folder.is_dir() else None


def start_frontend(grpc_url: str, options: FrontendOptions, *, default_name: str) -> RunningFrontend:
    """Read the served repository's description from Triton, then serve HTTP until stop()."""
    served = describe(grpc_url)
    tokenizer = options.tokenizer or served.tokenizer_dir or _manifest_tokenizer(options.repo)
    if served.llmapi and tokenizer is None:
        raise ServerError(
            "the OpenAI frontend needs the tokenizer of an LLM-API repository",
            expected="the repository folder (its specbuild.json names the tokenizer) or a tokenizer folder",
            found="the LLM-API model returns no prompt token count and no preprocessing model names one",
            fix="serve a repository written by `specbuild repo --backend llmapi-local`",
        )
    chat = ChatTemplate(tokenizer, options.chat_template)
    model = options.model_name or default_name
    bridge = TritonBridge(grpc_url, served, pool_size=options.pool_size)
    app = create_app(Frontend(bridge, chat, model, options.metrics_url))
    server, thread = serve_app(app, options.host, options.port)
    host = f"[{options.host}]" if ":" in options.host else options.host
    return RunningFrontend(server, thread, bridge, f"http://{host}:{options.port}/v1", model)


def serve_app(app, host: str, port: int) -> tuple[uvicorn.Server, threading.Thread]:
    """uvicorn serving `app` in a daemon thread, once it listens (else ServerError)."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="openai-frontend", daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise ServerError(
                f"the OpenAI frontend did not start on {host}:{port}",
                expected="a free port",
                found="uvicorn stopped"
                if not thread.is_alive()
                else f"not listening after {START_TIMEOUT_S:g} s",
                fix="pass another --openai-port",
            )
        time.sleep(0.05)
    return server, thread
