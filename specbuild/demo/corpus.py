"""The demo family's text: the Python standard library's own sources, split into training and held-out
files, encoded into one token stream and cut into training windows.

Shape legend: T sequence length.
"""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import torch

from specbuild.core.errors import SpecbuildError
from specbuild.demo.settings import HELD_OUT_EVERY, DemoSettings


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_split(settings: DemoSettings, *, stdlib: Path | None = None) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts): capped file prefixes in a fixed sorted order."""
    files = sorted((stdlib or stdlib_dir()).glob("*.py"))
    if len(files) < HELD_OUT_EVERY:
        raise SpecbuildError(
            "too few standard-library sources for the demo corpus",
            expected=f"at least {HELD_OUT_EVERY} .py files in {stdlib or stdlib_dir()}",
            found=f"{len(files)} files",
            fix="run the demo with a CPython that ships its standard library sources",
        )
    train: list[str] = []
    held: list[str] = []
    total = 0
    for i, path in enumerate(files):
        text = path.read_text(encoding="utf-8", errors="replace")[: settings.file_cap_bytes]
        if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1:
            held.append(text)
        elif total < settings.corpus_bytes:
            train.append(text[: settings.corpus_bytes - total])
            total += len(train[-1])
    return train, held


def encode_stream(tokenizer, texts: list[str]):
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer.encode(text + "\n\n", add_special_tokens=False))
    return torch.tensor(ids, dtype=torch.long)  # [N]


def windows(stream, n: int, length: int, generator):
    """n random windows of `length` tokens from a 1-D stream."""
    starts = torch.randint(0, len(stream) - length, (n,), generator=generator)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])  # [n, length]


def chunks(texts: list[str], size: int) -> list[str]:
    return [
        text[i : i + size] for text in texts for i in range(0, len(text), size) if text[i : i + size].strip()
    ]


def write_jsonl(path: Path, key: str, items: list[str]) -> None:
    path.write_text("".join(json.dumps({key: item}) + "\n" for item in items))
