"""A model process's lifeline: it ends within POLL_S of its parent's death, however the parent died.

Two kinds of process run a generated repository's Python code under tritonserver:

* **the Python-backend stubs** (one per model instance, children of tritonserver). The stub's own
  health thread notices a dead server (python_backend r24.10 `src/pb_stub.cc` main: `kill(parent_pid,
  0)` every 300 ms) but then joins its stub-to-parent thread while holding nothing it can give up: when
  the server died during a cancellation ask or a response send, that thread waits forever for the
  server's answer (`Stub::SendIsCancelled` / `ResponseSender::Send`, an interprocess condition variable
  without a timeout) with `stub_to_parent_message_mu_` held, so the health thread blocks on that mutex
  and the stub stays, with parent 1, holding its /dev/shm region. Both waits release the GIL
  (`PbCancel::IsCancelled`, `ResponseSender::Send`: `py::gil_scoped_release`), so a Python thread of the
  stub still runs: `start_in_stub` watches the server from one and ends the process with `os._exit`.
  PR_SET_PDEATHSIG cannot do it: the stub's parent is the tritonserver *thread* that forked it, a
  `std::async` thread of the model load that ends right after the instance is created (core r24.10
  `src/backend_model.cc`; python_backend sets ParallelModelInstanceLoading), and the kernel sends the
  signal when that thread exits.
* **the engine processes** of the local engine models (children of a stub: child_channel.ChildProcess).
  `child_channel.bind_to_parent` arms PR_SET_PDEATHSIG where that is sound and starts `watch` too.

The parent's death is read from `os.getppid()`: the kernel reparents a process's children the moment it
exits (before it is reaped), so the value changes at once whoever reaps it.

Plain Python (no Triton, no torch): copied into every model folder like the other common modules.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence

POLL_S = 0.2  # how often the parent is checked: a process outlives its parent by at most this (+ its exit)
STUB_BINARY = "triton_python_backend_stub"
SHM_DIR = "/dev/shm"
_STUB_REGION, _STUB_SERVER = 2, 5  # the stub's argv: model path, region name, sizes, server pid, ...


def process_argv() -> list[str]:
    """This process's argv as the kernel has it (the stub embeds Python: sys.argv is not its argv)."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [arg.decode(errors="replace") for arg in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def watch(
    parent: int,
    *,
    on_gone: Sequence[Callable[[], None]] = (),
    what: str = "this process",
    poll_s: float = POLL_S,
) -> threading.Thread:
    """A daemon thread that, once this process's parent is no longer `parent`, runs each of `on_gone`
    (errors ignored), says so on stderr (the server's log) and ends this process with `os._exit(1)`,
    whatever its other threads wait on."""

    def run() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        for action in on_gone:
            try:
                action()
            except Exception:  # noqa: BLE001 - the process ends either way
                pass
        try:
            os.write(2, f"specbuild: the parent (pid {parent}) of {what} is gone; it exits\n".encode())
        finally:
            os._exit(1)

    thread = threading.Thread(target=run, name="lifeline", daemon=True)
    thread.start()
    return thread


def remove_region(name: str, folder: str = SHM_DIR) -> None:
    """Delete the shared-memory region `name` (a bare file name) if it is there."""
    if not name or "/" in name or name in (".", ".."):
        return
    try:
        os.unlink(os.path.join(folder, name))
    except FileNotFoundError:
        pass


def start_in_stub(model: str, on_gone: Sequence[Callable[[], None]] = ()) -> threading.Thread | None:
    """In a Python-backend stub: `watch` tritonserver; once it is gone, remove this stub's shared-memory
    region (the server would have, had it lived), then run `on_gone`. Anywhere else (a test loading the
    model in its own process) it does nothing: that process's parent is not a server."""
    argv = process_argv()
    if not argv or os.path.basename(argv[0]) != STUB_BINARY or len(argv) <= _STUB_SERVER:
        return None
    server = int(argv[_STUB_SERVER]) if argv[_STUB_SERVER].isdigit() else os.getppid()
    region = argv[_STUB_REGION]
    return watch(
        server,
        on_gone=[lambda: remove_region(region), *on_gone],
        what=f"the Python-backend process of '{model}' (tritonserver)",
    )
