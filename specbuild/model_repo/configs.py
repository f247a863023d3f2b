"""config.pbtxt builders: each model's configuration as an `inference.ModelConfig` protobuf message.

Never string templates (the upstream `fill_template.py` leaves forgotten `${var}` in place, and a
wrong value silently becomes a default): every field is set on the message and the file is written
with `google.protobuf.text_format`, so a typo in a field name fails here, not at server load.
Tensor names, types and dims come from `specbuild.model_repo.tensors`.

tritonclient (protobuf) is imported inside the functions: this module is imported by the CLI.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from specbuild.core.deployment import RepoKind
from specbuild.core.methods import Method
from specbuild.core.perf.schedule import INFLIGHT_HOLD_MS, PLAIN_ROUND_GROWTH, PLAIN_ROUND_TOKENS
from specbuild.model_repo import tensors as T

BACKENDS = tuple(k.backend for k in RepoKind if not k.llmapi)  # `repo --backend` of the engine flow
# Parameters the C++ backend reads without a fallback: a config without them does not load (triton.md 1.2).
REQUIRED_ENGINE_PARAMETERS = (
    "gpt_model_type",
    "gpt_model_path",
    "tokenizer_dir",
    "guided_decoding_backend",
    "xgrammar_tokenizer_info_path",
)
EXECUTOR_WORKER_PATH = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
BATCHING_STRATEGY = "inflight_fused_batching"
BATCH_SCHEDULER_POLICY = "guaranteed_no_evict"  # never evicts a started request (the backend default)


@dataclass(frozen=True, kw_only=True)
class EngineModel:
    """One tensorrt_llm-interface model: the target (or Medusa) engine, or the draft engine."""

    name: str  # tensorrt_llm | tensorrt_llm_draft
    engine_dir: str  # gpt_model_path as the server will see it
    decoupled: bool  # streaming responses (Medusa); draft/target engines are called round by round
    kv_fraction: float  # kv_cache_free_gpu_mem_fraction from the memory plan
    gpu_device_ids: tuple[int, ...]  # one instance: its TP x PP ranks
    decoding_mode: str  # medusa | top_k_top_p
    enable_kv_cache_reuse: bool
    max_tokens_in_paged_kv_cache: int | None = None  # equal token pools for draft and target
    medusa_choices: str | None = None  # MedusaChoices.to_triton(): `{0}, {0, 0}` (no outer braces)
    enable_chunked_context: bool = (
        False  # serving.enable_chunked_context: prompts up to max_seq_len - 1 in chunks
    )
    # the local engine model of a self-drafting engine (Medusa): "1:K,n:0" (a specbuild parameter; the C++
    # backend cannot switch a Medusa engine's speculation off, so production repositories leave it out)
    draft_len_schedule: str = ""


@dataclass(frozen=True, kw_only=True)
class RepoLayout:
    """Everything the configs of one repository depend on."""

    mode: Method  # the speculation method: the BLS and the client read it from speculation_method
    backend: str  # tensorrtllm | python (the engine models' backend)
    trtllm_version: str
    max_batch_size: int
    tokenizer_dir: str  # as the server will see it
    target: EngineModel
    draft: EngineModel | None  # draft_target only
    logits_dtype: str = T.DEFAULT_LOGITS_DTYPE
    # `prompt_embedding_table_data_type` of tensorrt_llm. TYPE_FP16, as every upstream example fills it: the
    # upstream ensemble and BLS declare prompt_embedding_table TYPE_FP16, and an ensemble whose step input
    # type differs does not load. (Prompt tables are refused by the local engine model.)
    prompt_table_dtype: str = T.DEFAULT_PROMPT_TABLE_DTYPE
    max_queue_delay_microseconds: int = 0
    bls_instance_count: int = 4
    bls_drafter: str | None = None  # BLS: "module:Class" it drafts with (None: the target speculates itself)
    default_num_draft_tokens: int = 0  # BLS: used when a request omits num_draft_tokens
    default_use_draft_logits: bool = False  # BLS: used when a request omits use_draft_logits
    # Load-aware K (core/perf/schedule.py), as BLS parameters: "1:4,3:2,6:0" / "8:0.3" ("" when off)
    draft_len_schedule: str = ""
    acceptance_guard: str = ""
    bls_decoupled: bool = True  # the BLS's transaction policy (model_repo/transaction.py)
    bls_parameters: tuple[tuple[str, str], ...] = ()  # BLS: its drafter's own parameters (the method's)
    accumulate_tokens: bool = True  # BLS: detokenize streamed tokens with their context
    bls_detokenizes: bool = True  # BLS: its own tokenizer (postprocessing's) instead of a call per round
    # BLS: the engines' request limits (engine_limits.RequestLimits); None when no engine was built yet
    max_prompt_tokens: int | None = None  # prompt tokens every engine of a request accepts
    max_total_tokens: int | None = None  # prompt + max_tokens that always fits

    @property
    def names(self) -> T.Names:
        return T.names_for(self.trtllm_version)

    @property
    def kind(self) -> RepoKind:
        """The repository kind (engine flow: `backend` is also its `repo --backend`)."""
        return RepoKind.of_backend(self.backend)


def _pb():
    return model_config_pb2


def _add_tensors(config, interface: T.Interface) -> None:
    pb = _pb()
    for t in interface.inputs:
        msg = config.input.add(name=t.name, data_type=pb.DataType.Value(t.data_type), dims=list(t.dims))
        if t.optional:
            msg.optional = True
        if t.reshape:
            msg.reshape.SetInParent()  # `reshape: { shape: [ ] }`: a scalar per batch item
        if t.ragged:
            msg.allow_ragged_batch = True
    for t in interface.outputs:
        config.output.add(name=t.name, data_type=pb.DataType.Value(t.data_type), dims=list(t.dims))


def _set_params(config, params: dict[str, str]) -> None:
    for key, value in params.items():
        config.parameters[key].string_value = value


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _dynamic_batching(config, layout: RepoLayout) -> None:
    config.dynamic_batching.preferred_batch_size.append(layout.max_batch_size)
    config.dynamic_batching.max_queue_delay_microseconds = layout.max_queue_delay_microseconds
    config.dynamic_batching.default_queue_policy.max_queue_size = 0  # 0 = unbounded (upstream default)


def engine_config(layout: RepoLayout, engine: EngineModel):
    """tensorrt_llm / tensorrt_llm_draft: the C++ backend, or the local Python model (same interface)."""
    pb = _pb()
    config = pb.ModelConfig(name=engine.name, backend=layout.backend, max_batch_size=layout.max_batch_size)
    config.model_transaction_policy.decoupled = engine.decoupled
    _dynamic_batching(config, layout)
    _add_tensors(
        config,
        T.tensorrt_llm_interface(
            layout.names, logits_dtype=layout.logits_dtype, prompt_table_dtype=layout.prompt_table_dtype
        ),
    )
    config.instance_group.add(count=1, kind=pb.ModelInstanceGroup.KIND_CPU)  # the backend places ranks itself
    params = {
        "max_beam_width": "1",
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": BATCHING_STRATEGY,
        "gpt_model_path": engine.engine_dir,
        "batch_scheduler_policy": BATCH_SCHEDULER_POLICY,
        "kv_cache_free_gpu_mem_fraction": f"{engine.kv_fraction:.4g}",
        # The backend's default (a missing parameter is false): a request without exclude_input_in_output gets
        # the prompt in output_ids, which upstream's client-side speculative loop relies on. The BLS asks for
        # new tokens explicitly; streamed responses never repeat the prompt.
        "exclude_input_in_output": "false",
        "enable_kv_cache_reuse": _bool(engine.enable_kv_cache_reuse),
        "normalize_log_probs": "true",
        "enable_chunked_context": _bool(engine.enable_chunked_context),
        "gpu_device_ids": ",".join(str(i) for i in engine.gpu_device_ids),
        "decoding_mode": engine.decoding_mode,
        "cancellation_check_period_ms": "100",
        "stats_check_period_ms": "100",
        "gpu_weights_percent": "1.0",
        "multi_block_mode": "true",
        "cuda_graph_mode": "false",
        "enable_context_fmha_fp32_acc": "false",
        "speculative_decoding_fast_logits": "false",  # needs orchestrator mode with spawning disabled
        "executor_worker_path": EXECUTOR_WORKER_PATH,
        "tokenizer_dir": layout.tokenizer_dir,
        "guided_decoding_backend": "",  # empty = guided decoding off (the key itself must exist)
        "xgrammar_tokenizer_info_path": "",
    }
    if engine.max_tokens_in_paged_kv_cache:
        params["max_tokens_in_paged_kv_cache"] = str(engine.max_tokens_in_paged_kv_cache)
    if engine.medusa_choices is not None:
        params["medusa_choices"] = engine.medusa_choices
    if engine.draft_len_schedule:
        params["draft_len_schedule"] = engine.draft_len_schedule
        params["inflight_hold_ms"] = str(INFLIGHT_HOLD_MS)  # the local engine's count (core/perf/schedule.py)
    _set_params(config, params)
    return config


def preprocessing_config(layout: RepoLayout, *, instance_count: int = 1):
    pb = _pb()
    config = pb.ModelConfig(name="preprocessing", backend="python", max_batch_size=layout.max_batch_size)
    _dynamic_batching(config, layout)
    _add_tensors(config, T.preprocessing_interface())
    config.instance_group.add(count=instance_count, kind=pb.ModelInstanceGroup.KIND_CPU)
    _set_params(
        config,
        {
            "tokenizer_dir": layout.tokenizer_dir,
            "add_special_tokens": "true",
            "gpt_model_path": layout.target.engine_dir,
        },
    )
    return config


def postprocessing_config(layout: RepoLayout, *, instance_count: int = 1):
    pb = _pb()
    config = pb.ModelConfig(name="postprocessing", backend="python", max_batch_size=layout.max_batch_size)
    config.dynamic_batching.SetInParent()
    _add_tensors(config, T.postprocessing_interface())
    config.instance_group.add(count=instance_count, kind=pb.ModelInstanceGroup.KIND_CPU)
    _set_params(config, {"tokenizer_dir": layout.tokenizer_dir, "skip_special_tokens": "true"})
    return config


def ensemble_config(layout: RepoLayout):
    pb = _pb()
    config = pb.ModelConfig(name="ensemble", platform="ensemble", max_batch_size=layout.max_batch_size)
    _add_tensors(config, T.ensemble_interface(layout.names, logits_dtype=layout.logits_dtype))
    for step in T.ensemble_steps(layout.names, llm_model=layout.target.name):
        msg = config.ensemble_scheduling.step.add(model_name=step.model_name, model_version=-1)
        for key, value in step.input_map:
            msg.input_map[key] = value
        for key, value in step.output_map:
            msg.output_map[key] = value
    return config


def bls_config(layout: RepoLayout):
    """The BLS: decoupled to stream (accepted tokens per round, or the Medusa stream), else unary
    (layout.bls_decoupled: model_repo/transaction.py)."""
    pb = _pb()
    config = pb.ModelConfig(name="tensorrt_llm_bls", backend="python", max_batch_size=layout.max_batch_size)
    config.model_transaction_policy.decoupled = layout.bls_decoupled
    _add_tensors(config, T.bls_interface(layout.names, logits_dtype=layout.logits_dtype))
    config.instance_group.add(count=layout.bls_instance_count, kind=pb.ModelInstanceGroup.KIND_CPU)
    _set_params(
        config,
        {
            "accumulate_tokens": _bool(layout.accumulate_tokens),
            "tensorrt_llm_model_name": layout.target.name,
            "tensorrt_llm_draft_model_name": layout.draft.name if layout.draft else "",
            "multimodal_encoders_name": "",
            # specbuild additions (the upstream BLS ignores unknown keys):
            "tensorrt_llm_decoupled": _bool(layout.target.decoupled),
            "speculation_method": layout.mode.value,
            "bls_drafter": layout.bls_drafter or "",
            "default_num_draft_tokens": str(layout.default_num_draft_tokens),
            "default_use_draft_logits": _bool(layout.default_use_draft_logits),
            # detokenize inside the BLS (the postprocessing model's tokenizer and options): no IPC round trip
            # per streamed round; empty: call the postprocessing model as upstream's BLS does
            "tokenizer_dir": layout.tokenizer_dir if layout.bls_detokenizes else "",
            "skip_special_tokens": "true",
            **(
                {
                    "draft_len_schedule": layout.draft_len_schedule,
                    "plain_round_tokens": str(PLAIN_ROUND_TOKENS),
                    "plain_round_growth": str(PLAIN_ROUND_GROWTH),
                    "inflight_hold_ms": str(INFLIGHT_HOLD_MS),
                }
                if layout.draft_len_schedule
                else {}
            ),
            **({"acceptance_guard": layout.acceptance_guard} if layout.acceptance_guard else {}),
            **dict(layout.bls_parameters),
            **({"max_prompt_tokens": str(layout.max_prompt_tokens)} if layout.max_prompt_tokens else {}),
            **({"max_total_tokens": str(layout.max_total_tokens)} if layout.max_total_tokens else {}),
        },
    )
    return config


def all_configs(layout: RepoLayout) -> dict[str, object]:
    """model name -> ModelConfig, in the order a reader expects them."""
    configs = {
        "ensemble": ensemble_config(layout),
        "preprocessing": preprocessing_config(layout),
        "postprocessing": postprocessing_config(layout),
        layout.target.name: engine_config(layout, layout.target),
    }
    if layout.draft is not None:
        configs[layout.draft.name] = engine_config(layout, layout.draft)
    configs["tensorrt_llm_bls"] = bls_config(layout)
    return configs


def to_text(config) -> str:
    return text_format.MessageToString(config)


def parse_text(text: str):
    """Parse config.pbtxt text into a ModelConfig (raises google.protobuf.text_format.ParseError)."""
    return text_format.Parse(text, _pb().ModelConfig())


# ---- Triton's LLM-API model ------------------------------------------------------------------------

# upstream model.py in the container | the local reference model
LLMAPI_BACKENDS = tuple(k.backend for k in RepoKind if k.llmapi)
# Where the NGC tritonserver <yy.mm>-trtllm-python-py3 images keep the LLM-API model template (TensorRT-LLM
# docs' EAGLE-3 Triton guide: `cp -R /app/all_models/llmapi/ ...`): the production launch takes its
# 1/model.py and helpers.py from there, matched to the container's TensorRT-LLM.
CONTAINER_LLMAPI_MODEL = "/app/all_models/llmapi/tensorrt_llm/1"


@dataclass(frozen=True, kw_only=True)
class LlmApiLayout:
    """Everything the LLM-API repository's config depends on."""

    mode: Method
    trtllm_version: str
    local: bool  # the local reference model (specbuild additions, reference_engine parameter)
    default_num_draft_tokens: int  # speculative_config.max_draft_len (what the client reports as K)
    reference_engine: str | None = None  # local: the build folder the reference engine loads
    instance_count: int = 1  # upstream: 1 (the LLM batches in flight itself)
    decoupled: bool = False  # model.yaml's triton_config.decoupled (not in config.pbtxt, as upstream)


def llmapi_config(layout: LlmApiLayout):
    """tensorrt_llm of an LLM-API repository: Python backend, the upstream tensor table of the version.

    As upstream, no max_batch_size and no model_transaction_policy: model.py's auto_complete_config
    sets them from model.yaml's triton_config. specbuild's parameters (ignored by upstream model.py, which
    reads only gpu_device_ids) say the method and K to clients, and where the local model's engines are."""
    pb = _pb()
    config = pb.ModelConfig(name=T.LLMAPI_MODEL, backend="python")
    config.instance_group.add(count=layout.instance_count, kind=pb.ModelInstanceGroup.KIND_CPU)
    _add_tensors(config, T.llmapi_interface(layout.trtllm_version, local=layout.local))
    params = {
        "speculation_method": layout.mode.value,
        "default_num_draft_tokens": str(layout.default_num_draft_tokens),
        "trtllm_version": layout.trtllm_version,
    }
    if layout.local and layout.reference_engine:
        params["reference_engine"] = layout.reference_engine
    _set_params(config, params)
    return config
