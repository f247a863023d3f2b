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
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import tritonclient.grpc as grpcclient
import yaml
from rich.console import Console

from specbuild.bench.load_bench import LOAD_WAVES
from specbuild.core.errors import SpecbuildError
from specbuild.core.methods import Method
from specbuild.core.pdeathsig import die_with_parent
from specbuild.core.perf.schedule import SERVED_OFF
from specbuild.core.spec import PATH_KEYS
from specbuild.demo.models import (
    DEFAULT_CACHE,
    MICRO,
    DemoSettings,
    build_eagle3,
    build_family,
    build_medusa,
    cpu_count,
    link_current,
)
from specbuild.demo.report import print_summary
from specbuild.serve.tritonserver import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
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
SERVER_READY_TIMEOUT_S = 300.0


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


@dataclass
class Ledger:
    """Wall time per stage and what failed; printed at the end."""

    timings: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.time)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        _rule(name)
        t = time.time()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.time() - t


# ---------------------------------------------------------------- running commands


def _console():
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def _rule(title: str) -> None:
    _console().rule(f"[bold]{title}")


def specbuild_exe() -> str:
    exe = Path(sys.executable).with_name("specbuild")
    if not exe.is_file():
        raise SpecbuildError(
            "the specbuild command is not installed next to this Python",
            expected=str(exe),
            found="no such file",
            fix="run `make setup` (or `pip install -e .`) in this virtualenv",
        )
    return str(exe)


def _shown(argv: list[str]) -> str:
    """The command as a user would type it: `specbuild ...` with paths relative to the repository."""
    words = ["specbuild" if i == 0 else a for i, a in enumerate(argv)]
    return " ".join(_relative(w) for w in words)


def _relative(word: str) -> str:
    if word.startswith(str(REPO_ROOT) + os.sep):
        return os.path.relpath(word, Path.cwd())
    return word if " " not in word and "\n" not in word else json.dumps(word)


def run_cli(
    *args: str, capture: bool = False, check: bool = True, show: bool = True
) -> subprocess.CompletedProcess:
    """Run `specbuild ARGS` (echoed first); a non-zero exit raises unless check=False. capture: keep the
    output (printed too unless show=False: a JSON report the caller summarises)."""
    argv = [specbuild_exe(), *args]
    _console().print(f"[bold cyan]$ {_shown(argv)}[/]")
    t0 = time.time()
    done = subprocess.run(argv, capture_output=capture, text=True, env=_env(), preexec_fn=die_with_parent())
    _console().print(f"[dim]({time.time() - t0:.1f}s)[/]")
    if capture and show and done.stdout:
        print(done.stdout, end="")
    if check and done.returncode != 0:
        if capture and done.stderr:
            print(done.stderr, end="", file=sys.stderr)
        raise SpecbuildError(
            f"`{_shown(argv)}` failed",
            expected="exit code 0",
            found=f"exit code {done.returncode}",
            fix="see the output above",
        )
    return done


def _env() -> dict[str, str]:
    """The environment of each command; wide tables when the output goes to a file, not a terminal."""
    env = dict(os.environ)
    if not sys.stdout.isatty():
        env.setdefault("COLUMNS", "160")
    return env


def has_command(*words: str) -> bool:
    """Whether `specbuild WORDS --help` works (stages land independently while the project grows)."""
    done = subprocess.run([specbuild_exe(), *words, "--help"], capture_output=True, text=True)
    return done.returncode == 0


# ---------------------------------------------------------------- stages


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
        raw = yaml.safe_load(source.read_text())
        for section, key in PATH_KEYS.items():
            if section in raw:
                # the example names .cache/demo/<link>; the copy names the same link in opts.cache
                raw[section][key] = str(Path(opts.cache).absolute() / Path(raw[section][key]).name)
        dest = out / source.name
        dest.write_text(
            f"# Copied by `make demo` from {os.path.relpath(source, REPO_ROOT)}; tune --write edits this "
            "copy.\n" + yaml.safe_dump(raw, sort_keys=False)
        )
        specs[mode] = dest.resolve()
    return specs


def stage_check_and_tune(spec: Path, prompts: Path, max_tokens: int) -> None:
    """check, then tune --write (acceptance profiled on the tune prompts; K, tree or n-gram size)."""
    run_cli("check", str(spec))
    if not has_command("tune"):
        print("(`specbuild tune` is not in this checkout yet: the spec keeps its settings)")
        return
    run_cli("tune", str(spec), "--prompts", str(prompts), "--max-tokens", str(max_tokens), "--write")


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
        f"{sched.get('curve', {}).get('seconds', 0):.0f} s; predicted: {_relative(str(plot))}"
    )
    return SERVED_OFF if off else None


def stage_compile(spec: Path, out: Path) -> Path:
    """Reference engine for this CPU, and the TensorRT-LLM plan a GPU host would run."""
    build = out / "reference"
    run_cli("compile", str(spec), "--out", str(build), "--engine", "reference", "--force")
    plan = out / "trtllm-plan"
    run_cli("compile", str(spec), "--out", str(plan), "--engine", "trtllm", "--dry-run", "--force")
    script = plan / "build.sh"
    if script.is_file():
        print(f"--- {_relative(str(script))} (what a GPU host with TensorRT-LLM 1.2.x runs) ---")
        print(script.read_text().rstrip())
        print("---")
    return build


def stage_repo(build: Path, out: Path, schedule: str | None = None) -> Path:
    """`specbuild repo` (Python backend); `schedule`: a repository schedule the spec cannot hold."""
    repo = out / "repo"
    extra = ["--schedule", schedule] if schedule is not None else []
    run_cli("repo", str(build), "--out", str(repo), "--backend", "python", "--force", *extra)
    return repo


@contextmanager
def serving(repo: Path, log_file: Path) -> Iterator[str]:
    """`specbuild serve REPO` in the background until the block ends; yields HOST:PORT (gRPC)."""
    grpc, http, metrics = free_port(), free_port(), free_port()
    argv = [
        specbuild_exe(),
        "serve",
        str(repo),
        "--grpc-port",
        str(grpc),
        "--http-port",
        str(http),
        "--metrics-port",
        str(metrics),
        "--log-file",
        str(log_file),
    ]
    _console().print(f"[bold cyan]$ {_shown(argv)} &[/]")
    # its own session (a Ctrl-C here reaches only the demo, which stops it); dies if the demo is killed
    proc = subprocess.Popen(argv, start_new_session=True, env=_env(), preexec_fn=die_with_parent())
    url = f"127.0.0.1:{grpc}"
    try:
        _wait_ready(proc, url, log_file)
        yield url
    finally:
        _stop(proc)


def _wait_ready(proc: subprocess.Popen, url: str, log_file: Path) -> None:
    deadline = time.time() + SERVER_READY_TIMEOUT_S
    t0 = time.time()
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SpecbuildError(
                "`specbuild serve` exited before the server was ready",
                expected="a running tritonserver",
                found=f"exit code {proc.returncode}",
                fix=f"see its messages above and the log {log_file}",
            )
        try:
            client = grpcclient.InferenceServerClient(url)
            ready = client.is_server_ready()
            client.close()
            if ready:
                print(f"server ready at {url} after {time.time() - t0:.0f}s")
                return
        except Exception:  # not listening yet
            pass
        time.sleep(1.0)
    raise SpecbuildError(
        "the server did not become ready in time",
        expected=f"ready within {SERVER_READY_TIMEOUT_S:.0f}s",
        found="not ready",
        fix=f"see {log_file}",
    )


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (serve stops tritonserver and its stubs), then kill the whole session if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(f"server stopped (exit code {proc.returncode})")


def stage_generate(url: str, prompt: str, max_tokens: int) -> None:
    print(f"prompt: {prompt!r}")
    run_cli("generate", "--url", url, "--prompt", prompt, "--max-tokens", str(max_tokens), "--stream")


def stage_bench(url: str, prompts: Path, out: Path, opts: DemoOptions, *extra: str) -> Path:
    run_cli(
        "bench",
        "--url",
        url,
        "--prompts",
        str(prompts),
        "--concurrency",
        opts.concurrency,
        "--temperature",
        opts.temperatures,
        "--max-tokens",
        str(opts.max_tokens),
        "--out",
        str(out),
        *extra,
    )
    return out / "bench.json"


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


def run_mode(mode: str, spec: Path, family, opts: DemoOptions, ledger: Ledger) -> dict[str, Path]:
    """Compile, lay out, serve, generate and bench one mode; returns {prompt set: bench.json}."""
    out = (Path(opts.out) / mode).resolve()
    out.mkdir(parents=True, exist_ok=True)
    with ledger.stage(f"{mode}: compile"):
        build = stage_compile(spec, out)
    with ledger.stage(f"{mode}: model repository"):
        repo = stage_repo(build, out)
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
            serving(repo, out / "tritonserver-curve.log") as url,
        ):
            served_off = stage_served_schedule(spec, url, calibration, schedule, opts)
        with ledger.stage(f"{mode}: compile and repository again (the served schedule)"):
            build = stage_compile(spec, out)
            repo = stage_repo(build, out, schedule=served_off)
        with ledger.stage(f"{mode}: in-process check of the cost model"):  # no server: a quiet CPU
            stage_in_process_check(build, prompts, calibration, schedule, opts)
    with ledger.stage(f"{mode}: serve, generate, bench"), serving(repo, out / "tritonserver.log") as url:
        stage_generate(url, first, opts.max_tokens)
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
    with ledger.stage(f"{label}: compile, repository"):
        build, repo = out / "build", out / "repo"
        run_cli(
            "compile", str(spec), "--flow", "llmapi", "--engine", "reference", "--out", str(build), "--force"
        )
        options = build / "llmapi_options.yaml"
        print(f"--- {_relative(str(options))} (trtllm-serve --config / Triton model.yaml keys) ---")
        print(options.read_text().rstrip())
        print(f"--- {_relative(str(build / 'serve.sh'))} runs on a GPU host: ---")
        print(json.loads((build / "plan.json").read_text())["trtllm_serve"]["command"])
        # decoupled: the demo streams (the LLM-API repository's default is upstream's unary policy)
        run_cli("repo", str(build), "--out", str(repo), "--backend", "llmapi-local", "--decoupled", "--force")
        run_cli("repo", "check", str(repo))
    prompts = prompts_subset(
        family.prompts, out / "bench_prompts.jsonl", opts.bench_prompts, skip=opts.tune_prompts
    )
    first = json.loads(prompts.read_text().splitlines()[0])["prompt"]
    with (
        ledger.stage(f"{label}: serve, generate, bench"),
        serving(repo, out / "tritonserver.log") as url,
    ):
        stage_generate(url, first, opts.max_tokens)
        if not every_set:
            return {"usual": stage_bench(url, prompts, out / "bench", replace(opts, concurrency="1"))}
        return {
            "usual": stage_bench(url, prompts, out / "bench", opts),
            "repetition": stage_bench(url, REPETITION_BENCH, out / "bench-repetition", opts),
        }


def add_common_options(parser: argparse.ArgumentParser, defaults) -> None:
    """--out, --cache, --concurrency and --max-tokens, the options both demos take (make demo, make
    demo-real); `defaults` is their options dataclass (fields out, cache, concurrency, max_tokens)."""
    d = defaults
    parser.add_argument("--out", type=Path, default=d.out, help=f"output folder (default {d.out})")
    parser.add_argument("--cache", type=Path, default=d.cache, help=f"model cache (default {d.cache})")
    parser.add_argument(
        "--concurrency", default=d.concurrency, help=f"bench concurrency list (default {d.concurrency})"
    )
    parser.add_argument(
        "--max-tokens", type=int, default=d.max_tokens, help=f"tokens per request (default {d.max_tokens})"
    )


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
    args = parser.parse_args(argv)
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
                stage_check_and_tune(specs[mode], tune_prompts, opts.tune_max_tokens)
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
    _rule("summary")
    loads = {mode: sets.pop("load") for mode, sets in benches.items() if "load" in sets}
    print_summary(
        benches,
        loads=loads,
        family_metrics=family.metrics if family else None,
        out=Path(opts.out),
        timings=ledger.timings,
        total_s=time.time() - ledger.started,
    )
    for failure in ledger.failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if ledger.failures else 0


if __name__ == "__main__":
    sys.exit(main())
