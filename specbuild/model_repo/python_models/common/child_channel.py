"""A local engine model's engine process: start it, exchange JSON lines with it, stop it.

Both local engine models run their engine in a child process (engine_host.py says why and what they
exchange). This module is the plumbing: commands go to the child's stdin and events come from its
stdout, one JSON object a line; the child's own prints go to stderr (the server's log). No pickle: both
sides are this project's code, and JSON is all they exchange; arrays travel as base64 of their bytes
with dtype and shape (`pack_array`).

The child ends with its parent, however the parent ends (`bind_to_parent`, called first thing in the
child): SIGKILL from the kernel (PR_SET_PDEATHSIG) when the parent started it from its main thread, a
lifeline thread (lifeline.watch) always, and the end of its stdin without a "close" command.

Plain Python (no Triton, no torch): copied into every model folder like the other common modules.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
from lifeline import watch

PARENT_ENV = "SPECBUILD_ENGINE_PARENT"  # "<parent pid>", or "<parent pid>:pdeathsig" (bind_to_parent)
PR_SET_PDEATHSIG = 1  # linux/prctl.h

READY_TIMEOUT_S = 600.0  # loading and warming up the engine (seconds on a starved CPU, never minutes)
CLOSE_TIMEOUT_S = 10.0
ARRAY_DTYPES = ("float32", "float16", "int32", "int64")  # what pack_array / unpack_array carry


class ChildError(RuntimeError):
    """The engine process failed to start, failed a batch, or is gone."""


class RestartBudget:
    """The restart rule both local engine models follow: a dead engine process is started again at most
    `limit` times, so a crash that repeats leaves every later request with the error instead of a loop of
    restarts. The caller answers the dead process's requests with their error first, then asks `take`."""

    LIMIT = 3

    def __init__(self, limit: int = LIMIT):
        self.limit = limit
        self.used = 0  # times the engine process was started again after it died

    def take(self, why: str) -> str:
        """One restart, or ChildError when none is left; returns the line for the server's log."""
        if self.used >= self.limit:
            raise ChildError(f"the engine process died {self.used + 1} times; not started again")
        self.used += 1
        return f"{why}; starting it again ({self.used} of {self.limit})"


def python_executable() -> str:
    """The interpreter to start the child with: this process's, else the `python3` on PATH (inside the
    Python backend's stub, sys.executable is the stub's binary; the stub itself takes its Python from the
    `python3` on PATH)."""
    if Path(sys.executable).name.startswith("python"):
        return sys.executable
    found = shutil.which("python3")
    if found is None:
        raise ChildError("no python3 on PATH to start the engine process with")
    return found


def pack_array(array: np.ndarray) -> dict:
    """An array as JSON: dtype, shape and its bytes in base64 (C order)."""
    array = np.ascontiguousarray(array)
    if array.dtype.name not in ARRAY_DTYPES:
        raise ValueError(f"an array of dtype {array.dtype} cannot cross to the engine process")
    return {"dtype": array.dtype.name, "shape": list(array.shape), "b64": base64.b64encode(array).decode()}


def unpack_array(packed: dict) -> np.ndarray:
    dtype = str(packed["dtype"])
    if dtype not in ARRAY_DTYPES:
        raise ValueError(f"an array of dtype {dtype!r} from the engine process")
    data = base64.b64decode(packed["b64"])
    return np.frombuffer(data, dtype=dtype).reshape([int(n) for n in packed["shape"]]).copy()


class EventWriter:
    """The child's event channel (its original stdout), one whole line per write, from any thread. A write
    that finds the channel closed means the model's process is gone (nobody reads the events): the child
    ends at once and quietly, as its lifeline would end it (an engine thread's traceback in the server's
    log made a killed stub look like a crash)."""

    def __init__(self, fd: int):
        self._out = os.fdopen(fd, "wb", buffering=0)
        self._lock = threading.Lock()

    def send(self, event: dict) -> None:
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        with self._lock:
            try:
                self._out.write(line)
            except OSError:  # BrokenPipeError: the reader is gone
                os._exit(1)


def child_stdout() -> EventWriter:
    """In the child: the event channel on the process's stdout, and stdout itself pointed at stderr, so a
    stray print (a library's) never breaks the channel."""
    events = EventWriter(os.dup(1))
    os.dup2(2, 1)
    return events


def parent_env() -> dict[str, str]:
    """The environment a child is started with: this process's, plus who its parent is. PR_SET_PDEATHSIG
    follows the *thread* that forked the child, so the child arms it only when that is this process's
    main thread (a stub's runs initialize and execute and lives as long as the stub); a child started
    from another thread (an engine restarted from a worker thread) relies on its lifeline thread."""
    main = threading.current_thread() is threading.main_thread()
    return {**os.environ, PARENT_ENV: f"{os.getpid()}{':pdeathsig' if main else ''}"}


def bind_to_parent(what: str) -> None:
    """In the child, first thing: end when the process that started it ends (module docstring). Exits at
    once if that process is already gone."""
    pid, _, how = os.environ.pop(PARENT_ENV, "").partition(":")
    if how == "pdeathsig":
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:  # not glibc: the lifeline thread alone
            pass
    parent = int(pid) if pid.isdigit() else os.getppid()
    if os.getppid() != parent:  # it died before the signal was armed
        os._exit(1)
    watch(parent, what=what)


class ChildProcess:
    """`python SCRIPT ARGS...` with JSON lines both ways; ready once its first event is {"e": "ready"}."""

    def __init__(self, script: str, args: list[str], *, ready_timeout_s: float = READY_TIMEOUT_S):
        self.proc = subprocess.Popen(  # noqa: S603 - our own script, argv built by the caller
            [python_executable(), script, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=parent_env(),
        )
        self._write = threading.Lock()
        try:
            if not select.select([self.proc.stdout], [], [], ready_timeout_s)[0]:
                raise ChildError(f"the engine process was not ready within {ready_timeout_s:g} s")
            ready = self.next()
            if ready.get("e") != "ready":
                raise ChildError(f"the engine did not load: {ready.get('msg', ready)}")
        except BaseException:
            self.close()
            raise
        self.ready = ready

    def send(self, command: dict) -> None:
        line = (json.dumps(command, separators=(",", ":")) + "\n").encode()
        with self._write:
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                self._reap()
                raise ChildError(self.gone()) from None

    def next(self) -> dict:
        """The next event (blocks); ChildError once the process is gone."""
        line = self.proc.stdout.readline()
        if not line:
            self._reap()
            raise ChildError(self.gone())
        return json.loads(line)

    def _reap(self) -> None:
        """Its pipe closed: the process is ending (a killed one closes its pipes before it is a zombie).
        Wait for it, so that `alive` is False from now on and a model starting it again does not see the
        dying process as running; one that lives on without its pipe is of no use: killed."""
        try:
            self.proc.wait(timeout=CLOSE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Ask the child to end after its running work; kill it if it does not within timeout_s."""
        try:
            self.send({"op": "close"})
        except ChildError:
            pass
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:  # what a gone child never read
                pass

    def gone(self) -> str:
        code = self.proc.poll()
        return f"the engine process is gone (exit code {code}; its log is the server's)"
