"""ReferenceEngine.session(): in-flight batching of plain decode. Rows join a running batch between
steps and leave the step they end in; every row's tokens equal the same request decoded alone
(greedy, and seeded sampling: each row draws from its own generator)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from specbuild.core.sampling_params import SamplingParams  # noqa: E402

PROMPTS = [[5, 17, 99, 3, 44, 12], [7, 7, 8], [200, 31, 64, 90, 11, 2, 150, 42, 77, 19], [5, 17, 99, 8]]
LENGTHS = [9, 3, 12, 6]  # max_tokens per request: rows end at different steps
JOIN_AT = [0, 0, 2, 4]  # the step before which each request is added

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.numeric]


@pytest.fixture(scope="module")
def model(tiny_target_model):
    return tiny_target_model


def _engine(model):
    from specbuild.engines.reference.engine import ReferenceEngine

    return ReferenceEngine(model)


def _params(i: int, temperature: float) -> SamplingParams:
    return SamplingParams(max_tokens=LENGTHS[i], temperature=temperature, seed=100 + i, end_id=-1)


def _run_staggered(engine, temperature: float):
    """Requests joining at JOIN_AT; returns (tokens per request, streamed per request, the step each
    ended in, rows per decode step)."""
    session = engine.session()
    rows, streamed, ended_at, widths = {}, {i: [] for i in range(len(PROMPTS))}, {}, []
    step = 0
    while len(ended_at) < len(PROMPTS):
        for i, at in enumerate(JOIN_AT):
            if at == step:
                rows[i] = session.add(
                    PROMPTS[i], _params(i, temperature), on_tokens=lambda t, i=i: streamed[i].extend(t)
                )
                if rows[i].done:
                    ended_at[i] = step
        widths.append(len(session))
        for row in session.step():
            ended_at[next(i for i, r in rows.items() if r is row)] = step
        step += 1
    return {i: r.tokens for i, r in rows.items()}, streamed, ended_at, widths


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_rows_joining_mid_batch_decode_exactly_as_alone(model, temperature):
    alone = [
        _engine(model).generate(p, _params(i, temperature), speculative=False).token_ids
        for i, p in enumerate(PROMPTS)
    ]
    tokens, streamed, ended_at, widths = _run_staggered(_engine(model), temperature)
    assert [tokens[i] for i in range(len(PROMPTS))] == alone
    assert [streamed[i] for i in range(len(PROMPTS))] == alone
    # each row left the step it ended in (its first token comes from its prefill, at admission)
    assert ended_at == {i: JOIN_AT[i] + LENGTHS[i] - 2 for i in range(len(PROMPTS))}
    assert max(widths) == 3 and widths[0] == 2  # rows shared steps


def test_a_row_its_stop_hook_ends_leaves_in_that_step_and_the_others_go_on(model):
    engine = _engine(model)
    session = engine.session()
    params = SamplingParams(max_tokens=10, end_id=-1)
    cancel = {"now": False}
    a = session.add(PROMPTS[0], params, stop=lambda out, start: len(out) if cancel["now"] else None)
    b = session.add(PROMPTS[1], params)
    assert session.step() == []
    cancel["now"] = True
    assert session.step() == [a] and a.done and len(a.tokens) == 3 and len(session) == 1
    while not b.done:
        session.step()
    assert b.tokens == _engine(model).generate(PROMPTS[1], params, speculative=False).token_ids


def test_a_finished_row_leaves_its_kv_in_the_prefix_cache(model):
    engine = _engine(model)
    session = engine.session()
    params = SamplingParams(max_tokens=5, end_id=-1)
    row = session.add(PROMPTS[2], params)
    while not row.done:
        session.step()
    longer = PROMPTS[2] + row.tokens
    again = session.add(longer, params)
    assert again.cached_prompt_tokens == len(longer) - 1  # only the last token is fed again
    while not again.done:
        session.step()
    assert again.tokens == _engine(model).generate(longer, params, speculative=False).token_ids
    assert session.close() == [] and len(session) == 0


def test_a_running_row_keeps_its_prefix_entry_from_other_requests(model):
    """A verify call for a prompt that extends a running row's prompt must not take the row's entry."""
    engine = _engine(model)
    session = engine.session()
    params = SamplingParams(max_tokens=6, end_id=-1)
    row = session.add(PROMPTS[0], params)
    session.step()
    engine.verify_external(PROMPTS[0] + [1, 2], [3], params=params)  # would continue the row's entry
    while not row.done:
        session.step()
    assert row.tokens == _engine(model).generate(PROMPTS[0], params, speculative=False).token_ids


def test_requests_admitted_together_share_one_prefill_pass(model, monkeypatch):
    """The per-token calls of concurrent requests (the BLS's streamed baseline, its draft calls) are
    admitted together: one batched prefill pass for all of them, each from its own cached prefix."""
    engine = _engine(model)
    session = engine.session()
    params = SamplingParams(max_tokens=1, end_id=-1)
    grown = [list(p) for p in PROMPTS[:3]] + [[33, 1, 250, 4]]  # no two share a prefix
    grown = [p + session.add(p, params).tokens for p in grown]  # each prompt's KV in the prefix cache
    passes = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda *a, **kw: passes.append(1) or forward(*a, **kw))
    rows = session.add_many([(p, params, None, None) for p in grown])
    assert len(passes) == 1 and all(r.done for r in rows)
    assert [r.cached_prompt_tokens for r in rows] == [len(p) - 1 for p in grown]
    monkeypatch.undo()
    assert [r.tokens for r in rows] == [
        _engine(model).generate(p, params, speculative=False).token_ids for p in grown
    ]
