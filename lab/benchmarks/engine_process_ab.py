"""A/B of the local LLM-API model's engine process between two commits: each commit's own
`engine_process.py` (and the engine program it starts) drives the same greedy speculative requests on one
reference build, in interleaved rounds; prints tokens/s per variant and the B/A ratio per round.

    .venv/bin/python -m lab.benchmarks.engine_process_ab BUILD_DIR REV_A [REV_B] [--rounds N]

REV_B defaults to the working tree. A revision's python_models files are written to a temporary folder
(git show), so neither checkout changes.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from specbuild.core.sampling_params import SamplingParams

MODELS = Path("specbuild/model_repo/python_models")
FOLDERS = ("common", "engine_common", "tensorrt_llm_llmapi_local")
MODULES = ("engine_process", "child_channel", "lifeline", "words", "engine_host", "batch_host")


def _files(rev: str | None, dest: Path) -> Path:
    for folder in FOLDERS:
        if rev is None:
            for f in (MODELS / folder).glob("*.py"):
                (dest / f.name).write_bytes(f.read_bytes())
            continue
        names = subprocess.run(
            ["git", "ls-tree", "--name-only", rev, f"{MODELS / folder}/"], capture_output=True, text=True
        ).stdout.split()
        for name in names:
            if name.endswith(".py"):
                blob = subprocess.run(["git", "show", f"{rev}:{name}"], capture_output=True, check=True)
                (dest / Path(name).name).write_bytes(blob.stdout)
    return dest


def _module(folder: Path):
    for name in MODULES:
        sys.modules.pop(name, None)
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("engine_process")
    finally:
        sys.path.remove(str(folder))


def _tokens_per_s(module, build: str, prompts: list[list[int]], max_tokens: int) -> float:
    engine = module.EngineProcess(build, threads=1)
    params = SamplingParams(max_tokens=max_tokens, end_id=-1).to_dict()

    def one(ids):
        (result,) = engine.run(
            [{"ids": ids, "params": params, "stops": []}],
            speculative=True,
            k=None,
            on_tokens=lambda *a: None,
            stop=lambda i: False,
        )
        return len(result["tokens"])

    try:
        one(prompts[0])  # warm
        start, tokens = time.perf_counter(), sum(one(p) for p in prompts)
        return tokens / (time.perf_counter() - start)
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build")
    parser.add_argument("rev_a")
    parser.add_argument("rev_b", nargs="?", default=None)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args(argv)
    prompts = [[1 + (i * 7 + j) % 200 for j in range(12)] for i in range(6)]
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        modules = {"A": _module(_files(args.rev_a, Path(a))), "B": _module(_files(args.rev_b, Path(b)))}
        ratios = []
        for r in range(args.rounds):
            order = ("A", "B") if r % 2 == 0 else ("B", "A")
            got = {v: _tokens_per_s(modules[v], args.build, prompts, args.max_tokens) for v in order}
            ratios.append(got["B"] / got["A"])
            line = f"round {r}: A {got['A']:.0f} tok/s, B {got['B']:.0f} tok/s, B/A {ratios[-1]:.3f}"
            print(line, flush=True)
    print(f"B/A median {statistics.median(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
