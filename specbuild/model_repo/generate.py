"""`specbuild repo`: lay out a Triton model repository from what `specbuild compile` built.

Reads the build folder's manifest (kind "build": the resolved spec, the engine kind, the tokenizer
folder) and each engine's config.json, plans the repository (`RepoLayout`), builds every config as a
ModelConfig message (configs.py), copies this project's Python models, and writes the repository's
own specbuild.json, all into a temporary folder renamed into place at the end.

Engine and tokenizer paths in the configs are absolute paths on this host by default. With
`engine_root` (the folder where the build folder will be mounted in the serving container) engine
paths become `engine_root/<path inside the build folder>`; `tokenizer_dir` overrides the tokenizer path
the same way. The repository manifest records both mappings so `repo check` can find the files here.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specbuild.builder.memory_plan import plan_memory
from specbuild.core.artifacts import REPO_KIND, BuildManifest, read_build_manifest
from specbuild.core.deployment import RepoKind
from specbuild.core.engine_limits import EngineLimits, RequestLimits
from specbuild.core.errors import RepoError
from specbuild.core.facts.trtllm import known_versions, parse_version
from specbuild.core.formats.hf_config import HFModelConfig
from specbuild.core.formats.manifest import atomic_output_dir, write_manifest
from specbuild.core.formats.safe_io import read_json
from specbuild.core.perf.schedule import (
    AcceptanceGuard,
    DraftSchedule,
    ScheduleError,
    guard_of,
    guard_text,
    schedule_of,
)
from specbuild.model_repo.configs import (
    BACKENDS,
    LLMAPI_BACKENDS,
    EngineModel,
    RepoLayout,
    all_configs,
    to_text,
)
from specbuild.model_repo.llmapi_repo import generate_llmapi_repo
from specbuild.model_repo.sources import PYTHON_MODELS, model_files
from specbuild.model_repo.tensors import (
    DEFAULT_LOGITS_DTYPE,
    DRAFT_MODEL,
    LOGITS_DTYPE_OF,
    ROLE_MODELS,
    TARGET_MODEL,
)
from specbuild.model_repo.transaction import decoupled_of

# The torch-light modules the BLS needs for the shared speculative loop. Production containers do not
# have specbuild installed, so the generator vendors them into tensorrt_llm_bls/1/vendor/.
# Their packages get empty __init__.py files, so nothing else of specbuild is imported.
VENDORED_MODULES = (
    "core/errors.py",
    "core/sampling_params.py",
    "core/generation.py",
    "core/engine_limits.py",
    "core/perf/schedule.py",
    "engines/reference/speculative.py",
    "engines/reference/ngram.py",
    "engines/reference/sampling.py",
    "model_repo/tensors.py",  # the tensor names the BLS forwards (perf outputs), not re-listed there
    "core/facts/trtllm.py",  # tensors.py imports it; the BLS calls nothing that reads its data files
)


@dataclass(frozen=True)
class BuiltEngine:
    role: str  # target | draft
    path: Path  # engine folder on this host
    config: dict[str, Any] | None  # its config.json (None when not built yet: trtllm plan only)
    checkpoint_config: dict[str, Any] | None = None  # the TensorRT-LLM checkpoint's config.json
    hf_dir: Path | None = None  # the HF folder it was converted from

    @property
    def pretrained_config(self) -> dict[str, Any]:
        return (self.config or {}).get("pretrained_config") or self.checkpoint_config or {}


@dataclass(frozen=True)
class BuildInfo:
    """What `specbuild compile` wrote: its manifest plus each engine's config.json."""

    manifest: BuildManifest
    engines: dict[str, BuiltEngine]  # role -> engine

    @property
    def build_dir(self) -> Path:
        return self.manifest.folder

    @property
    def spec(self):
        return self.manifest.spec

    @property
    def engine_kind(self) -> str:
        return self.manifest.engine_kind

    @property
    def tokenizer_dir(self) -> Path:
        return self.manifest.tokenizer_dir


def read_build(build_dir: str | Path) -> BuildInfo:
    manifest = read_build_manifest(build_dir)
    engines = {}
    for role in manifest.method.roles(manifest.spec):
        record = manifest.roles.get(role.role)
        if record is None:
            raise RepoError(
                f"{manifest.folder}: the build has no {role.role} engine",
                expected=f"roles.{role.role} in specbuild.json",
                found=", ".join(manifest.roles),
                fix="re-run `specbuild compile`",
            )
        path = manifest.engine_dir(role.role)
        engines[role.role] = BuiltEngine(
            role.role,
            path,
            _json(path / "config.json"),
            checkpoint_config=_json(manifest.checkpoint_dir(role.role) / "config.json"),
            hf_dir=record.hf_dir,
        )
    return BuildInfo(manifest, engines)


def _json(path: Path) -> dict[str, Any] | None:
    return read_json(path, what="engine config.json") if path.is_file() else None


def kv_fractions(build: BuildInfo, *, strict: bool) -> tuple[float, float | None, int | None]:
    """(target fraction, draft fraction, KV tokens per engine) from the memory plan.

    strict (production): a plan that leaves no KV cache is an error. Otherwise (local serving, where
    the fraction is not used): an even split of serving.kv_cache_free_gpu_mem_fraction.
    """
    spec = build.spec
    total = spec.serving.kv_cache_free_gpu_mem_fraction
    n = len(build.engines)
    even = (total / n, total / n if "draft" in build.engines else None, None)
    # The HF folders the build recorded (the spec's relative paths may not resolve from here).
    configs = {
        role: HFModelConfig.from_hf(e.hf_dir)
        for role, e in build.engines.items()
        if e.hf_dir and e.hf_dir.is_dir()
    }
    plan = plan_memory(spec, target=configs.get("target"), draft=configs.get("draft"))
    fractions = [plan.target_kv_fraction] + ([plan.draft_kv_fraction] if "draft" in build.engines else [])
    if all(f is not None and 0.0 < f <= 1.0 for f in fractions) and plan.fits:
        return plan.target_kv_fraction, plan.draft_kv_fraction, plan.kv_tokens or None
    if strict:
        raise RepoError(
            "the memory plan leaves no room for the KV cache",
            expected="weights + KV cache that fit the GPUs",
            found=f"kv fractions {fractions}, {plan.kv_tokens} KV tokens for max_seq_len {plan.max_seq_len}",
            fix="run `specbuild check SPEC`; lower build.max_batch_size / max_seq_len, raise tp_size or "
            "serving.gpu_memory_gb",
        )
    return even


def plan_layout(
    build: BuildInfo,
    *,
    backend: str,
    trtllm_version: str | None = None,
    engine_root: str | None = None,
    tokenizer_dir: str | None = None,
    schedule: str | None = None,
    guard: str | None = None,
    decoupled: bool | None = None,
) -> RepoLayout:
    """`schedule`: "n:K,..." replacing the spec's speculation.schedule ("off": none; None: the spec's);
    `guard`: "window:min_acceptance" replacing its speculation.guard (same conventions); `decoupled`: the
    BLS's transaction policy (None: the spec's, else the flow's default; model_repo/transaction.py)."""
    spec = build.spec
    if backend not in BACKENDS:
        raise RepoError(
            f"unknown backend {backend!r}",
            expected=" | ".join(BACKENDS),
            found=backend,
            fix="pass --backend tensorrtllm (GPU containers) or --backend python (local)",
        )
    version = trtllm_version or spec.trtllm_version
    if not parse_version(version) or version not in known_versions():
        raise RepoError(
            f"unknown TensorRT-LLM version {version!r}",
            expected="a released version: " + ", ".join(known_versions()),
            found=version,
            fix="pass --trtllm-version 1.2.1 (the TensorRT-LLM inside the serving container)",
        )

    def served(path: Path) -> str:
        if engine_root is None:
            return str(path)
        try:
            rel = path.relative_to(build.build_dir)
        except ValueError:
            raise RepoError(
                f"engine folder {path} is outside the build folder",
                expected=f"a folder under {build.build_dir}",
                found=str(path),
                fix="omit --engine-root, or mount the engine folder yourself",
            ) from None
        return str(Path(engine_root) / rel)

    kind = RepoKind.of_backend(backend)
    target_kv, draft_kv, kv_tokens = kv_fractions(build, strict=not kind.local)
    method = build.manifest.method
    roles = {r.role: r for r in method.roles(spec)}
    loop = method.bls_drives_loop  # the BLS calls the engines round by round (else the engine speculates)
    schedule_, guard_ = schedule_of(spec), guard_of(spec)
    if schedule is not None:
        schedule_ = _schedule_option(schedule, spec.speculation.max_draft_len)
    if guard is not None:
        guard_ = _guard_option(guard)
    schedule, guard = schedule_, guard_
    models = {}
    for name, role in roles.items():
        section = spec.engine_sections()[name]
        models[name] = EngineModel(
            name=ROLE_MODELS[name],
            engine_dir=served(build.engines[name].path),
            decoupled=name == "target" and not loop,  # an engine that speculates itself streams its steps
            kv_fraction=draft_kv if name == "draft" and draft_kv is not None else target_kv,
            # the devices of one node (serving.nodes): the executor puts rank r on gpu_device_ids[r % len]
            # (engines/trtllm/ckpt_config.py); the draft shares the target's first GPUs
            gpu_device_ids=tuple(range(section.world_size // spec.serving.nodes)),
            decoding_mode=role.mode.triton_decoding_mode,
            enable_kv_cache_reuse=loop,  # the BLS re-sends the growing prefix every round
            max_tokens_in_paged_kv_cache=kv_tokens,
            medusa_choices=spec.medusa_choices().to_triton() if role.heads is not None else None,
            enable_chunked_context=spec.serving.enable_chunked_context,
            draft_len_schedule=schedule.to_text()
            if schedule is not None and name == "target" and not loop and kind.local
            else "",
        )
    return RepoLayout(
        mode=spec.mode,
        backend=backend,
        trtllm_version=version,
        max_batch_size=spec.build.max_batch_size,
        tokenizer_dir=tokenizer_dir or str(build.tokenizer_dir),
        target=models["target"],
        draft=models.get("draft"),
        logits_dtype=logits_dtype_of(build.engines["target"]),
        max_queue_delay_microseconds=spec.serving.max_queue_delay_microseconds,
        bls_instance_count=spec.serving.bls_instance_count,
        bls_drafter=method.bls_drafter,
        bls_parameters=tuple(method.bls_parameters(spec).items()),
        default_num_draft_tokens=spec.speculation.max_draft_len if loop else 0,
        default_use_draft_logits=roles["target"].gather_generation_logits and loop,
        draft_len_schedule=schedule.to_text() if loop and schedule is not None else "",
        acceptance_guard=guard_text(guard) if loop and guard is not None else "",
        bls_decoupled=decoupled_of(spec, decoupled),
        **_bls_limits(build),
    )


def _schedule_option(text: str, max_draft_len: int) -> DraftSchedule | None:
    if text.strip().lower() in ("off", "none"):
        return None
    if not text.strip():
        raise RepoError(
            "--schedule is empty",
            expected=f"requests in flight -> K, e.g. 1:{max_draft_len},4:0, or off (no schedule)",
            found=repr(text),
            fix="pass --schedule off to serve without a schedule, or leave the option out for the spec's",
        )
    try:
        return DraftSchedule.from_text(text, max_draft_len=max_draft_len, first_is_max=False)
    except ScheduleError as exc:
        raise RepoError(
            f"--schedule {text!r} is not a schedule",
            expected=f"requests in flight -> K, e.g. 1:{max_draft_len},4:0 (every K <= max_draft_len)",
            found=str(exc),
            fix="fix the schedule, or use off",
        ) from None


def _guard_option(text: str) -> AcceptanceGuard | None:
    if text.strip().lower() in ("off", "none"):
        return None
    window, _, floor = text.partition(":")
    try:
        guard = AcceptanceGuard(int(window), float(floor))
        ok = 1 <= guard.window <= 4096 and 0.0 <= guard.min_acceptance <= 1.0
    except ValueError:
        ok = False
    if not ok:
        raise RepoError(
            f"--guard {text!r} is not an acceptance guard",
            expected="WINDOW:MIN_ACCEPTANCE, e.g. 8:0.3 (rounds 1..4096, a rate in [0, 1])",
            found=text,
            fix="fix it, or use off",
        )
    return guard


def _bls_limits(build: BuildInfo) -> dict[str, int]:
    """The BLS's request limits from the built engines' build_config (none before the engines exist)."""
    configs = [e.config.get("build_config") for e in build.engines.values() if e.config]
    if len(configs) != len(build.engines) or not all(
        isinstance(c, dict) and c.get("max_seq_len") for c in configs
    ):
        return {}
    chunked = build.spec.serving.enable_chunked_context  # the engine models' parameter
    limits = RequestLimits.tightest(
        *(
            EngineLimits.from_build_config(c, enable_chunked_context=chunked).request_limits(
                growing_prefix=len(configs) > 1
            )
            for c in configs
        )
    )
    return {"max_prompt_tokens": limits.max_input_len, "max_total_tokens": limits.max_total_len}


def logits_dtype_of(engine: BuiltEngine) -> str:
    """The engine's logits dtype as a Triton type (TRT-LLM checkpoints default to float32 logits)."""
    return LOGITS_DTYPE_OF.get(
        str(engine.pretrained_config.get("logits_dtype", "float32")), DEFAULT_LOGITS_DTYPE
    )


def generate_repo(
    build_dir: str | Path,
    out: str | Path,
    *,
    backend: str | None = None,
    trtllm_version: str | None = None,
    force: bool = False,
    engine_root: str | None = None,
    tokenizer_dir: str | None = None,
    schedule: str | None = None,
    guard: str | None = None,
    decoupled: bool | None = None,
) -> Path:
    """Write the Triton model repository for BUILD_DIR into OUT. backend None: tensorrtllm when the
    build used TensorRT-LLM, python (the reference engine) otherwise. schedule, guard, decoupled: see
    plan_layout (decoupled: the LLM-API model's too)."""
    manifest = read_build_manifest(build_dir)
    if manifest.flow.one_model_repo:
        return generate_llmapi_repo(
            manifest,
            Path(out),
            backend=backend or ("llmapi-local" if manifest.engine_built else "llmapi"),
            trtllm_version=trtllm_version,
            force=force,
            decoupled=decoupled_of(manifest.spec, decoupled),
        )
    if backend in LLMAPI_BACKENDS:
        raise RepoError(
            f"{manifest.folder} is an engine-flow build; --backend {backend} serves LLM-API builds",
            expected="a build from `specbuild compile --flow llmapi`",
            found="flow: engine",
            fix="re-run compile with --flow llmapi (add --engine reference to serve it here), or pass "
            "--backend tensorrtllm / python",
        )
    build = read_build(build_dir)
    backend = backend or ("tensorrtllm" if build.engine_kind == "trtllm" else "python")
    layout = plan_layout(
        build,
        backend=backend,
        trtllm_version=trtllm_version,
        engine_root=engine_root,
        tokenizer_dir=tokenizer_dir,
        schedule=schedule,
        guard=guard,
        decoupled=decoupled,
    )
    configs = all_configs(layout)
    out = Path(out)
    inputs = {
        "build folder": build.build_dir,
        "tokenizer folder": build.tokenizer_dir,
        **{f"{role} engine folder": e.path for role, e in build.engines.items()},
        "specbuild's Python models": PYTHON_MODELS,
    }
    with atomic_output_dir(out, force=force, inputs=inputs) as tmp:
        for name, config in configs.items():
            (tmp / name / "1").mkdir(parents=True)
            (tmp / name / "config.pbtxt").write_text(to_text(config))
            _copy_python_model(name, tmp / name / "1", layout)
        write_manifest(
            tmp,
            kind=REPO_KIND,
            repo_kind=layout.kind.value,
            backend=backend,
            mode=layout.mode.value,
            trtllm_version=layout.trtllm_version,
            build_dir=str(build.build_dir),
            engine_root=engine_root,
            tokenizer_dir_host=str(build.tokenizer_dir),
            models=list(configs),
            layout=asdict(layout),
            spec=build.spec.to_dict(),
        )
    return out


def _copy_python_model(name: str, version_dir: Path, layout: RepoLayout) -> None:
    if name == "ensemble":
        return
    if name in (TARGET_MODEL, DRAFT_MODEL):
        if layout.kind.stand_in is None:
            return  # the C++ backend needs only the engine folder
        files = model_files(layout.kind.stand_in, engine_stand_in=True)
    else:
        files = model_files(name, engine_stand_in=False)
    for file in files:
        shutil.copy2(file, version_dir / file.name)
    if name == "tensorrt_llm_bls" and not layout.kind.local:  # no specbuild package in the container
        _vendor(version_dir / "vendor" / "specbuild")


def _vendor(dest: Path) -> None:
    package = Path(__file__).resolve().parent.parent
    for rel in VENDORED_MODULES:
        src = package / rel
        if not src.is_file():
            raise RepoError(
                f"cannot vendor specbuild/{rel} into the BLS",
                expected="the module in the installed package",
                found="missing",
                fix="reinstall specbuild (pip install -e .)",
            )
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    for folder in (
        dest,
        dest / "core",
        dest / "core" / "perf",
        dest / "core" / "facts",
        dest / "model_repo",
        dest / "engines",
        dest / "engines" / "reference",
    ):
        (folder / "__init__.py").write_text(
            '"""Vendored by specbuild repo: the BLS\'s shared speculative loop."""\n'
        )
