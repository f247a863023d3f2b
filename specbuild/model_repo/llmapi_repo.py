"""`specbuild repo --backend llmapi | llmapi-local`: Triton's LLM-API model from a `compile --flow llmapi`
build.

Layout: tensorrt_llm/config.pbtxt (the upstream tensor table of the targeted TensorRT-LLM version,
Python backend) and tensorrt_llm/1/model.yaml (the build's LLM-API options plus `model` and
`triton_config`: every key except triton_config becomes an `LLM(...)` argument).
* llmapi (production): 1/model.py is upstream's, taken at launch from the serving container
  (/app/all_models/llmapi, matched to its TensorRT-LLM; `serve --print-launch` stages it); 1/ also holds
  specbuild_preflight.py, which the launch runs on model.yaml with the container's own parser first;
* llmapi-local: 1/model.py is specbuild's stand-in running the reference engine (the build's reference
  engines, `compile --flow llmapi --engine reference`) behind the same tensors, plus the token ids of
  each response (output_ids, a specbuild addition).
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from specbuild.core.artifacts import REPO_KIND, BuildManifest
from specbuild.core.deployment import RepoKind
from specbuild.core.errors import RepoError
from specbuild.core.facts.llmapi import LLMAPI_VERSIONS, check_options
from specbuild.core.formats.manifest import atomic_output_dir, write_manifest
from specbuild.core.formats.safe_io import read_text
from specbuild.core.launch import PREFLIGHT_FILE, preflight_source
from specbuild.model_repo.configs import LLMAPI_BACKENDS, LlmApiLayout, llmapi_config, to_text
from specbuild.model_repo.sources import PYTHON_MODELS, model_files
from specbuild.model_repo.tensors import LLMAPI_MODEL, LLMAPI_OPTIONS

LOCAL_MODEL = RepoKind.LLMAPI_LOCAL.stand_in  # python_models/ folder of the local stand-in


def triton_config(decoupled: bool) -> dict[str, Any]:
    """The triton_config keys upstream model.py reads: decoupled and max_batch_size (required), the
    cancellation poll (default 100 ms). decoupled: the repository's choice (model_repo/transaction.py)."""
    return {"max_batch_size": 0, "decoupled": decoupled, "cancellation_check_period_ms": 100}


def read_options(manifest: BuildManifest) -> dict[str, Any]:
    info = manifest.llmapi or {}
    path = manifest.folder / str(info.get("options_file") or "llmapi_options.yaml")
    try:
        options = yaml.safe_load(read_text(path, kind="config", what="LLM-API options"))
    except yaml.YAMLError as exc:
        raise RepoError(
            f"{path} is not valid YAML", found=str(exc).splitlines()[0], fix="re-run `specbuild compile`"
        ) from None
    if not isinstance(options, dict):
        raise RepoError(
            f"{path} is not a mapping", found=type(options).__name__, fix="re-run `specbuild compile`"
        )
    return options


def model_yaml(manifest: BuildManifest, *, decoupled: bool) -> dict[str, Any]:
    """model.yaml: model first, the build's options, then triton_config."""
    models = (manifest.llmapi or {}).get("models") or {}
    options = read_options(manifest)
    problems = check_options(options, manifest.spec.trtllm_version)
    if problems:
        raise RepoError(
            f"{manifest.folder}: the LLM-API options do not match TensorRT-LLM "
            f"{manifest.spec.trtllm_version}",
            expected="the keys recorded in core/facts/llmapi.py",
            found="; ".join(problems),
            fix="re-run `specbuild compile --flow llmapi`",
        )
    return {
        "model": str(models.get("target") or manifest.tokenizer_dir),
        **options,
        "triton_config": triton_config(decoupled),
    }


def generate_llmapi_repo(
    manifest: BuildManifest,
    out: Path,
    *,
    backend: str,
    trtllm_version: str | None,
    force: bool,
    decoupled: bool,
) -> Path:
    if backend not in LLMAPI_BACKENDS:
        raise RepoError(
            f"backend {backend!r} does not serve an LLM-API build",
            expected=" | ".join(LLMAPI_BACKENDS),
            found=backend,
            fix="pass --backend llmapi (GPU containers) or --backend llmapi-local (this CPU)",
        )
    version = manifest.spec.trtllm_version
    if trtllm_version and trtllm_version != version:
        raise RepoError(
            f"the build's LLM-API options are for TensorRT-LLM {version}, not {trtllm_version}",
            expected=f"--trtllm-version {version} (or none)",
            found=trtllm_version,
            fix=f"re-run `specbuild compile --flow llmapi --trtllm-version {trtllm_version}`, then `repo`",
        )
    if version not in LLMAPI_VERSIONS:
        raise RepoError(
            f"no LLM-API facts for TensorRT-LLM {version}", fix="recompile with a supported version"
        )
    kind = RepoKind.of_backend(backend)
    local = kind.local
    if local and not manifest.engine_built:
        raise RepoError(
            f"{manifest.folder} has no reference engines for the local LLM-API model",
            expected="a build from `specbuild compile --flow llmapi --engine reference`",
            found=f"engine: {manifest.engine_kind}",
            fix="re-run compile with --engine reference, or generate --backend llmapi for a GPU container",
        )
    options = model_yaml(manifest, decoupled=decoupled)
    layout = LlmApiLayout(
        mode=manifest.spec.mode,
        trtllm_version=version,
        local=local,
        # no speculative_config (speculation.schedule {1: 0}): the target alone, K = 0
        default_num_draft_tokens=int((options.get("speculative_config") or {}).get("max_draft_len", 0)),
        reference_engine=str(manifest.folder) if local else None,
        decoupled=decoupled,
    )
    inputs = {
        "build folder": manifest.folder,
        **{f"{k} model": Path(v) for k, v in ((manifest.llmapi or {}).get("models") or {}).items()},
        "specbuild's Python models": PYTHON_MODELS,
    }
    with atomic_output_dir(out, force=force, inputs=inputs) as tmp:
        folder = tmp / LLMAPI_MODEL
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(to_text(llmapi_config(layout)))
        (folder / "1" / LLMAPI_OPTIONS).write_text(
            f"# Triton LLM-API model options (TensorRT-LLM {version}), written by `specbuild repo`: "
            "every key but "
            "triton_config is an LLM() argument.\n" + yaml.safe_dump(options, sort_keys=False)
        )
        if not local:  # the launch runs it before tritonserver (serve/llmapi_launch.py)
            (folder / "1" / PREFLIGHT_FILE).write_text(preflight_source())
        if local:
            for file in model_files(LOCAL_MODEL, engine_stand_in=True):
                shutil.copy2(file, folder / "1" / file.name)
        write_manifest(
            tmp,
            kind=REPO_KIND,
            repo_kind=kind.value,
            backend=backend,
            mode=layout.mode.value,
            trtllm_version=version,
            build_dir=str(manifest.folder),
            engine_root=None,
            tokenizer_dir_host=str(manifest.tokenizer_dir),
            models=[LLMAPI_MODEL],
            layout={**asdict(layout), "mode": layout.mode.value, "flow": "llmapi"},
            spec=manifest.spec.to_dict(),
            flow="llmapi",
            llmapi=dict(manifest.llmapi or {}),
        )
    return out
