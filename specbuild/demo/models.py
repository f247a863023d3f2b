"""The demo family: a small but trained target, draft and Medusa heads, built offline and cached.

Text: the Python standard library's own top-level `.py` files, read from the running interpreter's
stdlib folder in sorted order (every 10th file held out for prompts), so the build needs no download
and is reproducible for a given Python. Steps:

1. a byte-level BPE tokenizer (`demo/synthetic.py` train_tokenizer) shared by every model;
2. a Llama target trained with next-token loss (plain PyTorch, CPU, fixed seeds and steps);
3. the target's greedy continuations of training windows (sequence-level distillation data);
4. a much smaller Llama draft trained on real text plus those continuations, so it predicts what
   the target will say (high greedy acceptance);
5. an acceptance estimate: on held-out prompts, the draft's teacher-forced argmax against the
   target's greedy output gives the exact greedy chain acceptance for every K (metrics.json);
6. Medusa heads trained by `specbuild train-medusa` on the target (a separate cache entry, so the
   heads can be rebuilt without retraining the models);
7. an EAGLE-3 draft trained by `specbuild train-eagle3` on the target's answers to the first training
   chunks (a cache entry of its own, keyed like the heads).

Everything lands under CACHE/<key>/ where key is a hash of the settings (and the Python / torch
versions, which change the text and the numerics); a present, complete entry is reused.
The pieces: settings.py (what shapes the family, its hash), corpus.py (the text), lm.py (the models
and their training), this module (the build and its cache).

Shape legend: B batch, T sequence length, V vocabulary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoTokenizer

from specbuild.core.errors import SpecbuildError
from specbuild.core.formats.manifest import MANIFEST, atomic_output_dir, read_manifest, write_manifest
from specbuild.core.pdeathsig import die_with_parent
from specbuild.demo.corpus import chunks, corpus_split, encode_stream, windows, write_jsonl
from specbuild.demo.lm import acceptance_profile, greedy_continue, new_model, train_lm
from specbuild.demo.settings import (
    DEFAULT_CACHE,
    DEFAULT_SETTINGS,
    MICRO,
    DemoFamily,
    DemoSettings,
    cpu_count,
)
from specbuild.demo.synthetic import train_tokenizer

__all__ = [
    "DEFAULT_CACHE",
    "MICRO",
    "DemoFamily",
    "DemoSettings",
    "acceptance_profile",
    "build_eagle3",
    "build_family",
    "build_medusa",
    "corpus_split",
    "cpu_count",
    "link_current",
    "new_model",
]


def build_family(
    settings: DemoSettings = DEFAULT_SETTINGS,
    *,
    cache: Path = DEFAULT_CACHE,
    log: Callable[[str], None] = print,
) -> DemoFamily:
    """Build (or reuse) tokenizer, target and draft under cache/<family key>/."""
    root = (Path(cache) / f"family-{settings.family_key()}").resolve()
    if (root / MANIFEST).is_file():
        log(f"demo family cached at {root}")
        return _family_at(root)
    log(f"building the demo family into {root} (one-time; later runs reuse it)")
    with atomic_output_dir(root, force=True) as tmp:
        timings = _build_into(tmp, settings, log)
        write_manifest(tmp, kind="demo_family", settings=dataclasses.asdict(settings), timings=timings)
    return _family_at(root)


def _build_into(out: Path, settings: DemoSettings, log: Callable[[str], None]) -> dict:

    timings: dict[str, float] = {}
    t = time.time()
    train_texts, held_texts = corpus_split(settings)
    train_tokenizer(out / "tokenizer", train_texts, vocab_size=settings.vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(str(out / "tokenizer"))
    stream = encode_stream(tokenizer, train_texts)  # [N]
    held = encode_stream(tokenizer, held_texts)  # [M]
    write_jsonl(out / "train.jsonl", "text", chunks(train_texts, 2000))
    timings["tokenizer_s"] = time.time() - t
    log(f"  corpus: {len(train_texts)} stdlib files, {len(stream)} training tokens, vocab {len(tokenizer)}")

    gen = torch.Generator().manual_seed(settings.seed)
    t = time.time()
    target = new_model(settings.target, tokenizer, settings, settings.seed + 1)
    ts = settings.target_train
    target_loss = train_lm(
        target, lambda _: windows(stream, ts.batch_size, ts.seq_len, gen), ts, label="target", log=log
    )
    timings["target_s"] = time.time() - t

    t = time.time()
    prompts = windows(stream, settings.distill_sequences, settings.distill_prompt_len, gen)  # [S, P]
    distill = greedy_continue(target, prompts, settings.distill_new_tokens)  # [S, P+N]
    timings["distill_data_s"] = time.time() - t

    t = time.time()
    draft = new_model(settings.draft, tokenizer, settings, settings.seed + 2)
    ds = settings.draft_train
    length = min(ds.seq_len, distill.shape[1])

    def draft_batch(step: int):
        # Half real text, half the target's own greedy text: the draft learns what the target says.
        real = windows(stream, ds.batch_size - ds.batch_size // 2, length, gen)  # [B/2, T]
        rows = torch.randint(0, len(distill), (ds.batch_size // 2,), generator=gen)
        offset = int(torch.randint(0, distill.shape[1] - length + 1, (1,), generator=gen))
        synthetic = distill[rows, offset : offset + length]  # [B/2, T]
        return torch.cat([real, synthetic])  # [B, T]

    draft_loss = train_lm(draft, draft_batch, ds, label="draft", log=log)
    timings["draft_s"] = time.time() - t

    t = time.time()
    eval_prompts = windows(held, settings.eval_prompts, settings.distill_prompt_len, gen)  # [E, P]
    eval_seqs = greedy_continue(target, eval_prompts, settings.eval_new_tokens)  # [E, P+N]
    profile = acceptance_profile(eval_seqs, draft, settings.distill_prompt_len)
    timings["eval_s"] = time.time() - t

    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(str(out / name), safe_serialization=True)
        tokenizer.save_pretrained(str(out / name))
    prompt_texts = [tokenizer.decode(p) for p in windows(held, 16, 48, gen)]
    write_jsonl(out / "prompts.jsonl", "prompt", prompt_texts)
    metrics = {
        "target_params": sum(p.numel() for p in target.parameters()),
        "draft_params": sum(p.numel() for p in draft.parameters()),
        "training_tokens": len(stream),
        "target_final_loss": target_loss,
        "draft_final_loss": draft_loss,
        "held_out_greedy_acceptance": profile,
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    best = max(range(1, 9), key=lambda k: profile[f"tokens_per_pass_k{k}"] / (1 + 0.15 * k))
    log(
        f"  held-out greedy acceptance: per token {profile['alpha_token']:.2f}, "
        f"tokens per target pass {profile['tokens_per_pass_k4']:.2f} at K=4 (best-ish K={best})"
    )
    return timings


def build_medusa(
    family: DemoFamily,
    settings: DemoSettings = DEFAULT_SETTINGS,
    *,
    cache: Path = DEFAULT_CACHE,
    log: Callable[[str], None] = print,
    specbuild: str | None = None,
) -> Path | None:
    """Train Medusa heads on the target with `specbuild train-medusa` (cached); None if unavailable."""
    out = (Path(cache) / f"medusa-{settings.medusa_key()}").resolve()
    exe = _ready(out, "train-medusa", "the Medusa heads", specbuild, log)
    if exe is None:
        return out if (out / MANIFEST).is_file() else None
    argv = [exe, "train-medusa", str(family.target), "--data", str(family.train_text), "--out", str(out)]
    _train(argv + settings.medusa.train_options(), "the demo Medusa heads", log)
    return out


def build_eagle3(
    family: DemoFamily,
    settings: DemoSettings = DEFAULT_SETTINGS,
    *,
    cache: Path = DEFAULT_CACHE,
    log: Callable[[str], None] = print,
    specbuild: str | None = None,
) -> Path | None:
    """Train an EAGLE-3 draft on the target with `specbuild train-eagle3` (cached); None if unavailable.
    Its prompts: the first `settings.eagle3.prompts` training chunks (the target answers each)."""
    out = (Path(cache) / f"eagle3-{settings.eagle3_key()}").resolve()
    exe = _ready(out, "train-eagle3", "the EAGLE-3 draft", specbuild, log)
    if exe is None:
        return out if (out / MANIFEST).is_file() else None
    prompts = out.with_name(f"{out.name}.prompts.jsonl")
    lines = [line for line in family.train_text.read_text().splitlines() if line.strip()]
    prompts.write_text("\n".join(lines[: settings.eagle3.prompts]) + "\n")
    argv = [exe, "train-eagle3", str(family.target), "--data", str(prompts), "--out", str(out)]
    _train(argv + settings.eagle3.train_options() + ["--force"], "the demo EAGLE-3 draft", log)
    return out


def _ready(
    out: Path, command: str, what: str, specbuild: str | None, log: Callable[[str], None]
) -> str | None:
    """The specbuild executable to train `out` with; None when it is cached (logged) or the command is
    missing from this checkout (logged: the demo skips the method)."""
    if (out / MANIFEST).is_file():
        log(f"demo {what.removeprefix('the ')} cached at {out}")
        return None
    exe = specbuild or str(Path(sys.executable).with_name("specbuild"))
    if subprocess.run([exe, command, "--help"], capture_output=True, text=True).returncode != 0:
        log(f"  `specbuild {command}` is not available in this checkout; skipping {what}")
        return None
    return exe


def _train(argv: list[str], what: str, log: Callable[[str], None]) -> None:
    log("$ " + " ".join(argv))
    done = subprocess.run(argv, preexec_fn=die_with_parent())  # ends if the demo is killed
    if done.returncode != 0:
        raise SpecbuildError(
            f"training {what} failed",
            expected=f"`specbuild {argv[1]}` to exit 0",
            found=f"exit code {done.returncode}",
            fix="see the output above; rerun `make demo` after fixing it",
        )


def link_current(
    family: DemoFamily,
    medusa_heads: Path | None,
    *,
    cache: Path = DEFAULT_CACHE,
    eagle3: Path | None = None,
) -> dict[str, Path]:
    """Point the stable names cache/{target,draft,tokenizer,prompts.jsonl,medusa_heads,eagle3} at this
    build.

    The example specs (examples/demo/*.yaml) reference these names, so they follow the cached build
    without knowing its hash. Each link is replaced atomically (os.replace).
    """
    targets = {
        "target": family.target,
        "draft": family.draft,
        "tokenizer": family.tokenizer,
        "prompts.jsonl": family.prompts,
    }
    if medusa_heads is not None:
        targets["medusa_heads"] = medusa_heads
    if eagle3 is not None:
        targets["eagle3"] = eagle3
    links = {}
    for name, dest in targets.items():
        link = Path(cache) / name
        tmp = Path(cache) / f".{name}.link-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(os.path.relpath(dest, Path(cache).resolve()))
        os.replace(tmp, link)
        links[name] = link
    return links


def _family_at(root: Path) -> DemoFamily:
    read_manifest(root, kind="demo_family")
    return DemoFamily(
        root=root,
        tokenizer=root / "tokenizer",
        target=root / "target",
        draft=root / "draft",
        train_text=root / "train.jsonl",
        prompts=root / "prompts.jsonl",
        metrics=json.loads((root / "metrics.json").read_text()),
    )


def main(argv: list[str] | None = None) -> None:

    parser = argparse.ArgumentParser(
        prog="python -m specbuild.demo.models", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help="cache folder (default .cache/demo)"
    )
    parser.add_argument(
        "--micro", action="store_true", help="tiny sizes and steps (a pipeline check, not a useful model)"
    )
    parser.add_argument("--no-medusa", action="store_true", help="skip the Medusa heads")
    parser.add_argument("--no-eagle3", action="store_true", help="skip the EAGLE-3 draft")
    parser.add_argument(
        "--threads", type=int, default=cpu_count(), help="torch threads (default: the usable cores)"
    )
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # our lines and the commands' output stay in order in a log
    torch.set_num_threads(args.threads)
    settings = MICRO if args.micro else DemoSettings()
    family = build_family(settings, cache=args.cache)
    heads = None if args.no_medusa else build_medusa(family, settings, cache=args.cache)
    eagle3 = None if args.no_eagle3 else build_eagle3(family, settings, cache=args.cache)
    link_current(family, heads, cache=args.cache, eagle3=eagle3)
    print(json.dumps(family.metrics, indent=2))


if __name__ == "__main__":
    main()
