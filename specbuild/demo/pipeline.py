"""One served build through compile -> repo -> serve -> bench, as a small API.

`ServedBuild` describes it: the spec, the output folder, the repository kind and its options. Two drivers
run the same stages from it:

* the commands a user types (`run_compile`, `run_repo`, `serving`, `run_generate`, `run_bench`): each is a
  `specbuild ...` subprocess of this virtualenv, echoed first (commands.run_cli); `serving` runs `specbuild
  serve` in the background (its guardian cleans the process tree up if serve dies) and stops it with
  SIGTERM when the block ends. `make demo` and `make demo-real` drive these;
* in process (`compile_in_process`, `repo_in_process`, `local_server`): the library functions those
  commands call, and a `TritonServer` on free loopback ports (the object tests and benchmarks inspect:
  pids, logs, kill). The lab benchmarks and the end-to-end test fixtures drive these.

Every child process dies with its parent (core/pdeathsig.py): a killed driver leaves no server behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tritonclient.grpc as grpcclient
import yaml

from specbuild.builder.compile import compile_spec
from specbuild.core.deployment import RepoKind
from specbuild.core.errors import SpecbuildError
from specbuild.core.pdeathsig import die_with_parent
from specbuild.core.spec import PATH_KEYS, load_spec
from specbuild.demo.commands import REPO_ROOT, console, env, relative, run_cli, shown, specbuild_exe
from specbuild.model_repo.generate import generate_repo
from specbuild.serve.tritonserver import ServerOptions, TritonServer, free_port

SERVER_READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 60.0  # serve's SIGTERM: tritonserver unloads its models, the stubs end (then SIGKILL)


@dataclass(frozen=True, kw_only=True)
class ServedBuild:
    """A spec compiled with the reference engine into OUT/BUILD_DIR and laid out as a repository of `kind`
    in OUT/REPO_DIR (both replaced on each run)."""

    spec: Path
    out: Path
    kind: RepoKind = RepoKind.ENGINE_LOCAL
    decoupled: bool | None = None  # repo --decoupled / --no-decoupled; None: the spec's, else the kind's
    schedule: str | None = None  # repo --schedule (a schedule the spec cannot hold, or "off")
    build_dir: str = "build"
    repo_dir: str = "repo"

    @property
    def build(self) -> Path:
        return self.out / self.build_dir

    @property
    def repo(self) -> Path:
        return self.out / self.repo_dir

    def compile_args(self) -> list[str]:
        """`specbuild compile` for this build (an LLM-API kind adds `--flow llmapi`)."""
        flow = ["--flow", self.kind.flow.value] if self.kind.llmapi else []
        return [
            "compile",
            str(self.spec),
            *flow,
            "--out",
            str(self.build),
            "--engine",
            "reference",
            "--force",
        ]

    def repo_args(self) -> list[str]:
        """`specbuild repo` for this build."""
        decoupled = [] if self.decoupled is None else ["--decoupled" if self.decoupled else "--no-decoupled"]
        schedule = [] if self.schedule is None else ["--schedule", self.schedule]
        backend = ["--backend", self.kind.backend, *decoupled]
        return ["repo", str(self.build), "--out", str(self.repo), *backend, "--force", *schedule]


# ---------------------------------------------------------------- as a user types them


def run_compile(build: ServedBuild) -> Path:
    run_cli(*build.compile_args())
    return build.build


def run_repo(build: ServedBuild) -> Path:
    run_cli(*build.repo_args())
    return build.repo


def run_trtllm_plan(spec: Path, out: Path) -> Path:
    """`compile --engine trtllm --dry-run` into OUT, its build.sh printed (what a GPU host runs)."""
    run_cli("compile", str(spec), "--out", str(out), "--engine", "trtllm", "--dry-run", "--force")
    script = out / "build.sh"
    if script.is_file():
        print(f"--- {relative(str(script))} (what a GPU host with TensorRT-LLM 1.2.x runs) ---")
        print(script.read_text().rstrip())
        print("---")
    return out


@contextmanager
def serving(repo: Path, log_file: Path) -> Iterator[str]:
    """`specbuild serve REPO` in the background until the block ends; yields HOST:PORT (gRPC)."""
    grpc, http, metrics = free_port(), free_port(), free_port()
    argv = [specbuild_exe(), "serve", str(repo), "--grpc-port", str(grpc), "--http-port", str(http)]
    argv += ["--metrics-port", str(metrics), "--log-file", str(log_file)]
    console().print(f"[bold cyan]$ {shown(argv)} &[/]")
    # its own session (a Ctrl-C here reaches only the driver, which stops it); dies if the driver is killed
    proc = subprocess.Popen(argv, start_new_session=True, env=env(), preexec_fn=die_with_parent())
    url = f"127.0.0.1:{grpc}"
    try:
        _wait_ready(proc, url, log_file)
        yield url
    finally:
        _stop(proc)


def _wait_ready(proc: subprocess.Popen, url: str, log_file: Path) -> None:
    deadline = time.time() + SERVER_READY_TIMEOUT_S
    t0 = time.time()
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SpecbuildError(
                "`specbuild serve` exited before the server was ready",
                expected="a running tritonserver",
                found=f"exit code {proc.returncode}",
                fix=f"see its messages above and the log {log_file}",
            )
        try:
            client = grpcclient.InferenceServerClient(url)
            ready = client.is_server_ready()
            client.close()
            if ready:
                print(f"server ready at {url} after {time.time() - t0:.0f}s")
                return
        except Exception:  # not listening yet
            pass
        time.sleep(1.0)
    raise SpecbuildError(
        "the server did not become ready in time",
        expected=f"ready within {SERVER_READY_TIMEOUT_S:.0f}s",
        found="not ready",
        fix=f"see {log_file}",
    )


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM (serve stops tritonserver and its stubs), then kill the whole session if it lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    print(f"server stopped (exit code {proc.returncode})")


def run_generate(
    url: str, prompt: str, max_tokens: int, *, capture: bool = False
) -> subprocess.CompletedProcess:
    """`specbuild generate --url --stream` (capture: the answer on stdout, its stats line on stderr)."""
    return run_cli(
        "generate",
        "--url",
        url,
        "--prompt",
        prompt,
        "--max-tokens",
        str(max_tokens),
        "--stream",
        capture=capture,
    )


def run_bench(
    url: str,
    prompts: Path,
    out: Path,
    *,
    concurrency: str,
    max_tokens: int,
    temperature: str = "0",
    extra: tuple[str, ...] = (),
) -> Path:
    """`specbuild bench` into OUT (and `extra` options); returns OUT/bench.json."""
    run_cli(
        "bench",
        "--url",
        url,
        "--prompts",
        str(prompts),
        "--concurrency",
        concurrency,
        "--temperature",
        temperature,
        "--max-tokens",
        str(max_tokens),
        "--out",
        str(out),
        *extra,
    )
    return out / "bench.json"


def spec_copy(source: Path, cache: Path) -> dict[str, Any]:
    """An example spec (YAML) with each model path made an absolute path to the same link name in CACHE
    (the examples name the links in the repository's .cache/)."""
    raw = yaml.safe_load(source.read_text())
    for section, key in PATH_KEYS.items():
        if section in raw:
            raw[section][key] = str(Path(cache).absolute() / Path(raw[section][key]).name)
    return raw


def write_spec_copy(raw: dict[str, Any], dest: Path, *, source: Path, by: str) -> Path:
    """RAW (a `spec_copy` of SOURCE) written to DEST with a header naming SOURCE and BY (the make target);
    `tune --write` edits the copy, never the example. Returns DEST, absolute."""
    header = f"# Copied by `{by}` from {os.path.relpath(source, REPO_ROOT)}; tune --write edits this copy.\n"
    dest.write_text(header + yaml.safe_dump(raw, sort_keys=False))
    return dest.resolve()


# ---------------------------------------------------------------- in process


def compile_in_process(build: ServedBuild) -> Path:
    """What `specbuild compile` does for `build`, in this process."""
    flow = {"flow": build.kind.flow.value} if build.kind.llmapi else None
    return compile_spec(load_spec(build.spec, overrides=flow), build.build, engine="reference", force=True)


def repo_in_process(build: ServedBuild) -> Path:
    """What `specbuild repo` does for `build`, in this process."""
    return generate_repo(
        build.build,
        build.repo,
        backend=build.kind.backend,
        force=True,
        schedule=build.schedule,
        decoupled=build.decoupled,
    )


def local_server(repo: Path, **options: Any) -> TritonServer:
    """A tritonserver for REPO on free loopback ports (not started: `with`, or `.launch()` then
    `.wait_ready()` to overlap the loading of several)."""
    ports = {"grpc_port": free_port(), "http_port": free_port(), "metrics_port": free_port()}
    return TritonServer(repo, ServerOptions(**ports, **options))
