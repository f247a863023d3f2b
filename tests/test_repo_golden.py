"""Golden files: the whole generated repository (file list + every config.pbtxt), both modes, both backends.

Regenerate after an intended change with:
    SPECBUILD_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/test_repo_golden.py
and review the diff of tests/data/golden/ before committing. Machine paths become <WORK>.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from repo_builds import cached_build, repo_text

from specbuild.model_repo.generate import generate_repo

GOLDEN = Path(__file__).parent / "data" / "golden"


@pytest.fixture(scope="module")
def builds(tmp_path_factory, tiny_target, tiny_draft):
    return {
        "draft_target": cached_build(
            tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft
        ),
        "medusa": cached_build(tmp_path_factory, "medusa", "medusa", target=tiny_target),
        "ngram": cached_build(tmp_path_factory, "ngram", "ngram", target=tiny_target),
    }


@pytest.mark.parametrize("mode", ["draft_target", "medusa", "ngram"])
@pytest.mark.parametrize("backend", ["tensorrtllm", "python"])
def test_repository_matches_golden(builds, tmp_path, mode, backend):
    build = builds[mode]
    repo = generate_repo(build, tmp_path / "repo", backend=backend)
    text = repo_text(repo, replace={str(build.parent): "<WORK>"})
    assert "${" not in text  # no template placeholder can survive: there are no templates
    golden = GOLDEN / f"{mode}_{backend}.txt"
    if os.environ.get("SPECBUILD_UPDATE_GOLDEN"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_text(text)
    assert golden.is_file(), f"missing {golden}: run with SPECBUILD_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), (
        f"{golden.name} differs: regenerate with SPECBUILD_UPDATE_GOLDEN=1 if intended"
    )


def test_engine_root_rewrites_engine_paths(builds, tmp_path):
    repo = generate_repo(
        builds["draft_target"],
        tmp_path / "repo",
        backend="tensorrtllm",
        engine_root="/engines",
        tokenizer_dir="/tokenizer",
    )
    target = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    draft = (repo / "tensorrt_llm_draft" / "config.pbtxt").read_text()
    assert 'string_value: "/engines/target/engine"' in target
    assert 'string_value: "/engines/draft/engine"' in draft
    assert 'string_value: "/tokenizer"' in (repo / "preprocessing" / "config.pbtxt").read_text()
    assert str(builds["draft_target"]) not in target


@pytest.mark.parametrize("mode", ["draft_target", "ngram"])
def test_production_bls_vendors_a_self_contained_loop(builds, tmp_path, mode):
    """In the NVIDIA container specbuild is not installed: the BLS must find every module in vendor/."""
    import ast
    import subprocess
    import sys

    repo = generate_repo(builds[mode], tmp_path / "repo", backend="tensorrtllm")
    bls = repo / "tensorrt_llm_bls" / "1"
    vendor = bls / "vendor"
    # Statically: every specbuild module any BLS file imports (even lazily, inside functions) is vendored.
    for path in [*bls.glob("*.py"), *vendor.rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [node.module]
                if isinstance(node, ast.ImportFrom) and node.module
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            for name in (n for n in names if n == "specbuild" or n.startswith("specbuild.")):
                rel = name.replace(".", "/")
                assert (vendor / f"{rel}.py").is_file() or (vendor / rel / "__init__.py").is_file(), (
                    f"{path.name} imports {name}"
                )
    # Dynamically (torch-free part): the loop and the BLS core import from vendor/ only.
    code = f"""
import sys
sys.path[:0] = [{str(vendor)!r}, {str(bls)!r}]
import bls_core, trtllm_semantics, specbuild.engines.reference.speculative
assert trtllm_semantics.sampling_params(max_tokens=4, temperature=None, top_k=None, top_p=None, seed=None,
end_id=2).greedy
factory = bls_core.NGramDrafter.configure(lambda key, default: default, model_dir={str(tmp_path)!r})
assert type(factory.public).__name__ == "SharedPatternStore"  # the n-gram pool, with its sqlite store
print([m.__file__ for n, m in sys.modules.items() if n.startswith("specbuild") and not
m.__file__.startswith({str(vendor)!r})])
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_production_refuses_a_memory_plan_without_kv_room(builds, tmp_path):
    import json
    import shutil

    from specbuild.core.errors import RepoError

    build = shutil.copytree(builds["draft_target"], tmp_path / "build")
    manifest = json.loads((build / "specbuild.json").read_text())
    manifest["spec"]["serving"]["gpu_memory_gb"] = 2.0005  # the 2 GiB runtime reserve leaves nothing
    (build / "specbuild.json").write_text(json.dumps(manifest))
    with pytest.raises(RepoError, match="no room for the KV cache"):
        generate_repo(build, tmp_path / "prod", backend="tensorrtllm")
    local = generate_repo(build, tmp_path / "local", backend="python")  # fractions unused locally: even split
    assert 'string_value: "0.45"' in (local / "tensorrt_llm" / "config.pbtxt").read_text()


def test_backend_defaults_to_the_build_engine(builds, tmp_path):
    import json

    repo = generate_repo(builds["medusa"], tmp_path / "repo")  # a reference build: local Python models
    manifest = json.loads((repo / "specbuild.json").read_text())
    assert (
        manifest["kind"] == "model_repo" and manifest["backend"] == "python" and manifest["mode"] == "medusa"
    )
    assert 'backend: "python"' in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert set(manifest["files"]) >= {
        "tensorrt_llm/config.pbtxt",
        "tensorrt_llm/1/model.py",
        "ensemble/config.pbtxt",
    }
