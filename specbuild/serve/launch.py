"""GPU hosts: the commands that serve a repository with the TensorRT-LLM Triton container.

Pure argv builders (no server is started; `specbuild serve REPO --print-launch` prints them):
* `container_image(trtllm_version)`: `nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3`
  whose TensorRT-LLM matches the engines (core/facts/trtllm.py: the tensorrtllm_backend
  Dockerfile pins and the NGC matrix; 1.2.1 defaults to 26.04);
* `docker_argv(...)`: the container run line (host network, shm, memlock/stack ulimits, all
  GPUs, read-only mounts of the host folders only: the repository, the engine folders (the build
  folder at `--engine-root` when the repository was built with one) and the tokenizer folder;
  never anything under /opt/tritonserver, which is the container's own);
* `mpirun_argv(...)`: what tensorrtllm_backend's `scripts/launch_triton_server.py` runs
  (triton.md §4.1), written out so it needs no script inside the container. Leader mode
  (Medusa): one tritonserver per MPI rank, world size = target tp*pp, only rank 0 serves.
  Orchestrator mode (draft/target, several TensorRT-LLM models): world size 1 with
  `TRTLLM_ORCHESTRATOR=1`; the orchestrator spawns each model's workers (MPI_Comm_spawn).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specbuild.core.artifacts import RepoManifest, read_repo_manifest
from specbuild.core.deployment import RepoKind
from specbuild.core.errors import ServerError, SpecbuildError
from specbuild.core.facts.trtllm import containers, known_versions
from specbuild.core.formats.safe_io import read_text
from specbuild.core.launch import STACK_BYTES, tritonserver_argv
from specbuild.core.methods import Method, method_of, parse_method
from specbuild.model_repo.configs import parse_text

IMAGE_REPO = "nvcr.io/nvidia/tritonserver"
IMAGE_SUFFIX = "trtllm-python-py3"
SHM_SIZE = "2g"  # the Python backend (pre/post-processing, BLS) moves tensors through /dev/shm


@dataclass(frozen=True, kw_only=True)
class LaunchLayout:
    """What decides the launch: the engines' TensorRT-LLM version and their parallel layout."""

    trtllm_version: str
    mode: Method
    target_world_size: int = 1  # target tp * pp
    draft_world_size: int = 1  # draft tp * pp (methods with a draft model)
    num_gpus: int = 1  # GPUs the deployment uses (serving.num_gpus or the larger world size)

    @property
    def multi_model(self) -> bool:
        """Draft and target are two TensorRT-LLM models: orchestrator mode (`--multi-model`)."""
        return method_of(self.mode).draft_model

    @property
    def world_size(self) -> int:
        """MPI ranks started by mpirun: 1 in orchestrator mode, the target's tp*pp in leader mode."""
        return 1 if self.multi_model else self.target_world_size

    @classmethod
    def from_spec_dict(cls, spec: dict[str, Any]) -> LaunchLayout:
        """From a resolved spec (`BuildSpec.to_dict()`, as the manifests record it)."""

        def world(section: dict[str, Any] | None) -> int:
            return int(section.get("tp_size", 1)) * int(section.get("pp_size", 1)) if section else 1

        target, draft = world(spec.get("target")), world(spec.get("draft"))
        gpus = (spec.get("serving") or {}).get("num_gpus") or max(target, draft)
        return cls(
            trtllm_version=str(spec["trtllm_version"]),
            mode=parse_method(spec["mode"]),
            target_world_size=target,
            draft_world_size=draft,
            num_gpus=int(gpus),
        )


def container_tags(trtllm_version: str) -> tuple[str, ...]:
    """NGC tags whose TensorRT-LLM is `trtllm_version` (core/facts/trtllm.py, with sources)."""
    return _containers(trtllm_version).tags


def _containers(trtllm_version: str):
    found = containers(trtllm_version)
    if found is None:
        raise ServerError(
            f"no Triton TensorRT-LLM container is known for TensorRT-LLM {trtllm_version}",
            expected="one of " + ", ".join(known_versions()),
            found=trtllm_version,
            fix="set trtllm_version in the spec to a released version (1.2.1 pairs with 26.04-26.07), or "
            "pass --container-tag",
        )
    return found


def container_image(trtllm_version: str, *, tag: str | None = None) -> str:
    """The image whose TensorRT-LLM built the engines: its default tag (1.2.1: 26.04) unless `tag`."""
    return f"{IMAGE_REPO}:{tag or _containers(trtllm_version).default}-{IMAGE_SUFFIX}"


@dataclass(frozen=True)
class Mount:
    """A host folder and where the container sees it (read-only)."""

    host: Path
    container: str

    def __post_init__(self) -> None:
        if (
            not Path(self.container).is_absolute()
            or self.container.rstrip("/") in ("", CONTAINER_ROOT)
            or self.container.startswith(CONTAINER_ROOT + "/")
        ):
            raise ServerError(
                f"cannot mount {self.host} at {self.container} in the container",
                expected=f"an absolute path outside {CONTAINER_ROOT} (the container's own files)",
                found=self.container,
                fix="regenerate the repository with another --engine-root / --tokenizer-dir",
            )


def docker_argv(image: str, *, mounts: list[Mount], env: dict[str, str]) -> list[str]:
    """`docker run` up to and including the image; the server command follows it."""
    argv = [
        "docker",
        "run",
        "--rm",
        "-it",
        "--net",
        "host",
        f"--shm-size={SHM_SIZE}",
        "--ulimit",
        "memlock=-1",
        "--ulimit",
        f"stack={STACK_BYTES}",
        "--gpus",
        "all",
    ]
    for m in sorted(set(mounts), key=lambda m: (m.container, str(m.host))):
        argv += ["-v", f"{m.host}:{m.container}:ro"]
    for key, value in sorted(env.items()):
        argv += ["-e", f"{key}={value}"]
    return argv + [image]


def orchestrator_env(layout: LaunchLayout) -> dict[str, str]:
    """Env of `--multi-model` (orchestrator spawns the workers itself: SPAWN_PROCESSES=1)."""
    if not layout.multi_model:
        return {}
    return {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}


def mpirun_argv(
    layout: LaunchLayout,
    repo: Path,
    *,
    host: str = "127.0.0.1",
    grpc_port: int = 8001,
    http_port: int = 8000,
    metrics_port: int = 8002,
    log_file: str | None = None,
    trtllm_models: tuple[str, ...] = ("tensorrt_llm",),
    hosts: tuple[str, ...] = (),
    rsh_agent: str | None = None,
) -> list[str]:
    """The MPI launch of tritonserver inside the container (launch_triton_server.py's command).

    `hosts` ("name:slots", one per node) and `rsh_agent` spread leader mode over several nodes, as
    the LeaderWorkerSet TensorRT-LLM example (kubernetes-sigs/lws v0.10.0 docs/examples/tensorrt-llm)
    does: `--host` lists the group's pods and OpenMPI's `plm_rsh_agent` starts the remote ranks.
    Orchestrator mode spawns its workers on the local node only (tensorrtllm_backend README), so it
    takes no hosts.
    """
    if hosts and layout.multi_model:
        raise ServerError(
            "orchestrator mode (--multi-model) runs on one node",
            expected="leader mode (one TensorRT-LLM model) to span nodes",
            found=f"{layout.mode} with hosts {', '.join(hosts)}",
            fix="serve draft/target on one node, or use the LLM-API flow / vLLM for several nodes",
        )
    argv = ["mpirun", "--allow-run-as-root"]
    if rsh_agent:
        argv += ["-mca", "plm_rsh_agent", rsh_agent]
    if hosts:
        argv += ["-np", str(layout.world_size), "--host", ",".join(hosts)]
    for rank in range(layout.world_size):
        if rank:
            argv.append(":")
        argv += [
            "-n",
            "1",
            *tritonserver_argv(
                str(repo), host=host, grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port
            ),
        ]
        if log_file and rank == 0:
            argv += ["--log-verbose=3", f"--log-file={log_file}"]
        if rank:  # workers load only the TensorRT-LLM models; rank 0 serves the rest
            argv += ["--model-control-mode=explicit"] + [f"--load-model={m}" for m in trtllm_models]
        if layout.multi_model:  # orchestrator: no CUDA pools in the server process, workers own the GPUs
            argv += ["--pinned-memory-pool-byte-size=0", "--enable-peer-access=false"]
            argv += [f"--cuda-memory-pool-byte-size={gpu}:0" for gpu in range(layout.num_gpus)]
        argv += [
            "--disable-auto-complete-config",
            f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
        ]
    return argv


# config.pbtxt parameters that name host folders the server reads: the engines and the tokenizer.
# Everything else that looks like a path (executor_worker_path) is inside the container.
MOUNTED_PARAMETERS = ("gpt_model_path", "tokenizer_dir")
CONTAINER_ROOT = "/opt/tritonserver"


def repo_mounts(repo: Path) -> list[Mount]:
    """The repository (same path inside), the engine folders and the tokenizer folder, each once.

    With `repo --engine-root ROOT` the build folder is mounted at ROOT, and with a container
    `--tokenizer-dir` the host tokenizer folder at that path (the repository's specbuild.json records
    both host folders); other absolute paths are host paths mounted at the same place.
    """
    repo = Path(repo).resolve()
    manifest = _manifest(repo)
    mounts = [Mount(repo, str(repo))]
    root, build = manifest.engine_root, manifest.build_dir
    if root and build:
        mounts.append(Mount(Path(build), str(root)))
    served_tok = manifest.layout.get("tokenizer_dir")
    host_tok = str(manifest.tokenizer_dir_host) if manifest.tokenizer_dir_host else None
    for config in sorted(repo.glob("*/config.pbtxt")):
        try:
            parsed = parse_text(read_text(config, kind="config", what="model configuration"))
        except Exception as exc:  # a broken config: `repo check` explains it
            raise ServerError(
                f"cannot read {config}",
                expected="a valid config.pbtxt",
                found=str(exc)[:200],
                fix="run `specbuild repo check REPO`, or regenerate the repository",
            ) from None
        for key in MOUNTED_PARAMETERS:
            value = parsed.parameters[key].string_value if key in parsed.parameters else ""
            if not value.startswith("/") or value == CONTAINER_ROOT or value.startswith(CONTAINER_ROOT + "/"):
                continue
            if root and build and (value == root or value.startswith(str(root).rstrip("/") + "/")):
                continue  # inside the mounted build folder
            if key == "tokenizer_dir" and host_tok and value == served_tok and served_tok != host_tok:
                mounts.append(Mount(Path(host_tok), value))
            else:
                mounts.append(Mount(Path(value), value))
    return _drop_nested(mounts)


def _drop_nested(mounts: list[Mount]) -> list[Mount]:
    """Keep each mount once, and none that a broader mount already shows at the same place."""
    out: list[Mount] = []
    for m in sorted(set(mounts), key=lambda m: len(m.container)):
        covered = any(
            Path(m.container).is_relative_to(o.container)
            and m.host == o.host / Path(m.container).relative_to(o.container)
            for o in out
        )
        if not covered:
            out.append(m)
    return sorted(out, key=lambda m: m.container)


def _manifest(repo: Path) -> RepoManifest:
    try:
        return read_repo_manifest(repo)
    except SpecbuildError as exc:
        raise ServerError(
            f"cannot read the deployment layout of {repo}",
            expected=f'{Path(repo) / "specbuild.json"} with the resolved build spec under "spec" (written by '
            "`specbuild repo`)",
            found=exc.what,
            fix="generate the repository with `specbuild repo BUILD_DIR --out REPO`",
        ) from None


def read_layout(repo: Path) -> LaunchLayout:
    """The layout recorded in the repository's specbuild.json (its resolved spec)."""
    manifest = _manifest(repo)
    try:
        layout = LaunchLayout.from_spec_dict(manifest.spec)
        # `repo --trtllm-version V` names the serving container's TensorRT-LLM; the manifest records it
        return replace(layout, trtllm_version=manifest.trtllm_version)
    except (SpecbuildError, ValueError, KeyError, TypeError, AttributeError) as exc:
        found = exc.what if isinstance(exc, SpecbuildError) else f"{type(exc).__name__}: {exc}"
        raise ServerError(
            f"cannot read the deployment layout of {repo}",
            expected=f'{Path(repo) / "specbuild.json"} with the resolved build spec under "spec" (written by '
            "`specbuild repo`)",
            found=found,
            fix="generate the repository with `specbuild repo BUILD_DIR --out REPO`",
        ) from None


def launch_commands(repo: Path, *, tag: str | None = None, **server: Any) -> list[list[str]]:
    """[docker run ... image mpirun ...] for `repo`: one argv, ready for shlex.join."""
    kind = _manifest(repo).kind
    if kind.local:  # its tensorrt_llm is specbuild's stand-in on the reference engine: not in the container
        raise ServerError(
            f"{repo} is a local repository (repo_kind {kind.value}) for the bundled CPU tritonserver",
            expected="a repository for a GPU container (`specbuild repo BUILD_DIR OUT --backend "
            f"{RepoKind.of(kind.flow, local=False).backend}`)",
            found=f"repo_kind {kind.value} (--backend {kind.backend}): {kind.stand_in} stands in for "
            "tensorrt_llm",
            fix="serve it here with `specbuild serve REPO`, or generate the container's repository from the "
            "same build",
        )
    layout = read_layout(repo)
    image = container_image(layout.trtllm_version, tag=tag)
    run = docker_argv(image, mounts=repo_mounts(repo), env=orchestrator_env(layout))
    return [run + mpirun_argv(layout, Path(repo).resolve(), **server)]


def format_commands(commands: list[list[str]]) -> str:
    return "\n".join(shlex.join(argv) for argv in commands)
