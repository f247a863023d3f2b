"""README.md of a deployment folder: what each file is, what must exist first, what was validated."""

from __future__ import annotations

from typing import Any

from specbuild.core.methods import method_of
from specbuild.core.spec import BuildSpec
from specbuild.deploy.eagle3_draft import DRAFT_CONTENTS

REQUIREMENTS = {
    "triton": [
        "the NVIDIA device plugin (nvidia.com/gpu); with --gpu-product, GPU feature discovery labels",
        "the models volume of 00-storage.yaml holding the build folder at /specbuild/build, the "
        "repository (written with the pod's engine and tokenizer paths) at /specbuild/repo and the target's "
        "tokenizer files at /specbuild/tokenizer: the steps under 'Before applying' write and copy them",
        "LeaderWorkerSet layouts: the LWS controller v0.10.0 (kubectl apply --server-side -f "
        "https://github.com/kubernetes-sigs/lws/releases/download/v0.10.0/manifests.yaml) and an image "
        "with kubectl",
        "40-autoscaling.yaml: prometheus-operator (PodMonitor, PrometheusRule CRDs) and prometheus-adapter "
        "serving triton:queue_compute:ratio as a per-pod custom metric (custom.metrics.k8s.io/v1beta1)",
    ],
    "vllm": [
        "the NVIDIA device plugin; the models reachable from the pod (hub ids with a token, or "
        "--models-claim and model paths under /models)",
        "LeaderWorkerSet layouts: the LWS controller v0.10.0; multi-node uses Ray through the vLLM "
        "image's multi-node-serving.sh",
    ],
    "sglang": [
        "the NVIDIA device plugin; the models reachable from the pod (hub ids with a token, or "
        "--models-claim and model paths under /models)",
        "LeaderWorkerSet layouts: the LWS controller v0.10.0 (every pod runs launch_server with its "
        "--node-rank; LWS sets LWS_LEADER_ADDRESS, LWS_GROUP_SIZE, LWS_WORKER_INDEX)",
    ],
    "dynamo": ["the NVIDIA Dynamo operator (DynamoGraphDeployment nvidia.com/v1alpha1) and its platform"],
}


def readme_for(
    spec: BuildSpec,
    engine: str,
    files: dict[str, list[dict[str, Any]]],
    commands: dict[str, str],
    notes: list[str],
    *,
    nodes: int,
    recipe: tuple[tuple[str, str], ...] = (),
) -> str:
    lines = [
        f"# specbuild deploy: {spec.name} ({spec.mode}) on {engine}, {nodes} node(s) per replica",
        "",
        "Written by `specbuild deploy`; nothing here has been applied to a cluster. Apply in order:",
        "",
    ]
    for name, objs in files.items():
        kinds = ", ".join(f"{o['kind']} {o['metadata']['name']}" for o in objs)
        lines.append(f"* `{name}`: {kinds}")
    lines += ["", "## Needs", ""] + [f"* {r}" for r in REQUIREMENTS[engine]]
    if method_of(spec).one_model_draft(spec) is not None and engine in DRAFT_CONTENTS:
        lines.append(f"* {DRAFT_CONTENTS[engine]}")
    if recipe:
        lines += ["", "## Before applying (in order, from this folder)", ""]
        for i, (what, command) in enumerate(recipe, 1):
            lines += [f"{i}. {what}:", "", "```", command, "```", ""]
    if commands:
        lines += ["", "## Commands", ""]
        for k, v in commands.items():
            lines += [f"{k}:", "", "```", v, "```", ""]
    if notes:
        lines += ["## Notes", ""] + [f"* {n}" for n in notes]
    lines += [
        "",
        "Validated offline by specbuild's tests (docs/deploy.md): core objects against the Kubernetes "
        "1.33 OpenAPI schemas (kubernetes-validate, strict), LeaderWorkerSet against the v0.10.0 CRD schema, "
        "DynamoGraphDeployment against the v1alpha1 API fields. PrometheusRule / PodMonitor are not "
        "validated. No cluster was started.",
        "",
    ]
    return "\n".join(lines)
