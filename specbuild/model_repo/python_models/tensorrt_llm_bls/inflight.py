"""The BLS's in-flight counter: how many requests all instances of this BLS model are handling now.

Triton runs each BLS instance in its own stub process, so the count lives in a small shared file
mapped by every instance (`/dev/shm` when present, else the temp folder):

* one slot per instance process: (pid int32, count int32); an instance claims a free slot (pid 0, or a
  process that no longer exists) under an exclusive `flock` when it starts, and frees it when it ends;
* only the owner writes its slot's count: +1 when the instance starts handling a request, -1 when
  that request's final response is sent (or it failed / was cancelled); readers sum, without a lock,
  the counts of slots whose process is alive (aligned int32 stores; a round may read a count one
  request early or late, which only moves that round's K by one threshold);
* beside each slot, (end time, count): when a request ends, its instance writes the monotonic clock
  (system-wide) and the total just before the request left (it included), the larger of the two when
  its previous end is less than the hold old; `held_total` is the larger of the live total and the
  counts of ends within the hold (core/perf/schedule.held_count), so a request that replaces one that just
  ended reads the load it replaces;
* the file is named by the server process (the stubs' parent), the repository and the model, so two
  servers, or two repositories, never share a count; the last instance to end removes it, and a new
  instance removes the files of servers that are gone (killed before their instances could end).

Semantics: `total()` = requests being handled by the BLS instances of this server and model at the
moment of reading, including the caller's own; `held_total(hold_ms)` = that, or the count when a request
ended less than hold_ms ago if larger (what the schedule reads). Requests still waiting in Triton's queue
are not counted (the engines do not see them either).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import mmap
import os
import tempfile
import threading
import time

import numpy as np

from specbuild.core.perf.schedule import INFLIGHT_HOLD_MS, held_count, record_end

SLOTS = 1024  # >= serving.bls_instance_count's bound (core/spec.py _RANGES)
SLOT_BYTES = 8  # pid int32 + count int32
END_BYTES = 16  # per slot, after all slots: end time ns int64 + count then int64
SIZE = SLOTS * (SLOT_BYTES + END_BYTES)


PREFIX = "specbuild-bls-inflight-"  # PREFIX<server pid>-<key>


def _folder() -> str:
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK) else tempfile.gettempdir()


def counter_path(repository: str, model: str, server_pid: int | None = None) -> str:
    server_pid = os.getppid() if server_pid is None else server_pid
    key = hashlib.sha256(f"{server_pid}\0{os.path.realpath(repository)}\0{model}".encode()).hexdigest()[:16]
    return os.path.join(_folder(), f"{PREFIX}{server_pid}-{key}")


def remove_stale(folder: str | None = None) -> None:
    """Delete the counter files of servers that no longer run (best effort; a reused pid keeps its file,
    whose dead slots count nothing)."""
    folder = folder or _folder()
    with contextlib.suppress(OSError):
        for name in os.listdir(folder):
            pid = name[len(PREFIX) :].partition("-")[0] if name.startswith(PREFIX) else ""
            # ASCII digits up to Linux's largest pid_max (2**22): a planted name ("²", 30 digits) is skipped
            if pid.isascii() and pid.isdigit() and len(pid) <= 7 and not _alive(int(pid)):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(folder, name))


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class InflightCounter:
    """One instance's view of the shared count (see the module docstring)."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()
        self._count = 0
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_size < SIZE:
                os.ftruncate(fd, SIZE)
            self._map = mmap.mmap(fd, SIZE)
            self._slots = np.frombuffer(self._map, dtype=np.int32, count=2 * SLOTS).reshape(
                SLOTS, 2
            )  # [slot, (pid, count)]
            # [slot, (end time ns, count then)]
            self._ends = np.frombuffer(self._map, dtype=np.int64, offset=SLOTS * SLOT_BYTES).reshape(SLOTS, 2)
            self.slot = self._claim()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def _claim(self) -> int:
        me = os.getpid()
        for i in range(SLOTS):
            pid = int(self._slots[i, 0])
            if pid == me or not _alive(pid):
                self._slots[i, 1] = 0
                self._ends[i] = 0
                self._slots[i, 0] = me
                return i
        raise RuntimeError(f"tensorrt_llm_bls: no free in-flight slot in {self.path} ({SLOTS} instances)")

    def total(self) -> int:
        """Requests in flight across the instances: the counts of slots whose process is alive (an instance
        that died without ending its requests counts nothing)."""
        busy = np.flatnonzero(self._slots[:, 1] > 0)
        return int(sum(int(self._slots[i, 1]) for i in busy if _alive(int(self._slots[i, 0]))))

    def held_total(self, hold_ms: float = INFLIGHT_HOLD_MS) -> int:
        """What the schedule reads: total(), or the count when a request ended less than hold_ms ago if
        larger (module docstring)."""
        ended = np.flatnonzero(self._ends[:, 0] > 0)
        ends = [
            (int(self._ends[i, 0]), int(self._ends[i, 1])) for i in ended if _alive(int(self._slots[i, 0]))
        ]
        return held_count(self.total(), ends, time.monotonic_ns(), hold_ms)

    @contextlib.contextmanager
    def handling(self, hold_ms: float = INFLIGHT_HOLD_MS):
        """Count one request while the block runs."""
        with self._lock:
            self._count += 1
            self._slots[self.slot, 1] = self._count
        try:
            yield
        finally:
            with self._lock:
                last = (int(self._ends[self.slot, 0]), int(self._ends[self.slot, 1]))
                now, before = record_end(
                    last, self.total(), time.monotonic_ns(), hold_ms
                )  # this one included
                self._ends[self.slot, 1] = before
                self._ends[self.slot, 0] = now
                self._count -= 1
                self._slots[self.slot, 1] = self._count

    def close(self) -> None:
        """Free the slot; the last instance removes the file."""
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            self._slots[self.slot] = 0
            self._ends[self.slot] = 0
            empty = not bool((self._slots[:, 0] != 0).any())
            del self._slots, self._ends
            self._map.close()
            if empty:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
