"""The layers of docs/architecture.md hold: the import-linter contract, no method names compared
outside core/, a torch-free core."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "specbuild"


def test_import_contract_is_kept():
    """pyproject.toml [tool.importlinter]: layers in pipeline order, independent engines, no cycles."""
    pytest.importorskip("importlinter")
    result = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports"))],
        capture_output=True,
        text=True,
        cwd=PACKAGE.parent,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_no_stage_compares_method_names():
    """Stages ask the method object (core/methods); `x == "medusa"` outside core/ is what this forbids."""
    from specbuild.core.methods import Method

    names = {m.value for m in Method}
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "core"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for part in (node.left, *node.comparators):
                    if isinstance(part, ast.Constant) and part.value in names:
                        found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert not found, found


def test_core_imports_no_heavy_package():
    code = (
        "import sys, pkgutil, importlib, specbuild.core as c\n"
        "for m in pkgutil.walk_packages(c.__path__, 'specbuild.core.'): importlib.import_module(m.name)\n"
        "print([h for h in ('torch', 'transformers', 'tritonclient', 'numpy', 'safetensors') if h in "
        "sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]"
