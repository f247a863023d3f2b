"""The LLM-API flow without a server: the method x flow x version matrix, `compile --flow llmapi` for both
versions with every written key checked against the upstream field lists (tests/data/llmapi_fields.json),
the installed-tensorrt_llm comparison (a fake module), EAGLE-3 checks and memory plan, the LLM-API
repository against upstream's config.pbtxt (tests/data/triton_llmapi_contract.json), `repo check` and
the launch lines."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.core.errors import SpecError
from specbuild.core.facts.llmapi import LLMAPI_VERSIONS, Flow, check_options, release
from specbuild.core.methods.matrix import support
from specbuild.core.spec import load_spec, spec_from_dict

DATA = Path(__file__).parent / "data"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "llama33-70b-1b.yaml"
FIELDS = json.loads((DATA / "llmapi_fields.json").read_text())["versions"]
CONTRACT = json.loads((DATA / "triton_llmapi_contract.json").read_text())["versions"]
VERSIONS = ("1.2.1", "1.4.0rc4")


# ---- the matrix ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "flow", "version", "reason", "alternative"),
    [
        ("medusa", "llmapi", "1.2.1", "engine flow only in 1.2.x", "flow: engine"),
        ("medusa", "llmapi", "1.4.0rc4", "removed with the TensorRT backend", "flow: engine"),
        ("eagle3", "engine", "1.2.1", "only on the PyTorch backend", "flow: llmapi"),
        ("draft_target", "engine", "1.4.0rc4", "no engine flow", "flow: llmapi"),
        ("draft_target", "llmapi", "1.3.0", "1.2.1, 1.4.0rc4", 'trtllm_version: "1.2.1"'),
    ],
)
def test_matrix_refuses_with_reason_and_alternative(method, flow, version, reason, alternative):
    found = support(method, Flow(flow), version)
    assert not found.ok and reason in found.reason and alternative in found.alternative
    raw = {"name": "x", "mode": method, "flow": flow, "trtllm_version": version, "target": {"model": "t"}}
    raw.update({"medusa": {"heads": "h"}} if method == "medusa" else {})
    raw.update({"eagle3": {"model": "e"}} if method == "eagle3" else {})
    raw.update({"draft": {"model": "d"}} if method == "draft_target" else {})
    with pytest.raises(SpecError) as exc:
        spec_from_dict(raw)
    assert reason in exc.value.message() and alternative in exc.value.fix


@pytest.mark.parametrize("version", VERSIONS)
def test_matrix_supports_the_llmapi_methods(version):
    spelled = FIELDS[version]["decoding_types"]  # 1.2.1: the from_dict registry keys; 1.4: the Literals
    for method in ("draft_target", "ngram", "eagle3"):
        cls = release(version).methods[method]
        assert support(method, Flow.LLMAPI, version).decoding_type == spelled[cls]
    assert support("draft_target", Flow.ENGINE, "1.2.1").ok and support("medusa", Flow.ENGINE, "1.2.1").ok


def test_llmapi_refuses_engine_only_options():
    base = {
        "name": "x",
        "mode": "draft_target",
        "flow": "llmapi",
        "target": {"model": "t"},
        "draft": {"model": "d"},
    }
    with pytest.raises(SpecError, match="weight_only"):
        spec_from_dict({**base, "build": {"weight_only": "int8"}})
    with pytest.raises(SpecError, match="use_rejection_sampling"):
        spec_from_dict({**base, "speculation": {"use_logits": True}})  # 1.2.1 has no such key
    spec = spec_from_dict({**base, "trtllm_version": "1.4.0rc4", "speculation": {"use_logits": True}})
    assert spec.speculation.use_logits


# ---- compile --flow llmapi ------------------------------------------------------------------------


def _walk(options: dict, version: str):
    """(class, key) of every written key, nested classes resolved as upstream parses them."""
    fields = FIELDS[version]
    by_type = {v: k for k, v in fields["decoding_types"].items()}
    for key, value in options.items():
        yield "TorchLlmArgs", key
        if key == "kv_cache_config":
            yield from (("KvCacheConfig", k) for k in value)
        if key == "speculative_config":
            cls = by_type[value["decoding_type"]]
            classvar = fields["classvar_decoding_type"]  # 1.2.1: the registry pops it, not a field
            yield from ((cls, k) for k in value if not (classvar and k == "decoding_type"))


@pytest.mark.parametrize("version", VERSIONS)
def test_compile_flow_llmapi_writes_options_and_command(version, tmp_path):
    out = tmp_path / "build"
    result = CliRunner().invoke(
        app,
        ["compile", str(EXAMPLE), "--flow", "llmapi", "--trtllm-version", version, "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    options = yaml.safe_load((out / "llmapi_options.yaml").read_text())
    # every key is one upstream declares for this version, and one specbuild records for it
    for cls, key in _walk(options, version):
        assert key in FIELDS[version][cls], (version, cls, key)
    assert check_options(options, version) == []
    spec_cfg = options["speculative_config"]
    assert spec_cfg["decoding_type"] == FIELDS[version]["decoding_types"]["DraftTargetDecodingConfig"]
    assert spec_cfg["max_draft_len"] == 5
    assert spec_cfg["speculative_model"].endswith("llama-3.2-1b-instruct")
    assert options["backend"] == "pytorch" and options["tensor_parallel_size"] == 4
    # kv_cache_config from the memory plan of the LLM-API flow (one pool for target + draft)
    from specbuild.builder.memory_plan import plan_memory

    plan = plan_memory(load_spec(EXAMPLE, overrides={"flow": "llmapi", "trtllm_version": version}))
    assert options["kv_cache_config"] == {
        "free_gpu_memory_fraction": plan.kv_fraction_total,
        "max_tokens": plan.kv_tokens,
        "enable_block_reuse": True,
    }
    plan_json = json.loads((out / "plan.json").read_text())
    argv = plan_json["trtllm_serve"]["argv"]
    assert argv[:3] == [
        "trtllm-serve",
        "serve",
        str(Path(options["speculative_config"]["speculative_model"]).parent / "llama-3.3-70b-instruct"),
    ]
    flags = {a for a in argv if a.startswith("--")}
    assert flags <= set(release(version).serve_flags)
    pairs = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert pairs["--config"] == str(out / "llmapi_options.yaml")
    assert int(pairs["--max_batch_size"]) == options["max_batch_size"] == 8
    assert int(pairs["--max_seq_len"]) == options["max_seq_len"] == 8192
    assert int(pairs["--tp_size"]) == 4 and pairs["--backend"] == "pytorch"
    assert float(pairs["--kv_cache_free_gpu_memory_fraction"]) == plan.kv_fraction_total
    assert shlex.join(argv) in (out / "serve.sh").read_text()
    assert plan_json["flow"] == "llmapi" and plan_json["trtllm_version"] == version
    assert not (out / "target").exists()  # no conversion on the LLM-API flow


def test_rejection_sampling_only_where_the_version_has_it(tmp_path):
    from specbuild.builder.llmapi import speculative_config

    raw = yaml.safe_load(EXAMPLE.read_text())
    raw.update(flow="llmapi", trtllm_version="1.4.0rc4", speculation={"max_draft_len": 5, "use_logits": True})
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    cfg = speculative_config(load_spec(tmp_path / "s.yaml"), {"draft": "/d"})
    assert cfg["use_rejection_sampling"] is True
    assert "use_rejection_sampling" in FIELDS["1.4.0rc4"]["DraftTargetDecodingConfig"]
    assert "use_rejection_sampling" not in FIELDS["1.2.1"]["DraftTargetDecodingConfig"]


@pytest.mark.parametrize("version", VERSIONS)
def test_ngram_section_keys_are_upstream_keys(version):
    """The n-gram emission copies its section's fields verbatim: each must be an NGramDecodingConfig key."""
    from specbuild.core.methods import DECODINGS

    keys = DECODINGS["ngram"].section_keys.values()
    assert set(keys) <= set(FIELDS[version]["NGramDecodingConfig"])
    options = {
        "speculative_config": {
            "decoding_type": "NGram",
            "max_draft_len": 4,
            "max_matching_ngram_size": 2,
            "is_keep_all": True,
            "is_use_oldest": True,
            "is_public_pool": False,
        }
    }
    assert check_options(options, version) == []
    bad = {
        "speculative_config": {"decoding_type": "NGram", "max_draft_len": 0, "prompt_lookup_num_tokens": 2}
    }
    problems = check_options(bad, version)
    assert any("prompt_lookup_num_tokens" in p for p in problems) and any("0 <= 0" in p for p in problems)


def _ngram_seed(tmp_path: Path, **ngram) -> Path:
    """The seed's target alone with n-gram drafts (no draft section)."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    del raw["draft"]
    raw.update(mode="ngram", speculation={"max_draft_len": 4})
    raw["target"]["model"] = str(EXAMPLE.parent / raw["target"]["model"])
    if ngram:
        raw["ngram"] = ngram
    path = tmp_path / "ngram.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("version", VERSIONS)
def test_compile_flow_llmapi_ngram_writes_ngram_decoding_config(version, tmp_path):
    """flow llmapi + mode ngram: NGramDecodingConfig with K and the section's four fields under upstream's
    names, no speculative_model, the overlap scheduler off (as the executor does for NGram); every key one
    the version declares."""
    spec = _ngram_seed(tmp_path, max_matching_ngram_size=3, is_keep_all=False, is_public_pool=False)
    out = tmp_path / "build"
    result = CliRunner().invoke(
        app, ["compile", str(spec), "--flow", "llmapi", "--trtllm-version", version, "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    options = yaml.safe_load((out / "llmapi_options.yaml").read_text())
    for cls, key in _walk(options, version):
        assert key in FIELDS[version][cls], (version, cls, key)
    assert check_options(options, version) == []
    assert options["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": 4,
        "max_matching_ngram_size": 3,
        "is_keep_all": False,
        "is_use_oldest": True,
        "is_public_pool": False,
    }
    assert options["disable_overlap_scheduler"] is True
    plan_json = json.loads((out / "plan.json").read_text())
    assert "--config" in plan_json["trtllm_serve"]["argv"]
    # one model: the whole KV pool is the target's (more tokens than the d/t seed, whose 1B draft shares it)
    from specbuild.builder.memory_plan import plan_memory

    ng = plan_memory(load_spec(spec, overrides={"flow": "llmapi", "trtllm_version": version}))
    dt = plan_memory(load_spec(EXAMPLE, overrides={"flow": "llmapi", "trtllm_version": version}))
    assert ng.engine("draft") is None and ng.kv_tokens > dt.kv_tokens
    assert options["kv_cache_config"]["max_tokens"] == ng.kv_tokens


def test_llmapi_ngram_without_a_section_writes_upstreams_defaults(tmp_path):
    from specbuild.builder.llmapi import speculative_config

    spec = load_spec(_ngram_seed(tmp_path), overrides={"flow": "llmapi"})
    cfg = speculative_config(spec, {})
    defaults = {
        "max_matching_ngram_size": 2,
        "is_keep_all": True,
        "is_use_oldest": True,
        "is_public_pool": True,
    }
    assert cfg == {"decoding_type": "NGram", "max_draft_len": 4, **defaults}  # NGramDecodingConfig's own


@pytest.mark.parametrize("version", VERSIONS)
def test_llmapi_ngram_refuses_use_logits_on_every_version(version, tmp_path):
    """NGram has no draft distribution: 1.4 refuses use_rejection_sampling for it, 1.2 has no such key."""
    raw = yaml.safe_load(_ngram_seed(tmp_path).read_text())
    raw.update(flow="llmapi", trtllm_version=version, speculation={"max_draft_len": 4, "use_logits": True})
    with pytest.raises(SpecError) as exc:
        spec_from_dict(raw)
    assert "use_logits" in exc.value.message() and "1.4.0rc4" not in exc.value.fix


def test_check_options_refuses_other_versions_spellings():
    assert check_options({"speculative_config": {"decoding_type": "Draft_Target"}}, "1.2.1")
    assert check_options({"speculative_config": {"decoding_type": "Eagle3"}}, "1.2.1")
    assert check_options({"speculative_config": {"decoding_type": "DraftTarget"}}, "1.4.0rc4")
    assert check_options({"speculative_config": {"decoding_type": "Medusa", "max_draft_len": 3}}, "1.4.0rc4")
    assert check_options({"kv_cache_config": {"free_gpu_memory_fraction": 1.5}}, "1.2.1")
    assert check_options({"build_config": {}}, "1.2.1")  # a TrtLlmArgs key: forbidden on TorchLlmArgs


# ---- the installed tensorrt_llm: tests/test_llmapi_parsers.py (stand-ins of each release's parser) ----


# ---- EAGLE-3 -------------------------------------------------------------------------------------


def _eagle3(
    folder: Path, *, hidden: int, vocab: int, draft_vocab: int, capture: int, d2t=None, fc_layers=None
):
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(cfg))
    f32 = np.float32
    tensors = {
        "midlayer.self_attn.q_proj.weight": np.zeros((hidden, 2 * hidden), f32),
        "midlayer.mlp.down_proj.weight": np.zeros((hidden, 2 * hidden), f32),
        "norm.weight": np.ones(hidden, f32),
        "lm_head.weight": np.zeros((draft_vocab, hidden), f32),
        "fc.weight": np.zeros((hidden, hidden * (fc_layers or capture)), f32),
    }
    if d2t is not None:
        tensors["d2t"] = np.asarray(d2t, dtype=np.int64)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def _eagle3_spec(tmp_path: Path, target: Path, head: Path, *, layers=(0, 1)) -> Path:
    raw = {
        "name": "e3",
        "mode": "eagle3",
        "flow": "llmapi",
        "dtype": "float32",
        "target": {"model": str(target)},
        "eagle3": {"model": str(head), **({"layers_to_capture": list(layers)} if layers else {})},
        "speculation": {"max_draft_len": 3},
        "build": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
        "serving": {"gpu_memory_gb": 4},
    }
    path = tmp_path / "e3.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _rows(spec_path):
    from specbuild.builder.preflight import run_checks

    report = run_checks(load_spec(spec_path))
    return report, {r.name: r for r in report.results if r.name.startswith("eagle3")}


def test_eagle3_checkpoint_checked_against_the_target(tmp_path, tiny_target):
    cfg = json.loads((tiny_target / "config.json").read_text())
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    d2t = [1] * 100  # draft id i -> target id i + 1
    head = _eagle3(tmp_path / "head", hidden=h, vocab=v, draft_vocab=100, capture=2, d2t=d2t)
    report, rows = _rows(_eagle3_spec(tmp_path, tiny_target, head))
    assert {r.status for r in rows.values()} == {"pass"}, rows
    assert report.ok
    eagle = report.plan.engine("eagle3")
    assert eagle is not None and eagle.weight_bytes > 0
    # one KV pool: the draft layer's K and V join the target's per token
    assert eagle.kv_bytes_per_token == 2 * 1 * 2 * (h // 4) * 4
    assert report.plan.engine("target").kv_tokens == eagle.kv_tokens
    # compile writes Eagle3 with the captured layers; --engine reference adds the target's reference engine
    from specbuild.builder.compile import compile_spec

    out = compile_spec(load_spec(tmp_path / "e3.yaml"), tmp_path / "build")
    cfg_out = yaml.safe_load((out / "llmapi_options.yaml").read_text())["speculative_config"]
    assert cfg_out == {  # 1.2.1: EagleDecodingConfig, the one-model path said explicitly
        "decoding_type": "Eagle",
        "max_draft_len": 3,
        "speculative_model": str(head.resolve()),
        "eagle3_one_model": True,
        "eagle3_layers_to_capture": [0, 1],
    }
    local = compile_spec(load_spec(tmp_path / "e3.yaml"), tmp_path / "b2", engine="reference")
    from specbuild.core.errors import CheckpointError
    from specbuild.engines.reference.engine import ReferenceEngine

    with pytest.raises(CheckpointError, match="missing midlayer.self_attn.k_proj.weight"):
        ReferenceEngine.load(local)  # this stand-in head has shapes for the checks, not a whole layer
    from specbuild.model_repo.check import check_repo
    from specbuild.model_repo.generate import generate_repo

    repo = generate_repo(out, tmp_path / "repo")  # Triton's LLM-API model for a GPU container
    assert check_repo(repo) == []
    model_yaml = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["speculative_config"]["decoding_type"] == "Eagle"
    assert (repo / "tensorrt_llm" / "1" / "specbuild_preflight.py").is_file()  # the launch runs it first


def test_the_checked_capture_default_is_tensorrt_llms():
    """check's default capture is core/formats/eagle3.py's (Eagle3SpecMetadata.__post_init__): the one
    layer of a 1-layer target, none for 2..5 layers, (1, L//2 - 1, L - 4) above."""
    from specbuild.builder.eagle3_checks import capture_layers

    assert capture_layers(None, 1) == (0,)
    assert capture_layers(None, 8) == (1, 3, 4)
    assert capture_layers([4, 0], 3) == (4, 0)  # the spec's, as written (the row checks the range)
    for layers in (2, 5):
        with pytest.raises(ValueError, match="Not enough hidden layers"):
            capture_layers(None, layers)


@pytest.mark.parametrize(
    ("kw", "layers", "row", "text"),
    [
        ({"hidden_delta": 8}, (0, 1), "eagle3: hidden size", "hidden states of width"),
        ({"d2t": None}, (0, 1), "eagle3: vocabulary", "no d2t tensor"),
        ({"d2t": [10**6] * 100}, (0, 1), "eagle3: vocabulary", "outside the target vocabulary"),
        ({"fc_layers": 3}, (0, 1), "eagle3: layers captured", "fuses 3 layers"),
        ({}, None, "eagle3: layers captured", "Not enough hidden layers"),
        ({}, (0, 7), "eagle3: layers captured", "do not exist"),
    ],
)
def test_eagle3_problems_fail_their_row(tmp_path, tiny_target, kw, layers, row, text):
    cfg = json.loads((tiny_target / "config.json").read_text())
    h = cfg["hidden_size"] + kw.pop("hidden_delta", 0)
    kw.setdefault("d2t", [1] * 100)
    head = _eagle3(tmp_path / "head", hidden=h, vocab=cfg["vocab_size"], draft_vocab=100, capture=2, **kw)
    report, rows = _rows(_eagle3_spec(tmp_path, tiny_target, head, layers=layers))
    assert rows[row].status == "fail" and text in rows[row].found, rows[row]
    assert not report.ok


# ---- the LLM-API repository ----------------------------------------------------------------------


def _table(config, kind):
    from tritonclient.grpc import model_config_pb2 as pb

    items = config.input if kind == "input" else config.output
    return [
        (t.name, pb.DataType.Name(t.data_type), list(t.dims))
        + ((bool(t.optional),) if kind == "input" else ())
        for t in items
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_llmapi_config_matches_upstream(version):
    from specbuild.core.methods import Method
    from specbuild.model_repo.configs import LlmApiLayout, llmapi_config

    up = CONTRACT[version]
    want_in = [(t["name"], t["data_type"], t["dims"], t["optional"]) for t in up["input"]]
    want_out = [(t["name"], t["data_type"], t["dims"]) for t in up["output"]]
    prod = llmapi_config(
        LlmApiLayout(
            mode=Method.DRAFT_TARGET, trtllm_version=version, local=False, default_num_draft_tokens=4
        )
    )
    assert prod.name == up["name"] and prod.backend == up["backend"]
    assert _table(prod, "input") == want_in and _table(prod, "output") == want_out
    assert prod.max_batch_size == 0 and not prod.HasField("model_transaction_policy")  # model.yaml sets them
    assert [(g.count, g.kind) for g in prod.instance_group] == [(1, 2)]  # count 1, KIND_CPU
    local = llmapi_config(
        LlmApiLayout(
            mode=Method.DRAFT_TARGET,
            trtllm_version=version,
            local=True,
            default_num_draft_tokens=4,
            reference_engine="/b",
        )
    )
    assert _table(local, "input") == want_in
    assert _table(local, "output") == want_out + [("output_ids", "TYPE_INT32", [-1])]  # the one addition


def _llmapi_repo(tmp_path, version="1.2.1") -> Path:
    from specbuild.builder.compile import compile_spec
    from specbuild.model_repo.generate import generate_repo

    spec = load_spec(EXAMPLE, overrides={"flow": "llmapi", "trtllm_version": version})
    build = compile_spec(spec, tmp_path / "build")
    return generate_repo(build, tmp_path / "repo")


@pytest.mark.parametrize("version", VERSIONS)
def test_repo_backend_llmapi_and_repo_check(tmp_path, version):
    from specbuild.model_repo.check import check_repo

    repo = _llmapi_repo(tmp_path, version)
    model_yaml = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert model_yaml["triton_config"] == {
        "max_batch_size": 0,
        "decoupled": False,  # upstream model.yaml's default (model_repo/transaction.py)
        "cancellation_check_period_ms": 100,
    }
    assert model_yaml["model"].endswith("llama-3.3-70b-instruct")
    llm = {k: v for k, v in model_yaml.items() if k != "triton_config"}
    for cls, key in _walk(llm, version):
        assert key in FIELDS[version][cls]
    assert check_repo(repo) == []
    result = CliRunner().invoke(app, ["repo", "check", str(repo)])
    assert result.exit_code == 0, result.output
    # tampering: a 1.x spelling of another line, an unknown key, a changed tensor, the matrix
    path = repo / "tensorrt_llm" / "1" / "model.yaml"
    text = path.read_text()
    other = "Draft_Target" if version == "1.2.1" else "DraftTarget"
    mine = FIELDS[version]["decoding_types"]["DraftTargetDecodingConfig"]
    path.write_text(
        text.replace(f"decoding_type: {mine}", f"decoding_type: {other}").replace(
            "enable_block_reuse", "enable_blok_reuse"
        )
    )
    pbtxt = repo / "tensorrt_llm" / "config.pbtxt"
    pbtxt.write_text(
        pbtxt.read_text().replace(
            'name: "sampling_param_top_k"\n  data_type: TYPE_INT32',
            'name: "sampling_param_top_k"\n  data_type: TYPE_INT64',
        )
    )
    found = "\n".join(str(f) for f in check_repo(repo))
    assert other in found and "enable_blok_reuse" in found and "sampling_param_top_k" in found
    result = CliRunner().invoke(app, ["repo", "check", str(repo)])
    assert result.exit_code == 1


def test_backends_and_flows_must_match(tmp_path, tiny_target, tiny_draft):
    from repo_builds import compile_tiny

    from specbuild.builder.compile import compile_spec
    from specbuild.core.errors import RepoError
    from specbuild.model_repo.generate import generate_repo

    engine_flow = compile_tiny(tmp_path / "dt", "draft_target", target=tiny_target, draft=tiny_draft)
    with pytest.raises(RepoError, match="engine-flow build"):
        generate_repo(engine_flow, tmp_path / "r0", backend="llmapi")
    llm = compile_spec(load_spec(EXAMPLE, overrides={"flow": "llmapi"}), tmp_path / "l")
    with pytest.raises(RepoError, match="llmapi"):
        generate_repo(llm, tmp_path / "r", backend="python")
    with pytest.raises(RepoError, match="reference engines"):
        generate_repo(llm, tmp_path / "r2", backend="llmapi-local")


# ---- launch lines --------------------------------------------------------------------------------


def test_print_launch_for_builds_and_repositories(tmp_path):
    repo = _llmapi_repo(tmp_path)
    build = tmp_path / "build"
    runner = CliRunner()
    out = runner.invoke(
        app, ["serve", str(build), "--print-launch", "--http-port", "9000", "--nodes", "2"]
    ).output
    lines = [line for line in out.splitlines() if not line.startswith("#")]
    docker, multi = (shlex.split(line) for line in lines)
    image = docker.index("nvcr.io/nvidia/tensorrt-llm/release:1.2.1")
    assert docker[:2] == ["docker", "run"] and "--ipc" in docker and f"{build}:{build}:ro" in docker
    command = docker[image + 1 :]
    assert command[:2] == ["bash", "-c"]
    preflight, serve = (shlex.split(part) for part in command[2].split(" && exec "))
    plan = json.loads((build / "plan.json").read_text())
    assert serve[:3] == plan["trtllm_serve"]["argv"][:3] and serve[serve.index("--port") + 1] == "9000"
    assert preflight == plan["preflight"] and preflight[1] == str(build / "specbuild_preflight.py")
    assert multi[:5] == ["srun", "-N", "2", "--ntasks-per-node=2", "--mpi=pmix"]
    assert multi[5] == "trtllm-llmapi-launch" and multi[6:] == command
    out = runner.invoke(app, ["serve", str(repo), "--print-launch"]).output
    [line] = [line for line in out.splitlines() if not line.startswith("#")]
    argv = shlex.split(line)
    assert "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3" in argv
    assert "/app/all_models/llmapi/tensorrt_llm/1/*.py" in argv[-1] and "tritonserver" in argv[-1]
    # the container's parser on model.yaml before tritonserver starts
    assert argv[-1].index("specbuild_preflight.py --options") < argv[-1].index("exec /opt/tritonserver")
    assert "--drop triton_config" in argv[-1]


def test_argv_builders_refuse_unknown_flags_and_launchers():
    from specbuild.core.errors import SpecbuildError
    from specbuild.core.launch import ServeLimits, llmapi_launch_argv, trtllm_serve_argv

    limits = ServeLimits(
        max_batch_size=8, max_num_tokens=8192, max_seq_len=4096, kv_cache_free_gpu_memory_fraction=0.9
    )
    for version in LLMAPI_VERSIONS:
        argv = trtllm_serve_argv("/m", "/o.yaml", limits, version=version)
        assert argv[argv.index("--config") + 1] == "/o.yaml"
    with pytest.raises(SpecbuildError):
        llmapi_launch_argv(["x"], nodes=2, gpus_per_node=8, launcher="pdsh")
    assert llmapi_launch_argv(["x"], nodes=2, gpus_per_node=4, launcher="mpirun")[:7] == [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        "8",
        "-npernode",
        "4",
        "trtllm-llmapi-launch",
    ]


def test_local_server_refuses_a_production_llmapi_repository(tmp_path):
    """The repository's recorded kind sends an LLM-API repository for a GPU container to the GPU launch
    (its model.py imports tensorrt_llm; its config says only `backend: "python"`)."""
    from specbuild.core.errors import ServerError
    from specbuild.serve.tritonserver import ServerOptions, TritonServer

    repo = _llmapi_repo(tmp_path, VERSIONS[0])
    with pytest.raises(ServerError, match="production repository: tensorrt_llm") as err:
        TritonServer(repo, ServerOptions()).launch()
    assert "repo_kind llmapi" in err.value.found and "--backend llmapi-local" in err.value.fix
