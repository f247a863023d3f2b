"""`tune --write`: change one key of a build spec in place, keeping the user's comments and layout.

The edit is textual and narrow: the `key:` line inside a top-level `section:` (plus the indented
continuation lines of its old value) becomes `key: <flow YAML value>`. The result is re-loaded with
the spec loader and must carry exactly the intended value; if not (an unusual layout), the spec is
rewritten whole with core.spec.save_spec_yaml, which drops comments, and the caller is told.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from specbuild.core.safe_io import atomic_write_text
from specbuild.core.spec import load_spec, parse_spec_yaml, read_spec_text, save_spec_yaml, spec_from_dict


def set_spec_value(
    path: Path, section: str, key: str, value: Any, *, inputs: dict[str, Any] | None = None
) -> bool:
    """Set section.key = value in the YAML spec at `path`. Returns True when comments were kept.

    The spec is replaced in one rename (safe_io.atomic_write_text): a read-only spec or a full disk
    is a clear error and leaves the spec as it was. `inputs` (the files tune read) may not be the spec.
    """

    text = read_spec_text(path)
    edited = edit_text(text, section, key, value)
    try:
        raw = yaml.safe_load(edited)
        ok = isinstance(raw, dict) and raw.get(section, {}).get(key) == value
        if ok:
            spec_from_dict(raw, source=path)  # still a valid spec
    except Exception:  # any parse/validation failure: fall back to a full rewrite
        ok = False
    if ok:
        atomic_write_text(path, edited, inputs=inputs, option="the spec")
        return True
    spec = load_spec(path)
    raw = parse_spec_yaml(text, where=str(path))
    raw.setdefault(section, {})[key] = value
    spec = spec_from_dict(raw, source=spec.source)
    save_spec_yaml(spec, path, inputs=inputs)
    return False


def set_spec_values(
    path: Path, section: str, values: dict[str, Any], *, inputs: dict[str, Any] | None = None
) -> bool:
    """Several keys of one section at once (they may only be valid together, e.g. max_draft_len and the
    schedule whose K at 1 must equal it). Returns True when comments were kept."""
    text = read_spec_text(path)
    edited = text
    for key, value in values.items():
        edited = edit_text(edited, section, key, value)
    try:
        raw = yaml.safe_load(edited)
        ok = isinstance(raw, dict) and all(raw.get(section, {}).get(k) == v for k, v in values.items())
        if ok:
            spec_from_dict(raw, source=path)
    except Exception:  # any parse/validation failure: fall back to a full rewrite
        ok = False
    if ok:
        atomic_write_text(path, edited, inputs=inputs, option="the spec")
        return True
    spec = load_spec(path)
    raw = parse_spec_yaml(text, where=str(path))
    raw.setdefault(section, {}).update(values)
    save_spec_yaml(spec_from_dict(raw, source=spec.source), path, inputs=inputs)
    return False


def _flow_value(value: Any) -> str:
    """Flow YAML of a value: JSON, except that a mapping with integer keys keeps them integers."""
    if isinstance(value, dict) and value and all(isinstance(k, int) for k in value):
        return "{" + ", ".join(f"{k}: {json.dumps(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)


def edit_text(text: str, section: str, key: str, value: Any) -> str:
    """The narrow textual edit (see the module docstring); value written as flow YAML (JSON)."""
    flow = _flow_value(value)
    lines = text.splitlines(keepends=True)
    start = next(
        (i for i, ln in enumerate(lines) if re.match(rf"^{re.escape(section)}\s*:\s*(#.*)?$", ln)), None
    )
    if start is None:
        flow_line = next(
            (i for i, ln in enumerate(lines) if re.match(rf"^{re.escape(section)}\s*:\s*{{", ln)), None
        )
        if flow_line is not None:
            return (
                "".join(lines[:flow_line])
                + _edit_flow_line(lines[flow_line], section, key, value)
                + "".join(lines[flow_line + 1 :])
            )
        sep = "" if text.endswith("\n") or not text else "\n"
        return f"{text}{sep}{section}:\n  {key}: {flow}\n"
    end = start + 1
    while end < len(lines) and (
        not lines[end].strip() or lines[end][0] in " \t" or lines[end].lstrip().startswith("#")
    ):
        end += 1
    child_indent = next(
        (
            len(ln) - len(ln.lstrip())
            for ln in lines[start + 1 : end]
            if ln.strip() and not ln.lstrip().startswith("#")
        ),
        2,
    )
    pad = " " * child_indent
    for i in range(start + 1, end):
        if re.match(rf"^{pad}{re.escape(key)}\s*:", lines[i]):
            j = i + 1
            while (
                j < end
                and lines[j].strip()
                and (
                    len(lines[j]) - len(lines[j].lstrip()) > child_indent
                    or lines[j].lstrip().startswith("- ")
                )
            ):
                j += 1
            comment = re.search(r"\s+#.*$", lines[i].rstrip("\n")) if j == i + 1 else None
            tail = comment.group(0) if comment and _scalar_line(lines[i]) else ""
            return "".join(lines[:i]) + f"{pad}{key}: {flow}{tail}\n" + "".join(lines[j:])
    return "".join(lines[: start + 1]) + f"{pad}{key}: {flow}\n" + "".join(lines[start + 1 :])


def _scalar_line(line: str) -> bool:
    """A `key: value  # comment` line whose value has no quotes or brackets (so '#' starts a comment)."""
    value = line.split(":", 1)[1]
    return not any(ch in value.split("#", 1)[0] for ch in "'\"[]{}")


def _edit_flow_line(line: str, section: str, key: str, value: Any) -> str:
    """`section: {a: 1, key: old}  # note` -> the same mapping with key set, the comment kept."""
    body = line.split(":", 1)[1]
    close = body.rfind("}")
    mapping = yaml.safe_load(body[: close + 1])
    comment = body[close + 1 :].rstrip("\n")
    mapping[key] = value
    items = ", ".join(
        f"{k}: {_flow_value(v) if not isinstance(v, str) else _plain_scalar(v)}" for k, v in mapping.items()
    )
    return f"{section}: {{{items}}}{comment}\n"


def _plain_scalar(value: str) -> str:
    """A string as a YAML flow scalar (quoted only when it must be)."""
    return yaml.safe_dump(value, default_style=None).strip().removesuffix("...").strip()
