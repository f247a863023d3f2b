"""`make bench-serve`: tokens/s through Triton vs in-process at concurrency 1 (goal: >= 0.8x).

Uses the demo family (`specbuild.demo.models`: a trained target and a distilled draft, built once
into .cache/demo and reused), compiles reference engines for a draft/target spec, generates the
Python-backend repository, serves it on free loopback ports and runs the same prompts, one at a
time, both ways (interleaved prompt by prompt, so both see the same machine load): the target alone
(Triton: `num_draft_tokens=0` to the BLS) and speculative (K
drafts). Then the `bench` sweep (speculation off/on per concurrency) writes its report into OUT.

    python -m specbuild.benchmarks.serve [--out build/bench-serve] [--prompts 8] [--max-tokens 48]
        [--threads 1] [--repeats 3]

Both sides run with the same torch threads (`--threads`: the in-process engine's, and the served engine
processes' SPECBUILD_TORCH_THREADS); the output states them. Each (mode, side) figure is the median of
`--repeats` interleaved passes over the prompts, with its spread. The per-round breakdown of the
speculative requests through Triton comes from Triton's own statistics (each model's queue and compute
time per call) next to the in-process time per round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
from rich.console import Console
from tritonclient.grpc import InferenceServerClient

from specbuild.builder.compile import compile_spec
from specbuild.client.bench import run_bench
from specbuild.client.options import BenchConfig, default_prompts_file, load_prompts
from specbuild.client.remote import Session
from specbuild.client.report import table, write_report
from specbuild.core.methods import Method
from specbuild.core.sampling_params import SamplingParams
from specbuild.core.spec import spec_from_dict
from specbuild.demo.models import DEFAULT_CACHE, DemoSettings, build_family
from specbuild.demo.synthetic import make_model, train_tokenizer
from specbuild.engines.reference.api import generate_local
from specbuild.engines.reference.engine import ReferenceEngine
from specbuild.model_repo.generate import generate_repo
from specbuild.serve.server import ServerOptions, TritonServer, free_port

DEFAULT_OUT = Path("build/bench-serve")
GOAL_RATIO = 0.9  # Triton tokens/s over in-process tokens/s at concurrency 1, speculation on (issue 16)
SERVED_TORCH_THREADS = 1  # = the local engine models' DEFAULT_TORCH_THREADS


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
) -> tuple[Path, Path, Path]:
    """(compile folder, repository, prompts.jsonl) for the demo family's draft/target pair."""
    if random_models:
        target, draft, prompts = _random_pair(out)
    else:
        family = build_family(cache=demo_cache or DEFAULT_CACHE, log=log)
        target, draft, prompts = family.target, family.draft, family.prompts
    spec = spec_from_dict(
        {
            "name": "bench-serve",
            "mode": Method.DRAFT_TARGET.value,
            "dtype": "float32",
            "target": {"model": str(target)},
            "draft": {"model": str(draft)},
            "speculation": {"max_draft_len": num_draft_tokens},
            "build": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
            "serving": {"gpu_memory_gb": 4},
        },
        source=out / "spec.yaml",
    )
    build = compile_spec(spec, out / "build", engine="reference", force=True)
    repo = generate_repo(build, out / "repo", backend="python", force=True)
    return build, repo, prompts


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


def compare(
    build: Path, url: str, prompts: list[str], params: SamplingParams, k: int, *, repeats: int = 1
) -> dict[str, dict]:
    """Sequential requests (concurrency 1), in-process and through Triton interleaved prompt by prompt,
    so both see the same load on a shared machine; `repeats` passes over the prompts. mode ->
    {in_process|triton: {tokens, seconds, passes: [tokens/s per pass]}, breakdown (speculative)}."""
    engine = ReferenceEngine.load(build)
    # one connection for all requests, as a serving client (and `bench`) keeps it: no reconnect and no
    # model-metadata refetch per request in the Triton figures
    with Session(url) as session:
        return _compare(engine, session, url, prompts, params, k, repeats=repeats)


def _compare(engine, session, url, prompts, params, k, *, repeats):
    out: dict[str, dict] = {}
    for mode, drafts in (("baseline", 0), ("speculative", k)):

        def local(prompt: str, speculative: bool = drafts > 0) -> int:
            return len(
                generate_local(engine, prompt, params, speculative=speculative, num_draft_tokens=k).token_ids
            )

        def remote(prompt: str, drafts: int = drafts) -> int:
            return len(
                session.generate(
                    prompt, params, num_draft_tokens=drafts, stream=True, timeout_s=300
                ).token_ids
            )

        local(prompts[0]), remote(prompts[0])  # warm-up both paths
        totals = {side: {"tokens": 0, "seconds": 0.0, "passes": []} for side in ("in_process", "triton")}
        before = triton_stats(url)
        for _ in range(repeats):
            done = {side: [0, 0.0] for side in totals}
            for prompt in prompts:
                for side, run in (("in_process", local), ("triton", remote)):
                    t0 = time.perf_counter()
                    done[side][0] += run(prompt)
                    done[side][1] += time.perf_counter() - t0
            for side, (tokens, seconds) in done.items():
                totals[side]["tokens"] += tokens
                totals[side]["seconds"] += seconds
                totals[side]["passes"].append(tokens / seconds)
        out[mode] = totals
        out[mode]["breakdown"] = breakdown(
            before,
            triton_stats(url),
            triton_s=totals["triton"]["seconds"],
            in_process_s=totals["in_process"]["seconds"],
        )
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m specbuild.benchmarks.serve", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output folder (default {DEFAULT_OUT})"
    )
    parser.add_argument("--prompts", type=int, default=8, help="held-out demo prompts to run")
    parser.add_argument("--max-tokens", type=int, default=48, help="new tokens per request")
    parser.add_argument(
        "--num-draft-tokens", type=int, default=4, help="K drafts per round (speculative runs)"
    )
    parser.add_argument(
        "--concurrency", default="1,2,4", help="bench sweep concurrencies ('' skips the sweep)"
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
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["SPECBUILD_TORCH_THREADS"] = str(args.threads)  # the server's engine processes inherit it

    console = Console(width=160)  # the bench table has 13 columns
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    build, repo, prompts_file = build_repo(
        out,
        num_draft_tokens=args.num_draft_tokens,
        random_models=args.random_models,
        demo_cache=args.demo_cache,
        log=console.print,
    )
    prompts = list(load_prompts(prompts_file))[: args.prompts]
    params = SamplingParams(max_tokens=args.max_tokens)
    opts = ServerOptions(grpc_port=free_port(), http_port=free_port(), metrics_port=free_port())
    with TritonServer(repo, opts) as server:
        measured = compare(
            build, server.grpc_url, prompts, params, args.num_draft_tokens, repeats=args.repeats
        )
        sweep = None
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
            sweep = str(out / "bench.json")
    result = {
        "models": "random (demo shapes)" if args.random_models else "demo family",
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "num_draft_tokens": args.num_draft_tokens,
        "concurrency": 1,
        "torch_threads": {"in_process": torch.get_num_threads(), "served_engine_processes": args.threads},
        "repeats": args.repeats,
        "modes": {},
        "sweep_report": sweep,
    }
    console.print(
        f"torch threads: in-process {torch.get_num_threads()}, each served engine process {args.threads}"
    )
    for mode in ("baseline", "speculative"):
        side = measured[mode]
        local_passes, triton_passes = side["in_process"]["passes"], side["triton"]["passes"]
        ratios = [t / i for t, i in zip(triton_passes, local_passes, strict=True)]
        tps_local, tps_triton = statistics.median(local_passes), statistics.median(triton_passes)
        ratio = statistics.median(ratios)
        result["modes"][mode] = {
            "in_process_tokens_per_s": round(tps_local, 2),
            "triton_tokens_per_s": round(tps_triton, 2),
            "ratio": round(ratio, 3),
            "ratio_per_pass": [round(r, 3) for r in ratios],
            "breakdown_per_round": side["breakdown"],
        }
        verdict = "meets" if ratio >= GOAL_RATIO else "MISSES"
        console.print(
            f"{mode:11s} in-process {tps_local:8.1f} tok/s   Triton {tps_triton:8.1f} tok/s   "
            f"ratio {ratio:.2f} (passes {min(ratios):.2f}-{max(ratios):.2f}; {verdict} the "
            f"{GOAL_RATIO}x goal)"
        )
        b = side["breakdown"]
        console.print(
            f"            per round: Triton {b['triton_round_ms']:.2f} ms = draft {b['draft']['total']:.2f} "
            f"+ target {b['target']['total']:.2f} + BLS rest {b['bls_rest_ms']:.2f} + client rest "
            f"{b['client_rest_ms']:.2f}; in-process {b['in_process_round_ms']:.2f} ms"
        )
    (out / "bench_serve.json").write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {out / 'bench_serve.json'}")


if __name__ == "__main__":
    main()
