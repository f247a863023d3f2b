"""`make demo`'s EAGLE-3 draft: its own cache entry (the family's key untouched), trained by the real
`specbuild train-eagle3` with the settings' options on a micro family, linked where examples/demo/eagle3.yaml
looks, served on the LLM-API flow only."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from specbuild.demo import models as dm
from specbuild.demo import stages as demo

pytestmark = pytest.mark.numeric  # a micro family is trained (float results through CPU kernels)


def test_eagle3_settings_name_their_own_cache_entry():
    base = dm.DemoSettings()
    other = dataclasses.replace(base, eagle3=dataclasses.replace(base.eagle3, steps=base.eagle3.steps + 1))
    assert other.family_key() == base.family_key() and other.medusa_key() == base.medusa_key()
    assert other.eagle3_key() != base.eagle3_key()
    opts = base.eagle3.train_options()
    assert opts[opts.index("--steps") + 1] == str(base.eagle3.steps) and "--layers" not in opts
    assert dm.MICRO.eagle3.train_options()[-2:] == ["--layers", "0"]  # a 1-layer target: explicit


def test_the_example_spec_is_llmapi_and_points_at_the_link(tmp_path):
    from specbuild.core.facts.llmapi import Flow
    from specbuild.core.spec import load_spec

    assert "eagle3" in demo.MODES and "eagle3" in demo.LLMAPI_ONLY
    cache = tmp_path / "cache"
    specs = demo.stage_specs(demo.DemoOptions(out=tmp_path, cache=cache), ("eagle3",))
    spec = load_spec(specs["eagle3"])
    assert spec.flow is Flow.LLMAPI and Path(spec.eagle3.model) == cache / "eagle3"
    assert Path(spec.target.model) == cache / "target"


def test_build_eagle3_trains_once_then_reuses_the_cache(tmp_path):
    import torch

    torch.set_num_threads(1)
    family = dm.build_family(dm.MICRO, cache=tmp_path, log=lambda _: None)
    exe = str(Path(sys.executable).with_name("specbuild"))
    out = dm.build_eagle3(family, dm.MICRO, cache=tmp_path, specbuild=exe, log=lambda _: None)
    assert out == (tmp_path / f"eagle3-{dm.MICRO.eagle3_key()}").resolve()
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0]
    assert config["draft_vocab_size"] == dm.MICRO.eagle3.draft_vocab_size
    assert json.loads((out / "specbuild.json").read_text())["kind"] == "eagle3_draft"
    prompts = out.with_name(f"{out.name}.prompts.jsonl").read_text().splitlines()
    assert len(prompts) == dm.MICRO.eagle3.prompts  # the first training chunks
    logs: list[str] = []
    again = dm.build_eagle3(family, dm.MICRO, cache=tmp_path, specbuild="/nonexistent", log=logs.append)
    assert again == out and logs == [f"demo EAGLE-3 draft cached at {out}"]
    links = dm.link_current(family, None, cache=tmp_path, eagle3=out)
    assert links["eagle3"].resolve() == out and "medusa_heads" not in links
