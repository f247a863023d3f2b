"""What a Hugging Face Medusa heads folder holds: its config.json counts and its weights' shapes.

Layout (FasterDecoding/Medusa, read by TensorRT-LLM's `load_medusa_hf`): `config.json` with
`medusa_num_heads` / `medusa_num_layers`, and `medusa_lm_head.pt` (preferred) or
`medusa_lm_head.safetensors` with, per head h and ResBlock j < L:
`{h}.{j}.linear.weight` [hidden, hidden], `{h}.{j}.linear.bias` [hidden], and the head's vocabulary
projection `{h}.{L}.weight` [vocab, hidden]. Only shapes are read: the safetensors header (no torch),
or the .pt state dict memory-mapped with `weights_only=True`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from specbuild.core.errors import CheckpointError
from specbuild.core.weights import safetensors_shapes

WEIGHT_FILES = ("medusa_lm_head.pt", "medusa_lm_head.safetensors")
_KEY = re.compile(r"^(?:medusa_heads\.)?(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")


@dataclass(frozen=True)
class MedusaHeadsInfo:
    folder: Path
    config_num_heads: int | None  # as config.json says (medusa-vicuna-7b-v1.3's says 2 for 4 heads)
    config_num_layers: int | None
    config_hidden_size: int | None
    config_vocab_size: int | None
    weights_file: Path | None  # None: config only (plan before download)
    num_heads: int | None = None  # from the weights
    num_layers: int | None = None
    hidden_size: int | None = None
    vocab_size: int | None = None
    problems: tuple[str, ...] = ()  # malformed weights (missing keys, inconsistent shapes)


def read_medusa_heads(folder: str | Path) -> MedusaHeadsInfo:
    folder = Path(folder)
    config = {}
    if (folder / "config.json").is_file():
        try:
            config = json.loads((folder / "config.json").read_text())
        except json.JSONDecodeError:
            config = {}
    # the LLM-API path spells the count num_medusa_heads; the HF heads config medusa_num_heads
    info = MedusaHeadsInfo(
        folder=folder,
        config_num_heads=config.get("medusa_num_heads", config.get("num_medusa_heads")),
        config_num_layers=config.get("medusa_num_layers", config.get("num_medusa_layers")),
        config_hidden_size=config.get("hidden_size"),
        config_vocab_size=config.get("vocab_size"),
        weights_file=next((folder / f for f in WEIGHT_FILES if (folder / f).is_file()), None),
    )
    if info.weights_file is None:
        return info
    shapes = _shapes(info.weights_file)
    return _from_shapes(info, shapes)


def _from_shapes(info: MedusaHeadsInfo, shapes: dict[str, tuple[int, ...]]) -> MedusaHeadsInfo:
    heads: dict[int, dict[int, dict[str, tuple[int, ...]]]] = {}
    for key, shape in shapes.items():
        m = _KEY.match(key)
        if m:
            heads.setdefault(int(m[1]), {}).setdefault(int(m[2]), {})[m[3]] = shape
    if not heads:
        return replace(info, problems=(f"{info.weights_file.name} has no Medusa head tensors ('0.0.linear.weight', ...)",))
    problems: list[str] = []
    num_heads = max(heads) + 1
    if sorted(heads) != list(range(num_heads)):
        problems.append(f"head indices {sorted(heads)} are not 0..{num_heads - 1}")
    layers = {h: sum(1 for part in blocks.values() if "linear.weight" in part) for h, blocks in heads.items()}
    num_layers = layers[min(heads)]
    hidden = vocab = None
    for h, blocks in sorted(heads.items()):
        if layers[h] != num_layers:
            problems.append(f"head {h} has {layers[h]} ResBlocks, head 0 has {num_layers}")
        for j in range(layers[h]):
            w, bias = blocks.get(j, {}).get("linear.weight"), blocks.get(j, {}).get("linear.bias")
            if w is None or len(w) != 2 or w[0] != w[1]:
                problems.append(f"{h}.{j}.linear.weight has shape {w}, expected [hidden, hidden]")
                continue
            hidden = hidden or w[0]
            if bias != (w[0],):
                problems.append(f"{h}.{j}.linear.bias has shape {bias}, expected [{w[0]}]")
        head = blocks.get(layers[h], {}).get("weight")
        if head is None or len(head) != 2:
            problems.append(f"head {h} has no vocabulary projection {h}.{layers[h]}.weight [vocab, hidden]")
            continue
        vocab = vocab or head[0]
        hidden = hidden or head[1]
        if head != (vocab, hidden):
            problems.append(f"{h}.{layers[h]}.weight has shape {list(head)}, expected [{vocab}, {hidden}]")
    return replace(info, num_heads=num_heads, num_layers=num_layers, hidden_size=hidden, vocab_size=vocab, problems=tuple(problems))


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    if path.suffix == ".safetensors":
        return safetensors_shapes(path)
    import torch  # noqa: PLC0415 - core stays torch-free; only .pt heads need torch

    try:
        try:  # memory-mapped: only the shapes are needed
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # legacy (non-zip) torch.save format cannot be memory-mapped
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling refused (weights_only) or a truncated file
        raise CheckpointError(
            f"cannot read {path}", expected="a torch state dict of tensors (loaded with weights_only=True)",
            found=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
            fix="re-download the heads, or save them as medusa_lm_head.safetensors",
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"cannot read {path}", expected="a state dict", found=type(state).__name__, fix="save the heads' state_dict()")
    return {k: tuple(v.shape) for k, v in state.items() if hasattr(v, "shape")}
