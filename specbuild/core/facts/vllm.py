"""Versioned vLLM facts: the `vllm serve` flags and `--speculative-config` keys of the vLLM release the
project emits commands for, read from that release's wheel (specbuild/data/vllm_<version>.json, written by
tools/vllm_facts.py; its `source` names the wheel and the hash of every file read).

Medusa: vLLM 0.32.0 is the last release with it (`"medusa"` in `SpeculativeMethod`,
vllm/config/speculative.py line 75 of vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl, sha256
5e2ecdc5b0baf72921c288486417ca82778456a448e4fe60b62ee43c0dfc8611, file RECORD hash
sha256=zhNWUaegND_1JvculUWTJhc3gWGr0DE11n7abeicYXw);
vLLM 0.33.0 has no "medusa" anywhere in its wheel (no file name, no string).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

VLLM_VERSION = "0.33.0"  # the vLLM release `specbuild deploy --engine vllm` writes commands for
MEDUSA_LAST_VERSION = "0.32.0"


@dataclass(frozen=True)
class VllmFacts:
    version: str
    serve_flags: frozenset[str]
    speculative_config_keys: frozenset[str]
    speculative_methods: tuple[str, ...]
    defaults: dict[str, Any]
    source: dict[str, Any]


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
    )


# The spec's method (its `mode:` value) -> vLLM's `method` in --speculative-config (each tested in
# tests/test_deploy.py against the release's SpeculativeMethod and key list).
VLLM_METHODS: dict[str, str] = {"draft_target": "draft_model", "ngram": "ngram", "eagle3": "eagle3"}
# Methods vLLM cannot run, with the reason (checked against the release's SpeculativeMethod).
VLLM_REFUSED: dict[str, str] = {
    "medusa": f"vLLM {VLLM_VERSION} has no Medusa (no 'medusa' in SpeculativeMethod nor anywhere in its "
    "wheel); "
    f"vLLM {MEDUSA_LAST_VERSION} was the last release with it"
}
