"""Preflight rows about tokenizers: draft and target share one, and each fits its model's vocab."""

from __future__ import annotations

from specbuild.builder.check_rows import FAIL, PASS, WARN, CheckResult, LoadedModel
from specbuild.builder.tokenizer_compare import compare_tokenizers, read_tokenizer


def check_tokenizers(target: LoadedModel, draft: LoadedModel) -> list[CheckResult]:

    rows = []
    cmp = compare_tokenizers(target.folder, draft.folder)
    if cmp.status == "skipped":
        rows.append(
            CheckResult(
                "tokenizer",
                WARN,
                f"comparison skipped: {cmp.reason} (vocab sizes are still compared)",
                "add tokenizer.json / tokenizer_config.json (download the full model) to compare "
                "vocabularies",
            )
        )
    elif cmp.status == "different":
        rows.append(
            CheckResult(
                "tokenizer",
                FAIL,
                "draft and target tokenizers differ: " + " | ".join(cmp.differences),
                "use a draft trained with the target's tokenizer (same vocabulary, merges and special "
                "tokens)",
            )
        )
    else:
        info = read_tokenizer(target.folder)
        assert info is not None
        rows.append(
            CheckResult(
                "tokenizer",
                PASS,
                f"same vocabulary ({info.vocab_size} ids), merges ({len(info.merges)}), "
                f"added tokens ({len(info.added)}) and special-token ids",
            )
        )
    for m in (target, draft):
        info = read_tokenizer(m.folder)
        if info is not None and info.max_id >= m.config.vocab_size:
            rows.append(
                CheckResult(
                    f"{m.role}: tokenizer ids",
                    FAIL,
                    f"the tokenizer has ids up to {info.max_id} but vocab_size is {m.config.vocab_size}: "
                    "those tokens index past the embedding",
                    "use the tokenizer that was saved with this model",
                )
            )
    return rows
