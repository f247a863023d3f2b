"""The local LLM-API model's engine process: the reference engine, alone in a process of its own.

Why a process: the model's Triton process builds and sends a streamed response every engine step, and
each send and cancellation ask is an IPC round trip that leaves and retakes the GIL. With the engine in
the same process every such hand-over stalled the engine's thread on the GIL, and streamed requests ran
slower in the engine than one-call ones (lab/notebook/2026-12-03-engine-process.md).
TensorRT-LLM's LLM API does the same for the same reason: on one GPU it runs the executor in a worker
process ("Partition the workload to multiple process for streaming performance",
tensorrt_llm/executor/executor.py GenerationExecutor.create, read at 005bc848).

Started by engine_process.py as `python engine_child.py ENGINE_PATH TORCH_THREADS`. Protocol: JSON
lines, commands on stdin, events on stdout (the child's own prints go to stderr, the server's log):
* events: {"e": "ready", ...what the engine is} once loaded and warmed up, or {"e": "failed", "msg"};
  per batch, {"e": "tok", "rid", "row", "new", "ns"} for each step's new tokens of a row, then
  {"e": "done", "rid", "results": [...], "reused"} or {"e": "error", "rid", "msg"};
* commands: {"op": "gen", "rid", "rows": [{"ids", "params", "stops"}], "speculative", "k"} (one batch:
  its rows decode together), {"op": "abort", "rid", "row"} (that row ends at its next step, with what it
  produced), {"op": "close"} (the running batch ends first; the end of stdin without it means the model's
  process is gone: this one exits at once, as it does when that process dies:
  child_channel.bind_to_parent).
No pickle: both sides are this project's code, and JSON is all they exchange.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from child_channel import EventWriter, bind_to_parent, child_stdout  # noqa: E402
from words import stop_at_words  # noqa: E402

from specbuild.core.sampling_params import SamplingParams  # noqa: E402 - torch-free


class Child:
    """Runs the batches the Triton process sends, one at a time, and the aborts that name their rows."""

    def __init__(self, engine, events: EventWriter):
        self.engine, self.events = engine, events
        self.batches: queue.SimpleQueue = queue.SimpleQueue()
        self.aborted: set[tuple[int, int]] = set()  # (rid, row); read on the engine's thread at each step

    def read_commands(self, stream) -> None:
        """stdin's thread: batches to the queue, aborts to the set; close ends the process after the
        running batch, the end of input (the model's process is gone) at once."""
        for line in stream:
            command = json.loads(line)
            op = command.get("op")
            if op == "gen":
                self.batches.put(command)
            elif op == "abort":
                self.aborted.add((int(command["rid"]), int(command["row"])))
            elif op == "close":
                self.batches.put(None)
                return
        os._exit(1)

    def serve(self) -> None:
        while (command := self.batches.get()) is not None:
            self.run(command)

    def run(self, command: dict) -> None:
        rid, rows = int(command["rid"]), command["rows"]
        prompts = [row["ids"] for row in rows]
        params = [SamplingParams.from_dict(row["params"]) for row in rows]
        words = [stop_at_words(row["stops"]) for row in rows]
        events = self.events

        def on_tokens(i: int, new) -> None:
            events.send({"e": "tok", "rid": rid, "row": i, "new": list(new), "ns": time.time_ns()})

        def stop(i: int, out, start):
            if (rid, i) in self.aborted:
                return len(out)
            return words[i](out, start) if words[i] else None

        options = {"speculative": bool(command["speculative"]), "num_draft_tokens": command.get("k")}
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
            events.send({"e": "error", "rid": rid, "msg": f"{type(exc).__name__}: {exc}"})
        else:
            events.send(
                {
                    "e": "done",
                    "rid": rid,
                    "results": [_result(r) for r in results],
                    "reused": self.engine.prefix_cache.reused_tokens,
                }
            )
        finally:
            self.aborted -= {(rid, i) for i in range(len(rows))}


def _result(result) -> dict:
    stats = result.stats
    return {
        "tokens": list(result.token_ids),
        "accepted": stats.accepted,
        "drafted": stats.drafted,
        "steps": [list(step) for step in stats.steps],
        "finish": result.finish_reason,
    }


def main(argv: list[str]) -> int:
    engine_path, threads = argv[1], int(argv[2])
    bind_to_parent("the LLM-API model's engine process")
    events = child_stdout()
    try:
        import torch  # noqa: PLC0415

        from specbuild.engines.reference.engine import ReferenceEngine  # noqa: PLC0415

        torch.set_num_threads(threads)
        engine = ReferenceEngine.load(engine_path)
        # the first request must not pay for torch's lazy initialisation
        engine.generate([0], SamplingParams(max_tokens=2, end_id=-1), speculative=engine.speculates)
    except Exception as exc:  # noqa: BLE001 - the Triton process reports it and fails to load
        events.send({"e": "failed", "msg": f"{type(exc).__name__}: {exc}"})
        return 1
    events.send(
        {
            "e": "ready",
            "method": engine.method.value if engine.method is not None else None,
            "speculates": engine.speculates,
            "num_draft_tokens": engine.num_draft_tokens,
            "tokenizer_dir": str(engine.tokenizer_dir) if engine.tokenizer_dir is not None else None,
            "reused": engine.prefix_cache.reused_tokens,
        }
    )
    child = Child(engine, events)
    threading.Thread(target=child.read_commands, args=(sys.stdin,), daemon=True).start()
    child.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
