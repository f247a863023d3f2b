"""Read a tokenizer's identity from its files and compare two of them (draft vs target).

Draft/target decoding passes token ids between the models, so both must map every id to the same
string: same vocabulary, same merges, same added tokens and the same special-token ids. We compare the
`tokenizer.json` contents directly (JSON, no tokenizer is instantiated), and fall back to the
SentencePiece `tokenizer.model` bytes, then to transformers' `get_vocab()` (never trust_remote_code).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specbuild.core.formats.safe_io import InputFileError, read_bytes, read_json

SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")
SP_MODEL = "tokenizer.model"


@dataclass(frozen=True)
class TokenizerInfo:
    """What a tokenizer folder holds. `vocab` maps token -> id (base vocabulary plus added tokens)."""

    folder: Path
    source: str  # "tokenizer.json" | "tokenizer.model"
    class_name: str | None  # tokenizer_config.json tokenizer_class
    model_type: str | None  # BPE | Unigram | WordPiece | WordLevel (tokenizer.json)
    vocab: dict[str, int] = field(repr=False)
    merges: tuple[str, ...] = field(repr=False)
    added: tuple[tuple[int, str, bool], ...]  # (id, content, special)
    special: dict[str, tuple[str, int | None]]  # bos_token -> ("<s>", 1)
    sp_sha256: str | None = None  # SentencePiece model file hash when that is the source

    @property
    def vocab_size(self) -> int:
        """Number of distinct ids (what len(tokenizer) reports)."""
        ids = set(self.vocab.values()) | {i for i, _, _ in self.added}
        return len(ids)

    @property
    def max_id(self) -> int:
        return max(set(self.vocab.values()) | {i for i, _, _ in self.added}, default=-1)

    def summary(self) -> dict[str, Any]:
        return {
            "class": self.class_name,
            "source": self.source,
            "model": self.model_type,
            "vocab_size": self.vocab_size,
            "merges": len(self.merges),
            "added_tokens": len(self.added),
            "special_tokens": {k: {"token": t, "id": i} for k, (t, i) in self.special.items()},
        }


@dataclass(frozen=True)
class TokenizerComparison:
    status: str  # "same" | "different" | "skipped"
    differences: tuple[str, ...] = ()
    reason: str = ""  # why skipped


def read_tokenizer(folder: str | Path) -> TokenizerInfo | None:
    """None when the folder holds no tokenizer files (config-only folders)."""
    folder = Path(folder)
    config = _json(folder / "tokenizer_config.json") or {}
    class_name = config.get("tokenizer_class")
    if (folder / "tokenizer.json").is_file():
        raw = _json(folder / "tokenizer.json") or {}
        model = raw.get("model") or {}
        vocab = _vocab(model.get("vocab"))
        merges = tuple(m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or ())
        added = tuple(
            sorted(
                (int(t["id"]), str(t["content"]), bool(t.get("special")))
                for t in raw.get("added_tokens") or ()
            )
        )
        info = TokenizerInfo(
            folder, "tokenizer.json", class_name, model.get("type"), vocab, merges, added, {}
        )
    elif (folder / SP_MODEL).is_file():
        vocab, added = _vocab_via_transformers(folder)

        try:
            sha = hashlib.sha256(
                read_bytes(folder / SP_MODEL, kind="tokenizer", what="tokenizer.model")
            ).hexdigest()
        except InputFileError:  # not a regular file or too large: compared through the vocabulary only
            sha = None
        info = TokenizerInfo(folder, SP_MODEL, class_name, "SentencePiece", vocab, (), added, {}, sha)
    else:
        return None
    special = {
        key: (tok, _token_id(info, tok))
        for key in SPECIAL_KEYS
        if (tok := _special_text(config, folder, key))
    }
    return replace(info, special=special)


def compare_tokenizers(target_dir: str | Path, draft_dir: str | Path) -> TokenizerComparison:
    """Compare the draft's tokenizer with the target's; every difference is named."""
    target, draft = read_tokenizer(target_dir), read_tokenizer(draft_dir)
    missing = [name for name, info in (("target", target), ("draft", draft)) if info is None]
    if missing:
        return TokenizerComparison(
            "skipped", reason=f"no tokenizer files in the {' and '.join(missing)} folder"
        )
    assert target is not None and draft is not None
    diffs: list[str] = []
    if target.sp_sha256 and target.sp_sha256 == draft.sp_sha256:
        pass  # identical SentencePiece model: same pieces, same ids
    elif not target.vocab or not draft.vocab:
        diffs.append("the tokenizer files differ and could not be read to compare vocabularies")
    else:
        diffs += _vocab_diff(target.vocab, draft.vocab)
        diffs += _merges_diff(target.merges, draft.merges)
    diffs += _added_diff(target.added, draft.added)
    for key in sorted(set(target.special) | set(draft.special)):
        t, d = target.special.get(key), draft.special.get(key)
        if t != d:
            diffs.append(f"{key}: target {_fmt(t)} vs draft {_fmt(d)}")
    return TokenizerComparison("different" if diffs else "same", tuple(diffs))


# ---- differences ---------------------------------------------------------------------------------


def _vocab_diff(target: dict[str, int], draft: dict[str, int]) -> list[str]:
    if target == draft:
        return []
    only_t = [t for t in target if t not in draft]
    only_d = [t for t in draft if t not in target]
    moved = [t for t in target if t in draft and target[t] != draft[t]]
    parts = [f"vocabulary differs: target {len(target)} tokens, draft {len(draft)}"]
    if only_t:
        parts.append(f"{len(only_t)} only in the target (e.g. {only_t[0]!r})")
    if only_d:
        parts.append(f"{len(only_d)} only in the draft (e.g. {only_d[0]!r})")
    if moved:
        t = moved[0]
        parts.append(f"{len(moved)} with other ids (e.g. {t!r}: {target[t]} vs {draft[t]})")
    return ["; ".join(parts)]


def _merges_diff(target: tuple[str, ...], draft: tuple[str, ...]) -> list[str]:
    if target == draft:
        return []
    first = next(
        (i for i, (a, b) in enumerate(zip(target, draft, strict=False)) if a != b),
        min(len(target), len(draft)),
    )
    at = lambda m: repr(m[first]) if first < len(m) else "end"  # noqa: E731
    return [
        f"merges differ: target {len(target)}, draft {len(draft)}; first difference at #{first} "
        f"({at(target)} vs {at(draft)})"
    ]


def _added_diff(target: tuple, draft: tuple) -> list[str]:
    if target == draft:
        return []
    t, d = set(target), set(draft)
    example = sorted(t ^ d)[0]
    return [
        f"added tokens differ: {len(t - d)} only in the target, {len(d - t)} only in the draft (e.g. id "
        f"{example[0]} {example[1]!r})"
    ]


def _fmt(value: tuple[str, int | None] | None) -> str:
    return "none" if value is None else f"{value[0]!r} (id {value[1]})"


# ---- file reading --------------------------------------------------------------------------------


def _json(path: Path) -> Any:
    if not path.is_file():
        return None

    try:
        return read_json(path, kind="tokenizer")  # an object, or None below
    except InputFileError:  # unreadable, too large, not JSON: no tokenizer facts from this file
        return None


def _vocab(raw: Any) -> dict[str, int]:
    if isinstance(raw, dict):  # BPE / WordPiece / WordLevel: token -> id
        return {str(k): int(v) for k, v in raw.items()}
    if isinstance(raw, list):  # Unigram: [[piece, score], ...], id = position
        return {str(item[0]): i for i, item in enumerate(raw)}
    return {}


def _special_text(config: dict[str, Any], folder: Path, key: str) -> str | None:
    value = config.get(key)
    if value is None:
        value = (_json(folder / "special_tokens_map.json") or {}).get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return str(value) if value else None


def _token_id(info: TokenizerInfo, token: str) -> int | None:
    for i, content, _ in info.added:
        if content == token:
            return i
    return info.vocab.get(token)


def _vocab_via_transformers(folder: Path) -> tuple[dict[str, int], tuple[tuple[int, str, bool], ...]]:
    """SentencePiece-only folders: let transformers read the model (no remote code)."""
    try:
        # only SentencePiece-only folders need transformers (~2 s to import)
        from transformers import AutoTokenizer  # noqa: PLC0415

        tok = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
        added = tuple(
            sorted((int(i), str(t.content), bool(t.special)) for i, t in tok.added_tokens_decoder.items())
        )
        return dict(tok.get_vocab()), added
    except Exception:  # unreadable without extra packages: compare by file hash only
        return {}, ()
