"""The same spec on SGLang: the `python -m sglang.launch_server` command, and its Kubernetes Deployment (one
node) or LeaderWorkerSet (several nodes: every pod runs the server with its --node-rank, the LWS SGLang
example's pattern).

Flags are those of SGLang `SGLANG_VERSION` (core/facts/sglang.py, read from its wheel); every flag and
rule is checked against that release here and in the tests.

Spec -> SGLang:
* target.model -> --model-path; tp / pp -> --tp-size / --pp-size; dtype -> --dtype; build.max_seq_len ->
  --context-length; build.max_batch_size -> --max-running-requests (SGLang sets 48 for speculative decoding
  when it is unset);
* mode -> --speculative-algorithm: draft_target STANDALONE, eagle3 EAGLE3, ngram NGRAM (Medusa: none);
  the draft (draft.model, eagle3.model) -> --speculative-draft-model-path;
* K = speculation.max_draft_len: STANDALONE / EAGLE3 --speculative-num-steps K --speculative-eagle-topk 1
  --speculative-num-draft-tokens K+1 (given together, as SGLang requires; topk 1 = one chain of K drafted
  tokens, as TensorRT-LLM); NGRAM --speculative-num-draft-tokens K+1 (the request's last token + K
  drafted) and --speculative-ngram-max-bfs-breadth 1 (one chain);
* speculation.schedule -> --speculative-adaptive --speculative-adaptive-config <file> for EAGLE3 only (SGLang
  runs adaptive steps for EAGLE/EAGLE3 with topk 1 and switches it off with a warning otherwise): each
  threshold n -> {"n": {"candidate_steps": [K]}}, which SGLang routes like the schedule (largest key <= the
  batch size, padded to a CUDA-graph size); the file is a ConfigMap mounted in the pod. A schedule that is
  off at every load writes no speculation.
* --host 127.0.0.1 unless asked (SGLang's default too); in a pod, 0.0.0.0.
No SGLang equivalent (listed by `unmapped`): see that function.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from specbuild.core.errors import DeployError
from specbuild.core.facts.sglang import SGLANG_REFUSED, SGLANG_VERSION, sglang_facts
from specbuild.core.methods import SGLANG_ALGORITHMS, method_of
from specbuild.core.perf.schedule import schedule_of
from specbuild.core.spec import BuildSpec
from specbuild.deploy import k8s
from specbuild.deploy.eagle3_draft import check_draft, read_draft
from specbuild.deploy.pods import gpus_per_pod, health_probes, model_volumes, pod_model_root, server_labels
from specbuild.deploy.vllm import pod_model

IMAGE = f"lmsysorg/sglang:v{SGLANG_VERSION}"
PORT = 30000  # SGLang's default
DIST_PORT = 20000  # --dist-init-addr port on the leader (the LWS SGLang example's)
CONFIG_DIR = "/specbuild-sglang"
ADAPTIVE_FILE = "adaptive.json"


def algorithm_of(spec: BuildSpec, requested: str | None = None) -> str:
    """SGLang's --speculative-algorithm for the spec (`requested` overrides; EAGLE is refused for an EAGLE-3
    draft: SGLang would accept it and draft one token a step)."""
    mode = spec.mode.value
    if mode in SGLANG_REFUSED:
        raise DeployError(
            f"SGLang cannot serve mode {mode}",
            expected=f"a method SGLang {SGLANG_VERSION} runs: {', '.join(sorted(SGLANG_ALGORITHMS))}",
            found=SGLANG_REFUSED[mode],
            fix="use the Triton engine flow for this spec (`specbuild deploy SPEC`)",
        )
    algorithm = (requested or SGLANG_ALGORITHMS[mode]).upper()
    facts = sglang_facts()
    eagle = {"EAGLE", *facts.algorithms["aliases_of_EAGLE"]}
    draft = read_draft(spec)
    head = method_of(spec).one_model_draft(spec)
    eagle3_draft = head is not None or (draft is not None and any("Eagle3" in a for a in draft.architectures))
    if algorithm in eagle and eagle3_draft:
        raise DeployError(
            f"--speculative-algorithm {algorithm} with an EAGLE-3 draft",
            expected="EAGLE3 (EAGLE captures no target layers for the draft: SGLang 0.5.23 accepts the "
            "draft, skips its fc and drafts with an acceptance length of 1 token a step)",
            found=f"{algorithm} for {head or 'an EAGLE-3 draft'}",
            fix="use EAGLE3 (the default for mode eagle3)",
        )
    if algorithm not in facts.algorithm_names:
        raise DeployError(
            f"unknown SGLang algorithm {algorithm}",
            expected=", ".join(sorted(facts.algorithm_names)),
            found=algorithm,
            fix="use one of SGLang's algorithms",
        )
    return algorithm


def adaptive_config(spec: BuildSpec, algorithm: str) -> dict[str, Any] | None:
    """The --speculative-adaptive-config ladder from speculation.schedule, where SGLang honours it."""
    schedule = schedule_of(spec)
    ad = sglang_facts().adaptive
    if schedule is None or schedule.off or len(schedule.steps) < 2 or algorithm not in ad["algorithms"]:
        return None
    steps = [(n, k) for n, k in schedule.steps if n <= spec.build.max_batch_size]
    return {str(n): {"candidate_steps": [k]} for n, k in steps}


def launch_argv(
    spec: BuildSpec,
    *,
    host: str = "127.0.0.1",
    port: int = PORT,
    model_root: str | None = None,
    algorithm: str | None = None,
    adaptive_path: str | None = None,
    nodes: int = 1,
) -> list[str]:
    """The launch_server argv; `adaptive_path`: where the adaptive config file is (None: no adaptive steps);
    nodes > 1 adds --nnodes / --node-rank / --dist-init-addr with the LWS variables."""
    b = spec.build
    argv = [
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        pod_model(spec, spec.target.model, model_root),
        "--host",
        host,
        "--port",
        str(port),
        "--tp-size",
        str(spec.target.tp_size),
        "--pp-size",
        str(spec.target.pp_size),
        "--dtype",
        spec.dtype,
        "--context-length",
        str(b.max_seq_len),
        "--max-running-requests",
        str(b.max_batch_size),
    ]
    if nodes > 1:
        argv += [
            "--nnodes",
            "$(LWS_GROUP_SIZE)",
            "--node-rank",
            "$(LWS_WORKER_INDEX)",
            "--dist-init-addr",
            f"$(LWS_LEADER_ADDRESS):{DIST_PORT}",
        ]
    argv += speculative_args(spec, model_root=model_root, algorithm=algorithm, adaptive_path=adaptive_path)
    check_argv(argv)
    return argv


def speculative_args(
    spec: BuildSpec, *, model_root: str | None, algorithm: str | None, adaptive_path: str | None
) -> list[str]:
    schedule = schedule_of(spec)
    if schedule is not None and schedule.off:
        return []
    algorithm = algorithm_of(spec, algorithm)
    k = spec.speculation.max_draft_len
    args = ["--speculative-algorithm", algorithm]
    if algorithm == "NGRAM":
        return args + [
            "--speculative-num-draft-tokens",
            str(k + 1),
            "--speculative-ngram-max-bfs-breadth",
            "1",
        ]
    method = method_of(spec)
    draft = method.speculative_model(spec)
    if draft is None:
        raise DeployError(
            f"{algorithm} needs a draft model",
            expected="a draft or eagle3 section",
            found=f"mode {spec.mode}",
            fix="add the draft model to the spec",
        )
    if method.one_model_draft(spec) is not None:
        check_draft(spec, "sglang")
    args += ["--speculative-draft-model-path", pod_model(spec, draft, model_root)]
    args += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
    args += ["--speculative-num-draft-tokens", str(k + 1)]
    if adaptive_path and adaptive_config(spec, algorithm) is not None:
        args += ["--speculative-adaptive", "--speculative-adaptive-config", adaptive_path]
    return args


def check_argv(argv: list[str], adaptive: dict[str, Any] | None = None) -> None:
    """Every flag exists in the named SGLang release and its speculative rules hold
    (core/facts/sglang.py)."""
    facts = sglang_facts()
    flags = [a for a in argv[3:] if a.startswith("--")]
    wrong = [f"{f} (not a flag)" for f in flags if f not in facts.server_flags]

    def value(flag: str) -> str | None:
        return argv[argv.index(flag) + 1] if flag in argv else None

    algorithm = value("--speculative-algorithm")
    if algorithm is not None and algorithm.upper() not in facts.algorithm_names:
        wrong.append(f"--speculative-algorithm {algorithm}")
    trio = ["--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens"]
    if algorithm in ("EAGLE", "EAGLE3", "STANDALONE"):
        given = [f for f in trio if f in argv]
        if given and len(given) != 3:
            wrong.append(
                f"{', '.join(given)} without the rest ({facts.eagle_family['steps_topk_draft_tokens']})"
            )
        if value("--speculative-eagle-topk") == "1" and value("--speculative-num-draft-tokens") is not None:
            if int(value("--speculative-num-draft-tokens")) != int(value("--speculative-num-steps")) + 1:
                wrong.append(f"topk 1: {facts.eagle_family['topk_1']}")
    if "--speculative-adaptive" in argv:
        ad = facts.adaptive
        if algorithm not in ad["algorithms"] or value("--speculative-eagle-topk") != str(ad["topk"]):
            wrong.append(f"--speculative-adaptive with {algorithm}, topk {value('--speculative-eagle-topk')}")
        if value("--speculative-adaptive-config") is None:
            wrong.append("--speculative-adaptive without --speculative-adaptive-config")
        if adaptive is not None:
            steps = {s for slot in adaptive.values() for s in slot["candidate_steps"]}
            if int(value("--speculative-num-steps")) not in steps:
                wrong.append(f"--speculative-num-steps not among the candidate steps {sorted(steps)}")
    if wrong:
        raise DeployError(
            f"SGLang {facts.version} would refuse or misread the launch line",
            expected=f"flags and rules of SGLang {facts.version} "
            f"(specbuild/data/sglang_{facts.version}.json)",
            found="; ".join(wrong),
            fix="update core/facts/sglang.py and the emitter together, after reading the release",
        )


def unmapped(spec: BuildSpec) -> list[str]:
    """Spec settings with no SGLang equivalent, as set in this spec."""
    out = [
        f"trtllm_version {spec.trtllm_version} (TensorRT-LLM only)",
        f"build.max_input_len {spec.build.max_input_len} (SGLang bounds prompt + output by --context-length)",
        f"serving.kv_cache_free_gpu_mem_fraction {spec.serving.kv_cache_free_gpu_mem_fraction} (SGLang sizes "
        "its pools itself: --mem-fraction-static)",
        f"serving.max_queue_delay_microseconds {spec.serving.max_queue_delay_microseconds}",
        f"serving.bls_instance_count {spec.serving.bls_instance_count} (no BLS)",
    ]
    if spec.build.weight_only != "none":
        out.append(f"build.weight_only {spec.build.weight_only} (SGLang loads pre-quantized checkpoints)")
    draft = method_of(spec).draft_engine(spec)
    if draft is not None and draft.tp_size != spec.target.tp_size:
        out.append(
            f"draft.tp_size {draft.tp_size} (SGLang {SGLANG_VERSION} has no draft tensor-parallel flag: "
            "the draft runs with the target's --tp-size; inferred from its flag list)"
        )
    if spec.speculation.use_logits:
        out.append("speculation.use_logits (SGLang verifies with its own sampler)")
    out.extend(method_of(spec).sglang_unmapped(spec))
    schedule = schedule_of(spec)
    if schedule is not None and not schedule.off and len(schedule.steps) > 1:
        algorithm = SGLANG_ALGORITHMS.get(spec.mode.value)
        if algorithm not in sglang_facts().adaptive["algorithms"]:
            out.append(
                f"speculation.schedule {schedule.to_text()} (SGLang runs adaptive steps for EAGLE / EAGLE3 "
                f"only: {algorithm} drafts K at every load)"
            )
    return out


def sglang_manifests(
    spec: BuildSpec,
    *,
    name: str,
    nodes: int = 1,
    replicas: int = 1,
    image: str | None = None,
    shm: str = "16Gi",
    models_claim: str | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """[ConfigMap with the adaptive ladder] + Deployment (one node) or LeaderWorkerSet + Service."""
    name = k8s.k8s_name(name)
    labels = server_labels(name, "sglang")
    per = gpus_per_pod(spec, nodes)
    root = pod_model_root(spec, models_claim, engine="sglang")
    algorithm = algorithm_of(spec) if _speculates(spec) else None
    ladder = adaptive_config(spec, algorithm) if algorithm else None
    volumes, mounts = model_volumes(models_claim, shm)
    config: list[dict[str, Any]] = []
    if ladder is not None:
        cm = k8s.config_map(f"{name}-sglang", labels, {ADAPTIVE_FILE: json.dumps(ladder, indent=1) + "\n"})
        config = [cm]
        volumes.append({"name": "sglang-config", "configMap": {"name": cm["metadata"]["name"]}})
        mounts.append({"name": "sglang-config", "mountPath": CONFIG_DIR, "readOnly": True})
    argv = launch_argv(
        spec,
        host="0.0.0.0",
        model_root=root,
        adaptive_path=f"{CONFIG_DIR}/{ADAPTIVE_FILE}" if ladder else None,
        nodes=nodes,
    )
    check_argv(argv, ladder)
    image = image or IMAGE
    ports = [{"name": "http", "containerPort": PORT}]

    def container(role: str, probes: bool) -> dict[str, Any]:
        c = {
            "name": role,
            "image": image,
            "command": argv,
            "resources": k8s.gpu_resources(per),
            "volumeMounts": mounts,
        }
        if probes:
            c.update(ports=ports, **health_probes("/health", PORT))
        return c

    if nodes == 1:
        pod = {"containers": [container("sglang", True)], "volumes": volumes}
        server = [k8s.deployment(name, labels, pod, replicas=replicas)]
        selector = labels
    else:  # every pod runs the same line; LWS_WORKER_INDEX is 0 on the leader, which serves HTTP
        leader = {"containers": [container("sglang-leader", True)], "volumes": volumes}
        worker = {"containers": [container("sglang-worker", False)], "volumes": volumes}
        server = [
            k8s.leader_worker_set(name, labels, replicas=replicas, size=nodes, leader=leader, worker=worker)
        ]
        selector = {k8s.LWS_NAME_LABEL: name, "role": "leader"}
    return {
        "20-sglang.yaml": [*config, *server],
        "30-service.yaml": [k8s.service(name, labels, selector, {"http": PORT})],
    }


def _speculates(spec: BuildSpec) -> bool:
    schedule = schedule_of(spec)
    return schedule is None or not schedule.off


def host_files(spec: BuildSpec) -> dict[str, str]:
    """sglang-serve.sh (the loopback command for one host) and, with a ladder, the sglang-adaptive.json
    it reads from the current folder."""
    ladder = adaptive_config(spec, algorithm_of(spec)) if _speculates(spec) else None
    path = "sglang-adaptive.json" if ladder else None
    line = shlex.join(launch_argv(spec, adaptive_path=path))
    out = {"sglang-serve.sh": f"#!/usr/bin/env bash\n# SGLang command for spec {spec.name!r}\n{line}\n"}
    if ladder:
        out["sglang-adaptive.json"] = json.dumps(ladder, indent=1) + "\n"
    return out
