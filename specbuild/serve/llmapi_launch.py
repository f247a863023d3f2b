"""GPU hosts, LLM-API flow: the launch lines of an LLM-API build or repository (`serve --print-launch`).

Composed from the pure argv builders of core/launch.py (the one source of the argv; deployment
manifests use the same functions):
* a `compile --flow llmapi` build folder -> `docker run` of the TensorRT-LLM release image +
  the build's exact `trtllm-serve` command (from its manifest, as serve.sh runs it);
* an LLM-API repository (`repo --backend llmapi`) -> `docker run` of the Triton TensorRT-LLM
  container + tritonserver. The repository is mounted read-only; the launch stages it in /tmp with
  the container's own model.py / helpers.py (/app/all_models/llmapi, matched to its TensorRT-LLM);
* `nodes > 1`: the same command under `srun` / `mpirun` with `trtllm-llmapi-launch`, one rank per GPU.
Each line comes with a title; the model folders the options name are mounted at the same paths.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

import yaml

from specbuild.core.artifacts import BuildManifest, RepoManifest, read_artifact
from specbuild.core.errors import ServerError
from specbuild.core.formats.safe_io import read_text
from specbuild.core.launch import (
    PREFLIGHT_FILE,
    llmapi_docker_argv,
    llmapi_launch_argv,
    preflight_argv,
    release_image,
    triton_llmapi_argv,
)
from specbuild.model_repo.configs import CONTAINER_LLMAPI_MODEL
from specbuild.model_repo.tensors import LLMAPI_MODEL, LLMAPI_OPTIONS
from specbuild.serve.launch import container_image

STAGED_REPO = "/tmp/llmapi_repo"  # the writable copy tritonserver serves inside the container


@dataclass(frozen=True)
class LaunchLine:
    title: str
    argv: list[str]


def is_llmapi(path: Path) -> bool:
    """A `compile --flow llmapi` build or an LLM-API repository (what the LLM-API launch serves)."""
    try:
        artifact = read_artifact(path)
    except Exception:  # noqa: BLE001 - not one of ours: the engine-flow launch explains
        return False
    if isinstance(artifact, BuildManifest):
        return not artifact.flow.builds_engines  # trtllm-serve reads the HF folders
    return isinstance(artifact, RepoManifest) and artifact.kind.llmapi


def llmapi_launch_lines(
    path: Path,
    *,
    tag: str | None = None,
    host: str = "127.0.0.1",
    port: int = 8000,
    grpc_port: int = 8001,
    http_port: int = 8000,
    metrics_port: int = 8002,
    nodes: int = 1,
    gpus_per_node: int | None = None,
    launcher: str = "srun",
) -> list[LaunchLine]:
    path = Path(path).resolve()
    artifact = read_artifact(path)
    if isinstance(artifact, BuildManifest):
        return _trtllm_serve_lines(
            artifact, tag=tag, host=host, port=port, nodes=nodes, gpus=gpus_per_node, launcher=launcher
        )
    if isinstance(artifact, RepoManifest):
        return _triton_lines(
            artifact,
            tag=tag,
            host=host,
            ports=(grpc_port, http_port, metrics_port),
            nodes=nodes,
            gpus=gpus_per_node,
            launcher=launcher,
        )
    raise ServerError(
        f"{path} is neither an LLM-API build nor an LLM-API repository",
        expected="a folder from `specbuild compile --flow llmapi` or `specbuild repo --backend llmapi`",
        found="another folder",
        fix="pass the build or repository folder",
    )


def _model_mounts(models: dict[str, str]) -> list[tuple[str, str]]:
    return [(p, p) for p in sorted(set(models.values())) if p.startswith("/")]


def _world(options: dict) -> int:
    return int(options.get("tensor_parallel_size", 1)) * int(options.get("pipeline_parallel_size", 1))


def _multi_node(
    command: list[str], *, world: int, nodes: int, gpus: int | None, launcher: str
) -> LaunchLine | None:
    if nodes <= 1:
        return None
    per_node = gpus or -(-world // nodes)
    return LaunchLine(
        f"multi-node ({nodes} nodes x {per_node} GPUs, inside the same container on every node): "
        "trtllm-llmapi-launch runs the server on rank 0 and workers elsewhere",
        llmapi_launch_argv(command, nodes=nodes, gpus_per_node=per_node, launcher=launcher),
    )


def _trtllm_serve_lines(build: BuildManifest, *, tag, host, port, nodes, gpus, launcher) -> list[LaunchLine]:
    info = build.llmapi or {}
    serve = list(info.get("trtllm_serve") or [])
    if not serve:
        raise ServerError(
            f"{build.folder} records no trtllm-serve command", fix="re-run `specbuild compile --flow llmapi`"
        )
    serve = _with(serve, "--host", host)
    serve = _with(serve, "--port", str(port))
    models = {k: str(v) for k, v in (info.get("models") or {}).items()}
    mounts = [(str(build.folder), str(build.folder)), *_model_mounts(models)]
    image = release_image(build.spec.trtllm_version, tag=tag)
    preflight = list(info.get("preflight") or [])
    if not preflight:
        raise ServerError(
            f"{build.folder} records no preflight (a build from before the container preflight)",
            fix="re-run `specbuild compile --flow llmapi`",
        )
    command = ["bash", "-c", f"{shlex.join(preflight)} && exec {shlex.join(serve)}"]
    lines = [
        LaunchLine(
            f"trtllm-serve (OpenAI API on {host}:{port}) in the TensorRT-LLM "
            f"{build.spec.trtllm_version} release container, after the options preflight",
            llmapi_docker_argv(image, mounts=mounts) + command,
        )
    ]
    world = int(build.spec.target.tp_size) * int(build.spec.target.pp_size)
    multi = _multi_node(command, world=world, nodes=nodes, gpus=gpus, launcher=launcher)
    return lines + ([multi] if multi else [])


def _with(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    return out


def _triton_lines(repo: RepoManifest, *, tag, host, ports, nodes, gpus, launcher) -> list[LaunchLine]:
    if repo.kind.local:
        raise ServerError(
            f"{repo.folder} is a local LLM-API repository (the reference engine on CPU)",
            expected="a repository from `specbuild repo --backend llmapi` for a GPU container",
            found=f"backend {repo.kind.backend}",
            fix="serve it here with `specbuild serve`, or generate --backend llmapi from the same build",
        )
    options_path = repo.folder / LLMAPI_MODEL / "1" / LLMAPI_OPTIONS
    options = yaml.safe_load(read_text(options_path, kind="config", what="model.yaml")) or {}
    spec_cfg = options.get("speculative_config") or {}
    models = {"target": str(options.get("model", ""))}
    if spec_cfg.get("speculative_model"):
        models["speculative_model"] = str(spec_cfg["speculative_model"])
    folder = str(repo.folder)
    mounts = [(folder, folder), *_model_mounts(models)]
    image = container_image(repo.trtllm_version, tag=tag)
    grpc, http, metrics = ports
    server = triton_llmapi_argv(STAGED_REPO, host=host, grpc_port=grpc, http_port=http, metrics_port=metrics)
    version_dir = f"{STAGED_REPO}/{LLMAPI_MODEL}/1"
    preflight = preflight_argv(
        f"{version_dir}/{PREFLIGHT_FILE}",
        f"{version_dir}/{LLMAPI_OPTIONS}",
        version=repo.trtllm_version,
        drop=("triton_config",),
    )
    stage = (
        f"rm -rf {STAGED_REPO} && cp -R {shlex.quote(folder)} {STAGED_REPO} && "
        f"cp {CONTAINER_LLMAPI_MODEL}/*.py {version_dir}/ && {shlex.join(preflight)} && "
        f"exec {shlex.join(server)}"
    )
    docker = llmapi_docker_argv(image, mounts=mounts)
    lines = [
        LaunchLine(
            f"Triton (LLM-API model, gRPC {host}:{grpc}) in {image}; model.py from the container",
            docker + ["bash", "-c", stage],
        )
    ]
    multi = _multi_node(
        ["bash", "-c", stage], world=_world(options), nodes=nodes, gpus=gpus, launcher=launcher
    )
    return lines + ([multi] if multi else [])


def format_lines(lines: list[LaunchLine]) -> str:
    return "\n".join(f"# {line.title}\n{shlex.join(line.argv)}" for line in lines)
