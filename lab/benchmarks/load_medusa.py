"""bench-load for Medusa (lab/benchmarks/load.py --method medusa): three servers, the tree on or off per
concurrency."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path

import yaml

from lab.benchmarks.load_report import markdown
from lab.benchmarks.load_runs import CONCURRENCY, machine_load, served_rounds, write_spec
from specbuild.bench.bench import run_once
from specbuild.bench.load_bench import (
    BASELINE_MODE,
    FIXED_MODE,
    SCHEDULE_MODE,
    load_summary,
    load_table_lines,
)
from specbuild.bench.metrics import UNARY_BASELINE, UNARY_BASELINE_AGAIN, UNARY_SCHEDULE
from specbuild.bench.options import BenchConfig
from specbuild.bench.report import write_report
from specbuild.bench.serve_curve import (
    REPEATS,
    calibrate,
    predicted_tokens_per_s,
)
from specbuild.core.perf.schedule import schedule_steps
from specbuild.core.perf.schedule_choice import choose, round_order
from specbuild.core.spec import load_spec
from specbuild.demo.models import DEFAULT_CACHE, build_medusa
from specbuild.demo.pipeline import ServedBuild, compile_in_process, local_server, repo_in_process


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
    loads = {"start": machine_load()}
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
        loads["after the served curve"] = machine_load()
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
        loads["after Triton"] = machine_load()
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
