"""`specbuild check` on small specs next to tiny checkpoints: passes, and clear fails with fixes."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from specbuild.builder.preflight import run_checks
from specbuild.cli import app
from specbuild.core.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
runner = CliRunner()


def place_spec(tmp: Path, example: str, links: dict[str, Path], **overrides) -> Path:
    """Copy an examples/tiny spec into tmp, link the tiny models next to it, apply overrides."""
    raw = yaml.safe_load((EXAMPLES / "tiny" / example).read_text())
    for key, value in overrides.items():
        section, _, field = key.partition(".")
        if field:
            raw[section][field] = value
        else:
            raw[section] = value
    for name, folder in links.items():
        os.symlink(folder, tmp / name)
    path = tmp / example
    path.write_text(yaml.safe_dump(raw))
    return path


def rows(report) -> dict[str, tuple[str, str, str]]:
    return {r.name: (r.status, r.found, r.fix) for r in report.results}


@pytest.fixture(scope="module")
def other_tokenizer_model(tmp_path_factory, tiny_target):
    """A model whose tokenizer was trained on other text; its vocab_size is the target's."""
    from specbuild.demo.synthetic import make_model, train_tokenizer

    base = tmp_path_factory.mktemp("othertok")
    tok = train_tokenizer(base / "tok", ["Completely different words about cats, dogs and boats. "] * 40)
    target_vocab = json.loads((tiny_target / "config.json").read_text())["vocab_size"]
    make_model(
        base / "model",
        tok,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        vocab_size=target_vocab,
    )
    return base / "model"


def test_tiny_draft_target_passes(tmp_path, tiny_target, tiny_draft):
    spec = place_spec(tmp_path, "draft-target.yaml", {"target": tiny_target, "draft": tiny_draft})
    result = runner.invoke(app, ["check", str(spec)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "OK:" in result.output and "0 fail" in result.output
    report = run_checks(load_spec(spec))
    assert report.ok
    r = rows(report)
    assert r["tokenizer"][0] == "pass" and "same vocabulary" in r["tokenizer"][1]
    assert r["vocab size"][0] == "pass" and r["target: weights"][0] == "pass"
    assert r["memory plan"][0] == "pass"
    plan = report.plan
    t, d = plan.engine("target"), plan.engine("draft")
    assert 0 < plan.target_kv_fraction <= 1 and 0 < plan.draft_kv_fraction <= 1
    assert t.kv_tokens == d.kv_tokens == plan.kv_tokens > 0


def test_mismatched_tokenizer_fails_with_fix(tmp_path, tiny_target, other_tokenizer_model):
    spec = place_spec(tmp_path, "draft-target.yaml", {"target": tiny_target, "draft": other_tokenizer_model})
    result = runner.invoke(app, ["check", str(spec), "--json"])
    assert result.exit_code == 1
    out = {r["name"]: r for r in json.loads(result.output)["results"]}
    tok = out["tokenizer"]
    assert tok["status"] == "fail"
    assert "vocabulary differs" in tok["found"] and "merges differ" in tok["found"]
    assert "same vocabulary" in tok["fix"]
    assert out["vocab size"]["status"] == "pass"  # same vocab_size: only the tokenizer row catches it


def test_vocab_size_mismatch_fails(tmp_path, tiny_target, make_tiny):
    big = make_tiny(
        "bigvocab",
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
        vocab_size=512,
    )
    spec = place_spec(tmp_path, "draft-target.yaml", {"target": tiny_target, "draft": big})
    report = run_checks(load_spec(spec))
    status, found, fix = rows(report)["vocab size"]
    assert not report.ok and status == "fail"
    assert "target vocab_size 384, draft vocab_size 512" in found and "same tokenizer" in fix


def test_impossible_tp_names_valid_sizes(tmp_path, tiny_target, tiny_draft):
    spec = place_spec(
        tmp_path,
        "draft-target.yaml",
        {"target": tiny_target, "draft": tiny_draft},
        **{"target.tp_size": 3, "serving.num_gpus": 3},
    )
    report = run_checks(load_spec(spec))
    status, found, fix = rows(report)["target: tensor parallel"]
    assert status == "fail"
    assert "num_attention_heads 4 is not divisible by tp_size 3" in found
    assert fix == "set target.tp_size to one of 1, 2, 4"


def test_kv_duplication_case(tmp_path, tiny_target, tiny_draft):
    # target: 4 heads, 2 KV heads; tp 4 > 2 KV heads is valid (each KV head stored twice)
    spec = place_spec(
        tmp_path, "draft-target.yaml", {"target": tiny_target, "draft": tiny_draft}, **{"target.tp_size": 4}
    )
    report = run_checks(load_spec(spec))
    status, found, _ = rows(report)["target: tensor parallel"]
    assert status == "pass" and "duplicated x2" in found
    assert report.plan.engine("target").kv_duplication == 2


def test_config_only_folder_warns_and_still_plans(tmp_path, tiny_target, tiny_draft):
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(tiny_target / "config.json", bare / "config.json")
    spec = place_spec(tmp_path, "draft-target.yaml", {"target": bare, "draft": tiny_draft})
    report = run_checks(load_spec(spec))
    r = rows(report)
    assert report.ok
    assert r["target: weights"][0] == "warn" and "config.json only" in r["target: weights"][1]
    assert r["tokenizer"][0] == "warn" and "skipped" in r["tokenizer"][1]
    assert r["vocab size"][0] == "pass" and report.plan is not None


def test_missing_model_fails_with_path(tmp_path, tiny_draft):
    spec = place_spec(tmp_path, "draft-target.yaml", {"draft": tiny_draft})
    result = runner.invoke(app, ["check", str(spec), "--json"])
    assert result.exit_code == 1
    out = {r["name"]: r for r in json.loads(result.output)["results"]}
    assert out["target: model"]["status"] == "fail"
    assert str(tmp_path / "target") in out["target: model"]["found"]
    assert out["memory plan"]["status"] == "fail"


def test_memory_fail_suggests_tp(tmp_path):
    spec = tmp_path / "big.yaml"
    raw = yaml.safe_load((EXAMPLES / "llama33-70b-1b.yaml").read_text())
    raw["target"]["tp_size"] = 1
    raw["serving"]["gpu_memory_gb"] = 80
    for key in ("target", "draft"):
        raw[key]["model"] = str(EXAMPLES / raw[key]["model"])
    spec.write_text(yaml.safe_dump(raw))
    status, found, fix = rows(run_checks(load_spec(spec)))["memory plan"]
    assert status == "fail" and "serving.gpu_memory_gb is 80" in found
    assert "set target.tp_size: 2" in fix


# ---- Medusa ----------------------------------------------------------------------------------------


def write_heads(
    folder: Path, *, num_heads: int, num_layers: int, hidden: int, vocab: int, config_heads: int | None = None
) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    tensors = {}
    for h in range(num_heads):
        for j in range(num_layers):
            tensors[f"{h}.{j}.linear.weight"] = torch.zeros(hidden, hidden)
            tensors[f"{h}.{j}.linear.bias"] = torch.zeros(hidden)
        tensors[f"{h}.{num_layers}.weight"] = torch.zeros(vocab, hidden)
    save_file(tensors, str(folder / "medusa_lm_head.safetensors"))
    cfg = {
        "medusa_num_heads": config_heads or num_heads,
        "medusa_num_layers": num_layers,
        "base_model_name_or_path": "tiny",
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_tiny_medusa_passes(tmp_path, tiny_target):
    heads = write_heads(tmp_path / "h", num_heads=3, num_layers=1, hidden=64, vocab=384)
    spec = place_spec(tmp_path, "medusa.yaml", {"target": tiny_target, "medusa_heads": heads})
    report = run_checks(load_spec(spec))
    r = rows(report)
    assert report.ok, report.results
    assert r["medusa: head counts"][0] == "pass" and r["medusa: shapes"][0] == "pass"
    assert r["medusa: tree"][0] == "pass" and "5 nodes, depth 3" in r["medusa: tree"][1]
    assert report.plan.engine("target").medusa_bytes == 3 * (64 * 64 + 64 + 384 * 64) * 4


def test_medusa_head_count_and_shape_mismatch_fail(tmp_path, tiny_target):
    heads = write_heads(tmp_path / "h", num_heads=2, num_layers=1, hidden=64, vocab=500)
    spec = place_spec(tmp_path, "medusa.yaml", {"target": tiny_target, "medusa_heads": heads})
    r = rows(run_checks(load_spec(spec)))
    assert r["medusa: head counts"][0] == "fail"
    assert "holds 2 heads x 1 ResBlocks; the spec says num_heads 3" in r["medusa: head counts"][1]
    assert r["medusa: head counts"][2] == "set medusa.num_heads: 2 and medusa.num_layers: 1"
    assert r["medusa: shapes"][0] == "fail" and "vocab 500 vs target 384" in r["medusa: shapes"][1]


def test_bad_tree_is_a_failed_row(tmp_path, tiny_target):
    heads = write_heads(tmp_path / "h", num_heads=3, num_layers=1, hidden=64, vocab=384, config_heads=2)
    spec = place_spec(
        tmp_path,
        "medusa.yaml",
        {"target": tiny_target, "medusa_heads": heads},
        **{"medusa.choices": [[0], [1, 0], [0, 0, 0, 0]], "speculation.max_draft_len": 2},
    )
    result = runner.invoke(app, ["check", str(spec), "--json"])
    assert result.exit_code == 1
    out = {r["name"]: r for r in json.loads(result.output)["results"]}
    tree = out["medusa: tree"]
    assert tree["status"] == "fail"
    assert "path [1, 0] needs its prefix [1]" in tree["found"]
    assert "4 deep but the model has 3 Medusa heads" in tree["found"]
    assert "3 nodes but max_draft_len is 2" in tree["found"]
    # the heads' config.json disagrees with the weights: a warning that says the weights decide
    assert (
        out["medusa: config.json"]["status"] == "warn"
        and "weights decide" in out["medusa: config.json"]["fix"]
    )


def test_example_specs_check_offline():
    for name in ("llama33-70b-1b.yaml", "medusa-vicuna-7b.yaml"):
        result = runner.invoke(app, ["check", str(EXAMPLES / name)], env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "memory plan" in result.output and "kv_cache_free_gpu_mem_fraction" in result.output
        assert "config.json only" in result.output  # weights absent: a warning, not a fail


def test_weights_that_disagree_with_config_warn_and_broken_header_fails(tmp_path, tiny_target, tiny_draft):
    odd = tmp_path / "odd"
    shutil.copytree(tiny_target, odd)
    cfg = json.loads((odd / "config.json").read_text())
    cfg["intermediate_size"] = 256  # the weights were saved with 128
    (odd / "config.json").write_text(json.dumps(cfg))
    spec = place_spec(tmp_path, "draft-target.yaml", {"target": odd, "draft": tiny_draft})
    status, found, fix = rows(run_checks(load_spec(spec)))["target: weights"]
    assert status == "warn" and "config.json's shapes make" in found and "specbuild inspect" in fix
    (odd / "model.safetensors").write_bytes(b"\xff" * 16)  # truncated download
    status, found, fix = rows(run_checks(load_spec(spec)))["target: weights"]
    assert status == "fail" and "safetensors header" in found and "re-download" in fix


def config_only(tmp: Path, source: Path, name: str, **changes) -> Path:
    folder = tmp / name
    folder.mkdir()
    cfg = json.loads((source / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def test_architecture_and_pipeline_rows(tmp_path, tiny_target, tiny_draft, tiny_qwen2):
    neox = config_only(tmp_path, tiny_target, "neox", architectures=["GPTNeoXForCausalLM"])
    spec = place_spec(
        tmp_path,
        "draft-target.yaml",
        {"target": neox, "draft": tiny_draft},
        **{"target.pp_size": 3, "serving.num_gpus": 3},
    )
    r = rows(run_checks(load_spec(spec)))
    assert (
        r["target: architecture"][0] == "fail"
        and "GPTNeoXForCausalLM is not supported" in r["target: architecture"][1]
    )
    assert "Qwen2ForCausalLM" in r["target: architecture"][2]
    assert (
        r["target: pipeline parallel"][0] == "fail"
        and "pp_size 3 > 2 layers" in r["target: pipeline parallel"][1]
    )

    qwen = config_only(tmp_path, tiny_qwen2, "qwen")
    spec2 = tmp_path / "q"
    spec2.mkdir()
    spec2 = place_spec(spec2, "draft-target.yaml", {"target": qwen, "draft": tiny_draft})
    r = rows(run_checks(load_spec(spec2)))
    assert r["target: architecture"][0] == "pass" and "(qwen2)" in r["target: architecture"][1]


def test_sequence_length_and_dtype_rows(tmp_path, tiny_target, tiny_draft):
    short = config_only(
        tmp_path, tiny_target, "short", max_position_embeddings=100, torch_dtype="bfloat16", dtype="bfloat16"
    )
    spec = place_spec(tmp_path, "draft-target.yaml", {"target": short, "draft": tiny_draft}, dtype="float16")
    r = rows(run_checks(load_spec(spec)))
    assert (
        r["target: sequence length"][0] == "fail"
        and r["target: sequence length"][2] == "set build.max_seq_len <= 100"
    )
    assert r["target: dtype"][0] == "warn" and "bfloat16" in r["target: dtype"][2]


def test_sliding_window_and_bad_config_values(tmp_path, tiny_target, tiny_draft):
    mistral = config_only(
        tmp_path,
        tiny_target,
        "mistral",
        architectures=["MistralForCausalLM"],
        model_type="mistral",
        sliding_window=64,
    )
    spec = place_spec(tmp_path, "draft-target.yaml", {"target": mistral, "draft": tiny_draft})
    r = rows(run_checks(load_spec(spec)))
    assert (
        r["target: sequence length"][0] == "warn"
        and "sliding_window 64 < max_seq_len 128" in r["target: sequence length"][1]
    )
    broken = config_only(tmp_path, tiny_target, "broken", hidden_size="64")
    (tmp_path / "target").unlink()
    os.symlink(broken, tmp_path / "target")
    status, found, fix = rows(run_checks(load_spec(spec)))["target: model"]
    assert status == "fail" and "impossible hidden_size" in found and "'64'" in found


def test_medusa_heads_as_torch_pt_and_corrupt(tmp_path, tiny_target):
    import torch

    from specbuild.core.formats.medusa_heads import read_medusa_heads

    folder = tmp_path / "pt"
    folder.mkdir()
    state = {
        "0.0.linear.weight": torch.zeros(64, 64),
        "0.0.linear.bias": torch.zeros(64),
        "0.1.weight": torch.zeros(384, 64),
        "1.0.linear.weight": torch.zeros(64, 64),
        "1.0.linear.bias": torch.zeros(64),
        "1.1.weight": torch.zeros(384, 64),
    }
    torch.save(state, folder / "medusa_lm_head.pt")
    info = read_medusa_heads(folder)
    assert (info.num_heads, info.num_layers, info.hidden_size, info.vocab_size, info.problems) == (
        2,
        1,
        64,
        384,
        (),
    )
    (folder / "medusa_lm_head.pt").write_bytes(b"not a torch file")
    spec = place_spec(tmp_path, "medusa.yaml", {"target": tiny_target, "medusa_heads": folder})
    status, found, fix = rows(run_checks(load_spec(spec)))["medusa: heads"]
    assert (
        status == "fail" and "cannot load" in found and "re-download" in fix
    )  # one reader of heads folders: check and convert say the same
