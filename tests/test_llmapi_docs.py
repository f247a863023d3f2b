"""docs/llmapi.md's per-version table is the facts module's: what is written for each method on each
release, how the release parses it, and what it was verified against (core/facts/llmapi.py). Regenerate
the block with `python tests/test_llmapi_docs.py` after a facts change."""

from __future__ import annotations

from pathlib import Path

from specbuild.core.facts.llmapi import LLMAPI_VERSIONS, release
from specbuild.core.methods import DECODINGS

DOC = Path(__file__).resolve().parents[1] / "docs" / "llmapi.md"
BEGIN, END = "<!-- facts table: tests/test_llmapi_docs.py -->", "<!-- end facts table -->"


def render() -> str:
    rows = [
        "| release | method | `decoding_type` | class (`decoding_type` is a) | also written | parsed by | "
        "read in (status) |",
        "|---|---|---|---|---|---|---|",
    ]
    for version in LLMAPI_VERSIONS:
        rel = release(version)
        for method in DECODINGS:
            cls = rel.method_class(method)
            kind = "ClassVar, from_dict registry" if cls.classvar else "Literal field, discriminated union"
            fixed = (
                ", ".join(f"`{k}: {str(v).lower()}`" for k, v in rel.fixed.get(cls.name, {}).items()) or "—"
            )
            fn = rel.parser.function.split(":")[1]
            rows.append(
                f"| {version} | {method} | `{cls.decoding_type}` | `{cls.name}` ({kind}) | {fixed} | "
                f"`{fn}` → `TorchLlmArgs` | {cls.source.repo} `{cls.source.path}` @ {cls.source.at} "
                f"({cls.source.status}) |"
            )
    return "\n".join(rows)


def test_docs_table_is_the_facts_modules():
    text = DOC.read_text()
    assert BEGIN in text and END in text, "docs/llmapi.md lost its facts table markers"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == render(), "docs/llmapi.md's facts table is stale: python tests/test_llmapi_docs.py"


if __name__ == "__main__":
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    DOC.write_text(head + BEGIN + "\n" + render() + "\n" + END + rest.split(END, 1)[1])
