"""Turn a model reference (local folder or hub id) into a local folder, offline.

Hub ids are checked against a strict pattern before they become paths, then looked up in the local
Hugging Face cache only (no network).
"""

from __future__ import annotations

import re
from pathlib import Path

from huggingface_hub import snapshot_download

from specbuild.core.errors import ModelNotFoundError

HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.\-]{0,95}$")


def resolve_model(ref: str | Path, *, base: Path | None = None, what: str = "model") -> Path:
    """Return the local folder of `ref`. Relative paths are taken relative to `base` (a spec's folder)."""
    text = str(ref)
    path = Path(text).expanduser()
    if not path.is_absolute() and base is not None:
        path = base / path
    if path.is_dir():
        return path.resolve()
    if path.exists():
        raise ModelNotFoundError(
            f"{what} {text!r} is a file, not a folder",
            expected="a folder with config.json (and weights), or a hub id",
            found=str(path),
            fix="point at the folder that holds config.json",
        )
    if HUB_ID.match(text) and ".." not in text:
        cached = _from_hf_cache(text)
        if cached is not None:
            return cached
        raise ModelNotFoundError(
            f"{what} {text!r} is neither a local folder nor in the Hugging Face cache",
            expected=f"a folder at {path} or a cached snapshot of the hub id {text}",
            found="nothing (specbuild never downloads)",
            fix=f"run `huggingface-cli download {text}` on a machine with access, or pass a local folder",
        )
    raise ModelNotFoundError(
        f"{what} {text!r} was not found",
        expected="an existing folder, or a hub id of the form owner/name",
        found=f"no folder at {path}",
        fix="check the path (relative paths in a spec are relative to the spec file)",
    )


def _from_hf_cache(repo_id: str) -> Path | None:
    try:
        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # LocalEntryNotFoundError, offline errors: simply "not cached"
        return None
