"""bench-load's runs (lab/benchmarks/load.py): the spec copy, the in-process lockstep rounds, the served
rounds and the predicted rates they are compared with."""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
import yaml

from specbuild.bench.bench import run_once
from specbuild.bench.load_bench import (
    FIXED_MODE,
    LOAD_WAVES,
    SCHEDULE_MODE,
    load_summary,
    undecided_points,
)
from specbuild.bench.metrics import UNARY_SCHEDULE
from specbuild.bench.options import BenchConfig
from specbuild.bench.serve_curve import (
    calibrate,
    predicted_tokens_per_s,
)
from specbuild.core.methods import Method, Tunable, method_of
from specbuild.core.perf.schedule_choice import round_order
from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.engine import ReferenceEngine
from specbuild.tuning.holdout import calibrated_run

DEFAULT_OUT = Path("build/bench-load")
CONCURRENCY = (1, 2, 4, 8)


def machine_load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min) at {time.strftime('%H:%M:%S', time.gmtime())} UTC"


def write_spec(out: Path, family, *, k: int, method: str = Method.DRAFT_TARGET.value) -> Path:
    kind = method_of(Method(method))
    spec = {
        "name": "bench-load",
        "mode": method,
        "dtype": "float32",
        "target": {"model": str(family.target)},
        **({"draft": {"model": str(family.draft)}} if kind.draft_model else {}),
        **({kind.section: {"max_matching_ngram_size": 3}} if kind.tunes is Tunable.NGRAM else {}),
        "speculation": {"max_draft_len": k},
        "build": {"max_batch_size": 8, "max_input_len": 256, "max_seq_len": 512},
        # eight BLS instances: up to eight requests in flight reach the engines (and the counter)
        "serving": {"gpu_memory_gb": 4, "bls_instance_count": 8},
    }
    path = out / "spec.yaml"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# written by lab.benchmarks.load; tune --schedule adds the schedule\n" + yaml.safe_dump(spec)
    )
    return path


def in_process(
    build: Path,
    prompts: list[list[int]],
    ks: list[int],
    rounds: int,
    max_tokens: int,
    tune_prompts: list[list[int]],
) -> dict[tuple[int, str], list[tuple[float, float, float]]]:
    """(c, label) -> per round (measured tokens/s on the held-out `prompts`, predicted tokens/s, predicted
    with the held-out run's own rounds: holdout.calibrated_run) in
    lockstep batches of c; labels baseline, K=k, schedule. Each round times every point twice back to
    back: the cost model calibrated on the tune prompts (tuning/cost_curve.time_loop: first tokens,
    round time, rounds per prompt) predicts the held-out run that follows, so a load change between
    rounds moves both sides alike."""
    torch.set_num_threads(1)  # as the server's engine processes
    engine = ReferenceEngine.load(build)
    out: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    modes = [("baseline", False, None)] + [(f"K={k}", True, k) for k in ks] + [("schedule", True, None)]
    engine.generate_batch(prompts[:2], SamplingParams(max_tokens=4), num_draft_tokens=ks[-1])  # warm-up
    for r in range(rounds):
        for c in CONCURRENCY:
            for label, speculative, k in round_order(modes, r):  # reversed every other round
                triple = calibrated_run(
                    engine, tune_prompts, prompts, c, k, max_tokens, speculative=speculative
                )
                out.setdefault((c, label), []).append(triple)
    return out


def served_rounds(
    held,
    tune,
    modes,
    rounds: int,
    max_tokens: int,
    console,
    *,
    tree_k=None,
    waves: int = LOAD_WAVES,
    max_rounds: int = 0,
) -> list:
    """`rounds` interleaved rounds through the servers: every (c, mode) runs the tune prompts (the
    calibration: bench/serve_curve.calibrate) and right after them the held-out prompts, whose run
    carries the calibration's prediction (metrics["predicted_tokens_per_s"]). `modes`: (server URL,
    bench mode, num_draft_tokens to send or None); `tree_k`: the K a Medusa tree's runs are labelled with
    (its requests send none). `max_rounds`: after `rounds`, one more round at each c whose schedule bars
    the sign test leaves undecided (bench/load_bench.bar_decision), up to that many rounds."""

    def config(url, prompts):
        return BenchConfig(
            url=url,
            prompts=tuple(prompts),
            max_tokens=max_tokens,
            concurrency=CONCURRENCY,
            temperatures=(0.0,),
            timeout_s=600,
            waves=waves,
        )

    largest = tree_k or max(k for _, m, k in modes if m == FIXED_MODE)
    runs = []
    open_c, r = list(CONCURRENCY), 0
    while open_c:
        for c in open_c:
            for url, mode, k in round_order(modes, r):  # reversed every other round
                common = dict(mode=mode, temperature=0.0, concurrency=c, k=k, advance=lambda: None)
                cal = run_once(config(url, tune), **common)
                run = run_once(config(url, held), **common)
                run.metrics["round"] = r
                run.metrics["predicted_tokens_per_s"] = predicted_tokens_per_s(
                    calibrate(cal), c, len(run.records)
                )
                if mode in (SCHEDULE_MODE, UNARY_SCHEDULE) or (mode == FIXED_MODE and k is None):
                    run.num_draft_tokens = largest
                runs.append(run)
            extra = f" (more: a bar still undecided; up to {max_rounds})" if r >= rounds else ""
            console.print(f"round {r + 1}/{rounds}{extra} c={c} done", markup=False)
        r += 1
        if r >= rounds:
            open_c = [] if r >= max_rounds else sorted(c for _, c in undecided_points(load_summary(runs)))
    return runs


def predicted_rates(prediction: dict, *, baseline_label: str = "baseline") -> dict[tuple[int, str], float]:
    """(c, label) -> predicted tokens/s; the served prediction's baseline is the one-call (unary) run."""
    rates = {}
    for row in prediction["table"]:
        rates[row["batch"], f"K={row['k']}" if row["k"] else "K=0"] = row["tokens_per_s"]
    for b, rate in prediction["baseline"].items():
        rates[int(b), baseline_label] = rate
    for b, k in prediction["chosen"].items():
        rates[int(b), "schedule"] = rates[int(b), f"K={k}" if k else "K=0"]
    return rates
