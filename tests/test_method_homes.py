"""Each method's own home (core/methods/<method>.py) is consistent with the facts it names: its section's
keys, its integer ranges, its LLM-API Decoding, its vLLM and SGLang names."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from specbuild.core.facts.llmapi import LLMAPI_VERSIONS, Flow
from specbuild.core.methods import METHODS, SGLANG_ALGORITHMS, VLLM_METHODS
from specbuild.core.methods.matrix import support

SECTIONED = [m for m in METHODS.values() if m.section is not None]


@pytest.mark.parametrize("method", SECTIONED, ids=lambda m: m.name)
def test_section_keys_ranges_and_model_key_are_fields_of_the_section(method):
    assert dataclasses.is_dataclass(method.section_type) and method.section_type.__dataclass_params__.frozen
    hints = typing.get_type_hints(method.section_type)
    for key in method.ranges:
        assert hints[key] is int, (method.name, key)  # a range bounds an integer key
    if method.model_key:
        assert hints[method.model_key] is str
    if method.llmapi is not None:
        assert set(method.llmapi.section_keys) <= set(hints), method.name
        if method.llmapi.model_section is not None:
            assert method.llmapi.model_section == method.section and method.model_key


@pytest.mark.parametrize("method", METHODS.values(), ids=lambda m: m.name)
def test_the_llmapi_decoding_is_where_the_matrix_says_yes(method):
    """A method with a Decoding is supported on a release exactly when the release has a class for it; a
    method without one is refused on every release with a reason."""
    for version, rel in LLMAPI_VERSIONS.items():
        found = support(method.name, Flow.LLMAPI, version)
        assert found.ok == (method.llmapi is not None and rel.method_class(method.name) is not None)
        assert found.ok or (found.reason and found.alternative)


def test_sglang_names_are_the_releases():
    from specbuild.core.facts.sglang import SGLANG_REFUSED, sglang_facts

    for name in METHODS:
        assert (name.value in SGLANG_ALGORITHMS) != (name.value in SGLANG_REFUSED), name
    assert set(SGLANG_ALGORITHMS.values()) <= set(sglang_facts().algorithm_names)
    assert set(VLLM_METHODS) | set(SGLANG_ALGORITHMS) <= {m.value for m in METHODS}
