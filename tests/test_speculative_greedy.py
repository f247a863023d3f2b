"""At temperature 0, speculative output == the target's own greedy output, token for token.

Draft/target for K = 1..8 (a draft that agrees often: the target with perturbed weights; and the
unrelated tiny draft), Medusa with several trees (random heads, and "oracle" heads that know the
greedy continuation so long paths, non-first top-k branches and KV compaction are exercised),
batched and unbatched; stop tokens, max_tokens, external verification, prefix-cache reuse.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from tolerances import REORDER_ULPS, assert_close

torch = pytest.importorskip("torch")

from specbuild.core.methods import Method  # noqa: E402
from specbuild.core.sampling_params import SamplingParams  # noqa: E402

PROMPTS = [[5, 17, 99, 3, 44, 12], [7, 7, 8], [200, 31, 64, 90, 11, 2, 150, 42, 77, 19]]
MAX_TOKENS = 20

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.numeric]


@pytest.fixture(scope="module")
def target_ckpt(tiny_target, tmp_path_factory):
    from specbuild.engines.trtllm.convert import convert_checkpoint

    return convert_checkpoint(tiny_target, tmp_path_factory.mktemp("spec") / "target", dtype="float32")


@pytest.fixture(scope="module")
def models(target_ckpt, tiny_draft, tmp_path_factory):
    from specbuild.engines.reference.loader import load_weights
    from specbuild.engines.reference.model import LlamaModel
    from specbuild.engines.trtllm.convert import convert_checkpoint

    weights = load_weights(target_ckpt)
    gen = torch.Generator().manual_seed(3)
    noisy = {k: t + 0.04 * torch.randn(t.shape, generator=gen) for k, t in weights.tensors.items()}
    near = LlamaModel(dataclasses.replace(weights, tensors=noisy))
    far = LlamaModel(
        load_weights(
            convert_checkpoint(tiny_draft, tmp_path_factory.mktemp("spec") / "draft", dtype="float32")
        )
    )
    return LlamaModel(weights), near, far


@pytest.fixture(scope="module")
def baseline(models):
    from specbuild.engines.reference.engine import ReferenceEngine

    engine = ReferenceEngine(models[0])
    return [
        engine.generate(p, SamplingParams(max_tokens=MAX_TOKENS), speculative=False).token_ids
        for p in PROMPTS
    ]


def _engine(models, which):
    from specbuild.engines.reference.engine import ReferenceEngine

    return ReferenceEngine(
        models[0], draft=models[1] if which == "near" else models[2], method=Method.DRAFT_TARGET
    )


@pytest.mark.parametrize("k", range(1, 9))
def test_draft_target_greedy_equals_target(models, baseline, k):
    engine = _engine(models, "near")
    params = SamplingParams(max_tokens=MAX_TOKENS)
    accepted = 0
    for prompt, want in zip(PROMPTS, baseline, strict=True):
        result = engine.generate(prompt, params, num_draft_tokens=k)
        assert result.token_ids == want
        s = result.stats
        assert s.drafted == sum(s.drafted_per_position) and s.accepted == sum(s.accepted_per_step)
        assert s.target_passes == len(s.accepted_per_step) + (
            1 if len(want) > s.accepted + len(s.accepted_per_step) else 0
        )
        accepted += s.accepted
    assert accepted > 0  # the near draft must actually get tokens accepted, or this test proves little


def test_unrelated_draft_and_batched_speculation(models, baseline):
    engine = _engine(models, "far")
    results = engine.generate_batch(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS), num_draft_tokens=3)
    assert [r.token_ids for r in results] == baseline
    plain = engine.generate_batch(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS), speculative=False)
    assert [r.token_ids for r in plain] == baseline
    streamed: dict[int, list[int]] = {}
    for k in (1, 5, 8):
        near = _engine(models, "near").generate_batch(
            PROMPTS,
            SamplingParams(max_tokens=MAX_TOKENS),
            num_draft_tokens=k,
            on_tokens=lambda i, toks: streamed.setdefault(i, []).extend(toks),
        )
        assert [r.token_ids for r in near] == baseline
        assert [streamed.pop(i) for i in range(len(PROMPTS))] == baseline
        assert all(r.stats.accepted == sum(r.stats.accepted_per_step) for r in near)


def test_batched_plain_decode_reuses_the_prefix_cache(models, baseline):
    """A second batch whose prompts extend the first batch's requests takes their KV from the prefix
    cache (each row its own sequence) and still decodes exactly the greedy continuation."""
    engine = _engine(models, "far")
    params = SamplingParams(max_tokens=MAX_TOKENS)
    first = engine.generate_batch(PROMPTS, params, speculative=False)
    assert [r.token_ids for r in first] == baseline and all(r.cached_prompt_tokens == 0 for r in first)
    longer = [p + out[:4] for p, out in zip(PROMPTS, baseline, strict=True)]
    second = engine.generate_batch(longer, params, speculative=False)
    alone = _engine(models, "far")
    assert [r.token_ids for r in second] == [
        alone.generate(p, params, speculative=False).token_ids for p in longer
    ]
    # each row reused its whole earlier prompt and the fed continuation (the last prompt token is recomputed)
    assert [r.cached_prompt_tokens for r in second] == [len(p) - 1 for p in longer]


def test_batched_plain_decode_extends_a_sequence_grown_by_a_single_request(models):
    """A single request longer than a cached sequence's first capacity (256) grows it inside a forward
    pass (inference tensors); a batch that extends that request reads and writes it back (the server's
    multi-turn traffic at concurrency > 1)."""
    engine = _engine(models, "far")
    params = SamplingParams(max_tokens=8)
    long = [(7 * i) % 199 + 1 for i in range(260)]
    first = engine.generate(long, params, speculative=False)
    longer = [long + first.token_ids[:4], PROMPTS[1]]
    batch = engine.generate_batch(longer, params, speculative=False)
    alone = _engine(models, "far")
    assert [r.token_ids for r in batch] == [
        alone.generate(p, params, speculative=False).token_ids for p in longer
    ]
    assert batch[0].cached_prompt_tokens == len(longer[0]) - 1


def test_batched_sampling_equals_unbatched_with_the_same_seeds(models):
    engine = _engine(models, "near")
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0.7, seed=s) for s in (1, 2, 3)]
    batched = engine.generate_batch(PROMPTS, params, num_draft_tokens=3)
    alone = [engine.generate(p, q, num_draft_tokens=3) for p, q in zip(PROMPTS, params, strict=True)]
    assert [r.token_ids for r in batched] == [r.token_ids for r in alone]


def test_stop_token_and_max_tokens(models, baseline):
    engine = _engine(models, "near")
    want = baseline[0]
    stop = want[6]
    cut = want[: want.index(stop) + 1]
    for k in (1, 4, 8):
        r = engine.generate(
            PROMPTS[0], SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=(stop,)), num_draft_tokens=k
        )
        assert r.token_ids == cut and r.finish_reason == "stop"
        r = engine.generate(
            PROMPTS[0], SamplingParams(max_tokens=MAX_TOKENS, end_id=stop), num_draft_tokens=k
        )
        assert r.token_ids == cut
        r = engine.generate(PROMPTS[0], SamplingParams(max_tokens=3), num_draft_tokens=k)
        assert r.token_ids == want[:3] and r.finish_reason == "length"
    plain = engine.generate(
        PROMPTS[0], SamplingParams(max_tokens=MAX_TOKENS, stop_token_ids=(stop,)), speculative=False
    )
    assert plain.token_ids == cut


def test_sampling_is_seeded_and_self_draft_accepts_all(models):
    from specbuild.engines.reference.engine import ReferenceEngine

    engine = _engine(models, "near")
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.8, top_k=50, seed=11)
    a = engine.generate(PROMPTS[0], params, num_draft_tokens=4).token_ids
    b = engine.generate(PROMPTS[0], params, num_draft_tokens=4).token_ids
    assert a == b and len(a) == MAX_TOKENS
    same = ReferenceEngine(models[0], draft=models[0], method=Method.DRAFT_TARGET).generate(
        PROMPTS[0], params, num_draft_tokens=4
    )
    assert same.stats.acceptance_rate == 1.0  # identical distributions: every draft accepted


def test_external_verification_equals_in_process(models, baseline):
    from specbuild.engines.reference.cached_decode import ModelDrafter
    from specbuild.engines.reference.engine import ReferenceEngine

    target, near, _ = models
    engine = ReferenceEngine(target)
    drafter = ModelDrafter(near)
    params = SamplingParams(max_tokens=MAX_TOKENS)
    ids, out = list(PROMPTS[2]), []
    while len(out) < MAX_TOKENS - 4:
        drafts, draft_probs = drafter.propose(ids + out, 4, params)
        logits = torch.log(draft_probs.clamp_min(1e-9))  # what a draft engine would return
        got = engine.verify_external(ids + out, drafts, params=params)
        assert got == engine.verify_external(ids + out, drafts, logits, params=params)
        out += got
    assert out == baseline[2][: len(out)]
    assert engine.prefix_cache.reused_tokens > len(ids)  # the prompt was not recomputed on every call


def test_generate_with_logits_matches_model(models, baseline):
    from specbuild.engines.reference.engine import ReferenceEngine

    engine = ReferenceEngine(models[0])
    result, logits = engine.generate_with_logits(PROMPTS[1], SamplingParams(max_tokens=5))
    assert result.token_ids == baseline[1][:5]
    assert logits.shape == (5, models[0].cfg.vocab_size)
    assert logits.argmax(-1).tolist() == baseline[1][:5]


# ---- Medusa --------------------------------------------------------------------------------------

NUM_HEADS = 3


@pytest.fixture(scope="module")
def medusa_ckpt(tiny_target, tmp_path_factory):
    from safetensors.torch import save_file

    from specbuild.engines.trtllm.convert import convert_checkpoint
    from specbuild.engines.trtllm.medusa import MedusaHeadsSource

    cfg = json.loads((tiny_target / "config.json").read_text())
    h, v = cfg["hidden_size"], cfg["vocab_size"]
    heads = tmp_path_factory.mktemp("heads")
    gen = torch.Generator().manual_seed(5)
    tensors = {}
    for i in range(NUM_HEADS):
        tensors[f"{i}.0.linear.weight"] = 0.1 * torch.randn(h, h, generator=gen)
        tensors[f"{i}.0.linear.bias"] = 0.1 * torch.randn(h, generator=gen)
        tensors[f"{i}.1.weight"] = 0.2 * torch.randn(v, h, generator=gen)
    save_file(tensors, str(heads / "medusa_lm_head.safetensors"))
    (heads / "config.json").write_text(json.dumps({"medusa_num_heads": NUM_HEADS, "medusa_num_layers": 1}))
    src = MedusaHeadsSource(heads, num_heads=NUM_HEADS, num_layers=1, max_draft_len=63)
    ckpt = convert_checkpoint(
        tiny_target, tmp_path_factory.mktemp("medusa") / "ckpt", dtype="float32", tp_size=2, medusa=src
    )
    return ckpt, tensors


def test_medusa_heads_load_and_compute(medusa_ckpt):
    from specbuild.engines.reference.engine import ReferenceEngine

    ckpt, tensors = medusa_ckpt
    engine = ReferenceEngine.load(ckpt)
    assert engine.method == Method.MEDUSA  # the checkpoint declares MedusaForCausalLM
    x = torch.randn(engine.target.cfg.hidden_size)
    got = engine.speculator.heads.logits(x)  # [nH,V]
    for i in range(NUM_HEADS):
        y = x + torch.nn.functional.silu(tensors[f"{i}.0.linear.weight"] @ x + tensors[f"{i}.0.linear.bias"])
        assert_close(got[i], tensors[f"{i}.1.weight"] @ y, ulps=REORDER_ULPS)  # float32, engine vs by hand


def _medusa_engine(ckpt, tree):
    """Without a tokenizer (no eos stop), like the baseline engine."""
    from specbuild.engines.reference.engine import ReferenceEngine
    from specbuild.engines.reference.loader import load_weights
    from specbuild.engines.reference.model import LlamaModel

    return ReferenceEngine(LlamaModel(load_weights(ckpt)), method=Method.MEDUSA, medusa_choices=tree)


TREES = ["chain_3", [[0], [1], [2], [0, 0], [1, 0], [0, 1]], "mc_sim_7b_61"]


@pytest.mark.parametrize("tree", TREES, ids=["chain3", "small", "mc61"])
def test_medusa_random_heads_greedy_equals_target(medusa_ckpt, baseline, tree):
    engine = _medusa_engine(medusa_ckpt[0], tree)
    results = engine.generate_batch(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS))
    assert [r.token_ids for r in results] == baseline
    assert results[0].speculative and results[0].stats.draft_passes == 0


class OracleHeads:
    """Heads that know the greedy continuation: head 1 puts the right token at top-k rank 1, others
    at rank 0."""

    def __init__(self, model, sequence: list[int], num_heads: int):
        self.seq, self.num_heads, self.vocab = sequence, num_heads, model.cfg.vocab_size
        self.states = model.forward(torch.tensor([sequence]), model.new_cache(1, len(sequence)))[0]  # [S,H]

    def logits(self, hidden):
        t = int((self.states - hidden).norm(dim=-1).argmin())  # position this hidden state belongs to
        out = torch.zeros(self.num_heads, self.vocab)
        for h in range(self.num_heads):
            if t + 2 + h < len(self.seq):
                right = self.seq[t + 2 + h]
                out[h, right] = 5.0 if h != 1 else 4.0
                if h == 1:
                    out[h, (right + 1) % self.vocab] = 5.0  # a wrong guess ranked first
        return out


def test_medusa_oracle_heads_accept_long_paths(medusa_ckpt, baseline):
    tree = [[0], [1], [0, 0], [0, 1], [1, 0], [0, 1, 0], [0, 0, 0]]
    engine = _medusa_engine(medusa_ckpt[0], tree)
    for prompt, want in zip(PROMPTS, baseline, strict=True):
        engine.speculator.heads = OracleHeads(engine.target, prompt + want, NUM_HEADS)
        result = engine.generate(prompt, SamplingParams(max_tokens=MAX_TOKENS))
        assert result.token_ids == want
        assert result.stats.mean_accepted_per_step > 3.0  # path [0, 1, 0]: 3 drafts + 1 per pass


def test_tree_buffers_shapes():
    from specbuild.core.formats.medusa_choices import MedusaChoices
    from specbuild.engines.reference.medusa import TreeBuffers

    tree = TreeBuffers.from_choices(
        MedusaChoices.parse([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]), num_heads=3
    )
    assert tree.attention_mask.shape == (7, 7) and tree.depth == 3 and tree.num_nodes == 6
    assert tree.position_offsets.tolist() == [0, 1, 1, 2, 2, 2, 3]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1, 2, 3]
    assert tree.topk_index.tolist() == [-1, 0, 1, 0, 1, 0, 0]
    assert tree.attention_mask[6].tolist() == [True, True, False, True, False, False, True]
    assert sorted(tree.retrieve_indices.tolist()) == sorted([[0, 1, 3, 6], [0, 1, 4, -1], [0, 2, 5, -1]])
    assert tree.children[0] == (1, 2) and tree.children[1] == (3, 4)
