"""Request building, prompt files and the client's error paths (no server needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specbuild.bench.options import default_prompts_file, load_prompts
from specbuild.client.remote import generate_remote, normalize_url
from specbuild.client.request import build_inputs
from specbuild.core.errors import ClientError
from specbuild.core.sampling_params import SamplingParams
from specbuild.model_repo import tensors
from specbuild.model_repo.tensors import BLS, ENSEMBLE
from specbuild.serve.tritonserver import free_port

BLS_INPUTS = set(tensors.interface(BLS).input_names)
ENS_INPUTS = set(tensors.interface(ENSEMBLE).input_names)


def as_dict(items):
    return {name: (array, dtype) for name, array, dtype in items}


def test_bls_request_with_drafts():
    params = SamplingParams(max_tokens=12, temperature=0.0)
    got = as_dict(build_inputs(BLS, "hi", params, stream=True, num_draft_tokens=3, declared=BLS_INPUTS))
    assert got["text_input"][0].tolist() == [[b"hi"]] and got["text_input"][1] == "BYTES"
    assert got["max_tokens"][0].dtype == np.int32 and got["max_tokens"][0].tolist() == [[12]]
    assert got["num_draft_tokens"][0].tolist() == [[3]] and got["num_draft_tokens"][1] == "INT32"
    assert got["stream"][0].tolist() == [[True]] and got["exclude_input_in_output"][0].tolist() == [[True]]
    assert got["return_perf_metrics"][1] == "BOOL" and got["temperature"][1] == "FP32"
    assert "top_k" not in got and "seed" not in got  # greedy: sampling filters are not sent


def test_sampling_request_uses_the_declared_seed_name():
    params = SamplingParams(temperature=0.8, top_k=5, top_p=0.9, seed=7)
    got = as_dict(
        build_inputs(ENSEMBLE, "x", params, stream=False, num_draft_tokens=None, declared=ENS_INPUTS)
    )
    assert got["seed"][0].dtype == np.uint64 and got["seed"][0].tolist() == [[7]]
    assert got["top_k"][0].tolist() == [[5]] and got["top_p"][0].tolist() == [
        [pytest.approx(0.9)]
    ]  # 0.9 as a TYPE_FP32 tensor: 3e-8 relative off
    old = (ENS_INPUTS - {"seed"}) | {"random_seed"}
    got = as_dict(build_inputs(ENSEMBLE, "x", params, stream=False, num_draft_tokens=None, declared=old))
    assert "random_seed" in got and "seed" not in got


def test_drafts_to_a_model_without_num_draft_tokens_is_refused():
    with pytest.raises(ClientError, match="does not take num_draft_tokens") as err:
        build_inputs(ENSEMBLE, "x", SamplingParams(), stream=False, num_draft_tokens=4, declared=ENS_INPUTS)
    assert BLS in err.value.fix


def test_prompt_files(tmp_path):
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text(json.dumps({"prompt": "a b"}) + "\n\n" + json.dumps({"prompt": "c", "x": 1}) + "\n")
    assert load_prompts(jsonl) == ("a b", "c")
    plain = tmp_path / "p.txt"
    plain.write_text("first line\nsecond\n")
    assert load_prompts(plain) == ("first line", "second")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt"}\n')
    with pytest.raises(ClientError, match="bad.jsonl:1"):
        load_prompts(bad)
    with pytest.raises(ClientError, match="cannot read"):
        load_prompts(tmp_path / "missing.jsonl")
    assert len(load_prompts(default_prompts_file())) >= 8


def test_url_forms():
    assert normalize_url("grpc://127.0.0.1:8001/") == "127.0.0.1:8001"
    with pytest.raises(ClientError, match="cannot read the server address"):
        normalize_url("localhost")


def test_server_down_is_a_clear_error():
    url = f"127.0.0.1:{free_port()}"
    with pytest.raises(ClientError, match=f"cannot reach tritonserver at {url}") as err:
        generate_remote(url, "hello", SamplingParams(max_tokens=4))
    assert "specbuild serve" in err.value.fix


@pytest.mark.parametrize(
    "kw, what",
    [
        ({"temperature": float("nan")}, "temperature must be a finite number"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": float("nan")}, "top_p must be in"),
        ({"seed": 2**70}, "seed must be in"),
        ({"seed": -1}, "seed must be in"),
        ({"max_tokens": 2**31}, "max_tokens must be in"),
        ({"top_k": 2**31}, "top_k must be in"),
    ],
)
def test_sampling_values_that_would_wrap_or_mean_nothing_are_refused(kw, what):
    from specbuild.core.errors import SpecbuildError

    with pytest.raises(SpecbuildError, match=what):
        SamplingParams(**kw)


def test_request_values_are_checked_before_they_wrap_on_the_wire():
    with pytest.raises(ClientError, match="num_draft_tokens must be >= 0"):
        build_inputs(BLS, "x", SamplingParams(), stream=False, num_draft_tokens=-1, declared=BLS_INPUTS)
    with pytest.raises(ClientError, match="num_draft_tokens must be >= 0"):
        build_inputs(BLS, "x", SamplingParams(), stream=False, num_draft_tokens=2**31, declared=BLS_INPUTS)
    with pytest.raises(ClientError, match="not valid UTF-8"):
        build_inputs(
            BLS, "caf\udce9", SamplingParams(), stream=False, num_draft_tokens=None, declared=BLS_INPUTS
        )


def test_prompt_file_that_is_not_utf8(tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"first\ncaf\xe9\n")
    with pytest.raises(ClientError, match=r"latin1.txt:2: not valid UTF-8"):
        load_prompts(bad)


def test_bench_refuses_concurrency_zero():
    from typer.testing import CliRunner

    from specbuild.cli import app

    result = CliRunner().invoke(app, ["bench", "--url", "127.0.0.1:1", "--concurrency", "0,2"])
    assert result.exit_code == 2 and "--concurrency values must be whole numbers from 1" in result.output
    assert "Traceback" not in result.output


def test_a_run_sends_waves_times_concurrency_requests_cycling_the_prompts():
    from specbuild.bench.options import run_prompts

    prompts = ("a", "b", "c")
    assert run_prompts(prompts, 1, 4) == ("a", "b", "c", "a")
    assert run_prompts(prompts, 2, 1) == prompts  # never fewer than the prompt file holds
    assert run_prompts(prompts, 2, 2) == prompts + ("a",)
    assert run_prompts(prompts, 8, 1) == run_prompts(prompts, 4, 2)


def test_bench_refuses_waves_out_of_range():
    from typer.testing import CliRunner

    from specbuild.cli import app

    result = CliRunner().invoke(app, ["bench", "--url", "127.0.0.1:1", "--waves", "0"])
    assert result.exit_code == 2 and "--waves must be in 1..64, got 0" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args, what",
    [
        (["--temperature", "nan"], "temperature must be a finite number"),
        (["--seed", str(2**70)], "seed must be in"),
        (["--max-tokens", str(2**40)], "max_tokens must be in"),
        (["--top-p", "1.5"], "top_p must be in"),
    ],
)
def test_generate_cli_refuses_bad_values_without_a_traceback(args, what):
    from typer.testing import CliRunner

    from specbuild.cli import app

    result = CliRunner().invoke(app, ["generate", "--url", "127.0.0.1:1", "--prompt", "hi", *args])
    assert result.exit_code == 2 and what in result.output and "Traceback" not in result.output


def test_the_first_server_error_is_kept():
    """stop_stream(cancel_requests=True) after an error delivers "Locally cancelled by application!": not the
    reason."""
    from specbuild.client.remote import _Collector

    collector = _Collector(None)
    collector.callback(
        error=Exception("[StatusCode.INTERNAL] Prompt length (900) exceeds maximum input length (511).")
    )
    collector.callback(error=Exception("Locally cancelled by application!"))
    assert "Prompt length (900)" in collector.error


def test_a_dead_model_process_is_named():
    from specbuild.client.remote import raise_request_error

    message = (
        "tensorrt_llm_bls: tensorrt_llm_draft: Failed to process the request(s) for model "
        "'tensorrt_llm_draft_0_0', message: Stub process 'tensorrt_llm_draft_0_0' is not healthy."
    )
    with pytest.raises(ClientError, match="model 'tensorrt_llm_draft' is down") as err:
        raise_request_error("127.0.0.1:8001", BLS, message, 60)
    assert "restart `specbuild serve`" in err.value.fix
