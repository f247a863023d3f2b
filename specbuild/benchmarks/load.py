"""`make bench-load`: the load-aware schedule on the demo family, measured against its own prediction.

For draft/target (the demo's trained target and distilled draft):
1. `tune --schedule --write` on a spec copy: acceptance per draft position, the cost curve on the
   reference engine (batch sizes 1, 2, 4, 8; K 0..max_draft_len), the predicted throughput per (c, K) and
   the schedule written into the spec (predicted.png);
2. in-process: the held-out prompts in lockstep batches of c (ReferenceEngine.generate_batch) for the
   baseline, every fixed K and the schedule, interleaved, `--rounds` rounds: measured / predicted per
   (c, K) (median of the per-round ratios);
3. through the local Triton: the cost curve measured through a served repository (`tune --schedule
   --url`'s measurement, client/serve_curve.py: round time and TTFT per (c, K), on the tune prompts)
   combined with the profiled acceptance into the served prediction and schedule; then a repository
   with that schedule (`repo --schedule`) and `bench --concurrency 1,2,4,8` with baseline, every fixed K
   and the schedule interleaved in `--rounds` rounds (load.json, load_T0.png), measured / predicted per
   (c, K) on the held-out prompts;
4. `load.md`: the tables, with the machine load (`os.getloadavg`) before and after each part.

    python -m specbuild.benchmarks.load [--out build/bench-load] [--prompts 8] [--max-tokens 48] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import yaml
from rich.console import Console

from specbuild.builder.compile import compile_spec
from specbuild.client.bench import run_bench, run_once
from specbuild.client.load_bench import load_summary, load_table_lines
from specbuild.client.metrics import UNARY_BASELINE
from specbuild.client.options import BenchConfig, load_prompts
from specbuild.client.report import write_report
from specbuild.client.serve_curve import measure_served, predict_served
from specbuild.core.methods import Method, Tunable, method_of
from specbuild.core.sampling_params import SamplingParams
from specbuild.core.schedule import DraftSchedule
from specbuild.core.spec import load_spec
from specbuild.demo.models import DEFAULT_CACHE, build_family, build_medusa
from specbuild.engines.reference.engine import ReferenceEngine
from specbuild.model_repo.generate import generate_repo
from specbuild.serve.server import ServerOptions, TritonServer, free_port
from specbuild.tuning.cost_curve import plot
from specbuild.tuning.tune import round_tokens, tune_spec
from specbuild.tuning.tune_options import TuneOptions

DEFAULT_OUT = Path("build/bench-load")
CONCURRENCY = (1, 2, 4, 8)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def _server_options() -> ServerOptions:
    return ServerOptions(grpc_port=free_port(), http_port=free_port(), metrics_port=free_port())


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
    path.write_text(
        "# written by specbuild.benchmarks.load; tune --schedule adds the schedule\n" + yaml.safe_dump(spec)
    )
    return path


def in_process(build: Path, prompts: list[list[int]], ks: list[int], rounds: int, max_tokens: int) -> dict:
    """(c, label) -> per-round tokens/s, lockstep batches of c prompts; labels baseline, K=k, schedule."""
    torch.set_num_threads(1)  # as the server's engine processes
    engine = ReferenceEngine.load(build)
    params = SamplingParams(max_tokens=max_tokens)
    out: dict[tuple[int, str], list[float]] = {}
    modes = [("baseline", False, None)] + [(f"K={k}", True, k) for k in ks] + [("schedule", True, None)]
    engine.generate_batch(prompts[:2], params, num_draft_tokens=ks[-1])  # warm-up
    for _ in range(rounds):
        for c in CONCURRENCY:
            for label, speculative, k in modes:
                tokens, start = 0, time.perf_counter()
                for i in range(0, len(prompts), c):
                    batch = prompts[i : i + c]
                    results = engine.generate_batch(
                        batch, params, speculative=speculative, num_draft_tokens=k
                    )
                    tokens += sum(len(r.token_ids) for r in results)
                out.setdefault((c, label), []).append(tokens / (time.perf_counter() - start))
    return out


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
        prog="python -m specbuild.benchmarks.load", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--prompts", type=int, default=8, help="held-out demo prompts per run")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians reported)")
    parser.add_argument("--k", type=int, default=4, help="max_draft_len profiled and the largest fixed K")
    parser.add_argument("--demo-cache", type=Path, default=None)
    parser.add_argument("--skip-triton", action="store_true", help="in-process part only")
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
    (out / "tune_prompts.txt").write_text("\n".join(tune_texts[:8]) + "\n")
    loads = {"start": _load()}

    spec_path = write_spec(out, family, k=args.k, method=args.method)
    options = TuneOptions(
        prompts=out / "tune_prompts.txt",
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
    build = compile_spec(spec, out / "build", engine="reference", force=True)
    engine = ReferenceEngine.load(build)
    prompt_ids = [engine.encode(t) for t in held]
    ks = list(range(1, spec.speculation.max_draft_len + 1))
    local = in_process(build, prompt_ids, ks, args.rounds, args.max_tokens)
    loads["after in-process"] = _load()
    predicted = predicted_rates(prediction)
    result = {
        "method": args.method,
        "schedule": schedule.to_dict() if schedule else None,
        "prediction": prediction,
        "loads": loads,
    }
    result["in_process"] = {
        f"{c}/{label}": {
            "tokens_per_s_median": statistics.median(v),
            "min": min(v),
            "max": max(v),
            "measured_over_predicted": statistics.median(v) / predicted[c, label]
            if (c, label) in predicted
            else None,
        }
        for (c, label), v in local.items()
    }
    if not args.skip_triton:
        acceptance, tokens = round_tokens(report)
        curve_repo = generate_repo(build, out / "repo-curve", backend="python", force=True, schedule="off")
        with TritonServer(curve_repo, _server_options()) as server:
            curve = measure_served(
                server.grpc_url, tune_texts[:8], ks=ks, concurrency=CONCURRENCY, max_tokens=args.max_tokens
            )
        served = predict_served(curve, acceptance, tokens=tokens)
        plot(served, out / "predicted_served.png")
        loads["after the served curve"] = _load()
        result["served_prediction"] = served
        text = ",".join(f"{n}:{k}" for n, k in served["schedule"].items()) if served["schedule"] else "off"
        result["served_schedule"] = text
        console.print(f"served schedule: {text}")
        repo = generate_repo(build, out / "repo", backend="python", force=True, schedule=text)
        with TritonServer(repo, _server_options()) as server:
            config = BenchConfig(
                url=server.grpc_url,
                prompts=tuple(held),
                max_tokens=args.max_tokens,
                concurrency=CONCURRENCY,
                temperatures=(0.0,),
                timeout_s=600,
                rounds=args.rounds,
                fixed_ks=tuple(ks),
            )
            runs, context = run_bench(config, console=console)
        loads["after Triton"] = _load()
        write_report(runs, context, out / "triton")
        rows = load_summary(runs)
        result["triton"] = rows
        served_rates = predicted_rates(served, baseline_label=UNARY_BASELINE)
        for row in rows:
            for label, m in row["modes"].items():
                p = served_rates.get((row["concurrency"], label))
                m["measured_over_predicted"] = m["throughput_median"] / p if p else None
        for line in load_table_lines(rows):
            console.print(line, markup=False)
    (out / "load_result.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "load.md").write_text(markdown(result))
    console.print((out / "load.md").read_text(), markup=False)


def run_medusa(args, family, out: Path, tune_texts: list[str], held: list[str], console) -> None:
    """Medusa through the local Triton: a Medusa engine cannot run without its tree, so the baseline is the
    same target served by a draft/target repository (num_draft_tokens 0), the tree a Medusa repository
    without schedule, and the schedule a Medusa repository whose local engine model decodes a batch
    plainly where K(n) = 0 (three servers up together; every round runs each of them in turn). The
    schedule: per concurrency, the tree where its measured throughput on the tune prompts beats the
    baseline's (the served cost curve of a tree: on or off)."""
    heads = build_medusa(family, cache=args.demo_cache or DEFAULT_CACHE, log=console.print)
    loads = {"start": _load()}
    base_spec = load_spec(write_spec(out / "dt", family, k=args.k))
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
    dt_build = compile_spec(base_spec, out / "dt" / "build", engine="reference", force=True)
    m_build = compile_spec(medusa_spec, out / "medusa" / "build", engine="reference", force=True)
    dt_repo = generate_repo(dt_build, out / "dt" / "repo", backend="python", force=True, schedule="off")
    tree_repo = generate_repo(
        m_build, out / "medusa" / "repo-tree", backend="python", force=True, schedule="off"
    )

    def config(url, prompts, rounds=1):
        return BenchConfig(
            url=url,
            prompts=tuple(prompts),
            max_tokens=args.max_tokens,
            concurrency=CONCURRENCY,
            temperatures=(0.0,),
            timeout_s=600,
            rounds=rounds,
        )

    def one(url, prompts, c, mode, k):
        run = run_once(
            config(url, prompts), mode=mode, temperature=0.0, concurrency=c, k=k, advance=lambda: None
        )
        if mode != "baseline":
            run.num_draft_tokens = tree_k
        return run

    with TritonServer(dt_repo, _server_options()) as dt, TritonServer(tree_repo, _server_options()) as tree:
        measured = {
            c: {
                "baseline": one(dt.grpc_url, tune_texts, c, "baseline", 0).metrics["output_token_throughput"],
                "tree": one(tree.grpc_url, tune_texts, c, "speculative", None).metrics[
                    "output_token_throughput"
                ],
            }
            for c in CONCURRENCY
        }
        chosen = {c: tree_k if m["tree"] > m["baseline"] else 0 for c, m in measured.items()}
        steps, last = {}, None
        for c in CONCURRENCY:
            if chosen[c] != last:
                steps[1 if c == CONCURRENCY[0] else c] = chosen[c]
                last = chosen[c]
        text = ",".join(f"{n}:{k}" for n, k in steps.items()) if chosen[1] else "off"
        console.print(f"Medusa served schedule: {text} (measured on the tune prompts: {measured})")
        loads["after the served curve"] = _load()
        sched_repo = generate_repo(
            m_build, out / "medusa" / "repo-schedule", backend="python", force=True, schedule=text
        )
        runs = []
        with TritonServer(sched_repo, _server_options()) as sched:
            for r in range(args.rounds):
                for c in CONCURRENCY:
                    for url, mode, k in (
                        (dt.grpc_url, "baseline", 0),
                        (tree.grpc_url, "speculative", None),
                        (sched.grpc_url, "schedule", None),
                    ):
                        run = one(url, held, c, mode, k)
                        run.metrics["round"] = r
                        runs.append(run)
        loads["after Triton"] = _load()
    rows = load_summary(runs)
    predicted = {(c, "baseline"): m["baseline"] for c, m in measured.items()}
    predicted.update({(c, f"K={tree_k}"): m["tree"] for c, m in measured.items()})
    predicted.update({(c, "schedule"): max(m.values()) for c, m in measured.items()})
    for row in rows:
        for label, m in row["modes"].items():
            p = predicted.get((row["concurrency"], label))
            m["measured_over_predicted"] = m["throughput_median"] / p if p else None
    write_report(
        runs, {"mode": "medusa", "draft_len_schedule": text, "rounds": args.rounds}, out / "medusa" / "triton"
    )
    result = {
        "method": "medusa",
        "schedule": steps if chosen[1] else None,
        "served_schedule": text,
        "loads": loads,
        "prediction": {"mode": "measured on the tune prompts"},
        "in_process": {},
        "triton": rows,
        "served_measurements": measured,
    }
    (out / "load_result.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "load.md").write_text(markdown(result))
    for line in load_table_lines(rows):
        console.print(line, markup=False)
    console.print((out / "load.md").read_text(), markup=False)


def markdown(result: dict) -> str:
    lines = [
        f"# Load-aware schedule on the demo family ({result.get('method', 'draft_target')})",
        "",
        f"in-process schedule (`tune --schedule`, {result['prediction']['mode']} mode, in the spec): "
        f"`{result['schedule']}`; served schedule (`tune --schedule --url`, the Triton cost curve): "
        f"`{result.get('served_schedule')}`",
        "",
        "machine load (os.getloadavg): " + "; ".join(f"{k}: {v}" for k, v in result["loads"].items()),
        "",
        "## In-process (reference engine, lockstep batches of c), tokens/s, median of rounds "
        "(measured/predicted)",
        "",
    ]
    local = result["in_process"]
    labels = list(dict.fromkeys(key.split("/", 1)[1] for key in local))
    lines.append("| c | " + " | ".join(labels) + " |")
    lines.append("|---" * (len(labels) + 1) + "|")
    for c in CONCURRENCY:
        cells = []
        for label in labels:
            m = local.get(f"{c}/{label}")
            ratio = f" ({m['measured_over_predicted']:.2f})" if m and m["measured_over_predicted"] else ""
            cells.append(f"{m['tokens_per_s_median']:.1f}{ratio}" if m else "")
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    if "triton" in result:
        lines += [
            "",
            "## Through the local Triton (`bench`, interleaved rounds), tokens/s (measured/predicted)",
            "",
        ]
        labels = list(dict.fromkeys(label for row in result["triton"] for label in row["modes"]))
        lines.append(
            "| c | "
            + " | ".join(labels)
            + " | schedule / baseline | schedule / one-call baseline | schedule / best fixed K |"
        )
        lines.append("|---" * (len(labels) + 4) + "|")
        for row in result["triton"]:
            cells = []
            for label in labels:
                m = row["modes"].get(label)
                ratio = (
                    f" ({m['measured_over_predicted']:.2f})" if m and m.get("measured_over_predicted") else ""
                )
                cells.append(f"{m['throughput_median']:.1f}{ratio}" if m else "")
            sb, sf = row.get("schedule_over_baseline"), row.get("schedule_over_best_fixed")
            su = row.get("schedule_over_baseline_unary")
            cells.append(f"{sb['median']:.3f} ({sb['min']:.2f}-{sb['max']:.2f})" if sb else "")
            cells.append(f"{su['median']:.3f} ({su['min']:.2f}-{su['max']:.2f})" if su else "")
            cells.append(f"{sf['median']:.3f} vs {row.get('best_fixed')}" if sf else "")
            lines.append(f"| {row['concurrency']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
