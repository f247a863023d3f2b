"""The LLM-API options against a stand-in of each release's own parser (tests/fake_trtllm: the 1.2.1
from_dict registry, the 1.4.0rc4 Literal discriminators): every method's options parse, the other
release's spellings fail, the builder's guard reports upstream's error with its key, and the container
preflight (serve.sh) stops a wrong key before trtllm-serve is reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specbuild.builder.compile import llmapi_models
from specbuild.builder.llmapi import check_installed, llmapi_options, speculative_config
from specbuild.builder.memory_plan import plan_memory
from specbuild.core.errors import BuildError
from specbuild.core.facts.llmapi import decoding_class, release
from specbuild.core.llmapi_preflight import Refusal, validate
from specbuild.core.spec import load_spec

FAKES = Path(__file__).parent / "fake_trtllm"
STYLE = {"1.2.1": FAKES / "registry_1_2_1", "1.4.0rc4": FAKES / "literal_1_4_0rc4"}
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama33-70b-1b.yaml"
VERSIONS = tuple(STYLE)
METHODS = ("draft_target", "ngram", "eagle3")


def _purge() -> None:
    for name in [m for m in sys.modules if m == "tensorrt_llm" or m.startswith("tensorrt_llm.")]:
        del sys.modules[name]


@pytest.fixture
def installed(monkeypatch):
    """installed(version): the stand-in of that release is what `import tensorrt_llm` finds."""

    def put(version: str) -> None:
        _purge()
        monkeypatch.syspath_prepend(str(STYLE[version]))

    yield put
    _purge()


def _spec(version: str, method: str, tmp_path: Path):
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["target"]["model"] = str(EXAMPLE.parent / raw["target"]["model"])
    raw["draft"]["model"] = str(EXAMPLE.parent / raw["draft"]["model"])
    raw.update(flow="llmapi", trtllm_version=version, speculation={"max_draft_len": 4})
    if method != "draft_target":
        del raw["draft"]
        raw["mode"] = method
    path = tmp_path / f"{method}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _options(version: str, method: str, tmp_path: Path) -> dict:
    """The options specbuild writes for `method` on `version` (EAGLE-3: the draft/target seed's options
    with EAGLE-3's speculative_config; its head is not a folder here)."""
    if method == "eagle3":
        options = _options(version, "draft_target", tmp_path)
        options.pop("disable_overlap_scheduler", None)
        raw = yaml.safe_load(_spec(version, "ngram", tmp_path).read_text())
        raw.update(mode="eagle3", eagle3={"model": "/models/eagle3-head", "layers_to_capture": [1, 8, 12]})
        path = tmp_path / "eagle3.yaml"
        path.write_text(yaml.safe_dump(raw))
        options["speculative_config"] = speculative_config(load_spec(path), {"eagle3": "/models/eagle3-head"})
        return options
    spec = load_spec(_spec(version, method, tmp_path))
    return llmapi_options(spec, plan_memory(spec), models={k: str(v) for k, v in llmapi_models(spec).items()})


def _parse(options: dict, version: str) -> None:
    parser = release(version).parser
    validate(options, model="/models/target", parser=parser.function, args_class=parser.args_class)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("version", VERSIONS)
def test_each_methods_options_parse_with_the_releases_parser(version, method, installed, tmp_path):
    options = _options(version, method, tmp_path)
    installed(version)
    _parse(options, version)  # raises Refusal on any refusal
    assert check_installed(options, version, model="/models/target") == version


def test_1_2_1_spells_draft_target_DraftTarget_and_eagle3_Eagle(tmp_path):
    dt = _options("1.2.1", "draft_target", tmp_path)["speculative_config"]
    e3 = _options("1.2.1", "eagle3", tmp_path)["speculative_config"]
    assert dt["decoding_type"] == "DraftTarget" and e3["decoding_type"] == "Eagle"
    assert e3["eagle3_one_model"] is True  # the one-model path, said explicitly (the 1.2.1 default)
    assert decoding_class("eagle3", "1.2.1").classvar and not decoding_class("eagle3", "1.4.0rc4").classvar
    e4 = _options("1.4.0rc4", "eagle3", tmp_path)["speculative_config"]
    assert e4["decoding_type"] == "Eagle3" and "eagle3_one_model" not in e4  # never written on 1.4


@pytest.mark.parametrize(
    ("version", "method", "edit", "key", "text"),
    [
        # the 1.4 spellings on 1.2.1: not in the from_dict registry
        (
            "1.2.1",
            "draft_target",
            {"decoding_type": "Draft_Target"},
            "speculative_config",
            "Invalid decoding type",
        ),
        (
            "1.2.1",
            "eagle3",
            {"decoding_type": "Eagle3"},
            "speculative_config",
            "Invalid decoding type: Eagle3",
        ),
        # 1.4's kill switch on 1.2.1: extra keys are forbidden
        (
            "1.2.1",
            "ngram",
            {"acceptance_rate_threshold": 0.3},
            "speculative_config.acceptance_rate_threshold",
            "",
        ),
        # the 1.2.1 spellings on 1.4.0rc4: not a tag of the discriminated union
        ("1.4.0rc4", "draft_target", {"decoding_type": "DraftTarget"}, "speculative_config", "DraftTarget"),
        ("1.4.0rc4", "ngram", {"acceptance_window": 8}, "speculative_config", "acceptance_window"),
        # two-model EAGLE-3 is gone on 1.4: the key does not exist on Eagle3DecodingConfig
        ("1.4.0rc4", "eagle3", {"eagle3_one_model": False}, "speculative_config", "eagle3_one_model"),
    ],
)
def test_the_other_releases_spellings_fail(version, method, edit, key, text, installed, tmp_path):
    options = _options(version, method, tmp_path)
    options["speculative_config"].update(edit)
    installed(version)
    with pytest.raises(Refusal) as exc:
        _parse(options, version)
    assert exc.value.key.startswith(key) and text in exc.value.error
    with pytest.raises(BuildError) as built:  # the builder's guard: upstream's error, verbatim, with the key
        check_installed(options, version, model="/models/target")
    assert key in built.value.message() and exc.value.error in str(built.value.found)


def test_compile_on_a_1_2_1_host_passes_the_guard(installed, tmp_path):
    """The old guard looked for decoding_type among pydantic fields: on 1.2.1 it is a ClassVar, so every
    1.2.1 build stopped. The installed parser accepts what specbuild writes."""
    from specbuild.builder.compile import compile_spec

    installed("1.2.1")
    out = compile_spec(load_spec(_spec("1.2.1", "draft_target", tmp_path)), tmp_path / "b")
    plan = json.loads((out / "plan.json").read_text())
    assert (
        plan["checked_against"] == "tensorrt_llm 1.2.1 (installed)" and plan["decoding_type"] == "DraftTarget"
    )


# ---- the container preflight ---------------------------------------------------------------------


def _fake_bin(tmp_path: Path) -> tuple[Path, Path]:
    """A PATH with python3 (this interpreter) and a trtllm-serve that records that it was reached."""
    bin_dir, marker = tmp_path / "bin", tmp_path / "trtllm-serve-reached"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "trtllm-serve").write_text(f'#!/bin/sh\necho "$@" > {marker}\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    return bin_dir, marker


def _run_serve(build: Path, version: str, tmp_path: Path) -> tuple[subprocess.CompletedProcess, bool]:
    bin_dir, marker = _fake_bin(tmp_path)
    marker.unlink(missing_ok=True)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(STYLE[version]),
    }
    done = subprocess.run(
        ["bash", str(build / "serve.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    return done, marker.exists()


@pytest.mark.parametrize("version", VERSIONS)
def test_serve_sh_preflight_stops_a_wrong_key_before_loading(version, tmp_path):
    from specbuild.builder.compile import compile_spec

    build = compile_spec(load_spec(_spec(version, "draft_target", tmp_path)), tmp_path / "build")
    done, reached = _run_serve(build, version, tmp_path / "ok")
    assert done.returncode == 0 and reached, done.stderr  # the options as written: the server starts
    assert f"TensorRT-LLM {version} accepts" in done.stderr
    options_file = build / "llmapi_options.yaml"
    options = yaml.safe_load(options_file.read_text())
    wrong = "Eagle3" if version == "1.2.1" else "DraftTarget"  # the other release's spelling
    options["speculative_config"]["decoding_type"] = wrong
    options_file.chmod(0o644)
    options_file.write_text(yaml.safe_dump(options))
    done, reached = _run_serve(build, version, tmp_path / "bad")
    assert done.returncode == 2 and not reached  # stopped before trtllm-serve (weights never load)
    assert "speculative_config" in done.stderr and wrong in done.stderr
    assert f"TensorRT-LLM {version} refuses" in done.stderr
    # another TensorRT-LLM in the container: named, and stopped too
    other = next(v for v in VERSIONS if v != version)
    bin_dir, marker = _fake_bin(tmp_path / "other")
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(STYLE[other]),
    }
    done = subprocess.run(
        ["bash", str(build / "serve.sh")], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and not marker.exists() and f"this container has {other}" in done.stderr


def test_compile_on_another_release_stops_and_writes_nothing(installed, tmp_path):
    from specbuild.builder.compile import compile_spec

    installed("1.4.0rc4")
    with pytest.raises(BuildError, match="tensorrt_llm 1.4.0rc4 is installed here"):
        compile_spec(load_spec(_spec("1.2.1", "draft_target", tmp_path)), tmp_path / "b")
    assert not (tmp_path / "b").exists()
