"""Sampling options, declared once and carried together (engine, BLS, client, CLI).

No torch here: the client and the CLI import this module.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from specbuild.core.errors import SpecbuildError

DEFAULT_MAX_TOKENS = 64
INT32_MAX = 2**31 - 1  # max_tokens and top_k travel as INT32 (Triton's request_output_len, runtime_top_k)
UINT64_MAX = 2**64 - 1  # the seed travels as UINT64


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to pick each next token. temperature == 0 means greedy (top_k/top_p ignored)."""

    max_tokens: int = DEFAULT_MAX_TOKENS  # new tokens to generate, prompt excluded
    temperature: float = 0.0  # 0 = greedy argmax
    top_k: int = 0  # 0 = no top-k filter
    top_p: float = 1.0  # 1.0 = no nucleus filter
    seed: int | None = None  # reproducible sampling when set
    end_id: int | None = None  # stop when generated (None: the model's eos)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)  # extra single-token stops

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens <= INT32_MAX:
            raise SpecbuildError(
                "max_tokens must be in [1, 2^31 - 1]", found=str(self.max_tokens), fix="pass --max-tokens 32"
            )
        if not (
            math.isfinite(self.temperature) and self.temperature >= 0
        ):  # NaN fails every comparison: test it
            raise SpecbuildError(
                "temperature must be a finite number >= 0",
                found=str(self.temperature),
                fix="use 0 for greedy",
            )
        if not 0 <= self.top_k <= INT32_MAX:
            raise SpecbuildError(
                "top_k must be in [0, 2^31 - 1]", found=str(self.top_k), fix="use 0 to disable top-k"
            )
        if not (math.isfinite(self.top_p) and 0.0 < self.top_p <= 1.0):
            raise SpecbuildError(
                "top_p must be in (0, 1]", found=str(self.top_p), fix="use 1.0 to disable top-p"
            )
        if self.seed is not None and not 0 <= self.seed <= UINT64_MAX:
            raise SpecbuildError(
                "seed must be in [0, 2^64 - 1]", found=str(self.seed), fix="pass a smaller --seed"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stop_token_ids"] = list(self.stop_token_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> SamplingParams:
        """The inverse of to_dict (JSON has no tuples); every value is validated again."""
        return cls(**{**d, "stop_token_ids": tuple(d.get("stop_token_ids", ()))})
