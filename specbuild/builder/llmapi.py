"""The LLM-API options of a spec: `trtllm-serve --config`, Triton's `model.yaml`, Dynamo's engine args.

`llmapi_options(spec, plan, models=...)` builds the dict from the spec, its method's decoding
(core/llmapi_facts.py DECODINGS) and the memory plan (`kv_cache_config.free_gpu_memory_fraction` and
`max_tokens`: one pool for every model); `check_options` (core) refuses any key not recorded for the
targeted version. When `tensorrt_llm` is importable, `check_installed` compares the keys with the
installed classes' pydantic `model_fields` instead and fails loudly on a mismatch.
"""

from __future__ import annotations

import importlib
from typing import Any

from specbuild.builder.memory_plan import MemoryPlan, effective_max_num_tokens
from specbuild.core.errors import BuildError
from specbuild.core.llmapi_facts import DECODINGS, check_options, release
from specbuild.core.methods import method_of
from specbuild.core.spec import BuildSpec

OPTIONS_FILE = "llmapi_options.yaml"  # trtllm-serve --config / Dynamo --extra-engine-args
SERVE_SCRIPT = "serve.sh"
ARGS_MODULE = "tensorrt_llm.llmapi.llm_args"


def speculative_config(spec: BuildSpec, models: dict[str, str]) -> dict[str, Any]:
    """`speculative_config` of the spec's method, spelled for its TensorRT-LLM version."""
    decoding = DECODINGS[spec.mode.value]
    cls = release(spec.trtllm_version).classes[decoding.config_class]
    out: dict[str, Any] = {
        "decoding_type": cls.decoding_type,
        "max_draft_len": spec.speculation.max_draft_len,
    }
    if decoding.model_section is not None:
        out["speculative_model"] = models[decoding.model_section]
    method = method_of(spec)
    section = getattr(spec, method.section) if method.section else None
    for field, key in decoding.section_keys.items():
        value = getattr(section, field, None)
        if value is not None:
            out[key] = list(value) if isinstance(value, (list, tuple)) else value
    if spec.speculation.use_logits:  # the loader allows it only where the class has the key
        out["use_rejection_sampling"] = True
    return out


def llmapi_options(
    spec: BuildSpec, plan: MemoryPlan, *, models: dict[str, str], with_model: bool = False
) -> dict[str, Any]:
    """The options dict (keys in the order a reader expects). `models`: section -> folder as the server
    sees it ("target", and "draft" / "eagle3"); with_model: also `model` (Triton's model.yaml)."""
    if not plan.fits or plan.kv_tokens < 1:
        raise BuildError(
            "the memory plan leaves no room for the KV cache",
            expected="weights + KV cache that fit the GPUs",
            found=f"{plan.kv_tokens} KV tokens for max_seq_len {plan.max_seq_len}",
            fix="run `specbuild check SPEC`; lower build.max_batch_size / max_seq_len or raise tp_size",
        )
    b = spec.build
    out: dict[str, Any] = {"model": models["target"]} if with_model else {}
    out.update(
        backend="pytorch",
        tensor_parallel_size=spec.target.tp_size,
        pipeline_parallel_size=spec.target.pp_size,
        dtype=spec.dtype,
        trust_remote_code=False,
        max_batch_size=b.max_batch_size,
        max_num_tokens=effective_max_num_tokens(spec, speculative_target=True),
        max_seq_len=b.max_seq_len,
        enable_chunked_prefill=spec.serving.enable_chunked_context,
        kv_cache_config={
            "free_gpu_memory_fraction": plan.kv_fraction_total,
            "max_tokens": plan.kv_tokens,
            "enable_block_reuse": True,
        },
        return_perf_metrics=True,  # acceptance in the Triton perf outputs and per-request metrics
        enable_iter_perf_stats=True,  # trtllm-serve /metrics: trtllm_spec_decode_* per iteration
    )
    decoding = DECODINGS[spec.mode.value]
    if decoding.two_model or not decoding.overlap_scheduler:
        # as the Draft_Target examples of both lines set it; NGram: what the executor does anyway
        out["disable_overlap_scheduler"] = True
    out["speculative_config"] = speculative_config(spec, models)
    require_valid(out, spec.trtllm_version)
    return out


def require_valid(options: dict[str, Any], version: str) -> None:
    """Refuse options with a key not recorded for `version` (BaseLlmArgs: extra="forbid")."""
    problems = check_options(options, version)
    if problems:
        raise BuildError(
            f"the LLM-API options do not match TensorRT-LLM {version}",
            expected="only keys recorded in core/llmapi_facts.py for this version",
            found="; ".join(problems),
            fix="report this bug (or fix the options file by hand)",
        )


# ---- the installed tensorrt_llm ------------------------------------------------------------------


def check_installed(options: dict[str, Any], version: str) -> str | None:
    """When tensorrt_llm is importable: its version must be `version`, and every key of `options` a
    field (pydantic model_fields) of the installed class it lands in. Returns the installed version
    (None: not installed, the recorded facts decide)."""
    try:
        trtllm = importlib.import_module("tensorrt_llm")
    except ImportError:
        return None
    installed = str(getattr(trtllm, "__version__", "?"))
    if installed != version:
        raise BuildError(
            f"tensorrt_llm {installed} is installed here, the spec targets {version}",
            expected=f"tensorrt_llm {version} (its config classes decide which keys are valid)",
            found=installed,
            fix=f'set trtllm_version: "{installed}" if it is supported, or compile where tensorrt_llm '
            f"{version} (or none) is installed",
        )
    args = importlib.import_module(ARGS_MODULE)
    problems: list[str] = []
    _compare(options, _cls(args, "TorchLlmArgs", problems), args, "", problems)
    if problems:
        raise BuildError(
            f"the installed tensorrt_llm {installed} disagrees with the recorded LLM-API keys",
            expected="every written key a field of the installed config class",
            found="; ".join(problems),
            fix="the recorded facts (core/llmapi_facts.py) are wrong for this build of TensorRT-LLM: report "
            "it with the installed version",
        )
    return installed


NESTED = {"kv_cache_config": "KvCacheConfig"}


def _cls(module, name: str, problems: list[str]):
    cls = getattr(module, name, None)
    if cls is None or not hasattr(cls, "model_fields"):
        problems.append(f"{ARGS_MODULE} has no pydantic class {name}")
        return None
    return cls


def _compare(values: dict[str, Any], cls, module, prefix: str, problems: list[str]) -> None:
    if cls is None:
        return
    fields = cls.model_fields
    for key, value in values.items():
        where = f"{prefix}{key}"
        if key not in fields:
            problems.append(f"{where}: not a field of {cls.__name__}")
            continue
        if key in NESTED:
            _compare(value, _cls(module, NESTED[key], problems), module, where + ".", problems)
        elif key == "speculative_config":
            _compare(
                value,
                _decoding_class(module, value.get("decoding_type"), problems),
                module,
                where + ".",
                problems,
            )


def _decoding_class(module, decoding_type: str, problems: list[str]):
    """The installed class whose decoding_type field defaults to `decoding_type`."""
    for name in dir(module):
        cls = getattr(module, name)
        field = getattr(cls, "model_fields", {}).get("decoding_type") if isinstance(cls, type) else None
        if field is not None and getattr(field, "default", None) == decoding_type:
            return cls
    problems.append(f"speculative_config.decoding_type: no installed class takes {decoding_type!r}")
    return None
