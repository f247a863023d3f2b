"""Which files of python_models/ a generated Python model's version folder gets.

* python_models/<model>/: the model's own modules;
* python_models/common/: what every Python model shares (lifelines, the responder, words, ...);
* python_models/engine_common/: what only the local stand-ins of the engine share (the one engine process
  program both run, engine_host.py, and their spec-decode metrics): never in a production repository.
"""

from __future__ import annotations

from pathlib import Path

PYTHON_MODELS = Path(__file__).parent / "python_models"
COMMON = PYTHON_MODELS / "common"
ENGINE_COMMON = PYTHON_MODELS / "engine_common"


def model_files(model_folder: str, *, engine_stand_in: bool) -> list[Path]:
    """The .py files to copy for the model whose sources are python_models/<model_folder>, sorted by name
    (one folder's file never shadows another's: tested)."""
    folders = [PYTHON_MODELS / model_folder, COMMON, *([ENGINE_COMMON] if engine_stand_in else [])]
    return sorted((f for folder in folders for f in folder.glob("*.py")), key=lambda f: f.name)
