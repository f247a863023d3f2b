"""The demo's closing summary: one table per mode from the `specbuild bench` reports (bench.json).

Columns per (temperature, concurrency): acceptance rate alpha, mean accepted tokens per target pass,
predicted speedup (from alpha, K and the measured cost ratio c), measured speedup (speculative
output tokens/s over the target alone), TTFT and inter-token latency of both runs.

A Medusa engine always speculates, so its bench has no baseline of its own; its measured speedup is
taken against the draft/target run's baseline at the same temperature and concurrency, which serves
the same target model with the same prompts and lengths (marked "vs draft/target baseline").

Each mode may be benched on several prompt sets ("usual": the demo family's held-out prompts;
"repetition": prompts whose continuation repeats their own text); each set gets its rows, and one
comparison table puts every mode side by side per prompt set.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specbuild.bench.load_bench import FIXED_K_BAR, ONE_CALL_BAR, bar_verdict, decision_text
from specbuild.bench.metrics import UNARY_BASELINE, UNARY_BASELINE_AGAIN, UNARY_SCHEDULE
from specbuild.core.deployment import RepoKind
from specbuild.core.methods import method_of
from specbuild.core.perf import theory

COLUMNS = (
    "T",
    "conc",
    "accept",
    "tok/pass",
    "predicted",
    "measured",
    "TTFT ms",
    "ITL ms",
    "base ITL ms",
    "tok/s",
    "base tok/s",
    "1-call base tok/s",
    "vs 1-call",
)


def load_bench(path: Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


COMPARISON = ("prompts", "mode", "T", "conc", "accept", "tok/pass", "measured", "tok/s", "base tok/s")


def summary_rows(
    bench: dict[str, Any], *, baseline_from: dict[str, Any] | None = None, lender: str = "draft/target"
) -> list[dict[str, Any]]:
    """One row per speculative run; `baseline_from` (the bench of the method titled `lender`) supplies
    baselines the bench itself lacks (Medusa)."""
    base_runs = [r for r in bench["runs"] if r["mode"] == "baseline"]
    borrowed = False
    source = bench
    if not base_runs and baseline_from is not None:
        base_runs = [r for r in baseline_from["runs"] if r["mode"] == "baseline"]
        borrowed, source = True, baseline_from
    base = {(r["temperature"], r["concurrency"]): r["metrics"] for r in base_runs}
    # the target alone in one call per request (bench's baseline-unary run): no per-token BLS call
    unary = {
        (r["temperature"], r["concurrency"]): r["metrics"]
        for r in source["runs"]
        if r["mode"] == UNARY_BASELINE
    }
    rows = []
    for run in bench["runs"]:
        if run["mode"] != "speculative":
            continue
        m = run["metrics"]
        b = base.get((run["temperature"], run["concurrency"]))
        measured = m.get("speedup_measured")
        if measured is None and b and b.get("output_token_throughput"):
            measured = m["output_token_throughput"] / b["output_token_throughput"]
        u = unary.get((run["temperature"], run["concurrency"]))
        vs_unary = m["output_token_throughput"] / u["output_token_throughput"] if u else None
        rows.append(
            {
                "T": run["temperature"],
                "conc": run["concurrency"],
                "accept": m.get("acceptance_rate"),
                "tok/pass": m.get("mean_accepted_tokens_per_pass"),
                "predicted": m.get("speedup_predicted"),
                "measured": measured,
                "TTFT ms": m["time_to_first_token"]["avg"],
                "ITL ms": m["inter_token_latency"]["avg"],
                "base ITL ms": b["inter_token_latency"]["avg"] if b else None,
                "tok/s": m["output_token_throughput"],
                "base tok/s": b["output_token_throughput"] if b else None,
                "1-call base tok/s": u["output_token_throughput"] if u else None,
                "vs 1-call": vs_unary,
                "baseline": f"vs {lender} baseline" if borrowed and b else ("own baseline" if b else "none"),
            }
        )
    return rows


def _predict(rows: list[dict[str, Any]], bench: dict[str, Any], cost_ratio: float | None) -> None:
    """Fill the predicted speedup of rows whose bench could not time its draft (the LLM-API interface)."""
    if cost_ratio is None:
        return
    k = bench.get("context", {}).get("num_draft_tokens") or 0
    alphas = {(r["temperature"], r["concurrency"]): r["metrics"].get("alpha") for r in bench["runs"]}
    for row in rows:
        alpha = alphas.get((row["T"], row["conc"]))
        if row["predicted"] is None and alpha is not None and alpha == alpha and k:
            row["predicted"] = theory.predicted_speedup(alpha, k, cost_ratio)


def _fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def markdown(title: str, rows: list[dict[str, Any]], columns: tuple[str, ...] = COLUMNS) -> str:
    lines = [f"**{title}**", "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row[c]) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def family_line(family_metrics: dict | None) -> str | None:
    """The demo family's sizes and offline acceptance (models.py metrics.json), one line."""
    if not family_metrics:
        return None
    acc = family_metrics.get("held_out_greedy_acceptance", {})
    return (
        f"demo family: target {family_metrics['target_params'] / 1e6:.1f}M params, draft "
        f"{family_metrics['draft_params'] / 1e6:.2f}M; offline greedy acceptance per token "
        f"{_fmt(acc.get('alpha_token'))}, tokens per pass at K=4 {_fmt(acc.get('tokens_per_pass_k4'))}"
    )


def _by_set(benches: dict[str, Any]) -> dict[str, dict[str, Path]]:
    """mode -> {prompt set: bench.json}; a plain path is the "usual" set."""
    return {mode: v if isinstance(v, dict) else {"usual": v} for mode, v in benches.items()}


def print_summary(
    benches: dict[str, Path] | dict[str, dict[str, Path]],
    *,
    family_metrics: dict | None,
    out: Path,
    timings: dict[str, float],
    total_s: float,
    loads: dict[str, Path] | None = None,
) -> dict[str, Any]:
    """Print the tables and write OUT/summary.json and OUT/summary.md; returns the summary.

    `benches`: mode -> bench.json, or mode -> {prompt set: bench.json}; `loads`: mode -> the bench.json of
    its load-aware run (load.json and the tune report beside it: load_table)."""

    # A log file (not a terminal) gets the full table instead of rich's 80-column default.
    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
    paths = _by_set(benches)
    loaded = {
        mode: {name: load_bench(p) for name, p in sets.items() if Path(p).is_file()}
        for mode, sets in paths.items()
    }
    loaded = {mode: sets for mode, sets in loaded.items() if sets}
    summary: dict[str, Any] = {
        "modes": {},
        "comparison": [],
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "total_s": round(total_s, 1),
    }
    md = []
    for mode, sets in loaded.items():
        for name, bench in sets.items():
            md.append(_mode_table(console, summary, mode, name, bench, loaded, paths))
    if summary["comparison"]:
        table = Table(title="every method side by side (measured speedup: over the target alone)")
        for col in COMPARISON:
            table.add_column(col, justify="right")
        for row in summary["comparison"]:
            table.add_row(*(_fmt(row[c]) for c in COMPARISON))
        console.print(table)
        md.append(markdown("every method side by side", summary["comparison"], COMPARISON))
    for mode, path in (loads or {}).items():
        section = load_table(Path(path))
        if section is not None:
            title, rows, plots = section
            summary.setdefault("load_aware", {})[mode] = {"rows": rows, "plots": plots}
            table = Table(title=f"{mode}: {title}")
            for col in rows[0]:
                table.add_column(col, justify="right")
            for row in rows:
                table.add_row(*(_fmt(v) for v in row.values()))
            console.print(table)
            md.append(markdown(f"{mode}: {title}", rows, tuple(rows[0])))
            md.append("plots: " + ", ".join(f"`{p}`" for p in plots) + "\n")
            for plot in plots:
                console.print(f"plot (load-aware): {plot}")
    if family_metrics:
        summary["demo_family"] = family_metrics
        console.print(family_line(family_metrics))
    for mode in loaded:
        for plot in summary["modes"][mode]["plots"]:
            console.print(f"plot: {plot}")
    for mode, sets in loaded.items():
        for name in sets:
            if name != "usual":
                for plot in summary["modes"][mode]["sets"][name]["plots"]:
                    console.print(f"plot ({name} prompts): {plot}")
    console.print("stage times: " + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()))
    console.print(f"total: {total_s:.0f}s")
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "summary.md").write_text("\n".join(md))
    return summary


def _cell(spread: dict[str, float] | None, fmt: str = ".2f") -> str:
    """median (min-max) of a measured spread, or "-"."""
    if not spread or spread.get("median") is None:
        return "-"
    m, lo, hi = spread["median"], spread.get("min"), spread.get("max")
    if lo is None or hi is None or lo == hi:
        return format(m, fmt)
    return f"{m:{fmt}} ({lo:{fmt}}-{hi:{fmt}})"


def _bar_cell(point: dict, name: str, ratio: dict | None, bar: float) -> str:
    """A bar's reading: against the A/A spread (bench/load_bench.bar_verdict) and, over the rounds, the
    sign test (bar_decision; `bench --max-rounds` adds rounds where it is undecided)."""
    parts = []
    if point.get("a_a"):
        parts.append(bar_verdict(ratio, point["a_a"], bar))
    decision = point.get("bars", {}).get(name)
    if decision:
        parts.append(f"sign test: {decision_text(decision)}")
    return "; ".join(p for p in parts if p)


def load_table(bench_json: Path) -> tuple[str, list[dict[str, Any]], list[str]] | None:
    """(title, rows, plots) of a load-aware bench: per concurrency and mode (the target alone, the
    repository's K, the schedule) the tokens/s through Triton and in-process, each as median (range) of
    the interleaved rounds, with measured / predicted (median of the rounds' ratios, range): through
    Triton against the served cost model calibrated on the tune prompts (`bench --calibrate`), in-process
    against the lockstep model calibrated the same way (tuning/holdout.py); and per concurrency the
    schedule over the one-call baseline and over the fixed K (medians of per-round ratios). The schedule
    is the served one (SCHEDULE/served.json, `tune --schedule --url`), or an older in-process one
    (tune.json). None when files are missing."""
    folder = bench_json.parent
    schedule_dir = folder.parent / "schedule"
    tune = schedule_dir / "tune.json"
    served_path = schedule_dir / "served.json"  # the schedule the repository served (tune --url)
    if not (folder / "load.json").is_file() or not (tune.is_file() or served_path.is_file()):
        return None
    points = json.loads((folder / "load.json").read_text())["points"]
    sched = (json.loads(tune.read_text())["details"].get("schedule") or {}) if tune.is_file() else {}
    served_sched = (
        (json.loads(served_path.read_text())["details"].get("schedule") or {})
        if served_path.is_file()
        else {}
    )
    local_path = schedule_dir / "in_process.json"
    local = json.loads(local_path.read_text()) if local_path.is_file() else {"points": {}}
    chosen = (served_sched or sched).get("chosen", {})
    chosen_in_process = sched.get("chosen", {})
    rows = []
    for point in points:
        c = point["concurrency"]
        for label, m in point["modes"].items():
            if label == "baseline":  # the streamed baseline (an older bench): not in this table
                continue
            served = {
                "median": m["throughput_median"],
                "min": m["throughput_min"],
                "max": m["throughput_max"],
            }
            ratio = (
                {"median": m["measured_over_predicted"], "min": m.get("ratio_min"), "max": m.get("ratio_max")}
                if m.get("measured_over_predicted")
                else None
            )
            inproc = local["points"].get(f"{c}/{'baseline' if label == UNARY_BASELINE else label}") or {}
            row = {
                "conc": c,
                "mode": {UNARY_BASELINE: "target alone", UNARY_BASELINE_AGAIN: "target alone again"}.get(
                    label, label
                ),
                "Triton tok/s": _cell(served, ".1f"),
                "Triton meas/pred": _cell(ratio),
                "in-process tok/s": _cell(inproc.get("tokens_per_s"), ".1f"),
                "in-process meas/pred": _cell(inproc.get("measured_over_predicted")),
            }
            # measured over the prediction with the run's own rounds (the calibration's times): the cost
            # model's own error, without the held-out prompts' acceptance against the tune prompts'
            if m.get("measured_over_cost_model") or inproc.get("measured_over_cost_model"):
                row["Triton meas/pred, own rounds"] = _cell(m.get("measured_over_cost_model"))
                row["in-process meas/pred, own rounds"] = _cell(inproc.get("measured_over_cost_model"))
            if label == UNARY_BASELINE_AGAIN:  # A/A: the spread of two runs of one configuration
                row["A/A: again / target alone (Triton)"] = _cell(point.get("a_a"))
            if label in ("schedule", UNARY_SCHEDULE):  # streamed, and in one call per request
                row["sched K"] = chosen.get(str(c), chosen.get(c))
            if label == UNARY_SCHEDULE:  # against the one-call baseline, one call against one call
                one_call = point.get("schedule_unary_over_baseline_unary")
                row["sched (1 call) / 1-call (Triton)"] = _cell(one_call)
                row[f"1-call bar (>= {ONE_CALL_BAR})"] = _bar_cell(point, "one_call", one_call, ONE_CALL_BAR)
            if label == "schedule":
                if served_sched and chosen_in_process:  # an in-process curve chose another schedule
                    row["in-process sched K"] = chosen_in_process.get(str(c), chosen_in_process.get(c))
                row["sched / 1-call (Triton)"] = _cell(point.get("schedule_over_baseline_unary"))
                row["sched / fixed K (Triton)"] = _cell(point.get("schedule_over_best_fixed"))
                row[f"fixed-K bar (>= {FIXED_K_BAR})"] = _bar_cell(
                    point, "fixed_k", point.get("schedule_over_best_fixed"), FIXED_K_BAR
                )
                over = local.get("schedule_over_fixed", {})
                row["sched / fixed K (in-process)"] = _cell(over.get(str(c), over.get(c)))
            rows.append(row)
    if not rows:
        return None
    columns = dict.fromkeys(k for row in rows for k in row)
    rows = [{k: row.get(k, "") for k in columns} for row in rows]
    counts = sorted({m["rounds"] for point in points for m in point["modes"].values() if "rounds" in m})
    # bench --max-rounds: more rounds only where the sign test left a bar undecided
    rounds = (
        f"{counts[0]}-{counts[-1]}"
        if len(counts) > 1
        else json.loads((folder / "load.json").read_text()).get("context", {}).get("rounds")
    )
    if served_sched and sched:
        source = (
            f"served schedule {served_sched.get('schedule')} (tune --schedule --url: the cost curve through "
            f"this server) through Triton, in-process schedule {sched.get('schedule')} (the in-process cost "
            "curve) in-process"
        )
    elif served_sched and served_sched.get("schedule") is None and served_sched.get("repository_schedule"):
        source = (
            f"served schedule {served_sched['repository_schedule']}: off at every load (tune --schedule "
            "--url: no K > 0 beat the one-call target alone at one request in flight through this server; "
            "the repository carries it, the spec and the in-process engine keep the fixed K)"
        )
    elif served_sched:
        source = (
            f"served schedule {served_sched.get('schedule')} (tune --schedule --url: the cost curve through "
            "this server; the repository and the in-process engine both carry it)"
        )
    else:
        source = f"load-aware schedule {sched.get('schedule')} (tune --schedule, in-process cost curve)"
    title = (
        f"{source}: tokens/s, median (range) of {rounds or '?'} interleaved rounds; measured / predicted "
        "against the cost model calibrated on the tune prompts right before each run (through Triton: the "
        "served model, `bench --calibrate`; in-process: the lockstep loop, tuning/holdout.py); 'own rounds': "
        "the same prediction with each run's own rounds per request, the cost model's error without the "
        "held-out prompts' acceptance against the tune prompts'"
    )
    plots = [
        str(p)
        for p in (
            schedule_dir / "schedule_predicted.png",
            schedule_dir / "served_predicted.png",
            *sorted(folder.glob("load_T*.png")),
        )
        if p.is_file()
    ]
    return title, rows, plots


def _own_baseline(key: str, bench: dict[str, Any]) -> bool:
    """The run has a target-alone baseline of its own (a BLS that drives the rounds)."""
    ctx = bench.get("context", {})
    kind = RepoKind.of_interface(ctx.get("interface", RepoKind.ENGINE.interface))  # older runs: the BLS
    return kind.has_baseline(method_of(ctx.get("mode") or key))


def _mode_table(console, summary, mode, name, bench, loaded, paths) -> str:
    """Print one mode's table for one prompt set, record it in `summary`; returns its markdown."""
    ctx = bench.get("context", {})
    method = method_of(ctx.get("mode") or mode)  # the key may name a run ("draft_target (LLM API)")
    llmapi = RepoKind.of_interface(ctx.get("interface", RepoKind.ENGINE.interface)).llmapi
    # a run without its own baseline (the engine always speculates) borrows one of the same target
    lenders = [(m, s[name]) for m, s in loaded.items() if name in s and _own_baseline(m, s[name])]
    lender, lent = lenders[0] if lenders else (None, None)
    own = _own_baseline(mode, bench)
    lender_title = method_of(lent.get("context", {}).get("mode") or lender).title if lent else ""
    rows = summary_rows(bench, baseline_from=None if own else lent, lender=lender_title)
    if llmapi:
        # the same method through the BLS has the same draft and target: its cost ratio predicts this run
        twin = next(
            (
                s[name]
                for m, s in loaded.items()
                if m == method.name and name in s and _own_baseline(m, s[name])
            ),
            None,
        )
        c = (twin or {}).get("context", {}).get("cost_ratio")
        _predict(rows, bench, c)
        title = f"{mode}: Triton's LLM-API interface, K={ctx.get('num_draft_tokens')} (speculative_config)"
        if twin is not None:
            title += f", predicted with the {method.name} run's c={_fmt(c)}"
    elif method.bls_drives_loop:
        title = f"{mode}: K={ctx.get('num_draft_tokens')}, cost ratio c={_fmt(ctx.get('cost_ratio'))}"
    else:
        title = f"{mode}: tree from the tuned spec, c=0 (heads ride on the target pass)"
    if name != "usual":
        title += f"; {name} prompts"
    if rows and rows[0]["baseline"].startswith("vs "):
        title += f"; measured vs the {lender} run's target-alone baseline"
    table = Table(title=title)
    for col in COLUMNS:
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*(_fmt(row[c]) for c in COLUMNS))
    console.print(table)
    entry = {
        "context": ctx,
        "rows": rows,
        "plots": sorted(str(p) for p in Path(paths[mode][name]).parent.glob("*.png")),
    }
    if name == "usual":
        summary["modes"].setdefault(mode, {}).update(entry)
    summary["modes"].setdefault(mode, {}).setdefault("sets", {})[name] = entry
    summary["comparison"] += [{"prompts": name, "mode": mode, **row} for row in rows]
    return markdown(title, rows)
