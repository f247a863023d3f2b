"""What each command reads and writes, declared once in its signature, checked before it starts.

A command marks each path parameter with its role, beside its Typer option:
`out: Annotated[Path, typer.Option("--out", ...), OUT_DIR]`, `data: Annotated[Path, typer.Option(...),
INPUT("training data")]` (the label names it in messages; default: its option).

* `INPUT`: a file or folder the command reads;
* `SPEC`: a build spec: the file and every model folder it names (`BuildSpec.inputs`: the target and
  the method's own `extra_models`, so a new method's folders are covered by its declaration);
* `OUT_DIR`: a folder the command writes (replaced as a whole when the command has `--force`, else
  written into); `OUT_FILE`: a file it writes.

`check_paths` runs before every command (common.handle_errors): each output is refused when it is,
contains or lies inside any input (safe_io.guard_output: with or without --force, nothing a command
reads is ever replaced), and then checked by output_checks.check_output (the right kind, --force for
an existing one, writable now). A test walks every command of the app (tests/test_cli_paths.py).
"""

from __future__ import annotations

import functools
import os
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any


class Role(Enum):
    INPUT = "input"
    SPEC = "build spec"
    OUT_DIR = "output folder"
    OUT_FILE = "output file"


@dataclass(frozen=True)
class Declared:
    """A parameter's role, and what messages call it (`INPUT("HF model")`)."""

    role: Role
    label: str = ""

    def __call__(self, label: str) -> Declared:
        return Declared(self.role, label)


INPUT, SPEC = Declared(Role.INPUT), Declared(Role.SPEC)
OUT_DIR, OUT_FILE = Declared(Role.OUT_DIR), Declared(Role.OUT_FILE)
OUTPUTS = (Role.OUT_DIR, Role.OUT_FILE)
# Options that replace a top-level key of the spec before it is validated (`compile --flow llmapi`): the
# spec is read the way the command reads it.
SPEC_OVERRIDES = ("flow", "trtllm_version")


@dataclass(frozen=True)
class Param:
    role: Role
    spelling: str  # how the command line spells it: --out, SPEC
    label: str  # what messages call it


@functools.cache
def roles(fn: Callable[..., Any]) -> dict[str, Param]:
    """parameter name -> its declaration, for `fn`'s marked parameters."""
    found = {}
    for name, hint in typing.get_type_hints(fn, include_extras=True).items():
        meta = getattr(hint, "__metadata__", ())
        declared = next((m for m in meta if isinstance(m, Declared)), None)
        if declared is not None:
            spelling = _spelling(name, meta)
            found[name] = Param(declared.role, spelling, declared.label or spelling)
    return found


def _spelling(name: str, meta: tuple) -> str:
    for m in meta:  # in Annotated, typer.Option("--out") holds "--out" as its `default`
        decls = (getattr(m, "default", None), *(getattr(m, "param_decls", None) or ()))
        flags = [d for d in decls if isinstance(d, str) and d.startswith("--")]
        if flags:
            return flags[0]
        if hasattr(m, "metavar") and m.metavar:
            return m.metavar
    return name.upper()


def check_paths(fn: Callable[..., Any], values: dict[str, Any]) -> None:
    """Refuse the outputs of one invocation of `fn` (its arguments `values`) before it runs."""
    from specbuild.core.formats.output_checks import check_output
    from specbuild.core.formats.safe_io import guard_output

    declared = roles(fn)
    outputs = [(values[n], p) for n, p in declared.items() if p.role in OUTPUTS and values.get(n) is not None]
    if not outputs:
        return
    inputs = declared_inputs(declared, values)
    replaces = "force" in values  # the folder commands with --force replace their output as a whole
    for path, p in outputs:
        guard_output(path, inputs, option=p.spelling)
        folder = p.role is Role.OUT_DIR
        check_output(
            path,
            folder=folder,
            replaces=replaces and folder,
            force=bool(values.get("force")),
            option=p.spelling,
        )


def declared_inputs(declared: dict[str, Param], values: dict[str, Any]) -> dict[str, Path]:
    """label -> path of everything one invocation reads that exists here (a hub id names no path)."""
    from specbuild.core.spec import load_spec

    inputs: dict[str, Path] = {}
    overrides = {key: values.get(key) for key in SPEC_OVERRIDES}
    for name, p in declared.items():
        value = values.get(name)
        if value is None or p.role in OUTPUTS:
            continue
        if p.role is Role.SPEC:
            inputs.update(load_spec(value, validate_tree=False, overrides=overrides).inputs())
        elif os.path.lexists(os.path.expanduser(str(value))):
            inputs[p.label] = Path(os.path.expanduser(str(value)))
    return inputs
