"""Typed read-back of the `specbuild.json` manifests that later stages depend on.

A build folder (`specbuild compile`), its engine and checkpoint folders and a model repository
(`specbuild repo`) each record what was built. Stages read them through these frozen dataclasses,
never as raw dicts: a missing key is an error that names the folder, not a silent default.
Writing stays in core/formats/manifest.py (`write_manifest`); `RoleRecord.to_dict` is what a build records.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.core.deployment import RepoKind, kind_of_manifest
from specbuild.core.errors import SpecbuildError
from specbuild.core.facts.llmapi import Flow
from specbuild.core.facts.trtllm import SpeculativeDecodingMode
from specbuild.core.formats.manifest import MANIFEST, read_manifest
from specbuild.core.methods import Method, SpeculationMethod, method_of, parse_method
from specbuild.core.spec import BuildSpec, spec_from_dict

BUILD_KIND, ENGINE_KIND, CHECKPOINT_KIND, REPO_KIND = "build", "engine", "trtllm_checkpoint", "model_repo"


def _bad(folder: Path, exc: Exception) -> SpecbuildError:
    return SpecbuildError(
        f"{folder / MANIFEST} is incomplete",
        expected="a manifest written by this specbuild",
        found=f"{type(exc).__name__}: {exc}",
        fix="rebuild the folder with specbuild",
    )


def _spec(raw: dict[str, Any]) -> BuildSpec:
    raw = dict(raw)
    source = raw.pop("source", None)
    return spec_from_dict(raw, source=Path(source) if source else None)


@dataclass(frozen=True)
class RoleRecord:
    """One engine of a build, as `specbuild compile` recorded it (paths relative to the build folder)."""

    role: str  # target | draft
    hf_dir: Path | None  # the HF folder it was converted from
    checkpoint: str  # <role>/checkpoint
    engine: str | None  # <role>/engine, None while only planned (trtllm without trtllm-build)
    tp_size: int
    pp_size: int
    mode: SpeculativeDecodingMode
    max_draft_len: int
    argv: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "hf_dir": str(self.hf_dir) if self.hf_dir else None,
            "checkpoint": self.checkpoint,
            "engine": self.engine,
            "tp_size": self.tp_size,
            "pp_size": self.pp_size,
            "speculative_decoding_mode": int(self.mode),
            "max_draft_len": self.max_draft_len,
            "argv": list(self.argv),
        }

    @classmethod
    def from_dict(cls, role: str, d: dict[str, Any]) -> RoleRecord:
        return cls(
            role=role,
            hf_dir=Path(d["hf_dir"]) if d.get("hf_dir") else None,
            checkpoint=d["checkpoint"],
            engine=d.get("engine"),
            tp_size=int(d["tp_size"]),
            pp_size=int(d["pp_size"]),
            mode=SpeculativeDecodingMode.from_recorded(d["speculative_decoding_mode"]),
            max_draft_len=int(d["max_draft_len"]),
            argv=tuple(d.get("argv") or ()),
        )


@dataclass(frozen=True)
class BuildManifest:
    """A `specbuild compile` output folder."""

    folder: Path
    spec: BuildSpec
    engine_kind: str  # reference | trtllm
    engine_built: bool
    tokenizer_dir: Path
    roles: dict[str, RoleRecord]
    # LLM-API flow builds (compile --flow llmapi): options_file, models (section -> HF folder), trtllm_serve
    llmapi: dict[str, Any] | None = None

    @property
    def method(self) -> SpeculationMethod:
        return method_of(self.spec)

    @property
    def flow(self) -> Flow:
        return self.spec.flow

    def engine_dir(self, role: str) -> Path:
        """The role's engine folder (build.sh writes <role>/engine when it was only planned)."""
        record = self.roles[role]
        return self.folder / (record.engine or f"{role}/engine")

    def checkpoint_dir(self, role: str) -> Path:
        return self.folder / self.roles[role].checkpoint

    def loadable_dir(self, role: str) -> Path:
        """What the reference engine loads for the role: its engine folder, else its checkpoint."""
        record = self.roles[role]
        return self.folder / (record.engine or record.checkpoint)


def read_build_manifest(folder: str | Path, raw: dict[str, Any] | None = None) -> BuildManifest:
    folder = Path(folder).resolve()
    raw = raw if raw is not None else read_manifest(folder, kind=BUILD_KIND)
    try:
        roles = {role: RoleRecord.from_dict(role, d) for role, d in raw["roles"].items()}
        if "target" not in roles:
            raise KeyError("roles.target")
        return BuildManifest(
            folder=folder,
            spec=_spec(raw["spec"]),
            engine_kind=raw["engine"],
            engine_built=bool(raw.get("engine_built")),
            tokenizer_dir=Path(raw["tokenizer_dir"]),
            roles=roles,
            llmapi=dict(raw["llmapi"]) if isinstance(raw.get("llmapi"), dict) else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(folder, exc) from None


@dataclass(frozen=True)
class EngineManifest:
    """An engine folder (reference or TensorRT-LLM) inside a build."""

    folder: Path
    engine: str  # reference | trtllm
    checkpoint: Path | None  # the checkpoint it was built from
    build_config: dict[str, Any]


@dataclass(frozen=True)
class CheckpointManifest:
    """A TensorRT-LLM checkpoint written by `specbuild convert`."""

    folder: Path
    hf_dir: Path | None  # the HF folder it was converted from (tokenizer files live there)
    options: dict[str, Any]


@dataclass(frozen=True)
class RepoManifest:
    """A model repository written by `specbuild repo`."""

    folder: Path
    backend: str  # tensorrtllm | python | llmapi | llmapi-local (`repo --backend`; `kind` answers for it)
    mode: Method
    trtllm_version: str
    build_dir: Path
    engine_root: str | None  # where the build folder is mounted in the serving container
    tokenizer_dir_host: Path | None  # the tokenizer folder on the host that generated the repository
    models: tuple[str, ...]
    layout: dict[str, Any]  # the RepoLayout the configs were built from
    spec: dict[str, Any]  # the resolved build spec (BuildSpec.to_dict())
    kind: RepoKind = RepoKind.ENGINE  # flow x production|local (core/deployment.py)
    kind_recorded: bool = True  # False: an older repository; `kind` was read from its `backend` field

    @property
    def method(self) -> SpeculationMethod:
        return method_of(self.mode)


def read_repo_manifest(folder: str | Path) -> RepoManifest:
    folder = Path(folder)
    raw = read_manifest(folder, kind=REPO_KIND)
    try:
        kind, recorded = kind_of_manifest(raw)
        return RepoManifest(
            kind=kind,
            kind_recorded=recorded,
            folder=folder,
            backend=raw["backend"],
            mode=parse_method(raw["mode"], where=str(folder / MANIFEST)),
            trtllm_version=str(raw["trtllm_version"]),
            build_dir=Path(raw["build_dir"]),
            engine_root=raw.get("engine_root"),
            tokenizer_dir_host=Path(raw["tokenizer_dir_host"]) if raw.get("tokenizer_dir_host") else None,
            models=tuple(raw["models"]),
            layout=dict(raw["layout"]),
            spec=dict(raw["spec"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(folder, exc) from None


Manifest = BuildManifest | EngineManifest | CheckpointManifest | RepoManifest


def read_artifact(folder: str | Path) -> Manifest | None:
    """The typed manifest of whatever specbuild wrote in `folder`; None when it holds no manifest."""
    folder = Path(folder)
    if not (folder / MANIFEST).is_file():
        return None
    raw = read_manifest(folder)
    kind = raw.get("kind")
    try:
        if kind == BUILD_KIND:
            return read_build_manifest(folder, raw)
        if kind == ENGINE_KIND:
            ckpt = raw.get("checkpoint")
            return EngineManifest(
                folder=folder,
                engine=raw["engine"],
                checkpoint=(folder / ckpt).resolve() if ckpt else None,
                build_config=dict(raw.get("build_config") or {}),
            )
        if kind == CHECKPOINT_KIND:
            hf = (raw.get("inputs") or {}).get("hf_dir")
            return CheckpointManifest(
                folder=folder, hf_dir=Path(hf) if hf else None, options=dict(raw.get("options") or {})
            )
        if kind == REPO_KIND:
            return read_repo_manifest(folder)
    except (KeyError, TypeError, ValueError) as exc:
        raise _bad(folder, exc) from None
    return None  # another kind (Medusa heads, demo family): nothing a stage reads back here
