"""Capacity and cost arithmetic: how many replicas and GPUs a traffic needs, and what they cost.

Pure functions over plain numbers (no I/O); `specbuild plan` (planning/) feeds them from a bench report,
a speculation profile, stated figures or the roofline prediction (core/perf/roofline.py).

Definitions:
* traffic: generated (output) tokens per second, on average over the day and at the peak; the
  peak factor is peak / average. `--tokens-per-day` counts generated tokens, or prompt + generated
  tokens when it says so (then the generated share is output_len / (input_len + output_len)).
* a curve: one replica's output tokens/s at each concurrency (requests in flight), with the latency
  percentiles measured or predicted there. A replica is one copy of the deployment: TP x PP GPUs
  for the target, plus the GPUs the draft needs beyond the target's (0 when it shares them).
* operating point: the concurrency with the highest throughput whose latencies meet the objective
  (an unknown latency is not checked, and the plan says so).
* sizing: replicas = ceil(peak / (throughput at the operating point x utilisation)); GPUs =
  replicas x GPUs per replica; provisioned for the peak around the clock: cost per day = GPUs x
  24 h x price, per month x 730 h (8760 h / 12). The "autoscaled" figures size for the average
  instead: the floor a perfect autoscaler would approach.
* break-even: the acceptance rate below which speculation is slower than the target alone (for K
  and the cost ratio c, core/perf/theory.py), the concurrency at which the measured speculative
  throughput falls to the baseline's, and the throughput ratio the draft's extra GPUs need.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from specbuild.core.errors import PlanError
from specbuild.core.perf import theory

SECONDS_PER_DAY = 86_400
HOURS_PER_DAY = 24
HOURS_PER_MONTH = 730  # 8760 h / 12, the usual cloud billing month
COUNTS = ("output", "total")  # what --tokens-per-day counts


def _bad(what: str, *, expected: str, found: Any, fix: str) -> PlanError:
    return PlanError(what, expected=expected, found=str(found), fix=fix)


@dataclass(frozen=True)
class Traffic:
    avg_output_tok_s: float
    peak_output_tok_s: float
    input_len: int
    output_len: int
    basis: str  # how the figures were derived, in words

    @property
    def peak_factor(self) -> float:
        return self.peak_output_tok_s / self.avg_output_tok_s if self.avg_output_tok_s else math.inf

    @property
    def peak_rps(self) -> float:
        return self.peak_output_tok_s / self.output_len

    @property
    def avg_rps(self) -> float:
        return self.avg_output_tok_s / self.output_len

    @property
    def output_tokens_per_day(self) -> float:
        return self.avg_output_tok_s * SECONDS_PER_DAY


def make_traffic(
    *,
    input_len: int,
    output_len: int,
    tokens_per_day: float | None = None,
    counts: str = "output",
    peak_rps: float | None = None,
    peak_factor: float | None = None,
) -> Traffic:
    """Traffic from two of (tokens per day, peak requests/s, peak factor); the factor defaults to 1."""
    if input_len < 0 or output_len < 1:
        raise _bad(
            "impossible request lengths",
            expected="input >= 0 and output >= 1 tokens",
            found=f"input {input_len}, output {output_len}",
            fix="set --input-len and --output-len",
        )
    if counts not in COUNTS:
        raise _bad(
            "unknown token count",
            expected=" | ".join(COUNTS),
            found=counts,
            fix="use --counts output or total",
        )
    for name, value in (
        ("tokens per day", tokens_per_day),
        ("peak rps", peak_rps),
        ("peak factor", peak_factor),
    ):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise _bad(
                f"impossible {name}", expected="a positive finite number", found=value, fix=f"set the {name}"
            )
    if peak_factor is not None and peak_factor < 1:
        raise _bad(
            "impossible peak factor",
            expected="peak / average load, at least 1",
            found=peak_factor,
            fix="use e.g. --peak-factor 2",
        )
    if tokens_per_day is None and peak_rps is None:
        raise _bad(
            "no traffic given",
            expected="--tokens-per-day and/or --peak-rps",
            found="neither",
            fix="add --tokens-per-day 100M (and --peak-factor) or --peak-rps",
        )
    if tokens_per_day is not None and peak_rps is not None and peak_factor is not None:
        raise _bad(
            "over-determined traffic",
            expected="two of --tokens-per-day, --peak-rps, --peak-factor",
            found="all three",
            fix="leave out --peak-factor (tokens/day and peak rps fix it)",
        )
    share = 1.0 if counts == "output" else output_len / (input_len + output_len)
    if tokens_per_day is not None:
        avg = tokens_per_day * share / SECONDS_PER_DAY
        what = "generated" if counts == "output" else f"prompt + generated (generated share {share:.3f})"
        basis = f"{tokens_per_day:,.0f} {what} tokens/day = {avg:,.1f} generated tok/s on average"
        if peak_rps is not None:
            peak = peak_rps * output_len
            if peak < avg:
                raise _bad(
                    "the peak is below the average",
                    expected=f"peak >= the daily average {avg:,.1f} tok/s",
                    found=f"{peak_rps:g} req/s x {output_len} tokens = {peak:,.1f} tok/s",
                    fix="raise --peak-rps or lower --tokens-per-day",
                )
            basis += f"; peak {peak_rps:g} req/s x {output_len} tokens = {peak:,.1f} tok/s"
        else:
            factor = peak_factor or 1.0
            peak = avg * factor
            basis += f"; peak factor {factor:g}" + (" (average load, no headroom)" if factor == 1 else "")
    else:
        assert peak_rps is not None
        peak = peak_rps * output_len
        factor = peak_factor or 1.0
        avg = peak / factor
        basis = f"peak {peak_rps:g} req/s x {output_len} tokens = {peak:,.1f} tok/s; peak factor {factor:g}"
    return Traffic(avg, peak, input_len, output_len, basis)


@dataclass(frozen=True)
class Objective:
    """Latency limits per request, at the 99th percentile (ms); None: no limit."""

    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    latency_p99_ms: float | None = None

    def __post_init__(self) -> None:
        for option, limit in (
            ("--ttft-p99-ms", self.ttft_p99_ms),
            ("--itl-p99-ms", self.itl_p99_ms),
            ("--latency-p99-ms", self.latency_p99_ms),
        ):
            if limit is not None and not (math.isfinite(limit) and limit > 0):
                raise _bad(
                    f"impossible latency objective {option}",
                    expected="a finite number of milliseconds > 0",
                    found=limit,
                    fix=f"e.g. {option} 500, or leave it out",
                )

    def check(self, point: Point) -> tuple[bool, list[str]]:
        """(met, notes): a limit on a latency the point does not know is noted, not failed."""
        ok, notes = True, []
        for name, limit, value in (
            ("TTFT p99", self.ttft_p99_ms, point.ttft_p99_ms),
            ("ITL p99", self.itl_p99_ms, point.itl_p99_ms),
            ("latency p99", self.latency_p99_ms, point.latency_p99_ms),
        ):
            if limit is None:
                continue
            if value is None:
                notes.append(f"{name} unknown at concurrency {point.concurrency}: not checked")
            elif value > limit:
                ok = False
                notes.append(f"{name} {value:,.1f} ms > {limit:g} ms at concurrency {point.concurrency}")
        return ok, notes

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_p99_ms, self.itl_p99_ms, self.latency_p99_ms))

    def describe(self) -> str:
        parts = [
            f"{n} <= {v:g} ms"
            for n, v in (
                ("TTFT p99", self.ttft_p99_ms),
                ("ITL p99", self.itl_p99_ms),
                ("latency p99", self.latency_p99_ms),
            )
            if v is not None
        ]
        return ", ".join(parts) or "none"


@dataclass(frozen=True)
class Point:
    """One replica at one concurrency."""

    concurrency: int | None  # None: unknown (stated figures)
    tokens_per_s: float  # output tokens/s of the whole replica
    ttft_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    latency_p99_ms: float | None = None


@dataclass(frozen=True)
class Curve:
    name: str  # baseline | speculative | ...
    source: str  # measured | stated | profile | predicted
    gpus_per_replica: int
    points: tuple[Point, ...]
    detail: str = ""  # where the figures come from, in words

    def __post_init__(self) -> None:
        if not self.points:
            raise _bad(
                f"no {self.name} throughput",
                expected="at least one concurrency",
                found="none",
                fix="give a bench report with runs of this mode, or stated figures",
            )
        if self.gpus_per_replica < 1:
            raise _bad(
                f"a {self.name} replica without GPUs",
                expected=">= 1 GPU",
                found=self.gpus_per_replica,
                fix="check the spec's tp_size / pp_size",
            )
        for p in self.points:
            if not (math.isfinite(p.tokens_per_s) and p.tokens_per_s > 0):
                raise _bad(
                    f"impossible {self.name} throughput",
                    expected="a positive finite tok/s",
                    found=p.tokens_per_s,
                    fix="check the bench report or the stated figures",
                )


@dataclass(frozen=True)
class Operating:
    point: Point | None  # None: no point meets the objective
    notes: tuple[str, ...]


def operating_point(curve: Curve, objective: Objective) -> Operating:
    """The highest-throughput point whose known latencies meet the objective."""
    notes: list[str] = []
    best: Point | None = None
    for p in curve.points:
        ok, why = objective.check(p)
        notes += why
        if ok and (best is None or p.tokens_per_s > best.tokens_per_s):
            best = p
    return Operating(best, tuple(dict.fromkeys(notes)))


@dataclass(frozen=True)
class Sizing:
    name: str
    source: str
    concurrency: int | None
    tokens_per_s_per_replica: float
    tokens_per_s_per_gpu: float
    gpus_per_replica: int
    utilisation: float  # the planned ceiling of each replica's throughput
    replicas: int
    gpus: int
    load_at_peak: float  # peak / provisioned capacity at 100 %
    gpus_ideal_average: float  # average load / per-GPU throughput: no rounding, no headroom, no peak
    replicas_autoscaled: int  # sized for the average load (the floor perfect autoscaling approaches)
    gpus_autoscaled: int
    price_per_gpu_hour: float
    cost_per_day: float
    cost_per_month: float
    cost_per_day_autoscaled: float
    cost_per_million_tokens: float  # provisioned cost / generated tokens of the day
    notes: tuple[str, ...] = ()


def size(
    traffic: Traffic, curve: Curve, objective: Objective, *, utilisation: float, price_per_gpu_hour: float
) -> Sizing | None:
    """Replicas and cost of serving `traffic` with `curve`'s replicas; None when no point meets the
    objective."""
    if not 0 < utilisation <= 1:
        raise _bad(
            "impossible utilisation",
            expected="a fraction in (0, 1]",
            found=utilisation,
            fix="use --utilisation 0.8",
        )
    if not (math.isfinite(price_per_gpu_hour) and price_per_gpu_hour >= 0):
        raise _bad(
            "impossible GPU price",
            expected="a price per GPU-hour >= 0",
            found=price_per_gpu_hour,
            fix="set --gpu-price-per-hour",
        )
    op = operating_point(curve, objective)
    if op.point is None:
        return None
    per_replica = op.point.tokens_per_s
    usable = per_replica * utilisation
    replicas = max(1, math.ceil(traffic.peak_output_tok_s / usable - 1e-9))  # 1e-9: 16.000000001 is 16
    auto = max(1, math.ceil(traffic.avg_output_tok_s / usable - 1e-9))
    gpus = replicas * curve.gpus_per_replica
    day = gpus * HOURS_PER_DAY * price_per_gpu_hour
    return Sizing(
        name=curve.name,
        source=curve.source,
        concurrency=op.point.concurrency,
        tokens_per_s_per_replica=per_replica,
        tokens_per_s_per_gpu=per_replica / curve.gpus_per_replica,
        gpus_per_replica=curve.gpus_per_replica,
        utilisation=utilisation,
        replicas=replicas,
        gpus=gpus,
        load_at_peak=traffic.peak_output_tok_s / (replicas * per_replica),
        gpus_ideal_average=traffic.avg_output_tok_s / (per_replica / curve.gpus_per_replica),
        replicas_autoscaled=auto,
        gpus_autoscaled=auto * curve.gpus_per_replica,
        price_per_gpu_hour=price_per_gpu_hour,
        cost_per_day=day,
        cost_per_month=gpus * HOURS_PER_MONTH * price_per_gpu_hour,
        cost_per_day_autoscaled=auto * curve.gpus_per_replica * HOURS_PER_DAY * price_per_gpu_hour,
        cost_per_million_tokens=day / (traffic.output_tokens_per_day / 1e6),
        notes=op.notes,
    )


# ---- break-even -------------------------------------------------------------------------------------


def alpha_break_even(k: int, cost_ratio: float) -> float | None:
    """The per-token acceptance alpha at which speculation with K drafts and cost ratio c is exactly as
    fast as the target alone (E(alpha, K) = K c + 1, i.i.d. model); None when no alpha < 1 reaches it."""
    if k < 1 or cost_ratio < 0:
        raise _bad(
            "impossible K or cost ratio",
            expected="K >= 1 and c >= 0",
            found=f"K={k}, c={cost_ratio}",
            fix="check the profile",
        )
    need = k * cost_ratio + 1.0
    if theory.tokens_per_pass_iid(1.0, k) <= need:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):  # bisection: E is increasing in alpha; 60 halvings reach float resolution
        mid = (lo + hi) / 2
        if theory.tokens_per_pass_iid(mid, k) < need:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def concurrency_break_even(base: Curve, spec: Curve) -> float | None:
    """The concurrency at which the speculative replica's throughput falls to the baseline's, by linear
    interpolation of the ratio between measured concurrencies; None if it stays above (or below) within
    the concurrencies both curves share."""
    b = {p.concurrency: p.tokens_per_s for p in base.points if p.concurrency is not None}
    s = {p.concurrency: p.tokens_per_s for p in spec.points if p.concurrency is not None}
    shared = sorted(set(b) & set(s))
    ratios = [(c, s[c] / b[c]) for c in shared]
    for (c0, r0), (c1, r1) in zip(ratios, ratios[1:], strict=False):
        if r0 > 1 >= r1:
            return c0 + (c1 - c0) * (r0 - 1) / (r0 - r1)
    return None


def saving_starts_at(base: Sizing, spec: Sizing, *, limit: int = 10_000) -> float | None:
    """The smallest peak load (tok/s) at which speculation needs fewer GPUs than the baseline (both at
    their operating points and utilisation); None if it never does below `limit` baseline replicas."""
    cap_b = base.tokens_per_s_per_replica * base.utilisation
    cap_s = spec.tokens_per_s_per_replica * spec.utilisation
    for n in range(0, limit):  # the baseline's GPU count only rises just above n x cap_b
        load = n * cap_b * (1 + 1e-9) + 1e-9
        gb = math.ceil(load / cap_b) * base.gpus_per_replica
        gs = math.ceil(load / cap_s) * spec.gpus_per_replica
        if gs < gb:
            return load
    return None


@dataclass(frozen=True)
class BreakEven:
    alpha: float | None  # acceptance below which speculation loses (None: unknown K/c, or never)
    alpha_inputs: dict[str, float] = field(default_factory=dict)  # K and c it used
    concurrency: float | None = None
    min_throughput_ratio: float = 1.0  # spec / baseline per replica needed to cover the draft's extra GPUs
    saving_from_peak_tok_s: float | None = None


def break_even(
    base: Curve,
    spec: Curve,
    base_size: Sizing | None,
    spec_size: Sizing | None,
    *,
    k: int | None,
    cost_ratio: float | None,
) -> BreakEven:
    alpha = alpha_break_even(k, cost_ratio) if k and cost_ratio is not None else None
    return BreakEven(
        alpha=alpha,
        alpha_inputs={"k": k, "cost_ratio": cost_ratio} if alpha is not None else {},
        concurrency=concurrency_break_even(base, spec),
        min_throughput_ratio=spec.gpus_per_replica / base.gpus_per_replica,
        saving_from_peak_tok_s=saving_starts_at(base_size, spec_size) if base_size and spec_size else None,
    )


def sensitivity(
    traffic: Traffic,
    curves: Sequence[Curve],
    objective: Objective,
    *,
    peak_factors: Sequence[float],
    utilisations: Sequence[float],
    price_per_gpu_hour: float,
) -> list[dict[str, Any]]:
    """GPUs per curve for each (peak factor, utilisation): the assumptions a capacity claim rests on."""
    rows = []
    for pf in peak_factors:
        t = Traffic(
            traffic.avg_output_tok_s, traffic.avg_output_tok_s * pf, traffic.input_len, traffic.output_len, ""
        )
        for u in utilisations:
            row: dict[str, Any] = {"peak_factor": pf, "utilisation": u}
            for c in curves:
                s = size(t, c, objective, utilisation=u, price_per_gpu_hour=price_per_gpu_hour)
                row[c.name] = s.gpus if s else None
            rows.append(row)
    return rows


def to_dict(obj: Any) -> Any:
    return asdict(obj)


def claim_window(base: Sizing, spec: Sizing, *, base_gpus: int, spec_gpus: int) -> tuple[float, float] | None:
    """The peak loads (generated tok/s, an interval (low, high]) at which the baseline needs exactly
    `base_gpus` GPUs and speculation exactly `spec_gpus`, at the sizings' operating points and
    utilisation; None when no load gives both (e.g. a count that is not a whole number of replicas)."""

    def window(s: Sizing, gpus: int) -> tuple[float, float] | None:
        if gpus % s.gpus_per_replica:
            return None
        n = gpus // s.gpus_per_replica
        cap = s.tokens_per_s_per_replica * s.utilisation
        return (n - 1) * cap, n * cap

    a, b = window(base, base_gpus), window(spec, spec_gpus)
    if a is None or b is None:
        return None
    low, high = max(a[0], b[0]), min(a[1], b[1])
    return (low, high) if low < high else None
