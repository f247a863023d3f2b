"""mode: ngram in the spec: the `ngram:` section means TensorRT-LLM's NGramDecodingConfig (defaults,
validation), K lives in speculation.max_draft_len, and the build is one draft_tokens_external engine."""

from __future__ import annotations

import pytest

from specbuild.core.errors import SpecError
from specbuild.core.facts.trtllm import SpeculativeDecodingMode
from specbuild.core.methods import METHODS, Method, Tunable, method_of
from specbuild.core.spec import NGramSection, spec_from_dict

BASE = {"name": "n", "mode": "ngram", "target": {"model": "target"}}


def spec(**extra):
    return spec_from_dict({**BASE, **extra})


def test_section_may_be_left_out_and_gets_upstreams_defaults():
    s = spec()
    # NGramDecodingConfig (llm_args.py, 1.2 line and newest): max_matching_ngram_size 2, the flags True
    assert s.ngram == NGramSection(2, True, True, True)
    assert s.to_dict()["ngram"] == {
        "max_matching_ngram_size": 2,
        "is_keep_all": True,
        "is_use_oldest": True,
        "is_public_pool": True,
    }
    assert spec(ngram=None).ngram == NGramSection()


def test_default_k_follows_upstreams_auto_heuristic():
    # auto_heuristic.suggest_spec_config: 5 up to batch 4, else 3
    assert spec(build={"max_batch_size": 4}).speculation.max_draft_len == 5
    assert spec(build={"max_batch_size": 5}).speculation.max_draft_len == 3
    assert spec(speculation={"max_draft_len": 7}).speculation.max_draft_len == 7


def test_section_values_are_read():
    s = spec(ngram={"max_matching_ngram_size": 4, "is_keep_all": False, "is_use_oldest": False})
    assert s.ngram == NGramSection(4, False, False, True)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"ngram": {"max_matching_ngram_size": 0}}, "ngram.max_matching_ngram_size"),
        ({"ngram": {"max_matching_ngram_size": 65}}, "ngram.max_matching_ngram_size"),
        ({"speculation": {"max_draft_len": 0}}, "speculation.max_draft_len"),  # upstream: must be > 0
        ({"speculation": {"use_logits": True}}, "speculation.use_logits"),  # no draft distribution
        ({"draft": {"model": "d"}}, "draft"),
        ({"medusa": {"heads": "h"}}, "medusa"),
    ],
)
def test_impossible_values_are_refused(extra, key):
    with pytest.raises(SpecError) as info:
        spec(**extra)
    assert f"impossible value for {key}" in info.value.what and info.value.fix


def test_wrong_types_and_typos_in_the_section():
    with pytest.raises(SpecError, match="ngram.is_keep_all has the wrong type"):
        spec(ngram={"is_keep_all": "yes"})
    with pytest.raises(SpecError) as info:
        spec(ngram={"max_matching_ngram": 3})
    assert info.value.fix == "did you mean 'ngram.max_matching_ngram_size'?"


def test_other_methods_refuse_the_ngram_section():
    with pytest.raises(SpecError, match="impossible value for ngram"):
        spec_from_dict({**BASE, "mode": "draft_target", "draft": {"model": "d"}, "ngram": {}})


def test_one_engine_that_verifies_external_drafts():
    s = spec(speculation={"max_draft_len": 4})
    method = method_of(s)
    assert s.mode is Method.NGRAM and METHODS[Method.NGRAM] is method
    (target,) = method.roles(s)  # no draft engine, so no draft KV cache in the memory plan
    assert (target.role, target.mode, target.max_draft_len) == (
        "target",
        SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL,
        4,
    )
    assert not target.gather_generation_logits and target.heads is None
    assert method.bls_drives_loop and method.has_baseline and not method.draft_model


def test_tune_edits_k_and_the_ngram_size():
    assert Tunable.NGRAM.assignments(
        {"speculation.max_draft_len": 4, "ngram.max_matching_ngram_size": 3}
    ) == [
        ("speculation", "max_draft_len", 4),
        ("ngram", "max_matching_ngram_size", 3),
    ]
    assert Tunable.DRAFT_LEN.assignments(5) == [("speculation", "max_draft_len", 5)]
