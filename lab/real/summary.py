"""`make demo-real`'s summary: one table (method x prompt set x concurrency, fixed K and schedule rows,
measured against the target alone), the exactness lines, one real answer per method, stage times and the
machine's load; OUT/summary.{json,md}."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from specbuild.bench.load_bench import SCHEDULE_MODE
from specbuild.core.methods import method_of
from specbuild.demo.commands import Ledger, console
from specbuild.demo.report import COLUMNS as DEMO_COLUMNS
from specbuild.demo.report import _fmt, load_bench, summary_rows


def machine_load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.1f} (1 min) / {five:.1f} (5 min) on {os.cpu_count()} cores"


def _user_text(prompt: str) -> str:
    return prompt.split("<|im_start|>user\n", 1)[-1].split("<|im_end|>", 1)[0]


def quoted_question(prompt: str) -> str:
    return "  > " + _user_text(prompt).replace("\n", "\n  > ")


def answer_record(prompt: str, stdout: str, stderr: str) -> dict:
    """`generate --stream`'s output as {question, answer, stats}: the streamed text (stdout) and its stats
    line, the last line on stderr."""
    lines = [line for line in stderr.splitlines() if " tokens, finish=" in line]
    return {
        "question": _user_text(prompt),
        "answer": stdout.rstrip("\n"),
        "stats": lines[-1] if lines else "",
    }


# the demo summary's columns after its (T, conc): the same figures, per method and prompt set
COLUMNS = ("method", "prompts", "conc", "K", *DEMO_COLUMNS[2:])
# "measured" is tok/s over the STREAMED target-alone baseline (one BLS -> target call per token); "vs 1-call"
# over the target alone answering each request in one call (bench's baseline-unary run), the fair baseline
HEADERS = {
    "measured": "vs streamed",
    "base ITL ms": "streamed base ITL ms",
    "base tok/s": "streamed base tok/s",
}


def _header(col: str) -> str:
    return HEADERS.get(col, col)


def _schedule_label(schedule: str | dict | None) -> str:
    """ "sched 1:8,3:0" from the bench context's "1:8,3:0" (the BLS's draft_len_schedule) or a mapping."""
    if not schedule:
        return ""
    if isinstance(schedule, dict):
        schedule = ",".join(f"{n}:{k}" for n, k in sorted((int(n), int(k)) for n, k in schedule.items()))
    return f"sched {schedule}"


def method_rows(
    bench: dict, lender: dict | None, lender_name: str, schedule: dict | None = None
) -> list[dict]:
    """Rows of one bench: each fixed-K run, then each `schedule` run (K per round from the requests in
    flight), both against the target alone. A repository whose engine drafts by itself (Medusa) has one
    run per concurrency, under `schedule` (its spec's; the bench context names only a BLS's schedule)."""
    label = _schedule_label(bench.get("context", {}).get("draft_len_schedule") or schedule)
    runs = bench["runs"]
    fixed = {**bench, "runs": [r for r in runs if r["mode"] != SCHEDULE_MODE]}
    rows = summary_rows(fixed, baseline_from=lender, lender=lender_name)
    k = bench.get("context", {}).get("num_draft_tokens")
    own_baseline = any(r["mode"] == "baseline" for r in runs)
    for row in rows:
        row["K"] = label if label and not own_baseline else (k if k is not None else "tree")
    scheduled = [dict(r, mode="speculative") for r in runs if r["mode"] == SCHEDULE_MODE]
    if scheduled:
        others = [r for r in runs if r["mode"] not in ("speculative", SCHEDULE_MODE)]
        for row in summary_rows(
            {**bench, "runs": others + scheduled}, baseline_from=lender, lender=lender_name
        ):
            rows.append({**row, "K": label})
    return sorted(rows, key=lambda r: r["conc"])  # stable: at each concurrency fixed K, then the schedule


def summary_table(
    benches: dict[str, dict[str, Path]], schedules: dict[str, dict] | None = None
) -> list[dict]:
    """One row per (method, prompt set, concurrency, K or schedule); a method without its own baseline
    (Medusa) is measured against another method's target-alone runs on the same prompts and concurrency."""
    loaded = {
        m: {s: load_bench(p) for s, p in sets.items() if Path(p).is_file()} for m, sets in benches.items()
    }
    rows = []
    for mode, sets in loaded.items():
        method = method_of(mode)
        for name, bench in sets.items():
            lender_name, lender = next(
                ((m, b[name]) for m, b in loaded.items() if method_of(m).has_baseline and name in b),
                ("", None),
            )
            lent = None if method.has_baseline else lender
            for row in method_rows(bench, lent, lender_name, (schedules or {}).get(mode)):
                rows.append({"method": mode, "prompts": name, **row})
    return rows


def print_summary(
    rows: list[dict], *, exact: list, out: Path, ledger: Ledger, loads: dict, extra: dict
) -> None:
    shown = console()
    table = Table(
        title="SmolLM2-135M-Instruct on the local Triton (reference engine, CPU), greedy, "
        "measured vs the target alone"
    )
    for col in COLUMNS:
        table.add_column(_header(col), justify="left" if col in ("method", "prompts") else "right")
    for row in rows:
        table.add_row(*(_fmt(row.get(c)) for c in COLUMNS))
    shown.print(table)
    for line in exact:
        shown.print(line.line(), markup=False)
    total = time.time() - ledger.started
    shown.print("stage times: " + ", ".join(f"{k} {v:.0f}s" for k, v in ledger.timings.items()))
    shown.print(f"total: {total:.0f}s; {loads['start']} at the start, {machine_load()} at the end")
    out.mkdir(parents=True, exist_ok=True)
    summary = {
        "rows": rows,
        "exactness": [asdict(line) | {"ok": line.ok} for line in exact],
        "exactness_lines": [line.line() for line in exact],
        "timings_s": {k: round(v, 1) for k, v in ledger.timings.items()},
        "total_s": round(total, 1),
        "load": {"start": loads["start"], "end": machine_load()},
        **extra,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "summary.md").write_text(summary_markdown(rows, summary))


def summary_markdown(rows: list[dict], summary: dict) -> str:
    """summary.md: the table, the exactness lines, one real answer per method, stage times and load."""
    md = ["| " + " | ".join(map(_header, COLUMNS)) + " |", "|" + "---|" * len(COLUMNS)]
    md += ["| " + " | ".join(_fmt(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    md += ["", "Conversion exactness (reference engine vs transformers, float32):", ""]
    for line in summary.get("exactness_lines", []):
        md.append(f"* {line}")
    for mode, rec in summary.get("answers", {}).items():
        md += ["", f"One answer through the server ({mode}), the question:", ""]
        md += ["> " + q for q in rec["question"].splitlines()] or ["> "]
        md += ["", "the answer:", "", "````text", rec["answer"], "````"]  # 4: the answer may hold ```
        if rec["stats"]:
            md += ["", rec["stats"]]
    md += ["", "Stage times (s): " + ", ".join(f"{k} {v:.0f}" for k, v in summary["timings_s"].items())]
    md += [
        f"Total {summary['total_s']:.0f} s; {summary['load']['start']} at the start, "
        f"{summary['load']['end']} at the end."
    ]
    return "\n".join(md) + "\n"
