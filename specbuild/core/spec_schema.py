"""The build spec described from its dataclasses: the JSON Schema and the rows of docs/spec.md.

One walk over `BuildSpec`'s fields (`dataclasses.fields`, type hints, defaults) gives every key's path,
type and default; a key's meaning is its field's `metadata["doc"]`, else the comments written beside and
above the field in the source (the dataclasses' comments are the one text of what a key means). Ranges
and choices are those the loader enforces: integer ranges from a field's `metadata["range"]` or the
loader's range table, the few checks the loader writes as code (`_CHECKED`, below) and enum types.
`tests/test_spec_schema.py` holds the schema and the loader to the same verdict on a table of specs.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import io
import json
import textwrap
import tokenize
import types
import typing
from dataclasses import dataclass
from typing import Any

from specbuild.core import spec as spec_module
from specbuild.core.facts.llmapi import LLMAPI_VERSIONS
from specbuild.core.facts.trtllm import known_versions
from specbuild.core.formats.medusa_choices import NAMED_TREES
from specbuild.core.methods import METHODS
from specbuild.core.methods.eagle3 import MAX_LAYER_INDEX
from specbuild.core.methods.ngram import MAX_MATCHING_NGRAM_SIZE
from specbuild.core.perf.schedule import MAX_THRESHOLD
from specbuild.core.spec import DTYPES, MAX_GPU_MEMORY_GB, MAX_STRING, QUANT, BuildSpec

SCHEMA_ID = "https://specbuild.invalid/spec.schema.json"  # names the schema; nothing is fetched from it
SCHEMA_FILE = "spec.schema.json"  # in specbuild/data/ (package data)
SKIP = frozenset({"source"})  # BuildSpec fields that are not spec keys

# What the loader checks in code rather than by type, by key path: JSON Schema keywords.
_CHECKED: dict[str, dict[str, Any]] = {
    "trtllm_version": {"enum": list(dict.fromkeys([*known_versions(), *LLMAPI_VERSIONS]))},
    "dtype": {"enum": list(DTYPES)},
    "build.weight_only": {"enum": list(QUANT)},
    "serving.kv_cache_free_gpu_mem_fraction": {"exclusiveMinimum": 0, "maximum": 1},
    "serving.gpu_memory_gb": {"exclusiveMinimum": 0, "maximum": MAX_GPU_MEMORY_GB},
    "speculation.guard.window": {"minimum": 1, "maximum": 4096},
    "speculation.guard.min_acceptance": {"minimum": 0, "maximum": 1},
    "ngram.max_matching_ngram_size": {"minimum": 1, "maximum": MAX_MATCHING_NGRAM_SIZE},
    # Fields typed Any: what their parsers accept (MedusaChoices.parse, DraftSchedule.parse, Eagle3).
    "medusa.choices": {
        "anyOf": [
            {"enum": sorted(NAMED_TREES)},
            {"type": "string", "pattern": r"^\s*[\[{]"},  # a Python-literal list or Triton's "{0, 0}, {1}"
            {"type": "array", "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
        ]
    },
    "speculation.schedule": {
        "type": ["object", "null"],
        "minProperties": 1,
        "required": ["1"],
        "propertyNames": {"pattern": "^[1-9][0-9]*$"},
        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": spec_module.MAX_DRAFT_LEN},
        "x-threshold-maximum": MAX_THRESHOLD,
    },
    "eagle3.layers_to_capture": {
        "type": ["array", "null"],
        "minItems": 1,
        "maxItems": 64,
        "uniqueItems": True,
        "items": {"type": "integer", "minimum": -1, "maximum": MAX_LAYER_INDEX - 1},
    },
}


@dataclass(frozen=True)
class Key:
    """One spec key: its dotted path, JSON type(s), default (as YAML would write it), range and meaning."""

    path: str
    type: str
    default: str
    range: str
    meaning: str
    required: bool


# ---- the walk -------------------------------------------------------------------------------------


def _plain(tp: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(tp))
    return tp, False


def _comments(cls: type) -> dict[str, str]:
    """field name -> the comments beside and directly above its line(s) in the class body."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # a class made at run time has no source: metadata["doc"] only
        return {}
    by_line: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            by_line[tok.start[0]] = tok.string.lstrip("#").strip()
    lines = source.splitlines()
    out: dict[str, str] = {}
    body = ast.parse(source).body[0]
    for node in getattr(body, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        above: list[str] = []
        n = node.lineno - 1
        while n >= 1 and lines[n - 1].strip().startswith("#"):
            above.insert(0, by_line.get(n, ""))
            n -= 1
        beside = [
            by_line[i] for i in range(node.lineno, (node.end_lineno or node.lineno) + 1) if i in by_line
        ]
        text = " ".join(t for t in above + beside if t and not t.startswith("noqa"))
        out[node.target.id] = text
    return out


def _integer_range(path: str, f: dataclasses.Field) -> tuple[int, int] | None:
    if "range" in f.metadata:
        return tuple(f.metadata["range"])  # type: ignore[return-value]
    section, _, key = path.rpartition(".")
    table = getattr(spec_module, "_RANGES", {})  # the loader's (section, key) -> (low, high, example)
    found = table.get((section, key))
    return (found[0], found[1]) if found else None


def _scalar_schema(tp: Any) -> dict[str, Any]:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        return {"type": "number"}
    if tp is str:  # the loader also takes a number and keeps its text
        return {"type": ["string", "number"], "maxLength": MAX_STRING}
    return {}  # Any: see _CHECKED


def _field_schema(path: str, f: dataclasses.Field, tp: Any) -> dict[str, Any]:
    inner, nullable = _plain(tp)
    if dataclasses.is_dataclass(inner):
        schema = _object_schema(inner, path + ".")
    else:
        schema = _scalar_schema(inner)
        bounds = _integer_range(path, f) if inner is int else None
        if bounds:
            schema |= {"minimum": bounds[0], "maximum": bounds[1]}
    checked = _CHECKED.get(path, {})
    if "enum" in checked:  # a closed list of strings: the type is the list's
        schema = {}
    schema |= checked
    if nullable and "type" in schema and "null" not in schema["type"]:
        types_ = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        schema["type"] = [*types_, "null"]
    elif nullable and "enum" in schema:
        schema["enum"] = [*schema["enum"], None]
    return schema


def _object_schema(cls: type, prefix: str) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    comments = _comments(cls)
    props: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        if f.name in SKIP:
            continue
        schema = _field_schema(prefix + f.name, f, hints[f.name])
        meaning = _meaning(f, comments, hints[f.name])
        if meaning:
            schema = {"description": meaning, **schema}
        default = _default(f)
        if default is not dataclasses.MISSING and not dataclasses.is_dataclass(_plain(hints[f.name])[0]):
            schema["default"] = default
        props[f.name] = schema
        if _required(f):
            required.append(f.name)
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = required
    return out


def _meaning(f: dataclasses.Field, comments: dict[str, str], tp: Any) -> str:
    text = f.metadata.get("doc") or comments.get(f.name, "")
    inner, _ = _plain(tp)
    if not text and dataclasses.is_dataclass(inner) and inner.__doc__:  # a section: its class docstring
        text = inner.__doc__.split("\n\n")[0]
    return " ".join(str(text).split())


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING  # type: ignore[misc]


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return dataclasses.MISSING
    return value.value if isinstance(value, enum.Enum) else value


# ---- the JSON Schema ------------------------------------------------------------------------------


def json_schema() -> dict[str, Any]:
    """The build spec's JSON Schema (draft 2020-12), with each method's section rule."""
    root = _object_schema(BuildSpec, "")
    rules = []
    sections = [m.section for m in METHODS.values() if m.section]
    for method in METHODS.values():
        forbidden = [s for s in sections if s != method.section]
        then: dict[str, Any] = {"properties": {s: False for s in forbidden}} if forbidden else {}
        if method.section and method.section_required:
            then["required"] = [method.section]
        if then:
            rules.append(
                {"if": {"properties": {"mode": {"const": method.name}}, "required": ["mode"]}, "then": then}
            )
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        "title": "specbuild build spec",
        "description": "One YAML file describes one speculative-decoding deployment (docs/spec.md).",
        **root,
        "allOf": rules,
    }


def schema_text() -> str:
    """The schema as written to specbuild/data/spec.schema.json (stable key order, final newline)."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


# ---- docs/spec.md ---------------------------------------------------------------------------------


def keys() -> list[Key]:
    """Every spec key, depth first in the dataclasses' order."""
    out: list[Key] = []
    _collect(json_schema(), "", True, out)
    return out


def _collect(schema: dict[str, Any], prefix: str, parent_required: bool, out: list[Key]) -> None:
    required = set(schema.get("required", ()))
    for name, sub in schema.get("properties", {}).items():
        path = prefix + name
        out.append(
            Key(
                path=path,
                type=_type_text(sub),
                default=_default_text(sub, name in required),
                range=_range_text(sub),
                meaning=sub.get("description", ""),
                required=name in required and parent_required,  # required in every spec
            )
        )
        if sub.get("type") in ("object", ["object", "null"]) and "properties" in sub:
            _collect(sub, path + ".", name in required and parent_required, out)


def _default_text(s: dict[str, Any], required: bool) -> str:
    if required:
        return ""
    if "default" in s:
        return _yaml(s["default"])
    if "properties" in s:  # a section
        return "null" if "null" in s.get("type", ()) else "its keys' defaults"
    return "-"


def _type_text(s: dict[str, Any]) -> str:
    if "properties" in s:
        return "section" + (" or null" if "null" in s.get("type", ()) else "")
    if "enum" in s and "type" not in s:
        return "string" if all(isinstance(v, str) for v in s["enum"]) else "one of"
    if "anyOf" in s:
        return "name or list"
    t = s.get("type", "any")
    t = [x for x in t if x != "number"] if isinstance(t, list) and "string" in t else t  # text; numbers kept
    return " or ".join(t) if isinstance(t, list) else t


def _range_text(s: dict[str, Any]) -> str:
    if "enum" in s:
        return " \\| ".join(_yaml(v) for v in s["enum"])
    if "anyOf" in s:
        names = next((a["enum"] for a in s["anyOf"] if "enum" in a), [])
        return "a named tree (" + ", ".join(names) + ") or a list of paths like [[0], [0, 0], [1]]"
    if "additionalProperties" in s and isinstance(s["additionalProperties"], dict):
        k = s["additionalProperties"]
        most = s["x-threshold-maximum"]
        return f"requests in flight (1..{most}, must have 1) -> K in {k['minimum']}..{k['maximum']}"
    if "items" in s:
        i = s["items"]
        count = f"{s.get('minItems', 0)}..{s.get('maxItems', '')}"
        return f"{count} distinct integers in {i['minimum']}..{i['maximum']}"
    low = s.get("minimum", s.get("exclusiveMinimum"))
    if low is None and "maximum" not in s:
        return f"at most {s['maxLength']} characters" if "maxLength" in s else ""
    left = "(" if "exclusiveMinimum" in s else "["
    if "integer" in s.get("type", ()):
        return f"{low}..{s['maximum']}"
    return f"{left}{low}, {s['maximum']}]"


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    return json.dumps(value)


def spec_markdown() -> str:
    """docs/spec.md: a table per top-level section."""
    lines = [
        "# The build spec: every key",
        "",
        "<!-- Generated by `make docs` from the spec dataclasses (specbuild/core/spec_schema.py). -->",
        "",
        "One YAML file describes one deployment; `specbuild check SPEC` validates it and the JSON Schema",
        f"`specbuild/data/{SCHEMA_FILE}` lets editors validate and complete it (every example's first line",
        "names it for the YAML language server). Model paths are relative to the spec file. A section that",
        "belongs to another method than `mode` is refused; the method's own section is required (n-gram's",
        "may be left out: its defaults apply).",
        "",
    ]
    rows = keys()
    groups: list[tuple[str, list[Key]]] = [("top level", [k for k in rows if "." not in k.path])]
    for top in (k for k in rows if "." not in k.path and k.type.startswith("section")):
        groups.append((f"`{top.path}`", [k for k in rows if k.path.startswith(top.path + ".")]))
    for title, group_rows in groups:
        lines += [f"## {title}", "", "| key | type | default | range | meaning |", "|---|---|---|---|---|"]
        for k in group_rows:
            default = "**required**" if k.default == "" else k.default
            lines.append(
                f"| `{k.path}` | {k.type} | {_cell(default)} | {_cell(k.range)} | {_cell(k.meaning)} |"
            )
        lines.append("")
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") if "\\|" not in text else text.replace("\n", " ")
