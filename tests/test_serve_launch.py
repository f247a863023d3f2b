"""GPU-host launch commands: container pairing and the MPI launch, argv-exact."""

from __future__ import annotations

import json

import pytest

from specbuild.core.errors import ServerError
from specbuild.core.methods import Method
from specbuild.serve.launch import (
    LaunchLayout,
    Mount,
    container_image,
    docker_argv,
    launch_commands,
    mpirun_argv,
    orchestrator_env,
    repo_mounts,
)

TS = "/opt/tritonserver/bin/tritonserver"
PORTS = [
    "--grpc-address=127.0.0.1",
    "--grpc-port=8001",
    "--http-address=127.0.0.1",
    "--http-port=8000",
    "--metrics-address=127.0.0.1",
    "--metrics-port=8002",
]


def test_container_matches_trtllm_version():
    # 1.2.1 ships in 26.04-26.07; 26.04 is the default (the 26.07 README dropped the engine backend)
    assert container_image("1.2.1") == "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"
    assert container_image("1.2.1", tag="26.07") == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    assert container_image("0.19.0") == "nvcr.io/nvidia/tritonserver:25.05-trtllm-python-py3"
    assert container_image("1.1.0") == "nvcr.io/nvidia/tritonserver:26.02-trtllm-python-py3"


def test_container_map_follows_the_backend_dockerfile_pins():
    """r25.11 pins TensorRT-LLM 1.2.0rc2 and r26.03 1.2.0rc8 (ARG TENSORRTLLM_VER), not 1.0.3.2510 / 1.2.0."""
    from specbuild.core.facts.trtllm import containers, known_versions

    assert containers("1.2.0rc2").tags == ("25.11",) and containers("1.2.0rc8").tags == ("26.03",)
    assert (
        containers("1.2.1").tags == ("26.04", "26.05", "26.06", "26.07")
        and containers("1.2.1").default == "26.04"
    )
    assert "1.0.3.2510" not in known_versions() and "1.2.0" not in known_versions()
    assert container_image("1.2.0rc8") == "nvcr.io/nvidia/tritonserver:26.03-trtllm-python-py3"
    with pytest.raises(ServerError):
        container_image("1.2.0")


def test_unknown_trtllm_version_names_the_known_ones():
    with pytest.raises(ServerError, match="1.9.9") as err:
        container_image("1.9.9")
    assert "1.2.1" in err.value.expected


def test_leader_mode_medusa_tp2():
    layout = LaunchLayout(trtllm_version="1.2.1", mode="medusa", target_world_size=2, num_gpus=2)
    assert layout.world_size == 2 and orchestrator_env(layout) == {}
    assert mpirun_argv(layout, "/r") == [
        "mpirun",
        "--allow-run-as-root",
        "-n",
        "1",
        TS,
        "--model-repository=/r",
        *PORTS,
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix0_",
        ":",
        "-n",
        "1",
        TS,
        "--model-repository=/r",
        *PORTS,
        "--model-control-mode=explicit",
        "--load-model=tensorrt_llm",
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix1_",
    ]


def test_orchestrator_mode_draft_target_with_log():
    layout = LaunchLayout(
        trtllm_version="1.2.1", mode="draft_target", target_world_size=2, draft_world_size=1, num_gpus=2
    )
    assert layout.multi_model and layout.world_size == 1
    assert orchestrator_env(layout) == {
        "TRTLLM_ORCHESTRATOR": "1",
        "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1",
    }
    assert mpirun_argv(layout, "/r", log_file="triton_log.txt") == [
        "mpirun",
        "--allow-run-as-root",
        "-n",
        "1",
        TS,
        "--model-repository=/r",
        *PORTS,
        "--log-verbose=3",
        "--log-file=triton_log.txt",
        "--pinned-memory-pool-byte-size=0",
        "--enable-peer-access=false",
        "--cuda-memory-pool-byte-size=0:0",
        "--cuda-memory-pool-byte-size=1:0",
        "--disable-auto-complete-config",
        "--backend-config=python,shm-region-prefix-name=prefix0_",
    ]


def test_docker_run_line():
    from pathlib import Path

    mounts = [
        Mount(Path("/e"), "/e"),
        Mount(Path("/r"), "/r"),
        Mount(Path("/e"), "/e"),
        Mount(Path("/host/build"), "/engines"),
    ]
    argv = docker_argv("img:1", mounts=mounts, env={"B": "2", "A": "1"})
    assert argv == [
        "docker",
        "run",
        "--rm",
        "-it",
        "--net",
        "host",
        "--shm-size=2g",
        "--ulimit",
        "memlock=-1",
        "--ulimit",
        "stack=67108864",
        "--gpus",
        "all",
        "-v",
        "/e:/e:ro",
        "-v",
        "/host/build:/engines:ro",
        "-v",
        "/r:/r:ro",
        "-e",
        "A=1",
        "-e",
        "B=2",
        "img:1",
    ]


def test_nothing_is_mounted_over_the_containers_own_files():
    from pathlib import Path

    with pytest.raises(ServerError, match="/opt/tritonserver"):
        Mount(Path("/opt/tritonserver/backends"), "/opt/tritonserver/backends")


def test_layout_from_spec_dict():
    spec = {
        "trtllm_version": "1.2.1",
        "mode": "draft_target",
        "target": {"tp_size": 2, "pp_size": 2},
        "draft": {"tp_size": 1, "pp_size": 1},
        "serving": {"num_gpus": None},
    }
    assert LaunchLayout.from_spec_dict(spec) == LaunchLayout(
        trtllm_version="1.2.1", mode=Method.DRAFT_TARGET, target_world_size=4, draft_world_size=1, num_gpus=4
    )


def write_repo_manifest(repo, spec):
    """The fields `specbuild repo` records that the launch reads (its resolved spec), the rest minimal."""
    (repo / "specbuild.json").write_text(
        json.dumps(
            {
                "kind": "model_repo",
                "backend": "tensorrtllm",
                "mode": spec["mode"],
                "trtllm_version": spec["trtllm_version"],
                "build_dir": "/engines",
                "models": [],
                "layout": {},
                "spec": spec,
                "files": {},
            }
        )
    )


def _param(key: str, value: str) -> str:
    return f'parameters {{\n  key: "{key}"\n  value {{\n    string_value: "{value}"\n  }}\n}}\n'


def test_launch_commands_from_a_repository(tmp_path):
    from pathlib import Path

    repo = tmp_path / "repo"
    (repo / "tensorrt_llm").mkdir(parents=True)
    (repo / "tensorrt_llm" / "config.pbtxt").write_text(
        _param("gpt_model_path", "/srv/engines/target")
        + _param("tokenizer_dir", "/srv/hf/target")
        + _param("executor_worker_path", "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker")
    )
    write_repo_manifest(
        repo,
        {"trtllm_version": "1.2.1", "mode": "medusa", "target": {"tp_size": 1, "pp_size": 1}, "draft": None},
    )
    assert repo_mounts(repo) == [
        Mount(Path("/srv/engines/target"), "/srv/engines/target"),
        Mount(Path("/srv/hf/target"), "/srv/hf/target"),
        Mount(repo.resolve(), str(repo.resolve())),
    ]
    [argv] = launch_commands(repo)
    image = argv.index("nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3")
    assert argv[image + 1 : image + 3] == ["mpirun", "--allow-run-as-root"]
    assert "/srv/engines/target:/srv/engines/target:ro" in argv and argv.count(TS) == 1
    # executor_worker_path is a path inside the container: mounting it from the host would shadow
    # the container's binary, or make docker refuse to start where the host has no such file
    assert not any(a.startswith("/opt/tritonserver") for a in argv[:image])


def test_a_local_repository_gets_no_container_launch(tmp_path):
    """A repository for the bundled CPU server (its tensorrt_llm is specbuild's stand-in) is refused by
    the GPU launch, by its recorded kind (and, for an older manifest, by its backend field)."""
    repo = tmp_path / "repo"
    (repo / "tensorrt_llm").mkdir(parents=True)
    spec = {
        "trtllm_version": "1.2.1",
        "mode": "medusa",
        "target": {"tp_size": 1, "pp_size": 1},
        "draft": None,
    }
    write_repo_manifest(repo, spec)
    raw = json.loads((repo / "specbuild.json").read_text())
    for fields in ({"repo_kind": "engine-local"}, {"backend": "python"}):
        (repo / "specbuild.json").write_text(json.dumps({**raw, **fields}))
        with pytest.raises(ServerError, match="local repository") as err:
            launch_commands(repo)
        assert "--backend tensorrtllm" in err.value.expected and "specbuild serve REPO" in err.value.fix


def test_launch_without_manifest_is_explained(tmp_path):
    with pytest.raises(ServerError, match="cannot read the deployment layout"):
        launch_commands(tmp_path)


def test_serve_print_launch_cli(tmp_path):
    from typer.testing import CliRunner

    from specbuild.cli import app

    repo = tmp_path / "repo"
    (repo / "tensorrt_llm").mkdir(parents=True)
    (repo / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\n')
    write_repo_manifest(
        repo,
        {
            "trtllm_version": "1.2.1",
            "mode": "draft_target",
            "target": {"tp_size": 1, "pp_size": 1},
            "draft": {"tp_size": 1, "pp_size": 1},
        },
    )
    result = CliRunner().invoke(
        app, ["serve", str(repo), "--print-launch", "--container-tag", "26.05", "--grpc-port", "9001"]
    )
    assert result.exit_code == 0, result.output
    line = result.output.strip()
    assert line.startswith("docker run --rm -it --net host")
    assert (
        "-e TRTLLM_ORCHESTRATOR=1" in line
        and "nvcr.io/nvidia/tritonserver:26.05-trtllm-python-py3 mpirun" in line
    )
    assert "--grpc-port=9001" in line and "--cuda-memory-pool-byte-size=0:0" in line
