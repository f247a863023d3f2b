"""The outputs of `specbuild plan`: a rich table, the arithmetic in words, plan.json and plan.png."""

from __future__ import annotations

import json
import math
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from specbuild.core.perf.capacity import HOURS_PER_MONTH
from specbuild.planning.plan import CapacityPlan

PLOT = "plan.png"


def _money(x: float) -> str:
    return f"${x:,.0f}"


def render(plan: CapacityPlan) -> Group:
    t = plan.traffic
    head = Text(
        f"{plan.spec} ({plan.mode}, K={plan.k}) on {plan.gpu['name']} at "
        f"${plan.gpu['price_per_gpu_hour']:.2f}/GPU-hour\ntraffic: {t['basis']}; requests "
        f"{t['input_len']} prompt + {t['output_len']} generated "
        f"tokens, peak {t['peak_rps']:.2f} req/s\nlatency objective: {plan.objective}; utilisation "
        f"{plan.utilisation:.0%} of the operating point"
    )
    table = Table(title="specbuild plan (tokens are generated tokens)")
    for col in (
        "",
        "source",
        "conc",
        "tok/s/replica",
        "tok/s/GPU",
        "GPUs/replica",
        "replicas",
        "GPUs",
        "load@peak",
        "$/day",
        "$/month",
        "GPUs avg-sized",
        "$/1M tok",
    ):
        table.add_column(col, justify="left" if col in ("", "source") else "right")
    for curve in plan.curves:
        s = plan.sizings[curve.name]
        label = curve.source.upper() if curve.source == "predicted" else curve.source
        if s is None:
            table.add_row(curve.name, label, *["-"] * 11)
            continue
        table.add_row(
            curve.name,
            label,
            str(s.concurrency) if s.concurrency is not None else "?",
            f"{s.tokens_per_s_per_replica:,.1f}",
            f"{s.tokens_per_s_per_gpu:,.1f}",
            str(s.gpus_per_replica),
            str(s.replicas),
            str(s.gpus),
            f"{s.load_at_peak:.0%}",
            _money(s.cost_per_day),
            _money(s.cost_per_month),
            str(s.gpus_autoscaled),
            f"${s.cost_per_million_tokens:.3f}",
        )
    return Group(head, table, Text("\n".join(explain(plan))))


def explain(plan: CapacityPlan) -> list[str]:
    """The arithmetic behind the table, in words (the seed's claim is checked the same way)."""
    t = plan.traffic
    lines = []
    for curve in plan.curves:
        s = plan.sizings[curve.name]
        if s is None:
            continue
        lines.append(
            f"{curve.name}: average {t['avg_output_tok_s']:,.1f} tok/s / "
            f"{s.tokens_per_s_per_gpu:,.1f} tok/s per GPU = {s.gpus_ideal_average:.1f} GPUs at 100% and no "
            f"peak; peak {t['peak_output_tok_s']:,.1f} tok/s / "
            f"({s.tokens_per_s_per_replica:,.1f} x {s.utilisation:.0%}) = "
            f"{t['peak_output_tok_s'] / (s.tokens_per_s_per_replica * s.utilisation):.2f} -> "
            f"{s.replicas} replicas of {s.gpus_per_replica} GPUs = {s.gpus} GPUs  "
            f"[{curve.source}: {curve.detail}]"
        )
    if plan.saving:
        sv = plan.saving
        lines.append(
            f"speculation saves {sv['gpus']} GPUs ({sv['gpus_ratio']:.2f}x fewer), "
            f"{_money(sv['cost_per_day'])}/day, "
            f"{_money(sv['cost_per_month'])}/month ({HOURS_PER_MONTH} h)"
        )
    be = plan.break_even
    if be.alpha is not None:
        lines.append(
            f"break-even acceptance: alpha {be.alpha:.3f} (K={be.alpha_inputs['k']}, "
            f"c={be.alpha_inputs['cost_ratio']:.3f});"
            " below it speculation is slower than the target alone"
        )
    if be.concurrency is not None:
        lines.append(
            f"break-even concurrency: above ~{be.concurrency:.1f} requests per replica the baseline is faster"
        )
    if be.min_throughput_ratio > 1:
        lines.append(
            f"the draft's extra GPUs need >= {be.min_throughput_ratio:.2f}x throughput per replica to pay off"
        )
    if be.saving_from_peak_tok_s is not None:
        lines.append(f"speculation needs fewer GPUs from a peak of {be.saving_from_peak_tok_s:,.1f} tok/s on")
    if plan.claim:
        c = plan.claim
        verdict = {True: "HOLDS here", False: "does NOT hold here", None: "cannot be checked"}[c["holds"]]
        lines.append(f"claim {c['baseline_gpus']} -> {c['speculative_gpus']} GPUs {verdict}; it {c['why']}")
    names = [c.name for c in plan.curves]
    lines.append(
        "GPUs by peak factor x utilisation ("
        + " / ".join(names)
        + "): "
        + "; ".join(
            f"{r['peak_factor']:g}x@{r['utilisation']:.0%}: "
            + "/".join(str(r[n]) if r[n] is not None else "-" for n in names)
            for r in plan.sensitivity
        )
    )
    lines += [f"note: {n}" for n in plan.notes]
    return lines


def write_json(plan: CapacityPlan, path: Path) -> None:
    path.write_text(json.dumps(_finite(plan.to_dict()), indent=2) + "\n")


def _finite(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write_plot(plan: CapacityPlan, path: Path) -> Path:
    """Left: tok/s per replica vs concurrency (the operating points marked). Right: GPUs vs traffic."""
    import matplotlib  # noqa: PLC0415 - the Agg backend must be chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - the Agg backend must be chosen before pyplot loads

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for i, curve in enumerate(plan.curves):
        pts = [p for p in curve.points if p.concurrency is not None]
        s = plan.sizings[curve.name]
        if pts:
            ax1.plot(
                [p.concurrency for p in pts],
                [p.tokens_per_s for p in pts],
                "o-",
                color=f"C{i}",
                label=f"{curve.name} ({curve.source})",
            )
            if s is not None and s.concurrency is not None:
                ax1.plot([s.concurrency], [s.tokens_per_s_per_replica], "k*", ms=12)
        elif s is not None:
            ax1.axhline(
                s.tokens_per_s_per_replica,
                ls="--",
                color=f"C{i}",
                label=f"{curve.name} ({curve.source}, no concurrency)",
            )
    ax1.set(
        xlabel="concurrency per replica",
        ylabel="generated tok/s per replica",
        title="Throughput per replica (* operating point)",
    )
    if any(p.concurrency for c in plan.curves for p in c.points):
        ax1.set_xscale("log", base=2)
    ax1.legend(fontsize=8)
    ax1.grid(alpha=0.3)

    peak = plan.traffic["peak_output_tok_s"]
    day_share = plan.traffic["avg_output_tok_s"] / peak  # tokens/day per unit of peak load
    loads = [peak * f for f in [x / 20 for x in range(1, 61)]]
    for curve in plan.curves:
        s = plan.sizings[curve.name]
        if s is None:
            continue
        cap = s.tokens_per_s_per_replica * s.utilisation
        ax2.step(
            [x * day_share * 86_400 / 1e6 for x in loads],
            [max(1, math.ceil(x / cap - 1e-9)) * s.gpus_per_replica for x in loads],
            where="post",
            label=f"{curve.name} ({curve.source})",
        )
    ax2.axvline(plan.traffic["avg_output_tok_s"] * 86_400 / 1e6, color="grey", ls=":", label="this traffic")
    ax2.set(
        xlabel="generated tokens per day (millions; same peak factor)", ylabel="GPUs", title="GPUs needed"
    )
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
