"""ReferenceEngine.load on what `specbuild compile --engine reference` writes, and `specbuild generate`."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from specbuild.sampling_params import SamplingParams  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.numeric]



def _spec(tmp_path, text: str):
    from specbuild.builder.spec import load_spec

    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return load_spec(path)


@pytest.fixture(scope="module")
def dt_build(tiny_target, tiny_draft, tmp_path_factory):
    from specbuild.builder.compile import compile_spec

    root = tmp_path_factory.mktemp("dtbuild")
    spec = _spec(root, f"""
name: ref-dt
mode: draft_target
dtype: float32
target: {{model: {tiny_target}, tp_size: 2}}
draft: {{model: {tiny_draft}}}
speculation: {{max_draft_len: 3}}
build: {{max_batch_size: 2, max_input_len: 64, max_seq_len: 128}}
""")
    return compile_spec(spec, root / "out", engine="reference")


@pytest.fixture(scope="module")
def dt_engine(dt_build):
    from specbuild.engines.reference.engine import ReferenceEngine

    return ReferenceEngine.load(dt_build)


def test_load_build_folder_engine_folder_and_checkpoint(dt_build, dt_engine):
    from specbuild.engines.reference.engine import ReferenceEngine

    engine = dt_engine
    assert engine.mode == "draft_target" and engine.num_draft_tokens == 3
    assert engine.target.cfg.tp_size == 2 and engine.tokenizer_dir is not None
    prompt = engine.encode("def add(a, b):")
    spec = engine.generate(prompt, SamplingParams(max_tokens=12))
    plain = engine.generate(prompt, SamplingParams(max_tokens=12), speculative=False)
    assert spec.token_ids == plain.token_ids and spec.text == plain.text
    assert spec.speculative and spec.stats.drafted > 0 and not plain.speculative
    assert 0 < spec.timings["ttft"] <= spec.timings["total"]

    roles = json.loads((dt_build / "specbuild.json").read_text())["roles"]
    for sub in (roles["target"]["engine"], roles["target"]["checkpoint"]):
        alone = ReferenceEngine.load(dt_build / sub)
        assert alone.mode is None and alone.tokenizer_dir is not None  # found via the manifests
        assert alone.generate(prompt, SamplingParams(max_tokens=12)).token_ids == plain.token_ids


def test_generate_local_streams_the_same_text(dt_engine):
    from specbuild.engines.reference.api import generate_local

    chunks: list[str] = []
    result = generate_local(dt_engine, "import os", SamplingParams(max_tokens=10), on_text=chunks.append)
    assert "".join(chunks) == result.text and len(result.token_ids) <= 10
    params = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=3)
    a = generate_local(dt_engine, "import os", params, num_draft_tokens=2)
    assert a.token_ids == generate_local(dt_engine, "import os", params, num_draft_tokens=2).token_ids


def test_cli_generate_json(dt_build):
    from typer.testing import CliRunner

    from specbuild.cli import app

    runner = CliRunner()
    args = ["generate", "--engine", str(dt_build), "--prompt", "def add(a, b):", "--max-tokens", "8", "--json"]
    spec = runner.invoke(app, args)
    assert spec.exit_code == 0, spec.output
    out = json.loads(spec.stdout)
    assert set(out) >= {"text", "token_ids", "finish_reason", "stats", "speculative"} and out["speculative"]
    plain = json.loads(runner.invoke(app, args + ["--no-speculation"]).stdout)
    assert plain["token_ids"] == out["token_ids"] and not plain["speculative"]


def test_cli_errors_are_clear(dt_build, tmp_path):
    from typer.testing import CliRunner

    from specbuild.cli import app

    runner = CliRunner()
    both = runner.invoke(app, ["generate", "--engine", str(dt_build), "--url", "127.0.0.1:1", "--prompt", "x"])
    assert both.exit_code == 2 and "exactly one" in both.output
    missing = runner.invoke(app, ["generate", "--engine", str(tmp_path / "nope"), "--prompt", "x"])
    assert missing.exit_code == 2 and "not a folder" in missing.output


def test_medusa_build_uses_the_spec_tree(tiny_target, tmp_path):
    from safetensors.torch import save_file

    from specbuild.builder.compile import compile_spec
    from specbuild.engines.reference.engine import ReferenceEngine

    cfg = json.loads((tiny_target / "config.json").read_text())
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    heads = tmp_path / "heads"
    heads.mkdir()
    gen = torch.Generator().manual_seed(1)
    tensors = {}
    for i in range(2):
        tensors[f"{i}.0.linear.weight"] = 0.1 * torch.randn(h, h, generator=gen)
        tensors[f"{i}.0.linear.bias"] = torch.zeros(h)
        tensors[f"{i}.1.weight"] = 0.2 * torch.randn(v, h, generator=gen)
    save_file(tensors, str(heads / "medusa_lm_head.safetensors"))
    (heads / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    spec = _spec(tmp_path, f"""
name: ref-medusa
mode: medusa
dtype: float32
target: {{model: {tiny_target}}}
medusa: {{heads: {heads}, num_heads: 2, num_layers: 1, choices: [[0], [1], [0, 0]]}}
speculation: {{max_draft_len: 8}}
build: {{max_batch_size: 2, max_input_len: 64, max_seq_len: 128}}
""")
    build = compile_spec(spec, tmp_path / "out", engine="reference")
    engine = ReferenceEngine.load(build)
    assert engine.mode == "medusa" and engine.tree.num_nodes == 3
    prompt = engine.encode("Once upon a time")
    med = engine.generate(prompt, SamplingParams(max_tokens=10))
    assert med.token_ids == engine.generate(prompt, SamplingParams(max_tokens=10), speculative=False).token_ids
    assert med.stats.draft_passes == 0 and len(med.stats.accepted_per_step) >= 1
