"""`specbuild plan`: a spec + traffic + one throughput source -> replicas, GPUs and cost, with and
without speculation (core/perf/capacity.py does the arithmetic).

Throughput per replica at each concurrency comes from exactly one of:
* measured: a `specbuild bench` report (bench.json: baseline and speculative runs at each concurrency,
  with their latency percentiles), measured on the hardware it should stand for;
* stated: tokens/s per GPU given on the command line (`--stated BASE,SPEC`), with no concurrency or
  latency (the objective cannot be checked, and the plan says so);
* predicted: the roofline of core/perf/roofline.py on the spec's models (memory plan) and a listed GPU, with
  the acceptance of a speculation profile (`tune --json`) or an assumed alpha.
A profile may also stand in for the speculative runs: the baseline's throughput x the profile's
speedup, labelled "profile".

A replica: the target's TP x PP GPUs alone for the baseline; `spec.num_gpus` with speculation (the
draft shares the target's GPUs unless serving.num_gpus gives it more).

Load-aware schedule: when the spec carries a load-aware K schedule, `schedule_curves` turns the schedule
the serving runtime will run (the release's K floor on the LLM-API flow) into a third curve.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specbuild.bench.report import BenchRow, read_bench_json
from specbuild.builder.memory_plan import plan_memory
from specbuild.builder.schedule_checks import served_schedule
from specbuild.core.errors import PlanError
from specbuild.core.methods import Tunable, method_of
from specbuild.core.perf import capacity as C
from specbuild.core.perf import roofline as R
from specbuild.core.spec import BuildSpec
from specbuild.planning.profile import Profile, read_profile

DEFAULT_ALPHA = 0.7  # assumed per-token acceptance when nothing was measured (labelled in every output)
PEAK_FACTORS = (1.0, 1.5, 2.0, 3.0)
UTILISATIONS = (1.0, 0.8, 0.6)


@dataclass(frozen=True)
class PlanRequest:
    traffic: C.Traffic
    objective: C.Objective = C.Objective()
    utilisation: float = 1.0
    price_per_gpu_hour: float | None = None  # None: the GPU's documented default
    gpu: str | None = None  # data/gpus.json key; None: from serving.gpu_memory_gb
    bench: Path | None = None
    baseline_bench: Path | None = None  # the baseline runs, when --bench has none (Medusa)
    profile: Path | None = None
    stated: tuple[float | None, float | None] | None = None  # tok/s per GPU: baseline, speculative
    alpha: float | None = None
    temperature: float = 0.0
    claim: tuple[int, int] | None = None  # "baseline GPUs -> speculative GPUs" to check

    def __post_init__(self) -> None:
        """Every option is checked before any planning (an alpha of 1.5 predicted 25 M tok/s per GPU)."""
        if self.alpha is not None and not 0 <= self.alpha <= 1:  # NaN fails too
            raise PlanError(
                "impossible acceptance --alpha",
                expected="a probability in [0, 1] (the chance a draft token is accepted)",
                found=str(self.alpha),
                fix="e.g. --alpha 0.7, or measure it (`tune`, `bench`) and pass --profile / --bench",
            )
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise PlanError(
                "impossible --temperature",
                expected="the temperature of bench runs to use: a finite number >= 0 (0: greedy)",
                found=str(self.temperature),
                fix="e.g. --temperature 0",
            )
        if self.claim is not None and min(self.claim) < 1:
            raise PlanError(
                "impossible --claim",
                expected="BASE,SPEC GPU counts, each at least 1",
                found=f"{self.claim[0]},{self.claim[1]}",
                fix="e.g. --claim 16,8",
            )


@dataclass(frozen=True)
class CapacityPlan:
    spec: str
    mode: str
    k: int
    gpu: dict[str, Any]
    traffic: dict[str, Any]
    objective: str
    utilisation: float
    curves: tuple[C.Curve, ...]
    sizings: dict[str, C.Sizing | None]
    break_even: C.BreakEven
    sensitivity: list[dict[str, Any]]
    claim: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)  # curve name -> "measured" | "stated" | ...
    profile_best_k: int | None = None  # a speculation_profile.json's best K (as `tune --profile` chooses)

    @property
    def saving(self) -> dict[str, float] | None:
        b, s = self.sizings.get("baseline"), self.sizings.get("speculative")
        if not b or not s:
            return None
        return {
            "gpus": b.gpus - s.gpus,
            "gpus_ratio": b.gpus / s.gpus,
            "cost_per_day": b.cost_per_day - s.cost_per_day,
            "cost_per_month": b.cost_per_month - s.cost_per_month,
        }

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["saving"] = self.saving
        d["gpu_source"] = R.gpu_source()
        return d


def make_plan(spec: BuildSpec, req: PlanRequest) -> CapacityPlan:
    notes: list[str] = []
    needs_gpu = req.price_per_gpu_hour is None or (req.bench is None and req.stated is None)
    gpu = _gpu(spec, req) if needs_gpu or req.gpu else _UNNAMED
    price = req.price_per_gpu_hour if req.price_per_gpu_hour is not None else gpu.price_per_hour
    if req.price_per_gpu_hour is None:
        notes.append(f"GPU price ${price:.2f}/GPU-hour: the documented {gpu.name} default (data/gpus.json)")
    k = int(spec.speculation.max_draft_len or 0)
    method = method_of(spec)
    profile = (
        read_profile(req.profile, setting_value=_tuned_value(spec), method=method.ecosystem_name)
        if req.profile
        else None
    )
    if profile is not None and profile.best_k is not None:
        notes.append(
            f"the profile's best K is {profile.best_k} at its cost ratio {profile.cost_ratio:.3g} (what "
            f"`tune --profile` chooses); the spec's K is {k}"
            + ("" if profile.best_k == k else ": `specbuild tune SPEC --profile FILE --write` sets it")
        )
    if profile is not None and profile.measured_k is not None and k > profile.measured_k:
        notes.append(
            f"the spec's K={k} is past the profile's measured K={profile.measured_k}: the rates beyond it "
            "repeat the last measured one"
        )
    sources = [s for s in (req.bench, req.stated) if s is not None]
    if len(sources) > 1:
        raise PlanError(
            "two throughput sources",
            expected="one of --bench, --stated (or neither: the prediction)",
            found="--bench and --stated",
            fix="keep the one that describes the hardware you plan for",
        )
    gpr_base, gpr_spec = spec.target.world_size, spec.num_gpus
    cost_ratio: float | None = None
    if req.bench:
        base, spec_curve, cost_ratio, bench_k = _from_bench(spec, req, gpr_base, gpr_spec, profile, notes)
        k = bench_k or k  # the break-even is for the K that was measured
    elif req.stated:
        base, spec_curve = _from_stated(req, gpr_base, gpr_spec, profile, k, notes)
        cost_ratio = profile.cost_ratio if profile else None
    else:
        base, spec_curve, cost_ratio = _predicted(spec, req, gpu, profile, k, notes)
    curves = (base, spec_curve, *schedule_curves(spec, base, spec_curve))
    if spec.speculation.schedule is None:
        notes.append("no load-aware K schedule in the spec: speculation runs at its one K at every load")
    elif len(curves) == 2:
        notes.append(
            f"the schedule as it runs ({served_schedule(spec).to_text()}) uses no K the curves hold "
            "(the spec's K or 0): no schedule curve"
        )
    sizings = {
        c.name: C.size(req.traffic, c, req.objective, utilisation=req.utilisation, price_per_gpu_hour=price)
        for c in curves
    }
    for name, s in sizings.items():
        if s is None:
            notes.append(
                f"{name}: no measured concurrency meets the latency objective ({req.objective.describe()})"
            )
        else:
            notes += [f"{name}: {n}" for n in s.notes]
    if cost_ratio is None and profile is not None:
        cost_ratio = profile.cost_ratio
    per_round = method.tunes is Tunable.DRAFT_LEN
    be = C.break_even(
        base,
        spec_curve,
        sizings["baseline"],
        sizings["speculative"],
        k=k if per_round else None,
        cost_ratio=cost_ratio if per_round else None,
    )
    claim = _claim(req, sizings) if req.claim else None
    return CapacityPlan(
        spec=spec.name,
        mode=spec.mode.value,
        k=k,
        gpu={"key": gpu.key, "name": gpu.name, "price_per_gpu_hour": price},
        traffic={
            **asdict(req.traffic),
            "peak_factor": req.traffic.peak_factor,
            "peak_rps": req.traffic.peak_rps,
        },
        objective=req.objective.describe(),
        utilisation=req.utilisation,
        curves=curves,
        sizings=sizings,
        break_even=be,
        sensitivity=C.sensitivity(
            req.traffic,
            curves,
            req.objective,
            peak_factors=PEAK_FACTORS,
            utilisations=UTILISATIONS,
            price_per_gpu_hour=price,
        ),
        claim=claim,
        notes=tuple(dict.fromkeys(notes)),
        labels={c.name: c.source for c in curves},
        profile_best_k=profile.best_k if profile is not None else None,
    )


def schedule_curves(spec: BuildSpec, base: C.Curve, spec_curve: C.Curve) -> tuple[C.Curve, ...]:
    """ "speculative (schedule)": at each concurrency the curve of the K the serving runtime runs there
    (builder/schedule_checks.served_schedule: on the LLM-API flow the release's floor, e.g. 1.4 runs
    draft/target at K=1 where the spec says 0): the speculative point where it runs the spec's K, the
    baseline's where it runs K=0. A K between them was not measured or predicted: that concurrency is
    left out and the curve's detail says so."""
    schedule = served_schedule(spec)
    if schedule is None:
        return ()
    k = int(spec.speculation.max_draft_len or 0)
    base_at = {p.concurrency: p for p in base.points}
    points, missing = [], []
    for p in spec_curve.points:
        if p.concurrency is None:
            raise PlanError(
                "a load-aware K schedule needs throughput per concurrency",
                expected="--bench or the prediction (per concurrency)",
                found="stated figures without a concurrency",
                fix="plan with --bench, or without --stated",
            )
        runs = schedule.k_for(p.concurrency)
        if runs == k:
            points.append(p)
        elif runs == 0 and p.concurrency in base_at:
            points.append(base_at[p.concurrency])
        else:
            missing.append(f"c={p.concurrency} (K={runs})")
    if not points:
        return ()
    detail = f"the schedule as it runs: {schedule.to_text()}" + (
        f"; left out, no curve at that K: {', '.join(missing)}" if missing else ""
    )
    return (
        C.Curve(
            "speculative (schedule)", spec_curve.source, spec_curve.gpus_per_replica, tuple(points), detail
        ),
    )


# ---- sources ----------------------------------------------------------------------------------------


_UNNAMED = R.Gpu("unnamed", "the measured host's GPU", 0.0, 0.0, 0.0, 0.0)


def _gpu(spec: BuildSpec, req: PlanRequest) -> R.Gpu:
    table = R.gpus()
    if req.gpu is not None:
        if req.gpu not in table:
            raise PlanError(
                f"unknown GPU {req.gpu!r}",
                expected=" | ".join(table),
                found=req.gpu,
                fix="use one of the listed GPUs (and --gpu-price-per-hour for its price)",
            )
        return table[req.gpu]
    found = R.gpu_for_memory(spec.serving.gpu_memory_gb)
    if found is None:
        raise PlanError(
            "no listed GPU has the spec's memory",
            expected=", ".join(f"{g.key} ({g.memory_gib:g} GiB)" for g in table.values()),
            found=f"serving.gpu_memory_gb: {spec.serving.gpu_memory_gb:g}",
            fix="pass --gpu (or, with --bench / --stated, just --gpu-price-per-hour)",
        )
    return found


def _tuned_value(spec: BuildSpec) -> Any:
    """What the spec has of what `tune` chooses, as a tune report's setting value spells it."""
    return method_of(spec).tunes.setting_of(spec)


def _points(rows: list[BenchRow]) -> tuple[C.Point, ...]:
    return tuple(
        C.Point(r.concurrency, r.tokens_per_s, r.ttft_p99_ms, r.itl_p99_ms, r.latency_p99_ms)
        for r in sorted(rows, key=lambda r: r.concurrency)
    )


def _from_bench(spec, req: PlanRequest, gpr_base, gpr_spec, profile: Profile | None, notes: list[str]):
    context, rows = read_bench_json(req.bench)
    temps = sorted({r.temperature for r in rows})
    if req.temperature not in temps:
        raise PlanError(
            f"bench report {req.bench} has no runs at temperature {req.temperature:g}",
            expected="one of " + ", ".join(f"{t:g}" for t in temps),
            found=f"{req.temperature:g}",
            fix="pass --temperature with one of those",
        )
    rows = [r for r in rows if r.temperature == req.temperature]
    if context.get("mode") not in (None, spec.mode.value):
        notes.append(f"the bench report measured mode {context.get('mode')}, the spec is {spec.mode.value}")
    bk = context.get("num_draft_tokens")
    if bk and bk != spec.speculation.max_draft_len:
        notes.append(f"the bench report ran K={bk}; the spec's K is {spec.speculation.max_draft_len}")
    base_rows = [r for r in rows if r.mode == "baseline"]
    if not base_rows and req.baseline_bench:
        _, other = read_bench_json(req.baseline_bench)
        base_rows = [r for r in other if r.mode == "baseline" and r.temperature == req.temperature]
    if not base_rows:
        raise PlanError(
            f"bench report {req.bench} has no baseline runs",
            expected="runs with mode baseline (the target alone) at each concurrency",
            found="speculative runs only (an engine that always speculates, e.g. Medusa)",
            fix="add --baseline-bench with the report of the target-alone repository",
        )
    if any(not r.streamed for r in base_rows):
        notes.append(
            "baseline runs were not streamed (one response per request): their TTFT is the whole request "
            "and their ITL is unknown (not checked)"
        )
    where = f"{req.bench} (T={req.temperature:g}, {context.get('prompts', '?')} prompts, "
    where += f"{context.get('max_tokens', '?')} tokens each)"
    base = C.Curve("baseline", "measured", gpr_base, _points(base_rows), f"bench report {where}")
    spec_rows = [r for r in rows if r.mode == "speculative"]
    if spec_rows and profile is not None:
        raise PlanError(
            "a profile and measured speculative runs",
            expected="one source of the speculative throughput",
            found=f"--profile {req.profile} and speculative runs in {req.bench}",
            fix="drop --profile (the bench report measured speculation)",
        )
    if spec_rows:
        spec_curve = C.Curve("speculative", "measured", gpr_spec, _points(spec_rows), f"bench report {where}")
    elif profile is not None:
        spec_curve = _scaled(base, profile, spec, gpr_spec)
    else:
        raise PlanError(
            f"bench report {req.bench} has no speculative runs",
            expected="speculative runs or --profile",
            found="baseline runs only",
            fix="re-run `specbuild bench` with speculation, or add --profile",
        )
    c = context.get("cost_ratio")
    measured_k = int(bk) if spec_rows and isinstance(bk, int) and bk > 0 else None
    return base, spec_curve, float(c) if isinstance(c, (int, float)) else None, measured_k


def _scaled(base: C.Curve, profile: Profile, spec: BuildSpec, gpr_spec: int) -> C.Curve:
    k = int(spec.speculation.max_draft_len or 0)
    s = profile.speedup(k)
    if s is None:
        raise PlanError(
            f"the profile {profile.source} has no cost ratio",
            expected="details.cost_ratio (`tune --json`) or measurement_conditions.cost_ratio "
            "(a speculation_profile.json from `bench` or `tune --save-profile`)",
            found="none",
            fix="regenerate it with `specbuild tune --json`, or a profile with specbuild's cost ratio",
        )
    points = tuple(
        C.Point(
            p.concurrency, p.tokens_per_s * s, p.ttft_p99_ms, p.itl_p99_ms / s if p.itl_p99_ms else None, None
        )
        for p in base.points
    )
    return C.Curve(
        "speculative",
        "profile",
        gpr_spec,
        points,
        f"baseline x the profile's speedup {s:.3f} ({profile.source}; assumed the same at every load)",
    )


def _from_stated(req: PlanRequest, gpr_base, gpr_spec, profile: Profile | None, k: int, notes: list[str]):
    b, s = req.stated
    if b is None:
        raise PlanError(
            "no stated baseline throughput",
            expected="--stated BASE[,SPEC] in tok/s per GPU",
            found="none",
            fix="e.g. --stated 45,105",
        )
    base = C.Curve(
        "baseline",
        "stated",
        gpr_base,
        (C.Point(None, b * gpr_base),),
        f"stated {b:g} tok/s per GPU x {gpr_base} GPUs",
    )
    if s is None:
        if profile is None:
            raise PlanError(
                "no stated speculative throughput",
                expected="--stated BASE,SPEC or --profile",
                found=f"--stated {b:g}",
                fix="e.g. --stated 45,105",
            )
        spec_curve = _scaled(base, profile, _KOnly(k), gpr_spec)
    else:
        spec_curve = C.Curve(
            "speculative",
            "stated",
            gpr_spec,
            (C.Point(None, s * gpr_spec),),
            f"stated {s:g} tok/s per GPU x {gpr_spec} GPUs",
        )
    if req.objective.any:
        notes.append("stated figures carry no latency: the latency objective is not checked")
    notes.append("stated figures: the concurrency they were reached at is unknown")
    return base, spec_curve


@dataclass(frozen=True)
class _Spec:
    max_draft_len: int


@dataclass(frozen=True)
class _KOnly:
    k: int

    @property
    def speculation(self) -> _Spec:
        return _Spec(self.k)


def _predicted(
    spec: BuildSpec, req: PlanRequest, gpu: R.Gpu, profile: Profile | None, k: int, notes: list[str]
):
    memory = plan_memory(spec)
    t = memory.engine("target")
    target = R.EngineCost(t.num_parameters, t.weight_bytes_total, t.kv_bytes_per_token_total, t.tp_size)
    d = memory.engine("draft")
    draft = (
        R.EngineCost(d.num_parameters, d.weight_bytes_total, d.kv_bytes_per_token_total, d.tp_size)
        if d
        else None
    )
    traffic = req.traffic
    seq = traffic.input_len + traffic.output_len
    if seq > spec.build.max_seq_len:
        raise PlanError(
            "requests longer than the engines take",
            expected=f"input + output <= build.max_seq_len ({spec.build.max_seq_len})",
            found=f"{traffic.input_len} + {traffic.output_len} = {seq}",
            fix="lower --input-len / --output-len or raise the spec's max_seq_len",
        )
    limit = min(spec.build.max_batch_size, max(1, memory.kv_tokens // seq))
    concurrencies = [c for c in (2**i for i in range(17)) if c <= limit]
    if concurrencies[-1] != limit:
        concurrencies.append(limit)
    base = C.Curve(
        "baseline",
        "predicted",
        spec.target.world_size,
        R.baseline_points(
            target, gpu, concurrencies, input_len=traffic.input_len, output_len=traffic.output_len
        ),
        f"roofline on {gpu.name} (bandwidth x {R.BW_EFFICIENCY}, compute x {R.COMPUTE_EFFICIENCY}); "
        f"concurrency up to {limit} (max_batch_size {spec.build.max_batch_size}, "
        f"KV for {memory.kv_tokens} tokens)",
    )
    method = method_of(spec)
    tree = method.tunes is Tunable.TREE
    if tree and profile is None:
        raise PlanError(
            "no acceptance for a tree method",
            expected="--profile (the JSON of `specbuild tune SPEC --json`)",
            found="neither a bench report nor a profile",
            fix="profile the heads with `specbuild tune`, or plan from a bench report",
        )
    if profile is not None:
        e = profile.tokens_per_pass(k)
        what = f"E = {e:.3f} tokens per pass from the profile {profile.source}"
    else:
        alpha = req.alpha if req.alpha is not None else DEFAULT_ALPHA
        e = R.tokens_per_pass(alpha=alpha, acceptance=None, k=k)
        what = f"E = {e:.3f} tokens per pass from an ASSUMED alpha {alpha:g} (i.i.d.)"
        notes.append(
            f"speculation predicted with an assumed acceptance alpha {alpha:g}: measure it (`tune`, `bench`)"
        )
        if not method.drafts_every_round:
            notes.append(
                f"{method.title} rounds draft 0..K tokens (none without a match): an i.i.d. alpha over K "
                "drafts is a rough stand-in; `tune --json` measures E (pass it as --profile)"
            )
    verify = (spec.medusa_choices().size + 1) if tree else k + 1
    spec_points = R.speculative_points(
        target,
        draft if method.draft_model else None,
        gpu,
        concurrencies,
        input_len=traffic.input_len,
        output_len=traffic.output_len,
        k=k if method.draft_model else 0,
        tokens_per_pass=e,
        verify_tokens=verify,
    )
    spec_curve = C.Curve(
        "speculative",
        "predicted",
        spec.num_gpus,
        spec_points,
        f"roofline on {gpu.name}, K={k}, verify {verify} tokens/sequence, {what}",
    )
    notes.append("throughput and latency are PREDICTED (roofline, no measurement): see docs/plan.md")
    cost = (
        R.predicted_cost_ratio(target, draft, gpu, context=seq / 2) if draft and method.draft_model else None
    )
    return base, spec_curve, cost


def _claim(req: PlanRequest, sizings: dict[str, C.Sizing | None]) -> dict[str, Any]:
    gb, gs = req.claim
    b, s = sizings.get("baseline"), sizings.get("speculative")
    out: dict[str, Any] = {"baseline_gpus": gb, "speculative_gpus": gs}
    if not b or not s:
        return {**out, "holds": None, "why": "a side has no operating point"}
    out["holds"] = b.gpus == gb and s.gpus == gs
    window = C.claim_window(b, s, base_gpus=gb, spec_gpus=gs)
    if window is None:
        out["window"] = None
        out["why"] = (
            f"no peak load gives exactly {gb} and {gs} GPUs with replicas of {b.gpus_per_replica} and "
            f"{s.gpus_per_replica} GPUs at these throughputs"
        )
        return out
    low, high = window
    avg = req.traffic.avg_output_tok_s
    out["window"] = {"peak_tok_s": [low, high], "of_average": [low / avg, high / avg]}
    out["why"] = (
        f"holds for a peak of {low:,.1f} to {high:,.1f} generated tok/s, "
        f"i.e. {low / avg:.2f}-{high / avg:.2f} x "
        f"the stated average of {avg:,.1f} tok/s"
    )
    if high / avg < 1:
        out["why"] += (
            f": only if the day's generated tokens are {low / avg:.0%}-{high / avg:.0%} of the stated figure "
            "(e.g. the figure counts prompt tokens too), at no peak above the average, at "
            f"{req.utilisation:.0%} utilisation"
        )
    elif math.isfinite(high):
        out["why"] += (
            f" (peak factor {max(low / avg, 1):.2f}-{high / avg:.2f} at {req.utilisation:.0%} utilisation)"
        )
    return out
