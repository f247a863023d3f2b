"""Options of `specbuild tune` (torch-free: the CLI reads the defaults at import time)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TuneOptions:
    prompts: Path  # .txt (one prompt per line) or .jsonl ("text" or "prompt")
    max_tokens: int = 64  # greedy tokens generated per prompt while profiling
    topk: int = 10  # candidates per head considered when growing a Medusa tree
    k_max: int | None = None  # draft/target: largest K profiled (None: max(8, the spec's K))
    budget: int | None = None  # Medusa: tree nodes (None: the spec's max_draft_len)
    eval_prompts: Path | None = None  # held-out prompts: measure the chosen and current settings on the engine
    engine: Path | None = None  # a `specbuild compile` output to run instead of converting the spec
    write: bool = False
