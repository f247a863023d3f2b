"""`specbuild doctor --facts`: every upstream fact per targeted version with its source and status;
inferred ones marked. The facts module records a structured source for each (core/facts/llmapi_sources.Fact)."""

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
    assert set(rows) == set(LLMAPI_VERSIONS)
    eagle = next(x for x in rows["1.4.0rc4"] if x["topic"] == "method eagle3")
    assert "Eagle3" in eagle["value"] and eagle["status"] == VERIFIED and "1.4.0rc4" in eagle["at"]
    assert any(x["topic"].startswith("Dynamo") and x["value"] == "none" for x in rows["1.2.1"])
    r = CliRunner().invoke(app, ["doctor", "--facts", "--version", "1.3.0"])
    assert r.exit_code != 0 and "no recorded facts for TensorRT-LLM 1.3.0" in r.output
