"""Versioned TensorRT-LLM facts: everything that depends on which TensorRT-LLM release serves the engines.

One home for: the release line the engine flow targets, `SpeculativeDecodingMode` (TensorRT-LLM's
IntFlag, recorded as an int in an engine's `build_config`), the `trtllm-build` flags and their
accepted values (`specbuild/data/trtllm_build_flags.json`, read from TensorRT-LLM 1.x
`commands/build.py` and `plugin/plugin.py`), the `build_config` key each flag records and the
adjustments `build()` makes (`tensorrt_llm/builder.py` @ 008b2b8d23af, trtllm.md §1.2), the
defaults of flags left unset, the Triton inputs renamed with 0.20 (`min_length` -> `min_tokens`,
`random_seed` -> `seed`; tensorrtllm_backend templates, triton.md §1.1) and the NGC containers
that ship each release (triton.md §4.2).

`engine_limits` is the one computation of the limits an engine records, from TensorRT-LLM 1.2's
rules (`tensorrt_llm/builder.py` @008b2b8d23af: `_init_max_seq_len`, `check_max_num_tokens` in
`_common.py`, `build()`):
1. `max_input_len` is clipped to `max_seq_len`.
2. `check_max_num_tokens` (before any speculative change): `max_num_tokens` (CLI default 8192) is
   capped at `max_seq_len x max_batch_size`, then raised to `tokens_per_block` (context FMHA on);
   `opt_num_tokens` = min(max_batch_size x max_beam_width, max_num_tokens).
3. `build()` for a speculative engine: `max_seq_len += max_draft_len`, and `max_num_tokens` is raised
   to at least `max_batch_size x (max_draft_len + 1)`.
`prompt_limit` is the runtime's (`cpp/tensorrt_llm/batch_manager/trtGptModel.h`, TrtGptModel
constructor): with chunked context `max_seq_len - 1`; otherwise, with packed input and context FMHA
(both always on here), `min(max_seq_len - 1, max_num_tokens)` of the engine's recorded values.

`facts_for(version)` returns the facts of one release. Torch-free, no I/O at import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import IntFlag
from functools import lru_cache
from importlib import resources
from typing import Any

from specbuild.core.engine_limits import EngineLimits
from specbuild.core.errors import BuildError

DEFAULT_TRTLLM_VERSION = "1.2.1"  # the last release line with the convert -> trtllm-build engine flow
TRTLLM_BUILD = "trtllm-build"
RENAME_VERSION = (0, 20)  # first TensorRT-LLM release whose Triton templates say min_tokens / seed


def parse_version(text: object) -> tuple[int, ...]:
    """'1.2.1' -> (1, 2, 1); '1.0.3.2510' -> (1, 0, 3, 2510); stops at the first non-numeric piece."""
    parts = []
    for piece in str(text).split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():
            break
    return tuple(parts)


class SpeculativeDecodingMode(IntFlag):
    """`tensorrt_llm.models.modeling_utils.SpeculativeDecodingMode` (@ 01ea6d79d454, members in order of
    `auto()`): what an engine's `build_config.speculative_decoding_mode` records as an int."""

    NONE = 1
    DRAFT_TOKENS_EXTERNAL = 2
    MEDUSA = 4
    LOOKAHEAD_DECODING = 8
    EXPLICIT_DRAFT_TOKENS = 16
    EAGLE = 32

    @property
    def speculative(self) -> bool:
        return self is not SpeculativeDecodingMode.NONE

    @property
    def triton_decoding_mode(self) -> str:
        """The Triton `tensorrt_llm` model's `decoding_mode` parameter for an engine built this way."""
        return _DECODING_MODES.get(self, "top_k_top_p")

    @classmethod
    def from_cli(cls, name: str | None) -> SpeculativeDecodingMode:
        """The `--speculative_decoding_mode` string (None: no speculation), as from_arguments maps it."""
        return cls.NONE if name is None else cls[name.upper()]

    @classmethod
    def from_recorded(cls, value: Any) -> SpeculativeDecodingMode | None:
        """What an engine's build_config holds: the integer (trtllm-build), or a CLI name / None
        (folders written by specbuild before it recorded the integer). None when unreadable."""
        if value is None:
            return cls.NONE
        if isinstance(value, bool):
            return None
        if isinstance(value, int):  # one defined mode only (an IntFlag would also take unknown bits)
            return cls._value2member_map_.get(value)
        if isinstance(value, str):
            name = value.split(".")[-1].upper()  # also "SpeculativeDecodingMode.MEDUSA"
            if name.isdigit():
                return cls.from_recorded(int(name))
            return cls.__members__.get(name)
        return None

    @property
    def cli_name(self) -> str | None:
        return None if self is SpeculativeDecodingMode.NONE else self.name.lower()


# Triton `decoding_mode` values (triton.md §2.3): the C++ backend's names for the speculative modes.
_DECODING_MODES = {
    SpeculativeDecodingMode.MEDUSA: "medusa",
    SpeculativeDecodingMode.EAGLE: "eagle",
    SpeculativeDecodingMode.LOOKAHEAD_DECODING: "lookahead",
    SpeculativeDecodingMode.EXPLICIT_DRAFT_TOKENS: "redrafter",
}


@dataclass(frozen=True)
class TritonInputNames:
    """The Triton inputs whose names depend on the TensorRT-LLM release."""

    min_tokens: str  # "min_tokens" (>= 0.20) | "min_length"
    seed: str  # "seed" (>= 0.20) | "random_seed"


MODERN_NAMES = TritonInputNames(min_tokens="min_tokens", seed="seed")
LEGACY_NAMES = TritonInputNames(min_tokens="min_length", seed="random_seed")


# ---- releases and their NGC Triton containers (specbuild/data/trtllm_containers.json, with sources) ----


@dataclass(frozen=True)
class Containers:
    version: str  # TensorRT-LLM version, e.g. "1.2.1"
    tags: tuple[str, ...]  # NGC tritonserver tags (yy.mm), oldest first
    default: str  # the tag used unless --container-tag says otherwise


@lru_cache(maxsize=1)
def _containers_table() -> dict[str, Containers]:
    raw = json.loads(resources.files("specbuild.data").joinpath("trtllm_containers.json").read_text())[
        "versions"
    ]
    return {v: Containers(v, tuple(d["tags"]), d.get("default", d["tags"][-1])) for v, d in raw.items()}


def known_versions() -> tuple[str, ...]:
    """The released TensorRT-LLM versions the spec loader accepts (each has a serving container)."""
    return tuple(_containers_table())


def containers(version: str) -> Containers | None:
    return _containers_table().get(str(version))


# ---- trtllm-build: flags, what build_config records, defaults ------------------------------------


@dataclass(frozen=True)
class BuildFlag:
    """One trtllm-build flag and where the engine's config.json records it (None: not recorded)."""

    flag: str
    config_key: str | None  # "max_seq_len", or "plugin_config.gemm_plugin" for plugin flags


# The flags specbuild passes, in argv order, each with the build_config key it lands in. argv and the
# recorded build_config are both generated from this one list (engines/trtllm/plan.py).
BUILD_FLAGS: tuple[BuildFlag, ...] = (
    BuildFlag("--checkpoint_dir", None),
    BuildFlag("--output_dir", None),
    BuildFlag("--gemm_plugin", "plugin_config.gemm_plugin"),
    BuildFlag("--gpt_attention_plugin", "plugin_config.gpt_attention_plugin"),
    BuildFlag("--max_batch_size", "max_batch_size"),
    BuildFlag("--max_input_len", "max_input_len"),
    BuildFlag("--max_seq_len", "max_seq_len"),
    BuildFlag("--max_beam_width", "max_beam_width"),
    BuildFlag("--kv_cache_type", "kv_cache_type"),
    BuildFlag("--use_paged_context_fmha", "plugin_config.use_paged_context_fmha"),
    BuildFlag("--remove_input_padding", "plugin_config.remove_input_padding"),
    BuildFlag("--context_fmha", "plugin_config.context_fmha"),
    BuildFlag("--workers", None),
    BuildFlag("--max_num_tokens", "max_num_tokens"),
    BuildFlag("--speculative_decoding_mode", "speculative_decoding_mode"),
    BuildFlag("--max_draft_len", "max_draft_len"),
    BuildFlag("--gather_generation_logits", "gather_generation_logits"),
)


DEFAULT_MAX_NUM_TOKENS = 8192  # trtllm-build --max_num_tokens default (BuildConfig.max_num_tokens)
TOKENS_PER_BLOCK = 32  # the 1.x PluginConfig default, recorded in build_config.plugin_config
MAX_BEAM_WIDTH = 1  # speculative decoding is beam-free in TensorRT-LLM


def engine_limits(
    *,
    max_batch_size: int,
    max_input_len: int,
    max_seq_len: int,
    max_num_tokens: int | None,
    max_draft_len: int,
    speculative: bool,
) -> dict[str, int]:
    """max_input_len, max_seq_len, max_num_tokens and opt_num_tokens as the built engine records them.

    `max_seq_len` is the value passed to trtllm-build (before the speculative increase).
    """
    input_len = min(max_input_len, max_seq_len)
    tokens = DEFAULT_MAX_NUM_TOKENS if max_num_tokens is None else max_num_tokens
    tokens = min(tokens, max_seq_len * max_batch_size)
    tokens = max(tokens, TOKENS_PER_BLOCK)  # context FMHA on
    opt = min(max_batch_size * MAX_BEAM_WIDTH, tokens)
    seq = max_seq_len
    if speculative:
        seq += max_draft_len
        tokens = max(tokens, max_batch_size * (max_draft_len + 1))
    return {"max_input_len": input_len, "max_seq_len": seq, "max_num_tokens": tokens, "opt_num_tokens": opt}


def prompt_limit(build_config: dict[str, Any], *, enable_chunked_context: bool) -> int:
    """The longest prompt (tokens) the runtime accepts for an engine with this build_config (the one
    rule lives in core/engine_limits.py, which the serving side and the vendored BLS use too)."""
    return EngineLimits.from_build_config(
        build_config, enable_chunked_context=enable_chunked_context
    ).max_input_len


@dataclass(frozen=True)
class TrtllmFacts:
    """The facts of one TensorRT-LLM release."""

    version: str
    input_names: TritonInputNames
    containers: Containers | None  # the NGC tritonserver <yy.mm>-trtllm-python-py3 images that ship it
    default_max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS  # trtllm-build --max_num_tokens when unset
    tokens_per_block: int = (
        TOKENS_PER_BLOCK  # PluginConfig default of 1.x, recorded in build_config.plugin_config
    )

    @property
    def build_flags(self) -> dict[str, Any]:
        """flag -> "int" | "path" | "str" | "bool" (store_true) | [accepted values] (1.x build.py)."""
        return _accepted_flags()

    def recorded_defaults(self) -> dict[str, Any]:
        """build_config values of the flags specbuild leaves unset (BuildConfig defaults)."""
        return {
            "gather_context_logits": False,
            "gather_generation_logits": False,
            "speculative_decoding_mode": SpeculativeDecodingMode.NONE,
            "max_draft_len": 0,
            "plugin_config.paged_kv_cache": True,
            "plugin_config.tokens_per_block": self.tokens_per_block,
        }


def facts_for(version: str | None = None) -> TrtllmFacts:
    """The facts of a TensorRT-LLM version (None: DEFAULT_TRTLLM_VERSION)."""
    version = version or DEFAULT_TRTLLM_VERSION
    parsed = parse_version(version)
    return TrtllmFacts(
        version=version,
        input_names=MODERN_NAMES if parsed >= RENAME_VERSION else LEGACY_NAMES,
        containers=containers(version),
    )


@lru_cache(maxsize=1)
def _accepted_flags() -> dict[str, Any]:
    text = resources.files("specbuild.data").joinpath("trtllm_build_flags.json").read_text()
    return json.loads(text)["flags"]


def build_argv(values: list[tuple[str, Any]], facts: TrtllmFacts) -> list[str]:
    """trtllm-build argv from (flag, python value) pairs; a None value leaves the flag out.

    bool values: store_true flags appear only when True; enable/disable features get enable|disable.
    SpeculativeDecodingMode values become their CLI name.
    """
    flags = facts.build_flags
    argv = [TRTLLM_BUILD]
    for flag, value in values:
        if value is None or (isinstance(value, SpeculativeDecodingMode) and not value.speculative):
            continue
        kind = flags.get(flag)
        if kind == "bool":
            if value:
                argv.append(flag)
            continue
        if isinstance(value, bool):
            value = "enable" if value else "disable"
        elif isinstance(value, SpeculativeDecodingMode):
            value = value.cli_name
        argv += [flag, str(value)]
    validate_argv(argv, flags)
    return argv


def recorded_build_config(values: list[tuple[str, Any]], facts: TrtllmFacts) -> dict[str, Any]:
    """The engine config.json `build_config` trtllm-build writes for these flag values (trtllm.md §1.2).

    Unset flags take `recorded_defaults`; the limits follow `engine_limits` (trtllm-build's own rules).
    kv_cache_type is recorded as its enum name, the mode as TensorRT-LLM's int.
    """
    by_flag = {f.flag: f.config_key for f in BUILD_FLAGS}
    flat: dict[str, Any] = dict(facts.recorded_defaults())
    for flag, value in values:
        key = by_flag[flag]
        if key is not None and value is not None:
            flat[key] = value
    mode = SpeculativeDecodingMode(flat["speculative_decoding_mode"])
    k = int(flat["max_draft_len"]) if mode.speculative else 0
    given = dict(values).get("--max_num_tokens")  # None: trtllm-build's default, before its own limits
    flat.update(
        engine_limits(
            max_batch_size=int(flat["max_batch_size"]),
            max_input_len=int(flat["max_input_len"]),
            max_seq_len=int(flat["max_seq_len"]),
            max_num_tokens=given,
            max_draft_len=k,
            speculative=mode.speculative,
        )
    )
    flat["max_draft_len"] = k
    flat["speculative_decoding_mode"] = int(mode)
    if "kv_cache_type" in flat:
        flat["kv_cache_type"] = str(flat["kv_cache_type"]).upper()
    out: dict[str, Any] = {}
    for key, value in flat.items():
        head, _, leaf = key.partition(".")
        if leaf:
            out.setdefault(head, {})[leaf] = value
        else:
            out[key] = value
    return out


def validate_argv(argv: list[str] | tuple[str, ...], flags: dict[str, Any] | None = None) -> None:
    """Every flag must be one trtllm-build 1.x accepts, with a value of the right kind."""
    flags = flags or _accepted_flags()
    if not argv or argv[0] != TRTLLM_BUILD:
        raise BuildError(
            "not a trtllm-build command", expected=TRTLLM_BUILD, found=str(argv[:1]), fix="report this bug"
        )
    i = 1
    while i < len(argv):
        flag = argv[i]
        if flag not in flags:
            raise BuildError(
                f"trtllm-build does not accept {flag}",
                expected="a flag of TensorRT-LLM 1.2.x build.py",
                found=flag,
                fix="report this bug",
            )
        kind = flags[flag]
        if kind == "bool":
            i += 1
            continue
        if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
            raise BuildError(
                f"{flag} needs a value", expected=str(kind), found="nothing", fix="report this bug"
            )
        value = argv[i + 1]
        ok = value in kind if isinstance(kind, list) else (value.isdigit() if kind == "int" else bool(value))
        if not ok:
            expected = " | ".join(kind) if isinstance(kind, list) else kind
            raise BuildError(
                f"trtllm-build {flag} does not accept {value!r}",
                expected=expected,
                found=value,
                fix="report this bug",
            )
        i += 2


# ---- trtllm-serve's Prometheus names for speculative decoding ------------------------------------
# tensorrt_llm/metrics/collector.py (post-1.3, read in the code index as id 56480326944; not on 1.2.1,
# whose trtllm-serve exports none of them): per-request counters with a 0-based `token_position` label,
# per-iteration totals and the iteration's acceptance length (a gauge). The local engine models export
# them through Triton's custom-metrics API (pb_utils.MetricFamily, Python backend 2.51), so a dashboard
# built on trtllm-serve reads the local server too. Triton's custom metrics appear under exactly these
# names (no `_total` suffix is added, unlike prometheus_client), so the counters carry it in the name.
PROMETHEUS_SPEC_DECODE = {
    "num_draft_tokens": "trtllm_spec_decode_num_draft_tokens_total",  # Counter (iteration stats)
    "num_accepted_tokens": "trtllm_spec_decode_num_accepted_tokens_total",  # Counter (iteration stats)
    "acceptance_length": "trtllm_spec_decode_acceptance_length",  # Gauge: the last iteration's value
    "drafted_per_position": "trtllm_spec_decode_drafted_tokens_total",  # Counter{token_position}
    "accepted_per_position": "trtllm_spec_decode_accepted_tokens_total",  # Counter{token_position}
}
PROMETHEUS_POSITION_LABEL = "token_position"
# specbuild's addition (trtllm-serve exports no step count; vLLM's analogue is
# vllm:spec_decode_num_drafts): verification steps, so 1 + accepted / steps is the mean acceptance length.
PROMETHEUS_SPEC_STEPS = "specbuild_spec_decode_num_steps_total"
