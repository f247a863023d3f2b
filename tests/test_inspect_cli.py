"""`specbuild inspect` through the CLI: tables, --json, config-only folders, Medusa heads folders."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from specbuild.cli import app

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
runner = CliRunner()


def test_inspect_tiny_model_json(tiny_target):
    result = runner.invoke(app, ["inspect", str(tiny_target), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    cfg = out["config"]
    assert (
        cfg["architecture"],
        cfg["num_hidden_layers"],
        cfg["num_attention_heads"],
        cfg["num_key_value_heads"],
    ) == ("LlamaForCausalLM", 2, 4, 2)
    assert out["head_dim"] == 16 and out["family"] == "llama"
    # the count from config shapes equals the count from the safetensors headers
    assert out["weights"]["present"] and out["num_parameters"] == out["weights"]["num_parameters"]
    assert out["weight_bytes"] == 4 * out["num_parameters"]  # float32
    tok = out["tokenizer"]
    assert tok["vocab_size"] == cfg["vocab_size"] == 384
    assert tok["special_tokens"]["eos_token"] == {"token": "</s>", "id": 1}


def test_inspect_table_config_only_70b():
    result = runner.invoke(
        app, ["inspect", str(EXAMPLES / "models" / "llama-3.3-70b-instruct")], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    text = result.output
    assert "LlamaForCausalLM (llama)" in text and "64 / 8 (GQA)" in text
    assert "70,553,706,496 (70.55 B)" in text
    assert "rope_type llama3" in text and "factor 8.0" in text and "theta 500000" in text
    assert "absent (config only)" in text and "absent (no tokenizer.json" in text


def test_inspect_medusa_heads_folder():
    result = runner.invoke(app, ["inspect", str(EXAMPLES / "models" / "medusa-vicuna-7b-v1.3"), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["medusa"]["config heads x layers"] == "2 x 1"
    assert out["medusa"]["hidden / vocab"] == "4096 / 32000"


def test_inspect_missing_model_says_what_was_looked_for(tmp_path):
    result = runner.invoke(app, ["inspect", str(tmp_path / "nothing")])
    assert result.exit_code == 2
    assert "was not found" in result.output and str(tmp_path / "nothing") in result.output
    result = runner.invoke(app, ["inspect", "no-such-org/no-such-model"])
    assert result.exit_code == 2 and "huggingface-cli download no-such-org/no-such-model" in result.output
