"""Medusa (Cai et al. 2024): heads on the last hidden state propose a token tree; one pass verifies it.

Shape legend: N tree nodes (root excluded), P root-to-leaf paths, Dm tree depth, nH Medusa heads,
Kt largest top-k index + 1, H hidden, V vocab.

Tree layout: node 0 is the root, the token the base model produced last (emitted, not yet in the
KV cache); node i > 0 is `choices.paths[i-1]` after a stable sort by depth, so parents come before
children and a root-to-leaf path has ascending node indices. Head d proposes the candidates at
depth d+1 (head 0 guesses the token after the root), each node taking its head's top-k entry
`path[-1]`.

Acceptance walks the tree from the root. At a node with target probabilities p (from the verify
pass), each child, in top-k order, is accepted with probability p[child token]; a rejected child's
token is removed from p and p renormalised; if no child is accepted the next token is drawn from what
is left of p. The drafts are deterministic, so this is modified rejection sampling with one-hot draft
distributions applied to siblings in turn (SpecInfer-style): lossless at any temperature. At
temperature 0, p is one-hot, so the rule is exactly "follow the child equal to the target's argmax":
greedy acceptance of the longest matching path, as TensorRT-LLM does (trtllm.md §3.4, greedy only).
Typical acceptance is not offered.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specbuild.core.errors import EngineError
from specbuild.core.formats.medusa_choices import MedusaChoices, default_tree
from specbuild.core.generation import SpecStats
from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.cached_decode import CachedSequence, PrefixCache
from specbuild.engines.reference.model import LlamaModel
from specbuild.engines.reference.sampling import make_generator, probs_from_logits, sample
from specbuild.engines.reference.speculative import StopHook, emit, stop_ids


@dataclass(frozen=True)
class TreeBuffers:
    """Static tensors of one Medusa tree (built once per tree)."""

    paths: tuple[tuple[int, ...], ...]  # node i > 0 -> its path of top-k indices (index 0: root, ())
    attention_mask: torch.Tensor  # [N+1,N+1] bool: node i attends node j iff j is i or an ancestor
    position_offsets: torch.Tensor  # [N+1] long: depth of each node (root 0), added to the sequence length
    retrieve_indices: torch.Tensor  # [P,Dm+1] long: node ids of each root-to-leaf path, -1 padded
    parents: torch.Tensor  # [N+1] long: parent node id (-1 for the root)
    topk_index: torch.Tensor  # [N+1] long: the node's top-k rank in its head's candidates (-1 for the root)
    children: tuple[tuple[int, ...], ...]  # node id -> child node ids in top-k order

    @classmethod
    def from_choices(cls, choices: MedusaChoices, *, num_heads: int) -> TreeBuffers:
        choices.validate(num_heads=num_heads)
        paths = ((),) + tuple(sorted(choices.paths, key=len))  # stable: keeps the given order per depth
        index = {p: i for i, p in enumerate(paths)}
        n = len(paths)
        mask = torch.zeros(n, n, dtype=torch.bool)  # [N+1,N+1]
        for i, p in enumerate(paths):
            for d in range(len(p) + 1):
                mask[i, index[p[:d]]] = True
        parents = [-1] + [index[p[:-1]] for p in paths[1:]]
        kids: list[list[int]] = [[] for _ in range(n)]
        for i in sorted(range(1, n), key=lambda i: paths[i][-1]):
            kids[parents[i]].append(i)
        leaves = [i for i in range(n) if not kids[i]]
        depth = max(len(p) for p in paths)
        retrieve = torch.full((len(leaves), depth + 1), -1, dtype=torch.long)  # [P,Dm+1]
        for row, leaf in enumerate(leaves):
            chain = [index[paths[leaf][:d]] for d in range(len(paths[leaf]) + 1)]
            retrieve[row, : len(chain)] = torch.tensor(chain)
        return cls(
            paths=paths,
            attention_mask=mask,
            position_offsets=torch.tensor([len(p) for p in paths], dtype=torch.long),  # [N+1]
            retrieve_indices=retrieve,
            parents=torch.tensor(parents, dtype=torch.long),  # [N+1]
            topk_index=torch.tensor([-1] + [p[-1] for p in paths[1:]], dtype=torch.long),  # [N+1]
            children=tuple(tuple(k) for k in kids),
        )

    @property
    def num_nodes(self) -> int:
        return len(self.paths) - 1

    @property
    def depth(self) -> int:
        return self.retrieve_indices.shape[1] - 1

    def candidates(self, root: int, head_logits: torch.Tensor) -> torch.Tensor:
        """Tree tokens [N+1]: the root, then each node's top-k entry of its head. head_logits [nH,V]."""
        kt = int(self.topk_index.max()) + 1
        top = head_logits.topk(kt, dim=-1).indices.cpu()  # [nH,Kt] (tree buffers live on the CPU)
        heads = self.position_offsets[1:] - 1  # [N] head of each node
        return torch.cat([torch.tensor([root]), top[heads, self.topk_index[1:]]])  # [N+1]


class MedusaHeads:
    """nH heads: x <- x + SiLU(linear_j(x)) for each ResBlock j, then the head's own lm_head."""

    def __init__(self, model: LlamaModel):
        cfg = model.cfg
        if cfg.num_medusa_heads < 1:
            raise EngineError(
                "the model has no Medusa heads",
                expected="a MedusaForCausalLM checkpoint",
                found=cfg.architecture,
                fix="convert with Medusa heads (spec mode: medusa)",
            )
        self.num_heads, self.num_layers, self.w = cfg.num_medusa_heads, cfg.num_medusa_layers, model.w

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [H] (final-normed last hidden state) -> float32 logits [nH,V]."""
        out = []
        for h in range(self.num_heads):
            x = hidden  # [H]
            for j in range(self.num_layers):
                x = x + F.silu(F.linear(x, self.w[f"medusa.{h}.{j}.w"], self.w[f"medusa.{h}.{j}.b"]))  # [H]
            out.append(F.linear(x, self.w[f"medusa.{h}.lm_head"]).float())  # [V]
        return torch.stack(out)  # [nH,V]


def walk_tree(
    tree: TreeBuffers, tokens: torch.Tensor, target_probs: torch.Tensor, generator=None
) -> tuple[list[int], int]:
    """Accept a path. tokens [N+1], target_probs [N+1,V] -> (accepted node ids after the root, next token)."""
    node, path = 0, []
    while True:
        probs = target_probs[node].clone()  # [V] what the target wants after `node`
        chosen = None
        for child in tree.children[node]:
            x = int(tokens[child])
            if probs[x] >= 1.0 or (probs[x] > 0 and float(torch.rand((), generator=generator)) < probs[x]):
                chosen = child
                break
            probs[x] = 0.0
            probs = probs / probs.sum()  # [V] mass of the rejected sibling removed
        if chosen is None:
            return path, sample(probs, generator)
        path.append(chosen)
        node = chosen


@torch.inference_mode()  # the prefix cache's sequences hold inference tensors (grown inside forward passes)
def medusa_generate(
    model: LlamaModel,
    heads: MedusaHeads,
    tree: TreeBuffers,
    prompt_ids: list[int],
    params: SamplingParams,
    *,
    on_tokens=None,
    stop: StopHook | None = None,
    seq: CachedSequence | None = None,
    stats: SpecStats | None = None,
) -> tuple[list[int], SpecStats]:
    """Generate with Medusa; `params.end_id` resolved by the caller. Returns (new token ids, stats).

    `seq`: the sequence to run in (a prefix-cache entry: the prompt's cached prefix is not recomputed,
    and the entry is left holding the prompt and the tokens taken but the last, as a plain request
    leaves it); None: a fresh one. `stats`: the SpecStats to count in, updated before each step's
    on_tokens (a streaming caller reads the running totals there); None: a fresh one."""
    gen = make_generator(params.seed)
    stops = stop_ids(params)
    room = len(prompt_ids) + params.max_tokens + tree.num_nodes + 1  # the sequence at its longest
    if seq is None:
        seq = CachedSequence(model, capacity=room)
    else:
        seq.cache.reserve(room)  # grown once, not by doubling in the loop
    hidden = seq.feed(list(prompt_ids), 1)[0]  # [H] prefill (of what the entry does not hold)
    out: list[int] = []
    stats = stats if stats is not None else SpecStats()
    stats.target_passes += 1  # the prefill
    root = sample(probs_from_logits(model.logits(hidden), params), gen)
    taken, finished = emit(out, [root], params, stops, stop)
    if on_tokens and taken:
        on_tokens(taken)
    mask, offsets = tree.attention_mask, tree.position_offsets
    while not finished:
        tokens = tree.candidates(root, heads.logits(hidden))  # [N+1]
        start = seq.cache.lengths[0]
        states = model.forward(tokens[None], seq.cache, new_mask=mask, depths=offsets)[0]  # [N+1,H]
        stats.target_passes += 1
        target_probs = probs_from_logits(model.logits(states), params)  # [N+1,V]
        path, nxt = walk_tree(tree, tokens, target_probs, gen)
        seq.cache.keep_slots(0, start, [start] + [start + i for i in path])  # root + accepted nodes
        accepted = [int(tokens[i]) for i in path]
        seq.tokens = seq.tokens + [root] + accepted
        stats.record_step(len(path), tree.depth)
        taken, finished = emit(out, accepted + [nxt], params, stops, stop)
        if on_tokens and taken:
            on_tokens(taken)
        hidden, root = states[path[-1] if path else 0], nxt  # [H]
    return out, stats


class MedusaSpeculator:
    """Medusa in-process: the tree step of `medusa_generate`, one request at a time. With the engine's
    `prefix_cache`, each request starts from its best entry and leaves its KV there, as a plain request
    does (the batch manager's block reuse serves every request's context phase, whatever decodes it):
    a repeated prompt, a later turn, or a tree request that goes on as a plain row (a schedule's K=0,
    tensorrt_llm_local/step_scheduler.py) then does not prefill again what the tree already holds."""

    batched = False

    def __init__(self, target: LlamaModel, choices: MedusaChoices, prefix_cache: PrefixCache | None = None):
        self.target = target
        self.heads = MedusaHeads(target)
        self.tree = TreeBuffers.from_choices(choices, num_heads=target.cfg.num_medusa_heads)
        self.prefix_cache = prefix_cache

    def generate(
        self, prompt_ids, params, *, num_draft_tokens=0, on_tokens=None, stop=None, guard=None, stats=None
    ):
        """num_draft_tokens is unused: the tree fixes what is drafted; so is the acceptance guard (the tree
        step has no plain round; TensorRT-LLM's Medusa engines cannot switch speculation off either)."""
        seq = self.prefix_cache.acquire(list(prompt_ids)) if self.prefix_cache is not None else None
        if seq is not None:
            self.prefix_cache.hold(seq)  # its own until it ends
        try:
            return medusa_generate(
                self.target,
                self.heads,
                self.tree,
                prompt_ids,
                params,
                on_tokens=on_tokens,
                stop=stop,
                seq=seq,
                stats=stats,
            )
        finally:
            if seq is not None:
                self.prefix_cache.release(seq)

    def generate_batch(
        self,
        prompts,
        params,
        *,
        num_draft_tokens=0,
        on_tokens=None,
        stop=None,
        schedule=None,
        guard=None,
        prefix_cache=None,
    ):
        """One request after the other (a tree cannot run in lockstep here), each from the prefix cache the
        speculator was made with (the argument is that same engine cache: unused)."""
        return [
            self.generate(
                p,
                q,
                on_tokens=(lambda toks, i=i: on_tokens(i, toks)) if on_tokens else None,
                stop=(lambda out, start, i=i: stop(i, out, start)) if stop else None,
            )
            for i, (p, q) in enumerate(zip(prompts, params, strict=True))
        ]

    def drafts_per_step(self, num_draft_tokens: int, limits) -> int:
        """The tree's nodes: TensorRT-LLM reserves the engine's max_draft_len (>= the tree size) per step."""
        return limits.max_draft_len or self.tree.num_nodes


def medusa_speculator(engine) -> MedusaSpeculator:
    """The engine's tree: the one it was loaded with, else `default_tree` for its head count."""
    choices = (
        engine.medusa_choices
        if engine.medusa_choices is not None
        else default_tree(engine.target.cfg.num_medusa_heads)
    )
    return MedusaSpeculator(engine.target, MedusaChoices.parse(choices), prefix_cache=engine.prefix_cache)
