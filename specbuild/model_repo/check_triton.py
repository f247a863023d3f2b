"""What tritonserver itself checks when it loads a repository (the part `repo check` must repeat).

Each rule was seen failing a real tritonserver 2.51 load (the nvidia-pytriton build), with the
message quoted beside it; the server refuses to start when any model fails (exit-on-error).
* Every folder at the repository's top, hidden ones too, is a model: a folder without config.pbtxt
  fails ("Poll failed for model directory 'notes': ... Could not determine backend"), and a model
  needs a numeric version folder ("at least one version must be available under the version
  policy"). Plain files at the top are ignored.
* `dynamic_batching.preferred_batch_size` must be <= `max_batch_size` ("dynamic batching preferred
  size must be <= max batch size for tensorrt_llm"): a model written with max_batch_size 0 fails.
* An ensemble may not contain a batching model with a smaller max_batch_size ("ensemble ensemble
  allows maximum batch size 2, but it contains model postprocessing which only allows maximum batch
  size to be 1"); a non-batching model (max_batch_size 0) is allowed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specbuild.model_repo.check import _Repo


def check_folders(repo: _Repo) -> None:
    """Every top-level folder must be a loadable model folder."""
    for folder in sorted(p for p in repo.root.iterdir() if p.is_dir()):
        rel = folder.name
        config = folder / "config.pbtxt"
        if not config.exists() and not config.is_symlink():  # a symlink to /dev/zero is read (and refused) by _parse_all
            repo.fail(f"{rel}/", "-", "a folder without config.pbtxt: tritonserver takes every folder of the repository "
                      "for a model and refuses to start when one cannot load", f"move {rel} out of the repository")
            continue
        if not any(v.is_dir() and v.name.isdigit() for v in folder.iterdir()):
            repo.fail(f"{rel}/", "-", "no version folder (1/, 2/, ...): tritonserver finds no version to load",
                      "regenerate the repository with `specbuild repo --force`")


def check_batching(repo: _Repo) -> None:
    for name, cfg in sorted(repo.configs.items()):
        rel = f"{name}/config.pbtxt"
        if cfg.max_batch_size < 0:
            repo.fail(rel, "max_batch_size", f"{cfg.max_batch_size} is negative", "use the engine's max_batch_size (>= 1)")
            continue
        if cfg.HasField("dynamic_batching"):
            for size in cfg.dynamic_batching.preferred_batch_size:
                if size <= 0 or size > cfg.max_batch_size:
                    repo.fail(rel, "dynamic_batching.preferred_batch_size",
                              f"{size} with max_batch_size {cfg.max_batch_size}: tritonserver needs 0 < preferred <= max_batch_size",
                              f"set max_batch_size >= {max(size, 1)} (the engine's), or regenerate the repository")
    ens = repo.configs.get("ensemble")
    if ens is None:
        return
    for step in ens.ensemble_scheduling.step:
        model = repo.configs.get(step.model_name)
        if model is not None and 0 < model.max_batch_size < ens.max_batch_size:
            repo.fail(f"{step.model_name}/config.pbtxt", "max_batch_size",
                      f"{model.max_batch_size} but the ensemble allows {ens.max_batch_size}: tritonserver refuses the ensemble",
                      f"set max_batch_size: {ens.max_batch_size} (or regenerate the repository)")
