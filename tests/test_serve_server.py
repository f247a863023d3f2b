"""The bundled tritonserver launcher: argv, port checks, log triage; a real server on a trivial repo."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from specbuild.core.errors import ServerError
from specbuild.serve import bundle as bundle_mod
from specbuild.serve import tritonserver as tritonserver_mod
from specbuild.serve.tritonserver import (
    ServerOptions,
    StubLaunchHang,
    TritonServer,
    check_ports_free,
    free_port,
    important_log_lines,
    repo_models,
    server_argv,
)

ECHO_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "x" data_type: TYPE_INT32 dims: [ -1 ] }} ]
output [ {{ name: "y" data_type: TYPE_INT32 dims: [ -1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""
ECHO_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", (x * 2).astype(np.int32))]))
        return out
"""


def make_repo(root: Path, models: dict[str, str]) -> Path:
    """A repository of python-backend models: name -> model.py source."""
    for name, source in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(ECHO_CONFIG.format(name=name))
        (root / name / "1" / "model.py").write_text(source)
    return root


def loopback_options(**kw) -> ServerOptions:
    return ServerOptions(grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(), **kw)


def group_alive(pgid: int) -> list[int]:
    """Pids still in process group `pgid` (the server and its python stubs)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.append(int(entry))
            except ProcessLookupError:
                pass
    return pids


def test_server_argv_binds_every_endpoint_to_the_host():
    opts = ServerOptions(grpc_port=9001, http_port=9000, metrics_port=9002)
    argv = server_argv(Path("/b/tritonserver"), Path("/w/backends"), Path("/r"), opts)
    assert argv == [
        "/b/tritonserver",
        "--model-repository=/r",
        "--backend-directory=/w/backends",
        "--grpc-address=127.0.0.1",
        "--grpc-port=9001",
        "--http-address=127.0.0.1",
        "--http-port=9000",
        "--metrics-address=127.0.0.1",
        "--metrics-port=9002",
        "--exit-timeout-secs=20",
        "--log-verbose=0",
    ]


def test_busy_port_is_refused_before_start():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        busy = sock.getsockname()[1]
        opts = ServerOptions(grpc_port=busy, http_port=free_port(), metrics_port=free_port())
        with pytest.raises(ServerError, match=f"grpc port 127.0.0.1:{busy} is busy") as err:
            check_ports_free(opts)
        assert "--grpc-port" in err.value.fix


def test_repeated_port_is_refused():
    with pytest.raises(ServerError, match="both 9000"):
        check_ports_free(ServerOptions(grpc_port=9000, http_port=9000, metrics_port=free_port()))


def test_important_log_lines_keep_errors_drop_cpu_host_noise():
    log = "\n".join(
        [
            'E1129 19:35:34.979066 6413 server.cc:241] "CudaDriverHelper has not been initialized."',
            'I1129 19:35:36.589416 6413 python_be.cc:2249] "TRITONBACKEND_ModelInstanceInitialize: echo_0_0"',
            "E1129 19:36:58.587891 7132 model_lifecycle.cc:642] \"failed to load 'bad' version 1: "
            'ModuleNotFoundError"',
            "error: creating server: Internal - failed to load all models",
        ]
    )
    lines = important_log_lines(log)
    assert len(lines) == 2 and "ModuleNotFoundError" in lines[0] and "creating server" in lines[1]


def test_not_a_repository(tmp_path):
    assert repo_models(tmp_path) == []
    with pytest.raises(ServerError, match="not a Triton model repository"):
        TritonServer(tmp_path, loopback_options()).start()


def test_production_repository_is_sent_to_the_gpu_launch(tmp_path):
    (tmp_path / "tensorrt_llm").mkdir()
    (tmp_path / "tensorrt_llm" / "config.pbtxt").write_text('name: "tensorrt_llm"\nbackend: "tensorrtllm"\n')
    with pytest.raises(ServerError, match="production repository: tensorrt_llm") as err:
        TritonServer(tmp_path, loopback_options()).start()
    assert "--print-launch" in err.value.fix and "--backend python" in err.value.fix


def test_missing_libpython_is_explained(monkeypatch):
    fake = subprocess.CompletedProcess(
        [], 0, stdout="\tlibpython3.11.so.1.0 => not found\n\tlibc.so.6 => /lib/libc.so.6\n"
    )
    monkeypatch.setattr(bundle_mod.subprocess, "run", lambda *a, **k: fake)
    b = bundle_mod.find_bundle()
    with pytest.raises(ServerError, match="cannot load a shared library") as err:
        bundle_mod.check_libpython(b, b.env())
    assert "libpython3.11.so.1.0" in err.value.expected and "--enable-shared" in err.value.fix


def test_bundle_env_puts_venv_first_and_libs_on_loader_path():
    b = bundle_mod.find_bundle()
    env = b.env({"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/x"})
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(b.libs) and env["LD_LIBRARY_PATH"].endswith(":/x")
    assert env["PATH"].split(":")[0] == str(Path(os.sys.executable).parent)


@pytest.mark.slow
def test_trivial_repo_serves_and_stops_without_leftovers(tmp_path):
    import numpy as np
    import tritonclient.grpc as grpcclient

    repo = make_repo(tmp_path / "repo", {"echo": ECHO_MODEL})
    progress = []
    server = TritonServer(repo, loopback_options())
    server.start(on_progress=lambda ready, total: progress.append((ready, total)))
    pgid = server.pid
    try:
        assert progress[-1] == (1, 1)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        x = grpcclient.InferInput("x", [3], "INT32")
        x.set_data_from_numpy(np.array([1, 2, 3], dtype=np.int32))
        assert client.infer("echo", [x]).as_numpy("y").tolist() == [2, 4, 6]
        assert len(group_alive(pgid)) >= 2  # the server and its python stub
    finally:
        server.stop()
    assert group_alive(pgid) == []
    assert "Started GRPCInferenceService at 127.0.0.1" in server.log_text()


@pytest.mark.slow
def test_model_that_fails_to_load_shows_the_log_lines_that_matter(tmp_path):
    repo = make_repo(tmp_path / "repo", {"echo": ECHO_MODEL, "bad": "import no_such_module_xyz\n"})
    log = tmp_path / "server.log"
    with pytest.raises(ServerError, match="tritonserver exited") as err:
        TritonServer(repo, loopback_options(log_file=log)).start()
    assert "No module named 'no_such_module_xyz'" in err.value.found
    assert str(log) in err.value.fix and log.exists()


@pytest.mark.slow
def test_serve_cli_stops_cleanly_on_sigterm(tmp_path):
    import signal
    import sys
    import time

    repo = make_repo(tmp_path / "repo", {"echo": ECHO_MODEL})
    ports = [str(free_port()) for _ in range(3)]
    log = tmp_path / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "specbuild",
        "serve",
        str(repo),
        "--grpc-port",
        ports[0],
        "--http-port",
        ports[1],
        "--metrics-port",
        ports[2],
        "--log-file",
        str(log),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("ready") or not line:
            break
    assert lines[-1].startswith("ready: echo"), "".join(lines)
    server_pids = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit() and _cmdline(int(p)).find(f"--grpc-port={ports[0]}") >= 0
    ]
    assert server_pids
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, rest
    assert "stopping tritonserver" in rest
    for pid in server_pids:
        assert group_alive(pid) == []


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_host_that_is_not_ours_is_not_reported_as_a_busy_port():
    for host in ("999.1.1.1", "no-such-host.invalid"):
        with pytest.raises(ServerError, match=r"cannot use --host") as err:
            check_ports_free(
                ServerOptions(
                    host=host, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port()
                )
            )
        assert "busy" not in err.value.message()
    with pytest.raises(
        ServerError, match=r"--host 192\.0\.2\.1 is not an address of this machine"
    ):  # TEST-NET-1
        check_ports_free(
            ServerOptions(
                host="192.0.2.1", grpc_port=free_port(), http_port=free_port(), metrics_port=free_port()
            )
        )


def test_a_port_whose_last_server_just_stopped_is_free():
    """A server-side close leaves the port in TIME_WAIT for ~60 s; tritonserver binds with SO_REUSEADDR,
    so the probe must too (it refused to restart `serve` on the same ports for a minute)."""
    listener = socket.socket()
    listener.setsockopt(
        socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
    )  # as tritonserver's gRPC and HTTP listeners
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = listener.accept()
    conn.close()  # the server side closes first: its end goes to TIME_WAIT
    listener.close()
    client.close()
    check_ports_free(ServerOptions(grpc_port=port, http_port=free_port(), metrics_port=free_port()))


def test_fatal_lines_are_the_crash_not_the_start_up_noise():
    from specbuild.serve.server_watch import fatal_lines

    log = "\n".join(
        [
            "Error: Failed to initialize NVML",
            'I1201 08:31:16.720769 13955 grpc_server.cc:2558] "Started GRPCInferenceService at '
            '127.0.0.1:8001"',
            'I1201 08:31:17.720769 13955 model.py:12] "serving"',
            "Signal (11) received.",
            " 0# 0x000055F8A0C1E2A4 in /opt/tritonserver/bin/tritonserver",
            " 1# TRITONBACKEND_OutputBuffer in /opt/tritonserver/lib/libtritonserver.so",
        ]
    )
    lines = fatal_lines(log)
    assert (
        lines[0] == "Signal (11) received."
        and "TRITONBACKEND_OutputBuffer" in lines[-1]
        and not any("NVML" in x for x in lines)
    )


@pytest.mark.slow
def test_restart_on_the_same_ports_right_after_a_stop(tmp_path):
    import numpy as np
    import tritonclient.grpc as grpcclient

    repo = make_repo(tmp_path / "repo", {"echo": ECHO_MODEL})
    opts = loopback_options()
    for _ in range(2):
        with TritonServer(repo, opts) as server:
            client = grpcclient.InferenceServerClient(server.grpc_url)
            x = grpcclient.InferInput("x", [1], "INT32")
            x.set_data_from_numpy(np.array([3], dtype=np.int32))
            assert client.infer("echo", [x]).as_numpy("y").tolist() == [6]
            client.close()
        assert not list(Path("/dev/shm").glob(server.shm_prefix + "*"))  # no region left behind


@pytest.mark.slow
def test_a_server_crash_quotes_the_fatal_lines_and_cleans_up(tmp_path):
    import signal
    import time

    repo = make_repo(tmp_path / "repo", {"echo": ECHO_MODEL})
    server = TritonServer(repo, loopback_options()).start()
    try:
        assert list(Path("/dev/shm").glob(server.shm_prefix + "*"))
        pgid = server.pid
        os.kill(server.pid, signal.SIGSEGV)  # what a crash in the server looks like
        deadline = time.monotonic() + 30
        while server._proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(ServerError, match="tritonserver exited") as err:
            server.check_alive()
        assert "Signal (11) received" in err.value.found and "NVML" not in err.value.found
        assert group_alive(pgid) == [] and not list(Path("/dev/shm").glob(server.shm_prefix + "*"))
    finally:
        server.stop()


@pytest.mark.slow
def test_serve_fails_loudly_when_a_model_process_dies(tmp_path):
    """tritonserver 2.51 reports a model READY after its stub died; `specbuild serve` stops with the model's
    name."""
    import signal
    import sys
    import time

    repo = make_repo(tmp_path / "repo", {"echo": ECHO_MODEL})
    ports = [str(free_port()) for _ in range(3)]
    cmd = [
        sys.executable,
        "-m",
        "specbuild",
        "serve",
        str(repo),
        "--grpc-port",
        ports[0],
        "--http-port",
        ports[1],
        "--metrics-port",
        ports[2],
        "--log-file",
        str(tmp_path / "server.log"),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("ready") or not line:
            break
    assert lines[-1].startswith("ready: echo"), "".join(lines)
    stubs = [
        int(p)
        for p in os.listdir("/proc")
        if p.isdigit()
        and "triton_python_backend_stub" in _cmdline(int(p))
        and f"{repo}/echo/1/model.py" in _cmdline(int(p))
    ]
    assert len(stubs) == 1
    os.kill(stubs[0], signal.SIGKILL)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2, rest
    assert "a model's Python-backend process died: echo" in rest and "Traceback" not in rest


def test_free_port_never_hands_out_a_port_twice(monkeypatch):
    # The OS may offer a just-closed ephemeral port again; a server given it as gRPC and HTTP port fails
    # (seen in a full `make test`: both 60607). Force the OS side to repeat itself.
    import specbuild.serve.tritonserver as server

    offered = iter([50001, 50001, 50001, 50002])

    class FakeSocket:
        def __init__(self, *a):
            self.port = next(offered)

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def bind(self, addr):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(server, "_HANDED_OUT", set())
    monkeypatch.setattr(server.socket, "socket", FakeSocket)
    assert [server.free_port(), server.free_port()] == [50001, 50002]


SLOW_FINALIZE_MODEL = (
    ECHO_MODEL
    + """
    def initialize(self, args):
        import os

        self.marker = os.environ["SPECBUILD_TEST_FINALIZED"]

    def finalize(self):
        import time

        time.sleep(6)  # longer than tritonserver's former 5 s exit timeout
        with open(self.marker, "w") as f:
            f.write("finalized")
"""
)


def test_stop_lets_the_server_unload_its_models(tmp_path, monkeypatch):
    """stop() gives tritonserver the time to unload every model (each model's finalize runs, each stub
    exits on its own): a server whose exit timeout ran out first left the stubs to end without finalize
    (or, killed, logging 'Non-graceful termination detected')."""
    marker = tmp_path / "finalized"
    monkeypatch.setenv("SPECBUILD_TEST_FINALIZED", str(marker))
    server = TritonServer(make_repo(tmp_path / "repo", {"slow": SLOW_FINALIZE_MODEL}), loopback_options())
    server.start()
    pgid = server.pid
    server.stop()
    assert marker.read_text() == "finalized"
    log = server.log_text()
    assert "successfully unloaded 'slow'" in log and "Non-graceful" not in log
    assert group_alive(pgid) == []


def test_a_second_sigterm_while_serve_stops_neither_cuts_the_stop_short_nor_hides_the_error(monkeypatch):
    """`specbuild serve` stopping after a model died (a ServerError) and stopped again by its caller's
    SIGTERM: the stop runs to its end and the ServerError is what it reports, not 'interrupted' (the
    failed make demo lost both: tritonserver died with its stubs running, and the model's error)."""
    import io
    import signal
    import time

    from rich.console import Console

    from specbuild.serve import serve_command as serving

    stopped = []

    class DyingServer:
        grpc_url, http_url, log_path = "127.0.0.1:1", "http://127.0.0.1:2", Path("server.log")
        load_restarts: list[str] = []

        def __init__(self, repo, options):
            pass

        def start(self, on_progress=None):
            return self

        def model_states(self):
            return {"m": ("READY", "")}

        def check_alive(self):
            raise ServerError("a model's Python-backend process died: m (m_0_0, pid 1 exited)")

        def stop(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the caller stops `serve` again
            time.sleep(0.2)  # the handler would run here, between two bytecodes
            stopped.append(True)

    monkeypatch.setattr(serving, "TritonServer", DyingServer)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(ServerError, match="process died"):
            serving.run_server(
                Path("repo"), ServerOptions(), console=Console(file=io.StringIO()), log_stream=None
            )
    except KeyboardInterrupt:  # the second SIGTERM cut the stop short (and would end the test session)
        pytest.fail("the SIGTERM during the stop interrupted it and replaced the ServerError")
    assert stopped == [True]
    assert signal.getsignal(signal.SIGTERM) is previous


@pytest.mark.slow
def test_a_server_whose_guardian_does_not_start_is_not_left_running(tmp_path, monkeypatch):
    from specbuild.serve import guardian

    started = []

    def broken(pgid, prefixes):
        started.append(pgid)
        raise ServerError("the server's guardian process did not start")

    monkeypatch.setattr(guardian, "start", broken)
    server = TritonServer(make_repo(tmp_path / "repo", {"echo": ECHO_MODEL}), loopback_options())
    with pytest.raises(ServerError, match="guardian"):
        server.launch()
    assert started and group_alive(started[0]) == [] and server.pid is None


SLOW_INIT_MODEL = (
    ECHO_MODEL
    + """
    def initialize(self, args):
        import time

        time.sleep(6)
"""
)


def _stop_stub_while_it_initializes(server, instance: str, launches: int) -> threading.Thread:
    """For each of the first `launches` starts of `server`: SIGSTOP the stub of `instance` 2 s into its
    initialize, for 3 s (its health thread misses tritonserver 2.51's 1 s check, as a starved one did)."""

    def run():
        seen: set[int] = set()
        deadline = time.monotonic() + 120
        while len(seen) < launches and time.monotonic() < deadline:
            pid = server.pid
            try:
                stubs = [c for c in psutil.Process(pid).children() if c.cmdline()[-2:-1] == [instance]]
            except (psutil.Error, TypeError):
                stubs = []
            if pid in seen or not stubs:
                time.sleep(0.1)
                continue
            seen.add(pid)
            time.sleep(2)
            with contextlib.suppress(ProcessLookupError):
                os.kill(stubs[0].pid, signal.SIGSTOP)
                time.sleep(3)
                os.kill(stubs[0].pid, signal.SIGCONT)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_load_hung_on_a_stub_that_missed_its_health_check_is_started_again(tmp_path):
    """tritonserver 2.51 waits forever for a stub that missed its health check while its model initialized
    (tritonserver.StubLaunchHang): the server is started again, loads, and says why."""
    server = TritonServer(make_repo(tmp_path / "repo", {"slow": SLOW_INIT_MODEL}), loopback_options())
    stopper = _stop_stub_while_it_initializes(server, "slow_0_0", launches=1)
    try:
        server.start()
        assert server.model_states() == {"slow": ("READY", "")}
        assert len(server.load_restarts) == 1 and "missed its health check" in server.load_restarts[0]
    finally:
        server.stop()
        stopper.join(10)


@pytest.mark.slow
def test_a_load_that_hangs_again_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(tritonserver_mod, "LOAD_RESTARTS", 0)
    server = TritonServer(make_repo(tmp_path / "repo", {"slow": SLOW_INIT_MODEL}), loopback_options())
    stopper = _stop_stub_while_it_initializes(server, "slow_0_0", launches=1)
    with pytest.raises(StubLaunchHang) as err:
        server.start()
    stopper.join(10)
    assert "health check" in err.value.what and "waiting for a stub to exit" in err.value.found
    assert server.pid is None and server.load_restarts == []
    left = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not left, "the hung server's processes outlived the error"


def test_a_process_waiting_for_its_child_is_told_apart():
    """server_watch.waits_on_a_child: the signature of 2.51's hung stub launch (a thread in wait4)."""
    from specbuild.serve.server_watch import waits_on_a_child

    code = (
        "import os, time\nc = os.fork()\n"
        "if c == 0: time.sleep(30)\nelse: print(c, flush=True); os.waitpid(c, 0)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    try:
        deadline = time.monotonic() + 10
        while not waits_on_a_child(proc.pid):
            assert time.monotonic() < deadline, "the parent never showed as waiting"
            time.sleep(0.05)
        assert not waits_on_a_child(child)  # asleep, not waiting
    finally:
        os.kill(child, signal.SIGKILL)
        proc.wait(10)
    assert not waits_on_a_child(proc.pid)  # gone: /proc cannot tell
