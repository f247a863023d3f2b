"""Load-aware K: the spec key `speculation.schedule` (core/perf/schedule.py), the acceptance guard, and their
application in the reference engine's batch and the BLS loop — greedy output never changes."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import sys
from pathlib import Path

import pytest

from specbuild.core.errors import SpecError
from specbuild.core.perf.schedule import AcceptanceGuard, DraftSchedule, ScheduleError
from specbuild.core.spec import spec_from_dict

BASE = {
    "name": "s",
    "mode": "draft_target",
    "target": {"model": "t"},
    "draft": {"model": "d"},
    "speculation": {"max_draft_len": 4},
}


def _spec(**speculation):
    raw = {**BASE, "speculation": {**BASE["speculation"], **speculation}}
    return spec_from_dict(raw)


# ---- the type ---------------------------------------------------------------------------------------


def test_k_for_uses_the_largest_threshold_not_above_the_count():
    s = DraftSchedule.parse({1: 4, 3: 2, 6: 0}, max_draft_len=4)
    assert [s.k_for(n) for n in range(0, 9)] == [4, 4, 4, 2, 2, 2, 0, 0, 0]
    assert s.max_concurrency == 5
    assert DraftSchedule.parse({1: 4, 3: 2}, max_draft_len=4).max_concurrency is None


def test_text_and_json_spellings_round_trip():
    s = DraftSchedule.parse({"6": "0", "1": 4, 3: 2}, max_draft_len=4)  # a JSON manifest's string keys
    assert s.to_dict() == {1: 4, 3: 2, 6: 0}
    assert DraftSchedule.from_text(s.to_text(), max_draft_len=4) == s


def test_upper_bound_spelling_of_trtllm_1_3_plus():
    s = DraftSchedule.parse({1: 4, 3: 2, 6: 0}, max_draft_len=4)
    assert s.upper_bounds(8) == {2: 4, 5: 2}  # 6+ : the implicit K=0 past the largest key
    assert DraftSchedule.parse({1: 4, 3: 2}, max_draft_len=4).upper_bounds(8) == {2: 4, 8: 2}
    inner_zero = DraftSchedule.parse({1: 4, 3: 0, 5: 2}, max_draft_len=4)
    assert inner_zero.upper_bounds(8) == {2: 4, 4: 0, 8: 2}
    for n in range(1, 9):  # both spellings agree at every batch size
        up = inner_zero.upper_bounds(8)
        key = min((k for k in up if k >= n), default=None)
        assert (up[key] if key is not None else 0) == inner_zero.k_for(n)


@pytest.mark.parametrize(
    "raw", [{2: 4}, {1: 3}, {1: 4, 2: 5}, {1: 4, 0: 1}, {}, [1, 4], {1: True}, {1: 4, 2: -1}, {1: "x"}]
)
def test_bad_schedules_are_refused(raw):
    with pytest.raises(ScheduleError):
        DraftSchedule.parse(raw, max_draft_len=4)


def test_spec_key_is_validated_and_normalised():
    spec = _spec(schedule={3: 2, 1: 4, 6: 0})
    assert spec.speculation.schedule == {1: 4, 3: 2, 6: 0}
    assert list(spec.speculation.schedule) == [1, 3, 6]
    written = {k: v for k, v in spec.to_dict().items() if k != "source" and v is not None}
    assert spec_from_dict(written).speculation.schedule == {1: 4, 3: 2, 6: 0}
    with pytest.raises(SpecError, match="speculation.schedule"):
        _spec(schedule={1: 3})
    with pytest.raises(SpecError, match="speculation.schedule"):
        _spec(schedule="1:4")


def test_guard_section_is_validated():
    assert _spec(guard={"window": 4, "min_acceptance": 0.25}).speculation.guard.window == 4
    with pytest.raises(SpecError, match="min_acceptance"):
        _spec(guard={"min_acceptance": 1.5})
    with pytest.raises(SpecError, match="guard.window"):
        _spec(guard={"window": 0})
    assert _spec().speculation.guard is None  # off by default


def test_tree_methods_take_only_off_or_the_whole_tree():
    raw = {
        "name": "m",
        "mode": "medusa",
        "target": {"model": "t"},
        "medusa": {"heads": "h", "num_heads": 2, "choices": [[0], [0, 0], [1]]},
    }
    k = spec_from_dict(raw).speculation.max_draft_len
    assert spec_from_dict({**raw, "speculation": {"schedule": {1: k, 4: 0}}}).speculation.schedule == {
        1: k,
        4: 0,
    }
    with pytest.raises(SpecError, match="whole tree"):
        spec_from_dict({**raw, "speculation": {"schedule": {1: k, 4: 1}}})


def test_guard_trips_on_the_last_window_only():
    g = AcceptanceGuard(window=3, min_acceptance=0.5)
    assert not g.trips([(0, 4), (0, 4)])  # not a full window yet
    assert g.trips([(4, 4), (0, 4), (1, 4), (0, 4)])  # last three: 1 of 12
    assert not g.trips([(0, 4), (2, 4), (2, 4), (2, 4)])  # last three: 6 of 12 = 0.5


# ---- the loop: greedy output unchanged ---------------------------------------------------------------

torch = pytest.importorskip("torch")

from specbuild.core.sampling_params import SamplingParams  # noqa: E402

PROMPTS = [[5, 17, 99, 3, 44, 12], [7, 7, 8], [200, 31, 64, 90, 11, 2, 150, 42, 77, 19], [1, 2, 3, 4]]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def models(tiny_target, tmp_path_factory):
    from specbuild.engines.reference.loader import load_weights
    from specbuild.engines.reference.model import LlamaModel
    from specbuild.engines.trtllm.convert import convert_checkpoint

    weights = load_weights(
        convert_checkpoint(tiny_target, tmp_path_factory.mktemp("s") / "t", dtype="float32")
    )
    gen = torch.Generator().manual_seed(3)
    noisy = {k: t + 0.04 * torch.randn(t.shape, generator=gen) for k, t in weights.tensors.items()}
    # a draft that (almost) never agrees: the target with its output layer negated
    anti = {k: -t if "lm_head" in k else t for k, t in weights.tensors.items()}
    return (
        LlamaModel(weights),
        LlamaModel(dataclasses.replace(weights, tensors=noisy)),
        LlamaModel(dataclasses.replace(weights, tensors=anti)),
    )


def _engine(models, schedule=None, guard=None, draft=1):
    from specbuild.core.methods import Method
    from specbuild.engines.reference.engine import ReferenceEngine

    return ReferenceEngine(
        models[0],
        draft=models[draft],
        method=Method.DRAFT_TARGET,
        max_draft_len=4,
        schedule=schedule,
        guard=guard,
    )


@pytest.fixture(scope="module")
def baseline(models):
    from specbuild.engines.reference.engine import ReferenceEngine

    engine = ReferenceEngine(models[0])
    params = SamplingParams(max_tokens=MAX_TOKENS)
    return [r.token_ids for r in engine.generate_batch(PROMPTS, params, speculative=False)]


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("table", [{1: 4, 2: 2, 4: 0}, {1: 4, 3: 0}, {1: 4, 2: 1, 3: 3}])
def test_batch_schedule_keeps_greedy_output(models, baseline, table):
    """The rows still decoding pick K each round (4 rows -> 0, then 2 as rows finish, ...)."""
    schedule = DraftSchedule.parse(table, max_draft_len=4)
    engine = _engine(models, schedule=schedule)
    params = [SamplingParams(max_tokens=n) for n in (MAX_TOKENS, 6, 12, MAX_TOKENS)]
    results = engine.generate_batch(PROMPTS, params)
    for r, want, p in zip(results, baseline, params, strict=True):
        assert r.token_ids == want[: p.max_tokens]
    # the rounds followed the schedule: with 4 rows in flight the first round is a plain step of each row
    ks = [r.stats.k_per_round for r in results]
    assert all(k[0] == schedule.k_for(4) for k in ks)
    if schedule.k_for(4) == 0 and schedule.k_for(1) > 0:
        assert any(x > 0 for x in ks[0]), "the last row alone drafts again"


@pytest.mark.usefixtures("one_torch_thread")
def test_explicit_k_is_fixed_and_schedule_off_is_k(models, baseline):
    engine = _engine(models, schedule=DraftSchedule.parse({1: 4, 2: 0}, max_draft_len=4))
    params = SamplingParams(max_tokens=MAX_TOKENS)
    fixed = engine.generate_batch(PROMPTS, params, num_draft_tokens=3)
    assert [r.token_ids for r in fixed] == baseline
    assert all(set(r.stats.k_per_round[:-1]) <= {3, 2, 1} and r.stats.drafted > 0 for r in fixed)
    scheduled = engine.generate_batch(PROMPTS, params)
    assert [r.token_ids for r in scheduled] == baseline
    assert all(r.stats.drafted == 0 for r in scheduled)  # 4 rows in flight: K=0 until ...
    # ... the rows finish together (same max_tokens), so no row ever decodes alone


def _count_passes(monkeypatch, model) -> list[int]:
    """Record, per forward pass of `model`, the tokens it computed (sum of the rows' new tokens)."""
    fed: list[int] = []
    forward = model.forward

    def counted(tokens, cache, **kw):
        n_new = kw.get("n_new")
        fed.append(sum(n_new) if n_new is not None else tokens.numel())
        return forward(tokens, cache, **kw)

    monkeypatch.setattr(model, "forward", counted)
    return fed


@pytest.mark.usefixtures("one_torch_thread")
def test_all_k0_batch_is_the_plain_batch(models, baseline, monkeypatch):
    """Every row at K=0 (4 rows in flight, {1: 4, 2: 0}, rows ending together): no draft pass, and the
    target computes exactly the tokens of the plain batch (its prompts taken from the prefix cache as the
    plain batch's are), in as many passes, with the same greedy output."""
    engine = _engine(models, schedule=DraftSchedule.parse({1: 4, 2: 0}, max_draft_len=4))
    params = SamplingParams(max_tokens=MAX_TOKENS)
    engine.generate_batch(PROMPTS, params, speculative=False)  # the prompts' KV in the prefix cache
    draft = _count_passes(monkeypatch, engine.draft)
    target = _count_passes(monkeypatch, engine.target)
    plain = engine.generate_batch(PROMPTS, params, speculative=False)
    plain_fed, target[:] = list(target), []
    scheduled = engine.generate_batch(PROMPTS, params)
    assert [r.token_ids for r in scheduled] == [r.token_ids for r in plain] == baseline
    assert all(set(r.stats.k_per_round) == {0} for r in scheduled)
    assert draft == []  # the draft model never ran
    assert target == plain_fed  # per pass: the prompts' last token, then one token per row still decoding
    assert plain_fed[0] == len(PROMPTS)


@pytest.mark.usefixtures("one_torch_thread")
def test_lockstep_batch_leaves_its_kv_in_the_prefix_cache(models, baseline):
    """A scheduled batch (K=0 rounds, then K=4 for the last row) leaves each row's prompt + output KV in
    the prefix cache: a later plain batch of the continued sequences prefills only what was never fed."""
    engine = _engine(models, schedule=DraftSchedule.parse({1: 4, 2: 0}, max_draft_len=4))
    lengths = (MAX_TOKENS, 6, 12, 8)
    done = engine.generate_batch(PROMPTS, [SamplingParams(max_tokens=n) for n in lengths])
    assert [r.token_ids for r in done] == [want[:n] for want, n in zip(baseline, lengths, strict=True)]
    assert any(x > 0 for x in done[0].stats.k_per_round), "the last row drafts again"
    longer = [p + r.token_ids + [9] for p, r in zip(PROMPTS, done, strict=True)]
    again = engine.generate_batch(longer, SamplingParams(max_tokens=4), speculative=False)
    # prompt + output but its last token (never fed: generate_batch leaves the same)
    assert [r.cached_prompt_tokens for r in again] == [
        len(p) + len(r.token_ids) - 1 for p, r in zip(PROMPTS, done, strict=True)
    ]


@pytest.mark.usefixtures("one_torch_thread")
def test_all_k0_batch_samples_as_the_plain_batch(models):
    """Sampling: a K=0 round draws each row's token from the target's own distribution with the row's
    own generator, as the plain batch does, so the same seeds give the same tokens."""
    engine = _engine(models, schedule=DraftSchedule.parse({1: 4, 2: 0}, max_draft_len=4))
    params = [
        SamplingParams(max_tokens=MAX_TOKENS, temperature=0.9, top_p=0.95, seed=s) for s in (1, 2, 3, 4)
    ]
    engine.generate_batch(PROMPTS, params, speculative=False)  # both runs below reuse the prompts' KV
    plain = engine.generate_batch(PROMPTS, params, speculative=False)
    scheduled = engine.generate_batch(PROMPTS, params)
    assert [r.token_ids for r in scheduled] == [r.token_ids for r in plain]
    assert all(set(r.stats.k_per_round) == {0} for r in scheduled)


@pytest.mark.usefixtures("one_torch_thread")
def test_guard_stops_drafting_and_keeps_greedy_output(models, baseline):
    bad = _engine(models, guard=AcceptanceGuard(window=2, min_acceptance=0.5), draft=2)
    params = SamplingParams(max_tokens=MAX_TOKENS)
    for prompt, want in zip(PROMPTS, baseline, strict=True):
        r = bad.generate(prompt, params)
        assert r.token_ids == want
        assert r.stats.guard_stopped
        assert r.stats.drafted == 8  # two rounds of 4, then plain steps
        assert r.stats.k_per_round[2:] == [0] * (len(r.stats.k_per_round) - 2)
    batch = bad.generate_batch(PROMPTS, params)
    assert [r.token_ids for r in batch] == baseline and all(r.stats.guard_stopped for r in batch)
    good = _engine(models, guard=AcceptanceGuard(window=2, min_acceptance=0.0), draft=2)
    assert not good.generate(PROMPTS[0], params).stats.guard_stopped


def test_bls_loop_reads_k_each_round_and_plain_rounds_batch_tokens():
    """The shared loop with a k_of() source and a verifier with plain(): K=0 rounds ask for up to
    plain_tokens target tokens in one call; greedy output equals the target's."""
    from specbuild.engines.reference.speculative import speculative_generate

    truth = [(i * 7 + 3) % 50 for i in range(40)]  # the "target's" greedy continuation

    class Drafter:
        forward_passes = 0

        def propose(self, ids, k, params):
            self.forward_passes += 1
            n = len(ids) - 2
            return [truth[n + j] if j % 2 == 0 else 49 for j in range(k)], None

    class Verifier:
        forward_passes = 0
        plains: list[int] = []

        def verify(self, ids, drafts, probs, params):
            self.forward_passes += 1
            n = len(ids) - 2
            out = []
            for j, d in enumerate(drafts):
                if d != truth[n + j]:
                    break
                out.append(d)
            return out + [truth[n + len(out)]]

        def plain(self, ids, n_tokens, params):
            self.forward_passes += 1
            self.plains.append(n_tokens)
            n = len(ids) - 2
            return truth[n : n + n_tokens]

    load = iter([1, 1, 5, 5, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    schedule = DraftSchedule.parse({1: 3, 4: 0}, max_draft_len=3)
    verifier = Verifier()
    out, stats = speculative_generate(
        Drafter(),
        verifier,
        [0, 0],
        SamplingParams(max_tokens=30),
        num_draft_tokens=3,
        k_of=lambda: schedule.k_for(next(load)),
        plain_tokens=4,
    )
    assert out == truth[:30]
    assert stats.k_per_round[:5] == [3, 3, 0, 0, 0] and verifier.plains[:3] == [4, 4, 4]
    assert stats.target_passes == len(stats.k_per_round)


# ---- the BLS's shared in-flight counter ------------------------------------------------------------------

BLS_DIR = (
    Path(__file__).resolve().parents[1] / "specbuild" / "model_repo" / "python_models" / "tensorrt_llm_bls"
)


def _inflight():
    sys.path.insert(0, str(BLS_DIR))
    try:
        import inflight
    finally:
        sys.path.remove(str(BLS_DIR))
    return inflight


def _worker(path, started, release, done):
    counter = _inflight().InflightCounter(path)
    with counter.handling():
        started.release()
        release.acquire()
    counter.close()
    done.release()


def _instances(target, path, n: int):
    """n BLS-instance processes running target(path, started, b, c) (forked), each past its first
    `started.release()`; returns the three semaphores and the processes."""
    ctx = multiprocessing.get_context("fork")
    started, b, c = ctx.Semaphore(0), ctx.Semaphore(0), ctx.Semaphore(0)
    procs = [ctx.Process(target=target, args=(path, started, b, c)) for _ in range(n)]
    for p in procs:
        p.start()
    for _ in procs:
        assert started.acquire(timeout=30)
    return started, b, c, procs


def test_inflight_counter_is_shared_between_processes(tmp_path):
    inflight = _inflight()
    path = inflight.counter_path(str(tmp_path), "tensorrt_llm_bls", server_pid=os.getpid())
    assert path != inflight.counter_path(str(tmp_path), "tensorrt_llm_bls", server_pid=os.getpid() + 1)
    me = inflight.InflightCounter(path)
    started, release, done, procs = _instances(_worker, path, 3)
    assert me.total() == 3  # three other instances handle one request each
    with me.handling():
        assert me.total() == 4
        with me.handling():  # a second request of the same process (threads of one instance)
            assert me.total() == 5
    for _ in procs:
        release.release()
    for p in procs:
        p.join(timeout=30)
    assert me.total() == 0
    me.close()
    assert not os.path.exists(path)  # the last instance removes the file


def test_inflight_counter_skips_dead_instances(tmp_path):
    inflight = _inflight()
    path = inflight.counter_path(str(tmp_path), "m", server_pid=os.getpid())
    ctx = multiprocessing.get_context("fork")

    def crash():  # counts a request and dies without closing
        c = inflight.InflightCounter(path)
        c._slots[c.slot, 1] = 1
        os._exit(0)

    p = ctx.Process(target=crash)
    p.start()
    p.join(timeout=30)
    me = inflight.InflightCounter(path)
    assert me.slot == 0  # the dead process's slot is claimed again, its count reset
    assert me.total() == 0
    me.close()


@pytest.mark.usefixtures("one_torch_thread")
def test_tree_method_batch_decodes_plainly_where_the_schedule_says_zero(models, baseline):
    """A speculator that cannot batch (Medusa's tree) runs a batch of n requests plainly when K(n) = 0."""
    engine = _engine(models, schedule=DraftSchedule.parse({1: 4, 2: 0}, max_draft_len=4))
    calls = []

    class TreeLike:
        batched = False

        def generate(self, prompt_ids, params, **kw):
            calls.append(len(prompt_ids))
            return [1] * params.max_tokens, engine_stats()

        def drafts_per_step(self, k, limits):
            return 4

    from specbuild.core.generation import SpecStats as engine_stats

    engine.speculator = TreeLike()
    params = SamplingParams(max_tokens=MAX_TOKENS)
    assert [r.token_ids for r in engine.generate_batch(PROMPTS, params)] == baseline  # K(4) = 0: plain
    assert not calls
    engine.generate_batch(PROMPTS[:1], params)  # K(1) = 4: the tree
    assert calls == [len(PROMPTS[0])]


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("table", [{1: 4, 2: 2, 4: 0}, {1: 4, 3: 1}])
def test_ngram_batch_schedule_keeps_greedy_output(models, baseline, table):
    """The n-gram speculator follows the same schedule in its lockstep batch."""
    from specbuild.core.methods import Method
    from specbuild.engines.reference.engine import ReferenceEngine

    schedule = DraftSchedule.parse(table, max_draft_len=4)
    engine = ReferenceEngine(
        models[0], method=Method.NGRAM, max_draft_len=4, schedule=schedule, guard=AcceptanceGuard(4, 0.1)
    )
    params = [SamplingParams(max_tokens=n) for n in (MAX_TOKENS, 6, 12, MAX_TOKENS)]
    results = engine.generate_batch(PROMPTS, params)
    for r, want, p in zip(results, baseline, params, strict=True):
        assert r.token_ids == want[: p.max_tokens]
    # n-gram drafts up to K (fewer, or none, without a match): never more than the schedule's K
    assert all(r.stats.k_per_round[0] <= schedule.k_for(4) for r in results)
    assert max(results[0].stats.k_per_round) <= 4


def test_schedule_steps_put_thresholds_at_midpoints():
    from specbuild.core.perf.schedule import schedule_steps

    assert schedule_steps([1, 2, 4, 8], {1: 4, 2: 3, 4: 2, 8: 0}) == {1: 4, 2: 3, 3: 2, 6: 0}
    assert schedule_steps([1, 2, 4, 8], {1: 4, 2: 4, 4: 4, 8: 4}) == {1: 4}
    assert schedule_steps([1, 8], {1: 2, 8: 0}) == {1: 2, 5: 0}


def test_counter_files_of_gone_servers_are_removed(tmp_path):
    """A server killed before its instances end leaves its file; the next instance anywhere removes it."""
    inflight = _inflight()
    ctx = multiprocessing.get_context("fork")
    gone = ctx.Process(target=lambda: None)
    gone.start()
    gone.join(timeout=30)
    stale = tmp_path / f"{inflight.PREFIX}{gone.pid}-0123456789abcdef"
    live = tmp_path / f"{inflight.PREFIX}{os.getpid()}-0123456789abcdef"
    other = tmp_path / "specbuild-bls-inflight-notapid"
    # names anyone with /dev/shm can plant: a superscript digit (str.isdigit, not int()), a pid os.kill
    # cannot take (OverflowError): skipped, not a crash of the BLS's initialize
    planted = [tmp_path / f"{inflight.PREFIX}{d}-x" for d in ("\u00b2", "9" * 30, "9999999999")]
    for p in (stale, live, other, *planted):
        p.write_bytes(b"\0" * 8)
    inflight.remove_stale(str(tmp_path))
    assert not stale.exists() and live.exists() and other.exists()
    assert all(p.exists() for p in planted)
    path = inflight.counter_path(str(tmp_path), "m", server_pid=os.getpid())
    assert os.path.basename(path).startswith(f"{inflight.PREFIX}{os.getpid()}-")


def test_server_removes_the_counter_files_a_killed_server_leaves(tmp_path, monkeypatch):
    """A server stopped by SIGKILL leaves its BLS counter files (its instances never reach close()):
    TritonServer.stop removes the ones named by that server's pid, and only those."""
    from specbuild.serve import server_watch

    assert server_watch.BLS_COUNTER_PREFIX == _inflight().PREFIX  # the name's one fact, spelled twice
    monkeypatch.setattr(server_watch, "SHM_DIR", tmp_path)
    mine = tmp_path / f"{server_watch.BLS_COUNTER_PREFIX}4242-0123456789abcdef"
    other = tmp_path / f"{server_watch.BLS_COUNTER_PREFIX}42421-0123456789abcdef"  # a pid sharing digits
    for path in (mine, other):
        path.write_bytes(b"\0" * 8)
    assert server_watch.remove_bls_counters(4242) == [mine.name]
    assert not mine.exists() and other.exists()


def test_held_count_keeps_the_load_a_request_replaces():
    from specbuild.core.perf.schedule import held_count

    ms = 1_000_000
    now = 10_000 * ms
    assert held_count(1, [(now - 10 * ms, 2)], now, hold_ms=50) == 2  # replaces one of two that just ended
    assert held_count(1, [(now - 60 * ms, 2)], now, hold_ms=50) == 1  # the hold is over: the live count
    assert held_count(1, [(now - 1 * ms, 1)], now, hold_ms=50) == 1  # a lone client stays at 1
    assert held_count(3, [(now - 1 * ms, 2)], now, hold_ms=50) == 3  # never below the live count
    assert held_count(1, [(now + 5 * ms, 4)], now, hold_ms=50) == 1  # a clock read before the end: not held


def _end_and_stay(path, started, ended, stay):
    counter = _inflight().InflightCounter(path)
    with counter.handling(hold_ms=60_000):
        started.release()
        ended.acquire()  # all end together, as same-length requests batched in one step
    started.release()
    stay.acquire()  # the instance lives on (a Triton instance does), its end recorded
    counter.close()


def test_a_request_that_replaces_ones_that_just_ended_reads_their_load(tmp_path):
    """Two instances' requests end together; the replacement that arrives first, in a third instance,
    reads 2 (not 1: without the hold it would draft a round), until the hold is over."""
    inflight = _inflight()
    path = inflight.counter_path(str(tmp_path), "tensorrt_llm_bls", server_pid=os.getpid())
    me = inflight.InflightCounter(path)
    started, ended, stay, procs = _instances(_end_and_stay, path, 2)
    assert me.total() == 2
    for _ in procs:
        ended.release()
    for _ in procs:
        assert started.acquire(timeout=30)
    assert me.total() == 0
    with me.handling():
        assert me.total() == 1  # live: only this request
        assert me.held_total(hold_ms=60_000) == 2  # what the schedule reads: the load it replaces
        assert me.held_total(hold_ms=0) == 1  # past the hold: the live count
    for _ in procs:
        stay.release()
    for p in procs:
        p.join(timeout=30)
    me.close()


def test_a_lone_client_keeps_reading_one_and_one_instance_keeps_the_larger_end(tmp_path):
    inflight = _inflight()
    me = inflight.InflightCounter(inflight.counter_path(str(tmp_path), "m", server_pid=os.getpid()))
    with me.handling(hold_ms=60_000):
        pass
    with me.handling(hold_ms=60_000):  # c=1: the next request reads 1, and drafts
        assert me.held_total(hold_ms=60_000) == 1
    # two requests of one instance (its threads) end one after the other: the end keeps the larger count
    a, b = me.handling(hold_ms=60_000), me.handling(hold_ms=60_000)
    a.__enter__(), b.__enter__()
    a.__exit__(None, None, None), b.__exit__(None, None, None)
    assert me.total() == 0 and me.held_total(hold_ms=60_000) == 2
    me.close()
