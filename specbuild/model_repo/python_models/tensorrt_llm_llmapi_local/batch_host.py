"""The local LLM-API model's engine host: runs the batches the model sends, one at a time, in the engine
process (engine_common/engine_host.py: why a process, the protocol, the lifecycle), as the LLM API's generate
call runs the requests it is handed together.

What this host adds to the common protocol: a job is one batch, `req` = {"rows": [{"ids", "params",
"stops"}], "speculative", "k"} (its rows decode together); its events are {"e": "tok", "jid", "row",
"new", "ns"} for each step's new tokens of a row, then {"e": "done", "jid", "results": [_result, ...],
"reused"} or {"e": "error", "jid", "msg"}; `stop` and `cancel` name a row (it ends at its next step
with what it produced: the model asks Triton about cancellation itself and sends either).
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from collections.abc import Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from words import stop_at_words  # noqa: E402

from specbuild.core.sampling_params import SamplingParams  # noqa: E402 - torch-free


class BatchHost:
    """Runs the batches on a thread of its own, one at a time; `stop` marks a row, read at each step."""

    def __init__(self, engine, emit: Callable[[dict], None]):
        self.engine, self.emit = engine, emit
        self.batches: queue.SimpleQueue = queue.SimpleQueue()
        self.ended: set[tuple[int, int]] = set()  # (jid, row); read on the engine's thread at each step
        self._thread = threading.Thread(target=self._serve, name="tensorrt_llm-engine", daemon=True)
        self._thread.start()

    def submit(self, jid: int, req: dict) -> None:
        self.batches.put((jid, req))

    def stop(self, jid: int, row: int = 0) -> None:
        self.ended.add((jid, row))

    cancel = stop  # a cancelled row ends as a stopped one; the model sends no outputs for it

    def close(self) -> None:
        """The batches sent before close run to their end first."""
        self.batches.put(None)
        self._thread.join()

    def _serve(self) -> None:
        while (batch := self.batches.get()) is not None:
            self.run(*batch)

    def run(self, jid: int, req: dict) -> None:
        rows = req["rows"]
        prompts = [row["ids"] for row in rows]
        params = [SamplingParams.from_dict(row["params"]) for row in rows]
        words = [stop_at_words(row["stops"]) for row in rows]
        emit = self.emit

        def on_tokens(i: int, new) -> None:
            emit({"e": "tok", "jid": jid, "row": i, "new": list(new), "ns": time.time_ns()})

        def stop(i: int, out, start):
            if (jid, i) in self.ended:
                return len(out)
            return words[i](out, start) if words[i] else None

        options = {"speculative": bool(req["speculative"]), "num_draft_tokens": req.get("k")}
        try:
            if len(rows) > 1:
                results = self.engine.generate_batch(
                    prompts, params, on_tokens=on_tokens, stop=stop, **options
                )
            else:
                results = [
                    self.engine.generate(
                        prompts[0],
                        params[0],
                        on_tokens=lambda new: on_tokens(0, new),
                        stop=lambda out, start: stop(0, out, start),
                        **options,
                    )
                ]
        except Exception as exc:  # noqa: BLE001 - the batch's error; the process goes on
            emit({"e": "error", "jid": jid, "msg": f"{type(exc).__name__}: {exc}"})
        else:
            emit(
                {
                    "e": "done",
                    "jid": jid,
                    "results": [_result(r) for r in results],
                    "reused": self.engine.prefix_cache.reused_tokens,
                }
            )
        finally:
            self.ended -= {(jid, i) for i in range(len(rows))}


def _result(result) -> dict:
    stats = result.stats
    return {
        "tokens": list(result.token_ids),
        "accepted": stats.accepted,
        "drafted": stats.drafted,
        "steps": [list(step) for step in stats.steps],
        "finish": result.finish_reason,
    }


def make_host(engine, emit: Callable[[dict], None], options: dict) -> BatchHost:
    """The host engine_common/engine_host.py runs for this model (options: engine_process.EngineProcess)."""
    return BatchHost(engine, emit)
