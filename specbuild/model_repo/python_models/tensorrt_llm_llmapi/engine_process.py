"""The Triton side of the local LLM-API model's engine process (engine_child.py, which says why it is a
process and what the two exchange): start it, run one batch at a time, stop it.

Plain Python (no Triton, no torch): copied into the model folder like the other modules, unit-tested by
starting a real child on a tiny build.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_child.py")
READY_TIMEOUT_S = 600.0  # loading and warming up the engine (seconds on a starved CPU, never minutes)
CLOSE_TIMEOUT_S = 10.0


class EngineProcessError(RuntimeError):
    """The engine process failed to start, failed a batch, or is gone."""


@dataclass(frozen=True)
class EngineInfo:
    """What the loaded engine is (its ready event)."""

    method: str | None  # core.methods.Method value of the build (None: plain)
    speculates: bool
    num_draft_tokens: int
    tokenizer_dir: Path | None


def python_executable() -> str:
    """The interpreter to start the child with: this process's, else the `python3` on PATH (inside the
    Python backend's stub, sys.executable is the stub's binary; the stub itself takes its Python from the
    `python3` on PATH)."""
    if Path(sys.executable).name.startswith("python"):
        return sys.executable
    found = shutil.which("python3")
    if found is None:
        raise EngineProcessError("no python3 on PATH to start the engine process with")
    return found


class EngineProcess:
    """One child process running the engine at `engine_path`."""

    def __init__(self, engine_path: str, *, threads: int, ready_timeout_s: float = READY_TIMEOUT_S):
        self.engine_path, self.threads = engine_path, threads
        self.proc = subprocess.Popen(  # noqa: S603 - our own script, argv built here
            [python_executable(), CHILD, engine_path, str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._rids = itertools.count(1)
        self._write = threading.Lock()
        try:
            if not select.select([self.proc.stdout], [], [], ready_timeout_s)[0]:
                raise EngineProcessError(f"the engine process was not ready within {ready_timeout_s:g} s")
            ready = self._next()
            if ready.get("e") != "ready":
                raise EngineProcessError(f"the engine did not load: {ready.get('msg', ready)}")
        except BaseException:
            self.close()
            raise
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
        self._send({"op": "gen", "rid": rid, "rows": rows, "speculative": speculative, "k": k})
        aborted: set[int] = set()
        while True:
            event = self._next()
            kind = event.get("e")
            if kind == "tok" and event["rid"] == rid:
                row = int(event["row"])
                on_tokens(row, event["new"], int(event["ns"]))
                if row not in aborted and stop(row):
                    aborted.add(row)
                    self._send({"op": "abort", "rid": rid, "row": row})
            elif kind == "done" and event["rid"] == rid:
                self.reused = int(event["reused"])
                return event["results"]
            elif kind == "error" and event["rid"] == rid:
                raise EngineProcessError(event["msg"])

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Ask the child to end after its running batch; kill it if it does not within timeout_s."""
        try:
            self._send({"op": "close"})
        except EngineProcessError:
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

    def _send(self, command: dict) -> None:
        line = (json.dumps(command, separators=(",", ":")) + "\n").encode()
        with self._write:
            try:
                self.proc.stdin.write(line)
                self.proc.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                raise EngineProcessError(self._gone()) from None

    def _next(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise EngineProcessError(self._gone())
        return json.loads(line)

    def _gone(self) -> str:
        code = self.proc.poll()
        return f"the engine process is gone (exit code {code}; its log is the server's)"
