"""Commands of the client stage: `bench` (and `generate --url`, in generate.py).

Only typer is imported at module level: `specbuild --help` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.bench import options as B
from specbuild.cli.common import (
    INPUT,
    OUT_DIR,
    MaxTokens,
    NumDraftTokens,
    Timeout,
    Url,
    command,
    console,
    parse_csv_numbers,
)

_csv = lambda values: ",".join(f"{v:g}" for v in values)  # noqa: E731


@command("bench")
def bench(
    url: Url,
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            help='JSONL with a "prompt" field per line, or '
            "plain text with one prompt per line (default: the bundled prompt set).",
        ),
        INPUT("--prompts file"),
    ] = None,
    concurrency: str = typer.Option(
        _csv(B.DEFAULT_CONCURRENCY), "--concurrency", help="Concurrent requests, comma list."
    ),
    max_tokens: MaxTokens = B.DEFAULT_MAX_TOKENS,
    temperature: str = typer.Option(
        _csv(B.DEFAULT_TEMPERATURES), "--temperature", help="Temperatures, comma list (0 = greedy)."
    ),
    num_draft_tokens: NumDraftTokens = None,
    out: Annotated[
        Path, typer.Option("--out", help="Folder for bench.json, bench.csv and PNG plots."), OUT_DIR
    ] = B.DEFAULT_OUT,
    timeout: Timeout = B.DEFAULT_TIMEOUT_S,
    rounds: Annotated[
        int,
        typer.Option(
            "--rounds", help="Interleaved repeats of every run; load.json reports medians and spread."
        ),
    ] = 1,
    max_rounds: Annotated[
        int,
        typer.Option(
            "--max-rounds",
            help="With a schedule: after --rounds, one more round at each concurrency whose bars "
            "(schedule >= 0.97 x the one-call baseline, >= 0.95 x the best fixed K) the sign test over "
            "the rounds leaves undecided, up to this many rounds (0: no more). 5 rounds decide at the "
            "earliest.",
        ),
    ] = 0,
    fixed_k: Annotated[
        str,
        typer.Option(
            "--fixed-k", help="Extra fixed K runs beside the repository's K, comma list (e.g. 2,4)."
        ),
    ] = "",
    metrics_url: Annotated[
        str | None,
        typer.Option(
            "--metrics-url",
            help="The server's Prometheus endpoint (http://HOST:8002/metrics): read its speculative "
            "counters around each run and cross-check them with the requests' own counts.",
        ),
    ] = None,
    workload: Annotated[
        str,
        typer.Option(
            "--workload",
            help="single: every prompt once per run; multiturn: conversations whose turns extend the "
            "previous context after a shared system prompt, with the prefix reuse of target and draft.",
        ),
    ] = "single",
    waves: Annotated[
        int,
        typer.Option(
            "--waves",
            help="single: each run at concurrency c sends at least WAVES x c requests (the prompts cycled), "
            "so every worker sends several and the run measures the closed loop, not one burst.",
        ),
    ] = 1,
    conversations: Annotated[
        int, typer.Option("--conversations", help="multiturn: conversations per run.")
    ] = B.DEFAULT_CONVERSATIONS,
    turns: Annotated[int, typer.Option("--turns", help="multiturn: user turns per conversation.")] = (
        B.DEFAULT_TURNS
    ),
    unary_baseline: Annotated[
        bool,
        typer.Option(
            "--unary-baseline/--no-unary-baseline",
            help="Also run the target alone in one unary call per request (throughput without the "
            "streamed baseline's per-token BLS -> target call): speedup 'vs 1-call'.",
        ),
    ] = True,
    streamed_baseline: Annotated[
        bool,
        typer.Option(
            "--streamed-baseline/--no-streamed-baseline",
            help="Run the target alone streamed (num_draft_tokens 0: one BLS -> target call per token).",
        ),
    ] = True,
    aa_baseline: Annotated[
        bool,
        typer.Option(
            "--aa-baseline/--no-aa-baseline",
            help="Run the one-call baseline a second time in every round, at the round's other end: "
            "load.json's a_a (its ratio to the first) is the spread of two runs of one configuration, "
            "against which a schedule / baseline ratio is read.",
        ),
    ] = False,
    calibrate: Annotated[
        Path | None,
        typer.Option(
            "--calibrate",
            help="Prompts (not the benched ones, e.g. the tune prompts) run right before every benched run "
            "with its concurrency and mode: the served cost model's calibration; each run then reports "
            "measured / predicted tokens/s (load.json: median of the rounds' ratios).",
        ),
        INPUT("--calibrate file"),
    ] = None,
) -> None:
    """Benchmark speculation off (target alone) vs on, per temperature and concurrency, through Triton.

    A repository with a load-aware schedule (`repo --schedule`, or the spec's speculation.schedule) also
    runs `schedule` (K per round from the requests in flight) beside the baseline and the fixed K runs,
    interleaved; load.json and load_T*.png compare them per concurrency (medians over --rounds).

    Reports genai-perf's metrics (time_to_first_token, inter_token_latency, request_latency avg/p50/p90/p99,
    output_token_throughput, request_throughput) and, for speculative runs, acceptance rate, mean accepted
    tokens per target pass, measured speedup and the speedup predicted from acceptance and the measured
    draft/target cost ratio. Medusa repositories have no speculation-off run (the engine always speculates).

    Also writes, in --out: aiperf_metrics.json (every run under AIPerf 0.13.0's metric tags and units),
    records.jsonl (one AIPerf-shaped record per request, with its spec-decode acceptance record) and
    speculation_profile.json (ModelOpt's schema 1.0, from the greedy speculative runs).
    """
    from specbuild.bench.bench import run_bench
    from specbuild.bench.load_bench import load_summary, load_table_lines
    from specbuild.bench.options import BenchConfig, default_prompts_file, load_prompts
    from specbuild.bench.report import is_load_bench, table, write_report

    config = BenchConfig(
        url=url,
        prompts=load_prompts(prompts or default_prompts_file()),
        concurrency=tuple(parse_csv_numbers(concurrency, int, "--concurrency")),
        temperatures=tuple(parse_csv_numbers(temperature, float, "--temperature")),
        max_tokens=max_tokens,
        num_draft_tokens=num_draft_tokens,
        timeout_s=timeout,
        rounds=rounds,
        max_rounds=max_rounds,
        fixed_ks=tuple(parse_csv_numbers(fixed_k, int, "--fixed-k")) if fixed_k else (),
        metrics_url=metrics_url,
        workload=workload,
        conversations=conversations,
        turns=turns,
        unary_baseline=unary_baseline,
        streamed_baseline=streamed_baseline,
        aa_baseline=aa_baseline,
        calibration_prompts=load_prompts(calibrate) if calibrate else (),
        waves=waves,
    )
    out_console = console()
    runs, context = run_bench(config, console=out_console)
    if workload == "multiturn":
        from specbuild.bench.multiturn import compare_reuse

        context["prefix_reuse"] = compare_reuse(runs)
    files = write_report(runs, context, out)
    out_console.print(table(runs))
    for row in context.get("prefix_reuse", []):
        draft = row["draft_reused_blocks_on"]
        out_console.print(
            f"prefix reuse T={row['temperature']:g} c={row['concurrency']}: target reused blocks "
            f"{row['target_reused_blocks_off']} (speculation off) vs {row['target_reused_blocks_on']} (on); "
            f"draft {draft if draft is not None else '-'} (on): {row['verdict']}"
        )
    for run in runs:
        check = run.metrics.get("prometheus_check")
        if check is not None:
            p, b = check["prometheus"], check["bench"]
            out_console.print(
                f"/metrics {run.mode} T={run.temperature:g} c={run.concurrency}: drafted {p['drafted']:g} / "
                f"{b['drafted']}, accepted {p['accepted']:g} / {b['accepted']} (server / requests): "
                + ("agree" if check["agree"] else "[red]DISAGREE[/]")
            )
    k = context.get("num_draft_tokens")
    out_console.print(f"method: {context['mode']}" + (f", K = {k}" if k is not None else ""))
    if is_load_bench(runs, context):
        for line in load_table_lines(load_summary(runs)):
            out_console.print(line, markup=False)
    c = context["cost_ratio"]
    out_console.print(
        f"cost ratio c = {c:.3f} ({context['cost_ratio_method']})"
        if c is not None
        else "cost ratio: not measured"
    )
    out_console.print("wrote " + ", ".join(str(f) for f in files))
