"""Generate through a running tritonserver with tritonclient.grpc: streaming or unary.

`generate_remote(url, prompt, params, ...)` returns the same `GenerationResult` as the in-process
`generate_local`: the continuation's text and token ids, with speculative statistics from the
server's `return_perf_metrics` outputs (and, when streaming, the accepted length of each step).

Routing: every repository's `tensorrt_llm_bls` (draft/target: with `num_draft_tokens`, 0 = the target
alone; Medusa: the engine speculates, the BLS streams it). The BLS, not the ensemble, because in
Triton 2.51 cancelling an ensemble request reaches only the steps not yet scheduled
(core ensemble_scheduler.cc, r24.10), so a cancelled Medusa stream through the ensemble runs to its
end; the BLS stops the engine with a `stop` request. `--model ensemble` still works.
The repository says its speculation method (the BLS's `speculation_method` parameter, written by
`specbuild repo`): only methods whose BLS runs the draft -> verify loop take `num_draft_tokens`.
Decoupled models answer only on the bidirectional stream, so "unary" on a decoupled model is a
stream read to its final response with `stream=False` (one response with the whole text).
Every failure (server down, unknown model, a model that is down, timeout, server gone mid-request) is
a ClientError; the server's first error is the one reported (not the cancellation that follows it).
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from specbuild.client.request import KV, Chunk, build_inputs, build_llmapi_inputs, parse_response
from specbuild.client.session_stream import SessionStream
from specbuild.core.addresses import grpc_address
from specbuild.core.deployment import RepoKind
from specbuild.core.errors import ClientError, SpecbuildError
from specbuild.core.facts.trtllm import SpeculativeDecodingMode
from specbuild.core.generation import GenerationResult, SpecStats
from specbuild.core.methods import Method, SpeculationMethod, method_of, parse_method
from specbuild.core.methods.base import Tunable
from specbuild.core.perf.theory import rounds_from_steps
from specbuild.core.sampling_params import SamplingParams
from specbuild.model_repo.tensors import BLS, ENSEMBLE, LLMAPI_MODEL, is_llmapi_interface

DEFAULT_TIMEOUT_S = 60.0
CONNECT_TIMEOUT_S = 5.0


BLS_INTERFACE, LLMAPI_INTERFACE = RepoKind.ENGINE.interface, RepoKind.LLMAPI.interface  # the entry models'


@dataclass(frozen=True)
class RepoInfo:
    """What the served repository says about itself (the BLS's parameters, or the LLM-API model's)."""

    method: Method | None  # None: an LLM-API repository that does not say (not written by specbuild)
    num_draft_tokens: int  # the BLS's default_num_draft_tokens: the repository's K (0: not per round)
    interface: str = BLS_INTERFACE  # bls (ensemble / BLS text interface) | llmapi (Triton's LLM-API model)
    trtllm_version: str | None = None
    draft_len_schedule: str = ""  # the BLS's load-aware schedule ("1:4,3:2,6:0"; "": fixed K)

    @property
    def speculation(self) -> SpeculationMethod | None:
        return method_of(self.method) if self.method is not None else None

    @property
    def kind(self) -> RepoKind:
        """The repository kind as the wire shows it (core/deployment.py RepoKind.of_interface)."""
        return RepoKind.of_interface(self.interface)

    @property
    def bls_drives_loop(self) -> bool:
        """Requests choose K (num_draft_tokens; 0 = the target alone): the BLS runs the rounds."""
        return self.speculation is not None and self.kind.k_per_request(self.speculation)

    @property
    def has_baseline(self) -> bool:
        """The same server can run the target alone. The LLM API speculates on every request."""
        return self.speculation is not None and self.kind.has_baseline(self.speculation)

    @property
    def draft_model(self) -> bool:
        """A separate draft model to time for the cost ratio (BLS repositories only: the LLM-API model is
        one model)."""
        return self.speculation is not None and self.kind.separate_draft(self.speculation)

    @property
    def always_speculates(self) -> bool:
        if self.kind.llmapi:
            return self.method is not None
        return (
            not self.bls_drives_loop
            and self.speculation is not None
            and self.speculation.target_mode.speculative
        )

    @property
    def drafts_every_round(self) -> bool:
        """Each round drafts min(K, tokens left - 1), so the rounds follow from the responses' sizes;
        False for n-gram (0..K per round: what the pool holds)."""
        return self.speculation is None or self.speculation.drafts_every_round

    @property
    def context_chunk_first(self) -> bool:
        """A stream of an engine that speculates by itself starts with the context phase's token (no step)
        when the target drafts inside its own pass (Medusa heads, EAGLE); an engine-side draft/target
        loop (the LLM API's) drafts from the first round: every response is a round."""
        method = self.speculation
        return method is None or method.target_mode not in (
            SpeculativeDecodingMode.NONE,
            SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL,
        )

    @property
    def chain_after_context(self) -> bool:
        """The context phase's response drafts nothing, then every round drafts a chain of min(K, tokens
        left - 1) (EAGLE-3 one-model): the rounds follow from the responses' sizes, as for a draft/target
        loop. Not a tree (Medusa: the drafts per step vary)."""
        method = self.speculation
        return method is not None and self.context_chunk_first and method.tunes is Tunable.DRAFT_LEN

    @property
    def rounds_k(self) -> int | None:
        """K when a client can rebuild each round's drafts from the responses' sizes, else None (n-gram:
        0..K per round; Medusa: a tree)."""
        chain = self.drafts_every_round and not self.context_chunk_first
        if self.speculation is not None and (chain or self.chain_after_context):
            return self.num_draft_tokens or None
        return None

    @property
    def title(self) -> str:
        return self.speculation.title if self.speculation else "unknown method"

    @property
    def mode(self) -> str:
        return self.method.value if self.method is not None else "unknown"


@dataclass(frozen=True)
class ModelInfo:
    name: str
    inputs: frozenset[str]
    decoupled: bool
    repo: RepoInfo
    max_total_tokens: int | None = None  # the BLS's limit on prompt + max_tokens (its parameters)
    outputs: frozenset[str] = frozenset()

    @property
    def interface(self) -> str:
        return self.repo.interface

    @property
    def kind(self) -> RepoKind:
        return self.repo.kind

    @property
    def token_ids(self) -> bool:
        """Responses carry token ids (every specbuild repository; upstream's LLM-API model returns text)."""
        return not self.kind.llmapi or "output_ids" in self.outputs


# A Python-backend model whose stub process died: "Stub process 'tensorrt_llm_draft_0_0' is not healthy."
_DEAD_STUB = re.compile(r"Stub process '(?P<instance>[^']+)' is not healthy")


def normalize_url(url: str) -> str:
    """'grpc://host:port' or 'host:port' -> 'host:port', checked (core/addresses.py)."""
    return grpc_address(url, option="--url")


def _error_text(exc: Exception) -> str:
    msg = getattr(exc, "message", None)
    text = msg() if callable(msg) else str(exc)
    return " ".join(str(text).split())


def connect(url: str):
    """An InferenceServerClient for a live server, or a ClientError saying the server is down."""
    url = normalize_url(url)
    client = grpcclient.InferenceServerClient(url=url)
    try:
        live = client.is_server_live(client_timeout=CONNECT_TIMEOUT_S)
    except InferenceServerException as exc:
        client.close()
        raise ClientError(
            f"cannot reach tritonserver at {url}",
            expected="a running server with its gRPC endpoint on that address",
            found=_error_text(exc),
            fix="start it with `specbuild serve REPO --grpc-port PORT`, or check --url",
        ) from None
    if not live:
        client.close()
        raise ClientError(
            f"tritonserver at {url} is not live", fix="wait for it to finish starting, or restart it"
        )
    return client


def repo_info(client) -> RepoInfo:
    """The speculation method and K of the served repository, from the BLS's configuration."""
    try:
        params = client.get_model_config(BLS, as_json=True).get("config", {}).get("parameters", {})
    except InferenceServerException as exc:
        raise ClientError(
            f"cannot read the configuration of {BLS!r}",
            expected="a repository from `specbuild repo`",
            found=_error_text(exc),
            fix="serve the repository with `specbuild serve REPO`",
        ) from None

    def param(key: str) -> str:
        return str((params.get(key) or {}).get("string_value", ""))

    try:
        method = parse_method(param("speculation_method"), where=f"{BLS} parameter speculation_method")
    except SpecbuildError as exc:
        raise ClientError(
            exc.what,
            expected=exc.expected,
            found=exc.found,
            fix="regenerate the repository with this specbuild (`specbuild repo BUILD --out REPO --force`)",
        ) from None
    k = param("default_num_draft_tokens")
    return RepoInfo(method, int(k) if k.isdecimal() else 0, draft_len_schedule=param("draft_len_schedule"))


def llmapi_repo_info(config: dict) -> RepoInfo:
    """An LLM-API repository's method and K from its model's parameters (specbuild writes them; upstream's
    model.py ignores them); an upstream repository says nothing: method None."""
    params = config.get("parameters", {})

    def param(key: str) -> str:
        return str((params.get(key) or {}).get("string_value", ""))

    try:
        method = parse_method(param("speculation_method")) if param("speculation_method") else None
    except SpecbuildError:
        method = None
    k = param("default_num_draft_tokens")
    return RepoInfo(
        method,
        int(k) if k.isdecimal() else 0,
        LLMAPI_INTERFACE,
        trtllm_version=param("trtllm_version") or None,
    )


def model_info(client, model: str | None) -> ModelInfo:
    """Resolve the model (None: the BLS, else an LLM-API repository's tensorrt_llm) and read its inputs; the
    interface is detected from the model's metadata (text_input + sampling_param_*: Triton's LLM-API
    model); a model that is not READY is a ClientError."""
    index = client.get_model_repository_index(as_json=True).get("models", [])
    ready = {m["name"] for m in index if m.get("state") == "READY"}
    down = tuple(
        f"{m['name']} ({m.get('state') or 'UNKNOWN'}{': ' + m['reason'] if m.get('reason') else ''})"
        for m in index
        if m.get("state") != "READY"
    )
    name = model or (LLMAPI_MODEL if BLS not in ready and LLMAPI_MODEL in ready else BLS)
    if down:  # a model that failed to load or was unloaded: say which, before any request fails on it
        raise ClientError(
            f"model {name!r} is down on the server"
            if name not in ready
            else "the repository has models that are down",
            expected="every model of the repository READY",
            found="; ".join(down),
            fix="read the server log for why, then restart `specbuild serve`",
        )
    if name not in ready:
        raise ClientError(
            f"model {name!r} is not served here",
            expected=f"one of the READY models: {', '.join(sorted(ready)) or 'none'}",
            found=name,
            fix=f"pass --model {BLS} or --model {ENSEMBLE}",
        )
    try:
        meta = client.get_model_metadata(name, as_json=True)
        config = client.get_model_config(name, as_json=True).get("config", {})
    except InferenceServerException as exc:
        raise ClientError(
            f"cannot read the configuration of model {name!r}", found=_error_text(exc)
        ) from None
    decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
    total = (config.get("parameters", {}).get("max_total_tokens") or {}).get("string_value", "")
    inputs = frozenset(i["name"] for i in meta.get("inputs", []))
    if name == LLMAPI_MODEL and not is_llmapi_interface(inputs):
        raise ClientError(
            f"model {name!r} here is the TensorRT-LLM engine model (token ids in and out), not Triton's "
            "LLM-API model",
            expected="text_input + sampling_param_* inputs (an LLM-API repository)",
            found=", ".join(sorted(inputs)[:6]) + ", ...",
            fix=f"call --model {BLS} (or {ENSEMBLE}) on an engine-flow repository",
        )
    repo = llmapi_repo_info(config) if is_llmapi_interface(inputs) else repo_info(client)
    return ModelInfo(
        name,
        inputs,
        decoupled,
        repo,
        max_total_tokens=int(total) if total.isdecimal() else None,
        outputs=frozenset(o["name"] for o in meta.get("outputs", [])),
    )


def text_delta(previous: str, whole: str) -> str:
    """The new text of a cumulative text_output (the LLM-API interface sends the whole text so far): what
    `whole` adds after its common prefix with `previous` (best effort while streaming: a decode that
    rewrites earlier characters is not sent again)."""
    shared = 0
    while shared < min(len(whole), len(previous)) and whole[shared] == previous[shared]:
        shared += 1
    return whole[shared:]


class _Collector:
    """Gathers a request's responses; the stream callback feeds it (keyword args result=, error=)."""

    def __init__(self, on_text: Callable[[str], None] | None, *, cumulative: bool = False) -> None:
        self.cumulative = cumulative  # text_output holds the whole text so far (the LLM-API interface)
        self.last_text = ""
        self.chunks: list[Chunk] = []
        self.times: list[float] = []  # monotonic arrival of each response with tokens or text
        self.done = threading.Event()
        self.error: str | None = None
        self._on_text = on_text

    def callback(self, result=None, error=None) -> None:
        if error is not None:
            if self.error is None:  # the first error explains; what follows (our own cancellation) does not
                self.error = _error_text(error)
            self.done.set()
            return
        try:
            chunk = parse_response(result)
        except Exception as exc:  # noqa: BLE001 - runs in tritonclient's thread: report, never lose it
            if self.error is None:
                self.error = f"unreadable response: {type(exc).__name__}: {exc}"
            self.done.set()
            return
        if self.cumulative and chunk.text:
            chunk.text, self.last_text = text_delta(self.last_text, chunk.text), chunk.text
        if chunk.text or chunk.token_ids or chunk.perf or chunk.counts:
            self.chunks.append(chunk)
            self.times.append(time.monotonic())
            if self._on_text and chunk.text:
                self._on_text(chunk.text)
        if chunk.final:
            self.done.set()


def request_inputs(info: ModelInfo, prompt, params, *, stream, num_draft_tokens, stop_words=()):
    """The InferInputs of one request to the served model (only the inputs it declares)."""
    out = []
    if info.kind.llmapi:
        built = build_llmapi_inputs(
            prompt,
            params,
            stream=stream,
            declared=set(info.inputs),
            trtllm_version=info.repo.trtllm_version,
            stop_words=tuple(stop_words),
        )
    else:
        built = build_inputs(
            info.name,
            prompt,
            params,
            stream=stream,
            num_draft_tokens=num_draft_tokens,
            declared=set(info.inputs),
            stop_words=tuple(stop_words),
        )
    for name, array, dtype in built:
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def _run_stream(stream: SessionStream, info: ModelInfo, inputs, *, timeout_s: float, on_text) -> _Collector:
    collector = _Collector(on_text, cumulative=info.kind.llmapi)
    clean = False
    try:
        stream.send(info.name, inputs, collector.callback)
        if not collector.done.wait(timeout_s):
            raise ClientError(
                f"no complete answer from {info.name!r} within {timeout_s:g} s",
                expected="the final response of the request",
                found=f"{len(collector.chunks)} partial responses",
                fix="raise --timeout, lower --max-tokens, or check the server log",
            )
        clean = collector.error is None
    finally:
        stream.release(clean=clean)  # a request that went wrong closes the stream and cancels its work
    return collector


def _run_unary(client, info: ModelInfo, inputs, *, timeout_s: float) -> _Collector:
    collector = _Collector(None)
    try:
        result = client.infer(info.name, inputs, request_id=uuid.uuid4().hex, client_timeout=timeout_s)
    except InferenceServerException as exc:
        collector.error = _error_text(exc)
        return collector
    collector.callback(result=result)
    return collector


def raise_request_error(url: str, model: str, error: str, timeout_s: float) -> None:
    """The ClientError that explains a request's first server error."""
    dead = _DEAD_STUB.search(error)
    if dead:
        instance = dead.group("instance")
        served = re.sub(r"_\d+_\d+$", "", instance)  # instance name: <model>_<group>_<index>
        raise ClientError(
            f"model {served!r} is down: its Python backend process ({instance}) is not running",
            expected=f"a live process for every model behind {model!r}",
            found=error,
            fix="the server still lists it READY but cannot run it: restart `specbuild serve` "
            "(and check its log for why the process died)",
        )
    low = error.lower()
    if "deadline" in low:
        raise ClientError(
            f"request to {model!r} timed out after {timeout_s:g} s",
            found=error,
            fix="raise --timeout or lower --max-tokens",
        )
    if "unavailable" in low or "socket closed" in low or "connection" in low or "failed to connect" in low:
        raise ClientError(
            f"lost the connection to tritonserver at {url} during the request",
            expected="a response from the server",
            found=error,
            fix="the server stopped or crashed: check its log, restart it with `specbuild serve`, retry",
        )
    raise ClientError(
        f"the server answered the request to {model!r} with an error",
        found=error,
        fix="check the request options against the model (and the server log)",
    )


def request_steps(
    chunks: list[Chunk],
    *,
    self_speculating: bool,
    context_first: bool = True,
    k: int | None = None,
    max_tokens: int | None = None,
) -> list[tuple[int, int]] | None:
    """(accepted, drafted) of each verification step of a streamed request, or None when unknown.

    Exact when the streamed responses carry the running totals (the BLS's draft/target rounds with
    return_perf_metrics): each round's deltas. For an engine that speculates by itself:
    * context_first (Medusa, EAGLE): the first response is the context phase's token (no step) and every
      later one a step (its tokens = accepted + 1). With k (a chain of min(k, tokens still allowed - 1)
      per round after the context phase: EAGLE-3) the rounds are rebuilt as below, kept when they add up
      to the totals; otherwise the drafts per step follow from the total when it divides evenly, else
      stay unknown: 0 (Medusa trees);
    * else (the LLM API's draft/target loop: every response one round of accepted + 1 tokens): each
      round drafted min(k, tokens still allowed - 1) (core/perf/theory.rounds_from_steps), kept only when
      the rounds add up to the final response's totals (a round cut by a stop word, or an output length
      the server lowered, would not: None)."""
    content = [c for c in chunks if c.token_ids]
    if any("total_draft_tokens" in c.perf for c in content):
        steps, acc, dr = [], 0, 0
        for c in content:
            if "total_draft_tokens" not in c.perf:
                continue
            a, d = int(c.perf["total_accepted_draft_tokens"]), int(c.perf["total_draft_tokens"])
            if d > dr:
                steps.append((a - acc, d - dr))
            acc, dr = a, d
        return steps
    if not self_speculating:
        return None
    totals = next((c.perf for c in reversed(chunks) if "total_draft_tokens" in c.perf), {})
    total = int(totals.get("total_draft_tokens", 0))
    if not context_first:
        if not k or not max_tokens or not content:
            return None
        sizes = [len(c.token_ids) - 1 for c in content]
        rounds = [r for r in rounds_from_steps(sizes, k, max_tokens) if r[1]]  # a round of 0 drafts: no step
        accepted = int(totals.get("total_accepted_draft_tokens", -1))
        if sum(d for _, d in rounds) != total or sum(a for a, _ in rounds) != accepted:
            return None
        return rounds
    if len(content) > 1 and k and max_tokens:
        first = len(content[0].token_ids)  # the context phase's tokens: no drafts
        sizes = [len(c.token_ids) - 1 for c in content[1:]]
        rounds = [r for r in rounds_from_steps(sizes, k, max_tokens - first) if r[1]]
        accepted = int(totals.get("total_accepted_draft_tokens", -1))
        if sum(d for _, d in rounds) == total and sum(a for a, _ in rounds) == accepted:
            return rounds
    if len(content) > 1:
        accepted_steps = [len(c.token_ids) - 1 for c in content[1:]]
        per = total // len(accepted_steps) if total and total % len(accepted_steps) == 0 else 0
        return [(a, per) for a in accepted_steps]
    return None


def _result(collector: _Collector, *, t0: float, params: SamplingParams, repo: RepoInfo) -> GenerationResult:
    always_speculates = repo.always_speculates
    text = collector.last_text if collector.cumulative else "".join(c.text for c in collector.chunks)
    token_ids = [t for c in collector.chunks for t in c.token_ids]
    perf: dict[str, float] = {}
    for c in collector.chunks:
        perf.update(c.perf)
    stats = SpecStats(
        drafted=int(perf.get("total_draft_tokens", 0)),
        accepted=int(perf.get("total_accepted_draft_tokens", 0)),
        guard_stopped=bool(perf.get("speculation_stopped", 0.0)),
    )
    sizes = [len(c.token_ids) for c in collector.chunks if c.token_ids]
    speculative = always_speculates or stats.drafted > 0
    if speculative and len(sizes) > 1:  # streaming: one response per engine step
        stats.target_passes = len(sizes)
        steps = request_steps(
            collector.chunks,
            self_speculating=always_speculates,
            context_first=repo.context_chunk_first,
            k=repo.rounds_k,
            max_tokens=params.max_tokens,
        )
        if steps is not None:
            stats.accepted_per_step = [a for a, _ in steps]
            stats.drafted_per_step = [d for _, d in steps]
        else:
            stats.accepted_per_step = [max(n - 1, 0) for n in sizes]
    timings = {"total": time.monotonic() - t0}
    times = [t for c, t in zip(collector.chunks, collector.times, strict=True) if c.token_ids or c.text]
    if times:
        timings["ttft"] = times[0] - t0
    if len(times) > 1:  # AIPerf's time_to_second_token: the gap between the first two content chunks
        timings["ttst"] = times[1] - times[0]
    if sizes:
        timings["first_chunk_tokens"] = float(sizes[0])
    if "first_token_time_ns" in perf and "arrival_time_ns" in perf and perf["arrival_time_ns"] > 0:
        timings["server_ttft"] = (perf["first_token_time_ns"] - perf["arrival_time_ns"]) / 1e9
    if "last_token_time_ns" in perf and "arrival_time_ns" in perf and perf["arrival_time_ns"] > 0:
        timings["server_total"] = (perf["last_token_time_ns"] - perf["arrival_time_ns"]) / 1e9
    timings["chunks"] = float(len(sizes))
    reported = next((c.finish_reason for c in reversed(collector.chunks) if c.finish_reason), None)
    finish = reported or ("length" if len(token_ids) >= params.max_tokens else "stop")
    prompt = next(
        (c.counts["num_input_tokens"] for c in collector.chunks if "num_input_tokens" in c.counts), None
    )
    return GenerationResult(
        text=text,
        token_ids=token_ids,
        finish_reason=finish,
        speculative=speculative,
        stats=stats,
        timings=timings,
        prompt_tokens=prompt,
        kv_cache={name: int(perf[name]) for name in KV if name in perf},
    )


class Session:
    """One connection to a running tritonserver and the served model's description, read once.

    `generate` sends one request at a time over the session's channel, streamed requests (and every
    request to a decoupled model) on one gRPC stream kept open across them (session_stream.py: a failed
    or timed-out request closes it, cancelling its work, and the next request opens a fresh one).
    `specbuild bench` keeps one session per worker thread: no reconnect and no model-metadata refetch
    per request.
    """

    def __init__(self, url: str, model: str | None = None):
        self.url = normalize_url(url)
        self.client = connect(self.url)
        try:
            self.info = model_info(self.client, model)
        except BaseException:
            self.client.close()
            raise
        self.stream = SessionStream(self.client)

    def close(self) -> None:
        try:
            self.stream.close()
        finally:
            self.client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def generate(
        self,
        prompt: str,
        params: SamplingParams,
        *,
        stream: bool = False,
        num_draft_tokens: int | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        on_text: Callable[[str], None] | None = None,
    ) -> GenerationResult:
        """One request; `on_text` receives streamed text pieces as they arrive."""
        info = self.info
        if stream and not info.decoupled and info.name in (BLS, LLMAPI_MODEL):
            raise ClientError(
                f"model {info.name!r} is not decoupled: it answers each request once and cannot stream",
                expected="a decoupled model (model_transaction_policy decoupled: true) for streaming",
                found="decoupled: false (the repository's transaction policy)",
                fix="write the repository with `specbuild repo BUILD --decoupled`, or request without "
                "streaming",
            )
        if info.max_total_tokens is not None and params.max_tokens >= info.max_total_tokens:
            raise ClientError(
                f"max_tokens {params.max_tokens} cannot fit the engines' sequence limit",
                expected=f"prompt tokens + max_tokens <= {info.max_total_tokens} (the BLS's "
                "max_total_tokens)",
                found=f"max_tokens {params.max_tokens}",
                fix=f"pass --max-tokens {info.max_total_tokens - 1} or less",
            )
        if num_draft_tokens is not None and not info.repo.bls_drives_loop:
            raise ClientError(
                "--num-draft-tokens is for methods whose BLS drafts per round (draft/target)",
                expected="a draft/target repository with the BLS interface",
                found=f"a {info.repo.title} repository ({info.interface} interface: the engine drafts "
                "itself, "
                "K is its speculative_config.max_draft_len)",
                fix="drop --num-draft-tokens (the engine's own settings decide what it drafts)",
            )
        inputs = request_inputs(info, prompt, params, stream=stream, num_draft_tokens=num_draft_tokens)
        t0 = time.monotonic()
        if stream or info.decoupled:
            collector = _run_stream(
                self.stream, info, inputs, timeout_s=timeout_s, on_text=on_text if stream else None
            )
        else:
            collector = _run_unary(self.client, info, inputs, timeout_s=timeout_s)
        if collector.error is not None:
            raise_request_error(self.url, info.name, collector.error, timeout_s)
        # an engine that speculates by itself (Medusa) speculates on every request
        result = _result(collector, t0=t0, params=params, repo=info.repo)
        if on_text and not stream and result.text:
            on_text(result.text)
        return result


def generate_remote(
    url: str,
    prompt: str,
    params: SamplingParams,
    *,
    stream: bool = False,
    num_draft_tokens: int | None = None,
    model: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_text: Callable[[str], None] | None = None,
) -> GenerationResult:
    """One request through Triton on a connection of its own (see `Session` for many requests)."""
    with Session(url, model) as session:
        return session.generate(
            prompt,
            params,
            stream=stream,
            num_draft_tokens=num_draft_tokens,
            timeout_s=timeout_s,
            on_text=on_text,
        )
