"""The generated production interfaces against the real backend's templates (tests/data/
triton_backend_contract.json, the 1.2-era generation the r26.04-r26.07 containers ship: min_tokens/seed,
return_num_*_tokens, templated prompt table dtype), and the TensorRT-LLM 0.20 rename."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specbuild.core.methods import Method
from specbuild.model_repo import tensors as T
from specbuild.model_repo.configs import EngineModel, RepoLayout, all_configs, to_text

CONTRACT = json.loads((Path(__file__).parent / "data" / "triton_backend_contract.json").read_text())["models"]
# Parameters specbuild adds to the BLS (the upstream BLS ignores keys it does not know).
SPECBUILD_BLS_PARAMETERS = {
    "tensorrt_llm_decoupled",
    "default_num_draft_tokens",
    "default_use_draft_logits",
    "speculation_method",
    "bls_drafter",
}


def layout(*, version="1.2.1", medusa=False) -> RepoLayout:
    def engine(name, decoupled):
        return EngineModel(
            name=name,
            engine_dir=f"/engines/{name}",
            decoupled=decoupled,
            kv_fraction=0.45,
            gpu_device_ids=(0, 1),
            decoding_mode="medusa" if medusa else "top_k_top_p",
            enable_kv_cache_reuse=not medusa,
            medusa_choices="{0}, {0, 0}" if medusa else None,
        )

    return RepoLayout(
        mode=Method.MEDUSA if medusa else Method.DRAFT_TARGET,
        backend="tensorrtllm",
        trtllm_version=version,
        max_batch_size=8,
        tokenizer_dir="/tok",
        target=engine("tensorrt_llm", medusa),
        draft=None if medusa else engine("tensorrt_llm_draft", False),
        default_num_draft_tokens=4,
    )


def rows(tensors, *, inputs: bool) -> list[tuple]:
    out, seen = [], set()
    for t in tensors:
        if t["name"] in seen:  # the upstream ensemble declares kv_cache_alloc_total_blocks twice
            continue
        seen.add(t["name"])
        out.append(
            (t["name"], t["data_type"], tuple(t["dims"])) + ((t["optional"], t["reshape"]) if inputs else ())
        )
    return out


def generated_rows(config, *, inputs: bool) -> list[tuple]:
    from tritonclient.grpc import model_config_pb2 as pb

    tensors = config.input if inputs else config.output
    extra = (
        {t.name for t in T.POSTPROCESSING_EXTRA_OUTPUTS}
        if config.name == "postprocessing"
        else set()
        if config.name == "tensorrt_llm"
        else set(T.EXTRA_TEXT_OUTPUTS) | {t.name for t in T.BLS_EXTRA_OUTPUTS}
        if config.name == "tensorrt_llm_bls"
        else set(T.EXTRA_TEXT_OUTPUTS)
    )
    return [
        (t.name, pb.DataType.Name(t.data_type), tuple(t.dims))
        + ((t.optional, t.HasField("reshape")) if inputs else ())
        for t in tensors
        if inputs or t.name not in extra
    ]


@pytest.mark.parametrize(
    "model", ["ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls"]
)
def test_generated_interface_matches_backend_contract(model):
    config = all_configs(layout())[model]
    want = CONTRACT[model]
    assert generated_rows(config, inputs=True) == rows(want["inputs"], inputs=True)
    assert generated_rows(config, inputs=False) == rows(want["outputs"], inputs=False)
    assert config.platform == want["platform"]
    if model == "tensorrt_llm":
        assert config.backend == "tensorrtllm"
    else:
        assert config.backend == want["backend"]
    ours = set(config.parameters)
    assert ours - SPECBUILD_BLS_PARAMETERS <= set(want["parameters"]), ours - set(want["parameters"])


def test_ensemble_steps_match_backend_contract():
    """Exactly upstream's maps: output_ids / sequence_length reach postprocessing through the internal
    _TOKENS_BATCH / _SEQUENCE_LENGTH; specbuild adds only postprocessing's pass-through outputs."""
    config = all_configs(layout())["ensemble"]
    extra = {t.name for t in T.POSTPROCESSING_EXTRA_OUTPUTS}
    for step, want in zip(config.ensemble_scheduling.step, CONTRACT["ensemble"]["steps"], strict=True):
        assert step.model_name == want["model_name"] and step.model_version == -1
        assert dict(step.input_map) == want["input_map"]
        assert {k: v for k, v in step.output_map.items() if k not in extra} == want["output_map"]
    post = config.ensemble_scheduling.step[2]
    assert {post.output_map[n] for n in extra} == set(T.EXTRA_TEXT_OUTPUTS)
    # no tensorrt_llm output is both an ensemble output and a later step's input (Triton prunes such a step)
    outputs = {o.name for o in config.output}
    fed = {v for s in config.ensemble_scheduling.step for v in s.input_map.values()}
    assert not outputs & fed


def test_templated_prompt_table_dtype_agrees_across_the_ensemble():
    """tensorrt_llm's prompt_embedding_table type is a template parameter; the ensemble and BLS fix
    TYPE_FP16."""
    assert CONTRACT["tensorrt_llm"]["templated_data_types"] == {
        "prompt_embedding_table": "${prompt_embedding_table_data_type}"
    }
    configs = all_configs(layout())
    types = {
        name: next(t.data_type for t in configs[name].input if t.name == "prompt_embedding_table")
        for name in ("tensorrt_llm", "ensemble", "tensorrt_llm_bls")
    }
    assert len(set(types.values())) == 1


def test_required_engine_parameters_and_values():
    configs = all_configs(layout())
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        p = {k: v.string_value for k, v in configs[name].parameters.items()}
        for key in (
            "gpt_model_type",
            "gpt_model_path",
            "tokenizer_dir",
            "guided_decoding_backend",
            "xgrammar_tokenizer_info_path",
        ):
            assert key in p
        assert p["gpt_model_type"] == "inflight_fused_batching"
        assert (
            p["gpu_device_ids"] == "0,1" and p["exclude_input_in_output"] == "false"
        )  # the backend's default
        assert p["enable_kv_cache_reuse"] == "true" and p["decoding_mode"] == "top_k_top_p"
        assert not configs[name].model_transaction_policy.decoupled  # the BLS calls it round by round
    assert configs["tensorrt_llm_bls"].model_transaction_policy.decoupled
    medusa = all_configs(layout(medusa=True))
    p = medusa["tensorrt_llm"].parameters
    assert p["decoding_mode"].string_value == "medusa" and p["medusa_choices"].string_value == "{0}, {0, 0}"
    assert medusa["tensorrt_llm"].model_transaction_policy.decoupled and "tensorrt_llm_draft" not in medusa


@pytest.mark.parametrize(
    "version, min_tokens, seed",
    [
        ("0.19.0", "min_length", "random_seed"),
        ("0.20.0", "min_tokens", "seed"),
        ("1.2.1", "min_tokens", "seed"),
    ],
)
def test_input_names_follow_trtllm_version(version, min_tokens, seed):
    assert T.names_for(version) == T.Names(min_tokens=min_tokens, seed=seed)
    text = "\n".join(to_text(c) for c in all_configs(layout(version=version)).values())
    old = {"min_length", "random_seed"} if min_tokens == "min_tokens" else {"min_tokens", "seed"}
    for name in (min_tokens, seed):
        assert f'"{name}"' in text
    for name in old:
        assert f'"{name}"' not in text


def test_tables_are_torch_and_numpy_free():
    """The tensor tables are shared by the generator, the client and the Python models: plain data."""
    import subprocess
    import sys

    code = (
        "import sys, specbuild.model_repo.tensors; print('torch' in sys.modules, 'numpy' in sys.modules); "
        "import specbuild.model_repo.configs; print('torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["False", "False", "False"]
