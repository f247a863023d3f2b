"""What `specbuild bench` runs: its options and prompts (light at import: the CLI reads the defaults)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specbuild.core.errors import ClientError
from specbuild.core.sampling_params import DEFAULT_MAX_TOKENS

DEFAULT_CONCURRENCY = (1, 2, 4, 8)
DEFAULT_TEMPERATURES = (0.0, 0.8)
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_OUT = Path("build/bench")


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    url: str
    prompts: tuple[str, ...]
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    temperatures: tuple[float, ...] = DEFAULT_TEMPERATURES
    max_tokens: int = DEFAULT_MAX_TOKENS
    num_draft_tokens: int | None = None  # None: the repository's K (its BLS default_num_draft_tokens)
    seed: int = 0  # T > 0 requests use seed + prompt index: runs are repeatable
    timeout_s: float = DEFAULT_TIMEOUT_S


def load_prompts(path: Path) -> tuple[str, ...]:
    """JSONL with a "prompt" field per line, or plain text with one prompt per line."""
    try:
        lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise ClientError(
            f"cannot read the prompt file {path}", found=str(exc), fix="pass --prompts FILE"
        ) from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if line.lstrip().startswith("{"):
            try:
                prompts.append(str(json.loads(line)["prompt"]))
            except (ValueError, KeyError, TypeError):
                raise ClientError(
                    f'{path}:{number}: not a JSON object with a "prompt" field',
                    found=line[:80],
                    fix='write one {"prompt": "..."} per line',
                ) from None
        else:
            prompts.append(line)
    if not prompts:
        raise ClientError(f"{path} holds no prompts", fix="one prompt per line, or JSONL with a prompt field")
    return tuple(prompts)


def default_prompts_file() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "prompts.jsonl"
