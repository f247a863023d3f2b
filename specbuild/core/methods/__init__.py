"""The speculation methods: `Method` (what a spec's `mode:` names) and the registry of method objects.

Stages ask `method_of(spec)` (a `SpeculationMethod`, methods/base.py) instead of comparing names.
Registering a method is the three marked lines below; docs/architecture.md lists what else to add.
"""

from __future__ import annotations

import difflib
from enum import Enum
from typing import TYPE_CHECKING

from specbuild.core.errors import SpecError
from specbuild.core.facts.llmapi import Decoding
from specbuild.core.facts.trtllm import SpeculativeDecodingMode
from specbuild.core.methods.base import EngineRole, SpeculationMethod, Tunable, resolve_name
from specbuild.core.methods.draft_target import DRAFT_TARGET  # registration
from specbuild.core.methods.eagle3 import EAGLE3  # registration
from specbuild.core.methods.medusa import MEDUSA  # registration
from specbuild.core.methods.ngram import NGRAM  # registration

if TYPE_CHECKING:
    from specbuild.core.spec import BuildSpec

__all__ = [
    "DECODINGS",
    "EngineRole",
    "METHODS",
    "Method",
    "SGLANG_ALGORITHMS",
    "SpeculationMethod",
    "Tunable",
    "VLLM_METHODS",
    "method_of",
    "resolve_name",
]


class Method(str, Enum):
    """A spec's `mode:`; its value is what the YAML, manifests and Triton parameters say."""

    DRAFT_TARGET = DRAFT_TARGET.name  # registration
    MEDUSA = MEDUSA.name  # registration
    NGRAM = NGRAM.name  # registration
    EAGLE3 = EAGLE3.name  # registration

    def __str__(self) -> str:
        return self.value


METHODS: dict[Method, SpeculationMethod] = {
    Method(m.name): m
    for m in (DRAFT_TARGET, MEDUSA, NGRAM, EAGLE3)  # registration
}
SECTIONS: tuple[str, ...] = tuple(
    m.section for m in METHODS.values() if m.section
)  # method-owned spec sections
# What each method is called elsewhere, asked of the methods (method name -> ...): the LLM API's Decoding,
# vLLM's `method`, SGLang's --speculative-algorithm; a method that engine cannot run is left out.
DECODINGS: dict[str, Decoding] = {m.name: m.llmapi for m in METHODS.values() if m.llmapi}
VLLM_METHODS: dict[str, str] = {m.name: m.vllm_method for m in METHODS.values() if m.vllm_method}
SGLANG_ALGORITHMS: dict[str, str] = {
    m.name: m.sglang_algorithm for m in METHODS.values() if m.sglang_algorithm
}


def parse_method(value: object, *, where: str = "<spec>") -> Method:
    """A Method from its name, with a "did you mean" for a typo."""
    if isinstance(value, Method):
        return value
    try:
        return Method(str(value))
    except ValueError:
        names = [m.value for m in Method]
        close = difflib.get_close_matches(str(value), names, n=1)
        raise SpecError(
            f"{where}: impossible value for mode (not a speculation method)",
            expected=" | ".join(names),
            found=repr(value),
            fix=f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(names)}",
        ) from None


def method_of(value: Method | str | BuildSpec) -> SpeculationMethod:
    """The method object of a Method, its name, or a spec."""
    mode = getattr(value, "mode", value)
    return METHODS[parse_method(mode)]


def engine_speculator(mode: SpeculativeDecodingMode) -> SpeculationMethod | None:
    """The method whose engine speculates by itself when built with `mode` (Medusa for MEDUSA);
    None when the engine only verifies what a BLS drafts (draft_tokens_external) or does not speculate."""
    found = [m for m in METHODS.values() if m.target_mode == mode and not m.bls_drives_loop]
    return found[0] if len(found) == 1 else None
