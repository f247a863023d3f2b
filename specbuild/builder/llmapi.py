"""The LLM-API options of a spec: `trtllm-serve --config`, Triton's `model.yaml`, Dynamo's engine args.

`llmapi_options(spec, plan, models=...)` builds the dict from the spec, its method's config class on the
targeted release (core/facts/llmapi.py) and the memory plan (`kv_cache_config.free_gpu_memory_fraction`
and `max_tokens`: one pool for every model); `check_options` (core) refuses any key not recorded for the
targeted version. When `tensorrt_llm` is importable, `check_installed` runs the installed release's own
parser on the options (core/llmapi_preflight.py: the function trtllm-serve calls on `--config`, then the
args class) and reports its error verbatim with the key.
"""

from __future__ import annotations

from typing import Any

from specbuild.builder.memory_plan import MemoryPlan, effective_max_num_tokens
from specbuild.core.errors import BuildError
from specbuild.core.facts.llmapi import check_options, decoding_class, release, two_model
from specbuild.core.llmapi_preflight import Refusal, installed_version, validate
from specbuild.core.methods import method_of
from specbuild.core.perf.schedule import DraftSchedule, guard_of, schedule_of
from specbuild.core.spec import BuildSpec

OPTIONS_FILE = "llmapi_options.yaml"  # trtllm-serve --config / Dynamo --extra-engine-args
SERVE_SCRIPT = "serve.sh"


def speculative_config(spec: BuildSpec, models: dict[str, str]) -> dict[str, Any]:
    """`speculative_config` of the spec's method, spelled for its TensorRT-LLM version."""
    method = method_of(spec)
    decoding = method.llmapi
    rel = release(spec.trtllm_version)
    cls = decoding_class(spec.mode.value, spec.trtllm_version)
    out: dict[str, Any] = {
        "decoding_type": cls.decoding_type,
        "max_draft_len": spec.speculation.max_draft_len,
    }
    if decoding.model_section is not None:
        out["speculative_model"] = models[decoding.model_section]
    out.update(rel.fixed.get(cls.name, {}))  # 1.2.1 EAGLE-3: eagle3_one_model: true
    section = method.section_of(spec)
    for field, key in decoding.section_keys.items():
        value = getattr(section, field, None)
        if value is not None:
            out[key] = list(value) if isinstance(value, (list, tuple)) else value
    if spec.speculation.use_logits:  # the loader allows it only where the class has the key
        out["use_rejection_sampling"] = True
    out.update(load_keys(spec))
    return out


def load_keys(spec: BuildSpec) -> dict[str, Any]:
    """speculation.schedule / guard as the targeted release spells them (core/facts/llmapi ScheduleRule):
    1.2 takes the schedule as written ({n: K} from n requests on); 1.3+ reads its keys as upper bounds, so
    the same schedule is rewritten "up to n requests: K" (K=0 past the largest key). The guard becomes the
    release's kill switch, which is server-wide and permanent, unlike specbuild's per-request guard."""
    rule = release(spec.trtllm_version).schedule
    out: dict[str, Any] = {}
    schedule, guard = runtime_schedule(spec), guard_of(spec)
    if schedule is not None and len(schedule.steps) > 1:
        if rule.style == "from":
            out["draft_len_schedule"] = schedule.to_dict()
        else:
            out["draft_len_schedule"] = schedule.upper_bounds(spec.build.max_batch_size)
    if guard is not None:
        out[rule.guard_window] = guard.window
        if rule.guard_measure == "rate":
            out[rule.guard_threshold] = guard.min_acceptance
        else:  # mean acceptance length = 1 + accepted per step = 1 + rate x K when each step drafts K
            out[rule.guard_threshold] = round(1.0 + guard.min_acceptance * spec.speculation.max_draft_len, 6)
    return out


def runtime_schedule(spec: BuildSpec) -> DraftSchedule | None:
    """The spec's schedule as the targeted release runs it: each K raised to the release's floor for the
    method (core/facts/llmapi.py ScheduleRule.floors; 1.4 runs draft/target at K=1 where the spec says 0),
    equal neighbours merged. The options write this, so they say what will run."""
    schedule = schedule_of(spec)
    if schedule is None:
        return None
    rule = release(spec.trtllm_version).schedule
    steps: dict[int, int] = {}
    for n, k in schedule.steps:
        k = rule.runtime_k(spec.mode.value, k)
        if not steps or list(steps.values())[-1] != k:
            steps[n] = k
    return DraftSchedule(tuple(steps.items()))


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
    schedule = schedule_of(spec)
    if schedule is not None and schedule.off:  # `tune` measured that speculation does not pay: target alone
        require_valid(out, spec.trtllm_version)
        return out
    decoding = method_of(spec).llmapi
    if two_model(spec.mode.value, spec.trtllm_version) or not decoding.overlap_scheduler:
        # as the two-model draft/target examples of 1.2 set it; NGram: what the executor does anyway
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
            expected="only keys recorded in core/facts/llmapi.py for this version",
            found="; ".join(problems),
            fix="report this bug (or fix the options file by hand)",
        )


# ---- the installed tensorrt_llm ------------------------------------------------------------------


def check_installed(options: dict[str, Any], version: str, *, model: str) -> str | None:
    """When tensorrt_llm is importable: its version must be `version`, and its own parser (the function
    trtllm-serve calls on --config, then the args class; core/llmapi_preflight.py) must accept `options`.
    Returns the installed version (None: not installed, the recorded facts decide)."""
    installed = installed_version()
    if installed is None:
        return None
    if installed != version:
        raise BuildError(
            f"tensorrt_llm {installed} is installed here, the spec targets {version}",
            expected=f"tensorrt_llm {version} (its parser decides which options are valid)",
            found=installed,
            fix=f'set trtllm_version: "{installed}" if it is supported, or compile where tensorrt_llm '
            f"{version} (or none) is installed",
        )
    parser = release(version).parser
    try:
        validate(options, model=model, parser=parser.function, args_class=parser.args_class)
    except Refusal as refusal:
        raise BuildError(
            f"the installed tensorrt_llm {installed} refuses {refusal.key}",
            expected=f"options {parser.function} and {parser.args_class} accept",
            found=f"{refusal.key}: {refusal.error}",
            fix="the recorded facts (core/facts/llmapi.py) are wrong for this build of TensorRT-LLM: report "
            "it with the installed version and this error",
        ) from None
    return installed
