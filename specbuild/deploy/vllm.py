"""The same spec on vLLM: the `vllm serve` command, and its Kubernetes Deployment (one node) or
LeaderWorkerSet (several nodes, Ray: the LWS vLLM example's multi-node-serving.sh).

Flags are those of vLLM `VLLM_VERSION` (core/facts/vllm.py, read from its wheel); every flag and every
--speculative-config key emitted is checked against that list here and in the tests.

Spec -> vLLM:
* target.model -> the positional model; target tp/pp -> --tensor-parallel-size / --pipeline-parallel-size;
* dtype -> --dtype; build.max_seq_len -> --max-model-len; build.max_batch_size -> --max-num-seqs;
  build.max_num_tokens -> --max-num-batched-tokens;
* speculation: {"method": <vLLM method>, "num_speculative_tokens": K, "rejection_sample_method":
  "standard", "model": draft.model, "draft_tensor_parallel_size": draft.tp_size, "draft_sample_method":
  "probabilistic" with speculation.use_logits else "greedy"} (draft/target); {"method": "eagle3", "model":
  eagle3.model, ...} (EAGLE-3; the draft's config.json is checked, deploy/eagle3_draft.py); {"method":
  "ngram", "num_speculative_tokens": K, "prompt_lookup_max": ngram.max_matching_ngram_size,
  "prompt_lookup_min": 1} (n-gram); speculation.schedule -> "num_speculative_tokens_per_batch_size"
  (inclusive [start, end, K] ranges over 1..build.max_batch_size; no data parallelism is written, which
  would switch it off); a schedule that is off at every load writes no --speculative-config;
* --gpu-memory-utilization from the memory plan: the share of GPU memory the plan gives the engines
  (weights, activations, the KV budget and the runtime reserve), i.e. 1 - what the plan leaves unused;
* --host 127.0.0.1 unless asked (vLLM binds every interface by default); in a pod, 0.0.0.0 (the Service
  decides who reaches it).
No vLLM equivalent (listed by `unmapped`): build.max_input_len, build.weight_only (vLLM loads
pre-quantized checkpoints, it does not quantize weight-only at load), serving.kv_cache_free_gpu_mem_fraction
(folded into --gpu-memory-utilization), serving.max_queue_delay_microseconds, serving.bls_instance_count,
serving.enable_chunked_context (vLLM V1 chunks prefills by default), trtllm_version, draft.pp_size (> 1).
In a pod the models are hub ids or folders of `--models-claim` (deploy/pods.py).
"""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

from specbuild.builder.memory_plan import plan_memory
from specbuild.core.errors import DeployError
from specbuild.core.facts.vllm import VLLM_REFUSED, VLLM_VERSION, VllmFacts, vllm_facts
from specbuild.core.methods import VLLM_METHODS, method_of
from specbuild.core.perf.schedule import schedule_of
from specbuild.core.spec import BuildSpec
from specbuild.deploy import k8s
from specbuild.deploy.eagle3_draft import check_draft
from specbuild.deploy.pods import (
    gpus_per_pod,
    health_probes,
    is_local,
    model_volumes,
    pod_model_root,
    server_labels,
)

IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
PORT = 8000
MULTI_NODE_SCRIPT = "/vllm-workspace/examples/online_serving/multi-node-serving.sh"  # in the vLLM image
SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"


def speculative_config(spec: BuildSpec, *, model_root: str | None = None) -> dict[str, Any] | None:
    """The --speculative-config of the spec (None: its schedule never drafts: vLLM serves the target
    alone)."""
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
            fix="set its vllm_method in core/methods/<method>.py",
        )
    schedule = schedule_of(spec)
    if schedule is not None and schedule.off:
        return None
    cfg: dict[str, Any] = {
        "method": VLLM_METHODS[mode],
        "num_speculative_tokens": spec.speculation.max_draft_len,
        "rejection_sample_method": "standard",  # lossless per-token rejection sampling, as TensorRT-LLM
    }
    method = method_of(spec)
    if (draft := method.draft_engine(spec)) is not None:
        if draft.pp_size != 1:
            raise DeployError(
                "vLLM runs the draft without pipeline parallelism",
                expected="draft.pp_size: 1",
                found=f"draft.pp_size: {draft.pp_size}",
                fix="set draft.pp_size: 1",
            )
        cfg["model"] = pod_model(spec, draft.model, model_root)
        cfg["draft_tensor_parallel_size"] = draft.tp_size
    if (head := method.one_model_draft(spec)) is not None:  # the EAGLE-3 draft head
        check_draft(spec, "vllm")
        cfg["model"] = pod_model(spec, head, model_root)
    if "model" in cfg:  # the draft's distribution in the ratio test (speculation.use_logits), else one-hot
        cfg["draft_sample_method"] = "probabilistic" if spec.speculation.use_logits else "greedy"
    cfg.update(method.vllm_section_config(spec))
    if schedule is not None and len(schedule.steps) > 1:
        cfg[SCHEDULE_KEY] = [list(r) for r in schedule.ranges(spec.build.max_batch_size)]
    check_speculative_config(cfg, spec.target.tp_size)
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
    cfg = speculative_config(spec, model_root=model_root)
    if cfg is not None:
        argv += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
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


def check_speculative_config(cfg: dict[str, Any], target_tp: int, facts: VllmFacts | None = None) -> None:
    """The rules the release's SpeculativeConfig applies to what specbuild writes (core/facts/vllm.py):
    keys it refuses outright, Literal values, the draft-TP rule, the per-batch-size schedule's shape."""
    facts = facts or vllm_facts()
    wrong = [f"{k} (vLLM {facts.version}: {facts.rejected_keys[k]})" for k in cfg if k in facts.rejected_keys]
    for key, value in cfg.items():
        allowed = facts.values(key)
        if allowed is not None and value not in allowed:
            wrong.append(f"{key}: {value!r} (one of {', '.join(allowed)})")
    if cfg.get("method") in facts.mtp["deprecated"]:
        wrong.append(
            f"method {cfg['method']} (deprecated: vLLM {facts.version} replaces it with "
            f"{facts.mtp['method']})"
        )
    draft_tp = [target_tp if v == "target tensor_parallel_size" else v for v in facts.draft_tp]
    if cfg.get("draft_tensor_parallel_size", draft_tp[0]) not in draft_tp:
        wrong.append(
            f"draft_tensor_parallel_size: {cfg['draft_tensor_parallel_size']} (one of {draft_tp}: 1 or the "
            "target's tensor_parallel_size)"
        )
    if SCHEDULE_KEY in cfg:
        wrong += [f"{SCHEDULE_KEY}: {e}" for e in schedule_errors(cfg[SCHEDULE_KEY], facts)]
    if wrong:
        raise DeployError(
            f"vLLM {facts.version} would refuse the speculative config",
            expected=f"keys and values SpeculativeConfig of vLLM {facts.version} accepts "
            f"(specbuild/data/vllm_{facts.version}.json)",
            found="; ".join(wrong),
            fix="change the spec (or core/facts/vllm.py with the emitter, after reading the release)",
        )


def schedule_errors(entries: Any, facts: VllmFacts) -> list[str]:
    """What the release's num_speculative_tokens_per_batch_size validation would raise on `entries`."""
    rules = facts.dynamic
    if not isinstance(entries, list) or not entries:
        return ["a non-empty list of [range_start, range_end, K]"]
    if any(not isinstance(e, list | tuple) or len(e) != 3 for e in entries):
        return ["each entry is [range_start, range_end, K]"]
    out = []
    for start, end, k in entries:
        if start <= 0 or end <= 0 or start > end:
            out.append(f"range ({start}, {end}): positive, start <= end")
        if k < rules["k_min"]:
            out.append(f"K {k} < {rules['k_min']}")
    ordered = sorted(entries, key=lambda e: e[0])
    if any(b[0] <= a[1] for a, b in zip(ordered, ordered[1:], strict=False)):
        out.append("ranges overlap")
    if ordered[0][0] != rules["first_start"]:
        out.append(f"the first range starts at {ordered[0][0]}, not {rules['first_start']}")
    return out


def unmapped(spec: BuildSpec) -> list[str]:
    """Spec settings with no vLLM equivalent, as set in this spec."""
    out = [
        f"trtllm_version {spec.trtllm_version} (TensorRT-LLM only)",
        f"build.max_input_len {spec.build.max_input_len}"
        " (vLLM limits prompt + output by --max-model-len only)",
    ]
    if spec.build.weight_only != "none":
        out.append(f"build.weight_only {spec.build.weight_only} (vLLM needs a pre-quantized checkpoint)")
    out.extend(method_of(spec).vllm_unmapped(spec))
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
    labels = server_labels(name, "vllm")
    argv = serve_argv(spec, host="0.0.0.0", model_root=pod_model_root(spec, models_claim, engine="vllm"))
    image = image or IMAGE
    gpus = spec.num_gpus
    volumes, mounts = model_volumes(models_claim, shm)
    probes = health_probes("/health", PORT)
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
        per = gpus_per_pod(spec, nodes)
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
    """A hub id stays as written; a local folder (deploy/pods.py `is_local`) is named as the spec names it
    (a command for this host), or, with `root` (a mounted models volume), as `root/<folder name>`."""
    return f"{root}/{Path(model).name}" if root and is_local(spec, model) else model
