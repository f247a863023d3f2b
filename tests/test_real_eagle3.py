"""`make demo-real`'s EAGLE-3 wiring, without the model: the same training budget as the Medusa heads, the
spec on the LLM-API flow linked where the demo puts the draft, the summary measuring it against the
target-alone baseline of the same prompt set (n-gram's; the LLM-API model always speculates), and the
train-eagle3 command the stage runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_real_model import _bench


def test_eagle3_gets_the_medusa_heads_data_and_a_comparable_time():
    """The same prompts, batches, windows and learning rate; the steps differ (a draft step costs ~0.4 s
    here, a Medusa step ~8 s): at most 20 draft steps a Medusa step, so never more compute than the heads'."""
    from dataclasses import replace

    from lab.real.stages import REAL_EAGLE3, REAL_MEDUSA, RealOptions, available_methods

    assert available_methods(()) == ("ngram", "medusa", "eagle3")
    for field in ("batch_size", "seq_len", "lr"):
        assert getattr(REAL_EAGLE3, field) == getattr(REAL_MEDUSA, field), field
    assert REAL_MEDUSA.steps < REAL_EAGLE3.steps <= 20 * REAL_MEDUSA.steps
    opts = replace(RealOptions(), medusa=replace(REAL_MEDUSA, steps=7), eagle3=replace(REAL_EAGLE3, steps=9))
    assert opts.eagle3.train_options()[:2] == ["--steps", "9"]
    assert opts.medusa.train_options()[opts.medusa.train_options().index("--steps") + 1] == "7"


def test_the_spec_is_llmapi_and_points_at_the_draft_link(tmp_path):
    from lab.real.stages import RealOptions, stage_specs
    from specbuild.core.facts.llmapi import Flow
    from specbuild.core.spec import load_spec

    cache = tmp_path / "cache"
    specs = stage_specs(RealOptions(out=tmp_path, cache=cache), ("ngram", "eagle3"), real=None)
    spec = load_spec(specs["eagle3"])
    assert spec.flow is Flow.LLMAPI and Path(spec.eagle3.model) == cache.absolute() / "eagle3"
    assert Path(spec.target.model) == cache.absolute() / "smollm2"


def test_summary_measures_eagle3_against_the_same_prompt_sets_baseline(tmp_path):
    from lab.real.summary import summary_table

    benches = {
        "ngram": {
            "quoting": _bench(
                tmp_path / "nq.json", "ngram", [("baseline", 1, 10.0), ("speculative", 1, 15.0)]
            ),
            "open": _bench(tmp_path / "no.json", "ngram", [("baseline", 1, 20.0), ("speculative", 1, 14.0)]),
        },
        "eagle3": {
            "quoting": _bench(tmp_path / "eq.json", "eagle3", [("speculative", 1, 25.0)]),
            "open": _bench(tmp_path / "eo.json", "eagle3", [("speculative", 1, 30.0)]),
        },
    }
    rows = {(r["method"], r["prompts"]): r for r in summary_table(benches)}
    assert rows["eagle3", "quoting"]["measured"] == pytest.approx(2.5)  # 25 / the quoting baseline's 10
    assert rows["eagle3", "open"]["measured"] == pytest.approx(1.5)  # 30 / the open baseline's 20


def test_the_training_stage_runs_train_eagle3_with_the_budget(tmp_path, monkeypatch):
    import lab.real.stages as real_stages
    from lab.real.prompts import PromptSets
    from lab.real.stages import RealOptions, stage_eagle3

    calls = []
    monkeypatch.setattr(real_stages, "run_cli", lambda *args, **kw: calls.append(args))

    class Real:
        root = tmp_path / "smollm2-entry"
        model = tmp_path / "smollm2"

    opts = RealOptions(cache=tmp_path / "cache")
    (tmp_path / "cache").mkdir()
    sets = PromptSets(quoting=(), open=(), train=("a", "b"))
    out = stage_eagle3(Real(), tmp_path / "train.jsonl", sets, opts)
    (argv,) = calls
    assert argv[:2] == ("train-eagle3", str(Real.model)) and argv[argv.index("--out") + 1] == str(out)
    assert argv[argv.index("--steps") + 1] == str(opts.eagle3.steps)
    assert argv[argv.index("--batch-size") + 1] == str(opts.medusa.batch_size)  # train-medusa's
    assert argv[argv.index("--new-tokens") + 1] == str(opts.distill_new_tokens)  # train-medusa's
    assert (tmp_path / "cache" / "eagle3").resolve() == out  # the link the spec names
    other = stage_eagle3(Real(), tmp_path / "train.jsonl", PromptSets((), (), ("c",)), opts)
    assert other != out  # the prompts are part of the cache key
