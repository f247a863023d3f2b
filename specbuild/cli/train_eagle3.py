"""`specbuild train-eagle3` (the tuning stage; beside train-medusa in cli/tuning.py, which is full).

Thin: builds an Eagle3TrainConfig and calls tuning/eagle3_train.py. Only typer and the torch-free config
module are imported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.common import INPUT, OUT_DIR, command, console
from specbuild.core.errors import TrainingError
from specbuild.tuning.config import Eagle3TrainConfig, default


def _d(name: str):
    return default(Eagle3TrainConfig, name)


@command("train-eagle3")
def train_eagle3_cmd(
    model: Annotated[
        str,
        typer.Argument(help="The target: a Hugging Face folder (or a cached hub id). Frozen."),
        INPUT("target model"),
    ],
    data: Annotated[
        Path,
        typer.Option(
            "--data",
            help='Prompts: a .txt file (one per non-empty line) or .jsonl (field "text" or "prompt"), in the '
            "form the target serves them (chat template applied).",
        ),
        INPUT("training data"),
    ],
    out: Annotated[
        Path,
        typer.Option(
            "--out",
            help="Output folder: the draft in the HF EAGLE-3 layout (config.json, model.safetensors), "
            "metrics.json, written atomically.",
        ),
        OUT_DIR,
    ],
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps.")] = _d("steps"),
    lr: Annotated[
        float,
        typer.Option("--lr", help="Peak AdamW learning rate (warmup over 5% of the steps, cosine decay)."),
    ] = _d("lr"),
    batch_size: Annotated[
        int, typer.Option("--batch-size", help="Sequences (prompt + answer) per step.")
    ] = _d("batch_size"),
    seq_len: Annotated[
        int,
        typer.Option("--seq-len", help="Tokens per sequence: the prompt's last SEQ_LEN/2, then the answer."),
    ] = _d("seq_len"),
    new_tokens: Annotated[
        int | None,
        typer.Option(
            "--new-tokens", help="Answer tokens the target generates per prompt (default: fill SEQ_LEN)."
        ),
    ] = _d("new_tokens"),
    regenerate: Annotated[
        bool,
        typer.Option(
            "--regenerate/--no-regenerate",
            help="Train on the target's own greedy answers to the prompts (EAGLE-3's regenerated data), "
            "or on the texts as they are.",
        ),
    ] = _d("regenerate"),
    ttt_steps: Annotated[
        int,
        typer.Option(
            "--ttt-steps", help="Drafting steps unrolled by the training-time test (draft tokens learnt)."
        ),
    ] = _d("ttt_steps"),
    step_decay: Annotated[
        float, typer.Option("--step-decay", help="Loss weight of unrolled step j is DECAY**j.")
    ] = _d("step_decay"),
    draft_vocab_size: Annotated[
        int,
        typer.Option(
            "--draft-vocab-size",
            help="The draft's vocabulary: the N most frequent answer tokens (d2t maps them).",
        ),
    ] = _d("draft_vocab_size"),
    layers: Annotated[
        str | None,
        typer.Option(
            "--layers",
            help="Captured target layers, comma-separated, 0-based layer outputs (TensorRT-LLM's "
            "eagle3_layers_to_capture). Default: 1, L//2-1, L-4.",
        ),
    ] = None,
    init_layer: Annotated[
        int | None,
        typer.Option(
            "--init-layer", help="Target layer the draft layer starts from (default: after the top capture)."
        ),
    ] = _d("init_layer"),
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from the latest checkpoint in OUT.checkpoints/.")
    ] = _d("resume"),
    checkpoint_every: Annotated[
        int,
        typer.Option(
            "--checkpoint-every",
            help="Save a resumable checkpoint every N steps into OUT.checkpoints/ (0: never; the answers and "
            "captured states are kept there too). Deleted after a successful run.",
        ),
    ] = _d("checkpoint_every"),
    seed: Annotated[int, typer.Option("--seed", help="Seed of the held-out split and the batch order.")] = _d(
        "seed"
    ),
    eval_depth: Annotated[
        int, typer.Option("--eval-depth", help="Draft positions the held-out acceptance report measures.")
    ] = _d("eval_depth"),
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")] = _d("device"),
    force: Annotated[bool, typer.Option("--force", help="Replace an existing OUT.")] = _d("force"),
) -> None:
    """Train an EAGLE-3 draft for a frozen target with the training-time test; writes the HF EAGLE-3 layout.

    The target answers the prompts, its states at three layers are captured, and one draft decoder layer
    learns to draft from them over a reduced vocabulary. Prints and saves (OUT/metrics.json) the held-out
    greedy acceptance of each draft position, trained and at initialisation.
    """
    from specbuild.tuning.eagle3_train import train_eagle3
    from specbuild.tuning.progress import RichReporter

    config = Eagle3TrainConfig(
        model=model,
        data=data,
        out=out,
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        seq_len=seq_len,
        new_tokens=new_tokens,
        regenerate=regenerate,
        ttt_steps=ttt_steps,
        step_decay=step_decay,
        draft_vocab_size=draft_vocab_size,
        layers=parse_layers(layers),
        init_layer=init_layer,
        resume=resume,
        checkpoint_every=checkpoint_every,
        seed=seed,
        eval_depth=eval_depth,
        device=device,
        force=force,
    )
    with RichReporter() as reporter:
        result = train_eagle3(config, reporter=reporter)
    con = console()
    con.print(
        f"EAGLE-3 draft written to {result.out}"
        + (f" (resumed from step {result.resumed_from})" if result.resumed_from else "")
    )
    con.print(format_acceptance(result.metrics))


def parse_layers(text: str | None) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise TrainingError(
            "--layers is not a list of layer indices",
            expected="comma-separated integers, e.g. 1,14,26",
            found=text,
            fix="write the 0-based layer outputs to capture",
        ) from None


def format_acceptance(metrics: dict) -> str:
    lines = [
        f"held-out greedy acceptance ({metrics['evaluated_on']}; draft vocabulary "
        f"{metrics['draft_vocab_size']}, layers {metrics['aux_layers']}):",
        "  position  trained  untrained",
    ]
    for j, (a, u) in enumerate(zip(metrics["acceptance"], metrics["untrained_acceptance"], strict=True)):
        lines.append(f"  {j + 1:<8}  {a:.3f}    {u:.3f}")
    return "\n".join(lines)
