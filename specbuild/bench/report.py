"""Benchmark reports: bench.json, bench.csv, PNG plots (matplotlib, Agg) and a console table."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from specbuild.bench.aiperf_export import AIPERF_VERSION, record_lines, run_export
from specbuild.bench.load_bench import load_summary, plot_load
from specbuild.bench.metrics import RunSummary
from specbuild.core.formats.safe_io import InputFileError, read_json, shorten
from specbuild.core.formats.speculation_profile import FILE_NAME as PROFILE_FILE
from specbuild.core.formats.speculation_profile import build_profile
from specbuild.core.formats.speculation_profile import write_profile as save_profile

PLOTS = ("speedup_vs_concurrency.png", "throughput_vs_concurrency.png", "accepted_length_per_position.png")


def _clean(value: Any) -> Any:
    """NaN -> None so the JSON is standard."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_json(runs: list[RunSummary], context: dict[str, Any], path: Path) -> None:
    data = {"context": context, "runs": [_clean({**r.row(), "metrics": r.metrics}) for r in runs]}
    for run in data["runs"]:  # the flat copy is for CSV; JSON keeps metrics nested
        for key in list(run):
            if key not in (
                "mode",
                "temperature",
                "concurrency",
                "num_draft_tokens",
                "requests",
                "duration_s",
                "metrics",
            ):
                del run[key]
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_csv(runs: list[RunSummary], path: Path) -> None:
    rows = [r.row() for r in runs]
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            )


def write_plots(runs: list[RunSummary], out: Path) -> list[Path]:
    import matplotlib  # noqa: PLC0415 - the Agg backend must be chosen before pyplot loads

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - the Agg backend must be chosen before pyplot loads

    temps = sorted({r.temperature for r in runs})
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for t in temps:
        spec = sorted(
            (r for r in runs if r.mode == "speculative" and r.temperature == t), key=lambda r: r.concurrency
        )
        xs = [r.concurrency for r in spec]
        if any("speedup_measured" in r.metrics for r in spec):
            ax.plot(
                xs,
                [r.metrics.get("speedup_measured", float("nan")) for r in spec],
                "o-",
                label=f"measured T={t:g}",
            )
        if any("speedup_predicted" in r.metrics for r in spec):
            ax.plot(
                xs,
                [r.metrics.get("speedup_predicted", float("nan")) for r in spec],
                "x--",
                label=f"predicted T={t:g}",
            )
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(
        xlabel="concurrency",
        ylabel="speedup over target alone",
        title="Speculative speedup",
        xscale="log",
        xticks=[],
    )
    _finish(fig, ax, out / PLOTS[0], written)

    fig, ax = plt.subplots(figsize=(6, 4))
    for t in temps:
        for mode, style in (("baseline", "s-"), ("speculative", "o-")):
            sel = sorted(
                (r for r in runs if r.mode == mode and r.temperature == t), key=lambda r: r.concurrency
            )
            if sel:
                ax.plot(
                    [r.concurrency for r in sel],
                    [r.metrics["output_token_throughput"] for r in sel],
                    style,
                    label=f"{mode} T={t:g}",
                )
    ax.set(
        xlabel="concurrency",
        ylabel="output tokens / s",
        title="Output token throughput",
        xscale="log",
        xticks=[],
    )
    _finish(fig, ax, out / PLOTS[1], written)

    fig, ax = plt.subplots(figsize=(6, 4))
    depth = 0
    for r in runs:
        per_pos = r.metrics.get("accepted_length_per_position") or []
        if r.mode == "speculative" and per_pos:
            depth = max(depth, len(per_pos))
            ax.plot(range(1, len(per_pos) + 1), per_pos, "o-", label=f"T={r.temperature:g} c={r.concurrency}")
    if depth:
        ax.set_xticks(range(1, depth + 1))
    ax.set(
        xlabel="draft position",
        ylabel="P(accepted through this position)",
        title="Accepted length per position",
        ylim=(0, 1.05),
    )
    _finish(fig, ax, out / PLOTS[2], written)
    return written


def _finish(fig, ax, path: Path, written: list[Path]) -> None:
    import matplotlib.pyplot as plt  # noqa: PLC0415 - the Agg backend must be chosen before pyplot loads

    if ax.get_xscale() == "log":
        ticks = sorted({int(x) for line in ax.get_lines() for x in line.get_xdata() if x > 0})
        ax.minorticks_off()  # log-axis minor labels (2x10^0, ...) would clutter integer concurrencies
        ax.set_xticks(ticks, [str(t) for t in ticks])
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    written.append(path)


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def table(runs: list[RunSummary]):
    """A rich Table: one row per run."""
    t = Table(title="specbuild bench (ms; tokens/s)")
    for col in (
        "mode",
        "T",
        "conc",
        "TTFT avg",
        "ITL avg",
        "latency p50",
        "latency p99",
        "out tok/s",
        "req/s",
        "accept",
        "tok/pass",
        "speedup",
        "vs 1-call",
        "predicted",
    ):
        t.add_column(col, justify="right" if col not in ("mode",) else "left")
    for r in runs:
        m = r.metrics
        t.add_row(
            r.mode,
            f"{r.temperature:g}",
            str(r.concurrency),
            _fmt(m["time_to_first_token"]["avg"], 1),
            _fmt(m["inter_token_latency"]["avg"], 1),
            _fmt(m["request_latency"]["p50"], 1),
            _fmt(m["request_latency"]["p99"], 1),
            _fmt(m["output_token_throughput"], 1),
            _fmt(m["request_throughput"], 2),
            _fmt(m.get("acceptance_rate")),
            _fmt(m.get("mean_accepted_tokens_per_pass")),
            _fmt(m.get("speedup_measured")),
            _fmt(m.get("speedup_measured_vs_unary")),
            _fmt(m.get("speedup_predicted")),
        )
    return t


AIPERF_FILE = "aiperf_metrics.json"  # every run's summary under AIPerf's metric tags
RECORDS_FILE = "records.jsonl"  # one AIPerf-shaped record per request (profile_export.jsonl's shape)


def _spec_k(run: RunSummary, context: dict[str, Any]) -> int | None:
    """K per step when fixed (the BLS's rounds); None for an engine that drafts by itself."""
    return (run.num_draft_tokens or None) if context.get("num_draft_tokens") is not None else None


def write_aiperf(runs: list[RunSummary], context: dict[str, Any], out: Path) -> list[Path]:
    exports, lines = [], []
    for run in runs:
        key = {"mode": run.mode, "temperature": run.temperature, "concurrency": run.concurrency}
        k = _spec_k(run, context)
        exports.append({**key, **run_export(run.records, duration_s=run.duration_s, num_spec_tokens=k)})
        lines += record_lines(run.records, run=key, num_spec_tokens=k)
    (out / AIPERF_FILE).write_text(
        json.dumps(_clean({"aiperf_version": AIPERF_VERSION, "context": context, "runs": exports}), indent=2)
        + "\n"
    )
    with open(out / RECORDS_FILE, "w") as f:
        for line in lines:
            f.write(json.dumps(_clean(line)) + "\n")
    return [out / AIPERF_FILE, out / RECORDS_FILE]


def write_profile(runs: list[RunSummary], context: dict[str, Any], out: Path) -> list[Path]:
    """speculation_profile.json from the lowest temperature's speculative runs (all concurrencies pooled),
    when their steps are known."""
    spec = [r for r in runs if r.mode == "speculative" and any(rec.rounds for rec in r.records)]
    if not spec:
        return []
    t = min(r.temperature for r in spec)
    chosen = [r for r in spec if r.temperature == t]
    requests = [rec.rounds for r in chosen for rec in r.records]
    k = max((d for req in requests for _, d in req), default=0)
    if k < 1:
        return []
    profile = build_profile(
        requests,
        num_speculative_tokens=_spec_k(chosen[0], context) or k,
        method=context.get("method") or context.get("mode") or "unknown",
        measurement_conditions={
            "engine": "specbuild bench through Triton",
            "served_model": context.get("model"),
            "temperature": t,
            "concurrency": sorted({r.concurrency for r in chosen}),
            "max_tokens": context.get("max_tokens"),
            "prompts": context.get("prompts"),
            "workload": context.get("workload"),
            **({"cost_ratio": context["cost_ratio"]} if context.get("cost_ratio") else {}),
        },
    )
    return [save_profile(profile, out / PROFILE_FILE)]


def write_report(runs: list[RunSummary], context: dict[str, Any], out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    write_json(runs, context, out / "bench.json")
    write_csv(runs, out / "bench.csv")
    files = [out / "bench.json", out / "bench.csv"]
    files += write_aiperf(runs, context, out)
    files += write_profile(runs, context, out)
    files += write_plots(runs, out)
    if is_load_bench(runs, context):
        rows = load_summary(runs)
        (out / "load.json").write_text(json.dumps(_clean({"context": context, "points": rows}), indent=2))
        files += [out / "load.json", *plot_load(rows, out)]
    return files


def is_load_bench(runs: list[RunSummary], context: dict[str, Any]) -> bool:
    """A bench with the schedule, several fixed K or several rounds: the load summary applies."""
    fixed = {r.num_draft_tokens for r in runs if r.mode == "speculative"}
    return bool(context.get("draft_len_schedule")) or len(fixed) > 1 or (context.get("rounds") or 1) > 1


# ---- reading bench.json back (specbuild plan) ----------------------------------------------------------


@dataclass(frozen=True)
class BenchRow:
    """One run of a bench.json, as `specbuild plan` uses it."""

    mode: str  # baseline | speculative
    temperature: float
    concurrency: int
    tokens_per_s: float  # output_token_throughput
    ttft_p99_ms: float | None
    itl_p99_ms: float | None  # None when the run was not streamed (one response per request)
    latency_p99_ms: float | None
    streamed: bool
    metrics: dict[str, Any]


def read_bench_json(path: Path) -> tuple[dict[str, Any], list[BenchRow]]:
    """(context, runs) of a report written by `write_json`; a malformed file is an InputFileError."""
    data = read_json(path, kind="manifest", what="bench report")
    runs = data.get("runs")
    if not isinstance(runs, list) or not isinstance(data.get("context"), dict):
        raise InputFileError(
            f"bench report {path} has no runs",
            expected='{"context": {...}, "runs": [...]} as `specbuild bench --out` writes it',
            found=shorten(sorted(data)),
            fix="point at the bench.json of a `specbuild bench` run",
        )
    rows = []
    for i, run in enumerate(runs):
        try:
            m = run["metrics"]
            ttft, latency = m["time_to_first_token"], m["request_latency"]
            # A run whose first token arrives with the last (TTFT ~ whole request) was not streamed:
            # its inter-token latency is not a per-token time. 0.9: streamed runs of >= 2 tokens have
            # TTFT well below the request latency; one-response runs have them equal up to clock noise.
            osl = (m.get("output_sequence_length") or {}).get("avg") or 0
            streamed = osl <= 1 or (ttft["avg"] or 0) < 0.9 * (latency["avg"] or 0)
            rows.append(
                BenchRow(
                    mode=str(run["mode"]),
                    temperature=float(run["temperature"]),
                    concurrency=int(run["concurrency"]),
                    tokens_per_s=float(m["output_token_throughput"]),
                    ttft_p99_ms=_num(ttft.get("p99")),
                    itl_p99_ms=_num(m["inter_token_latency"].get("p99")) if streamed else None,
                    latency_p99_ms=_num(latency.get("p99")),
                    streamed=streamed,
                    metrics=m,
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InputFileError(
                f"bench report {path}: run {i} is incomplete",
                expected="mode, temperature, concurrency and metrics with output_token_throughput, "
                "time_to_first_token, inter_token_latency and request_latency",
                found=f"{type(exc).__name__}: {shorten(str(exc))}",
                fix="regenerate it with `specbuild bench --out DIR`",
            ) from None
    return data["context"], rows


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
