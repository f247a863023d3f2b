"""`make bench-serve-real`: Triton / in-process tokens/s on the real model (SmolLM2-135M-Instruct), with
speculation on, for every method of `make demo-real` on every flow it has (goal: >= 0.9x).

It reuses what `make demo-real` built under ROOT (build/demo-real: each method's tuned spec, its reference
build and its repository) and adds the flows demo-real does not serve (n-gram through Triton's LLM-API
model). Per (method, flow): the same prompts one at a time (concurrency 1), greedy, streamed, in-process
(the reference engine loaded from the build) and through a local tritonserver on the repository,
interleaved prompt by prompt so both sides see the same machine load, `--repeats` passes; every answer
of every side, method and flow must be the same tokens (greedy speculation is exact and all serve the
same target). Reported: the median per-pass ratio with its spread, and the serving cost per speculative
round in ms ((Triton seconds - in-process seconds) / rounds: the same rounds on both sides, since the
tokens are identical).

    python -m lab.benchmarks.serve_real [--root build/demo-real] [--out build/bench-serve-real]
        [--prompts 2] [--max-tokens 48] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
import yaml
from rich.console import Console

from lab.benchmarks.serve import GOAL_RATIO
from lab.benchmarks.serve_arms import Arm, run_arm, summarize
from specbuild.bench.options import load_prompts
from specbuild.client.remote import Session
from specbuild.core.deployment import RepoKind
from specbuild.core.errors import SpecbuildError
from specbuild.core.facts.llmapi import Flow, parse_flow
from specbuild.core.methods.matrix import support
from specbuild.core.sampling_params import SamplingParams
from specbuild.core.spec import load_spec
from specbuild.demo.pipeline import ServedBuild, compile_in_process, local_server, repo_in_process
from specbuild.engines.reference.api import generate_local
from specbuild.engines.reference.engine import ReferenceEngine

DEFAULT_ROOT = Path("build/demo-real")
DEFAULT_OUT = Path("build/bench-serve-real")
METHODS = ("ngram", "medusa", "eagle3")
PROMPT_SETS = ("quoting", "open")
LOCAL_KIND = {kind.flow: kind for kind in RepoKind if kind.local}  # the repository served on this CPU


def flows_of(spec_path: Path) -> list[Flow]:
    """The flows the spec's method has on its TensorRT-LLM version (core/methods/matrix.py)."""
    spec = load_spec(spec_path)
    return [f for f in Flow if support(spec.mode.value, f, spec.trtllm_version).ok]


def build_for(root: Path, out: Path, method: str, flow: Flow) -> tuple[Path, Path]:
    """(reference build, repository) of `method` on `flow`: demo-real's own where it served that flow,
    else compiled here from demo-real's tuned spec with `flow` set (and no schedule: concurrency 1)."""
    spec_path = root / "specs" / f"{method}.yaml"
    own = parse_flow(load_spec(spec_path).flow)
    if flow is own and (root / method / "repo").is_dir():
        return root / method / "reference", root / method / "repo"
    raw = yaml.safe_load(spec_path.read_text())
    raw["flow"] = flow.value
    raw.get("speculation", {}).pop("schedule", None)
    folder = out / f"{method}-{flow.value}"
    folder.mkdir(parents=True, exist_ok=True)
    spec_file = folder / "spec.yaml"
    spec_file.write_text(yaml.safe_dump(raw, sort_keys=False))
    # the LLM-API model streams only when decoupled
    served = ServedBuild(
        spec=spec_file, out=folder, kind=LOCAL_KIND[flow], decoupled=True, build_dir="reference"
    )
    return compile_in_process(served), repo_in_process(served)


def measure(build: Path, repo: Path, label: str, prompts: list[str], args, expected: dict) -> dict:
    engine = ReferenceEngine.load(build)
    params = SamplingParams(max_tokens=args.max_tokens)  # greedy: the tokens are checked identical
    k = engine.num_draft_tokens
    with local_server(repo) as server, Session(server.grpc_url) as session:

        def remote(prompt: str) -> object:  # the repository's own K (its tuned value)
            return session.generate(prompt, params, stream=True, timeout_s=600)

        def local(prompt: str) -> object:  # the build's own K, as the repository's
            return generate_local(engine, prompt, params, speculative=True)

        method, flow = label.split("/")
        measured = run_arm(
            Arm(flow, method, k, local, remote), prompts, repeats=args.repeats, expected=expected
        )
    row = summarize(measured)
    rounds = max(measured["triton"]["rounds"], 1)
    row["serving_ms_per_round"] = round(
        (measured["triton"]["seconds"] - measured["in_process"]["seconds"]) * 1e3 / rounds, 2
    )
    row["tokens_per_round"] = round(measured["in_process"]["tokens"] / rounds, 2)
    row["k"] = k
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.benchmarks.serve_real", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="make demo-real's output folder")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--method", action="append", default=[], help="only this method (repeatable)")
    parser.add_argument("--prompts", type=int, default=2, help="prompts of each set (quoting, open)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved passes over the prompts")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of both sides (served default 1)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ["SPECBUILD_TORCH_THREADS"] = str(args.threads)  # the served engine processes inherit it
    console = Console(width=160)
    root, out = args.root.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    prompts = []
    for name in PROMPT_SETS:
        path = root / "prompts" / f"{name}.jsonl"
        if not path.is_file():
            raise SpecbuildError(
                f"{path} is missing",
                expected="make demo-real's output",
                found=str(root),
                fix="run make demo-real",
            )
        prompts += list(load_prompts(path))[: args.prompts]
    expected: dict = {}
    result = {
        "model": "SmolLM2-135M-Instruct (make demo-real)",
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "torch_threads": args.threads,
        "load_before": os.getloadavg(),
        "rows": {},
    }
    for method in args.method or METHODS:
        spec_path = root / "specs" / f"{method}.yaml"
        if not spec_path.is_file():
            console.print(f"{method}: no spec under {root / 'specs'}; skipped")
            continue
        for flow in flows_of(spec_path):
            label = f"{method}/{flow.value}"
            console.print(f"[bold]{label}[/]: building / serving")
            build, repo = build_for(root, out, method, flow)
            row = measure(build, repo, label, prompts, args, expected)
            result["rows"][label] = row
            console.print(
                f"{label}: K {row['k']}, {row['tokens_per_round']} tokens/round; in-process "
                f"{row['in_process_tokens_per_s']} tok/s, Triton {row['triton_tokens_per_s']} tok/s; ratio "
                f"{row['ratio']} (passes {row['ratio_per_pass']}); round {row['in_process_round_ms']} ms "
                f"in-process, serving cost {row['serving_ms_per_round']} ms/round"
            )
            (out / "serve_real.json").write_text(json.dumps(result, indent=2) + "\n")
    result["load_after"] = os.getloadavg()
    ratios = {k: r["ratio"] for k, r in result["rows"].items()}
    result["goal"] = {"ratio": GOAL_RATIO, "met": all(r >= GOAL_RATIO for r in ratios.values())}
    result["tokens_identical"] = len(expected)
    (out / "serve_real.json").write_text(json.dumps(result, indent=2) + "\n")
    console.print(
        f"greedy tokens identical on every method, flow and side ({len(expected)} prompts); median ratio "
        f"{statistics.median(ratios.values()) if ratios else float('nan'):.3f}; goal >= {GOAL_RATIO}: "
        f"{'met' if result['goal']['met'] else 'NOT met'}; wrote {out / 'serve_real.json'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
