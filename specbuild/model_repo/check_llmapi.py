"""`specbuild repo check` of an LLM-API repository (`repo --backend llmapi | llmapi-local`).

Checks: the tensor interface of tensorrt_llm/config.pbtxt against the upstream table of the repository's
TensorRT-LLM version (model_repo/tensors.py llmapi_interface; tests compare it with tests/data/
triton_llmapi_contract.json), the config leaves max_batch_size / the transaction policy to model.yaml
(as upstream), 1/model.yaml: triton_config (decoupled, max_batch_size), every other key recorded for the
version (core/facts/llmapi.py check_options), the model folders it names, the method x flow x version
matrix and that speculative_config is the repository's method; local repositories: 1/model.py and the
reference build it loads; production repositories take 1/model.py from the serving container.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import yaml
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from specbuild.core.deployment import TRITON_PYTHON_BACKEND
from specbuild.core.errors import SpecbuildError
from specbuild.core.facts.llmapi import LLMAPI_VERSIONS, Flow, check_options, decoding_class
from specbuild.core.formats.manifest import MANIFEST
from specbuild.core.formats.safe_io import read_json, read_text, shorten
from specbuild.core.methods.matrix import support
from specbuild.core.spec import MAX_DRAFT_LEN
from specbuild.model_repo import tensors as T
from specbuild.model_repo.configs import parse_text

if TYPE_CHECKING:
    from specbuild.model_repo.check import _Repo

CONFIG = f"{T.LLMAPI_MODEL}/config.pbtxt"
OPTIONS = f"{T.LLMAPI_MODEL}/1/{T.LLMAPI_OPTIONS}"


def is_llmapi_repo(repo: _Repo) -> bool:
    if repo.manifest is not None:
        return repo.manifest.kind.llmapi
    return (repo.root / T.LLMAPI_MODEL / "1" / T.LLMAPI_OPTIONS).is_file()


def check_llmapi(repo: _Repo) -> None:
    m = repo.manifest
    local = m.kind.local if m is not None else (repo.root / T.LLMAPI_MODEL / "1" / "model.py").is_file()
    version = m.trtllm_version if m is not None else None
    cfg = _config(repo)
    if cfg is not None:
        version = version or _param(cfg, "trtllm_version") or None
        _check_interface(repo, cfg, version, local=local)
    if version not in LLMAPI_VERSIONS:
        repo.fail(
            MANIFEST,
            "trtllm_version",
            f"{version!r} is not a TensorRT-LLM version with recorded LLM-API facts",
            "use one of " + ", ".join(LLMAPI_VERSIONS),
        )
        return
    options = _options(repo)
    if options is None:
        return
    _check_options(repo, options, version)
    _check_draft_len(repo, options, cfg, m)
    mode = m.mode.value if m is not None else (_param(cfg, "speculation_method") if cfg is not None else "")
    _check_method(repo, options, mode, version)
    if cfg is not None and m is not None and _param(cfg, "speculation_method") not in ("", mode):
        repo.fail(
            CONFIG,
            "parameters.speculation_method",
            f"{_param(cfg, 'speculation_method')!r} but the repository was generated for {mode}",
            "regenerate the repository with `specbuild repo --force`",
        )
    if local:
        _check_local(repo, cfg, mode)


def _config(repo: _Repo):
    path = repo.root / CONFIG
    if not path.is_file():
        repo.fail(CONFIG, "-", "missing", "regenerate the repository with `specbuild repo --backend llmapi`")
        return None
    try:
        cfg = parse_text(read_text(path, kind="config", what="model configuration"))
    except SpecbuildError as exc:
        repo.fail(CONFIG, "-", f"{exc.what} ({exc.found})", "regenerate it with `specbuild repo --force`")
        return None
    except text_format.ParseError as exc:
        repo.fail(CONFIG, "-", f"not a valid inference.ModelConfig: {shorten(str(exc))}", "regenerate it")
        return None
    repo.configs[T.LLMAPI_MODEL] = cfg
    return cfg


def _param(cfg, key: str) -> str:
    return cfg.parameters[key].string_value if key in cfg.parameters else ""


def _check_interface(repo: _Repo, cfg, version: str | None, *, local: bool) -> None:
    if cfg.name and cfg.name != T.LLMAPI_MODEL:
        repo.fail(
            CONFIG,
            "name",
            f"{cfg.name!r}, Triton's LLM-API model is {T.LLMAPI_MODEL!r}",
            'set name: "tensorrt_llm"',
        )
    if cfg.backend != TRITON_PYTHON_BACKEND:
        repo.fail(
            CONFIG,
            "backend",
            f"{cfg.backend!r}: the LLM-API model is a Python-backend model",
            'set backend: "python"',
        )
    if cfg.max_batch_size or cfg.HasField("model_transaction_policy"):
        repo.fail(
            CONFIG,
            "max_batch_size / model_transaction_policy",
            "set in config.pbtxt: upstream's model.py sets them from model.yaml's triton_config "
            "(auto_complete_config), and two sources can disagree",
            "remove them from config.pbtxt and set triton_config in 1/model.yaml",
        )
    want = T.llmapi_interface(version, local=local)
    for kind, have, table in (("input", cfg.input, want.inputs), ("output", cfg.output, want.outputs)):
        got = {t.name: t for t in have}
        for t in table:
            field = f"{kind} {t.name}"
            if t.name not in got:
                repo.fail(
                    CONFIG,
                    field,
                    f"missing: Triton's LLM-API model of TensorRT-LLM {version} declares it",
                    "regenerate the repository with `specbuild repo --force`",
                )
                continue
            g = got[t.name]
            if pb.DataType.Name(g.data_type) != t.data_type or tuple(g.dims) != t.dims:
                repo.fail(
                    CONFIG,
                    field,
                    f"{pb.DataType.Name(g.data_type)} {list(g.dims)}, upstream declares {t.data_type} "
                    f"{list(t.dims)}",
                    "use the upstream type and dims (regenerate the repository)",
                )
            if kind == "input" and bool(g.optional) != t.optional:
                repo.fail(CONFIG, field + ".optional", f"{g.optional}, upstream {t.optional}", "regenerate")
        extra = sorted(set(got) - {t.name for t in table})
        for name in extra:
            repo.fail(
                CONFIG,
                f"{kind} {name}",
                f"not in the LLM-API model's interface of TensorRT-LLM {version}",
                "remove it (upstream model.py neither reads nor fills it)",
            )


def _options(repo: _Repo) -> dict[str, Any] | None:
    path = repo.root / OPTIONS
    if not os.path.lexists(path):  # anything else there (a symlink to /dev/zero) is read_text's to refuse
        repo.fail(OPTIONS, "-", "missing: the LLM-API model reads its LLM() options there", "regenerate")
        return None
    try:
        options = yaml.safe_load(read_text(path, kind="config", what="model.yaml"))
    except (SpecbuildError, yaml.YAMLError) as exc:
        repo.fail(OPTIONS, "-", f"unreadable: {shorten(str(exc))}", "regenerate the repository")
        return None
    if not isinstance(options, dict):
        repo.fail(OPTIONS, "-", "not a mapping", "regenerate the repository")
        return None
    return options


def _check_options(repo: _Repo, options: dict[str, Any], version: str) -> None:
    triton = options.get("triton_config")
    if not isinstance(triton, dict):
        repo.fail(
            OPTIONS,
            "triton_config",
            "missing: model.py requires decoupled and max_batch_size there",
            "add it",
        )
    else:
        if not isinstance(triton.get("decoupled"), bool):
            repo.fail(OPTIONS, "triton_config.decoupled", f"{triton.get('decoupled')!r}", "set true or false")
        mbs = triton.get("max_batch_size")
        if not isinstance(mbs, int) or isinstance(mbs, bool) or mbs < 0:
            repo.fail(
                OPTIONS, "triton_config.max_batch_size", f"{mbs!r}", "set 0 (the LLM batches in flight)"
            )
    llm = {k: v for k, v in options.items() if k != "triton_config"}
    if "model" not in llm:
        repo.fail(OPTIONS, "model", "missing: LLM() needs the model folder or hub id", "add model: <folder>")
    for problem in check_options(llm, version):
        key, _, why = problem.partition(": ")
        repo.fail(OPTIONS, key, why, f"use the keys TensorRT-LLM {version} takes (core/facts/llmapi.py)")
    for key, value in (
        ("model", llm.get("model")),
        ("speculative_config.speculative_model", _spec(llm).get("speculative_model")),
    ):
        if (
            isinstance(value, str)
            and value.startswith("/")
            and not (repo.host_path(value) / "config.json").is_file()
        ):
            repo.fail(
                OPTIONS,
                key,
                f"{value} holds no config.json",
                "point it at the HF folder (mounted in the container)",
            )


def _check_draft_len(repo: _Repo, options: dict[str, Any], cfg, m) -> None:
    """speculative_config.max_draft_len within the spec's range and equal to the K the repository
    records (config.pbtxt's default_num_draft_tokens, what clients report; the manifest's spec)."""
    k = _spec(options).get("max_draft_len")
    if not isinstance(k, int) or isinstance(k, bool):
        return  # absent or mistyped: check_options reported it
    where = "speculative_config.max_draft_len"
    if not 1 <= k <= MAX_DRAFT_LEN:
        repo.fail(
            OPTIONS, where, f"{k}, outside 1..{MAX_DRAFT_LEN}", "regenerate the repository from the spec"
        )
        return
    recorded = {}
    if cfg is not None and _param(cfg, "default_num_draft_tokens").isdecimal():
        recorded["config.pbtxt default_num_draft_tokens"] = int(_param(cfg, "default_num_draft_tokens"))
    spec_k = ((m.spec or {}).get("speculation") or {}).get("max_draft_len") if m is not None else None
    if isinstance(spec_k, int):
        recorded["the manifest's speculation.max_draft_len"] = spec_k
    for what, value in recorded.items():
        if value != k:
            repo.fail(
                OPTIONS, where, f"{k}, but {what} is {value}", "regenerate the repository from the spec"
            )


def _spec(options: dict[str, Any]) -> dict[str, Any]:
    value = options.get("speculative_config")
    return value if isinstance(value, dict) else {}


def _check_method(repo: _Repo, options: dict[str, Any], mode: str, version: str) -> None:
    found = support(mode, Flow.LLMAPI, version)
    if not found.ok:
        repo.fail(
            MANIFEST,
            "mode",
            f"{mode} on the LLM-API flow of {version}: {found.reason}",
            f"use {found.alternative}",
        )
        return
    if "speculative_config" not in options:  # the target alone (speculation.schedule {1: 0}): valid
        return
    cls = decoding_class(mode, version)
    want = cls.decoding_type if cls else None
    have = _spec(options).get("decoding_type")
    if have != want:
        repo.fail(
            OPTIONS,
            "speculative_config.decoding_type",
            f"{have!r}, but the repository's method {mode} is {want!r} on TensorRT-LLM {version}",
            f"set decoding_type: {want}",
        )


def _check_local(repo: _Repo, cfg, mode: str) -> None:
    if not (repo.root / T.LLMAPI_MODEL / "1" / "model.py").is_file():
        repo.fail(
            f"{T.LLMAPI_MODEL}/1/model.py", "-", "missing: the local model has nothing to run", "regenerate"
        )
    served = _param(cfg, "reference_engine") if cfg is not None else ""
    if not served:
        repo.fail(
            CONFIG,
            "parameters.reference_engine",
            "missing (the local model loads the build from it)",
            "regenerate",
        )
        return
    folder = repo.host_path(served)
    try:
        build = read_json(folder / MANIFEST, kind="manifest")
    except SpecbuildError as exc:
        repo.fail(
            CONFIG,
            "parameters.reference_engine",
            f"{exc.what}",
            "compile with --flow llmapi --engine reference",
        )
        return
    if build.get("kind") != "build" or not build.get("engine_built"):
        repo.fail(
            CONFIG,
            "parameters.reference_engine",
            f"{folder} is not a build with reference engines",
            "compile with --flow llmapi --engine reference",
        )
    elif (build.get("spec") or {}).get("mode") != mode:
        repo.fail(
            CONFIG,
            "parameters.reference_engine",
            f"the build runs {(build.get('spec') or {}).get('mode')}, the repository says {mode}",
            "regenerate the repository from its build",
        )
