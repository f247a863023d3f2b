"""What an EAGLE-3 draft learns from: the draft vocabulary, and the target's captured states on disk.

Shape legend: N sequences, T tokens of one, n captured layers, H target hidden, V / Vd target / draft vocab.

* `select_vocab`: the Vd most frequent tokens of the answers (SpecForge `generate_vocab_mapping_file` and
  speculators `vocab_mapping.py` count the loss-masked tokens), ties and the rest by frequency in the
  whole text then by id, returned ascending (both sort it); `vocab_maps` builds d2t (draft id -> target
  id offset) and t2d (target id -> in the draft vocabulary).
* `CaptureStore`: one target pass per batch of sequences (HF transformers) writes, per sequence, the
  captured states `aux` [T, n*H] (the output of decoder layer i for our layer i, core/formats/eagle3.py,
  taken by a forward hook: transformers 5's `output_hidden_states[L]` is the final-normed state, not the
  last layer's output), the final normed hidden `last` [T, H] (the draft's
  targets are the target lm_head's rows of the draft vocabulary over it) and the target's argmax `top`
  [T] over the whole vocabulary, into safetensors shards beside the checkpoints. Training reads one
  batch at a time from the shards (memory-mapped), so memory stays bounded whatever the data's size, and
  the target runs once per sequence, not once per epoch.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from specbuild.core.formats.manifest import atomic_output_dir
from specbuild.tuning.progress import Reporter

SHARD_TOKENS = 1 << 16  # tokens per shard file (its states: 64 Ki x (n+1) x H floats)


def select_vocab(
    sequences: list[list[int]], answer_starts: list[int], *, vocab_size: int, draft_vocab_size: int
) -> torch.Tensor:
    """[Vd] ascending target ids: the most frequent answer tokens (then whole-text frequency, then id)."""
    answers, everything = Counter(), Counter()
    for seq, start in zip(sequences, answer_starts, strict=True):
        answers.update(seq[start:])
        everything.update(seq)
    ranked = sorted(range(vocab_size), key=lambda t: (-answers[t], -everything[t], t))
    return torch.tensor(sorted(ranked[: min(draft_vocab_size, vocab_size)]), dtype=torch.long)  # [Vd]


def vocab_maps(used: torch.Tensor, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [Vd] int64: target id = draft id + d2t[draft id], t2d [V] bool) of ascending target ids."""
    d2t = used - torch.arange(used.numel())  # [Vd]
    t2d = torch.zeros(vocab_size, dtype=torch.bool).index_fill_(0, used, True)  # [V]
    return d2t, t2d


@dataclass(frozen=True)
class Captured:
    """A batch of captured sequences, right-padded to the longest (T)."""

    tokens: torch.Tensor  # [B,T] long (0 past a row's end)
    aux: torch.Tensor  # [B,T,n*H] float32
    last: torch.Tensor  # [B,T,H] float32: the target's final normed hidden
    top: torch.Tensor  # [B,T] long: the target's argmax over its whole vocabulary
    answer: torch.Tensor  # [B,T] bool: position i's next token is an answer token (and exists)


class CaptureStore:
    """Captured target states of N sequences in safetensors shards (see the module docstring)."""

    def __init__(self, folder: Path, lengths: list[int], shards: list[int]):
        self.folder, self.lengths, self.shards = folder, lengths, shards  # shards[i]: file of sequence i

    def __len__(self) -> int:
        return len(self.lengths)

    @classmethod
    def build(
        cls,
        folder: Path,
        base,
        sequences: list[list[int]],
        answer_starts: list[int],
        *,
        layers: tuple[int, ...],
        batch_size: int,
        rep: Reporter,
        label: str = "capture",
    ) -> CaptureStore:
        """Run the target over `sequences` (cached: a complete folder for the same inputs is reused)."""
        key = hashlib.sha256(json.dumps([sequences, answer_starts, list(layers)]).encode()).hexdigest()[:16]
        folder = folder / f"{label}-{key}"
        lengths = [len(s) for s in sequences]
        shards: list[int] = []
        shard, used = 0, 0
        for n in lengths:
            if used and used + n > SHARD_TOKENS:
                shard, used = shard + 1, 0
            shards.append(shard)
            used += n
        store = cls(folder, lengths, shards)
        if (folder / "done").is_file():
            rep.log(f"target states read back from {folder}")
            return store
        rep.start(label, len(sequences))
        with atomic_output_dir(folder, force=True) as tmp:
            for s in range(shard + 1):
                members = [i for i in range(len(sequences)) if shards[i] == s]
                tensors: dict[str, torch.Tensor] = {}
                for at in range(0, len(members), batch_size):
                    group = members[at : at + batch_size]
                    tensors.update(
                        _capture(base, [sequences[i] for i in group], group, answer_starts, layers)
                    )
                    rep.advance(label, len(group))
                save_file(tensors, str(tmp / f"shard-{s:05d}.safetensors"))
            (tmp / "done").write_text("complete\n")
        rep.stop(label)
        return store

    def batch(self, indices: list[int], device: torch.device) -> Captured:
        """Sequences `indices` (read from their shards), right-padded."""
        rows = []
        for i in indices:
            with safe_open(str(self.folder / f"shard-{self.shards[i]:05d}.safetensors"), framework="pt") as f:
                rows.append({k: f.get_tensor(f"{i}.{k}") for k in ("tokens", "aux", "last", "top", "answer")})
        t = max(r["tokens"].shape[0] for r in rows)

        def stack(name: str) -> torch.Tensor:
            return torch.stack(
                [
                    torch.nn.functional.pad(r[name], [0, 0] * (r[name].dim() - 1) + [0, t - r[name].shape[0]])
                    for r in rows
                ]
            ).to(device)

        return Captured(stack("tokens"), stack("aux"), stack("last"), stack("top"), stack("answer"))


@torch.no_grad()
def _capture(base, sequences: list[list[int]], ids: list[int], answer_starts: list[int], layers) -> dict:
    """One target pass over right-padded sequences -> {f"{i}.{name}": tensor} per sequence i."""
    t = max(len(s) for s in sequences)
    tokens = torch.zeros(len(sequences), t, dtype=torch.long)  # [B,T]
    mask = torch.zeros(len(sequences), t, dtype=torch.long)  # [B,T]
    for row, seq in enumerate(sequences):
        tokens[row, : len(seq)] = torch.tensor(seq)
        mask[row, : len(seq)] = 1
    decoder = base.model.get_decoder()
    taken: dict[int, torch.Tensor] = {}
    hooks = [
        decoder.layers[i].register_forward_hook(
            lambda _m, _in, out, i=i: taken.__setitem__(i, out[0] if isinstance(out, tuple) else out)
        )
        for i in layers
    ]
    try:
        out = decoder(input_ids=tokens.to(base.device), attention_mask=mask.to(base.device))
    finally:
        for h in hooks:
            h.remove()
    aux = torch.cat([taken[i] for i in layers], -1).float().cpu()  # [B,T,n*H]
    last = out.last_hidden_state.float()  # [B,T,H] after the final norm
    top = base.model.get_output_embeddings()(last.to(base.model.dtype)).argmax(-1).cpu()  # [B,T]
    result = {}
    for row, (seq, i) in enumerate(zip(sequences, ids, strict=True)):
        n = len(seq)
        answer = torch.zeros(n, dtype=torch.bool)  # position p predicts token p + 1
        answer[max(answer_starts[i] - 1, 0) : n - 1] = True
        result |= {
            f"{i}.tokens": tokens[row, :n].clone(),
            f"{i}.aux": aux[row, :n].clone(),
            f"{i}.last": last[row, :n].cpu().clone(),
            f"{i}.top": top[row, :n].clone(),
            f"{i}.answer": answer,
        }
    return result
