"""`make bench-serve`: tokens/s through Triton vs in-process at concurrency 1 (goal: >= 0.9x, issue 16).

Uses the demo family (`specbuild.demo.models`: a trained target and a distilled draft, built once
into .cache/demo and reused) and compares, for each flow (`--flow engine|llmapi|both`), the same prompts
one at a time, in-process and through a local tritonserver, interleaved prompt by prompt (so both see
the same machine load), with and without speculation:
* engine: the draft/target spec compiled for the engine flow -> the Python-backend repository (BLS +
  tensorrt_llm_local): the target alone (`num_draft_tokens=0` to the BLS, streamed) and speculative (K
  drafts, BLS rounds);
* llmapi: the same spec compiled `--flow llmapi --engine reference` -> Triton's LLM-API `tensorrt_llm`
  model (`repo --backend llmapi-local`: speculation inside the executor, one request in, tokens out),
  with `speculative_config` (K) and without it (a copy of the repository whose model.yaml has none: the
  target alone, as an LLM-API deployment without speculation).
What is compared is checked equal: same K, method, max tokens and sampling (greedy), and every response's
tokens identical to the engine flow's in-process target alone (greedy speculation is exact).
Then, on the engine flow, the OpenAI frontend's tokens/s over direct-to-Triton's at each
`--frontend-concurrency` (serve_frontend.py: interleaved rounds, the ratio's spread), and the `bench` sweep
(speculation off/on per concurrency) writes its report into OUT.

    python -m lab.benchmarks.serve [--out build/bench-serve] [--flow both] [--prompts 8]
        [--max-tokens 48] [--threads 1] [--repeats 3] [--floor]

Both sides run with the same torch threads (`--threads`: the in-process engine's, and the served engine
processes' SPECBUILD_TORCH_THREADS); the output states them. Each (flow, mode, side) figure is the median
of `--repeats` interleaved passes over the prompts, with its spread. The per-round breakdown of the
engine flow's speculative requests comes from Triton's own statistics (each model's queue and compute
time per call) and the BLS's own timers (SPECBUILD_BLS_TIMINGS), next to the in-process time per round.
`--floor` also measures the Python backend's own cost per call on this machine (lab/benchmarks/ipc_floor.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import torch
from rich.console import Console

from lab.benchmarks.ipc_floor import format_floor, measure
from lab.benchmarks.serve_arms import (
    Arm,
    bls_breakdown,
    breakdown,
    engine_arms,
    local_side,
    read_bls_timings,
    run_arm,
    summarize,
    triton_stats,
)
from lab.benchmarks.serve_frontend import format_frontend, measure_frontend
from lab.benchmarks.serve_setup import build_repo, check_setup, without_speculation
from specbuild.bench.bench import run_bench
from specbuild.bench.options import BenchConfig, load_prompts
from specbuild.bench.report import table, write_report
from specbuild.client.remote import Session
from specbuild.core.generation import GenerationResult
from specbuild.core.sampling_params import SamplingParams
from specbuild.demo.pipeline import local_server
from specbuild.engines.reference.engine import ReferenceEngine

DEFAULT_OUT = Path("build/bench-serve")
GOAL_RATIO = 0.9  # Triton tokens/s over in-process tokens/s at concurrency 1, speculation on (issue 16)
SERVED_TORCH_THREADS = 1  # = the local engine models' DEFAULT_TORCH_THREADS
FLOWS = ("engine", "llmapi")
MODES = ("baseline", "speculative")
BLS_TIMINGS_ENV = "SPECBUILD_BLS_TIMINGS"  # = tensorrt_llm_bls/model.py TIMINGS_ENV


def run_engine_flow(
    args, out: Path, prompts: list[str], params: SamplingParams, expected: dict, console
) -> dict:
    build, repo = args.engine_build, args.engine_repo
    engine = ReferenceEngine.load(build)
    timings = out / "bls-timings"
    if args.bls_timings:
        shutil.rmtree(timings, ignore_errors=True)
        timings.mkdir(parents=True)
        os.environ[BLS_TIMINGS_ENV] = str(timings)  # the server's BLS processes inherit it
    flow: dict = {"repository": str(repo), "modes": {}, "sweep_report": None}
    try:
        with local_server(repo) as server, Session(server.grpc_url) as session:
            # one connection for all requests, as a serving client (and `bench`) keeps it
            for arm in engine_arms(engine, session, params, args.num_draft_tokens):
                checked = check_setup(
                    "engine", arm.mode, engine=engine, session=session, repo=repo, k=args.num_draft_tokens
                )
                before = {}

                def warm(url=server.grpc_url, before=before):  # the measured passes start here
                    for path in timings.glob("*"):
                        path.unlink()
                    before.update(triton_stats(url))

                measured = run_arm(arm, prompts, repeats=args.repeats, expected=expected, after_warm_up=warm)
                row = summarize(measured) | {"checked": checked}
                row["breakdown_per_round"] = breakdown(
                    before,
                    triton_stats(server.grpc_url),
                    triton_s=measured["triton"]["seconds"],
                    in_process_s=measured["in_process"]["seconds"],
                )
                if args.bls_timings:
                    b = row["breakdown_per_round"]
                    rows = read_bls_timings(timings)  # the measured passes' requests
                    row["bls_timers_per_round"] = bls_breakdown(
                        rows,
                        rounds=b["rounds"],
                        engine_ms={"draft": b["draft"]["total"], "target": b["target"]["total"]},
                    )
                flow["modes"][arm.mode] = row
            if args.frontend_concurrency:  # the OpenAI frontend on the same server: its cost as a ratio
                found = measure_frontend(
                    server.grpc_url,
                    prompts,
                    params,
                    k=args.num_draft_tokens,
                    concurrency=tuple(int(c) for c in args.frontend_concurrency.split(",")),
                    rounds=args.repeats,
                )
                flow["frontend"] = found
                console.print("\n".join(format_frontend(found)))
            if args.concurrency:
                config = BenchConfig(
                    url=server.grpc_url,
                    prompts=tuple(prompts),
                    max_tokens=args.max_tokens,
                    concurrency=tuple(int(c) for c in args.concurrency.split(",")),
                    temperatures=(0.0, 0.8),
                    num_draft_tokens=args.num_draft_tokens,
                    timeout_s=300,
                )
                runs, context = run_bench(config, console=console)
                write_report(runs, context, out)
                console.print(table(runs))
                flow["sweep_report"] = str(out / "bench.json")
    finally:
        os.environ.pop(BLS_TIMINGS_ENV, None)
    return flow


def run_llmapi_flow(
    args, out: Path, prompts: list[str], params: SamplingParams, expected: dict, console
) -> dict:
    build, repo, _ = build_repo(
        out,
        num_draft_tokens=args.num_draft_tokens,
        random_models=args.random_models,
        demo_cache=args.demo_cache,
        log=console.print,
        flow="llmapi",
    )
    plain = without_speculation(repo, out / "llmapi" / "repo-no-speculation")
    engine = ReferenceEngine.load(build)
    flow: dict = {"repository": str(repo), "repository_no_speculation": str(plain), "modes": {}}
    for mode, repository, k in (("baseline", plain, 0), ("speculative", repo, args.num_draft_tokens)):
        with local_server(repository) as server, Session(server.grpc_url) as session:
            checked = check_setup(
                "llmapi", mode, engine=engine, session=session, repo=repository, k=args.num_draft_tokens
            )

            def remote(prompt: str, session=session) -> GenerationResult:
                return session.generate(prompt, params, stream=True, timeout_s=300)

            arm = Arm("llmapi", mode, k, local_side(engine, params, k), remote)
            measured = run_arm(arm, prompts, repeats=args.repeats, expected=expected)
            flow["modes"][mode] = summarize(measured) | {"checked": checked}
    return flow


def print_flow(console, name: str, flow: dict) -> None:
    for mode in MODES:
        row = flow["modes"].get(mode)
        if row is None:
            continue
        ratios = row["ratio_per_pass"]
        verdict = "meets" if row["ratio"] >= GOAL_RATIO else "MISSES"
        console.print(
            f"{name:6s} {mode:11s} in-process {row['in_process_tokens_per_s']:8.1f} tok/s   Triton "
            f"{row['triton_tokens_per_s']:8.1f} tok/s   ratio {row['ratio']:.2f} (passes {min(ratios):.2f}-"
            f"{max(ratios):.2f}; {verdict} the {GOAL_RATIO}x goal)   per round: Triton "
            f"{row['triton_round_ms']:.2f} ms, in-process {row['in_process_round_ms']:.2f} ms"
        )
        b = row.get("breakdown_per_round")
        if b:
            console.print(
                f"       per Triton round: {b['triton_round_ms']:.2f} ms = draft {b['draft']['total']:.2f}"
                f" + target {b['target']['total']:.2f} + BLS rest {b['bls_rest_ms']:.2f} + client rest "
                f"{b['client_rest_ms']:.2f}"
            )
        t = row.get("bls_timers_per_round")
        if t and not t["statistics_time_the_calls"]:
            console.print(
                "       Triton's statistics do not time the engine calls (their models answer from a "
                "thread of their own): read the BLS timers, not 'BLS rest' or the hops"
            )
        if t:
            console.print(
                f"       BLS timers per round: exec {t['exec_ms']} (hop beyond the callee: {t['hop_ms']}), "
                f"{t['sends_per_round']:.2f} sends {t['send_ms']:.2f} ms, {t['asks_per_round']:.2f} asks "
                f"{t['ask_ms']:.2f} ms, own code {t['own_code_ms']:.2f} ms"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m lab.benchmarks.serve", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})"
    )
    parser.add_argument(
        "--flow",
        choices=(*FLOWS, "both"),
        default="both",
        help="engine (BLS), llmapi (LLM-API model) or both",
    )
    parser.add_argument("--prompts", type=int, default=8, help="held-out demo prompts to run")
    parser.add_argument("--max-tokens", type=int, default=48, help="new tokens per request")
    parser.add_argument(
        "--num-draft-tokens", type=int, default=4, help="K drafts per round (speculative runs)"
    )
    parser.add_argument(
        "--concurrency", default="1,2,4", help="engine-flow bench sweep concurrencies ('' skips the sweep)"
    )
    parser.add_argument(
        "--frontend-concurrency",
        default="1,4",
        help="concurrencies of the OpenAI frontend / direct-to-Triton ratio (engine flow; '' skips it)",
    )
    parser.add_argument(
        "--random-models",
        action="store_true",
        help="untrained models with the demo shapes instead of the trained demo family",
    )
    parser.add_argument(
        "--demo-cache", type=Path, default=None, help="demo family cache (default .cache/demo)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("SPECBUILD_TORCH_THREADS", SERVED_TORCH_THREADS)),
        help="torch threads of the in-process engine AND of each served engine process "
        f"(SPECBUILD_TORCH_THREADS; default {SERVED_TORCH_THREADS}, the served default)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="interleaved passes over the prompts")
    parser.add_argument(
        "--bls-timings",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the BLS's own per-round timers (engine flow; SPECBUILD_BLS_TIMINGS)",
    )
    parser.add_argument(
        "--floor", action="store_true", help="also measure the Python backend's cost per call (ipc_floor.py)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["SPECBUILD_TORCH_THREADS"] = str(args.threads)  # the server's engine processes inherit it

    console = Console(width=160)  # the bench table has 13 columns
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    flows = FLOWS if args.flow == "both" else (args.flow,)
    params = SamplingParams(max_tokens=args.max_tokens)  # greedy: the tokens are checked identical
    assert params.temperature == 0.0
    args.engine_build, args.engine_repo, prompts_file = build_repo(
        out,
        num_draft_tokens=args.num_draft_tokens,
        random_models=args.random_models,
        demo_cache=args.demo_cache,
        log=console.print,
    )
    prompts = list(load_prompts(prompts_file))[: args.prompts]
    expected: dict = {}  # prompt -> (tokens, who answered first): every arm must answer the same
    result = {
        "models": "random (demo shapes)" if args.random_models else "demo family",
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "sampling": "greedy",
        "stream": True,
        "num_draft_tokens": args.num_draft_tokens,
        "concurrency": 1,
        "torch_threads": {"in_process": torch.get_num_threads(), "served_engine_processes": args.threads},
        "repeats": args.repeats,
        "load_before": os.getloadavg(),
        "flows": {},
    }
    written = out / "bench_serve.json"

    def save(done: str) -> None:  # after each part, so a run stopped by a time limit keeps what it measured
        result["load_after"], result["done"] = os.getloadavg(), done
        result["tokens_identical"] = {
            "prompts": len(expected),
            "reference": sorted({who for _, who in expected.values()}),
        }
        written.write_text(json.dumps(result, indent=2) + "\n")

    for name in flows:
        run = run_engine_flow if name == "engine" else run_llmapi_flow
        result["flows"][name] = run(args, out, prompts, params, expected, console)
        print_flow(console, name, result["flows"][name])
        save(f"flow {name}")
        if args.floor and name == "engine":  # the floor next to the engine flow's figures (same load)
            result["floor"] = floor(args, out, console)
            save("floor")
    if args.floor and "floor" not in result:
        result["floor"] = floor(args, out, console)
        save("floor")
    console.print(
        f"torch threads: in-process {torch.get_num_threads()}, each served engine process {args.threads}; "
        f"greedy tokens identical on every flow, mode and side ({len(expected)} prompts)"
    )
    for name in flows:
        print_flow(console, name, result["flows"][name])
    save("all")
    console.print(f"wrote {written}")


def floor(args, out: Path, console) -> dict:
    found = measure(
        args.engine_repo,
        out / "floor" / "repo",
        calls=200,
        prompt_len=40,
        draft_len=args.num_draft_tokens,
        engine_build=args.engine_build,
    )
    console.print("\n".join(format_floor(found)))
    return found


if __name__ == "__main__":
    main()
