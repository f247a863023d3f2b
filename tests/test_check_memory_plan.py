"""Memory plan numbers, checked against hand computation for the seed spec (70B target TP4 + 1B draft)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from specbuild.builder.memory_plan import GIB, plan_memory, pp_layers
from specbuild.core.spec import load_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def seed_plan():
    return plan_memory(load_spec(EXAMPLES / "llama33-70b-1b.yaml"))


def test_seed_target_weights_per_gpu_tp4_bf16(seed_plan):
    t = seed_plan.engine("target")
    h, inter, v, hd = 8192, 28672, 128256, 128
    # per rank: 64/4 = 16 q heads, 8/4 = 2 KV heads, intermediate 28672/4; 2 bytes per bf16 weight
    qkv = (16 * hd + 2 * 2 * hd) * h
    dense = h * 16 * hd
    mlp = 3 * h * (inter // 4)
    layer = (qkv + dense + mlp + 2 * h) * 2
    embed = v * h * 2  # replicated on every TP rank
    lm_head = (v // 4) * h * 2 + h * 2  # split by vocab, + ln_f
    assert t.weight_bytes == 80 * layer + embed + lm_head
    assert round(t.weight_bytes / GIB, 2) == 34.32
    # the HF checkpoint: 70.55 B parameters, 141.1 GB in bf16
    assert t.num_parameters == 70_553_706_496
    assert t.weight_bytes_total == 2 * 70_553_706_496


def test_seed_kv_bytes_per_token(seed_plan):
    t, d = seed_plan.engine("target"), seed_plan.engine("draft")
    # K and V, 80 layers, 8 KV heads of 128, bf16 = 320 KiB per token; a quarter per GPU at TP4
    assert t.kv_bytes_per_token_total == 2 * 80 * 8 * 128 * 2 == 327_680
    assert t.kv_bytes_per_token == 327_680 // 4
    assert t.kv_heads_per_gpu == 2 and t.kv_duplication == 1
    # draft: 16 layers, 8 KV heads of 64 = 32 KiB per token, all on GPU 0
    assert d.kv_bytes_per_token == 2 * 16 * 8 * 64 * 2 == 32_768
    # tied embeddings: the HF checkpoint holds 1.24 B params, TensorRT-LLM stores lm_head too
    assert d.num_parameters == 1_235_814_400
    assert d.weight_bytes == 2 * 1_235_814_400 + 128256 * 2048 * 2


def test_seed_split_gives_equal_tokens_and_consistent_fractions(seed_plan):
    t, d = seed_plan.engine("target"), seed_plan.engine("draft")
    gpu = 141 * GIB
    free_after = gpu - 2 * GIB - t.resident_bytes - d.resident_bytes
    assert seed_plan.free_after_weights_bytes == free_after
    budget = int(0.9 * free_after)
    tokens = budget // (t.kv_bytes_per_token + d.kv_bytes_per_token)
    assert t.kv_tokens == d.kv_tokens == seed_plan.kv_tokens == tokens
    # replay TensorRT-LLM's allocation in both load orders: pool = min(fraction x free now, token cap)
    for order in ((t, d), (d, t)):
        free = gpu - 2 * GIB
        got = {}
        for e in order:
            free -= e.resident_bytes
            pool = min(e.kv_fraction * free, tokens * e.kv_bytes_per_token)  # max_tokens_in_paged_kv_cache
            got[e.role] = pool / e.kv_bytes_per_token
            free -= pool
        assert got["target"] == pytest.approx(tokens, rel=1e-4) and got["draft"] == pytest.approx(
            tokens, rel=1e-4
        )  # fractions are ceiled to 4 decimals: pools may exceed the token cap by <= 1e-4 relative
        assert free >= 0.1 * free_after * 0.99  # the configured 10 % stays free
    assert seed_plan.target_kv_fraction == t.kv_fraction and 0 < t.kv_fraction < 1 and 0 < d.kv_fraction < 1
    # by hand: F = 100.53 GiB left after weights; pools 64.63 (target) and 25.85 GiB (draft)
    assert t.kv_fraction == pytest.approx(
        t.kv_bytes / (free_after - d.kv_bytes), abs=1e-4
    )  # the plan ceils each fraction to 4 decimals
    assert d.kv_fraction == pytest.approx(d.kv_bytes / (free_after - t.kv_bytes), abs=1e-4)  # ditto
    assert seed_plan.fits and seed_plan.full_sequences == tokens // 8192


def test_kv_duplication_when_tp_exceeds_kv_heads():
    from specbuild.builder.memory_plan import engine_memory
    from specbuild.core.formats.hf_config import HFModelConfig

    cfg = HFModelConfig.from_hf(EXAMPLES / "models" / "llama-3.3-70b-instruct")
    e = engine_memory(
        cfg,
        role="target",
        tp=16,
        pp=1,
        dtype="bfloat16",
        weight_only="none",
        max_num_tokens=8192,
        logits_rows=8,
    )
    # 8 KV heads on 16 ranks: every rank stores one (duplicated) head, so the per-GPU KV is 1/8, not 1/16
    assert e.kv_heads_per_gpu == 1 and e.kv_duplication == 2
    assert e.kv_bytes_per_token == 2 * 80 * 1 * 128 * 2


def test_pp_split_and_weight_only():
    from specbuild.builder.memory_plan import rank_weight_bytes
    from specbuild.core.formats.hf_config import HFModelConfig

    assert pp_layers(10, 4) == [3, 3, 2, 2]
    cfg = HFModelConfig.from_hf(EXAMPLES / "models" / "llama-3.3-70b-instruct")
    full = rank_weight_bytes(cfg, tp=4, pp=1, dtype="bfloat16")[0]
    int8 = rank_weight_bytes(cfg, tp=4, pp=1, dtype="bfloat16", weight_only="int8")[0]
    int4 = rank_weight_bytes(cfg, tp=4, pp=1, dtype="bfloat16", weight_only="int4")[0]
    embed_head = 128256 * 8192 * 2 + 32064 * 8192 * 2 + 8192 * 2
    # the layer linears halve (int8) or quarter (int4), plus a bf16 scale per output channel
    layers_bf16 = full - embed_head
    assert int8 - embed_head < layers_bf16 / 2 * 1.01
    assert int4 - embed_head < layers_bf16 / 4 * 1.02
    stages = rank_weight_bytes(cfg, tp=1, pp=2, dtype="bfloat16")
    assert stages[0] == pytest.approx(stages[1], rel=0.01)  # 40 layers each; embedding vs lm_head + ln_f


def test_medusa_plan_counts_heads():
    plan = plan_memory(load_spec(EXAMPLES / "medusa-vicuna-7b.yaml"))
    t = plan.engine("target")
    assert plan.draft_kv_fraction is None and plan.target_kv_fraction == pytest.approx(
        0.9, abs=1e-3
    )  # one engine: the configured 0.9, quantised by whole tokens
    assert t.medusa_bytes == 4 * ((4096 * 4096 + 4096) + 32000 * 4096) * 2
    assert t.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2
    assert math.isclose(t.weight_bytes, 6_738_415_616 * 2)  # integers: isclose is exact equality here
