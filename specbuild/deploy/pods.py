"""What a server pod of `deploy --engine vllm | sglang | dynamo` sees of the spec's models: hub ids as
written (the pod downloads them), local folders only through `--models-claim` (a PVC mounted read-only at
/models, each folder named /models/<folder name>). A spec that names local folders without a claim is
refused: the pod has no such path, and writing it would fail only once the server starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specbuild.builder.resolve import HUB_ID
from specbuild.core.errors import DeployError
from specbuild.core.methods import method_of
from specbuild.core.spec import BuildSpec
from specbuild.deploy import k8s

MODEL_ROOT = "/models"  # where `--models-claim` mounts the model folders


def is_local(spec: BuildSpec, model: str) -> bool:
    """A folder on this host (beside the spec, or absolute), or a name that cannot be a hub id."""
    path = Path(model)
    return path.is_absolute() or (spec.base_dir / model).is_dir() or not HUB_ID.match(model) or ".." in model


def spec_models(spec: BuildSpec, *, speculative: bool = True) -> dict[str, str]:
    """{section: model} the server loads: the target, and the method's draft model (draft, eagle3) if any."""
    out = {"target": spec.target.model}
    method = method_of(spec)
    ref = method.speculative_model(spec) if speculative else None
    if ref is not None:
        out[method.section] = ref
    return out


def pod_model_root(
    spec: BuildSpec, models_claim: str | None, *, engine: str, speculative: bool = True
) -> str | None:
    """MODEL_ROOT with a claim; None when every model is a hub id; refused when a local folder would be
    written without a claim."""
    if models_claim:
        return MODEL_ROOT
    local = {s: m for s, m in spec_models(spec, speculative=speculative).items() if is_local(spec, m)}
    if local:
        raise DeployError(
            f"--engine {engine}: the spec names model folders of this host, which the pod cannot see",
            expected="hub ids in the spec (the pod downloads them), or --models-claim with a PVC holding "
            f"the folders (mounted at {MODEL_ROOT}, each named {MODEL_ROOT}/<folder name>)",
            found=", ".join(f"{s}.model: {m}" for s, m in local.items()),
            fix="pass --models-claim <PVC with the model folders>, or set "
            + " / ".join(f"{s}.model" for s in local)
            + " to hub ids (e.g. meta-llama/Llama-3.3-70B-Instruct)",
        )
    return None


def model_volumes(models_claim: str | None, shm: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(volumes, mounts): /dev/shm, and the models claim read-only at MODEL_ROOT."""
    volumes = [k8s.shm_volume(shm)]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if models_claim:
        volumes.append(k8s.pvc_volume(models_claim, "models"))
        mounts.append({"name": "models", "mountPath": MODEL_ROOT, "readOnly": True})
    return volumes, mounts


def health_probes(path: str, port: int, *, startup_minutes: int = 30) -> dict[str, Any]:
    return {
        "readinessProbe": k8s.http_probe(path, port, period=10, failures=3),
        "livenessProbe": k8s.http_probe(path, port, period=10, failures=6),
        "startupProbe": k8s.http_probe(path, port, period=10, failures=startup_minutes * 6),
    }


def server_labels(name: str, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "specbuild",
    }


def gpus_per_pod(spec: BuildSpec, nodes: int) -> int:
    """The spec's GPUs split over `nodes` pods (refused when they do not split evenly)."""
    if spec.num_gpus % nodes:
        raise DeployError(
            "the spec's GPUs do not split evenly over the nodes",
            expected=f"a multiple of --nodes ({nodes})",
            found=f"{spec.num_gpus} GPUs",
            fix="change --nodes or the spec's tp_size / pp_size",
        )
    return spec.num_gpus // nodes
