"""Kubernetes object builders (plain dicts, written as YAML): the pieces every `specbuild deploy` layout
shares. Core objects follow the Kubernetes API (tests validate them with kubernetes-validate, strict);
LeaderWorkerSet follows kubernetes-sigs/lws v0.10.0; PrometheusRule / PodMonitor follow the
prometheus-operator `monitoring.coreos.com/v1` API (not validated here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from specbuild.core.errors import DeployError

LWS_API = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/group-index"
GPU_RESOURCE = "nvidia.com/gpu"
NAME_MAX = 40  # leaves room for suffixes (-engines, -build, LWS pod names <name>-<i>-<j>) under 63


def k8s_name(name: str) -> str:
    """A DNS-1123 label from a spec name (lower case, [a-z0-9-], starts and ends alphanumeric)."""
    out = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:NAME_MAX].strip("-")
    if not out:
        raise DeployError(
            f"spec name {name!r} gives no Kubernetes name",
            expected="letters or digits",
            found=name,
            fix="pass --name NAME",
        )
    return out


# A resource.Quantity (k8s.io/apimachinery/pkg/api/resource/quantity.go): a decimal number and a binary
# (Ki..Ei), decimal (n, u, m, k, M..E) or exponent (e3, E-2) suffix.
_QUANTITY = re.compile(
    r"\+?(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?"
)


def check_quantity(text: str, *, option: str) -> str:
    """`text` when it is a positive Kubernetes quantity (1Ti, 500Gi, 2e12)."""
    match = _QUANTITY.fullmatch(text)
    if not match or float(match["number"]) == 0:
        raise DeployError(
            f"{option}: {text[:80]!r} is not a size Kubernetes reads",
            expected="a positive quantity: a number with a suffix Ki Mi Gi Ti Pi Ei, k M G T P E, or e<exp>",
            found=text[:80],
            fix=f"e.g. {option} 1Ti or {option} 500Gi",
        )
    return text


def meta(name: str, labels: dict[str, str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "labels": dict(labels), **extra}


@dataclass(frozen=True)
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002


def http_probe(path: str, port: int, *, period: int, failures: int, delay: int = 0) -> dict[str, Any]:
    probe = {"httpGet": {"path": path, "port": port}, "periodSeconds": period, "failureThreshold": failures}
    if delay:
        probe["initialDelaySeconds"] = delay
    return probe


def gpu_resources(gpus: int, *, cpu: str | None = None, memory: str | None = None) -> dict[str, Any]:
    """GPUs are extended resources: request == limit (the device plugin allows nothing else)."""
    limits: dict[str, Any] = {GPU_RESOURCE: str(gpus)}
    requests: dict[str, Any] = {GPU_RESOURCE: str(gpus)}
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = limits["memory"] = memory
    return {"limits": limits, "requests": requests}


def shm_volume(size: str) -> dict[str, Any]:
    return {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}


def pvc_volume(claim: str, name: str = "specbuild") -> dict[str, Any]:
    return {"name": name, "persistentVolumeClaim": {"claimName": claim}}


def pvc(name: str, labels: dict[str, str], *, size: str, many_nodes: bool, storage_class: str | None) -> dict:
    spec: dict[str, Any] = {
        # several nodes read the engines at once (LeaderWorkerSet, replicas): ReadWriteMany
        "accessModes": ["ReadWriteMany" if many_nodes else "ReadWriteOnce"],
        "resources": {"requests": {"storage": size}},
    }
    if storage_class:
        spec["storageClassName"] = storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta(name, labels), "spec": spec}


def service(name: str, labels: dict[str, str], selector: dict[str, str], ports: dict[str, int]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(name, labels),
        "spec": {
            "type": "ClusterIP",  # inside the cluster only; expose it deliberately (Ingress, LoadBalancer)
            "selector": dict(selector),
            "ports": [{"name": n, "port": p, "targetPort": p, "protocol": "TCP"} for n, p in ports.items()],
        },
    }


def config_map(name: str, labels: dict[str, str], data: dict[str, str]) -> dict:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta(name, labels), "data": dict(data)}


def deployment(name: str, labels: dict[str, str], pod_spec: dict[str, Any], *, replicas: int) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(name, labels),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": dict(labels)},
            # a new pod needs the old one's GPUs: replace, don't surge
            "strategy": {"type": "Recreate"},
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


def job(name: str, labels: dict[str, str], pod_spec: dict[str, Any]) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(name, labels),
        "spec": {
            "backoffLimit": 0,  # a failed engine build is read from its log, not retried blindly
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {**pod_spec, "restartPolicy": "Never"},
            },
        },
    }


def leader_worker_set(
    name: str,
    labels: dict[str, str],
    *,
    replicas: int,
    size: int,
    leader: dict[str, Any],
    worker: dict[str, Any],
) -> dict:
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": meta(name, labels),
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": size,
                "restartPolicy": "RecreateGroupOnPodRestart",  # one rank lost = the whole TP/PP group
                "leaderTemplate": {"metadata": {"labels": {**labels, "role": "leader"}}, "spec": leader},
                "workerTemplate": {"metadata": {"labels": {**labels, "role": "worker"}}, "spec": worker},
            },
        },
    }


def rbac_exec(name: str, labels: dict[str, str]) -> list[dict]:
    """ServiceAccount + Role + RoleBinding letting the leader list the group's pods and exec into them
    (OpenMPI's plm_rsh_agent through `kubectl exec`, as the LWS TensorRT-LLM example's rbac.yaml)."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta(name, labels)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta(name, labels),
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
                {"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta(name, labels),
            "subjects": [{"kind": "ServiceAccount", "name": name}],
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        },
    ]


# ---- autoscaling on Triton's queue / compute ratio ------------------------------------------------

QUEUE_COMPUTE_RATIO = "triton:queue_compute:ratio"


def prometheus_rule(name: str, labels: dict[str, str]) -> dict:
    """The recording rules of the Triton TensorRT-LLM autoscaling tutorial
    (triton-inference-server/tutorials @e848952, Deployment/Kubernetes/
    TensorRT-LLM_Autoscaling_and_Load_Balancing/triton-metrics_prometheus-rule.yaml): queue time over
    compute time per pod, from Triton's counters."""

    def per_request(counter: str) -> str:
        return f"rate({counter}[1m])/clamp_min(rate(nv_inference_request_success[1m]),1)"

    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": meta(name, labels),
        "spec": {
            "groups": [
                {
                    "name": "autoscaling",
                    "interval": "6s",
                    "rules": [
                        {
                            "expr": per_request("nv_inference_compute_infer_duration_us"),
                            "record": "triton:compute_duration:average",
                        },
                        {
                            "expr": per_request("nv_inference_queue_duration_us"),
                            "record": "triton:queue_duration:average",
                        },
                        {
                            "expr": per_request("nv_inference_request_duration_us"),
                            "record": "triton:request_duration:average",
                        },
                        {
                            "expr": "rate(nv_inference_queue_duration_us[1m])/"
                            "clamp_min(rate(nv_inference_compute_infer_duration_us[1m]),1)",
                            "record": QUEUE_COMPUTE_RATIO,
                        },
                    ],
                }
            ]
        },
    }


def pod_monitor(name: str, labels: dict[str, str], selector: dict[str, str], port: str = "metrics") -> dict:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta(name, labels),
        "spec": {
            "selector": {"matchLabels": dict(selector)},
            "podMetricsEndpoints": [{"port": port, "interval": "6s"}],
        },
    }


def hpa(
    name: str, labels: dict[str, str], target: dict[str, str], *, max_replicas: int, average: str = "1000m"
) -> dict:
    """autoscaling/v2 on the per-pod metric `triton:queue_compute:ratio` (served to the HPA by
    prometheus-adapter as custom.metrics.k8s.io/v1beta1); 1000m = queue time equal to compute time,
    the tutorial's target."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta(name, labels),
        "spec": {
            "scaleTargetRef": dict(target),
            "minReplicas": 1,
            "maxReplicas": max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": QUEUE_COMPUTE_RATIO},
                        "target": {"type": "AverageValue", "averageValue": average},
                    },
                }
            ],
        },
    }
