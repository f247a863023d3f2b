"""Two running servers, A/B: tokens/s of B over A in interleaved rounds, with an A/A beside it.

`bench --aa-baseline` compares modes of one server. When the two things to compare are two deployments
(the Medusa repository's schedule against another repository's target alone; a model before and after a
change), this runs, in every round, A, B and A again on the same prompts at the same concurrency (in
reverse order every other round: core/perf/schedule_choice.round_order), and reports per concurrency:

* B / A and A again / A: the median of the per-round ratios and their range (bench/load_bench);
* the bar's verdict, read against that A/A (bench/load_bench.bar_verdict): met / within A/A / missed;
* the mean tokens/s of each arm;
* with `--a-pid` / `--b-pid` (each server's `specbuild serve` process): the CPU seconds its process
  tree spent per run, by process (psutil). Equal CPU seconds for equal work say B did no more work
  than A, whatever its tokens/s; on this host the same work's CPU seconds still vary by ~10%.

    python -m lab.benchmarks.ab --a 127.0.0.1:8001 --b 127.0.0.1:8011 \\
        --a-mode baseline-unary --b-mode schedule-unary \\
        --prompts build/demo/draft_target/bench_prompts.jsonl \\
        --concurrency 8,4 --rounds 10 [--a-pid PID --b-pid PID] [--out ab.json]

A mode is one of the bench's one-call or streamed modes: `baseline-unary` (K = 0 in one call; the target
alone), `schedule-unary` (the repository's own K, in one call), `speculative` (its own K, streamed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from specbuild.bench.bench import run_once
from specbuild.bench.load_bench import ONE_CALL_BAR, bar_verdict, median_ratio
from specbuild.bench.options import BenchConfig, load_prompts
from specbuild.core.errors import SpecbuildError
from specbuild.core.perf.schedule_choice import round_order

MODES = {"baseline-unary": 0, "schedule-unary": None, "speculative": None}  # mode -> K sent (None: own)
MAX_ROUNDS = 100
ARMS = ("a", "b", "a_again")  # a round's runs, in this order in even rounds (reversed in odd ones)


@dataclass(frozen=True)
class Arm:
    url: str
    mode: str
    pid: int | None = None  # the server's process: its tree's CPU seconds per run


@dataclass(frozen=True)
class RunResult:
    tokens_per_s: float
    cpu_s: dict[str, float]  # CPU seconds per process name during the run ({} without a pid)


def plan(rounds: int, concurrency: Sequence[int]) -> list[tuple[int, int, str]]:
    """(round, c, arm) of every run: per round and c, A, B and A again, reversed every other round."""
    return [(r, c, arm) for r in range(rounds) for c in concurrency for arm in round_order(ARMS, r)]


def summarize(results: dict[tuple[int, int, str], RunResult], bar: float) -> dict[str, Any]:
    """Per c: B / A and A again / A (median and range of per-round ratios), the bar's verdict, mean tok/s
    of each arm, and the median CPU seconds per process of each arm's runs."""
    out: dict[str, Any] = {}
    for c in sorted({c for _, c, _ in results}):
        per = {
            arm: {r: res.tokens_per_s for (r, cc, a), res in results.items() if cc == c and a == arm}
            for arm in ARMS
        }
        b_over_a = median_ratio(per["b"], per["a"])
        a_a = median_ratio(per["a_again"], per["a"])
        cpu: dict[str, dict[str, float]] = {}
        for arm in ARMS:
            runs = [res.cpu_s for (_, cc, a), res in results.items() if cc == c and a == arm and res.cpu_s]
            names = sorted({n for run in runs for n in run})
            if names:
                cpu[arm] = {n: statistics.median(run.get(n, 0.0) for run in runs) for n in names}
        out[str(c)] = {
            "b_over_a": b_over_a,
            "a_a": a_a,
            "verdict": bar_verdict(b_over_a, a_a, bar),
            "bar": bar,
            "tokens_per_s": {arm: statistics.fmean(v.values()) for arm, v in per.items() if v},
            "cpu_s": cpu,
        }
    return out


def process_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) so far of `pid`'s process tree, summed by process name (a Python
    backend stub's name carries its model's: triton_python_backend_stub ... per model instance)."""
    totals: dict[str, float] = {}
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = _model_of(proc.cmdline()) or proc.name()
            t = proc.cpu_times()
        except psutil.Error:  # a process that ended meanwhile
            continue
        totals[name] = totals.get(name, 0.0) + t.user + t.system
    return totals


def _model_of(cmdline: list[str]) -> str | None:
    """The model a Python backend stub serves: the folder above its model.py's version folder."""
    for part in cmdline:
        path = Path(part)
        if path.name == "model.py" and len(path.parts) >= 3:
            return path.parent.parent.name
    return None


def run_ab(
    arms: dict[str, Arm],
    *,
    rounds: int,
    concurrency: Sequence[int],
    run: Callable[[Arm, int], float],
    cpu: Callable[[int], dict[str, float]] = process_cpu_s,
    on_run: Callable[[int, int, str, float], None] = lambda *_: None,
) -> dict[tuple[int, int, str], RunResult]:
    """Every run of plan(), each through `run(arm, c)` -> tokens/s, its server's CPU seconds around it."""
    results: dict[tuple[int, int, str], RunResult] = {}
    for r, c, name in plan(rounds, concurrency):
        arm = arms["a" if name == "a_again" else name]
        before = cpu(arm.pid) if arm.pid else {}
        rate = run(arm, c)
        after = cpu(arm.pid) if arm.pid else {}
        results[(r, c, name)] = RunResult(rate, {n: after[n] - before.get(n, 0.0) for n in after})
        on_run(r, c, name, rate)
    return results


def _served_run(prompts: tuple[str, ...], max_tokens: int, waves: int, timeout_s: float):
    def run(arm: Arm, c: int) -> float:
        config = BenchConfig(
            url=arm.url,
            prompts=prompts,
            concurrency=(c,),
            temperatures=(0.0,),
            max_tokens=max_tokens,
            waves=waves,
            timeout_s=timeout_s,
        )
        summary = run_once(
            config, mode=arm.mode, temperature=0.0, concurrency=c, k=MODES[arm.mode], advance=lambda: None
        )
        return summary.metrics["output_token_throughput"]

    return run


def table_lines(summary: dict[str, Any]) -> list[str]:
    def ratio(x):
        return "-" if not x else f"{x['median']:.3f} ({x['min']:.2f}-{x['max']:.2f})"

    lines = [
        "| c | B / A | A/A: A again / A | bar | tok/s A / B / A again |",
        "|---|---|---|---|---|",
    ]
    for c, row in summary.items():
        tps = row["tokens_per_s"]
        lines.append(
            f"| {c} | {ratio(row['b_over_a'])} | {ratio(row['a_a'])} | {row['verdict']} (>= {row['bar']}) | "
            + " / ".join(f"{tps.get(arm, 0):.1f}" for arm in ARMS)
            + " |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.benchmarks.ab", description=__doc__.split("\n")[0])
    parser.add_argument("--a", required=True, help="server A's gRPC address (host:port)")
    parser.add_argument("--b", required=True, help="server B's gRPC address")
    parser.add_argument("--a-mode", default="baseline-unary", choices=sorted(MODES))
    parser.add_argument("--b-mode", default="schedule-unary", choices=sorted(MODES))
    parser.add_argument("--a-pid", type=int, help="server A's `specbuild serve` pid: CPU seconds per run")
    parser.add_argument("--b-pid", type=int)
    parser.add_argument("--prompts", type=Path, required=True, help="a JSONL or text prompts file (bench's)")
    parser.add_argument("--concurrency", default="8")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--waves", type=int, default=4, help="a run at c sends >= WAVES x c requests")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--bar", type=float, default=ONE_CALL_BAR, help="B / A at least this (the verdict)")
    parser.add_argument("--out", type=Path, help="write the summary and every run's figures (JSON)")
    args = parser.parse_args(argv)

    try:
        if not 1 <= args.rounds <= MAX_ROUNDS:
            raise SpecbuildError(
                "--rounds out of range",
                expected=f"1 .. {MAX_ROUNDS}",
                found=str(args.rounds),
                fix="pass --rounds 10",
            )
        try:
            concurrency = tuple(int(x) for x in args.concurrency.split(",") if x.strip())
        except ValueError:
            raise SpecbuildError(
                f"--concurrency: cannot read {args.concurrency!r}",
                expected="comma-separated concurrencies, e.g. 8,4",
                found=args.concurrency,
                fix="pass --concurrency 8,4",
            ) from None
        prompts = load_prompts(args.prompts)
        for c in concurrency:  # BenchConfig checks every bound (concurrency, waves, max_tokens) up front
            BenchConfig(
                url=args.a, prompts=prompts, concurrency=(c,), max_tokens=args.max_tokens, waves=args.waves
            )
        arms = {"a": Arm(args.a, args.a_mode, args.a_pid), "b": Arm(args.b, args.b_mode, args.b_pid)}

        def progress(r, c, name, rate):
            print(f"round {r + 1}/{args.rounds} c={c} {name}: {rate:.1f} tok/s", file=sys.stderr, flush=True)

        results = run_ab(
            arms,
            rounds=args.rounds,
            concurrency=concurrency,
            run=_served_run(prompts, args.max_tokens, args.waves, args.timeout_s),
            on_run=progress,
        )
    except SpecbuildError as exc:  # expected / found / fix, no traceback
        print(exc, file=sys.stderr)
        return 2
    summary = summarize(results, args.bar)
    print("\n".join(table_lines(summary)))
    for c, row in summary.items():
        for arm, procs in row["cpu_s"].items():
            shown = ", ".join(
                f"{n} {s:.2f}" for n, s in sorted(procs.items(), key=lambda x: -x[1]) if s >= 0.01
            )
            print(f"c={c} {arm}: CPU s a run (median): {shown}")
    if args.out:
        runs = [
            {"round": r, "c": c, "arm": a, "tokens_per_s": v.tokens_per_s, "cpu_s": v.cpu_s}
            for (r, c, a), v in results.items()
        ]
        args.out.write_text(
            json.dumps(
                {"arms": {k: vars(v) for k, v in arms.items()}, "summary": summary, "runs": runs}, indent=2
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
