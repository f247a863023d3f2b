"""Artifact folders: atomic creation and the specbuild.json manifest.

Every artifact folder (checkpoint, engine, build output, model repository, Medusa heads) is written
into a temporary sibling and renamed into place at the end, so an interrupted or failed run never
leaves a folder that looks complete. Its `specbuild.json` records what was built (kind, resolved
spec or options, inputs, tool versions) and the sha256 of every file, so later stages read back
exactly what was built and `specbuild verify` can tell what changed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from specbuild.core.errors import OutputExistsError, SpecbuildError

MANIFEST = "specbuild.json"
_CHUNK = 8 << 20  # 8 MiB reads for hashing


@contextlib.contextmanager
def atomic_output_dir(final: str | Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary folder that becomes `final` only if the block completes.

    An existing `final` is refused unless `force`; with `force` it is replaced only after the new
    folder is complete.
    """
    final = Path(final)
    if final.exists() and not force:
        raise OutputExistsError(
            f"output folder {final} already exists",
            expected="a path that does not exist yet",
            found=f"{final} ({'folder' if final.is_dir() else 'file'})",
            fix="choose another --out, or pass --force to replace it",
        )
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.partial-{os.getpid()}-{int(time.time() * 1000)}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def tool_versions() -> dict[str, str | None]:
    """Versions of the tools that shaped an artifact (None when not installed)."""
    out: dict[str, str | None] = {}
    for dist in ("specbuild", "torch", "transformers", "safetensors", "tensorrt_llm", "tritonclient"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def nested_digests(folder: Path) -> dict[str, str]:
    """Digests recorded by the manifests of artifact folders inside `folder`, keyed relative to it."""
    known: dict[str, str] = {}
    for m in sorted(folder.rglob(MANIFEST)):
        if m.parent == folder:
            continue
        sub = m.parent.relative_to(folder).as_posix()
        for rel, digest in json.loads(m.read_text())["files"].items():
            known.setdefault(f"{sub}/{rel}", digest)
    return known


def write_manifest(
    folder: str | Path,
    *,
    kind: str,
    known: dict[str, str] | None = None,
    reuse_nested: bool = False,
    **fields: Any,
) -> dict[str, Any]:
    """Hash every file under `folder` and write specbuild.json. `fields` must be JSON-serialisable.

    `known` (relative path -> sha256) holds digests taken while the files were written, and
    `reuse_nested` takes those of artifact folders written earlier in the same run: for a 70B
    checkpoint a second hashing pass would cost minutes.
    """
    folder = Path(folder)
    digests = {**(nested_digests(folder) if reuse_nested else {}), **(known or {})}
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST and "__pycache__" not in p.parts:
            rel = p.relative_to(folder).as_posix()
            files[rel] = digests[rel] if rel in digests else sha256_file(p)
    manifest = {"kind": kind, **fields, "versions": tool_versions(), "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n")
    return manifest


def read_manifest(folder: str | Path, *, kind: str | tuple[str, ...] | None = None) -> dict[str, Any]:
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise SpecbuildError(
            f"{folder} has no {MANIFEST}",
            expected="a folder written by specbuild (convert, compile, repo, train-medusa)",
            found="no manifest",
            fix="point at the folder specbuild wrote, or rebuild it",
        )
    manifest = json.loads(path.read_text())
    kinds = (kind,) if isinstance(kind, str) else kind
    if kinds and manifest.get("kind") not in kinds:
        raise SpecbuildError(
            f"{folder} holds a {manifest.get('kind')!r} artifact",
            expected=" or ".join(kinds),
            found=str(manifest.get("kind")),
            fix="point at the right folder",
        )
    return manifest


@dataclass(frozen=True)
class Change:
    path: str  # relative to the artifact folder
    status: str  # modified | missing | added


def verify_manifest(folder: str | Path) -> list[Change]:
    """Re-hash every file; report modified, missing and added files (nested manifests checked too)."""
    folder = Path(folder)
    manifest = read_manifest(folder)
    changes: list[Change] = []
    for rel, digest in manifest["files"].items():
        p = folder / rel
        if not p.is_file():
            changes.append(Change(rel, "missing"))
        elif sha256_file(p) != digest:
            changes.append(Change(rel, "modified"))
    known = set(manifest["files"])
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and p.name != MANIFEST and rel not in known and "__pycache__" not in p.parts:
            changes.append(Change(rel, "added"))
    return changes
