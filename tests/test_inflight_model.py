"""The local tensorrt_llm model schedules per step (in-flight batching), through the fake Python
backend: a request that arrives while another one decodes joins at the next step, and a short one
(a BLS verify round, a short plain request) is answered as soon as its own work ends, not when the
long request it shares the engine with ends. Tokens stay those of each request alone."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest
from fake_triton import FakeServer, Request, stop_request
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
    server = FakeServer(repo)
    yield server
    server.close()
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
    session = model.host.core._worker._sched.session
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


# ---- an engine that speculates by itself (Medusa's tree) with a draft_len_schedule ----------------------
SCHEDULE = "1:8,2:0"  # the tree alone, plain rows from 2 in flight (the tiny Medusa build's max_draft_len: 8)


@pytest.fixture(scope="module")
def medusa(tmp_path_factory, tiny_target):
    import torch

    threads = torch.get_num_threads()
    build = cached_build(tmp_path_factory, "medusa", "medusa", target=tiny_target)
    repo = generate_repo(
        build, tmp_path_factory.mktemp("inflight-medusa") / "repo", backend="python", schedule=SCHEDULE
    )
    server = FakeServer(repo)
    # a request these tests send alone is alone, however soon after the last test's requests it comes
    # (the hold on the count: test_a_request_right_after_two_were_answered_reads_two_and_runs_no_tree)
    server.models["tensorrt_llm"].host.core.hold_ms = 0
    yield server
    server.close()  # the BLS's in-flight counter file goes with it
    torch.set_num_threads(threads)


def _answer(request) -> tuple[list[int], dict, int]:
    """A decoupled request's tokens (its streamed chunks, or its one final response), its final response's
    outputs, and how many data chunks it streamed."""
    sent = request.sender.responses
    assert sent[-1][1] == 1 and all(flags == 0 for _, flags in sent[:-1])  # COMPLETE_FINAL last, once
    tokens, chunks = [], 0
    for response, flags in sent:
        assert response is not None and not response.has_error(), response and response.error().message()
        out = {t.name(): t.as_numpy() for t in response.output_tensors}
        tokens += out["output_ids"].reshape(-1)[: int(out["sequence_length"].reshape(-1)[0])].tolist()
        chunks += not flags
    return tokens, out, chunks


def _held_tokens(model, when, gate: threading.Event, reached: threading.Event):
    """Wrap the model's per-step token callback (the engine's thread): once `when(job, tokens so far)`
    holds, set `reached` and wait for `gate` there, so the engine stands still meanwhile."""
    core = model.host.core  # the engine host (step_host.StepHost), in this process here
    on_tokens, seen = core._on_tokens, {}

    def held(job, new):
        seen[id(job)] = seen.get(id(job), 0) + len(new)
        if when(job, seen[id(job)]):
            reached.set()
            gate.wait(30)
        return on_tokens(job, new)

    core._on_tokens = held
    return lambda: delattr(core, "_on_tokens")


def _perf_request(ids, n, *, stream=False):
    request = _request(ids, n)
    request.inputs["return_perf_metrics"] = np.array([[True]])
    request.inputs["streaming"] = np.array([[stream]])
    return request


def test_medusa_plain_rows_join_at_the_next_step_when_the_schedule_is_zero(medusa):
    """Two requests admitted together (K(2) = 0) are plain rows; a third that arrives while the long one
    decodes is admitted with 2 in flight, so it is a row too: it joins at the next step and is answered
    before the long one ends (the Medusa model used to run the requests it took to their end, the late one
    waiting for them). Every output is the plain greedy one; rows draft nothing; a row streams one chunk a
    step."""
    model = medusa.models["tensorrt_llm"]
    engine = model.engine
    long_ids, first_ids, late_ids = [5, 17, 99, 3, 44, 12], [9, 8, 7], [7, 7, 8, 21]

    def greedy(ids, n):
        return engine.generate(ids, SamplingParams(max_tokens=n, end_id=-1), speculative=False).token_ids

    long, first = _perf_request(long_ids, LONG, stream=True), _perf_request(first_ids, 2)
    gate, running = threading.Event(), threading.Event()
    restore = _held_tokens(model, lambda job, n: job.req.max_new == LONG and n == 2, gate, running)
    try:
        assert model.execute([long, first]) is None
        assert running.wait(30)
        late = _perf_request(late_ids, 3)
        model.execute([late])
        gate.set()
        assert late.sender.done.wait(30) and first.sender.done.is_set()
        assert not long.sender.done.is_set()  # the late one joined: it did not wait for the long one
        assert long.sender.done.wait(60)
    finally:
        restore()
        gate.set()
    for request, ids, n in ((long, long_ids, LONG), (first, first_ids, 2), (late, late_ids, 3)):
        tokens, out, _ = _answer(request)
        assert tokens == greedy(ids, n)
        assert int(out["total_draft_tokens"].reshape(-1)[0]) == 0  # a plain row: no tree
    assert _answer(long)[2] == LONG  # streamed: one chunk per token, each in its own step


def test_medusa_request_alone_runs_its_tree_with_its_figures(medusa):
    """K(1) = 8: a request admitted alone runs the Medusa tree whole: the tree's greedy output (= plain
    greedy) and its accepted / drafted figures, streamed in the tree's chunks (several tokens a step)."""
    model = medusa.models["tensorrt_llm"]
    engine = model.engine
    ids = [5, 17, 99, 3, 44, 12]
    params = SamplingParams(max_tokens=LONG, end_id=-1)
    tree = engine.generate(ids, params, speculative=True)
    assert tree.token_ids == engine.generate(ids, params, speculative=False).token_ids
    request = _perf_request(ids, LONG, stream=True)
    medusa.infer_batch("tensorrt_llm", [], requests=[request])
    tokens, out, chunks = _answer(request)
    assert tokens == tree.token_ids
    assert int(out["total_draft_tokens"].reshape(-1)[0]) == tree.stats.drafted > 0
    assert int(out["total_accepted_draft_tokens"].reshape(-1)[0]) == tree.stats.accepted
    assert chunks == len(tree.stats.steps) + 1 < LONG  # the root token, then one chunk per tree step


def test_a_stop_request_ends_a_medusa_row_within_a_step_and_the_other_row_goes_on(medusa):
    """Rows of the Medusa model keep the model's promises: a `stop` request for one row ends it at the next
    step with what it produced (a prefix of its greedy output), the row beside it ends whole."""

    model = medusa.models["tensorrt_llm"]
    engine = model.engine
    ids, other_ids = [5, 17, 99, 3, 44, 12], [7, 7, 8, 21]
    stopped, other = _perf_request(ids, 100, stream=True), _perf_request(other_ids, LONG)
    stopped._id = "s1"
    first, stop_read = threading.Event(), threading.Event()  # the engine waits at the first token
    restore = _held_tokens(model, lambda job, n: job.req.request_id == "s1" and n == 1, stop_read, first)
    assert model.execute([stopped, other]) is None  # 2 in flight: K(2) = 0, both rows
    assert first.wait(30)
    stop = stop_request("s1")
    model.execute([stop])
    stop_read.set()
    assert stop.sender.done.wait(10) and stopped.sender.done.wait(60) and other.sender.done.wait(60)
    restore()
    tokens, _, _ = _answer(stopped)
    greedy = engine.generate(ids, SamplingParams(max_tokens=100, end_id=-1), speculative=False).token_ids
    assert 0 < len(tokens) <= 2 and tokens == greedy[: len(tokens)]  # ended at the step after the stop
    plain = engine.generate(other_ids, SamplingParams(max_tokens=LONG, end_id=-1), speculative=False)
    assert _answer(other)[0] == plain.token_ids


def test_streamed_sends_do_not_hold_the_engine_and_keep_their_order(medusa):
    """A decoupled model's chunks and final responses go out on a thread of their own: while the first
    chunk's send is stuck (a slow IPC round trip), the engine still produces every token of the request;
    once the send returns, every chunk goes out in order and the final response last."""
    model = medusa.models["tensorrt_llm"]
    engine = model.engine
    ids, other_ids = [5, 17, 99, 3, 44, 12], [7, 7, 8, 21]
    long, other = _perf_request(ids, LONG, stream=True), _perf_request(other_ids, 3, stream=True)
    gate, sending, produced = threading.Event(), threading.Event(), threading.Event()
    send = long.sender.send

    def stuck(response=None, flags=0):
        sending.set()
        gate.wait(30)
        send(response, flags)

    long.sender.send = stuck
    core = model.host.core
    on_tokens, seen = core._on_tokens, []

    def counted(job, new):  # the engine's thread: count the long request's tokens as they are produced
        if job.req.max_new == LONG:
            seen.extend(new)
            if len(seen) == LONG:
                produced.set()
        return on_tokens(job, new)

    core._on_tokens = counted
    try:
        assert model.execute([long, other]) is None
        assert sending.wait(30)
        assert produced.wait(30)  # every token while the first send is still stuck
        assert not long.sender.responses
    finally:
        del core._on_tokens
        gate.set()
    assert long.sender.done.wait(60) and other.sender.done.wait(60)
    tokens, _, chunks = _answer(long)
    assert tokens == engine.generate(ids, SamplingParams(max_tokens=LONG, end_id=-1)).token_ids
    assert chunks == LONG


def test_a_medusa_tree_goes_on_as_a_plain_row_once_the_load_turns_k_to_zero(medusa):
    """A request admitted alone runs its tree (K(1) = 8); when a second request arrives (K(2) = 0) the
    tree stops after its next step and the request goes on as a plain row, in flight with the new one
    (which then does not wait for the tree to end). Both outputs stay the plain greedy ones; the first
    keeps the figures of the tree steps it ran."""
    model = medusa.models["tensorrt_llm"]
    engine = model.engine
    ids, late_ids = [5, 17, 99, 3, 44, 12], [7, 7, 8, 21]
    params = SamplingParams(max_tokens=LONG, end_id=-1)
    whole = engine.generate(ids, params, speculative=True)
    tree = _perf_request(ids, LONG, stream=True)
    gate, running = threading.Event(), threading.Event()
    restore = _held_tokens(model, lambda job, n: job.req.max_new == LONG and n == 1, gate, running)
    try:
        assert model.execute([tree]) is None
        assert running.wait(30)  # its root token: the tree runs
        late = _perf_request(late_ids, 3)
        model.execute([late])
        gate.set()
        assert late.sender.done.wait(30)
        assert not tree.sender.done.is_set()  # the late one did not wait for the tree to end
        assert tree.sender.done.wait(60)
    finally:
        restore()
        gate.set()
    tokens, out, _ = _answer(tree)
    assert tokens == whole.token_ids == engine.generate(ids, params, speculative=False).token_ids
    assert (
        0 < int(out["total_draft_tokens"].reshape(-1)[0]) < whole.stats.drafted
    )  # one tree step, then a row
    late_tokens, late_out, _ = _answer(late)
    assert late_tokens == engine.generate(late_ids, SamplingParams(max_tokens=3, end_id=-1)).token_ids
    assert int(late_out["total_draft_tokens"].reshape(-1)[0]) == 0


def test_a_medusa_tree_starts_from_the_prefix_cache_and_leaves_its_kv_there(medusa):
    """A tree request takes its prompt's KV from the engine's prefix cache, as a plain row does (the
    batch manager's block reuse serves every context phase), and leaves the prompt and the tokens it took
    there: the same prompt again prefills one token, and a row that goes on from the tree's output
    (a schedule's K=0) prefills only its last token. Before, every tree prefilled its whole prompt into a
    sequence of its own, and a tree that went on as a row prefilled the prompt and its output again."""
    engine = medusa.models["tensorrt_llm"].engine
    ids = [9, 31, 4, 4, 60, 2, 18, 77]  # a prompt no other test sends
    params = SamplingParams(max_tokens=12, end_id=-1)
    cache = engine.prefix_cache
    first = engine.generate(ids, params, speculative=True)
    assert first.stats.drafted > 0  # the tree ran
    before = cache.reused_tokens
    again = engine.generate(ids, params, speculative=True)
    assert cache.reused_tokens - before == len(ids) - 1  # all of the prompt but the token it feeds
    assert again.token_ids == first.token_ids == engine.generate(ids, params, speculative=False).token_ids
    head = first.token_ids[:5]  # what a paused tree hands its row (job.head)
    before = cache.reused_tokens
    row = engine.generate(ids + head, SamplingParams(max_tokens=3, end_id=-1), speculative=False)
    assert cache.reused_tokens - before == len(ids) + len(head) - 1
    assert row.token_ids == first.token_ids[5:8]


def test_a_row_asks_triton_about_cancellation_once_per_check_period_not_every_step(medusa):
    """A running row is asked whether Triton cancelled it (an IPC round trip, on the model's watcher thread)
    at most every cancellation_check_period_ms (the repository's 100), as the C++ backend checks, not at
    every step: asking every ~10 ms step cost the decoupled Medusa model 5-10% of its throughput at
    c = 2-4. Steps are slowed to >= 12 ms here, so asking every POLL_S (10 ms) would ask ~LONG times."""
    import time

    model = medusa.models["tensorrt_llm"]
    assert model.row_poll_s == 0.1  # the generated config's cancellation_check_period_ms
    engine = model.engine
    ids, other_ids = [5, 17, 99, 3, 44, 12], [7, 7, 8, 21]
    long, other = _perf_request(ids, LONG), _perf_request(other_ids, 2)  # 2 in flight: K(2) = 0, rows
    counted = _Counted(long)
    core = model.host.core
    on_tokens = core._on_tokens

    def slowed(job, new):  # the engine's thread, once a step per row
        if job.req.max_new == LONG:
            time.sleep(0.012)
        return on_tokens(job, new)

    core._on_tokens = slowed
    try:
        assert model.execute([long, other]) is None
        assert long.sender.done.wait(60) and other.sender.done.wait(60)
    finally:
        del core._on_tokens
    tokens, out, _ = _answer(long)
    plain = engine.generate(ids, SamplingParams(max_tokens=LONG, end_id=-1), speculative=False)
    assert tokens == plain.token_ids
    assert int(out["total_draft_tokens"].reshape(-1)[0]) == 0  # a plain row
    # LONG steps of >= 12 ms: about 0.5 s, so ~5 period asks, plus the final response's own ask
    assert counted.asks <= 10, counted.asks


def test_a_request_right_after_two_were_answered_reads_two_and_runs_no_tree(medusa):
    """Two requests answered together (same length, one step): the one that replaces them arrives alone
    but is admitted with the count they left (core/perf/schedule.held_count), so K(2) = 0: a plain row, not
    the tree; once the hold is over a lone request runs its tree again."""
    model = medusa.models["tensorrt_llm"]
    core = model.host.core  # the engine host holds the count
    a, b = _perf_request([9, 8, 7], 2), _perf_request([7, 7, 8, 21], 2)
    core.hold_ms = 60_000
    try:
        assert model.execute([a, b]) is None
        assert a.sender.done.wait(30) and b.sender.done.wait(30)
        assert core._in_flight() == 2  # none held now; two when the first of them was answered
        late = _perf_request([5, 17, 99, 3, 44, 12], 4)
        medusa.infer_batch("tensorrt_llm", [], requests=[late])
        assert int(_answer(late)[1]["total_draft_tokens"].reshape(-1)[0]) == 0  # a plain row
        core.hold_ms = 0  # the hold is over
        assert core._in_flight() == 0
        alone = _perf_request([5, 17, 99, 3, 44, 12], 4)
        medusa.infer_batch("tensorrt_llm", [], requests=[alone])
        assert int(_answer(alone)[1]["total_draft_tokens"].reshape(-1)[0]) > 0  # the tree
    finally:
        core.hold_ms = 0


def _sent_on(request) -> list[str]:
    """Record the thread each of a fake request's responses is sent on."""
    names, send = [], request.sender.send

    def recorded(response=None, flags=0):
        names.append(threading.current_thread().name)
        return send(response, flags)

    request.sender.send = recorded
    return names


def test_a_decoupled_request_that_does_not_stream_is_answered_on_the_engine_thread(medusa):
    """Decoupled (Medusa): a request that does not stream gets its one response on the engine's thread, not
    handed to the outbox's, where it would wait behind other requests' streamed chunks; a streamed
    request's chunks and its final response still go out on the outbox's thread, final last."""
    model = medusa.models["tensorrt_llm"]
    engine = model.engine
    ids = [5, 17, 99, 3, 44, 12]
    unary, streamed = _perf_request(ids, 6), _perf_request(ids, 6, stream=True)
    unary_on, streamed_on = _sent_on(unary), _sent_on(streamed)
    for request in (unary, streamed):  # one at a time: each runs the tree alone (K(1) = 8)
        medusa.infer_batch("tensorrt_llm", [], requests=[request])
        assert request.sender.done.wait(30)
    assert unary_on == [f"{model.name}-engine"]
    tokens, _, chunks = _answer(streamed)
    assert chunks > 0 and set(streamed_on) == {f"{model.name}-responses"}
    want = engine.generate(ids, SamplingParams(max_tokens=6, end_id=-1), speculative=False).token_ids
    assert tokens == _answer(unary)[0] == want  # the greedy tokens, either way


def _streamed_perf(request) -> list[dict]:
    """Every response's perf outputs (each must carry all of UPSTREAM_PERF, with the C++ backend's shape
    and type) as Python numbers, the final response last."""
    from test_repo_models import UPSTREAM_PERF

    seen = []
    for response, _ in request.sender.responses:
        out = {t.name(): t.as_numpy() for t in response.output_tensors}
        for name, dtype in UPSTREAM_PERF.items():
            assert name in out, (name, len(seen))
            assert out[name].shape == (1, 1) and out[name].dtype == dtype, (name, out[name].dtype)
        seen.append({name: out[name][0][0].item() for name in UPSTREAM_PERF})
    return seen


def _check_running(seen: list[dict]) -> None:
    """Running figures: the counts and times never go back, the prompt's reuse stays, the rate is the
    counts' ratio, and the last chunk's are the final response's (it ends with no new tokens)."""
    for before, after in zip(seen, seen[1:], strict=False):
        for name in ("total_draft_tokens", "total_accepted_draft_tokens", "kv_cache_alloc_total_blocks"):
            assert before[name] <= after[name], (name, before, after)
        assert before["kv_cache_alloc_new_blocks"] <= after["kv_cache_alloc_new_blocks"]
        assert before["kv_cache_reused_blocks"] == after["kv_cache_reused_blocks"]
        assert before["arrival_time_ns"] == after["arrival_time_ns"]
        assert before["first_token_time_ns"] == after["first_token_time_ns"] > 0
        assert before["last_token_time_ns"] <= after["last_token_time_ns"]
    for row in seen:
        drafted, accepted = row["total_draft_tokens"], row["total_accepted_draft_tokens"]
        assert 0 <= accepted <= drafted
        assert row["acceptance_rate"] == pytest.approx(
            accepted / drafted if drafted else 0.0
        )  # float32 (1e-6)
        assert (
            row["kv_cache_alloc_total_blocks"]
            == row["kv_cache_alloc_new_blocks"] + row["kv_cache_reused_blocks"]
        )
    assert seen[-2] == seen[-1]


def test_every_streamed_medusa_response_carries_the_perf_outputs_so_far(medusa):
    """With return_perf_metrics every streamed response carries every perf output, as the C++ backend fills
    them on each response: a tree's running accepted / drafted counts (its first chunk, the root token,
    none yet; then each step's), the final response the totals; plain rows (K(2) = 0) the same outputs,
    nothing drafted. The old model sent them on the final response only."""
    model = medusa.models["tensorrt_llm"]
    engine = model.engine
    ids = [5, 17, 99, 3, 44, 12]
    tree = engine.generate(ids, SamplingParams(max_tokens=LONG, end_id=-1), speculative=True)
    request = _perf_request(ids, LONG, stream=True)
    medusa.infer_batch("tensorrt_llm", [], requests=[request])
    seen = _streamed_perf(request)
    assert len(seen) == len(tree.stats.steps) + 2  # the root token, one chunk per tree step, the final
    _check_running(seen)
    assert seen[0]["total_draft_tokens"] == 0  # the root token comes before any tree step
    drafted = list(itertools.accumulate(d for _, d in tree.stats.steps))
    accepted = list(itertools.accumulate(a for a, _ in tree.stats.steps))
    assert [row["total_draft_tokens"] for row in seen[1:-1]] == drafted  # each step's running count
    assert [row["total_accepted_draft_tokens"] for row in seen[1:-1]] == accepted
    assert seen[-1]["total_draft_tokens"] == tree.stats.drafted > 0
    assert seen[-1]["total_accepted_draft_tokens"] == tree.stats.accepted

    rows = [_perf_request(ids, 5, stream=True), _perf_request([7, 7, 8, 21], 4, stream=True)]
    assert model.execute(rows) is None  # 2 in flight: K(2) = 0, both rows
    assert all(r.sender.done.wait(60) for r in rows)
    for request, n in zip(rows, (5, 4), strict=True):
        seen = _streamed_perf(request)
        assert len(seen) == n + 1  # one chunk per token, then the final
        _check_running(seen)
        assert seen[-1]["total_draft_tokens"] == 0
