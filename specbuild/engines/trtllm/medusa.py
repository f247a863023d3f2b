"""HF Medusa heads for `convert`: open the weights `core/formats/medusa_heads.py` chooses and settle the
counts.

The folder is read by the one reader of heads folders (`read_medusa_heads`: medusa_lm_head.pt first,
safetensors only when the .pt is absent, as TensorRT-LLM's `load_medusa_hf`; keys without a prefix;
config.json counts), so `check` and `convert` accept exactly the same folders. Counts come from the
caller (flags) or the config, and must agree with the weights; the README of medusa-vicuna-7b-v1.3
shows configs that lie (2 heads stored as 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specbuild.core.errors import CheckpointError
from specbuild.core.formats.medusa_heads import (
    WEIGHT_FILES,
    heads_weights_file,
    load_pt_state,
    read_medusa_heads,
)
from specbuild.engines.trtllm.sources import MemorySource, SafetensorsSource

DEFAULT_MAX_DRAFT_LEN = 63  # TRT-LLM's --max_medusa_token_len default; holds the mc_sim_7b_63 tree


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
    file = heads_weights_file(folder)
    if file is None:
        raise CheckpointError(
            f"no Medusa heads in {folder}",
            expected=" or ".join(WEIGHT_FILES) + " (HF Medusa format)",
            found=", ".join(sorted(p.name for p in folder.iterdir())[:20])
            if folder.is_dir()
            else "no such folder",
            fix="point --medusa at the folder written by Medusa training (or `specbuild train-medusa`)",
        )
    state = load_pt_state(file) if file.suffix == ".pt" else None
    info = read_medusa_heads(folder, state=state)
    if info.problems:
        raise CheckpointError(
            f"{file}: not HF Medusa heads",
            expected='keys "{h}.{j}.linear.weight|bias" and "{h}.{L}.weight"',
            found="; ".join(info.problems),
            fix="use the HF Medusa format (FasterDecoding medusa_lm_head)",
        )
    source: SafetensorsSource | MemorySource = (
        MemorySource(state, file=file) if state is not None else SafetensorsSource([file], where=str(file))
    )
    heads = _settle(
        "num_medusa_heads", spec.num_heads, info.config_num_heads, info.num_heads, file, "--num-medusa-heads"
    )
    layers = _settle(
        "num_medusa_layers",
        spec.num_layers,
        info.config_num_layers,
        info.num_layers,
        file,
        "--num-medusa-layers",
    )
    return MedusaHeads(source=source, num_heads=heads, num_layers=layers, file=file)


def _settle(key: str, flag: int | None, config: int | None, weights: int, file: Path, option: str) -> int:
    wanted, origin = (
        (flag, f"{option} {flag}")
        if flag is not None
        else (config, f"config.json {config}")
        if config is not None
        else (weights, "")
    )
    if wanted != weights:
        raise CheckpointError(
            f"Medusa {key} mismatch: {origin} but {file.name} holds {weights}",
            expected=f"{key} = {wanted} to match the weights",
            found=f"{weights} in the weights",
            fix=f"pass {option} {weights} (or use the heads that were trained with {wanted})",
        )
    return int(wanted)
