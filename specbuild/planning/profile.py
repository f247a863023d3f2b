"""Speculation profiles for `specbuild plan`: acceptance and cost ratio, from `specbuild tune --json`.

A profile says how many tokens one target pass yields (E) and what the speculation costs per pass
relative to the target alone; the speedup is E / (K c + 1) for a drafter run K times per round
(core/perf/theory.py), or E / (pass cost) for a method with no draft passes, whose drafts one target pass
verifies (a Medusa tree; n-gram drafts, looked up for free).

Read here:
* the JSON `specbuild tune SPEC --json` prints (TuneReport.to_dict()):
  * draft length (`tunes: draft_len`): details.acceptance_per_position, details.cost_ratio;
  * tree (`tunes: tree`): chosen/current tokens_per_pass and details.tree_pass_cost;
  * n-gram (`tunes: ngram`): chosen/current tokens_per_pass and speedup of the exact replay (their
    ratio is the mean verify-pass cost, timed on the tuning host), and the setting's
    details.<label>_profile.acceptance_per_position;
* a ModelOpt-style `speculation_profile.json` (core/formats/speculation_profile.py: `bench` and `tune
  --save-profile` write it, ModelOpt's specdec_bench too): its conditional acceptance per position and
  measurement_conditions.cost_ratio (specbuild's key; ModelOpt's profiles measure no cost). Its best K
  is chosen as `tune --profile` chooses it (tuning/predict.py `choose_k_from_profile`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.core.errors import PlanError
from specbuild.core.formats.safe_io import read_json, shorten
from specbuild.core.formats.speculation_profile import read_speculation_profile
from specbuild.core.methods import Tunable
from specbuild.core.perf import theory
from specbuild.tuning.predict import choose_k_from_profile


@dataclass(frozen=True)
class Profile:
    source: str  # the file, in words
    acceptance: tuple[float, ...] = ()  # per draft position, conditional on the earlier ones
    cost_ratio: float | None = None  # draft pass / target pass (per-round drafters)
    # no draft passes (Medusa's tree, n-gram lookup): E at the profiled setting and its pass cost
    one_pass_tokens_per_pass: float | None = None
    one_pass_cost: float | None = None  # verify pass time / plain pass time
    # a speculation_profile.json: the K it was measured at, and the K it supports best (tune --profile's)
    measured_k: int | None = None
    best_k: int | None = None

    def tokens_per_pass(self, k: int) -> float:
        if self.one_pass_tokens_per_pass is not None:
            return self.one_pass_tokens_per_pass
        return theory.tokens_per_pass_chain(self.acceptance, k)

    def speedup(self, k: int) -> float | None:
        """Over the target alone at low load; None without a cost."""
        if self.one_pass_tokens_per_pass is not None:
            return self.one_pass_tokens_per_pass / self.one_pass_cost if self.one_pass_cost else None
        if self.cost_ratio is None:
            return None
        return theory.speedup(self.tokens_per_pass(k), k, self.cost_ratio)

    @property
    def alpha(self) -> float | None:
        """A single per-token acceptance with the same E at the profiled depth (for the break-even)."""
        if not self.acceptance:
            return None
        return sum(self.acceptance) / len(self.acceptance)


def read_profile(path: Path, *, setting_value: Any = None, method: str | None = None) -> Profile:
    """A Profile from a `tune --json` report or a speculation_profile.json. `setting_value`: what the spec
    now has of what the report tuned (the tree as lists; n-gram: {"speculation.max_draft_len": K,
    "ngram.max_matching_ngram_size": N}), to pick which of the report's two settings (chosen / current) it
    describes; `method`: the spec's method as the ecosystem names it (a speculation_profile.json of another
    method is refused)."""
    data = read_json(path, kind="config", what="speculation profile")
    if "schema_version" in data:
        return _from_speculation_profile(path, method)
    where = f"speculation profile {path}"
    details = data.get("details")
    if not isinstance(details, dict):
        raise PlanError(
            f"{where} has no details",
            expected="the JSON of `specbuild tune SPEC --json` (keys mode, tunes, chosen, current, details)",
            found=shorten(sorted(data)),
            fix="run `specbuild tune SPEC --prompts FILE --json > profile.json`",
        )
    if data.get("tunes") == Tunable.NGRAM.name.lower():
        return _ngram_profile(data, details, setting_value, path, where)
    if data.get("tunes") == Tunable.TREE.name.lower():
        chosen, current = data.get("chosen") or {}, data.get("current") or {}
        setting = chosen if setting_value is not None and chosen.get("value") == setting_value else current
        label = "chosen" if setting is chosen else "current"
        cost = (details.get("tree_pass_cost") or {}).get(label)
        e = setting.get("tokens_per_pass")
        if not _positive(e):
            raise PlanError(
                f"{where}: no tokens per pass for the {label} tree",
                expected="a number > 0",
                found=shorten(e),
                fix="regenerate it with `specbuild tune --json`",
            )
        return Profile(
            source=f"{path} ({label} tree)",
            one_pass_tokens_per_pass=float(e),
            one_pass_cost=float(cost) if _positive(cost) else None,
        )
    acceptance = details.get("acceptance_per_position")
    if (
        not isinstance(acceptance, list)
        or not acceptance
        or not all(isinstance(a, (int, float)) and 0 <= a <= 1 for a in acceptance)
    ):
        raise PlanError(
            f"{where}: no acceptance per position",
            expected="details.acceptance_per_position: a list of rates in [0, 1]",
            found=shorten(acceptance),
            fix="regenerate it with `specbuild tune SPEC --json`",
        )
    cost = details.get("cost_ratio")
    return Profile(
        source=str(path),
        acceptance=tuple(float(a) for a in acceptance),
        cost_ratio=float(cost) if _positive(cost) else None,
    )


def _from_speculation_profile(path: Path, method: str | None) -> Profile:
    sp = read_speculation_profile(path)  # a malformed or placeholder profile: InputFileError
    if method and sp.method and sp.method.lower() != method.lower():
        raise PlanError(
            f"the speculation profile {path} describes another method",
            expected=f"method {method!r} (the spec's)",
            found=f"method {sp.method!r}",
            fix="use a profile measured with this spec's method",
        )
    best = choose_k_from_profile(sp, sp.cost_ratio).k if sp.cost_ratio is not None else None
    return Profile(
        source=f"{path} (speculation_profile.json, measured at K={sp.num_speculative_tokens})",
        acceptance=tuple(sp.acceptance),
        cost_ratio=sp.cost_ratio if sp.cost_ratio and sp.cost_ratio > 0 else None,
        measured_k=sp.num_speculative_tokens,
        best_k=best,
    )


def _ngram_profile(data: dict, details: dict, setting_value: Any, path: Path, where: str) -> Profile:
    """n-gram: the replay's E of the setting the spec has, and its mean verify-pass cost (E / speedup)."""
    chosen, current = data.get("chosen") or {}, data.get("current") or {}
    setting = chosen if setting_value is not None and chosen.get("value") == setting_value else current
    label = "chosen" if setting is chosen else "current"
    e, s = setting.get("tokens_per_pass"), setting.get("speedup")
    if not (_positive(e) and _positive(s)):
        raise PlanError(
            f"{where}: no tokens per pass and speedup for the {label} (K, N)",
            expected="numbers > 0",
            found=shorten({"tokens_per_pass": e, "speedup": s}),
            fix="regenerate it with `specbuild tune --json`",
        )
    acceptance = (details.get(f"{label}_profile") or {}).get("acceptance_per_position") or []
    return Profile(
        source=f"{path} ({label} K and N; verify costs timed on the tuning host)",
        acceptance=tuple(float(a) for a in acceptance if isinstance(a, (int, float))),
        one_pass_tokens_per_pass=float(e),
        one_pass_cost=float(e) / float(s),
    )


def _positive(value: Any) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )
