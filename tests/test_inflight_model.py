"""The local tensorrt_llm model schedules per step (in-flight batching), through the fake Python
backend: a request that arrives while another one decodes joins at the next step, and a short one
(a BLS verify round, a short plain request) is answered as soon as its own work ends, not when the
long request it shares the engine with ends. Tokens stay those of each request alone."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from fake_triton import FakeServer, Request
from repo_builds import cached_build

from specbuild.core.sampling_params import SamplingParams
from specbuild.model_repo.generate import generate_repo

pytestmark = pytest.mark.numeric  # float results through CPU kernels (greedy equality)

LONG = 40  # tokens of the long request (the repository's max_seq_len is 128)


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_target, tiny_draft):
    import torch

    threads = torch.get_num_threads()  # the local engine model pins its threads; restore after
    build = cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft)
    repo = generate_repo(build, tmp_path_factory.mktemp("inflight") / "repo", backend="python")
    yield FakeServer(repo)
    torch.set_num_threads(threads)


def _request(ids, n, drafts=None):
    inputs = {
        "input_ids": np.array([ids], dtype=np.int32),
        "input_lengths": np.array([[len(ids)]], dtype=np.int32),
        "request_output_len": np.array([[n]], dtype=np.int32),
        "exclude_input_in_output": np.array([[True]]),
    }
    if drafts is not None:
        inputs["draft_input_ids"] = np.array([drafts], dtype=np.int32)
    return Request(inputs)


def _tokens(request) -> list[int]:
    ((response, _),) = request.sender.responses
    assert not response.has_error(), response.error().message()
    out = {t.name(): t.as_numpy() for t in response.output_tensors}
    return out["output_ids"].reshape(-1)[: int(out["sequence_length"].reshape(-1)[0])].tolist()


def _held_step(model, gate: threading.Event, running: threading.Event):
    """Wrap the scheduler's decode step: its second call waits for `gate` (a request is submitted while
    the long one is mid-generation)."""
    session = model._worker._sched.session
    step, calls = session.step, []

    def held():
        calls.append(1)
        if len(calls) == 2:
            running.set()
            gate.wait(30)
        return step()

    session.step = held
    return lambda: setattr(session, "step", step)


@pytest.mark.parametrize("short_kind", ["verify", "plain"])
def test_a_short_request_joins_a_running_one_and_is_answered_first(server, short_kind):
    model = server.models["tensorrt_llm"]
    engine = model.engine
    long_ids, short_ids = [5, 17, 99, 3, 44, 12], [7, 7, 8, 21]
    alone_long = engine.generate(long_ids, SamplingParams(max_tokens=LONG, end_id=-1)).token_ids
    greedy = engine.generate(short_ids, SamplingParams(max_tokens=3, end_id=-1)).token_ids
    if short_kind == "verify":  # a BLS round: the first draft right, the second wrong
        short = _request(short_ids, 3, drafts=[greedy[0], (greedy[1] + 1) % 300])
        want = greedy[:2]
    else:
        short = _request(short_ids, 3)
        want = greedy
    gate, running = threading.Event(), threading.Event()
    restore = _held_step(model, gate, running)
    try:
        long = _request(long_ids, LONG)
        assert model.execute([long]) is None  # answered through its response sender
        assert running.wait(30)
        model.execute([short])
        gate.set()
        assert short.sender.done.wait(30)
        assert not long.sender.done.is_set()  # the short one did not wait for the long one's end
        assert long.sender.done.wait(60)
    finally:
        restore()
        gate.set()
    assert _tokens(short) == want
    assert _tokens(long) == alone_long


class _Counted:
    """Count a fake request's cancellation asks (each one an IPC round trip in a real stub)."""

    def __init__(self, request):
        self.asks, ask = 0, request.sender.is_cancelled

        def counted():
            self.asks += 1
            return ask()

        request.sender.is_cancelled = counted


def test_a_short_call_asks_triton_nothing_at_its_start_and_a_cancelled_wait_is_still_seen(
    server, monkeypatch
):
    """A BLS round's call arrives, runs and is answered within POLL_S: its arrival counts as an answer
    "not cancelled" (responder.handed_over), so it asks Triton nothing (the model asked before every
    verify pass). A request that waited longer than POLL_S is asked afresh and, cancelled, writes no
    outputs."""
    import sys

    model = server.models["tensorrt_llm"]
    module = sys.modules[type(model).__module__]
    ids = [7, 7, 8, 21]
    greedy = model.engine.generate(ids, SamplingParams(max_tokens=3, end_id=-1)).token_ids
    monkeypatch.setattr(module, "POLL_S", 60.0)  # "short": however slow this machine is
    verify = _request(ids, 3, drafts=[greedy[0], greedy[1]])
    counted = _Counted(verify)
    (responses,) = server.infer_batch("tensorrt_llm", [], requests=[verify])
    assert _tokens(verify) == greedy[:3] and counted.asks == 0

    monkeypatch.setattr(module, "POLL_S", 0.0)  # every wait is "long": the answer must be fresh
    late = _request(ids, 3, drafts=[greedy[0], greedy[1]])
    late.cancelled.set()
    (responses,) = server.infer_batch("tensorrt_llm", [], requests=[late])
    assert responses[0].has_error() and responses[0].error().code() == 1  # CANCELLED, no outputs
