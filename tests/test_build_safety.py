"""Nothing lost, everything bounded, a clear error for each bad input (issue 12, build side).

Each test is one case a careless or hostile user hit; each failed (lost data, hung, or printed a
traceback) on the code before the fix.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from repo_builds import cached_build
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.core.errors import CheckpointError, SpecbuildError, SpecError, TrainingError

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def builds(tmp_path_factory, tiny_target, tiny_draft):
    return {
        "draft_target": cached_build(
            tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft
        )
    }


@pytest.fixture
def model(tiny_draft, tmp_path):
    """A private copy of a tiny HF model (tests may try to destroy it)."""
    return shutil.copytree(tiny_draft, tmp_path / "model")


def write_spec(path: Path, **changes) -> Path:
    raw = {
        "name": "t",
        "mode": "draft_target",
        "dtype": "float32",
        "target": {"model": "target"},
        "draft": {"model": "draft"},
        "speculation": {"max_draft_len": 4},
        "build": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
        "serving": {"gpu_memory_gb": 4},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            raw.setdefault(section, {})[field] = value
        else:
            raw[section] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(raw))
    return path


# ---- severe 1: --force never destroys an input -------------------------------------------------


def test_convert_out_equal_to_the_source_is_refused(model):
    before = tree(model)
    result = run("convert", str(model), "--out", str(model), "--force")
    assert (
        result.exit_code == 2 and "HF model" in result.output and "which this command reads" in result.output
    )
    assert tree(model) == before


def test_convert_out_inside_the_source_or_through_a_symlink_is_refused(model, tmp_path):
    assert run("convert", str(model), "--out", str(model / "trt")).exit_code == 2
    (tmp_path / "link").symlink_to(model)
    result = run("convert", str(model), "--out", str(tmp_path / "link"), "--force")
    assert result.exit_code == 2 and "HF model" in result.output
    assert not (model / "trt").exists() and (model / "config.json").is_file()


def test_compile_out_holding_the_spec_and_its_models_is_refused(tiny_target, tiny_draft, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(tiny_target, work / "target")
    shutil.copytree(tiny_draft, work / "draft")
    spec = write_spec(work / "spec.yaml")
    before = tree(work)
    result = run("compile", str(spec), "--out", str(work), "--force")
    assert result.exit_code == 2 and "contains the build spec" in result.output, result.output
    assert tree(work) == before


def test_repo_out_equal_to_the_build_folder_is_refused(builds, tmp_path):
    build = shutil.copytree(builds["draft_target"], tmp_path / "build")
    before = tree(build)
    result = run("repo", str(build), "--out", str(build), "--force")
    assert result.exit_code == 2 and "build folder" in result.output
    assert tree(build) == before


def test_train_medusa_out_on_the_base_model_is_refused_before_loading(model, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("some text\n")
    before = tree(model)
    result = run(
        "train-medusa", str(model), "--data", str(data), "--out", str(model), "--force", "--device", "cpu"
    )
    assert result.exit_code == 2 and "base model" in result.output
    assert tree(model) == before


def test_atomic_write_refuses_to_replace_an_input(tmp_path):
    from specbuild.core.formats.safe_io import OutputError, atomic_write_text

    prompts = tmp_path / "p.txt"
    prompts.write_text("keep me\n")
    with pytest.raises(OutputError, match="prompts"):
        atomic_write_text(prompts, "x", inputs={"prompts": prompts})
    assert prompts.read_text() == "keep me\n"


# ---- medium 7: bounded reads ----------------------------------------------------------------------


def test_yaml_alias_bomb_is_refused_at_once(tmp_path):
    """Six levels of 9 aliases each: 9**6 leaves a wrong-type error used to print in full."""
    from specbuild.core.spec import load_spec

    levels = ['&a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    levels += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 7)]
    path = tmp_path / "bomb.yaml"
    path.write_text("name: [" + ", ".join(levels) + "]\nmode: draft_target\n")
    start = time.monotonic()
    with pytest.raises(SpecError, match="alias") as err:
        load_spec(path)
    assert time.monotonic() - start < 5 and len(err.value.message()) < 1000


def test_huge_spec_is_refused_without_parsing(tmp_path):
    from specbuild.core.spec import load_spec

    path = tmp_path / "big.yaml"
    path.write_text("name: x\n" + "#" * (25 << 20) + "\n")
    start = time.monotonic()
    with pytest.raises(SpecError, match="too large"):
        load_spec(path)
    assert time.monotonic() - start < 5


def test_duplicate_keys_are_refused(tmp_path):
    from specbuild.core.spec import load_spec

    path = tmp_path / "dup.yaml"
    path.write_text("name: a\nmode: medusa\nmode: draft_target\n")
    with pytest.raises(SpecError, match="appears twice") as err:
        load_spec(path)
    assert "lines 2 and 3" in err.value.found


def test_a_long_wrong_value_is_echoed_bounded(tmp_path):
    from specbuild.core.spec import load_spec

    path = write_spec(tmp_path / "s.yaml", build__max_batch_size="x" * 100_000)
    with pytest.raises(SpecError) as err:
        load_spec(path)
    assert len(err.value.message()) < 1000 and "100000 characters" in err.value.found


def test_config_json_symlinked_to_dev_zero_is_refused(tmp_path):
    from specbuild.core.formats.hf_config import HFModelConfig

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").symlink_to("/dev/zero")
    with pytest.raises(CheckpointError, match="not a regular file"):
        HFModelConfig.from_hf(tmp_path / "m")


def test_repo_check_reads_no_device_and_no_binary(builds, tmp_path):
    from specbuild.model_repo.check import check_repo
    from specbuild.model_repo.generate import generate_repo

    repo = generate_repo(builds["draft_target"], tmp_path / "repo", backend="python")
    (repo / "postprocessing" / "config.pbtxt").unlink()
    (repo / "postprocessing" / "config.pbtxt").symlink_to("/dev/zero")
    (repo / "preprocessing" / "config.pbtxt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe binary")
    start = time.monotonic()
    problems = {f.file: f.problem for f in reversed(check_repo(repo))}  # the first finding per file
    assert time.monotonic() - start < 10
    assert "not a regular file" in problems["postprocessing/config.pbtxt"]
    assert "not UTF-8 text" in problems["preprocessing/config.pbtxt"]


# ---- medium 8: NaN / Inf weights ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dtype", "value"), [(None, float("nan")), ("float16", float("inf")), ("bfloat16", float("nan"))]
)
def test_nonfinite_weights_are_refused_naming_the_tensor(model, tmp_path, dtype, value):
    from safetensors.torch import load_file, save_file

    from specbuild.engines.trtllm.convert import convert_checkpoint

    f = model / "model.safetensors"
    state = load_file(str(f))
    state["model.layers.0.mlp.down_proj.weight"][1, 2] = value
    save_file(state, str(f), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.down_proj\.weight .*NaN/Inf"):
        convert_checkpoint(model, tmp_path / "ckpt", dtype=dtype)
    assert (
        not any(p.name.startswith(".ckpt") for p in tmp_path.iterdir()) and not (tmp_path / "ckpt").exists()
    )


def test_float32_values_that_overflow_float16_are_refused(model, tmp_path):
    from safetensors.torch import load_file, save_file

    from specbuild.engines.trtllm.convert import convert_checkpoint

    f = model / "model.safetensors"
    state = load_file(str(f))
    state["model.norm.weight"][0] = 1e6  # finite in float32, +Inf in float16 (max 65504)
    save_file(state, str(f), metadata={"format": "pt"})
    convert_checkpoint(model, tmp_path / "ok", dtype="bfloat16")  # bfloat16 holds it
    with pytest.raises(CheckpointError, match="model.norm.weight"):
        convert_checkpoint(model, tmp_path / "bad", dtype="float16")


def test_inspect_check_values_lists_nonfinite_tensors(model):
    from safetensors.torch import load_file, save_file

    f = model / "model.safetensors"
    state = load_file(str(f))
    state["model.embed_tokens.weight"][0, 0] = float("nan")
    save_file(state, str(f), metadata={"format": "pt"})
    result = run("inspect", str(model), "--check-values", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["nonfinite_tensors"] == {
        "model.safetensors:model.embed_tokens.weight": 1
    }


# ---- the rest ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [".nan", "1.0e+300", ".inf"])
def test_gpu_memory_gb_must_be_a_sane_number(tmp_path, value):
    from specbuild.core.spec import load_spec

    path = write_spec(tmp_path / "s.yaml")
    path.write_text(path.read_text().replace("gpu_memory_gb: 4", f"gpu_memory_gb: {value}"))
    with pytest.raises(SpecError, match="gpu_memory_gb"):
        load_spec(path)


def test_huge_max_batch_size_is_a_range_error_not_a_memory_figure(tmp_path):
    path = write_spec(tmp_path / "s.yaml", build__max_batch_size=10**26)
    result = run("check", str(path))
    assert result.exit_code == 2 and "an integer in 1..65536" in result.output


def test_unknown_trtllm_version_is_refused_at_load(tmp_path):
    from specbuild.core.spec import load_spec

    path = write_spec(tmp_path / "s.yaml", trtllm_version="9.9.9")
    with pytest.raises(SpecError, match="trtllm_version") as err:
        load_spec(path)
    assert "1.2.1" in err.value.expected


def test_a_spec_folder_is_not_reported_as_missing(tmp_path):
    result = run("check", str(tmp_path))
    assert result.exit_code == 2 and "is a directory" in result.output and "not found" not in result.output


def test_config_json_holding_a_list_is_a_clear_error(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("[1, 2, 3]")
    result = run("inspect", str(tmp_path / "m"))
    assert result.exit_code == 2 and "holds a JSON list" in result.output and "Traceback" not in result.output


def test_train_medusa_refuses_a_pickle_only_model(model, tmp_path):
    import torch
    from safetensors.torch import load_file

    state = load_file(str(model / "model.safetensors"))
    torch.save(state, model / "pytorch_model.bin")
    (model / "model.safetensors").unlink()
    data = tmp_path / "data.txt"
    data.write_text("text\n")
    result = run(
        "train-medusa", str(model), "--data", str(data), "--out", str(tmp_path / "heads"), "--device", "cpu"
    )
    assert (
        result.exit_code == 2
        and "no safetensors weights" in result.output
        and "never unpickles" in result.output
    )


@pytest.mark.parametrize("lr", ["nan", "inf", "-1"])
def test_train_medusa_refuses_a_non_finite_lr(model, tmp_path, lr):
    data = tmp_path / "data.txt"
    data.write_text("text\n")
    result = run(
        "train-medusa", str(model), "--data", str(data), "--out", str(tmp_path / "heads"), "--lr", lr
    )
    assert (
        result.exit_code == 2
        and "impossible training options" in result.output
        and f"lr={float(lr)}" in result.output
    )


@pytest.mark.parametrize("k_max", ["0", "10000"])
def test_tune_k_max_out_of_range_is_refused(tmp_path, k_max):
    path = write_spec(tmp_path / "s.yaml")
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    result = run("tune", str(path), "--prompts", str(prompts), "--k-max", k_max)
    assert result.exit_code == 2 and "--k-max" in result.output and "1..256" in result.output


def test_verify_stays_inside_the_folder(builds, tmp_path):
    folder = shutil.copytree(builds["draft_target"] / "target" / "checkpoint", tmp_path / "ckpt")
    manifest = json.loads((folder / "specbuild.json").read_text())
    manifest["files"]["../../../../etc/shadow"] = "0" * 64
    (folder / "specbuild.json").write_text(json.dumps(manifest))
    result = run("verify", str(folder))
    assert result.exit_code == 1 and "outside" in result.output


def test_verify_explains_a_garbled_manifest(builds, tmp_path):
    folder = shutil.copytree(builds["draft_target"] / "target" / "checkpoint", tmp_path / "ckpt")
    (folder / "specbuild.json").write_text('{"kind": "trtllm_checkpoint", "files": {"a": 1')
    result = run("verify", str(folder))
    assert result.exit_code == 2 and "not valid JSON" in result.output and "Traceback" not in result.output
    (folder / "specbuild.json").write_text('{"kind": "trtllm_checkpoint", "files": ["config.json"]}')
    result = run("verify", str(folder))
    assert result.exit_code == 2 and "garbled" in result.output


def test_repo_check_finds_what_tritonserver_refuses(builds, tmp_path):
    """Rules seen failing tritonserver 2.51 loads (model_repo/check_triton.py quotes its messages)."""
    from specbuild.model_repo.check import check_repo
    from specbuild.model_repo.configs import parse_text, to_text
    from specbuild.model_repo.generate import generate_repo

    repo = generate_repo(builds["draft_target"], tmp_path / "repo", backend="python")
    (repo / "notes").mkdir()
    (repo / "notes" / "README").write_text("not a model")
    path = repo / "tensorrt_llm" / "config.pbtxt"
    cfg = parse_text(path.read_text())
    cfg.max_batch_size = 0
    path.write_text(to_text(cfg))
    path = repo / "postprocessing" / "config.pbtxt"
    cfg = parse_text(path.read_text())
    cfg.max_batch_size = 1  # batching, but smaller than the ensemble's 2
    path.write_text(to_text(cfg))
    findings = {(f.file, f.field): f.problem for f in check_repo(repo)}
    assert "a folder without config.pbtxt" in findings[("notes/", "-")]
    assert "preferred" in findings[("tensorrt_llm/config.pbtxt", "dynamic_batching.preferred_batch_size")]
    assert "tritonserver refuses the ensemble" in findings[("postprocessing/config.pbtxt", "max_batch_size")]


def test_a_killed_runs_partial_folder_is_removed_by_the_next_run(model, tmp_path):
    from specbuild.engines.trtllm.convert import convert_checkpoint

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a PID that no longer runs: what a killed convert leaves behind
    partial = tmp_path / f".ckpt.partial-{dead.pid}-123"
    (partial / "x").mkdir(parents=True)
    live = tmp_path / f".ckpt.partial-{os.getpid()}-456"  # a run still writing (this process) is left alone
    live.mkdir()
    convert_checkpoint(model, tmp_path / "ckpt")
    assert not partial.exists() and live.exists() and (tmp_path / "ckpt" / "config.json").is_file()


# ---- read-only and full output folders: a clear message, nothing replaced -------------------------


@contextlib.contextmanager
def mounted_tmpfs(path: Path, options: str):
    path.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({proc.stderr.decode().strip()[:80]}); the errno mapping is tested "
            "below"
        )
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_full_disk_is_a_clear_error_and_leaves_nothing(model, tmp_path):
    with mounted_tmpfs(tmp_path / "small", "size=64k") as small:
        result = run("convert", str(model), "--out", str(small / "ckpt"))
        assert result.exit_code == 2 and "No space left on device" in result.output, result.output
        assert list(small.iterdir()) == []


def test_read_only_output_is_a_clear_error(model, tmp_path):
    with mounted_tmpfs(tmp_path / "ro", "size=1m,ro") as ro:
        result = run("convert", str(model), "--out", str(ro / "ckpt"))
        assert (
            result.exit_code == 2
            and "Read-only file system" in result.output
            and "Traceback" not in result.output
        )


def test_tune_write_on_a_read_only_spec_fails_before_profiling(tiny_target, tiny_draft, tmp_path):
    folder = tmp_path / "specs"
    with mounted_tmpfs(folder, "size=1m") as mnt:
        spec = write_spec(
            mnt / "s.yaml", target={"model": str(tiny_target)}, draft={"model": str(tiny_draft)}
        )
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        prompts = tmp_path / "p.txt"
        prompts.write_text("hello\n")
        start = time.monotonic()
        result = run("tune", str(spec), "--prompts", str(prompts), "--write")
        assert result.exit_code == 2 and "Read-only file system" in result.output, result.output
        assert time.monotonic() - start < 10  # refused before the checkpoints are converted and profiled


def test_write_errors_map_to_one_message(tmp_path, monkeypatch):
    """Portable (no mount): ENOSPC / EROFS raised while writing an output become OutputError."""
    import errno

    from specbuild.core.formats.manifest import atomic_output_dir
    from specbuild.core.formats.safe_io import OutputError

    for code, text in ((errno.ENOSPC, "No space left on device"), (errno.EROFS, "Read-only file system")):
        with pytest.raises(OutputError, match=text), atomic_output_dir(tmp_path / "out") as tmp:
            raise OSError(code, os.strerror(code), str(tmp / "rank0.safetensors"))
        assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_errors_are_specbuild_errors():
    assert issubclass(TrainingError, SpecbuildError)
