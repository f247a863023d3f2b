"""`ReferenceEngine`: load what specbuild wrote and run it (plain, speculative, external drafts).

`ReferenceEngine.load(path)` accepts:
  * a `specbuild compile` output folder (specbuild.json kind "build"): its method, target and draft
    engines, the Medusa tree and K = max_draft_len from the build's spec, the tokenizer;
  * one engine folder (config.json with pretrained_config + build_config, rank{N}.safetensors): an
    engine built to speculate by itself (speculative_decoding_mode medusa) speculates; one built to
    verify what a BLS drafts (draft_tokens_external) or plain decodes, and verifies;
  * one TensorRT-LLM checkpoint folder (config.json + rank{N}.safetensors): a MedusaForCausalLM
    checkpoint declares Medusa, any other decodes plainly.
What the folder *declares* decides the method, never which weights happen to load. The tokenizer is
the build's `tokenizer_dir`, else the HF folder the checkpoint was converted from (its manifest's
inputs.hf_dir), else tokenizer files in the folder itself.

What the local Triton `tensorrt_llm` Python model calls (all thread-safe, one lock per engine):
  * `generate(prompt_ids, params, speculative=, num_draft_tokens=, on_tokens=, stop=)` — one request,
    streaming new tokens through on_tokens(list[int]); `stop` may end it after any step;
  * `generate_batch(prompts, params, on_tokens=)` — several requests; plain decode runs them in one
    batch (different prompt lengths), speculative decode in lockstep when the method allows it;
  * `verify_external(prefix_ids, draft_ids, draft_logits=None, params)` — TensorRT-LLM's
    draft_tokens_external: one target pass over prefix + drafts, returns accepted drafts + 1 token.
    Repeated calls with a growing prefix reuse the cached prefix KV (`PrefixCache`, LRU).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbuild.core.artifacts import BuildManifest, CheckpointManifest, EngineManifest, read_artifact
from specbuild.core.engine_limits import EngineLimits, LimitError
from specbuild.core.errors import EngineError
from specbuild.core.facts.trtllm import SpeculativeDecodingMode
from specbuild.core.formats.hf_config import HFModelConfig
from specbuild.core.formats.safe_io import InputFileError, read_json
from specbuild.core.generation import GenerationResult, SpecStats
from specbuild.core.methods import Method, engine_speculator, method_of, resolve_name
from specbuild.core.perf.schedule import AcceptanceGuard, DraftSchedule, guard_of, schedule_of
from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.cached_decode import (
    DEFAULT_PREFIX_CACHE_ENTRIES,
    ModelVerifier,
    PrefixCache,
    generate_batch,
    generate_cached,
    verify_batch_cached,
)
from specbuild.engines.reference.loader import load_weights
from specbuild.engines.reference.model import LlamaModel
from specbuild.engines.reference.sampling import make_generator, probs_from_logits
from specbuild.engines.reference.session import DecodeSession, Row
from specbuild.engines.reference.speculative import StopHook
from specbuild.engines.reference.text import decode, load_tokenizer

MEDUSA_ARCHITECTURE = "MedusaForCausalLM"  # what a TensorRT-LLM Medusa checkpoint declares


@dataclass(frozen=True)
class EngineLayout:
    """Where the pieces of a loadable folder are, and the method it declares."""

    target: Path
    draft: Path | None = None
    tokenizer_dir: Path | None = None
    medusa_choices: Any = None  # whatever MedusaChoices.parse accepts, or None
    max_draft_len: int | None = None
    method: Method | None = None  # None: plain decode (and external verification)
    method_options: dict | None = None  # the build spec's section of its method (e.g. `ngram:`), as a dict
    build_config: dict | None = None  # the target engine's config.json build_config (its request limits)
    schedule: DraftSchedule | None = None  # the build spec's speculation.schedule (core/perf/schedule.py)
    guard: AcceptanceGuard | None = None  # the build spec's speculation.guard
    draft_head: Path | None = None  # a head-based draft's own HF folder (EAGLE-3: the spec's eagle3.model)


def _build_config(folder: Path | None) -> dict | None:
    path = folder / "config.json" if folder is not None else None
    if path is None or not path.is_file():
        return None
    build = _read_json(path).get("build_config")
    return build if isinstance(build, dict) and build.get("max_seq_len") else None


def locate(path: str | Path) -> EngineLayout:
    """Work out what `path` is (build output, engine folder or checkpoint) from what it declares."""
    folder = Path(path)
    if not folder.is_dir():
        raise EngineError(
            f"{folder} is not a folder",
            expected="a `specbuild compile` output, an engine folder or a TensorRT-LLM checkpoint",
            found="no such folder",
            fix="check the --engine path",
        )
    artifact = read_artifact(folder)
    if isinstance(artifact, BuildManifest) and not artifact.flow.builds_engines and not artifact.engine_built:
        raise EngineError(
            f"{folder} is an LLM-API build without reference engines",
            expected="a build with engine folders (the LLM API itself reads the HF folders on a GPU host)",
            found=f"engine: {artifact.engine_kind}",
            fix="re-run `specbuild compile --flow llmapi --engine reference` to run it here",
        )
    if isinstance(artifact, BuildManifest):
        method, spec = artifact.method, artifact.spec
        return EngineLayout(
            target=artifact.loadable_dir("target"),
            draft=artifact.loadable_dir("draft") if method.draft_model else None,
            tokenizer_dir=artifact.tokenizer_dir,
            medusa_choices=heads.choices if (heads := method.heads_of(spec)) else None,
            max_draft_len=artifact.roles["target"].max_draft_len,
            method=spec.mode,
            method_options=method.options_of(spec),
            build_config=_build_config(artifact.loadable_dir("target")),
            schedule=schedule_of(spec),
            guard=guard_of(spec),
            draft_head=_draft_head(artifact),
        )
    raw = _read_json(folder / "config.json") if (folder / "config.json").is_file() else {}
    if "build_config" in raw:  # an engine folder: its speculative_decoding_mode says what it does
        build_config = raw["build_config"]
        mode = SpeculativeDecodingMode.from_recorded(build_config.get("speculative_decoding_mode"))
        speculator = engine_speculator(mode)
        return EngineLayout(
            target=folder,
            tokenizer_dir=_tokenizer_of(folder, artifact),
            max_draft_len=build_config.get("max_draft_len") or None,
            method=Method(speculator.name) if speculator else None,
            build_config=_build_config(folder),
        )
    medusa = (
        engine_speculator(SpeculativeDecodingMode.MEDUSA)
        if raw.get("architecture") == MEDUSA_ARCHITECTURE
        else None
    )
    return EngineLayout(
        target=folder,
        tokenizer_dir=_tokenizer_of(folder, artifact),
        max_draft_len=raw.get("max_draft_len") or None,
        method=Method(medusa.name) if medusa else None,
    )


def _draft_head(artifact: BuildManifest) -> Path | None:
    """The HF folder of a draft the target's engine reads itself (EAGLE-3), as compile resolved it: the
    LLM-API build records each spec section's model folder (manifest llmapi.models)."""
    section = artifact.method.section
    models = (artifact.llmapi or {}).get("models") or {}
    if artifact.method.draft_model or section is None or section not in models:
        return None
    return Path(models[section])


class ReferenceEngine:
    """A loaded target (+ draft) with a tokenizer; see the module docstring for the API.

    `method` says how `generate(speculative=True)` speculates (None: plain decode); `max_draft_len`
    is K for methods that draft per round (the build's; the method's default when not given);
    `method_options` is the spec section of the method (its speculator reads it; None: its defaults);
    `draft_head` the HF folder of a draft that reads the target's hidden states (EAGLE-3).
    """

    def __init__(
        self,
        target: LlamaModel,
        *,
        draft: LlamaModel | None = None,
        method: Method | str | None = None,
        medusa_choices: Any = None,
        tokenizer_dir: Path | None = None,
        max_draft_len: int | None = None,
        build_config: dict | None = None,
        schedule: DraftSchedule | None = None,
        guard: AcceptanceGuard | None = None,
        method_options: dict | None = None,
        draft_head: Path | None = None,
    ):
        self.target, self.draft, self.draft_head = target, draft, draft_head
        # Load-aware K: applied when a caller leaves num_draft_tokens out (an explicit K is fixed).
        self.schedule, self.guard = schedule, guard
        self.tokenizer_dir = tokenizer_dir
        self.medusa_choices = medusa_choices
        self.method_options = dict(method_options) if method_options else None
        self.method = Method(method) if method is not None else None
        # Room for every row of a full batch twice over (running sequences and the ones just finished), so
        # concurrent sequences never evict each other's KV (cached_decode.PrefixCache). Made before the
        # speculator:
        # a tree speculator (Medusa) starts each request from it too.
        batch = int((build_config or {}).get("max_batch_size") or 0)
        self.prefix_cache = PrefixCache(target, max_entries=max(DEFAULT_PREFIX_CACHE_ENTRIES, 2 * batch))
        self.speculator = None
        if self.method is not None:
            factory = method_of(self.method).reference_decoder
            if factory is None:
                raise EngineError(
                    f"the reference engine cannot run {method_of(self.method).title} speculation",
                    expected="a method with an in-process speculator",
                    found=str(self.method),
                    fix="serve it on TensorRT-LLM, or use --no-speculation",
                )
            self.speculator = resolve_name(factory)(self)
        self.num_draft_tokens = max_draft_len or (method_of(self.method).default_k if self.method else 0)
        # The engine's request limits (build_config, as TensorRT-LLM's runtime applies them), else the model's
        # positions.
        self.limits = (
            EngineLimits.from_build_config(build_config)
            if build_config
            else EngineLimits.from_positions(target.cfg.max_position_embeddings)
        )
        self._lock = threading.RLock()
        self._tokenizer = None

    @classmethod
    def load(cls, path: str | Path, *, device: str = "cpu", medusa_choices: Any = None) -> ReferenceEngine:
        layout = locate(path)
        target = LlamaModel(load_weights(layout.target), device=device)
        draft = LlamaModel(load_weights(layout.draft), device=device) if layout.draft else None
        if draft is not None and draft.cfg.vocab_size != target.cfg.vocab_size:
            raise EngineError(
                "draft and target vocabularies differ",
                expected=f"vocab_size {target.cfg.vocab_size}",
                found=f"draft vocab_size {draft.cfg.vocab_size}",
                fix="use a draft model trained with the target's tokenizer",
            )
        return cls(
            target,
            draft=draft,
            method=layout.method,
            medusa_choices=medusa_choices if medusa_choices is not None else layout.medusa_choices,
            tokenizer_dir=layout.tokenizer_dir,
            max_draft_len=layout.max_draft_len,
            build_config=layout.build_config,
            schedule=layout.schedule,
            guard=layout.guard,
            method_options=layout.method_options,
            draft_head=layout.draft_head,
        )

    # ---- properties ---------------------------------------------------------------------------
    @property
    def speculates(self) -> bool:
        """`generate(speculative=True)` speculates (else it decodes plainly)."""
        return self.speculator is not None

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.tokenizer_dir)
        return self._tokenizer

    def end_ids(self) -> tuple[int, ...]:
        """The model's end-of-sequence ids (tokenizer's eos, or the HF config's eos list)."""
        ids: list[int] = []
        if self.tokenizer_dir is not None and (self.tokenizer_dir / "config.json").is_file():
            ids += list(HFModelConfig.from_hf(self.tokenizer_dir).eos_ids)
        if not ids and self.tokenizer_dir is not None and self.tokenizer.eos_token_id is not None:
            ids.append(int(self.tokenizer.eos_token_id))
        return tuple(ids)

    def resolve(self, params: SamplingParams) -> SamplingParams:
        """Fill end_id with the model's eos when unset (extra eos ids become stop tokens)."""
        if params.end_id is not None:
            return params
        ids = self.end_ids()
        if not ids:
            return params
        return dataclasses.replace(
            params, end_id=ids[0], stop_token_ids=tuple(dict.fromkeys(params.stop_token_ids + ids[1:]))
        )

    # ---- generation ---------------------------------------------------------------------------
    def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        *,
        speculative: bool = True,
        num_draft_tokens: int | None = None,
        on_tokens=None,
        stop: StopHook | None = None,
        stats: SpecStats | None = None,
    ) -> GenerationResult:
        """One request: the continuation of prompt_ids (text decoded when a tokenizer is known). `stats`: a
        SpecStats the speculator counts in while it runs, updated before each step's on_tokens (a streaming
        caller reads the request's running totals there); unused when it decodes plainly."""
        _check_prompt(prompt_ids, self.target.cfg.vocab_size)
        params = self._bound(
            prompt_ids,
            self.resolve(params),
            self.draft_per_step(speculative=speculative, num_draft_tokens=num_draft_tokens),
        )
        started = time.perf_counter()
        first: list[float] = []
        user_on_tokens = on_tokens

        def on_tokens(tokens: list[int]) -> None:  # records the time to the first token (ttft)
            if not first:
                first.append(time.perf_counter() - started)
            if user_on_tokens is not None:
                user_on_tokens(tokens)

        speculate = speculative and self.speculates
        with self._lock:
            if speculate:
                k = self.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
                ids, stats = self.speculator.generate(
                    list(prompt_ids),
                    params,
                    num_draft_tokens=k,
                    on_tokens=on_tokens,
                    stop=stop,
                    guard=self.guard,
                    stats=stats,
                )
            else:
                seq = self.prefix_cache.acquire(list(prompt_ids))
                ids, _, passes = generate_cached(
                    seq, list(prompt_ids), params, on_tokens=on_tokens, stop=stop
                )
                stats = SpecStats(target_passes=passes)
        result = self._result(
            ids, params, stats, speculative=speculate, seconds=time.perf_counter() - started
        )
        if first:
            result.timings["ttft"] = first[0]
        return result

    def generate_batch(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams],
        *,
        speculative: bool = True,
        num_draft_tokens: int | None = None,
        on_tokens=None,
        stop=None,
    ) -> list[GenerationResult]:
        """Several requests. on_tokens(index, list[int]) streams; stop(index, out, start) is each
        request's stop hook (a request it ends stops there, the others go on).

        Plain decode and batched speculators (draft/target) run all requests in lockstep, one batched
        pass per step (rows keep their own lengths); other speculators (Medusa) one after the other.
        Both lockstep kinds start each row from the prefix cache and leave its KV there, so a round with
        K=0 for every row costs what a plain batched step costs.
        """
        plist = [self.resolve(p) for p in (params if isinstance(params, list) else [params] * len(prompts))]
        draft = self.draft_per_step(speculative=speculative, num_draft_tokens=num_draft_tokens)
        plist = [self._bound(p, q, draft) for p, q in zip(prompts, plist, strict=True)]
        speculate = speculative and self.speculates
        schedule = self.schedule if num_draft_tokens is None else None
        if (
            speculate
            and schedule is not None
            and not self.speculator.batched
            and schedule.k_for(len(prompts)) == 0
        ):
            speculate = False  # a tree method cannot switch per round: the whole batch decodes plainly
        if speculate and not self.speculator.batched:
            return [
                self.generate(
                    p,
                    q,
                    num_draft_tokens=num_draft_tokens,
                    on_tokens=(lambda toks, i=i: on_tokens(i, toks)) if on_tokens else None,
                    stop=(lambda out, start, i=i: stop(i, out, start)) if stop else None,
                )
                for i, (p, q) in enumerate(zip(prompts, plist, strict=True))
            ]
        for p in prompts:
            _check_prompt(p, self.target.cfg.vocab_size)
        started = time.perf_counter()
        if speculate:
            k = self.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
            with self._lock:
                done = self.speculator.generate_batch(
                    [list(p) for p in prompts],
                    plist,
                    num_draft_tokens=k,
                    on_tokens=on_tokens,
                    stop=stop,
                    schedule=schedule.k_for if schedule is not None else None,
                    guard=self.guard,
                    prefix_cache=self.prefix_cache,
                )
            seconds = time.perf_counter() - started
            return [
                self._result(ids, q, stats, speculative=True, seconds=seconds)
                for (ids, stats), q in zip(done, plist, strict=True)
            ]
        with self._lock:
            outs, _, passes, reused = generate_batch(
                self.target,
                [list(p) for p in prompts],
                plist,
                on_tokens=on_tokens,
                stop=stop,
                prefix_cache=self.prefix_cache,
            )
        seconds = time.perf_counter() - started
        results = [
            self._result(o, q, SpecStats(target_passes=passes), speculative=False, seconds=seconds)
            for o, q in zip(outs, plist, strict=True)
        ]
        for result, n in zip(results, reused, strict=True):
            result.cached_prompt_tokens = n
        return results

    def session(self) -> EngineSession:
        """In-flight batching of plain decode: rows join and leave between steps (session.DecodeSession),
        each step under this engine's lock, so other calls (verify_external_batch) run between steps."""
        return EngineSession(self)

    def generate_with_logits(
        self, prompt_ids: list[int], params: SamplingParams, *, on_tokens=None, stop: StopHook | None = None
    ):
        """Plain decode of one request that also returns its generation logits [n,V] (float32).

        What a draft model serves to the BLS when `return_generation_logits` is set; reuses the
        prefix cache, so drafting again after a growing prefix does not recompute the prompt.
        """
        _check_prompt(prompt_ids, self.target.cfg.vocab_size)
        params = self._bound(prompt_ids, self.resolve(params), 0)
        started = time.perf_counter()
        with self._lock:
            seq = self.prefix_cache.acquire(list(prompt_ids))
            gen = make_generator(params.seed, offset=len(prompt_ids))  # see verify_external
            ids, rows, passes = generate_cached(
                seq, list(prompt_ids), params, on_tokens=on_tokens, keep_logits=True, generator=gen, stop=stop
            )
        result = self._result(
            ids,
            params,
            SpecStats(target_passes=passes),
            speculative=False,
            seconds=time.perf_counter() - started,
        )
        return result, torch.stack(rows)  # [n,V]

    def verify_external(
        self, prefix_ids: list[int], draft_ids: list[int], draft_logits=None, *, params: SamplingParams
    ) -> list[int]:
        """One target pass over prefix + drafts; returns the accepted drafts plus one target token.

        draft_logits [K,V] (float, any dtype): modified rejection sampling on the draft's probabilities
        (computed with the same params). Without them: token equality with the target's own sample
        (argmax at temperature 0). Seeded params give a reproducible draw per call; the stream is
        seeded with seed + len(prefix_ids), so the rounds of one request (growing prefixes) do not
        reuse the same random numbers, which would correlate accept decisions and bias the output.
        """
        _check_prompt(prefix_ids, self.target.cfg.vocab_size)
        self._bound(prefix_ids, params, len(draft_ids))  # one pass over prefix + drafts must fit max_seq_len
        draft_probs = self._draft_probs(draft_ids, draft_logits, params)
        with self._lock:
            gen = make_generator(params.seed, offset=len(prefix_ids))
            verifier = ModelVerifier(self.target, generator=gen, prefix_cache=self.prefix_cache)
            return verifier.verify(list(prefix_ids), list(draft_ids), draft_probs, params)

    def verify_external_batch(
        self,
        prefixes: list[list[int]],
        drafts: list[list[int]],
        draft_logits: list | None = None,
        *,
        params: list[SamplingParams],
    ) -> list[tuple[list[int], int]]:
        """verify_external for several requests in one target pass (rows of their own length, each from
        its own prefix-cache sequence): per row (the same tokens as one call each: same seeds, same
        acceptance; the prefix tokens it reused). At most prefix_cache.max_entries rows share a pass
        (each row holds one entry)."""
        logits_of = draft_logits or [None] * len(prefixes)
        probs = []
        for prefix, d, q, lg in zip(prefixes, drafts, params, logits_of, strict=True):
            _check_prompt(prefix, self.target.cfg.vocab_size)
            self._bound(prefix, q, len(d))
            probs.append(self._draft_probs(d, lg, q))
        out: list[tuple[list[int], int]] = []
        step = max(1, self.prefix_cache.max_entries)
        with self._lock:
            for at in range(0, len(prefixes), step):
                rows = slice(at, at + step)
                gens = [
                    make_generator(q.seed, offset=len(p))
                    for p, q in zip(prefixes[rows], params[rows], strict=True)
                ]
                out += verify_batch_cached(
                    self.target,
                    self.prefix_cache,
                    prefixes[rows],
                    drafts[rows],
                    probs[rows],
                    params[rows],
                    gens,
                )
        return out

    def _draft_probs(self, draft_ids: list[int], draft_logits, params: SamplingParams):
        if draft_logits is None:
            return None
        logits = torch.as_tensor(draft_logits).float()  # [K,V]
        if logits.shape != (len(draft_ids), self.target.cfg.vocab_size):
            raise EngineError(
                "draft_logits have the wrong shape",
                expected=f"[{len(draft_ids)}, {self.target.cfg.vocab_size}] (one row per draft token)",
                found=str(tuple(logits.shape)),
                fix="send the draft model's generation logits for exactly the draft tokens",
            )
        return probs_from_logits(logits, params)  # [K,V]

    # ---- limits -------------------------------------------------------------------------------
    def draft_per_step(self, *, speculative: bool = True, num_draft_tokens: int | None = None) -> int:
        """Draft tokens one step adds to the sequence (counted against max_seq_len, as the runtime does)."""
        if not speculative or not self.speculates:
            return 0
        k = self.num_draft_tokens if num_draft_tokens is None else num_draft_tokens
        return self.speculator.drafts_per_step(k, self.limits)

    def _bound(self, prompt_ids, params: SamplingParams, draft: int) -> SamplingParams:
        """The backend's rules: a prompt over the input limit fails; the output length is lowered to fit."""
        try:
            self.limits.check_prompt(len(prompt_ids))
        except LimitError as exc:
            raise EngineError(
                str(exc),
                expected=f"at most {self.limits.max_input_len} prompt tokens",
                found=f"{len(prompt_ids)} tokens",
                fix="shorten the prompt",
            ) from None
        room = self.limits.output_len(len(prompt_ids), params.max_tokens, draft)
        if room < 1:
            raise EngineError(
                "no room for output tokens",
                expected=f"prompt + {draft} draft tokens < max_seq_len {self.limits.max_seq_len}",
                found=f"{len(prompt_ids)} prompt tokens",
                fix="shorten the prompt",
            )
        return params if room == params.max_tokens else dataclasses.replace(params, max_tokens=room)

    def check_request(self, prompt_len: int, max_tokens: int) -> None:
        """Refuse (EngineError) what would not run whole: callers that prefer a clear error to the clamp."""
        try:
            self.limits.request_limits().check(prompt_len, max_tokens)
        except LimitError as exc:
            raise EngineError(
                str(exc),
                expected=f"prompt + max_tokens <= {self.limits.request_limits().max_total_len} tokens",
                found=f"{prompt_len} + {max_tokens}",
                fix="lower --max-tokens or shorten the prompt",
            ) from None

    # ---- text ---------------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise EngineError(
                "the prompt is not valid UTF-8 text",
                expected="UTF-8 text",
                found=f"an undecodable byte at position {exc.start}",
                fix="re-encode the prompt as UTF-8",
            ) from None
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return decode(self.tokenizer, ids)

    def _result(self, ids, params, stats, *, speculative: bool, seconds: float) -> GenerationResult:
        text = self.decode(ids) if self.tokenizer_dir is not None else ""
        stops = set(params.stop_token_ids) | ({params.end_id} if params.end_id is not None else set())
        reason = "stop" if ids and ids[-1] in stops else "length"
        return GenerationResult(
            text=text,
            token_ids=list(ids),
            finish_reason=reason,
            speculative=speculative,
            stats=stats,
            timings={"total": seconds},
        )


def _check_prompt(ids: list[int], vocab: int) -> None:
    if not ids:
        raise EngineError(
            "empty prompt", expected="at least one token", found="[]", fix="pass a non-empty prompt"
        )
    bad = [t for t in ids if not 0 <= int(t) < vocab]
    if bad:
        raise EngineError(
            "prompt token id out of range",
            expected=f"ids in [0, {vocab})",
            found=str(bad[:5]),
            fix="tokenize with the engine's tokenizer",
        )


def _read_json(path: Path, *, kind: str = "config") -> dict[str, Any]:
    """A bounded JSON object (safe_io); a damaged file is an EngineError naming it."""
    try:
        return read_json(path, kind=kind)
    except InputFileError as exc:
        raise EngineError(
            exc.what, expected=exc.expected, found=exc.found, fix="rebuild it with `specbuild compile`"
        ) from None


def _tokenizer_of(folder: Path, artifact) -> Path | None:
    """HF folder a checkpoint came from (engine manifests point at their checkpoint), or the folder itself."""
    seen = 0
    while artifact is not None and seen < 3:
        if isinstance(artifact, CheckpointManifest) and artifact.hf_dir and artifact.hf_dir.is_dir():
            return artifact.hf_dir
        if not isinstance(artifact, EngineManifest) or artifact.checkpoint is None:
            break
        folder = artifact.checkpoint
        artifact, seen = read_artifact(folder), seen + 1
    if (folder / "tokenizer.json").is_file() or (folder / "tokenizer_config.json").is_file():
        return folder
    return None


class EngineSession:
    """ReferenceEngine.session(): a DecodeSession with the engine's request rules (prompt checks, eos,
    the output length clamp) and its lock. add() returns the row (row.done: it ended on its first
    token); step() the rows that ended in it; result(row) a finished row's GenerationResult."""

    def __init__(self, engine: ReferenceEngine):
        self.engine = engine
        self._session = DecodeSession(engine.target, engine.prefix_cache)

    def __len__(self) -> int:
        return len(self._session)

    def add(self, prompt_ids: list[int], params: SamplingParams, *, on_tokens=None, stop=None) -> Row:
        return self.add_many([(prompt_ids, params, on_tokens, stop)])[0]

    def add_many(self, requests: list[tuple], *, continued: bool = False) -> list[Row]:
        """add() for several (prompt_ids, params, on_tokens, stop): one batched prefill (a request the
        engine refuses raises before any is admitted: callers check each with `checked` first).
        continued: each prompt_ids is a request's prompt + the tokens it already produced, and params its
        checked params with max_tokens what is left: only the token ids are checked again (the input
        limit applies to the prompt alone, which was checked when the request came)."""
        checked = []
        for prompt, params, on_tokens, stop in requests:
            if continued:
                _check_prompt(prompt, self.engine.target.cfg.vocab_size)
            else:
                params = self.checked(prompt, params)
            checked.append((list(prompt), params, on_tokens, stop))
        with self.engine._lock:
            return self._session.add_many(checked)

    def checked(self, prompt_ids: list[int], params: SamplingParams) -> SamplingParams:
        """The params a request runs with (eos filled in, output length clamped); EngineError when the
        engine refuses it (empty prompt, ids out of range, no room)."""
        _check_prompt(prompt_ids, self.engine.target.cfg.vocab_size)
        return self.engine._bound(prompt_ids, self.engine.resolve(params), 0)

    def step(self) -> list[Row]:
        with self.engine._lock:
            return self._session.step()

    def close(self) -> list[Row]:
        with self.engine._lock:
            return self._session.close()

    def result(self, row: Row) -> GenerationResult:
        result = self.engine._result(
            row.tokens, row.params, SpecStats(target_passes=row.passes), speculative=False, seconds=0.0
        )
        result.cached_prompt_tokens = row.cached_prompt_tokens
        return result
