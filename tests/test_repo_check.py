"""`specbuild repo check`: a clean repository passes; each inconsistency is caught, naming file, field and
fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from repo_builds import cached_build
from typer.testing import CliRunner

from specbuild.model_repo.check import check_repo
from specbuild.model_repo.configs import parse_text, to_text
from specbuild.model_repo.generate import generate_repo


@pytest.fixture(scope="module")
def builds(tmp_path_factory, tiny_target, tiny_draft):
    return {
        "draft_target": cached_build(
            tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft
        ),
        "medusa": cached_build(tmp_path_factory, "medusa", "medusa", target=tiny_target),
        "ngram": cached_build(tmp_path_factory, "ngram", "ngram", target=tiny_target),
    }


@pytest.fixture(scope="module")
def clean(builds, tmp_path_factory):
    root = tmp_path_factory.mktemp("clean-repos")
    return {mode: generate_repo(build, root / mode, backend="python") for mode, build in builds.items()}


@pytest.fixture
def repo(clean, tmp_path, request):
    """A private copy of the clean repository of the mode the test names (draft_target by default)."""
    mode = getattr(request, "param", "draft_target")
    return shutil.copytree(clean[mode], tmp_path / "repo")


def edit(repo, model, change):
    path = repo / model / "config.pbtxt"
    config = parse_text(path.read_text())
    change(config)
    path.write_text(to_text(config))


def set_param(key, value):
    def change(config):
        config.parameters[key].string_value = value

    return change


def only(findings, file, field):
    """Exactly the expected finding (by file and field) is reported, with a fix."""
    hits = [f for f in findings if f.file == file and f.field == field]
    assert hits, f"expected a finding for {file} {field}, got {[str(f) for f in findings]}"
    assert all(f.fix for f in hits)
    return hits[0]


@pytest.mark.parametrize("mode", ["draft_target", "medusa", "ngram"])
def test_clean_repositories_pass(clean, mode):
    assert check_repo(clean[mode]) == []


def test_production_ngram_repository_validates(builds, tmp_path):
    """The C++ tensorrt_llm model and a BLS that drafts itself: no tensorrt_llm_draft model, the target built
    with draft_tokens_external. With engine files where trtllm-build puts them, `repo check` passes."""
    from specbuild.cli import app

    build = shutil.copytree(builds["ngram"], tmp_path / "build")
    (build / "target" / "engine" / "rank0.engine").write_bytes(b"stand-in for trtllm-build's output")
    repo = generate_repo(build, tmp_path / "prod", backend="tensorrtllm")
    assert not (repo / "tensorrt_llm_draft").exists()
    local = generate_repo(build, tmp_path / "local", backend="python")
    for name in ("model.py", "bls_core.py", "ngram_store.py"):  # the BLS test_repo_models.py runs
        bls = Path("tensorrt_llm_bls") / "1" / name
        assert (repo / bls).read_bytes() == (local / bls).read_bytes()
    for key in (
        "bls_drafter",
        "speculation_method",
        "ngram_max_matching_ngram_size",
        "tensorrt_llm_draft_model_name",
    ):
        assert (
            parse_text((repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()).parameters[key]
            == parse_text((local / "tensorrt_llm_bls" / "config.pbtxt").read_text()).parameters[key]
        )
    assert 'backend: "tensorrtllm"' in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    result = CliRunner().invoke(app, ["repo", "check", str(repo)])
    assert result.exit_code == 0, result.output
    edit(repo, "tensorrt_llm_bls", set_param("bls_drafter", "bls_core:TritonDrafter"))
    assert (
        "drafts with bls_core:NGramDrafter"
        in only(check_repo(repo), "tensorrt_llm_bls/config.pbtxt", "parameters.bls_drafter").problem
    )
    edit(repo, "tensorrt_llm_bls", set_param("tensorrt_llm_draft_model_name", "tensorrt_llm_draft"))
    only(check_repo(repo), "tensorrt_llm_bls/config.pbtxt", "parameters.tensorrt_llm_draft_model_name")
    (repo / "tensorrt_llm_bls" / "1" / "vendor" / "specbuild" / "engines" / "reference" / "ngram.py").unlink()
    assert "engines/reference/ngram.py" in only(check_repo(repo), "tensorrt_llm_bls/1/vendor", "-").problem


@pytest.mark.parametrize("repo", ["ngram"], indirect=True)
def test_ngram_target_must_verify_external_drafts(repo):
    import json as _json

    engine = repo.parent / "engine-copy"
    served = parse_text((repo / "tensorrt_llm" / "config.pbtxt").read_text()).parameters["gpt_model_path"]
    shutil.copytree(served.string_value, engine)
    cfg = _json.loads((engine / "config.json").read_text())
    cfg["build_config"]["speculative_decoding_mode"] = 1  # NONE: a plain engine cannot take draft tokens
    (engine / "config.json").write_text(_json.dumps(cfg))
    edit(repo, "tensorrt_llm", set_param("gpt_model_path", str(engine)))
    finding = only(check_repo(repo), "tensorrt_llm/config.pbtxt", "parameters.gpt_model_path")
    assert "BLS drafts with bls_core:NGramDrafter" in finding.problem


def test_unknown_speculation_method(repo):
    edit(repo, "tensorrt_llm_bls", set_param("speculation_method", "ngarm"))
    only(check_repo(repo), "tensorrt_llm_bls/config.pbtxt", "parameters.speculation_method")


def test_production_repo_flags_reference_engines(builds, tmp_path):
    findings = check_repo(generate_repo(builds["draft_target"], tmp_path / "prod", backend="tensorrtllm"))
    assert {f.file for f in findings} == {"tensorrt_llm/config.pbtxt", "tensorrt_llm_draft/config.pbtxt"}
    assert all("rank*.engine" in f.problem for f in findings)


def test_unparsable_config(repo):
    (repo / "postprocessing" / "config.pbtxt").write_text(
        'name: "postprocessing"\nmax_batch_size: ${triton_max_batch_size}\n'
    )
    assert (
        "not a valid inference.ModelConfig"
        in only(check_repo(repo), "postprocessing/config.pbtxt", "-").problem
    )


def test_missing_engine_folder(repo):
    edit(repo, "tensorrt_llm_draft", set_param("gpt_model_path", str(repo / "no-such-engine")))
    assert (
        "does not exist"
        in only(check_repo(repo), "tensorrt_llm_draft/config.pbtxt", "parameters.gpt_model_path").problem
    )


def test_num_draft_tokens_above_max_draft_len(repo):
    edit(
        repo, "tensorrt_llm_bls", set_param("default_num_draft_tokens", "9")
    )  # the tiny target has max_draft_len 4
    assert (
        "max_draft_len is 4"
        in only(
            check_repo(repo), "tensorrt_llm_bls/config.pbtxt", "parameters.default_num_draft_tokens"
        ).problem
    )


@pytest.mark.parametrize("repo", ["medusa"], indirect=True)
def test_medusa_tree_larger_than_max_draft_len(repo):
    nine = "{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}"  # 9 nodes > max_draft_len 8
    edit(repo, "tensorrt_llm", set_param("medusa_choices", nine))
    assert (
        "9 nodes but max_draft_len is 8"
        in only(check_repo(repo), "tensorrt_llm/config.pbtxt", "parameters.medusa_choices").problem
    )


@pytest.mark.parametrize("repo", ["medusa"], indirect=True)
def test_medusa_tree_deeper_than_heads(repo):
    edit(
        repo, "tensorrt_llm", set_param("medusa_choices", "{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0}")
    )  # depth 4, 3 heads
    assert (
        "3 Medusa heads"
        in only(check_repo(repo), "tensorrt_llm/config.pbtxt", "parameters.medusa_choices").problem
    )


@pytest.mark.parametrize("repo", ["medusa"], indirect=True)
def test_medusa_choices_with_outer_braces(repo):
    edit(repo, "tensorrt_llm", set_param("medusa_choices", "{{0}, {0, 0}}"))
    assert (
        "outer braces"
        in only(check_repo(repo), "tensorrt_llm/config.pbtxt", "parameters.medusa_choices").problem
    )


@pytest.mark.parametrize("repo", ["medusa"], indirect=True)
def test_decoding_mode_must_match_medusa_engine(repo):
    edit(repo, "tensorrt_llm", set_param("decoding_mode", "top_k_top_p"))
    assert "medusa" in only(check_repo(repo), "tensorrt_llm/config.pbtxt", "parameters.decoding_mode").fix


def test_decoding_mode_medusa_on_a_draft_target_engine(repo):
    edit(repo, "tensorrt_llm", set_param("decoding_mode", "medusa"))
    only(check_repo(repo), "tensorrt_llm/config.pbtxt", "parameters.decoding_mode")


def test_logits_dtype_disagrees(repo):
    from tritonclient.grpc import model_config_pb2 as pb

    def fp16(config):
        for out in config.output:
            if out.name in ("generation_logits", "context_logits"):
                out.data_type = pb.TYPE_FP16

    edit(repo, "tensorrt_llm_draft", fp16)
    only(check_repo(repo), "tensorrt_llm_draft/config.pbtxt", "output generation_logits.data_type")


def test_tokenizer_folder_missing(repo):
    edit(repo, "postprocessing", set_param("tokenizer_dir", str(repo / "nowhere")))
    assert (
        "holds no tokenizer"
        in only(check_repo(repo), "postprocessing/config.pbtxt", "parameters.tokenizer_dir").problem
    )


def test_tokenizers_differ(repo, tmp_path):
    pre = (
        parse_text((repo / "preprocessing" / "config.pbtxt").read_text())
        .parameters["tokenizer_dir"]
        .string_value
    )
    other = shutil.copytree(pre, tmp_path / "other-tokenizer")
    cfg = json.loads((other / "tokenizer_config.json").read_text())
    cfg["model_max_length"] = 12345  # a different tokenizer configuration
    (other / "tokenizer_config.json").write_text(json.dumps(cfg))
    edit(repo, "postprocessing", set_param("tokenizer_dir", str(other)))
    assert (
        "differs" in only(check_repo(repo), "postprocessing/config.pbtxt", "parameters.tokenizer_dir").problem
    )


def test_ensemble_maps_a_tensor_nobody_produces(repo):
    edit(
        repo,
        "ensemble",
        lambda c: c.ensemble_scheduling.step[2].input_map.__setitem__("TOKENS_BATCH", "_NOWHERE"),
    )
    finding = only(
        check_repo(repo), "ensemble/config.pbtxt", "ensemble_scheduling.step[2].input_map[TOKENS_BATCH]"
    )
    assert "neither an ensemble input nor produced" in finding.problem


def test_ensemble_type_mismatch(repo):
    from tritonclient.grpc import model_config_pb2 as pb

    def int64_temperature(config):
        next(t for t in config.input if t.name == "temperature").data_type = pb.TYPE_INT64

    edit(repo, "ensemble", int64_temperature)
    finding = only(
        check_repo(repo), "ensemble/config.pbtxt", "ensemble_scheduling.step[1].input_map[temperature]"
    )
    assert "TYPE_INT64" in finding.problem and "TYPE_FP32" in finding.problem


def test_required_parameter_missing(repo):
    edit(repo, "tensorrt_llm", lambda c: c.parameters.pop("xgrammar_tokenizer_info_path"))
    only(check_repo(repo), "tensorrt_llm/config.pbtxt", "parameters.xgrammar_tokenizer_info_path")


def test_cli_repo_build_and_check(builds, tmp_path):
    from specbuild.cli import app

    runner = CliRunner()
    out = tmp_path / "cli-repo"
    result = runner.invoke(
        app, ["repo", str(builds["draft_target"]), "--out", str(out), "--backend", "python"]
    )
    assert result.exit_code == 0, result.output
    assert (out / "tensorrt_llm_draft" / "config.pbtxt").is_file()
    result = runner.invoke(app, ["repo", "check", str(out)])
    assert result.exit_code == 0, result.output
    edit(out, "tensorrt_llm_bls", set_param("default_num_draft_tokens", "9"))
    result = runner.invoke(app, ["repo", "check", str(out)])
    assert result.exit_code == 1 and "default_num_draft_tokens" in result.output
    result = runner.invoke(app, ["repo", str(builds["draft_target"]), "--out", str(out)])
    assert result.exit_code == 2 and "already exists" in result.output  # no --force


def test_tokenizer_larger_than_the_engine_vocabulary(repo, tmp_path):
    pre = (
        parse_text((repo / "preprocessing" / "config.pbtxt").read_text())
        .parameters["tokenizer_dir"]
        .string_value
    )
    bigger = shutil.copytree(pre, tmp_path / "bigger-tokenizer")
    data = json.loads((bigger / "tokenizer.json").read_text())
    data["added_tokens"].append({**data["added_tokens"][0], "id": 100000, "content": "<extra>"})
    (bigger / "tokenizer.json").write_text(json.dumps(data))
    for model in ("preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_draft"):
        edit(repo, model, set_param("tokenizer_dir", str(bigger)))
    assert (
        "100001 tokens"
        in only(check_repo(repo), "preprocessing/config.pbtxt", "parameters.tokenizer_dir").problem
    )


def test_unbuilt_trtllm_plan_is_reported(tiny_target, tiny_draft, tmp_path):
    """compile --engine trtllm without trtllm-build writes checkpoints and build.sh only: the repository is
    production by default and check says the engines still have to be built."""
    from repo_builds import compile_tiny

    build = compile_tiny(
        tmp_path / "w", "draft_target", target=tiny_target, draft=tiny_draft, engine="trtllm"
    )
    repo = generate_repo(build, tmp_path / "repo")
    assert 'backend: "tensorrtllm"' in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    finding = only(check_repo(repo), "tensorrt_llm/config.pbtxt", "parameters.gpt_model_path")
    assert "does not exist" in finding.problem and "build.sh" in finding.fix


def test_python_model_source_missing(repo):
    (repo / "postprocessing" / "1" / "model.py").unlink()
    only(check_repo(repo), "postprocessing/1/model.py", "-")


def test_production_bls_without_vendored_loop(builds, tmp_path):
    repo = generate_repo(builds["draft_target"], tmp_path / "prod", backend="tensorrtllm")
    shutil.rmtree(repo / "tensorrt_llm_bls" / "1" / "vendor")
    assert "cannot import its loop" in only(check_repo(repo), "tensorrt_llm_bls/1/vendor", "-").problem


def test_repository_records_its_kind_and_reads_older_manifests(builds, tmp_path):
    """The manifest records repo_kind (core/deployment.py); a manifest written before the field still reads
    (from `backend`), and `repo check` says so."""
    from specbuild.cli import app
    from specbuild.core.artifacts import read_repo_manifest
    from specbuild.core.deployment import RepoKind

    build = shutil.copytree(builds["ngram"], tmp_path / "build")
    (build / "target" / "engine" / "rank0.engine").write_bytes(b"stand-in for trtllm-build's output")
    prod = generate_repo(build, tmp_path / "prod", backend="tensorrtllm")
    local = generate_repo(build, tmp_path / "local", backend="python")
    for repo, kind in ((prod, RepoKind.ENGINE), (local, RepoKind.ENGINE_LOCAL)):
        raw = json.loads((repo / "specbuild.json").read_text())
        assert raw["repo_kind"] == kind.value
        m = read_repo_manifest(repo)
        assert (m.kind, m.kind_recorded) == (kind, True)
    assert not (prod / "tensorrt_llm" / "1" / "model.py").exists()  # the C++ backend: no stand-in
    assert (local / "tensorrt_llm" / "1" / "model.py").is_file()  # kind.stand_in, tensorrt_llm_local
    result = CliRunner().invoke(app, ["repo", "check", str(local)])
    assert result.exit_code == 0 and "NOTE" not in result.output

    raw = json.loads((local / "specbuild.json").read_text())
    del raw["repo_kind"]  # as an older specbuild wrote it
    (local / "specbuild.json").write_text(json.dumps(raw))
    m = read_repo_manifest(local)
    assert (m.kind, m.kind_recorded) == (RepoKind.ENGINE_LOCAL, False)
    result = CliRunner().invoke(app, ["repo", "check", str(local)])
    assert result.exit_code == 0, result.output
    assert "no repo_kind" in result.output and "backend field (python)" in result.output
