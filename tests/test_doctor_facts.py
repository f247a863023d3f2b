"""`specbuild doctor --facts`: every upstream fact per targeted version with its source and status;
inferred ones marked. The facts module records a structured source for each
(core/facts/llmapi_sources.Fact)."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.core.facts.llmapi import LLMAPI_VERSIONS, release, release_facts
from specbuild.core.facts.llmapi_sources import INFERRED, VERIFIED, Fact


def test_every_recorded_fact_has_a_structured_source():
    for version in LLMAPI_VERSIONS:
        facts = release_facts(version)
        assert facts and all(isinstance(f, Fact) and f.status in (VERIFIED, INFERRED) for _, _, f in facts)
        assert all(f.repo and f.path and f.at for _, _, f in facts)
        rel = release(version)
        assert all(isinstance(c.source, Fact) for c in rel.classes.values())
    # 1.2.1: nothing of TensorRT-LLM was readable at the pinned commit, so every class fact is inferred
    assert all(f.status == INFERRED for topic, _, f in release_facts("1.2.1") if topic != "release pin")
    assert "ca88df0a400515b8206a19eb30cd047eb7661035" in release("1.2.1").pin.at


def test_doctor_facts_prints_them_per_version_inferred_marked():
    r = CliRunner().invoke(app, ["doctor", "--facts", "--version", "1.2.1"])
    assert r.exit_code == 0, r.output
    assert "TensorRT-LLM 1.2.1:" in r.output and "1.4.0rc4" not in r.output.split("\n")[0]
    assert "[INFERRED] method draft_target: DraftTargetDecodingConfig decoding_type DraftTarget" in r.output
    assert "[verified] release pin" in r.output and "code-index id 1090804222" in r.output
    r = CliRunner().invoke(app, ["doctor", "--facts", "--json"])
    rows = json.loads(r.stdout)
    assert set(rows) == {*LLMAPI_VERSIONS, "vllm==0.33.0", "sglang==0.5.23"}
    eagle = next(x for x in rows["1.4.0rc4"] if x["topic"] == "method eagle3")
    assert "Eagle3" in eagle["value"] and eagle["status"] == VERIFIED and "1.4.0rc4" in eagle["at"]
    assert any(x["topic"].startswith("Dynamo") and x["value"] == "none" for x in rows["1.2.1"])
    r = CliRunner().invoke(app, ["doctor", "--facts", "--version", "1.3.0"])
    assert r.exit_code != 0 and "no recorded facts for TensorRT-LLM 1.3.0" in r.output


def test_doctor_facts_lists_the_vllm_and_sglang_facts_deploy_writes_against():
    """Each with the wheel that pins the release (file + RECORD hash + wheel sha256); the image tags and
    the LWS SGLang pattern are inferred and say so."""
    from specbuild.core.facts import sglang as sglang_facts
    from specbuild.core.facts import vllm as vllm_facts

    for facts, package in (
        (vllm_facts.release_facts(), "vllm==0.33.0"),
        (sglang_facts.release_facts(), "sglang==0.5.23"),
    ):
        topics = {t for t, _, _ in facts}
        assert {"release", "medusa", "image"} <= topics
        for topic, value, fact in facts:
            assert isinstance(fact, Fact) and value
            if fact.status == VERIFIED and topic != "medusa":
                assert fact.repo == f"PyPI {package}" and "sha256" in fact.at and "sha256=" in fact.path
        assert any(f.inferred for t, _, f in facts if t == "image")
    vtopics = {t for t, _, _ in vllm_facts.release_facts()}
    assert {
        "rejection_sample_method",
        "draft_sample_method",
        "num_speculative_tokens_per_batch_size",
        "mtp",
        "refused keys",
        "draft_tensor_parallel_size",
        "EAGLE-3 aux-layer ids",
    } <= vtopics
    stopics = {t for t, _, _ in sglang_facts.release_facts()}
    assert {
        "--speculative-algorithm",
        "steps / topk / draft tokens",
        "--speculative-adaptive",
        "EAGLE-3 aux-layer ids",
        "NGRAM draft tokens",
        "multi-node",
    } <= stopics
    r = CliRunner().invoke(app, ["doctor", "--facts", "--version", "vllm==0.33.0"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("vLLM 0.33.0: ") and "TensorRT-LLM" not in r.output
    assert (
        "[verified] rejection_sample_method: standard | synthetic | block | fly, default standard" in r.output
    )
    assert "[INFERRED] image: vllm/vllm-openai:v0.33.0" in r.output
    r = CliRunner().invoke(app, ["doctor", "--facts", "--version", "sglang==0.5.23"])
    assert r.exit_code == 0 and r.output.startswith("SGLang 0.5.23: ")
    assert "[verified] --speculative-adaptive: EAGLE / EAGLE3 with topk 1 only" in r.output
