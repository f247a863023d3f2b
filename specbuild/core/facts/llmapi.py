"""Versioned facts of the TensorRT-LLM LLM API (PyTorch backend): the second deployment flow.

One home for: `Flow` (the spec's `flow:`, engine | llmapi), the TensorRT-LLM versions the LLM-API
flow is generated for (`LLMAPI_VERSIONS`), every option key specbuild writes into an LLM-API options
file (`trtllm-serve --config`, Triton's `model.yaml`, Dynamo's `--extra-engine-args`) with its type,
its bounds and where it was read, the `decoding_type` spelling of each speculation method per release,
how each release parses the file (`Parser`: the function trtllm-serve calls on `--config`, then the
args class), the load-aware keys and their runtime floors (`ScheduleRule`), the `trtllm-serve` flags
specbuild passes and the NGC image of each release. The method x flow x version matrix (`support`) asks
these facts and each method: core/methods/matrix.py.

Every class, parser and rule carries its source (`core/facts/llmapi_sources.py` `Fact`: repository, path,
revision, verified | inferred); `release_facts(version)` lists them and `specbuild doctor --facts`
prints them. The two parser styles:
* 1.2.1 ("registry"): `update_llm_args_with_extra_dict` sends `speculative_config` through
  `DecodingBaseConfig.from_dict`, a registry keyed MTP, Medusa, Eagle, Lookahead, NGram, DraftTarget,
  SaveState, UserProvided, AUTO; `decoding_type` is a ClassVar of each class. Draft/target is
  `DraftTarget`, EAGLE-3 is `Eagle` (EagleDecodingConfig; `eagle3_one_model` True: the one-model path).
* 1.4.0rc4 ("literal"): `decoding_type` is a Literal field and TorchLlmArgs validates
  `speculative_config` as a discriminated union: `Draft_Target`, `Eagle3`, `NGram`.

Rules the facts encode (docs/llmapi.md has the table):
* speculation runs in the PyTorch backend; Medusa has no PyTorch path (MedusaDecodingConfig.
  supports_backend excludes "pytorch" in 1.2; the class is gone with the TensorRT backend in 1.3+);
* EAGLE-3 has no engine path (TrtLlmArgs refuses it: "only supported on the PyTorch backend");
* the engine flow (trtllm-build + the C++ `tensorrtllm` Triton backend) ends with the 1.2.x line;
* `eagle3_one_model: false` / `mtp_eagle_one_model: false` are never written (two-model is gone on 1.4).

Torch-free, no I/O at import.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from specbuild.core.facts import llmapi_sources as S
from specbuild.core.facts.llmapi_sources import Fact
from specbuild.core.facts.trtllm import parse_version

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

    # ---- what the flow's runtime does that the stages model differently (they ask; they do not branch) --
    @property
    def builds_engines(self) -> bool:
        """`compile` converts checkpoints and builds engines (trtllm-build's limits apply to them). On the
        LLM-API flow the runtime reads the HF folders itself: compile writes its options, no engines
        (unless `--engine reference`, for the local stand-in)."""
        return self is Flow.ENGINE

    @property
    def one_model_repo(self) -> bool:
        """Its Triton repository is one model (the LLM-API model.py) that speculates by itself; the engine
        flow's is the ensemble, the BLS and an engine model per role (core/deployment.py RepoKind)."""
        return self is Flow.LLMAPI

    @property
    def one_kv_pool(self) -> bool:
        """One KV pool holds every model's K and V per token and the draft model and EAGLE-3 layers use
        the target's TP/PP mapping (the LLM API's KvCacheCreator); the engine flow sizes one pool per
        engine, each on its own mapping."""
        return self is Flow.LLMAPI

    @property
    def runtime_floors_schedule(self) -> bool:
        """The runtime applies `draft_len_schedule` with the release's per-mode floors (the LLM API);
        on the engine flow specbuild's BLS applies the schedule as written."""
        return self is Flow.LLMAPI

    @property
    def default_max_num_tokens(self) -> int | None:
        """max_num_tokens when the spec sets none: BaseLlmArgs' default on the LLM API; None on the engine
        flow, where trtllm-build derives it from the build limits (core/facts/trtllm.py)."""
        return LLMAPI_DEFAULT_MAX_NUM_TOKENS if self is Flow.LLMAPI else None


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

    kind: str  # "int" | "float" | "bool" | "str" | "path" | "set[int]" | "literal" | "class" | "schedule"
    ge: float | None = None  # inclusive lower bound
    gt: float | None = None  # exclusive lower bound
    le: float | None = None  # inclusive upper bound
    choices: tuple[str, ...] = ()  # literal values (kind "literal")
    nested: str | None = None  # the config class of a mapping value (kind "class")
    note: str = ""


@dataclass(frozen=True)
class ConfigClass:
    """A config class of `tensorrt_llm.llmapi.llm_args`: the keys specbuild writes into it."""

    name: str  # the class name in tensorrt_llm.llmapi.llm_args
    keys: dict[str, Key]
    source: Fact
    decoding_type: str | None = None  # the spelling of `decoding_type` this release parses
    classvar: bool = False  # decoding_type is a ClassVar (dispatched by a registry), not a pydantic field
    required: tuple[str, ...] = ()  # keys its validators require (speculative_model, max_draft_len > 0)
    fields_source: Fact | None = None  # where its field list was read, when not `source`


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
    "max_draft_len": Key("int", gt=0, note="> 0 for draft/target, EAGLE-3 and NGram (validators)"),
    "speculative_model": Key(
        "path", note="AliasChoices('speculative_model', 'speculative_model_dir') in both lines read"
    ),
}
_NGRAM = {
    "max_matching_ngram_size": Key("int", gt=0, note="> 0 (TorchLlmArgs validator)"),
    "is_keep_all": Key("bool"),
    "is_use_oldest": Key("bool"),
    "is_public_pool": Key("bool"),
}
_EAGLE3 = {
    "eagle3_layers_to_capture": Key("set[int]", note="None: (1, L//2 - 1, L - 4) of an L-layer target")
}
# 1.2.1's EagleDecodingConfig serves EAGLE-3: eagle3_one_model selects the one-model path (default True)
_EAGLE_1_2 = {**_EAGLE3, "eagle3_one_model": Key("bool", note="True: one model (False: the two-model path)")}
# Load-aware K (core/perf/schedule.py): `max_concurrency` and `draft_len_schedule` (batch size -> K), and the
# kill switch, renamed (not aliased) between the lines.
_LOAD_1_2 = {
    "max_concurrency": Key("int", ge=0, note="Optional[int]"),
    "draft_len_schedule": Key("schedule", note="'batch_size >= key uses value'; key 1 == max_draft_len"),
    "acceptance_window": Key("int", ge=0, note="rolling window over the last N completed requests; 0: off"),
    "acceptance_length_threshold": Key(
        "float", ge=0.0, note="mean acceptance length below which speculation is off for good"
    ),
}
_LOAD_1_4 = {
    "max_concurrency": Key("int", gt=0, note="Optional[PositiveInt]; exclusive with draft_len_schedule"),
    "draft_len_schedule": Key(
        "schedule", note="'batch size <= key uses value'; smallest key == max_draft_len; 0 past the largest"
    ),
    "acceptance_rate_window_size": Key("int", ge=0, note="last N speculation-enabled iterations; 0: off"),
    "acceptance_rate_threshold": Key("float", ge=0.0, le=1.0, note="accepted / drafted; off for good below"),
}
_REJECTION = {
    "use_rejection_sampling": Key("bool", note="1.3+: lossless sampling for one-model Draft_Target / Eagle3")
}


def _classes_1_2() -> dict[str, ConfigClass]:
    base, src = {**_DECODING_BASE, **_LOAD_1_2}, S.TRANSCRIPT_1_2
    return {
        "TorchLlmArgs": ConfigClass("TorchLlmArgs", _TOP, src),
        "KvCacheConfig": ConfigClass("KvCacheConfig", _KV, src),
        "DraftTargetDecodingConfig": ConfigClass(
            "DraftTargetDecodingConfig",
            base,
            S.REGISTRY_1_2,
            fields_source=S.TRANSCRIPT_1_2,
            decoding_type="DraftTarget",  # the registry key; the class's ClassVar says "Draft_Target"
            classvar=True,
            required=("max_draft_len", "speculative_model"),
        ),
        "NGramDecodingConfig": ConfigClass(
            "NGramDecodingConfig",
            {k: v for k, v in {**base, **_NGRAM}.items() if k != "speculative_model"},
            S.REGISTRY_1_2,
            fields_source=S.TRANSCRIPT_1_2,
            decoding_type="NGram",
            classvar=True,
            required=("max_draft_len",),
        ),
        "EagleDecodingConfig": ConfigClass(
            "EagleDecodingConfig",
            {**base, **_EAGLE_1_2},
            S.EAGLE_1_2,
            fields_source=S.TRANSCRIPT_1_2,
            decoding_type="Eagle",
            classvar=True,
            required=("max_draft_len", "speculative_model"),
        ),
    }


def _classes_1_4() -> dict[str, ConfigClass]:
    base, src = {**_DECODING_BASE, **_LOAD_1_4}, S.DOCS_1_4
    return {
        "TorchLlmArgs": ConfigClass("TorchLlmArgs", _TOP, src),
        "KvCacheConfig": ConfigClass("KvCacheConfig", _KV, src),
        "DraftTargetDecodingConfig": ConfigClass(
            "DraftTargetDecodingConfig",
            {**base, **_REJECTION},
            src,
            decoding_type="Draft_Target",
            required=("max_draft_len", "speculative_model"),
        ),
        "NGramDecodingConfig": ConfigClass(
            "NGramDecodingConfig",
            {k: v for k, v in {**base, **_NGRAM}.items() if k != "speculative_model"},
            src,
            decoding_type="NGram",
            required=("max_draft_len",),
        ),
        "Eagle3DecodingConfig": ConfigClass(
            "Eagle3DecodingConfig",
            {**base, **_EAGLE3, **_REJECTION},
            src,
            decoding_type="Eagle3",
            required=("max_draft_len", "speculative_model"),
        ),
    }


@dataclass(frozen=True)
class Parser:
    """How a release reads an options file: `function` is what trtllm-serve calls on `--config`
    (`update_llm_args_with_extra_dict(llm_args, options)`), then `args_class(**merged)` validates."""

    style: str  # "registry": DecodingBaseConfig.from_dict dispatch; "literal": a discriminated union
    function: str  # "module:function"
    args_class: str  # "module:Class"
    source: Fact


@dataclass(frozen=True)
class ScheduleRule:
    """How one release spells, validates and runs the load-aware keys (DecodingBaseConfig)."""

    style: str  # "from": {n: K} = from n requests on (1.2); "upto": up to n requests (1.3+)
    guard_window: str  # the kill switch's window key
    guard_threshold: str  # ... and its threshold key
    guard_measure: str  # "length": mean acceptance length (1 + accepted per step); "rate": accepted / drafted
    exclusive: bool  # max_concurrency and draft_len_schedule may not both be set
    # method -> min_runtime_draft_len: the K the runtime runs when the schedule resolves lower. None: the
    # release has no floor (K=0 skips the drafter, whose state then goes stale: COLLAPSE)
    floors: dict[str, int] | None
    source: Fact

    def runtime_k(self, method: str, k: int) -> int:
        """The K this release runs when its schedule resolves to `k` for `method`."""
        return k if self.floors is None else max(k, self.floors.get(method, 0))

    def collapses(self, method: str) -> bool:
        """True where a K=0 phase loses acceptance for the rest of the request (pre-fix, not NGram)."""
        return self.floors is None and method != "ngram"


@dataclass(frozen=True)
class LlmApiRelease:
    """The LLM-API facts of one TensorRT-LLM release."""

    version: str
    classes: dict[str, ConfigClass]
    methods: dict[str, str]  # speculation method -> its config class
    parser: Parser
    schedule: ScheduleRule
    serve_flags: tuple[str, ...]  # the trtllm-serve flags specbuild passes (all accepted by this release)
    serve_config_flag: str  # the flag naming the options YAML
    image: str  # the NGC TensorRT-LLM release container (trtllm-serve inside)
    pin: Fact  # how the release itself was pinned
    serve_source: Fact  # where the trtllm-serve flags were read
    fixed: dict[str, dict[str, Any]] = field(default_factory=dict)  # class -> keys always written
    two_model: tuple[str, ...] = ()  # methods that still run as two models on this release
    notes: tuple[str, ...] = field(default=())

    def decoding_class(self, decoding_type: str) -> ConfigClass | None:
        return next((c for c in self.classes.values() if c.decoding_type == decoding_type), None)

    def method_class(self, method: str) -> ConfigClass | None:
        name = self.methods.get(method)
        return self.classes.get(name) if name else None

    @property
    def decoding_types(self) -> tuple[str, ...]:
        return tuple(c.decoding_type for c in self.classes.values() if c.decoding_type)

    @property
    def sources(self) -> tuple[Fact, ...]:
        seen: list[Fact] = [self.pin]
        for fact in (
            *(c.source for c in self.classes.values()),
            self.parser.source,
            self.schedule.source,
            *(c.fields_source for c in self.classes.values() if c.fields_source),
            S.RELEASE_IMAGES,
            self.serve_source,
        ):
            if fact not in seen:
                seen.append(fact)
        return tuple(seen)


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
_METHODS_1_2 = {
    "draft_target": "DraftTargetDecodingConfig",
    "ngram": "NGramDecodingConfig",
    "eagle3": "EagleDecodingConfig",
}
_METHODS_1_4 = {**_METHODS_1_2, "eagle3": "Eagle3DecodingConfig"}

LLMAPI_VERSIONS: dict[str, LlmApiRelease] = {
    LINE_1_2: LlmApiRelease(
        version=LINE_1_2,
        classes=_classes_1_2(),
        methods=_METHODS_1_2,
        parser=Parser(
            "registry",
            "tensorrt_llm.llmapi.llm_utils:update_llm_args_with_extra_dict",
            "tensorrt_llm.llmapi.llm_args:TorchLlmArgs",
            S.SERVE_1_2,
        ),
        schedule=ScheduleRule(
            style="from",
            guard_window="acceptance_window",
            guard_threshold="acceptance_length_threshold",
            guard_measure="length",
            exclusive=False,
            floors=None,
            source=S.COLLAPSE,
        ),
        serve_flags=SERVE_FLAGS,
        serve_config_flag="--config",
        image=f"{RELEASE_IMAGE}:{LINE_1_2}",
        pin=S.PIN_1_2,
        serve_source=S.SERVE_1_2,
        fixed={"EagleDecodingConfig": {"eagle3_one_model": True}},
        two_model=("draft_target",),
        notes=(
            "decoding_type spellings: DraftTarget, Eagle (EAGLE-3, eagle3_one_model: true), NGram; "
            "Draft_Target and Eagle3 raise 'Invalid decoding type'",
            "kill switch keys of this line: acceptance_window / acceptance_length_threshold (over completed "
            "requests, acceptance length; specbuild writes them from speculation.guard)",
            "draft_len_schedule: 'batch_size >= key uses value', key 1 required and == max_draft_len; no "
            "runtime floor: a K=0 phase may cost the rest of a request its acceptance (pre-fix)",
            "no use_rejection_sampling: sampled draft/target on this line is refused by specbuild",
        ),
    ),
    LINE_1_4: LlmApiRelease(
        version=LINE_1_4,
        classes=_classes_1_4(),
        methods=_METHODS_1_4,
        parser=Parser(
            "literal",
            "tensorrt_llm.llmapi.llm_args:update_llm_args_with_extra_dict",
            "tensorrt_llm.llmapi.llm_args:TorchLlmArgs",
            S.MAIN_1_4,
        ),
        schedule=ScheduleRule(
            style="upto",
            guard_window="acceptance_rate_window_size",
            guard_threshold="acceptance_rate_threshold",
            guard_measure="rate",
            exclusive=True,
            floors={"draft_target": 1, "eagle3": 0, "ngram": 0},
            source=S.FLOOR,
        ),
        serve_flags=SERVE_FLAGS,
        serve_config_flag="--config",
        image=f"{RELEASE_IMAGE}:{LINE_1_4}",
        pin=S.DOCS_1_4,
        serve_source=S.SERVE_1_4,
        notes=(
            "decoding_type spellings: Draft_Target, Eagle3, NGram (Literal discriminators); DraftTarget "
            "fails the union",
            "kill switch keys renamed: acceptance_rate_window_size / acceptance_rate_threshold (over "
            "iterations, accepted / drafted; specbuild writes them from speculation.guard)",
            "draft_len_schedule: 'batch size <= key uses value', smallest key == max_draft_len; exclusive "
            "with max_concurrency. The runtime floors K at min_runtime_draft_len: draft/target runs K=1 "
            "where the schedule says 0; Eagle3 one-model and NGram go to 0 (Eagle3 keeps its drafter warm)",
            "eagle_choices and num_eagle_layers are gone, spec_dec_variant is new (not written); no "
            "two-model path: eagle3_one_model: false raises",
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


def release_facts(version: str) -> list[tuple[str, str, Fact]]:
    """(topic, value, source) for every upstream fact specbuild writes for `version`."""
    rel = release(version)
    out: list[tuple[str, str, Fact]] = [("release pin", rel.version, rel.pin)]
    out.append(
        ("parser", f"{rel.parser.style}: {rel.parser.function} -> {rel.parser.args_class}", rel.parser.source)
    )
    for method, name in rel.methods.items():
        cls = rel.classes[name]
        spelled = f"{name} decoding_type {cls.decoding_type}" + (
            " (ClassVar)" if cls.classvar else " (field)"
        )
        fixed = rel.fixed.get(name)
        out.append((f"method {method}", spelled + (f", writes {fixed}" if fixed else ""), cls.source))
        keys = ", ".join(k for k in cls.keys if k != "decoding_type")
        out.append((f"{name} keys", keys, cls.fields_source or cls.source))
    for name in ("TorchLlmArgs", "KvCacheConfig"):
        out.append((f"{name} keys", ", ".join(rel.classes[name].keys), rel.classes[name].source))
    rule = rel.schedule
    floors = (
        "none (pre-fix)" if rule.floors is None else ", ".join(f"{m} {k}" for m, k in rule.floors.items())
    )
    out.append(("draft_len_schedule", f"{rule.style}; min_runtime_draft_len: {floors}", rule.source))
    out.append(
        (
            "kill switch",
            f"{rule.guard_window} / {rule.guard_threshold}",
            rel.classes[rel.methods["ngram"]].source,
        )
    )
    out.append(("two-model", ", ".join(rel.two_model) or "none", S.TWO_MODEL))
    out.append(("trtllm-serve flags", " ".join(rel.serve_flags), rel.serve_source))
    out.append(("image", rel.image, S.RELEASE_IMAGES))
    return out


# ---- methods on the LLM-API flow ----------------------------------------------------------------


@dataclass(frozen=True)
class Decoding:
    """How one speculation method is written as `speculative_config` (its class: `LlmApiRelease.methods`)."""

    # spec section field -> speculative_config key, copied when the section has the field
    section_keys: dict[str, str] = field(default_factory=dict)
    model_section: str | None = None  # the spec section whose folder becomes speculative_model
    # False: the PyTorch executor turns the overlap scheduler off for this mode by itself
    # (SpeculativeDecodingMode.support_overlap_scheduler), so the options say disable_overlap_scheduler
    overlap_scheduler: bool = True


# Each method's Decoding is the method's (core/methods/<method>.py `llmapi`; DECODINGS there).


def decoding_class(method: str, version: str) -> ConfigClass | None:
    """The config class `method` is written as on `version` (None: no LLM-API path)."""
    rel = LLMAPI_VERSIONS.get(str(version))
    return rel.method_class(method) if rel else None


def two_model(method: str, version: str) -> bool:
    """A separate draft model on this release (its own weights; the options disable the overlap scheduler
    as the two-model examples of the 1.2 line do)."""
    rel = LLMAPI_VERSIONS.get(str(version))
    return bool(rel) and method in rel.two_model


@dataclass(frozen=True)
class Support:
    """Whether a (method, flow, version) combination can be generated, and what to do instead."""

    ok: bool
    reason: str = ""
    alternative: str = ""  # the nearest supported combination, as a spec edit
    decoding_type: str | None = None  # llmapi flow: the speculative_config decoding_type


def engine_flow_version(version: str) -> bool:
    return parse_version(version)[:2] <= LAST_ENGINE_LINE


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
    if cls.decoding_type is not None:
        problems += [f"{prefix}{p}" for p in _schedule_problems(values, rel.schedule)]
    for key in cls.required:
        if key not in values:
            problems.append(
                f"{prefix}{key}: required by {cls.name} (its validator refuses the config without it)"
            )


def _schedule_problems(values: dict[str, Any], rule: ScheduleRule) -> list[str]:
    """The draft_len_schedule validators of the release (validate_draft_len_schedule_and_sort and, 1.3+,
    the max_concurrency exclusion)."""
    schedule, k = values.get("draft_len_schedule"), values.get("max_draft_len")
    if not isinstance(schedule, dict) or not schedule or not all(isinstance(n, int) for n in schedule):
        return []
    problems = []
    first = 1 if rule.style == "from" else min(schedule)
    if rule.style == "from" and 1 not in schedule:
        problems.append("draft_len_schedule: must include batch_size=1 (this release requires key 1)")
    elif isinstance(k, int) and schedule[first] != k:
        problems.append(
            f"draft_len_schedule[{first}] = {schedule[first]}, but max_draft_len = {k} (must be equal)"
        )
    if isinstance(k, int) and any(isinstance(v, int) and v > k for v in schedule.values()):
        problems.append(f"draft_len_schedule: a draft length above max_draft_len ({k})")
    if rule.exclusive and values.get("max_concurrency") is not None:
        problems.append("draft_len_schedule: exclusive with max_concurrency on this release (set one)")
    return problems


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
    if kind == "schedule":
        ok = (
            isinstance(value, dict)
            and value
            and all(
                isinstance(k, int) and isinstance(v, int) and not isinstance(v, bool)
                for k, v in value.items()
            )
            and all(k >= 1 and v >= 0 for k, v in value.items())
        )
        return None if ok else f"expected {{batch size >= 1: K >= 0}}, found {value!r}"
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
