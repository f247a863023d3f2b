"""The Triton side's link to the local model's engine host (step_host.py): one interface, two places.

* ProcessHost (the default): the engine host runs in the engine process (engine_common/engine_host.py says why
  and what the two exchange); commands go down its stdin, and a reader thread hands each event to
  `on_event`. When the process dies, the thread hands over one {"e": "gone", "msg"} event and ends.
* ThreadHost (`engine_process` "false"): the same StepHost inside this process, its events handed to
  `on_event` directly from the engine's thread; what the fake-Triton tests drive (they reach its engine
  and scheduler), and a way to profile the engine inside the stub.

Both: `info` (the ready event: speculates, num_draft_tokens, draft_per_step, reused), `submit(jid, wire)`,
`stop(jid)`, `cancel(jid)`, `close()`, `alive`.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable

from child_channel import ChildError, ChildProcess
from engine_host import load_engine, ready_event
from step_host import make_host

# this folder's copy (a module imported by name may be another model folder's in a shared test process)
SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_host.py")


class ProcessHost:
    def __init__(self, options: dict, on_event: Callable[[dict], None]):
        self.child = ChildProcess(SCRIPT, [json.dumps(options)])
        self.info = self.child.ready
        self._on_event = on_event
        self._closing = False
        self._reader = threading.Thread(
            target=self._read, name=f"{options.get('name', 'tensorrt_llm')}-events", daemon=True
        )
        self._reader.start()

    def submit(self, jid: int, wire: dict) -> None:
        self.child.send({"op": "job", "jid": jid, "req": wire})

    def stop(self, jid: int) -> None:
        self.child.send({"op": "stop", "jid": jid})

    def cancel(self, jid: int) -> None:
        self.child.send({"op": "cancel", "jid": jid})

    @property
    def alive(self) -> bool:
        return self.child.alive

    def close(self) -> None:
        """The child ends after its running step (its unfinished requests are done with an error first) and
        its events are handed over before this returns. A child already dead (its model starts another) is
        not waited on: its reader may be handing over its "gone" event, which waits for the model's lock
        that the restart holds; the model fails that host's requests itself."""
        dead = not self.child.alive
        self._closing = True
        self.child.close()
        if not dead:
            self._reader.join(timeout=10)

    def _read(self) -> None:
        while True:
            try:
                event = self.child.next()
            except ChildError as exc:
                if not self._closing:
                    self._on_event({"e": "gone", "msg": str(exc)})
                return
            self._on_event(event)


class ThreadHost:
    def __init__(self, options: dict, on_event: Callable[[dict], None]):
        self.engine = load_engine(options)
        self.core = make_host(self.engine, on_event, options)
        self.info = ready_event(self.engine)

    def submit(self, jid: int, wire: dict) -> None:
        self.core.submit(jid, wire)

    def stop(self, jid: int) -> None:
        self.core.stop(jid)

    def cancel(self, jid: int) -> None:
        self.core.cancel(jid)

    @property
    def alive(self) -> bool:
        return True

    def close(self) -> None:
        self.core.close()
