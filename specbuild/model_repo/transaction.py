"""The transaction policy of a repository's entry model: Triton's `model_transaction_policy.decoupled` of
the engine flow's `tensorrt_llm_bls` and of the LLM-API flow's `tensorrt_llm`, a repository option
(`repo --decoupled / --no-decoupled`, else the spec's `serving.decoupled`, else the flow's default).

What each choice serves (Triton 2.51; the gRPC wording is Triton's, the HTTP status its HTTP frontend's):
* decoupled: a request may get any number of responses, so the model streams (the BLS sends each round's
  accepted tokens, the LLM-API model each engine step) over gRPC's bidirectional stream. Triton refuses
  unary calls to it: gRPC ModelInfer ("ModelInfer RPC doesn't support models with decoupled transaction
  policy") and HTTP `/infer` (501 Not Implemented);
* not decoupled: exactly one response per request, on every endpoint: gRPC ModelInfer, HTTP `/infer` and
  `/generate`, and the gRPC stream (one response). A request that asks to stream is refused with the
  backend's own message (the models below say which).

Defaults:
* LLM-API flow: false, as upstream's `all_models/llmapi/tensorrt_llm/1/model.yaml`
  (`triton_config: decoupled: False`; tensorrtllm_backend r25.05 c2e65b88, and the copy in NVIDIA/TensorRT-LLM
  `triton_backend/` that later containers ship), so the tools upstream's docs/llmapi.md runs
  (`end_to_end_test.py --test-llmapi`, `benchmark_core_model.py --test-llmapi`: unary calls) work;
* engine flow: true. Upstream's BLS template has no default (`decoupled: ${decoupled_mode}` must be
  filled; its docs fill False for unary examples and True for streaming ones); specbuild's BLS exists to
  stream speculative rounds, and the engine flow's `bench`, `serve --openai-port` and `make demo` stream.
Paths that stream on an LLM-API repository (`make demo`, `make bench-serve`) write it with decoupled true.
"""

from __future__ import annotations

from specbuild.core.facts.llmapi import Flow
from specbuild.core.spec import BuildSpec

# upstream model.yaml's triton_config.decoupled (module docstring); the engine flow's BLS streams
DEFAULT_DECOUPLED = {Flow.ENGINE: True, Flow.LLMAPI: False}


def decoupled_of(spec: BuildSpec, override: bool | None = None) -> bool:
    """The entry model's policy: the `repo` option, else the spec's serving.decoupled, else the flow's
    default."""
    if override is not None:
        return override
    if spec.serving.decoupled is not None:
        return spec.serving.decoupled
    return DEFAULT_DECOUPLED[spec.flow]


def serves(model: str, decoupled: bool) -> str:
    """One line for `repo`'s output: the policy and what it serves."""
    if decoupled:
        return (
            f"{model}: decoupled - streams over gRPC (bench, generate --stream, serve --openai-port); "
            "unary gRPC ModelInfer and HTTP /infer are refused (repo --no-decoupled serves those)"
        )
    return (
        f"{model}: not decoupled - one response per request: gRPC ModelInfer, HTTP /infer and /generate; "
        "no streaming (repo --decoupled streams)"
    )
