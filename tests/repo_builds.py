"""Tiny `specbuild compile` outputs for the model-repository tests (reference engines, CPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "tiny"


def make_heads(folder: Path, *, hidden: int, vocab: int, heads: int, layers: int = 1, seed: int = 0) -> Path:
    """Random HF Medusa heads ({h}.{j}.linear.weight|bias, {h}.{layers}.weight)."""
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    state = {}
    for h in range(heads):
        for j in range(layers):
            state[f"{h}.{j}.linear.weight"] = torch.randn(hidden, hidden, generator=g) * 0.02
            state[f"{h}.{j}.linear.bias"] = torch.zeros(hidden)
        state[f"{h}.{layers}.weight"] = torch.randn(vocab, hidden, generator=g) * 0.02
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, folder / "medusa_lm_head.safetensors")
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": heads, "medusa_num_layers": layers}))
    return folder


def compile_tiny(
    workdir: Path, mode: str, *, target: Path, draft: Path | None = None, engine: str = "reference"
) -> Path:
    """Place the tiny models beside a copy of examples/tiny/<spec>.yaml and compile reference engines."""
    from specbuild.builder.compile import compile_spec
    from specbuild.core.spec import load_spec

    workdir.mkdir(parents=True, exist_ok=True)
    spec_name = f"{mode.replace('_', '-')}.yaml"  # examples/tiny/draft-target.yaml, medusa.yaml, ngram.yaml
    shutil.copy(EXAMPLES / spec_name, workdir / spec_name)
    shutil.copytree(target, workdir / "target")
    if draft is not None:
        shutil.copytree(draft, workdir / "draft")
    if mode == "medusa":
        cfg = json.loads((target / "config.json").read_text())
        make_heads(workdir / "medusa_heads", hidden=cfg["hidden_size"], vocab=cfg["vocab_size"], heads=3)
    return compile_spec(load_spec(workdir / spec_name), workdir / "build", engine=engine)


def compile_tiny_llmapi(workdir: Path, *, target: Path, draft: Path) -> Path:
    """examples/tiny/draft-target.yaml on the LLM-API flow with reference engines (what the local LLM-API
    model serves), max_seq_len 128."""
    import yaml

    from specbuild.builder.compile import compile_spec
    from specbuild.core.spec import load_spec

    raw = yaml.safe_load((EXAMPLES / "draft-target.yaml").read_text())
    raw["build"].update(max_seq_len=128, max_input_len=64)
    raw["flow"] = "llmapi"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "spec.yaml").write_text(yaml.safe_dump(raw))
    for name, folder in {"target": target, "draft": draft}.items():
        shutil.copytree(folder, workdir / name)
    return compile_spec(load_spec(workdir / "spec.yaml"), workdir / "build", engine="reference")


_BUILDS: dict[tuple, Path] = {}


def cached_build(tmp_path_factory, name: str, mode: str, *, target: Path, draft: Path | None = None) -> Path:
    """compile_tiny once per session and name (several test modules share the builds)."""
    key = (name, mode, str(target), str(draft))
    if key not in _BUILDS:
        _BUILDS[key] = compile_tiny(
            tmp_path_factory.mktemp(f"build-{name}"), mode, target=target, draft=draft
        )
    return _BUILDS[key]


def repo_text(repo: Path, *, replace: dict[str, str]) -> str:
    """Every config.pbtxt and the file list of a repository, with machine paths replaced (golden files)."""
    parts = ["# files"]
    parts += [
        p.relative_to(repo).as_posix()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and p.name != "specbuild.json" and "__pycache__" not in p.parts
    ]
    for path in sorted(repo.glob("*/config.pbtxt")):
        parts += [f"# {path.relative_to(repo).as_posix()}", path.read_text().rstrip("\n")]
    text = "\n".join(parts) + "\n"
    for old, new in sorted(replace.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(old, new)
    return text
