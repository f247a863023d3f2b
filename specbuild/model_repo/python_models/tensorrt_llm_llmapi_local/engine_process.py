"""The Triton side of the local LLM-API model's engine process (engine_common/engine_host.py, which says
why it is a process and what the two exchange, running batch_host.py): start it, run one batch at a
time, stop it.

Plain Python (no Triton, no torch): copied into the model folder like the other modules, unit-tested by
starting a real child on a tiny build.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from child_channel import READY_TIMEOUT_S, ChildError, ChildProcess

# this folder's copy (a module imported by name may be another model folder's in a shared test process)
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_host.py")

EngineProcessError = ChildError  # the engine process failed to start, failed a batch, or is gone


@dataclass(frozen=True)
class EngineInfo:
    """What the loaded engine is (its ready event)."""

    method: str | None  # core.methods.Method value of the build (None: plain)
    speculates: bool
    num_draft_tokens: int
    tokenizer_dir: Path | None


class EngineProcess:
    """One child process running the engine at `engine_path` (common/child_channel.py: the plumbing)."""

    def __init__(self, engine_path: str, *, threads: int, ready_timeout_s: float = READY_TIMEOUT_S):
        self.engine_path, self.threads = engine_path, threads
        options = {"host": "batches", "name": "tensorrt_llm", "path": engine_path, "threads": threads}
        self.child = ChildProcess(SCRIPT, [json.dumps(options)], ready_timeout_s=ready_timeout_s)
        self.proc = self.child.proc
        self._jids = itertools.count(1)
        ready = self.child.ready
        self.info = EngineInfo(
            method=ready["method"],
            speculates=bool(ready["speculates"]),
            num_draft_tokens=int(ready["num_draft_tokens"]),
            tokenizer_dir=Path(ready["tokenizer_dir"]) if ready["tokenizer_dir"] else None,
        )
        self.reused = int(ready["reused"])  # the engine's prefix-cache reuse counter, as last reported

    def run(
        self,
        rows: list[dict],
        *,
        speculative: bool,
        k: int | None,
        on_tokens: Callable[[int, list[int], int], None],
        stop: Callable[[int], bool],
    ) -> list[dict]:
        """One batch (its rows: {"ids", "params", "stops"}) to its end. For each step of a row,
        on_tokens(row, new tokens, time.time_ns() they were made at), then stop(row): True ends that row
        at its next step (it keeps what it produced). Returns each row's result (batch_host._result);
        EngineProcessError when the engine failed the batch or the process is gone."""
        jid = next(self._jids)
        req = {"rows": rows, "speculative": speculative, "k": k}
        self.child.send({"op": "job", "jid": jid, "req": req})
        stopped: set[int] = set()
        while True:
            event = self.child.next()
            kind = event.get("e")
            if kind == "tok" and event["jid"] == jid:
                row = int(event["row"])
                on_tokens(row, event["new"], int(event["ns"]))
                if row not in stopped and stop(row):
                    stopped.add(row)
                    self.child.send({"op": "stop", "jid": jid, "row": row})
            elif kind == "done" and event["jid"] == jid:
                self.reused = int(event["reused"])
                return event["results"]
            elif kind == "error" and event["jid"] == jid:
                raise EngineProcessError(event["msg"])

    @property
    def alive(self) -> bool:
        return self.child.alive

    def close(self) -> None:
        """Ask the child to end after its running batch; kill it if it does not in time."""
        self.child.close()
