"""Conversion errors: each names what is wrong, and no output folder is left behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.core.errors import CheckpointError, ConversionError, OutputExistsError
from specbuild.engines.trtllm.convert import convert_checkpoint
from specbuild.engines.trtllm.medusa import MedusaHeadsSource


def copy_model(src: Path, dst: Path, edit=None) -> Path:
    """A copy of an HF folder; `edit(state)` may change the tensors before they are saved."""
    dst.mkdir()
    shutil.copy(src / "config.json", dst / "config.json")
    state = load_file(src / "model.safetensors")
    if edit:
        edit(state)
    save_file(state, dst / "model.safetensors")
    return dst


def heads(folder: Path, *, n: int, layers: int, hidden: int, vocab: int, config: dict) -> Path:
    folder.mkdir()
    state = {}
    for h in range(n):
        for j in range(layers):
            state[f"{h}.{j}.linear.weight"] = torch.zeros(hidden, hidden)
            state[f"{h}.{j}.linear.bias"] = torch.zeros(hidden)
        state[f"{h}.{layers}.weight"] = torch.zeros(vocab, hidden)
    save_file(state, folder / "medusa_lm_head.safetensors")
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def no_leftovers(parent: Path) -> bool:
    return not any(p.name.startswith(".out") or p.name == "out" for p in parent.iterdir())


def test_no_weights(tiny_target, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tiny_target / "config.json", bare / "config.json")
    with pytest.raises(CheckpointError, match="no safetensors weights"):
        convert_checkpoint(bare, tmp_path / "out")
    assert no_leftovers(tmp_path)


def test_truncated_and_corrupt_safetensors(tiny_target, tmp_path):
    bad = copy_model(tiny_target, tmp_path / "bad")
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as exc:
        convert_checkpoint(bad, tmp_path / "out")
    assert "model.safetensors" in str(exc.value)
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        convert_checkpoint(bad, tmp_path / "out")
    assert no_leftovers(tmp_path)


def test_wrong_shape_names_the_tensor(tiny_target, tmp_path):
    name = "model.layers.1.mlp.up_proj.weight"

    def edit(state):
        state[name] = state[name][:-1].clone()

    bad = copy_model(tiny_target, tmp_path / "bad", edit)
    with pytest.raises(CheckpointError, match="wrong shape") as exc:
        convert_checkpoint(bad, tmp_path / "out")
    assert name in str(exc.value) and "[128, 64]" in str(exc.value)
    assert no_leftovers(tmp_path)


def test_missing_and_extra_tensors_are_named(tiny_target, tmp_path):
    name = "model.layers.0.self_attn.k_proj.weight"
    bad = copy_model(tiny_target, tmp_path / "missing", lambda s: s.pop(name))
    with pytest.raises(CheckpointError, match=f"missing tensor {name}"):
        convert_checkpoint(bad, tmp_path / "out")
    extra = copy_model(
        tiny_target, tmp_path / "extra", lambda s: s.update({"model.layers.0.mystery.weight": torch.zeros(2)})
    )
    with pytest.raises(CheckpointError, match="model.layers.0.mystery.weight"):
        convert_checkpoint(extra, tmp_path / "out")
    assert no_leftovers(tmp_path)


def test_tp_that_cannot_split(make_tiny, tiny_target, tmp_path):
    with pytest.raises(ConversionError, match="num_attention_heads=4 is not a multiple of tp_size=3"):
        convert_checkpoint(tiny_target, tmp_path / "out", tp_size=3)
    kv3 = make_tiny(
        "heads12_kv3",
        hidden_size=96,
        num_layers=1,
        num_heads=12,
        num_kv_heads=3,
        intermediate_size=96,
        seed=9,
    )
    with pytest.raises(ConversionError, match="num_key_value_heads=3 is not a multiple of tp_size=2"):
        convert_checkpoint(kv3, tmp_path / "out", tp_size=2)
    with pytest.raises(ConversionError, match="tp_size=4 is not a multiple of num_key_value_heads=3"):
        convert_checkpoint(kv3, tmp_path / "out", tp_size=4)
    with pytest.raises(ConversionError, match="more pipeline stages than layers"):
        convert_checkpoint(tiny_target, tmp_path / "out", pp_size=3)
    with pytest.raises(ConversionError, match="weight-only"):
        convert_checkpoint(tiny_target, tmp_path / "out", dtype="float32", weight_only="int8")


def test_medusa_counts_must_match_the_weights(tiny_target, tmp_path):
    h = heads(
        tmp_path / "heads",
        n=4,
        layers=1,
        hidden=64,
        vocab=384,
        config={"medusa_num_heads": 2, "medusa_num_layers": 1},
    )
    with pytest.raises(
        CheckpointError,
        match="num_medusa_heads mismatch: config.json 2 but medusa_lm_head.safetensors holds 4",
    ):
        convert_checkpoint(tiny_target, tmp_path / "out", medusa=MedusaHeadsSource(h))
    with pytest.raises(CheckpointError, match="--num-medusa-layers 2"):
        convert_checkpoint(
            tiny_target, tmp_path / "out", medusa=MedusaHeadsSource(h, num_heads=4, num_layers=2)
        )
    out = convert_checkpoint(
        tiny_target, tmp_path / "out", medusa=MedusaHeadsSource(h, num_heads=4)
    )  # the flag wins over config
    assert json.loads((out / "config.json").read_text())["num_medusa_heads"] == 4
    with pytest.raises(CheckpointError, match="no Medusa heads"):
        convert_checkpoint(tiny_target, tmp_path / "out2", medusa=MedusaHeadsSource(tmp_path))


def test_output_exists_refused_unless_force(tiny_draft, tmp_path):
    out = convert_checkpoint(tiny_draft, tmp_path / "out")
    (out / "marker").write_text("old")
    with pytest.raises(OutputExistsError):
        convert_checkpoint(tiny_draft, out)
    assert (out / "marker").exists()
    convert_checkpoint(tiny_draft, out, force=True)
    assert not (out / "marker").exists() and (out / "rank0.safetensors").exists()


def test_cli_convert_and_errors(tiny_draft, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["convert", str(tiny_draft), "--out", str(tmp_path / "c"), "--dtype", "float16"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "c" / "config.json").read_text())["dtype"] == "float16"
    res = runner.invoke(app, ["convert", str(tiny_draft), "--out", str(tmp_path / "c")])
    assert res.exit_code == 2 and "already exists" in res.output
    res = runner.invoke(app, ["convert", str(tiny_draft), "--out", str(tmp_path / "d"), "--tp-size", "3"])
    assert res.exit_code == 2 and "tp_size=3" in res.output


def test_medusa_pt_legacy_format_and_corrupt(tiny_target, tmp_path):
    folder = tmp_path / "heads"
    folder.mkdir()
    state = {
        "0.0.linear.weight": torch.zeros(64, 64),
        "0.0.linear.bias": torch.zeros(64),
        "0.1.weight": torch.zeros(384, 64),
    }
    torch.save(
        state, folder / "medusa_lm_head.pt", _use_new_zipfile_serialization=False
    )  # cannot be memory-mapped
    out = convert_checkpoint(tiny_target, tmp_path / "out", medusa=MedusaHeadsSource(folder))
    assert json.loads((out / "config.json").read_text())["num_medusa_heads"] == 1
    (folder / "medusa_lm_head.pt").write_bytes(b"not a pickle")
    with pytest.raises(CheckpointError, match="cannot load"):
        convert_checkpoint(tiny_target, tmp_path / "out2", medusa=MedusaHeadsSource(folder))
