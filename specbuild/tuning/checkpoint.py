"""Resumable training checkpoints: heads, AdamW state, step and RNG state, as safetensors + JSON.

No pickle anywhere: tensors go to safetensors, everything else to state.json. Each checkpoint is a
folder `step-NNNNNNN/` written atomically (manifest.atomic_output_dir), so a run killed while saving
leaves the previous checkpoint as the latest complete one.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from specbuild.core.errors import OutputExistsError, TrainingError
from specbuild.core.formats.manifest import atomic_output_dir
from specbuild.core.formats.safe_io import InputFileError, guard_output, read_json

KEEP = 2  # complete checkpoints kept; older ones are deleted
_PREFIX = "step-"


@dataclass(frozen=True)
class TrainState:
    step: int  # optimizer steps done
    heads: dict[str, torch.Tensor]  # HF Medusa keys
    optimizer: dict[str, Any]  # torch optimizer state_dict
    rng: dict[str, torch.Tensor]  # "cpu" and, on GPU, "cuda"
    info: dict[str, Any]  # fingerprint, losses, ... (JSON)


def save_checkpoint(folder: Path, state: TrainState) -> Path:
    final = folder / f"{_PREFIX}{state.step:07d}"
    opt_tensors, opt_meta = _flatten_optimizer(state.optimizer)
    with atomic_output_dir(final, force=True) as tmp:
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in state.heads.items()}, str(tmp / "heads.safetensors")
        )
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        save_file({k: v.cpu() for k, v in state.rng.items()}, str(tmp / "rng.safetensors"))
        meta = {"step": state.step, "optimizer": opt_meta, **state.info}
        (tmp / "state.json").write_text(json.dumps(meta, indent=2) + "\n")
    for old in _complete(folder)[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(folder: Path) -> Path | None:
    done = _complete(folder)
    return done[-1] if done else None


def load_checkpoint(path: Path) -> TrainState:
    try:
        try:
            meta = read_json(path / "state.json", what="checkpoint state.json")
        except InputFileError as exc:
            raise OSError(exc.message()) from None
        heads = load_file(str(path / "heads.safetensors"))
        opt_tensors = load_file(str(path / "optimizer.safetensors"))
        rng = load_file(str(path / "rng.safetensors"))
    except (OSError, ValueError) as exc:
        raise TrainingError(
            f"checkpoint {path} is unreadable",
            expected="heads/optimizer/rng safetensors + state.json",
            found=str(exc),
            fix="delete it to resume from the previous one",
        ) from None
    optimizer = _unflatten_optimizer(opt_tensors, meta.pop("optimizer"))
    step = int(meta.pop("step"))
    return TrainState(step=step, heads=heads, optimizer=optimizer, rng=rng, info=meta)


def _complete(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.startswith(_PREFIX) and (p / "state.json").is_file())


def _flatten_optimizer(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """torch optimizer state_dict -> ({"<param>.<name>": tensor}, JSON-able param_groups + scalars)."""
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for idx, per_param in sd["state"].items():
        for name, value in per_param.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(str(idx), {})[name] = value
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    for idx, values in meta.get("scalars", {}).items():
        state.setdefault(int(idx), {}).update(values)
    groups = [{k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in meta["param_groups"]]
    return {"state": state, "param_groups": groups}


def check_outputs(out: Path, checkpoint_dir: Path, inputs: dict, *, force: bool, resume: bool) -> None:
    """Before a training run (train-medusa, train-eagle3): neither the output nor its checkpoint folder is,
    holds or lies in an input; an existing output needs --force; checkpoints of an unfinished run need
    --resume (never silently continued or overwritten)."""
    guard_output(out, inputs)
    guard_output(checkpoint_dir, inputs, option="the checkpoint folder (beside --out)")
    if out.exists() and not force:
        raise OutputExistsError(
            f"output folder {out} already exists",
            expected="a new path",
            found=str(out),
            fix="choose another --out or pass --force",
        )
    if not resume and latest_checkpoint(checkpoint_dir) is not None:
        raise TrainingError(
            f"{checkpoint_dir} holds checkpoints of an earlier, unfinished run",
            expected="no checkpoints, or --resume",
            found=str(latest_checkpoint(checkpoint_dir)),
            fix=f"pass --resume to continue that run, or delete {checkpoint_dir}",
        )
