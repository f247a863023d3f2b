"""Medusa heads and `tune` end to end on a tiny base model trained (in seconds) on repetitive text.

* trained heads beat untrained heads on held-out prompts;
* the tuned tree beats mc_sim_7b_63 in tokens per pass measured by the reference engine's greedy
  Medusa loop on held-out prompts, and `--write` keeps the spec's comments;
* for draft/target, the chosen K is at or next to the best K of a measured sweep.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.numeric]  # trains two tiny models and a set of heads

TRAIN_PROMPTS = [
    "The quick brown",
    "def add(a",
    "Speculative decoding drafts",
    "import os",
    "Once upon a time",
    "over the lazy dog.",
    "return a + b",
    "with a small model and",
    "for i in range(10):",
    "there was a tiny language",
]
HELD_OUT = [
    "fox jumps over",
    "a tiny language model",
    "print(i)",
    "verifies them with",
    "wanted to run fast.",
]


def _train_lm(folder: Path, tokenizer_dir: Path, *, steps: int, seed: int, **shape) -> Path:
    """A tiny Llama that memorises the synthetic corpus (plain next-token training)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specbuild.demo.synthetic import _DEFAULT_CORPUS, make_model

    make_model(folder, tokenizer_dir, seed=seed, init_std=0.02, **shape)
    model = AutoModelForCausalLM.from_pretrained(str(folder))
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = torch.tensor(tok("".join(_DEFAULT_CORPUS) * 4)["input_ids"])  # [N]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - 33, (8,), generator=gen)
        x = torch.stack([ids[s : s + 33] for s in starts])  # [8, 33]
        logits = model(input_ids=x[:, :-1]).logits  # [8, 32, V]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def family(tmp_path_factory, tokenizer_dir):
    import torch

    from specbuild.tuning.config import TrainConfig
    from specbuild.tuning.train import train_medusa

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tune")
    target = _train_lm(
        root / "target", tokenizer_dir, steps=60, seed=1, num_layers=2, num_heads=4, num_kv_heads=2
    )
    draft = _train_lm(
        root / "draft",
        tokenizer_dir,
        steps=15,
        seed=2,
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=64,
    )
    (root / "train.txt").write_text("\n".join(TRAIN_PROMPTS))
    (root / "held.txt").write_text("\n".join(HELD_OUT))
    cfg = TrainConfig(
        model=str(target),
        data=root / "train.txt",
        out=root / "heads",
        steps=60,
        lr=1e-2,
        batch_size=4,
        seq_len=48,
        self_distill=True,
        checkpoint_every=0,
        device="cpu",
    )
    heads = train_medusa(cfg)
    return {"root": root, "target": target, "draft": draft, "heads": heads, "config": cfg}


def test_trained_heads_beat_untrained_heads_on_held_out_prompts(family):
    from specbuild.core.formats.medusa_choices import MedusaChoices
    from specbuild.tuning.data import encode
    from specbuild.tuning.heads import load_heads
    from specbuild.tuning.hf_base import load_base
    from specbuild.tuning.predict import accepted_lengths
    from specbuild.tuning.profile_medusa import HFMedusa, medusa_ranks
    from specbuild.tuning.train import new_heads

    metrics = family["heads"].metrics
    assert metrics["heads"][0]["top1"] > metrics["heads"][0]["untrained_top1"] + 0.2
    base = load_base(str(family["target"]), device="cpu")
    held = encode(base.tokenizer, HELD_OUT)
    tree = MedusaChoices.parse("mc_sim_7b_63")
    mean = {}
    for name, heads in (
        ("untrained", new_heads(base, family["config"])),
        ("trained", load_heads(family["heads"].out)),
    ):
        lengths = accepted_lengths(
            tree, medusa_ranks(HFMedusa(base, heads), held, max_new_tokens=24, topk=10)
        )
        mean[name] = sum(lengths) / len(lengths)
    print("tokens per pass on held-out prompts (mc_sim_7b_63, greedy replay):", mean)
    assert mean["trained"] > mean["untrained"] + 1.0


def test_tuned_tree_beats_mc_sim_7b_63_measured_on_the_reference_engine(family):
    from specbuild.core.spec import load_spec
    from specbuild.tuning.tune import tune_spec
    from specbuild.tuning.tune_options import TuneOptions

    root = family["root"]
    spec_path = root / "medusa.yaml"
    spec_path.write_text(
        "# tiny Medusa spec\nname: tiny-medusa\nmode: medusa\ndtype: float32\ntarget: {model: target}\n"
        "medusa:\n  heads: heads  # trained by the fixture\n  num_heads: 4\n  choices: mc_sim_7b_63\n"
        "speculation:\n  max_draft_len: 63  # tree size bound\n"
    )
    report = tune_spec(
        spec_path,
        TuneOptions(prompts=root / "train.txt", eval_prompts=root / "held.txt", max_tokens=24, write=True),
    )
    measured = report.details["measured"]
    print(
        "medusa tune:",
        json.dumps(
            {
                "measured": measured,
                "predicted": [report.chosen.tokens_per_pass, report.current.tokens_per_pass],
            }
        ),
    )
    assert report.chosen.size <= 63
    assert measured["chosen"] > measured["current"]
    assert report.written == "kept comments"
    text = spec_path.read_text()
    assert "# trained by the fixture" in text and "# tiny Medusa spec" in text
    spec = load_spec(spec_path)  # valid: prefix-closed, depth <= heads, size <= max_draft_len
    assert spec.medusa_choices().to_lists() == report.chosen.value


def test_chosen_k_is_at_or_next_to_the_best_measured_k(family):
    """Through the CLI (`tune --json --write`)."""
    from typer.testing import CliRunner

    from specbuild.cli import app
    from specbuild.core.spec import load_spec

    root = family["root"]
    spec_path = root / "dt.yaml"
    spec_path.write_text(
        "name: tiny-dt\nmode: draft_target\ndtype: float32\ntarget: {model: target}\ndraft: {model: draft}\n"
        "speculation:\n  max_draft_len: 5  # K\n"
    )
    r = CliRunner().invoke(
        app,
        [
            "tune",
            str(spec_path),
            "--prompts",
            str(root / "train.txt"),
            "--eval-prompts",
            str(root / "held.txt"),
            "--max-tokens",
            "24",
            "--k-max",
            "6",
            "--write",
            "--save-profile",
            str(root / "profile" / "speculation_profile.json"),
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    acc = report["details"]["acceptance_per_position"]
    measured = report["details"]["measured"]
    print(
        "draft/target tune:",
        json.dumps(
            {
                "acceptance": acc,
                "c": report["details"]["cost_ratio"],
                "chosen": report["chosen"]["value"],
                "measured": measured,
            }
        ),
    )
    assert 0.0 < acc[0] < 1.0
    assert len(measured["sweep"]) == 6
    assert abs(report["chosen"]["value"] - measured["best_k"]) <= 1
    assert load_spec(spec_path).speculation.max_draft_len == report["chosen"]["value"]
    assert "# K" in spec_path.read_text()

    # the profile round-trips: tune --profile (no engine, no prompts) chooses the same K
    profile = root / "profile" / "speculation_profile.json"
    written = json.loads(profile.read_text())
    assert written["num_speculative_tokens"] == 6 and written["method"] == "draft_model"
    assert written["measurement_conditions"]["cost_ratio"] == report["details"]["cost_ratio"]
    again = CliRunner().invoke(app, ["tune", str(spec_path), "--profile", str(profile), "--json"])
    assert again.exit_code == 0, again.output
    back = json.loads(again.stdout)
    assert back["chosen"]["value"] == report["chosen"]["value"]
    assert back["details"]["acceptance_per_position"] == pytest.approx(acc, abs=1e-6)  # 6 dp in the file
    # refused: prompts with a profile, a profile of another method, none of a cost ratio
    bad = CliRunner().invoke(
        app, ["tune", str(spec_path), "--profile", str(profile), "--prompts", str(root / "train.txt")]
    )
    assert bad.exit_code != 0 and "exclude each other" in bad.output
    other = root / "profile" / "eagle.json"
    no_cost = root / "profile" / "no_cost.json"
    other.write_text(json.dumps({**written, "method": "eagle3"}))
    no_cost.write_text(json.dumps({**written, "measurement_conditions": {}}))
    for path, words in ((other, "another method"), (no_cost, "no cost ratio")):
        r = CliRunner().invoke(app, ["tune", str(spec_path), "--profile", str(path)])
        assert r.exit_code != 0 and words in r.output, r.output
    r = CliRunner().invoke(
        app, ["tune", str(spec_path), "--profile", str(no_cost), "--cost-ratio", "0.5", "--json"]
    )
    assert r.exit_code == 0 and json.loads(r.stdout)["details"]["cost_ratio"] == 0.5
    # ... and into `plan`: the same best K (the spec's, which tune --write set), the speedup at it
    from specbuild.core.errors import PlanError
    from specbuild.core.perf import capacity as C
    from specbuild.core.perf import theory
    from specbuild.planning.plan import PlanRequest, make_plan

    spec = load_spec(spec_path)
    traffic = C.make_traffic(input_len=32, output_len=64, tokens_per_day=10e6)
    req = PlanRequest(traffic, stated=(100.0, None), profile=profile, price_per_gpu_hour=1.0)
    plan = make_plan(spec, req)
    k = report["chosen"]["value"]
    assert plan.profile_best_k == k == plan.k
    assert any(f"best K is {k}" in n for n in plan.notes)
    c = report["details"]["cost_ratio"]
    s = theory.speedup(theory.tokens_per_pass_chain(back["details"]["acceptance_per_position"], k), k, c)
    assert plan.labels["speculative"] == "profile"
    assert plan.sizings["speculative"].tokens_per_s_per_replica == pytest.approx(100.0 * s, rel=1e-9)
    # float64 products of the same few factors (~1e-15): 1e-9 is loose and still catches another K
    for path, words in ((other, "another method"), (no_cost, "no cost ratio")):
        with pytest.raises(PlanError, match=words):
            make_plan(spec, PlanRequest(traffic, stated=(100.0, None), profile=path, price_per_gpu_hour=1.0))


def test_ngram_tune_replays_exactly_and_writes_k_and_n(family):
    """The replay's tokens per pass is what the engine's own loop measures on the same prompts (exact:
    lossless greedy verification, the same drafter), and --write sets both keys, keeping comments."""
    from typer.testing import CliRunner

    from specbuild.cli import app
    from specbuild.core.spec import load_spec

    root = family["root"]
    spec_path = root / "ngram.yaml"
    spec_path.write_text(
        "name: tiny-ngram\nmode: ngram\ndtype: float32\ntarget: {model: target}\n"
        "speculation:\n  max_draft_len: 2  # K\nngram:\n  max_matching_ngram_size: 1  # N\n"
    )
    prompts = str(root / "train.txt")
    args = ["tune", str(spec_path), "--prompts", prompts, "--eval-prompts", prompts, "--max-tokens", "24"]
    r = CliRunner().invoke(app, [*args, "--k-max", "5", "--n-max", "3", "--write", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    measured = report["details"]["measured"]
    for s in ("chosen", "current"):
        assert measured[s]["tokens_per_pass"] == pytest.approx(report[s]["tokens_per_pass"], abs=1e-12)
    assert report["chosen"]["tokens_per_pass"] > 1.5  # the memorised corpus repeats: drafts are accepted
    assert len(report["details"]["table"]) == 5 * 3
    best = max(report["details"]["table"], key=lambda row: row["speedup"])
    assert report["chosen"]["speedup"] == best["speedup"]
    text = spec_path.read_text()
    assert "# K" in text and "# N" in text and report["written"] == "kept comments"
    spec = load_spec(spec_path)
    assert spec.speculation.max_draft_len == report["chosen"]["value"]["speculation.max_draft_len"]
    assert spec.ngram.max_matching_ngram_size == report["chosen"]["value"]["ngram.max_matching_ngram_size"]
