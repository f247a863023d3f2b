"""`compile` end to end on tiny models: reference engines, trtllm dry run, a fake trtllm-build, verify."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file
from typer.testing import CliRunner

from specbuild.builder.compile import compile_spec
from specbuild.cli import app
from specbuild.core.errors import BuildError
from specbuild.core.formats.manifest import read_manifest, verify_manifest
from specbuild.core.spec import load_spec


def write_spec(folder: Path, **raw) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture()
def dt_spec(tmp_path, tiny_target, tiny_draft):
    return write_spec(
        tmp_path / "spec",
        name="tiny",
        mode="draft_target",
        dtype="float32",
        target={"model": str(tiny_target), "tp_size": 2},
        draft={"model": str(tiny_draft)},
        speculation={"max_draft_len": 4},
        build={"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
    )


def test_compile_reference_draft_target(dt_spec, tmp_path, tiny_target):
    out = compile_spec(load_spec(dt_spec), tmp_path / "build", engine="reference")
    m = read_manifest(out, kind="build")
    assert (
        m["engine"] == "reference"
        and m["engine_built"] is True
        and m["tokenizer_dir"] == str(tiny_target.resolve())
    )
    assert m["spec"]["name"] == "tiny" and set(m["roles"]) == {"target", "draft"}
    # SpeculativeDecodingMode IntFlag integers, as trtllm-build's BuildConfig.to_dict() writes them
    assert (
        m["roles"]["target"]["speculative_decoding_mode"] == 2
        and m["roles"]["draft"]["speculative_decoding_mode"] == 1
    )
    assert m["roles"]["draft"]["max_draft_len"] == 0
    for role, world in (("target", 2), ("draft", 1)):
        eng = json.loads((out / role / "engine" / "config.json").read_text())
        ckpt = json.loads((out / role / "checkpoint" / "config.json").read_text())
        assert eng["pretrained_config"] == ckpt and eng["specbuild_engine"] == "reference"
        assert eng["build_config"]["max_draft_len"] == (4 if role == "target" else 0)
        for r in range(world):
            assert (out / role / "engine" / f"rank{r}.safetensors").read_bytes() == (
                out / role / "checkpoint" / f"rank{r}.safetensors"
            ).read_bytes()
        assert read_manifest(out / role / "engine", kind="engine")["engine"] == "reference"
    plan = json.loads((out / "plan.json").read_text())
    assert [r["role"] for r in plan["roles"]] == ["target", "draft"] and os.access(out / "build.sh", os.X_OK)
    assert not any(p.name.startswith(".build") for p in tmp_path.iterdir())
    # digests reused from nested manifests and hard links match a fresh hash of every file
    for folder in (out, out / "target" / "engine", out / "draft" / "engine", out / "target" / "checkpoint"):
        assert verify_manifest(folder) == []
    assert set(m["files"]) >= {
        "plan.json",
        "build.sh",
        "target/engine/rank1.safetensors",
        "draft/checkpoint/config.json",
    }


def test_compile_medusa_reference(tmp_path, tiny_target):
    heads = tmp_path / "heads"
    heads.mkdir()
    state = {}
    for h in range(2):
        state[f"{h}.0.linear.weight"] = torch.randn(64, 64)
        state[f"{h}.0.linear.bias"] = torch.randn(64)
        state[f"{h}.1.weight"] = torch.randn(384, 64)
    save_file(state, heads / "medusa_lm_head.safetensors")
    spec = write_spec(
        tmp_path / "spec",
        name="m",
        mode="medusa",
        dtype="float32",
        target={"model": str(tiny_target)},
        medusa={"heads": "../heads", "num_heads": 2, "num_layers": 1, "choices": [[0], [0, 0], [1]]},
        speculation={"max_draft_len": 3},
        build={"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
    )
    out = compile_spec(load_spec(spec), tmp_path / "build", engine="reference")
    assert not (out / "draft").exists()
    eng = json.loads((out / "target" / "engine" / "config.json").read_text())
    assert (
        eng["pretrained_config"]["architecture"] == "MedusaForCausalLM"
        and eng["pretrained_config"]["num_medusa_heads"] == 2
    )
    assert eng["pretrained_config"]["max_draft_len"] == 3 == eng["build_config"]["max_draft_len"]
    assert eng["build_config"]["speculative_decoding_mode"] == 4  # SpeculativeDecodingMode.MEDUSA
    assert read_manifest(out)["spec"]["medusa"]["choices"] == [[0], [0, 0], [1]]


def test_compile_refuses_a_spec_that_fails_preflight(tmp_path, tiny_target, tiny_draft):
    spec = write_spec(
        tmp_path / "spec",
        name="long",
        mode="draft_target",
        target={"model": str(tiny_target)},
        draft={"model": str(tiny_draft)},
        build={"max_seq_len": 4096},
    )
    with pytest.raises(BuildError, match="preflight failed") as exc:
        compile_spec(load_spec(spec), tmp_path / "build")
    assert "max_position_embeddings" in str(exc.value)
    assert not (tmp_path / "build").exists()


def test_compile_trtllm_dry_run_and_without_trtllm_build(dt_spec, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no trtllm-build here
    messages = []
    out = compile_spec(load_spec(dt_spec), tmp_path / "build", engine="trtllm", on_message=messages.append)
    m = read_manifest(out, kind="build")
    assert m["engine"] == "trtllm" and m["engine_built"] is False and m["roles"]["target"]["engine"] is None
    assert (
        not (out / "target" / "engine").exists()
        and (out / "target" / "checkpoint" / "rank1.safetensors").exists()
    )
    assert "build.sh" in messages[0] and "GPU host" in messages[0]


def _fake_trtllm_build(folder: Path, *, fail: bool) -> Path:
    folder.mkdir()
    script = folder / "trtllm-build"
    body = (
        'echo "building $*"; echo "boom: out of memory" >&2; exit 3'
        if fail
        else (
            'out=""; while [ $# -gt 0 ]; do if [ "$1" = --output_dir ]; then out=$2; fi; shift; done\n'
            'mkdir -p "$out"; echo "{}" > "$out/config.json"; echo engine > "$out/rank0.engine"; echo "built '
            '$out"'
        )
    )
    script.write_text("#!/usr/bin/env bash\n" + body + "\n")
    script.chmod(0o755)
    return folder


def test_compile_trtllm_runs_trtllm_build(dt_spec, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_trtllm_build(tmp_path / 'bin', fail=False)}:/usr/bin:/bin")
    out = compile_spec(load_spec(dt_spec), tmp_path / "build", engine="trtllm")
    assert read_manifest(out)["engine_built"] is True
    assert (out / "target" / "engine" / "rank0.engine").exists() and "built target/engine" in (
        out / "target" / "build.log"
    ).read_text()
    assert read_manifest(out / "target" / "engine", kind="engine")["engine"] == "trtllm"


def test_compile_trtllm_failure_shows_log_tail(dt_spec, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_trtllm_build(tmp_path / 'bin', fail=True)}:/usr/bin:/bin")
    with pytest.raises(BuildError, match="boom: out of memory") as exc:
        compile_spec(load_spec(dt_spec), tmp_path / "build", engine="trtllm")
    assert "exit 3" in str(exc.value)
    assert not (tmp_path / "build").exists()
    assert "boom" in (tmp_path / "build.target-build.log").read_text()


def test_cli_compile_and_verify_detects_changes(dt_spec, tmp_path):
    runner = CliRunner()
    out = tmp_path / "build"
    res = runner.invoke(app, ["compile", str(dt_spec), "--out", str(out), "--engine", "trtllm", "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "build.sh" in res.output
    res = runner.invoke(app, ["verify", str(out)])
    assert res.exit_code == 0 and "ok" in res.output
    rank = out / "target" / "checkpoint" / "rank1.safetensors"
    data = bytearray(rank.read_bytes())
    data[-1] ^= 0xFF
    rank.write_bytes(bytes(data))
    (out / "draft" / "checkpoint" / "config.json").unlink()
    res = runner.invoke(app, ["verify", str(out)])
    assert res.exit_code == 1
    assert "modified" in res.output and "rank1.safetensors" in res.output and "missing" in res.output
    res = runner.invoke(app, ["compile", str(dt_spec), "--out", str(out)])
    assert res.exit_code == 2 and "already exists" in res.output
