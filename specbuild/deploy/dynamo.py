"""The LLM-API flow on NVIDIA Dynamo: a DynamoGraphDeployment (nvidia.com/v1alpha1) whose TensorRT-LLM
worker runs `python3 -m dynamo.trtllm` with the LLM-API options YAML (the same `speculative_config` as
`trtllm-serve --config`) mounted from a ConfigMap and passed as `--extra-engine-args`.

The interface is the options dict (what `compile --flow llmapi` writes as its options YAML) + an image +
the model path: this module does not build options itself. Field names follow the Dynamo operator's
v1alpha1 Go types (deploy/operator/api/v1alpha1/dynamocomponentdeployment_types.go @1d26d92, common.go
@647025f, dynamographdeployment_types.go) and the upstream TensorRT-LLM examples
(examples/backends/trtllm/deploy/agg-with-config.yaml @179449f: ConfigMap + --extra-engine-args;
agg_failover_eagle.yaml @7e74881: a speculative worker). Worker flags: docs.nvidia.com/dynamo/v1.6.0
(TensorRT-LLM configuration): --model-path, --served-model-name, --tensor-parallel-size,
--pipeline-parallel-size, --extra-engine-args.

Image pairing: each Dynamo release ships one TensorRT-LLM in its tensorrtllm-runtime image
(`DYNAMO_TRTLLM`, from Dynamo's support matrix). The options are written for the spec's TensorRT-LLM,
so a listed image that ships another version is refused (expected / found / fix), and with no --image
the default is the listed image that ships the spec's version, if any. An image not listed is taken
as given: the worker runs the options preflight first (core/llmapi_preflight.py, from the ConfigMap),
which stops the pod in seconds, naming the installed version, when it is not the one written for.
"""

from __future__ import annotations

import shlex
from typing import Any

import yaml

from specbuild.core.errors import DeployError
from specbuild.core.facts.llmapi_sources import DYNAMO_MATRIX
from specbuild.core.launch import preflight_argv, preflight_source
from specbuild.deploy import k8s

API = "nvidia.com/v1alpha1"
RUNTIME_IMAGE = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime"
# Dynamo release (the runtime image's tag) -> the TensorRT-LLM it ships (DYNAMO_MATRIX: the v0.9.1 support
# matrix for 0.6.0-0.9.1, the dev TensorRT-LLM page for 1.0.2, the v1.1.1 / v1.3.0 "at a glance" rows)
DYNAMO_TRTLLM = {
    "0.6.0": "1.1.0rc5",
    "0.6.1": "1.1.0rc5",
    "0.6.1.post1": "1.1.0rc5",
    "0.7.0": "1.2.0rc2",
    "0.7.0.post1": "1.2.0rc3",
    "0.7.1": "1.2.0rc3",
    "0.8.0": "1.2.0rc6.post1",
    "0.8.1": "1.2.0rc6.post1",
    "0.8.1.post1": "1.2.0rc6.post1",
    "0.8.1.post2": "1.2.0rc6.post2",
    "0.8.1.post3": "1.2.0rc6.post3",
    "0.9.0": "1.3.0rc1",
    "0.9.1": "1.3.0rc3",
    "1.0.2": "1.3.0rc5.post1",
    "1.1.1": "1.3.0rc11",
    "1.3.0": "1.3.0rc19",
}
PAIRING_SOURCE = DYNAMO_MATRIX
CONFIG_DIR = "/specbuild-config"
CONFIG_KEY = "engine.yaml"
PREFLIGHT_KEY = "preflight.py"
WORKER = "TRTLLMWorker"
FRONTEND = "Frontend"


def options_yaml(options: dict[str, Any]) -> str:
    if not isinstance(options.get("speculative_config"), dict):
        raise DeployError(
            "the LLM-API options have no speculative_config",
            expected="an options mapping with speculative_config (what `compile --flow llmapi` writes)",
            found=", ".join(sorted(options)) or "nothing",
            fix="pass the options YAML of the spec's LLM-API build",
        )
    return yaml.safe_dump(options, sort_keys=False)


def runtime_image(version: str, image: str | None) -> str:
    """The worker image for options written for TensorRT-LLM `version`: --image, or the listed Dynamo
    runtime that ships `version`; a listed image that ships another version is refused."""
    if image is None:
        paired = [tag for tag, v in DYNAMO_TRTLLM.items() if v == version]
        if not paired:
            raise DeployError(
                f"no Dynamo tensorrtllm-runtime image ships TensorRT-LLM {version}",
                expected=f"a Dynamo runtime image with TensorRT-LLM {version} (the options are for it)",
                found="Dynamo releases ship "
                + ", ".join(f"{tag}: {v}" for tag, v in DYNAMO_TRTLLM.items())
                + f" ({PAIRING_SOURCE.repo}/{PAIRING_SOURCE.path})",
                fix=f"pass --image with a Dynamo TensorRT-LLM runtime built on tensorrt-llm=={version} (its "
                "worker checks the installed version before loading), or target the release your image ships",
            )
        return f"{RUNTIME_IMAGE}:{paired[-1]}"
    repo, _, tag = image.rpartition(":")
    ships = DYNAMO_TRTLLM.get(tag) if repo == RUNTIME_IMAGE else None
    if ships is not None and ships != version:
        raise DeployError(
            f"{image} ships TensorRT-LLM {ships}, the options are written for {version}",
            expected=f"an image with TensorRT-LLM {version}",
            found=f"{image}: TensorRT-LLM {ships} ({PAIRING_SOURCE.repo}/{PAIRING_SOURCE.path})",
            fix=f"pass --image with TensorRT-LLM {version}, or set trtllm_version to what the image ships "
            "if specbuild supports it",
        )
    return image


def dynamo_graph(
    options: dict[str, Any],
    *,
    version: str,
    name: str,
    model_path: str,
    served_model_name: str | None = None,
    image: str | None = None,
    tp: int = 1,
    pp: int = 1,
    nodes: int = 1,
    replicas: int = 1,
    models_claim: str | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """{file: objects}: the ConfigMap with the options and the DynamoGraphDeployment."""
    name = k8s.k8s_name(name)
    gpus = tp * pp
    if gpus % nodes:
        raise DeployError(
            "the worker's GPUs do not split evenly over the nodes",
            expected=f"tp x pp ({gpus}) a multiple of --nodes",
            found=f"--nodes {nodes}",
            fix="change --nodes or the spec's tp_size / pp_size",
        )
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "specbuild"}
    image = runtime_image(version, image)
    config = k8s.config_map(
        f"{name}-engine-config",
        labels,
        {CONFIG_KEY: options_yaml(options), PREFLIGHT_KEY: preflight_source()},
    )
    preflight = preflight_argv(
        f"{CONFIG_DIR}/{PREFLIGHT_KEY}", f"{CONFIG_DIR}/{CONFIG_KEY}", version=version, model=model_path
    )
    # the container's own parser on the options first (seconds, no weights), then the worker
    worker_cmd = ["/bin/sh", "-c", f'{shlex.join(preflight)} && exec python3 -m dynamo.trtllm "$@"', "worker"]
    args = [
        "--model-path",
        model_path,
        "--served-model-name",
        served_model_name or model_path,
        "--tensor-parallel-size",
        str(tp),
        "--pipeline-parallel-size",
        str(pp),
        "--extra-engine-args",
        f"{CONFIG_DIR}/{CONFIG_KEY}",
    ]
    # the batch / token limits the options carry are also flags: Dynamo applies the YAML to the engine but
    # not to its own config object (trtllm-llmapi.md §9), so both say the same
    for key, flag in (
        ("max_batch_size", "--max-batch-size"),
        ("max_num_tokens", "--max-num-tokens"),
        ("max_seq_len", "--max-seq-len"),
    ):
        if options.get(key) is not None:
            args += [flag, str(options[key])]
    volumes = [{"name": "engine-config", "configMap": {"name": config["metadata"]["name"]}}]
    mounts = [{"name": "engine-config", "mountPath": CONFIG_DIR, "readOnly": True}]
    if models_claim:
        volumes.append(k8s.pvc_volume(models_claim, "models"))
        mounts.append({"name": "models", "mountPath": "/models", "readOnly": True})
    worker: dict[str, Any] = {
        "componentType": "worker",
        "replicas": replicas,
        "resources": {"limits": {"gpu": str(gpus // nodes)}, "requests": {"gpu": str(gpus // nodes)}},
        "extraPodSpec": {
            "volumes": volumes,
            "mainContainer": {
                "name": "main",
                "image": image,
                "command": worker_cmd,
                "args": args,
                "volumeMounts": mounts,
            },
        },
    }
    if nodes > 1:
        worker["multinode"] = {"nodeCount": nodes}
    frontend = {
        "componentType": "frontend",
        "replicas": 1,
        "extraPodSpec": {
            "mainContainer": {"name": "main", "image": image, "command": ["python3", "-m", "dynamo.frontend"]}
        },
    }
    graph = {
        "apiVersion": API,
        "kind": "DynamoGraphDeployment",
        "metadata": k8s.meta(name, labels),
        "spec": {"backendFramework": "trtllm", "services": {FRONTEND: frontend, WORKER: worker}},
    }
    return {"20-dynamo.yaml": [config, graph]}
