"""`tune --write`: set keys of a build spec in place, keeping the user's comments and layout.

The spec is edited with ruamel.yaml's round-trip loader and dumper, which keep comments, key order,
quoting and flow or block style of everything not edited (the indentation is the file's own, guessed by
ruamel). New values are written in flow style (`choices: [[0], [0, 0]]`, `schedule: {1: 4, 4: 0}`). The
edited text is then read back the way every spec is read (yaml.safe_load through the spec loader) and must
be a valid spec carrying exactly the new values, or nothing is written. The file is replaced in one
rename (safe_io.atomic_write_text).
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from specbuild.core.errors import SpecError
from specbuild.core.formats.safe_io import atomic_write_text
from specbuild.core.spec import parse_spec_yaml, read_spec_text, spec_from_dict

Edit = tuple[str, str, Any]  # (section, key, value): section.key = value
MAX_LINE = 4096  # ruamel folds longer flow values at 80 columns otherwise; a Medusa tree stays one line


def set_spec_value(
    path: Path, section: str, key: str, value: Any, *, inputs: dict[str, Any] | None = None
) -> None:
    """Set section.key = value in the YAML spec at `path` (see edit_spec)."""
    edit_spec(path, [(section, key, value)], inputs=inputs)


def set_spec_values(
    path: Path, section: str, values: dict[str, Any], *, inputs: dict[str, Any] | None = None
) -> None:
    """Several keys of one section at once (they may only be valid together, e.g. max_draft_len and the
    schedule whose K at 1 must equal it)."""
    edit_spec(path, [(section, key, value) for key, value in values.items()], inputs=inputs)


def edit_spec(path: Path, edits: Iterable[Edit], *, inputs: dict[str, Any] | None = None) -> None:
    """Apply every edit in one write; `inputs` (the files tune read) may not be the spec. A spec the
    edits would make invalid, or whose text would read back differently, is left as it was (SpecError)."""
    edits = list(edits)
    text = read_spec_text(path)
    edited = edit_text(text, edits, where=str(path))
    raw = parse_spec_yaml(edited, where=str(path))  # the spec loader's safe_load
    wrong = [
        f"{section}.{key}"
        for section, key, value in edits
        if not isinstance(raw, dict)
        or not isinstance(raw.get(section), dict)
        or raw[section].get(key) != value
    ]
    if wrong:
        raise SpecError(
            f"{path}: the edited spec does not read back as written",
            expected=", ".join(f"{s}.{k}: {v!r}" for s, k, v in edits),
            found=f"{', '.join(wrong)} read back differently",
            fix="set these keys by hand (the spec was not changed)",
        )
    spec_from_dict(raw, source=path)  # still a valid spec (SpecError otherwise; the file is untouched)
    atomic_write_text(path, edited, inputs=inputs, option="the spec")


def edit_text(text: str, edits: Iterable[Edit], *, where: str = "<spec>") -> str:
    """The spec's text with each section.key set to its value (a missing section or key is added at
    the end of its mapping), everything else as it was."""
    yaml = YAML()  # round-trip
    yaml.width = MAX_LINE
    mapping, offset = _indentation(text)
    yaml.indent(mapping=mapping, sequence=offset + 2, offset=offset)  # "- " is two columns
    yaml.explicit_start = _first_content_line(text).startswith("---")
    try:
        data = yaml.load(text)
    except YAMLError as exc:
        raise SpecError(
            f"{where}: not valid YAML", expected="a YAML mapping", found=str(exc).splitlines()[0]
        ) from None
    if data is None:
        data = CommentedMap()
    if not isinstance(data, CommentedMap):
        raise SpecError(f"{where}: the spec must be a mapping", found=type(data).__name__)
    _keep_anchors(data)
    for section, key, value in edits:
        if not isinstance(data.get(section), CommentedMap):
            data[section] = CommentedMap()
        data[section][key] = _flow(value)
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def _indentation(text: str) -> tuple[int, int]:
    """(mapping indent, block sequence dash offset) of the spec as written: the columns of the first
    nested mapping key and of the first block sequence's dash, each under a `key:` line of its own
    (ruamel's own guess takes the sequence's indent for the mapping's: it would re-indent a spec whose
    lists are indented further than its mappings)."""
    mapping = offset = None
    parent = None  # indent of the last `key:` line without a value on it
    for line in text.splitlines():
        body = line.strip()
        if not body or body.startswith("#") or body.startswith("---"):
            continue
        col = len(line) - len(line.lstrip(" "))
        if parent is not None and col > parent:
            if body.startswith("- "):
                offset = col - parent if offset is None else offset
            elif mapping is None:
                mapping = col - parent
        parent = col if body.split("#", 1)[0].rstrip().endswith(":") else None
        if mapping is not None and offset is not None:
            break
    return mapping or 2, offset if offset is not None else 0


def _first_content_line(text: str) -> str:
    return next((ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")), "")


def _keep_anchors(node: Any) -> None:
    """ruamel drops an anchor no alias uses (specs may not hold aliases): write each back as it was."""
    anchor = getattr(node, "anchor", None)
    if anchor is not None and anchor.value:
        node.yaml_set_anchor(anchor.value, always_dump=True)
    children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
    for child in children:
        _keep_anchors(child)


def _flow(value: Any) -> Any:
    """A new value as ruamel writes it in flow style (lists and mappings, nested too)."""
    if isinstance(value, dict):
        node = CommentedMap((k, _flow(v)) for k, v in value.items())
        node.fa.set_flow_style()
        return node
    if isinstance(value, (list, tuple)):
        node = CommentedSeq(_flow(v) for v in value)
        node.fa.set_flow_style()
        return node
    return value
