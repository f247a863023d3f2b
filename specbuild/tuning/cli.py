"""CLI commands of this stage: `train-medusa` and `tune` (registered on the root app by specbuild.cli).

Thin: each command builds a config object and calls one library function. Only typer and the
torch-free config module are imported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli_common import console, handle_errors
from specbuild.tuning.config import TrainConfig, default


def register(app: typer.Typer) -> None:
    """Add this stage's commands to `app`."""
    app.command("train-medusa")(train_medusa_cmd)


@handle_errors
def train_medusa_cmd(
    model: Annotated[str, typer.Argument(help="Base model: a Hugging Face folder (or a cached hub id). It stays frozen.")],
    data: Annotated[Path, typer.Option("--data", help='Training text: a .txt file (one document or prompt per non-empty line) or .jsonl (field "text" or "prompt").')],
    out: Annotated[Path, typer.Option("--out", help="Output folder for the heads (HF Medusa format: medusa_lm_head.safetensors + config.json), written atomically.")],
    num_heads: Annotated[int, typer.Option("--num-heads", help="Medusa heads; head h predicts token t+h+2.")] = default(TrainConfig, "num_heads"),
    num_layers: Annotated[int, typer.Option("--num-layers", help="ResBlocks per head.")] = default(TrainConfig, "num_layers"),
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps.")] = default(TrainConfig, "steps"),
    lr: Annotated[float, typer.Option("--lr", help="Peak AdamW learning rate (linear warmup over 5% of the steps, then cosine decay).")] = default(TrainConfig, "lr"),
    batch_size: Annotated[int, typer.Option("--batch-size", help="Windows per step.")] = default(TrainConfig, "batch_size"),
    seq_len: Annotated[int, typer.Option("--seq-len", help="Tokens per training window.")] = default(TrainConfig, "seq_len"),
    self_distill: Annotated[bool, typer.Option("--self-distill", help="Train on the base model's own greedy continuations of the --data prompts (heads stay faithful to the model being served).")] = default(TrainConfig, "self_distill"),
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the latest checkpoint in OUT.checkpoints/ (same options required).")] = default(TrainConfig, "resume"),
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every", help="Save a resumable checkpoint every N steps into OUT.checkpoints/ (0: never). Deleted after a successful run.")] = default(TrainConfig, "checkpoint_every"),
    seed: Annotated[int, typer.Option("--seed", help="Seed for the held-out split, batch order and initialisation.")] = default(TrainConfig, "seed"),
    topk: Annotated[int, typer.Option("--topk", help="k of the reported per-head top-k accuracy.")] = default(TrainConfig, "topk"),
    head_decay: Annotated[float, typer.Option("--head-decay", help="Loss weight of head h is DECAY**h.")] = default(TrainConfig, "head_decay"),
    device: Annotated[str, typer.Option("--device", help="auto (a CUDA GPU when present, else CPU), cpu, cuda or cuda:N.")] = default(TrainConfig, "device"),
    force: Annotated[bool, typer.Option("--force", help="Replace an existing OUT.")] = default(TrainConfig, "force"),
) -> None:
    """Train Medusa-1 heads on a frozen base model; writes the HF Medusa format that `convert --medusa` reads.

    Runs on the CPU for small models and on a CUDA GPU when one is present. Prints and saves (OUT/metrics.json) each head's top-1 / top-k accuracy on a held-out split, next to the accuracy of untrained heads.
    """
    from specbuild.tuning.progress import RichReporter
    from specbuild.tuning.train import train_medusa

    config = TrainConfig(
        model=model, data=data, out=out, num_heads=num_heads, num_layers=num_layers, steps=steps, lr=lr,
        batch_size=batch_size, seq_len=seq_len, self_distill=self_distill, resume=resume,
        checkpoint_every=checkpoint_every, seed=seed, topk=topk, head_decay=head_decay, device=device, force=force,
    )
    with RichReporter() as reporter:
        result = train_medusa(config, reporter=reporter)
    con = console()
    con.print(f"heads written to {result.out}" + (f" (resumed from step {result.resumed_from})" if result.resumed_from else ""))
    con.print(format_accuracy_table(result.metrics))


def format_accuracy_table(metrics: dict) -> str:
    k = metrics["topk"]
    lines = [f"held-out accuracy ({metrics['evaluated_on']}, {metrics['heldout_tokens']} tokens):", f"  head  predicts  top1    top{k}    untrained top1  untrained top{k}"]
    for h in metrics["heads"]:
        lines.append(f"  {h['head']:<4}  {h['predicts']:<8}  {h['top1']:.3f}   {h['topk']:.3f}    {h['untrained_top1']:.3f}           {h['untrained_topk']:.3f}")
    return "\n".join(lines)
