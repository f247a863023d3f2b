"""What `specbuild tune` reports: the chosen and current settings with their predictions."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Setting:
    label: str  # "chosen" | "current"
    value: Any  # K, the tree as lists, or {"section.key": value} for several keys (Tunable.assignments)
    tokens_per_pass: float  # predicted from the profile
    speedup: float  # predicted
    size: int  # K, or tree nodes


@dataclass(frozen=True)
class TuneReport:
    mode: str  # the spec's method (its value)
    tunes: str  # Tunable name, lower case: "draft_len" (K) | "tree" (the Medusa tree) | "ngram" (K and N)
    chosen: Setting
    current: Setting
    details: dict[str, Any] = field(default_factory=dict)
    written: str | None = None  # "kept comments" once --write updated the spec, else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
