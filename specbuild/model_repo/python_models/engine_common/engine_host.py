"""The local engine models' engine process: the reference engine, alone in a process of its own, for both
local stand-ins of `tensorrt_llm` (the C++ backend's interface: tensorrt_llm_local; the LLM-API model's:
tensorrt_llm_llmapi_local). One program, one protocol, one lifecycle; each model brings its host: what
runs the jobs it sends (tensorrt_llm_local/step_host.py: one request a job, in-flight batching step by
step, as the C++ backend's executor; tensorrt_llm_llmapi_local/batch_host.py: a batch of rows a job, as
the LLM API's generate call).

Why a process: the model's Triton process reads requests and builds and sends every response (a streamed
request's every step), and each of those is Python work that holds the GIL; with the engine in the same
process that work stalled the engine's steps and slowed streamed requests against the same requests
answered in one call (lab/notebook/2026-12-03-engine-process.md). TensorRT-LLM's LLM API does the same
for the same reason ("Partition the workload to multiple process for streaming performance",
tensorrt_llm/executor/executor.py GenerationExecutor.create, read at 005bc848); the C++ backend runs its
executor on threads of its own, outside the GIL.

Started as `python <the model's folder>/engine_host.py OPTIONS_JSON` (child_channel.ChildProcess; the
folder's own copy, since the host module beside it is imported by name; options: "host" names the
model's host module, "name", "path", "threads", "medusa_choices", "schedule", "warm_verify", and what
the host reads). Protocol, one JSON object a line (child_channel.py: the plumbing; no pickle):
* events: {"e": "ready", "method", "speculates", "num_draft_tokens", "draft_per_step", "tokenizer_dir",
  "reused"} once the engine is loaded and warmed up, or {"e": "failed", "msg"}; then the host's events,
  each naming its job: {"e": "tok", "jid", "new", ...} for a step's new tokens, {"e": "done", "jid",
  ...its result} or {"e": "error", "jid", "msg"} when the job ended; {"e": "log", "msg"} for the server's
  log;
* commands: {"op": "job", "jid", "req"} (a job to run: the host reads `req`), {"op": "stop", "jid",
  "row"?} (a `stop` request named it: it ends at its next step and keeps what it produced), {"op":
  "cancel", "jid", "row"?} (Triton cancelled it: it ends at its next step), {"op": "close"} (the running
  step ends first; the end of stdin without it means the model's process is gone: this one exits at once,
  as it does when that process dies: child_channel.bind_to_parent).

The rules that follow a process's death (the restart budget: child_channel.RestartBudget; the dead
process's requests get their error first) are the models' side, written once there too.

Plain Python at import (torch is imported by load_engine): copied into the folders of the two local
engine models only (model_repo/sources.py).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Protocol

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from child_channel import bind_to_parent, child_stdout  # noqa: E402

HOSTS = {"steps": "step_host", "batches": "batch_host"}  # options["host"] -> the module beside this one


class Host(Protocol):
    """What runs the jobs (a model's host module's `make_host(engine, emit, options)` builds it); `emit`
    hands each event to the model's side, from any thread."""

    def submit(self, jid: int, req: dict) -> None: ...

    def stop(self, jid: int, row: int = 0) -> None: ...

    def cancel(self, jid: int, row: int = 0) -> None: ...

    def close(self) -> None:
        """Stop after the running step; every event of the jobs it ran is emitted before this returns."""


def load_engine(options: dict):
    """The reference engine of `options`, its schedule set, warmed up: the first request must not pay for
    torch's lazy initialisation (seconds on a busy CPU, which would distort TTFT measurements)."""
    import torch  # noqa: PLC0415

    from specbuild.core.sampling_params import SamplingParams  # noqa: PLC0415
    from specbuild.engines.reference.engine import ReferenceEngine  # noqa: PLC0415

    # Several processes (draft, target, BLS, pre/post) share the CPU: torch's default of one thread per
    # core in each of them oversubscribes it (measured 50x slower on 2 loaded cores).
    torch.set_num_threads(int(options["threads"]))
    engine = ReferenceEngine.load(options["path"], medusa_choices=options.get("medusa_choices") or None)
    # specbuild addition (the C++ backend has no such parameter): on a self-drafting engine (Medusa) a
    # request admitted while the schedule's K for the requests in flight is 0 decodes as a plain row
    if options.get("schedule") and engine.speculates:
        from specbuild.core.perf.schedule import DraftSchedule  # noqa: PLC0415

        engine.schedule = DraftSchedule.from_text(options["schedule"], max_draft_len=engine.num_draft_tokens)
    params = SamplingParams(max_tokens=2, end_id=-1)
    engine.generate([0], params, speculative=True)  # plain on an engine that does not speculate
    if options.get("warm_verify") and not engine.speculates:  # an engine the BLS drives verifies drafts
        engine.verify_external([0], [0], None, params=params)
    return engine


def ready_event(engine) -> dict:
    return {
        "e": "ready",
        "method": engine.method.value if engine.method is not None else None,
        "speculates": engine.speculates,
        "num_draft_tokens": engine.num_draft_tokens,
        "draft_per_step": engine.draft_per_step(),
        "tokenizer_dir": str(engine.tokenizer_dir) if engine.tokenizer_dir is not None else None,
        "reused": engine.prefix_cache.reused_tokens,
    }


def make_host(options: dict, engine, emit: Callable[[dict], None]) -> Host:
    """The host options["host"] names, from its module beside this one (a model folder has its own)."""
    kind = options.get("host", "steps")
    if kind not in HOSTS:
        raise ValueError(f"unknown engine host {kind!r}: expected one of {sorted(HOSTS)}")
    return importlib.import_module(HOSTS[kind]).make_host(engine, emit, options)


def read_commands(host: Host, stream) -> bool:
    """The engine process's stdin: each command to the host, until close (True) or end of input (False)."""
    for line in stream:
        command = json.loads(line)
        op = command.get("op")
        if op == "job":
            host.submit(int(command["jid"]), command["req"])
        elif op == "stop":
            host.stop(int(command["jid"]), int(command.get("row", 0)))
        elif op == "cancel":
            host.cancel(int(command["jid"]), int(command.get("row", 0)))
        elif op == "close":
            return True
    return False


def main(argv: list[str]) -> int:
    options = json.loads(argv[1])
    bind_to_parent(f"the engine process of '{options.get('name', 'tensorrt_llm')}'")
    events = child_stdout()
    try:
        engine = load_engine(options)
        host = make_host(options, engine, events.send)
    except Exception as exc:  # noqa: BLE001 - the Triton process reports it and fails to load
        events.send({"e": "failed", "msg": f"{type(exc).__name__}: {exc}"})
        return 1
    events.send(ready_event(engine))
    if not read_commands(host, sys.stdin):  # the model's process is gone: nobody reads the answers
        os._exit(1)
    host.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
