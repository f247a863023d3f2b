"""The layers of docs/architecture.md hold: the import-linter contract, no method names compared
outside core/, no method-section reads and no deployment-kind branches outside core/ (but the listed,
explained sites), a torch-free core."""

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


# ---- one home per method and per deployment kind ---------------------------------------------------
# Outside core/, stages ask the method (core/methods: `method_of(spec).draft_engine(spec)`, `heads_of`,
# `one_model_draft`, `speculative_model`, `extra_models`, `options_of`) and the repository kind
# (core/deployment.py RepoKind) instead of reading `spec.<method section>` or branching on `Flow.X` / backend
# and interface strings. The sites that still do are listed here with their reason; the test fails when a
# file gains one (ask the method or the kind instead) and when one goes (lower its count here).

# file -> (reads of spec.draft / .medusa / .ngram / .eagle3 (or getattr(spec, "<section>")), why)
SECTION_READS_ALLOWED: dict[str, tuple[int, str]] = {
    "specbuild/builder/eagle3_checks.py": (2, "EAGLE-3's own preflight rows (capture layers, draft folder)"),
    "specbuild/deploy/eagle3_draft.py": (6, "EAGLE-3's draft config in vLLM's and SGLang's numbering"),
    "specbuild/tuning/tune_ngram.py": (2, "n-gram's tuner edits ngram.max_matching_ngram_size"),
}
# file -> (comparisons with Flow.X or a repository backend / interface / flow string, why): none. Where the
# flows differ, stages ask the flow what its runtime does (core/facts/llmapi.py Flow: builds_engines,
# one_model_repo, one_kv_pool, runtime_floors_schedule, default_max_num_tokens) or the RepoKind.
KIND_BRANCHES_ALLOWED: dict[str, tuple[int, str]] = {}


def _sites(check) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.is_relative_to(PACKAGE / "core"):
            continue
        rel = path.relative_to(PACKAGE.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if check(node):
                found.setdefault(rel, []).append(f"{rel}:{node.lineno}: {ast.unparse(node)[:100]}")
    return found


def _section_read(node: ast.AST) -> bool:
    """`spec.<section>`, `x.spec.<section>`, `getattr(spec, "<section>")` for a method's section, or
    `getattr(spec, name)` with a name only known at run time."""
    from specbuild.core.methods import SECTIONS

    def specish(n: ast.AST) -> bool:
        return (isinstance(n, ast.Name) and n.id == "spec") or (
            isinstance(n, ast.Attribute) and n.attr == "spec"
        )

    if isinstance(node, ast.Attribute):
        return node.attr in SECTIONS and specish(node.value)
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and specish(node.args[0])
        and (not isinstance(node.args[1], ast.Constant) or node.args[1].value in SECTIONS)
    )


def _kind_branch(node: ast.AST) -> bool:
    """A comparison with `Flow.X`, or with a repository backend / interface / flow name as a string."""
    from specbuild.core.deployment import RepoKind
    from specbuild.core.facts.llmapi import Flow

    words = {k.backend for k in RepoKind} | {k.interface for k in RepoKind} | {f.value for f in Flow}
    if not isinstance(node, ast.Compare):
        return False
    for part in (node.left, *node.comparators):
        items = part.elts if isinstance(part, (ast.Tuple, ast.List, ast.Set)) else [part]
        for item in items:
            if isinstance(item, ast.Constant) and item.value in words:
                return True
            if (
                isinstance(item, ast.Attribute)
                and isinstance(item.value, ast.Name)
                and item.value.id == "Flow"
            ):
                return True
    return False


@pytest.mark.parametrize(
    ("check", "allowed"),
    [(_section_read, SECTION_READS_ALLOWED), (_kind_branch, KIND_BRANCHES_ALLOWED)],
    ids=["method-section-reads", "deployment-kind-branches"],
)
def test_no_method_section_or_kind_branch_outside_core(check, allowed):
    found = _sites(check)
    grown = {f: s for f, s in found.items() if len(s) > allowed.get(f, (0, ""))[0]}
    assert not grown, "ask the method (core/methods) or the RepoKind (core/deployment.py) instead:\n" + (
        "\n".join(line for sites in grown.values() for line in sites)
    )
    shrunk = {f: (len(found.get(f, [])), n) for f, (n, _) in allowed.items() if len(found.get(f, [])) < n}
    assert not shrunk, f"fewer sites than allowed (file: (found, allowed)): lower the allowance: {shrunk}"


def test_the_spec_assembles_method_sections_from_the_registry():
    """BuildSpec has one field per method section, typed by that method's section_type."""
    import typing

    from specbuild.core.methods import METHODS
    from specbuild.core.spec import BuildSpec

    hints = typing.get_type_hints(BuildSpec)
    for m in METHODS.values():
        if m.section is not None:
            assert m.section_type in typing.get_args(hints[m.section]), m.name


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
