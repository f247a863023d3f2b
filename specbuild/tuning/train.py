"""Medusa-1 training: a frozen HF base model, trainable heads, resumable checkpoints, accuracy report.

The base model runs once per batch under no_grad to give the last hidden state; only the heads get
gradients. Loss = sum_h head_decay**h * CE(head h at t, token t+h+2) / sum_h head_decay**h.
Batches and the learning rate are pure functions of (seed, step), so a resumed run replays exactly
the batches an uninterrupted one would have seen.

Shape legend: B batch, T tokens per window, D hidden size, V vocabulary, H heads, N windows.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specbuild.builder.resolve import resolve_model
from specbuild.core.errors import TrainingError
from specbuild.core.formats.manifest import atomic_output_dir, write_manifest
from specbuild.tuning import checkpoint as ckpt
from specbuild.tuning.config import TrainConfig
from specbuild.tuning.data import encode, pack_windows, read_texts, regenerated, split_heldout
from specbuild.tuning.heads import HeadsConfig, MedusaHeads, save_heads
from specbuild.tuning.hf_base import BaseModel, load_base
from specbuild.tuning.progress import Reporter

METRICS_FILE = "metrics.json"
MANIFEST_KIND = "medusa_heads"
# option -> (lowest, highest): each bounds memory or time of one run
_RANGES = {
    "num_heads": (1, 64),
    "num_layers": (1, 64),
    "steps": (1, 10_000_000),
    "batch_size": (1, 65536),
    "seq_len": (1, 1 << 20),
    "topk": (1, 1000),
    "checkpoint_every": (0, 10_000_000),
    "seed": (0, 2**32 - 1),
}  # seeds derive from seed * 1_000_003 (< 2**63)
_DISTILL_NEW_TOKENS = (1, 1 << 16)  # greedy tokens per prompt under --self-distill (generation time)
_FLOAT_MAX = {"lr": 1.0, "head_decay": 1.0}  # AdamW peak learning rate; loss weight of head h is decay**h


@dataclass(frozen=True)
class TrainResult:
    out: Path
    steps: int
    resumed_from: int | None  # the checkpoint step a --resume run started from
    metrics: dict[str, Any]


def train_medusa(config: TrainConfig, *, reporter: Reporter | None = None, on_step=None) -> TrainResult:
    """Train Medusa heads on `config.model` and write them to `config.out` (HF Medusa format).

    `on_step(step)` is called after each optimizer step (tests use it to simulate an interruption).
    """
    rep = reporter or Reporter()
    _check_options(config)
    base = load_base(config.model, device=config.device)
    max_pos = getattr(base.model.config, "max_position_embeddings", None)
    if max_pos is not None and config.seq_len > max_pos:
        raise TrainingError(
            "--seq-len is longer than the base model's context",
            expected=f"at most {max_pos} (max_position_embeddings)",
            found=str(config.seq_len),
            fix=f"pass --seq-len {min(max_pos, 512)}",
        )
    windows = _training_windows(config, base, rep)
    train_w, heldout_w = split_heldout(windows, fraction=config.heldout_fraction, seed=config.seed)
    rep.log(
        f"{train_w.shape[0]} training windows and {heldout_w.shape[0]} held-out windows of "
        f"{windows.shape[1]} tokens"
    )

    torch.manual_seed(config.seed)
    heads = new_heads(base, config)
    optimizer = torch.optim.AdamW(heads.parameters(), lr=config.lr, weight_decay=0.0)
    start, resumed_from, losses = _maybe_resume(config, heads, optimizer, base, rep)

    rep.start("train", config.steps, start)
    for step in range(start, config.steps):
        ids = train_w[
            batch_indices(step, n=train_w.shape[0], batch_size=config.batch_size, seed=config.seed)
        ]  # [B, T]
        loss = _train_step(
            heads, optimizer, base, ids.to(base.device), lr=lr_at(step, config), decay=config.head_decay
        )
        losses.append(loss)
        rep.advance("train", 1, loss=loss)
        done = step + 1
        if config.checkpoint_every and done % config.checkpoint_every == 0 and done < config.steps:
            _save(config, heads, optimizer, done, losses)
        if on_step is not None:
            on_step(done)
    rep.stop("train")

    rep.log("measuring per-head accuracy on the held-out split")
    eval_w = (heldout_w if heldout_w.shape[0] else train_w)[
        : config.max_eval_windows
    ]  # [<=max_eval_windows, T]
    untrained = head_accuracy(base, new_heads(base, config), eval_w, topk=config.topk)
    trained = head_accuracy(base, heads, eval_w, topk=config.topk)
    metrics = {
        "topk": config.topk,
        "heldout_windows": int(heldout_w.shape[0]),
        "heldout_tokens": int(eval_w.numel()),
        "evaluated_on": "heldout" if heldout_w.shape[0] else "train (no held-out window: too little data)",
        "steps": config.steps,
        "final_loss": losses[-1] if losses else None,
        "heads": [
            {
                "head": h,
                "predicts": f"t+{h + 2}",
                **trained[h],
                **{f"untrained_{k}": v for k, v in untrained[h].items() if k != "positions"},
            }
            for h in range(config.num_heads)
        ],
    }
    out = _write_output(config, base, heads, metrics)
    shutil.rmtree(config.checkpoint_dir, ignore_errors=True)
    return TrainResult(out=out, steps=config.steps, resumed_from=resumed_from, metrics=metrics)


# ---- pure schedule ---------------------------------------------------------------------------------


def lr_at(step: int, config: TrainConfig) -> float:
    """Linear warmup, then cosine decay to 0 at config.steps (a function of the step only)."""
    warm = config.warmup_steps if config.warmup_steps is not None else max(1, config.steps // 20)
    if step < warm:
        return config.lr * (step + 1) / warm
    span = max(1, config.steps - warm)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * min(1.0, (step - warm) / span)))


def batch_indices(step: int, *, n: int, batch_size: int, seed: int) -> torch.Tensor:
    """Window indices of batch `step`: consecutive slices of one seeded permutation per epoch."""
    out = []
    for pos in range(step * batch_size, (step + 1) * batch_size):
        epoch, i = divmod(pos, n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch))
        out.append(int(perm[i]))
    return torch.tensor(out, dtype=torch.long)  # [B]


# ---- model pieces ----------------------------------------------------------------------------------


def new_heads(base: BaseModel, config: TrainConfig) -> MedusaHeads:
    cfg = HeadsConfig(
        num_heads=config.num_heads,
        num_layers=config.num_layers,
        hidden_size=base.hidden_size,
        vocab_size=base.vocab_size,
        hidden_act=base.hidden_act,
        base_model_name_or_path=str(base.folder),
    )
    heads = MedusaHeads(cfg)
    heads.init_from_base(base.lm_head_weight())
    return heads.to(base.device)


def head_losses(heads: MedusaHeads, hidden: torch.Tensor, ids: torch.Tensor) -> list[torch.Tensor]:
    """Cross-entropy of each head against the token h+2 positions ahead (one scalar per head)."""
    out = []
    t = ids.shape[1]
    for h, head in enumerate(heads.heads):
        shift = h + 2
        if t <= shift:
            break
        logits = head(hidden[:, : t - shift])  # [B, T-shift, V]
        out.append(
            torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]).float(), ids[:, shift:].reshape(-1)
            )
        )
    return out


def _train_step(heads, optimizer, base: BaseModel, ids: torch.Tensor, *, lr: float, decay: float) -> float:
    hidden = base.hidden(ids)  # [B, T, D] float32, no grad
    losses = head_losses(heads, hidden, ids)
    weights = [decay**h for h in range(len(losses))]
    loss = sum(w * head for w, head in zip(weights, losses, strict=True)) / sum(weights)
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(heads.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def head_accuracy(
    base: BaseModel, heads: MedusaHeads, windows: torch.Tensor, *, topk: int, batch_size: int = 8
) -> list[dict[str, float]]:
    """Per head: fraction of positions whose true token t+h+2 is the head's top-1 / in its top-k."""
    hits1 = [0] * len(heads.heads)
    hitsk = [0] * len(heads.heads)
    count = [0] * len(heads.heads)
    for s in range(0, windows.shape[0], batch_size):
        ids = windows[s : s + batch_size].to(base.device)  # [B, T]
        hidden = base.hidden(ids)  # [B, T, D]
        t = ids.shape[1]
        for h, head in enumerate(heads.heads):
            shift = h + 2
            if t <= shift:
                continue
            top = head(hidden[:, : t - shift]).topk(topk, dim=-1).indices  # [B, T-shift, k]
            truth = ids[:, shift:].unsqueeze(-1)  # [B, T-shift, 1]
            hits1[h] += int((top[..., :1] == truth).sum())
            hitsk[h] += int((top == truth).any(-1).sum())
            count[h] += truth.numel()
    return [
        {"top1": hits1[h] / max(1, count[h]), "topk": hitsk[h] / max(1, count[h]), "positions": count[h]}
        for h in range(len(heads.heads))
    ]


# ---- data, resume, output ----------------------------------------------------------------------------


def _check_options(config: TrainConfig) -> None:
    bad = [f"{n}={v}" for n, (low, high) in _RANGES.items() if not low <= (v := getattr(config, n)) <= high]
    floats = {"lr": config.lr, "head_decay": config.head_decay}
    bad += [f"{n}={v}" for n, v in floats.items() if not (math.isfinite(v) and 0 < v <= _FLOAT_MAX[n])]
    low, high = _DISTILL_NEW_TOKENS
    if config.distill_new_tokens is not None and not low <= config.distill_new_tokens <= high:
        bad.append(f"distill_new_tokens={config.distill_new_tokens}")
    if bad or config.seq_len < config.num_heads + 3:
        raise TrainingError(
            "impossible training options",
            expected=", ".join(f"{n} in {lo}..{hi}" for n, (lo, hi) in _RANGES.items())
            + f", distill_new_tokens in {low}..{high} (or unset)"
            + "; seq_len >= num_heads + 3; lr in (0, 1]; head_decay in (0, 1] (finite numbers)",
            found=", ".join(bad) or f"seq_len={config.seq_len} with num_heads={config.num_heads}",
            fix="see `specbuild train-medusa --help`",
        )

    inputs = {"base model": resolve_model(config.model, what="base model"), "training data": config.data}
    ckpt.check_outputs(config.out, config.checkpoint_dir, inputs, force=config.force, resume=config.resume)


def _training_windows(config: TrainConfig, base: BaseModel, rep: Reporter) -> torch.Tensor:
    texts = read_texts(config.data)
    seqs = encode(base.tokenizer, texts)
    if config.self_distill:
        seqs = _self_distill(config, base, seqs, rep)
    sep = base.eos_ids[0] if base.eos_ids else None
    return pack_windows(seqs, seq_len=config.seq_len, separator=sep, min_len=config.num_heads + 3)


def _self_distill(
    config: TrainConfig, base: BaseModel, prompts: list[list[int]], rep: Reporter
) -> list[list[int]]:
    """prompt + greedy continuation per prompt; cached beside the checkpoints so --resume reuses it."""
    half = max(1, config.seq_len // 2)  # keep room for the continuation
    return regenerated(
        base,
        prompts,
        key=config.fingerprint(),
        cache_dir=config.checkpoint_dir if config.checkpoint_every else None,
        keep_prompt=half,
        new_tokens=config.distill_new_tokens or config.seq_len - half,
        batch_size=config.batch_size,
        rep=rep,
    )


def _save(config: TrainConfig, heads: MedusaHeads, optimizer, step: int, losses: list[float]) -> None:
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    info = {"fingerprint": config.fingerprint(), "losses": losses}
    ckpt.save_checkpoint(
        config.checkpoint_dir,
        ckpt.TrainState(
            step=step, heads=heads.hf_state_dict(), optimizer=optimizer.state_dict(), rng=rng, info=info
        ),
    )


def _maybe_resume(
    config: TrainConfig, heads: MedusaHeads, optimizer, base: BaseModel, rep: Reporter
) -> tuple[int, int | None, list[float]]:
    if not config.resume:
        return 0, None, []
    path = ckpt.latest_checkpoint(config.checkpoint_dir)
    if path is None:
        rep.log(f"--resume: no checkpoint in {config.checkpoint_dir}; starting from step 0")
        return 0, None, []
    state = ckpt.load_checkpoint(path)
    saved = state.info.get("fingerprint")
    if saved != json.loads(json.dumps(config.fingerprint())):
        raise TrainingError(
            f"checkpoint {path} was written with other options",
            expected=json.dumps(config.fingerprint()),
            found=json.dumps(saved),
            fix="resume with the same options (model, heads, lr, batch size, seq len, seed), or delete the "
            "checkpoints",
        )
    if state.step > config.steps:
        raise TrainingError(
            f"checkpoint {path} is at step {state.step}",
            expected=f"--steps >= {state.step}",
            found=str(config.steps),
            fix=f"pass --steps {state.step} or more",
        )
    heads.load_hf_state_dict({k: v.to(base.device) for k, v in state.heads.items()}, str(path))
    optimizer.load_state_dict(state.optimizer)
    torch.set_rng_state(state.rng["cpu"])
    if "cuda" in state.rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(state.rng["cuda"])
    rep.log(f"resumed from {path} (step {state.step})")
    return state.step, state.step, list(state.info.get("losses", []))


def _write_output(config: TrainConfig, base: BaseModel, heads: MedusaHeads, metrics: dict[str, Any]) -> Path:
    with atomic_output_dir(
        config.out, force=config.force, inputs={"base model": base.folder, "training data": config.data}
    ) as tmp:
        save_heads(heads, tmp, dtype=base.stored_dtype)
        (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
        write_manifest(
            tmp, kind=MANIFEST_KIND, base_model=str(base.folder), options=config.to_dict(), metrics=metrics
        )
    return config.out
