"""EAGLE-3 one-model in the reference engine: the draft layer drafts from the target's captured states,
in the one speculative loop (speculative.py).

Shape legend: R rows, T slots, H draft hidden, A captured width (n * Ht), V / Vd target / draft vocab.

A round, per request: the target's pass (a `ModelVerifier` / `BatchModelVerifier` with `capture`)
verifies the drafts and returns `Verified` answers carrying the captured states of the positions it fed;
the loop hands them to `observe`. The next `propose` feeds the draft one catch-up pass: the slots of the
tokens taken since its last round, each paired with the target state of the position before it (fused by
fc); the last slot's output gives draft token 1, and K - 1 more passes feed the draft's own output with
the token it drafted (draft.py's slot rule). The drafted slots are then rolled back: the next round
refeeds those positions from the target's states. The first round of a request drafts nothing (no target
state exists before the prefill pass, as in TensorRT-LLM's context phase), so K draft passes per later
round, one target pass per round.

Sampling: the draft samples over its own vocabulary with the request's params, and its distribution,
scattered into the target vocabulary (zero outside the draft vocabulary: `Eagle3Draft.to_target`), is
what `accept_draft`'s modified rejection sampling compares with the target's; greedy requests accept by
equality with the target's argmax. Either way every emitted token is the target's choice.

Prefix cache: the draft keeps its own (a `PrefixCache` of one-layer sequences: a draft slot depends on
tokens 0..i only, as the target's KV does). A request takes its draft rows from it and the target is
made to recompute the positions whose states the draft still needs (`keep_at_most`: at most one
position more than a plain request when both caches hold the prompt); both leave their KV behind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from specbuild.core.engine_limits import EngineLimits
from specbuild.core.errors import EngineError
from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.cached_decode import (
    FedStates,
    ModelVerifier,
    PrefixCache,
    common_prefix,
    lockstep_batch,
)
from specbuild.engines.reference.eagle3 import Eagle3Draft, load_eagle3_draft, open_row
from specbuild.engines.reference.model import LlamaModel
from specbuild.engines.reference.sampling import make_generator, probs_from_logits, sample
from specbuild.engines.reference.speculative import speculative_generate

if TYPE_CHECKING:
    from specbuild.engines.reference.engine import ReferenceEngine


class Eagle3Drafts:
    """The draft side of R requests (rows = request indices): the draft's KV rows, the target states
    observed and not yet fed, and drafting. A BatchDrafter of the loop; `Eagle3Drafter` is one row."""

    passes_per_draft_token = 1

    def __init__(
        self,
        draft: Eagle3Draft,
        prompts: list[list[int]],
        generators: list[torch.Generator | None],
        *,
        prefix_cache: PrefixCache | None = None,
    ):
        self.draft, self.generators, self.prefix_cache = draft, generators, prefix_cache
        self.cache = draft.new_cache(len(prompts), max(len(p) for p in prompts) + 1)
        self.tokens: list[list[int]] = []  # row -> the tokens of its target-fed slots (slot i: tokens[i])
        self.states: list[FedStates | None] = [None] * len(prompts)  # observed, not yet fed
        self.entries: dict[int, object] = {}  # row -> the draft prefix-cache sequence it came from
        self.keep_at_most: list[int] = []  # row -> prompt positions the target may take from its cache
        self.forward_passes = 0
        for row, prompt in enumerate(prompts):
            self.keep_at_most.append(self._seed(row, list(prompt)))

    def _seed(self, row: int, prompt: list[int]) -> int:
        """Open the row from its prompt's longest cached draft prefix (never the last prompt slot: its
        output is draft token 1); return how many prompt positions the target may keep (the draft needs
        the target state of the position before its first missing slot)."""
        held = 0
        if self.prefix_cache is not None:
            entry = self.prefix_cache.acquire(prompt, exclude=frozenset(id(e) for e in self.entries.values()))
            self.prefix_cache.hold(entry)
            self.entries[row] = entry
            held = min(entry.common_prefix(prompt), len(prompt) - 1)
            if held:
                self.cache.copy_slots(row, entry.cache, 0, 0, held)
        if held == 0:
            open_row(self.cache, row)
            held = 1
        self.tokens.append(prompt[:held])
        return held - 1

    def store(self) -> None:
        """Leave each row's target-fed slots in the draft prefix-cache sequence it came from."""
        for row, entry in self.entries.items():
            n = len(self.tokens[row])
            entry.cache.copy_slots(0, self.cache, row, 0, n)
            entry.tokens = list(self.tokens[row])
            self.prefix_cache.release(entry)
        self.entries = {}

    def observe(self, row: int, fed: FedStates) -> None:
        """A target pass fed positions fed.start..: keep what is observed before them, then these."""
        old = self.states[row]
        if old is not None and old.start <= fed.start <= old.start + len(old.aux):
            fed = FedStates(old.start, torch.cat([old.aux[: fed.start - old.start], fed.aux]))  # [T,A]
        self.states[row] = fed

    def propose_batch(self, rows, ids, ks, params):
        out: list[tuple[list[int], object | None]] = [([], None) for _ in rows]
        todo = [j for j, k in enumerate(ks) if k > 0 and self._ready(rows[j], ids[j])]
        if not todo:
            return out
        last = dict(zip(todo, self._catch_up([rows[j] for j in todo], [ids[j] for j in todo]), strict=True))
        drafts: dict[int, list[int]] = {j: [] for j in todo}
        probs: dict[int, list[torch.Tensor | None]] = {j: [] for j in todo}
        live = todo
        while live:
            for j in live:
                tok, p = self._sample(self.draft.logits(last[j]), params[j], self.generators[rows[j]])
                drafts[j].append(tok)
                probs[j].append(p)
            live = [j for j in live if ks[j] > len(drafts[j])]
            if live:
                outs = self._step(
                    [rows[j] for j in live], [drafts[j][-1] for j in live], [last[j] for j in live]
                )
                last.update(zip(live, outs, strict=True))
        for j in todo:
            self.cache.truncate(rows[j], len(self.tokens[rows[j]]))  # drafted slots: refed next round
            out[j] = (drafts[j], None if probs[j][0] is None else torch.stack(probs[j]))  # [k,V]
        return out

    # ---- pieces ---------------------------------------------------------------------------------
    def _ready(self, row: int, ids: list[int]) -> bool:
        """Whether the states of every slot still to feed are observed (not in a request's first round)."""
        valid = min(common_prefix(self.tokens[row], ids), len(ids) - 1)
        st = self.states[row]
        return (
            valid >= 1 and st is not None and st.start <= valid - 1 and st.start + len(st.aux) >= len(ids) - 1
        )

    def _catch_up(self, rows: list[int], ids: list[list[int]]) -> list[torch.Tensor]:
        """One pass feeding each row's slots valid..len(ids)-1; returns each row's last output [H]."""
        tails, feats = [], []
        for row, seq in zip(rows, ids, strict=True):
            valid = min(common_prefix(self.tokens[row], seq), len(seq) - 1)
            self.cache.truncate(row, valid)
            st = self.states[row]
            tails.append(seq[valid:])
            feats.append(st.aux[valid - 1 - st.start : len(seq) - 1 - st.start])  # [n,A]: states of slot - 1
            self.tokens[row] = list(seq)
            self.states[row] = FedStates(len(seq) - 1, st.aux[len(seq) - 1 - st.start :])  # not fed yet
        width = max(len(t) for t in tails)
        all_rows = len(self.tokens)
        tokens = torch.zeros(
            all_rows, width, dtype=torch.long, device=self.draft.device
        )  # [R,T] right-padded
        hidden = torch.zeros(
            all_rows, width, self.draft.config.hidden_size, dtype=self.draft.dtype, device=self.draft.device
        )  # [R,T,H]
        n_new = [0] * all_rows
        for row, t, f in zip(rows, tails, feats, strict=True):
            tokens[row, : len(t)] = torch.tensor(t)
            hidden[row, : len(t)] = self.draft.fuse(f)  # [n,H]
            n_new[row] = len(t)
        out = self.draft.forward(tokens, hidden, self.cache, n_new=n_new)  # [R,T,H]
        self.forward_passes += 1
        return [out[row, len(t) - 1] for row, t in zip(rows, tails, strict=True)]  # [H] each

    def _step(self, rows: list[int], tokens: list[int], hidden: list[torch.Tensor]) -> list[torch.Tensor]:
        """One drafted slot per given row: (the token it drafted, its previous output [H]) -> outputs [H]."""
        all_rows = len(self.tokens)
        toks = torch.zeros(all_rows, 1, dtype=torch.long, device=self.draft.device)  # [R,1]
        hid = torch.zeros(
            all_rows, 1, self.draft.config.hidden_size, dtype=self.draft.dtype, device=self.draft.device
        )  # [R,1,H]
        n_new = [0] * all_rows
        for row, tok, h in zip(rows, tokens, hidden, strict=True):
            toks[row, 0], hid[row, 0], n_new[row] = tok, h, 1
        out = self.draft.forward(toks, hid, self.cache, n_new=n_new)[:, 0]  # [R,H]
        self.forward_passes += 1
        return [out[row] for row in rows]  # [H] each

    def _sample(
        self, logits: torch.Tensor, params: SamplingParams, generator
    ) -> tuple[int, torch.Tensor | None]:
        """A draft token (target id) from draft logits [Vd]; its target-vocabulary probabilities [V]
        (None when greedy: acceptance is then equality with the target's argmax)."""
        probs = probs_from_logits(logits, params)  # [Vd]
        d = sample(probs, generator)
        return int(self.draft.draft_ids[d]), None if params.greedy else self.draft.to_target(probs)  # [V]


class Eagle3Drafter:
    """The loop's Drafter for one request: row 0 of an `Eagle3Drafts`."""

    def __init__(self, drafts: Eagle3Drafts):
        self.drafts = drafts

    @property
    def forward_passes(self) -> int:
        return self.drafts.forward_passes

    def observe(self, fed: FedStates) -> None:
        self.drafts.observe(0, fed)

    def propose(self, ids, k, params):
        return self.drafts.propose_batch([0], [list(ids)], [k], [params])[0]


@dataclass
class Eagle3Speculator:
    """The reference engine's EAGLE-3 speculator (one-model: the target verifies and captures)."""

    target: LlamaModel
    draft: Eagle3Draft
    prefix_cache: PrefixCache  # the engine's (target)
    draft_cache: PrefixCache = field(init=False)
    batched: bool = True

    def __post_init__(self) -> None:
        self.draft_cache = PrefixCache(self.draft, max_entries=self.prefix_cache.max_entries)

    def generate(
        self, prompt_ids, params, *, num_draft_tokens, on_tokens=None, stop=None, guard=None, stats=None
    ):
        prompt = list(prompt_ids)
        drafts = Eagle3Drafts(
            self.draft, [prompt], [make_generator(params.seed, offset=1)], prefix_cache=self.draft_cache
        )
        seq = self.prefix_cache.acquire(prompt)
        self.prefix_cache.hold(seq)
        try:
            keep = min(len(seq.tokens), drafts.keep_at_most[0])  # recompute what the draft still needs
            seq.cache.truncate(0, keep)
            seq.tokens = seq.tokens[:keep]
            verifier = ModelVerifier(
                self.target, generator=make_generator(params.seed), seq=seq, capture=self.draft.aux_layers
            )
            return speculative_generate(
                Eagle3Drafter(drafts),
                verifier,
                prompt,
                params,
                num_draft_tokens=num_draft_tokens,
                on_tokens=on_tokens,
                stop=stop,
                guard=guard,
                stats=stats,
            )
        finally:
            drafts.store()
            self.prefix_cache.release(seq)

    def generate_batch(self, prompts, params, *, num_draft_tokens, prefix_cache=None, **loop):
        """Lockstep rounds (runners.lockstep_batch); `loop`: on_tokens, stop, schedule, guard."""
        prompts = [list(p) for p in prompts]
        drafts = Eagle3Drafts(
            self.draft,
            prompts,
            [make_generator(q.seed, offset=1) for q in params],
            prefix_cache=self.draft_cache,
        )
        try:
            return lockstep_batch(
                drafts,
                self.target,
                prompts,
                params,
                prefix_cache=prefix_cache,
                capture=self.draft.aux_layers,
                keep_at_most=drafts.keep_at_most,
                num_draft_tokens=num_draft_tokens,
                **loop,
            )
        finally:
            drafts.store()

    def drafts_per_step(self, num_draft_tokens: int, limits: EngineLimits) -> int:
        return num_draft_tokens

    def draft_pass(self, prompt: list[int], rows: int = 1):
        """A callable running one drafting pass of `rows` rows after `prompt` (its slots cached): one
        drafted slot and its logits, what each of a round's K draft positions costs (tune's cost ratio)."""
        cache = self.draft.new_cache(rows, len(prompt) + 2)
        states = torch.zeros(
            rows, len(prompt) - 1, self.draft.fc_input_size, dtype=self.draft.dtype, device=self.draft.device
        )  # [R,T-1,A]: stand-in target states
        tokens = torch.tensor([prompt[1:]] * rows, device=self.draft.device)  # [R,T-1]
        for row in range(rows):
            open_row(cache, row)
        hidden = self.draft.forward(tokens, self.draft.fuse(states), cache)[:, -1:]  # [R,1,H]
        last = tokens[:, -1:]  # [R,1]
        held = list(cache.lengths)

        def run() -> None:
            with torch.inference_mode():
                self.draft.logits(self.draft.forward(last, hidden, cache))  # [R,1,Vd]
            cache.lengths = list(held)

        return run


def eagle3_speculator(engine: ReferenceEngine) -> Eagle3Speculator:
    """The engine's EAGLE-3 draft: the folder it was loaded with (`draft_head`), the capture of the spec's
    eagle3.layers_to_capture (None: the draft config's ids, else TensorRT-LLM's default)."""
    if engine.draft_head is None:
        raise EngineError(
            "EAGLE-3 speculation needs the draft's folder",
            expected="a build of an eagle3 spec (compile --flow llmapi --engine reference)",
            found="a target alone",
            fix="load the `specbuild compile` output folder, not one engine",
        )
    layers = (engine.method_options or {}).get("layers_to_capture")
    draft = load_eagle3_draft(engine.draft_head, engine.target, aux_layers=layers)
    return Eagle3Speculator(engine.target, draft, engine.prefix_cache)
