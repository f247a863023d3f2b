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
"""

from __future__ import annotations

from typing import Any

import yaml

from specbuild.core.errors import DeployError
from specbuild.deploy import k8s

API = "nvidia.com/v1alpha1"
# The tag of the upstream agg-with-config example; pair it with your Dynamo operator's release (--image).
DEFAULT_IMAGE = "nvcr.io/nvidia/ai-dynamo/tensorrtllm-runtime:0.7.0.post1"
CONFIG_DIR = "/specbuild-config"
CONFIG_KEY = "engine.yaml"
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


def dynamo_graph(
    options: dict[str, Any],
    *,
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
    image = image or DEFAULT_IMAGE
    config = k8s.config_map(f"{name}-engine-config", labels, {CONFIG_KEY: options_yaml(options)})
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
                "command": ["python3", "-m", "dynamo.trtllm"],
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
