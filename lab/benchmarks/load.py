"""`make bench-load`: the load-aware schedule on the demo family, measured against its own prediction.

For draft/target (the demo's trained target and distilled draft):
1. `tune --schedule --write` on a spec copy: acceptance per draft position, the cost curve on the
   reference engine (batch sizes 1, 2, 4, 8; K 0..max_draft_len), the predicted throughput per (c, K) and
   the schedule written into the spec (predicted.png);
2. in-process: the held-out prompts in lockstep batches of c (ReferenceEngine.generate_batch) for the
   baseline, every fixed K and the schedule, interleaved, `--rounds` rounds: measured / predicted per
   (c, K) (median of the per-round ratios);
3. through the local Triton: the cost curve measured through a served repository (`tune --schedule
   --url`'s measurement, bench/serve_curve.py: round time and TTFT per (c, K), on the tune prompts)
   combined with the profiled acceptance into the served prediction and schedule; then a repository
   with that schedule (`repo --schedule`) and `bench --concurrency 1,2,4,8` with baseline, every fixed K
   and the schedule interleaved in `--rounds` rounds (load.json, load_T0.png), measured / predicted per
   (c, K) on the held-out prompts;
4. `load.md`: the tables, with the machine load (`os.getloadavg`) before and after each part.

    python -m lab.benchmarks.load [--method draft_target|ngram|medusa] [--out build/bench-load] \
        [--prompts 8] [--max-tokens 48] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

from rich.console import Console

from lab.benchmarks.load_medusa import run_medusa
from lab.benchmarks.load_report import markdown
from lab.benchmarks.load_runs import (
    CONCURRENCY,
    DEFAULT_OUT,
    in_process,
    machine_load,
    served_rounds,
    write_spec,
)
from specbuild.bench.load_bench import (
    BASELINE_MODE,
    FIXED_MODE,
    LOAD_WAVES,
    SCHEDULE_MODE,
    load_summary,
    load_table_lines,
)
from specbuild.bench.metrics import UNARY_BASELINE, UNARY_BASELINE_AGAIN, UNARY_SCHEDULE
from specbuild.bench.options import load_prompts
from specbuild.bench.report import write_report
from specbuild.bench.serve_curve import (
    measure_served,
    predict_served,
)
from specbuild.core.methods import Method, Tunable, method_of
from specbuild.core.perf.schedule import DraftSchedule
from specbuild.core.spec import load_spec
from specbuild.demo.models import DEFAULT_CACHE, build_family
from specbuild.demo.pipeline import ServedBuild, compile_in_process, local_server, repo_in_process
from specbuild.engines.reference.engine import ReferenceEngine
from specbuild.tuning.cost_curve import plot
from specbuild.tuning.tune import round_tokens, tune_spec
from specbuild.tuning.tune_options import TuneOptions


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m lab.benchmarks.load", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--prompts", type=int, default=8, help="held-out demo prompts per run")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (medians reported)")
    parser.add_argument(
        "--max-rounds",
        type=int,
        default=0,
        help="after --rounds, one more round at each c whose bars the sign test leaves undecided, up to "
        "this many (0: no more)",
    )
    parser.add_argument(
        "--waves",
        type=int,
        default=LOAD_WAVES,
        help="a run at c sends >= WAVES x c requests (prompts cycled)",
    )
    parser.add_argument("--k", type=int, default=4, help="max_draft_len profiled and the largest fixed K")
    parser.add_argument("--demo-cache", type=Path, default=None)
    parser.add_argument("--skip-triton", action="store_true", help="in-process part only")
    parser.add_argument(
        "--skip-in-process",
        action="store_true",
        help="served part only (make demo checks tune's in-process prediction on held-out prompts)",
    )
    parser.add_argument("--method", choices=("draft_target", "ngram", "medusa"), default="draft_target")
    args = parser.parse_args(argv)
    console = Console(width=160)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    family = build_family(cache=args.demo_cache or DEFAULT_CACHE, log=console.print)
    texts = list(load_prompts(family.prompts))
    tune_texts, held = texts[: max(2, len(texts) - args.prompts)], texts[-args.prompts :]
    if method_of(Method(args.method)).tunes is Tunable.TREE:
        run_medusa(args, family, out, tune_texts[:8], held, console)
        return
    # jsonl: a prompt keeps its newlines (a .txt file is one prompt per line)
    (out / "tune_prompts.jsonl").write_text("".join(json.dumps({"prompt": t}) + "\n" for t in tune_texts[:8]))
    loads = {"start": machine_load()}

    spec_path = write_spec(out, family, k=args.k, method=args.method)
    options = TuneOptions(
        prompts=out / "tune_prompts.jsonl",
        max_tokens=args.max_tokens,
        k_max=args.k,
        write=True,
        schedule=True,
        concurrency=CONCURRENCY,
        plot=out / "predicted.png",
    )
    report = tune_spec(spec_path, options)
    prediction = report.details["schedule"]
    loads["after tune"] = machine_load()
    spec = load_spec(spec_path)
    schedule = (
        DraftSchedule.parse(spec.speculation.schedule, max_draft_len=spec.speculation.max_draft_len)
        if spec.speculation.schedule
        else None
    )
    console.print(
        f"schedule: {schedule.to_dict() if schedule else None} "
        f"(max_draft_len {spec.speculation.max_draft_len})"
    )
    served = ServedBuild(spec=spec_path, out=out)
    build = compile_in_process(served)
    engine = ReferenceEngine.load(build)
    prompt_ids = [engine.encode(t) for t in held]
    ks = list(range(1, spec.speculation.max_draft_len + 1))
    tune_ids = [engine.encode(t) for t in tune_texts[:8]]
    local = (
        {}
        if args.skip_in_process
        else in_process(build, prompt_ids, ks, args.rounds, args.max_tokens, tune_ids)
    )
    loads["after in-process"] = machine_load()
    result = {
        "method": args.method,
        "schedule": schedule.to_dict() if schedule else None,
        "prediction": prediction,
        "loads": loads,
    }
    result["in_process"] = {}
    for (c, label), v in local.items():
        measured = [m for m, _, _ in v]
        result["in_process"][f"{c}/{label}"] = {
            "tokens_per_s_median": statistics.median(measured),
            "min": min(measured),
            "max": max(measured),
            "predicted_median": statistics.median(p for _, p, _ in v),
            "measured_over_predicted": statistics.median(m / p for m, p, _ in v),
            "ratio_min": min(m / p for m, p, _ in v),
            "ratio_max": max(m / p for m, p, _ in v),
            "measured_over_cost_model": statistics.median(m / own for m, _, own in v),
        }
    if not args.skip_triton:
        acceptance, tokens = round_tokens(report)
        curve_repo = repo_in_process(replace(served, repo_dir="repo-curve", schedule="off"))
        with local_server(curve_repo) as server:
            curve = measure_served(
                server.grpc_url,
                tune_texts[:8],
                ks=ks,
                concurrency=CONCURRENCY,
                max_tokens=args.max_tokens,
                waves=args.waves,
            )
        served = predict_served(curve, acceptance, tokens=tokens)
        plot(served, out / "predicted_served.png")
        loads["after the served curve"] = machine_load()
        result["served_prediction"] = served
        # the repository's schedule: the spec's, or speculation off where no K pays at one request in flight
        text = served["repository_schedule"]
        result["served_schedule"] = text
        console.print(f"served schedule: {text}")
        repo = repo_in_process(replace(served, schedule=text))
        with local_server(repo) as server:
            url = server.grpc_url
            modes = [(url, BASELINE_MODE, 0), (url, UNARY_BASELINE, 0)] + [(url, FIXED_MODE, k) for k in ks]
            # streamed, and in one call per request (against the one-call baseline)
            modes += [(url, SCHEDULE_MODE, None), (url, UNARY_SCHEDULE, None)]
            modes.append((url, UNARY_BASELINE_AGAIN, 0))  # A/A: at the round's other end from the first
            runs = served_rounds(
                held,
                tune_texts[:8],
                modes,
                args.rounds,
                args.max_tokens,
                console,
                waves=args.waves,
                max_rounds=args.max_rounds,
            )
        loads["after Triton"] = machine_load()
        context = {
            "url": "local Triton (bench-load)",
            "mode": args.method,
            "draft_len_schedule": text,
            "rounds": max(run.metrics["round"] for run in runs) + 1,
            "max_tokens": args.max_tokens,
            "prompts": len(held),
        }
        write_report(runs, context, out / "triton")
        rows = load_summary(runs)  # with measured / predicted per mode (median of per-round ratios)
        result["triton"] = rows
        for line in load_table_lines(rows):
            console.print(line, markup=False)
    (out / "load_result.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "load.md").write_text(markdown(result))
    console.print((out / "load.md").read_text(), markup=False)


if __name__ == "__main__":
    main()
