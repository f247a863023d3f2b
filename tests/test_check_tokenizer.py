"""Tokenizer comparison from files: every kind of difference is found and named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from specbuild.builder.tokenizer_compare import compare_tokenizers, read_tokenizer


def copy_tok(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_identical_copies_are_same(tokenizer_dir, tmp_path):
    other = copy_tok(tokenizer_dir, tmp_path / "b")
    assert compare_tokenizers(tokenizer_dir, other).status == "same"
    info = read_tokenizer(tokenizer_dir)
    assert info.model_type == "BPE" and info.vocab_size == 384 and info.special["eos_token"] == ("</s>", 1)


def test_special_token_and_added_token_differences(tokenizer_dir, tmp_path):
    other = copy_tok(tokenizer_dir, tmp_path / "b")
    edit_json(other / "tokenizer_config.json", lambda d: d.update(eos_token="<pad>"))
    cmp = compare_tokenizers(tokenizer_dir, other)
    assert cmp.status == "different"
    assert "eos_token: target '</s>' (id 1) vs draft '<pad>' (id 2)" in cmp.differences

    third = copy_tok(tokenizer_dir, tmp_path / "c")
    edit_json(
        third / "tokenizer.json",
        lambda d: d["added_tokens"].append({"id": 384, "content": "<extra>", "special": True}),
    )
    cmp = compare_tokenizers(tokenizer_dir, third)
    assert cmp.status == "different" and any(
        "added tokens differ: 0 only in the target, 1 only in the draft" in d for d in cmp.differences
    )


def test_swapped_ids_and_merges(tokenizer_dir, tmp_path):
    other = copy_tok(tokenizer_dir, tmp_path / "b")

    def swap(d):
        vocab = d["model"]["vocab"]
        a, b = sorted(vocab, key=vocab.get)[100:102]
        vocab[a], vocab[b] = vocab[b], vocab[a]
        d["model"]["merges"] = d["model"]["merges"][::-1]

    edit_json(other / "tokenizer.json", swap)
    diffs = compare_tokenizers(tokenizer_dir, other).differences
    assert any("2 with other ids" in d for d in diffs)
    assert any(d.startswith("merges differ") and "first difference at #0" in d for d in diffs)


def test_unigram_vocab_and_missing_files(tmp_path):
    folder = tmp_path / "uni"
    folder.mkdir()
    (folder / "tokenizer.json").write_text(
        json.dumps({"model": {"type": "Unigram", "vocab": [["<unk>", 0.0], ["a", -1.0]]}, "added_tokens": []})
    )
    info = read_tokenizer(folder)
    assert info.vocab == {"<unk>": 0, "a": 1} and info.model_type == "Unigram"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert read_tokenizer(empty) is None
    cmp = compare_tokenizers(folder, empty)
    assert cmp.status == "skipped" and "draft" in cmp.reason
