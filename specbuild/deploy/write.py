"""Write a deployment folder: one YAML file per concern (multi-document), a README and the commands."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from specbuild.core.formats.manifest import atomic_output_dir


class _NoAliases(yaml.SafeDumper):
    """Write shared sub-objects out in full: manifests are read by people and by kubectl, not anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(objects: list[dict[str, Any]]) -> str:
    return yaml.dump_all(objects, Dumper=_NoAliases, sort_keys=False, width=1000)


def write_folder(
    out: Path,
    files: dict[str, list[dict[str, Any]]],
    *,
    readme: str,
    extra: dict[str, str] | None = None,
    force: bool = False,
    inputs: dict[str, Path | None] | None = None,
) -> list[Path]:
    with atomic_output_dir(out, force=force, inputs=inputs or {}) as tmp:
        for name, objects in files.items():
            (tmp / name).write_text(dump(objects))
        for name, text in (extra or {}).items():
            (tmp / name).write_text(text)
        (tmp / "README.md").write_text(readme)
    return sorted(out / n for n in [*files, *(extra or {}), "README.md"])
