"""The BLS logic without Triton: request options, the engine calls, and the draft->target loop glue.

The Triton glue (model.py) hands this module a `call(model_name, inputs, output_names) -> outputs`
function (numpy arrays in and out, batch dim included); everything here is plain Python + numpy, so
it is unit-tested against a fake executor.

The speculative loop itself is NOT here: `specbuild.engines.reference.speculative.speculative_generate`
is the one loop; `TritonDrafter` / `TritonVerifier` implement its two protocols (Drafter.propose,
Verifier.verify)
with calls to the `tensorrt_llm_draft` and `tensorrt_llm` models, as the real backend's BLS does;
`NGramDrafter` drafts from an n-gram pool instead (no draft model). A method names its BLS drafter in
core/methods (`bls_drafter`) and its parameters (`bls_parameters`); the repository passes them on in
the BLS's parameters and model.py resolves the drafter here (`drafter_factory`). Request helpers
shared with the other models: common/words.py.

Shape legend: L tokens so far (prompt + accepted), k draft tokens this round, V vocab.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from ngram_store import SharedPatternStore, remove_stale, server_pool_path
from trtllm_semantics import sampling_params
from words import first_stop, flag, stop_at_words, word_lists
from words import scalar as read

from specbuild.engines.reference.ngram import NGramConfig, NGramRequest, PatternPool
from specbuild.engines.reference.speculative import speculative_generate
from specbuild.model_repo.tensors import KV_OUTPUT_NAMES, PERF_OUTPUT_NAMES

Call = Callable[[str, dict[str, np.ndarray], list[str]], dict[str, np.ndarray]]
ENGINE_OUTPUTS = ["output_ids", "sequence_length"]
PERF_OUTPUTS = list(PERF_OUTPUT_NAMES)  # the perf outputs a round asks tensorrt_llm for
# BLS input -> tensorrt_llm input for the sampling options forwarded unchanged (names: tensors.py).
FORWARDED = {
    "temperature": "temperature",
    "top_k": "runtime_top_k",
    "top_p": "runtime_top_p",
    "length_penalty": "len_penalty",
    "repetition_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "beam_width": "beam_width",
    "num_return_sequences": "num_return_sequences",
}


def _i32(value) -> np.ndarray:
    return np.array([[value]], dtype=np.int32)  # [1, 1]


@dataclass(frozen=True)
class BlsOptions:
    """One BLS request, read from its input tensors (batch size 1)."""

    text: str
    max_tokens: int
    stream: bool = False
    num_draft_tokens: int = 0
    use_draft_logits: bool = False
    return_perf_metrics: bool = False
    return_num_input_tokens: bool = False
    return_num_output_tokens: bool = False
    exclude_input_in_output: bool = False  # upstream's default: the engines' parameter, false when unset
    seed: int | None = None
    end_id: int | None = None
    pad_id: int | None = None
    temperature: float | None = None  # None: the backend's defaults (trtllm_semantics.py)
    top_k: int | None = None
    top_p: float | None = None
    forwarded: dict[str, np.ndarray] = field(default_factory=dict)  # tensorrt_llm inputs passed as given
    bad_words: np.ndarray | None = None  # [1, n] BYTES
    stop_words: np.ndarray | None = None  # [1, n] BYTES
    k_given: bool = False  # the request set num_draft_tokens (a fixed K: the schedule does not apply)

    @classmethod
    def from_inputs(
        cls,
        get: Callable[[str], np.ndarray | None],
        *,
        default_num_draft_tokens: int,
        default_use_draft_logits: bool,
        seed_name: str,
        min_tokens_name: str,
    ) -> BlsOptions:
        def scalar(name, kind, default=None):
            return read(get, name, kind, default)

        text = get("text_input")
        if text is None or get("max_tokens") is None:
            raise ValueError("text_input and max_tokens are required")
        if np.asarray(text).size != 1:
            raise ValueError(
                f"one prompt per request (batch size 1), got {np.asarray(text).size} text_input values"
            )
        raw = np.asarray(text).reshape(-1)[0]
        try:
            prompt = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
        except UnicodeDecodeError as exc:
            raise ValueError(f"text_input is not valid UTF-8 (byte {exc.start})") from None
        forwarded = {
            dst: np.asarray(get(src)).reshape(1, 1) for src, dst in FORWARDED.items() if get(src) is not None
        }
        if get(min_tokens_name) is not None:
            forwarded[min_tokens_name] = np.asarray(get(min_tokens_name)).reshape(1, 1)
        k = scalar("num_draft_tokens", int, default_num_draft_tokens)
        if k < 0:
            raise ValueError(f"num_draft_tokens must be >= 0 (0: the target alone), got {k}")
        max_tokens = scalar("max_tokens", int)
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        from trtllm_semantics import check_sampling

        check_sampling(
            temperature=scalar("temperature", float, None),
            top_k=scalar("top_k", int, None),
            top_p=scalar("top_p", float, None),
            min_tokens=scalar(min_tokens_name, int, None),
        )
        return cls(
            text=prompt,
            max_tokens=max_tokens,
            stream=scalar("stream", bool, False),
            num_draft_tokens=k,
            use_draft_logits=scalar("use_draft_logits", bool, default_use_draft_logits),
            return_perf_metrics=scalar("return_perf_metrics", bool, False),
            return_num_input_tokens=scalar("return_num_input_tokens", bool, False),
            return_num_output_tokens=scalar("return_num_output_tokens", bool, False),
            exclude_input_in_output=scalar("exclude_input_in_output", bool, False),
            seed=scalar(seed_name, int, None),
            end_id=scalar("end_id", int, None),
            pad_id=scalar("pad_id", int, None),
            temperature=scalar("temperature", float, None),
            top_k=scalar("top_k", int, None),
            top_p=scalar("top_p", float, None),
            forwarded=forwarded,
            bad_words=get("bad_words"),
            stop_words=get("stop_words"),
            k_given=get("num_draft_tokens") is not None,
        )

    def sampling_params(self, end_id: int):
        """What the engines will do with this request's sampling inputs (the loop must agree)."""
        return sampling_params(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            end_id=end_id,
        )


@dataclass(frozen=True)
class Prepared:
    """What preprocessing returned for one request."""

    prompt_ids: list[int]
    end_id: int
    pad_id: int
    stop_words_list: np.ndarray  # [1, 2, n]
    bad_words_list: np.ndarray  # [1, 2, n]


def preprocess(call: Call, opts: BlsOptions, seed_name: str = "seed") -> Prepared:
    inputs = {
        "QUERY": np.array([[opts.text.encode()]], dtype=object),
        "REQUEST_OUTPUT_LEN": _i32(opts.max_tokens),
    }
    if opts.bad_words is not None:
        inputs["BAD_WORDS_DICT"] = np.asarray(opts.bad_words, dtype=object).reshape(1, -1)
    if opts.stop_words is not None:
        inputs["STOP_WORDS_DICT"] = np.asarray(opts.stop_words, dtype=object).reshape(1, -1)
    if opts.end_id is not None:
        inputs["END_ID"] = _i32(opts.end_id)
    if opts.pad_id is not None:
        inputs["PAD_ID"] = _i32(opts.pad_id)
    out = call(
        "preprocessing",
        inputs,
        ["INPUT_ID", "REQUEST_INPUT_LEN", "OUT_END_ID", "OUT_PAD_ID", "STOP_WORDS_IDS", "BAD_WORDS_IDS"],
    )
    n = int(out["REQUEST_INPUT_LEN"].reshape(-1)[0])
    return Prepared(
        prompt_ids=[int(t) for t in out["INPUT_ID"].reshape(-1)[:n]],
        end_id=int(out["OUT_END_ID"].reshape(-1)[0]),
        pad_id=int(out["OUT_PAD_ID"].reshape(-1)[0]),
        stop_words_list=out["STOP_WORDS_IDS"].reshape(1, 2, -1).astype(np.int32),
        bad_words_list=out["BAD_WORDS_IDS"].reshape(1, 2, -1).astype(np.int32),
    )


def detokenize(call: Call, tokens: list[int]) -> str:
    if not tokens:
        return ""
    out = call(
        "postprocessing",
        {
            "TOKENS_BATCH": np.array([[tokens]], dtype=np.int32).reshape(1, 1, -1),
            "SEQUENCE_LENGTH": _i32(len(tokens)),
        },
        ["OUTPUT"],
    )
    raw = out["OUTPUT"].reshape(-1)[0]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def engine_inputs(
    ids: list[int],
    output_len: int,
    opts: BlsOptions,
    prep: Prepared,
    *,
    seed_name: str,
    seed: int | None,
    stop_words: bool = True,
) -> dict[str, np.ndarray]:
    """The tensorrt_llm request for `ids` (prompt + accepted so far) -> `output_len` new tokens."""
    inputs = {
        "input_ids": np.array([ids], dtype=np.int32),  # [1, L]
        "input_lengths": _i32(len(ids)),
        "request_output_len": _i32(output_len),
        "end_id": _i32(prep.end_id),
        "pad_id": _i32(prep.pad_id),
        "exclude_input_in_output": np.array([[True]]),
        "streaming": np.array([[False]]),
        **opts.forwarded,
    }
    if seed is not None:
        inputs[seed_name] = np.array([[seed]], dtype=np.uint64)
    if prep.bad_words_list.shape[-1]:
        inputs["bad_words_list"] = prep.bad_words_list
    if stop_words and prep.stop_words_list.shape[-1]:
        inputs["stop_words_list"] = prep.stop_words_list
    return inputs


def new_tokens(out: dict[str, np.ndarray]) -> list[int]:
    """output_ids [1, beams, T] + sequence_length [1, beams] -> beam 0's tokens (input excluded)."""
    n = int(np.asarray(out["sequence_length"]).reshape(-1)[0])
    ids = np.asarray(out["output_ids"])
    if n == 0 or ids.size == 0:  # a streamed final response carries no tokens
        return []
    return [int(t) for t in ids.reshape(-1, ids.shape[-1])[0, :n]]


class _Shared:
    """State one request's drafter and verifier share."""

    def __init__(self, call: Call, opts: BlsOptions, prep: Prepared, *, seed_name: str, logits_dtype: str):
        self.call, self.opts, self.prep = call, opts, prep
        self.seed_name, self.logits_dtype = seed_name, logits_dtype
        self.calls = 0  # engine calls so far: separates the per-call seeds of one request
        self.draft_logits: np.ndarray | None = None  # [k, V] raw logits of the last proposal
        self.first_call_ns: int | None = None
        # the perf outputs of each engine's first call ("target", "draft"): its KV-cache figures say how
        # much of the prompt that engine reused from earlier requests (prefix reuse, e.g. multi-turn)
        self.first_perf: dict[str, dict[str, np.ndarray]] = {}
        self.drafted = 0  # running totals over the verified rounds (the streamed responses carry them)
        self.accepted = 0

    def inputs(self, ids: list[int], output_len: int, *, stop_words: bool = True) -> dict[str, np.ndarray]:
        if self.first_call_ns is None:
            self.first_call_ns = time.time_ns()
        self.calls += 1
        # A fixed seed on every call would replay the same random numbers in every round.
        seed = None if self.opts.seed is None else (self.opts.seed + self.calls) % 2**64
        inputs = engine_inputs(
            ids, output_len, self.opts, self.prep, seed_name=self.seed_name, seed=seed, stop_words=stop_words
        )
        # A request's min_tokens bounds the whole continuation, not one round: never forward it per round.
        for name in ("min_tokens", "min_length"):
            inputs.pop(name, None)
        return inputs


class TritonDrafter:
    """Drafter of the shared loop: one non-streaming call to the draft model per round."""

    def __init__(self, shared: _Shared, model: str):
        self.shared, self.model = shared, model
        self.forward_passes = 0  # engine calls (the engine's own passes are not visible through Triton)

    def propose(self, ids, k, params):
        sh = self.shared
        inputs = sh.inputs(list(ids), k, stop_words=False)
        # min tokens = k: the draft must not stop at end_id before offering k tokens (as upstream).
        inputs["min_length" if sh.seed_name == "random_seed" else "min_tokens"] = _i32(k)
        wanted = list(ENGINE_OUTPUTS)
        first = "draft" not in sh.first_perf
        if first:  # the draft's prompt reuse (KV-cache figures of its first call)
            inputs["return_perf_metrics"] = np.array([[True]])
            wanted += PERF_OUTPUTS
        if sh.opts.use_draft_logits:
            inputs["return_generation_logits"] = np.array([[True]])
            wanted.append("generation_logits")
        out = sh.call(self.model, inputs, wanted)
        self.forward_passes += 1
        if first:
            sh.first_perf["draft"] = _kv_figures(out)
        tokens = new_tokens(out)[:k]
        if not sh.opts.use_draft_logits:
            sh.draft_logits = None
            return tokens, None
        # torch only for draft logits: a repository that never sends them never loads it (4 BLS processes)
        import torch

        from specbuild.engines.reference.sampling import probs_from_logits

        rows = np.asarray(out["generation_logits"], dtype=np.float32)  # [1, beams, T, V]
        rows = rows.reshape(-1, rows.shape[-1])  # [T, V] (beam 0)
        logits = rows[rows.shape[0] - len(tokens) :]  # [k, V]: the rows that produced the k drafts
        sh.draft_logits = logits
        return tokens, probs_from_logits(torch.from_numpy(logits.copy()), params)  # [k, V]


class NGramDrafter:
    """Drafter of the shared loop for mode ngram: the request's n-gram state (engines/reference/ngram.py),
    no model and no engine call. Its pool: the server's shared one (ngram_store.py) with
    is_public_pool, else the request's own, gone with it.

    The shared pool never fails a request: a round that cannot use it (locked by another process
    beyond ngram_store.BUSY_TIMEOUT_S, or any SQLite error) continues the request with a pool of its own,
    and `count(reason)` is told (the BLS's `specbuild_ngram_pool_fallbacks_total`): "locked" or
    "error" once for such a request, "unusable" for every request of an instance whose shared pool
    could not be opened. Drafts get worse; outputs stay exact.

    `configure` reads the repository's ngram_* BLS parameters once per model instance and returns the
    factory the BLS calls per request."""

    forward_passes = 0

    def __init__(self, shared: _Shared, config: NGramConfig, public, count: Callable[[str], None]):
        self.request = NGramRequest(config, shared.opts.num_draft_tokens, public)
        self.count = count

    def propose(self, ids, k, params):
        try:
            return self.request.propose(list(ids), k), None
        except sqlite3.Error as exc:  # the shared pool only: a private pool raises nothing of SQLite's
            self.count("locked" if "locked" in str(exc) else "error")  # "database is locked": SQLITE_BUSY
            self.request = self.request.privately()
            return self.request.propose(list(ids), k), None

    @classmethod
    def configure(
        cls,
        parameter: Callable[[str, str], str],
        *,
        model_dir: str,
        log=print,
        count: Callable[[str], None] = lambda reason: None,
    ):
        config = NGramConfig(
            max_matching_ngram_size=int(parameter("ngram_max_matching_ngram_size", "2")),
            is_keep_all=flag(parameter("ngram_is_keep_all", "true")),
            is_use_oldest=flag(parameter("ngram_is_use_oldest", "true")),
            is_public_pool=flag(parameter("ngram_is_public_pool", "true")),
        )
        public, unusable = None, False
        if config.is_public_pool:
            public = open_public_pool(model_dir, log=log)
            unusable = public is None
            public = PatternPool() if public is None else public

        def factory(shared: _Shared, draft_model: str | None) -> NGramDrafter:
            if unusable:
                count("unusable")
            return cls(shared, config, public, count)

        factory.config, factory.public = config, public
        factory.draft_logits = False  # no draft distribution: torch is never needed
        return factory


def open_public_pool(model_dir: str, *, log=print):
    """The pool shared by this server's BLS instances, or None (then each instance keeps its own)."""
    path = None
    try:
        path = server_pool_path(model_dir)
        remove_stale(path.parent)
        return SharedPatternStore(path)
    except (OSError, sqlite3.Error) as exc:
        where = path if path is not None else "folder"
        log(f"tensorrt_llm_bls: n-gram pool {where} unusable ({exc}); this instance keeps its own pool")
        return None


def drafter_factory(
    name: str,
    parameter: Callable[[str, str], str],
    *,
    model_dir: str,
    log=print,
    count: Callable[[str], None] = lambda reason: None,
):
    """The repository's drafter ("bls_core:Class", its `bls_drafter` parameter) as a factory
    (shared, draft_model) -> Drafter: the class itself, or what its `configure` returns. `count(reason)`:
    the drafter's fallback counter (NGramDrafter)."""
    drafter = globals()[name.partition(":")[2]]
    configure = getattr(drafter, "configure", None)
    return configure(parameter, model_dir=model_dir, log=log, count=count) if configure else drafter


class TritonVerifier:
    """Verifier of the shared loop: the target model scores draft_input_ids (+ draft_logits) in one call
    and returns the accepted drafts plus its own next token."""

    def __init__(self, shared: _Shared, model: str):
        self.shared, self.model = shared, model
        self.forward_passes = 0

    def verify(self, ids, draft_tokens, draft_probs, params):
        sh = self.shared
        draft_tokens = [int(t) for t in draft_tokens]
        inputs = sh.inputs(list(ids), len(draft_tokens) + 1)
        if draft_tokens:
            inputs["draft_input_ids"] = np.array([draft_tokens], dtype=np.int32)  # [1, k]
            if sh.draft_logits is not None and draft_probs is not None:
                inputs["draft_logits"] = sh.draft_logits[None].astype(sh.logits_dtype)  # [1, k, V]
        tokens = new_tokens(self._call(inputs))
        if draft_tokens:  # as the loop records the round (SpecStats.record_step)
            sh.drafted += len(draft_tokens)
            sh.accepted += min(max(len(tokens) - 1, 0), len(draft_tokens))
        return tokens

    def plain(self, ids, n, params):
        """A K=0 round (schedule or acceptance guard): up to n plain target steps in one call (the engine
        stops at end_id and stop words itself; the loop trims what follows a stop)."""
        return new_tokens(self._call(self.shared.inputs(list(ids), n)))

    def _call(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One target call. Only the first asks for the perf outputs (its KV-cache figures: the prompt's
        prefix reuse); later rounds take the two token outputs alone: each output tensor costs the
        Python backend's IPC a shared-memory buffer per call."""
        sh = self.shared
        wanted = list(ENGINE_OUTPUTS)
        first = "target" not in sh.first_perf
        if first:
            inputs["return_perf_metrics"] = np.array([[True]])
            wanted += PERF_OUTPUTS
        out = sh.call(self.model, inputs, wanted)
        self.forward_passes += 1
        if first:
            sh.first_perf["target"] = _kv_figures(out)
        return out


KV_OUTPUTS = KV_OUTPUT_NAMES
DRAFT_KV_PREFIX = "draft_"  # the BLS's draft_kv_cache_* outputs: the draft engine's figures (specbuild)


def _kv_figures(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {name: out[name] for name in KV_OUTPUTS if out.get(name) is not None}


def perf_outputs(
    *,
    accepted: int,
    drafted: int,
    arrival_ns: int,
    first_scheduled_ns: int | None,
    first_token_ns: int | None,
    last_token_ns: int | None,
    kv: dict[str, np.ndarray],
    draft_kv: dict[str, np.ndarray] | None = None,
    guard_stopped: bool | None = None,
) -> dict[str, np.ndarray]:
    """The perf outputs of a speculative request so far (accepted / drafted draft tokens), batch dim
    included: every one upstream's backend fills on a response (model_instance_state.cc
    fillTritonResponse), as it does on every response of the request, streamed ones included.

    kv: the target's KV-cache figures of its first call (the prompt's prefix reuse); draft_kv: the
    draft's, as draft_kv_cache_* (None: no draft model ran); guard_stopped: whether the acceptance guard
    stopped drafting (the final response's speculation_stopped; None: not known yet, left out)."""

    def one(value, dtype):
        return np.array([[value]], dtype=dtype)

    out = {
        "arrival_time_ns": one(arrival_ns, np.int64),
        "first_scheduled_time_ns": one(first_scheduled_ns or arrival_ns, np.int64),
        "first_token_time_ns": one(first_token_ns or 0, np.int64),
        "last_token_time_ns": one(last_token_ns or 0, np.int64),
        # SpecStats.acceptance_rate's definition: the backend's totalAccepted / totalDraft
        "acceptance_rate": one(accepted / drafted if drafted else 0.0, np.float32),
        "total_accepted_draft_tokens": one(accepted, np.int32),
        "total_draft_tokens": one(drafted, np.int32),
    }
    if guard_stopped is not None:
        out["speculation_stopped"] = one(guard_stopped, bool)  # specbuild addition: the acceptance guard
    for name in KV_OUTPUTS:
        out[name] = np.asarray(kv[name], dtype=np.int32).reshape(1, 1) if name in kv else one(0, np.int32)
    for name in KV_OUTPUTS if draft_kv is not None else ():
        value = draft_kv.get(name)
        out[DRAFT_KV_PREFIX + name] = (
            np.asarray(value, dtype=np.int32).reshape(1, 1) if value is not None else one(0, np.int32)
        )
    return out


def streamed_perf(
    shared: _Shared, *, arrival_ns: int, first_token_ns: int | None, last_token_ns: int | None
) -> dict[str, np.ndarray]:
    """What a streamed speculative response carries with return_perf_metrics: every perf output, with
    the request's counters so far (a client gets each round's drafted and accepted tokens exactly as the
    differences of two responses; the final response: the totals)."""
    return perf_outputs(
        accepted=shared.accepted,
        drafted=shared.drafted,
        arrival_ns=arrival_ns,
        first_scheduled_ns=shared.first_call_ns,
        first_token_ns=first_token_ns,
        last_token_ns=last_token_ns,
        kv=shared.first_perf.get("target", {}),
        draft_kv=shared.first_perf.get("draft"),
    )


class RequestTimers:
    """Wall time of one BLS request's pieces (model.py, when SPECBUILD_BLS_TIMINGS names a folder): its
    engine calls (InferenceRequest.exec, by model), its responses (send, final included, without their
    cancellation ask), its cancellation asks that went to Triton, and the whole request. What is left
    is the BLS's own code (bench-serve: `bls_breakdown`)."""

    def __init__(self, clock: Callable[[], int] = time.perf_counter_ns):
        self.clock = clock
        self.start = clock()
        self.exec_ns: dict[str, int] = {}
        self.calls: dict[str, int] = {}
        self.send_ns = self.sends = self.ask_ns = self.asks = 0

    def add_exec(self, model: str, ns: int) -> None:
        self.exec_ns[model] = self.exec_ns.get(model, 0) + ns
        self.calls[model] = self.calls.get(model, 0) + 1

    def add_send(self, ns: int) -> None:
        self.send_ns += ns
        self.sends += 1

    def add_ask(self, ns: int) -> None:
        self.ask_ns += ns
        self.asks += 1

    def row(self) -> dict:
        return {
            "handle_ns": self.clock() - self.start,
            "exec_ns": dict(self.exec_ns),
            "calls": dict(self.calls),
            "send_ns": self.send_ns,
            "sends": self.sends,
            "ask_ns": self.ask_ns,
            "asks": self.asks,
        }

    def write(self, path: str) -> None:
        """Append this request's row to PATH (one JSON object a line; one file per BLS process)."""
        line = json.dumps(self.row())
        with open(path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


class NoTimers:
    """RequestTimers' stand-in when nothing observes the request: every hook does nothing, so the BLS
    calls them unconditionally (model.py's Observer)."""

    ask_ns = 0

    def add_exec(self, model: str, ns: int) -> None:
        pass

    def add_send(self, ns: int) -> None:
        pass

    def add_ask(self, ns: int) -> None:
        pass


NO_TIMERS = NoTimers()


class TextStream:
    """Accumulates tokens and yields only the new text: detokenizing with context keeps spaces and
    multi-byte characters right (a lone chunk can decode differently than inside the sequence)."""

    def __init__(self, detok: Callable[[list[int]], str]):
        self.detok, self.tokens, self.text = detok, [], ""

    def push(self, tokens: list[int]) -> str:
        self.tokens += [int(t) for t in tokens]
        full = self.detok(self.tokens)
        if full.endswith("\ufffd"):  # an incomplete UTF-8 character: wait for its next byte
            return ""
        delta = full[len(self.text) :] if full.startswith(self.text) else full
        self.text = full
        return delta

    def flush(self) -> str:
        full = self.detok(self.tokens)
        delta = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text = full
        return delta


def speculate(
    call: Call,
    opts: BlsOptions,
    prep: Prepared,
    *,
    drafter_factory,
    target_model: str,
    draft_model: str | None,
    seed_name: str,
    logits_dtype: str,
    on_tokens: Callable[[list[int], _Shared], None] | None = None,
    stop=None,
    k_of: Callable[[], int] | None = None,
    guard=None,
    plain_tokens: int = 1,
    plain_growth: int | None = None,
):
    """Run the shared speculative loop over the Triton models; returns (new tokens, SpecStats, shared state).

    `on_tokens(tokens, shared)` gets each round's emitted tokens and the request's shared state (its
    running totals: streamed_perf()).

    `drafter_factory` makes the repository's drafter (its `bls_drafter` parameter: `drafter_factory()`).

    k_of(): each round's K (the repository's schedule for the requests in flight; None: the request's
    num_draft_tokens every round); guard: the repository's acceptance guard; plain_tokens: target tokens
    one K=0 round asks for (a streamed request's K=0 rounds start at one token and grow by plain_growth
    up to it: speculative_generate's plain_growth).
    Stop words: single-token ones are stop ids of the loop; longer ones end it through its stop hook
    right after their last token (the engines also stop at them inside one call). `stop` is the
    caller's own hook (cancellation), asked after every round too.
    """
    words = word_lists(prep.stop_words_list) if prep.stop_words_list.shape[-1] else []
    params = opts.sampling_params(prep.end_id)
    params = dataclasses.replace(params, stop_token_ids=tuple(w[0] for w in words if len(w) == 1))
    shared = _Shared(call, opts, prep, seed_name=seed_name, logits_dtype=logits_dtype)
    drafter, verifier = drafter_factory(shared, draft_model), TritonVerifier(shared, target_model)
    tokens, stats = speculative_generate(
        drafter,
        verifier,
        prep.prompt_ids,
        params,
        num_draft_tokens=opts.num_draft_tokens,
        on_tokens=(lambda toks: on_tokens(toks, shared)) if on_tokens else None,
        stop=first_stop(stop_at_words([w for w in words if len(w) > 1]), stop),
        k_of=k_of,
        guard=guard,
        plain_tokens=plain_tokens,
        plain_growth=plain_growth if opts.stream else None,  # a streamed K=0 round starts at one token
    )
    return list(tokens), stats, shared
