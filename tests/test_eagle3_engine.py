"""EAGLE-3 in the reference engine: the capture convention, the draft layer against an independent oracle,
greedy output identical to the target alone (single, batched, from the prefix cache), and loading errors.

The draft drafts from target states, so its tokens depend on which layers are captured and how the
layer computes; the greedy output does not (every emitted token is the target's). The first tests pin
the former against HF transformers and a plain-torch oracle (tests/eagle3_drafts.py); the rest the latter.
"""

from __future__ import annotations

import json

import pytest
from eagle3_drafts import oracle_logits, write_draft
from tolerances import REORDER_ULPS, assert_close

torch = pytest.importorskip("torch")

from specbuild.core.errors import CheckpointError  # noqa: E402
from specbuild.core.formats.eagle3 import Eagle3DraftConfig, from_vllm_ids, to_vllm_ids  # noqa: E402
from specbuild.core.sampling_params import SamplingParams  # noqa: E402
from specbuild.engines.reference.eagle3 import load_eagle3_draft, open_row  # noqa: E402
from specbuild.engines.reference.engine import ReferenceEngine  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_torch_thread")]

LAYERS = [0, 1, 2]  # of the 4-layer target: 0-based layer outputs
PROMPTS = ["def add(a, b):", "The quick brown fox", "import os\nimport sys", "Once upon a time there"]


@pytest.fixture(scope="module")
def target4(make_tiny):
    return make_tiny("target4", num_layers=4, num_heads=4, num_kv_heads=2, seed=11)


@pytest.fixture(scope="module")
def target4_model(target4, tmp_path_factory):
    from specbuild.engines.reference.loader import load_weights
    from specbuild.engines.reference.model import LlamaModel
    from specbuild.engines.trtllm.convert import convert_checkpoint

    ckpt = convert_checkpoint(target4, tmp_path_factory.mktemp("t4") / "ckpt", dtype="float32")
    return LlamaModel(load_weights(ckpt))


@pytest.fixture(scope="module")
def hf_target4(target4):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(target4), dtype=torch.float32).eval()


def _draft(tmp_path_factory, name, **kw):
    args = dict(hidden=64, heads=4, kv_heads=2, intermediate=128, vocab=384, draft_vocab=200, layers=LAYERS)
    return write_draft(tmp_path_factory.mktemp(name), **{**args, **kw})


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory):
    return _draft(tmp_path_factory, "e3-random", seed=5)


def _engine(target_model, draft_dir, tokenizer_dir, k=3, **kw):
    return ReferenceEngine(
        target_model,
        method="eagle3",
        draft_head=draft_dir,
        tokenizer_dir=tokenizer_dir,
        max_draft_len=k,
        **kw,
    )


def _engine_first_step(target_model, draft, tokens):
    """The engine's first-step draft logits [T-1,Vd] at every position (one catch-up pass)."""
    seq = torch.tensor([tokens])
    _, aux = target_model.forward_capture(
        seq, target_model.new_cache(1, len(tokens) + 1), capture=draft.aux_layers
    )
    cache = draft.new_cache(1, len(tokens) + 1)
    open_row(cache, 0)
    out = draft.forward(seq[:, 1:], draft.fuse(aux[:, :-1]), cache)  # [1,T-1,H]
    return draft.logits(out[0])


def test_capture_is_the_output_of_layer_i(target4, target4_model, hf_target4):
    """forward_capture's layer i = HF output_hidden_states[i + 1] (the output of decoder layer i); the
    last layer's output is not transformers 5's hidden_states[L] (final-normed), so it is taken by hook."""
    tokens = torch.tensor([[5, 17, 42, 99, 7, 3]])
    _, aux = target4_model.forward_capture(tokens, target4_model.new_cache(1, 8), capture=(0, 1, 2, 3))
    taken = []
    hooks = [
        layer.register_forward_hook(lambda _m, _i, o: taken.append(o[0] if isinstance(o, tuple) else o))
        for layer in hf_target4.model.layers
    ]
    try:
        with torch.no_grad():
            out = hf_target4.model(input_ids=tokens, output_hidden_states=True)
    finally:
        for h in hooks:
            h.remove()
    h = 64
    for i in range(4):
        assert_close(aux[0, :, i * h : (i + 1) * h], taken[i][0], ulps=REORDER_ULPS)
    for i in range(3):
        assert_close(aux[0, :, i * h : (i + 1) * h], out.hidden_states[i + 1][0], ulps=REORDER_ULPS)


def test_draft_layer_matches_an_independent_oracle(target4_model, hf_target4, random_draft):
    draft = load_eagle3_draft(random_draft, target4_model)
    tokens = [5, 17, 42, 99, 7, 3, 250, 11]
    got = _engine_first_step(target4_model, draft, tokens)
    assert_close(got, oracle_logits(hf_target4, random_draft, tokens, LAYERS), ulps=REORDER_ULPS)


def test_a_wrong_capture_convention_gives_another_draft(tmp_path_factory, target4_model, hf_target4):
    """The same weights with vLLM's top-level ids (layer + 1) load as the same capture; read as ours
    (nested), those ids name other layers and the draft's output changes by far more than rounding."""
    top = _draft(tmp_path_factory, "e3-top", seed=5, ids_key="top")
    wrong = _draft(tmp_path_factory, "e3-wrong", seed=5, layers=[1, 2, 3])  # vLLM ids read as ours
    tokens = [5, 17, 42, 99, 7, 3, 250, 11]
    want = oracle_logits(hf_target4, top, tokens, LAYERS)
    right = load_eagle3_draft(top, target4_model)
    assert right.aux_layers == tuple(LAYERS)
    assert_close(_engine_first_step(target4_model, right, tokens), want, ulps=REORDER_ULPS)
    off = _engine_first_step(target4_model, load_eagle3_draft(wrong, target4_model), tokens)
    assert (off - want).abs().max() > 0.1 * want.abs().max()


def test_id_conventions_convert_both_ways():
    assert to_vllm_ids((1, 14, 26)) == (2, 15, 27)  # SmolLM2-135M's defaults (research note §C.6)
    assert from_vllm_ids([2, 15, 27]) == (1, 14, 26)
    with pytest.raises(CheckpointError, match="embedding"):
        from_vllm_ids([0, 3])
    cfg = Eagle3DraftConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "hidden_size": 8,
            "num_attention_heads": 2,
            "intermediate_size": 16,
            "vocab_size": 10,
            "eagle_aux_hidden_state_layer_ids": [3, 1],
        }
    )
    assert cfg.aux_layers == (0, 2)  # ascending: the fc input order
    assert Eagle3DraftConfig.from_dict(cfg.to_hf()).aux_layers == (0, 2)  # both keys written, both agree
    bad = cfg.to_hf()
    bad["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [1, 3]
    with pytest.raises(CheckpointError, match="different layers"):
        Eagle3DraftConfig.from_dict(bad)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_random_draft_greedy_equals_the_target(target4_model, random_draft, tokenizer_dir, k):
    engine = _engine(target4_model, random_draft, tokenizer_dir, k=k)
    params = SamplingParams(max_tokens=24, temperature=0.0)
    prompts = [engine.encode(t) for t in PROMPTS]
    want = [engine.generate(p, params, speculative=False).token_ids for p in prompts]
    for p, w in zip(prompts, want, strict=True):
        got = engine.generate(p, params)
        assert got.token_ids == w
        assert (
            got.stats.draft_passes > 0 and got.stats.k_per_round[0] == 0
        )  # the prefill round drafts nothing
    batch = engine.generate_batch(prompts, params)
    assert [r.token_ids for r in batch] == want
    again = engine.generate_batch(prompts, params)  # every prompt's KV (target and draft) from the caches
    assert [r.token_ids for r in again] == want
    assert engine.prefix_cache.reused_tokens > 0  # the prompts came from the target's cache
    assert engine.speculator.draft_cache.reused_tokens > 0  # and the draft's


def test_prefix_cache_continuation_and_shared_prefixes(target4_model, random_draft, tokenizer_dir):
    """A later turn extends a cached sequence; prompts sharing a system prefix share its KV: the output is
    the target's either way, and the draft's prefix cache serves the second request."""
    engine = _engine(target4_model, random_draft, tokenizer_dir)
    params = SamplingParams(max_tokens=16, temperature=0.0)
    first = engine.encode("The quick brown fox")
    out = engine.generate(first, params).token_ids
    later = first + out + engine.encode(" and then")
    assert (
        engine.generate(later, params).token_ids
        == engine.generate(later, params, speculative=False).token_ids
    )
    assert engine.speculator.draft_cache.reused_tokens > 0
    shared = [first + engine.encode(t) for t in (" jumps", " sleeps", " runs")]
    want = [engine.generate(p, params, speculative=False).token_ids for p in shared]
    assert [r.token_ids for r in engine.generate_batch(shared, params)] == want


def test_stop_hook_and_max_tokens(target4_model, random_draft, tokenizer_dir):
    engine = _engine(target4_model, random_draft, tokenizer_dir, k=4)
    prompt = engine.encode("def add(a, b):")
    full = engine.generate(
        prompt, SamplingParams(max_tokens=20, temperature=0.0), speculative=False
    ).token_ids
    got = engine.generate(prompt, SamplingParams(max_tokens=7, temperature=0.0))
    assert got.token_ids == full[:7]
    cut = engine.generate(
        prompt,
        SamplingParams(max_tokens=20, temperature=0.0),
        stop=lambda out, s: 5 if len(out) >= 5 else None,
    )
    assert cut.token_ids == full[:5]
    stop_tok = full[9]
    stopped = engine.generate(
        prompt, SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=(stop_tok,))
    )
    assert stopped.token_ids == full[: full.index(stop_tok) + 1]


def test_loading_errors_say_what_is_wrong(tmp_path_factory, target4_model):
    no_d2t = _draft(tmp_path_factory, "e3-nod2t", seed=1)
    from safetensors.torch import load_file, save_file

    w = load_file(str(no_d2t / "model.safetensors"))
    del w["d2t"]
    save_file(w, str(no_d2t / "model.safetensors"))
    with pytest.raises(CheckpointError, match="no d2t"):
        load_eagle3_draft(no_d2t, target4_model)
    two = _draft(tmp_path_factory, "e3-two", seed=1, layers=[0, 2])
    with pytest.raises(CheckpointError, match="fc"):
        load_eagle3_draft(two, target4_model, aux_layers=[0, 1, 2])  # fc fuses 2 layers, 3 asked
    with pytest.raises(CheckpointError, match="do not fit"):
        load_eagle3_draft(two, target4_model, aux_layers=[0, 7])
    flagged = _draft(tmp_path_factory, "e3-flag", seed=1)
    cfg = json.loads((flagged / "config.json").read_text())
    (flagged / "config.json").write_text(json.dumps({**cfg, "norm_before_residual": True}))
    with pytest.raises(CheckpointError, match="norm_before_residual"):
        load_eagle3_draft(flagged, target4_model)
    layers0 = _draft(tmp_path_factory, "e3-layers0", seed=5, prefix="layers.0.")  # the speculators names
    same = _draft(tmp_path_factory, "e3-mid", seed=5)
    tokens = [5, 17, 42, 99, 7]
    a = _engine_first_step(target4_model, load_eagle3_draft(layers0, target4_model), tokens)
    b = _engine_first_step(target4_model, load_eagle3_draft(same, target4_model), tokens)
    assert torch.equal(a, b)
