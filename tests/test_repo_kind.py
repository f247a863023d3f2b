"""RepoKind (core/deployment.py): the four repository kinds answer what stages used to branch on."""

from __future__ import annotations

import pytest

from specbuild.core.deployment import RepoKind, kind_of_manifest
from specbuild.core.errors import SpecbuildError
from specbuild.core.facts.llmapi import Flow


def test_the_four_kinds():
    rows = {k: (k.flow, k.local, k.backend, k.stand_in, k.entry_model, k.interface) for k in RepoKind}
    assert rows == {
        RepoKind.ENGINE: (Flow.ENGINE, False, "tensorrtllm", None, "tensorrt_llm_bls", "bls"),
        RepoKind.ENGINE_LOCAL: (Flow.ENGINE, True, "python", "tensorrt_llm_local", "tensorrt_llm_bls", "bls"),
        RepoKind.LLMAPI: (Flow.LLMAPI, False, "llmapi", None, "tensorrt_llm", "llmapi"),
        RepoKind.LLMAPI_LOCAL: (
            Flow.LLMAPI,
            True,
            "llmapi-local",
            "tensorrt_llm_llmapi_local",
            "tensorrt_llm",
            "llmapi",
        ),
    }
    for kind in RepoKind:
        assert RepoKind.of_backend(kind.backend) is kind
        assert RepoKind.of(kind.flow, local=kind.local) is kind


def test_manifest_field_wins_and_older_manifests_read_backend():
    assert kind_of_manifest({"repo_kind": "llmapi-local", "backend": "llmapi-local"}) == (
        RepoKind.LLMAPI_LOCAL,
        True,
    )
    assert kind_of_manifest({"backend": "tensorrtllm"}) == (RepoKind.ENGINE, False)
    with pytest.raises(SpecbuildError, match="unknown repo_kind"):
        kind_of_manifest({"repo_kind": "gpu", "backend": "python"})
    with pytest.raises(SpecbuildError, match="unknown repository backend"):
        kind_of_manifest({"backend": "onnx"})


def test_stand_ins_are_shipped_python_models():
    from pathlib import Path

    import specbuild.model_repo as mr

    models = Path(mr.__file__).parent / "python_models"
    for kind in RepoKind:
        if kind.stand_in:
            assert (models / kind.stand_in / "model.py").is_file(), kind


def test_what_a_kind_offers_per_method():
    """K per request and a target-alone baseline: only where the BLS drives the rounds (draft/target and
    n-gram on the engine flow); a draft to time: draft/target's BLS repository only."""
    from specbuild.core.methods import METHODS, Method

    for kind in RepoKind:
        offers = {
            m.value: (kind.k_per_request(s), kind.has_baseline(s), kind.separate_draft(s))
            for m, s in METHODS.items()
        }
        if kind.llmapi:
            assert not any(any(v) for v in offers.values()), kind
        else:
            assert offers[Method.DRAFT_TARGET.value] == (True, True, True)
            assert offers[Method.NGRAM.value] == (True, True, False)
            assert offers[Method.MEDUSA.value] == (False, False, False)
    assert (
        RepoKind.of_interface("llmapi") is RepoKind.LLMAPI and RepoKind.of_interface("bls") is RepoKind.ENGINE
    )
