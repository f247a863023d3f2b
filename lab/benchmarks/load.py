"""`make bench-load`: the load-aware schedule on the demo family, measured against its own prediction.

For draft/target (the demo's trained target and distilled draft):
1. `tune --schedule --write` on a spec copy: acceptance per draft position, the cost curve on the
   reference engine (batch sizes 1, 2, 4, 8; K 0..max_draft_len), the predicted throughput per (c, K) and
   the schedule written into the spec (predicted.png);
2. in-process: the held-out prompts in lockstep batches of c (ReferenceEngine.generate_batch) for the
   baseline, every fixed K and the schedule, interleaved, `--rounds` rounds: measured / predicted per
   (c, K) (median of the per-round ratios);
3. through the local Triton: the cost curve measured through a served repository (`tune --schedule
   --url`'s measurement, bench/serve_curve.py: round time and TTFT per (c, K), on the tune prompts)
   combined with the profiled acceptance into the served prediction and schedule; then a repository
   with that schedule (`repo --schedule`) and `bench --concurrency 1,2,4,8` with baseline, every fixed K
   and the schedule interleaved in `--rounds` rounds (load.json, load_T0.png), measured / predicted per
   (c, K) on the held-out prompts;
4. `load.md`: the tables, with the machine load (`os.getloadavg`) before and after each part.

    python -m lab.benchmarks.load [--method draft_target|ngram|medusa] [--out build/bench-load] \
        [--prompts 8] [--max-tokens 48] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml
from rich.console import Console

from specbuild.bench.bench import run_once
from specbuild.bench.load_bench import (
    BASELINE_MODE,
    FIXED_MODE,
    LOAD_WAVES,
    SCHEDULE_MODE,
    bar_verdict,
    decision_text,
    load_summary,
    load_table_lines,
    undecided_points,
)
from specbuild.bench.metrics import UNARY_BASELINE, UNARY_BASELINE_AGAIN, UNARY_SCHEDULE
from specbuild.bench.options import BenchConfig, load_prompts
from specbuild.bench.report import write_report
from specbuild.bench.serve_curve import (
    REPEATS,
    calibrate,
    measure_served,
    predict_served,
    predicted_tokens_per_s,
)
from specbuild.core.methods import Method, Tunable, method_of
from specbuild.core.perf.schedule import DraftSchedule, schedule_steps
from specbuild.core.perf.schedule_choice import choose, round_order
from specbuild.core.sampling_params import SamplingParams
from specbuild.core.spec import load_spec
from specbuild.demo.models import DEFAULT_CACHE, build_family, build_medusa
from specbuild.demo.pipeline import ServedBuild, compile_in_process, local_server, repo_in_process
from specbuild.engines.reference.engine import ReferenceEngine
from specbuild.tuning.cost_curve import plot
from specbuild.tuning.holdout import calibrated_run
from specbuild.tuning.tune import round_tokens, tune_spec
from specbuild.tuning.tune_options import TuneOptions

DEFAULT_OUT = Path("build/bench-load")
CONCURRENCY = (1, 2, 4, 8)


def _load() -> str:
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


def rewrite_markdown(out: Path) -> Path:
    """load.md again from load_result.json (after a change to the table layout)."""
    path = out / "load.md"
    path.write_text(markdown(json.loads((out / "load_result.json").read_text())))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m lab.benchmarks.load", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--prompts", type=int, default=8, help="held-out demo prompts per run")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (medians reported)")
    parser.add_argument(
        "--max-rounds",
        type=int,
        default=0,
        help="after --rounds, one more round at each c whose bars the sign test leaves undecided, up to "
        "this many (0: no more)",
    )
    parser.add_argument(
        "--waves",
        type=int,
        default=LOAD_WAVES,
        help="a run at c sends >= WAVES x c requests (prompts cycled)",
    )
    parser.add_argument("--k", type=int, default=4, help="max_draft_len profiled and the largest fixed K")
    parser.add_argument("--demo-cache", type=Path, default=None)
    parser.add_argument("--skip-triton", action="store_true", help="in-process part only")
    parser.add_argument(
        "--skip-in-process",
        action="store_true",
        help="served part only (make demo checks tune's in-process prediction on held-out prompts)",
    )
    parser.add_argument("--method", choices=("draft_target", "ngram", "medusa"), default="draft_target")
    args = parser.parse_args(argv)
    console = Console(width=160)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    family = build_family(cache=args.demo_cache or DEFAULT_CACHE, log=console.print)
    texts = list(load_prompts(family.prompts))
    tune_texts, held = texts[: max(2, len(texts) - args.prompts)], texts[-args.prompts :]
    if method_of(Method(args.method)).tunes is Tunable.TREE:
        run_medusa(args, family, out, tune_texts[:8], held, console)
        return
    # jsonl: a prompt keeps its newlines (a .txt file is one prompt per line)
    (out / "tune_prompts.jsonl").write_text("".join(json.dumps({"prompt": t}) + "\n" for t in tune_texts[:8]))
    loads = {"start": _load()}

    spec_path = write_spec(out, family, k=args.k, method=args.method)
    options = TuneOptions(
        prompts=out / "tune_prompts.jsonl",
        max_tokens=args.max_tokens,
        k_max=args.k,
        write=True,
        schedule=True,
        concurrency=CONCURRENCY,
        plot=out / "predicted.png",
    )
    report = tune_spec(spec_path, options)
    prediction = report.details["schedule"]
    loads["after tune"] = _load()
    spec = load_spec(spec_path)
    schedule = (
        DraftSchedule.parse(spec.speculation.schedule, max_draft_len=spec.speculation.max_draft_len)
        if spec.speculation.schedule
        else None
    )
    console.print(
        f"schedule: {schedule.to_dict() if schedule else None} "
        f"(max_draft_len {spec.speculation.max_draft_len})"
    )
    served = ServedBuild(spec=spec_path, out=out)
    build = compile_in_process(served)
    engine = ReferenceEngine.load(build)
    prompt_ids = [engine.encode(t) for t in held]
    ks = list(range(1, spec.speculation.max_draft_len + 1))
    tune_ids = [engine.encode(t) for t in tune_texts[:8]]
    local = (
        {}
        if args.skip_in_process
        else in_process(build, prompt_ids, ks, args.rounds, args.max_tokens, tune_ids)
    )
    loads["after in-process"] = _load()
    result = {
        "method": args.method,
        "schedule": schedule.to_dict() if schedule else None,
        "prediction": prediction,
        "loads": loads,
    }
    result["in_process"] = {}
    for (c, label), v in local.items():
        measured = [m for m, _, _ in v]
        result["in_process"][f"{c}/{label}"] = {
            "tokens_per_s_median": statistics.median(measured),
            "min": min(measured),
            "max": max(measured),
            "predicted_median": statistics.median(p for _, p, _ in v),
            "measured_over_predicted": statistics.median(m / p for m, p, _ in v),
            "ratio_min": min(m / p for m, p, _ in v),
            "ratio_max": max(m / p for m, p, _ in v),
            "measured_over_cost_model": statistics.median(m / own for m, _, own in v),
        }
    if not args.skip_triton:
        acceptance, tokens = round_tokens(report)
        curve_repo = repo_in_process(replace(served, repo_dir="repo-curve", schedule="off"))
        with local_server(curve_repo) as server:
            curve = measure_served(
                server.grpc_url,
                tune_texts[:8],
                ks=ks,
                concurrency=CONCURRENCY,
                max_tokens=args.max_tokens,
                waves=args.waves,
            )
        served = predict_served(curve, acceptance, tokens=tokens)
        plot(served, out / "predicted_served.png")
        loads["after the served curve"] = _load()
        result["served_prediction"] = served
        # the repository's schedule: the spec's, or speculation off where no K pays at one request in flight
        text = served["repository_schedule"]
        result["served_schedule"] = text
        console.print(f"served schedule: {text}")
        repo = repo_in_process(replace(served, schedule=text))
        with local_server(repo) as server:
            url = server.grpc_url
            modes = [(url, BASELINE_MODE, 0), (url, UNARY_BASELINE, 0)] + [(url, FIXED_MODE, k) for k in ks]
            # streamed, and in one call per request (against the one-call baseline)
            modes += [(url, SCHEDULE_MODE, None), (url, UNARY_SCHEDULE, None)]
            modes.append((url, UNARY_BASELINE_AGAIN, 0))  # A/A: at the round's other end from the first
            runs = served_rounds(
                held,
                tune_texts[:8],
                modes,
                args.rounds,
                args.max_tokens,
                console,
                waves=args.waves,
                max_rounds=args.max_rounds,
            )
        loads["after Triton"] = _load()
        context = {
            "url": "local Triton (bench-load)",
            "mode": args.method,
            "draft_len_schedule": text,
            "rounds": max(run.metrics["round"] for run in runs) + 1,
            "max_tokens": args.max_tokens,
            "prompts": len(held),
        }
        write_report(runs, context, out / "triton")
        rows = load_summary(runs)  # with measured / predicted per mode (median of per-round ratios)
        result["triton"] = rows
        for line in load_table_lines(rows):
            console.print(line, markup=False)
    (out / "load_result.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "load.md").write_text(markdown(result))
    console.print((out / "load.md").read_text(), markup=False)


def run_medusa(args, family, out: Path, tune_texts: list[str], held: list[str], console) -> None:
    """Medusa through the local Triton: a Medusa engine cannot run without its tree, so the baseline is the
    same target served by a draft/target repository (num_draft_tokens 0: streamed, and in one call), the
    tree a Medusa repository without schedule, and the schedule a Medusa repository whose local engine
    model decodes a batch plainly where K(n) = 0 (three servers up together). The served cost curve of
    a tree is on or off: per concurrency, the tune prompts through the tree and through the one-call
    baseline, REPEATS interleaved sweeps, give the predicted throughput of each
    (bench/serve_curve.calibrate / predicted_tokens_per_s: the closed-loop makespan); the tree stays on
    at c=1 unless the baseline predicts more in every repeat by > 3%, and past c=1 only where it predicts
    more than the baseline in every repeat by > 3% (core/perf/schedule_choice), thresholds at the
    midpoints (core/perf/schedule.schedule_steps). Then `--rounds` interleaved rounds of the baselines, the
    tree, the schedule streamed and the schedule in one call per request (`schedule-unary`: its K=0
    batches answer once per request, like the one-call baseline), each run of the held-out prompts
    right after its calibration on the tune prompts."""
    heads = build_medusa(family, cache=args.demo_cache or DEFAULT_CACHE, log=console.print)
    loads = {"start": _load()}
    base_spec = write_spec(out / "dt", family, k=args.k)
    raw = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "examples" / "demo" / "medusa.yaml").read_text()
    )
    raw["target"]["model"], raw["medusa"]["heads"] = str(family.target), str(heads)
    raw["build"]["max_batch_size"] = 8
    raw.setdefault("serving", {}).update(bls_instance_count=8)
    (out / "medusa").mkdir(parents=True, exist_ok=True)
    (out / "medusa" / "spec.yaml").write_text(yaml.safe_dump(raw))
    medusa_spec = load_spec(out / "medusa" / "spec.yaml")
    tree_k = medusa_spec.speculation.max_draft_len
    dt_build = ServedBuild(spec=base_spec, out=out / "dt", schedule="off")
    tree_build = ServedBuild(
        spec=out / "medusa" / "spec.yaml", out=out / "medusa", repo_dir="repo-tree", schedule="off"
    )
    compile_in_process(dt_build)
    compile_in_process(tree_build)
    dt_repo, tree_repo = repo_in_process(dt_build), repo_in_process(tree_build)

    def config(url, prompts):
        return BenchConfig(
            url=url,
            prompts=tuple(prompts),
            max_tokens=args.max_tokens,
            concurrency=CONCURRENCY,
            temperatures=(0.0,),
            timeout_s=600,
            waves=args.waves,
        )

    def calibrated(url, c, mode, k):
        run = run_once(
            config(url, tune_texts), mode=mode, temperature=0.0, concurrency=c, k=k, advance=lambda: None
        )
        point = calibrate(run)
        return {
            "predicted": predicted_tokens_per_s(point, c, len(run.records)),
            "measured": point["throughput"],
        }

    with local_server(dt_repo) as dt, local_server(tree_repo) as tree:
        measured: dict[int, dict[str, list[dict]]] = {}
        for r in range(REPEATS):  # the sweep repeated, interleaved (as bench/serve_curve.measure_served)
            for c in CONCURRENCY:
                point = measured.setdefault(c, {"baseline": [], "tree": []})
                sides = (
                    ("baseline", dt.grpc_url, UNARY_BASELINE, 0),
                    ("tree", tree.grpc_url, FIXED_MODE, None),
                )
                for name, url, mode, k in round_order(sides, r):  # reversed every other repeat
                    point[name].append(calibrated(url, c, mode, k))
        rates = {
            c: {0: [m["predicted"] for m in p["baseline"]], tree_k: [m["predicted"] for m in p["tree"]]}
            for c, p in measured.items()
        }
        # the tree is on at c=1 unless the one-call baseline wins every repeat by > 3%, and past c=1 only
        # where it wins every repeat against the baseline by > 3%; more load never turns it back on
        # (core/perf/schedule_choice)
        decisions = choose(rates)
        chosen = {d.concurrency: d.chosen for d in decisions}
        steps = schedule_steps(list(CONCURRENCY), chosen)
        text = ",".join(f"{n}:{k}" for n, k in steps.items()) if chosen[CONCURRENCY[0]] else "off"
        console.print(f"Medusa served schedule: {text}")
        for d in decisions:
            console.print(f"  c={d.concurrency}: {d.reason}", markup=False)
        loads["after the served curve"] = _load()
        with contextlib.ExitStack() as stack:
            modes = [
                (dt.grpc_url, BASELINE_MODE, 0),
                (dt.grpc_url, UNARY_BASELINE, 0),
                (tree.grpc_url, FIXED_MODE, None),
            ]
            if text != "off":
                sched_repo = repo_in_process(replace(tree_build, repo_dir="repo-schedule", schedule=text))
                sched = stack.enter_context(local_server(sched_repo))
                modes.append((sched.grpc_url, SCHEDULE_MODE, None))
                # the same schedule in one unary call per request: its K=0 batches then answer once per
                # request, like the one-call baseline (streamed, they send one response per token)
                modes.append((sched.grpc_url, UNARY_SCHEDULE, None))
            # A/A: the one-call baseline again, at the round's other end from the first
            modes.append((dt.grpc_url, UNARY_BASELINE_AGAIN, 0))
            runs = served_rounds(
                held,
                tune_texts,
                modes,
                args.rounds,
                args.max_tokens,
                console,
                tree_k=tree_k,
                waves=args.waves,
                max_rounds=args.max_rounds,
            )
        loads["after Triton"] = _load()
    rows = load_summary(runs)  # with measured / predicted per mode (median of per-round ratios)
    write_report(
        runs,
        {"mode": "medusa", "draft_len_schedule": text, "rounds": args.rounds, "max_tokens": args.max_tokens},
        out / "medusa" / "triton",
    )
    result = {
        "method": "medusa",
        "schedule": steps if text != "off" else None,
        "served_schedule": text,
        "loads": loads,
        "prediction": {
            "mode": "throughput",
            "served_tune_points": measured,
            "chosen": chosen,
            "decisions": [d.reason for d in decisions],
        },
        "in_process": {},
        "triton": rows,
    }
    (out / "load_result.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "load.md").write_text(markdown(result))
    for line in load_table_lines(rows):
        console.print(line, markup=False)
    console.print((out / "load.md").read_text(), markup=False)


# The second ratio of a speculative cell: measured over the prediction with the run's own rounds (the
# calibration's times; holdout.calibrated_run, cost_model.with_rounds_of): the cost model's own error,
# without the held-out prompts' acceptance against the tune prompts'.
OWN_ROUNDS_NOTE = "; then over the prediction with the run's own rounds: the cost model alone"


def _ratios(over_predicted: float, over_cost_model: float | None) -> str:
    own = f"; {over_cost_model:.2f}" if over_cost_model else ""
    return f" ({over_predicted:.2f}{own})"


def markdown(result: dict) -> str:
    lines = [
        f"# Load-aware schedule on the demo family ({result.get('method', 'draft_target')})",
        "",
        (
            f"served schedule (the tree where the tune prompts predict more than the one-call baseline): "
            f"`{result.get('served_schedule')}`"
            if "served_tune_points" in result["prediction"]  # a tree: on or off per concurrency
            else f"in-process schedule (`tune --schedule`, {result['prediction']['mode']} mode, in the spec):"
            " "
            f"`{result['schedule']}`; served schedule (`tune --schedule --url`, the Triton cost curve): "
            f"`{result.get('served_schedule')}`"
        ),
        "",
        "machine load (os.getloadavg): " + "; ".join(f"{k}: {v}" for k, v in result["loads"].items()),
        "",
    ]
    local = result["in_process"]
    if local:
        lines += [
            "## In-process (reference engine, lockstep batches of c), tokens/s, median of rounds "
            f"(measured/predicted, median of per-round ratios{OWN_ROUNDS_NOTE})",
            "",
        ]
        labels = list(dict.fromkeys(key.split("/", 1)[1] for key in local))
        lines.append("| c | " + " | ".join(labels) + " |")
        lines.append("|---" * (len(labels) + 1) + "|")
        for c in CONCURRENCY:
            cells = []
            for label in labels:
                m = local.get(f"{c}/{label}")
                ratio = (
                    _ratios(m["measured_over_predicted"], m.get("measured_over_cost_model"))
                    if m and m["measured_over_predicted"]
                    else ""
                )
                cells.append(f"{m['tokens_per_s_median']:.1f}{ratio}" if m else "")
            lines.append(f"| {c} | " + " | ".join(cells) + " |")
    if "triton" in result:
        lines += [
            "",
            "## Through the local Triton (`bench`, interleaved rounds), tokens/s "
            f"(measured/predicted{OWN_ROUNDS_NOTE})",
            "",
        ]
        labels = list(dict.fromkeys(label for row in result["triton"] for label in row["modes"]))
        one_call = any("schedule_unary_over_baseline_unary" in row for row in result["triton"])
        a_a = any("a_a" in row for row in result["triton"])
        lines.append(
            "| c | "
            + " | ".join(labels)
            + " | schedule / baseline | schedule / one-call baseline | schedule / best fixed K |"
            + (" schedule (one call) / one-call baseline |" if one_call else "")
            + (" A/A: one-call baseline again / itself |" if a_a else "")
            + " bars (sign test over the rounds) |"
        )
        lines.append("|---" * (len(labels) + 5 + one_call + a_a) + "|")
        for row in result["triton"]:
            cells = []
            for label in labels:
                m = row["modes"].get(label)
                ratio = (
                    _ratios(
                        m["measured_over_predicted"], (m.get("measured_over_cost_model") or {}).get("median")
                    )
                    if m and m.get("measured_over_predicted")
                    else ""
                )
                cells.append(f"{m['throughput_median']:.1f}{ratio}" if m else "")
            sb, sf = row.get("schedule_over_baseline"), row.get("schedule_over_best_fixed")
            su = row.get("schedule_over_baseline_unary")
            cells.append(f"{sb['median']:.3f} ({sb['min']:.2f}-{sb['max']:.2f})" if sb else "")
            cells.append(f"{su['median']:.3f} ({su['min']:.2f}-{su['max']:.2f})" if su else "")
            cells.append(f"{sf['median']:.3f} vs {row.get('best_fixed')}" if sf else "")
            if one_call:
                uu = row.get("schedule_unary_over_baseline_unary")
                verdict = f" {bar_verdict(uu, row['a_a'])}" if uu and row.get("a_a") else ""
                cells.append(f"{uu['median']:.3f} ({uu['min']:.2f}-{uu['max']:.2f}){verdict}" if uu else "")
            if a_a:
                aa = row.get("a_a")
                cells.append(f"{aa['median']:.3f} ({aa['min']:.2f}-{aa['max']:.2f})" if aa else "")
            bars = row.get("bars", {})  # load_summary's sign test of each bar (none in older results)
            cells.append("; ".join(f"{n.replace('_', '-')}: {decision_text(d)}" for n, d in bars.items()))
            lines.append(f"| {row['concurrency']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
