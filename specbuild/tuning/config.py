"""Options of `train-medusa`, `train-eagle3` and `tune` (torch-free: the CLI reads the defaults at import).

Each default is declared here once; the Typer options take theirs from these dataclasses.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class TrainConfig:
    model: str  # HF base model folder or cached hub id (frozen during training)
    data: Path  # .txt (one document per non-empty line) or .jsonl (field "text" or "prompt")
    out: Path  # final heads folder (HF Medusa format)
    num_heads: int = 4
    num_layers: int = 1  # ResBlocks per head
    steps: int = 200
    lr: float = 1e-3  # AdamW peak; Medusa-1 used 1e-3 with warmup + cosine decay
    batch_size: int = 8
    seq_len: int = 128  # tokens per training window
    self_distill: bool = False  # train on the base model's own greedy continuations of the prompts
    distill_new_tokens: int | None = None  # None: fill each window (seq_len minus the prompt)
    resume: bool = False
    checkpoint_every: int = 50  # steps; 0 disables checkpoints
    seed: int = 0
    topk: int = 5  # the k of the reported top-k accuracy
    head_decay: float = 0.8  # loss weight of head h is head_decay**h (deeper heads matter less)
    heldout_fraction: float = 0.1  # of the training windows, kept for the accuracy report
    max_eval_windows: int = 64  # held-out windows the accuracy report runs on (two passes of the base each)
    warmup_steps: int | None = None  # None: 5% of steps
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    force: bool = False  # replace an existing --out

    @property
    def checkpoint_dir(self) -> Path:
        """Where resumable checkpoints live: beside --out, so an interrupted run keeps them."""
        return self.out.parent / f"{self.out.name}.checkpoints"

    def fingerprint(self) -> dict[str, Any]:
        """The options a resumed run must share with the run that wrote the checkpoint."""
        keep = (
            "num_heads",
            "num_layers",
            "lr",
            "batch_size",
            "seq_len",
            "self_distill",
            "distill_new_tokens",
            "seed",
            "head_decay",
            "heldout_fraction",
        )
        d = {k: getattr(self, k) for k in keep}
        d["model"] = str(self.model)
        return d

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: str(v) if isinstance(v, Path) else v for k, v in d.items()}


def default(cls: type, name: str) -> Any:
    """The declared default of a dataclass field (for Typer options)."""
    return {f.name: f.default for f in dataclasses.fields(cls)}[name]


@dataclass(frozen=True)
class Eagle3TrainConfig:
    """Options of `train-eagle3` (tuning/eagle3_train.py)."""

    model: str  # the target: HF folder or cached hub id (frozen)
    data: Path  # prompts: .txt (one per non-empty line) or .jsonl (field "text" or "prompt")
    out: Path  # the draft folder (HF EAGLE-3 layout)
    steps: int = 300
    lr: float = 3e-3  # AdamW peak, linear warmup then cosine decay
    batch_size: int = 8  # sequences (prompt + answer) per step
    seq_len: int = 128  # tokens per sequence: the prompt's last seq_len // 2, then the answer
    new_tokens: int | None = None  # answer tokens per prompt (None: seq_len minus the prompt part)
    regenerate: bool = True  # train on the target's own greedy answers (else on the texts as they are)
    ttt_steps: int = 3  # unrolled drafting steps of the training-time test
    step_decay: float = 0.8  # loss weight of TTT step j is step_decay**j
    draft_vocab_size: int = 4096  # most frequent answer tokens; capped at the target's vocabulary
    layers: tuple[int, ...] | None = None  # captured target layers (0-based outputs); None: TRT-LLM default
    init_layer: int | None = None  # target layer the draft layer starts from; None: after the top capture
    resume: bool = False
    checkpoint_every: int = 50  # steps; 0 disables checkpoints
    seed: int = 0
    heldout_fraction: float = 0.1  # of the prompts, kept for the acceptance report
    eval_depth: int = 5  # draft positions the held-out acceptance report measures
    warmup_steps: int | None = None  # None: 5% of steps
    device: str = "auto"
    force: bool = False

    @property
    def checkpoint_dir(self) -> Path:
        return self.out.parent / f"{self.out.name}.checkpoints"

    def fingerprint(self) -> dict[str, Any]:
        """The options a resumed run must share with the run that wrote the checkpoint."""
        keep = (
            "lr",
            "batch_size",
            "seq_len",
            "new_tokens",
            "regenerate",
            "ttt_steps",
            "step_decay",
            "draft_vocab_size",
            "layers",
            "init_layer",
            "seed",
            "heldout_fraction",
            "warmup_steps",
        )
        d = {k: getattr(self, k) for k in keep}
        d["layers"] = list(self.layers) if self.layers is not None else None
        d["model"] = str(self.model)
        return d

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {
            k: str(v) if isinstance(v, Path) else list(v) if isinstance(v, tuple) else v for k, v in d.items()
        }
