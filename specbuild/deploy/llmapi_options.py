"""The LLM-API options for a spec as a pod sees them: what `compile --flow llmapi` writes
(builder/llmapi.py `llmapi_options`, the spec's memory plan), with the model folders named as in the
pod (`--models-claim`: /models/<folder>, else as the spec names them). Dynamo's worker reads this YAML
through `--extra-engine-args`, so `deploy --engine dynamo` needs no options file of its own."""

from __future__ import annotations

from typing import Any

from specbuild.builder.llmapi import llmapi_options
from specbuild.builder.memory_plan import plan_memory
from specbuild.core.errors import DeployError
from specbuild.core.methods import method_of
from specbuild.core.spec import BuildSpec
from specbuild.deploy.pods import MODEL_ROOT  # noqa: F401 (re-exported: where --models-claim mounts)
from specbuild.deploy.vllm import pod_model


def spec_options(spec: BuildSpec, *, model_root: str | None = None) -> dict[str, Any]:
    """{key: value}, validated for the spec's TensorRT-LLM version (llmapi_options refuses unknown keys)."""
    if spec.flow.builds_engines:  # the memory plan (one KV pool) and max_num_tokens differ by flow
        raise DeployError(
            "the spec is not loaded for the LLM-API flow",
            expected="flow: llmapi (load_spec(..., overrides={'flow': 'llmapi'}))",
            found=f"flow: {spec.flow}",
            fix="set `flow: llmapi` in the spec",
        )
    models = {"target": pod_model(spec, spec.target.model, model_root)}
    method = method_of(spec)
    ref = method.speculative_model(spec)
    if ref is not None:
        models[method.llmapi.model_section] = pod_model(spec, ref, model_root)
    return llmapi_options(spec, plan_memory(spec), models=models)
