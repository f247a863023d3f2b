"""`make demo`'s stages before and around serving: the demo models, the spec copies, check and tune, the
served schedule (`tune --schedule --url`), the load-aware bench and the in-process check of the cost model,
and the prompt files (tune and bench prompts never overlap). run.py drives them per mode."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from specbuild.bench.load_bench import LOAD_WAVES
from specbuild.core.methods import Method
from specbuild.core.perf.schedule import SERVED_OFF
from specbuild.demo.commands import REPO_ROOT, has_command, relative, run_cli, shown, specbuild_exe
from specbuild.demo.models import (
    DEFAULT_CACHE,
    DemoSettings,
    build_eagle3,
    build_family,
    build_medusa,
    link_current,
)
from specbuild.demo.pipeline import run_bench, spec_copy, write_spec_copy

DATA = Path(__file__).resolve().parents[1] / "data"
# Held-out prompts whose continuation naturally repeats their own text (written for specbuild: "complete
# this function" after similar functions, "the same function, edited"); tune and bench sets differ.
REPETITION_TUNE = DATA / "demo_repetition_tune.jsonl"
REPETITION_BENCH = DATA / "demo_repetition_bench.jsonl"
EXAMPLES = REPO_ROOT / "examples" / "demo"
MODES = tuple(
    m.value for m in Method if (EXAMPLES / f"{m.value}.yaml").is_file()
)  # examples/demo/<mode>.yaml
LLMAPI_RUN = "draft_target (LLM API)"  # the draft/target spec on the LLM-API flow, served locally
LLMAPI_ONLY = (Method.EAGLE3.value,)  # modes with no engine flow: served through the LLM-API model only


# what earlier demo runs wrote under <mode>/schedule/ (the in-process curve's report and plot, this run's
# files): removed before a run, so the summary never mixes two runs' schedules
STALE_SCHEDULE_FILES = (
    "tune.json",
    "schedule_predicted.png",
    "served.json",
    "served_predicted.png",
    "in_process.json",
)


@dataclass(frozen=True)
class DemoOptions:
    out: Path = Path("build/demo")
    cache: Path = DEFAULT_CACHE
    concurrency: str = "1,4"
    temperatures: str = "0"
    max_tokens: int = 64
    bench_prompts: int = 8  # of the held-out prompts; each runs baseline and speculative per concurrency
    tune_prompts: int = 8  # the first held-out prompts profile acceptance; bench uses the next ones
    tune_max_tokens: int = 48
    schedule_concurrency: str = "1,2,4,8"  # draft/target: tune --schedule batch sizes and the load bench
    load_rounds: int = 3  # interleaved rounds of the load bench, served and in-process (medians, spread)
    # the served load bench adds rounds (bench --max-rounds) where the sign test over the rounds leaves a
    # bar of the schedule undecided (bench/load_bench.bar_decision; 5 rounds decide at the earliest)
    load_max_rounds: int = 8
    load_waves: int = LOAD_WAVES  # served curve and load bench: a run at c sends >= load_waves x c requests
    modes: tuple[str, ...] = MODES
    llmapi: bool = True  # also serve the draft/target spec through the LLM-API interface (bench at c=1)
    settings: DemoSettings = DemoSettings()  # MICRO with --micro: a quick pipeline check, untrained models


def stage_models(opts: DemoOptions):
    """Build or reuse the trained demo family, Medusa heads and EAGLE-3 draft; link them where the specs
    look. Returns (family, {mode: False for a method whose model could not be built})."""
    settings = opts.settings
    family = build_family(settings, cache=opts.cache)
    heads = eagle3 = None
    if Method.MEDUSA.value in opts.modes:
        heads = build_medusa(family, settings, cache=opts.cache, specbuild=specbuild_exe())
    if Method.EAGLE3.value in opts.modes:
        eagle3 = build_eagle3(family, settings, cache=opts.cache, specbuild=specbuild_exe())
        if eagle3 is not None:
            report = json.loads((eagle3 / "metrics.json").read_text())
            print(f"EAGLE-3 draft: held-out greedy acceptance per position {report.get('acceptance')}")
    link_current(family, heads, cache=opts.cache, eagle3=eagle3)
    acc = family.metrics["held_out_greedy_acceptance"]
    print(
        f"target {family.metrics['target_params'] / 1e6:.1f}M params, draft "
        f"{family.metrics['draft_params'] / 1e6:.2f}M "
        f"params; held-out greedy draft acceptance per token {acc['alpha_token']:.2f}"
    )
    missing = {Method.MEDUSA.value: heads is None, Method.EAGLE3.value: eagle3 is None}
    return family, missing


def stage_specs(opts: DemoOptions, modes: tuple[str, ...]) -> dict[str, Path]:
    """Copy the example specs to OUT/specs/, model paths made absolute links in the cache (tune edits the
    copy)."""
    out = Path(opts.out) / "specs"
    out.mkdir(parents=True, exist_ok=True)
    specs = {}
    for mode in modes:
        source = EXAMPLES / f"{mode}.yaml"
        # the example names .cache/demo/<link>; the copy names the same link in opts.cache
        raw = spec_copy(source, opts.cache)
        specs[mode] = write_spec_copy(raw, out / source.name, source=source, by="make demo")
    return specs


def stage_check_and_tune(spec: Path, prompts: Path, max_tokens: int) -> str:
    """check, then tune --write (acceptance profiled on the tune prompts; K, tree or n-gram size). Returns
    the tune command as typed and what it printed (for the figures page)."""
    run_cli("check", str(spec))
    if not has_command("tune"):
        print("(`specbuild tune` is not in this checkout yet: the spec keeps its settings)")
        return ""
    args = ("tune", str(spec), "--prompts", str(prompts), "--max-tokens", str(max_tokens), "--write")
    done = run_cli(*args, capture=True)
    return f"$ {shown([specbuild_exe(), *args])}\n{done.stdout}"


def stage_served_schedule(
    spec: Path, url: str, prompts: Path, schedule: Path, opts: DemoOptions
) -> str | None:
    """`tune --schedule --url`: the cost curve measured through the running server (bench/serve_curve.py:
    per concurrency and K, closed-loop runs of `prompts`, 3 interleaved repeats, the one-call baseline as
    K=0) and the schedule it implies, written into the spec (comments kept). The in-process curve's
    schedule prices a lockstep batch; the served engines batch in flight, so the one-call baseline
    scales better than that curve says (docs/schedule.md). Report and plot in SCHEDULE/served.json,
    served_predicted.png. Returns the schedule the repository must be laid out with when the spec cannot
    hold it (core/perf/schedule.SERVED_OFF: speculation off at every load), else None (the spec has it)."""
    plot = schedule / "served_predicted.png"
    report = run_cli(
        "tune",
        str(spec),
        "--prompts",
        str(prompts),
        "--max-tokens",
        str(opts.tune_max_tokens),
        "--write",
        "--schedule",
        "--concurrency",
        opts.schedule_concurrency,
        "--url",
        url,
        "--waves",
        str(opts.load_waves),
        "--plot",
        str(plot),
        "--json",
        capture=True,
        show=False,
    ).stdout
    (schedule / "served.json").write_text(report)
    sched = json.loads(report)["details"].get("schedule") or {}
    for decision in sched.get("decisions", []):
        print(f"  c={decision['concurrency']}: {decision['reason']}")
    off = sched.get("schedule") is None and sched.get("repository_schedule") == SERVED_OFF
    shown = (
        f"{SERVED_OFF} (off at every load: the repository is laid out with --schedule {SERVED_OFF})"
        if off
        else sched.get("schedule")
    )
    print(
        f"served schedule (requests in flight -> K): {shown}; cost curve measured in "
        f"{sched.get('curve', {}).get('seconds', 0):.0f} s; predicted: {relative(str(plot))}"
    )
    return SERVED_OFF if off else None


def stage_bench(url: str, prompts: Path, out: Path, opts: DemoOptions, *extra: str) -> Path:
    """`specbuild bench` at the demo's concurrencies, temperatures and answer length; OUT/bench.json."""
    return run_bench(
        url,
        prompts,
        out,
        concurrency=opts.concurrency,
        temperature=opts.temperatures,
        max_tokens=opts.max_tokens,
        extra=extra,
    )


def stage_load_bench(url: str, prompts: Path, calibration: Path, out: Path, opts: DemoOptions) -> Path:
    """The load-aware bench: the one-call baseline, the repository's K and the schedule at every
    concurrency, `load_rounds` interleaved rounds, each (c, mode) first calibrated once on the tune
    prompts (`--calibrate`: the served cost model, so measured / predicted includes the serving path's
    own cost); tune's --max-tokens, so the in-process prediction applies to the same requests."""
    load = replace(
        opts, concurrency=opts.schedule_concurrency, temperatures="0", max_tokens=opts.tune_max_tokens
    )
    return stage_bench(
        url,
        prompts,
        out,
        load,
        "--rounds",
        str(opts.load_rounds),
        "--max-rounds",
        str(max(opts.load_max_rounds, opts.load_rounds)),
        "--calibrate",
        str(calibration),
        "--waves",
        str(opts.load_waves),
        "--no-streamed-baseline",  # the streamed baseline (one call per token) is in the bench above
        "--aa-baseline",  # the one-call baseline twice per round: the spread of no difference (A/A)
    )


def stage_in_process_check(
    build: Path, prompts: Path, calibration: Path, schedule: Path, opts: DemoOptions
) -> Path:
    """The in-process cost model checked on the bench prompts, on the compiled reference engine
    (tuning/holdout.py): the target alone, the repository's K and the schedule it carries in lockstep
    batches of c, `load_rounds` interleaved rounds, each run predicted from a calibration run on the
    tune prompts right before it; written to SCHEDULE/in_process.json (the summary's table)."""
    from specbuild.bench.options import load_prompts  # noqa: PLC0415
    from specbuild.engines.reference.engine import ReferenceEngine  # noqa: PLC0415
    from specbuild.tuning.holdout import check  # noqa: PLC0415

    engine = ReferenceEngine.load(build)
    concurrency = [int(c) for c in opts.schedule_concurrency.split(",")]
    carried = engine.schedule.to_dict() if engine.schedule is not None else None
    print(
        f"in-process check of the cost model: {prompts.name} in lockstep batches of c = {concurrency}, "
        f"target alone, K={engine.num_draft_tokens} and the schedule {carried}, {opts.load_rounds} "
        f"interleaved rounds of {opts.tune_max_tokens} tokens, each predicted from a run of "
        f"{calibration.name} right before it"
    )
    result = check(
        engine,
        [engine.encode(t) for t in load_prompts(prompts)],
        calibration=[engine.encode(t) for t in load_prompts(calibration)],
        fixed_k=engine.num_draft_tokens,
        concurrency=concurrency,
        rounds=opts.load_rounds,
        max_tokens=opts.tune_max_tokens,
    )
    for key, point in result["points"].items():
        ratio = point["measured_over_predicted"]
        print(
            f"  c/mode {key}: {point['tokens_per_s']['median']:.1f} tokens/s "
            f"({point['tokens_per_s']['min']:.1f}-{point['tokens_per_s']['max']:.1f}), "
            f"measured / predicted {ratio['median']:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})"
        )
    path = schedule / "in_process.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"({result['seconds']:.0f}s)")
    return path


def prompts_subset(family_prompts: Path, dest: Path, n: int, *, skip: int = 0) -> Path:
    """The held-out prompts [skip, skip + n) as a JSONL file (tune and bench use different ones)."""
    lines = [line for line in family_prompts.read_text().splitlines() if line.strip()][skip : skip + n]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(lines) + "\n")
    return dest


def tune_prompts_file(family_prompts: Path, dest: Path, n: int) -> Path:
    """The first n held-out family prompts, then the repetition tune prompts (none is a bench prompt)."""
    usual = prompts_subset(family_prompts, dest, n)
    lines = usual.read_text().splitlines() + [
        line for line in REPETITION_TUNE.read_text().splitlines() if line.strip()
    ]
    dest.write_text("\n".join(lines) + "\n")
    return dest
