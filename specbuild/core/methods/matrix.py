"""The method x flow x version matrix: can specbuild generate a method on a flow for a TensorRT-LLM
version, and if not, why and what is nearest. The versions' facts are core/facts/llmapi.py's and
core/facts/trtllm.py's; what a method cannot do is the method's (`engine_refusal`, `llmapi_refusal`)."""

from __future__ import annotations

from specbuild.core.facts.llmapi import LINE_1_2, LLMAPI_VERSIONS, Flow, Support, decoding_class, parse_flow
from specbuild.core.facts.trtllm import known_versions
from specbuild.core.methods import method_of


def support(method: str, flow: Flow, version: str) -> Support:
    """The matrix: can specbuild generate `method` on `flow` for TensorRT-LLM `version`?"""
    flow = parse_flow(flow)
    m = method_of(method)
    if flow is Flow.ENGINE:
        if version not in known_versions():
            if version in LLMAPI_VERSIONS:
                return Support(
                    False,
                    f"TensorRT-LLM {version} has no engine flow: trtllm-build and the C++ tensorrtllm Triton "
                    f"backend end with the 1.2.x line",
                    f'flow: llmapi (trtllm_version "{version}"), or trtllm_version: "{LINE_1_2}" for the '
                    "engine flow",
                )
            return Support(
                False,
                f"TensorRT-LLM {version} is not a release with a known serving container",
                f'trtllm_version: "{LINE_1_2}"',
            )
        refusal = m.engine_refusal()
        return Support(False, *refusal) if refusal else Support(True)
    if version not in LLMAPI_VERSIONS:
        return Support(
            False,
            f"no LLM-API facts for TensorRT-LLM {version}: specbuild generates the LLM-API flow for "
            + ", ".join(LLMAPI_VERSIONS),
            " or ".join(f'trtllm_version: "{v}"' for v in LLMAPI_VERSIONS),
        )
    refusal = m.llmapi_refusal(version)
    if refusal:
        return Support(False, *refusal)
    cls = decoding_class(m.name, version)
    if m.llmapi is None or cls is None:
        return Support(
            False,
            f"specbuild has no LLM-API mapping for {m.name} on TensorRT-LLM {version}",
            f"mode: {' | '.join(LLMAPI_VERSIONS[version].methods)}",
        )
    return Support(True, decoding_type=cls.decoding_type)
