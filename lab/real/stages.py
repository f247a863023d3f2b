"""`make demo-real`'s stages before serving: the options, the prompt files, the spec copies (TP 1 and a TP 3
copy for `check`), conversion with its exactness check against transformers, and the trained Medusa heads and
EAGLE-3 draft (cached by what shapes them). run.py drives them, then serves each method."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from lab.real.checks import check_exact
from lab.real.model import DEFAULT_CACHE, LINK, RealModel, chat_prompt
from lab.real.prompts import PromptSets
from specbuild.core.errors import SpecbuildError
from specbuild.core.formats.manifest import MANIFEST, read_manifest
from specbuild.core.methods import Method
from specbuild.demo.commands import REPO_ROOT, run_cli
from specbuild.demo.pipeline import spec_copy, write_spec_copy
from specbuild.demo.settings import Eagle3Settings, MedusaSettings, settings_hash

EXAMPLES = REPO_ROOT / "examples" / "real"
PROMPT_SETS = ("quoting", "open")
REAL_METHODS = ("ngram", "medusa", "eagle3")
LLMAPI_METHODS = ("eagle3",)  # no engine flow: served through Triton's LLM-API model (llmapi-local)
CHECK_TP = 3  # 9 attention heads and 3 KV heads split over 3 ranks without duplication


# 3 heads, 1 ResBlock; ~8 s a step on 2 cores (the three 49,152 x 576 head matrices dominate).
# Windows of 128 tokens: --self-distill keeps each prompt's last 64 tokens and continues it greedily by
# REAL_DISTILL_NEW_TOKENS tokens (HF generate, batch 4: ~0.23 s a token step here, so 64 tokens cost ~2 min).
# Measured on the fresh-clone run of 2026-12-01 18:47: 192 tokens (two windows per answer) cost 353 s of
# generation against ~120 s and bought nothing: bench tokens a pass 1.38 / 1.35 (quoting / open) against
# 1.39 / 1.26 with 64 (held-out top-1 for t+2 0.12 against 0.29, on held-out windows of another kind: most
# start mid-answer, without the context the text was generated from).
REAL_MEDUSA = MedusaSettings(num_heads=3, num_layers=1, steps=24, batch_size=4, seq_len=128, lr=3e-3)
REAL_DISTILL_NEW_TOKENS = 64
MEDUSA_CHECKPOINT_EVERY = 8  # steps: an interrupted demo resumes (--resume) from the last checkpoint
# The EAGLE-3 draft for a comparable training time, on the same prompts, batch, sequence length (each
# prompt's last 64 tokens, then 64 answer tokens: --new-tokens REAL_DISTILL_NEW_TOKENS) and learning rate;
# the draft vocabulary is the 8192 most frequent answer tokens (the heads predict all 49,152). Comparable
# time, not the same steps: a draft step costs ~0.4 s here against a Medusa step's ~8 s (the stage times
# of one run: Medusa 199 s, EAGLE-3 336 s, each with its own answers and checks). At 24 steps the draft
# learnt little (held-out acceptance 0.09 at position 1; lab/notebook/2026-12-05-eagle3-data-scaling.md).
REAL_EAGLE3 = Eagle3Settings(steps=400, batch_size=4, seq_len=128, lr=3e-3, draft_vocab_size=8192)


@dataclass(frozen=True)
class RealOptions:
    out: Path = Path("build/demo-real")
    cache: Path = DEFAULT_CACHE
    concurrency: str = "1,4"
    max_tokens: int = 64
    bench_prompts: int = 4  # per prompt set
    # seconds one bench request may take: the streamed target-alone baseline at concurrency 4 took over
    # bench's default 120 s for 64 tokens at load 10-20 (the full run of 2026-12-01 16:08 stopped there)
    bench_timeout_s: float = 600.0
    # training prompts of both trained methods: with 32 (29 answers) the EAGLE-3 draft memorised its
    # answers (held-out 0.20 at position 1 after 120 steps); with 128 it generalises (0.42 after 400)
    train_prompts: int = 128
    tune_prompts: int = 4  # tune profiles on them (prompt_sets: neither bench nor training prompts)
    tune_max_tokens: int = 32
    # speculation.schedule {1: K, plain_from: 0}: plain target steps from this many requests in flight
    # (0: no schedule). The previous full run measured every K losing at concurrency 4 on this CPU (n-gram
    # 0.68x quoting, 0.19x open) and winning at 1 (1.64x quoting); `tune --schedule`'s rule puts the step
    # at the midpoint of the measured sizes 1 and 4, rounded up. Fixed, not measured per run: a cost
    # curve (`tune --schedule --concurrency 1,4`) takes minutes here, past the 20-minute budget.
    # Since batched verification and the prefix-cache fix, K = 7 WINS at concurrency 4 on quoting prompts
    # (2.27x against the one-call baseline; the schedule's plain steps 0.87x) and still loses on open ones
    # (0.65x; the schedule 0.94x): the fixed step is kept but is no longer right for every prompt set.
    plain_from: int = 3
    exact_new_tokens: int = 24
    medusa: MedusaSettings = REAL_MEDUSA
    eagle3: Eagle3Settings = REAL_EAGLE3
    distill_new_tokens: int = (
        REAL_DISTILL_NEW_TOKENS  # train-medusa --distill-new-tokens, train-eagle3 --new-tokens
    )
    methods: tuple[str, ...] = ()  # empty: every method this checkout has


def available_methods(wanted: tuple[str, ...]) -> tuple[str, ...]:
    """n-gram, Medusa and EAGLE-3, in that order: the methods that need no separate draft model."""
    known = {m.value for m in Method}
    order = [m for m in REAL_METHODS if m in known]
    if wanted:
        order = [m for m in order if m in wanted]
    return tuple(order)


def write_prompts(real: RealModel, sets: PromptSets, out: Path, opts: RealOptions) -> dict[str, Path]:
    """OUT/prompts/{quoting,open,train,tune}.jsonl: each user turn in the chat template, field "prompt"."""
    from transformers import AutoTokenizer  # noqa: PLC0415  (the tokenizer only; torch is loaded already)

    tokenizer = AutoTokenizer.from_pretrained(str(real.model))
    folder = out / "prompts"
    folder.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, items in (
        ("quoting", sets.quoting),
        ("open", sets.open),
        ("train", sets.train),
        ("tune", sets.tune),
    ):
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"prompt": chat_prompt(tokenizer, p)}) + "\n" for p in items))
        files[name] = path
    return files


def stage_specs(opts: RealOptions, methods: tuple[str, ...], real: RealModel) -> dict[str, Path]:
    """examples/real/<method>.yaml copied to OUT/specs/ with absolute paths into the cache, plus a TP 3 copy
    of the first (checked, not built: one CPU runs TP 1)."""
    out = Path(opts.out) / "specs"
    out.mkdir(parents=True, exist_ok=True)
    specs = {}
    for mode in methods:
        source = EXAMPLES / f"{mode}.yaml"
        raw = spec_copy(source, opts.cache)
        specs[mode] = write_spec_copy(raw, out / source.name, source=source, by="make demo-real")
        if len(specs) == 1:  # a TP 3 copy for `check`
            raw["name"] = f"{raw['name']}-tp{CHECK_TP}"
            raw["target"]["tp_size"] = CHECK_TP
            tp = out / f"{source.stem}-tp{CHECK_TP}.yaml"
            specs[f"{mode}-tp{CHECK_TP}"] = write_spec_copy(raw, tp, source=source, by="make demo-real")
    return specs


def stage_convert_and_exactness(real: RealModel, prompt_files: dict[str, Path], opts: RealOptions) -> list:
    ckpts = {}
    for tp in (1, CHECK_TP):
        path = (Path(opts.out) / "checkpoints" / f"tp{tp}").resolve()
        run_cli(
            "convert",
            str(Path(opts.cache) / LINK),
            "--out",
            str(path),
            "--dtype",
            "float32",
            "--tp-size",
            str(tp),
            "--force",
        )
        ckpts[f"TP {tp}"] = path
    prompts = [json.loads(prompt_files[name].read_text().splitlines()[0])["prompt"] for name in PROMPT_SETS]
    print(
        f"reference engine vs transformers, float32, {len(prompts)} prompts x {opts.exact_new_tokens} greedy "
        "tokens (transformers' continuation, then both score prompt + continuation)"
    )
    lines = check_exact(real.model, ckpts, prompts, new_tokens=opts.exact_new_tokens)
    failed = [line for line in lines if not line.ok]
    if failed:
        raise SpecbuildError(
            "the converted real model does not reproduce transformers",
            expected="max |Δlogit| within tolerance and equal greedy tokens",
            found=failed[0].line(),
            fix="see the lines above",
        )
    return lines


# ---------------------------------------------------------------- training data, Medusa, draft


def stage_medusa(real: RealModel, train_prompts: Path, sets: PromptSets, opts: RealOptions) -> Path:
    """Medusa heads from `specbuild train-medusa --self-distill` on the training prompts (cached by what
    shapes them): the target's own greedy continuations are the training text, so the heads learn the
    model being served. train-medusa keeps each prompt's last seq_len/2 tokens and continues it greedily
    by --distill-new-tokens tokens (its rule, tuning/train.py); the long code-editing prompts lose their
    head there."""
    options = [*opts.medusa.train_options(), "--distill-new-tokens", str(opts.distill_new_tokens)]
    return _trained("train-medusa", "medusa", opts.medusa, options, real, train_prompts, sets, opts)


def stage_eagle3(real: RealModel, train_prompts: Path, sets: PromptSets, opts: RealOptions) -> Path:
    """An EAGLE-3 draft from `specbuild train-eagle3` on the training prompts with the Medusa heads' budget
    (cached by what shapes it): the target answers each prompt (its last seq_len/2 tokens, then
    --new-tokens), and the draft learns those answers from the target's own hidden states."""
    options = [*opts.eagle3.train_options(), "--new-tokens", str(opts.distill_new_tokens)]
    return _trained("train-eagle3", "eagle3", opts.eagle3, options, real, train_prompts, sets, opts)


TRAINED = {  # name -> (the CACHE link the spec names, the manifest kind, the title)
    "medusa": ("medusa_heads", "medusa_heads", "Medusa heads"),
    "eagle3": ("eagle3", "eagle3_draft", "EAGLE-3 draft"),
}


def _trained(
    command: str,
    name: str,
    settings: MedusaSettings | Eagle3Settings,
    options: list[str],
    real: RealModel,
    train_prompts: Path,
    sets: PromptSets,
    opts: RealOptions,
) -> Path:
    """`specbuild COMMAND` on the training prompts into CACHE/NAME-<key> (key: the prompts, the settings and
    the answer length), reused when complete, linked as CACHE/<link>. --resume: an interrupted demo
    continues from the last checkpoint and reuses the answers saved beside it."""
    link, kind, title = TRAINED[name]
    recipe = {name: asdict(settings), "distill_new_tokens": opts.distill_new_tokens}
    key = settings_hash({"model": real.root.name, "prompts": list(sets.train), **recipe})
    out = (Path(opts.cache) / f"{name}-{key}").resolve()
    if (out / MANIFEST).is_file():
        read_manifest(out, kind=kind)
        print(f"{title} cached at {out}")
    else:
        run_cli(
            command,
            str(real.model),
            "--data",
            str(train_prompts),
            "--out",
            str(out),
            *options,
            "--checkpoint-every",
            str(MEDUSA_CHECKPOINT_EVERY),
            "--resume",
            "--force",
        )
    _link(Path(opts.cache), link, out)
    return out


def _link(cache: Path, name: str, dest: Path) -> None:
    link = cache / name
    tmp = cache / f".{name}.link-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(os.path.relpath(dest, cache.resolve()))
    os.replace(tmp, link)
