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
import re
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from specbuild.core.errors import OutputExistsError, SpecbuildError
from specbuild.core.formats.safe_io import InputFileError, guard_output, output_errors, read_json, shorten

MANIFEST = "specbuild.json"
_CHUNK = 8 << 20  # 8 MiB reads for hashing


@contextlib.contextmanager
def atomic_output_dir(
    final: str | Path,
    *,
    force: bool = False,
    inputs: Mapping[str, str | Path | None] | None = None,
    option: str = "--out",
) -> Iterator[Path]:
    """Yield a temporary folder that becomes `final` only if the block completes.

    `inputs` (label -> path) are what the command reads: `final` may not equal, contain or lie inside
    any of them (safe_io.guard_output), with or without `force`. An existing `final` (a symlink, even a
    dangling one, included) is refused unless `force`; with `force` it is replaced only after the new
    folder is complete (a symlink is replaced by the folder: the folder it pointed to is left as it
    was). Temporary folders left by a killed earlier run for the same `final` are removed first. A full
    disk or a read-only folder is an OutputError naming the file.
    """
    final = Path(final)
    if inputs:
        guard_output(final, inputs, option=option)
    if os.path.lexists(final) and not force:
        raise OutputExistsError(
            f"output folder {final} already exists",
            expected="a path that does not exist yet",
            found=f"{final} ({'folder' if final.is_dir() else 'file'})",
            fix=f"choose another {option}, or pass --force to replace it",
        )
    with output_errors(final):
        final.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(final)
        tmp = final.parent / f".{final.name}{_PARTIAL}{os.getpid()}-{int(time.time() * 1000)}"
        tmp.mkdir()
    try:
        with output_errors(final, scratch=tmp):
            yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    with output_errors(final, scratch=tmp):
        if os.path.lexists(final):
            old = final.parent / f".{final.name}{_OLD}{os.getpid()}"
            final.rename(old)
            tmp.rename(final)
            _remove(old)
        else:
            tmp.rename(final)


_PARTIAL, _OLD = ".partial-", ".old-"


def remove_stale_partials(final: Path) -> list[Path]:
    """Delete `.NAME.partial-PID-*` / `.NAME.old-PID` folders beside `final` whose process is gone.

    They are what a killed run of the same output left; a live PID is another run still writing.
    """
    removed = []
    prefix = f".{final.name}"
    try:
        entries = list(final.parent.iterdir())
    except OSError:
        return removed
    for p in entries:
        rest = p.name[len(prefix) :] if p.name.startswith(prefix) else ""
        for marker in (_PARTIAL, _OLD):
            if rest.startswith(marker):
                pid = rest[len(marker) :].split("-", 1)[0]
                if pid.isdecimal() and not _alive(int(pid)) and (p.is_dir() or p.is_symlink()):
                    _remove(p)
                    removed.append(p)
    return removed


def _remove(path: Path) -> None:
    """Delete a replaced output: a folder with what it holds, a symlink itself (never what it points to)."""
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(OSError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


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
        for rel, digest in manifest_files(read_json(m, kind="manifest", what="manifest"), m).items():
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
    manifest = read_json(path, kind="manifest", what="manifest")
    manifest_files(manifest, path)
    kinds = (kind,) if isinstance(kind, str) else kind
    if kinds and manifest.get("kind") not in kinds:
        raise SpecbuildError(
            f"{folder} holds a {shorten(manifest.get('kind'))} artifact",
            expected=" or ".join(kinds),
            found=shorten(manifest.get("kind")),
            fix="point at the right folder",
        )
    return manifest


def manifest_files(manifest: dict[str, Any], path: Path) -> dict[str, str]:
    """The manifest's {relative path: sha256}, checked: a garbled manifest is a clear error."""
    files = manifest.get("files")
    bad = None
    if not isinstance(files, dict):
        bad = f"files is {shorten(files)}"
    else:
        bad = next(
            (
                f"{shorten(k)}: {shorten(v)}"
                for k, v in files.items()
                if not isinstance(k, str) or not isinstance(v, str) or not _SHA256.fullmatch(v)
            ),
            None,
        )
    if bad is not None:
        raise InputFileError(
            f"manifest {path} is garbled",
            expected='"files": {relative path: sha256 hex digest}',
            found=bad,
            fix="rebuild the artifact (the manifest was edited or damaged)",
        )
    return files


_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Change:
    path: str  # relative to the artifact folder
    status: str  # modified | missing | added


def verify_manifest(folder: str | Path) -> list[Change]:
    """Re-hash every file; report modified, missing and added files (nested manifests checked too).

    An entry that names a path outside the folder (absolute, `..`, or through a symlink) is reported
    as "outside" and never read: a manifest is data, not a list of files to open.
    """
    folder = Path(folder)
    root = folder.resolve()
    manifest = read_manifest(folder)
    changes: list[Change] = []
    for rel, digest in manifest["files"].items():
        p = folder / rel
        if not _inside(root, rel, p):
            changes.append(Change(rel, "outside"))
        elif not p.is_file():
            changes.append(Change(rel, "missing"))
        elif sha256_file(p) != digest:
            changes.append(Change(rel, "modified"))
    known = set(manifest["files"])
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if p.is_file() and p.name != MANIFEST and rel not in known and "__pycache__" not in p.parts:
            changes.append(Change(rel, "added" if _inside(root, rel, p) else "outside"))
    return changes


def _inside(root: Path, rel: str, path: Path) -> bool:
    """`rel` is a plain relative path and `path` (symlinks resolved) stays under `root`."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        return False
    real = path.resolve()
    return real == root or root in real.parents
