"""The demo family script: settings hashing, the corpus split, the acceptance arithmetic, a micro build."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specbuild.demo import models as dm

pytestmark = (
    pytest.mark.numeric
)  # float results through CPU kernels: `make test-isa` runs them per kernel family


def test_settings_key_is_deterministic_and_tracks_every_setting():
    assert dm.DemoSettings().family_key() == dm.DemoSettings().family_key()
    base = dm.DemoSettings()
    changed = dataclasses.replace(
        base, target_train=dataclasses.replace(base.target_train, steps=base.target_train.steps + 1)
    )
    assert changed.family_key() != base.family_key()
    assert dataclasses.replace(base, seed=1).family_key() != base.family_key()
    # Medusa settings name their own cache entry and leave the family (target, draft) alone.
    other_heads = dataclasses.replace(
        base, medusa=dataclasses.replace(base.medusa, steps=base.medusa.steps + 1)
    )
    assert other_heads.family_key() == base.family_key()
    assert other_heads.medusa_key() != base.medusa_key()
    assert dm.MICRO.family_key() != base.family_key()


def test_corpus_split_is_sorted_capped_and_holds_out_every_tenth(tmp_path):
    for i in reversed(range(25)):  # written out of order: the split must sort
        (tmp_path / f"m{i:02d}.py").write_text(f"# file {i}\n" + "x = 1\n" * 50)
    (tmp_path / "notes.txt").write_text("not python")
    settings = dataclasses.replace(dm.MICRO, corpus_bytes=10_000, file_cap_bytes=40)
    train, held = dm.corpus_split(settings, stdlib=tmp_path)
    assert [t.splitlines()[0] for t in held] == ["# file 9", "# file 19"]
    assert len(train) == 23 and train[0].startswith("# file 0") and all(len(t) <= 40 for t in train)
    assert dm.corpus_split(settings, stdlib=tmp_path) == (train, held)
    small = dataclasses.replace(settings, corpus_bytes=100)
    train_small, _ = dm.corpus_split(small, stdlib=tmp_path)
    assert sum(len(t) for t in train_small) == 100


def test_corpus_split_refuses_an_empty_stdlib(tmp_path):
    with pytest.raises(dm.SpecbuildError, match="too few"):
        dm.corpus_split(dm.MICRO, stdlib=tmp_path)


class _FixedDraft:
    """Stands in for a draft model: its argmax at position i is `guesses[b][i]`."""

    def __init__(self, guesses, vocab: int = 8):
        import torch

        self.logits = torch.nn.functional.one_hot(torch.tensor(guesses), vocab).float()  # [B, T, V]

    def __call__(self, input_ids):
        return type("Out", (), {"logits": self.logits})()


def test_acceptance_profile_counts_greedy_chain_passes():
    import torch

    # Prompt of 2 tokens, then 6 generated target tokens 1..6. The draft's guess for generated token j
    # sits at position prompt_len - 1 + j; it matches tokens 1, 2 and 4, 5, 6 (misses token 3).
    target = torch.tensor([[7, 7, 1, 2, 3, 4, 5, 6]])  # [1, 8]
    guesses = [[0, 1, 2, 0, 4, 5, 6, 0]]  # position 7 (after the last token) is never used
    profile = dm.acceptance_profile(target, _FixedDraft(guesses), prompt_len=2, max_k=3)
    assert profile["alpha_token"] == pytest.approx(
        5 / 6
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    # K=1: [1 ok + bonus 2], [3 miss -> bonus 3], [4 ok + bonus 5], [6 ok + bonus end] = 4 passes, 7 tokens
    # emitted
    assert profile["tokens_per_pass_k1"] == pytest.approx(
        7 / 4
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound
    # K=3: [1,2 ok, 3 miss -> emits 3], [4,5,6 ok + bonus] = 2 passes, 3 + 4 tokens
    assert profile["tokens_per_pass_k3"] == pytest.approx(
        7 / 2
    )  # float64 arithmetic of a few terms (~1e-16): approx's default rel 1e-6 is a sound bound


@pytest.mark.slow
def test_micro_build_writes_a_complete_cached_family(tmp_path):
    import torch

    torch.set_num_threads(1)
    logs: list[str] = []
    family = dm.build_family(dm.MICRO, cache=tmp_path, log=logs.append)
    assert family.root.name == f"family-{dm.MICRO.family_key()}"
    for folder in (family.target, family.draft):
        config = json.loads((folder / "config.json").read_text())
        assert config["architectures"] == ["LlamaForCausalLM"]
        assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    target_cfg = json.loads((family.target / "config.json").read_text())
    draft_cfg = json.loads((family.draft / "config.json").read_text())
    assert target_cfg["vocab_size"] == draft_cfg["vocab_size"]
    assert draft_cfg["hidden_size"] < target_cfg["hidden_size"]
    prompts = [json.loads(line)["prompt"] for line in family.prompts.read_text().splitlines()]
    assert prompts and all(prompts)
    assert json.loads(family.train_text.read_text().splitlines()[0])["text"]
    assert "tokens_per_pass_k4" in family.metrics["held_out_greedy_acceptance"]
    assert not list(tmp_path.glob(".*partial*"))  # the atomic folder was renamed into place

    again: list[str] = []
    assert dm.build_family(dm.MICRO, cache=tmp_path, log=again.append) == family
    assert again == [f"demo family cached at {family.root}"]

    links = dm.link_current(family, None, cache=tmp_path)
    assert (links["target"] / "config.json").is_file()
    assert links["target"].resolve() == family.target.resolve()
    assert "medusa_heads" not in links


def test_build_medusa_reuses_a_cached_entry_without_running_anything(tmp_path):
    from specbuild.core.formats.manifest import write_manifest

    family = dm.DemoFamily(
        root=tmp_path,
        tokenizer=tmp_path,
        target=tmp_path,
        draft=tmp_path,
        train_text=tmp_path / "t.jsonl",
        prompts=tmp_path / "p.jsonl",
        metrics={},
    )
    heads = tmp_path / f"medusa-{dm.MICRO.medusa_key()}"
    heads.mkdir()
    write_manifest(heads, kind="medusa_heads")
    assert (
        dm.build_medusa(family, dm.MICRO, cache=tmp_path, specbuild="/nonexistent", log=lambda _: None)
        == heads
    )


def test_stable_links_point_at_the_current_build(tmp_path):
    root = tmp_path / "family-x"
    for name in ("target", "draft", "tokenizer"):
        (root / name).mkdir(parents=True)
    (root / "prompts.jsonl").write_text("")
    family = dm.DemoFamily(
        root=root,
        tokenizer=root / "tokenizer",
        target=root / "target",
        draft=root / "draft",
        train_text=root / "train.jsonl",
        prompts=root / "prompts.jsonl",
        metrics={},
    )
    heads = tmp_path / "medusa-y"
    heads.mkdir()
    dm.link_current(family, heads, cache=tmp_path)
    dm.link_current(family, heads, cache=tmp_path)  # replacing existing links works
    assert (tmp_path / "medusa_heads").resolve() == heads.resolve()
    assert (tmp_path / "draft").is_symlink() and not Path((tmp_path / "draft").readlink()).is_absolute()


def test_new_models_start_with_identity_blocks_and_unit_embeddings(tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = dm.new_model(dm.MICRO.target, tokenizer, dm.MICRO, seed=0)
    params = dict(model.named_parameters())
    zeroed = [n for n in params if n.endswith(("o_proj.weight", "down_proj.weight"))]
    assert len(zeroed) == 2 * dm.MICRO.target.num_layers and all(
        float(params[n].detach().abs().max()) == 0.0 for n in zeroed
    )
    assert 0.8 < float(model.get_input_embeddings().weight.detach().std()) < 1.2
    q_proj = params["model.layers.0.self_attn.q_proj.weight"]
    assert float(q_proj.detach().abs().max()) > 0  # the rest is random
    assert model.config.vocab_size == len(tokenizer) and not model.config.tie_word_embeddings
