"""bench-load's load.md (lab/benchmarks/load.py): the tables of a load_result.json."""

from __future__ import annotations

import json
from pathlib import Path

from lab.benchmarks.load_runs import CONCURRENCY
from specbuild.bench.load_bench import (
    bar_verdict,
    decision_text,
)

OWN_ROUNDS_NOTE = "; then over the prediction with the run's own rounds: the cost model alone"


def _ratios(over_predicted: float, over_cost_model: float | None) -> str:
    own = f"; {over_cost_model:.2f}" if over_cost_model else ""
    return f" ({over_predicted:.2f}{own})"


def markdown(result: dict) -> str:
    lines = [
        f"# Load-aware schedule on the demo family ({result.get('method', 'draft_target')})",
        "",
        (
            f"served schedule (the tree where the tune prompts predict more than the one-call baseline): "
            f"`{result.get('served_schedule')}`"
            if "served_tune_points" in result["prediction"]  # a tree: on or off per concurrency
            else f"in-process schedule (`tune --schedule`, {result['prediction']['mode']} mode, in the spec):"
            " "
            f"`{result['schedule']}`; served schedule (`tune --schedule --url`, the Triton cost curve): "
            f"`{result.get('served_schedule')}`"
        ),
        "",
        "machine load (os.getloadavg): " + "; ".join(f"{k}: {v}" for k, v in result["loads"].items()),
        "",
    ]
    local = result["in_process"]
    if local:
        lines += [
            "## In-process (reference engine, lockstep batches of c), tokens/s, median of rounds "
            f"(measured/predicted, median of per-round ratios{OWN_ROUNDS_NOTE})",
            "",
        ]
        labels = list(dict.fromkeys(key.split("/", 1)[1] for key in local))
        lines.append("| c | " + " | ".join(labels) + " |")
        lines.append("|---" * (len(labels) + 1) + "|")
        for c in CONCURRENCY:
            cells = []
            for label in labels:
                m = local.get(f"{c}/{label}")
                ratio = (
                    _ratios(m["measured_over_predicted"], m.get("measured_over_cost_model"))
                    if m and m["measured_over_predicted"]
                    else ""
                )
                cells.append(f"{m['tokens_per_s_median']:.1f}{ratio}" if m else "")
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
    if "triton" in result:
        lines += [
            "",
            "## Through the local Triton (`bench`, interleaved rounds), tokens/s "
            f"(measured/predicted{OWN_ROUNDS_NOTE})",
            "",
        ]
        labels = list(dict.fromkeys(label for row in result["triton"] for label in row["modes"]))
        one_call = any("schedule_unary_over_baseline_unary" in row for row in result["triton"])
        a_a = any("a_a" in row for row in result["triton"])
        lines.append(
            "| c | "
            + " | ".join(labels)
            + " | schedule / baseline | schedule / one-call baseline | schedule / best fixed K |"
            + (" schedule (one call) / one-call baseline |" if one_call else "")
            + (" A/A: one-call baseline again / itself |" if a_a else "")
            + " bars (sign test over the rounds) |"
        )
        lines.append("|---" * (len(labels) + 5 + one_call + a_a) + "|")
        for row in result["triton"]:
            cells = []
            for label in labels:
                m = row["modes"].get(label)
                ratio = (
                    _ratios(
                        m["measured_over_predicted"], (m.get("measured_over_cost_model") or {}).get("median")
                    )
                    if m and m.get("measured_over_predicted")
                    else ""
                )
                cells.append(f"{m['throughput_median']:.1f}{ratio}" if m else "")
            sb, sf = row.get("schedule_over_baseline"), row.get("schedule_over_best_fixed")
            su = row.get("schedule_over_baseline_unary")
            cells.append(f"{sb['median']:.3f} ({sb['min']:.2f}-{sb['max']:.2f})" if sb else "")
            cells.append(f"{su['median']:.3f} ({su['min']:.2f}-{su['max']:.2f})" if su else "")
            cells.append(f"{sf['median']:.3f} vs {row.get('best_fixed')}" if sf else "")
            if one_call:
                uu = row.get("schedule_unary_over_baseline_unary")
                verdict = f" {bar_verdict(uu, row['a_a'])}" if uu and row.get("a_a") else ""
                cells.append(f"{uu['median']:.3f} ({uu['min']:.2f}-{uu['max']:.2f}){verdict}" if uu else "")
            if a_a:
                aa = row.get("a_a")
                cells.append(f"{aa['median']:.3f} ({aa['min']:.2f}-{aa['max']:.2f})" if aa else "")
            bars = row.get("bars", {})  # load_summary's sign test of each bar (none in older results)
            cells.append("; ".join(f"{n.replace('_', '-')}: {decision_text(d)}" for n, d in bars.items()))
            lines.append(f"| {row['concurrency']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def rewrite_markdown(out: Path) -> Path:
    """load.md again from load_result.json (after a change to the table layout)."""
    path = out / "load.md"
    path.write_text(markdown(json.loads((out / "load_result.json").read_text())))
    return path
