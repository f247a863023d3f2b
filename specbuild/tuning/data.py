"""Training and profiling text: read prompts/documents, self-distill, pack into token windows.

Shape legend: N windows, T tokens per window.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specbuild.core.errors import TrainingError
from specbuild.core.formats.safe_io import InputFileError, read_text
from specbuild.tuning.progress import Reporter

JSONL_FIELDS = ("text", "prompt")


def read_texts(path: str | Path) -> list[str]:
    """Documents of a .jsonl file (field "text" or "prompt") or a text file (one per non-empty line)."""
    path = Path(path)
    if not path.is_file():
        raise TrainingError(
            f"data file {path} not found",
            expected="a .txt or .jsonl file",
            found="no such file",
            fix="check --data / --prompts",
        )

    try:
        lines = read_text(path, kind="text", what="text file").splitlines()
    except InputFileError as exc:
        raise TrainingError(exc.what, expected=exc.expected, found=exc.found, fix=exc.fix) from None
    if path.suffix == ".jsonl":
        texts = [_jsonl_text(line, path, n) for n, line in enumerate(lines, 1) if line.strip()]
    else:
        texts = [line for line in lines if line.strip()]
    if not texts:
        raise TrainingError(
            f"{path} holds no text",
            expected="at least one non-empty line",
            found="an empty file",
            fix="add prompts or documents",
        )
    return texts


def _jsonl_text(line: str, path: Path, n: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TrainingError(
            f"{path}:{n}: not valid JSON",
            expected="one JSON object per line",
            found=str(exc),
            fix="fix that line",
        ) from None
    for key in JSONL_FIELDS:
        if isinstance(record, dict) and isinstance(record.get(key), str):
            return record[key]
    raise TrainingError(
        f"{path}:{n}: no text field",
        expected='an object with "text" or "prompt" (a string)',
        found=line[:80],
        fix='write {"text": "..."} per line',
    )


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    return [list(tokenizer(t, add_special_tokens=True)["input_ids"]) for t in texts]


def greedy_continuations(
    model,
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    eos_ids: tuple[int, ...],
    batch_size: int = 8,
    on_batch: Callable[[int], None] | None = None,
) -> list[list[int]]:
    """prompt + the base model's greedy continuation, for each prompt (HF model, batched, left-padded)."""
    device = next(model.parameters()).device
    pad = eos_ids[0] if eos_ids else 0
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        width = max(len(p) for p in batch)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)  # [b, width]
        mask = torch.tensor(
            [[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device
        )  # [b, width]
        with torch.no_grad():
            gen = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad,
                eos_token_id=list(eos_ids) or None,
            )  # [b, width + new]
        for p, row in zip(batch, gen[:, width:].tolist(), strict=True):
            new = []
            for tok in row:
                new.append(tok)
                if tok in eos_ids:
                    break
            out.append(p + new)
        if on_batch:
            on_batch(len(batch))
    return out


def pack_windows(sequences: list[list[int]], *, seq_len: int, separator: int | None, min_len: int):
    """Concatenate sequences (separated by EOS) and cut the stream into windows -> LongTensor [N, T].

    A stream shorter than seq_len becomes one shorter window; otherwise the tail that does not fill a
    window is dropped.
    """
    stream: list[int] = []
    for seq in sequences:
        stream.extend(seq)
        if separator is not None and (not seq or seq[-1] != separator):
            stream.append(separator)
    if len(stream) < min_len:
        raise TrainingError(
            "not enough training text",
            expected=f"at least {min_len} tokens (num_heads + 2, plus room to learn)",
            found=f"{len(stream)} tokens",
            fix="add more text to --data",
        )
    t = min(seq_len, len(stream))
    n = len(stream) // t
    return torch.tensor(stream[: n * t], dtype=torch.long).view(n, t)  # [N, T]


def split_heldout(windows, *, fraction: float, seed: int):
    """Seeded shuffle, then (train [N-n, T], heldout [n, T]); n >= 1 when there are 2+ windows."""
    n = windows.shape[0]
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    k = 0 if n < 2 else max(1, round(n * fraction))
    return windows[perm[k:]], windows[perm[:k]]


def regenerated(
    base,
    prompts: list[list[int]],
    *,
    key: object,
    cache_dir: Path | None,
    keep_prompt: int,
    new_tokens: int,
    batch_size: int,
    rep: Reporter,
) -> list[list[int]]:
    """Each prompt's last `keep_prompt` tokens + the base model's greedy continuation of up to `new_tokens`
    (the regenerated data EAGLE-3 and self-distilled Medusa heads learn from). Saved in `cache_dir` under a
    digest of `key` and the prompts, so a resumed run reuses it; None: not saved."""
    digest = hashlib.sha256(json.dumps([key, prompts]).encode()).hexdigest()
    cache = cache_dir / f"distilled-{digest[:16]}.safetensors" if cache_dir is not None else None
    if cache is not None and cache.is_file():
        flat = load_file(str(cache))
        lengths, tokens = flat["lengths"].tolist(), flat["tokens"].tolist()
        out, pos = [], 0
        for n in lengths:
            out.append(tokens[pos : pos + n])
            pos += n
        rep.log(f"self-distilled data read back from {cache}")
        return out
    prompts = [p[-keep_prompt:] for p in prompts]
    rep.start("distill", len(prompts))
    out = greedy_continuations(
        base.model,
        prompts,
        max_new_tokens=new_tokens,
        eos_ids=base.eos_ids,
        batch_size=batch_size,
        on_batch=lambda n: rep.advance("distill", n),
    )
    rep.stop("distill")
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        flat_tokens = [t for seq in out for t in seq]
        save_file(
            {"lengths": torch.tensor([len(s) for s in out]), "tokens": torch.tensor(flat_tokens)}, str(cache)
        )
    return out
