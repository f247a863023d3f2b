"""One EAGLE-3 spec, every target it is emitted for, through the commands a user runs: `compile --flow llmapi`
for TensorRT-LLM 1.2.1 (`Eagle` + eagle3_one_model) and 1.4.0rc4 (`Eagle3`), checked by the stand-in of
each release's parser (tests/fake_trtllm) through the build's own serve.sh preflight; `repo` (Triton's
LLM-API repository); `deploy --engine dynamo | vllm | sglang`. The draft is laid out as `train-eagle3` writes
it (both id keys: TensorRT-LLM's numbering nested, vLLM's at the top level), so every engine must capture
the same target layers: the spec's [1, 3, 4] of an 8-layer target (TensorRT-LLM's default for 8 layers).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from eagle3_drafts import write_draft
from test_deploy import validate_all
from test_llmapi_parsers import _run_serve

from specbuild.core.formats.eagle3 import Eagle3DraftConfig

LAYERS = [1, 3, 4]  # TensorRT-LLM's (1, L//2 - 1, L - 4) for L = 8
K = 4
VERSIONS = ("1.2.1", "1.4.0rc4")
DYNAMO_IMAGE = (
    "registry.example/dynamo-trtllm:custom"  # not in the support matrix: the options preflight runs
)


@pytest.fixture(scope="module")
def target8(make_tiny):
    return make_tiny("target8", num_layers=8, num_heads=4, num_kv_heads=2, seed=21)


@pytest.fixture(scope="module")
def draft(target8, tmp_path_factory):
    """An EAGLE-3 draft with the config train-eagle3 writes (Eagle3DraftConfig.to_hf: both id keys)."""
    cfg = json.loads((target8 / "config.json").read_text())
    folder = write_draft(
        tmp_path_factory.mktemp("e3-emit") / "eagle3",
        hidden=cfg["hidden_size"],
        heads=4,
        kv_heads=2,
        intermediate=128,
        vocab=cfg["vocab_size"],
        draft_vocab=100,
        layers=LAYERS,
    )
    hf = Eagle3DraftConfig.from_hf(folder).to_hf()
    (folder / "config.json").write_text(json.dumps(hf))
    return folder


def _spec(tmp_path: Path, target: Path, draft: Path, version: str) -> Path:
    raw = {
        "name": "e3-emit",
        "mode": "eagle3",
        "flow": "llmapi",
        "trtllm_version": version,
        "dtype": "float32",
        "target": {"model": str(target)},
        "eagle3": {"model": str(draft), "layers_to_capture": LAYERS},
        "speculation": {"max_draft_len": K},
        "build": {"max_batch_size": 4, "max_input_len": 64, "max_seq_len": 256},
        "serving": {"gpu_memory_gb": 4},
    }
    path = tmp_path / "e3.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _cli(*args: str) -> str:
    from typer.testing import CliRunner

    from specbuild.cli import app

    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output
    return r.output


def test_the_draft_holds_both_numberings(draft):
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == LAYERS  # TensorRT-LLM / SGLang
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in LAYERS]  # vLLM: 0 is the embedding


@pytest.mark.parametrize("version", VERSIONS)
def test_llmapi_options_repository_and_dynamo(version, target8, draft, tmp_path):
    from specbuild.core.facts.llmapi import check_options
    from specbuild.model_repo.check import check_repo

    spec = _spec(tmp_path, target8, draft, version)
    _cli("check", str(spec))
    build = tmp_path / "build"
    _cli("compile", str(spec), "--out", str(build))
    options = yaml.safe_load((build / "llmapi_options.yaml").read_text())
    want = {
        "decoding_type": "Eagle" if version == "1.2.1" else "Eagle3",
        "max_draft_len": K,
        "speculative_model": str(draft.resolve()),
        "eagle3_layers_to_capture": LAYERS,
    }
    if version == "1.2.1":
        want["eagle3_one_model"] = True  # EagleDecodingConfig: the one-model path, said explicitly
    assert options["speculative_config"] == want
    assert check_options(options, version) == []
    assert "disable_overlap_scheduler" not in options  # one model: the overlap scheduler stays on
    # the release's own parser (its stand-in) accepts the file, before trtllm-serve would load anything
    done, reached = _run_serve(build, version, tmp_path / "serve")
    assert done.returncode == 0 and reached, done.stderr
    # Triton's LLM-API repository: model.yaml is the same options plus the target
    repo = tmp_path / "repo"
    _cli("repo", str(build), "--out", str(repo))
    assert check_repo(repo) == []
    model_yaml = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["speculative_config"] == want
    assert Path(model_yaml["model"]).resolve() == target8.resolve()
    # Dynamo: the worker's engine YAML is the same options, the models on the mounted volume
    out = tmp_path / "dynamo"
    _cli(
        "deploy",
        str(spec),
        "--engine",
        "dynamo",
        "--image",
        DYNAMO_IMAGE,
        "--models-claim",
        "m",
        "--out",
        str(out),
    )
    cm, dgd = list(yaml.safe_load_all((out / "20-dynamo.yaml").read_text()))
    assert validate_all({"20-dynamo.yaml": [cm, dgd]}) == {"ConfigMap": 1, "DynamoGraphDeployment": 1}
    engine = yaml.safe_load(cm["data"]["engine.yaml"])
    assert engine["speculative_config"] == {**want, "speculative_model": f"/models/{draft.name}"}
    worker = dgd["spec"]["services"]["TRTLLMWorker"]["extraPodSpec"]["mainContainer"]["args"]
    assert worker[worker.index("--model-path") + 1] == f"/models/{target8.name}"


def test_vllm_method_eagle3_reads_the_top_level_ids(target8, draft, tmp_path):
    from specbuild.core.facts.vllm import vllm_facts
    from specbuild.core.spec import load_spec
    from specbuild.deploy.eagle3_draft import engine_layers, read_draft
    from specbuild.deploy.vllm import check_argv, speculative_config

    path = _spec(tmp_path, target8, draft, "1.2.1")
    spec = load_spec(path)
    cfg = speculative_config(spec, model_root="/models")
    assert cfg["method"] == "eagle3" and cfg["model"] == f"/models/{draft.name}"
    assert cfg["num_speculative_tokens"] == K and set(cfg) <= vllm_facts().speculative_config_keys
    check_argv(["vllm", "serve", "m", "--speculative-config", json.dumps(cfg)])
    # vLLM captures h(j) for the draft's top-level ids: the outputs of layers j - 1 = the spec's
    got, where = engine_layers(spec, read_draft(spec), "vllm")
    assert got == tuple(i + 1 for i in LAYERS) and where.startswith("top-level")
    out = tmp_path / "vllm"
    _cli("deploy", str(path), "--engine", "vllm", "--models-claim", "m", "--out", str(out))
    docs = [d for f in sorted(out.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    validate_all({"all": docs})
    (container,) = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"][
        "containers"
    ]
    argv = container["command"]  # one node: the argv itself
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == cfg


def test_sglang_eagle3_reads_the_nested_ids(target8, draft, tmp_path):
    from specbuild.core.spec import load_spec
    from specbuild.deploy.eagle3_draft import engine_layers, read_draft
    from specbuild.deploy.sglang import launch_argv

    path = _spec(tmp_path, target8, draft, "1.2.1")
    spec = load_spec(path)
    argv = launch_argv(spec, model_root="/models")

    def value(flag):
        return argv[argv.index(flag) + 1]

    assert value("--speculative-algorithm") == "EAGLE3"
    assert value("--speculative-draft-model-path") == f"/models/{draft.name}"
    # the trio together; a chain (topk 1) of K steps verifies K + 1 tokens
    assert (value("--speculative-num-steps"), value("--speculative-eagle-topk")) == (str(K), "1")
    assert value("--speculative-num-draft-tokens") == str(K + 1)
    got, where = engine_layers(spec, read_draft(spec), "sglang")  # SGLang adds 1 to eagle_config's ids
    assert got == tuple(i + 1 for i in LAYERS) and where.startswith("eagle_config")
    out = tmp_path / "sglang"
    _cli("deploy", str(path), "--engine", "sglang", "--models-claim", "m", "--out", str(out))
    docs = [d for f in sorted(out.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    validate_all({"all": docs})
