"""The LLM-API flow's launch lines as pure argv builders: the one source of truth for the argv.

`specbuild compile --flow llmapi` writes `trtllm_serve_argv` into serve.sh and plan.json,
`specbuild serve --print-launch` prints the container, Triton and multi-node variants
(serve/launch.py composes them), and deployment manifests (Kubernetes / Dynamo) build their
container commands from the same functions. Nothing here starts anything or reads files.

* `trtllm_serve_argv`: `trtllm-serve serve MODEL --host --port --backend pytorch --tp_size --pp_size
  --max_batch_size --max_num_tokens --max_seq_len --kv_cache_free_gpu_memory_fraction --config FILE`.
  The limits appear both on the command line and in the options file: the 1.2-era serve.py lets the
  file win (`llm_args | yaml`), newer CLIs let explicit flags win; equal values make the order moot.
* `llmapi_docker_argv`: `docker run` of the NGC TensorRT-LLM release image
  (nvcr.io/nvidia/tensorrt-llm/release:<version>, whose tag is the TensorRT-LLM version; the quick
  start runs it with --ipc host, --ulimit memlock=-1, --ulimit stack=67108864, --gpus all).
* `triton_llmapi_argv`: tritonserver over a repository holding Triton's LLM-API `tensorrt_llm` model
  (one process: the LLM API starts its own workers for TP/PP).
* `llmapi_launch_argv`: multi-node. `trtllm-llmapi-launch CMD` under srun/mpirun: rank 0 runs CMD
  (with the MPI environment stripped) and `mgmn_leader_node`, the other ranks `mgmn_worker_node`
  (tensorrt_llm/llmapi/trtllm-llmapi-launch @cbe4c0aed8b5).

Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specbuild.core import llmapi_preflight
from specbuild.core.errors import SpecbuildError
from specbuild.core.facts.llmapi import release

TRTLLM_SERVE = "trtllm-serve"
PREFLIGHT_FILE = "specbuild_preflight.py"  # core/llmapi_preflight.py, copied next to every LLM-API launch
LLMAPI_LAUNCH = "trtllm-llmapi-launch"
CONTAINER_TRITONSERVER = "/opt/tritonserver/bin/tritonserver"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
STACK_BYTES = 67108864  # the ulimit stack the TensorRT-LLM containers are documented with


@dataclass(frozen=True, kw_only=True)
class ServeLimits:
    """What trtllm-serve takes on its command line (the same values as the options file)."""

    tp_size: int = 1
    pp_size: int = 1
    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int
    kv_cache_free_gpu_memory_fraction: float

    @classmethod
    def from_options(cls, options: dict) -> ServeLimits:
        """From an LLM-API options dict (what `compile --flow llmapi` writes)."""
        return cls(
            tp_size=int(options.get("tensor_parallel_size", 1)),
            pp_size=int(options.get("pipeline_parallel_size", 1)),
            max_batch_size=int(options["max_batch_size"]),
            max_num_tokens=int(options["max_num_tokens"]),
            max_seq_len=int(options["max_seq_len"]),
            kv_cache_free_gpu_memory_fraction=float(options["kv_cache_config"]["free_gpu_memory_fraction"]),
        )

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size


def trtllm_serve_argv(
    model: str,
    options_file: str,
    limits: ServeLimits,
    *,
    version: str,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
) -> list[str]:
    """The exact trtllm-serve command of one deployment (every flag one `version` accepts)."""
    rel = release(version)
    argv = [
        TRTLLM_SERVE,
        "serve",
        model,
        "--host",
        host,
        "--port",
        str(port),
        "--backend",
        "pytorch",
        "--tp_size",
        str(limits.tp_size),
        "--pp_size",
        str(limits.pp_size),
        "--max_batch_size",
        str(limits.max_batch_size),
        "--max_num_tokens",
        str(limits.max_num_tokens),
        "--max_seq_len",
        str(limits.max_seq_len),
        "--kv_cache_free_gpu_memory_fraction",
        f"{limits.kv_cache_free_gpu_memory_fraction:g}",
        rel.serve_config_flag,
        options_file,
    ]
    unknown = [a for a in argv if a.startswith("--") and a not in rel.serve_flags]
    if unknown:
        raise SpecbuildError(
            f"trtllm-serve {version} does not take {', '.join(unknown)}",
            expected="flags recorded in core/facts/llmapi.py for this version",
            found=" ".join(unknown),
            fix="report this bug",
        )
    return argv


def preflight_source() -> str:
    """The text of core/llmapi_preflight.py, written as PREFLIGHT_FILE next to each launch (the
    containers have no specbuild)."""
    return Path(llmapi_preflight.__file__).read_text(encoding="utf-8")


def preflight_argv(
    script: str, options_file: str, *, version: str, model: str | None = None, drop: tuple[str, ...] = ()
) -> list[str]:
    """`python3 SCRIPT ...`: the installed release's own parser on the options file, before the server
    starts (exit 2 names the refused key, upstream's error and the installed version)."""
    parser = release(version).parser
    argv = ["python3", script, "--options", options_file, "--version", version]
    argv += ["--parser", parser.function, "--args", parser.args_class]
    if model:
        argv += ["--model", model]
    for key in drop:
        argv += ["--drop", key]
    return argv


def release_image(version: str, *, tag: str | None = None) -> str:
    """The NGC TensorRT-LLM release container of `version` (trtllm-serve and trtllm-llmapi-launch inside)."""
    image = release(version).image
    return image.rsplit(":", 1)[0] + f":{tag}" if tag else image


def llmapi_docker_argv(
    image: str, *, mounts: list[tuple[str, str]], env: dict[str, str] | None = None
) -> list[str]:
    """`docker run` up to and including the image; read-only mounts (host, container); host network so a
    loopback --host stays reachable from this host only."""
    argv = [
        "docker",
        "run",
        "--rm",
        "-it",
        "--ipc",
        "host",
        "--net",
        "host",
        "--ulimit",
        "memlock=-1",
        "--ulimit",
        f"stack={STACK_BYTES}",
        "--gpus",
        "all",
    ]
    for host, container in sorted(set(mounts), key=lambda m: (m[1], m[0])):
        argv += ["-v", f"{host}:{container}:ro"]
    for key, value in sorted((env or {}).items()):
        argv += ["-e", f"{key}={value}"]
    return argv + [image]


def tritonserver_argv(
    repo: str,
    *,
    binary: str = CONTAINER_TRITONSERVER,
    host: str = DEFAULT_HOST,
    grpc_port: int = 8001,
    http_port: int = 8000,
    metrics_port: int = 8002,
    backend_dir: str | None = None,
) -> list[str]:
    """The one tritonserver command line: the repository and the three endpoints, each bound to `host`
    (the local server adds its backend directory). Every launch (local `serve`, the engine flow's mpirun
    ranks, the LLM-API repository, deploy's pods) starts from it and appends its own flags."""
    backend = [f"--backend-directory={backend_dir}"] if backend_dir is not None else []
    return [
        str(binary),
        f"--model-repository={repo}",
        *backend,
        f"--grpc-address={host}",
        f"--grpc-port={grpc_port}",
        f"--http-address={host}",
        f"--http-port={http_port}",
        f"--metrics-address={host}",
        f"--metrics-port={metrics_port}",
    ]


def triton_llmapi_argv(
    repo: str,
    *,
    host: str = DEFAULT_HOST,
    grpc_port: int = 8001,
    http_port: int = 8000,
    metrics_port: int = 8002,
) -> list[str]:
    """tritonserver over an LLM-API repository (the model's LLM starts its own TP/PP workers)."""
    return tritonserver_argv(
        repo, host=host, grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port
    )


LAUNCHERS = ("srun", "mpirun")


def llmapi_launch_argv(
    command: list[str], *, nodes: int, gpus_per_node: int, launcher: str = "srun"
) -> list[str]:
    """Multi-node: one rank per GPU, every rank runs trtllm-llmapi-launch COMMAND (rank 0 serves)."""
    if launcher not in LAUNCHERS:
        raise SpecbuildError(
            f"unknown launcher {launcher!r}", expected=" | ".join(LAUNCHERS), found=launcher, fix="use srun"
        )
    if nodes < 1 or gpus_per_node < 1:
        raise SpecbuildError(
            "a multi-node launch needs at least one node and one GPU per node",
            expected="nodes >= 1, gpus_per_node >= 1",
            found=f"nodes {nodes}, gpus_per_node {gpus_per_node}",
            fix="pass the cluster's node count and GPUs per node",
        )
    if launcher == "srun":
        head = ["srun", "-N", str(nodes), f"--ntasks-per-node={gpus_per_node}", "--mpi=pmix"]
    else:
        head = [
            "mpirun",
            "--allow-run-as-root",
            "-np",
            str(nodes * gpus_per_node),
            "-npernode",
            str(gpus_per_node),
        ]
    return head + [LLMAPI_LAUNCH, *command]
