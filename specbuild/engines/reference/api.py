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

from specbuild.core.generation import GenerationResult
from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.engine import ReferenceEngine

__all__ = ["GenerationResult", "ReferenceEngine", "SamplingParams", "generate_local"]


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
    ids = engine.encode(prompt)
    engine.check_request(len(ids), params.max_tokens)  # refuse up front what the engine would cut short
    on_tokens = None
    if on_text is not None:
        sent: list[int] = []
        shown = [""]

        def on_tokens(
            tokens: list[int],
        ) -> None:  # decode the running total so multi-token characters stay whole
            sent.extend(tokens)
            text = engine.decode(sent)
            on_text(text[len(shown[0]) :])
            shown[0] = text

    result = engine.generate(
        ids, params, speculative=speculative, num_draft_tokens=num_draft_tokens, on_tokens=on_tokens
    )
    result.prompt_tokens = len(ids)
    return result
