"""docs/deploy.md's per-engine table is the facts modules': for each engine and release, what `specbuild
deploy` writes or follows and where it was read (core/facts/deploy_sources.py, core/facts/vllm.py,
core/facts/sglang.py, deploy/dynamo.py's pairing). Regenerate the block with `python
tests/test_deploy_docs.py` after a facts change."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "deploy.md"
BEGIN, END = "<!-- deploy facts table: tests/test_deploy_docs.py -->", "<!-- end deploy facts table -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render() -> str:
    from specbuild.core.facts import sglang as sglang_facts
    from specbuild.core.facts import vllm as vllm_facts
    from specbuild.core.facts.deploy_sources import triton_facts
    from specbuild.core.methods import SGLANG_ALGORITHMS, VLLM_METHODS
    from specbuild.deploy.dynamo import DYNAMO_TRTLLM, PAIRING_SOURCE

    groups = [
        ("Triton + TensorRT-LLM (`triton`)", "1.2.1", triton_facts()),
        ("vLLM (`vllm`)", vllm_facts.VLLM_VERSION, vllm_facts.release_facts(writes=VLLM_METHODS)),
        (
            "SGLang (`sglang`)",
            sglang_facts.SGLANG_VERSION,
            sglang_facts.release_facts(writes=SGLANG_ALGORITHMS),
        ),
        (
            "NVIDIA Dynamo (`dynamo`)",
            "runtime images",
            [
                (
                    "image -> TensorRT-LLM",
                    ", ".join(f"{k}: {v}" for k, v in DYNAMO_TRTLLM.items()),
                    PAIRING_SOURCE,
                )
            ],
        ),
    ]
    rows = ["| engine | release | topic | written / followed | read from (status) |", "|---|---|---|---|---|"]
    for engine, release, facts in groups:
        for topic, value, fact in facts:
            path = re.sub(r" \(sha256=[^)]*\)", "", fact.path)  # the RECORD hashes: in the data file
            where = f"{_cell(fact.repo)} `{_cell(path)}` @ {_cell(fact.at)} ({fact.status})"
            rows.append(f"| {engine} | {release} | {_cell(topic)} | {_cell(value)} | {where} |")
    return "\n".join(rows)


def test_docs_table_is_the_facts_modules():
    text = DOC.read_text()
    assert BEGIN in text and END in text, "docs/deploy.md lost its facts table markers"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == render(), "docs/deploy.md's facts table is stale: python tests/test_deploy_docs.py"


if __name__ == "__main__":
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    DOC.write_text(head + BEGIN + "\n" + render() + "\n" + END + rest.split(END, 1)[1])
