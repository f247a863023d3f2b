"""Children that the kernel kills when the thread that started them ends: PR_SET_PDEATHSIG = SIGKILL.

`subprocess.Popen(..., preexec_fn=die_with_parent())` for the processes specbuild starts and must not
outlive it, however it ends (SIGKILL included): tritonserver under `serve`; `serve`, the stage commands
and `train-medusa` under the demo; trtllm-build under `compile`; the benchmarks' children. (The demo's
`pip install` of the real model is left to finish: a pip killed halfway breaks the environment.)

The signal follows the *thread* that forked the child: start them from the main thread (it lives as
long as the process). The C library is loaded here, in the parent; the function runs between fork and
exec and only calls prctl (nothing there may take a lock another thread held at the fork).
"""

from __future__ import annotations

import ctypes
import signal
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn arming PR_SET_PDEATHSIG (SIGKILL) in the child; None where there is no glibc prctl."""
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return arm
