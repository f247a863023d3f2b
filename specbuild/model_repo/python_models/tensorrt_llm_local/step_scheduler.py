"""In-flight batching of the local `tensorrt_llm` model (engine_worker.Scheduler), per step as TensorRT-LLM's
batch manager schedules:

* a plain request becomes a row of the engine's DecodeSession when admitted: its prompt is prefilled
  from the prefix cache and its first token taken at once; every step then decodes one token for every
  row, streams it, and a row that ends (end id, stop words, max_tokens, cancelled or stopped) is
  answered in that step;
* a verification request (draft_input_ids: a BLS round) is one target pass: the verifications admitted
  since the last step run as one batched pass (ReferenceEngine.verify_external_batch) before the step's
  decode pass, and are answered right after it, not when the rows end;
* a whole job runs alone, to its end, between steps, one after another: a generation-logits request (a
  draft model serving the BLS its logits), and on an engine that speculates by itself (Medusa's tree) a
  request whose tree is on.

Row or tree (an engine that speculates by itself): `tree_k(n)` is the K of the engine's draft_len_schedule
for n = the requests in flight: the requests the model holds (`in_flight`: read and not answered, queued
for admission included), at least the rows decoding + the whole jobs waiting + the ones being admitted.
At admission, K = 0: the request is a plain row, in flight with the others; K > 0: its tree runs between
steps. A running tree checks n after each of its steps (the model's stop hook): once K is 0 it stops
there (job.paused) and the request goes on as a row over its prompt + what the tree produced (job.head),
with what is left of max_tokens; it never goes back to the tree. (Deciding at admission only, a closed
loop whose rows ended together sent its next requests one by one into trees that ran whole, and fell
back to one tree request at a time: bench-load medusa 0.70 of the one-call baseline at c=4, 0.90 with
the switch.) An engine that decodes plainly (draft/target, n-gram: the BLS drafts) has tree_k = 0.

Plain Python over the engine host's methods (step_host.StepHost: no Triton calls); copied beside
model.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


def plain_k(in_flight: int) -> int:
    """tree_k of an engine that decodes plainly: no request ever runs a tree."""
    return 0


class StepScheduler:
    """The rows, whole jobs and verifications of one local engine model (see the module docstring).
    `model`: the engine host (step_host.StepHost: its engine, _run_jobs, _on_tokens, _admitted,
    _stop_hook, _ended, _log_end)."""

    def __init__(
        self, model, *, tree_k: Callable[[int], int] = plain_k, in_flight: Callable[[], int] | None = None
    ):
        self.model = model
        self.tree_k = tree_k
        self.in_flight = in_flight  # the requests the model holds (queued for admission included)
        self.session = model.engine.session()
        self.rows: dict[int, tuple] = {}  # id(row) -> (job, row)
        self.waiting: list = []  # one-pass and whole jobs admitted for the next step
        self.done: list = []  # jobs that ended at admission (their first token, a cancelled request)
        self._skipped = False  # the last step answered first and left the rows' decode pass for this one

    def admit(self, jobs: list) -> None:
        in_flight = len(self.rows) + len(self.waiting) + len(jobs)
        if self.in_flight is not None:
            in_flight = max(in_flight, self.in_flight())
        tree = self.tree_k(in_flight) > 0
        plain = []
        for job in jobs:
            if job.req.draft_ids is not None or job.req.generation_logits or tree:
                self.waiting.append(job)
            elif job.responder.ended():  # cancelled or stopped while it waited
                self.model._ended(job)
                job.ran = True
                self.done.append(job)
            else:
                try:
                    plain.append((job, self.session.checked(job.req.prompt_ids, job.req.params)))
                except Exception as exc:  # noqa: BLE001 - the request's error response
                    job.error, job.ran = exc, True
                    self.done.append(job)
        if plain:
            self._add(plain)

    def step(self) -> list:
        """One step: the one-pass work admitted since the last step (verify passes, whole jobs; requests
        that ended at admission) is answered before the rows' decode pass, which then runs in the next
        step; with both kinds waiting they alternate, so neither starves the other."""
        waiting, self.waiting = self.waiting, []
        if waiting:
            self.model._run_jobs(waiting)  # the verify pass, then each whole job
            paused = [job for job in waiting if job.paused and _goes_on(job)]
            self.done += [job for job in waiting if job not in paused]
            if paused:
                self._add([(job, _rest(job)) for job in paused], continued=True)
        answer_first = bool(self.done) and not self._skipped
        self._skipped = answer_first and len(self.session) > 0
        if len(self.session) and not answer_first:
            try:
                ended = self.session.step()
            except Exception as exc:  # noqa: BLE001 - every row of the pass gets the error
                self.session.close()
                for job, _ in self.rows.values():
                    job.error, job.ran = exc, True
                    self.done.append(job)
                self.rows = {}
                ended = []
            for row in ended:
                self._ended(*self.rows.pop(id(row)))
        done, self.done = self.done, []
        return done

    def active(self) -> int:
        return len(self.rows) + len(self.waiting) + len(self.done)

    def drain(self) -> list:
        self.session.close()
        jobs = [job for job, _ in self.rows.values()] + self.waiting + self.done
        self.rows, self.waiting, self.done = {}, [], []
        return jobs

    def _add(self, plain: list, *, continued: bool = False) -> None:
        """New plain requests (job, checked params): rows of the session, prefilled together. continued:
        requests whose tree stopped (their prompt + what the tree produced is prefilled). A row's first
        token is taken while it is admitted, before its prefix reuse is known: the model holds the streamed
        tokens until then (step_host._admitted), so each chunk's perf outputs count its reuse."""
        model = self.model
        jobs = [job for job, _ in plain]
        for job in jobs:
            job.held = []
        try:
            rows = self.session.add_many(
                [
                    (
                        job.req.prompt_ids + job.head,
                        params,
                        lambda new, job=job: model._on_tokens(job, new),
                        model._stop_hook(job),
                    )
                    for job, params in plain
                ],
                continued=continued,
            )
        except Exception as exc:  # noqa: BLE001 - every request of the pass gets the error
            for job in jobs:
                job.error, job.ran, job.held = exc, True, None
                self.done.append(job)
            return
        for job, row in zip(jobs, rows, strict=True):
            # a continued row's prefill reuses its own tree's KV: the request's reuse is what its tree reused
            model._admitted(job, None if continued else row.cached_prompt_tokens)
            if row.done:
                self._ended(job, row)
            else:
                self.rows[id(row)] = (job, row)

    def _ended(self, job, row) -> None:
        job.tokens, job.ran = job.head + row.tokens, True
        if not job.head:  # its row's prefix reuse (a continued row's: its tree's, kept)
            job.reused_tokens = row.cached_prompt_tokens
        if job.cancelled:
            self.model._log_end(job)
        self.done.append(job)


def _goes_on(job) -> bool:
    """A paused tree request still has tokens to produce (it did not end, fail or reach max_tokens)."""
    params, tokens = job.req.params, job.tokens
    stops = set(params.stop_token_ids) | ({params.end_id} if params.end_id is not None else set())
    ended = job.cancelled or job.error is not None or (tokens and tokens[-1] in stops)
    return not ended and len(tokens) < params.max_tokens


def _rest(job):
    """The params of a paused tree request's row: what is left of max_tokens, and (seeded) a stream of its
    own, so the row does not reuse the random numbers its tree drew (offset as verify_external's)."""
    job.head, params = list(job.tokens), job.req.params
    seed = None if params.seed is None else params.seed + len(job.req.prompt_ids) + len(job.head)
    return dataclasses.replace(params, max_tokens=params.max_tokens - len(job.head), seed=seed)
