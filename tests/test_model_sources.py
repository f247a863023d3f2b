"""model_repo/sources.py: which python_models/ files each generated Python model gets."""

from __future__ import annotations

import pytest

from specbuild.model_repo.sources import COMMON, ENGINE_COMMON, PYTHON_MODELS, model_files

MODELS = sorted(p.name for p in PYTHON_MODELS.iterdir() if p.is_dir() and p not in (COMMON, ENGINE_COMMON))


@pytest.mark.parametrize("model", MODELS)
def test_no_shared_module_shadows_a_models_own(model):
    """Copied into one folder, two files of one name would leave one of them out without a word."""
    for stand_in in (False, True):
        names = [f.name for f in model_files(model, engine_stand_in=stand_in)]
        assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_the_engine_process_goes_only_to_the_engine_stand_ins():
    assert "engine_host.py" not in {f.name for f in model_files("tensorrt_llm_bls", engine_stand_in=False)}
    for model in ("tensorrt_llm_local", "tensorrt_llm_llmapi_local"):
        files = {f.name for f in model_files(model, engine_stand_in=True)}
        assert {"engine_host.py", "spec_metrics.py", "child_channel.py"} <= files
