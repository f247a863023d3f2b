"""specbuild.json without hashing the same bytes twice.

Same format as `specbuild.manifest.write_manifest` ({"kind", fields..., "versions", "files"}, every file
under the folder except manifests and __pycache__), but digests already known are reused: those the
converter took while writing a rank file, those of nested artifact folders written earlier in the
same run (a build folder holds checkpoints and engines that have their own manifests), and those of
hard-linked copies. For a 70B checkpoint a second hashing pass would cost minutes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def nested_digests(folder: Path) -> dict[str, str]:
    """Digests from the manifests of artifact folders inside `folder`, keyed by path relative to it."""
    from specbuild.manifest import MANIFEST

    known: dict[str, str] = {}
    for m in sorted(folder.rglob(MANIFEST)):
        if m.parent == folder:
            continue
        sub = m.parent.relative_to(folder).as_posix()
        for rel, digest in json.loads(m.read_text())["files"].items():
            known.setdefault(f"{sub}/{rel}", digest)
    return known


def write_manifest_known(folder: str | Path, *, kind: str, known: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    """write_manifest, with `known` digests (relative path -> sha256) used instead of re-hashing."""
    from specbuild.manifest import MANIFEST, sha256_file, tool_versions

    folder = Path(folder)
    known = {**nested_digests(folder), **(known or {})}
    files = {}
    for p in sorted(folder.rglob("*")):
        if p.is_file() and p.name != MANIFEST and "__pycache__" not in p.parts:
            rel = p.relative_to(folder).as_posix()
            files[rel] = known[rel] if rel in known else sha256_file(p)
    manifest = {"kind": kind, **fields, "versions": tool_versions(), "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=False, default=str) + "\n")
    return manifest
