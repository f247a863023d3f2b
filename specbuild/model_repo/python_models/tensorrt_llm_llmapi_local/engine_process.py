"""The Triton side of the local LLM-API model's engine process (engine_child.py, which says why it is a
process and what the two exchange): start it, run one batch at a time, stop it.

Plain Python (no Triton, no torch): copied into the model folder like the other modules, unit-tested by
starting a real child on a tiny build.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from child_channel import READY_TIMEOUT_S, ChildError, ChildProcess

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_child.py")
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
        self.child = ChildProcess(CHILD, [engine_path, str(threads)], ready_timeout_s=ready_timeout_s)
        self.proc = self.child.proc
        self._rids = itertools.count(1)
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
        at its next step (it keeps what it produced). Returns each row's result (engine_child._result);
        EngineProcessError when the engine failed the batch or the process is gone."""
        rid = next(self._rids)
        self.child.send({"op": "gen", "rid": rid, "rows": rows, "speculative": speculative, "k": k})
        aborted: set[int] = set()
        while True:
            event = self.child.next()
            kind = event.get("e")
            if kind == "tok" and event["rid"] == rid:
                row = int(event["row"])
                on_tokens(row, event["new"], int(event["ns"]))
                if row not in aborted and stop(row):
                    aborted.add(row)
                    self.child.send({"op": "abort", "rid": rid, "row": row})
            elif kind == "done" and event["rid"] == rid:
                self.reused = int(event["reused"])
                return event["results"]
            elif kind == "error" and event["rid"] == rid:
                raise EngineProcessError(event["msg"])

    @property
    def alive(self) -> bool:
        return self.child.alive

    def close(self) -> None:
        """Ask the child to end after its running batch; kill it if it does not in time."""
        self.child.close()
