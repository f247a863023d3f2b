"""Request limits from an engine's build_config (specbuild.core.engine_limits), as TensorRT-LLM 1.2's runtime
applies them, and the reference engine / `generate --engine` that enforce them."""

from __future__ import annotations

import pytest

from specbuild.core.engine_limits import EngineLimits, LimitError, RequestLimits

PACKED = {
    "max_seq_len": 136,
    "max_input_len": 64,
    "max_num_tokens": 8192,
    "max_draft_len": 8,
    "plugin_config": {"remove_input_padding": True, "context_fmha": True},
}


def test_runtime_prompt_limit_ignores_max_input_len_with_packed_inputs_and_context_fmha():
    limits = EngineLimits.from_build_config(PACKED)
    assert limits.max_input_len == 135  # min(max_seq_len - 1, max_num_tokens), not trtllm-build's 64
    assert EngineLimits.from_build_config({**PACKED, "max_num_tokens": 100}).max_input_len == 100


def test_chunked_context_and_padded_inputs():
    assert (
        EngineLimits.from_build_config(
            {**PACKED, "max_num_tokens": 100}, enable_chunked_context=True
        ).max_input_len
        == 135
    )
    assert (
        EngineLimits.from_build_config(
            {**PACKED, "enable_chunked_context": True, "max_num_tokens": 100}
        ).max_input_len
        == 135
    )
    padded = {**PACKED, "plugin_config": {"remove_input_padding": False, "context_fmha": True}}
    assert EngineLimits.from_build_config(padded).max_input_len == 64


def test_the_backends_refusals_and_output_clamp():
    limits = EngineLimits.from_build_config(PACKED)
    limits.check_prompt(135)
    with pytest.raises(LimitError, match=r"Prompt length \(136\) exceeds maximum input length \(135\)\."):
        limits.check_prompt(136)
    with pytest.raises(
        LimitError, match=r"Draft tokens length \(9\) exceeds maximum draft tokens length \(8\)\."
    ):
        limits.check_draft(9)
    # prompt + output + draft tokens per step fit max_seq_len: the output length is lowered, not refused
    assert limits.output_len(100, 1000, 8) == 28 and limits.output_len(10, 5, 8) == 5


def test_request_limits_of_a_whole_request():
    limits = EngineLimits.from_build_config(PACKED).request_limits()
    assert limits == RequestLimits(max_input_len=135, max_total_len=128)  # the spec's max_seq_len
    limits.check(10, 118)
    with pytest.raises(LimitError, match=r"ask for at most 118 tokens"):
        limits.check(10, 119)
    draft = EngineLimits.from_build_config(
        {**PACKED, "max_seq_len": 128, "max_draft_len": 0, "max_num_tokens": 64}
    )
    both = RequestLimits.tightest(
        EngineLimits.from_build_config(PACKED).request_limits(growing_prefix=True),
        draft.request_limits(growing_prefix=True),
    )
    assert both == RequestLimits(
        max_input_len=64, max_total_len=65
    )  # the BLS feeds its growing prefix to both


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tiny_target, one_torch_thread):
    from repo_builds import cached_build

    from specbuild.engines.reference.engine import ReferenceEngine

    return ReferenceEngine.load(
        cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_target)
    )


def test_reference_engine_applies_the_backend_rules(engine):
    from specbuild.core.errors import EngineError
    from specbuild.core.sampling_params import SamplingParams

    limits = engine.limits  # examples/tiny/draft-target.yaml: max_seq_len 128 + K 4
    assert (limits.max_seq_len, limits.max_input_len, limits.max_draft_len) == (132, 131, 4)
    with pytest.raises(EngineError, match="exceeds maximum input length"):
        engine.generate([5] * 132, SamplingParams(max_tokens=2), speculative=False)
    out = engine.generate([5] * 120, SamplingParams(max_tokens=100, end_id=-1), speculative=False)
    assert len(out.token_ids) == 132 - 120  # lowered to fit, as TensorRT-LLM does


def test_generate_engine_refuses_what_would_be_cut(tmp_path_factory, tiny_target):
    from repo_builds import cached_build
    from typer.testing import CliRunner

    from specbuild.cli import app

    build = cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_target)
    runner = CliRunner()
    result = runner.invoke(
        app, ["generate", "--engine", str(build), "--prompt", "hello", "--max-tokens", "500"]
    )
    assert (
        result.exit_code == 2
        and "exceeds the engine's sequence limit" in result.output
        and "Traceback" not in result.output
    )
    result = runner.invoke(
        app,
        ["generate", "--engine", str(build), "--prompt", "the quick brown fox " * 200, "--max-tokens", "4"],
    )
    assert result.exit_code == 2 and "exceeds maximum input length" in result.output


def test_generate_engine_with_a_missing_tokenizer_is_a_clear_error(tmp_path_factory, tiny_target, tmp_path):
    import json
    import shutil

    from repo_builds import compile_tiny
    from typer.testing import CliRunner

    from specbuild.cli import app

    build = compile_tiny(tmp_path / "w", "medusa", target=tiny_target)
    manifest = json.loads((build / "specbuild.json").read_text())
    shutil.rmtree(manifest["tokenizer_dir"])  # the HF folder the build recorded is gone
    result = CliRunner().invoke(
        app, ["generate", "--engine", str(build), "--prompt", "hi", "--max-tokens", "2"]
    )
    assert result.exit_code == 2, result.output
    assert (
        "tokenizer folder" in result.output
        and "does not exist" in result.output
        and "Traceback" not in result.output
    )


def test_generate_engine_refuses_a_prompt_that_is_not_utf8(tmp_path_factory, tiny_target):
    """A prompt whose bytes were not UTF-8 reaches Python as surrogate escapes: a clear error, not a
    traceback."""
    from repo_builds import cached_build
    from typer.testing import CliRunner

    from specbuild.cli import app

    build = cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_target)
    result = CliRunner().invoke(
        app, ["generate", "--engine", str(build), "--prompt", "caf\udce9", "--max-tokens", "2"]
    )
    assert result.exit_code == 2 and "not valid UTF-8" in result.output and "Traceback" not in result.output
