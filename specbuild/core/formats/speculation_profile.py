"""ModelOpt's portable `speculation_profile.json` (schema 1.0): write one from measured steps, read one
measured elsewhere (torch-free, stdlib only: `tune`, `bench` and `plan` use it).

Schema source: NVIDIA/Model-Optimizer `examples/specdec_bench/specdec_bench/speculation_profile.py`
(`build_profile`, SCHEMA_VERSION "1.0") at commit edf879d3daf7879acdeb2dab9f54a591837da7b0, read
2026-12 through the code index. The file is NOT on Model-Optimizer main (mirror HEAD a2fbac7 and all its
refs lack it): an unmerged proposal, so the schema may still change. Keys in ModelOpt's order:
schema_version, measured, method, draft_checkpoint, target_model, num_speculative_tokens, block_size,
max_supported_k, verification_method, conditional_accept_rates, marginal_accept_rates,
mean_accept_length, mean_accept_length_per_request, accept_length_model, accept_length_by_k,
acceptance_length_histogram, per_category, measurement_conditions, validation.

Conventions (as ModelOpt's): an *acceptance length* is the tokens one verification step emits, the
bonus token included (1 = no draft accepted); draft position i <-> length i + 2;
`marginal_accept_rates[i]` = P(the first i + 1 drafts all accepted) (a survival function, what vLLM's
synthetic sampler reads), `conditional_accept_rates[i]` = marginal[i] / marginal[i - 1] (P(draft i + 1
accepted | the first i were), what Dynamo's mocker reads); `mean_accept_length` is per step.

What specbuild measures differently: the conditional rates are estimated over the positions actually
*tested* (core/perf/theory.py `conditional_acceptance`: a round near the end of a request drafts fewer than K,
and its missing positions are not counted as rejections); the marginals are their running products, so
the two vectors agree exactly. ModelOpt's estimator divides by all steps instead; its mean-consistency
check (1 + sum(marginal) vs the per-step mean, tolerance 0.02) is computed and recorded the same way and
then shows that truncation effect rather than hiding it. specbuild also records, in
`measurement_conditions`, the draft/target cost ratio `cost_ratio` when it measured one (a key of
specbuild's; ModelOpt's profile has no cost), so `tune --profile` can choose K from the file alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbuild.core.formats.safe_io import InputFileError, atomic_write_text, read_json
from specbuild.core.perf.theory import conditional_acceptance, positions_from_rounds

SCHEMA_VERSION = "1.0"
MODELOPT_SOURCE = (
    "NVIDIA/Model-Optimizer examples/specdec_bench/specdec_bench/speculation_profile.py "
    "@edf879d3daf7879acdeb2dab9f54a591837da7b0 (unmerged upstream)"
)
FILE_NAME = "speculation_profile.json"
CHAIN_METHODS = frozenset({"eagle", "eagle1", "eagle2", "eagle3", "draft_model"})  # ModelOpt's set
CONSISTENCY_TOLERANCE = 0.02  # ModelOpt's mean_consistency tolerance (acceptance-length units)
DIGITS = 6  # ModelOpt rounds every rate and mean to 6 decimals

Step = tuple[int, int]  # (accepted drafts, drafted tokens) of one verification step


def checkpoint_id(path: str | Path | None) -> str | None:
    """The last two components of a checkpoint path (`org/model`), as ModelOpt publishes it: a profile
    travels with a checkpoint, so it must not carry this machine's folder layout."""
    if not path:
        return None
    parts = [p for p in str(path).replace("\\", "/").split("/") if p]
    return "/".join(parts[-2:]) if parts else None


def _survival_checks(mean: float, marginal: list[float]) -> dict[str, Any]:
    implied = 1.0 + sum(marginal)
    delta = abs(implied - mean)
    violations = [
        {"position": i, "value": marginal[i], "previous": marginal[i - 1]}
        for i in range(1, len(marginal))
        if marginal[i] > marginal[i - 1] + 1e-9
    ]
    return {
        "mean_consistency": {
            "implied_mean_accept_length": round(implied, DIGITS),
            "reported_mean_accept_length": round(mean, DIGITS),
            "abs_delta": round(delta, DIGITS),
            "tolerance": CONSISTENCY_TOLERANCE,
            "passed": delta <= CONSISTENCY_TOLERANCE,
        },
        "marginal_monotonicity": {"passed": not violations, "violations": violations},
    }


def build_profile(
    requests: Sequence[Sequence[Step]],
    *,
    num_speculative_tokens: int,
    method: str,
    max_supported_k: int | None = None,
    target_model: str | Path | None = None,
    draft_checkpoint: str | Path | None = None,
    conditional: Sequence[float] | None = None,
    measurement_conditions: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A measured profile from the verification steps of each request (steps that drafted nothing are
    ignored). `conditional`: per-position rates the caller estimated itself (tune's profile); by default
    they are estimated from the steps over the positions tested."""
    k = int(num_speculative_tokens)
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    per_request = [[(int(a), int(d)) for a, d in r if d > 0] for r in requests]
    steps = [s for r in per_request for s in r]
    histogram: dict[int, int] = {}
    for a, _ in steps:
        histogram[a + 1] = histogram.get(a + 1, 0) + 1
    if conditional is None:
        accepted, drafted = positions_from_rounds(steps)
        conditional = conditional_acceptance(accepted, drafted)
    rates = [float(conditional[i]) if i < len(conditional) else 0.0 for i in range(k)]
    marginal, survive = [], 1.0
    for a in rates:
        survive *= a
        marginal.append(survive)
    cond = [m / p if p > 0 else 0.0 for m, p in zip(marginal, [1.0, *marginal[:-1]], strict=True)]
    n = sum(histogram.values())
    mean = sum(length * c for length, c in histogram.items()) / n if n else 1.0
    means = [1.0 + sum(a for a, _ in r) / len(r) for r in per_request if r]
    return {
        "schema_version": SCHEMA_VERSION,
        "measured": True,
        "method": method,
        "draft_checkpoint": {"id": checkpoint_id(draft_checkpoint)} if draft_checkpoint else None,
        "target_model": {"id": checkpoint_id(target_model)} if target_model else None,
        "num_speculative_tokens": k,
        "block_size": None,
        "max_supported_k": int(max_supported_k) if max_supported_k is not None else k,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": [round(x, DIGITS) for x in cond],
        "marginal_accept_rates": [round(x, DIGITS) for x in marginal],
        "mean_accept_length": round(mean, DIGITS),
        "mean_accept_length_per_request": round(sum(means) / len(means), DIGITS) if means else 1.0,
        "accept_length_model": "chain_analytic" if method.lower() in CHAIN_METHODS else "measured_per_k",
        "accept_length_by_k": {str(k): round(mean, DIGITS)},
        "acceptance_length_histogram": {str(length): histogram[length] for length in sorted(histogram)},
        "per_category": None,
        "measurement_conditions": {
            **(measurement_conditions or {}),
            "producer": "specbuild",
            "schema_source": MODELOPT_SOURCE,
            "steps": n,
            "requests": len(per_request),
        },
        "validation": _survival_checks(mean, marginal),
    }


def write_profile(profile: dict[str, Any], path: str | Path) -> Path:
    """Write (atomically: a failed write leaves an older file as it was)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, json.dumps(profile, indent=2) + "\n", option="the speculation profile")


@dataclass(frozen=True)
class SpeculationProfile:
    """A profile read back: what `tune` and `plan` need from it."""

    path: str
    method: str | None
    num_speculative_tokens: int  # K the measurement ran at
    max_supported_k: int
    conditional_accept_rates: tuple[float, ...]  # [K]
    marginal_accept_rates: tuple[float, ...]  # [K]
    mean_accept_length: float | None
    accept_length_model: str
    cost_ratio: float | None = None  # measurement_conditions.cost_ratio (specbuild's key), when present
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def acceptance(self) -> list[float]:
        """Per-position conditional acceptance (tune's `acceptance_per_position`)."""
        return list(self.conditional_accept_rates)

    @property
    def extrapolates(self) -> bool:
        """chain_analytic: E(K) for any K <= num_speculative_tokens follows from the rates."""
        return self.accept_length_model == "chain_analytic"


def _bad(path, what: str, found: Any, expected: str) -> InputFileError:
    return InputFileError(
        f"speculation profile {path}: {what}",
        expected=expected,
        found=repr(found)[:200],
        fix="point at a speculation_profile.json written by specbuild bench/tune or ModelOpt's specdec_bench",
    )


def _rates(path, data: dict, key: str, k: int) -> tuple[float, ...] | None:
    value = data.get(key)
    if value is None:
        return None
    ok = isinstance(value, list) and len(value) == k
    ok = ok and all(
        isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) and 0 <= x <= 1
        for x in value
    )
    if not ok:
        raise _bad(path, f"{key} is not {k} rates in [0, 1]", value, f"a list of {k} numbers in [0, 1]")
    return tuple(float(x) for x in value)


def read_speculation_profile(path: str | Path) -> SpeculationProfile:
    """Read and check a ModelOpt-style speculation_profile.json (schema 1.x); a stub (`measured: false`)
    or a file whose vectors do not fit its K is an InputFileError."""
    data = read_json(path, kind="config", what="speculation profile")
    version = str(data.get("schema_version", ""))
    if not version.startswith("1."):
        raise _bad(path, "unknown schema_version", data.get("schema_version"), f'"{SCHEMA_VERSION}" (1.x)')
    if data.get("measured") is not True:
        raise _bad(path, "is a placeholder, not a measurement", data.get("measured"), "measured: true")
    k = data.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise _bad(path, "num_speculative_tokens is not a positive integer", k, "an integer >= 1")
    max_k = data.get("max_supported_k", k)
    if not isinstance(max_k, int) or isinstance(max_k, bool) or max_k < 1:
        raise _bad(path, "max_supported_k is not a positive integer", max_k, "an integer >= 1")
    conditional = _rates(path, data, "conditional_accept_rates", k)
    marginal = _rates(path, data, "marginal_accept_rates", k)
    if conditional is None and marginal is None:
        raise _bad(
            path, "has no acceptance vector", None, "conditional_accept_rates or marginal_accept_rates"
        )
    if (
        marginal is None
    ):  # one follows from the other (ModelOpt: conditional[i] = marginal[i] / marginal[i-1])
        out, survive = [], 1.0
        for a in conditional:
            survive *= a
            out.append(survive)
        marginal = tuple(out)
    if conditional is None:
        prev = (1.0, *marginal[:-1])
        conditional = tuple(m / p if p > 0 else 0.0 for m, p in zip(marginal, prev, strict=True))
    mean = data.get("mean_accept_length")
    conditions = data.get("measurement_conditions") or {}
    cost = conditions.get("cost_ratio") if isinstance(conditions, dict) else None
    if cost is not None and not (isinstance(cost, int | float) and math.isfinite(cost) and cost >= 0):
        raise _bad(path, "measurement_conditions.cost_ratio is not a number >= 0", cost, "a number >= 0")
    model = data.get("accept_length_model") or (
        "chain_analytic" if str(data.get("method") or "").lower() in CHAIN_METHODS else "measured_per_k"
    )
    return SpeculationProfile(
        path=str(path),
        method=data.get("method"),
        num_speculative_tokens=k,
        max_supported_k=max_k,
        conditional_accept_rates=conditional,
        marginal_accept_rates=marginal,
        mean_accept_length=float(mean) if isinstance(mean, int | float) else None,
        accept_length_model=str(model),
        cost_ratio=float(cost) if cost is not None else None,
        raw=data,
    )
