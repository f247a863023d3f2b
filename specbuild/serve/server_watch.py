"""What `TritonServer` watches and cleans: the Python-backend stub processes, the fatal lines of a log,
and the shared-memory regions a server leaves in /dev/shm.

* Stubs: every Python-backend model instance is a `triton_python_backend_stub` child of tritonserver;
  its argv holds the model file (`<repo>/<model>/1/model.py`) and the instance name
  (`<model>_<group>_<index>`). tritonserver 2.51 does not restart a dead stub and keeps reporting its
  model READY (python_backend r24.10, TRITONBACKEND_ModelInstanceExecute: "TODO: Implement restart"),
  so the server's owner must notice.
* Shared memory: each stub's region is `/dev/shm/<prefix><uuid>`, prefix from
  `--backend-config=python,shm-region-prefix-name=...`; a stub killed (or a server crash) leaves it.
  A unique prefix per server lets exactly its own regions be removed after it stops.
"""

from __future__ import annotations

import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")
STUB_BINARY = "triton_python_backend_stub"
# Lines that say why a server died: the signal handler's line and stack, aborts, uncaught C++ exceptions.
_FATAL = re.compile(
    r"Signal \(\d+\) received|Segmentation fault|core dumped|Aborted|terminate called|what\(\):|"
    r"^\s*\d+# |Stub process .* (is not healthy|unexpectedly exited)|Killed|out of memory|"
    r"Bus error|Illegal instruction|Failed to .* stub",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Stub:
    pid: int
    model: str  # the model folder's name
    instance: str  # <model>_<group>_<index>


def owner_prefix(pid: int | None = None) -> str:
    """The start of the region names of every server the process `pid` (default: this one) starts."""
    return f"specbuild_{os.getpid() if pid is None else int(pid)}_"


def shm_prefix() -> str:
    """A region-name prefix no other server uses (the Python backend appends a UUID per stub)."""
    return f"{owner_prefix()}{secrets.token_hex(4)}_"


# = PREFIX in python_models/tensorrt_llm_bls/inflight.py (the BLS's in-flight counter file,
# `<this><server pid>-<key>`; tests/test_schedule.py checks the two agree)
BLS_COUNTER_PREFIX = "specbuild-bls-inflight-"


def remove_bls_counters(server_pid: int) -> list[str]:
    """Delete the BLS in-flight counter files of the server `server_pid` (its instances remove them when
    they end; a server stopped by SIGKILL leaves them). Call only when that server is gone."""
    return remove_shm(f"{BLS_COUNTER_PREFIX}{int(server_pid)}-")


def remove_shm(prefix: str) -> list[str]:
    """Delete the /dev/shm regions named `<prefix>*` (call only when no process of that server is left)."""
    removed = []
    if not prefix or not SHM_DIR.is_dir():
        return removed
    for path in SHM_DIR.glob(prefix + "*"):
        try:
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:
            pass
    return removed


def wait_group_gone(pgid: int, timeout_s: float = 5.0) -> None:
    """After SIGKILL: wait until no process of the group is left (their regions are then safe to remove)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)


def stub_processes(server_pid: int) -> dict[int, Stub]:
    """pid -> Stub for the Python-backend stubs under a running server (empty if it is gone)."""
    out: dict[int, Stub] = {}
    try:
        children = psutil.Process(server_pid).children(recursive=True)
    except psutil.Error:
        return out
    for child in children:
        try:
            argv = child.cmdline()
        except psutil.Error:
            continue
        if not argv or not argv[0].endswith(STUB_BINARY) or len(argv) < 3:
            continue
        model = Path(argv[1]).parent.parent.name
        instance = argv[-2] if len(argv) >= 3 else model
        out[child.pid] = Stub(child.pid, model, instance)
    return out


def waits_on_a_child(pid: int) -> bool:
    """A thread of process `pid` is blocked waiting for a child to exit (Linux: its wchan is `do_wait`);
    False where /proc cannot tell. While tritonserver 2.51 loads its models this happens only in the
    python backend's failed stub launch (StubLauncher::Launch, python_backend r24.10: a stub that missed
    the 1 s health check during its initialize is waited for; it waits for its next command and never
    exits), so the load hangs with nothing in the log."""
    try:
        tasks = list(Path(f"/proc/{int(pid)}/task").iterdir())
    except OSError:
        return False
    for task in tasks:
        try:
            if (task / "wchan").read_text().strip() == "do_wait":
                return True
        except OSError:
            continue
    return False


def dead(stubs: dict[int, Stub]) -> list[tuple[Stub, str]]:
    """The stubs that are no longer running, with how they ended when that can be told."""
    gone = []
    for pid, stub in stubs.items():
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                continue
            how = "exited"
        except psutil.NoSuchProcess:
            how = "exited"
        except psutil.Error:
            continue
        gone.append((stub, how))
    return gone


def fatal_lines(log: str, limit: int = 20) -> list[str]:
    """The lines that explain a crash (signal, stack, abort), else the log's last lines."""
    lines = [line.rstrip() for line in log.splitlines() if line.strip()]
    fatal = [line for line in lines if _FATAL.search(line)]
    return (fatal or lines)[-limit:]
