"""What a server pod of `specbuild deploy` sees: every path its configs and commands name lies under one of
its mounts, and every device it asks for is one the pod has.

* Triton (engine flow): the README's recipe, run as written on this host (compile, repo build with the
  pod's paths, the tokenizer copy), then the copy into the volume emulated as `kubectl cp` would do it:
  every path parameter of every config.pbtxt is under the pod's mounts and names what the volume holds;
  with the paths mapped to a folder here, the same repository (Python backend) loads in the local
  tritonserver and answers.
* Several nodes (a Medusa engine, TP 2 over 2 pods of 1 GPU): the checkpoint's mapping.gpus_per_node and
  the repository's gpu_device_ids put every rank on a device of its own pod under TensorRT-LLM's rule
  (engines/trtllm/ckpt_config.py names the upstream files).
* vLLM / SGLang / Dynamo: without --models-claim a spec naming host folders is refused with the flag that
  fixes it; hub ids are written as they are; with a claim the model paths are under the mounted volume.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_deploy import SEED, validate_all

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "examples" / "tiny"
CONTAINER_ROOT = "/opt/tritonserver"  # paths inside the image (executor_worker_path), not on a mount


def _config_parameters(repo: Path) -> dict[str, dict[str, str]]:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    out = {}
    for path in sorted(repo.glob("*/config.pbtxt")):
        cfg = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        out[path.parent.name] = {k: v.string_value for k, v in cfg.parameters.items()}
    return out


def _tiny_spec(work: Path, name: str, *, target_dir: Path, draft_dir: Path | None = None, **edits) -> Path:
    """examples/tiny/<name> beside copies of the tiny models (and Medusa heads), `edits` merged per
    section."""
    from repo_builds import make_heads

    work.mkdir(parents=True)
    raw = yaml.safe_load((TINY / name).read_text())
    for section, values in edits.items():
        raw.setdefault(section, {}).update(values)
    (work / name).write_text(yaml.safe_dump(raw))
    shutil.copytree(target_dir, work / "target")
    if draft_dir is not None:
        shutil.copytree(draft_dir, work / "draft")
    if raw["mode"] == "medusa":
        cfg = json.loads((target_dir / "config.json").read_text())
        make_heads(work / "medusa_heads", hidden=cfg["hidden_size"], vocab=cfg["vocab_size"], heads=3)
    return work / name


def _run_host_steps(recipe, cwd: Path, replace: dict[str, str] | None = None) -> None:
    """Run the recipe's build-host steps as written (bash, `specbuild` from this virtualenv)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for what, command in recipe:
        if not what.startswith("build host"):
            continue
        for old, new in (replace or {}).items():
            command = command.replace(old, new)
        proc = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, f"{what}: {command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"


def _copy_in(recipe, host: Path, volume: Path, mount: str) -> None:
    """The recipe's `kubectl cp DIR loader:MOUNT/DIR` steps, onto a folder standing for the volume."""
    copies = [c for what, c in recipe if "kubectl cp" in c]
    assert copies, "the recipe copies nothing into the volume"
    for part in copies[0].split(" && "):
        _, _, src, dest = part.split()
        target = dest.split(":", 1)[1]
        assert target.startswith(mount + "/")
        shutil.copytree(host / src, volume / target.removeprefix(mount + "/"))


def _server_mounts(files) -> list[str]:
    (dep,) = [o for o in files["20-server.yaml"] if o["kind"] in ("Deployment", "LeaderWorkerSet")]
    spec = dep["spec"]["template"]["spec"] if dep["kind"] == "Deployment" else None
    if spec is None:
        spec = dep["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    return [m["mountPath"] for m in spec["containers"][0]["volumeMounts"]]


def test_recipe_gives_a_repository_whose_paths_lie_in_the_pod(tmp_path, tiny_target, tiny_draft):
    from transformers import AutoTokenizer

    from specbuild.core.spec import load_spec
    from specbuild.deploy.triton import BUILD_DIR, MOUNT, TOKENIZER_DIR, DeployOptions, triton_manifests
    from specbuild.engines.trtllm.plan import build_plan

    host = tmp_path / "host"
    spec = load_spec(_tiny_spec(host, "draft-target.yaml", target_dir=tiny_target, draft_dir=tiny_draft))
    m = triton_manifests(spec, DeployOptions())
    validate_all(m.files)
    mounts = _server_mounts(m.files)
    assert MOUNT in mounts
    _run_host_steps(m.recipe, host)
    volume = tmp_path / "volume"
    _copy_in(m.recipe, host, volume, MOUNT)

    engines = {f"{BUILD_DIR}/{p.output_dir}": p for p in build_plan(spec)}
    params = _config_parameters(volume / "repo")
    seen = set()
    for model, values in params.items():
        for key, value in values.items():
            if not value.startswith("/") or value.startswith(CONTAINER_ROOT + "/"):
                continue
            assert any(value == d or value.startswith(d.rstrip("/") + "/") for d in mounts), (
                model,
                key,
                value,
            )
            local = volume / value.removeprefix(MOUNT + "/")
            if key == "gpt_model_path":  # built in the pod by the Job from the checkpoint beside build.sh
                plan = engines[value]
                assert (volume / "build" / plan.checkpoint_dir / "config.json").is_file()
                assert (volume / "build" / "build.sh").is_file()
            else:
                assert key == "tokenizer_dir" and value == TOKENIZER_DIR, (model, key, value)
                assert local.is_dir()
            seen.add((model, key))
    # every model that names a tokenizer names the pod's (preprocessing, postprocessing, BLS, both engines)
    assert {m for m, k in seen if k == "tokenizer_dir"} >= {"preprocessing", "postprocessing", "tensorrt_llm"}
    assert {m for m, k in seen if k == "gpt_model_path"} >= {"tensorrt_llm", "tensorrt_llm_draft"}
    # the copied tokenizer is the target's (same ids), without the weights
    text = "speculative decoding in a pod"
    copied = AutoTokenizer.from_pretrained(str(volume / "tokenizer"))
    assert copied(text)["input_ids"] == AutoTokenizer.from_pretrained(str(tiny_target))(text)["input_ids"]
    assert not list((volume / "tokenizer").glob("*.safetensors"))
    readme_steps = [c for _, c in m.recipe]
    from specbuild.deploy.readme import readme_for

    readme = readme_for(spec, "triton", m.files, m.commands, list(m.notes), nodes=1, recipe=m.recipe)
    assert all(c in readme for c in readme_steps)  # the README carries the recipe the test ran


@pytest.mark.slow
def test_the_recipes_repository_loads_with_paths_mapped_to_a_local_folder(tmp_path, tiny_target, tiny_draft):
    """The same recipe with reference engines and the Python backend (what runs on this CPU): mapping the
    pod's mount to a local folder, the repository loads in the local tritonserver and answers."""
    from specbuild.client.remote import generate_remote
    from specbuild.core.sampling_params import SamplingParams
    from specbuild.core.spec import load_spec
    from specbuild.deploy.triton import MOUNT, DeployOptions, triton_manifests
    from specbuild.serve.tritonserver import ServerOptions, TritonServer, free_port

    host = tmp_path / "host"
    one_bls = {"bls_instance_count": 1}  # fewer Python stubs to start on a shared CPU
    spec = load_spec(
        _tiny_spec(host, "draft-target.yaml", target_dir=tiny_target, draft_dir=tiny_draft, serving=one_bls)
    )
    m = triton_manifests(spec, DeployOptions())
    local = {"--engine trtllm --dry-run": "--engine reference", "--backend tensorrtllm": "--backend python"}
    _run_host_steps(m.recipe, host, replace=local)
    volume = tmp_path / "volume"
    _copy_in(m.recipe, host, volume, MOUNT)
    for cfg in (volume / "repo").glob("*/config.pbtxt"):  # the mount, at a folder of this host
        cfg.write_text(cfg.read_text().replace(f'"{MOUNT}/', f'"{volume}/'))
    # loading six Python models while the rest of the suite runs its own servers can take minutes here
    ports = {"grpc_port": free_port(), "http_port": free_port(), "metrics_port": free_port()}
    opts = ServerOptions(**ports, ready_timeout_s=900)
    with TritonServer(volume / "repo", opts) as server:
        result = generate_remote(server.grpc_url, "a pod", SamplingParams(max_tokens=4), timeout_s=120)
    assert result.token_ids and len(result.token_ids) <= 4


def test_two_nodes_put_every_rank_on_a_device_of_its_pod(tmp_path, tiny_target):
    """Medusa (one engine, leader mode) at TP 2 over 2 pods of 1 GPU. TensorRT-LLM's executor takes GPUs
    per node from the engine's mapping.gpus_per_node, refuses device ids not below it and runs rank r on
    gpu_device_ids[r % len] (WorldConfig, engines/trtllm/ckpt_config.py): each rank's device must exist in
    the pod that runs it."""
    from specbuild.builder.compile import compile_spec
    from specbuild.core.spec import load_spec
    from specbuild.deploy.triton import BUILD_DIR, TOKENIZER_DIR, DeployOptions, triton_manifests
    from specbuild.model_repo.generate import generate_repo

    work = tmp_path / "host"
    path = _tiny_spec(
        work, "medusa.yaml", target_dir=tiny_target, target={"tp_size": 2}, serving={"nodes": 2}
    )
    spec = load_spec(path)
    build = compile_spec(spec, work / "build", engine="reference")
    repo = generate_repo(
        build, work / "repo", backend="tensorrtllm", engine_root=BUILD_DIR, tokenizer_dir=TOKENIZER_DIR
    )
    m = triton_manifests(spec, DeployOptions(nodes=2, image="registry.example/triton-trtllm-kubectl:26.04"))
    validate_all(m.files)
    lws = m.files["20-server.yaml"][-1]["spec"]["leaderWorkerTemplate"]
    pod_gpus = {
        int(t["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        for t in (lws["leaderTemplate"], lws["workerTemplate"])
    }
    assert pod_gpus == {1} and lws["size"] == 2
    (per_pod,) = pod_gpus
    mapping = json.loads((build / "target" / "checkpoint" / "config.json").read_text())["mapping"]
    engine = json.loads((build / "target" / "engine" / "config.json").read_text())["pretrained_config"][
        "mapping"
    ]
    assert mapping == engine and mapping["world_size"] == 2
    ids = [int(i) for i in _config_parameters(repo)["tensorrt_llm"]["gpu_device_ids"].split(",")]
    gpus_per_node = mapping["gpus_per_node"]
    assert gpus_per_node == per_pod
    assert len(ids) <= gpus_per_node and max(ids) < gpus_per_node  # WorldConfig's checks
    ranks_per_pod = mapping["world_size"] // lws["size"]  # mpirun --host <pod>:<G>: G ranks a pod
    for rank in range(mapping["world_size"]):
        assert rank // ranks_per_pod < lws["size"]
        assert ids[rank % len(ids)] < per_pod, f"rank {rank} asks for device {ids[rank % len(ids)]}"
    plan = json.loads((build / "plan.json").read_text())
    assert plan["nodes"] == 2 and plan["gpus_per_node"] == 1


def test_triton_refuses_nodes_the_engines_were_not_built_for(tmp_path):
    from specbuild.core.errors import DeployError
    from specbuild.core.spec import load_spec
    from specbuild.deploy.triton import DeployOptions, triton_manifests

    raw = yaml.safe_load((ROOT / "examples" / "medusa-vicuna-7b.yaml").read_text())
    raw["target"]["tp_size"] = 2
    raw["target"]["model"] = str(ROOT / "examples" / raw["target"]["model"])
    raw["medusa"]["heads"] = str(ROOT / "examples" / raw["medusa"]["heads"])
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(raw))
    spec = load_spec(tmp_path / "m.yaml")  # serving.nodes: 1 (the default)
    assert spec.gpus_per_node == 2
    with pytest.raises(DeployError) as exc:
        triton_manifests(spec, DeployOptions(nodes=2, image="x"))
    assert "serving.nodes: 2" in exc.value.fix and "--nodes 2" in exc.value.found


# ---- the seed spec at 1 and 2 nodes --------------------------------------------------------------------


def test_seed_on_one_node_triton_names_the_pods_tokenizer_and_engines():
    from specbuild.core.spec import load_spec
    from specbuild.deploy.triton import BUILD_DIR, MOUNT, TOKENIZER_DIR, DeployOptions, triton_manifests

    spec = load_spec(SEED)
    m = triton_manifests(spec, DeployOptions())
    assert MOUNT in _server_mounts(m.files)
    (repo_step,) = [c for _, c in m.recipe if c.startswith("specbuild repo build")]
    assert f"--tokenizer-dir {TOKENIZER_DIR}" in repo_step and f"--engine-root {BUILD_DIR}" in repo_step
    (dep,) = m.files["20-server.yaml"]
    gpus = int(dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
    assert gpus == spec.gpus_per_node == 4  # tp 4 on one node; the draft shares GPU 0


@pytest.mark.parametrize("engine", ["vllm", "sglang", "dynamo"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_seed_models_are_on_the_pods_volume(tmp_path, engine, nodes):
    from typer.testing import CliRunner

    from specbuild.cli import app

    out = tmp_path / "k"
    args = ["deploy", str(SEED), "--engine", engine, "--nodes", str(nodes), "--models-claim", "llama"]
    if engine == "dynamo":
        args += ["--image", "registry.example/dynamo-trtllm:tensorrt-llm-1.2.1"]
    r = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    docs = [d for f in sorted(out.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())]
    validate_all({"all": docs})
    text = "\n".join(f.read_text() for f in out.glob("*.yaml"))
    for folder in ("llama-3.3-70b-instruct", "llama-3.2-1b-instruct"):
        assert f"/models/{folder}" in text and f"models/{folder}" not in text.replace(f"/models/{folder}", "")
    pods = []
    for d in docs:
        if d["kind"] == "Deployment":
            pods.append(d["spec"]["template"]["spec"])
        elif d["kind"] == "LeaderWorkerSet":
            t = d["spec"]["leaderWorkerTemplate"]
            pods += [t["leaderTemplate"]["spec"], t["workerTemplate"]["spec"]]
        elif d["kind"] == "DynamoGraphDeployment":
            pods.append(d["spec"]["services"]["TRTLLMWorker"]["extraPodSpec"]["mainContainer"])
    assert pods
    for pod in pods:
        containers = pod.get("containers") or [pod]
        for c in containers:
            assert {"mountPath": "/models", "name": "models", "readOnly": True} in c["volumeMounts"]
            gpus = (c.get("resources") or {}).get("limits", {}).get("nvidia.com/gpu")
            assert gpus in (None, str(4 // nodes))  # tp 4 split over the nodes


# ---- no claim ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["vllm", "sglang", "dynamo"])
def test_host_folders_without_a_claim_are_refused_with_the_flag(tmp_path, engine):
    from typer.testing import CliRunner

    from specbuild.cli import app

    args = ["deploy", str(SEED), "--engine", engine, "--out", str(tmp_path / "k")]
    if engine == "dynamo":
        args += ["--image", "registry.example/dynamo-trtllm:tensorrt-llm-1.2.1"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code != 0
    assert "--models-claim" in r.output and "target.model: models/llama-3.3-70b-instruct" in r.output
    assert not (tmp_path / "k").exists()


def test_hub_ids_are_written_as_named_without_a_volume(tmp_path, monkeypatch):
    """Hub ids in the local Hugging Face cache (the memory plan reads their config.json) stay hub ids."""
    import huggingface_hub.constants

    from specbuild.core.spec import load_spec
    from specbuild.deploy.sglang import sglang_manifests
    from specbuild.deploy.vllm import vllm_manifests

    cache = tmp_path / "hf"
    for repo, folder in (
        ("Llama-3.3-70B-Instruct", "llama-3.3-70b-instruct"),
        ("Llama-3.2-1B-Instruct", "llama-3.2-1b-instruct"),
    ):
        base = cache / f"models--meta-llama--{repo}"
        (base / "snapshots" / "0").mkdir(parents=True)
        (base / "refs").mkdir()
        (base / "refs" / "main").write_text("0")
        shutil.copy(SEED.parent / "models" / folder / "config.json", base / "snapshots" / "0" / "config.json")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    raw = yaml.safe_load(SEED.read_text())
    raw["target"]["model"] = "meta-llama/Llama-3.3-70B-Instruct"
    raw["draft"]["model"] = "meta-llama/Llama-3.2-1B-Instruct"
    (tmp_path / "hub.yaml").write_text(yaml.safe_dump(raw))
    spec = load_spec(tmp_path / "hub.yaml")
    for files in (vllm_manifests(spec, name="hub"), sglang_manifests(spec, name="hub")):
        validate_all(files)
        pod = next(o for f in files.values() for o in f if o["kind"] == "Deployment")["spec"]["template"]
        (c,) = pod["spec"]["containers"]
        assert "meta-llama/Llama-3.3-70B-Instruct" in c["command"]
        assert "meta-llama/Llama-3.2-1B-Instruct" in " ".join(c["command"])
        assert all(m["mountPath"] != "/models" for m in c["volumeMounts"])
