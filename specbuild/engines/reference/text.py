"""The engine's tokenizer, loaded once from the folder a build recorded (no torch here).

`ReferenceEngine.tokenizer` loads it through `load_tokenizer`; the local LLM-API model's Triton process,
which tokenizes prompts and detokenizes responses while its engine runs in a process of its own
(python_models/engine_common/engine_host.py), loads the same tokenizer the same way without loading the
model.
"""

from __future__ import annotations

from pathlib import Path

from specbuild.core.errors import EngineError


def load_tokenizer(tokenizer_dir: Path | None):
    """The Hugging Face tokenizer in `tokenizer_dir` (trust_remote_code off), or an EngineError that says
    which folder is missing or unreadable."""
    if tokenizer_dir is None:
        raise EngineError(
            "no tokenizer for this engine",
            expected="a build folder (tokenizer_dir) or a checkpoint converted by specbuild",
            found="no tokenizer_dir",
            fix="pass the `specbuild compile` output folder, or token ids instead of text",
        )
    if not tokenizer_dir.is_dir():
        raise EngineError(
            f"the engine's tokenizer folder {tokenizer_dir} does not exist",
            expected="the tokenizer folder the build recorded (its tokenizer_dir)",
            found="no such folder",
            fix="restore that folder, or re-run `specbuild compile` with the model folder in place",
        )
    # transformers takes ~2 s to import; engines that only ever see token ids (the Triton models) skip it.
    from transformers import AutoTokenizer  # noqa: PLC0415

    try:
        return AutoTokenizer.from_pretrained(str(tokenizer_dir), trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise EngineError(
            f"cannot load the tokenizer in {tokenizer_dir}",
            expected="tokenizer.json / tokenizer_config.json",
            found=" ".join(str(exc).split())[:300],
            fix="restore the tokenizer files, or re-run `specbuild compile`",
        ) from None


def decode(tokenizer, ids: list[int]) -> str:
    """The text of generated ids (special tokens skipped), as every output of the engine spells it."""
    return tokenizer.decode(ids, skip_special_tokens=True)
