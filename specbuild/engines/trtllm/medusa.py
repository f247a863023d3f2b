"""HF Medusa heads (FasterDecoding format): find the weights file, settle the head/layer counts.

Files: `medusa_lm_head.safetensors` (memory-mapped) or `medusa_lm_head.pt` (torch.load with
weights_only=True), plus an optional `config.json` with `medusa_num_heads` / `medusa_num_layers`.
Keys: "{h}.{j}.linear.weight" [H, H], "{h}.{j}.linear.bias" [H] for ResBlock j < L, and "{h}.{L}.weight"
[V, H] for the head's lm_head. Counts come from the caller (flags) or the config, and must agree with
the weights; the README of medusa-vicuna-7b-v1.3 shows configs that lie (2 heads stored as 4).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from specbuild.core.errors import CheckpointError
from specbuild.engines.trtllm.sources import MemorySource, SafetensorsSource

DEFAULT_MAX_DRAFT_LEN = 63  # TRT-LLM's --max_medusa_token_len default; holds the mc_sim_7b_63 tree
_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


@dataclass(frozen=True)
class MedusaHeadsSource:
    heads_dir: Path
    num_heads: int | None = None  # None: read medusa_num_heads from the heads' config.json
    num_layers: int | None = None  # None: read medusa_num_layers from the heads' config.json
    max_draft_len: int = DEFAULT_MAX_DRAFT_LEN  # written to the checkpoint; the builder's default


@dataclass(frozen=True)
class MedusaHeads:
    source: SafetensorsSource | MemorySource
    num_heads: int
    num_layers: int
    file: Path


def open_heads(spec: MedusaHeadsSource) -> MedusaHeads:
    folder = Path(spec.heads_dir)
    st, pt = folder / "medusa_lm_head.safetensors", folder / "medusa_lm_head.pt"
    if st.is_file():
        source: SafetensorsSource | MemorySource = SafetensorsSource([st], where=str(st))
        file = st
    elif pt.is_file():
        source, file = _load_pt(pt), pt
    else:
        raise CheckpointError(
            f"no Medusa heads in {folder}",
            expected="medusa_lm_head.safetensors or medusa_lm_head.pt (HF Medusa format)",
            found=", ".join(sorted(p.name for p in folder.iterdir())) if folder.is_dir() else "no such folder",
            fix="point --medusa at the folder written by Medusa training (or `specbuild train-medusa`)",
        )
    found_heads, found_layers = _counts_from_keys(source, file)
    cfg = _heads_config(folder)
    heads = _settle("num_medusa_heads", spec.num_heads, cfg.get("medusa_num_heads"), found_heads, file, "--num-medusa-heads")
    layers = _settle("num_medusa_layers", spec.num_layers, cfg.get("medusa_num_layers"), found_layers, file, "--num-medusa-layers")
    return MedusaHeads(source=source, num_heads=heads, num_layers=layers, file=file)


def _load_pt(path: Path) -> MemorySource:
    try:
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # files in torch's legacy (pre-zip) format cannot be memory-mapped
            if "mmap" not in str(exc):
                raise
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # pickle errors, truncated zip, forbidden globals
        raise CheckpointError(f"cannot load {path}", expected="a torch state dict of tensors", found=f"{type(exc).__name__}: {exc}"[:300], fix="re-save the heads, preferably as medusa_lm_head.safetensors") from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} is not a state dict", expected="{name: tensor}", found=type(state).__name__, fix="re-save the heads' state_dict()")
    return MemorySource(state, file=path)


def _heads_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON", expected="the heads' config.json", found=str(exc), fix="fix or remove it") from None
    return raw if isinstance(raw, dict) else {}


def _counts_from_keys(source, file: Path) -> tuple[int, int]:
    """(heads, layers) the weights hold: head h's lm_head is the key with the largest index."""
    per_head: dict[int, set[int]] = {}
    for name in source.names():
        m = _KEY.match(name)
        if not m:
            raise CheckpointError(f"{file}: unexpected tensor {name}", expected='keys "{h}.{j}.linear.weight|bias" and "{h}.{L}.weight"', found=name, fix="use the HF Medusa format (FasterDecoding medusa_lm_head)")
        per_head.setdefault(int(m.group(1)), set()).add(int(m.group(2)))
    if not per_head:
        raise CheckpointError(f"{file} holds no tensors", expected="Medusa head weights", found="empty", fix="re-save the heads")
    heads = max(per_head) + 1
    layers = max(max(js) for js in per_head.values())  # the lm_head index equals the ResBlock count
    return heads, layers


def _settle(key: str, flag: int | None, config: int | None, weights: int, file: Path, option: str) -> int:
    wanted, origin = (flag, f"{option} {flag}") if flag is not None else (config, f"config.json {config}") if config is not None else (weights, "")
    if wanted != weights:
        raise CheckpointError(
            f"Medusa {key} mismatch: {origin} but {file.name} holds {weights}",
            expected=f"{key} = {wanted} to match the weights",
            found=f"{weights} in the weights",
            fix=f"pass {option} {weights} (or use the heads that were trained with {wanted})",
        )
    return int(wanted)
