"""The local LLM-API model (tensorrt_llm_llmapi_local) through the fake Python backend: its streamed
responses are
built and sent on a thread of their own (engine_worker.Outbox), so a slow send does not hold up the
engine's next step, and they still go out in order with the protocol upstream's model speaks (one response
a step: the cumulative text_output and the step's output_ids; the final response last). A streamed
request's stop hook reads its sends' cancellation answers instead of asking Triton again every step."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
import pytest
import yaml
from fake_triton import FINAL, FakeServer, Request
from repo_builds import compile_tiny_llmapi

pytestmark = pytest.mark.numeric  # greedy tokens through CPU kernels

MAX_TOKENS = 12
PROMPT = "the quick brown fox"


@pytest.fixture(scope="module")
def llmapi(tmp_path_factory, tiny_target, tiny_draft):
    """(fake server, its tensorrt_llm model) of the tiny draft/target spec on the LLM-API flow."""
    import torch

    from specbuild.model_repo.generate import generate_repo

    threads = torch.get_num_threads()  # the local model pins its torch threads; restore after
    root = tmp_path_factory.mktemp("llmapi-model")
    build = compile_tiny_llmapi(root, target=tiny_target, draft=tiny_draft)
    repo = generate_repo(build, root / "repo", backend="llmapi-local", decoupled=True)  # these tests stream
    # what the model's auto_complete_config sets from model.yaml's triton_config (the fake does not call it)
    triton = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())["triton_config"]
    assert triton["decoupled"] is True
    config = repo / "tensorrt_llm" / "config.pbtxt"
    config.write_text(config.read_text() + "\nmodel_transaction_policy {\n  decoupled: true\n}\n")
    server = FakeServer(repo)
    model = server.models["tensorrt_llm"]
    yield server, model
    model.finalize()
    torch.set_num_threads(threads)


def _inputs(stream: bool) -> dict:
    return {
        "text_input": np.array([PROMPT.encode()], dtype=object),
        "sampling_param_max_tokens": np.array([MAX_TOKENS], dtype=np.int32),
        "sampling_param_temperature": np.array([0.0], dtype=np.float32),
        "sampling_param_exclude_input_from_output": np.array([True]),
        "streaming": np.array([stream]),
    }


class CountingRequest(Request):
    """A request whose sender counts its cancellation asks and may hold its first data response."""

    def __init__(self, inputs, hold: threading.Event | None = None):
        super().__init__(inputs)
        self.asks, self.hold = 0, hold
        sender, asks = self.sender, self

        def is_cancelled():
            asks.asks += 1
            return False

        send = sender.send

        def held_send(response=None, flags=0):
            if hold is not None and flags == 0 and not sender.responses:
                assert hold.wait(10), "the test never released the first send"
            send(response, flags)

        sender.is_cancelled, sender.send = is_cancelled, held_send


def _run(server, request) -> list[tuple]:
    server._validate("tensorrt_llm", request.inputs)  # declared names and dtypes, as the server checks
    assert server.models["tensorrt_llm"].execute([request]) is None  # decoupled: answered later
    assert request.sender.done.wait(60), "no final response"
    return request.sender.responses


def _out(response, name):
    return next(t.as_numpy() for t in response.output_tensors if t.name() == name)


def test_a_slow_send_does_not_hold_up_the_engine_and_responses_keep_their_order(llmapi, monkeypatch):
    server, model = llmapi
    final = _run(server, Request(_inputs(stream=False)))
    whole = list(_out(final[-1][0], "output_ids"))
    assert len(whole) == MAX_TOKENS

    generated = threading.Event()  # the engine process ran the request to its end
    done = model._done

    def watched(job, result):
        done(job, result)
        generated.set()

    monkeypatch.setattr(model, "_done", watched)
    hold = threading.Event()
    request = CountingRequest(_inputs(stream=True), hold=hold)
    server._validate("tensorrt_llm", request.inputs)
    assert model.execute([request]) is None
    # the first step's response is held in its send: the engine still runs every step to the end
    assert generated.wait(10), "the engine waited for a streamed response to be sent"
    hold.set()
    assert request.sender.done.wait(60)
    sent = request.sender.responses
    assert [flags for _, flags in sent] == [0] * (len(sent) - 1) + [FINAL]
    steps = [r for r, flags in sent if flags == 0]
    assert len(steps) > 1  # one response a step (speculation: several tokens a step)
    assert sum((list(_out(r, "output_ids")) for r in steps), []) == whole  # in order, none lost
    texts = [_out(r, "text_output")[0].decode() for r in steps]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))  # cumulative
    assert texts[-1] == _out(final[-1][0], "text_output")[0].decode()


def test_a_streamed_requests_stop_hook_reuses_its_sends_cancellation_answers(llmapi, monkeypatch):
    server, model = llmapi
    # a stop hook that asked Triton would now ask at every step
    monkeypatch.setattr(model, "check_period_s", 0.0)
    request = CountingRequest(_inputs(stream=True))
    sent = _run(server, request)
    # one ask when the request starts, then every data response and the final one ask afresh before
    # they go out; a stop hook that asked too would add one a step
    assert request.asks == len(sent) + 1, f"{request.asks} asks for {len(sent)} responses"


def test_a_one_call_request_asks_about_cancellation_once_per_check_period_not_every_step(llmapi):
    """A request that is not streamed has no sends to read answers from: after each step the worker asks
    Triton (an IPC round trip) at most every cancellation_check_period_ms (model.yaml's triton_config, 100
    as upstream's cancellation loop), not every POLL_S (10 ms), which cost 4.5% of the engine's time here.
    Each step's check is slowed to >= 15 ms, so asking every POLL_S would ask at every step."""
    import time

    server, model = llmapi
    assert model.check_period_s == 0.1  # the generated model.yaml's triton_config
    ended, calls = model._ended, []

    def slowed(job):  # the worker's thread, after each step of the request
        calls.append(job)
        time.sleep(0.015)
        return ended(job)

    model._ended = slowed
    try:
        inputs = _inputs(stream=False) | {"sampling_param_max_tokens": np.array([40], dtype=np.int32)}
        request = CountingRequest(inputs)
        t0 = time.monotonic()
        sent = _run(server, request)
        elapsed = time.monotonic() - t0
    finally:
        del model._ended
    assert len(sent) == 1 and len(list(_out(sent[-1][0], "output_ids"))) == 40
    steps = len(calls)
    # one ask when the request starts, one per period of its run, the final response's own
    assert request.asks <= elapsed / model.check_period_s + 3, (request.asks, elapsed)
    assert steps >= 2 * (elapsed / model.check_period_s + 3), "too few steps to tell the cadences apart"


def _engine_process(model):
    """The EngineProcess class of the model's folder (its modules are imported from there)."""
    return sys.modules[type(model.engine).__module__]


def test_the_engine_runs_in_a_process_of_its_own_and_streams_each_step(llmapi, greedy):
    """engine_host.py + batch_host.py: the model's Triton process only sends responses; the engine's steps
    come back as they are made, and their tokens are the greedy ones."""
    import os

    _, model = llmapi
    engine = model.engine
    assert engine.proc.pid != os.getpid() and engine.proc.poll() is None
    ids = list(model.tokenizer(PROMPT)["input_ids"])
    params = model._params(type("R", (), {"greedy": True, "max_new": MAX_TOKENS, "seed": None})())
    steps: list[list[int]] = []
    (result,) = engine.run(
        [{"ids": ids, "params": params.to_dict(), "stops": []}],
        speculative=True,
        k=model.k,
        on_tokens=lambda i, new, ns: steps.append(new),
        stop=lambda i: False,
    )
    assert sum(steps, []) == result["tokens"] == greedy(PROMPT, MAX_TOKENS)[1]
    assert len(steps) > 1 and result["drafted"] > 0  # one event a speculative step


def test_an_aborted_row_ends_at_its_next_step_with_what_it_produced(llmapi, greedy):
    _, model = llmapi
    ids = list(model.tokenizer(PROMPT)["input_ids"])
    params = model._params(type("R", (), {"greedy": True, "max_new": 40, "seed": None})())
    steps: list[list[int]] = []
    (result,) = model.engine.run(
        [{"ids": ids, "params": params.to_dict(), "stops": []}],
        speculative=False,
        k=None,
        on_tokens=lambda i, new, ns: steps.append(new),
        stop=lambda i: True,  # stop after the first step
    )
    assert result["tokens"] == sum(steps, [])
    assert 1 <= len(result["tokens"]) < 40  # the abort reached the engine within a few steps, not at the end
    assert result["tokens"] == greedy(PROMPT, 40)[1][: len(result["tokens"])]


def test_a_dead_engine_process_and_an_unloadable_engine_are_clear_errors(llmapi):
    _, model = llmapi
    module = _engine_process(model)
    other = module.EngineProcess(model.engine.engine_path, threads=1)
    other.proc.kill()
    other.proc.wait()
    with pytest.raises(module.EngineProcessError, match="the engine process is gone"):
        other.run(
            [{"ids": [1, 2], "params": {"max_tokens": 2}, "stops": []}],
            speculative=False,
            k=None,
            on_tokens=lambda *a: None,
            stop=lambda i: False,
        )
    other.close()
    with pytest.raises(module.EngineProcessError, match="did not load: .*no-such-build"):
        module.EngineProcess("/no-such-build", threads=1)


def test_requests_of_an_engine_process_that_dies_fail_at_once_not_after_it_is_started_again(llmapi):
    """The engine process dies under a running request: the request's error goes out before the model
    starts the engine again (the restart loads a model: it used to come first, holding the error), and
    the dead process is known dead at once (a killed process closes its pipe before it is a zombie: a
    restart check that raced it left the next request on the dead engine)."""
    server, model = llmapi
    old, restarts = model.engine, model.restarts
    os.kill(old.proc.pid, signal.SIGSTOP)  # the request reaches the engine, which stands still
    request = CountingRequest(_inputs(stream=False))
    server._validate("tensorrt_llm", request.inputs)
    assert model.execute([request]) is None
    time.sleep(0.5)
    os.kill(old.proc.pid, signal.SIGKILL)
    assert request.sender.done.wait(30), "no final response"
    assert model.engine is old and model.restarts == restarts  # answered before any restart
    ((response, flags),) = request.sender.responses
    assert flags == FINAL and response.has_error()
    assert "the engine process is gone (exit code -9" in response.error().message()
    assert not old.alive


def test_a_dead_engine_process_is_started_again_for_the_next_request(llmapi, greedy):
    """The engine process dies (killed here) with no request running: the model starts it again before the
    next batch, which is answered in full (the requests a dying engine was running get their error at
    once: test_e2e_process_tree.py, engine:tensorrt_llm)."""
    server, model = llmapi
    old = model.engine
    old.proc.kill()
    old.proc.wait()
    answered = _run(server, CountingRequest(_inputs(stream=False)))
    assert list(_out(answered[-1][0], "output_ids")) == greedy(PROMPT, MAX_TOKENS)[1]
    assert model.engine is not old and model.engine.alive and model.restarts == 1


# The perf outputs as upstream's model.py builds them (triton_backend/all_models/llmapi/tensorrt_llm/1/
# model.py `_create_response`, NVIDIA/TensorRT-LLM b35ac1b6): np.asarray([value], dtype=self.output_dtype),
# the dtype of text_output (TYPE_STRING -> object), so the container answers BYTES holding str(value) --
# upstream's docs/llmapi.md shows `"acceptance_rate": "0.0"`, `"total_draft_tokens": "0"` from a real server.
LLMAPI_PERF = (
    "kv_cache_reused_block",
    "kv_cache_hit_rate",
    "kv_cache_alloc_new_blocks",
    "kv_cache_alloc_total_blocks",
    "kv_cache_missed_block",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
)
FLOATS = {"kv_cache_hit_rate", "acceptance_rate"}


def test_perf_outputs_are_strings_as_the_container_sends_them(llmapi):
    server, _ = llmapi
    inputs = {**_inputs(stream=False), "sampling_param_return_perf_metrics": np.array([True])}
    ((response, _),) = _run(server, Request(inputs))[-1:]
    for name in LLMAPI_PERF:
        value = _out(response, name)
        assert value.dtype == object and value.shape == (1,), (name, value.dtype)  # BYTES [1]
        text = value[0].decode() if isinstance(value[0], bytes) else value[0]
        assert isinstance(text, str), (name, type(value[0]))
        if name in FLOATS:
            assert "." in text and 0.0 <= float(text) <= 1.0, (name, text)  # str(float): "0.0", "0.75"
        else:
            assert text.isdigit(), (name, text)  # str(int)
    drafted = int(_out(response, "total_draft_tokens")[0])
    accepted = int(_out(response, "total_accepted_draft_tokens")[0])
    assert drafted > 0 and float(_out(response, "acceptance_rate")[0]) == pytest.approx(accepted / drafted)
    assert int(_out(response, "arrival_time_ns")[0]) % 1000 == 0  # a timedelta's microseconds, in ns
