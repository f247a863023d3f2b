"""The demo family: a small but trained target, draft and Medusa heads, built offline and cached.

Text: the Python standard library's own top-level `.py` files, read from the running interpreter's
stdlib folder in sorted order (every 10th file held out for prompts), so the build needs no download
and is reproducible for a given Python. Steps:

1. a byte-level BPE tokenizer (`builder.synthetic.train_tokenizer`) shared by every model;
2. a Llama target trained with next-token loss (plain PyTorch, CPU, fixed seeds and steps);
3. the target's greedy continuations of training windows (sequence-level distillation data);
4. a much smaller Llama draft trained on real text plus those continuations, so it predicts what
   the target will say (high greedy acceptance);
5. an acceptance estimate: on held-out prompts, the draft's teacher-forced argmax against the
   target's greedy output gives the exact greedy chain acceptance for every K (metrics.json);
6. Medusa heads trained by `specbuild train-medusa` on the target (a separate cache entry, so the
   heads can be rebuilt without retraining the models).

Everything lands under CACHE/<key>/ where key is a hash of the settings (and the Python / torch
versions, which change the text and the numerics); a present, complete entry is reused.

Shape legend: B batch, T sequence length, V vocabulary.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specbuild.core.errors import SpecbuildError
from specbuild.core.manifest import MANIFEST, atomic_output_dir, read_manifest, write_manifest
from specbuild.demo.synthetic import train_tokenizer

RECIPE_VERSION = 2  # bump when the recipe changes in a way the settings do not capture
DEFAULT_CACHE = Path(".cache/demo")
HELD_OUT_EVERY = 10  # every 10th stdlib file (sorted) is held out for prompts and evaluation


@dataclass(frozen=True)
class ModelShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int


@dataclass(frozen=True)
class TrainSchedule:
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    warmup: int = 20  # linear warmup steps, then cosine decay to lr/10


@dataclass(frozen=True)
class MedusaSettings:
    num_heads: int = 4
    num_layers: int = 1  # ResBlocks per head
    steps: int = 120
    batch_size: int = 8
    seq_len: int = 128
    lr: float = 1e-3
    # Train on the target's own greedy continuations: heads trained on plain text were worse than
    # untrained ones on this target (its greedy output repeats itself); self-distilled heads measured
    # 2.66 vs 1.89 tokens/pass with their tuned trees on the held-out bench prompts.
    self_distill: bool = True


@dataclass(frozen=True)
class DemoSettings:
    """Everything that shapes the demo family; its hash names the cache entry."""

    corpus_bytes: int = 2_000_000  # of training text
    file_cap_bytes: int = 24_000  # at most this much from the start of each file (keeps variety)
    vocab_size: int = 512  # small: each token is easier to predict, and the models learn faster
    # Sized so that a target pass costs several draft passes on CPU (the cost ratio c) while the
    # whole family trains in a few minutes on 2 cores.
    target: ModelShape = ModelShape(
        hidden_size=256, num_layers=8, num_heads=4, num_kv_heads=2, intermediate_size=768
    )
    draft: ModelShape = ModelShape(
        hidden_size=128, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=384
    )
    target_train: TrainSchedule = TrainSchedule(steps=240, batch_size=8, seq_len=128, lr=4e-3)
    draft_train: TrainSchedule = TrainSchedule(steps=300, batch_size=32, seq_len=128, lr=3e-3)
    distill_sequences: int = 128  # target greedy continuations the draft learns from
    distill_prompt_len: int = 32
    distill_new_tokens: int = 96
    eval_prompts: int = 32  # held-out prompts for the acceptance estimate
    eval_new_tokens: int = 64
    max_position_embeddings: int = 1024
    medusa: MedusaSettings = field(default_factory=MedusaSettings)
    seed: int = 0

    def family_key(self) -> str:
        """Hash of what shapes tokenizer, target and draft (not the Medusa heads)."""
        d = dataclasses.asdict(self)
        d.pop("medusa")
        return _hash({"settings": d, **_environment()})

    def medusa_key(self) -> str:
        return _hash({"family": self.family_key(), "medusa": dataclasses.asdict(self.medusa)})


# Tiny sizes and a handful of steps: proves the pipeline in tests, trains nothing useful.
MICRO = DemoSettings(
    corpus_bytes=40_000,
    file_cap_bytes=4_000,
    vocab_size=300,
    target=ModelShape(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64),
    draft=ModelShape(hidden_size=16, num_layers=1, num_heads=1, num_kv_heads=1, intermediate_size=32),
    target_train=TrainSchedule(steps=2, batch_size=2, seq_len=32, lr=1e-3, warmup=1),
    draft_train=TrainSchedule(steps=2, batch_size=2, seq_len=32, lr=1e-3, warmup=1),
    distill_sequences=4,
    distill_prompt_len=8,
    distill_new_tokens=8,
    eval_prompts=2,
    eval_new_tokens=8,
    max_position_embeddings=1024,  # RoPE only (no learned positions): free, and the demo specs fit
    medusa=MedusaSettings(steps=2, batch_size=2, seq_len=32),  # 4 heads, as examples/demo/medusa.yaml says
)


@dataclass(frozen=True)
class DemoFamily:
    """Where the built family lies (all absolute paths)."""

    root: Path  # CACHE/<family key>
    tokenizer: Path
    target: Path
    draft: Path
    train_text: Path  # JSONL, one {"text": ...} per training chunk (train-medusa's --data)
    prompts: Path  # JSONL, one {"prompt": ...} per held-out prompt (tune / bench --prompts)
    metrics: dict
    medusa_heads: Path | None = None  # None until Medusa heads are built


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _environment() -> dict:
    return {"python": sys.version.split()[0], "torch": torch.__version__, "recipe": RECIPE_VERSION}


def _hash(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


# ---------------------------------------------------------------- text


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def corpus_split(settings: DemoSettings, *, stdlib: Path | None = None) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts): capped file prefixes in a fixed sorted order."""
    files = sorted((stdlib or stdlib_dir()).glob("*.py"))
    if len(files) < HELD_OUT_EVERY:
        raise SpecbuildError(
            "too few standard-library sources for the demo corpus",
            expected=f"at least {HELD_OUT_EVERY} .py files in {stdlib or stdlib_dir()}",
            found=f"{len(files)} files",
            fix="run the demo with a CPython that ships its standard library sources",
        )
    train: list[str] = []
    held: list[str] = []
    total = 0
    for i, path in enumerate(files):
        text = path.read_text(encoding="utf-8", errors="replace")[: settings.file_cap_bytes]
        if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1:
            held.append(text)
        elif total < settings.corpus_bytes:
            train.append(text[: settings.corpus_bytes - total])
            total += len(train[-1])
    return train, held


def _encode_stream(tokenizer, texts: list[str]):
    ids: list[int] = []
    for text in texts:
        ids.extend(tokenizer.encode(text + "\n\n", add_special_tokens=False))
    return torch.tensor(ids, dtype=torch.long)  # [N]


def _windows(stream, n: int, length: int, generator):
    """n random windows of `length` tokens from a 1-D stream."""
    starts = torch.randint(0, len(stream) - length, (n,), generator=generator)
    return torch.stack([stream[s : s + length] for s in starts.tolist()])  # [n, length]


# ---------------------------------------------------------------- models


def _new_model(shape: ModelShape, tokenizer, settings: DemoSettings, seed: int):
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=settings.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rms_norm_eps=1e-6,
        initializer_range=0.02,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # A fast start for a few hundred CPU steps: every block's output projection starts at zero, so
        # the deep model begins as embedding -> head and learns bigrams at once instead of sitting on
        # the unigram plateau (the SkipInit / zero-init-residual idea); unit-variance embeddings give
        # the residual stream a useful scale from step one. Measured here: loss 4.3 vs 5.0 after 50 steps.
        for name, param in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.zero_()
        model.get_input_embeddings().weight.normal_(0.0, 1.0)
    return model


def _lr_at(step: int, sched: TrainSchedule) -> float:
    if step < sched.warmup:
        return sched.lr * (step + 1) / sched.warmup
    frac = (step - sched.warmup) / max(1, sched.steps - sched.warmup)
    return sched.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_lm(
    model, batches: Callable[[int], object], sched: TrainSchedule, *, label: str, log: Callable[[str], None]
) -> float:
    """Plain next-token training; `batches(step)` returns token ids [B, T]. Returns the last loss."""
    opt = torch.optim.AdamW(model.parameters(), lr=sched.lr, betas=(0.9, 0.95), weight_decay=0.01)
    model.train()
    t0, c0 = time.time(), time.process_time()
    loss_val = float("nan")
    for step in range(sched.steps):
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, sched)
        ids = batches(step)  # [B, T]
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_val = float(loss.detach())
        if step % 20 == 0 or step == sched.steps - 1:
            log(
                f"  {label}: step {step + 1}/{sched.steps}  loss {loss_val:.3f}  ({time.time() - t0:.0f}s, cpu {time.process_time() - c0:.0f}s)"
            )
    model.eval()
    return loss_val


def greedy_continue(model, prompts, new_tokens: int, *, chunk: int = 128):
    """The model's greedy continuation of equal-length prompts [B, P] -> [B, P + new_tokens]."""
    outs = []
    with torch.no_grad():
        for part in prompts.split(chunk):
            out = model.generate(
                input_ids=part,
                attention_mask=torch.ones_like(part),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=model.config.pad_token_id,
            )
            outs.append(out)  # [b, P + new_tokens]
    return torch.cat(outs)


def acceptance_profile(target_seqs, draft, prompt_len: int, max_k: int = 8) -> dict:
    """Greedy chain acceptance of `draft` on the target's own greedy sequences [B, P + N].

    Under greedy speculation the output is exactly the target's greedy text, so the draft's
    teacher-forced argmax at each position says whether its proposal there would be accepted; a
    chain of K accepts the run of consecutive matches (capped at K) plus the target's bonus token.
    """
    with torch.no_grad():
        logits = draft(input_ids=target_seqs).logits  # [B, P+N, V]
    predicted = logits[:, prompt_len - 1 : -1].argmax(-1)  # [B, N]: draft's guess for each generated token
    match = (predicted == target_seqs[:, prompt_len:]).tolist()  # B x N bools
    result = {"alpha_token": float(torch.tensor(match, dtype=torch.float).mean())}
    for k in range(1, max_k + 1):
        passes = emitted = 0
        for row in match:
            i = 0
            while i < len(row):
                run = 0
                while run < k and i + run < len(row) and row[i + run]:
                    run += 1
                passes += 1
                emitted += run + 1
                i += run + 1
        result[f"tokens_per_pass_k{k}"] = emitted / passes
    return result


# ---------------------------------------------------------------- the build


def build_family(
    settings: DemoSettings = DemoSettings(),
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
    stream = _encode_stream(tokenizer, train_texts)  # [N]
    held = _encode_stream(tokenizer, held_texts)  # [M]
    _write_jsonl(out / "train.jsonl", "text", _chunks(train_texts, 2000))
    timings["tokenizer_s"] = time.time() - t
    log(f"  corpus: {len(train_texts)} stdlib files, {len(stream)} training tokens, vocab {len(tokenizer)}")

    gen = torch.Generator().manual_seed(settings.seed)
    t = time.time()
    target = _new_model(settings.target, tokenizer, settings, settings.seed + 1)
    ts = settings.target_train
    target_loss = train_lm(
        target, lambda _: _windows(stream, ts.batch_size, ts.seq_len, gen), ts, label="target", log=log
    )
    timings["target_s"] = time.time() - t

    t = time.time()
    prompts = _windows(stream, settings.distill_sequences, settings.distill_prompt_len, gen)  # [S, P]
    distill = greedy_continue(target, prompts, settings.distill_new_tokens)  # [S, P+N]
    timings["distill_data_s"] = time.time() - t

    t = time.time()
    draft = _new_model(settings.draft, tokenizer, settings, settings.seed + 2)
    ds = settings.draft_train
    length = min(ds.seq_len, distill.shape[1])

    def draft_batch(step: int):
        # Half real text, half the target's own greedy text: the draft learns what the target says.
        real = _windows(stream, ds.batch_size - ds.batch_size // 2, length, gen)  # [B/2, T]
        rows = torch.randint(0, len(distill), (ds.batch_size // 2,), generator=gen)
        offset = int(torch.randint(0, distill.shape[1] - length + 1, (1,), generator=gen))
        synthetic = distill[rows, offset : offset + length]  # [B/2, T]
        return torch.cat([real, synthetic])  # [B, T]

    draft_loss = train_lm(draft, draft_batch, ds, label="draft", log=log)
    timings["draft_s"] = time.time() - t

    t = time.time()
    eval_prompts = _windows(held, settings.eval_prompts, settings.distill_prompt_len, gen)  # [E, P]
    eval_seqs = greedy_continue(target, eval_prompts, settings.eval_new_tokens)  # [E, P+N]
    profile = acceptance_profile(eval_seqs, draft, settings.distill_prompt_len)
    timings["eval_s"] = time.time() - t

    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(str(out / name), safe_serialization=True)
        tokenizer.save_pretrained(str(out / name))
    prompt_texts = [tokenizer.decode(p) for p in _windows(held, 16, 48, gen)]
    _write_jsonl(out / "prompts.jsonl", "prompt", prompt_texts)
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
    settings: DemoSettings = DemoSettings(),
    *,
    cache: Path = DEFAULT_CACHE,
    log: Callable[[str], None] = print,
    specbuild: str | None = None,
) -> Path | None:
    """Train Medusa heads on the target with `specbuild train-medusa` (cached); None if unavailable."""
    out = (Path(cache) / f"medusa-{settings.medusa_key()}").resolve()
    if (out / MANIFEST).is_file():
        log(f"demo Medusa heads cached at {out}")
        return out
    exe = specbuild or str(Path(sys.executable).with_name("specbuild"))
    m = settings.medusa
    argv = [
        exe, "train-medusa", str(family.target), "--data", str(family.train_text), "--out", str(out),
        "--num-heads", str(m.num_heads), "--num-layers", str(m.num_layers), "--steps", str(m.steps),
        "--batch-size", str(m.batch_size), "--seq-len", str(m.seq_len), "--lr", str(m.lr),
    ] + (["--self-distill"] if m.self_distill else [])  # fmt: skip
    probe = subprocess.run([exe, "train-medusa", "--help"], capture_output=True, text=True)
    if probe.returncode != 0:
        log("  `specbuild train-medusa` is not available in this checkout; skipping the Medusa heads")
        return None
    log("$ " + " ".join(argv))
    done = subprocess.run(argv)
    if done.returncode != 0:
        raise SpecbuildError(
            "training the demo Medusa heads failed",
            expected="`specbuild train-medusa` to exit 0",
            found=f"exit code {done.returncode}",
            fix="see the output above; rerun `make demo` after fixing it",
        )
    return out


def link_current(
    family: DemoFamily, medusa_heads: Path | None, *, cache: Path = DEFAULT_CACHE
) -> dict[str, Path]:
    """Point the stable names cache/{target,draft,tokenizer,prompts.jsonl,medusa_heads} at this build.

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


def _chunks(texts: list[str], size: int) -> list[str]:
    return [
        text[i : i + size] for text in texts for i in range(0, len(text), size) if text[i : i + size].strip()
    ]


def _write_jsonl(path: Path, key: str, items: list[str]) -> None:
    path.write_text("".join(json.dumps({key: item}) + "\n" for item in items))


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
    parser.add_argument(
        "--threads", type=int, default=cpu_count(), help="torch threads (default: the usable cores)"
    )
    args = parser.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # our lines and the commands' output stay in order in a log
    torch.set_num_threads(args.threads)
    settings = MICRO if args.micro else DemoSettings()
    family = build_family(settings, cache=args.cache)
    heads = None if args.no_medusa else build_medusa(family, settings, cache=args.cache)
    link_current(family, heads, cache=args.cache)
    print(json.dumps(family.metrics, indent=2))


if __name__ == "__main__":
    main()
