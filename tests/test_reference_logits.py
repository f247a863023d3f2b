"""The reference engine reproduces HF logits from checkpoints written by the real converter.

Also: incremental decode == one pass, a right-padded batch == each row alone, KV rollback.
"""

from __future__ import annotations

import pytest
from tolerances import HALF_ULPS, REORDER_ULPS, assert_close

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.numeric]



def _convert(hf_dir, out, **kw):
    from specbuild.engines.trtllm.convert import convert_checkpoint

    return convert_checkpoint(hf_dir, out, dtype=kw.pop("dtype", "float32"), **kw)


def _hf_logits(hf_dir, ids):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        return model(ids).logits  # [1,T,V]


def _ref(ckpt):
    from specbuild.engines.reference.loader import load_weights
    from specbuild.engines.reference.model import LlamaModel

    return LlamaModel(load_weights(ckpt))


@pytest.fixture(scope="module")
def prompt_ids():
    gen = torch.Generator().manual_seed(0)
    return torch.randint(3, 300, (1, 24), generator=gen)  # [1,T]


@pytest.mark.parametrize(
    ("fixture", "tp", "pp"),
    [("tiny_target", 1, 1), ("tiny_qwen2", 1, 1), ("tiny_tied", 1, 1), ("tiny_target", 2, 1), ("tiny_target", 1, 2), ("tiny_qwen2", 2, 2)],
)
def test_converted_logits_match_hf(request, tmp_path, prompt_ids, fixture, tp, pp):
    hf_dir = request.getfixturevalue(fixture)
    model = _ref(_convert(hf_dir, tmp_path / "ckpt", tp_size=tp, pp_size=pp))
    got = model.logits(model.forward(prompt_ids, model.new_cache(1, 8)))  # [1,T,V]
    want = _hf_logits(hf_dir, prompt_ids)
    assert_close(got, want, ulps=REORDER_ULPS)  # same float32 math as HF, other op order (fused qkv, TP/PP)


def test_kv_duplication_and_llama3_rope(make_tiny, tmp_path, prompt_ids):
    """tp=4 > 1 KV head: duplicated KV heads are merged back; llama3 RoPE scaling is applied."""
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
    hf_dir = make_tiny("mqa_llama3", num_heads=4, num_kv_heads=1, rope_scaling=scaling, seed=7)
    model = _ref(_convert(hf_dir, tmp_path / "ckpt", tp_size=4))
    got = model.logits(model.forward(prompt_ids, model.new_cache(1, 8)))
    assert_close(got, _hf_logits(hf_dir, prompt_ids), ulps=REORDER_ULPS)  # float32, other op order
    assert model.cfg.rotary_scaling["rope_type"] == "llama3"


@pytest.fixture(scope="module")
def target_model(tiny_target, tmp_path_factory):
    return _ref(_convert(tiny_target, tmp_path_factory.mktemp("ckpt") / "t"))


def test_incremental_decode_equals_one_pass(target_model, prompt_ids):
    m = target_model
    full = m.logits(m.forward(prompt_ids, m.new_cache(1, 4)))  # [1,T,V]
    cache = m.new_cache(1, 4)  # small on purpose: the cache must grow
    parts = [m.logits(m.forward(prompt_ids[:, :10], cache))]
    parts += [m.logits(m.forward(prompt_ids[:, i:i + 1], cache)) for i in range(10, prompt_ids.shape[1])]
    assert cache.lengths == [prompt_ids.shape[1]]
    assert_close(torch.cat(parts, 1), full, ulps=REORDER_ULPS)  # float32: one pass vs cached steps, other GEMM shapes


def test_batch_of_different_lengths_equals_rows_alone(target_model, prompt_ids):
    m = target_model
    lengths = [24, 7, 15]
    batch = torch.zeros(3, 24, dtype=torch.long)
    for row, n in enumerate(lengths):
        batch[row, :n] = prompt_ids[0, :n]
    cache = m.new_cache(3, 32)
    hidden = m.forward(batch, cache, n_new=lengths)  # [3,24,H]
    assert cache.lengths == lengths
    step = m.forward(torch.tensor([[5], [6], [7]]), cache)  # one decode step, rows at different lengths
    for row, n in enumerate(lengths):
        alone = m.new_cache(1, 32)
        want = m.forward(prompt_ids[:, :n], alone)
        want_step = m.forward(torch.tensor([[5 + row]]), alone)
        assert_close(hidden[row, :n], want[0], ulps=REORDER_ULPS)  # float32: padded batch vs row alone
        assert_close(step[row], want_step[0], ulps=REORDER_ULPS)


def test_kv_rollback_then_refeed_equals_fresh(target_model, prompt_ids):
    m = target_model
    cache = m.new_cache(1, 32)
    m.forward(prompt_ids[:, :20], cache)
    cache.truncate(0, 12)  # reject the last 8
    other = torch.tensor([[9, 8, 7]])
    got = m.forward(other, cache)
    fresh = m.new_cache(1, 32)
    m.forward(prompt_ids[:, :12], fresh)
    want = m.forward(other, fresh)
    assert_close(got, want, ulps=REORDER_ULPS)  # float32: rolled-back cache vs fresh prefill
    with pytest.raises(Exception, match="roll"):
        cache.truncate(0, 99)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_runs_close_to_float32(tiny_target, tmp_path, prompt_ids, dtype):
    model = _ref(_convert(tiny_target, tmp_path / "ckpt", dtype=dtype))
    assert model.dtype == getattr(torch, dtype)
    got = model.logits(model.forward(prompt_ids, model.new_cache(1, 8)))
    want = _hf_logits(tiny_target, prompt_ids)
    assert got.dtype == torch.float32
    assert_close(got, want, ulps=HALF_ULPS, dtype=getattr(torch, dtype))  # weights/activations rounded to the half dtype


def test_missing_rank_file_is_a_clear_error(tiny_target, tmp_path):
    from specbuild.engines.reference.loader import load_weights
    from specbuild.errors import CheckpointError

    ckpt = _convert(tiny_target, tmp_path / "ckpt", tp_size=2)
    (ckpt / "rank1.safetensors").unlink()
    with pytest.raises(CheckpointError, match="rank1.safetensors"):
        load_weights(ckpt)
