"""`make demo`: the whole specbuild pipeline on a CPU machine, with the commands a user would type.

Stages (each prints the real `specbuild ...` command it runs, in a subprocess of this virtualenv's
`specbuild`, so the demo proves the CLI itself):

1. models  - the trained demo family (target, draft, Medusa heads, EAGLE-3 draft) from
             `specbuild.demo.models`, cached under .cache/demo/ (a second run reuses it);
2. specs   - examples/demo/*.yaml copied to build/demo/specs/ (model paths made absolute), then
             `specbuild check` and `specbuild tune --write` on each copy (tune prompts: the first
             held-out family prompts and specbuild/data/demo_repetition_tune.jsonl, never a bench one);
3. compile - `specbuild compile --engine reference` for both modes, and the TensorRT-LLM plan a GPU
             host would run (`--engine trtllm --dry-run`, its build.sh printed);
4. serve   - `specbuild repo --backend python`, `specbuild serve` (local tritonserver),
             `specbuild generate --url --stream`, `specbuild bench` at concurrency 1 and 4 on two
             prompt sets: "usual" (the next held-out family prompts) and "repetition"
             (specbuild/data/demo_repetition_bench.jsonl: code whose continuation repeats earlier
             code, where n-gram drafting is meant to shine);
   llmapi  - the draft/target spec again on the LLM-API flow (`compile --flow llmapi --engine reference`,
             `repo --backend llmapi-local`, `repo check`), served through Triton's LLM-API tensor
             interface: `generate --url --stream` and `bench` at concurrency 1 (usual prompts);
   eagle3  - the EAGLE-3 spec (LLM-API flow only) the same way, benched like the other modes (both
             prompt sets, the bench concurrencies); its speedup is measured against the draft/target
             run's target-alone baselines, as Medusa's;
5. summary - one table per mode and prompt set (acceptance, tokens per pass, predicted vs measured
             speedup, TTFT, inter-token latency), every method side by side per prompt set, and the
             load-aware table (draft/target: after `tune --write` chose K, `tune --schedule --url`
             measures the served cost curve through the demo's own server and writes the schedule
             the repository serves into the spec, which is compiled and laid out again; the
             in-process lockstep model is checked on the bench prompts on the compiled engine
             (tuning/holdout.py), then `bench --concurrency 1,2,4,8 --rounds 3 --calibrate <tune
             prompts>` runs the one-call baseline, the fixed K and the schedule through Triton:
             tokens/s as median (range) of the rounds and measured / predicted of both, the plots),
             build/demo/summary.{json,md}; the server is always stopped.

Everything is written under build/demo/ (override with --out).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from specbuild.core.deployment import RepoKind
from specbuild.core.errors import SpecbuildError
from specbuild.core.methods import Method
from specbuild.demo.commands import Ledger, add_common_options, relative, rule, run_cli
from specbuild.demo.figures import figures_page, write_figures
from specbuild.demo.models import MICRO, DemoSettings, cpu_count
from specbuild.demo.pipeline import ServedBuild, run_compile, run_generate, run_repo, run_trtllm_plan, serving
from specbuild.demo.report import family_line, print_summary
from specbuild.demo.stages import (
    LLMAPI_ONLY,
    LLMAPI_RUN,
    MODES,
    REPETITION_BENCH,
    STALE_SCHEDULE_FILES,
    DemoOptions,
    prompts_subset,
    stage_bench,
    stage_check_and_tune,
    stage_in_process_check,
    stage_load_bench,
    stage_models,
    stage_served_schedule,
    stage_specs,
    tune_prompts_file,
)


def generate(url: str, prompt: str, max_tokens: int) -> None:
    print(f"prompt: {prompt!r}")
    run_generate(url, prompt, max_tokens)


def compile_mode(served: ServedBuild) -> None:
    """The reference engine for this CPU, and the TensorRT-LLM plan a GPU host would run."""
    run_compile(served)
    run_trtllm_plan(served.spec, served.out / "trtllm-plan")


def run_mode(mode: str, spec: Path, family, opts: DemoOptions, ledger: Ledger) -> dict[str, Path]:
    """Compile, lay out, serve, generate and bench one mode; returns {prompt set: bench.json}."""
    out = (Path(opts.out) / mode).resolve()
    out.mkdir(parents=True, exist_ok=True)
    served = ServedBuild(spec=spec, out=out, build_dir="reference")  # repo --backend python
    with ledger.stage(f"{mode}: compile"):
        compile_mode(served)
    with ledger.stage(f"{mode}: model repository"):
        run_repo(served)
    prompts = prompts_subset(
        family.prompts, out / "bench_prompts.jsonl", opts.bench_prompts, skip=opts.tune_prompts
    )
    first = json.loads(prompts.read_text().splitlines()[0])["prompt"]
    load_aware = mode == Method.DRAFT_TARGET.value  # its BLS enforces a load-aware schedule
    calibration = prompts_subset(family.prompts, out / "calibration_prompts.jsonl", opts.tune_prompts)
    if load_aware:
        schedule = out / "schedule"
        schedule.mkdir(parents=True, exist_ok=True)
        for stale in STALE_SCHEDULE_FILES:  # an earlier demo's (this run writes its own): not in this table
            (schedule / stale).unlink(missing_ok=True)
        # the schedule the repository serves comes from the cost curve of the server that serves it
        with (
            ledger.stage(f"{mode}: served cost curve and schedule"),
            serving(served.repo, out / "tritonserver-curve.log") as url,
        ):
            served_off = stage_served_schedule(spec, url, calibration, schedule, opts)
        with ledger.stage(f"{mode}: compile and repository again (the served schedule)"):
            compile_mode(served)
            served = replace(served, schedule=served_off)  # a schedule the spec cannot hold, else None
            run_repo(served)
        with ledger.stage(f"{mode}: in-process check of the cost model"):  # no server: a quiet CPU
            stage_in_process_check(served.build, prompts, calibration, schedule, opts)
    with (
        ledger.stage(f"{mode}: serve, generate, bench"),
        serving(served.repo, out / "tritonserver.log") as url,
    ):
        generate(url, first, opts.max_tokens)
        # K: the repository's (what tune chose)
        sets = {
            "usual": stage_bench(url, prompts, out / "bench", opts),
            "repetition": stage_bench(url, REPETITION_BENCH, out / "bench-repetition", opts),
        }
        if load_aware:  # the load-aware schedule: the one-call baseline, K, schedule
            sets["load"] = stage_load_bench(url, prompts, calibration, out / "bench-load", opts)
        return sets


def run_llmapi(
    spec: Path,
    family,
    opts: DemoOptions,
    ledger: Ledger,
    *,
    label: str = LLMAPI_RUN,
    folder: str = "draft_target-llmapi",
    every_set: bool = False,
) -> dict[str, Path]:
    """A spec on the LLM-API flow (the draft/target spec again, or EAGLE-3's): the options a GPU host would
    serve with trtllm-serve, plus reference engines, laid out as Triton's LLM-API model (`--backend
    llmapi-local`) and served here; generate and bench go through the LLM-API tensor interface: at
    concurrency 1 on the usual prompts, or (every_set) at the bench concurrencies on both prompt sets.
    Returns {prompt set: bench.json}."""
    out = (Path(opts.out) / folder).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # decoupled: the demo streams (the LLM-API repository's default is upstream's unary policy)
    served = ServedBuild(spec=spec, out=out, kind=RepoKind.LLMAPI_LOCAL, decoupled=True)
    with ledger.stage(f"{label}: compile, repository"):
        build = run_compile(served)
        options = build / "llmapi_options.yaml"
        print(f"--- {relative(str(options))} (trtllm-serve --config / Triton model.yaml keys) ---")
        print(options.read_text().rstrip())
        print(f"--- {relative(str(build / 'serve.sh'))} runs on a GPU host: ---")
        print(json.loads((build / "plan.json").read_text())["trtllm_serve"]["command"])
        run_cli("repo", "check", str(run_repo(served)))
    prompts = prompts_subset(
        family.prompts, out / "bench_prompts.jsonl", opts.bench_prompts, skip=opts.tune_prompts
    )
    first = json.loads(prompts.read_text().splitlines()[0])["prompt"]
    with (
        ledger.stage(f"{label}: serve, generate, bench"),
        serving(served.repo, out / "tritonserver.log") as url,
    ):
        generate(url, first, opts.max_tokens)
        if not every_set:
            return {"usual": stage_bench(url, prompts, out / "bench", replace(opts, concurrency="1"))}
        return {
            "usual": stage_bench(url, prompts, out / "bench", opts),
            "repetition": stage_bench(url, REPETITION_BENCH, out / "bench-repetition", opts),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specbuild.demo", description=__doc__.split("\n\n")[0])
    add_common_options(parser, DemoOptions)
    parser.add_argument(
        "--temperature", default=DemoOptions.temperatures, help="bench temperatures (default 0)"
    )
    parser.add_argument(
        "--mode", choices=[*MODES, "all", "both"], default="all", help="which deployment to run (default all)"
    )
    parser.add_argument(
        "--micro", action="store_true", help="tiny untrained models: checks the pipeline in a minute"
    )
    parser.add_argument(
        "--no-llmapi",
        action="store_true",
        help="skip the draft/target run through the LLM-API interface (compile --flow llmapi)",
    )
    parser.add_argument(
        "--figures",
        type=Path,
        default=None,
        help="after a full run, write its figures to this docs page (`make figures`: docs/figures/demo.md)",
    )
    args = parser.parse_args(argv)
    if args.figures is not None and args.micro:
        parser.error("--figures records a full run's figures: drop --micro")
    sys.stdout.reconfigure(line_buffering=True)  # our lines and the commands' output stay in order in a log
    opts = DemoOptions(
        out=args.out,
        cache=args.cache,
        concurrency=args.concurrency,
        temperatures=args.temperature,
        max_tokens=args.max_tokens,
        modes=MODES if args.mode in ("all", "both") else (args.mode,),
        llmapi=not args.no_llmapi,
        settings=MICRO if args.micro else DemoSettings(),
    )

    torch.set_num_threads(cpu_count())

    ledger = Ledger()
    benches: dict[str, dict[str, Path]] = {}
    tune_reports: dict[str, str] = {}
    family = None
    try:
        with ledger.stage("1. demo models (trained once, then cached)"):
            family, missing = stage_models(opts)
        modes = tuple(m for m in opts.modes if not missing.get(m))
        with ledger.stage("2. check and tune the demo specs"):
            specs = stage_specs(opts, modes)
            tune_prompts = tune_prompts_file(
                family.prompts, Path(opts.out) / "tune_prompts.jsonl", opts.tune_prompts
            )
            for mode in modes:
                tune_reports[mode] = stage_check_and_tune(specs[mode], tune_prompts, opts.tune_max_tokens)
        for mode in modes:
            try:
                if mode in LLMAPI_ONLY:
                    benches[mode] = run_llmapi(
                        specs[mode], family, opts, ledger, label=mode, folder=mode, every_set=True
                    )
                else:
                    benches[mode] = run_mode(mode, specs[mode], family, opts, ledger)
            except SpecbuildError as exc:
                ledger.failures.append(f"{mode}: {exc.what}")
                print(exc.message(), file=sys.stderr)
        if opts.llmapi and Method.DRAFT_TARGET.value in modes:
            try:
                benches[LLMAPI_RUN] = run_llmapi(specs[Method.DRAFT_TARGET.value], family, opts, ledger)
            except SpecbuildError as exc:
                ledger.failures.append(f"{LLMAPI_RUN}: {exc.what}")
                print(exc.message(), file=sys.stderr)
    except SpecbuildError as exc:
        ledger.failures.append(exc.what)
        print(exc.message(), file=sys.stderr)
    rule("summary")
    loads = {mode: sets.pop("load") for mode, sets in benches.items() if "load" in sets}
    summary = print_summary(
        benches,
        loads=loads,
        family_metrics=family.metrics if family else None,
        out=Path(opts.out),
        timings=ledger.timings,
        total_s=time.time() - ledger.started,
    )
    for failure in ledger.failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    if ledger.failures:
        if args.figures is not None:
            print(f"figures: {args.figures} not written (the run failed)", file=sys.stderr)
        return 1
    if args.figures is not None:
        write_figures(
            args.figures,
            figures_page(
                summary_md=(Path(opts.out) / "summary.md").read_text(),
                tune_reports={m: r for m, r in tune_reports.items() if r},
                family_line=family_line(summary.get("demo_family")),
                stage_times=ledger.timings,
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
