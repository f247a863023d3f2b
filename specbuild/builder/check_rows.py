"""One row of `specbuild check` and what the per-topic checks share (preflight.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from specbuild.core.formats.hf_config import HFModelConfig
from specbuild.core.formats.weights import WeightFiles
from specbuild.core.spec import ModelSection

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # pass | warn | fail
    found: str  # what was found
    fix: str = ""  # how to fix it (empty on a pass)


@dataclass(frozen=True)
class LoadedModel:
    role: str  # target | draft
    section: ModelSection
    folder: Path
    config: HFModelConfig
    weights: WeightFiles = field(repr=False)


def short_path(path: Path) -> str:
    """Relative to the working directory when below it (table cells stay readable)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
