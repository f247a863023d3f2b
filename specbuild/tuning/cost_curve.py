"""`tune --schedule`: the cost curve of the engine that serves, and the load-aware schedule it implies.

Measured on the reference engine (the engine the local Triton serves), for each batch size b of
`--concurrency` (up to build.max_batch_size) and each K in 0..max_draft_len:

* the pass costs (what a round is made of, shown by `tune` and the plot): t_verify(b, K), one target
  pass over b rows of K+1 new tokens; t_draft(b), one draft pass over b rows of one token; t_prefill(b),
  one pass over b prompts;
* the loop as it runs (what the prediction uses): the tune prompts in real lockstep batches of b at
  each K (and the plain batch loop, the baseline), timed per batch from its start to its first tokens
  (`first_s`: the prefill of those prompts at their real lengths and the first round) and from there
  to its end over its later rounds (`loop_round_s`: the draft passes per position, the first one
  feeding the accepted tokens; the verify pass at the rows' real lengths; the loop's own work; rows
  that finished early still riding in the pass), with each prompt's rounds at each K (`rounds`: the
  acceptance as it is, the last round drafting less included); `loop_s(b)` is what is left of a round
  at K = max_draft_len once the passes above are taken out (the loop's own cost, for the table).

Prediction for requests of N tokens (tune's --max-tokens) in lockstep batches of b
(core/perf/concurrency.lockstep_s): a batch lasts first_s(b, K) + (E[max over its b rows of R] - 1) x
loop_round_s(b, K), R drawn from the tune prompts' rounds at K; throughput = b x mean tokens / that.
Baseline: the same with the plain loop (one step per token). Medusa (a fixed tree; the engine runs
tree requests one after another): mean tokens / (first_s + (mean R - 1) x round) whatever b, against
the plain batch. Without the loop timings (a steady state, or a curve built by hand) the round is
T(b, K) = K t_draft(b) + t_verify(b, K) + loop_s(b) yielding E(K) tokens per row
(core/perf/theory.tokens_per_pass_chain over the per-position acceptance, or the n-gram replay's E(K)).
Calibrated on the tune prompts only: `make bench-load` reports measured / predicted on held-out ones.

The schedule, from a measured curve (the loop timed in interleaved repeats): core/perf/schedule_choice's rule
over the rates predicted from each repeat's timings: K at the smallest b is max_draft_len unless a
smaller K predicts more in EVERY repeat and by more than TIE in the median; at each larger b it is 0
unless a K > 0, no larger than the K before, beats K=0 that way (never on a difference inside the spread;
both modes: in a closed loop they rank K alike). From a hand-built curve (one value per point): for each
b the K with the best predicted throughput, near ties (within TIE) broken by the mode: `throughput` takes
the smaller K (less compute for the same tokens), `latency` the larger (faster requests when the load
drops between rounds). Where K changes between two measured sizes the threshold is their midpoint,
rounded up. The schedule's K at 1 becomes max_draft_len (TensorRT-LLM requires it); when no K > 0 beats
K=0 at b = 1 there is no schedule to write.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from specbuild.core.errors import TrainingError
from specbuild.core.perf.concurrency import lockstep_s
from specbuild.core.perf.schedule import DraftSchedule, schedule_steps
from specbuild.core.perf.schedule_choice import choose, round_order, spread
from specbuild.core.perf.theory import tokens_per_pass_chain
from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.cached_decode import SequenceBatch
from specbuild.tuning.profile_engine import TIMING_REPEATS, draft_pass

SERVED_TORCH_THREADS = "1"  # = the local engine models' DEFAULT_TORCH_THREADS
TIE = 0.03  # predicted throughputs within 3% count as a tie (the spread of interleaved CPU timings)
CALIBRATION_REPEATS = 2  # interleaved repeats of the loop timings on the tune prompts (median taken)
CALIBRATION_PROMPTS = 8  # tune prompts the loop timings run (the first ones): bounds tune's time


@dataclass(frozen=True)
class CostCurve:
    batch_sizes: list[int]
    max_k: int
    verify_s: dict[int, list[float]]  # b -> [K=0..max_k] seconds of one verify pass
    draft_s: dict[int, float]  # b -> seconds of one draft pass (0: nothing drafts with a model)
    loop_s: dict[int, float]  # b -> the speculative loop's own seconds per round (what passes leave)
    plain_step_s: dict[int, float]  # b -> seconds per later step of the plain batch loop (the baseline)
    tree_round_s: float | None = None  # Medusa: seconds per later tree round of one request
    prefill_s: dict[int, float] = field(
        default_factory=dict
    )  # b -> one pass over b prompts (the profiled one)
    # the loop on the tune prompts (empty on a hand-built curve: the pass sum above is used)
    loop_round_s: dict[int, list[float]] = field(default_factory=dict)  # b -> [K] s per later round
    first_s: dict[int, list[float]] = field(default_factory=dict)  # b -> [K] s to a batch's first tokens
    plain_first_s: dict[int, float] = field(default_factory=dict)  # b -> the same, plain loop
    rounds: dict[int, list[int]] = field(default_factory=dict)  # K -> rounds of each tune prompt
    tokens: list[int] = field(default_factory=list)  # tokens each tune prompt generated (plain loop)
    # the same loop timings per interleaved repeat (the choice rule compares K repeat by repeat)
    loop_round_reps: dict[int, list[list[float]]] = field(default_factory=dict)  # b -> [K] -> [repeat]
    first_reps: dict[int, list[list[float]]] = field(default_factory=dict)  # b -> [K] -> [repeat]

    def round_s(self, b: int, k: int) -> float:
        """Seconds of one (later) round at batch size b and K: measured on the tune prompts when the
        curve has it, else draft passes + verify + loop."""
        if b in self.loop_round_s:
            return self.loop_round_s[b][k]
        return k * self.draft_s[b] + self.verify_s[b][k] + self.loop_s[b]


@dataclass(frozen=True)
class SchedulePrediction:
    mode: str  # throughput | latency
    acceptance: list[float]
    curve: CostCurve
    table: list[dict[str, Any]]  # one row per (b, K): tokens_per_round, round_ms, tokens_per_s
    baseline: dict[int, float]  # b -> predicted tokens/s of the plain batch loop
    chosen: dict[int, int]  # b -> K
    schedule: DraftSchedule | None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["schedule"] = self.schedule.to_dict() if self.schedule else None
        return d


def _median_time(run, repeats: int = TIMING_REPEATS) -> float:
    times = []
    for i in range(repeats + 2):
        start = time.perf_counter()
        run()
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _pass(model, b: int, prompt: list[int], n_new: int):
    """A callable running one batched pass of b rows, each feeding n_new tokens after `prompt` (cached)."""
    batch = SequenceBatch(model, b, capacity=len(prompt) + n_new + 8)
    rows = list(range(b))
    batch.feed(rows, [list(prompt)] * b, [1] * b)
    ids = list(prompt) + [int(prompt[-1])] * n_new

    def run():
        with torch.inference_mode():
            batch.feed(rows, [ids] * b, [n_new] * b)

    return run


def _prefill(model, b: int, prompt: list[int]):
    """A callable running the prefill of b copies of `prompt` in one pass (a fresh cache each time)."""

    def run():
        batch = SequenceBatch(model, b, capacity=len(prompt) + 2)
        with torch.inference_mode():
            batch.feed(list(range(b)), [list(prompt)] * b, [1] * b)

    return run


@dataclass(frozen=True)
class LoopTiming:
    """Prompts through the real loop in lockstep batches of b at one K (plain: the baseline loop)."""

    batch: int
    first_s: float  # mean seconds from a batch's start to its first tokens
    round_s: float  # seconds per later round (sum over batches / sum of their later rounds)
    rounds: list[int]  # rounds of each prompt (plain: its tokens)
    tokens: list[int]  # tokens of each prompt
    seconds: float  # the whole run

    @property
    def tokens_per_s(self) -> float:
        return sum(self.tokens) / self.seconds

    def predicted_tokens_per_s(self, batch: int, requests: int) -> float:
        """Requests like these prompts (rounds drawn from theirs) in lockstep batches of `batch`."""
        seconds = lockstep_s(
            self.rounds, batch=batch, requests=requests, first_s=self.first_s, round_s=self.round_s
        )
        return requests * statistics.fmean(self.tokens) / seconds


def time_loop(
    engine,
    prompts: list[list[int]],
    b: int,
    k: int | None,
    max_tokens: int,
    *,
    speculative: bool | None = None,
) -> LoopTiming:
    """`prompts` through engine.generate_batch in batches of b (greedy, max_tokens each) at fixed K = k,
    the plain loop (k None), or the engine's schedule (k None, speculative True)."""
    speculative = k is not None if speculative is None else speculative
    params = SamplingParams(max_tokens=max_tokens)
    firsts, later_s, later_rounds, rounds, tokens = [], 0.0, 0, [], []
    sequential = engine.speculator is not None and speculative and not engine.speculator.batched
    run_start = time.perf_counter()
    for i in range(0, len(prompts), b):
        batch = prompts[i : i + b]
        first: list[float] = []

        def on_tokens(_row, _toks, first=first):
            if not first:
                first.append(time.perf_counter())

        start = time.perf_counter()
        results = engine.generate_batch(
            [list(p) for p in batch],
            params,
            speculative=speculative,
            num_draft_tokens=k,
            on_tokens=on_tokens,
        )
        end = time.perf_counter()
        per_row = [
            (len(r.stats.k_per_round) or len(r.stats.accepted_per_step)) if speculative else len(r.token_ids)
            for r in results
        ]
        rounds += per_row
        tokens += [len(r.token_ids) for r in results]
        firsts.append(first[0] - start)
        if sequential:  # a tree method runs requests one after another (calibrated at b = 1)
            later_s += end - start - len(batch) * firsts[-1]
            later_rounds += sum(max(n - 1, 0) for n in per_row)
        else:
            later_s += end - first[0]
            later_rounds += max(max(per_row) - 1, 0)  # the batch runs until its slowest row is done
    return LoopTiming(
        batch=b,
        first_s=statistics.fmean(firsts),
        round_s=later_s / max(later_rounds, 1),
        rounds=rounds,
        tokens=tokens,
        seconds=time.perf_counter() - run_start,
    )


def measure_curve(
    engine,
    prompts: list[list[int]],
    batch_sizes: Sequence[int],
    max_k: int,
    *,
    max_tokens: int = 64,
    repeats: int = CALIBRATION_REPEATS,
) -> CostCurve:
    """Timed with the torch threads of a served engine process (SPECBUILD_TORCH_THREADS, default 1, as
    the local Triton's engine models): the default of one thread per core oversubscribes a shared CPU and
    is not what serves. `prompts`: the tune prompts (the loop timings run all of them; the pass costs the
    first)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("SPECBUILD_TORCH_THREADS", SERVED_TORCH_THREADS)))
    try:
        return _measure_curve(engine, prompts[:CALIBRATION_PROMPTS], batch_sizes, max_k, max_tokens, repeats)
    finally:
        torch.set_num_threads(threads)


def _measure_curve(engine, prompts, batch_sizes, max_k, max_tokens, repeats) -> CostCurve:
    prompt = prompts[0]
    verify, draft, prefill = {}, {}, {}
    for b in batch_sizes:
        prefill[b] = _median_time(_prefill(engine.target, b, prompt), repeats=5)
        verify[b] = [_median_time(_pass(engine.target, b, prompt, k + 1)) for k in range(max_k + 1)]
        if engine.draft is not None:
            draft[b] = _median_time(_pass(engine.draft, b, prompt, 1))
        else:  # a head drafter's own pass (EAGLE-3's draft layer), or none (n-gram)
            own = draft_pass(engine, prompt, b)
            draft[b] = _median_time(own) if own is not None else 0.0
    tree = engine.speculator is not None and not engine.speculator.batched
    points: list[tuple[int, int | None]] = []
    for b in batch_sizes:
        points.append((b, None))
        ks = [0, max_k] if tree and b == min(batch_sizes) else [] if tree else range(max_k + 1)
        points += [(b, k) for k in ks]
    engine.generate_batch([list(prompt)] * 2, SamplingParams(max_tokens=4), num_draft_tokens=max_k)  # warm
    timed: dict[tuple[int, int | None], list[LoopTiming]] = {}
    for r in range(repeats):  # interleaved: every point once per repeat, in reverse order every other one
        for point in round_order(points, r):
            timed.setdefault(point, []).append(time_loop(engine, prompts, *point, max_tokens))

    def med(point, what):
        return statistics.median(getattr(t, what) for t in timed[point])

    b1 = min(batch_sizes)
    rounds = {k: timed[b1, k][0].rounds for b, k in points if b == b1 and k is not None}
    loop_round, first, loop, plain, plain_first = {}, {}, {}, {}, {}
    loop_round_reps: dict[int, list[list[float]]] = {}
    first_reps: dict[int, list[list[float]]] = {}
    for b in batch_sizes:
        plain[b], plain_first[b] = med((b, None), "round_s"), med((b, None), "first_s")
        if tree:
            loop[b] = max(plain[b] - verify[b][0], 0.0)
            continue
        loop_round[b] = [med((b, k), "round_s") for k in range(max_k + 1)]
        first[b] = [med((b, k), "first_s") for k in range(max_k + 1)]
        loop_round_reps[b] = [[t.round_s for t in timed[b, k]] for k in range(max_k + 1)]
        first_reps[b] = [[t.first_s for t in timed[b, k]] for k in range(max_k + 1)]
        loop[b] = max(loop_round[b][max_k] - max_k * draft[b] - verify[b][max_k], 0.0)
    tree_round = med((b1, max_k), "round_s") if tree else None
    if tree:
        first[b1] = [med((b1, 0), "first_s"), med((b1, max_k), "first_s")]
    return CostCurve(
        batch_sizes=list(batch_sizes),
        max_k=max_k,
        verify_s=verify,
        draft_s=draft,
        loop_s=loop,
        plain_step_s=plain,
        tree_round_s=tree_round,
        prefill_s=prefill,
        loop_round_s=loop_round,
        first_s=first,
        plain_first_s=plain_first,
        rounds=rounds,
        tokens=timed[b1, None][0].tokens,
        loop_round_reps=loop_round_reps,
        first_reps=first_reps,
    )


def predict(
    curve: CostCurve,
    acceptance: Sequence[float],
    *,
    mode: str = "throughput",
    tree_tokens_per_round: float | None = None,
    max_batch_size: int | None = None,
    tokens: dict[int, float] | None = None,
    max_tokens: int | None = None,
) -> SchedulePrediction:
    """Predicted throughput per (b, K) and the schedule (see the module docstring). `tokens`: E(K) per K
    when it is not the chain over `acceptance` (n-gram: the exact greedy replay of each K). `max_tokens`:
    predict requests of that many tokens, prefill included; None: the steady state. A curve with the
    loop timings (measure_curve) predicts from them (core/perf/concurrency.lockstep_s); a hand-built one from
    the pass sum and E(K)."""
    measured = bool(curve.rounds) and max_tokens is not None
    mean_tokens = statistics.fmean(curve.tokens) if curve.tokens else float(max_tokens or 1)

    def finite(b: int, e: float, round_s: float) -> float:
        """Predicted tokens/s of b requests of max_tokens tokens (steady state when max_tokens is None)."""
        if max_tokens is None or not curve.prefill_s:
            return b * e / round_s
        n = max_tokens
        return b * n / (curve.prefill_s[b] + (n - 1) / e * round_s)

    def lockstep(b: int, rounds: list[int], first: float, round_s: float) -> float:
        """Predicted tokens/s of one lockstep batch of b tune-like requests."""
        timing = LoopTiming(
            batch=b, first_s=first, round_s=round_s, rounds=rounds, tokens=curve.tokens, seconds=0
        )
        return timing.predicted_tokens_per_s(b, b)

    if mode not in ("throughput", "latency"):
        raise TrainingError(
            f"--mode {mode!r}",
            expected="throughput | latency",
            found=mode,
            fix="use --mode throughput (default) or --mode latency",
        )
    table, baseline, chosen, per_repeat = [], {}, {}, {}
    tree = curve.tree_round_s is not None
    ks = [0, curve.max_k] if tree else list(range(curve.max_k + 1))
    b1 = min(curve.batch_sizes)
    for b in curve.batch_sizes:
        if measured:
            baseline[b] = lockstep(b, curve.tokens, curve.plain_first_s[b], curve.plain_step_s[b])
        else:
            baseline[b] = finite(b, 1.0, curve.plain_step_s[b])
        rates = {}
        for k in ks:
            if tree and k > 0:
                e, seconds = tree_tokens_per_round, curve.tree_round_s
                if measured:  # one request at a time, whatever b
                    r = statistics.fmean(curve.rounds[k])
                    e = mean_tokens / r
                    rate = mean_tokens / (curve.first_s[b1][1] + (r - 1) * seconds)
                else:
                    rate = finite(1, e, seconds)
            elif tree:
                e, seconds, rate = 1.0, curve.plain_step_s[b], baseline[b]
            elif measured:
                e = mean_tokens / statistics.fmean(curve.rounds[k])
                seconds = curve.round_s(b, k)
                rate = lockstep(b, curve.rounds[k], curve.first_s[b][k], seconds)
            else:
                e = (tokens[k] if tokens else tokens_per_pass_chain(acceptance, k)) if k else 1.0
                seconds = curve.round_s(b, k)
                rate = finite(b, e, seconds)
            rates[k] = rate
            row = {"batch": b, "k": k, "tokens_per_round": e, "round_ms": seconds * 1e3, "tokens_per_s": rate}
            if measured and not tree and b in curve.loop_round_reps:  # the rate of each interleaved repeat
                reps = zip(curve.first_reps[b][k], curve.loop_round_reps[b][k], strict=True)
                per_repeat.setdefault(b, {})[k] = [lockstep(b, curve.rounds[k], f, r) for f, r in reps]
                row["predicted"] = spread(per_repeat[b][k])
            table.append(row)
        if b in per_repeat:  # repeated timings: the rule of core/perf/schedule_choice, applied after the loop
            continue
        best = max(rates.values())
        near = [k for k, r in rates.items() if r >= best * (1 - TIE)]
        if b == min(curve.batch_sizes) and any(
            k > 0 for k in near
        ):  # one request in flight: a tie speculates
            near = [max(near)]  # with the larger K: no other request pays for it
        chosen[b] = min(near) if mode == "throughput" else max(near)
        if chosen:  # more load never drafts more (and K at 1 stays the largest: max_draft_len)
            chosen[b] = min(chosen[b], min(chosen.values()))
    decisions = []
    if per_repeat and len(per_repeat) == len(curve.batch_sizes):
        # K leaves its default (max at the smallest b, 0 after) only on a win in every repeat by > TIE
        decisions = choose(per_repeat, tie=TIE)
        chosen = {d.concurrency: d.chosen for d in decisions}
    notes = [f"b={d.concurrency}: {d.reason}" for d in decisions]
    if chosen[curve.batch_sizes[0]] == 0:
        notes.append("no K > 0 beats K=0 at the smallest batch size: speculation does not pay here")
        schedule = None
    else:
        steps = schedule_steps(sorted(curve.batch_sizes), chosen)
        if max_batch_size is not None:
            steps = {n: k for n, k in steps.items() if n <= max_batch_size}
        schedule = DraftSchedule.parse(steps, max_draft_len=chosen[sorted(curve.batch_sizes)[0]])
    return SchedulePrediction(
        mode=mode,
        acceptance=list(acceptance),
        curve=curve,
        table=table,
        baseline=baseline,
        chosen=chosen,
        schedule=schedule,
        notes=notes,
    )


def plot(prediction: dict[str, Any], path: Path) -> Path:
    """Predicted tokens/s vs concurrency for each K, the baseline and the schedule (a prediction's dict:
    SchedulePrediction.to_dict() or bench/serve_curve.predict_served)."""
    import matplotlib  # noqa: PLC0415 - the Agg backend, only when a plot is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    table, chosen = prediction["table"], {int(b): k for b, k in prediction["chosen"].items()}
    baseline = {int(b): v for b, v in prediction["baseline"].items()}
    sizes = sorted({r["batch"] for r in table})

    def rate(b, k):
        return next(r["tokens_per_s"] for r in table if r["batch"] == b and r["k"] == k)

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for k in sorted({r["k"] for r in table}):
        ax.plot(
            sizes, [rate(b, k) for b in sizes], marker="o", lw=1, alpha=0.7, label=f"K={k}" if k else "K=0"
        )
    ax.plot(sizes, [baseline[b] for b in sizes], "k--", lw=1.5, label="baseline (target alone)")
    ax.plot(
        sizes,
        [rate(b, chosen[b]) for b in sizes],
        color="crimson",
        lw=3,
        alpha=0.6,
        label=f"schedule ({prediction['mode']})",
    )
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [str(b) for b in sizes])
    ax.set_xlabel("requests in flight")
    ax.set_ylabel("predicted tokens/s (all requests)")
    served = prediction["curve"].get("kind") == "served"
    ax.set_title(
        "predicted throughput per K (" + ("served cost curve" if served else "reference engine") + ")"
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
