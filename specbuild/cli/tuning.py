"""Commands of the tuning stage: `train-medusa` and `tune`.

Thin: each command builds a config object and calls one library function. Only typer and the
torch-free config module are imported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.common import INPUT, OUT_DIR, OUT_FILE, SPEC, AsJson, command, console, parse_csv_numbers
from specbuild.tuning.config import TrainConfig, default
from specbuild.tuning.tune_options import TuneOptions


@command("train-medusa")
def train_medusa_cmd(
    model: Annotated[
        str,
        typer.Argument(help="Base model: a Hugging Face folder (or a cached hub id). It stays frozen."),
        INPUT("base model"),
    ],
    data: Annotated[
        Path,
        typer.Option(
            "--data",
            help="Training text: a .txt file (one document or prompt per non-empty line) or .jsonl (field "
            '"text" or "prompt").',
        ),
        INPUT("training data"),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Output folder for the heads (HF Medusa format: medusa_lm_head.safetensors + config.json), "
            "written atomically.",
        ),
        OUT_DIR,
    ],
    num_heads: Annotated[
        int, typer.Option("--num-heads", help="Medusa heads; head h predicts token t+h+2.")
    ] = default(TrainConfig, "num_heads"),
    num_layers: Annotated[int, typer.Option("--num-layers", help="ResBlocks per head.")] = default(
        TrainConfig, "num_layers"
    ),
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps.")] = default(TrainConfig, "steps"),
    lr: Annotated[
        float,
        typer.Option(
            "--lr", help="Peak AdamW learning rate (linear warmup over 5% of the steps, then cosine decay)."
        ),
    ] = default(TrainConfig, "lr"),
    batch_size: Annotated[int, typer.Option("--batch-size", help="Windows per step.")] = default(
        TrainConfig, "batch_size"
    ),
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per training window.")] = default(
        TrainConfig, "seq_len"
    ),
    self_distill: Annotated[
        bool,
        typer.Option(
            "--self-distill",
            help="Train on the base model's own greedy continuations of the --data prompts (heads stay "
            "faithful to the model being served).",
        ),
    ] = default(TrainConfig, "self_distill"),
    distill_new_tokens: Annotated[
        int | None,
        typer.Option(
            "--distill-new-tokens",
            help="--self-distill: greedy tokens per prompt (default: fill one window, seq_len minus the "
            "prompt's kept seq_len/2 tail). More than that packs an answer into several windows; the later "
            "ones start mid-answer, without the context the text was generated from.",
        ),
    ] = default(TrainConfig, "distill_new_tokens"),
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue from the latest checkpoint in OUT.checkpoints/ (same options required).",
        ),
    ] = default(TrainConfig, "resume"),
    checkpoint_every: Annotated[
        int,
        typer.Option(
            "--checkpoint-every",
            help="Save a resumable checkpoint every N steps into OUT.checkpoints/ (0: never). Deleted after "
            "a successful run.",
        ),
    ] = default(TrainConfig, "checkpoint_every"),
    seed: Annotated[
        int, typer.Option("--seed", help="Seed for the held-out split, batch order and initialisation.")
    ] = default(TrainConfig, "seed"),
    topk: Annotated[int, typer.Option("--topk", help="k of the reported per-head top-k accuracy.")] = default(
        TrainConfig, "topk"
    ),
    head_decay: Annotated[
        float, typer.Option("--head-decay", help="Loss weight of head h is DECAY**h.")
    ] = default(TrainConfig, "head_decay"),
    device: Annotated[
        str, typer.Option("--device", help="auto (a CUDA GPU when present, else CPU), cpu, cuda or cuda:N.")
    ] = default(TrainConfig, "device"),
    force: Annotated[bool, typer.Option("--force", help="Replace an existing OUT.")] = default(
        TrainConfig, "force"
    ),
) -> None:
    """Train Medusa-1 heads on a frozen base model; writes the HF Medusa format that `convert --medusa` reads.

    Runs on the CPU for small models and on a CUDA GPU when one is present. Prints and saves
    (OUT/metrics.json) each head's top-1 / top-k accuracy on a held-out split, next to the accuracy of
    untrained heads.
    """
    from specbuild.tuning.progress import RichReporter
    from specbuild.tuning.train import train_medusa

    config = TrainConfig(
        model=model,
        data=data,
        out=out,
        num_heads=num_heads,
        num_layers=num_layers,
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        seq_len=seq_len,
        self_distill=self_distill,
        distill_new_tokens=distill_new_tokens,
        resume=resume,
        checkpoint_every=checkpoint_every,
        seed=seed,
        topk=topk,
        head_decay=head_decay,
        device=device,
        force=force,
    )
    with RichReporter() as reporter:
        result = train_medusa(config, reporter=reporter)
    con = console()
    con.print(
        f"heads written to {result.out}"
        + (f" (resumed from step {result.resumed_from})" if result.resumed_from else "")
    )
    con.print(format_accuracy_table(result.metrics))


def format_accuracy_table(metrics: dict) -> str:
    k = metrics["topk"]
    lines = [
        f"held-out accuracy ({metrics['evaluated_on']}, {metrics['heldout_tokens']} tokens):",
        f"  head  predicts  top1    top{k}    untrained top1  untrained top{k}",
    ]
    for h in metrics["heads"]:
        lines.append(
            f"  {h['head']:<4}  {h['predicts']:<8}  {h['top1']:.3f}   {h['topk']:.3f}    "
            f"{h['untrained_top1']:.3f}           {h['untrained_topk']:.3f}"
        )
    return "\n".join(lines)


@command("tune")
def tune_cmd(
    spec: Annotated[
        Path, typer.Argument(help="Build spec (YAML), mode draft_target, medusa, ngram or eagle3."), SPEC
    ],
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            help='Prompts to profile on: .txt (one per non-empty line) or .jsonl ("text" or "prompt"). Use '
            "prompts like the traffic you will serve. Not with --profile.",
        ),
        INPUT("--prompts file"),
    ] = None,
    write: Annotated[
        bool,
        typer.Option(
            "--write",
            help="Update the spec: speculation.max_draft_len (draft/target; n-gram with "
            "ngram.max_matching_ngram_size) or medusa.choices (Medusa). A round-trip YAML edit that "
            "keeps comments, key order and layout; nothing is written unless the result is a valid spec.",
        ),
    ] = default(TuneOptions, "write"),
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", help="Greedy tokens generated per prompt while profiling.")
    ] = default(TuneOptions, "max_tokens"),
    topk: Annotated[
        int, typer.Option("--topk", help="Medusa: candidates per head considered when growing the tree.")
    ] = default(TuneOptions, "topk"),
    k_max: Annotated[
        int | None,
        typer.Option(
            "--k-max",
            help="draft/target, n-gram: largest K profiled (default: max(8, the spec's max_draft_len)).",
        ),
    ] = default(TuneOptions, "k_max"),
    budget: Annotated[
        int | None,
        typer.Option(
            "--budget",
            help="Medusa: tree nodes (default and upper bound: the spec's speculation.max_draft_len).",
        ),
    ] = default(TuneOptions, "budget"),
    n_max: Annotated[
        int | None,
        typer.Option(
            "--n-max",
            help="n-gram: largest max_matching_ngram_size profiled (default: max(4, the spec's)).",
        ),
    ] = default(TuneOptions, "n_max"),
    eval_prompts: Annotated[
        Path | None,
        typer.Option(
            "--eval-prompts",
            help="Held-out prompts: run the engine's greedy speculative loop with the chosen and current "
            "settings (draft/target: every K) and print measured tokens per pass next to the prediction.",
        ),
        INPUT("--eval-prompts file"),
    ] = default(TuneOptions, "eval_prompts"),  # noqa: B008
    engine: Annotated[
        Path | None,
        typer.Option(
            "--engine",
            help="Run this `specbuild compile` output instead of converting the spec's checkpoints.",
        ),
        INPUT("--engine folder"),
    ] = default(TuneOptions, "engine"),  # noqa: B008
    schedule: Annotated[
        bool,
        typer.Option(
            "--schedule",
            help="Also measure the cost curve (verify pass of b x (K+1) tokens, draft pass, the loop's "
            "per-round cost, per batch size of --concurrency) and choose speculation.schedule (requests in "
            "flight -> K); --write writes it with max_draft_len = its K at 1.",
        ),
    ] = default(TuneOptions, "schedule"),
    mode: Annotated[
        str,
        typer.Option(
            "--mode", help="--schedule: throughput (near ties -> smaller K) or latency (-> larger K)."
        ),
    ] = default(TuneOptions, "mode"),
    concurrency: Annotated[
        str,
        typer.Option("--concurrency", help="--schedule: batch sizes to measure, e.g. 1,2,4,8."),
    ] = "1,2,4,8",
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="--schedule: measure the cost curve through this running server (the repository that will "
            "serve: its BLS rounds at each K and concurrency) instead of the in-process reference engine.",
        ),
    ] = None,
    waves: Annotated[
        int,
        typer.Option(
            "--waves",
            help="--schedule --url: each measured run at concurrency c sends at least WAVES x c requests "
            "(the prompts cycled), as `bench --waves`.",
        ),
    ] = 1,
    plot_path: Annotated[
        Path | None,
        typer.Option("--plot", help="--schedule: save the predicted throughput per K and concurrency here."),
        OUT_FILE,
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="A speculation_profile.json measured elsewhere (ModelOpt schema 1.0, e.g. from `specbuild "
            "bench` or `tune --save-profile` on a GPU host): choose K from its acceptance instead of "
            "profiling here (draft/target).",
        ),
        INPUT("--profile file"),
    ] = None,
    cost_ratio: Annotated[
        float | None,
        typer.Option(
            "--cost-ratio",
            help="With --profile: draft pass / target pass time on the serving hardware (default: the "
            "profile's measurement_conditions.cost_ratio).",
        ),
    ] = None,
    save_profile: Annotated[
        Path | None,
        typer.Option(
            "--save-profile",
            help="Write this measurement as a ModelOpt-style speculation_profile.json (conditional and "
            "marginal acceptance per position, mean acceptance length, cost ratio).",
        ),
        OUT_FILE,
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Profile acceptance offline on the reference engine and pick K (draft/target), grow the Medusa tree,
    or pick K and the n-gram size (n-gram).

    draft/target: measures the greedy acceptance of each draft position and the draft/target pass-time
    ratio c, then picks the K that maximises the predicted speedup E(K)/(K*c+1). Medusa: measures each
    head's top-k accuracy (conditional on the path so far) and grows the tree with the largest expected
    accepted length within max_draft_len nodes (greedy by path probability). Prints predicted tokens per
    pass and speedup for the chosen and the current settings. n-gram: replays every (K, N) exactly on the
    target's greedy continuations and times verify passes of K + 1 tokens; picks the best predicted
    speedup. Runs on the CPU (timings are CPU timings: c
    and tree costs on a GPU differ).
    """
    import json

    from specbuild.tuning.progress import RichReporter
    from specbuild.tuning.tune import tune_spec

    if url is not None:
        from specbuild.core.addresses import grpc_address

        grpc_address(url, option="--url")  # now, not after the profiling

    options = TuneOptions(
        prompts=prompts,
        max_tokens=max_tokens,
        topk=topk,
        k_max=k_max,
        budget=budget,
        n_max=n_max,
        eval_prompts=eval_prompts,
        engine=engine,
        write=write,
        schedule=schedule,
        mode=mode,
        concurrency=tuple(parse_csv_numbers(concurrency, int, "--concurrency")),
        plot=plot_path,
        profile=profile,
        cost_ratio=cost_ratio,
        save_profile=save_profile,
    )
    schedule_fn = None
    if url is not None:
        from specbuild.bench.serve_curve import measure_served, predict_served
        from specbuild.tuning.data import read_texts

        def schedule_fn(spec_obj, report):
            from specbuild.tuning.tune import round_tokens

            acceptance, tokens = round_tokens(report)
            ks = sorted(tokens) if tokens else range(1, len(acceptance) + 1)
            # the served engines were built with the spec's max_draft_len: a larger K is refused
            ks = [k for k in ks if k <= spec_obj.speculation.max_draft_len]
            curve = measure_served(
                url,
                read_texts(prompts),
                ks=list(ks),
                concurrency=[c for c in options.concurrency if c <= spec_obj.build.max_batch_size],
                max_tokens=max_tokens,
                waves=waves,
            )
            return predict_served(curve, acceptance, mode=mode, tokens=tokens)

    with RichReporter() as reporter:
        report = tune_spec(spec, options, reporter=reporter, schedule_fn=schedule_fn)
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
        return
    console().print(format_tune_report(report), markup=False)


def format_schedule(sched: dict) -> list[str]:
    curve = sched["curve"]
    if curve.get("kind") == "served":
        return _format_served(sched)
    lines = [
        f"cost curve (reference engine; mode {sched['mode']}): per batch size b, ms of a verify pass at "
        "K=0..max, a draft pass, the loop per round, a plain step",
    ]
    for b in curve["batch_sizes"]:
        verify = " ".join(f"{t * 1e3:.2f}" for t in curve["verify_s"][b])
        lines.append(
            f"  b={b:<3} verify [{verify}]  draft {curve['draft_s'][b] * 1e3:.2f}  loop "
            f"{curve['loop_s'][b] * 1e3:.2f}  plain {curve['plain_step_s'][b] * 1e3:.2f}"
        )
        if curve.get("loop_round_s", {}).get(b):  # the loop on the tune prompts: what predicts
            rounds = " ".join(f"{t * 1e3:.2f}" for t in curve["loop_round_s"][b])
            firsts = " ".join(f"{t * 1e3:.1f}" for t in curve["first_s"][b])
            lines.append(f"        round (tune prompts) [{rounds}]  first tokens [{firsts}]")
    lines.append("  b    K   tokens/round  round ms  predicted tokens/s   (baseline tokens/s)")
    for r in sched["table"]:
        mark = " <" if sched["chosen"][r["batch"]] == r["k"] else ""
        lines.append(
            f"  {r['batch']:<4} {r['k']:<3} {r['tokens_per_round']:<13.3f} {r['round_ms']:<9.2f} "
            f"{r['tokens_per_s']:<20.1f} ({sched['baseline'][r['batch']]:.1f}){mark}"
        )
    lines.append(f"schedule: {sched['schedule']}" if sched["schedule"] else "schedule: none")
    lines += [f"note: {n}" for n in sched["notes"]]
    if sched.get("plot"):
        lines.append(f"plot: {sched['plot']}")
    return lines


def _format_served(sched: dict) -> list[str]:
    lines = [
        f"cost curve through {sched['curve']['url']} (mode {sched['mode']}; "
        f"{sched['curve'].get('repeats', 1)} interleaved repeats, medians): per concurrency c and K, the "
        "measured round time and the predicted (range over repeats) / measured tokens/s",
        "  c    K   tokens/round  round ms  predicted tokens/s (range)    measured",
    ]
    for r in sched["table"]:
        mark = " <" if sched["chosen"][r["batch"]] == r["k"] else ""
        measured = r.get("measured_tokens_per_s", r["tokens_per_s"])
        p = r.get("predicted") or {"min": r["tokens_per_s"], "max": r["tokens_per_s"]}
        cell = f"{r['tokens_per_s']:.1f} ({p['min']:.1f}-{p['max']:.1f})"
        lines.append(
            f"  {r['batch']:<4} {r['k']:<3} {r['tokens_per_round']:<13.3f} {r['round_ms']:<9.2f} "
            f"{cell:<29} {measured:.1f}{mark}"
        )
    lines += [f"  c={d['concurrency']}: {d['reason']}" for d in sched.get("decisions", [])]
    if "seconds" in sched["curve"]:
        lines.append(f"served cost curve measured in {sched['curve']['seconds']:.0f} s")
    lines.append(f"schedule: {sched['schedule']}" if sched["schedule"] else "schedule: none")
    lines += [f"note: {n}" for n in sched["notes"]]
    if sched.get("plot"):
        lines.append(f"plot: {sched['plot']}")
    return lines


def written_lines(report) -> list[str]:
    """What `--write` left in the spec, in words."""
    lines = [f"spec updated ({report.written})"]
    if report.details.get("speculation_off"):
        lines.append(
            "speculation off: wrote speculation.schedule: {1: 0} (no K > 0 beat the target alone at the "
            "smallest load): the engine flow's BLS drafts 0 at every load, the LLM-API options have no "
            "speculative_config"
        )
    return lines


def format_ngram_report(report) -> str:
    d = report.details
    lines = [
        f"n-gram flags: {d['flags']}; {d['profiled_tokens']} greedy tokens replayed",
        "verify pass cost / plain pass (this host), j drafts: "
        + ", ".join(f"{j}:{c:.2f}" for j, c in enumerate(d["verify_cost"])),
        "  K   N   tokens/pass  hit rate  predicted speedup",
    ]
    lines += [
        f"  {r['k']:<3} {r['n']:<3} {r['tokens_per_pass']:<12.3f} {r['hit_rate']:<9.2f} {r['speedup']:.3f}"
        for r in d["table"]
    ]
    for s, prof in ((report.chosen, d["chosen_profile"]), (report.current, d["current_profile"])):
        k, n = s.value["speculation.max_draft_len"], s.value["ngram.max_matching_ngram_size"]
        acc = ", ".join(f"{a:.3f}" for a in prof["acceptance_per_position"])
        lines.append(
            f"{s.label:<8} K={k} N={n}: predicted {s.tokens_per_pass:.3f} tokens/pass, speedup "
            f"{s.speedup:.3f}; hit rate {prof['hit_rate']:.2f}, acceptance {prof['acceptance_rate']:.3f}, "
            f"per position: {acc}"
        )
    m = d.get("measured")
    if m:
        lines.append("measured on held-out prompts (reference engine, greedy):")
        lines += [
            f"  {label:<8} K={r['k']} N={r['n']}: {r['tokens_per_pass']:.3f} tokens/pass, "
            f"{r['seconds']:.2f} s"
            for label, r in m.items()
        ]
    if d.get("schedule"):
        lines += format_schedule(d["schedule"])
    if report.written:
        lines += written_lines(report)
    return "\n".join(lines)


def format_tune_report(report) -> str:
    from specbuild.core.methods import Tunable

    tunes = Tunable[report.tunes.upper()]  # TuneReport.tunes: the Tunable's name, lower case
    if tunes is Tunable.NGRAM:
        return format_ngram_report(report)
    d = report.details
    lines = []
    tree = tunes is Tunable.TREE  # else K
    if not tree:
        acc = ", ".join(f"{a:.3f}" for a in d["acceptance_per_position"])
        timing = (
            f"({d['draft_pass_ms']:.2f} ms / {d['target_pass_ms']:.2f} ms)"
            if "draft_pass_ms" in d
            else f"(from {d.get('cost_ratio_source', 'the profile')})"
        )
        lines += [
            f"acceptance per draft position (greedy, conditional): {acc}"
            + (f"  [from the profile {d['profile']}]" if "profile" in d else ""),
            f"cost ratio c = draft pass / target pass = {d['cost_ratio']:.3f} {timing}",
            "  K   tokens/pass  predicted speedup",
        ]
        lines += [f"  {r['k']:<3} {r['tokens_per_pass']:<12.3f} {r['speedup']:.3f}" for r in d["table"]]
    else:
        lines.append(f"profiled positions: {d['profiled_positions']}")
        for depth, probs in enumerate(d["depth_probs"]):
            cum = sum(probs)
            lines.append(
                f"  head {depth}: top1 {probs[0]:.3f}  top{len(probs)} {cum:.3f} (conditional on the path so "
                "far)"
            )
    if tree:
        lines.append("predicted = exact greedy replay of each tree on the profiled positions")
    for s in (report.chosen, report.current):
        what = f"{s.size}-node tree" if tree else f"K={s.value}"
        lines.append(
            f"{s.label:<8} {what}: predicted {s.tokens_per_pass:.3f} tokens/pass, speedup {s.speedup:.3f}"
        )
    if tree:
        fp = d["factorised_tokens_per_pass"]
        lines.append(
            f"independent-heads model: chosen {fp['chosen']:.3f}, current {fp['current']:.3f} tokens/pass"
        )
        lines.append(
            f"tree pass cost / plain pass: chosen {d['tree_pass_cost']['chosen']:.2f}, current "
            f"{d['tree_pass_cost']['current']:.2f}"
        )
        lines.append(f"chosen tree: {report.chosen.value}")
    m = d.get("measured")
    if m and tree:
        lines.append(
            f"measured on held-out prompts (reference engine, greedy): chosen {m['chosen']:.3f}, current "
            f"{m['current']:.3f} tokens/pass"
        )
    elif m:
        lines.append(
            "measured on held-out prompts (reference engine, greedy):  K  tokens/pass  speedup(measured E, "
            "c)  seconds"
        )
        lines += [
            f"  {r['k']:<3} {r['tokens_per_pass']:<12.3f} {r['speedup_from_measured']:<24.3f} "
            f"{r['seconds']:.2f}"
            for r in m["sweep"]
        ]
        lines.append(f"best measured K: {m['best_k']}")
    if d.get("schedule"):
        lines += format_schedule(d["schedule"])
    if d.get("profile_written"):
        lines.append(f"wrote the speculation profile {d['profile_written']}")
    if report.written:
        lines += written_lines(report)
    return "\n".join(lines)
