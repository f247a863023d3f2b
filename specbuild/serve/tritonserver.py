"""Run the bundled tritonserver on a model repository: start, wait until every model is ready, stop.

`TritonServer` is a context manager; it never leaves a server behind: the server runs in its own
process group (the Python-backend stubs are its children and the engine processes theirs, so they are in
it too). On stop, and on interpreter exit (atexit), tritonserver gets SIGTERM (it unloads its models,
which ends the stubs), then whatever is left of the group SIGKILL. The server's Python-backend regions
carry a prefix of their own, and whatever of them is left in /dev/shm after the stop (stubs that ended on
the signal, a crash) is removed. When the owning process dies without stopping (SIGKILL), the kernel
kills tritonserver (PR_SET_PDEATHSIG) and the server's guardian (guardian.py) kills the rest of the group
and removes the regions. `check_alive()` also watches the stubs: tritonserver 2.51 keeps a model whose
stub died READY, so a dead stub is a ServerError naming the model (server_watch.py).
"""

from __future__ import annotations

import atexit
import errno
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specbuild.core.addresses import check_port
from specbuild.core.artifacts import RepoManifest, read_artifact
from specbuild.core.deployment import RepoKind
from specbuild.core.errors import ServerError, SpecbuildError
from specbuild.core.launch import tritonserver_argv
from specbuild.core.pdeathsig import die_with_parent
from specbuild.serve import guardian
from specbuild.serve.bundle import TritonBundle, check_libpython, find_bundle
from specbuild.serve.server_watch import (
    BLS_COUNTER_PREFIX,
    dead,
    fatal_lines,
    remove_bls_counters,
    remove_shm,
    shm_prefix,
    stub_processes,
    wait_group_gone,
    waits_on_a_child,
)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_GRPC_PORT = 8001
DEFAULT_HTTP_PORT = 8000
DEFAULT_METRICS_PORT = 8002
READY_TIMEOUT_S = 300.0  # model loading of the reference engines takes seconds; bigger models longer
# tritonserver --exit-timeout-secs: on stop, the grace for in-flight requests and then for unloading the
# models. 2.51 unloads a Python model's instances one after another, each at least 1 s (the stub health
# check in ~ModelInstanceState) plus its finalize and the stub's exit: the demo's 4-instance BLS took
# 15 s at load 5-8 (5 s left it and tensorrt_llm loaded when the server exited). A server whose timeout
# runs out exits with stubs still running; they end without their finalize (SIGKILL from stop()).
EXIT_TIMEOUT_S = 20
# A Python-backend stub that misses tritonserver 2.51's health check while its model initializes (its
# health thread did not run for 1 s: a stopped or starved process, as when tens of stubs start at once on 2
# busy cores) leaves the load hanging for good, with nothing in the log: the server waits for that stub to
# exit and the stub waits for its next command (server_watch.waits_on_a_child; the mechanism and how it was
# found: lab/notebook/2026-12-05-stub-launch-hang.md). Such a wait, this long, is that hang (a stub whose
# initialize failed exits and is reaped at once); the server is then started again, LOAD_RESTARTS times.
STUB_HANG_S = 10.0
LOAD_RESTARTS = 1
LOG_READ_BYTES = 8 * 2**20  # the most of a server log read back (its tail) to explain a failure

# Log lines of a CPU host that are not errors of ours (no CUDA driver, no NVML / DCGM).
_HARMLESS = ("CudaDriverHelper", "NVML", "DCGM", "pinned memory pool", "CUDA memory pool")
_ERROR_LINE = re.compile(
    r"^E\d{4} |failed to load|UNAVAILABLE|Error|error:|Traceback|Exception", re.IGNORECASE
)


class StubLaunchHang(ServerError):
    """tritonserver 2.51 hangs in a failed stub launch (STUB_HANG_S)."""


@dataclass(frozen=True, kw_only=True)
class ServerOptions:
    """Where the server listens and what it does with its log."""

    host: str = DEFAULT_HOST  # every endpoint binds here; loopback unless the user asks otherwise
    grpc_port: int = DEFAULT_GRPC_PORT
    http_port: int = DEFAULT_HTTP_PORT
    metrics_port: int = DEFAULT_METRICS_PORT
    log_file: Path | None = None  # None: a new file in the temp folder (its path is in .log_path)
    log_verbose: int = 0  # tritonserver --log-verbose level
    ready_timeout_s: float = READY_TIMEOUT_S
    exit_timeout_s: int = EXIT_TIMEOUT_S

    @property
    def ports(self) -> dict[str, int]:
        return {"grpc": self.grpc_port, "http": self.http_port, "metrics": self.metrics_port}


_HANDED_OUT: set[int] = set()  # ports free_port gave this process: the OS may offer a closed one again
_FREE_PORT_TRIES = 64


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port the OS reports free right now and this process has not been given before (tests use it
    for loopback servers). Without the second condition two calls in a row could return the same
    port (the OS reuses an ephemeral port once its socket is closed), and a server asked for it as
    both its gRPC and its HTTP port fails to start."""
    for _ in range(_FREE_PORT_TRIES):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise ServerError(
        "no free loopback port",
        expected=f"a port this process has not used, within {_FREE_PORT_TRIES} tries",
        found=f"{len(_HANDED_OUT)} ports handed out already",
        fix="pass explicit ports",
    )


def check_host(host: str) -> None:
    """Refuse an address this machine cannot bind (not an IP of one of its interfaces, or unresolvable)."""
    try:
        infos = socket.getaddrinfo(host, None, 0, socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        raise ServerError(
            f"cannot use --host {host}",
            expected="an address of this machine (127.0.0.1 by default) or a name that resolves to one",
            found=str(exc),
            fix="pass --host 127.0.0.1, or an address `ip addr` lists",
        ) from None
    family, address = infos[0][0], infos[0][4][0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, 0))
        except OSError as exc:
            raise ServerError(
                f"--host {host} is not an address of this machine",
                expected="an address of one of its interfaces",
                found=f"{address}: {exc.strerror}",
                fix="pass --host 127.0.0.1, or an address `ip addr` lists",
            ) from None


def check_ports_free(options: ServerOptions) -> None:
    """Refuse a bad host, and a busy or repeated port, before starting, naming the option that picks it.

    The probe sets SO_REUSEADDR, as tritonserver's own sockets do: a port whose last server stopped
    moments ago (connections in TIME_WAIT) is free to reuse, not busy."""
    check_host(options.host)
    seen: dict[int, str] = {}
    for name, port in options.ports.items():
        if port in seen:
            raise ServerError(
                f"--{name}-port and --{seen[port]}-port are both {port}",
                expected="three different ports (grpc, http, metrics)",
                found=str(port),
                fix=f"pass another --{name}-port",
            )
        seen[port] = name
        check_port(port, option=f"--{name}-port", error=ServerError)
        family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((options.host, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise ServerError(
                        f"cannot bind the {name} port {options.host}:{port}",
                        found=exc.strerror or str(exc),
                        fix=f"pass another --{name}-port (ports below 1024 need privileges)",
                    ) from None
                raise ServerError(
                    f"the {name} port {options.host}:{port} is busy",
                    expected="a free port",
                    found=f"{exc.strerror} (another server, maybe an earlier tritonserver, is listening)",
                    fix=f"stop that process or pass --{name}-port with a free port",
                ) from None


def server_argv(
    binary: Path, backend_dir: Path, repo: Path, options: ServerOptions, *, shm_prefix: str | None = None
) -> list[str]:
    """The tritonserver command line (pure; tested argv-exact). shm_prefix: the Python backend's
    shared-memory region prefix (unique per server, so its leftovers can be found)."""
    host = options.host
    extra = [f"--backend-config=python,shm-region-prefix-name={shm_prefix}"] if shm_prefix else []
    base = tritonserver_argv(
        str(repo),
        binary=str(binary),
        host=host,
        grpc_port=options.grpc_port,
        http_port=options.http_port,
        metrics_port=options.metrics_port,
        backend_dir=str(backend_dir),
    )
    return [
        *base,
        f"--exit-timeout-secs={options.exit_timeout_s}",
        f"--log-verbose={options.log_verbose}",
        *extra,
    ]


def repo_models(repo: Path) -> list[str]:
    """Model names of a repository: its sub-folders with a config.pbtxt."""
    return sorted(p.parent.name for p in repo.glob("*/config.pbtxt"))


def important_log_lines(log: str, limit: int = 25) -> list[str]:
    """The lines of a server log that explain a failure (errors, load failures, Python tracebacks)."""
    lines = [
        line
        for line in log.splitlines()
        if _ERROR_LINE.search(line) and not any(h in line for h in _HARMLESS)
    ]
    return lines[-limit:]


def recorded_kind(repo: Path) -> RepoKind | None:
    """The repository kind its manifest records (None: no readable specbuild repository manifest)."""
    try:
        manifest = read_artifact(repo)
    except SpecbuildError:
        return None
    return manifest.kind if isinstance(manifest, RepoManifest) else None


class TritonServer:
    """A running tritonserver for one repository. Use as `with TritonServer(repo, opts) as srv:`."""

    def __init__(
        self, repo: Path, options: ServerOptions | None = None, *, bundle: TritonBundle | None = None
    ):
        self.repo = Path(repo).resolve()
        self.options = options or ServerOptions()
        self._bundle = bundle
        self._proc: subprocess.Popen | None = None
        self._guardian: subprocess.Popen | None = None  # cleans up if this process dies (guardian.py)
        self._workdir: tempfile.TemporaryDirectory | None = None
        self._models: list[str] = []
        self.log_path: Path | None = None
        self._shm_prefix = shm_prefix()
        self._stubs: dict = {}  # pid -> server_watch.Stub, recorded when every model is READY
        self._ready_at: int | None = None  # log size when the server became ready (what follows: serving)
        self.load_restarts: list[str] = []  # why it was started again while it loaded (StubLaunchHang)

    # ---- addresses -------------------------------------------------------------------------
    @property
    def grpc_url(self) -> str:
        return f"{self.options.host}:{self.options.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.options.host}:{self.options.http_port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def log_text(self, since: int = 0, max_bytes: int = LOG_READ_BYTES) -> str:
        """The log from byte `since` on, at most its last `max_bytes` (a long-running server's log can be
        large)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(since, size - max_bytes))
            return f.read().decode(errors="replace")

    def _log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path is not None and self.log_path.exists() else 0

    # ---- lifecycle -------------------------------------------------------------------------
    def start(self, *, on_progress: Callable[[int, int], None] | None = None) -> TritonServer:
        """Start the server and block until every model of the repository is READY."""
        self.launch()
        return self.wait_ready(on_progress=on_progress)

    def launch(self) -> TritonServer:
        """Start the server process without waiting (call from the main thread: the process dies with
        the thread that started it). `wait_ready()` completes the start."""
        self._models = repo_models(self.repo)
        if not self._models:
            raise ServerError(
                f"{self.repo} is not a Triton model repository",
                expected="sub-folders with a config.pbtxt (ensemble/, preprocessing/, tensorrt_llm/, ...)",
                found="none",
                fix="generate one with `specbuild repo BUILD_DIR OUT --backend python`",
            )
        gpu_only = [
            m
            for m in self._models
            if 'backend: "tensorrtllm"' in (self.repo / m / "config.pbtxt").read_text()
        ]
        kind = recorded_kind(self.repo)
        if kind is not None and not kind.local and not gpu_only:  # upstream's LLM-API model.py
            gpu_only = [kind.entry_model]
        local_kind = RepoKind.of(kind.flow, local=True) if kind else RepoKind.ENGINE_LOCAL
        if gpu_only:
            raise ServerError(
                f"{self.repo} is a production repository: {', '.join(gpu_only)} "
                + (f"run TensorRT-LLM's {kind.flow} flow" if kind else "use the TensorRT-LLM C++ backend"),
                expected="a local repository (repo --backend python | llmapi-local) for the bundled CPU "
                "tritonserver",
                found=f"repo_kind {kind.value} (--backend {kind.backend})"
                if kind
                else 'backend: "tensorrtllm"',
                fix="on a GPU host run the container (`specbuild serve REPO --print-launch`); locally "
                "generate "
                f"`specbuild repo BUILD_DIR OUT --backend {local_kind.backend}`",
            )
        check_ports_free(self.options)
        bundle = self._bundle or find_bundle()
        self._workdir = tempfile.TemporaryDirectory(prefix="specbuild-triton-")
        work = Path(self._workdir.name)
        backend_dir = bundle.make_backend_dir(work / "backends")
        env = bundle.env()
        check_libpython(bundle, env)
        if self.options.log_file:
            self.log_path = Path(self.options.log_file)
        else:  # outside the work folder: the log stays readable after stop()
            fd, name = tempfile.mkstemp(prefix="specbuild-tritonserver-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = server_argv(bundle.binary, backend_dir, self.repo, self.options, shm_prefix=self._shm_prefix)
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=work,
                start_new_session=True,
                preexec_fn=die_with_parent(),  # the kernel kills it if this process dies
            )
        atexit.register(self.stop)
        pid = self._proc.pid
        try:
            self._guardian = guardian.start(pid, [self._shm_prefix, f"{BLS_COUNTER_PREFIX}{pid}-"])
        except BaseException:
            self.kill()
            self.stop()
            raise
        return self

    def wait_ready(self, *, on_progress: Callable[[int, int], None] | None = None) -> TritonServer:
        """Block until every model is READY; on failure stop the server and raise ServerError. A load that
        hangs in a failed stub launch (StubLaunchHang) is started again, at most LOAD_RESTARTS times, each
        reason kept in `load_restarts`."""
        while True:
            try:
                self._wait_ready(self._models, on_progress)
                return self
            except StubLaunchHang as exc:
                self.kill()  # it serves nothing yet, and SIGTERM would wait out the exit timeout
                self.stop()
                if len(self.load_restarts) >= LOAD_RESTARTS:
                    raise
                self.load_restarts.append(f"{exc.what}: {exc.found}")
            except BaseException:
                self.stop()
                raise
            self.launch()

    def _wait_ready(self, models: list[str], on_progress: Callable[[int, int], None] | None) -> None:
        deadline = time.monotonic() + self.options.ready_timeout_s
        hung_since: float | None = None  # since when tritonserver waits for a stub to exit
        while True:
            if self._proc.poll() is not None:
                raise self._died("while loading the models")
            states = self.model_states()
            ready = sum(states.get(m, ("", ""))[0] == "READY" for m in models)
            if on_progress:
                on_progress(ready, len(models))
            if ready == len(models) and self._http_ok("/v2/health/ready"):
                self._stubs = stub_processes(self._proc.pid)
                self._ready_at = self._log_size()
                return
            now = time.monotonic()
            hung_since = (hung_since or now) if waits_on_a_child(self._proc.pid) else None
            if hung_since is not None and now - hung_since > STUB_HANG_S:
                raise StubLaunchHang(
                    "tritonserver hangs loading the models: a Python-backend stub missed its health check",
                    expected="each stub's health thread to run at least once a second while its model "
                    "initializes (tritonserver 2.51 otherwise waits forever for that stub to exit)",
                    found=f"tritonserver waiting for a stub to exit for {now - hung_since:.0f} s, "
                    f"{ready} of {len(models)} models READY",
                    fix="start it again on a less busy machine (fewer servers or model instances loading "
                    f"at once); whole log: {self.log_path}",
                )
            if time.monotonic() > deadline:
                waiting = [m for m in models if states.get(m, ("",))[0] != "READY"]
                raise ServerError(
                    f"models not ready after {self.options.ready_timeout_s:.0f} s: {', '.join(waiting)}",
                    expected="every model READY",
                    found="\n    ".join(important_log_lines(self.log_text())) or "no error in the log",
                    fix=f"read the whole log: {self.log_path}",
                )
            time.sleep(0.25)

    def _died(self, when: str) -> ServerError:
        code = self._proc.returncode if self._proc else None
        how = f"killed by {signal.Signals(-code).name}" if code is not None and code < 0 else f"code {code}"
        text = self.log_text()
        if self._ready_at is not None:  # it served: what it logged since then, the fatal lines first
            lines = fatal_lines(self.log_text(since=self._ready_at))
        else:  # it was loading: the load errors, and the fatal lines if it crashed
            important = important_log_lines(text)
            crash = [line for line in fatal_lines(text) if line not in important]
            lines = (
                important + crash
                if crash and any("Signal" in c or "#" in c for c in crash)
                else important or fatal_lines(text)
            )
        self._kill_group()  # a crash leaves the stubs and their regions: end both
        return ServerError(
            f"tritonserver exited ({how}) {when}",
            expected="a running server with every model READY",
            found="\n    " + "\n    ".join(lines) if lines else "nothing in the log",
            fix=f"read the whole log: {self.log_path}; fix the model it names, or restart `specbuild serve`",
        )

    def _kill_group(self) -> None:
        """SIGKILL tritonserver and everything under it at once, then remove its regions: a server that
        crashed or lost a model process is broken, and the requests it holds get an error now instead of
        waiting out a graceful stop (a request queued for the dead model would wait for all of it)."""
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._proc.wait()  # reaped: a zombie of ours would keep the group alive
        wait_group_gone(self._proc.pid)
        remove_bls_counters(self._proc.pid)
        self._clean_shm()

    def dead_models(self) -> list[str]:
        """Models whose Python-backend process died while serving ("model (instance, pid N exited)")."""
        return [f"{stub.model} ({stub.instance}, pid {stub.pid} {how})" for stub, how in dead(self._stubs)]

    def _http_ok(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.http_url + path, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def model_states(self) -> dict[str, tuple[str, str]]:
        """name -> (state, reason) from the repository index (empty while the server is starting)."""
        req = urllib.request.Request(self.http_url + "/v2/repository/index", data=b"{}", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=2) as resp:
                index = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError):
            return {}
        return {m["name"]: (m.get("state", ""), m.get("reason", "")) for m in index}

    def check_alive(self) -> None:
        """ServerError if the server exited or one of its model processes died (tritonserver 2.51 would go
        on reporting that model READY while failing every request to it)."""
        if self._proc is None or self._proc.poll() is not None:
            raise self._died("while serving")
        gone = self.dead_models()
        if gone:
            lines = fatal_lines(self.log_text(since=self._ready_at or 0), limit=10)
            self._kill_group()
            raise ServerError(
                f"a model's Python-backend process died: {', '.join(gone)}",
                expected="a live process for every model instance (tritonserver still reports the model "
                "READY, "
                "but every request to it fails)",
                found="\n    " + "\n    ".join(lines)
                if lines
                else "no message in the server log (the process was killed, "
                "e.g. by the OOM killer: see `dmesg`)",
                fix=f"the server was stopped; restart `specbuild serve` (whole log: {self.log_path})",
            )

    def wait(self) -> int:
        """Block until the server exits by itself; return its exit code."""
        return self._proc.wait() if self._proc else 0

    def stop(self) -> None:
        """SIGTERM the server, SIGKILL its process group after the exit timeout, remove its leftover
        shared memory; idempotent."""
        proc, self._proc = self._proc, None
        try:
            if proc is not None:
                try:
                    self._stop_group(proc)  # the group is gone when it returns, or raises (Ctrl-C)
                finally:
                    self._clean_shm()
                    remove_bls_counters(proc.pid)  # the stubs' parent is the server: the files name its pid
        finally:
            self._release_guardian()
            if self._workdir is not None:
                self._workdir.cleanup()
                self._workdir = None
            atexit.unregister(self.stop)

    def _release_guardian(self) -> None:
        """The stop is done: the guardian's cleanup (now a no-op) runs and it exits."""
        keeper, self._guardian = self._guardian, None
        if keeper is not None:
            try:
                keeper.stdin.close()
                keeper.wait(timeout=guardian.GROUP_GONE_TIMEOUT_S + 5)
            except (OSError, subprocess.TimeoutExpired):
                keeper.kill()
                keeper.wait()

    def _stop_group(self, proc: subprocess.Popen) -> None:
        """SIGTERM to tritonserver alone: it finishes in-flight work, then unloads every model, which
        finalizes each stub (the model's finalize runs, the stub exits) within --exit-timeout-secs. The
        stubs ignore SIGTERM (pb_stub.cc installs a no-op handler), so signalling the group changes
        nothing; a stub outlives the unload only when tritonserver exits first (its timeout ran out, or it
        was killed): then the stub logs "Non-graceful termination detected" and can crash on its way
        out. Whatever of the group is left after the server exits, or after the grace, gets SIGKILL,
        also when the wait is interrupted (Ctrl-C): no stub is ever left behind."""
        try:
            proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=self.options.exit_timeout_s + 5)
        except subprocess.TimeoutExpired:
            pass
        finally:
            try:  # whatever is left of the group, the stubs too, even if the server itself already exited
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
            wait_group_gone(proc.pid)

    def _clean_shm(self) -> None:
        if self._proc is None or self._proc.poll() is not None:  # never under a live server
            remove_shm(self._shm_prefix)

    def kill(self) -> None:
        """Kill the server at once (tests: a server dying mid-request)."""
        if self._proc is not None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    @property
    def shm_prefix(self) -> str:
        return self._shm_prefix

    def stub_pids(self) -> dict[int, str]:
        """pid -> model of the Python-backend processes recorded at ready (tests, diagnostics)."""
        return {pid: stub.model for pid, stub in self._stubs.items()}

    def __enter__(self) -> TritonServer:
        if self._proc is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
