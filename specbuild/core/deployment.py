"""The deployment kind: which of the four Triton model repositories `specbuild repo` writes.

A repository is one flow (engine: the C++ tensorrtllm backend and a BLS; llmapi: Triton's LLM-API
Python model) for one place (production: a GPU container with TensorRT-LLM; local: the bundled CPU
tritonserver, where specbuild's Python models stand in for TensorRT-LLM with the reference engine).
`RepoKind` answers what the stages ask of that pair, so none of them compares flow or `--backend`
strings. It is recorded in the repository's specbuild.json (`repo_kind`); older repositories recorded
only `backend`, from which `RepoKind.of_backend` reads it.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from specbuild.core.errors import SpecbuildError
from specbuild.core.facts.llmapi import Flow

if TYPE_CHECKING:
    from specbuild.core.methods import SpeculationMethod

ENGINE_ENTRY, LLMAPI_ENTRY = "tensorrt_llm_bls", "tensorrt_llm"  # the model a client sends requests to
# Triton's backend names (a config.pbtxt's `backend:`): TensorRT-LLM's C++ backend, the Python backend
TRITON_CPP_BACKEND, TRITON_PYTHON_BACKEND = "tensorrtllm", "python"


class RepoKind(Enum):
    """flow x production|local; the value is what the manifest records."""

    ENGINE = "engine"  # C++ tensorrtllm backend + the BLS, for a GPU container (`--backend tensorrtllm`)
    ENGINE_LOCAL = "engine-local"  # the BLS + tensorrt_llm_local on the reference engine (`--backend python`)
    LLMAPI = "llmapi"  # upstream's LLM-API model.py in the container (`--backend llmapi`)
    LLMAPI_LOCAL = (
        "llmapi-local"  # tensorrt_llm_llmapi_local on the reference engine (`--backend llmapi-local`)
    )

    @property
    def flow(self) -> Flow:
        return Flow.LLMAPI if self in (RepoKind.LLMAPI, RepoKind.LLMAPI_LOCAL) else Flow.ENGINE

    @property
    def llmapi(self) -> bool:
        """The entry is the LLM-API model (one model; the engine speculates by itself)."""
        return self.flow is Flow.LLMAPI

    @property
    def local(self) -> bool:
        """Served here by the bundled CPU tritonserver (the reference engine stands in for TensorRT-LLM)."""
        return self in (RepoKind.ENGINE_LOCAL, RepoKind.LLMAPI_LOCAL)

    @property
    def backend(self) -> str:
        """`specbuild repo --backend` of this kind (also the manifest's `backend` field)."""
        return _BACKENDS[self]

    @property
    def engine_backend(self) -> str:
        """The Triton backend of the engine models (tensorrt_llm, tensorrt_llm_draft) of an engine-flow
        repository: the C++ `tensorrtllm`, or `python` (specbuild's tensorrt_llm_local stand-in)."""
        return TRITON_PYTHON_BACKEND if self.local else TRITON_CPP_BACKEND

    @property
    def stand_in(self) -> str | None:
        """specbuild's Python model (python_models/<name>) vendored for `tensorrt_llm` (None: the real one:
        the C++ backend, or upstream's LLM-API model.py in the container)."""
        return _STAND_INS[self]

    @property
    def entry_model(self) -> str:
        """The model clients send requests to."""
        return LLMAPI_ENTRY if self.llmapi else ENGINE_ENTRY

    @property
    def interface(self) -> str:
        """The client interface of the entry model: "bls" (specbuild's BLS tensors) | "llmapi"."""
        return "llmapi" if self.llmapi else "bls"

    # ---- what a repository of this kind serving `method` offers its clients ---------------------------
    def k_per_request(self, method: SpeculationMethod) -> bool:
        """Requests choose K (num_draft_tokens; 0 = the target alone): the BLS runs the draft -> verify
        rounds. The LLM-API model (and an engine that speculates by itself) drafts its configured K."""
        return not self.llmapi and method.bls_drives_loop

    def has_baseline(self, method: SpeculationMethod) -> bool:
        """The same server can run the target alone (the benchmarks' baseline)."""
        return self.k_per_request(method)

    def separate_draft(self, method: SpeculationMethod) -> bool:
        """A draft model of its own the client can time (the BLS's tensorrt_llm_draft); the LLM-API model
        is one model."""
        return not self.llmapi and method.draft_model

    @classmethod
    def of_interface(cls, interface: str) -> RepoKind:
        """The kind a client sees over the wire from the entry model's interface ("bls" | "llmapi"). The
        place (production or local) does not show there; nothing a client asks depends on it, so this is
        the production kind of that flow."""
        return cls.LLMAPI if interface == cls.LLMAPI.interface else cls.ENGINE

    @classmethod
    def of_backend(cls, backend: str) -> RepoKind:
        """The kind a `--backend` value (or an older manifest's `backend` field) names."""
        for kind, name in _BACKENDS.items():
            if name == backend:
                return kind
        raise SpecbuildError(
            f"unknown repository backend {backend!r}",
            expected=" | ".join(_BACKENDS.values()),
            found=repr(backend),
            fix="pass --backend tensorrtllm | python (engine flow) or llmapi | llmapi-local (LLM-API flow)",
        )

    @classmethod
    def of(cls, flow: Flow, *, local: bool) -> RepoKind:
        if flow is Flow.LLMAPI:
            return cls.LLMAPI_LOCAL if local else cls.LLMAPI
        return cls.ENGINE_LOCAL if local else cls.ENGINE


_BACKENDS = {
    RepoKind.ENGINE: "tensorrtllm",
    RepoKind.ENGINE_LOCAL: "python",
    RepoKind.LLMAPI: "llmapi",
    RepoKind.LLMAPI_LOCAL: "llmapi-local",
}
_STAND_INS = {
    RepoKind.ENGINE: None,
    RepoKind.ENGINE_LOCAL: "tensorrt_llm_local",
    RepoKind.LLMAPI: None,
    RepoKind.LLMAPI_LOCAL: "tensorrt_llm_llmapi_local",
}


def kind_of_manifest(raw: dict) -> tuple[RepoKind, bool]:
    """(kind, recorded) of a repository manifest: `repo_kind` when recorded, else read from the older
    `backend` field (recorded False: say so to the user)."""
    if "repo_kind" in raw:
        try:
            return RepoKind(raw["repo_kind"]), True
        except ValueError:
            raise SpecbuildError(
                f"unknown repo_kind {raw['repo_kind']!r} in a repository manifest",
                expected=" | ".join(k.value for k in RepoKind),
                found=repr(raw["repo_kind"]),
                fix="regenerate the repository with this specbuild (`specbuild repo BUILD_DIR OUT`)",
            ) from None
    return RepoKind.of_backend(raw["backend"]), False
