"""`specbuild train-eagle3`: an EAGLE-3 draft for a frozen target, trained with the training-time test.

Shape legend: B sequences in a batch, T tokens, A = T - 1 anchors, H hidden, V / Vd target / draft vocab.

1. The target answers the prompts greedily (the regenerated data EAGLE-3 trains on; tuning/data.py
   `regenerated`, cached); a seeded tenth of the prompts is held out for the report.
2. The draft vocabulary is the Vd most frequent answer tokens (eagle3_data.select_vocab; d2t / t2d).
3. One target pass per sequence captures the states of the aux layers, its final normed hidden and its
   argmax into safetensors shards (eagle3_data.CaptureStore): training reads a batch at a time.
4. Training: the TTT unroll (eagle3_draft.py), loss = sum_j decay^j * soft cross-entropy of step j against
   the target's next-token distribution over the draft vocabulary (its lm_head rows of the draft vocabulary,
   renormalised), on answer positions whose target argmax is in the draft vocabulary (SpecForge 0.2.0
   `_compute_target_p`: `position_mask = t2d[target argmax] * loss_mask`) / sum_j decay^j. Batches and the
   learning rate are pure functions of (seed, step), so a resumed run replays exactly the batches an
   uninterrupted one would have seen (checkpoints: tuning/checkpoint.py).
5. The report: per draft position j, the held-out greedy acceptance P(draft j right | drafts < j right)
   with the drafts fed back as drafting does (teacher forcing feeds the true token, which is the drafted
   one whenever the chain is still right), trained and at initialisation.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from specbuild.builder.resolve import resolve_model
from specbuild.core.errors import TrainingError
from specbuild.core.formats.eagle3 import Eagle3DraftConfig, check_aux_layers, default_aux_layers
from specbuild.core.formats.hf_config import HFModelConfig
from specbuild.core.formats.manifest import atomic_output_dir, sha256_file, write_manifest
from specbuild.tuning import checkpoint as ckpt
from specbuild.tuning.config import Eagle3TrainConfig
from specbuild.tuning.data import encode, read_texts, regenerated
from specbuild.tuning.eagle3_data import Captured, CaptureStore, select_vocab, vocab_maps
from specbuild.tuning.eagle3_draft import Eagle3TrainDraft
from specbuild.tuning.hf_base import BaseModel, load_base
from specbuild.tuning.progress import Reporter
from specbuild.tuning.train import batch_indices, lr_at

METRICS_FILE = "metrics.json"
MANIFEST_KIND = "eagle3_draft"
WEIGHTS_FILE = "model.safetensors"
# option -> (lowest, highest): each bounds memory or time of one run
_RANGES = {
    "steps": (1, 10_000_000),
    "batch_size": (1, 65536),
    "seq_len": (4, 1 << 20),
    "ttt_steps": (1, 32),
    "draft_vocab_size": (2, 1 << 22),
    "checkpoint_every": (0, 10_000_000),
    "seed": (0, 2**32 - 1),
    "eval_depth": (1, 32),
}
_NEW_TOKENS = (1, 1 << 16)


@dataclass(frozen=True)
class Eagle3TrainResult:
    out: Path
    steps: int
    resumed_from: int | None
    metrics: dict[str, Any]


@dataclass(frozen=True)
class Prepared:
    """Everything training reads: the target, the captured data, the draft vocabulary and the shapes."""

    base: BaseModel
    config: Eagle3DraftConfig
    train: CaptureStore
    heldout: CaptureStore
    used: torch.Tensor  # [Vd] ascending target ids of the draft vocabulary
    lm_rows: torch.Tensor  # [Vd,H] the target's lm_head rows of the draft vocabulary (frozen)
    t2d: torch.Tensor  # [V] bool


def train_eagle3(
    config: Eagle3TrainConfig, *, reporter: Reporter | None = None, on_step=None
) -> Eagle3TrainResult:
    """Train an EAGLE-3 draft for `config.model` and write it to `config.out` (HF EAGLE-3 layout).
    `on_step(step)` is called after each optimizer step (tests use it to simulate an interruption)."""
    rep = reporter or Reporter()
    _check_options(config)
    data = prepare(config, rep)
    torch.manual_seed(config.seed)
    draft = new_draft(data, config)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=config.lr, weight_decay=0.0)
    start, resumed_from, losses = _maybe_resume(config, draft, optimizer, rep)
    n = len(data.train)
    rep.start("train-eagle3", config.steps, start)
    for step in range(start, config.steps):
        batch = data.train.batch(
            batch_indices(step, n=n, batch_size=config.batch_size, seed=config.seed).tolist(),
            data.base.device,
        )
        loss, accuracy = ttt_loss(draft, batch, data, config)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        rep.advance("train-eagle3", 1, loss=losses[-1], **{f"acc{j}": a for j, a in enumerate(accuracy)})
        done = step + 1
        if config.checkpoint_every and done % config.checkpoint_every == 0 and done < config.steps:
            _save(config, draft, optimizer, done, losses)
        if on_step is not None:
            on_step(done)
    rep.stop("train-eagle3")
    rep.log("measuring the held-out acceptance per draft position")
    evaluated = data.heldout if len(data.heldout) else data.train
    torch.manual_seed(config.seed)
    metrics = {
        "steps": config.steps,
        "final_loss": losses[-1] if losses else None,
        "draft_vocab_size": int(data.used.numel()),
        "aux_layers": list(data.config.aux_layers or ()),
        "evaluated_on": "heldout" if len(data.heldout) else "train (no held-out prompt: too few prompts)",
        "acceptance": acceptance(draft, evaluated, data, config.eval_depth),
        "untrained_acceptance": acceptance(new_draft(data, config), evaluated, data, config.eval_depth),
    }
    out = _write_output(config, data, draft, metrics)
    shutil.rmtree(config.checkpoint_dir, ignore_errors=True)
    return Eagle3TrainResult(out=out, steps=config.steps, resumed_from=resumed_from, metrics=metrics)


# ---- data -----------------------------------------------------------------------------------------


def prepare(config: Eagle3TrainConfig, rep: Reporter) -> Prepared:
    base = load_base(config.model, device=config.device)
    hf = HFModelConfig.from_hf(base.folder)
    layers = check_aux_layers(
        config.layers if config.layers is not None else default_aux_layers(hf.num_hidden_layers),
        hf.num_hidden_layers,
        where="--layers",
    )
    prompts = encode(base.tokenizer, read_texts(config.data))
    perm = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(config.seed)).tolist()
    k = (
        0
        if len(prompts) < 2 or not config.heldout_fraction
        else max(1, round(len(prompts) * config.heldout_fraction))
    )
    splits = {"train": [prompts[i] for i in perm[k:]], "heldout": [prompts[i] for i in perm[:k]]}
    stores, seqs, starts = {}, {}, {}
    for name, group in splits.items():
        seqs[name], starts[name] = _sequences(config, base, group, rep)
    vocab = int(base.vocab_size)
    used = select_vocab(
        seqs["train"], starts["train"], vocab_size=vocab, draft_vocab_size=config.draft_vocab_size
    )
    for name in splits:
        stores[name] = CaptureStore.build(
            config.checkpoint_dir,
            base,
            seqs[name],
            starts[name],
            layers=layers,
            batch_size=config.batch_size,
            rep=rep,
            label=f"capture-{name}",
        )
    draft_config = Eagle3DraftConfig(
        architecture="LlamaForCausalLMEagle3",
        hidden_size=hf.hidden_size,
        target_hidden_size=hf.hidden_size,
        num_hidden_layers=1,
        num_attention_heads=hf.num_attention_heads,
        num_key_value_heads=hf.num_key_value_heads,
        head_dim=hf.head_dim,
        intermediate_size=hf.intermediate_size,
        vocab_size=vocab,
        draft_vocab_size=int(used.numel()),
        rms_norm_eps=hf.rms_norm_eps,
        rope_theta=hf.rope_theta,
        rope_scaling=hf.rope_scaling,
        max_position_embeddings=hf.max_position_embeddings,
        dtype=hf.dtype,
        aux_layers=layers,
    )
    lm_rows = base.lm_head_weight().float()[used.to(base.device)]  # [Vd,H]
    _, t2d = vocab_maps(used, vocab)
    rep.log(
        f"{len(stores['train'])} training and {len(stores['heldout'])} held-out answers; draft vocabulary "
        f"{used.numel()} of {vocab}; captured layers {list(layers)}"
    )
    return Prepared(
        base,
        draft_config,
        stores["train"],
        stores["heldout"],
        used.to(base.device),  # indexed by the draft's argmax, which lives on the target's device
        lm_rows,
        t2d.to(base.device),
    )


def _sequences(config: Eagle3TrainConfig, base: BaseModel, prompts: list[list[int]], rep: Reporter):
    """(prompt + answer token lists, where each answer starts)."""
    keep = max(1, config.seq_len // 2)
    if not prompts:
        return [], []
    if not config.regenerate:
        seqs = [p[: config.seq_len] for p in prompts]
        return seqs, [1] * len(seqs)  # every next token is learnt
    key = {"model": str(config.model), "seq_len": config.seq_len, "new_tokens": config.new_tokens}
    seqs = regenerated(
        base,
        prompts,
        key=key,
        cache_dir=config.checkpoint_dir if config.checkpoint_every else None,
        keep_prompt=keep,
        new_tokens=config.new_tokens or config.seq_len - keep,
        batch_size=config.batch_size,
        rep=rep,
    )
    return seqs, [min(len(p), keep) for p in prompts]


# ---- model, loss, report -------------------------------------------------------------------------


def new_draft(data: Prepared, config: Eagle3TrainConfig) -> Eagle3TrainDraft:
    """The draft at initialisation: target layer `init_layer` (default: the one after the top captured
    layer), the final norm and the lm_head rows of the draft vocabulary (Eagle3TrainDraft.init_from_target).
    """
    base = data.base
    draft = Eagle3TrainDraft(data.config, base.model.get_input_embeddings().weight.float())
    layers = base.model.get_decoder().layers
    index = (
        config.init_layer
        if config.init_layer is not None
        else min(max(data.config.aux_layers) + 1, len(layers) - 1)
    )
    layer = {k: v.float() for k, v in layers[index].state_dict().items()}
    draft.init_from_target(layer, base.model.get_decoder().norm.weight.float(), data.lm_rows)
    return draft.to(base.device)


def ttt_loss(draft: Eagle3TrainDraft, batch: Captured, data: Prepared, config: Eagle3TrainConfig):
    """(loss, per-step top-1 accuracy on the answer positions) of one batch (module docstring, 4.)."""
    steps = draft.unroll(batch.aux, batch.tokens, config.ttt_steps)  # [B,A,Vd] per step
    target = batch.last @ data.lm_rows.T  # [B,T,Vd] the target's logits over the draft vocabulary
    total, weights, accuracy = 0.0, 0.0, []
    for j, logits in enumerate(steps):
        t = batch.tokens.shape[1]
        pos = slice(1 + j, t)  # positions a + j of anchors a = 1..T-1-j
        lg = logits[:, : t - 1 - j]  # [B,A-j,Vd]
        answer = batch.answer[:, pos]  # [B,A-j]
        mask = answer & data.t2d[batch.top[:, pos]]
        ce = -(target[:, pos].softmax(-1) * lg.log_softmax(-1)).sum(-1)  # [B,A-j]
        loss = (ce * mask).sum() / mask.sum().clamp_min(1)
        total, weights = total + config.step_decay**j * loss, weights + config.step_decay**j
        right = (data.used[lg.argmax(-1)] == batch.top[:, pos]) & answer
        accuracy.append(float(right.sum()) / max(int(answer.sum()), 1))
    return total / weights, accuracy


@torch.no_grad()
def acceptance(draft: Eagle3TrainDraft, store: CaptureStore, data: Prepared, depth: int) -> list[float]:
    """Per draft position j < depth: held-out P(draft j right | drafts < j right), greedy (docstring, 5.)."""
    reached, right = [0] * depth, [0] * depth
    for at in range(0, len(store), 8):
        batch = store.batch(list(range(at, min(at + 8, len(store)))), data.base.device)
        steps = draft.unroll(batch.aux, batch.tokens, depth)
        t = batch.tokens.shape[1]
        alive = torch.ones(
            batch.tokens.shape[0], t - 1, dtype=torch.bool, device=batch.tokens.device
        )  # [B,A]
        for j, logits in enumerate(steps):
            p = torch.arange(1, t, device=alive.device) + j  # [A] position a + j
            inside = p <= t - 1
            pc = p.clamp(max=t - 1)
            ok = alive & inside & batch.answer[:, pc]
            guess = data.used[logits.argmax(-1)]  # [B,A] target ids
            hit = ok & (guess == batch.top[:, pc])
            reached[j] += int(ok.sum())
            right[j] += int(hit.sum())
            # the next step is fed the true token a + j + 1: it is the drafted one only where the data
            # agrees with the target's argmax (greedy regenerated data does)
            nxt = batch.tokens[:, (pc + 1).clamp(max=t - 1)]
            alive = hit & (nxt == batch.top[:, pc])
    return [r / max(n, 1) for r, n in zip(right, reached, strict=True)]


# ---- options, resume, output ----------------------------------------------------------------------


def _check_options(config: Eagle3TrainConfig) -> None:
    bad = [f"{n}={v}" for n, (low, high) in _RANGES.items() if not low <= (v := getattr(config, n)) <= high]
    if not (math.isfinite(config.lr) and 0 < config.lr <= 1.0):
        bad.append(f"lr={config.lr}")
    if not (math.isfinite(config.step_decay) and 0 < config.step_decay <= 1.0):
        bad.append(f"step_decay={config.step_decay}")
    if config.new_tokens is not None and not _NEW_TOKENS[0] <= config.new_tokens <= _NEW_TOKENS[1]:
        bad.append(f"new_tokens={config.new_tokens}")
    if not 0 <= config.heldout_fraction < 1:
        bad.append(f"heldout_fraction={config.heldout_fraction}")
    if bad:
        raise TrainingError(
            "impossible training options",
            expected=", ".join(f"{n} in {lo}..{hi}" for n, (lo, hi) in _RANGES.items())
            + f"; lr and step_decay in (0, 1]; new_tokens in {_NEW_TOKENS[0]}..{_NEW_TOKENS[1]} (or unset); "
            "heldout_fraction in [0, 1)",
            found=", ".join(bad),
            fix="see `specbuild train-eagle3 --help`",
        )
    inputs = {"target model": resolve_model(config.model, what="target model"), "prompts": config.data}
    ckpt.check_outputs(config.out, config.checkpoint_dir, inputs, force=config.force, resume=config.resume)


def _save(
    config: Eagle3TrainConfig, draft: Eagle3TrainDraft, optimizer, step: int, losses: list[float]
) -> None:
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state()
    info = {"fingerprint": config.fingerprint(), "losses": losses}
    ckpt.save_checkpoint(
        config.checkpoint_dir,
        ckpt.TrainState(
            step=step, heads=draft.hf_state_dict(), optimizer=optimizer.state_dict(), rng=rng, info=info
        ),
    )


def _maybe_resume(config: Eagle3TrainConfig, draft: Eagle3TrainDraft, optimizer, rep: Reporter):
    if not config.resume:
        return 0, None, []
    path = ckpt.latest_checkpoint(config.checkpoint_dir)
    if path is None:
        rep.log(f"--resume: no checkpoint in {config.checkpoint_dir}; starting from step 0")
        return 0, None, []
    state = ckpt.load_checkpoint(path)
    if state.info.get("fingerprint") != json.loads(json.dumps(config.fingerprint())):
        raise TrainingError(
            f"checkpoint {path} was written with other options",
            expected=json.dumps(config.fingerprint()),
            found=json.dumps(state.info.get("fingerprint")),
            fix="resume with the same options, or delete the checkpoints",
        )
    if state.step > config.steps:
        raise TrainingError(
            f"checkpoint {path} is at step {state.step}",
            expected=f"--steps >= {state.step}",
            found=str(config.steps),
            fix=f"pass --steps {state.step} or more",
        )
    try:
        draft.load_hf_state_dict(state.heads)
    except (KeyError, RuntimeError) as exc:
        raise TrainingError(
            f"checkpoint {path} does not hold this draft",
            expected="the draft's tensors",
            found=str(exc)[:200],
            fix="delete the checkpoints",
        ) from None
    optimizer.load_state_dict(state.optimizer)
    torch.set_rng_state(state.rng["cpu"])
    if "cuda" in state.rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(state.rng["cuda"])
    rep.log(f"resumed from {path} (step {state.step})")
    return state.step, state.step, list(state.info.get("losses", []))


def recipe_digest(config: Eagle3TrainConfig) -> str:
    """sha256 of what shapes the draft: the options a resume must share and the prompts file's bytes."""
    try:
        data = sha256_file(config.data)
    except OSError as exc:
        raise TrainingError(
            str(exc), expected="a readable prompts file", found=str(config.data), fix="check --data"
        ) from None
    blob = json.dumps({"options": config.fingerprint(), "steps": config.steps, "data": data}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _write_output(config: Eagle3TrainConfig, data: Prepared, draft: Eagle3TrainDraft, metrics: dict) -> Path:
    d2t, t2d = vocab_maps(data.used.cpu(), data.config.vocab_size)
    tensors = {k: v.to(data.base.stored_dtype).contiguous().cpu() for k, v in draft.hf_state_dict().items()}
    tensors |= {"d2t": d2t, "t2d": t2d}
    with atomic_output_dir(
        config.out, force=config.force, inputs={"target model": data.base.folder, "prompts": config.data}
    ) as tmp:
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(data.config.to_hf(), indent=2) + "\n")
        (tmp / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
        write_manifest(
            tmp,
            kind=MANIFEST_KIND,
            base_model=str(data.base.folder),
            options=config.to_dict(),
            recipe=recipe_digest(config),
            metrics=metrics,
        )
    return config.out
