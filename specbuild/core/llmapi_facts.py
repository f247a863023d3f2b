"""Versioned facts of the TensorRT-LLM LLM API (PyTorch backend): the second deployment flow.

One home for: `Flow` (the spec's `flow:`, engine | llmapi), the TensorRT-LLM versions the LLM-API
flow is generated for (`LLMAPI_VERSIONS`), every option key specbuild writes into an LLM-API options
file (`trtllm-serve --config`, Triton's `model.yaml`, Dynamo's `--extra-engine-args`) with its type,
its bounds and where it was read, the `decoding_type` spelling of each speculation method, the
`trtllm-serve` flags specbuild passes, the NGC image of each release, and the method x flow x version
matrix (`support`).

Sources (the TensorRT-LLM repository is too large to mirror; files were read through the code index,
so each fact names the file and the commit or index id it was read at):
* LINE_1_2 ("1.2.1"): `tensorrt_llm/llmapi/llm_args.py` index id 7019226376, the Literal-discriminated
  style that predates 1.3 (it has PARD and `acceptance_window`; a warning mentions "release 1.3"). The
  v1.2.1 tag itself could not be read: this snapshot stands in for it (UNVERIFIED against the tag).
  The Triton tutorial for the 1.2.1 containers (triton-inference-server/tutorials @4fe2b90, 2026-04-21)
  uses the same spellings (`decoding_type: Eagle3`, `Draft_Target`, `speculative_model`).
* LINE_1_4 ("1.4.0rc4"): `llm_args.py` @ 0004396720054fd8e205cbf616f21f0b57c6b412 (main, Aug-Sep 2026,
  read for BaseLlmArgs, TorchLlmArgs and KvCacheConfig) and the Sphinx signatures of the 1.4.0rc4 API
  reference (nvidia.github.io/TensorRT-LLM/1.4.0rc4/llm-api/reference/<Class>.html: TorchLlmArgs,
  KvCacheConfig, NGramDecodingConfig, Eagle3DecodingConfig, MTPDecodingConfig).
* `trtllm-serve`: `tensorrt_llm/commands/serve.py` index id 4219957788 (1.2 era) and the newer
  `add_serve_options` (index id 59679953799).

Rules the facts encode (docs/llmapi.md has the table):
* speculation runs in the PyTorch backend; Medusa has no PyTorch path (MedusaDecodingConfig.
  supports_backend excludes "pytorch" in 1.2; the class is gone with the TensorRT backend in 1.3+);
* EAGLE-3 has no engine path (TrtLlmArgs refuses `Eagle3`: "only supported on the PyTorch backend");
* the engine flow (trtllm-build + the C++ `tensorrtllm` Triton backend) ends with the 1.2.x line.

Torch-free, no I/O at import.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from specbuild.core.trtllm_facts import known_versions, parse_version

LINE_1_2 = "1.2.1"
LINE_1_4 = "1.4.0rc4"
DEFAULT_LLMAPI_VERSION = LINE_1_2  # the release the Triton 26.04-26.07 containers ship
LLMAPI_DEFAULT_MAX_NUM_TOKENS = 8192  # BaseLlmArgs.max_num_tokens default (both lines read)
LAST_ENGINE_LINE = (1, 2)  # the engine flow exists up to and including TensorRT-LLM 1.2.x


class Flow(str, Enum):
    """A spec's `flow:` — which TensorRT-LLM deployment path the spec is generated for."""

    ENGINE = "engine"  # convert -> trtllm-build -> the C++ tensorrtllm Triton backend (up to 1.2.x)
    LLMAPI = "llmapi"  # the LLM API on the PyTorch backend: trtllm-serve, Triton's LLM-API model, Dynamo

    def __str__(self) -> str:
        return self.value


def parse_flow(value: object) -> Flow:
    """A Flow from its name; ValueError with the valid names otherwise."""
    if isinstance(value, Flow):
        return value
    try:
        return Flow(str(value))
    except ValueError:
        names = [f.value for f in Flow]
        close = difflib.get_close_matches(str(value), names, n=1)
        raise ValueError(
            f"{value!r} is not a flow ({' | '.join(names)})"
            + (f"; did you mean {close[0]!r}?" if close else "")
        ) from None


# ---- option keys ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Key:
    """One field of an LLM-API config class that specbuild writes."""

    kind: str  # "int" | "float" | "bool" | "str" | "path" | "set[int]" | "literal" | "class"
    ge: float | None = None  # inclusive lower bound
    gt: float | None = None  # exclusive lower bound
    le: float | None = None  # inclusive upper bound
    choices: tuple[str, ...] = ()  # literal values (kind "literal")
    nested: str | None = None  # the config class of a mapping value (kind "class")
    note: str = ""


@dataclass(frozen=True)
class ConfigClass:
    """A pydantic config class of `tensorrt_llm.llmapi.llm_args`: the keys specbuild writes into it."""

    name: str  # the class name in tensorrt_llm.llmapi.llm_args
    keys: dict[str, Key]
    source: str
    decoding_type: str | None = None  # the Literal of `decoding_type` (speculative config classes)
    required: tuple[str, ...] = ()  # keys its validators require (speculative_model, max_draft_len > 0)


# The top-level keys (TorchLlmArgs / BaseLlmArgs). `model` is the positional MODEL of trtllm-serve, so it
# is written only into Triton's model.yaml, whose every key except triton_config goes to LLM(**kwargs).
_TOP = {
    "model": Key("path", note="HF folder or hub id"),
    "backend": Key("literal", choices=("pytorch",), note="TorchLlmArgs: Literal['pytorch']"),
    "tensor_parallel_size": Key("int", ge=1),
    "pipeline_parallel_size": Key("int", ge=1),
    "dtype": Key("literal", choices=("auto", "float16", "bfloat16", "float32")),
    "trust_remote_code": Key("bool"),
    "max_batch_size": Key("int", ge=1),
    "max_num_tokens": Key("int", ge=1),
    "max_seq_len": Key("int", ge=1),
    "enable_chunked_prefill": Key("bool"),
    "disable_overlap_scheduler": Key("bool", note="TorchLlmArgs (beta)"),
    "return_perf_metrics": Key("bool", note="per-request perf metrics (Triton perf outputs, Prometheus)"),
    "enable_iter_perf_stats": Key("bool", note="iteration stats (Prometheus trtllm_spec_decode_*)"),
    "kv_cache_config": Key("class", nested="KvCacheConfig"),
    "speculative_config": Key("class", nested="<decoding_type>"),
}
_KV = {
    "free_gpu_memory_fraction": Key("float", ge=0.0, le=1.0, note="of the memory free after weights"),
    "max_tokens": Key("int", ge=1, note="the smaller of this and the fraction's tokens is used"),
    "enable_block_reuse": Key("bool"),
}
_DECODING_BASE = {
    "decoding_type": Key("literal"),
    "max_draft_len": Key("int", gt=0, note="> 0 for Draft_Target, Eagle3 and NGram (after-validators)"),
    "speculative_model": Key(
        "path", note="AliasChoices('speculative_model', 'speculative_model_dir') in both lines read"
    ),
}
_NGRAM = {
    "max_matching_ngram_size": Key("int", gt=0, note="PositiveInt = 2"),
    "is_keep_all": Key("bool"),
    "is_use_oldest": Key("bool"),
    "is_public_pool": Key("bool"),
}
_EAGLE3 = {
    "eagle3_layers_to_capture": Key("set[int]", note="None: (1, L//2 - 1, L - 4) of an L-layer target")
}
_REJECTION = {
    "use_rejection_sampling": Key(
        "bool", note="1.3+: lossless sampling for one-model Draft_Target / Eagle3 (not NGram)"
    )
}

_SRC_A = "tensorrt_llm/llmapi/llm_args.py, index id 7019226376 (pre-1.3 Literal style; v1.2.1 tag UNVERIFIED)"
_SRC_C = (
    "tensorrt_llm/llmapi/llm_args.py @0004396720054fd8e205cbf616f21f0b57c6b412 and the 1.4.0rc4 API "
    "reference signature (nvidia.github.io/TensorRT-LLM/1.4.0rc4/llm-api/reference/{cls}.html)"
)


def _classes(source: str, *, rejection: bool) -> dict[str, ConfigClass]:
    def src(cls: str) -> str:
        return source.format(cls=cls)

    base = dict(_DECODING_BASE)
    extra = dict(_REJECTION) if rejection else {}
    return {
        "TorchLlmArgs": ConfigClass("TorchLlmArgs", _TOP, src("TorchLlmArgs")),
        "KvCacheConfig": ConfigClass("KvCacheConfig", _KV, src("KvCacheConfig")),
        "DraftTargetDecodingConfig": ConfigClass(
            "DraftTargetDecodingConfig",
            {**base, **extra},
            src("DraftTargetDecodingConfig"),
            decoding_type="Draft_Target",
            required=("max_draft_len", "speculative_model"),
        ),
        "NGramDecodingConfig": ConfigClass(
            "NGramDecodingConfig",
            {k: v for k, v in {**base, **_NGRAM}.items() if k != "speculative_model"},
            src("NGramDecodingConfig"),
            decoding_type="NGram",
            required=("max_draft_len",),
        ),
        "Eagle3DecodingConfig": ConfigClass(
            "Eagle3DecodingConfig",
            {**base, **_EAGLE3, **extra},
            src("Eagle3DecodingConfig"),
            decoding_type="Eagle3",
            required=("max_draft_len", "speculative_model"),
        ),
    }


@dataclass(frozen=True)
class LlmApiRelease:
    """The LLM-API facts of one TensorRT-LLM release."""

    version: str
    classes: dict[str, ConfigClass]
    serve_flags: tuple[str, ...]  # the trtllm-serve flags specbuild passes (all accepted by this release)
    serve_config_flag: str  # the flag naming the options YAML
    image: str  # the NGC TensorRT-LLM release container (trtllm-serve inside)
    sources: tuple[str, ...] = field(default=())
    notes: tuple[str, ...] = field(default=())

    def decoding_class(self, decoding_type: str) -> ConfigClass | None:
        return next((c for c in self.classes.values() if c.decoding_type == decoding_type), None)

    @property
    def decoding_types(self) -> tuple[str, ...]:
        return tuple(c.decoding_type for c in self.classes.values() if c.decoding_type)


# trtllm-serve flags (1.2-era serve.py, index id 4219957788: --free_gpu_memory_fraction has the long alias
# --kv_cache_free_gpu_memory_fraction, --tp_size / --pp_size are aliases of the *_parallel_size flags and
# --config of --extra_llm_api_options; add_serve_options, index id 59679953799, keeps all of them).
SERVE_FLAGS = (
    "--host",
    "--port",
    "--backend",
    "--tp_size",
    "--pp_size",
    "--max_batch_size",
    "--max_num_tokens",
    "--max_seq_len",
    "--kv_cache_free_gpu_memory_fraction",
    "--config",
)
RELEASE_IMAGE = "nvcr.io/nvidia/tensorrt-llm/release"  # tag = the TensorRT-LLM version (containers.html)

LLMAPI_VERSIONS: dict[str, LlmApiRelease] = {
    LINE_1_2: LlmApiRelease(
        version=LINE_1_2,
        classes=_classes(_SRC_A, rejection=False),
        serve_flags=SERVE_FLAGS,
        serve_config_flag="--config",
        image=f"{RELEASE_IMAGE}:{LINE_1_2}",
        sources=(_SRC_A, "tensorrt_llm/commands/serve.py, index id 4219957788 (1.2 era)"),
        notes=(
            "kill switch keys of this line: acceptance_window / acceptance_length_threshold (not written)",
            "no use_rejection_sampling: sampled draft/target on this line is refused by specbuild",
        ),
    ),
    LINE_1_4: LlmApiRelease(
        version=LINE_1_4,
        classes=_classes(_SRC_C, rejection=True),
        serve_flags=SERVE_FLAGS,
        serve_config_flag="--config",
        image=f"{RELEASE_IMAGE}:{LINE_1_4}",
        sources=(_SRC_C, "tensorrt_llm/commands/serve.py add_serve_options, index id 59679953799"),
        notes=(
            "kill switch keys renamed: acceptance_rate_window_size / acceptance_rate_threshold (not written)",
            "eagle3_one_model, eagle_choices, num_eagle_layers are absent from the 1.4.0rc4 signature",
            "Medusa and Lookahead are gone with the TensorRT backend",
        ),
    ),
}


def llmapi_versions() -> tuple[str, ...]:
    return tuple(LLMAPI_VERSIONS)


def release(version: str) -> LlmApiRelease:
    found = LLMAPI_VERSIONS.get(str(version))
    if found is None:
        raise KeyError(f"no LLM-API facts for TensorRT-LLM {version!r} ({', '.join(LLMAPI_VERSIONS)})")
    return found


# ---- methods on the LLM-API flow ----------------------------------------------------------------


@dataclass(frozen=True)
class Decoding:
    """How one speculation method is written as `speculative_config`."""

    config_class: str  # e.g. "NGramDecodingConfig"
    # spec section field -> speculative_config key, copied when the section has the field
    section_keys: dict[str, str] = field(default_factory=dict)
    model_section: str | None = None  # the spec section whose folder becomes speculative_model
    two_model: bool = False  # a separate draft model (disable_overlap_scheduler, its own weights)
    # False: the PyTorch executor turns the overlap scheduler off for this mode by itself
    # (SpeculativeDecodingMode.support_overlap_scheduler), so the options say disable_overlap_scheduler
    overlap_scheduler: bool = True


DECODINGS: dict[str, Decoding] = {
    "draft_target": Decoding("DraftTargetDecodingConfig", model_section="draft", two_model=True),
    # K is speculation.max_draft_len; the spec's ngram: section is NGramDecodingConfig's four fields, whose
    # names and defaults are the same in both lines read (core/methods/ngram.py). NGram is not among the
    # modes of SpeculativeDecodingMode.support_overlap_scheduler in any _torch/speculative/interface.py read
    # (index ids 2550156383, 735060080, 10039271475, 55097849426, 57352998664, oldest to newest style): the
    # executor turns the overlap scheduler off for it, so the options say so.
    "ngram": Decoding(
        "NGramDecodingConfig",
        section_keys={
            k: k for k in ("max_matching_ngram_size", "is_keep_all", "is_use_oldest", "is_public_pool")
        },
        overlap_scheduler=False,
    ),
    "eagle3": Decoding(
        "Eagle3DecodingConfig",
        section_keys={"layers_to_capture": "eagle3_layers_to_capture"},
        model_section="eagle3",
    ),
}


@dataclass(frozen=True)
class Support:
    """Whether a (method, flow, version) combination can be generated, and what to do instead."""

    ok: bool
    reason: str = ""
    alternative: str = ""  # the nearest supported combination, as a spec edit
    decoding_type: str | None = None  # llmapi flow: the speculative_config decoding_type


def engine_flow_version(version: str) -> bool:
    return parse_version(version)[:2] <= LAST_ENGINE_LINE


def support(method: str, flow: Flow, version: str) -> Support:
    """The matrix: can specbuild generate `method` on `flow` for TensorRT-LLM `version`?"""
    flow = parse_flow(flow)
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
        if method == "eagle3":
            return Support(
                False,
                "EAGLE-3 runs only on the PyTorch backend (TrtLlmArgs refuses decoding_type Eagle3: "
                "'only supported on the PyTorch backend')",
                f'flow: llmapi (trtllm_version "{LINE_1_2}" or "{LINE_1_4}")',
            )
        return Support(True)
    if version not in LLMAPI_VERSIONS:
        return Support(
            False,
            f"no LLM-API facts for TensorRT-LLM {version}: specbuild generates the LLM-API flow for "
            + ", ".join(LLMAPI_VERSIONS),
            " or ".join(f'trtllm_version: "{v}"' for v in LLMAPI_VERSIONS),
        )
    if method == "medusa":
        why = (
            "Medusa runs on the TensorRT engine backend only (MedusaDecodingConfig.supports_backend excludes "
            "pytorch)"
            if engine_flow_version(version)
            else f"Medusa was removed with the TensorRT backend: TensorRT-LLM {version} has no Medusa"
        )
        return Support(
            False,
            why + "; engine flow only in 1.2.x",
            f'flow: engine with trtllm_version: "{LINE_1_2}", or mode: eagle3 (the LLM API\'s head-based '
            "drafter)",
        )
    decoding = DECODINGS.get(method)
    if decoding is None:
        return Support(
            False,
            f"specbuild has no LLM-API mapping for {method}",
            f"mode: {' | '.join(DECODINGS)}",
        )
    rel = release(version)
    cls = rel.classes.get(decoding.config_class)
    if cls is None:
        return Support(False, f"TensorRT-LLM {version} has no {decoding.config_class}", "another method")
    return Support(True, decoding_type=cls.decoding_type)


# ---- validating an options dict ------------------------------------------------------------------


def check_options(options: dict[str, Any], version: str) -> list[str]:
    """Every problem of an LLM-API options dict against the recorded keys of `version` (empty: valid).

    Only keys specbuild records may appear (BaseLlmArgs forbids extra keys: `extra="forbid"`), each of
    its kind and within its bounds; speculative_config must carry a decoding_type of this release and
    the keys its validators require."""
    rel = release(version)
    problems: list[str] = []
    _check_mapping(options, rel.classes["TorchLlmArgs"], rel, "", problems)
    return problems


def _check_mapping(
    values: Any, cls: ConfigClass, rel: LlmApiRelease, prefix: str, problems: list[str]
) -> None:
    if not isinstance(values, dict):
        problems.append(f"{prefix or '<options>'}: expected a mapping ({cls.name}), found {values!r}")
        return
    for key, value in values.items():
        where = f"{prefix}{key}"
        spec = cls.keys.get(key)
        if spec is None:
            close = difflib.get_close_matches(str(key), cls.keys, n=1)
            problems.append(
                f"{where}: not a {cls.name} key recorded for TensorRT-LLM {rel.version}"
                + (f" (did you mean {close[0]!r}?)" if close else "")
            )
            continue
        if spec.kind == "class":
            nested = _nested(spec, value, rel, where, problems)
            if nested is not None:
                _check_mapping(value, nested, rel, where + ".", problems)
            continue
        if key == "decoding_type":
            if value != cls.decoding_type:
                problems.append(f"{where}: {value!r}, but {cls.name} takes {cls.decoding_type!r}")
            continue
        problem = _check_value(spec, value)
        if problem:
            problems.append(f"{where}: {problem}")
    for key in cls.required:
        if key not in values:
            problems.append(
                f"{prefix}{key}: required by {cls.name} (its validator refuses the config without it)"
            )


def _nested(spec: Key, value: Any, rel: LlmApiRelease, where: str, problems: list[str]) -> ConfigClass | None:
    if spec.nested != "<decoding_type>":
        return rel.classes[spec.nested]
    kind = value.get("decoding_type") if isinstance(value, dict) else None
    cls = rel.decoding_class(kind) if isinstance(kind, str) else None
    if cls is None:
        problems.append(
            f"{where}.decoding_type: {kind!r} is not a decoding_type specbuild writes for TensorRT-LLM "
            f"{rel.version} ({' | '.join(rel.decoding_types)})"
        )
    return cls


def _check_value(spec: Key, value: Any) -> str | None:
    kind = spec.kind
    if kind == "bool":
        return None if isinstance(value, bool) else f"expected true/false, found {value!r}"
    if kind in ("str", "path"):
        return None if isinstance(value, str) and value else f"expected a non-empty string, found {value!r}"
    if kind == "literal":
        return None if value in spec.choices else f"{value!r} is not one of {', '.join(spec.choices)}"
    if kind == "set[int]":
        ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        return None if ok else f"expected a list of layer indices, found {value!r}"
    numeric = (int,) if kind == "int" else (int, float)
    if isinstance(value, bool) or not isinstance(value, numeric):
        return f"expected {'an integer' if kind == 'int' else 'a number'}, found {value!r}"
    if spec.ge is not None and value < spec.ge:
        return f"{value} < {spec.ge:g}"
    if spec.gt is not None and value <= spec.gt:
        return f"{value} <= {spec.gt:g}"
    if spec.le is not None and value > spec.le:
        return f"{value} > {spec.le:g}"
    return None


def recorded_keys(version: str) -> dict[str, set[str]]:
    """config class -> the keys recorded for it (for the installed-package comparison and tests)."""
    return {name: set(cls.keys) for name, cls in release(version).classes.items()}
