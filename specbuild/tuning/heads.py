"""Medusa-1 heads: the module, its initialisation from a base model, and the HF Medusa file format.

Head h (0-based) reads the base model's last hidden state at position t and predicts the token at
t + h + 2 (the base lm_head itself predicts t + 1). Each head is `num_layers` ResBlocks
(x + act(Linear(x))) followed by its own lm_head (Cai et al. 2024, Medusa-1).

On disk (what `specbuild convert --medusa` and TensorRT-LLM's `load_medusa_hf` read, trtllm.md §3.3):
  medusa_lm_head.safetensors  keys "{h}.{j}.linear.weight" [D, D], "{h}.{j}.linear.bias" [D],
                              "{h}.{num_layers}.weight" [V, D]
  config.json                 medusa_num_heads, medusa_num_layers, hidden_size, vocab_size,
                              base_model_name_or_path

Shape legend: B batch, T tokens, D hidden size, V vocabulary, H heads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from specbuild.core.errors import CheckpointError
from specbuild.core.formats.medusa_heads import (
    WEIGHT_FILES,
    heads_weights_file,
    load_pt_state,
    read_heads_config,
    read_medusa_heads,
)

HEADS_FILE = "medusa_lm_head.safetensors"
CONFIG_FILE = "config.json"


@dataclass(frozen=True)
class HeadsConfig:
    num_heads: int
    num_layers: int  # ResBlocks per head
    hidden_size: int
    vocab_size: int
    hidden_act: str = "silu"
    base_model_name_or_path: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "medusa_num_heads": self.num_heads,
            "medusa_num_layers": self.num_layers,
            # TRT-LLM's LLM-API path (MedusaConfig.from_hugging_face) reads this spelling instead.
            "num_medusa_heads": self.num_heads,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "hidden_act": self.hidden_act,
            "base_model_name_or_path": self.base_model_name_or_path,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any], where: str) -> HeadsConfig:
        try:
            return cls(
                num_heads=int(raw["medusa_num_heads"]),
                num_layers=int(raw["medusa_num_layers"]),
                hidden_size=int(raw["hidden_size"]),
                vocab_size=int(raw["vocab_size"]),
                hidden_act=str(raw.get("hidden_act", "silu")),
                base_model_name_or_path=str(raw.get("base_model_name_or_path", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{where}: not a Medusa heads config",
                expected="medusa_num_heads, medusa_num_layers, hidden_size, vocab_size",
                found=f"{sorted(raw)} ({exc})",
                fix="point at a folder written by `specbuild train-medusa`",
            ) from None


def _activation(name: str) -> nn.Module:
    acts = {"silu": nn.SiLU, "swish": nn.SiLU, "gelu": nn.GELU, "relu": nn.ReLU}
    if name not in acts:
        raise CheckpointError(
            f"unsupported hidden_act {name!r} for Medusa heads",
            expected=" | ".join(acts),
            found=name,
            fix="use a Llama-family base model",
        )
    return acts[name]()


class ResBlock(nn.Module):
    def __init__(self, hidden_size: int, act: str) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        self.act = _activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))  # [..., D]


class MedusaHeads(nn.Module):
    """H heads; forward(hidden [B, T, D]) -> logits [H, B, T, V]."""

    def __init__(self, config: HeadsConfig) -> None:
        super().__init__()
        self.config = config
        d, v = config.hidden_size, config.vocab_size
        self.heads = nn.ModuleList(
            nn.Sequential(
                *[ResBlock(d, config.hidden_act) for _ in range(config.num_layers)],
                nn.Linear(d, v, bias=False),
            )
            for _ in range(config.num_heads)
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack([head(hidden) for head in self.heads])  # [H, B, T, V]

    @torch.no_grad()
    def init_from_base(self, lm_head_weight: torch.Tensor) -> None:
        """ResBlock linears at zero (each head starts as the identity), lm_heads copied from the base.

        Medusa zeroes only the weight; we zero the bias too so untrained heads equal the base lm_head
        exactly: a clean "untrained" baseline for the acceptance comparison.
        """
        for head in self.heads:
            for block in head[:-1]:
                block.linear.weight.zero_()
                block.linear.bias.zero_()
            head[-1].weight.copy_(lm_head_weight.to(head[-1].weight.dtype))  # [V, D]

    # ---- HF Medusa format ------------------------------------------------------------------------
    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """Keys as FasterDecoding/Medusa saves them: "{h}.{j}.linear.weight", "{h}.{L}.weight"."""
        return {k: v.detach().contiguous() for k, v in self.heads.state_dict().items()}

    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor], where: str) -> None:
        expected = set(self.heads.state_dict())
        found = set(tensors)
        if expected != found:
            raise CheckpointError(
                f"{where}: Medusa head tensors do not match the config",
                expected=f"{len(expected)} tensors such as {sorted(expected)[:3]}",
                found=f"missing {sorted(expected - found)[:4]}, extra {sorted(found - expected)[:4]}",
                fix="check medusa_num_heads / medusa_num_layers in config.json",
            )
        self.heads.load_state_dict(tensors)


def save_heads(heads: MedusaHeads, folder: Path, *, dtype: torch.dtype | None = None) -> None:
    tensors = heads.hf_state_dict()
    if dtype is not None:
        tensors = {k: v.to(dtype) for k, v in tensors.items()}
    save_file({k: v.cpu() for k, v in tensors.items()}, str(folder / HEADS_FILE))
    (folder / CONFIG_FILE).write_text(json.dumps(heads.config.to_json(), indent=2) + "\n")


def load_heads(folder: str | Path) -> MedusaHeads:
    """A heads folder as float32 MedusaHeads, read through the one heads-folder reader
    (core/formats/medusa_heads.py): the weights file it picks (medusa_lm_head.pt, else .safetensors) and the
    head counts and sizes the weights hold (a config.json that says otherwise does not decide)."""
    folder = Path(folder)
    weights = heads_weights_file(folder)
    if weights is None:
        raise CheckpointError(
            f"{folder} is not a Medusa heads folder",
            expected=" or ".join(WEIGHT_FILES) + " (HF Medusa format)",
            found=", ".join(sorted(p.name for p in folder.iterdir())[:20])
            if folder.is_dir()
            else "no such folder",
            fix="train heads with `specbuild train-medusa` or point at the heads folder",
        )
    state = load_pt_state(weights) if weights.suffix == ".pt" else load_file(str(weights))
    info = read_medusa_heads(folder, state=state)
    if info.problems:
        raise CheckpointError(
            f"{weights}: not HF Medusa heads",
            expected='keys "{h}.{j}.linear.weight|bias" and "{h}.{L}.weight"',
            found="; ".join(info.problems),
            fix="use the HF Medusa format (FasterDecoding medusa_lm_head)",
        )
    raw = read_heads_config(folder)
    config = HeadsConfig(
        num_heads=info.num_heads,
        num_layers=info.num_layers,
        hidden_size=info.hidden_size,
        vocab_size=info.vocab_size,
        hidden_act=str(raw.get("hidden_act", "silu")),
        base_model_name_or_path=str(raw.get("base_model_name_or_path", "")),
    )
    heads = MedusaHeads(config)
    heads.load_hf_state_dict({k: v.float() for k, v in state.items()}, str(weights))
    return heads
