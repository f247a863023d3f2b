"""Request building, prompt files and the client's error paths (no server needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specbuild.client.options import default_prompts_file, load_prompts
from specbuild.client.remote import generate_remote, normalize_url
from specbuild.client.request import build_inputs
from specbuild.core.errors import ClientError
from specbuild.core.sampling_params import SamplingParams
from specbuild.model_repo import tensors
from specbuild.model_repo.tensors import BLS, ENSEMBLE
from specbuild.serve.server import free_port

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
