"""The reference engine folder: a TensorRT-LLM engine's config.json shape around a checkpoint's weights.

Layout: config.json {"version", "pretrained_config": <checkpoint config.json>, "build_config": {...,
speculative_decoding_mode, max_draft_len, plugin_config}, "specbuild_engine": "reference"}, the
checkpoint's rank{N}.safetensors (hard-linked when possible, else copied) and specbuild.json
(kind "engine"). The PyTorch reference engine (engines/reference) loads it; a TensorRT-LLM engine folder
has the same config.json with rank{N}.engine files instead.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from specbuild.core.formats.manifest import read_manifest, write_manifest
from specbuild.core.formats.safe_io import read_json

REFERENCE = "reference"


def write_reference_engine(
    checkpoint_dir: str | Path, out_dir: str | Path, *, build_config: dict[str, Any], version: str
) -> Path:
    """Write the engine folder `out_dir` (which must not exist) next to or inside a build output."""
    ckpt, out = Path(checkpoint_dir), Path(out_dir)
    ckpt_files = read_manifest(ckpt, kind="trtllm_checkpoint")["files"]  # refuses incomplete checkpoints

    pretrained = read_json(ckpt / "config.json", what="checkpoint config.json")
    out.mkdir(parents=True)
    config = {
        "version": version,
        "pretrained_config": pretrained,
        "build_config": build_config,
        "specbuild_engine": REFERENCE,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    world = pretrained["mapping"]["world_size"]
    known = {}
    for rank in range(world):
        name = f"rank{rank}.safetensors"
        try:
            os.link(ckpt / name, out / name)  # same bytes, no second copy on disk
            known[name] = ckpt_files[name]  # and no second hash: the same inode
        except OSError:
            shutil.copyfile(ckpt / name, out / name)
    write_manifest(
        out,
        reuse_nested=True,
        kind="engine",
        known=known,
        engine=REFERENCE,
        checkpoint=os.path.relpath(ckpt, out),
        build_config=build_config,
    )
    return out
