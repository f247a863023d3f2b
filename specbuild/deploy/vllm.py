"""The same spec on vLLM: the `vllm serve` command, and its Kubernetes Deployment (one node) or
LeaderWorkerSet (several nodes, Ray: the LWS vLLM example's multi-node-serving.sh).

Flags are those of vLLM `VLLM_VERSION` (core/facts/vllm.py, read from its wheel); every flag and every
--speculative-config key emitted is checked against that list here and in the tests.

Spec -> vLLM:
* target.model -> the positional model; target tp/pp -> --tensor-parallel-size / --pipeline-parallel-size;
* dtype -> --dtype; build.max_seq_len -> --max-model-len; build.max_batch_size -> --max-num-seqs;
  build.max_num_tokens -> --max-num-batched-tokens;
* speculation: {"method": <vLLM method>, "model": draft.model, "num_speculative_tokens": K,
  "draft_tensor_parallel_size": draft.tp_size} (draft/target); {"method": "eagle3", "model":
  eagle3.model, ...} (EAGLE-3); {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max":
  ngram.max_matching_ngram_size, "prompt_lookup_min": 1} (n-gram);
* --gpu-memory-utilization from the memory plan: the share of GPU memory the plan gives the engines
  (weights, activations, the KV budget and the runtime reserve), i.e. 1 - what the plan leaves unused;
* --host 127.0.0.1 unless asked (vLLM binds every interface by default); in a pod, 0.0.0.0 (the Service
  decides who reaches it).
No vLLM equivalent (listed by `unmapped`): build.max_input_len, build.weight_only (vLLM loads
pre-quantized checkpoints, it does not quantize weight-only at load), speculation.use_logits (vLLM always
samples losslessly against the draft's distribution), serving.kv_cache_free_gpu_mem_fraction (folded into
--gpu-memory-utilization), serving.max_queue_delay_microseconds, serving.bls_instance_count,
serving.enable_chunked_context (vLLM V1 chunks prefills by default), trtllm_version, draft.pp_size (> 1).
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

from specbuild.builder.memory_plan import plan_memory
from specbuild.core.errors import DeployError
from specbuild.core.facts.vllm import VLLM_METHODS, VLLM_REFUSED, VLLM_VERSION, vllm_facts
from specbuild.core.spec import BuildSpec
from specbuild.deploy import k8s

IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
PORT = 8000
MULTI_NODE_SCRIPT = "/vllm-workspace/examples/online_serving/multi-node-serving.sh"  # in the vLLM image


def speculative_config(spec: BuildSpec, *, model_root: str | None = None) -> dict[str, Any]:
    mode = spec.mode.value
    if mode in VLLM_REFUSED:
        raise DeployError(
            f"vLLM cannot serve mode {mode}",
            expected=f"a method vLLM {VLLM_VERSION} supports: {', '.join(sorted(VLLM_METHODS))}",
            found=VLLM_REFUSED[mode],
            fix="use the Triton engine flow for this spec (`specbuild deploy SPEC`)",
        )
    if mode not in VLLM_METHODS:
        raise DeployError(
            f"no vLLM mapping for mode {mode}",
            expected=", ".join(sorted(VLLM_METHODS)),
            found=mode,
            fix="add it to core/facts/vllm.py VLLM_METHODS",
        )
    cfg: dict[str, Any] = {
        "method": VLLM_METHODS[mode],
        "num_speculative_tokens": spec.speculation.max_draft_len,
    }
    if spec.draft is not None:
        if spec.draft.pp_size != 1:
            raise DeployError(
                "vLLM runs the draft without pipeline parallelism",
                expected="draft.pp_size: 1",
                found=f"draft.pp_size: {spec.draft.pp_size}",
                fix="set draft.pp_size: 1",
            )
        if spec.draft.tp_size not in (1, spec.target.tp_size):
            raise DeployError(
                "vLLM's draft TP must be 1 or the target's",
                expected=f"draft.tp_size 1 or {spec.target.tp_size} (vllm/config/speculative.py "
                "_verify_and_get_draft_tp)",
                found=f"draft.tp_size: {spec.draft.tp_size}",
                fix="set draft.tp_size: 1",
            )
        cfg["model"] = pod_model(spec, spec.draft.model, model_root)
        cfg["draft_tensor_parallel_size"] = spec.draft.tp_size
    if spec.eagle3 is not None:  # the EAGLE-3 draft head
        cfg["model"] = pod_model(spec, spec.eagle3.model, model_root)
    if spec.ngram is not None:  # prompt lookup within the request (vLLM has no pool shared across requests)
        cfg["prompt_lookup_max"] = spec.ngram.max_matching_ngram_size
        cfg["prompt_lookup_min"] = 1  # TensorRT-LLM's NGram tries every size from the largest down to 1
    return cfg


def gpu_memory_utilization(spec: BuildSpec) -> float:
    """What the memory plan gives the engines of one GPU, as vLLM's fraction (rounded down to 0.01)."""
    plan = plan_memory(spec)
    unused = (1 - plan.kv_fraction_total) * max(plan.free_after_weights_bytes, 0)
    return math.floor((1 - unused / plan.gpu_memory_bytes) * 100) / 100


def serve_argv(
    spec: BuildSpec, *, host: str = "127.0.0.1", port: int = PORT, model_root: str | None = None
) -> list[str]:
    b = spec.build
    argv = [
        "vllm",
        "serve",
        pod_model(spec, spec.target.model, model_root),
        "--host",
        host,
        "--port",
        str(port),
        "--tensor-parallel-size",
        str(spec.target.tp_size),
        "--pipeline-parallel-size",
        str(spec.target.pp_size),
        "--dtype",
        spec.dtype,
        "--max-model-len",
        str(b.max_seq_len),
        "--max-num-seqs",
        str(b.max_batch_size),
        "--gpu-memory-utilization",
        f"{gpu_memory_utilization(spec):.2f}",
    ]
    if b.max_num_tokens:
        argv += ["--max-num-batched-tokens", str(b.max_num_tokens)]
    argv += [
        "--speculative-config",
        json.dumps(speculative_config(spec, model_root=model_root), separators=(",", ":")),
    ]
    check_argv(argv)
    return argv


def check_argv(argv: list[str]) -> None:
    """Every flag and --speculative-config key must exist in the named vLLM release."""
    facts = vllm_facts()
    flags = [a for a in argv[3:] if a.startswith("--")]
    unknown = [f for f in flags if f not in facts.serve_flags]
    keys = json.loads(argv[argv.index("--speculative-config") + 1]) if "--speculative-config" in argv else {}
    unknown += [f"speculative_config.{k}" for k in keys if k not in facts.speculative_config_keys]
    if keys and keys.get("method") not in facts.speculative_methods:
        unknown.append(f"method {keys.get('method')}")
    if unknown:
        raise DeployError(
            f"not in vLLM {facts.version}: {', '.join(unknown)}",
            expected=f"flags of vLLM {facts.version} (specbuild/data/vllm_{facts.version}.json)",
            found=", ".join(unknown),
            fix="update core/facts/vllm.py and the emitter together",
        )


def unmapped(spec: BuildSpec) -> list[str]:
    """Spec settings with no vLLM equivalent, as set in this spec."""
    out = [
        f"trtllm_version {spec.trtllm_version} (TensorRT-LLM only)",
        f"build.max_input_len {spec.build.max_input_len}"
        " (vLLM limits prompt + output by --max-model-len only)",
    ]
    if spec.build.weight_only != "none":
        out.append(f"build.weight_only {spec.build.weight_only} (vLLM needs a pre-quantized checkpoint)")
    if spec.ngram is not None:
        out.append(
            "ngram.is_keep_all / is_use_oldest / is_public_pool (vLLM's n-gram proposer looks up the "
            "request's own tokens and has no pool options)"
        )
    if spec.eagle3 is not None and spec.eagle3.layers_to_capture is not None:
        out.append(
            "eagle3.layers_to_capture (no --speculative-config key: vLLM reads "
            "eagle_aux_hidden_state_layer_ids from the draft's config.json, in its own layer numbering)"
        )
    if spec.speculation.use_logits:
        out.append("speculation.use_logits (vLLM verifies against the draft's probabilities itself)")
    s = spec.serving
    out.append(
        f"serving.kv_cache_free_gpu_mem_fraction {s.kv_cache_free_gpu_mem_fraction} (folded into "
        "--gpu-memory-utilization)"
    )
    out += [
        f"serving.max_queue_delay_microseconds {s.max_queue_delay_microseconds}",
        f"serving.bls_instance_count {s.bls_instance_count} (no BLS: vLLM schedules drafts itself)",
        f"serving.enable_chunked_context {s.enable_chunked_context} (vLLM V1 chunks prefills itself)",
    ]
    return out


def vllm_manifests(
    spec: BuildSpec,
    *,
    name: str,
    nodes: int = 1,
    replicas: int = 1,
    image: str | None = None,
    shm: str = "16Gi",
    models_claim: str | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Deployment (one node) or LeaderWorkerSet (Ray over `nodes` pods) + Service."""
    name = k8s.k8s_name(name)
    labels = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": "vllm",
        "app.kubernetes.io/managed-by": "specbuild",
    }
    argv = serve_argv(spec, host="0.0.0.0", model_root="/models" if models_claim else None)
    image = image or IMAGE
    gpus = spec.num_gpus
    volumes = [k8s.shm_volume(shm)]
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if models_claim:
        volumes.append(k8s.pvc_volume(models_claim, "models"))
        mounts.append({"name": "models", "mountPath": "/models", "readOnly": True})
    probes = {
        "readinessProbe": k8s.http_probe("/health", PORT, period=10, failures=3),
        "livenessProbe": k8s.http_probe("/health", PORT, period=10, failures=6),
        "startupProbe": k8s.http_probe("/health", PORT, period=10, failures=180),
    }
    ports = [{"name": "http", "containerPort": PORT}]
    if nodes == 1:
        pod = {
            "containers": [
                {
                    "name": "vllm",
                    "image": image,
                    "command": argv,
                    "ports": ports,
                    "resources": k8s.gpu_resources(gpus),
                    "volumeMounts": mounts,
                    **probes,
                }
            ],
            "volumes": volumes,
        }
        server = [k8s.deployment(name, labels, pod, replicas=replicas)]
        selector = labels
    else:
        if gpus % nodes:
            raise DeployError(
                "the spec's GPUs do not split evenly over the nodes",
                expected=f"a multiple of --nodes ({nodes})",
                found=f"{gpus} GPUs",
                fix="change --nodes or the spec's tp_size / pp_size",
            )
        per = gpus // nodes
        leader_cmd = (
            f"bash {MULTI_NODE_SCRIPT} leader --ray_cluster_size=$(LWS_GROUP_SIZE); {shlex.join(argv)}"
        )
        worker_cmd = f"bash {MULTI_NODE_SCRIPT} worker --ray_address=$(LWS_LEADER_ADDRESS)"
        leader = {
            "containers": [
                {
                    "name": "vllm-leader",
                    "image": image,
                    "command": ["sh", "-c", leader_cmd],
                    "ports": ports,
                    "resources": k8s.gpu_resources(per),
                    "volumeMounts": mounts,
                    **probes,
                }
            ],
            "volumes": volumes,
        }
        worker = {
            "containers": [
                {
                    "name": "vllm-worker",
                    "image": image,
                    "command": ["sh", "-c", worker_cmd],
                    "resources": k8s.gpu_resources(per),
                    "volumeMounts": mounts,
                }
            ],
            "volumes": volumes,
        }
        server = [
            k8s.leader_worker_set(name, labels, replicas=replicas, size=nodes, leader=leader, worker=worker)
        ]
        selector = {k8s.LWS_NAME_LABEL: name, "role": "leader"}
    return {"20-vllm.yaml": server, "30-service.yaml": [k8s.service(name, labels, selector, {"http": PORT})]}


def pod_model(spec: BuildSpec, model: str, root: str | None = None) -> str:
    """A hub id stays as written; a local folder (one that exists beside the spec) is named as the spec
    names it, or, with `root` (a mounted models volume), as `root/<folder name>`."""
    local = (spec.base_dir / model).is_dir() or Path(model).is_absolute()
    return f"{root}/{Path(model).name}" if root and local else model
