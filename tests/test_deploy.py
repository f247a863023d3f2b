"""`specbuild deploy`: the manifests validate offline, for the seed spec on one node (Triton engine flow)
and on two nodes (vLLM LeaderWorkerSet, Dynamo multinode), and for a leader-mode (Medusa) spec on two
nodes (Triton LeaderWorkerSet).

Validation: core Kubernetes objects with kubernetes-validate against the Kubernetes 1.33 OpenAPI schemas,
strict (unknown fields rejected); LeaderWorkerSet against the openAPIV3Schema of the LWS v0.10.0 CRD
(tests/data/deploy/lws_v0.10.0_schema.json.gz) plus a pruning walk, because CRD schemas do not reject
unknown fields (the API server prunes them silently), and its pod templates as core Pods;
DynamoGraphDeployment against the v1alpha1 fields transcribed from the operator's Go types, its
extraPodSpec as a core Pod. No cluster is started.
"""

from __future__ import annotations

import gzip
import json
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SEED = ROOT / "examples" / "llama33-70b-1b.yaml"
MEDUSA = ROOT / "examples" / "medusa-vicuna-7b.yaml"
DATA = ROOT / "tests" / "data" / "deploy"
K8S_VERSION = "1.33"  # the Kubernetes minor the core objects are validated against
CORE_KINDS = {
    "Pod",
    "Deployment",
    "Job",
    "Service",
    "PersistentVolumeClaim",
    "ConfigMap",
    "HorizontalPodAutoscaler",
    "ServiceAccount",
    "Role",
    "RoleBinding",
}


def _schema(name: str) -> dict:
    raw = (DATA / name).read_bytes()
    return json.loads(gzip.decompress(raw) if name.endswith(".gz") else raw)["schema"]


def validate_core(obj: dict) -> None:
    import kubernetes_validate as kv

    assert kv.validate(obj, K8S_VERSION, strict=True) == K8S_VERSION


def unknown_keys(obj, schema: dict, path: str = "") -> list[str]:
    """Keys the schema does not declare (what the API server would prune without a word)."""
    out = []
    if isinstance(obj, dict) and schema.get("type") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        if props is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out += [f"{path}.{k}" for k in obj if k not in props and extra in (None, False)]
        for k, v in obj.items():
            sub = (props or {}).get(k) or (extra if isinstance(extra, dict) else None)
            if sub:
                out += unknown_keys(v, sub, f"{path}.{k}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(obj):
            out += unknown_keys(v, schema["items"], f"{path}[{i}]")
    return out


def validate_crd(obj: dict, schema: dict) -> None:
    import jsonschema

    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(obj)]
    assert not errors, errors
    assert not unknown_keys(obj, schema)


def validate_pod_spec(spec: dict, name: str = "check") -> None:
    validate_core({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def validate_lws(obj: dict) -> None:
    validate_crd(obj, _schema("lws_v0.10.0_schema.json.gz"))
    tpl = obj["spec"]["leaderWorkerTemplate"]
    for key in ("leaderTemplate", "workerTemplate"):
        validate_pod_spec(tpl[key]["spec"])


def validate_all(files: dict) -> dict[str, int]:
    seen: dict[str, int] = {}
    for objects in files.values():
        for obj in objects:
            kind = obj["kind"]
            seen[kind] = seen.get(kind, 0) + 1
            if kind in CORE_KINDS:
                validate_core(obj)
            elif kind == "LeaderWorkerSet":
                validate_lws(obj)
            elif kind == "DynamoGraphDeployment":
                validate_crd(obj, _schema("dynamo_v1alpha1_schema.json"))
                for svc in obj["spec"]["services"].values():
                    pod = dict(svc["extraPodSpec"])
                    pod["containers"] = [pod.pop("mainContainer")]
                    validate_pod_spec(pod)
            else:
                assert obj["apiVersion"] == "monitoring.coreos.com/v1", kind  # not validated (see docs)
    return seen


def _spec(path):
    from specbuild.core.spec import load_spec

    return load_spec(path)


def test_seed_single_node_triton_validates_and_launches_like_print_launch():
    from specbuild.deploy.triton import REPO_DIR, DeployOptions, triton_manifests
    from specbuild.serve.launch import LaunchLayout, mpirun_argv, orchestrator_env

    spec = _spec(SEED)
    m = triton_manifests(spec, DeployOptions())
    kinds = validate_all(m.files)
    assert kinds == {
        "PersistentVolumeClaim": 1,
        "Pod": 1,  # the loader the README's recipe copies the build, repository and tokenizer through
        "Job": 1,
        "Deployment": 1,
        "Service": 1,
        "PodMonitor": 1,
        "PrometheusRule": 1,
        "HorizontalPodAutoscaler": 1,
    }
    (dep,) = m.files["20-server.yaml"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    layout = LaunchLayout.from_spec_dict(spec.to_dict())
    # the same builder as `serve --print-launch`, bound to the pod's address
    assert c["command"] == mpirun_argv(layout, Path(REPO_DIR), host="0.0.0.0")
    assert {e["name"]: e["value"] for e in c["env"]} == orchestrator_env(layout)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4" == c["resources"]["requests"]["nvidia.com/gpu"]
    assert c["image"] == "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    (job,) = m.files["10-build-job.yaml"]
    assert job["spec"]["template"]["spec"]["containers"][0]["command"] == [
        "bash",
        "/specbuild/build/build.sh",
    ]
    hpa = m.files["40-autoscaling.yaml"][2]
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "triton:queue_compute:ratio"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": dep["metadata"]["name"],
    }
    rule = m.files["40-autoscaling.yaml"][1]
    assert "triton:queue_compute:ratio" in {r["record"] for r in rule["spec"]["groups"][0]["rules"]}
    svc = m.files["30-service.yaml"][0]
    assert {p["port"] for p in svc["spec"]["ports"]} == {8000, 8001, 8002} and svc["spec"][
        "type"
    ] == "ClusterIP"


def test_seed_two_nodes_on_triton_is_refused_with_the_reason():
    from specbuild.core.errors import DeployError
    from specbuild.deploy.triton import DeployOptions, triton_manifests

    with pytest.raises(DeployError, match="orchestrator mode, one node") as exc:
        triton_manifests(_spec(SEED), DeployOptions(nodes=2, image="x"))
    assert "vllm" in exc.value.fix and "Dynamo" in exc.value.fix


def test_seed_two_nodes_on_vllm_validates():
    from specbuild.deploy.vllm import MULTI_NODE_SCRIPT, serve_argv, vllm_manifests

    spec = _spec(SEED)
    files = vllm_manifests(spec, name=spec.name, nodes=2, models_claim="llama-models")
    assert validate_all(files) == {"LeaderWorkerSet": 1, "Service": 1}
    (lws,) = files["20-vllm.yaml"]
    tpl = lws["spec"]["leaderWorkerTemplate"]
    assert tpl["size"] == 2
    leader = tpl["leaderTemplate"]["spec"]["containers"][0]
    assert leader["resources"]["limits"]["nvidia.com/gpu"] == "2"  # 4 GPUs over 2 nodes
    assert f"{MULTI_NODE_SCRIPT} leader" in leader["command"][2]
    assert shlex.join(serve_argv(spec, host="0.0.0.0", model_root="/models")) in leader["command"][2]
    one = vllm_manifests(spec, name=spec.name, models_claim="llama-models")
    assert validate_all(one) == {"Deployment": 1, "Service": 1}
    cmd = one["20-vllm.yaml"][0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[2] == "/models/llama-3.3-70b-instruct"  # the spec's local folders, on the mounted volume
    assert json.loads(cmd[-1])["model"] == "/models/llama-3.2-1b-instruct"


DYNAMO_IMAGE = "registry.example/dynamo-trtllm:tensorrt-llm-1.2.1"  # a runtime built on 1.2.1 (not listed)


def test_seed_two_nodes_on_dynamo_validates():
    from specbuild.deploy.dynamo import dynamo_graph

    # a hand-built LLM-API options dict (what `compile --flow llmapi` writes, trtllm-llmapi.md §10)
    options = {
        "backend": "pytorch",
        "max_batch_size": 8,
        "max_num_tokens": 8192,
        "max_seq_len": 8192,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": False},
        "disable_overlap_scheduler": True,
        "speculative_config": {
            "decoding_type": "DraftTarget",
            "speculative_model": "/models/llama-3.2-1b-instruct",
            "max_draft_len": 5,
        },
    }
    spec = _spec(SEED)
    files = dynamo_graph(
        options,
        version="1.2.1",
        image=DYNAMO_IMAGE,
        name=spec.name,
        model_path="/models/llama-3.3-70b-instruct",
        tp=4,
        nodes=2,
    )
    assert validate_all(files) == {"ConfigMap": 1, "DynamoGraphDeployment": 1}
    cm, dgd = files["20-dynamo.yaml"]
    import yaml

    assert yaml.safe_load(cm["data"]["engine.yaml"])["speculative_config"] == options["speculative_config"]
    worker = dgd["spec"]["services"]["TRTLLMWorker"]
    assert worker["multinode"] == {"nodeCount": 2} and worker["resources"]["limits"]["gpu"] == "2"
    args = worker["extraPodSpec"]["mainContainer"]["args"]
    assert args[args.index("--extra-engine-args") + 1] == "/specbuild-config/engine.yaml"
    assert args[args.index("--max-batch-size") + 1] == "8"


def test_leader_mode_two_nodes_on_triton_validates(tmp_path):
    from specbuild.deploy.triton import KUBESSH, DeployOptions, triton_manifests

    text = (
        MEDUSA.read_text().replace("tp_size: 1", "tp_size: 2").replace("serving: {", "serving: {nodes: 2, ")
    )
    spec_path = tmp_path / "medusa-tp2.yaml"
    spec_path.write_text(text)
    for d in ("models",):
        (tmp_path / d).symlink_to(MEDUSA.parent / d)
    spec = _spec(spec_path)
    m = triton_manifests(spec, DeployOptions(nodes=2, image="registry.example/triton-trtllm-kubectl:26.04"))
    kinds = validate_all(m.files)
    assert kinds["LeaderWorkerSet"] == 1 and kinds["Role"] == 1 and kinds["ConfigMap"] == 1
    lws = m.files["20-server.yaml"][-1]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    script = leader["command"][2]
    name = lws["metadata"]["name"]
    assert f"--host '{name}-$(GROUP_INDEX):1,{name}-$(GROUP_INDEX)-1:1'" in script
    assert f"-mca plm_rsh_agent {KUBESSH} -np 2" in script
    assert "--load-model=tensorrt_llm" in script  # rank 1 loads only the TensorRT-LLM model
    hpa = m.files["40-autoscaling.yaml"][2]
    assert hpa["spec"]["scaleTargetRef"]["kind"] == "LeaderWorkerSet"


def test_unknown_fields_are_caught():
    """The checks above would fail on a typo: strict core schemas, and the pruning walk for CRDs."""
    import kubernetes_validate as kv

    from specbuild.deploy.vllm import vllm_manifests

    spec = _spec(SEED)
    (dep,) = vllm_manifests(spec, name="x", models_claim="m")["20-vllm.yaml"]
    dep["spec"]["replica"] = 2
    with pytest.raises(kv.ValidationError):
        validate_core(dep)
    (lws,) = vllm_manifests(spec, name="x", nodes=2, models_claim="m")["20-vllm.yaml"]
    lws["spec"]["leaderWorkerTemplate"]["sizee"] = 2
    schema = _schema("lws_v0.10.0_schema.json.gz")
    import jsonschema

    assert not list(jsonschema.Draft202012Validator(schema).iter_errors(lws))  # the CRD schema lets it pass
    assert unknown_keys(lws, schema) == [".spec.leaderWorkerTemplate.sizee"]  # the walk does not


def test_vllm_command_for_the_seed_uses_the_named_versions_flags():
    from specbuild.core.facts.vllm import VLLM_VERSION, vllm_facts
    from specbuild.deploy.vllm import gpu_memory_utilization, serve_argv

    spec = _spec(SEED)
    argv = serve_argv(spec)
    facts = vllm_facts()
    assert facts.version == VLLM_VERSION == "0.33.0"
    assert argv[:3] == ["vllm", "serve", "models/llama-3.3-70b-instruct"]
    flags = [a for a in argv if a.startswith("--")]
    assert flags and set(flags) <= facts.serve_flags
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # vLLM's default binds every interface
    cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert cfg == {
        "method": "draft_model",
        "model": "models/llama-3.2-1b-instruct",
        "num_speculative_tokens": 5,
        "rejection_sample_method": "standard",
        "draft_sample_method": "greedy",  # speculation.use_logits: false
        "draft_tensor_parallel_size": 1,
    }
    assert "tensor_parallel_size" not in cfg  # vLLM 0.33.0 raises on it (facts.rejected_keys)
    assert set(cfg) <= facts.speculative_config_keys and cfg["method"] in facts.speculative_methods
    assert argv[argv.index("--tensor-parallel-size") + 1] == "4"
    util = float(argv[argv.index("--gpu-memory-utilization") + 1])
    assert util == gpu_memory_utilization(spec) and 0.5 < util < 1
    # the data file records its source wheel
    assert facts.source["wheel"].startswith("vllm-0.33.0") and len(facts.source["wheel_sha256"]) == 64


def test_vllm_gpu_memory_utilization_follows_the_memory_plan():
    from specbuild.builder.memory_plan import plan_memory
    from specbuild.deploy.vllm import gpu_memory_utilization

    spec = _spec(SEED)
    plan = plan_memory(spec)
    unused = (1 - plan.kv_fraction_total) * plan.free_after_weights_bytes
    assert gpu_memory_utilization(spec) == pytest.approx(1 - unused / plan.gpu_memory_bytes, abs=0.01)


def test_vllm_refuses_medusa_with_the_last_version():
    from specbuild.core.errors import DeployError
    from specbuild.deploy.vllm import serve_argv

    with pytest.raises(DeployError) as exc:
        serve_argv(_spec(MEDUSA))
    assert "0.32.0" in exc.value.found and "0.33.0" in exc.value.found
    from specbuild.core.facts.vllm import vllm_facts

    assert "medusa" not in vllm_facts().speculative_methods


def _seed_as(tmp_path: Path, mode: str, **sections) -> Path:
    """The seed's target with another method (its draft section replaced by `sections`)."""
    import yaml

    raw = yaml.safe_load(SEED.read_text())
    del raw["draft"]
    raw.update(mode=mode, **sections)
    raw["target"]["model"] = str(SEED.parent / raw["target"]["model"])
    if mode == "eagle3":
        raw.update(flow="llmapi")
    path = tmp_path / f"{mode}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_vllm_maps_ngram_to_prompt_lookup(tmp_path):
    """mode ngram -> vLLM's ngram: K, the longest n-gram down to 1, no model; the pool flags unmapped."""
    from specbuild.core.facts.vllm import vllm_facts
    from specbuild.deploy.vllm import gpu_memory_utilization, serve_argv, unmapped, vllm_manifests

    spec = _spec(_seed_as(tmp_path, "ngram", ngram={"max_matching_ngram_size": 3, "is_public_pool": False}))
    argv = serve_argv(spec)
    cfg = json.loads(argv[argv.index("--speculative-config") + 1])
    assert cfg == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "rejection_sample_method": "standard",
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    facts = vllm_facts()
    assert set(cfg) <= facts.speculative_config_keys and cfg["method"] in facts.speculative_methods
    assert any(u.startswith("ngram.is_keep_all / is_use_oldest / is_public_pool") for u in unmapped(spec))
    # no draft weights: the memory plan leaves the engines the same share as the d/t seed or more
    assert gpu_memory_utilization(spec) >= gpu_memory_utilization(_spec(SEED)) - 0.01
    validate_all(vllm_manifests(spec, name=spec.name, models_claim="m"))


def test_vllm_maps_eagle3_to_its_draft_head(tmp_path):
    from specbuild.core.facts.vllm import vllm_facts
    from specbuild.deploy.vllm import check_argv, speculative_config, unmapped

    spec = _spec(_seed_as(tmp_path, "eagle3", eagle3={"model": "heads/e3", "layers_to_capture": [1, 39, 76]}))
    cfg = speculative_config(spec)
    assert cfg == {
        "method": "eagle3",
        "num_speculative_tokens": 5,
        "rejection_sample_method": "standard",
        "model": "heads/e3",
        "draft_sample_method": "greedy",
    }
    assert set(cfg) <= vllm_facts().speculative_config_keys
    check_argv(["vllm", "serve", "m", "--speculative-config", json.dumps(cfg)])
    assert any(u.startswith("eagle3.layers_to_capture") for u in unmapped(spec))
    (tmp_path / "heads" / "e3").mkdir(parents=True)  # a local folder: named on the models volume
    assert speculative_config(spec, model_root="/models")["model"] == "/models/e3"


def test_cli_deploy_writes_a_folder_and_keeps_an_existing_one(tmp_path):
    from typer.testing import CliRunner

    from specbuild.cli import app

    out = tmp_path / "k8s"
    r = CliRunner().invoke(app, ["deploy", str(SEED), "--out", str(out)])
    assert r.exit_code == 0, r.output
    import yaml

    docs = [d for f in sorted(out.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    validate_all({"all": docs})
    assert "*id" not in (out / "20-server.yaml").read_text()  # no YAML aliases
    assert "No cluster was started" in (out / "README.md").read_text()
    again = CliRunner().invoke(app, ["deploy", str(SEED), "--out", str(out)])
    assert again.exit_code != 0
    r = CliRunner().invoke(app, ["deploy", str(SEED), "--engine", "vllm", "--print"])
    assert r.exit_code == 0 and r.output.startswith(
        "vllm serve models/llama-3.3-70b-instruct --host 127.0.0.1"
    )


def test_every_method_is_mapped_to_vllm_or_refused():
    from specbuild.core.facts.vllm import VLLM_REFUSED, vllm_facts
    from specbuild.core.methods import VLLM_METHODS, Method

    for m in Method:
        assert (m.value in VLLM_METHODS) != (m.value in VLLM_REFUSED), m
    assert set(VLLM_METHODS.values()) <= set(vllm_facts().speculative_methods)


def test_cli_dynamo_builds_the_options_compile_writes(tmp_path):
    """Without --options, Dynamo's engine YAML is `compile --flow llmapi`'s options file, key for key, with
    the model folders on the mounted volume; an engine-only method is refused with the matrix's reason."""
    import yaml
    from typer.testing import CliRunner

    from specbuild.cli import app

    r = CliRunner().invoke(app, ["compile", str(SEED), "--flow", "llmapi", "--out", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    compiled = yaml.safe_load((tmp_path / "b" / "llmapi_options.yaml").read_text())
    args = [
        "deploy",
        str(SEED),
        "--engine",
        "dynamo",
        "--models-claim",
        "models",
        "--image",
        DYNAMO_IMAGE,
        "--out",
        str(tmp_path / "k"),
    ]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    cm, dgd = list(yaml.safe_load_all((tmp_path / "k" / "20-dynamo.yaml").read_text()))
    assert validate_all({"20-dynamo.yaml": [cm, dgd]}) == {"ConfigMap": 1, "DynamoGraphDeployment": 1}
    engine = yaml.safe_load(cm["data"]["engine.yaml"])
    draft = engine["speculative_config"].pop("speculative_model")
    assert draft == "/models/llama-3.2-1b-instruct"
    compiled["speculative_config"].pop("speculative_model")
    assert engine == compiled
    worker = dgd["spec"]["services"]["TRTLLMWorker"]["extraPodSpec"]["mainContainer"]["args"]
    assert worker[worker.index("--model-path") + 1] == "/models/llama-3.3-70b-instruct"
    r = CliRunner().invoke(app, ["deploy", str(MEDUSA), "--engine", "dynamo", "--out", str(tmp_path / "m")])
    assert r.exit_code != 0 and "Medusa runs on the TensorRT engine backend only" in r.output
    assert not (tmp_path / "m").exists()


def test_dynamo_engine_options_for_ngram(tmp_path):
    """An n-gram spec on the LLM-API flow: Dynamo's engine YAML carries NGramDecodingConfig, no draft."""
    import yaml
    from typer.testing import CliRunner

    from specbuild.cli import app

    spec = _seed_as(tmp_path, "ngram", flow="llmapi", ngram={"max_matching_ngram_size": 3})
    args = ["deploy", str(spec), "--engine", "dynamo", "--image", DYNAMO_IMAGE, "--models-claim", "m"]
    args += ["--out", str(tmp_path / "k")]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    cm, dgd = list(yaml.safe_load_all((tmp_path / "k" / "20-dynamo.yaml").read_text()))
    assert validate_all({"20-dynamo.yaml": [cm, dgd]}) == {"ConfigMap": 1, "DynamoGraphDeployment": 1}
    engine = yaml.safe_load(cm["data"]["engine.yaml"])
    assert engine["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": 5,
        "max_matching_ngram_size": 3,
        "is_keep_all": True,
        "is_use_oldest": True,
        "is_public_pool": True,
    }
    assert engine["disable_overlap_scheduler"] is True


def test_dynamo_pairs_the_image_with_the_options_release():
    """Each Dynamo runtime ships one TensorRT-LLM (deploy/dynamo.py DYNAMO_TRTLLM, Dynamo's support matrix):
    no listed image ships 1.2.1, so no default; a listed image of another release is refused; an unlisted
    image runs the options preflight before the worker."""
    from specbuild.core.errors import DeployError
    from specbuild.deploy.dynamo import DYNAMO_TRTLLM, RUNTIME_IMAGE, dynamo_graph

    options = {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 3}}
    kw = {"name": "x", "model_path": "/models/t"}
    with pytest.raises(DeployError) as exc:
        dynamo_graph(options, version="1.2.1", **kw)
    assert "no Dynamo tensorrtllm-runtime image ships TensorRT-LLM 1.2.1" in exc.value.message()
    assert "--image" in exc.value.fix
    assert DYNAMO_TRTLLM["0.7.0.post1"] == "1.2.0rc3"  # the old default: predates the speculative_model alias
    with pytest.raises(DeployError, match="ships TensorRT-LLM 1.2.0rc3, the options are written for 1.2.1"):
        dynamo_graph(options, version="1.2.1", image=f"{RUNTIME_IMAGE}:0.7.0.post1", **kw)
    cm, dgd = dynamo_graph(options, version="1.2.1", image=DYNAMO_IMAGE, **kw)["20-dynamo.yaml"]
    main = dgd["spec"]["services"]["TRTLLMWorker"]["extraPodSpec"]["mainContainer"]
    assert main["command"][:2] == ["/bin/sh", "-c"] and "preflight.py" in cm["data"]
    script = main["command"][2]
    assert script.index(
        "/specbuild-config/preflight.py --options /specbuild-config/engine.yaml"
    ) < script.index("exec python3 -m dynamo.trtllm")
    assert "--version 1.2.1" in script and "--model /models/t" in script
