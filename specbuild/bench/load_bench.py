"""Load-aware benches: which modes `bench` runs side by side, and the summary over interleaved rounds.

Modes (same prompts, interleaved: every mode of one temperature and concurrency runs once per round,
`--rounds` rounds):
* `baseline`: num_draft_tokens = 0, the target alone (BLS-driven methods only);
* `speculative`: a fixed K sent with every request (the repository's K, and each `--fixed-k`);
* `schedule`: num_draft_tokens left out, so the BLS's `draft_len_schedule` picks each round's K from the
  requests in flight (only when the repository has a schedule).

`load_summary` gives, per temperature and concurrency, the median output-token throughput and request
latency of each mode over the rounds (with min and max), and the schedule's throughput over the
baseline's and over the best fixed K's — each ratio the median of the per-round ratios, so the load of
one round hits both sides of it alike; with `bench --aa-baseline`, "a_a": the one-call baseline's second
run of each round over its first (two runs of one configuration: the spread of no difference); with
`bench --calibrate`, each mode's measured / predicted tokens/s (median of the per-round ratios, and
their range). `bar_verdict` reads a ratio against its bar and the A/A; `plot_load` draws throughput
and latency against concurrency.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from specbuild.bench.metrics import UNARY_BASELINE, UNARY_BASELINE_AGAIN, UNARY_SCHEDULE  # one-call runs
from specbuild.core.perf.schedule_choice import spread

BASELINE_MODE, FIXED_MODE, SCHEDULE_MODE = "baseline", "speculative", "schedule"
# load benches (make demo's served curve and load table, make bench-load): a run at concurrency c sends
# >= LOAD_WAVES x c requests (BenchConfig.waves), so each closed-loop worker sends several and the run
# measures the loop's throughput, not one burst that ends with its slowest request
LOAD_WAVES = 4
# the bars the schedule is held to (issue #16; docs/schedule.md "Reading the bars on a noisy host")
ONE_CALL_BAR = 0.97  # schedule / the target alone, both in one call per request
FIXED_K_BAR = 0.95  # schedule / the best fixed K, both streamed
# bar_decision: the sign test's one-sided level. 5 rounds all on one side of a bar is the fewest that
# decides (2^-5 = 0.031); fewer rounds leave every bar undecided.
SIGN_ALPHA = 0.05


def bench_modes(repo, k: int | None, fixed_ks: tuple[int, ...] = ()) -> list[tuple[str, int | None]]:
    """(mode, num_draft_tokens to send) for the repository (None: leave the input out)."""
    if not repo.has_baseline:  # the engine speculates by itself (Medusa, every LLM-API repository)
        return [(FIXED_MODE, None)]
    modes: list[tuple[str, int | None]] = [(BASELINE_MODE, 0)]
    modes += [(FIXED_MODE, kk) for kk in sorted({k, *fixed_ks}) if kk]
    if repo.draft_len_schedule:
        modes.append((SCHEDULE_MODE, None))
    return modes


def _label(run) -> str:
    return f"K={run.num_draft_tokens}" if run.mode == FIXED_MODE else run.mode


def load_summary(runs) -> list[dict[str, Any]]:
    """One row per (temperature, concurrency): each mode's median throughput / latency and the ratios."""
    by_point: dict[tuple[float, int], dict[str, list]] = {}
    for run in runs:
        point = by_point.setdefault((run.temperature, run.concurrency), {})
        point.setdefault(_label(run), []).append(run)
    rows = []
    for (t, c), modes in sorted(by_point.items()):
        row: dict[str, Any] = {"temperature": t, "concurrency": c, "modes": {}}
        for label, rs in modes.items():
            thr = [r.metrics["output_token_throughput"] for r in rs]
            lat = [r.metrics["request_latency"]["avg"] for r in rs]
            row["modes"][label] = {
                "throughput_median": statistics.median(thr),
                "throughput_min": min(thr),
                "throughput_max": max(thr),
                "latency_median_ms": statistics.median(lat),  # request_latency is in ms
                "rounds": len(rs),
            }
            ratios = [
                r.metrics["output_token_throughput"] / r.metrics["predicted_tokens_per_s"]
                for r in rs
                if r.metrics.get("predicted_tokens_per_s")
            ]
            if ratios:  # measured / predicted (bench --calibrate): median of the per-round ratios
                row["modes"][label].update(
                    measured_over_predicted=statistics.median(ratios),
                    ratio_min=min(ratios),
                    ratio_max=max(ratios),
                )
            own = [
                r.metrics["output_token_throughput"] / r.metrics["predicted_own_rounds_tokens_per_s"]
                for r in rs
                if r.metrics.get("predicted_own_rounds_tokens_per_s")
            ]
            if own:  # the same with the run's own rounds (cost_model.with_rounds_of): the cost model alone
                row["modes"][label]["measured_over_cost_model"] = spread(own)
        if UNARY_BASELINE_AGAIN in modes and UNARY_BASELINE in modes:  # A/A: one configuration twice
            row["a_a"] = median_ratio(
                _per_round(modes[UNARY_BASELINE_AGAIN]), _per_round(modes[UNARY_BASELINE])
            )
        if SCHEDULE_MODE in modes:
            sched = _per_round(modes[SCHEDULE_MODE])
            if BASELINE_MODE in modes:
                base = _per_round(modes[BASELINE_MODE])
                row["schedule_over_baseline"] = median_ratio(sched, base)
            if UNARY_BASELINE in modes:  # the target alone in one call per request (no per-token round trip)
                row["schedule_over_baseline_unary"] = median_ratio(sched, _per_round(modes[UNARY_BASELINE]))
            if UNARY_SCHEDULE in modes and UNARY_BASELINE in modes:  # both in one call per request
                row["schedule_unary_over_baseline_unary"] = median_ratio(
                    _per_round(modes[UNARY_SCHEDULE]), _per_round(modes[UNARY_BASELINE])
                )
            fixed = [label for label in modes if label.startswith("K=")]
            if fixed:
                best = max(fixed, key=lambda label: row["modes"][label]["throughput_median"])
                row["best_fixed"] = best
                row["schedule_over_best_fixed"] = median_ratio(sched, _per_round(modes[best]))
            bars = bars_of(row)
            if bars:  # the sign test of each bar over the rounds (bar_decision)
                row["bars"] = bars
        rows.append(row)
    return rows


def bar_verdict(
    ratio: dict[str, float] | None, a_a: dict[str, float] | None, bar: float = ONE_CALL_BAR
) -> str:
    """How to read a ratio against its bar: "met" (median >= bar), "within A/A" (below the bar, but two
    runs of one configuration in the same bench differed at least as much: a_a's smaller ratio is no
    larger), "missed" (below both), "" (not measured)."""
    if not ratio:
        return ""
    if ratio["median"] >= bar:
        return "met"
    if a_a and min(a_a["min"], 1 / a_a["max"]) <= ratio["median"]:
        return "within A/A"
    return "missed"


def bar_decision(ratio: dict[str, float] | None, bar: float, alpha: float = SIGN_ALPHA) -> dict | None:
    """Is the median of the per-round ratios at or above the bar, at level alpha: the exact sign test
    (no assumption about the spread's shape; the rounds are paired runs of one minute each, independent
    of each other). With n rounds and s of them at or above the bar, under "the median is the bar" S is
    Binomial(n, 1/2): "met" when P(S >= s) <= alpha, "missed" when P(S <= s) <= alpha, else "undecided"
    (more rounds may decide it: `bench --max-rounds`). None when the ratio was not measured."""
    if not ratio or "ratios" not in ratio:
        return None
    n = len(ratio["ratios"])
    s = sum(1 for r in ratio["ratios"] if r >= bar)
    p_met = sum(math.comb(n, i) for i in range(s, n + 1)) / 2**n
    p_missed = sum(math.comb(n, i) for i in range(s + 1)) / 2**n
    verdict = "met" if p_met <= alpha else "missed" if p_missed <= alpha else "undecided"
    return {"verdict": verdict, "bar": bar, "at_or_above": s, "rounds": n, "p": min(p_met, p_missed)}


def bars_of(row: dict[str, Any]) -> dict[str, dict]:
    """The schedule's bars at one (T, c) with their sign-test decisions: the one-call bar (schedule in one
    call / the one-call baseline; streamed over streamed where no one-call runs exist) and the fixed-K
    bar (schedule / the best fixed K)."""
    one_call = row.get("schedule_unary_over_baseline_unary") or row.get("schedule_over_baseline")
    out = {}
    for name, ratio, bar in (
        ("one_call", one_call, ONE_CALL_BAR),
        ("fixed_k", row.get("schedule_over_best_fixed"), FIXED_K_BAR),
    ):
        decision = bar_decision(ratio, bar)
        if decision is not None:
            out[name] = decision
    return out


def undecided_points(rows: list[dict[str, Any]]) -> set[tuple[float, int]]:
    """(T, c) of load_summary's rows where a bar of the schedule is still undecided by the sign test:
    where `bench --max-rounds` adds a round."""
    return {
        (row["temperature"], row["concurrency"])
        for row in rows
        if any(d["verdict"] == "undecided" for d in row.get("bars", {}).values())
    }


def _per_round(runs) -> dict[int, float]:
    return {int(r.metrics.get("round", i)): r.metrics["output_token_throughput"] for i, r in enumerate(runs)}


def median_ratio(a: dict[int, float], b: dict[int, float]) -> dict[str, float] | None:
    """a / b per round (rounds in both): median, extremes, how many and each round's, in round order (None:
    no round in both)."""
    ratios = [a[i] / b[i] for i in sorted(a) if i in b and b[i] > 0]
    if not ratios:
        return None
    return {
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "rounds": len(ratios),
        "ratios": ratios,
    }


def load_table_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        cells = "  ".join(
            f"{label} {m['throughput_median']:.1f} tok/s "
            f"({m['throughput_min']:.1f}-{m['throughput_max']:.1f})"
            + (
                f" measured/predicted {m['measured_over_predicted']:.2f} "
                f"({m['ratio_min']:.2f}-{m['ratio_max']:.2f})"
                if m.get("measured_over_predicted")
                else ""
            )
            + (
                f" (with its own rounds {m['measured_over_cost_model']['median']:.2f})"
                if m.get("measured_over_cost_model")
                else ""
            )
            for label, m in row["modes"].items()
        )
        lines.append(f"T={row['temperature']:g} c={row['concurrency']}: {cells}")
        for key, what in (
            ("schedule_over_baseline", "schedule / baseline"),
            ("schedule_over_best_fixed", "schedule / best fixed K"),
            ("a_a", "A/A, the one-call baseline again / itself"),
        ):
            r = row.get(key)
            if r:
                extra = f" ({row['best_fixed']})" if key == "schedule_over_best_fixed" else ""
                lines.append(
                    f"    {what}{extra}: {r['median']:.3f} (median of {r['rounds']} rounds, "
                    f"{r['min']:.3f}-{r['max']:.3f})"
                )
        for name, d in row.get("bars", {}).items():
            lines.append(f"    {name.replace('_', '-')} bar {d['bar']}: {decision_text(d)}")
    return lines


def decision_text(d: dict) -> str:
    """'met (5 of 5 rounds >= 0.97, sign test p=0.031)'."""
    rounds = f"{d['at_or_above']} of {d['rounds']} rounds >= {d['bar']}"
    return f"{d['verdict']} ({rounds}, sign test p={d['p']:.3f})"


def plot_load(rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """load_T<t>.png per temperature: throughput and mean request latency vs concurrency per mode."""
    import matplotlib  # noqa: PLC0415 - the Agg backend, only when plotting

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    written = []
    for t in sorted({r["temperature"] for r in rows}):
        pts = [r for r in rows if r["temperature"] == t]
        labels = list(dict.fromkeys(label for r in pts for label in r["modes"]))
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
        for label in labels:
            xs = [r["concurrency"] for r in pts if label in r["modes"]]
            style = {"baseline": "k--", "schedule": "r-"}.get(label, "-")
            a1.plot(
                xs,
                [r["modes"][label]["throughput_median"] for r in pts if label in r["modes"]],
                style,
                marker="o",
                label=label,
                lw=2.5 if label == "schedule" else 1.2,
            )
            a2.plot(
                xs,
                [r["modes"][label]["latency_median_ms"] for r in pts if label in r["modes"]],
                style,
                marker="o",
                label=label,
                lw=2.5 if label == "schedule" else 1.2,
            )
        for ax, what in (
            (a1, "output tokens/s (median of rounds)"),
            (a2, "request latency ms (median of rounds)"),
        ):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrency")
            ax.set_ylabel(what)
            ax.grid(alpha=0.3)
        a1.legend(fontsize=8)
        fig.suptitle(f"baseline, fixed K and the schedule through Triton (T={t:g})")
        fig.tight_layout()
        path = out / f"load_T{t:g}.png"
        out.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
