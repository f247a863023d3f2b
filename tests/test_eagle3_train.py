"""train-eagle3 on a tiny target: the TTT unroll is the engine's drafting, the vocabulary maps round-trip,
a resumed run ends on the weights of an uninterrupted one, and a trained draft drafts well and stays lossless:
greedy output identical to the target alone, sampled output distributed as the target's (chi-square), which
a broken acceptance rule or a broken draft-to-target mapping fails."""

from __future__ import annotations

import json

import pytest
from eagle3_drafts import write_draft
from tolerances import REORDER_ULPS, assert_close

torch = pytest.importorskip("torch")

from safetensors.torch import load_file  # noqa: E402

from specbuild.core.formats.eagle3 import Eagle3DraftConfig  # noqa: E402
from specbuild.core.sampling_params import SamplingParams  # noqa: E402
from specbuild.engines.reference import cached_decode  # noqa: E402
from specbuild.engines.reference import eagle3 as engine_eagle3  # noqa: E402
from specbuild.engines.reference.eagle3 import load_eagle3_draft, open_row  # noqa: E402
from specbuild.engines.reference.engine import ReferenceEngine  # noqa: E402
from specbuild.engines.reference.sampling import probs_from_logits  # noqa: E402
from specbuild.tuning.config import Eagle3TrainConfig  # noqa: E402
from specbuild.tuning.eagle3_data import select_vocab, vocab_maps  # noqa: E402
from specbuild.tuning.eagle3_draft import Eagle3TrainDraft  # noqa: E402
from specbuild.tuning.eagle3_train import train_eagle3  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_torch_thread")]

LAYERS = (0, 1, 2)
PROMPTS = [
    "def add(a, b):",
    "The quick brown fox",
    "import os\nimport sys",
    "Once upon a time there",
    "for i in range(10):",
    "Speculative decoding drafts",
    "print(i)",
    "class Foo:",
]


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
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("e3data") / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    return path


def _config(target, data, out, **kw):
    base = dict(
        model=str(target),
        data=data,
        out=out,
        steps=60,
        batch_size=8,
        seq_len=48,
        layers=LAYERS,
        draft_vocab_size=128,
        device="cpu",
        checkpoint_every=0,
        heldout_fraction=0.0,
    )
    return Eagle3TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def trained(target4, prompts_file, tmp_path_factory):
    """A draft trained on the target's answers to PROMPTS (measured on them: it knows them)."""
    return train_eagle3(_config(target4, prompts_file, tmp_path_factory.mktemp("e3t") / "draft"))


def _engine(target_model, draft, tokenizer_dir, k=3):
    return ReferenceEngine(
        target_model, method="eagle3", draft_head=draft, tokenizer_dir=tokenizer_dir, max_draft_len=k
    )


def test_ttt_unroll_is_the_engines_drafting(tmp_path, target4_model):
    """Step j of the unroll at anchor a = the engine's draft after a catch-up to slot a and j drafted slots
    fed the true tokens: one layer math in two places (training and the reference engine)."""
    folder = write_draft(
        tmp_path / "d",
        hidden=64,
        heads=4,
        kv_heads=2,
        intermediate=128,
        vocab=384,
        draft_vocab=100,
        layers=list(LAYERS),
        seed=3,
    )
    draft = load_eagle3_draft(folder, target4_model)
    module = Eagle3TrainDraft(Eagle3DraftConfig.from_hf(folder), target4_model.w["embed"])
    module.load_hf_state_dict(load_file(str(folder / "model.safetensors")))
    tokens = [5, 17, 42, 99, 7, 3, 250, 11, 64, 8]
    seq = torch.tensor([tokens])
    _, aux = target4_model.forward_capture(seq, target4_model.new_cache(1, 12), capture=LAYERS)
    with torch.no_grad():
        unrolled = module.unroll(aux, seq, 3)  # [1,A,Vd] per step
    for anchor in (1, 4, 6):
        cache = draft.new_cache(1, 16)
        open_row(cache, 0)
        h = draft.forward(seq[:, 1 : anchor + 1], draft.fuse(aux[:, :anchor]), cache)[:, -1:]  # [1,1,H]
        for j in range(3):
            if j:
                h = draft.forward(seq[:, anchor + j : anchor + j + 1], h, cache)  # the true token a + j
            assert_close(unrolled[j][0, anchor - 1], draft.logits(h[0, 0]), ulps=REORDER_ULPS)


def test_draft_vocabulary_maps_round_trip(trained, target4_model):
    seqs = [[1, 2, 2, 3, 3, 3, 9], [4, 3, 3, 5]]
    used = select_vocab(seqs, [2, 1], vocab_size=12, draft_vocab_size=4)
    assert used.tolist() == [2, 3, 5, 9]  # answers: 3 x6 then 2, 5, 9 once; ties by whole-text count, then id
    d2t, t2d = vocab_maps(used, 12)
    assert (torch.arange(4) + d2t).tolist() == used.tolist()
    assert t2d.nonzero().flatten().tolist() == used.tolist()
    w = load_file(str(trained.out / "model.safetensors"))  # the written draft: the loader maps the same ids
    draft = load_eagle3_draft(trained.out, target4_model)
    assert torch.equal(draft.draft_ids, torch.arange(w["d2t"].numel()) + w["d2t"])
    assert torch.equal(w["t2d"].nonzero().flatten(), draft.draft_ids)
    config = json.loads((trained.out / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)
    assert config["eagle_aux_hidden_state_layer_ids"] == [i + 1 for i in LAYERS]  # vLLM's key
    assert config["draft_vocab_size"] == w["lm_head.weight"].shape[0] == 128
    assert "embed_tokens.weight" not in w  # shared with the target


def test_training_learns_and_reports_acceptance(trained):
    m = trained.metrics
    assert m["acceptance"][0] > 0.4 > m["untrained_acceptance"][0]  # measured 0.70 vs 0.04 on these answers
    assert len(m["acceptance"]) == 5


def test_resume_ends_on_the_uninterrupted_weights(target4, prompts_file, tmp_path):
    whole = train_eagle3(_config(target4, prompts_file, tmp_path / "whole", steps=6, checkpoint_every=2))

    class Stop(Exception):
        pass

    def interrupt(step):
        if step == 5:
            raise Stop

    config = _config(target4, prompts_file, tmp_path / "resumed", steps=6, checkpoint_every=2)
    with pytest.raises(Stop):
        train_eagle3(config, on_step=interrupt)
    resumed = train_eagle3(Eagle3TrainConfig(**{**config.__dict__, "resume": True}))
    assert resumed.resumed_from == 4
    a, b = load_file(str(whole.out / "model.safetensors")), load_file(str(resumed.out / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_trained_draft_greedy_equals_the_target_and_accepts(trained, target4_model, tokenizer_dir):
    engine = _engine(target4_model, trained.out, tokenizer_dir, k=4)
    params = SamplingParams(max_tokens=24, temperature=0.0)  # the answers' length in training
    prompts = [engine.encode(t) for t in PROMPTS]
    want = [engine.generate(p, params, speculative=False).token_ids for p in prompts]
    single = [engine.generate(p, params) for p in prompts]
    assert [r.token_ids for r in single] == want
    stats = [r.stats for r in single]
    accepted = sum(s.accepted for s in stats)
    partial = sum(
        0 < a < d for s in stats for a, d in zip(s.accepted_per_step, s.drafted_per_step, strict=True)
    )
    # measured 0.24 of the drafts accepted (the first position 0.6); rounds with 1..K-1 accepted roll back
    assert accepted > 0.1 * sum(s.drafted for s in stats) and partial > 0
    assert [r.token_ids for r in engine.generate_batch(prompts, params)] == want
    assert [r.token_ids for r in engine.generate_batch(prompts[::-1], params)] == want[
        ::-1
    ]  # from the caches


# ---- T > 0: the output follows the target ---------------------------------------------------------

SAMPLED = SamplingParams(max_tokens=3, temperature=1.0, top_k=3)
ROWS, CHUNKS = 100, 15  # 1500 samples of 3 tokens: <= 27 cells


def _target_joint(model, prompt):
    """Exact P(t1, t2, t3) under SAMPLED from the target alone."""
    from specbuild.engines.reference.cached_decode import CachedSequence

    def probs(ids):
        seq = CachedSequence(model, capacity=len(ids) + 1)
        return probs_from_logits(model.logits(seq.feed(ids)[0]), SAMPLED)  # [V]

    joint = {}
    p1 = probs(prompt)
    for a in p1.nonzero().flatten().tolist():
        p2 = probs(prompt + [a])
        for b in p2.nonzero().flatten().tolist():
            p3 = probs(prompt + [a, b])
            for c in p3.nonzero().flatten().tolist():
                joint[(a, b, c)] = float(p1[a] * p2[b] * p3[c])
    return joint


def _sampled_pvalue(engine, prompt, joint):
    counts: dict[tuple, int] = {}
    drafted = accepted = 0
    for chunk in range(CHUNKS):
        params = [SamplingParams(**{**SAMPLED.__dict__, "seed": chunk * ROWS + r}) for r in range(ROWS)]
        for res in engine.generate_batch([prompt] * ROWS, params):
            key = tuple(res.token_ids)
            counts[key] = counts.get(key, 0) + 1
            drafted, accepted = drafted + res.stats.drafted, accepted + res.stats.accepted
    if any(k not in joint for k in counts):
        return 0.0, accepted / drafted
    n = sum(counts.values())
    cells = list(joint)
    stat = sum((counts.get(c, 0) - joint[c] * n) ** 2 / (joint[c] * n) for c in cells)
    return float(
        torch.special.gammaincc(torch.tensor((len(cells) - 1) / 2.0), torch.tensor(stat / 2.0))
    ), accepted / drafted


@pytest.fixture(scope="module")
def sampled_case(trained, target4_model, tokenizer_dir):
    engine = _engine(target4_model, trained.out, tokenizer_dir, k=2)
    prompt = engine.encode(PROMPTS[0])
    return engine, prompt, _target_joint(target4_model, prompt)


def test_sampled_output_follows_the_target(sampled_case):
    engine, prompt, joint = sampled_case
    pvalue, rate = _sampled_pvalue(engine, prompt, joint)
    assert 0.05 < rate < 0.95  # both accepted and rejected drafts took part (residual draws included)
    assert pvalue > 1e-3, pvalue  # chi-square: false alarm 1 in 1000 (seeded: deterministic per kernel)


def _always_accept(draft_tokens, draft_probs, target_probs, generator=None):
    from specbuild.engines.reference.sampling import sample

    return len(draft_tokens), sample(target_probs[len(draft_tokens)], generator)


def _unmapped(self, draft_probs):
    """The draft distribution left at draft ids instead of their target ids (a d2t bug)."""
    out = draft_probs.new_zeros(draft_probs.shape[:-1] + (self.vocab_size,))
    out[..., : draft_probs.shape[-1]] = draft_probs
    return out


@pytest.mark.parametrize("broken", ["always_accept", "unmapped_draft_probs"])
def test_the_sampled_test_fails_a_broken_rule(sampled_case, monkeypatch, broken):
    engine, prompt, joint = sampled_case
    if broken == "always_accept":
        monkeypatch.setattr(cached_decode, "accept_draft", _always_accept)
    else:
        monkeypatch.setattr(engine_eagle3.Eagle3Draft, "to_target", _unmapped)
    pvalue, _ = _sampled_pvalue(engine, prompt, joint)
    assert pvalue < 1e-6, pvalue


def test_cli_trains_and_reports_and_refuses_bad_options(target4, tiny_target, prompts_file, tmp_path):
    from typer.testing import CliRunner

    from specbuild.cli import app

    argv = ["train-eagle3", str(target4), "--data", str(prompts_file), "--seq-len", "24", "--batch-size", "4"]
    r = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "d"), "--steps", "3", "--layers", "0,1,3"])
    assert r.exit_code == 0, r.output
    assert "held-out greedy acceptance" in r.output and "position  trained  untrained" in r.output
    assert json.loads((tmp_path / "d" / "config.json").read_text())["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": [0, 1, 3]
    }
    r = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "e"), "--layers", "0,x"])
    assert r.exit_code == 2 and "--layers" in r.output
    r = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "e"), "--layers", "0,9"])
    assert r.exit_code == 2 and "do not fit a 4-layer target" in r.output
    r = CliRunner().invoke(
        app, ["train-eagle3", str(tiny_target), "--data", str(prompts_file), "--out", str(tmp_path / "f")]
    )
    assert r.exit_code == 2 and "no default EAGLE-3 capture" in r.output  # a 2-layer target
    r = CliRunner().invoke(app, [*argv, "--out", str(tmp_path / "d")])
    assert r.exit_code == 2 and "already exists" in r.output


def _spec(tmp_path, target, draft, k=3):
    import yaml

    raw = {
        "name": "e3",
        "mode": "eagle3",
        "flow": "llmapi",
        "dtype": "float32",
        "target": {"model": str(target)},
        "eagle3": {"model": str(draft), "layers_to_capture": list(LAYERS)},
        "speculation": {"max_draft_len": k},
        "build": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
        "serving": {"gpu_memory_gb": 4},
    }
    path = tmp_path / "e3.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_a_compiled_build_runs_the_draft_from_the_specs_folder(trained, target4, tmp_path):
    """compile --flow llmapi --engine reference writes the target's reference engine; loading the build
    runs EAGLE-3 with the draft of eagle3.model, greedy output the target's (also through the CLI)."""
    from typer.testing import CliRunner

    from specbuild.cli import app

    out = tmp_path / "build"
    r = CliRunner().invoke(
        app,
        [
            "compile",
            str(_spec(tmp_path, target4, trained.out)),
            "--flow",
            "llmapi",
            "--engine",
            "reference",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    engine = ReferenceEngine.load(out)
    assert engine.speculates and engine.draft_head == trained.out and engine.num_draft_tokens == 3
    params = SamplingParams(max_tokens=20, temperature=0.0)
    prompt = engine.encode(PROMPTS[1])
    spec = engine.generate(prompt, params)
    assert spec.token_ids == engine.generate(prompt, params, speculative=False).token_ids
    assert spec.stats.accepted > 0
    r = CliRunner().invoke(
        app, ["generate", "--engine", str(out), "--prompt", PROMPTS[1], "--max-tokens", "8", "--json"]
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["stats"]["draft_passes"] > 0, r.output


def test_tune_measures_the_drafts_acceptance_and_picks_k(trained, target4, prompts_file, tmp_path):
    from typer.testing import CliRunner

    from specbuild.cli import app

    spec = _spec(tmp_path, target4, trained.out, k=2)
    r = CliRunner().invoke(
        app,
        [
            "tune",
            str(spec),
            "--prompts",
            str(prompts_file),
            "--k-max",
            "4",
            "--max-tokens",
            "16",
            "--json",
            "--write",
        ],
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    acceptance = report["details"]["acceptance_per_position"]
    assert len(acceptance) == 4 and acceptance[0] > 0.3  # the trained draft on its own prompts
    assert 0 < report["details"]["cost_ratio"] < 1  # one draft-layer pass against a 4-layer target pass
    assert report["details"]["speculation_profile"]["method"] == "eagle3"
    import yaml

    assert yaml.safe_load(spec.read_text())["speculation"]["max_draft_len"] == report["chosen"]["value"]
