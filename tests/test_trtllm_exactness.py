"""What the real TensorRT-LLM 1.2.1 stack records and accepts (issue 11 §2, build side).

Each test names the upstream rule it follows; each failed on the code before the fix.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from repo_builds import cached_build, make_heads
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.core.errors import CheckpointError
from specbuild.core.spec import load_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def builds(tmp_path_factory, tiny_target, tiny_draft):
    return {
        "draft_target": cached_build(
            tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft
        ),
        "medusa": cached_build(tmp_path_factory, "medusa", "medusa", target=tiny_target),
    }


# ---- 1. speculative_decoding_mode is the IntFlag's integer --------------------------------------


def test_plan_and_reference_engines_record_the_intflag_integer(builds):
    """BuildConfig.to_dict() keeps SpeculativeDecodingMode (IntFlag: NONE=1, DRAFT_TOKENS_EXTERNAL=2,
    MEDUSA=4); json writes the integer, so an engine's config.json holds 2 / 1 / 4, never a string."""
    want = {("draft_target", "target"): 2, ("draft_target", "draft"): 1, ("medusa", "target"): 4}
    for (mode, role), value in want.items():
        build = builds[mode]
        plan = {r["role"]: r for r in json.loads((build / "plan.json").read_text())["roles"]}
        engine = json.loads((build / role / "engine" / "config.json").read_text())
        assert plan[role]["build_config"]["speculative_decoding_mode"] == value
        assert engine["build_config"]["speculative_decoding_mode"] == value


@pytest.mark.parametrize(
    ("mode", "recorded"),
    [("draft_target", 2), ("draft_target", "draft_tokens_external"), ("medusa", 4), ("medusa", "medusa")],
)
def test_repo_check_accepts_the_integer_and_old_strings(builds, tmp_path, mode, recorded):
    from specbuild.model_repo.check import check_repo
    from specbuild.model_repo.generate import generate_repo

    build = shutil.copytree(builds[mode], tmp_path / "build")
    engine = build / "target" / "engine" / "config.json"
    cfg = json.loads(engine.read_text())
    cfg["build_config"]["speculative_decoding_mode"] = (
        recorded  # what trtllm-build (int) or old specbuild (str) wrote
    )
    engine.write_text(json.dumps(cfg))
    repo = generate_repo(build, tmp_path / "repo", backend="python")
    assert check_repo(repo) == []


def test_repo_check_names_an_unknown_mode(builds, tmp_path):
    from specbuild.model_repo.check import check_repo
    from specbuild.model_repo.generate import generate_repo

    build = shutil.copytree(builds["medusa"], tmp_path / "build")
    engine = build / "target" / "engine" / "config.json"
    cfg = json.loads(engine.read_text())
    cfg["build_config"]["speculative_decoding_mode"] = 1024
    engine.write_text(json.dumps(cfg))
    findings = check_repo(generate_repo(build, tmp_path / "repo", backend="python"))
    assert any("1024 is not a TensorRT-LLM mode" in f.problem for f in findings)


# ---- 4. max_num_tokens: one rule for plan.json and the memory plan -------------------------------


def test_max_num_tokens_capped_before_the_speculative_increase():
    """check_max_num_tokens caps 8192 at max_seq_len x max_batch_size = 1984 x 4 = 7936 before build()
    raises it to batch x (K+1) = 256: the Medusa example's engine records 7936."""
    from specbuild.builder.memory_plan import plan_memory
    from specbuild.engines.trtllm.plan import effective_build_config

    spec = load_spec(EXAMPLES / "medusa-vicuna-7b.yaml")
    bc = effective_build_config(spec, "target")
    assert (bc["max_num_tokens"], bc["max_seq_len"], bc["opt_num_tokens"]) == (7936, 1984 + 63, 4)
    assert plan_memory(spec).engine("target").max_num_tokens == 7936


def test_max_num_tokens_floor_and_speculative_raise():
    from specbuild.core.facts.trtllm import engine_limits

    # tiny engines: capped at batch x seq = 2 x 12 = 24, then raised to tokens_per_block 32 (context FMHA)
    assert (
        engine_limits(
            max_batch_size=2,
            max_input_len=8,
            max_seq_len=12,
            max_num_tokens=None,
            max_draft_len=0,
            speculative=False,
        )["max_num_tokens"]
        == 32
    )
    # speculative: batch x (K+1) = 64 x 9 = 576 > 512 given: raised after the cap
    got = engine_limits(
        max_batch_size=64,
        max_input_len=100,
        max_seq_len=200,
        max_num_tokens=512,
        max_draft_len=8,
        speculative=True,
    )
    assert got == {"max_input_len": 100, "max_seq_len": 208, "max_num_tokens": 576, "opt_num_tokens": 64}


# ---- 5. the prompt limit, and enable_chunked_context ----------------------------------------------


def test_check_states_the_prompt_limit():
    """remove_input_padding + context FMHA: the runtime limit is min(max_seq_len - 1, max_num_tokens)
    with the engine's values (trtGptModel.h); trtllm-build ignores max_input_len."""
    from specbuild.builder.preflight import check_prompt_limit

    spec = load_spec(EXAMPLES / "medusa-vicuna-7b.yaml")
    row = check_prompt_limit(spec)
    assert (
        row.status == "pass"
        and "longest prompt 2046 tokens" in row.found
        and "ignores build.max_input_len 1024" in row.found
    )


def test_prompt_limit_below_max_input_len_warns_and_chunked_context_lifts_it(tmp_path):
    from specbuild.builder.preflight import check_prompt_limit

    raw = yaml.safe_load((EXAMPLES / "llama33-70b-1b.yaml").read_text())
    raw["build"]["max_num_tokens"] = 2048  # below max_input_len 4096
    (tmp_path / "models").symlink_to(EXAMPLES / "models")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw))
    row = check_prompt_limit(load_spec(path))
    assert (
        row.status == "warn"
        and "longest prompt 2048 tokens" in row.found
        and "enable_chunked_context" in row.fix
    )
    raw["serving"]["enable_chunked_context"] = True
    path.write_text(yaml.safe_dump(raw))
    row = check_prompt_limit(load_spec(path))
    assert (
        row.status == "pass" and "longest prompt 8191 tokens" in row.found
    )  # the draft's max_seq_len 8192 - 1


def test_chunked_context_reaches_the_backend_parameter(builds, tmp_path):
    from specbuild.model_repo.configs import parse_text
    from specbuild.model_repo.generate import generate_repo

    build = shutil.copytree(builds["draft_target"], tmp_path / "build")
    manifest = json.loads((build / "specbuild.json").read_text())
    manifest["spec"]["serving"]["enable_chunked_context"] = True
    (build / "specbuild.json").write_text(json.dumps(manifest))
    repo = generate_repo(build, tmp_path / "repo", backend="tensorrtllm")
    for model in ("tensorrt_llm", "tensorrt_llm_draft"):
        cfg = parse_text((repo / model / "config.pbtxt").read_text())
        assert cfg.parameters["enable_chunked_context"].string_value == "true"


def test_check_cli_prints_the_prompt_limit():
    result = CliRunner().invoke(app, ["check", str(EXAMPLES / "medusa-vicuna-7b.yaml"), "--json"])
    rows = {r["name"]: r for r in json.loads(result.output)["results"]}
    assert "min(engine max_seq_len 2047 - 1, max_num_tokens 7936)" in rows["prompt limit"]["found"]


# ---- 7. Medusa heads: .pt first, one reader -------------------------------------------------------


def _heads_both_files(folder: Path, *, hidden: int, vocab: int) -> Path:
    """safetensors with 3 heads and a .pt with 2: upstream's load_medusa_hf reads the .pt."""
    import torch

    make_heads(folder, hidden=hidden, vocab=vocab, heads=3)
    g = torch.Generator().manual_seed(9)
    state = {}
    for h in range(2):
        state[f"{h}.0.linear.weight"] = torch.randn(hidden, hidden, generator=g) * 0.02
        state[f"{h}.0.linear.bias"] = torch.zeros(hidden)
        state[f"{h}.1.weight"] = torch.randn(vocab, hidden, generator=g) * 0.02
    torch.save(state, folder / "medusa_lm_head.pt")
    (folder / "config.json").write_text(json.dumps({"medusa_num_heads": 2, "medusa_num_layers": 1}))
    return folder


def test_pt_takes_precedence_in_check_and_convert(tiny_target, tmp_path):
    from specbuild.core.formats.medusa_heads import read_medusa_heads
    from specbuild.engines.trtllm.convert import convert_checkpoint
    from specbuild.engines.trtllm.medusa import MedusaHeadsSource

    cfg = json.loads((tiny_target / "config.json").read_text())
    heads = _heads_both_files(tmp_path / "heads", hidden=cfg["hidden_size"], vocab=cfg["vocab_size"])
    info = read_medusa_heads(heads)
    assert info.weights_file.name == "medusa_lm_head.pt" and info.num_heads == 2
    out = convert_checkpoint(tiny_target, tmp_path / "ckpt", dtype="float32", medusa=MedusaHeadsSource(heads))
    assert json.loads((out / "config.json").read_text())["num_medusa_heads"] == 2
    assert json.loads((out / "specbuild.json").read_text())["inputs"]["medusa_file"].endswith(
        "medusa_lm_head.pt"
    )


def test_check_and_convert_refuse_the_same_prefixed_keys(tiny_target, tmp_path):
    """Upstream reads `{h}.{j}...` keys; the `medusa_heads.` prefix is ModelOpt's combined form.
    `check` used to accept it while `convert` refused it."""
    import torch
    from safetensors.torch import save_file

    from specbuild.core.formats.medusa_heads import read_medusa_heads
    from specbuild.engines.trtllm.convert import convert_checkpoint
    from specbuild.engines.trtllm.medusa import MedusaHeadsSource

    cfg = json.loads((tiny_target / "config.json").read_text())
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    folder = tmp_path / "heads"
    folder.mkdir()
    save_file(
        {
            "medusa_heads.0.0.linear.weight": torch.zeros(h, h),
            "medusa_heads.0.0.linear.bias": torch.zeros(h),
            "medusa_heads.0.1.weight": torch.zeros(v, h),
        },
        str(folder / "medusa_lm_head.safetensors"),
    )
    info = read_medusa_heads(folder)
    assert info.problems and "ModelOpt" in info.problems[0]
    with pytest.raises(CheckpointError, match="not HF Medusa heads"):
        convert_checkpoint(tiny_target, tmp_path / "ckpt", medusa=MedusaHeadsSource(folder))


# ---- 9. `repo build --out R` with a build folder named `build` ------------------------------------


def test_repo_build_takes_a_folder_named_build(builds, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(builds["draft_target"], work / "build")
    monkeypatch.chdir(work)
    result = CliRunner().invoke(app, ["repo", "build", "--out", "R"])
    assert result.exit_code == 0, result.output
    assert (work / "R" / "ensemble" / "config.pbtxt").is_file()
    result = CliRunner().invoke(
        app, ["repo", "build", "build", "--out", "R2"]
    )  # the explicit form still works
    assert result.exit_code == 0, result.output


def test_repo_build_without_a_build_folder_says_what_happened(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["repo", "build", "--out", "R"])
    assert result.exit_code == 2 and "`build` here is the subcommand" in result.output


# ---- 2/3. --print-launch mounts host folders only -------------------------------------------------


def test_print_launch_mounts_the_build_folder_at_the_engine_root(builds, tmp_path):
    from specbuild.model_repo.generate import generate_repo
    from specbuild.serve.launch import Mount, launch_commands, repo_mounts

    build = builds["draft_target"]
    manifest = json.loads((build / "specbuild.json").read_text())
    tokenizer_host = Path(manifest["tokenizer_dir"])
    repo = generate_repo(
        build, tmp_path / "repo", backend="tensorrtllm", engine_root="/engines", tokenizer_dir="/tokenizer"
    )
    mounts = repo_mounts(repo)
    assert Mount(build.resolve(), "/engines") in mounts and Mount(tokenizer_host, "/tokenizer") in mounts
    assert not any(m.container.startswith("/opt/tritonserver") for m in mounts)
    [argv] = launch_commands(repo)
    assert f"{build.resolve()}:/engines:ro" in argv and f"{tokenizer_host}:/tokenizer:ro" in argv
    assert "/engines:/engines:ro" not in argv  # the container path is not a host path


def test_print_launch_on_a_host_path_repository_mounts_engines_and_tokenizer(builds, tmp_path):
    from specbuild.model_repo.generate import generate_repo
    from specbuild.serve.launch import repo_mounts

    build = builds["medusa"]
    repo = generate_repo(build, tmp_path / "repo", backend="tensorrtllm")
    hosts = {str(m.host) for m in repo_mounts(repo)}
    assert str((build / "target" / "engine").resolve()) in hosts and str(repo.resolve()) in hosts
    assert all(os.path.exists(h) for h in hosts)  # every mount exists on this host


def test_print_launch_uses_the_repositorys_serving_version(builds, tmp_path):
    """`repo --trtllm-version V` names the container's TensorRT-LLM: the launch line follows it."""
    from specbuild.core.errors import RepoError
    from specbuild.model_repo.generate import generate_repo
    from specbuild.serve.launch import launch_commands

    repo = generate_repo(builds["medusa"], tmp_path / "repo", backend="tensorrtllm", trtllm_version="1.1.0")
    [argv] = launch_commands(repo)
    assert "nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3" in argv
    with pytest.raises(RepoError, match="unknown TensorRT-LLM version"):
        generate_repo(builds["medusa"], tmp_path / "repo2", backend="tensorrtllm", trtllm_version="9.9.9")
