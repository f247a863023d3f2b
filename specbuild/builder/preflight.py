"""`specbuild check`: every preflight check of a build spec, as pass / warn / fail rows.

Checks run from config.json alone when weights are absent (plan before downloading); a missing model
or config fails its row and skips what depends on it, so one run shows every problem at once. Every
row says what was found and, when it is not a pass, the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specbuild.builder.check_rows import FAIL, PASS, WARN, CheckResult, LoadedModel, short_path
from specbuild.builder.eagle3_checks import check_eagle3, load_eagle3
from specbuild.builder.medusa_checks import check_medusa_heads, check_tree
from specbuild.builder.memory_plan import (
    GIB,
    RUNTIME_RESERVE_GIB,
    MedusaShape,
    MemoryPlan,
    eagle3_shape_read,
    plan_memory,
    pp_layers,
)
from specbuild.builder.resolve import resolve_model
from specbuild.builder.schedule_checks import schedule_row
from specbuild.builder.tokenizer_checks import check_tokenizers
from specbuild.core.errors import SpecbuildError
from specbuild.core.facts.trtllm import prompt_limit
from specbuild.core.formats.hf_config import SUPPORTED_ARCHITECTURES, HFModelConfig
from specbuild.core.formats.weights import WeightFiles, find_weights, weight_stats
from specbuild.core.methods import method_of
from specbuild.core.methods.matrix import support
from specbuild.core.spec import BuildSpec, ModelSection
from specbuild.engines.trtllm.plan import effective_build_config

TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class CheckReport:
    spec: BuildSpec
    results: tuple[CheckResult, ...]
    plan: MemoryPlan | None = None

    @property
    def ok(self) -> bool:
        return not any(r.status == FAIL for r in self.results)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    def result(self, name: str) -> CheckResult | None:
        return next((r for r in self.results if r.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": str(self.spec.source) if self.spec.source else self.spec.name,
            "ok": self.ok,
            "results": [r.__dict__ for r in self.results],
            "plan": self.plan.to_dict() if self.plan else None,
        }


def run_checks(spec: BuildSpec, *, runtime_reserve_gib: float = RUNTIME_RESERVE_GIB) -> CheckReport:
    out: list[CheckResult] = [flow_row(spec)]
    row = schedule_row(spec)
    if row is not None:
        out.append(row)
    target = _load(spec, "target", spec.target, out)
    method = method_of(spec)
    draft_section = method.draft_engine(spec)
    draft = _load(spec, "draft", draft_section, out) if draft_section else None
    for m in (target, draft):
        if m is not None:
            _check_architecture(m, out)
            _check_parallel(m, out)
            _check_lengths(m, spec, out)
            _check_dtype(m, spec, out)
    if target and draft:
        _check_vocab_sizes(target, draft, out)
        _check_special_ids(target, draft, out)
        out.extend(check_tokenizers(target, draft))
    out.append(check_prompt_limit(spec))
    medusa = None
    if method.heads_of(spec) is not None:  # heads converted into the target
        medusa = check_medusa_heads(spec, target, out)
        out.append(check_tree(spec))
    eagle3 = None
    one_model = method.one_model_draft(spec)
    if one_model is not None:  # an EAGLE-3 draft read by the target's engine (LLM-API flow)
        head = load_eagle3(spec, out)
        if head is not None:
            check_eagle3(spec, target, head, out)
            if target is not None:
                try:
                    eagle3 = eagle3_shape_read(head, spec, target.config.num_hidden_layers)
                except ValueError:  # reported by the capture row
                    pass
    plan = None
    if target and (draft or not method.draft_model) and (one_model is None or eagle3):
        plan = plan_memory(
            spec,
            target=target.config,
            draft=draft.config if draft else None,
            medusa=medusa,
            eagle3=eagle3,
            runtime_reserve_gib=runtime_reserve_gib,
        )
        out.append(_check_plan(spec, plan, target, draft, runtime_reserve_gib))
    else:
        out.append(
            CheckResult(
                "memory plan",
                FAIL,
                "not computed: a model config could not be read",
                "fix the model rows above; the plan needs each model's config.json",
            )
        )
    return CheckReport(spec, tuple(out), plan)


def flow_row(spec: BuildSpec) -> CheckResult:
    """The method x flow x version combination (core/methods/matrix.py; the spec loader refuses the rest)."""
    found = support(spec.mode.value, spec.flow, spec.trtllm_version)
    if not spec.flow.builds_engines:
        what = (
            f"LLM API (PyTorch backend) on TensorRT-LLM {spec.trtllm_version}: speculative_config "
            "decoding_type "
            f"{found.decoding_type}; compile writes the options file and the trtllm-serve command, no engines"
        )
    else:
        what = (
            f"engine flow on TensorRT-LLM {spec.trtllm_version}: convert, trtllm-build, the C++ tensorrtllm "
            "Triton backend"
        )
    return CheckResult("flow", PASS if found.ok else FAIL, what, found.alternative)


# ---- models --------------------------------------------------------------------------------------


def _load(spec: BuildSpec, role: str, section: ModelSection, out: list[CheckResult]) -> LoadedModel | None:
    try:
        folder = resolve_model(section.model, base=spec.base_dir, what=f"{role} model")
        config = HFModelConfig.from_hf(folder)
    except SpecbuildError as exc:
        out.append(CheckResult(f"{role}: model", FAIL, f"{exc.what} ({exc.found})", exc.fix or ""))
        return None
    weights = find_weights(folder)
    if weights.missing:
        out.append(
            CheckResult(
                f"{role}: weights",
                FAIL,
                f"{short_path(folder)}: {len(weights.missing)} shard(s) listed in the index are missing, "
                f"e.g. {weights.missing[0]}",
                "finish the download (huggingface-cli download resumes) before compile",
            )
        )
    elif not weights.present:
        out.append(
            CheckResult(
                f"{role}: weights",
                WARN,
                f"{short_path(folder)}: config.json only, no *.safetensors / pytorch_model*.bin; checks and "
                "the plan use the shapes",
                "download the weights before `specbuild compile`",
            )
        )
    else:
        out.append(_weights_row(role, folder, config, weights))
    return LoadedModel(role, section, folder, config, weights)


def _weights_row(role: str, folder: Path, config: HFModelConfig, weights: WeightFiles) -> CheckResult:
    """Present weights: the safetensors headers must be readable and hold what config.json describes."""
    n = len(weights.safetensors) + len(weights.torch_bins)
    found = f"{n} file(s), {weights.disk_bytes / GIB:.2f} GiB in {short_path(folder)}"
    try:
        stats = weight_stats(weights)
    except SpecbuildError as exc:
        return CheckResult(f"{role}: weights", FAIL, f"{exc.what}: {exc.found}", exc.fix or "")
    if stats is not None and stats.num_parameters != config.num_parameters:
        return CheckResult(
            f"{role}: weights",
            WARN,
            f"{found}; the headers hold {stats.num_parameters:,} parameters, config.json's shapes make "
            f"{config.num_parameters:,}",
            "check that config.json belongs to these weights (specbuild inspect shows both)",
        )
    return CheckResult(
        f"{role}: weights", PASS, found + (f", {stats.num_parameters:,} parameters" if stats else "")
    )


def _check_architecture(m: LoadedModel, out: list[CheckResult]) -> None:
    c = m.config
    if c.supported:
        out.append(
            CheckResult(
                f"{m.role}: architecture",
                PASS,
                f"{c.architecture} ({c.family}), {c.num_hidden_layers} layers, hidden {c.hidden_size}",
            )
        )
    else:
        out.append(
            CheckResult(
                f"{m.role}: architecture",
                FAIL,
                f"{c.architecture} is not supported",
                f"use a checkpoint of {', '.join(SUPPORTED_ARCHITECTURES)} (the Llama, Mistral and Qwen2 "
                "families)",
            )
        )


def valid_tp_sizes(c: HFModelConfig, limit: int = 64) -> list[int]:
    return [t for t in TP_CANDIDATES if t <= limit and not _tp_problems(c, t)]


def _tp_problems(c: HFModelConfig, tp: int) -> list[str]:
    problems = []
    if c.num_attention_heads % tp:
        problems.append(f"num_attention_heads {c.num_attention_heads} is not divisible by tp_size {tp}")
    nkv = c.num_key_value_heads
    if tp <= nkv and nkv % tp:
        problems.append(f"num_key_value_heads {nkv} is not divisible by tp_size {tp}")
    if tp > nkv and tp % nkv:
        problems.append(
            f"tp_size {tp} > num_key_value_heads {nkv} needs tp_size % {nkv} == 0 to duplicate KV heads"
        )
    if c.hidden_size % tp:
        problems.append(f"hidden_size {c.hidden_size} is not divisible by tp_size {tp}")
    if c.intermediate_size % tp:
        problems.append(f"intermediate_size {c.intermediate_size} is not divisible by tp_size {tp}")
    return problems


def _check_parallel(m: LoadedModel, out: list[CheckResult]) -> None:
    c, tp, pp = m.config, m.section.tp_size, m.section.pp_size
    problems = _tp_problems(c, tp)
    if problems:
        ok = ", ".join(str(t) for t in valid_tp_sizes(c))
        out.append(
            CheckResult(
                f"{m.role}: tensor parallel",
                FAIL,
                "; ".join(problems),
                f"set {m.role}.tp_size to one of {ok}",
            )
        )
    else:
        note = f"tp {tp}: {c.num_attention_heads // tp} heads, "
        if tp > c.num_key_value_heads:
            note += (
                f"1 KV head per GPU (each of the {c.num_key_value_heads} KV heads duplicated "
                f"x{tp // c.num_key_value_heads})"
            )
        else:
            note += f"{c.num_key_value_heads // tp} KV heads per GPU"
        if c.vocab_size % tp:
            note += f"; lm_head padded to {-(-c.vocab_size // tp) * tp} rows"
        out.append(CheckResult(f"{m.role}: tensor parallel", PASS, note))
    layers = c.num_hidden_layers
    if pp > layers:
        out.append(
            CheckResult(
                f"{m.role}: pipeline parallel",
                FAIL,
                f"pp_size {pp} > {layers} layers",
                f"set {m.role}.pp_size <= {layers}",
            )
        )
    elif layers % pp:
        out.append(
            CheckResult(
                f"{m.role}: pipeline parallel",
                WARN,
                f"{layers} layers over pp {pp} is uneven: stages hold {pp_layers(layers, pp)}",
                f"use a pp_size that divides {layers} to balance the stages",
            )
        )
    elif pp > 1:
        out.append(
            CheckResult(f"{m.role}: pipeline parallel", PASS, f"pp {pp}: {layers // pp} layers per stage")
        )


def _check_lengths(m: LoadedModel, spec: BuildSpec, out: list[CheckResult]) -> None:
    limit = m.config.max_position_embeddings
    seq = spec.build.max_seq_len
    # trtllm-build adds max_draft_len to max_seq_len of a speculative engine (trtllm.md 1.2)
    extra = spec.speculation.max_draft_len if m.role == "target" else 0
    name = f"{m.role}: sequence length"
    if seq > limit:
        out.append(
            CheckResult(
                name,
                FAIL,
                f"build.max_seq_len {seq} > max_position_embeddings {limit}",
                f"set build.max_seq_len <= {limit}",
            )
        )
    elif seq + extra > limit:
        out.append(
            CheckResult(
                name,
                WARN,
                f"max_seq_len {seq} + max_draft_len {extra} > max_position_embeddings {limit}",
                f"set build.max_seq_len <= {limit - extra}",
            )
        )
    else:
        window = m.config.sliding_window
        if window is not None and window < seq + extra:
            out.append(
                CheckResult(
                    name,
                    WARN,
                    f"sliding_window {window} < max_seq_len {seq}{f' + {extra}' if extra else ''}: attention "
                    f"beyond {window} tokens is local",
                    f"set build.max_seq_len <= {window - extra} for exact full-attention results, or "
                    f"configure max_attention_window_size {window}",
                )
            )
            return
        plus = f" + max_draft_len {extra}" if extra else ""
        out.append(CheckResult(name, PASS, f"max_seq_len {seq}{plus} <= max_position_embeddings {limit}"))


def _check_dtype(m: LoadedModel, spec: BuildSpec, out: list[CheckResult]) -> None:
    stored, chosen = m.config.dtype, spec.dtype
    if stored == "bfloat16" and chosen == "float16":
        out.append(
            CheckResult(
                f"{m.role}: dtype",
                WARN,
                "bfloat16 checkpoint built as float16: activations may overflow float16's range",
                "set dtype: bfloat16 (Ampere or newer)",
            )
        )
    else:
        out.append(
            CheckResult(
                f"{m.role}: dtype",
                PASS,
                f"{stored} checkpoint -> {chosen}"
                + (f", weight-only {spec.build.weight_only}" if spec.build.weight_only != "none" else ""),
            )
        )


def _check_vocab_sizes(target: LoadedModel, draft: LoadedModel, out: list[CheckResult]) -> None:
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv == dv:
        out.append(CheckResult("vocab size", PASS, f"target and draft vocab_size {tv}"))
    else:
        out.append(
            CheckResult(
                "vocab size",
                FAIL,
                f"target vocab_size {tv}, draft vocab_size {dv}",
                "pick a draft from the target's family with the same tokenizer and vocab_size; draft tokens "
                "are passed as ids",
            )
        )


def _check_special_ids(target: LoadedModel, draft: LoadedModel, out: list[CheckResult]) -> None:
    t, d = target.config, draft.config
    if t.bos_token_id != d.bos_token_id:
        out.append(
            CheckResult(
                "special token ids",
                FAIL,
                f"bos_token_id: target {t.bos_token_id}, draft {d.bos_token_id}",
                "use a draft with the target's tokenizer (same special-token ids)",
            )
        )
    elif set(t.eos_ids) != set(d.eos_ids):
        out.append(
            CheckResult(
                "special token ids",
                WARN,
                f"eos_token_id: target {list(t.eos_ids)}, draft {list(d.eos_ids)}; the target's decides when "
                "to stop",
                "align the draft's eos_token_id in its config.json with the target's",
            )
        )
    else:
        out.append(
            CheckResult(
                "special token ids", PASS, f"bos {t.bos_token_id}, eos {list(t.eos_ids)} in both configs"
            )
        )


def check_prompt_limit(spec: BuildSpec) -> CheckResult:
    """The longest prompt the engines accept (core/facts/trtllm.py: the runtime's rule)."""
    chunked = spec.serving.enable_chunked_context
    if not spec.flow.builds_engines:  # no engine limits: the LLM API's own max_num_tokens rule
        return _llmapi_prompt_limit(spec)
    limits = {}
    for role in method_of(spec).roles(spec):
        bc = effective_build_config(spec, role)
        limits[role.role] = (
            prompt_limit(bc, enable_chunked_context=chunked),
            bc["max_seq_len"],
            bc["max_num_tokens"],
        )
    role, (limit, seq, tokens) = min(limits.items(), key=lambda kv: kv[1][0])
    rule = (
        f"engine max_seq_len {seq} - 1 (serving.enable_chunked_context: prompts run {tokens} tokens at a "
        "time)"
        if chunked
        else f"min(engine max_seq_len {seq} - 1, max_num_tokens {tokens})"
    )
    where = f" ({role} engine)" if len(limits) > 1 else ""
    found = (
        f"longest prompt {limit} tokens{where} = {rule}; with remove_input_padding and context FMHA (always "
        "on) "
        f"TensorRT-LLM ignores build.max_input_len {spec.build.max_input_len}"
    )
    if limit < spec.build.max_input_len:
        fix = (
            f"raise build.max_num_tokens to >= {spec.build.max_input_len}, or set "
            "serving.enable_chunked_context: true"
            if not chunked
            else f"raise build.max_seq_len above {spec.build.max_input_len}"
        )
        return CheckResult(
            "prompt limit",
            WARN,
            found + f": prompts of {limit + 1}..{spec.build.max_input_len} tokens are refused",
            fix,
        )
    return CheckResult("prompt limit", PASS, found)


def _llmapi_prompt_limit(spec: BuildSpec) -> CheckResult:
    """LLM API: without chunked prefill a prompt longer than max_num_tokens is refused ("The sum of prompt
    length ..., query length (0) should not exceed max_num_tokens", TensorRT-LLM's test_max_num_token_check,
    tests/unittest/llmapi/test_llm.py index id 4226824540); max_tokens is lowered to max_seq_len - prompt."""
    tokens = spec.build.max_num_tokens or spec.flow.default_max_num_tokens
    seq = spec.build.max_seq_len
    if spec.serving.enable_chunked_context:
        return CheckResult(
            "prompt limit",
            PASS,
            f"longest prompt max_seq_len {seq} - 1 (enable_chunked_prefill: {tokens} tokens per step)",
        )
    limit = min(seq - 1, tokens)
    found = f"longest prompt min(max_seq_len {seq} - 1, max_num_tokens {tokens}) = {limit} tokens (LLM API)"
    if limit < spec.build.max_input_len:
        return CheckResult(
            "prompt limit",
            WARN,
            found + f": prompts of {limit + 1}..{spec.build.max_input_len} tokens are refused",
            f"raise build.max_num_tokens to >= {spec.build.max_input_len}, or set "
            "serving.enable_chunked_context: true (enable_chunked_prefill)",
        )
    return CheckResult("prompt limit", PASS, found)


# ---- memory --------------------------------------------------------------------------------------


def _check_plan(
    spec: BuildSpec, plan: MemoryPlan, target: LoadedModel, draft: LoadedModel | None, reserve: float
) -> CheckResult:
    t = plan.engine("target")
    d = plan.engine("draft")
    gpu = spec.serving.gpu_memory_gb
    need = (plan.gpu_memory_bytes - plan.free_after_weights_bytes) / GIB
    if plan.free_after_weights_bytes <= 0:
        return CheckResult(
            "memory plan",
            FAIL,
            f"GPU 0 needs {need:.1f} GiB for weights, activations and the {reserve:g} GiB reserve; "
            f"serving.gpu_memory_gb is {gpu:g}",
            _fit_fix(spec, target, draft, reserve),
        )
    needed = spec.build.max_seq_len + spec.speculation.max_draft_len
    if plan.kv_tokens < needed:
        return CheckResult(
            "memory plan",
            FAIL,
            f"KV cache holds {plan.kv_tokens} tokens per engine, one sequence needs {needed}",
            _fit_fix(spec, target, draft, reserve),
        )
    fractions = f"kv_cache_free_gpu_mem_fraction target {t.kv_fraction}" + (
        f", draft {d.kv_fraction}" if d else ""
    )
    e = plan.engine("eagle3")
    if spec.flow.one_kv_pool:
        fractions = (
            f"kv_cache_config free_gpu_memory_fraction {plan.kv_fraction_total:g}, max_tokens "
            f"{plan.kv_tokens} (one pool for every model)"
        )
    found = (
        f"weights {t.weight_bytes / GIB:.2f} GiB/GPU (target)"
        + (f" + {d.weight_bytes / GIB:.2f} GiB (draft)" if d else "")
        + (f" + {e.weight_bytes / GIB:.2f} GiB (EAGLE-3)" if e else "")
        + f"; KV {plan.kv_tokens:,} tokens per engine = {plan.full_sequences} sequences of "
        f"{plan.max_seq_len}; {fractions}"
    )
    if plan.full_sequences < plan.max_batch_size:
        return CheckResult(
            "memory plan",
            WARN,
            found + f" (< max_batch_size {plan.max_batch_size})",
            "long sequences cap the batch: lower build.max_seq_len or max_batch_size, or raise tp_size",
        )
    return CheckResult("memory plan", PASS, found)


def _fit_fix(spec: BuildSpec, target: LoadedModel, draft: LoadedModel | None, reserve: float) -> str:
    """Name the smallest target tp_size that fits, else the other levers."""
    for tp in valid_tp_sizes(target.config):
        if tp <= spec.target.tp_size:
            continue
        trial = replace(
            spec, target=replace(spec.target, tp_size=tp), serving=replace(spec.serving, num_gpus=None)
        )
        plan = plan_memory(
            trial,
            target=target.config,
            draft=draft.config if draft else None,
            medusa=MedusaShape(h.num_heads, h.num_layers) if (h := method_of(spec).heads_of(spec)) else None,
            runtime_reserve_gib=reserve,
        )
        if plan.fits and plan.kv_tokens >= spec.build.max_seq_len + spec.speculation.max_draft_len:
            return (
                f"set target.tp_size: {tp} ({tp} GPUs), or build.weight_only: int8, or a GPU with more memory"
            )
    return "use build.weight_only: int8 / int4, a GPU with more memory, or a smaller model"
