"""`make bench-reference`: baseline vs speculative decoding on the reference engine, CPU, concurrency 1.

For draft/target at each K and for Medusa it prints, side by side:
  rate       accepted / drafted (TensorRT-LLM's acceptance_rate; Medusa: per tree level)
  alpha      measured per-token acceptance: accepted / positions tested (a position is tested only
             when every earlier draft of its round was accepted): the alpha of the formula below
  c          cost ratio: a draft decode pass / a target decode pass (Medusa: the heads / a target pass),
             both timed as plain one-token decode steps on the same prompts
  predicted  (1 - alpha^(K+1)) / ((1 - alpha)(K c + 1))   (Leviathan et al. 2023; K = tree depth for Medusa)
  measured   speculative tokens/s / baseline tokens/s
Times are this process's CPU seconds (time.process_time) with one torch thread by default: on a
shared 2-core machine wall time mostly measures the other processes; with --threads > 1 use an
idle machine (CPU time then sums the threads).
  ratio      measured / predicted (goal >= 0.85: the gap is the runtime's overhead, e.g. a verify
             pass over K+1 tokens costing more than a one-token step)
  v          measured cost of that verify pass (K+1 tokens; Medusa: the whole tree) / a one-token pass:
             ~1 on a memory-bound GPU, well above 1 on a compute-bound CPU
  pred(v)    the prediction with the verify pass costing v instead of 1: (tokens/pass) / (K c + v)

Models: --target/--draft take HF folders (converted to a TensorRT-LLM checkpoint in a temporary
folder first) or folders the engine loads (checkpoint, engine, build); --medusa takes an HF Medusa
heads folder for the target. Without --target the trained demo family (specbuild.demo.models) is
built or reused from its cache.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specbuild.core.generation import SpecStats
from specbuild.core.methods import Method
from specbuild.core.perf import theory
from specbuild.core.sampling_params import SamplingParams
from specbuild.demo import models as demo_models
from specbuild.engines.reference.cached_decode import CachedSequence
from specbuild.engines.reference.engine import ReferenceEngine
from specbuild.engines.reference.medusa import MedusaHeads
from specbuild.engines.trtllm.convert import convert_checkpoint
from specbuild.engines.trtllm.medusa import MedusaHeadsSource

DEFAULT_KS = "1,2,4,6"
DEFAULT_PROMPTS = 8
DEFAULT_MAX_TOKENS = 64
GOAL = 0.85  # measured / predicted
FALLBACK_PROMPTS = [
    "def main():",
    "import os\n",
    "class Parser:",
    "The quick brown fox",
    "for i in range(",
    "Once upon a time",
]


@dataclass(frozen=True)
class Row:
    mode: str  # a Method value
    k: int  # draft tokens per step (Medusa: tree depth)
    rate: float  # accepted / drafted (TensorRT-LLM's acceptance_rate)
    alpha: (
        float  # per-token acceptance of the i.i.d. model (core/perf/theory.py alpha), used in the prediction
    )
    c: float
    predicted: float
    measured: float
    tokens_per_s: float
    baseline_tokens_per_s: float
    tokens_per_pass: float
    verify_cost: float = 1.0  # v: one target pass over K+1 tokens / a one-token decode pass (measured)

    @property
    def predicted_v(self) -> float:
        """The prediction with the verify pass costing v decode steps instead of 1."""
        return self.predicted * (self.k * self.c + 1) / (self.k * self.c + self.verify_cost)

    @property
    def ratio(self) -> float:
        return self.measured / self.predicted if self.predicted else 0.0


def _loadable(path: Path, work: Path, name: str, *, medusa: Path | None = None) -> Path:
    """HF folders are converted (float32 keeps CPU matmuls fast); specbuild folders are used as they are."""
    raw = json.loads((path / "config.json").read_text()) if (path / "config.json").is_file() else {}
    if "architectures" not in raw:
        return path
    heads = MedusaHeadsSource(medusa) if medusa else None
    return convert_checkpoint(path, work / name, dtype="float32", medusa=heads)


def _clock() -> float:
    """CPU seconds of this process: with one torch thread this is the compute time, and unlike wall time it
    does not count the time other processes on a shared machine take from us."""
    return time.process_time()


def _run(engine, prompts, params, **kw) -> tuple[float, int, object]:
    """(CPU seconds, tokens, merged stats) over all prompts."""
    stats, tokens, seconds = SpecStats(), 0, 0.0
    for ids in prompts:
        start = _clock()
        result = engine.generate(ids, params, **kw)
        seconds += _clock() - start
        tokens += len(result.token_ids)
        stats.merge(result.stats)
    return seconds, tokens, stats


def bench(
    target: Path,
    *,
    draft: Path | None,
    medusa: Path | None,
    prompts: list[str],
    ks: list[int],
    max_tokens: int,
    tree=None,
    log=print,
) -> list[Row]:
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="specbuild-bench-") as tmp:
        work = Path(tmp)
        base = ReferenceEngine.load(_loadable(target, work, "target"))
        if base.tokenizer_dir is None and (target / "tokenizer.json").is_file():
            base.tokenizer_dir = target
        ids = [base.encode(p) for p in prompts]
        # end_id -1 never matches: every run produces exactly max_tokens, so tokens/s compare like with like.
        params = SamplingParams(max_tokens=max_tokens, end_id=-1)
        _run(base, ids[:1], SamplingParams(max_tokens=4, end_id=-1), speculative=False)  # warm-up
        t_base, n_base, _ = _run(base, ids, params, speculative=False)
        base_tps = n_base / t_base
        log(f"baseline target: {n_base} tokens in {t_base:.2f}s = {base_tps:.1f} tok/s")
        if draft is not None:
            d = ReferenceEngine.load(_loadable(draft, work, "draft"))
            t_draft, n_draft, _ = _run(d, ids, params, speculative=False)
            c = (t_draft / n_draft) / (t_base / n_base)
            log(f"draft alone: {n_draft / t_draft:.1f} tok/s -> c = {c:.3f}")
            pair = ReferenceEngine(
                base.target, draft=d.target, method=Method.DRAFT_TARGET, tokenizer_dir=base.tokenizer_dir
            )
            for k in ks:
                secs, n, stats = _run(pair, ids, params, num_draft_tokens=k)
                rows.append(
                    _row(
                        Method.DRAFT_TARGET.value,
                        k,
                        stats,
                        c,
                        n / secs,
                        base_tps,
                        verify_cost(base.target, ids[0], k + 1),
                    )
                )
        if medusa is not None:
            m = ReferenceEngine.load(
                _loadable(target, work, "target-with-heads", medusa=medusa), medusa_choices=tree
            )
            heads: MedusaHeads = m.speculator.heads
            hidden = m.target.forward(
                __import__("torch").tensor([ids[0]]), m.target.new_cache(1, len(ids[0]))
            )[0, -1]
            reps = 50
            start = _clock()
            for _ in range(reps):
                heads.logits(hidden)
            c = ((_clock() - start) / reps) / (t_base / n_base)
            secs, n, stats = _run(m, ids, params)
            tree = m.speculator.tree
            v = verify_cost(
                m.target,
                ids[0],
                tree.num_nodes + 1,
                new_mask=tree.attention_mask,
                depths=tree.position_offsets,
            )
            rows.append(_row(Method.MEDUSA.value, tree.depth, stats, c, n / secs, base_tps, v))
    return rows


def _row(mode, k, stats, c, tps, base_tps, v) -> Row:
    alpha = theory.alpha(stats.accepted_per_position, stats.drafted_per_position)
    return Row(
        mode=mode,
        k=k,
        rate=stats.acceptance_rate,
        alpha=alpha,
        c=c,
        predicted=theory.predicted_speedup(alpha, k, c),
        measured=tps / base_tps,
        tokens_per_s=tps,
        baseline_tokens_per_s=base_tps,
        tokens_per_pass=stats.mean_accepted_per_step,
        verify_cost=v,
    )


def verify_cost(model, ids: list[int], n_tokens: int, *, new_mask=None, depths=None, reps: int = 20) -> float:
    """CPU time of one pass over n_tokens new tokens / one pass over 1 token, after `ids` are cached."""

    seq = CachedSequence(model)
    seq.feed(ids, 1)
    base = len(ids)

    def timed(n: int, mask=None, offs=None) -> float:
        tail = torch.tensor([[7] * n])  # [1,n]
        start = _clock()
        for _ in range(reps):
            seq.cache.truncate(0, base)
            model.forward(tail, seq.cache, new_mask=mask, depths=offs)
        return _clock() - start

    return timed(n_tokens, new_mask, depths) / timed(1)


def format_table(rows: list[Row]) -> str:
    head = (
        f"{'mode':<13}{'K':>3}{'rate':>7}{'alpha':>8}{'c':>8}{'tok/pass':>10}"
        f"{'predicted':>11}{'measured':>10}{'ratio':>8}"
        f"{'tok/s':>9}{'v':>7}{'pred(v)':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        flag = "" if r.ratio >= GOAL else "  < goal"
        lines.append(
            f"{r.mode:<13}{r.k:>3}{r.rate:>7.3f}{r.alpha:>8.3f}{r.c:>8.3f}{r.tokens_per_pass:>10.2f}"
            f"{r.predicted:>10.2f}x{r.measured:>9.2f}x{r.ratio:>8.2f}"
            f"{r.tokens_per_s:>9.1f}{r.verify_cost:>7.2f}{r.predicted_v:>8.2f}x{flag}"
        )
    return "\n".join(lines)


def _read_prompts(path: Path, n: int) -> list[str]:
    items = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [it["prompt"] if isinstance(it, dict) else str(it) for it in items][:n]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m lab.benchmarks.reference", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--target",
        type=Path,
        help="target: HF folder, checkpoint, engine or build folder (default: the demo family)",
    )
    p.add_argument("--draft", type=Path, help="draft model (HF folder or specbuild folder)")
    p.add_argument("--medusa", type=Path, help="HF Medusa heads folder for the target")
    p.add_argument(
        "--tree",
        default=None,
        help="Medusa tree (named tree or list of paths; default mc_sim_7b_63 / a chain)",
    )
    p.add_argument(
        "--prompts",
        type=Path,
        help='JSONL with {"prompt": ...} per line (default: the demo family\'s held-out prompts)',
    )
    p.add_argument("--num-prompts", type=int, default=DEFAULT_PROMPTS)
    p.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    p.add_argument("--k", default=DEFAULT_KS, help="comma-separated draft lengths K")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: steadiest timings on a shared CPU)"
    )
    p.add_argument("--micro", action="store_true", help="demo family at micro size (pipeline check only)")
    p.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="demo family cache folder (default: specbuild.demo.models' .cache/demo)",
    )
    p.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    target, draft, medusa, prompts_file = args.target, args.draft, args.medusa, args.prompts
    if target is None:
        settings = demo_models.MICRO if args.micro else demo_models.DemoSettings()
        cache = {"cache": args.cache} if args.cache else {}
        family = demo_models.build_family(settings, **cache)
        target, draft, prompts_file = family.target, family.draft, prompts_file or family.prompts
        medusa = demo_models.build_medusa(family, settings, **cache)
    prompts = (
        _read_prompts(prompts_file, args.num_prompts)
        if prompts_file
        else FALLBACK_PROMPTS[: args.num_prompts]
    )
    ks = [int(k) for k in args.k.split(",") if k.strip()]
    print(
        f"reference bench: target={target} draft={draft} medusa={medusa} prompts={len(prompts)} "
        f"max_tokens={args.max_tokens} threads={args.threads}"
    )
    rows = bench(
        target, draft=draft, medusa=medusa, prompts=prompts, ks=ks, max_tokens=args.max_tokens, tree=args.tree
    )
    print(format_table(rows))
    if args.json:
        args.json.write_text(
            json.dumps([asdict(r) | {"ratio": r.ratio, "predicted_v": r.predicted_v} for r in rows], indent=2)
            + "\n"
        )


if __name__ == "__main__":
    main()
