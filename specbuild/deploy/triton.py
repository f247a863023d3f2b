"""`specbuild deploy SPEC` for the engine flow: Triton + the TensorRT-LLM backend on Kubernetes.

Objects (docs/deploy.md):
* a PersistentVolumeClaim holding the build folder (`compile --engine trtllm --dry-run`: checkpoints +
  build.sh) at /specbuild/build, the repository (`repo BUILD --engine-root /specbuild/build
  --tokenizer-dir /specbuild/tokenizer`) at /specbuild/repo and the target's tokenizer files at
  /specbuild/tokenizer, copied in through a loader Pod (`recipe`: the steps, in the README);
* a Job that runs build.sh there on one GPU of the serving kind (trtllm-build, in the same container);
* one node: a Deployment whose pod runs the server command `serve --print-launch` prints (the same
  `mpirun_argv` / `orchestrator_env` / `container_image` of serve/launch.py), bound to the pod's
  address, with the GPUs of the spec's plan;
  several nodes (leader mode: one TensorRT-LLM model, e.g. Medusa): a LeaderWorkerSet whose leader runs
  that mpirun over the group's pods through `kubectl exec` (OpenMPI plm_rsh_agent), the way the LWS
  TensorRT-LLM example does; workers wait;
* readiness / liveness / startup probes on Triton's /v2/health/ready and /v2/health/live;
* a ClusterIP Service with the HTTP, gRPC and metrics ports;
* autoscaling: a PodMonitor, the PrometheusRule recording `triton:queue_compute:ratio` and an
  autoscaling/v2 HPA on it (needs prometheus-operator and prometheus-adapter; see docs/deploy.md).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.core.errors import DeployError
from specbuild.core.spec import BuildSpec
from specbuild.deploy import k8s
from specbuild.deploy.pods import server_labels
from specbuild.engines.trtllm.plan import build_plan
from specbuild.serve.launch import LaunchLayout, container_image, mpirun_argv, orchestrator_env

MOUNT = "/specbuild"
BUILD_DIR = f"{MOUNT}/build"
REPO_DIR = f"{MOUNT}/repo"
TOKENIZER_DIR = f"{MOUNT}/tokenizer"
# The target's tokenizer, as AutoTokenizer reads it: every file the preprocessing, postprocessing and BLS
# models may need (config.json: AutoTokenizer reads the model type from it when tokenizer_config.json names
# no tokenizer_class); the weights stay behind (the engines hold them).
TOKENIZER_FILES = (
    "config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "chat_template.jinja",
    "generation_config.json",
)
KUBESSH = "/specbuild-bin/kubessh"
STARTUP_MINUTES = 30  # engines of a 70B model take minutes to load: the startup probe waits this long


@dataclass(frozen=True)
class DeployOptions:
    name: str | None = None  # Kubernetes name (default: from the spec's name)
    nodes: int = 1
    replicas: int = 1
    max_replicas: int | None = None  # HPA ceiling (default: 4 x replicas)
    image: str | None = None  # default: the Triton TensorRT-LLM container of the spec's version
    container_tag: str | None = None
    storage: str = "1Ti"  # checkpoints + engines of the spec (a 70B model in bf16: ~140 GB each)
    storage_class: str | None = None
    shm: str = "16Gi"  # /dev/shm for the Python backend's tensors
    gpu_product: str | None = None  # nodeSelector nvidia.com/gpu.product (GPU feature discovery)


@dataclass(frozen=True)
class Manifests:
    """Files to write: name -> list of objects (one YAML document each), plus notes for the README."""

    files: dict[str, list[dict[str, Any]]]
    notes: tuple[str, ...]
    commands: dict[str, str]  # what runs where, for the README
    recipe: tuple[tuple[str, str], ...] = ()  # (what, shell command) to run before applying, in order


labels_for = server_labels  # app.kubernetes.io name / component / managed-by


def triton_manifests(spec: BuildSpec, opts: DeployOptions) -> Manifests:
    name = k8s.k8s_name(opts.name or spec.name)
    layout = LaunchLayout.from_spec_dict(spec.to_dict())
    gpus = layout.num_gpus
    image = opts.image or container_image(spec.trtllm_version, tag=opts.container_tag)
    many_nodes = opts.nodes > 1
    if many_nodes:
        _check_multinode(spec, layout, opts)
    _check_nodes(spec, opts)
    server_labels = labels_for(name, "server")
    notes = []
    pvc_name = f"{name}-models"
    volumes = [k8s.pvc_volume(pvc_name), k8s.shm_volume(opts.shm)]
    mounts = [{"name": "specbuild", "mountPath": MOUNT}, {"name": "dshm", "mountPath": "/dev/shm"}]
    node_selector = {"nvidia.com/gpu.product": opts.gpu_product} if opts.gpu_product else None

    engines = [f"{BUILD_DIR}/{p.output_dir}" for p in build_plan(spec)]
    wait_engines = " && ".join(
        f'[ -f {e}/config.json ] && ! grep -q \'"specbuild_engine": "reference"\' {e}/config.json'
        for e in engines
    )
    init = {
        "name": "wait-for-engines",
        "image": image,
        "command": [
            "sh",
            "-c",
            f"until {wait_engines}; do echo waiting for the engine build Job; sleep 10; done",
        ],
        "volumeMounts": [mounts[0]],
    }
    ports = k8s.Ports()
    container_ports = [
        {"name": "http", "containerPort": ports.http},
        {"name": "grpc", "containerPort": ports.grpc},
        {"name": "metrics", "containerPort": ports.metrics},
    ]
    probes = {
        "readinessProbe": k8s.http_probe("/v2/health/ready", ports.http, period=10, failures=3),
        "livenessProbe": k8s.http_probe("/v2/health/live", ports.http, period=10, failures=6),
        "startupProbe": k8s.http_probe(
            "/v2/health/ready", ports.http, period=10, failures=STARTUP_MINUTES * 6
        ),
    }
    env = [{"name": k, "value": v} for k, v in sorted(orchestrator_env(layout).items())]
    server_kw = dict(host="0.0.0.0", grpc_port=ports.grpc, http_port=ports.http, metrics_port=ports.metrics)
    files: dict[str, list[dict[str, Any]]] = {}
    files["00-storage.yaml"] = [
        k8s.pvc(
            pvc_name,
            labels_for(name, "storage"),
            size=opts.storage,
            many_nodes=many_nodes or opts.replicas > 1,
            storage_class=opts.storage_class,
        )
    ]
    build_pod = {
        "containers": [
            {
                "name": "trtllm-build",
                "image": image,
                "command": ["bash", f"{BUILD_DIR}/build.sh"],
                "resources": k8s.gpu_resources(1),
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    if node_selector:
        build_pod["nodeSelector"] = node_selector
    files["05-loader.yaml"] = [_loader_pod(name, image, volumes[0], mounts[0])]
    files["10-build-job.yaml"] = [k8s.job(f"{name}-build", labels_for(name, "build"), build_pod)]

    if not many_nodes:
        argv = mpirun_argv(layout, Path(REPO_DIR), **server_kw)
        pod = {
            "initContainers": [init],
            "containers": [
                {
                    "name": "tritonserver",
                    "image": image,
                    "command": argv,
                    "env": env,
                    "ports": container_ports,
                    "resources": k8s.gpu_resources(gpus),
                    "volumeMounts": mounts,
                    **probes,
                }
            ],
            "volumes": volumes,
        }
        if node_selector:
            pod["nodeSelector"] = node_selector
        files["20-server.yaml"] = [k8s.deployment(name, server_labels, pod, replicas=opts.replicas)]
        selector = server_labels
        target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}
        commands = {"server": shlex.join(argv)}
    else:
        per_node = gpus // opts.nodes
        hosts = tuple(
            [f"{name}-$(GROUP_INDEX):{per_node}"]
            + [f"{name}-$(GROUP_INDEX)-{j}:{per_node}" for j in range(1, opts.nodes)]
        )
        argv = mpirun_argv(layout, Path(REPO_DIR), hosts=hosts, rsh_agent=KUBESSH, **server_kw)
        workers = " ".join(f"{name}-$(GROUP_INDEX)-{j}" for j in range(1, opts.nodes))
        wait = (
            f"for p in {workers}; do until kubectl get pod \"$p\" -o jsonpath='{{.status.phase}}' "
            "2>/dev/null "
            '| grep -qx Running; do echo "waiting for $p"; sleep 5; done; done'
        )
        script = f"{wait}\nexec {shlex.join(argv)}"
        group_env = [
            {
                "name": "GROUP_INDEX",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{k8s.LWS_GROUP_INDEX_LABEL}']"}},
            }
        ]
        bin_volume = {"name": "specbuild-bin", "configMap": {"name": f"{name}-bin", "defaultMode": 0o555}}
        bin_mount = {"name": "specbuild-bin", "mountPath": "/specbuild-bin", "readOnly": True}
        leader = {
            "serviceAccountName": name,
            "initContainers": [init],
            "containers": [
                {
                    "name": "tritonserver",
                    "image": image,
                    "command": ["sh", "-c", script],
                    "env": group_env + env,
                    "ports": container_ports,
                    "resources": k8s.gpu_resources(per_node),
                    "volumeMounts": [*mounts, bin_mount],
                    **probes,
                }
            ],
            "volumes": [*volumes, bin_volume],
        }
        worker = {
            "serviceAccountName": name,
            "containers": [
                {
                    "name": "worker",
                    "image": image,
                    # the leader's mpirun starts this node's ranks in here (kubectl exec); until then, wait
                    "command": ["sh", "-c", "exec sleep infinity"],
                    "resources": k8s.gpu_resources(per_node),
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        }
        if node_selector:
            leader["nodeSelector"] = worker["nodeSelector"] = node_selector
        kubessh = '#!/bin/sh\n# OpenMPI plm_rsh_agent: run the remote command in pod $1\npod="$1"\nshift\n'
        kubessh += 'exec kubectl exec "$pod" -- /bin/sh -c "$*"\n'
        files["20-server.yaml"] = [
            *k8s.rbac_exec(name, server_labels),
            k8s.config_map(f"{name}-bin", server_labels, {"kubessh": kubessh}),
            k8s.leader_worker_set(
                name, server_labels, replicas=opts.replicas, size=opts.nodes, leader=leader, worker=worker
            ),
        ]
        selector = {k8s.LWS_NAME_LABEL: name, "role": "leader"}
        target = {"apiVersion": k8s.LWS_API, "kind": "LeaderWorkerSet", "name": name}
        commands = {"leader": script, "worker": "exec sleep infinity"}
        notes.append(
            "the leader needs kubectl in its image (the stock Triton image has none): build one as the LWS "
            "TensorRT-LLM example's Dockerfile does and pass --image"
        )
    files["30-service.yaml"] = [
        k8s.service(
            name, server_labels, selector, {"http": ports.http, "grpc": ports.grpc, "metrics": ports.metrics}
        )
    ]
    files["40-autoscaling.yaml"] = [
        k8s.pod_monitor(name, server_labels, selector),
        k8s.prometheus_rule(f"{name}-triton", server_labels),
        k8s.hpa(name, server_labels, target, max_replicas=opts.max_replicas or 4 * opts.replicas),
    ]
    commands["build"] = f"bash {BUILD_DIR}/build.sh"
    return Manifests(files, tuple(notes), commands, recipe(spec, name, list(files)))


def recipe(spec: BuildSpec, name: str, files: list[str]) -> tuple[tuple[str, str], ...]:
    """The steps before the server starts: on the build host, the build folder, the repository with the
    pod's paths (engines under BUILD_DIR, tokenizer TOKENIZER_DIR) and the tokenizer files; in the cluster,
    the volume, the loader Pod that the three folders are copied through, then the rest."""
    spec_path = shlex.quote(str(spec.source)) if spec.source else "SPEC"
    loader = f"{name}-loader"
    source = (
        "python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[\"tokenizer_dir\"])' "
        "build/specbuild.json"
    )
    copy = (
        f'src="$({source})" && mkdir tokenizer && for f in {" ".join(TOKENIZER_FILES)}; '
        'do if [ -f "$src/$f" ]; then cp "$src/$f" tokenizer/; fi; done'
    )
    rest = [f for f in files if f not in ("00-storage.yaml", "05-loader.yaml")]
    return (
        (
            "build host: the checkpoints and build.sh",
            f"specbuild compile {spec_path} --engine trtllm --dry-run --out build",
        ),
        (
            "build host: the repository with the pod's paths",
            f"specbuild repo build build --out repo --backend tensorrtllm --engine-root {BUILD_DIR} "
            f"--tokenizer-dir {TOKENIZER_DIR}",
        ),
        ("build host: the target's tokenizer files (no weights)", copy),
        (
            "cluster: the volume and the loader Pod",
            f"kubectl apply -f 00-storage.yaml -f 05-loader.yaml && kubectl wait --for=condition=Ready "
            f"pod/{loader} --timeout=10m",
        ),
        (
            "cluster: copy the three folders in",
            " && ".join(f"kubectl cp {d} {loader}:{MOUNT}/{d}" for d in ("build", "repo", "tokenizer")),
        ),
        ("cluster: the loader is no longer needed", f"kubectl delete pod {loader}"),
        (
            "cluster: build the engines (Job), then serve",
            "kubectl apply " + " ".join(f"-f {f}" for f in rest),
        ),
    )


def _loader_pod(name: str, image: str, volume: dict[str, Any], mount: dict[str, Any]) -> dict[str, Any]:
    """A Pod that mounts the models volume and waits: `kubectl cp` copies the folders in through it (the
    image has tar); no GPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": k8s.meta(f"{name}-loader", labels_for(name, "loader")),
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "loader",
                    "image": image,
                    "command": ["sh", "-c", "exec sleep infinity"],
                    "volumeMounts": [mount],
                }
            ],
            "volumes": [volume],
        },
    }


def _check_nodes(spec: BuildSpec, opts: DeployOptions) -> None:
    """The engines are built for the spec's serving.nodes (mapping.gpus_per_node, gpu_device_ids)."""
    if opts.nodes != spec.serving.nodes:
        raise DeployError(
            f"the spec's engines are built for {spec.serving.nodes} node(s) per replica",
            expected=f"--nodes {spec.serving.nodes} (serving.nodes: the engines' mapping.gpus_per_node "
            f"{spec.gpus_per_node} and the repository's gpu_device_ids follow it)",
            found=f"--nodes {opts.nodes}",
            fix=f"set serving.nodes: {opts.nodes} in the spec and re-run compile and repo build (the "
            f"README's recipe), or deploy with --nodes {spec.serving.nodes}",
        )


def _check_multinode(spec: BuildSpec, layout: LaunchLayout, opts: DeployOptions) -> None:
    if layout.multi_model:
        raise DeployError(
            f"{spec.mode} serves two TensorRT-LLM models (draft and target): orchestrator mode, one node "
            "only",
            expected="--nodes 1 for the engine flow (orchestrator mode spawns its workers with "
            "MPI_Comm_spawn on the local node: tensorrtllm_backend README, 'Orchestrator Mode')",
            found=f"--nodes {opts.nodes}",
            fix="deploy on one node, or across nodes with --engine vllm (LeaderWorkerSet + Ray) or the "
            "LLM-API flow (Dynamo)",
        )
    gpus = layout.num_gpus
    if gpus % opts.nodes or layout.world_size != gpus:
        raise DeployError(
            "the spec's GPUs do not split evenly over the nodes",
            expected=f"tp x pp ({layout.world_size}) GPUs, a multiple of --nodes",
            found=f"{gpus} GPUs over {opts.nodes} nodes",
            fix="change --nodes or the spec's tp_size / pp_size",
        )
    if opts.image is None:
        raise DeployError(
            "a multi-node Triton deployment needs an image with kubectl",
            expected="--image: the Triton TensorRT-LLM container plus kubectl (the leader starts the other "
            "nodes' ranks with `kubectl exec`, as the LWS TensorRT-LLM example does)",
            found="the stock image (no kubectl)",
            fix="build FROM "
            + container_image(spec.trtllm_version, tag=opts.container_tag)
            + " with kubectl added and pass --image",
        )
