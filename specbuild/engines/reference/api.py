"""The reference engine's public entry points (import these; the other modules are internals).

    from specbuild.engines.reference.api import ReferenceEngine, generate_local, SamplingParams

    result = generate_local("build/demo", "def add(", SamplingParams(max_tokens=32))
    print(result.text, result.stats.acceptance_rate)

    engine = ReferenceEngine.load("build/demo")              # build output, engine folder or checkpoint
    engine.generate(prompt_ids, params, on_tokens=print)     # one request, streamed token lists
    engine.generate_batch([ids_a, ids_b], params)            # several requests
    engine.verify_external(prefix_ids, draft_ids, draft_logits, params=params)  # accepted + 1
    engine.generate_with_logits(prompt_ids, params)          # (result, generation logits [n, V])

The speculative loop for other runtimes (the Triton BLS) is `speculative.speculative_generate`
with its `Drafter` / `Verifier` protocols; the acceptance rule is `sampling.accept_draft`.
"""

from __future__ import annotations

from pathlib import Path

from specbuild.core.errors import EngineError
from specbuild.core.generation import GenerationResult
from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.engine import ReferenceEngine

__all__ = ["GenerationResult", "ReferenceEngine", "SamplingParams", "generate_local"]


class TextStream:
    """Tokens in, text out as it becomes final: the running total is decoded (a character may span
    tokens: byte-level BPE splits a multi-byte UTF-8 character into one token per byte), and text that
    ends in U+FFFD (an incomplete character) is held back until the next tokens complete it; `flush`
    sends what is left at the end (a character the generation really left incomplete included)."""

    def __init__(self, decode, on_text):
        self.decode, self.on_text = decode, on_text
        self.tokens: list[int] = []
        self.shown = ""

    def push(self, tokens: list[int]) -> None:
        self.tokens.extend(tokens)
        text = self.decode(self.tokens)
        if not text.endswith("\ufffd"):
            self._send(text)

    def flush(self) -> None:
        self._send(self.decode(self.tokens) if self.tokens else "")

    def _send(self, text: str) -> None:
        if len(text) > len(self.shown) and text.startswith(self.shown):
            self.on_text(text[len(self.shown) :])
            self.shown = text


def generate_local(
    path_or_engine: str | Path | ReferenceEngine,
    prompt: str,
    params: SamplingParams,
    *,
    speculative: bool = True,
    num_draft_tokens: int | None = None,
    on_text=None,
) -> GenerationResult:
    """Tokenize `prompt`, generate in-process, return the continuation (prompt excluded).

    speculative=False runs the target alone; num_draft_tokens overrides K (default: the build's
    max_draft_len). on_text(str) receives the text of each streamed chunk. A prompt over the engine's
    input limit, or prompt + max_tokens over its sequence limit, is an EngineError (engine_limits).
    """
    engine = (
        path_or_engine
        if isinstance(path_or_engine, ReferenceEngine)
        else ReferenceEngine.load(path_or_engine)
    )
    k_max = engine.num_draft_tokens  # the build's max_draft_len
    if speculative and engine.speculates and num_draft_tokens is not None and num_draft_tokens > k_max:
        raise EngineError(  # the runtime refuses more drafts than max_draft_len: say so with the K asked
            f"num_draft_tokens {num_draft_tokens} exceeds the build's max_draft_len {k_max}",
            expected=f"draft tokens per round in 0..{k_max}",
            found=str(num_draft_tokens),
            fix=f"pass --num-draft-tokens {k_max} or less; a larger K needs a build with a larger "
            "speculation.max_draft_len",
        )
    ids = engine.encode(prompt)
    engine.check_request(len(ids), params.max_tokens)  # refuse up front what the engine would cut short
    stream = TextStream(engine.decode, on_text) if on_text is not None else None
    result = engine.generate(
        ids,
        params,
        speculative=speculative,
        num_draft_tokens=num_draft_tokens,
        on_tokens=stream.push if stream else None,
    )
    if stream is not None:
        stream.flush()
    result.prompt_tokens = len(ids)
    return result
