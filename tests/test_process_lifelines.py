"""What ends each process specbuild starts when its parent dies, without tritonserver (the real tree under
faults: test_e2e_process_tree.py): a stub's lifeline (python_models/common/lifeline.py), an engine
process's PR_SET_PDEATHSIG and lifeline (child_channel.bind_to_parent), and the server's guardian
(serve/guardian.py). Each test builds the tree from plain Python processes and SIGKILLs the parent."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from specbuild.model_repo.generate import PYTHON_MODELS

COMMON = PYTHON_MODELS / "common"
# A lifeline looks every POLL_S (0.2 s); a killed process's children see it at once; the rest is Python
# starting and 2 loaded cores.
GONE_S = 5.0


def _python(code: str, *argv: str, executable: str = sys.executable, **kw) -> subprocess.Popen:
    return subprocess.Popen([executable, "-c", textwrap.dedent(code), *argv], **kw)


def _read_pid(proc: subprocess.Popen) -> int:
    line = proc.stdout.readline()
    assert line.strip().isdigit(), f"no pid from the parent: {line!r}"
    return int(line)


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# A fake tritonserver: starts one "stub" (argv as python_backend's stub_launcher.cc builds it at r24.10:
# model path, region, default size, growth size, parent pid, install path, IPC handle, name, model dir),
# prints its pid, and waits to be killed.
FAKE_SERVER = """
import os, subprocess, sys, time
stub, model, region, model_dir = sys.argv[1:5]
child = subprocess.Popen(
    [stub, model, region, "1048576", "1048576", str(os.getpid()), "/opt", "0", "m_0_0", model_dir]
)
print(child.pid, flush=True)
time.sleep(3600)
"""

# The stub's model: the lifeline, then every thread waits on something only the (dead) server would end,
# as the stub's threads do after the server died mid-request (the GIL is free: those waits release it).
FAKE_MODEL = """
import os, select, sys, threading
sys.path.insert(0, sys.argv[-1])
from lifeline import start_in_stub

marker = os.environ["MARKER"]
assert start_in_stub("echo", on_gone=[lambda: open(marker, "w").write("cleaned")]) is not None
reader, _ = os.pipe()
threading.Thread(target=select.select, args=([reader], [], []), daemon=True).start()
threading.Event().wait()
"""


WRITE_TO_GONE_PARENT = """
import os, sys
sys.path.insert(0, sys.argv[1])
from child_channel import child_stdout
events = child_stdout()
sys.stdin.read()  # the test closes our stdout's reader, then our stdin
events.send({"e": "log", "msg": "x" * 100_000})  # more than a pipe holds: the write meets the closed pipe
print("still running", file=sys.stderr)
"""


def test_an_engine_process_whose_event_reader_is_gone_exits_quietly():
    """The child writes an event after the model's process (its events' reader) is gone: it exits at once
    with status 1 and no traceback (its stderr is the server's log)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITE_TO_GONE_PARENT, str(COMMON)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    proc.stdout.close()
    _, err = proc.communicate(b"", timeout=60)
    assert proc.returncode == 1 and err == b"", err.decode()


def test_a_stub_whose_server_is_killed_removes_its_region_and_exits(tmp_path):
    """The process is named triton_python_backend_stub (a link to Python) and gets the stub's argv."""
    stub = tmp_path / "triton_python_backend_stub"
    stub.symlink_to(os.path.realpath(sys.executable))
    model = tmp_path / "model.py"
    model.write_text(textwrap.dedent(FAKE_MODEL))
    region = f"specbuild_lifeline_test_{os.getpid()}_{secrets.token_hex(4)}"
    (Path("/dev/shm") / region).write_bytes(b"\0" * 4096)
    marker = tmp_path / "marker"
    env = {**os.environ, "MARKER": str(marker)}
    # the stub's model dir (its last argument): where the fake model finds lifeline.py
    server = _python(
        FAKE_SERVER, str(stub), str(model), region, str(COMMON), stdout=subprocess.PIPE, text=True, env=env
    )
    stub_pid = 0
    try:
        stub_pid = _read_pid(server)
        time.sleep(1.0)  # the model is loaded (its lifeline runs)
        assert psutil.Process(stub_pid).ppid() == server.pid
        server.kill()
        server.wait()
        assert _gone_within(stub_pid, GONE_S), "the stub outlived its server"
        assert not (Path("/dev/shm") / region).exists(), "the stub's region was left"
        assert marker.read_text() == "cleaned"
    finally:
        _kill(stub_pid)
        server.kill()
        (Path("/dev/shm") / region).unlink(missing_ok=True)


def test_outside_a_stub_the_lifeline_does_nothing():
    """A test that loads a model in its own process: its parent is not a server."""
    sys.path.insert(0, str(COMMON))
    try:
        import lifeline
    finally:
        sys.path.remove(str(COMMON))
    assert lifeline.start_in_stub("echo") is None


# A model's process starting its engine process (child_channel.parent_env), from its main thread or from
# another thread; the engine binds itself to it (bind_to_parent), then spends its time as `ENGINE` says.
FAKE_MODEL_PROCESS = """
import subprocess, sys, threading
sys.path.insert(0, sys.argv[1])
from child_channel import parent_env

def start():
    child = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]], env=parent_env())
    print(child.pid, flush=True)

if sys.argv[3] == "main":
    start()
else:
    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
threading.Event().wait()
"""
ENGINE_HOLDING_THE_GIL = """
import ctypes, sys
sys.path.insert(0, sys.argv[1])
from child_channel import bind_to_parent

bind_to_parent("a test engine")
ctypes.PyDLL("libc.so.6").sleep(3600)  # a call that keeps the GIL: no Python thread runs
"""
ENGINE_WAITING = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from child_channel import bind_to_parent

bind_to_parent("a test engine")
threading.Event().wait()
"""


@pytest.mark.parametrize(
    ("started_from", "engine"),
    [
        ("main", ENGINE_HOLDING_THE_GIL),  # only the kernel's PR_SET_PDEATHSIG can end it
        ("thread", ENGINE_WAITING),  # no PR_SET_PDEATHSIG (the thread ends first): the lifeline ends it
    ],
)
def test_an_engine_process_dies_with_the_model_process(started_from, engine):
    model = _python(
        FAKE_MODEL_PROCESS,
        str(COMMON),
        textwrap.dedent(engine),
        started_from,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = 0
    try:
        child = _read_pid(model)
        time.sleep(1.0)  # bound
        assert psutil.Process(child).ppid() == model.pid
        model.kill()
        model.wait()
        assert _gone_within(child, GONE_S), (
            f"the engine process outlived its parent (started from {started_from})"
        )
    finally:
        _kill(child)
        model.kill()


# The owner of a server: a process group standing for tritonserver and a stub under it, two files with
# the server's prefix in /dev/shm, its guardian; prints the group's pid and the guardian's, then waits.
FAKE_OWNER = """
import subprocess, sys, time
from pathlib import Path
from specbuild.serve import guardian

prefix = sys.argv[1]
SLEEP = "import time; time.sleep(3600)"
STUB = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SLEEP!r}]); {SLEEP}"
server = subprocess.Popen([sys.executable, "-c", STUB], start_new_session=True)
for name in ("a", "b"):
    Path("/dev/shm", prefix + name).write_bytes(b"0")
keeper = guardian.start(server.pid, [prefix])
print(server.pid, keeper.pid, flush=True)
time.sleep(3600)
"""


def _group(pgid: int) -> list[int]:
    return [p.pid for p in psutil.process_iter() if _pgid(p.pid) == pgid and _running(p)]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_guardian_ends_the_server_and_removes_its_regions_when_its_owner_is_killed():
    prefix = f"specbuild_guardian_test_{os.getpid()}_{secrets.token_hex(4)}_"
    owner = _python(FAKE_OWNER, prefix, stdout=subprocess.PIPE, text=True)
    pgid = keeper = 0
    try:
        pgid, keeper = (int(x) for x in owner.stdout.readline().split())
        deadline = time.monotonic() + 10
        while len(_group(pgid)) < 2 and time.monotonic() < deadline:  # the server and its stub
            time.sleep(0.05)
        assert len(_group(pgid)) == 2
        os.kill(keeper, signal.SIGTERM)  # a signal meant for the owner does not end the guardian
        time.sleep(0.3)
        assert _running(psutil.Process(keeper))
        owner.kill()
        owner.wait()
        assert _gone_within(keeper, GONE_S), "the guardian did not finish"
        assert _group(pgid) == [], "the server's group outlived its owner"
        assert sorted(p.name for p in Path("/dev/shm").glob(prefix + "*")) == []
    finally:
        owner.kill()
        if pgid:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for path in Path("/dev/shm").glob(prefix + "*"):
            path.unlink()


def test_a_child_started_with_die_with_parent_ends_with_its_parent():
    """core/pdeathsig.py: what tritonserver (under serve), serve and the stage commands (under the demo)
    and trtllm-build (under compile) are started with."""
    parent = _python(
        """
        import subprocess, time
        from specbuild.core.pdeathsig import die_with_parent
        child = subprocess.Popen(["sleep", "3600"], preexec_fn=die_with_parent())
        print(child.pid, flush=True)
        time.sleep(3600)
        """,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = 0
    try:
        child = _read_pid(parent)
        parent.kill()
        parent.wait()
        assert _gone_within(child, GONE_S), "the child outlived its parent"
    finally:
        _kill(child)
        parent.kill()
