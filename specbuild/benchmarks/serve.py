"""`make bench-serve`: tokens/s through Triton vs in-process at concurrency 1 (goal: >= 0.8x).

Uses the demo family (`specbuild.demo.models`: a trained target and a distilled draft, built once
into .cache/demo and reused), compiles reference engines for a draft/target spec, generates the
Python-backend repository, serves it on free loopback ports and runs the same prompts, one at a
time, both ways (interleaved prompt by prompt, so both see the same machine load): the target alone
(Triton: `num_draft_tokens=0` to the BLS) and speculative (K
drafts). Then the `bench` sweep (speculation off/on per concurrency) writes its report into OUT.

    python -m specbuild.benchmarks.serve [--out build/bench-serve] [--prompts 8] [--max-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from rich.console import Console

from specbuild.builder.compile import compile_spec
from specbuild.client.bench import run_bench
from specbuild.client.options import BenchConfig, default_prompts_file, load_prompts
from specbuild.client.remote import generate_remote
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
GOAL_RATIO = 0.8  # Triton tokens/s over in-process tokens/s at concurrency 1


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


def compare(build: Path, url: str, prompts: list[str], params: SamplingParams, k: int) -> dict[str, dict]:
    """Sequential requests (concurrency 1), in-process and through Triton interleaved prompt by prompt,
    so both see the same load on a shared machine. mode -> {in_process|triton: {tokens, seconds}}."""

    torch.set_num_threads(1)  # the server's local engine processes run one torch thread each too
    engine = ReferenceEngine.load(build)
    out: dict[str, dict] = {}
    for mode, drafts in (("baseline", 0), ("speculative", k)):

        def local(prompt: str, speculative: bool = drafts > 0) -> int:
            return len(
                generate_local(engine, prompt, params, speculative=speculative, num_draft_tokens=k).token_ids
            )

        def remote(prompt: str, drafts: int = drafts) -> int:
            return len(
                generate_remote(
                    url, prompt, params, num_draft_tokens=drafts, stream=True, timeout_s=300
                ).token_ids
            )

        local(prompts[0]), remote(prompts[0])  # warm-up both paths
        totals = {"in_process": {"tokens": 0, "seconds": 0.0}, "triton": {"tokens": 0, "seconds": 0.0}}
        for prompt in prompts:
            for side, run in (("in_process", local), ("triton", remote)):
                t0 = time.perf_counter()
                totals[side]["tokens"] += run(prompt)
                totals[side]["seconds"] += time.perf_counter() - t0
        out[mode] = totals
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
    args = parser.parse_args(argv)

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
        measured = compare(build, server.grpc_url, prompts, params, args.num_draft_tokens)
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
        "modes": {},
        "sweep_report": sweep,
    }
    for mode in ("baseline", "speculative"):
        side = measured[mode]
        tps_local = side["in_process"]["tokens"] / side["in_process"]["seconds"]
        tps_triton = side["triton"]["tokens"] / side["triton"]["seconds"]
        result["modes"][mode] = {
            "in_process_tokens_per_s": round(tps_local, 2),
            "triton_tokens_per_s": round(tps_triton, 2),
            "ratio": round(tps_triton / tps_local, 3),
        }
        verdict = "meets" if tps_triton >= GOAL_RATIO * tps_local else "MISSES"
        console.print(
            f"{mode:11s} in-process {tps_local:8.1f} tok/s   Triton {tps_triton:8.1f} tok/s   "
            f"ratio {tps_triton / tps_local:.2f} ({verdict} the {GOAL_RATIO}x goal)"
        )
    (out / "bench_serve.json").write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {out / 'bench_serve.json'}")


if __name__ == "__main__":
    main()
