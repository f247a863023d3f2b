"""The local tensorrt_llm model as it is served: its engine in a process of its own (engine_host.py,
host_link.ProcessHost), spoken to in JSON lines. The answers are those of the same engine inside the model's
process (host_link.ThreadHost, what the other fake-Triton tests drive): plain and speculative, greedy and
seeded sampling through the BLS (draft generation logits and draft logits cross the pipe as arrays),
streamed Medusa chunks, a `stop` request; a killed engine process fails its requests with an error that says
so and is started again. Real tritonserver runs of the same model: the e2e tests."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest
from fake_triton import (
    FINAL,
    FakeServer,
    InferenceResponse,
    Request,
    collect,
    engine_request,
    stop_request,
    text_request,
)
from repo_builds import cached_build

from specbuild.core.sampling_params import SamplingParams
from specbuild.model_repo.generate import generate_repo

pytestmark = pytest.mark.numeric  # float results through CPU kernels (greedy and seeded equality)

PROMPT = "def add(a, b):"
N = 8


@pytest.fixture(scope="module")
def dt(tmp_path_factory, tiny_target, tiny_draft):
    """(in this process, in an engine process): the same draft/target repository served both ways."""
    import torch

    threads = torch.get_num_threads()
    build = cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft)
    repo = generate_repo(build, tmp_path_factory.mktemp("host-dt") / "repo", backend="python")
    here, there = FakeServer(repo), FakeServer(repo, engine_process=True)
    yield here, there
    there.close()
    here.close()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def medusa(tmp_path_factory, tiny_target):
    import torch

    threads = torch.get_num_threads()
    build = cached_build(tmp_path_factory, "medusa", "medusa", target=tiny_target)
    repo = generate_repo(build, tmp_path_factory.mktemp("host-medusa") / "repo", backend="python")
    server = FakeServer(repo, engine_process=True)
    yield server
    server.close()
    torch.set_num_threads(threads)


def _child_pid(server: FakeServer, model: str = "tensorrt_llm") -> int:
    return server.models[model].host.child.proc.pid


def test_the_models_engines_run_in_processes_of_their_own(dt):
    _, there = dt
    pids = {_child_pid(there, name) for name in ("tensorrt_llm", "tensorrt_llm_draft")}
    assert len(pids) == 2 and os.getpid() not in pids
    assert there.models["tensorrt_llm"].engine is None  # nothing of the engine in the model's process


@pytest.mark.parametrize(
    "kw",
    [
        {"num_draft_tokens": 0},
        {"num_draft_tokens": 3, "return_perf_metrics": True},
        {"num_draft_tokens": 3, "use_draft_logits": True},  # generation and draft logits cross the pipe
        {"num_draft_tokens": 3, "use_draft_logits": True, "temperature": 0.9, "top_p": 1.0, "seed": 7},
        {"num_draft_tokens": 3, "stream": True},
    ],
    ids=["target-alone", "speculative", "draft-logits", "seeded-sampling", "streamed"],
)
def test_an_engine_process_answers_as_the_engine_in_the_models_process(dt, kw):
    here, there = dt
    want = collect(here.infer("tensorrt_llm_bls", text_request(PROMPT, N, **kw)))
    got = collect(there.infer("tensorrt_llm_bls", text_request(PROMPT, N, **kw)))
    assert got["tokens"] == want["tokens"] and got["text"] == want["text"] and len(got["tokens"]) == N
    if "return_perf_metrics" in kw:
        for key in ("total_draft_tokens", "total_accepted_draft_tokens"):
            assert got["perf"][key] == want["perf"][key]
        assert (
            got["perf"]["arrival_time_ns"]
            <= got["perf"]["first_token_time_ns"]
            <= got["perf"]["last_token_time_ns"]
        )


def test_generation_logits_cross_the_pipe_exactly(dt):
    """The draft model's generation logits (float32 [1, 1, n, V]) come back from the engine process as the
    engine computed them: the same bits as the same engine in this process (one torch thread in both, so the
    same kernels), through base64 of the raw bytes."""
    here, there = dt
    ids = here.models["preprocessing"].tokenizer.encode(PROMPT)
    inputs = engine_request(ids, 3, exclude_input_in_output=None, return_generation_logits=[[True]])
    (want,) = here.infer("tensorrt_llm_draft", inputs)
    (got,) = there.infer("tensorrt_llm_draft", inputs)
    out_want = {t.name(): t.as_numpy() for t in want.output_tensors}
    out_got = {t.name(): t.as_numpy() for t in got.output_tensors}
    vocab = here.models["tensorrt_llm"].engine.target.cfg.vocab_size
    assert out_got["generation_logits"].shape == (1, 1, 3, vocab)
    assert out_got["generation_logits"].dtype == np.float32
    assert np.array_equal(out_got["generation_logits"], out_want["generation_logits"])
    assert np.array_equal(out_got["output_ids"], out_want["output_ids"])


def _long(ids, n, *, request_id=""):
    return Request(engine_request(ids, n, streaming=[[True]]), request_id=request_id)


def _streamed(request) -> list[int]:
    sent = request.sender.responses
    assert sent[-1][1] == 1 and all(flags == 0 for _, flags in sent[:-1])  # COMPLETE_FINAL last, once
    tokens = []
    for response, _ in sent:
        assert response is None or not response.has_error(), response.error().message()
        if response is not None:
            out = {t.name(): t.as_numpy() for t in response.output_tensors}
            if "output_ids" in out:
                tokens += out["output_ids"].reshape(-1)[: int(out["sequence_length"].reshape(-1)[0])].tolist()
    return tokens


def test_medusa_streams_from_its_engine_process_and_a_stop_request_ends_it(medusa, tiny_target):
    """A streamed Medusa request's chunks come from the engine process's per-step events, in order, the
    tree's greedy output; a `stop` request read while a long one runs ends it early with a prefix of it."""
    from specbuild.engines.reference.engine import ReferenceEngine

    model = medusa.models["tensorrt_llm"]
    engine = ReferenceEngine.load(model.host_options["path"])  # the same build, in this process
    ids = [5, 17, 99, 3, 44, 12]
    whole = _long(ids, 40)
    medusa.infer_batch("tensorrt_llm", [], requests=[whole])
    greedy = engine.generate(ids, SamplingParams(max_tokens=100, end_id=-1), speculative=False).token_ids
    tokens = _streamed(whole)
    assert tokens == greedy[:40] and len(whole.sender.responses) > 2  # several chunks, then the final one

    stopped = _long(ids, 100, request_id="stop-me")
    assert model.execute([stopped]) is None
    stop = stop_request("stop-me")
    model.execute([stop])
    assert stop.sender.done.wait(30) and stopped.sender.done.wait(60)
    tokens = _streamed(stopped)
    assert len(tokens) < 100 and tokens == greedy[: len(tokens)]


def test_a_killed_engine_process_fails_its_request_and_is_started_again(dt):
    """The engine process dies while a request runs: that request gets an error that says so (never a hang);
    the model starts the engine again at the next request, which is answered exactly."""
    here, there = dt
    model = there.models["tensorrt_llm"]
    ids = here.models["preprocessing"].tokenizer.encode(PROMPT)
    inputs = engine_request(ids, 60)
    request = Request(dict(inputs))
    first = _child_pid(there)
    os.kill(first, signal.SIGSTOP)  # the request is read and handed over, the engine stands still
    assert model.execute([request]) is None
    os.kill(first, signal.SIGKILL)
    assert request.sender.done.wait(30)
    ((response, _),) = request.sender.responses
    assert response.has_error() and "the engine process is gone" in response.error().message()

    (again,) = there.infer("tensorrt_llm", inputs)
    assert _child_pid(there) != first and model.restarts == 1
    (want,) = here.infer("tensorrt_llm", inputs)
    assert not again.has_error(), again.error().message()
    get = lambda r: {t.name(): t.as_numpy() for t in r.output_tensors}["output_ids"].tolist()  # noqa: E731
    assert get(again) == get(want)


def _output_ids(response) -> list:
    assert not response.has_error(), response.error().message()
    return {t.name(): t.as_numpy() for t in response.output_tensors}["output_ids"].tolist()


def _wait_dead(host) -> None:
    deadline = time.monotonic() + 30
    while host.alive:  # False once the process is reaped (by the host's reader, or by this poll)
        assert time.monotonic() < deadline, "the killed engine process is still running"
        time.sleep(0.01)


def test_a_request_read_before_the_gone_event_runs_on_the_restarted_engine(dt):
    """The engine process dies and the model reads the next request before the dead host's "gone" event was
    handled (held here, as a loaded CPU holds the reader thread; issue 40's late error, a BLS round sent
    right after the kill): the request the dead engine held fails at once, before the new engine loads; the
    new request runs on the restarted engine and is answered exactly; the late "gone" fails nothing of it."""
    here, there = dt
    model = there.models["tensorrt_llm"]
    inputs = engine_request(here.models["preprocessing"].tokenizer.encode(PROMPT), 60)
    (want,) = here.infer("tensorrt_llm", inputs)
    old, restarts = model.host, model.restarts
    release = threading.Event()
    deliver = old._on_event

    def hold_gone(event):
        if event.get("e") == "gone":
            release.wait(60)
        deliver(event)

    old._on_event = hold_gone
    first = _child_pid(there)
    held = Request(dict(inputs))
    os.kill(first, signal.SIGSTOP)  # the request is handed over, the engine stands still
    assert model.execute([held]) is None
    os.kill(first, signal.SIGKILL)
    _wait_dead(old)
    after = Request(dict(inputs))
    try:
        assert model.execute([after]) is None  # the engine is started again first
        assert held.sender.done.is_set(), "the dead engine's request was not answered before the restart"
    finally:
        release.set()
    ((response, _),) = held.sender.responses
    assert response.has_error() and "the engine process is gone" in response.error().message()
    assert after.sender.done.wait(60)
    ((response, _),) = after.sender.responses
    assert _output_ids(response) == _output_ids(want)
    assert model.host is not old and model.restarts == restarts + 1 and _child_pid(there) != first


def test_a_request_whose_write_finds_the_engine_dead_runs_on_the_restarted_engine(dt):
    """The engine process died after the model last saw it running: the write of the next request breaks,
    and the model starts the engine again and runs the request there (not an error)."""
    here, there = dt
    model = there.models["tensorrt_llm"]
    inputs = engine_request(here.models["preprocessing"].tokenizer.encode(PROMPT), 8)
    (want,) = here.infer("tensorrt_llm", inputs)
    old, restarts = model.host, model.restarts
    os.kill(_child_pid(there), signal.SIGKILL)
    _wait_dead(old)
    proc = old.child.proc
    poll = proc.poll

    def running_once():  # the model's look finds it running: it died right after
        proc.poll = poll
        return None

    proc.poll = running_once
    (response,) = there.infer("tensorrt_llm", inputs)
    assert _output_ids(response) == _output_ids(want)
    assert model.host is not old and model.restarts == restarts + 1


def test_an_engine_that_keeps_dying_is_not_started_again_past_its_budget(dt):
    """The restart rule (child_channel.RestartBudget): with no restart left, a request read after the engine
    process died gets an error that says so, at once, and no engine is started; with one left again, the
    next request starts one and is answered exactly."""
    here, there = dt
    model = there.models["tensorrt_llm"]
    inputs = engine_request(here.models["preprocessing"].tokenizer.encode(PROMPT), 8)
    (want,) = here.infer("tensorrt_llm", inputs)
    budget, old = model._restarts, model.host
    budget.limit = budget.used  # none left
    try:
        os.kill(_child_pid(there), signal.SIGKILL)
        _wait_dead(old)
        (response,) = there.infer("tensorrt_llm", inputs)
        assert response.has_error()
        assert (
            f"the engine process died {budget.used + 1} times; not started again"
            in response.error().message()
        )
        assert model.host is old and not old.alive
    finally:
        budget.limit = budget.used + 1  # one left: the module's later tests get a live engine
    (again,) = there.infer("tensorrt_llm", inputs)
    assert model.host is not old and not again.has_error(), again.error().message()
    assert _output_ids(again) == _output_ids(want)


def test_the_bls_passes_on_its_engines_error_without_a_stop_request(medusa):
    """The Medusa engine process dies under a BLS call to the decoupled tensorrt_llm: the BLS answers its
    client with the engine's error and sends no `stop` for the failed call (served, that `stop` waits in
    tensorrt_llm's queue behind the restart of its engine, and the client's error came seconds late)."""
    model = medusa.models["tensorrt_llm"]
    first = _child_pid(medusa)
    os.kill(first, signal.SIGSTOP)  # the call is handed over, the engine stands still
    calls = len(medusa.calls)
    answered = []
    bls = threading.Thread(
        target=lambda: answered.append(medusa.infer("tensorrt_llm_bls", text_request(PROMPT, N))), daemon=True
    )
    bls.start()
    deadline = time.monotonic() + 60
    while not model._jobs:
        assert time.monotonic() < deadline, "the BLS's call never reached the engine host"
        time.sleep(0.01)
    os.kill(first, signal.SIGKILL)
    bls.join(60)
    assert answered, "the BLS did not answer"
    response = answered[0][-1]
    assert response.has_error() and "the engine process is gone" in response.error().message()
    stops = [inputs for name, inputs in medusa.calls[calls:] if name == "tensorrt_llm" and "stop" in inputs]
    assert stops == []


def test_a_stream_that_fails_after_its_chunks_sends_the_error_then_the_final_flag_alone(medusa):
    """A streamed request whose engine process dies after it sent chunks: its error goes out as a response of
    its own and the final flag alone after it (tritonserver 2.51 loses an error response following data
    responses on its way to a BLS, and the final flag with it when they go together: the BLS hung)."""
    model = medusa.models["tensorrt_llm"]
    request = _long([5, 17, 99, 3, 44, 12], 400)
    assert model.execute([request]) is None
    deadline = time.monotonic() + 60
    while not request.sender.responses:  # a chunk went out
        assert time.monotonic() < deadline, "no chunk was streamed"
        time.sleep(0.001)
    os.kill(_child_pid(medusa), signal.SIGKILL)
    assert request.sender.done.wait(60)
    *chunks, (error, flags), (last, final) = request.sender.responses
    assert chunks and all(r is not None and not r.has_error() and f == 0 for r, f in chunks)
    assert flags == 0 and error.has_error() and "the engine process is gone" in error.error().message()
    assert last is None and final == FINAL


def test_the_bls_fails_a_stream_that_ends_without_outputs(medusa, monkeypatch):
    """A stream from tensorrt_llm as tritonserver 2.51 hands a failed one to the BLS: its first chunk, then
    the final flag alone (the error response after it never arrives). The BLS answers with an error, never
    with the partial text as if it were complete."""
    infer = medusa.infer

    def as_2_51_delivers(name, inputs, request_id=""):
        responses = infer(name, inputs, request_id=request_id)
        if name != "tensorrt_llm" or "stop" in inputs:
            return responses
        return [*responses[:1], InferenceResponse()]  # the final flag alone: a response without outputs

    monkeypatch.setattr(medusa, "infer", as_2_51_delivers)
    last = medusa.infer("tensorrt_llm_bls", text_request(PROMPT, 24, stream=True))[-1]
    assert last.has_error() and "the stream ended without its outputs" in last.error().message()


def test_an_engine_that_does_not_load_fails_with_its_reason(dt, tmp_path):
    """A build the engine process cannot load: starting the host fails with the engine's own reason (the
    model's initialize turns it into the load error Triton logs)."""
    _, there = dt
    module = sys.modules[type(there.models["tensorrt_llm"]).__module__]
    with pytest.raises(module.ChildError, match="did not load: .*no-such-build"):
        module.ProcessHost(
            {"path": str(tmp_path / "no-such-build"), "threads": 1, "hold_ms": 0}, lambda e: None
        )
