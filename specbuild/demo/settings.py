"""The demo family's settings: every number that shapes its models, and the hash that names the cache.

See models.py for what the family is and how it is built.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

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

    def train_options(self) -> list[str]:
        """These settings as `specbuild train-medusa` options (both demos run the command with them)."""
        opts = ["--num-heads", str(self.num_heads), "--num-layers", str(self.num_layers)]
        opts += ["--steps", str(self.steps), "--batch-size", str(self.batch_size)]
        opts += ["--seq-len", str(self.seq_len), "--lr", str(self.lr)]
        return opts + (["--self-distill"] if self.self_distill else [])


@dataclass(frozen=True)
class Eagle3Settings:
    """The demo's EAGLE-3 draft: `specbuild train-eagle3` on the target (its own greedy answers)."""

    prompts: int = 256  # the first training chunks; the target answers each (the regenerated data)
    steps: int = 200
    batch_size: int = 16
    seq_len: int = 128  # each prompt's last 64 tokens, then the target's 64-token answer
    lr: float = 3e-3
    ttt_steps: int = 3
    draft_vocab_size: int = 512  # the family's whole vocabulary (capped at the target's)
    layers: tuple[int, ...] | None = None  # None: TensorRT-LLM's default (1, L//2 - 1, L - 4)

    def train_options(self) -> list[str]:
        """These settings as `specbuild train-eagle3` options (both demos run the command with them)."""
        opts = ["--steps", str(self.steps), "--batch-size", str(self.batch_size)]
        opts += ["--seq-len", str(self.seq_len), "--lr", str(self.lr), "--ttt-steps", str(self.ttt_steps)]
        opts += ["--draft-vocab-size", str(self.draft_vocab_size)]
        return opts + (["--layers", ",".join(map(str, self.layers))] if self.layers else [])


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
    eagle3: Eagle3Settings = field(default_factory=Eagle3Settings)
    seed: int = 0

    def family_key(self) -> str:
        """Hash of what shapes tokenizer, target and draft (not the Medusa heads or the EAGLE-3 draft)."""
        d = dataclasses.asdict(self)
        d.pop("medusa")
        d.pop("eagle3")
        return settings_hash({"settings": d, **environment()})

    def medusa_key(self) -> str:
        return settings_hash({"family": self.family_key(), "medusa": dataclasses.asdict(self.medusa)})

    def eagle3_key(self) -> str:
        return settings_hash({"family": self.family_key(), "eagle3": dataclasses.asdict(self.eagle3)})


DEFAULT_SETTINGS = DemoSettings()  # what `make demo` builds

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
    # a 1-layer target: its one layer's output (the default needs more than 5 layers)
    eagle3=Eagle3Settings(prompts=4, steps=2, batch_size=2, seq_len=32, draft_vocab_size=64, layers=(0,)),
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


def environment() -> dict:
    return {"python": sys.version.split()[0], "torch": torch.__version__, "recipe": RECIPE_VERSION}


def settings_hash(obj: dict) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
