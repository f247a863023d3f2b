"""`specbuild tune`: measure acceptance offline on the reference engine, then pick K or grow the tree.

draft/target: greedy runs at K = k_max give the acceptance of each draft position (conditional on the
earlier ones); timed single-token passes give c; K maximises E(K) / (K*c + 1) (predict.py).
Medusa: greedy continuations give, at every position, the rank of the true token in each head's
top-k; from them the per-depth accuracies (conditional on the path so far) and a tree grown greedily
by path probability up to the node budget (max_draft_len); the path probability is the measured joint
one (heads are correlated), with the factorised one as a small prior for unseen paths. The predicted
tokens per pass of a tree is its exact greedy replay on the profiled positions. Tree speedup = tokens per
pass divided by
the measured time of a tree pass relative to a plain decode pass.

The spec's HF checkpoints are converted (float32, tp 1) into a temporary folder and run by the
reference engine, unless --engine points at a `specbuild compile` output.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from specbuild.builder.resolve import resolve_model
from specbuild.core.errors import TrainingError
from specbuild.core.formats.medusa_choices import MedusaChoices
from specbuild.core.formats.safe_io import check_writable, guard_output
from specbuild.core.formats.speculation_profile import (
    SpeculationProfile,
    build_profile,
    read_speculation_profile,
)
from specbuild.core.formats.speculation_profile import write_profile as save_profile
from specbuild.core.methods import Tunable, method_of, resolve_name
from specbuild.core.perf.schedule import OFF
from specbuild.core.perf.theory import speedup, tokens_per_pass_chain
from specbuild.core.spec import load_spec
from specbuild.engines.reference.engine import ReferenceEngine
from specbuild.engines.reference.loader import load_weights
from specbuild.engines.reference.model import LlamaModel
from specbuild.engines.trtllm.convert import convert_checkpoint
from specbuild.engines.trtllm.medusa import MedusaHeadsSource
from specbuild.tuning.cost_curve import measure_curve, plot, predict
from specbuild.tuning.data import read_texts
from specbuild.tuning.predict import (
    accepted_lengths,
    choose_k,
    choose_k_from_profile,
    conditional_depth_probs,
    grow_tree_from_ranks,
    k_table,
    tree_tokens_per_pass,
)
from specbuild.tuning.profile_engine import (
    ReferenceMedusa,
    decode_pass,
    measure_tree,
    pass_times_shown,
    profile_chain,
    sweep_k,
    tree_pass,
)
from specbuild.tuning.profile_medusa import medusa_ranks
from specbuild.tuning.progress import Reporter
from specbuild.tuning.spec_edit import edit_spec
from specbuild.tuning.tune_ngram import measure as measure_ngram
from specbuild.tuning.tune_options import TuneOptions
from specbuild.tuning.tune_report import Setting, TuneReport


def tune_spec(
    spec_path: Path, options: TuneOptions, *, reporter: Reporter | None = None, schedule_fn=None
) -> TuneReport:
    """`schedule_fn(spec, report) -> prediction dict`: measures the cost curve elsewhere (the CLI's
    `--url`: through the server, bench/serve_curve.py); None: on this reference engine."""
    rep = reporter or Reporter()
    spec = load_spec(spec_path)
    options.validate(spec)
    if options.write:
        check_writable(spec_path, option="the spec")  # before minutes of profiling, not after
    if options.save_profile is not None:
        inputs = {
            "build spec": spec_path,
            "--prompts file": options.prompts,
            "--eval-prompts file": options.eval_prompts,
            "--profile file": options.profile,
        }
        guard_output(options.save_profile, inputs, option="--save-profile")  # never replace an input
        Path(options.save_profile).parent.mkdir(parents=True, exist_ok=True)
        check_writable(options.save_profile, option="--save-profile")
    if options.profile is not None:
        report = tune_from_profile(spec, read_speculation_profile(options.profile), options)
        return _finish(spec_path, report, options)
    texts = read_texts(options.prompts)
    with open_engine(spec, options.engine, rep) as engine:
        prompts = [engine.tokenizer(t, add_special_tokens=True)["input_ids"] for t in texts]
        report = resolve_name(method_of(spec).tuner)(spec, engine, prompts, options, rep)
        if options.eval_prompts is not None:
            held = [
                engine.tokenizer(t, add_special_tokens=True)["input_ids"]
                for t in read_texts(options.eval_prompts)
            ]
            report = _measure(report, engine, held, options, rep)
        if options.schedule:
            report = _schedule(spec, report, engine, prompts, options, rep, schedule_fn)
    return _finish(spec_path, report, options)


def _finish(spec_path: Path, report: TuneReport, options: TuneOptions) -> TuneReport:
    """--save-profile, then --write."""
    if options.save_profile is not None:
        profile = report.details.get("speculation_profile")
        if profile is not None:
            save_profile(profile, options.save_profile)
            report = replace(report, details={**report.details, "profile_written": str(options.save_profile)})
    if options.write:
        report = _write(
            spec_path,
            report,
            inputs={
                "--prompts file": options.prompts,
                "--eval-prompts file": options.eval_prompts,
                "--engine folder": options.engine,
                "--profile file": options.profile,
            },
        )
    return report


def tune_from_profile(spec, profile: SpeculationProfile, options: TuneOptions) -> TuneReport:
    """K from a speculation profile measured elsewhere (no engine runs): its per-position conditional
    acceptance and a cost ratio (--cost-ratio, else the profile's measurement_conditions.cost_ratio)."""
    method = method_of(spec)
    if profile.method and profile.method.lower() != method.ecosystem_name.lower():
        raise TrainingError(
            "the speculation profile describes another method",
            expected=f"method {method.ecosystem_name!r} (the spec's mode {spec.mode})",
            found=f"method {profile.method!r} in {profile.path}",
            fix="use a profile measured with this spec's draft, or measure here (`specbuild tune --prompts`)",
        )
    c = options.cost_ratio if options.cost_ratio is not None else profile.cost_ratio
    if c is None:
        raise TrainingError(
            "the speculation profile has no cost ratio",
            expected="measurement_conditions.cost_ratio in the profile, or --cost-ratio",
            found=f"{profile.path}: acceptance only (ModelOpt's profiles measure no cost)",
            fix="pass --cost-ratio C (draft pass / target pass on the serving GPU; `bench` reports it)",
        )
    # rates past the measured K would be extrapolated from the last one: never choose beyond it
    k_max = min(options.k_max or profile.num_speculative_tokens, profile.num_speculative_tokens)
    k_max = min(k_max, profile.max_supported_k)
    acceptance = profile.acceptance
    best = choose_k_from_profile(profile, c, options.k_max)
    current_k = spec.speculation.max_draft_len
    e_cur = tokens_per_pass_chain(acceptance, current_k)
    return TuneReport(
        mode=spec.mode.value,
        tunes=Tunable.DRAFT_LEN.name.lower(),
        chosen=Setting("chosen", best.k, best.tokens_per_pass, best.speedup, best.k),
        current=Setting("current", current_k, e_cur, speedup(e_cur, current_k, c), current_k),
        details={
            "acceptance_per_position": acceptance,
            "cost_ratio": c,
            "cost_ratio_source": "--cost-ratio" if options.cost_ratio is not None else "the profile",
            "profile": profile.path,
            "profile_k": profile.num_speculative_tokens,
            "table": [
                {"k": r.k, "tokens_per_pass": r.tokens_per_pass, "speedup": r.speedup}
                for r in k_table(acceptance, c, k_max)
            ],
        },
    )


def _bar(rep: Reporter):
    """convert_checkpoint's progress (bytes done, bytes total, tensor) as the reporter's "convert" bar in MB:
    a model's conversion takes seconds to a minute here, and a silent minute reads as a hang."""
    shown = [-1]

    def on_progress(done: int, total: int, _tensor: str) -> None:
        if shown[0] < 0:
            rep.start("convert", max(total // 1_000_000, 1))
            shown[0] = 0
        mb = done // 1_000_000
        if mb > shown[0]:
            rep.advance("convert", mb - shown[0])
            shown[0] = mb

    return on_progress


@contextlib.contextmanager
def open_engine(spec, engine_dir: Path | None, rep: Reporter, *, device: str = "cpu") -> Iterator[Any]:
    """A ReferenceEngine over the spec's models (converted into a temporary folder) or `engine_dir`."""
    if engine_dir is not None:
        yield ReferenceEngine.load(engine_dir, device=device)
        return

    target_hf = resolve_model(spec.target.model, base=spec.base_dir, what="target model")
    with tempfile.TemporaryDirectory(prefix="specbuild-tune-") as tmp:
        medusa, method = None, method_of(spec)
        if (section := method.heads_of(spec)) is not None:
            heads = resolve_model(section.heads, base=spec.base_dir, what="Medusa heads")
            medusa = MedusaHeadsSource(heads, num_heads=section.num_heads, num_layers=section.num_layers)
        rep.log("converting the spec's checkpoints for the reference engine (float32)")
        target_ckpt = convert_checkpoint(
            target_hf, Path(tmp) / "target", dtype="float32", medusa=medusa, on_progress=_bar(rep)
        )
        rep.stop("convert")
        target = LlamaModel(load_weights(target_ckpt), device=device)
        draft = None
        if (section := method.draft_engine(spec)) is not None:
            draft_hf = resolve_model(section.model, base=spec.base_dir, what="draft model")
            draft_ckpt = convert_checkpoint(
                draft_hf, Path(tmp) / "draft", dtype="float32", on_progress=_bar(rep)
            )
            rep.stop("convert")
            draft = LlamaModel(load_weights(draft_ckpt), device=device)
        head = None
        if (ref := method.one_model_draft(spec)) is not None:  # EAGLE-3's layers read the target's states
            head = resolve_model(ref, base=spec.base_dir, what=f"{method.section} model")
        yield ReferenceEngine(
            target,
            draft=draft,
            draft_head=head,
            method=spec.mode,
            medusa_choices=spec.medusa_tree(),
            tokenizer_dir=target_hf,
            max_draft_len=spec.speculation.max_draft_len,
            method_options=method_of(spec).options_of(spec),
        )


def tune_draft_len(spec, engine, prompts, options: TuneOptions, rep: Reporter) -> TuneReport:
    """K of a method that drafts per round: the K in 1..k_max with the best predicted speedup."""
    current_k = spec.speculation.max_draft_len
    k_max = options.k_max or max(8, current_k)
    prof = profile_chain(engine, prompts, k_max=k_max, max_tokens=options.max_tokens, reporter=rep)
    best = choose_k(prof.acceptance, prof.cost_ratio, k_max)
    e_cur = tokens_per_pass_chain(prof.acceptance, current_k)
    profile = build_profile(
        prof.requests,
        num_speculative_tokens=k_max,
        method=method_of(spec).ecosystem_name,
        conditional=prof.acceptance,
        target_model=spec.target.model,
        draft_checkpoint=method_of(spec).speculative_model(spec),
        measurement_conditions={
            "engine": "specbuild reference engine (CPU, float32), greedy",
            "dataset": options.prompts.name if options.prompts else None,
            "concurrency": 1,
            "temperature": 0.0,
            "max_tokens": options.max_tokens,
            "cost_ratio": prof.cost_ratio,
            "target_pass_ms": prof.target_pass_s * 1e3,
            "draft_pass_ms": prof.draft_pass_s * 1e3,
        },
    )
    return TuneReport(
        mode=spec.mode.value,
        tunes=Tunable.DRAFT_LEN.name.lower(),
        chosen=Setting("chosen", best.k, best.tokens_per_pass, best.speedup, best.k),
        current=Setting("current", current_k, e_cur, speedup(e_cur, current_k, prof.cost_ratio), current_k),
        details={
            "acceptance_per_position": prof.acceptance,
            "cost_ratio": prof.cost_ratio,
            "target_pass_ms": prof.target_pass_s * 1e3,
            "draft_pass_ms": prof.draft_pass_s * 1e3,
            "profiled_steps": len(prof.stats.accepted_per_step),
            "table": [
                {"k": r.k, "tokens_per_pass": r.tokens_per_pass, "speedup": r.speedup}
                for r in k_table(prof.acceptance, prof.cost_ratio, k_max)
            ],
            "speculation_profile": profile,
        },
    )


def tune_tree(spec, engine, prompts, options: TuneOptions, rep: Reporter) -> TuneReport:
    """A Medusa tree grown from the heads' measured accuracies within max_draft_len nodes."""
    num_heads = method_of(spec).heads_of(spec).num_heads
    ranks = medusa_ranks(
        ReferenceMedusa(engine), prompts, max_new_tokens=options.max_tokens, topk=options.topk, reporter=rep
    )
    if not ranks:
        raise TrainingError(
            "no position to profile",
            expected=f"greedy continuations longer than {num_heads + 1} tokens",
            found=f"{len(prompts)} prompts, max_tokens {options.max_tokens}",
            fix="raise --max-tokens or add prompts",
        )
    probs = conditional_depth_probs(ranks, topk=options.topk)
    budget = options.budget or spec.speculation.max_draft_len
    tree = grow_tree_from_ranks(
        ranks,
        topk=options.topk,
        budget=min(budget, spec.speculation.max_draft_len),
        num_heads=num_heads,
    )
    current = spec.medusa_choices()
    rep.log("timing a plain pass and the chosen and current trees' passes")
    cost = pass_times_shown(
        {
            "plain": decode_pass(engine.target, prompts[0]),
            "chosen": tree_pass(engine, tree, prompts[0]),
            "current": tree_pass(engine, current, prompts[0]),
        },
        rep,
    )
    ratio = {name: cost[name] / cost["plain"] for name in ("chosen", "current")}

    def setting(label, choices):
        lengths = accepted_lengths(choices, ranks)  # exact greedy replay on the profiled positions
        e = sum(lengths) / len(lengths)
        return Setting(label, choices.to_lists(), e, e / ratio[label], choices.size)

    chosen, cur = setting("chosen", tree), setting("current", current)
    factorised = {
        "chosen": tree_tokens_per_pass(tree, probs),
        "current": tree_tokens_per_pass(current, probs),
    }
    return TuneReport(
        mode=spec.mode.value,
        tunes=Tunable.TREE.name.lower(),
        chosen=chosen,
        current=cur,
        details={
            "depth_probs": probs,
            "profiled_positions": len(ranks),
            "factorised_tokens_per_pass": factorised,  # the independent-heads model of the Medusa authors
            "tree_pass_cost": ratio,  # tree pass time / plain decode pass time
        },
    )


def _measure(report: TuneReport, engine, prompts, options: TuneOptions, rep: Reporter) -> TuneReport:
    """Predicted vs measured on held-out prompts: the engine's own greedy loops, tokens per pass."""

    rep.log(f"measuring on {len(prompts)} held-out prompts")
    if report.tunes == Tunable.NGRAM.name.lower():
        measured = measure_ngram(report, engine, prompts, options)
    elif report.tunes == Tunable.TREE.name.lower():
        measured = {
            s.label: measure_tree(
                engine, MedusaChoices.parse(s.value), prompts, max_tokens=options.max_tokens
            ).mean_accepted_per_step
            for s in (report.chosen, report.current)
        }
    else:
        c = report.details["cost_ratio"]
        ks = sorted({r["k"] for r in report.details["table"]} | {report.current.value})
        rows = sweep_k(engine, prompts, ks, max_tokens=options.max_tokens)
        measured = {
            "sweep": [
                {
                    "k": r.k,
                    "tokens_per_pass": r.tokens_per_pass,
                    "speedup_from_measured": speedup(r.tokens_per_pass, r.k, c),
                    "seconds": r.seconds,
                }
                for r in rows
            ]
        }
        best = max(measured["sweep"], key=lambda r: r["speedup_from_measured"])
        measured["best_k"] = best["k"]
    return replace(report, details={**report.details, "measured": measured})


def _schedule(
    spec, report: TuneReport, engine, prompts, options: TuneOptions, rep: Reporter, schedule_fn=None
) -> TuneReport:
    """The cost curve on this engine and the schedule it implies (tuning/cost_curve.py)."""
    if schedule_fn is not None:
        rep.log("measuring the cost curve through the server")
        prediction = schedule_fn(spec, report)
        details = {**report.details, "schedule": prediction}
        if options.plot is not None:
            details["schedule"]["plot"] = str(plot(prediction, options.plot))
        return replace(report, details=details)
    tree = report.tunes == Tunable.TREE.name.lower()
    acceptance, tokens = round_tokens(report)
    max_k = spec.speculation.max_draft_len if tree else min(max(tokens) if tokens else len(acceptance), 8)
    sizes = sorted({c for c in options.concurrency if c <= spec.build.max_batch_size} | {1})
    rep.log(f"measuring the cost curve: batch sizes {sizes}, K 0..{max_k}")
    curve = measure_curve(engine, prompts, sizes, max_k, max_tokens=options.max_tokens)
    prediction = predict(
        curve,
        acceptance,
        tokens=tokens,
        mode=options.mode,
        tree_tokens_per_round=report.chosen.tokens_per_pass if tree else None,
        max_batch_size=spec.build.max_batch_size,
        max_tokens=options.max_tokens,
    )
    details = {**report.details, "schedule": prediction.to_dict()}
    if options.plot is not None:
        details["schedule"]["plot"] = str(plot(details["schedule"], options.plot))
    return replace(report, details=details)


def round_tokens(report: TuneReport) -> tuple[list[float], dict[int, float] | None]:
    """What a round yields per K for the schedule: (acceptance per draft position, None) when E(K) is the
    chain over it (draft/target), or ([], {K: E(K)}) from the tuner's exact replay (n-gram, at its
    chosen N); a tree's E is its chosen setting's."""
    d = report.details
    if report.tunes == Tunable.NGRAM.name.lower():
        n = report.chosen.value["ngram.max_matching_ngram_size"]
        return [], {r["k"]: r["tokens_per_pass"] for r in d["table"] if r["n"] == n}
    return list(d.get("acceptance_per_position", [])), None


def speculation_pays(sched: dict[str, Any] | None) -> bool:
    """False when the in-process cost curve chose K=0 at the smallest batch size: no K > 0 beats the target
    alone even with one request in flight, whatever serves it (the draft's acceptance and the loop's
    cost, measured on the reference engine). A served curve (`--url`) that finds the same speaks for that
    engine-flow repository only (its BLS round trips): it says `repo --schedule 1:0`, the spec keeps
    speculating for the flows that speculate inside the engine (docs/schedule.md)."""
    if not sched or not sched.get("chosen") or sched.get("curve", {}).get("kind") == "served":
        return True
    chosen = {int(n): k for n, k in sched["chosen"].items()}
    return chosen[min(chosen)] != 0


def _write(spec_path: Path, report: TuneReport, *, inputs: dict[str, Any]) -> TuneReport:
    """The chosen setting (and a measured schedule) into the spec, in one write (spec_edit.py)."""
    tunable = Tunable[report.tunes.upper()]
    edits = list(tunable.assignments(report.chosen.value))
    sched = report.details.get("schedule")
    if not speculation_pays(sched):
        # the measurement says off: the spec's OFF schedule ({1: 0}) serves the target alone on every
        # flow (the BLS drafts 0; the LLM-API options leave speculative_config out), never a spec that
        # speculates against the printed conclusion
        edits.append(("speculation", "schedule", dict(OFF)))
        report = replace(report, details={**report.details, "speculation_off": True})
    elif sched is not None and sched["schedule"] is not None:
        schedule = {int(n): k for n, k in sched["schedule"].items()}
        if tunable is not Tunable.TREE:  # K at 1 request in flight is the schedule's first K
            edits = [e for e in edits if e[:2] != ("speculation", "max_draft_len")]
            edits.append(("speculation", "max_draft_len", schedule[1]))
        edits.append(("speculation", "schedule", schedule))
    edit_spec(spec_path, edits, inputs=inputs)
    return replace(report, written="kept comments")
