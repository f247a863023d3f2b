"""Versioned vLLM facts: the `vllm serve` flags, the `--speculative-config` keys with their value lists,
defaults and bounds, and the speculation rules of the vLLM release the project writes commands for, read
from that release's wheel (specbuild/data/vllm_<version>.json, written by tools/vllm_facts.py; its
`source` names the wheel, its sha256 and the RECORD hash of every file read). Each fact specbuild writes
against is listed by `release_facts` with a `Fact` (core/facts/llmapi_sources.py): the wheel pins the
release, so these are verified; `specbuild doctor --facts` prints them.

Medusa: vLLM 0.32.0 is the last release with it (`"medusa"` in `SpeculativeMethod`,
vllm/config/speculative.py line 75 of vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl, sha256
5e2ecdc5b0baf72921c288486417ca82778456a448e4fe60b62ee43c0dfc8611, file RECORD hash
sha256=zhNWUaegND_1JvculUWTJhc3gWGr0DE11n7abeicYXw);
vLLM 0.33.0 has no "medusa" anywhere in its wheel (no file name, no string).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from specbuild.core.facts.llmapi_sources import INFERRED, VERIFIED, Fact, wheel_fact

VLLM_VERSION = "0.33.0"  # the vLLM release `specbuild deploy --engine vllm` writes commands for
MEDUSA_LAST_VERSION = "0.32.0"
MEDUSA_LAST = Fact(
    "PyPI vllm==0.32.0",
    "vllm/config/speculative.py (SpeculativeMethod, line 75; RECORD "
    "sha256=zhNWUaegND_1JvculUWTJhc3gWGr0DE11n7abeicYXw)",
    "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl sha256 "
    "5e2ecdc5b0baf72921c288486417ca82778456a448e4fe60b62ee43c0dfc8611",
    VERIFIED,
    '"medusa" is a SpeculativeMethod in 0.32.0; the 0.33.0 wheel has no "medusa" anywhere',
)
IMAGE_TAG = Fact(
    "hub.docker.com",
    "vllm/vllm-openai",
    "v<version>",
    INFERRED,
    "the release image's tag convention (the image was not pulled or read here)",
)


@dataclass(frozen=True)
class VllmFacts:
    version: str
    serve_flags: frozenset[str]
    speculative_config_keys: frozenset[str]
    speculative_methods: tuple[str, ...]
    defaults: dict[str, Any]
    source: dict[str, Any]
    fields: dict[str, dict[str, Any]]  # SpeculativeConfig field -> annotation, default, ge/gt
    literals: dict[str, tuple[str, ...]]  # RejectionSampleMethod, DraftSampleMethod, MTPModelTypes
    rejected_keys: dict[str, str]  # speculative-config key -> the error vLLM raises when it is set
    mtp: dict[str, Any]
    draft_tp: tuple[Any, ...]  # draft_tensor_parallel_size's allowed values (1, the target's TP)
    dynamic: dict[str, Any]  # num_speculative_tokens_per_batch_size's rules
    eagle3_layer_ids: dict[str, Any]

    def fact(self, path: str | list[str], note: str = "") -> Fact:
        """Where a fact of this release was read: the wheel pins the release."""
        return wheel_fact(self.source, path, note)

    def values(self, key: str) -> tuple[str, ...] | None:
        """The allowed values of a Literal-typed `--speculative-config` key (None: not a Literal)."""
        annotation = self.fields.get(key, {}).get("annotation", "")
        return self.literals.get(annotation) or (self.speculative_methods if key == "method" else None)


@cache
def vllm_facts(version: str = VLLM_VERSION) -> VllmFacts:
    raw = json.loads(resources.files("specbuild.data").joinpath(f"vllm_{version}.json").read_text())
    return VllmFacts(
        version=raw["version"],
        serve_flags=frozenset(raw["serve_flags"]),
        speculative_config_keys=frozenset(raw["speculative_config_keys"]),
        speculative_methods=tuple(raw["speculative_methods"]),
        defaults=dict(raw["defaults"]),
        source=dict(raw["source"]),
        fields=dict(raw["speculative_fields"]),
        literals={k: tuple(v) for k, v in raw["speculative_literals"].items()},
        rejected_keys=dict(raw["speculative_rejected_keys"]),
        mtp=dict(raw["mtp"]),
        draft_tp=tuple(raw["draft_tensor_parallel_size"]["allowed"]),
        dynamic=dict(raw["dynamic_speculation"]),
        eagle3_layer_ids=dict(raw["eagle3_layer_ids"]),
    )


# The spec's method -> vLLM's `method` in --speculative-config is each method's (core/methods: `vllm_method`,
# tested in tests/test_deploy.py against the release's SpeculativeMethod and key list).
# Methods vLLM cannot run, with the reason (checked against the release's SpeculativeMethod).
VLLM_REFUSED: dict[str, str] = {
    "medusa": f"vLLM {VLLM_VERSION} has no Medusa (no 'medusa' in SpeculativeMethod nor anywhere in its "
    "wheel); "
    f"vLLM {MEDUSA_LAST_VERSION} was the last release with it"
}
SPECULATIVE_FILE = "vllm/config/speculative.py"


def release_facts(
    version: str = VLLM_VERSION, writes: Mapping[str, str] | None = None
) -> list[tuple[str, str, Fact]]:
    """(topic, value, source) for every vLLM fact `deploy --engine vllm` writes against; `writes`: the
    methods' vLLM names (core/methods VLLM_METHODS), shown in the `method` row."""
    f = vllm_facts(version)
    fields = f.fields
    dyn = f.dynamic
    ids = f.eagle3_layer_ids
    spec_file = SPECULATIVE_FILE
    return [
        ("release", f"vllm=={f.version}", f.fact([spec_file], "the wheel pins the release")),
        (
            "vllm serve flags",
            f"{len(f.serve_flags)} flags, -sc/--speculative-config among them",
            f.fact(["vllm/engine/arg_utils.py", "vllm/entrypoints/common/cli_args.py"]),
        ),
        ("--speculative-config keys", ", ".join(sorted(f.speculative_config_keys)), f.fact(spec_file)),
        (
            "method",
            ", ".join((writes or {}).values()) + " (what specbuild writes)",
            f.fact(spec_file),
        ),
        (
            "rejection_sample_method",
            f"{' | '.join(f.literals['RejectionSampleMethod'])}, default "
            f"{fields['rejection_sample_method']['default']}",
            f.fact(spec_file),
        ),
        (
            "draft_sample_method",
            f"{' | '.join(f.literals['DraftSampleMethod'])}, default "
            f"{fields['draft_sample_method']['default']}",
            f.fact(spec_file),
        ),
        (
            "refused keys",
            "; ".join(f"{k}: {msg}" for k, msg in f.rejected_keys.items()),
            f.fact(spec_file, "_verify_args raises whenever the key is set"),
        ),
        (
            "mtp",
            f"method {f.mtp['method']}; the *_mtp names ({len(f.mtp['deprecated'])}) are deprecated and "
            "replaced by it",
            f.fact(spec_file),
        ),
        (
            "draft_tensor_parallel_size",
            " or ".join(str(v) for v in f.draft_tp)
            + f" (ge={fields['draft_tensor_parallel_size'].get('ge')})",
            f.fact(spec_file, "_verify_and_get_draft_tp"),
        ),
        (
            "num_speculative_tokens_per_batch_size",
            f"inclusive [start, end, K]; first start {dyn['first_start']}; sorted, non-overlapping; K >= "
            f"{dyn['k_min']}, {dyn['k_above_num_speculative_tokens']}; gaps and tail {dyn['gaps_and_tail']}; "
            "off with data parallel > 1; Model Runner V1 keeps it for " + ", ".join(dyn["v1_runner_methods"]),
            f.fact(dyn["read_from"]),
        ),
        (
            "EAGLE-3 aux-layer ids",
            f"read from the draft's config.json: {' then '.join(ids['keys_in_order'])}; default "
            f"{ids['default']}; {ids['meaning']}",
            f.fact(ids["read_from"]),
        ),
        ("medusa", f"none in {f.version}; last in {MEDUSA_LAST_VERSION}", MEDUSA_LAST),
        ("image", f"vllm/vllm-openai:v{f.version}", IMAGE_TAG),
    ]
