"""Profile Medusa heads offline: where does each head rank the token greedy decoding actually produces?

For a prompt, the base model's greedy continuation y is what greedy tree verification accepts. At
position t (the last accepted token), the base itself emits s[t+1] (the root) and head d proposes
candidates for s[t+d+2]. rank[t][d] = index of s[t+d+2] in head d's top-k list (topk when absent).
A tree then accepts, at position t, the longest path that is a prefix of rank[t]: so these ranks give
both the per-depth accuracies tree growth needs and an exact replay of greedy verification.

Two backends give (greedy continuation, head logits at every position): the HF base model with
trained heads (`HFMedusa`, usable before conversion) and the reference engine on a converted
checkpoint (`ReferenceMedusa`).

Shape legend: T tokens, H hidden size, nH heads, V vocabulary, k top-k.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from specbuild.tuning.data import greedy_continuations
from specbuild.tuning.progress import Reporter


class MedusaRunner(Protocol):
    num_heads: int

    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """The base model's greedy continuation (prompt excluded, stops at an end token)."""

    def head_logits(self, ids: list[int]) -> torch.Tensor:
        """Logits of every head at every position: [nH, T, V]."""


class HFMedusa:
    """A transformers base model plus `tuning.heads.MedusaHeads`."""

    def __init__(self, base, heads) -> None:
        self.base, self.heads = base, heads.to(base.device).eval()
        self.num_heads = heads.config.num_heads

    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        full = greedy_continuations(
            self.base.model, [prompt], max_new_tokens=max_new_tokens, eos_ids=self.base.eos_ids, batch_size=1
        )[0]
        return full[len(prompt) :]

    @torch.no_grad()
    def head_logits(self, ids: list[int]) -> torch.Tensor:
        hidden = self.base.hidden(torch.tensor([ids], device=self.base.device))[0]  # [T, H]
        return self.heads(hidden).float()  # [nH, T, V]


def medusa_ranks(
    runner: MedusaRunner,
    prompts: Sequence[list[int]],
    *,
    max_new_tokens: int,
    topk: int,
    reporter: Reporter | None = None,
) -> list[list[int]]:
    """rank rows (one per position with all nH lookahead tokens inside the greedy continuation)."""
    rep = reporter or Reporter()
    rows: list[list[int]] = []
    nh = runner.num_heads
    rep.start("profile", len(prompts))
    for prompt in prompts:
        cont = runner.greedy(list(prompt), max_new_tokens)
        seq = list(prompt) + cont
        logits = runner.head_logits(seq)  # [nH, T, V]
        top = logits.topk(topk, dim=-1).indices  # [nH, T, k]
        target = torch.tensor(seq, device=top.device)  # [T]
        # positions t from the last prompt token on, while s[t + nH + 1] exists
        for t in range(len(prompt) - 1, len(seq) - nh - 1):
            row = []
            for d in range(nh):
                hit = (top[d, t] == target[t + d + 2]).nonzero()  # [<=1, 1]
                row.append(int(hit[0, 0]) if hit.numel() else topk)
            rows.append(row)
        rep.advance("profile", 1)
    rep.stop("profile")
    return rows
