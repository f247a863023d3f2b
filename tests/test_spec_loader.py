"""The build spec loader: every error names the file, the key path and the fix; the examples load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specbuild.core.errors import SpecError
from specbuild.core.spec import load_spec, spec_from_dict

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

BASE = {
    "name": "t",
    "mode": "draft_target",
    "target": {"model": "target", "tp_size": 1},
    "draft": {"model": "draft"},
}


def write(tmp_path: Path, raw) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw) if not isinstance(raw, str) else raw)
    return path


def error_of(tmp_path: Path, raw) -> SpecError:
    path = write(tmp_path, raw)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = info.value.message()
    assert str(path) in message, message  # every error names the file
    assert info.value.fix, message  # ... and the fix
    return info.value


EXAMPLE_SPECS = sorted(str(p.relative_to(EXAMPLES)) for p in EXAMPLES.rglob("*.yaml"))


def test_examples_are_there():
    assert {
        "llama33-70b-1b.yaml",
        "medusa-vicuna-7b.yaml",
        "tiny/draft-target.yaml",
        "tiny/medusa.yaml",
    } <= set(EXAMPLE_SPECS)


@pytest.mark.parametrize("name", EXAMPLE_SPECS)
def test_example_specs_load(name):
    spec = load_spec(EXAMPLES / name)
    assert spec.source == (EXAMPLES / name).resolve()
    assert (
        spec.base_dir == (EXAMPLES / name).resolve().parent
    )  # model paths resolve against the spec's folder
    assert spec.to_dict()["name"] == spec.name


def test_seed_spec_values():
    spec = load_spec(EXAMPLES / "llama33-70b-1b.yaml")
    assert (spec.mode, spec.dtype, spec.target.tp_size, spec.draft.tp_size) == (
        "draft_target",
        "bfloat16",
        4,
        1,
    )
    assert spec.speculation.max_draft_len == 5 and spec.num_gpus == 4
    medusa = load_spec(EXAMPLES / "medusa-vicuna-7b.yaml")
    assert medusa.medusa.num_heads == 4 and medusa.medusa_choices().size == 63
    assert medusa.to_dict()["medusa"]["choices"][:3] == [[0], [0, 0], [1]]


def test_unknown_key_did_you_mean(tmp_path):
    err = error_of(tmp_path, {**BASE, "speculaton": {"max_draft_len": 4}})
    assert "unknown key speculaton" in err.what and err.fix == "did you mean 'speculation'?"
    err = error_of(tmp_path, {**BASE, "target": {"model": "m", "tp_szie": 2}})
    assert "unknown key target.tp_szie" in err.what and "'target.tp_size'" in err.fix
    err = error_of(tmp_path, {**BASE, "zzz": 1})
    assert "valid keys here" in err.fix


def test_wrong_types_name_key_path(tmp_path):
    err = error_of(tmp_path, {**BASE, "target": {"model": "m", "tp_size": "four"}})
    assert "target.tp_size has the wrong type" in err.what and "'four'" in err.found and err.expected == "int"
    err = error_of(tmp_path, {**BASE, "build": {"max_batch_size": True}})
    assert "build.max_batch_size" in err.what  # a bool is not an int
    err = error_of(tmp_path, {**BASE, "serving": [1, 2]})
    assert "serving must be a mapping" in err.what
    err = error_of(tmp_path, "- just\n- a list\n")
    assert "must be a mapping" in err.what


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"mode": "draft-target"}, "mode"),
        ({"dtype": "fp8"}, "dtype"),
        ({"target": {"model": "m", "tp_size": 0}}, "target.tp_size"),
        ({"speculation": {"max_draft_len": 0}}, "speculation.max_draft_len"),
        ({"build": {"max_input_len": 4096, "max_seq_len": 2048}}, "build.max_input_len"),
        ({"build": {"weight_only": "int3"}}, "build.weight_only"),
        ({"serving": {"kv_cache_free_gpu_mem_fraction": 1.5}}, "serving.kv_cache_free_gpu_mem_fraction"),
        ({"serving": {"gpu_memory_gb": 0}}, "serving.gpu_memory_gb"),
        ({"target": {"model": "m", "tp_size": 4}, "serving": {"num_gpus": 2}}, "serving.num_gpus"),
        ({"draft": None}, "draft"),
    ],
)
def test_impossible_values(tmp_path, change, key):
    err = error_of(tmp_path, {**BASE, **change})
    assert f"impossible value for {key}" in err.what, err.message()


def test_mode_typo_suggests(tmp_path):
    err = error_of(tmp_path, {**BASE, "mode": "draft-target"})
    assert err.fix == "did you mean 'draft_target'?"


def test_missing_required_key(tmp_path):
    raw = dict(BASE)
    del raw["target"]
    err = error_of(tmp_path, raw)
    assert "missing required key target" in err.what and "add target" in err.fix


def test_medusa_tree_errors(tmp_path):
    medusa = {
        "name": "m",
        "mode": "medusa",
        "target": {"model": "t"},
        "medusa": {"heads": "h", "num_heads": 2, "choices": [[0], [1, 1]]},
        "speculation": {"max_draft_len": 8},
    }
    err = error_of(tmp_path, medusa)
    assert "medusa.choices" in err.what and "needs its prefix [1]" in err.found
    # check reports the tree as a table row instead: load without tree validation
    spec = load_spec(write(tmp_path, medusa), validate_tree=False)
    assert spec.medusa_choices().problems(num_heads=2)
    # an unreadable tree is an error either way, and names the file and key
    err = error_of(tmp_path, {**medusa, "medusa": {"heads": "h", "choices": "mc_sim_7b_64"}})
    assert "medusa.choices" in err.what and "unknown Medusa tree name" in err.what


def test_yaml_syntax_and_missing_file(tmp_path):
    err = error_of(tmp_path, "name: [unclosed\n")
    assert "not valid YAML" in err.what
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "nope.yaml")


def test_spec_from_dict_roundtrip():
    spec = spec_from_dict({**BASE, "speculation": {"max_draft_len": 6}})
    again = spec_from_dict({k: v for k, v in spec.to_dict().items() if k != "source" and v is not None})
    assert again == spec


def test_check_cli_reports_spec_errors_with_exit_2(tmp_path):
    from typer.testing import CliRunner

    from specbuild.cli import app

    path = write(tmp_path, {**BASE, "bulid": {"max_batch_size": 4}})
    result = CliRunner().invoke(app, ["check", str(path)])
    assert result.exit_code == 2
    assert f"{path}: unknown key bulid" in result.output and "did you mean 'build'?" in result.output


def test_a_minimal_medusa_spec_has_consistent_defaults(tmp_path):
    """mode: medusa with only the heads path: the default tree (mc_sim_7b_63) sets max_draft_len to its
    size, so the spec validates and `check` passes on the example configs (weights absent: warnings)."""
    from typer.testing import CliRunner

    from specbuild.cli import app

    models = EXAMPLES / "models"
    path = tmp_path / "minimal.yaml"
    path.write_text(
        f"name: m\nmode: medusa\ntarget: {{model: {models / 'vicuna-7b-v1.3'}}}\n"
        f"medusa: {{heads: {models / 'medusa-vicuna-7b-v1.3'}}}\n"
    )
    spec = load_spec(path)
    assert spec.speculation.max_draft_len == spec.medusa_choices().size == 63
    result = CliRunner().invoke(app, ["check", str(path), "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["name"]: r["status"] for r in json.loads(result.output)["results"]}
    assert rows["medusa: tree"] == "pass" and "fail" not in rows.values()
