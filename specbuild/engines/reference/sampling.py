"""Sampling and the speculative acceptance rule, as pure functions (no model inside).

Shape legend: V vocab, K draft tokens in one round, R rows.

* `probs_from_logits(logits [R,V], params) -> probs [R,V]` (float32): temperature, then top-k, then
  top-p on the tempered distribution; temperature 0 is a one-hot on the argmax (ties: lowest id).
* `accept_draft(draft_tokens [K], draft_probs [K,V] | None, target_probs [K+1,V], generator)` is the
  one acceptance rule every caller uses (in-process loop, external verification, the Triton BLS).
  With `draft_probs`, modified rejection sampling (Leviathan et al. 2023, Chen et al. 2023): draft
  token x_i is accepted with probability min(1, target_probs[i,x] / draft_probs[i,x]); at the first
  rejection the next token is drawn from the residual max(0, target_probs[i] - draft_probs[i])
  renormalised; if all K are accepted the bonus token is drawn from target_probs[K]. The output then
  follows the target distribution exactly. Without `draft_probs` (TensorRT-LLM's `use_logits=False`,
  token equality), the target samples each position itself and drafts are accepted while they
  equal the target's sample — also lossless. At temperature 0 both probs are one-hot, so both reduce
  to greedy equality with the target's argmax, deterministically.

Vendored as-is into the production Triton BLS (model_repo VENDORED_MODULES): import only
specbuild.core.errors, sampling_params, generation and the reference sampling/speculative modules.
"""

from __future__ import annotations

import torch

from specbuild.core.sampling_params import SamplingParams

__all__ = [
    "SamplingParams",
    "accept_draft",
    "make_generator",
    "probs_from_logits",
    "residual_probs",
    "sample",
]


def make_generator(
    seed: int | None, *, offset: int = 0, device: str | torch.device = "cpu"
) -> torch.Generator | None:
    """A seeded generator (None when unseeded: torch's global RNG). `offset` separates streams of one
    request."""
    if seed is None:
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed) + offset)
    return gen


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [R,V] (or [V]) -> float32 probabilities of the same shape."""
    logits = logits.float()  # [R,V]
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)  # [R,V] one-hot
    logits = logits / params.temperature  # [R,V]
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [R,1] k-th largest
        logits = logits.masked_fill(logits < kth, float("-inf"))  # [R,V]
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # [R,V] each
        cum = sorted_logits.softmax(-1).cumsum(-1)  # [R,V]
        drop_sorted = (
            cum - sorted_logits.softmax(-1)
        ) >= params.top_p  # [R,V] mass before a token already >= p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # [R,V] back in vocab order
        logits = logits.masked_fill(drop, float("-inf"))  # [R,V]
    return logits.softmax(-1)  # [R,V]


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """Draw one token id from probs [V]. A one-hot row returns its argmax without touching the RNG."""
    top = int(probs.argmax())
    if float(probs[top]) >= 1.0:
        return top
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)  # seeded generators live on the CPU; the model may not
    return int(torch.multinomial(probs, 1, generator=generator))


def accept_draft(
    draft_tokens: list[int] | torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """Return (n_accepted, next_token): the first n drafts are kept, then next_token follows them."""
    tokens = [int(t) for t in draft_tokens]
    k = len(tokens)
    assert target_probs.dim() == 2 and target_probs.shape[0] == k + 1, (
        f"target_probs must be [K+1,V], got {tuple(target_probs.shape)} for K={k}"
    )
    if draft_probs is None:
        return _accept_by_equality(tokens, target_probs, generator)
    assert draft_probs.shape == (k, target_probs.shape[1]), (
        f"draft_probs must be [K,V], got {tuple(draft_probs.shape)}"
    )
    target_probs = target_probs.float()  # [K+1,V]
    draft_probs = draft_probs.float()  # [K,V]
    for i, x in enumerate(tokens):
        p_target, p_draft = float(target_probs[i, x]), float(draft_probs[i, x])
        if p_target >= p_draft:  # ratio >= 1: always accepted, no random draw (keeps greedy RNG-free)
            continue
        u = float(torch.rand((), generator=generator))
        if u * p_draft < p_target:  # u < target/draft, written without dividing
            continue
        return i, sample(residual_probs(target_probs[i], draft_probs[i]), generator)
    return k, sample(target_probs[k], generator)


def residual_probs(target_row: torch.Tensor, draft_row: torch.Tensor) -> torch.Tensor:
    """max(0, target - draft) renormalised to sum 1: where to sample after a rejection. [V] -> [V]."""
    residual = (target_row.float() - draft_row.float()).clamp_min(0.0)  # [V]
    mass = float(residual.sum())
    # mass == 0 only if target == draft, which never rejects; fall back to the target row defensively.
    return residual / mass if mass > 0 else target_row.float()  # [V]


def _accept_by_equality(tokens: list[int], target_probs: torch.Tensor, generator) -> tuple[int, int]:
    """Token equality: the target samples position i itself; a draft survives while it equals that sample."""
    for i, x in enumerate(tokens):
        chosen = sample(target_probs[i], generator)
        if chosen != x:
            return i, chosen
    return len(tokens), sample(target_probs[len(tokens)], generator)
