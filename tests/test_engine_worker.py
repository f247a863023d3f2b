"""common/engine_worker.py: the worker, the running-request registry and the counters both local engine
models share (no Triton, no torch)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

COMMON = Path(__file__).resolve().parents[1] / "specbuild" / "model_repo" / "python_models" / "common"
sys.path.insert(0, str(COMMON))

from engine_worker import ActiveRequests, EngineWorker, RequestCounters  # noqa: E402


def test_worker_runs_waiting_jobs_together_up_to_max_batch_and_finishes_each():
    gate, started, batches, finished = threading.Event(), threading.Event(), [], []
    done = threading.Event()

    def run(jobs):
        if not batches and not started.is_set():
            started.set()
            gate.wait(5)  # hold the first batch so the next submissions wait together
        batches.append(list(jobs))

    def finish(job):
        finished.append(job)
        if len(finished) == 6:
            done.set()

    worker = EngineWorker("t", 3, run, finish)
    worker.submit([0])
    assert started.wait(5)
    worker.submit([])  # nothing to run: no batch
    worker.submit([1, 2, 3, 4, 5])
    gate.set()
    assert done.wait(5)
    assert batches == [[0], [1, 2, 3], [4, 5]] and finished == [0, 1, 2, 3, 4, 5]
    assert worker.close() == []


def test_close_returns_the_jobs_that_never_started():
    gate = threading.Event()
    started = threading.Event()

    def run(jobs):
        started.set()
        gate.wait(5)

    worker = EngineWorker("t", 1, run, lambda job: None)
    worker.submit(["a"])
    assert started.wait(5)
    worker.submit(["b", "c"])
    closing = threading.Thread(target=lambda: left.extend(worker.close()))
    left: list = []
    closing.start()
    gate.set()
    closing.join(5)
    assert left == ["b", "c"]


def test_active_requests_by_id():
    active = ActiveRequests()
    a, b, c = object(), object(), object()
    active.add("x", a)
    active.add("x", b)
    active.add("", c)  # no id: a stop request cannot name it
    assert active.named("x") == [a, b] and active.named("") == []
    active.remove("x", a)
    assert active.named("x") == [b]
    active.remove("x", b)
    active.remove("y", c)  # unknown: nothing happens
    assert active.named("x") == []


def test_counters_blocks_and_acceptance():
    perf = RequestCounters(arrival_ns=1)
    assert perf.acceptance_rate == 0.0
    perf.accepted, perf.drafted = 3, 4
    assert perf.acceptance_rate == 0.75
    perf.blocks(reused_tokens=70, total_tokens=100, tokens_per_block=32)
    assert (perf.reused_blocks, perf.new_blocks) == (2, 2)  # 100 tokens: 4 blocks, 2 of them reused
    perf.token()
    first = perf.first_token_ns
    perf.token()
    assert 0 < first <= perf.last_token_ns
    perf.scheduled()
    assert perf.scheduled_ns >= perf.arrival_ns


def test_outbox_sends_in_order_off_the_callers_thread_and_flushes_on_close():
    from engine_worker import Outbox

    gate, sent, threads, errors = threading.Event(), [], set(), []
    outbox = Outbox("t", on_error=errors.append)

    def first():
        gate.wait(5)  # a slow send: the caller goes on meanwhile
        sent.append(0)

    outbox.put(first)
    for i in range(1, 5):
        outbox.put(lambda i=i: (sent.append(i), threads.add(threading.current_thread().name)))
    outbox.put(lambda: 1 / 0)  # a failing send is reported, the next ones still go out
    outbox.put(lambda: sent.append(5))
    assert sent == []  # put returned before the first send ended
    gate.set()
    assert outbox.close()
    assert sent == [0, 1, 2, 3, 4, 5] and threads == {"t"}
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError)
    outbox.put(lambda: sent.append(6))  # after close: run by the caller, never dropped
    assert sent[-1] == 6
