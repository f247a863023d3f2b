"""The one reader of a Hugging Face Medusa heads folder, used by `check`, `inspect` and `convert`.

Layout (FasterDecoding/Medusa), read as TensorRT-LLM's `load_medusa_hf` reads it
(`tensorrt_llm/models/medusa/weight.py`, the 1.x version with `is_modelopt_ckpt`; called from
`MedusaForCausalLM.from_hugging_face` in `tensorrt_llm/models/medusa/model.py` @0249976575):
* weights: `medusa_lm_head.pt` first; `medusa_lm_head.safetensors` only when the .pt is absent;
* keys without any prefix: per head h and ResBlock j < L `{h}.{j}.linear.weight` [hidden, hidden] and
  `{h}.{j}.linear.bias` [hidden], and the head's vocabulary projection `{h}.{L}.weight` [vocab, hidden]
  (the `medusa_heads.` prefix belongs to ModelOpt checkpoints that combine base model and heads, which
  upstream reads from every *.safetensors of the model folder; specbuild does not take those);
* `config.json`: `medusa_num_heads` / `medusa_num_layers` (the LLM-API path spells it
  `num_medusa_heads`).

The .pt is loaded with `weights_only=True` (memory-mapped when its format allows), safetensors headers
without loading anything. What the weights hold is described by `MedusaHeadsInfo` (counts, shapes and
every problem); `convert` refuses a folder whose info has problems, `check` reports them as rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specbuild.core.errors import CheckpointError
from specbuild.core.formats.safe_io import read_json
from specbuild.core.formats.weights import safetensors_shapes

WEIGHT_FILES = ("medusa_lm_head.pt", "medusa_lm_head.safetensors")  # upstream's order of precedence
_KEY = re.compile(r"^(\d+)\.(\d+)\.(linear\.weight|linear\.bias|weight)$")
MODELOPT_PREFIX = "medusa_heads."


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
    problems: tuple[str, ...] = ()  # malformed weights (foreign or missing keys, inconsistent shapes)


def heads_weights_file(folder: str | Path) -> Path | None:
    """The file upstream loads: medusa_lm_head.pt, else medusa_lm_head.safetensors, else None."""
    return next((Path(folder) / f for f in WEIGHT_FILES if (Path(folder) / f).is_file()), None)


def read_heads_config(folder: str | Path) -> dict[str, Any]:
    """The heads' config.json (bounded read; {} when absent)."""
    path = Path(folder) / "config.json"
    if not path.exists():
        return {}
    try:
        return read_json(path, what="Medusa heads config.json")
    except CheckpointError:
        raise
    except Exception as exc:  # InputFileError: invalid JSON, a list, too large
        raise CheckpointError(
            getattr(exc, "what", str(exc)),
            expected="the heads' config.json (a JSON object)",
            found=getattr(exc, "found", None),
            fix="fix or remove it",
        ) from None


def read_medusa_heads(folder: str | Path, *, state: dict[str, Any] | None = None) -> MedusaHeadsInfo:
    """Counts, shapes and problems of a heads folder. `state`: the already loaded .pt state dict."""
    folder = Path(folder)
    config = read_heads_config(folder)
    info = MedusaHeadsInfo(
        folder=folder,
        config_num_heads=_int(config.get("medusa_num_heads", config.get("num_medusa_heads"))),
        config_num_layers=_int(config.get("medusa_num_layers", config.get("num_medusa_layers"))),
        config_hidden_size=_int(config.get("hidden_size")),
        config_vocab_size=_int(config.get("vocab_size")),
        weights_file=heads_weights_file(folder),
    )
    if info.weights_file is None:
        return info
    if state is not None:
        shapes = {k: tuple(v.shape) for k, v in state.items()}
    elif info.weights_file.suffix == ".safetensors":
        shapes = safetensors_shapes(info.weights_file)
    else:
        shapes = {k: tuple(v.shape) for k, v in load_pt_state(info.weights_file).items()}
    return _from_shapes(info, shapes)


def load_pt_state(path: Path) -> dict[str, Any]:
    """medusa_lm_head.pt as {name: tensor}, with weights_only=True (no arbitrary unpickling)."""
    import torch  # noqa: PLC0415 - core stays torch-free; only .pt heads need torch

    try:
        try:  # memory-mapped: pages are read only when a tensor is used
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:  # legacy (non-zip) torch.save format cannot be memory-mapped
            if "mmap" not in str(exc):
                raise
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # unpickling refused (weights_only), a truncated zip
        raise CheckpointError(
            f"cannot load {path}",
            expected="a torch state dict of tensors (loaded with weights_only=True)",
            found=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
            fix="re-download the heads, or save them as medusa_lm_head.safetensors",
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(
            f"{path} is not a state dict",
            expected="{name: tensor}",
            found=type(state).__name__,
            fix="save the heads' state_dict()",
        )
    return state


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _from_shapes(info: MedusaHeadsInfo, shapes: dict[str, tuple[int, ...]]) -> MedusaHeadsInfo:
    heads: dict[int, dict[int, dict[str, tuple[int, ...]]]] = {}
    problems: list[str] = []
    foreign = sorted(k for k in shapes if not _KEY.match(k))
    if foreign:
        prefixed = [
            k for k in foreign if k.startswith(MODELOPT_PREFIX) and _KEY.match(k[len(MODELOPT_PREFIX) :])
        ]
        note = (
            (
                f" (the '{MODELOPT_PREFIX}' prefix is ModelOpt's combined-checkpoint form; TensorRT-LLM "
                "reads "
                f"{info.weights_file.name} keys without a prefix)"
            )
            if prefixed
            else ""
        )
        problems.append(
            f"{len(foreign)} tensor(s) outside the HF Medusa layout, e.g. {', '.join(foreign[:3])}{note}"
        )
    for key, shape in shapes.items():
        m = _KEY.match(key)
        if m:
            heads.setdefault(int(m[1]), {}).setdefault(int(m[2]), {})[m[3]] = shape
    if not heads:
        return replace(
            info,
            problems=(
                *problems,
                f"{info.weights_file.name} has no Medusa head tensors ('0.0.linear.weight', ...)",
            ),
        )
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
        extra = sorted(
            j for j, parts in blocks.items() if j > layers[h] or (j == layers[h] and set(parts) != {"weight"})
        )
        if extra:
            problems.append(f"head {h} has tensors past its vocabulary projection: indices {extra}")
    return replace(
        info,
        num_heads=num_heads,
        num_layers=num_layers,
        hidden_size=hidden,
        vocab_size=vocab,
        problems=tuple(problems),
    )
