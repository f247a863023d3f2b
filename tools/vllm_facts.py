"""Write specbuild/data/vllm_<version>.json: the `vllm serve` flags and `--speculative-config` keys of one
vLLM release, read from its wheel's sources (no vLLM import: it needs a CUDA torch).

Usage (once per vLLM release the project targets):

    pip download vllm==0.33.0 --no-deps --only-binary :all: -d /tmp/w
    mkdir /tmp/w/x && cd /tmp/w/x && unzip -q ../vllm-0.33.0-*.whl
    python tools/vllm_facts.py /tmp/w/x /tmp/w/vllm-0.33.0-*.whl > specbuild/data/vllm_0.33.0.json

What it reads (python `ast`, nothing is executed):
* vllm/engine/arg_utils.py: every "--flag" / "-x" string literal given to an `add_argument(...)` call
  (EngineArgs.add_cli_args spells each engine flag out);
* vllm/entrypoints/common/cli_args.py: the fields of `BaseFrontendArgs` and `FrontendArgs` (their
  `add_cli_args` registers `--<field-with-dashes>` for each);
* vllm/config/speculative.py: the fields of `SpeculativeConfig` (the `--speculative-config` JSON keys;
  fields typed `SkipValidation[...]` are filled by vLLM itself and left out) and the `SpeculativeMethod`
  Literal, with the Literal aliases it names expanded;
* vllm/config/cache.py: the default of `gpu_memory_utilization`.
The wheel's sha256 and the RECORD hash of each file read go into the `source` note.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import json
import sys
from pathlib import Path

FILES = {
    "arg_utils": "vllm/engine/arg_utils.py",
    "cli_args": "vllm/entrypoints/common/cli_args.py",
    "speculative": "vllm/config/speculative.py",
    "cache": "vllm/config/cache.py",
}


def _tree(root: Path, key: str) -> ast.Module:
    return ast.parse((root / FILES[key]).read_text())


def engine_flags(tree: ast.Module) -> set[str]:
    flags = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("-"):
                    flags.add(arg.value)
    return flags


def class_fields(tree: ast.Module, name: str, *, skip_annotation: str | None = None) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            out = []
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    if skip_annotation and skip_annotation in ast.unparse(item.annotation):
                        continue
                    out.append(item.target.id)
            return out
    raise SystemExit(f"class {name} not found")


def literal_values(tree: ast.Module, name: str) -> list[str]:
    """The strings of a `Name = Literal[...]` alias, following aliases it names."""
    aliases = {
        n.targets[0].id: n.value
        for n in tree.body
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)
    }

    def walk(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Subscript):  # Literal[...]
            elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
            return [v for e in elts for v in walk(e)]
        if isinstance(node, ast.Constant):
            return [node.value]
        if isinstance(node, ast.Name):
            return walk(aliases[node.id])
        raise SystemExit(f"unexpected node in {name}: {ast.unparse(node)}")

    return walk(aliases[name])


def field_default(tree: ast.Module, cls: str, field: str) -> object:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and getattr(item.target, "id", None) == field:
                    value = item.value
                    if isinstance(value, ast.Call):  # Field(default=...)
                        value = next(k.value for k in value.keywords if k.arg == "default")
                    return ast.literal_eval(value)
    raise SystemExit(f"{cls}.{field} not found")


def record_hashes(root: Path) -> dict[str, str]:
    record = next(root.glob("vllm-*.dist-info/RECORD"))
    with open(record, newline="") as f:
        rows = {row[0]: row[1] for row in csv.reader(f) if len(row) >= 2}
    return {path: rows[path] for path in FILES.values()}


def main(root: str, wheel: str) -> None:
    root_p = Path(root)
    version = next(root_p.glob("vllm-*.dist-info")).name.removeprefix("vllm-").removesuffix(".dist-info")
    cli = _tree(root_p, "cli_args")
    frontend = class_fields(cli, "BaseFrontendArgs") + class_fields(cli, "FrontendArgs")
    flags = engine_flags(_tree(root_p, "arg_utils")) | {"--" + f.replace("_", "-") for f in frontend}
    spec = _tree(root_p, "speculative")
    digest = hashlib.sha256(Path(wheel).read_bytes()).digest()
    data = {
        "source": {
            "package": f"vllm=={version}",
            "wheel": Path(wheel).name,
            "wheel_sha256": digest.hex(),
            "files": record_hashes(root_p),
            "tool": "tools/vllm_facts.py (ast over the wheel's sources)",
            "note": "vllm serve MODEL: the model is the positional model_tag (vllm/entrypoints/cli/serve.py)",
        },
        "version": version,
        "serve_flags": sorted(flags),
        "speculative_config_keys": class_fields(spec, "SpeculativeConfig", skip_annotation="SkipValidation"),
        "speculative_methods": literal_values(spec, "SpeculativeMethod"),
        "defaults": {
            "gpu_memory_utilization": field_default(_tree(root_p, "cache"), "CacheConfig", "gpu_memory_utilization"),
            "host": field_default(cli, "FrontendArgs", "host"),
            "port": field_default(cli, "FrontendArgs", "port"),
        },
    }
    json.dump(data, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
