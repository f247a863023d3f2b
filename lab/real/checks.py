"""Exact conversion on the real model: the reference engine, loaded from `specbuild convert`'s TensorRT-LLM
checkpoint (TP 1 and TP 3), against transformers on the HF folder — logits and greedy tokens.

For each prompt (a user turn in the chat template): transformers' greedy continuation of N tokens, then

* logits: one pass of prompt + continuation through both; max |Δlogit| over every position and
  vocabulary entry, against a tolerance of EXACT_ULPS ulps of float32 at the largest |logit|;
* greedy: the reference engine's own greedy generation (its KV cache, its stop rule) must give the
  same N tokens (or stop at the same end-of-sequence token).

Shape legend: T tokens (prompt + continuation), V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from specbuild.core.sampling_params import SamplingParams
from specbuild.engines.reference.api import ReferenceEngine

# Both sides compute the same float32 function; the converter fuses q/k/v and splits ranks, so the sums may
# run in another order: tests/tolerances.py REORDER_ULPS (2**10 ulps of the largest logit, measured 12-34
# on the tiny test models across CPU kernel families) is the bound. A wrong layout, rope or mask moves
# logits by their own magnitude (~2**23 ulps), so the bound still tells a bug from rounding.
EXACT_ULPS = 2**10
FLOAT32_EPS = torch.finfo(torch.float32).eps


@dataclass(frozen=True)
class ExactLine:
    checkpoint: str  # e.g. "TP 3"
    prompt: str  # the user turn (shortened)
    tokens: int  # T compared
    max_abs_diff: float
    tolerance: float
    ulps: float  # max |Δ| in ulps of the largest |logit|
    greedy_equal: bool
    new_tokens: int

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance and self.greedy_equal

    def line(self) -> str:
        return (
            f"{self.checkpoint}: {self.prompt!r}: max |Δlogit| {self.max_abs_diff:.3g} over {self.tokens} "
            f"positions = {self.ulps:.1f} ulps of max |logit| (allowed {EXACT_ULPS}, {self.tolerance:.3g}); "
            f"greedy {self.new_tokens} tokens {'equal' if self.greedy_equal else 'DIFFER'} "
            f"-> {'ok' if self.ok else 'FAILED'}"
        )


def hf_model(folder: Path):
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def hf_greedy(model, ids: list[int], new_tokens: int, eos: int) -> list[int]:
    x = torch.tensor([ids])  # [1, P]
    with torch.no_grad():
        out = model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=eos,
            eos_token_id=eos,
        )  # [1, P + n]
    return out[0, len(ids) :].tolist()


def check_exact(
    hf_dir: Path,
    checkpoints: dict[str, Path],
    prompts: list[str],
    *,
    new_tokens: int = 24,
    log=print,
) -> list[ExactLine]:
    """One ExactLine per (checkpoint, prompt); `prompts` are already in the chat template."""
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    model = hf_model(hf_dir)
    eos = int(tokenizer.eos_token_id)
    cases = []
    for i, text in enumerate(prompts, 1):
        log(f"  transformers: prompt {i}/{len(prompts)}, {new_tokens} greedy tokens, then its logits")
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        greedy = hf_greedy(model, ids, new_tokens, eos)
        x = torch.tensor([ids + greedy])  # [1, T]
        with torch.no_grad():
            want = model(x).logits[0]  # [T, V]
        cases.append((text, ids, greedy, x, want))
    lines = []
    for label, ckpt in checkpoints.items():
        log(f"  {label}: the reference engine on {ckpt.name}, the same {len(cases)} prompts")
        engine = ReferenceEngine.load(ckpt)
        target = engine.target
        for text, ids, greedy, x, want in cases:
            if engine.encode(text) != ids:
                raise AssertionError(f"{label}: the engine's tokenizer encodes the prompt differently")
            with torch.no_grad():
                got = target.logits(target.forward(x, target.new_cache(1, x.shape[1])))[0]  # [T, V]
            diff = float((got - want).abs().max())
            unit = FLOAT32_EPS * float(want.abs().max())
            result = engine.generate(ids, SamplingParams(max_tokens=new_tokens), speculative=False)
            line = ExactLine(
                checkpoint=label,
                prompt=_user_turn(text),
                tokens=int(x.shape[1]),
                max_abs_diff=diff,
                tolerance=EXACT_ULPS * unit,
                ulps=diff / unit,
                greedy_equal=list(result.token_ids) == greedy,
                new_tokens=len(greedy),
            )
            log(line.line())
            lines.append(line)
    return lines


def _user_turn(text: str, limit: int = 48) -> str:
    """The user's words of a chat-template prompt, shortened for a report line."""
    marker = "<|im_start|>user\n"
    user = text.split(marker, 1)[-1].split("<|im_end|>", 1)[0]
    user = " ".join(user.split())
    return user if len(user) <= limit else user[: limit - 3] + "..."
