"""Options of `specbuild tune` (torch-free: the CLI reads the defaults at import time)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.core.errors import TrainingError
from specbuild.core.methods import Tunable, method_of

# option -> (lowest, highest): K and tree sizes share the spec's speculation.max_draft_len range
RANGES = {
    "max_tokens": (1, 4096),
    "topk": (1, 100),
    "k_max": (1, 256),
    "budget": (1, 256),
    "n_max": (1, 64),  # the spec's ngram.max_matching_ngram_size range
}


@dataclass(frozen=True)
class TuneOptions:
    prompts: Path | None  # .txt (one prompt per line) or .jsonl ("text" or "prompt"); None with `profile`
    max_tokens: int = 64  # greedy tokens generated per prompt while profiling
    topk: int = 10  # candidates per head considered when growing a Medusa tree
    k_max: int | None = None  # draft/target: largest K profiled (None: max(8, the spec's K))
    budget: int | None = None  # Medusa: tree nodes (None: the spec's max_draft_len)
    n_max: int | None = None  # n-gram: largest max_matching_ngram_size profiled (None: max(4, the spec's))
    eval_prompts: Path | None = (
        None  # held-out prompts: measure the chosen and current settings on the engine
    )
    engine: Path | None = None  # a `specbuild compile` output to run instead of converting the spec
    write: bool = False
    # a speculation_profile.json measured elsewhere (ModelOpt schema 1.0, e.g. `bench` on a GPU host): K is
    # chosen from its acceptance instead of profiling here; its cost ratio or `cost_ratio` gives c
    profile: Path | None = None
    cost_ratio: float | None = None  # draft pass / target pass on the serving hardware (with `profile`)
    save_profile: Path | None = None  # write this run's measurement as a speculation_profile.json

    def validate(self, spec: Any = None) -> None:
        """Every numeric option in its range (a K of 0 or 10000 is a mistake, not a request)."""
        for name, (low, high) in RANGES.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, float) and not math.isfinite(value) or not low <= value <= high:
                raise TrainingError(
                    f"--{name.replace('_', '-')} {value} is out of range",
                    expected=f"an integer in {low}..{high}",
                    found=str(value),
                    fix=f"pass --{name.replace('_', '-')} between {low} and {high}",
                )
        self._check_profile(spec)
        if spec is not None and self.budget is not None and method_of(spec).tunes is not Tunable.TREE:
            raise TrainingError(
                "--budget is for specs whose tree is tuned (Medusa)",
                expected="--k-max for draft/target",
                found=f"mode {spec.mode}",
                fix="drop --budget, or use --k-max",
            )
        if spec is not None and self.n_max is not None and method_of(spec).tunes is not Tunable.NGRAM:
            raise TrainingError(
                "--n-max is for n-gram specs (it bounds ngram.max_matching_ngram_size)",
                expected="--k-max for draft/target, --budget for Medusa",
                found=f"mode {spec.mode}",
                fix="drop --n-max",
            )

    def _check_profile(self, spec: Any) -> None:
        if self.profile is None:
            if self.prompts is None:
                raise TrainingError(
                    "tune needs prompts to profile on", fix="pass --prompts FILE (or --profile PROFILE.json)"
                )
            if self.cost_ratio is not None:
                raise TrainingError(
                    "--cost-ratio is for --profile (tune measures c itself when it profiles)",
                    fix="drop --cost-ratio, or pass --profile speculation_profile.json",
                )
            return
        for flag, value in (("--prompts", self.prompts), ("--eval-prompts", self.eval_prompts)):
            if value is not None:
                raise TrainingError(
                    f"{flag} and --profile exclude each other",
                    expected="--profile alone (acceptance measured elsewhere), or prompts to profile on",
                    found=f"{flag} {value} and --profile {self.profile}",
                    fix=f"drop {flag} to choose K from the profile, or drop --profile to measure here",
                )
        if self.cost_ratio is not None and not (math.isfinite(self.cost_ratio) and self.cost_ratio >= 0):
            raise TrainingError(
                f"--cost-ratio {self.cost_ratio} is not a number >= 0", fix="pass --cost-ratio 0.1"
            )
        if spec is not None and method_of(spec).tunes is not Tunable.DRAFT_LEN:
            raise TrainingError(
                "--profile chooses K (draft tokens per round); this spec's method tunes something else",
                expected="a method whose K is tuned (draft/target)",
                found=f"mode {spec.mode} (tunes {method_of(spec).tunes.name.lower()})",
                fix="profile here with --prompts (a Medusa tree needs each head's candidate ranks, n-gram "
                "its match sizes)",
            )
