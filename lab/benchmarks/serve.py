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
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from rich.console import Console
from tritonclient.grpc import InferenceServerClient

from lab.benchmarks.ipc_floor import format_floor, measure
from lab.benchmarks.serve_frontend import format_frontend, measure_frontend
from specbuild.bench.bench import run_bench
from specbuild.bench.options import BenchConfig, default_prompts_file, load_prompts
from specbuild.bench.report import table, write_report
from specbuild.client.remote import Session
from specbuild.core.deployment import RepoKind
from specbuild.core.errors import SpecbuildError
from specbuild.core.facts.llmapi import LLMAPI_VERSIONS, decoding_class
from specbuild.core.generation import GenerationResult
from specbuild.core.methods import Method
from specbuild.core.sampling_params import SamplingParams
from specbuild.demo.models import DEFAULT_CACHE, DemoSettings, build_family
from specbuild.demo.pipeline import ServedBuild, compile_in_process, local_server, repo_in_process
from specbuild.demo.synthetic import make_model, train_tokenizer
from specbuild.engines.reference.api import generate_local
from specbuild.engines.reference.engine import ReferenceEngine

DEFAULT_OUT = Path("build/bench-serve")
GOAL_RATIO = 0.9  # Triton tokens/s over in-process tokens/s at concurrency 1, speculation on (issue 16)
SERVED_TORCH_THREADS = 1  # = the local engine models' DEFAULT_TORCH_THREADS
FLOWS = ("engine", "llmapi")
MODES = ("baseline", "speculative")
BLS_TIMINGS_ENV = "SPECBUILD_BLS_TIMINGS"  # = tensorrt_llm_bls/model.py TIMINGS_ENV


class BenchServeError(SpecbuildError):
    """The two sides of bench-serve did not run the same thing (tokens, K, method, sampling)."""


def _random_pair(out: Path) -> tuple[Path, Path, Path]:
    """Untrained target and draft with the demo family's shapes (no training: minutes saved, but the
    draft's acceptance is near zero, so only the Triton/in-process ratio means something)."""
    settings = DemoSettings()
    tok = train_tokenizer(out / "models" / "tokenizer")
    paths = []
    for name, shape, seed in (("target", settings.target, 1), ("draft", settings.draft, 2)):
        folder = out / "models" / name
        if not (folder / "config.json").exists():
            make_model(
                folder,
                tok,
                hidden_size=shape.hidden_size,
                num_layers=shape.num_layers,
                num_heads=shape.num_heads,
                num_kv_heads=shape.num_kv_heads,
                intermediate_size=shape.intermediate_size,
                seed=seed,
            )
        paths.append(folder)
    return paths[0], paths[1], default_prompts_file()


def build_repo(
    out: Path,
    *,
    num_draft_tokens: int,
    random_models: bool = False,
    demo_cache: Path | None = None,
    log=print,
    flow: str = "engine",
) -> tuple[Path, Path, Path]:
    """(compile folder, repository, prompts.jsonl) for the demo family's draft/target pair on `flow`:
    engine -> the Python-backend BLS repository in OUT; llmapi -> `compile --flow llmapi --engine
    reference` and the local LLM-API model (`repo --backend llmapi-local`) in OUT/llmapi."""
    if random_models:
        target, draft, prompts = _random_pair(out)
    else:
        family = build_family(cache=demo_cache or DEFAULT_CACHE, log=log)
        target, draft, prompts = family.target, family.draft, family.prompts
    root = out if flow == "engine" else out / flow
    root.mkdir(parents=True, exist_ok=True)
    raw = {
        "name": "bench-serve",
        "mode": Method.DRAFT_TARGET.value,
        "dtype": "float32",
        "target": {"model": str(target)},
        "draft": {"model": str(draft)},
        "speculation": {"max_draft_len": num_draft_tokens},
        "build": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
        "serving": {"gpu_memory_gb": 4},
    }
    if flow != "engine":
        raw["flow"] = flow
    (root / "spec.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    kind = RepoKind.ENGINE_LOCAL if flow == "engine" else RepoKind.LLMAPI_LOCAL
    served = ServedBuild(spec=root / "spec.yaml", out=root, kind=kind, decoupled=True)  # it streams
    return compile_in_process(served), repo_in_process(served), prompts


LLMAPI_OPTIONS_FILE = Path("tensorrt_llm") / "1" / "model.yaml"  # = model_repo/tensors.py LLMAPI_OPTIONS
LLMAPI_CONFIG_FILE = Path("tensorrt_llm") / "config.pbtxt"


# draft/target's decoding_type on every LLM-API release specbuild writes (DraftTarget 1.2.1, Draft_Target 1.4)
DRAFT_TARGET_SPELLINGS = {decoding_class("draft_target", v).decoding_type for v in LLMAPI_VERSIONS}


def llmapi_speculation(repo: Path) -> dict:
    """The LLM-API repository's speculative_config ({} when it has none)."""
    options = yaml.safe_load((repo / LLMAPI_OPTIONS_FILE).read_text(encoding="utf-8"))
    return dict(options.get("speculative_config") or {})


def without_speculation(repo: Path, out: Path) -> Path:
    """A copy of the LLM-API repository REPO in OUT (replaced) that serves the target alone: model.yaml
    without speculative_config (an LLM-API deployment without speculation; the local model then decodes
    plainly) and the specbuild parameter default_num_draft_tokens 0 (what the client reports as K)."""
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(repo, out, ignore=shutil.ignore_patterns("__pycache__"))
    path = out / LLMAPI_OPTIONS_FILE
    options = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not options.pop("speculative_config", None):
        raise BenchServeError(
            f"{repo / LLMAPI_OPTIONS_FILE} has no speculative_config",
            expected="the speculative LLM-API repository of bench-serve",
            found="no speculative_config",
            fix="pass the repository `build_repo(..., flow='llmapi')` wrote",
        )
    path.write_text(yaml.safe_dump(options, sort_keys=False), encoding="utf-8")
    config = out / LLMAPI_CONFIG_FILE
    text = config.read_text(encoding="utf-8")
    key = 'key: "default_num_draft_tokens"'
    at = text.find(key)
    if at >= 0:
        value = text.index("string_value:", at)
        end = text.index("\n", value)
        text = text[:value] + 'string_value: "0"' + text[end:]
        config.write_text(text, encoding="utf-8")
    return out


MODELS = ("tensorrt_llm_bls", "tensorrt_llm_draft", "tensorrt_llm")  # the BLS round's Triton models
STAT_PARTS = ("queue", "compute_input", "compute_infer", "compute_output")


def triton_stats(url: str) -> dict[str, dict[str, int]]:
    """model -> {calls, success_ns, queue_ns, compute_*_ns}: Triton's cumulative inference statistics."""
    client = InferenceServerClient(url)
    out = {}
    try:
        for model in MODELS:
            stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]["inference_stats"]
            row = {
                "calls": int(stats["success"].get("count", 0)),
                "success_ns": int(stats["success"].get("ns", 0)),
            }
            row.update({f"{part}_ns": int(stats[part].get("ns", 0)) for part in STAT_PARTS})
            out[model] = row
    finally:
        client.close()
    return out


def breakdown(before: dict, after: dict, *, triton_s: float, in_process_s: float) -> dict:
    """Per speculative round (= one target call), in ms: where a Triton round's time goes.

    draft / target: each call's time in Triton (queue + compute: the Python backend's IPC to the model's
    stub, the model code and the engine); bls_rest: the BLS request's time beyond its engine calls
    (its own loop and bookkeeping, BLS -> model IPC not inside the callee's statistics, preprocessing,
    detokenizing, streaming its responses); client_rest: the client's wall time beyond the BLS request
    (gRPC, the frontend); in_process: the same rounds in the in-process engine (no IPC)."""
    d = {m: {key: after[m][key] - before[m].get(key, 0) for key in after[m]} for m in after}
    rounds = max(d["tensorrt_llm"]["calls"], 1)
    ms = 1e-6 / rounds

    def model_ms(m):
        return {part: round(d[m][f"{part}_ns"] * ms, 3) for part in STAT_PARTS} | {
            "total": round(d[m]["success_ns"] * ms, 3),
            "calls_per_round": round(d[m]["calls"] / rounds, 3),
        }

    draft, target = model_ms("tensorrt_llm_draft"), model_ms("tensorrt_llm")
    bls = d["tensorrt_llm_bls"]["success_ns"] * ms
    return {
        "rounds": rounds,
        "triton_round_ms": round(triton_s * 1e3 / rounds, 3),
        "in_process_round_ms": round(in_process_s * 1e3 / rounds, 3),
        "draft": draft,
        "target": target,
        "bls_rest_ms": round(bls - draft["total"] - target["total"], 3),
        "client_rest_ms": round(triton_s * 1e3 / rounds - bls, 3),
    }


@dataclass(frozen=True)
class Arm:
    """One (flow, mode) of the comparison: how each side answers one prompt. k: drafts per round (0: the
    target alone)."""

    flow: str
    mode: str
    k: int
    in_process: Callable[[str], GenerationResult]
    triton: Callable[[str], GenerationResult]


def check_tokens(arm: Arm, side: str, prompt: str, result: GenerationResult, expected: dict) -> None:
    """Greedy: every response of every arm and side is the same tokens as the first one seen for the
    prompt (the engine flow's in-process target alone when that flow runs): speculation is exact, and
    both flows serve the same weights. The first result seen for a prompt becomes its reference."""
    tokens = list(result.token_ids)
    want = expected.setdefault(prompt, (tokens, f"{arm.flow} {arm.mode} {side}"))
    if tokens != want[0]:
        n = next(
            (i for i, (a, b) in enumerate(zip(tokens, want[0], strict=False)) if a != b),
            min(len(tokens), len(want[0])),
        )
        raise BenchServeError(
            f"bench-serve: {arm.flow} {arm.mode} ({side}) answered other tokens than {want[1]} for "
            f"prompt {prompt[:40]!r} (greedy must be identical)",
            expected=f"{len(want[0])} tokens, from position {n}: {want[0][n : n + 8]}",
            found=f"{len(tokens)} tokens, from position {n}: {tokens[n : n + 8]}",
            fix="the two sides do not run the same models or sampling: rebuild OUT (delete it) and rerun",
        )


def run_arm(
    arm: Arm,
    prompts: list[str],
    *,
    repeats: int,
    expected: dict,
    after_warm_up: Callable[[], None] | None = None,
) -> dict:
    """Sequential requests (concurrency 1), in-process and through Triton interleaved prompt by prompt,
    so both see the same load on a shared machine; `repeats` passes over the prompts. Returns
    {in_process|triton: {tokens, seconds, passes: [tokens/s per pass], drafted, rounds}}; checks the
    tokens (check_tokens) and that each side drafted (speculative) or did not (baseline)."""
    sides = {"in_process": arm.in_process, "triton": arm.triton}
    for run in sides.values():  # warm-up both paths
        run(prompts[0])
    if after_warm_up is not None:  # e.g. the statistics before the measured passes
        after_warm_up()
    totals = {side: {"tokens": 0, "seconds": 0.0, "passes": [], "drafted": 0, "rounds": 0} for side in sides}
    for _ in range(repeats):
        done = {side: [0, 0.0] for side in sides}
        for prompt in prompts:
            for side, run in sides.items():
                t0 = time.perf_counter()
                result = run(prompt)
                done[side][1] += time.perf_counter() - t0
                done[side][0] += len(result.token_ids)
                check_tokens(arm, side, prompt, result, expected)
                totals[side]["drafted"] += result.stats.drafted
                totals[side]["rounds"] += result.stats.target_passes
        for side, (tokens, seconds) in done.items():
            totals[side]["tokens"] += tokens
            totals[side]["seconds"] += seconds
            totals[side]["passes"].append(tokens / seconds)
    for side, row in totals.items():
        if (row["drafted"] > 0) != (arm.k > 0):
            raise BenchServeError(
                f"bench-serve: {arm.flow} {arm.mode} ({side}) drafted {row['drafted']} tokens",
                expected="drafts in every speculative run, none in a baseline run",
                found=f"k={arm.k}, drafted={row['drafted']}",
                fix="check the repository's speculation settings (model.yaml / num_draft_tokens)",
            )
    return totals


def summarize(measured: dict) -> dict:
    """Tokens/s per side (median pass), the Triton / in-process ratio (median of the per-pass ratios)."""
    local_passes, triton_passes = measured["in_process"]["passes"], measured["triton"]["passes"]
    ratios = [t / i for t, i in zip(triton_passes, local_passes, strict=True)]
    rounds = max(measured["in_process"]["rounds"], 1)
    return {
        "in_process_tokens_per_s": round(statistics.median(local_passes), 2),
        "triton_tokens_per_s": round(statistics.median(triton_passes), 2),
        "ratio": round(statistics.median(ratios), 3),
        "ratio_per_pass": [round(r, 3) for r in ratios],
        "tokens": measured["in_process"]["tokens"],
        # per round (a target pass in-process; the same rounds through Triton: the tokens are identical)
        "in_process_round_ms": round(measured["in_process"]["seconds"] * 1e3 / rounds, 3),
        "triton_round_ms": round(measured["triton"]["seconds"] * 1e3 / rounds, 3),
    }


def _local(engine: ReferenceEngine, params: SamplingParams, k: int) -> Callable[[str], GenerationResult]:
    def run(prompt: str) -> GenerationResult:
        return generate_local(engine, prompt, params, speculative=k > 0, num_draft_tokens=k if k else None)

    return run


def engine_arms(engine: ReferenceEngine, session: Session, params: SamplingParams, k: int) -> list[Arm]:
    """The engine flow: the BLS with num_draft_tokens 0 (the target alone, streamed) and K."""

    def remote(drafts: int):
        return lambda prompt: session.generate(
            prompt, params, num_draft_tokens=drafts, stream=True, timeout_s=300
        )

    return [
        Arm("engine", mode, drafts, _local(engine, params, drafts), remote(drafts))
        for mode, drafts in (("baseline", 0), ("speculative", k))
    ]


def check_setup(
    flow: str, mode: str, *, engine: ReferenceEngine, session: Session, repo: Path, k: int
) -> dict:
    """What this arm runs, checked equal on both sides: the method, K, and (LLM-API) the repository's
    speculative_config; returns the facts checked."""
    info = session.info.repo
    problems = []
    if engine.method is not Method.DRAFT_TARGET or engine.num_draft_tokens < k:
        problems.append(f"in-process engine {engine.method} with K <= {engine.num_draft_tokens}")
    if flow == "llmapi":
        spec = llmapi_speculation(repo)
        want_k = k if mode == "speculative" else 0
        if mode == "speculative" and (
            spec.get("decoding_type") not in DRAFT_TARGET_SPELLINGS or spec.get("max_draft_len") != k
        ):
            problems.append(f"model.yaml speculative_config {spec}")
        if mode == "baseline" and spec:
            problems.append(f"model.yaml of the target-alone repository has speculative_config {spec}")
        if info.num_draft_tokens != want_k:
            problems.append(f"the server reports K={info.num_draft_tokens}")
        checked = {"speculative_config": spec, "server_k": info.num_draft_tokens}
    else:
        if info.method is not Method.DRAFT_TARGET or not info.has_baseline:
            problems.append(f"the BLS repository is {info.method} (baseline: {info.has_baseline})")
        checked = {
            "bls_method": str(info.method),
            "num_draft_tokens_per_request": k if mode == "speculative" else 0,
        }
    if problems:
        raise BenchServeError(
            f"bench-serve {flow} {mode}: the two sides do not run the same speculation",
            expected=f"draft/target with K={k} on both sides (or none, baseline)",
            found="; ".join(problems),
            fix="rebuild OUT (delete it) and rerun",
        )
    return {"method": Method.DRAFT_TARGET.value, "k": k if mode == "speculative" else 0, **checked}


def read_bls_timings(folder: Path) -> list[dict]:
    """The BLS's per-request timers (model.py, SPECBUILD_BLS_TIMINGS): one JSON object a line per file."""
    rows = []
    for path in sorted(folder.glob("bls-*.jsonl")):
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def bls_breakdown(rows: list[dict], *, rounds: int, engine_ms: dict[str, float]) -> dict:
    """Per round (ms), from the BLS's own timers: its engine calls as the BLS waits for them (exec, by
    model) and beyond the callee's Triton time (the BLS-side hop), the streamed responses, the
    cancellation asks, and the BLS's own code (everything else inside the request)."""
    rounds = max(rounds, 1)
    total = sum(r["handle_ns"] for r in rows)
    execs: dict[str, int] = {}
    for r in rows:
        for model, ns in r["exec_ns"].items():
            execs[model] = execs.get(model, 0) + ns
    send, ask = sum(r["send_ns"] for r in rows), sum(r["ask_ns"] for r in rows)
    own = total - sum(execs.values()) - send - ask
    out = {
        "requests": len(rows),
        "handle_ms": round(total / 1e6 / rounds, 3),
        "exec_ms": {m: round(ns / 1e6 / rounds, 3) for m, ns in sorted(execs.items())},
        "sends_per_round": round(sum(r["sends"] for r in rows) / rounds, 3),
        "send_ms": round(send / 1e6 / rounds, 3),
        "asks_per_round": round(sum(r["asks"] for r in rows) / rounds, 3),
        "ask_ms": round(ask / 1e6 / rounds, 3),
        "own_code_ms": round(own / 1e6 / rounds, 3),
    }
    # a callee that returns from execute at once and answers from its own thread (the step-scheduled
    # local engine model) is not timed by Triton's statistics: then the hops below mean nothing
    out["statistics_time_the_calls"] = all(
        engine_ms[m] >= 0.5 * out["exec_ms"].get(model, 0.0)
        for m, model in (("draft", "tensorrt_llm_draft"), ("target", "tensorrt_llm"))
    )
    out["hop_ms"] = {
        m: round(out["exec_ms"].get(model, 0.0) - ms, 3)
        for m, (model, ms) in {
            "draft": ("tensorrt_llm_draft", engine_ms["draft"]),
            "target": ("tensorrt_llm", engine_ms["target"]),
        }.items()
    }
    return out


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

            arm = Arm("llmapi", mode, k, _local(engine, params, k), remote)
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
