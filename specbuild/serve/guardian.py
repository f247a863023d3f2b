"""A server's guardian: the process that cleans up after `TritonServer` when its owner dies unannounced.

`TritonServer.launch` starts one beside tritonserver, in a session of its own, its stdin a pipe from the
owner (`specbuild serve`, a test). The owner's stop does the clean, graceful stop and then closes the
pipe; an owner that dies (SIGKILL, a supervisor's grace running out, the OOM killer) closes it too,
with no code of its own running. On that end of input the guardian

1. SIGKILLs whatever is left of the server's process group: tritonserver (PR_SET_PDEATHSIG killed it
   already if the owner died), its Python-backend stubs and their engine processes, all of which
   inherit the group;
2. waits until the group is empty (their shared memory is unused then);
3. removes the server's files in /dev/shm (the stubs' regions and the BLS in-flight counters, by their
   name prefixes) and exits.

It ignores SIGINT, SIGTERM and SIGHUP, so a signal meant for the owner (or for everything named
specbuild) does not end it before the owner's stop has run: it lives exactly as long as its owner, plus
its cleanup. The processes of the tree also end on their own when their parent dies (the stubs' and
engine processes' lifeline, python_models/common/lifeline.py); this is the backstop that needs nothing
of them, for a stub that is still loading or wedged.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys

from specbuild.core.errors import ServerError
from specbuild.serve.server_watch import remove_shm, wait_group_gone

GROUP_GONE_TIMEOUT_S = 10.0  # SIGKILLed processes end in milliseconds; reaping them takes what init takes
START_TIMEOUT_S = 30.0  # Python starting (~0.1 s; seconds on a loaded machine)
READY = b"ready\n"


def start(pgid: int, prefixes: list[str]) -> subprocess.Popen:
    """The guardian of the process group `pgid` and the /dev/shm names `prefixes`, once it ignores the stop
    signals (it says so); close its stdin (or die) to make it clean up and exit."""
    keeper = subprocess.Popen(  # noqa: S603 - this module, our own arguments
        [sys.executable, "-m", "specbuild.serve.guardian", str(int(pgid)), *prefixes],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    ready = select.select([keeper.stdout], [], [], START_TIMEOUT_S)[0] and keeper.stdout.readline()
    keeper.stdout.close()
    if ready != READY:
        keeper.kill()
        keeper.wait()
        raise ServerError(
            "the server's guardian process did not start",
            expected=f"{READY!r} from `python -m specbuild.serve.guardian` within {START_TIMEOUT_S:g} s",
            found=repr(ready or b""),
            fix="check that this virtualenv's Python runs (`python -m specbuild.serve.guardian` is part of "
            "specbuild)",
        )
    return keeper


def clean_up(pgid: int, prefixes: list[str]) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # the group is gone (the owner's stop ended it)
        pass
    wait_group_gone(pgid, GROUP_GONE_TIMEOUT_S)
    for prefix in prefixes:
        remove_shm(prefix)


def main(argv: list[str]) -> int:
    pgid, prefixes = int(argv[1]), [p for p in argv[2:] if p]
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    while sys.stdin.buffer.read(4096):  # until end of input: the owner closed the pipe, or died
        pass
    clean_up(pgid, prefixes)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
