"""bench-serve's frontend part: tokens/s through the OpenAI frontend (`serve --openai-port`: HTTP + SSE,
then gRPC to the BLS) over tokens/s straight to Triton (`specbuild bench`'s path: a gRPC session per
worker), on the same server, prompts and sampling, at each concurrency.

Rounds interleave the two sides (which goes first alternates), so both see the same machine load; the
ratio is frontend / direct per round, reported as its median with the spread of the rounds. Greedy: every
frontend answer's text is checked equal to the direct answer's for the same prompt.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import psutil

from specbuild.client.remote import Session
from specbuild.core.errors import SpecbuildError
from specbuild.core.sampling_params import SamplingParams
from specbuild.frontend.run import FrontendOptions, start_frontend
from specbuild.serve.tritonserver import free_port

MODEL = "bench"  # the served model id the benchmark gives the frontend


class FrontendClient:
    """One keep-alive HTTP connection per worker thread; a streamed completion -> (text, tokens)."""

    def __init__(self, url: str, model: str = MODEL):
        self.model = model
        address = urlparse(url)
        self.host, self.port = address.hostname, address.port
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        if not hasattr(self._local, "conn"):
            self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        return self._local.conn

    def complete(self, prompt: str, params: SamplingParams, k: int) -> tuple[str, int]:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "num_draft_tokens": k,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        conn = self._conn()
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise SpecbuildError(
                f"the frontend answered {response.status}", found=response.read()[:300].decode()
            )
        text, tokens = [], 0
        for line in response:  # SSE: "data: {json}\n", blank lines, "data: [DONE]"
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if event["choices"]:
                text.append(event["choices"][0]["text"])
            elif event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
        return "".join(text), tokens


def _serve(grpc_url: str, port: int, ready, stop) -> None:  # the child process
    frontend = start_frontend(grpc_url, FrontendOptions(port=port), default_name=MODEL)
    ready.set()
    stop.wait()
    frontend.stop()


class FrontendProcess:
    """The frontend in its own process, as `serve` runs it apart from its clients (in the benchmark's
    process the client threads would share its interpreter lock)."""

    def __init__(self, grpc_url: str, start_timeout_s: float = 120.0):
        context = multiprocessing.get_context("spawn")
        port = free_port()
        self._ready, self._stop = context.Event(), context.Event()
        self._process = context.Process(
            target=_serve, args=(grpc_url, port, self._ready, self._stop), daemon=True
        )
        self._process.start()
        if not self._ready.wait(start_timeout_s):
            self.stop()
            raise SpecbuildError("bench-serve: the OpenAI frontend did not start", found=f"port {port}")
        self.url = f"http://127.0.0.1:{port}/v1"
        self.pid = self._process.pid

    def cpu_s(self) -> float:
        """CPU seconds (user + system) the frontend's process used so far."""
        times = psutil.Process(self.pid).cpu_times()
        return times.user + times.system

    def stop(self) -> None:
        self._stop.set()
        self._process.join(timeout=15)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()


def _pass(run: Callable[[str], tuple[str, int]], prompts: list[str], concurrency: int) -> tuple[float, list]:
    """All prompts at `concurrency` -> (tokens/s, answers in prompt order)."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        answers = list(pool.map(run, prompts))
    seconds = time.perf_counter() - started
    return sum(tokens for _, tokens in answers) / seconds, answers


def measure_frontend(
    grpc_url: str,
    prompts: list[str],
    params: SamplingParams,
    *,
    k: int,
    concurrency: tuple[int, ...] = (1, 4),
    rounds: int = 3,
) -> dict:
    """{concurrency: {direct_tokens_per_s, frontend_tokens_per_s, ratio (median), ratio_per_round,
    ratio_spread [min, max], frontend_cpu_ms_per_token / _per_request}} on the server at `grpc_url`. The
    frontend's CPU per token is the figure that load does not blur: on a machine whose cores the engines
    need, it is what the frontend takes from them."""
    frontend = FrontendProcess(grpc_url)
    http_client = FrontendClient(frontend.url)
    local = threading.local()
    sessions: list[Session] = []

    def direct(prompt: str) -> tuple[str, int]:
        if not hasattr(local, "session"):
            local.session = Session(grpc_url)
            sessions.append(local.session)
        result = local.session.generate(prompt, params, num_draft_tokens=k, stream=True, timeout_s=300)
        return result.text, len(result.token_ids)

    def via_frontend(prompt: str) -> tuple[str, int]:
        return http_client.complete(prompt, params, k)

    sides = {"direct": direct, "frontend": via_frontend}
    out: dict = {}
    try:
        for c in concurrency:
            for run in sides.values():  # warm-up: connections, sessions, first-call costs
                _pass(run, prompts[: max(c, 1)], c)
            rates: dict[str, list[float]] = {side: [] for side in sides}
            cpu_s, tokens = 0.0, 0
            for r in range(rounds):
                order = list(sides) if r % 2 == 0 else list(reversed(sides))
                answers = {}
                for side in order:
                    before = frontend.cpu_s()
                    rate, answers[side] = _pass(sides[side], prompts, c)
                    rates[side].append(rate)
                    if side == "frontend":
                        cpu_s += frontend.cpu_s() - before
                        tokens += sum(n for _, n in answers[side])
                _check_same(answers, prompts)
            ratios = [f / d for f, d in zip(rates["frontend"], rates["direct"], strict=True)]
            out[c] = {
                "direct_tokens_per_s": round(statistics.median(rates["direct"]), 2),
                "frontend_tokens_per_s": round(statistics.median(rates["frontend"]), 2),
                "ratio": round(statistics.median(ratios), 3),
                "ratio_per_round": [round(x, 3) for x in ratios],
                "ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)],
                # the frontend process's own CPU (user + system) per generated token and per request
                "frontend_cpu_ms_per_token": round(cpu_s * 1e3 / max(tokens, 1), 3),
                "frontend_cpu_ms_per_request": round(cpu_s * 1e3 / (rounds * len(prompts)), 3),
            }
    finally:
        frontend.stop()
        for session in sessions:
            session.close()
    return out


def _check_same(answers: dict[str, list], prompts: list[str]) -> None:
    for prompt, (a, b) in zip(prompts, zip(answers["direct"], answers["frontend"], strict=True), strict=True):
        if a != b:
            raise SpecbuildError(
                f"bench-serve: the frontend answered otherwise than Triton for prompt {prompt[:40]!r}",
                expected=f"greedy: the same text and token count ({a[1]} tokens)",
                found=f"{b[1]} tokens, text {b[0][:60]!r} vs {a[0][:60]!r}",
                fix="a frontend bug: the same request through both paths must answer the same",
            )


def format_frontend(found: dict) -> list[str]:
    lines = ["frontend / direct-to-Triton tokens/s (streamed completions, interleaved rounds):"]
    for c, row in found.items():
        lines.append(
            f"  c={c}: direct {row['direct_tokens_per_s']} tok/s, frontend {row['frontend_tokens_per_s']} "
            f"tok/s, ratio {row['ratio']} (rounds {row['ratio_per_round']}); frontend CPU "
            f"{row['frontend_cpu_ms_per_token']} ms/token, {row['frontend_cpu_ms_per_request']} ms/request"
        )
    return lines
