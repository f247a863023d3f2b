"""`specbuild repo check REPO`: is this model repository consistent with itself and its engines?

Every config.pbtxt is parsed as an `inference.ModelConfig`; then the repository is checked against the
engine folders it points to (their config.json: build_config.max_draft_len and
speculative_decoding_mode, pretrained_config.num_medusa_heads / logits_dtype). Paths written for a
container (`--engine-root`, `--tokenizer-dir`) are mapped back to this host through the repository's
specbuild.json. Each finding names the file, the field and the fix.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from specbuild.core.artifacts import RepoManifest, read_repo_manifest
from specbuild.core.deployment import TRITON_CPP_BACKEND, TRITON_PYTHON_BACKEND
from specbuild.core.errors import SpecbuildError, SpecError
from specbuild.core.facts.trtllm import SpeculativeDecodingMode
from specbuild.core.formats.manifest import MANIFEST
from specbuild.core.formats.medusa_choices import MedusaChoices
from specbuild.core.formats.safe_io import read_bytes, read_json, read_text, shorten
from specbuild.core.methods import Method, method_of
from specbuild.model_repo import check_llmapi, check_triton
from specbuild.model_repo.configs import REQUIRED_ENGINE_PARAMETERS, parse_text
from specbuild.model_repo.generate import VENDORED_MODULES
from specbuild.model_repo.tensors import LOGITS_DTYPE_OF

ENGINE_MODELS = ("tensorrt_llm", "tensorrt_llm_draft")
REQUIRED_PARAMETERS = {
    "preprocessing": ("tokenizer_dir",),
    "postprocessing": ("tokenizer_dir",),
    "tensorrt_llm_bls": ("tensorrt_llm_model_name",),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
# Triton decoding_mode values that need an engine built for that speculative mode.
SPECULATIVE_DECODING_MODES = tuple(
    m.triton_decoding_mode for m in SpeculativeDecodingMode if m.triton_decoding_mode != "top_k_top_p"
)


@dataclass(frozen=True)
class Finding:
    file: str  # relative to the repository
    field: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.file}: {self.field}: {self.problem}\n    fix: {self.fix}"


class _Repo:
    def __init__(self, root: Path):
        self.root = root
        self.findings: list[Finding] = []
        self.configs: dict[str, Any] = {}
        try:  # a repository without (or with a broken) manifest is still checked; paths stay as written
            self.manifest: RepoManifest | None = (
                read_repo_manifest(root) if (root / MANIFEST).is_file() else None
            )
        except SpecbuildError as exc:
            self.manifest = None
            self.fail(
                MANIFEST, "-", exc.what, exc.fix or "regenerate the repository with `specbuild repo --force`"
            )

    def fail(self, file: str, field: str, problem: str, fix: str) -> None:
        self.findings.append(Finding(file, field, problem, fix))

    def param(self, model: str, key: str) -> str | None:
        cfg = self.configs.get(model)
        if cfg is None or key not in cfg.parameters:
            return None
        return cfg.parameters[key].string_value

    def host_path(self, served: str) -> Path:
        """A path as written in a config -> where it is on this host (undo --engine-root /
        --tokenizer-dir)."""
        m = self.manifest
        if m is None:
            return Path(served)
        root = m.engine_root
        if root and (served == root or served.startswith(root.rstrip("/") + "/")):
            return m.build_dir / Path(served).relative_to(root)
        if served == m.layout.get("tokenizer_dir") and m.tokenizer_dir_host:
            return m.tokenizer_dir_host
        return Path(served)


def kind_note(root: str | Path) -> str | None:
    """What to tell about a repository whose manifest predates `repo_kind` (None: nothing)."""
    try:
        m = read_repo_manifest(root) if (Path(root) / MANIFEST).is_file() else None
    except SpecbuildError:
        return None  # check_repo reports the broken manifest
    if m is None or m.kind_recorded:
        return None
    return (
        f"{MANIFEST} has no repo_kind (an older specbuild): read {m.kind.value} from its backend field "
        f"({m.kind.backend}); `specbuild repo BUILD_DIR OUT --force` records it"
    )


def check_repo(root: str | Path) -> list[Finding]:
    """Every inconsistency found (empty list: the repository is consistent)."""
    repo = _Repo(Path(root))
    if not repo.root.is_dir():
        return [Finding(str(root), "-", "no such folder", "pass the folder `specbuild repo` wrote")]

    check_triton.check_folders(repo)
    if check_llmapi.is_llmapi_repo(repo):  # Triton's LLM-API model: one Python model and its model.yaml
        check_llmapi.check_llmapi(repo)
        return repo.findings
    _parse_all(repo)
    check_triton.check_batching(repo)
    engines = _check_engines(repo)
    _check_speculation(repo, engines)
    _check_logits(repo, engines)
    _check_tokenizers(repo, engines)
    _check_ensemble(repo)
    _check_parameters(repo)
    _check_python_sources(repo)
    return repo.findings


def _parse_all(repo: _Repo) -> None:

    unreadable = set()
    for path in sorted(repo.root.glob("*/config.pbtxt")):
        rel = path.relative_to(repo.root).as_posix()
        try:
            cfg = parse_text(read_text(path, kind="config", what="model configuration"))
        except SpecbuildError as exc:  # too large, not a file, not UTF-8 (binary)
            repo.fail(rel, "-", f"{exc.what} ({exc.found})", "regenerate it with `specbuild repo --force`")
            unreadable.add(path.parent.name)
            continue
        except text_format.ParseError as exc:
            repo.fail(
                rel,
                "-",
                f"not a valid inference.ModelConfig: {shorten(str(exc))}",
                "regenerate it with `specbuild repo --force`",
            )
            unreadable.add(path.parent.name)
            continue
        if cfg.name and cfg.name != path.parent.name:
            repo.fail(
                rel,
                "name",
                f"{cfg.name!r} differs from its folder {path.parent.name!r}",
                f'set name: "{path.parent.name}"',
            )
        repo.configs[path.parent.name] = cfg
    for model in ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls"):
        if model not in repo.configs and model not in unreadable:
            repo.fail(
                f"{model}/config.pbtxt", "-", "missing", "regenerate the repository with `specbuild repo`"
            )


def _check_engines(repo: _Repo) -> dict[str, dict]:
    """engine model -> its engine config.json (only for the folders that exist)."""
    out = {}
    for model in ENGINE_MODELS:
        if model not in repo.configs:
            continue
        rel = f"{model}/config.pbtxt"
        served = repo.param(model, "gpt_model_path")
        if not served:
            continue  # reported by _check_parameters
        folder = repo.host_path(served)
        if not (folder / "config.json").is_file():
            repo.fail(
                rel,
                "parameters.gpt_model_path",
                f"engine folder {folder} does not exist (or has no config.json)",
                "build the engines (`specbuild compile`, then build.sh on a GPU host) or fix the path / "
                "--engine-root",
            )
            continue
        try:
            cfg = read_json(folder / "config.json", what="engine config.json")
        except SpecbuildError as exc:
            repo.fail(
                rel,
                "parameters.gpt_model_path",
                f"{exc.what} ({exc.found})",
                "rebuild the engine (`specbuild compile`, or build.sh on a GPU host)",
            )
            continue
        out[model] = cfg
        if repo.configs[model].backend == TRITON_CPP_BACKEND and not any(folder.glob("rank*.engine")):
            repo.fail(
                rel,
                "parameters.gpt_model_path",
                f"{folder} holds no rank*.engine (a reference engine or an unbuilt plan)",
                "run build.sh on a GPU host with tensorrt_llm, or generate with --backend python for local "
                "serving",
            )
    return out


def _check_speculation(repo: _Repo, engines: dict[str, dict]) -> None:
    target = engines.get("tensorrt_llm")
    if target is None:
        return

    build = target.get("build_config") or {}
    raw = build.get("speculative_decoding_mode")
    rel = "tensorrt_llm/config.pbtxt"
    # trtllm-build records the IntFlag's integer (MEDUSA = 4); older specbuild folders the CLI name
    mode = SpeculativeDecodingMode.from_recorded(raw)
    if mode is None:
        repo.fail(
            rel,
            "parameters.gpt_model_path",
            f"the engine's build_config.speculative_decoding_mode {shorten(raw)} is not a TensorRT-LLM mode",
            "rebuild the engine (its config.json is damaged or from an unknown TensorRT-LLM)",
        )
        return
    shown = f"{mode.name} ({int(mode)})"
    try:
        max_draft_len = int(build.get("max_draft_len") or 0)
    except (TypeError, ValueError):
        max_draft_len = 0
    decoding = repo.param("tensorrt_llm", "decoding_mode") or ""
    want = mode.triton_decoding_mode  # what the C++ backend calls the engine's speculative mode
    if want != "top_k_top_p" and decoding != want:
        repo.fail(
            rel,
            "parameters.decoding_mode",
            f"{decoding!r} but the engine was built with speculative_decoding_mode {shown}",
            f'set decoding_mode to "{want}"',
        )
    if want == "top_k_top_p" and decoding in SPECULATIVE_DECODING_MODES:
        repo.fail(
            rel,
            "parameters.decoding_mode",
            f"{decoding} but the engine's speculative_decoding_mode is {shown}",
            'set decoding_mode to "top_k_top_p" (or rebuild the engine for that mode)',
        )
    if mode is SpeculativeDecodingMode.MEDUSA:
        _check_medusa_tree(repo, target, max_draft_len)
    k = repo.param("tensorrt_llm_bls", "default_num_draft_tokens")
    draft_name = repo.param("tensorrt_llm_bls", "tensorrt_llm_draft_model_name")
    drafter = repo.param("tensorrt_llm_bls", "bls_drafter")
    _check_method(repo, draft_name, drafter)
    if draft_name and draft_name not in repo.configs:
        repo.fail(
            "tensorrt_llm_bls/config.pbtxt",
            "parameters.tensorrt_llm_draft_model_name",
            f"names {draft_name!r}, which is not in the repository",
            "set it to tensorrt_llm_draft or regenerate",
        )
    if draft_name or drafter:  # the BLS drafts (a draft model or its own drafter) and the target verifies
        if mode is not SpeculativeDecodingMode.DRAFT_TOKENS_EXTERNAL:
            repo.fail(
                "tensorrt_llm/config.pbtxt",
                "parameters.gpt_model_path",
                f"the target engine's speculative_decoding_mode is {shown}, but the BLS drafts with "
                f"{draft_name or drafter}",
                "rebuild the target with --speculative_decoding_mode draft_tokens_external --max_draft_len K",
            )
        if k is not None and k.isdecimal() and int(k) > max_draft_len:
            repo.fail(
                "tensorrt_llm_bls/config.pbtxt",
                "parameters.default_num_draft_tokens",
                f"{k} draft tokens but the target engine's max_draft_len is {max_draft_len}",
                f"set default_num_draft_tokens <= {max_draft_len}, or rebuild the target with a larger "
                "--max_draft_len",
            )


def _check_method(repo: _Repo, draft_name: str | None, drafter: str | None) -> None:
    """The BLS's speculation_method, its drafter and its draft model agree (what `repo` writes)."""
    name = repo.param("tensorrt_llm_bls", "speculation_method")
    if name is None:
        return
    rel = "tensorrt_llm_bls/config.pbtxt"
    try:
        method = method_of(name)
    except SpecError:
        repo.fail(
            rel,
            "parameters.speculation_method",
            f"{shorten(name)!r} is not a speculation method",
            "use one of " + ", ".join(m.value for m in Method),
        )
        return
    if (drafter or None) != method.bls_drafter:
        repo.fail(
            rel,
            "parameters.bls_drafter",
            f"{drafter!r}, but mode {method.name} drafts with {method.bls_drafter or 'the engine itself'}",
            f'set bls_drafter to "{method.bls_drafter or ""}" or regenerate the repository',
        )
    if bool(draft_name) != method.draft_model:
        repo.fail(
            rel,
            "parameters.tensorrt_llm_draft_model_name",
            f"{draft_name!r}, but mode {method.name} "
            + ("needs a draft model" if method.draft_model else "has no draft model"),
            "regenerate the repository with `specbuild repo --force`",
        )


def _check_medusa_tree(repo: _Repo, target: dict, max_draft_len: int) -> None:
    rel = "tensorrt_llm/config.pbtxt"
    text = repo.param("tensorrt_llm", "medusa_choices")
    if not text:
        repo.fail(
            rel,
            "parameters.medusa_choices",
            "missing: the backend would use its default mc_sim_7b_63 tree",
            "set medusa_choices to the tree the engine was built for, e.g. {0}, {0, 0}, {1}",
        )
        return
    try:
        tree = MedusaChoices.from_triton(text)
    except SpecbuildError as exc:
        repo.fail(
            rel,
            "parameters.medusa_choices",
            f"{exc.what}: {text[:80]}",
            exc.fix or "write {0}, {0, 0}, {1} (no outer braces)",
        )
        return
    heads = int((target.get("pretrained_config") or {}).get("num_medusa_heads") or 0)
    for problem in tree.problems(num_heads=heads, max_draft_len=max_draft_len):
        repo.fail(
            rel,
            "parameters.medusa_choices",
            problem,
            f"use a tree of at most {max_draft_len} nodes and depth <= {heads} (or rebuild the engine)",
        )


def _check_logits(repo: _Repo, engines: dict[str, dict]) -> None:
    def logits_type(model: str) -> str | None:
        cfg = repo.configs.get(model)
        for out in cfg.output if cfg else ():
            if out.name == "generation_logits":
                return pb.DataType.Name(out.data_type)
        return None

    types = {m: logits_type(m) for m in (*ENGINE_MODELS, "tensorrt_llm_bls", "ensemble") if logits_type(m)}
    if len(set(types.values())) > 1:
        target = types.get("tensorrt_llm")
        for model, dtype in types.items():
            if dtype != target:
                repo.fail(
                    f"{model}/config.pbtxt",
                    "output generation_logits.data_type",
                    f"{dtype} but tensorrt_llm uses {target} (draft_logits travel between them)",
                    f"use {target} in every model (logits_datatype)",
                )
    for model, cfg in engines.items():
        want = LOGITS_DTYPE_OF.get(str((cfg.get("pretrained_config") or {}).get("logits_dtype", "float32")))
        if want and types.get(model) and types[model] != want:
            repo.fail(
                f"{model}/config.pbtxt",
                "output generation_logits.data_type",
                f"{types[model]} but the engine's logits_dtype is {want}",
                f"use {want}",
            )


def _check_tokenizers(repo: _Repo, engines: dict[str, dict]) -> None:
    seen: dict[str, Path] = {}
    for model in ("preprocessing", "postprocessing", *ENGINE_MODELS):
        served = repo.param(model, "tokenizer_dir")
        if served is None or model not in repo.configs:
            continue
        folder = repo.host_path(served)
        rel = f"{model}/config.pbtxt"
        if not folder.is_dir() or not any((folder / f).is_file() for f in TOKENIZER_FILES):
            repo.fail(
                rel,
                "parameters.tokenizer_dir",
                f"{folder} holds no tokenizer ({', '.join(TOKENIZER_FILES)})",
                "point tokenizer_dir at the target model's HF folder",
            )
            continue
        seen[model] = folder
    folders = {str(p.resolve()) for p in seen.values()}
    if len(folders) > 1 and not _same_tokenizer(list(seen.values())):
        for model, folder in seen.items():
            repo.fail(
                f"{model}/config.pbtxt",
                "parameters.tokenizer_dir",
                f"{folder} differs from the other models' tokenizer",
                "use the target model's tokenizer folder in preprocessing, postprocessing and the engine "
                "models",
            )
    vocab = int((engines.get("tensorrt_llm", {}).get("pretrained_config") or {}).get("vocab_size") or 0)
    if "preprocessing" in seen and vocab:
        size = _tokenizer_size(seen["preprocessing"])
        if size > vocab:
            repo.fail(
                "preprocessing/config.pbtxt",
                "parameters.tokenizer_dir",
                f"the tokenizer in {seen['preprocessing']} has {size} tokens but the target engine's "
                f"vocab_size is {vocab}",
                "use the tokenizer of the model the engine was built from",
            )


def _tokenizer_size(folder: Path) -> int:
    """Token count of a fast tokenizer (tokenizer.json: vocab + added tokens); 0 when unknown."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return 0
    try:
        data = read_json(path, kind="tokenizer", what="tokenizer.json")
    except SpecbuildError:
        return 0  # unreadable: the tokenizer rows of `check` and the server say why
    ids = (
        set(((data.get("model") or {}).get("vocab") or {}).values())
        if isinstance((data.get("model") or {}).get("vocab"), dict)
        else set()
    )
    ids |= {t.get("id") for t in data.get("added_tokens") or [] if isinstance(t, dict)}
    return max((i for i in ids if isinstance(i, int)), default=-1) + 1


def _same_tokenizer(folders: list[Path]) -> bool:
    """Two folders hold the same tokenizer when their tokenizer files are byte-identical."""

    def digest(folder: Path) -> tuple:
        return tuple(
            (f, hashlib.sha256(read_bytes(folder / f, kind="tokenizer")).hexdigest())
            for f in TOKENIZER_FILES
            if (folder / f).is_file()
        )

    first = digest(folders[0])
    return all(digest(f) == first for f in folders[1:])


def _check_ensemble(repo: _Repo) -> None:
    ens = repo.configs.get("ensemble")
    if ens is None:
        return
    rel = "ensemble/config.pbtxt"
    types: dict[str, int] = {t.name: t.data_type for t in ens.input}
    produced: dict[str, int] = {}
    for i, step in enumerate(ens.ensemble_scheduling.step):
        model = repo.configs.get(step.model_name)
        if model is None:
            repo.fail(
                rel,
                f"ensemble_scheduling.step[{i}].model_name",
                f"{step.model_name!r} is not in the repository",
                "regenerate the repository",
            )
            continue
        inputs = {t.name: t for t in model.input}
        outputs = {t.name: t for t in model.output}
        for key, tensor in step.input_map.items():
            field = f"ensemble_scheduling.step[{i}].input_map[{key}]"
            if key not in inputs:
                repo.fail(rel, field, f"{step.model_name} has no input {key!r}", "map an existing input name")
            elif tensor not in types and tensor not in produced:
                repo.fail(
                    rel,
                    field,
                    f"ensemble tensor {tensor!r} is neither an ensemble input nor produced by an earlier "
                    "step",
                    "map an ensemble input or an earlier step's output",
                )
            else:
                have = types.get(tensor, produced.get(tensor))
                if have != inputs[key].data_type:
                    repo.fail(
                        rel,
                        field,
                        f"{tensor!r} has type {_dtype(have)} but {step.model_name}.{key} wants "
                        f"{_dtype(inputs[key].data_type)}",
                        "make the types agree (logits_datatype / the tensor tables)",
                    )
        for key, tensor in step.output_map.items():
            field = f"ensemble_scheduling.step[{i}].output_map[{key}]"
            if key not in outputs:
                repo.fail(
                    rel, field, f"{step.model_name} has no output {key!r}", "map an existing output name"
                )
                continue
            produced[tensor] = outputs[key].data_type
        missing = [t.name for t in model.input if not t.optional and t.name not in step.input_map]
        for name in missing:
            repo.fail(
                rel,
                f"ensemble_scheduling.step[{i}].input_map",
                f"required input {step.model_name}.{name} is not mapped",
                f"map {name} to an ensemble tensor",
            )
    for out in ens.output:
        if out.name not in produced:
            repo.fail(rel, f"output {out.name}", "no step produces it", "map it in a step's output_map")
        elif produced[out.name] != out.data_type:
            repo.fail(
                rel,
                f"output {out.name}.data_type",
                f"{_dtype(out.data_type)} but the step produces {_dtype(produced[out.name])}",
                "make the types agree",
            )


def _dtype(value: int | None) -> str:
    return pb.DataType.Name(value) if value is not None else "?"


def _check_parameters(repo: _Repo) -> None:
    required = dict(REQUIRED_PARAMETERS)
    for model in ENGINE_MODELS:
        required[model] = REQUIRED_ENGINE_PARAMETERS
    for model, keys in required.items():
        cfg = repo.configs.get(model)
        if cfg is None:
            continue
        for key in keys:
            if key not in cfg.parameters:
                repo.fail(
                    f"{model}/config.pbtxt",
                    f"parameters.{key}",
                    "missing (the model does not load without it)",
                    f'add parameters {{ key: "{key}" value: {{ string_value: "..." }} }}',
                )
    for model in ENGINE_MODELS:
        if repo.param(model, "gpt_model_type") not in (
            None,
            "inflight_fused_batching",
            "inflight_batching",
            "V1",
            "v1",
        ):
            repo.fail(
                f"{model}/config.pbtxt",
                "parameters.gpt_model_type",
                f"{repo.param(model, 'gpt_model_type')!r} is not a batching strategy",
                'use "inflight_fused_batching"',
            )


def _check_python_sources(repo: _Repo) -> None:
    """Python-backend models need 1/model.py; a production BLS needs its vendored loop (no
    specbuild there)."""
    for name, cfg in repo.configs.items():
        if cfg.backend == TRITON_PYTHON_BACKEND and not (repo.root / name / "1" / "model.py").is_file():
            repo.fail(
                f"{name}/1/model.py",
                "-",
                "missing: the Python backend has nothing to run",
                "regenerate the repository with `specbuild repo --force`",
            )
    production = any(
        repo.configs.get(m) is not None and repo.configs[m].backend == TRITON_CPP_BACKEND
        for m in ENGINE_MODELS
    )
    vendor = repo.root / "tensorrt_llm_bls" / "1" / "vendor" / "specbuild"
    missing = [rel for rel in VENDORED_MODULES if not (vendor / rel).is_file()]
    if production and "tensorrt_llm_bls" in repo.configs and missing:
        repo.fail(
            "tensorrt_llm_bls/1/vendor",
            "-",
            f"missing specbuild/{', specbuild/'.join(missing)}: the container has no specbuild, the BLS "
            "cannot import its loop",
            "regenerate the repository with `specbuild repo --backend tensorrtllm --force`",
        )
