"""`tune --schedule`: the cost curve of the engine that serves, and the load-aware schedule it implies.

Measured on the reference engine (the engine the local Triton serves), for each batch size b of
`--concurrency` (up to build.max_batch_size) and each K in 0..max_draft_len:

* t_verify(b, K): one target pass over b rows of K+1 new tokens (the verify pass; K=0: a plain step);
* t_draft(b): one draft pass over b rows of one token (draft/target; Medusa heads ride on the target);
* the loop's own per-round cost o(b): a real lockstep batch of b identical requests at K = max_draft_len,
  timed at two lengths so the prefill cancels, minus the passes the model above predicts for its rounds;
  the plain batch loop's per-step time p(b) is timed the same way (the baseline).

A round at (b, K) is predicted to take T(b, K) = K t_draft(b) + t_verify(b, K) + o(b) and to give each
row E(K) tokens (core/theory.tokens_per_pass_chain over the measured per-position acceptance), so the
predicted throughput is b E(K) / T(b, K) tokens/s; K=0 is b / (t_verify(b, 0) + o(b)) and the baseline
b / p(b). For requests of N tokens (tune's --max-tokens) the prefill of b prompts counts too:
b N / (t_prefill(b) + (N - 1) / E(K) x T(b, K)). Medusa (a fixed tree, requests one after another
in-process): the tree's throughput is E_tree / T_tree whatever b, against the plain batch's b / p(b);
its schedule K is the tree or 0.

The schedule: for each b the K with the best predicted throughput. In a closed loop (b requests always
in flight) per-request speed is throughput / b, so both modes rank K alike; they differ on near ties
(within TIE): `throughput` takes the smaller K (less compute for the same tokens), `latency` the larger
(faster requests when the load drops between rounds). Where K changes between two measured sizes the
threshold is their midpoint, rounded up. The schedule's K at 1 becomes max_draft_len (TensorRT-LLM requires
it); when no K > 0 beats K=0 at b = 1 there is no schedule to write.
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
from specbuild.core.sampling_params import SamplingParams
from specbuild.core.schedule import DraftSchedule, schedule_steps
from specbuild.core.theory import tokens_per_pass_chain
from specbuild.engines.reference.runners import SequenceBatch
from specbuild.tuning.profile_engine import TIMING_REPEATS

SERVED_TORCH_THREADS = "1"  # = the local engine models' DEFAULT_TORCH_THREADS
TIE = 0.03  # predicted throughputs within 3% count as a tie (the spread of interleaved CPU timings)
LOOP_TOKENS = (16, 48)  # the two lengths the loop timings difference (prefill cancels)


@dataclass(frozen=True)
class CostCurve:
    batch_sizes: list[int]
    max_k: int
    verify_s: dict[int, list[float]]  # b -> [K=0..max_k] seconds of one verify pass
    draft_s: dict[int, float]  # b -> seconds of one draft pass (0: no draft model)
    loop_s: dict[int, float]  # b -> the speculative loop's own seconds per round
    plain_step_s: dict[int, float]  # b -> seconds per step of the plain batch loop (the baseline)
    tree_round_s: float | None = None  # Medusa: seconds per tree round of one request (whole loop)
    prefill_s: dict[int, float] = field(
        default_factory=dict
    )  # b -> one pass over b prompts (the profiled one)

    def round_s(self, b: int, k: int) -> float:
        """Predicted seconds of one round at batch size b and K (draft passes + verify + loop)."""
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


def _loop_round_s(engine, b: int, prompt: list[int], *, k: int | None) -> tuple[float, int]:
    """(seconds per round, rounds) of a real lockstep batch of b copies of `prompt`, from two lengths."""
    out = []
    for n in LOOP_TOKENS:
        params = SamplingParams(max_tokens=n, end_id=-1)  # no early stop: every row runs n tokens
        best = None
        for _ in range(3):  # best of 3: the loop's floor on a shared machine
            start = time.perf_counter()
            results = engine.generate_batch(
                [list(prompt)] * b, params, speculative=k is not None, num_draft_tokens=k
            )
            seconds = time.perf_counter() - start
            best = seconds if best is None else min(best, seconds)
        st = results[0].stats  # the rows are identical: row 0's rounds are the batch's
        rounds = (len(st.k_per_round) or len(st.accepted_per_step)) if k is not None else n
        out.append((best, rounds))
    (t1, r1), (t2, r2) = out
    return (t2 - t1) / max(r2 - r1, 1), r2


def measure_curve(engine, prompt: list[int], batch_sizes: Sequence[int], max_k: int) -> CostCurve:
    """Timed with the torch threads of a served engine process (SPECBUILD_TORCH_THREADS, default 1, as
    the local Triton's engine models): the default of one thread per core oversubscribes a shared CPU and
    is not what serves."""
    threads = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("SPECBUILD_TORCH_THREADS", SERVED_TORCH_THREADS)))
    try:
        return _measure_curve(engine, prompt, batch_sizes, max_k)
    finally:
        torch.set_num_threads(threads)


def _measure_curve(engine, prompt: list[int], batch_sizes: Sequence[int], max_k: int) -> CostCurve:
    verify, draft, loop, plain, prefill = {}, {}, {}, {}, {}
    tree_round = None
    for b in batch_sizes:
        prefill[b] = _median_time(_prefill(engine.target, b, prompt), repeats=5)
        verify[b] = [_median_time(_pass(engine.target, b, prompt, k + 1)) for k in range(max_k + 1)]
        draft[b] = _median_time(_pass(engine.draft, b, prompt, 1)) if engine.draft is not None else 0.0
        plain[b], _ = _loop_round_s(engine, b, prompt, k=None)
        if engine.speculator is not None and engine.speculator.batched:
            per_round, _ = _loop_round_s(engine, b, prompt, k=max_k)
            loop[b] = max(per_round - max_k * draft[b] - verify[b][max_k], 0.0)
        else:
            loop[b] = max(plain[b] - verify[b][0], 0.0)
    if engine.speculator is not None and not engine.speculator.batched:
        tree_round, _ = _loop_round_s(engine, 1, prompt, k=max_k)
    return CostCurve(
        batch_sizes=list(batch_sizes),
        max_k=max_k,
        verify_s=verify,
        draft_s=draft,
        loop_s=loop,
        plain_step_s=plain,
        tree_round_s=tree_round,
        prefill_s=prefill,
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
    predict requests of that many tokens, prefill included (the first token comes from it, the other
    N - 1 from N - 1 / E(K) rounds); None: the steady state."""

    def finite(b: int, e: float, round_s: float) -> float:
        """Predicted tokens/s of b requests of max_tokens tokens (steady state when max_tokens is None)."""
        if max_tokens is None or not curve.prefill_s:
            return b * e / round_s
        n = max_tokens
        return b * n / (curve.prefill_s[b] + (n - 1) / e * round_s)

    if mode not in ("throughput", "latency"):
        raise TrainingError(
            f"--mode {mode!r}",
            expected="throughput | latency",
            found=mode,
            fix="use --mode throughput (default) or --mode latency",
        )
    table, baseline, chosen = [], {}, {}
    tree = curve.tree_round_s is not None
    ks = [0, curve.max_k] if tree else list(range(curve.max_k + 1))
    for b in curve.batch_sizes:
        baseline[b] = finite(b, 1.0, curve.plain_step_s[b])
        rates = {}
        for k in ks:
            if tree and k > 0:
                e, seconds = tree_tokens_per_round, curve.tree_round_s
                rate = finite(1, e, seconds)  # one request at a time, whatever b
            elif tree:
                e, seconds, rate = 1.0, curve.plain_step_s[b], baseline[b]
            else:
                e = (tokens[k] if tokens else tokens_per_pass_chain(acceptance, k)) if k else 1.0
                seconds = curve.round_s(b, k)
                rate = finite(b, e, seconds)
            rates[k] = rate
            table.append(
                {
                    "batch": b,
                    "k": k,
                    "tokens_per_round": e,
                    "round_ms": seconds * 1e3,
                    "tokens_per_s": rate,
                }
            )
        best = max(rates.values())
        near = [k for k, r in rates.items() if r >= best * (1 - TIE)]
        if b == min(curve.batch_sizes) and any(
            k > 0 for k in near
        ):  # one request in flight: a tie speculates
            near = [max(near)]  # with the larger K: no other request pays for it
        chosen[b] = min(near) if mode == "throughput" else max(near)
        if chosen:  # more load never drafts more (and K at 1 stays the largest: max_draft_len)
            chosen[b] = min(chosen[b], min(chosen.values()))
    notes = []
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
    SchedulePrediction.to_dict() or client/serve_curve.predict_served)."""
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
