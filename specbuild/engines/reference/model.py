"""The Llama-family forward pass (Llama, Mistral, Qwen2) over merged checkpoint weights, with a KV cache.

Shape legend:
  B batch (sequences), T new tokens in this pass, S cache slots attended (max length + T),
  C cache capacity, L layers, H hidden, nh / nkv query / KV heads, D head size, I intermediate,
  V vocab.

One pass takes T new tokens per sequence and writes their keys/values into cache slots
`length_b .. length_b + T - 1` of row b. The new tokens attend to every cached slot of their row
plus the new tokens that `new_mask` [T, T] allows: the causal triangle for prefill/decode/chain
verification, or a Medusa tree mask. Rows may hold different lengths (a batch of prompts of
different lengths, right-padded): `n_new[b]` says how many of the T tokens are real, and only those
advance the row's length; padded slots are overwritten later. Rolling back to an accepted prefix
is setting a row's length (`KVCache.truncate`); a tree path is kept with `KVCache.keep_slots`.

Math follows the HF modules the checkpoint came from: RMSNorm in float32 then scaled in the model
dtype, RoPE (gpt-neox halves, optional llama3 or linear scaling) with cos/sin computed in float32,
SwiGLU with mlp.fc = gate_proj (through SiLU) and mlp.gate = up_proj, logits returned in float32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specbuild.core.errors import EngineError
from specbuild.engines.reference.config import RefModelConfig
from specbuild.engines.reference.loader import Weights


class KVCache:
    """Preallocated keys/values of B sequences. k, v: [L, B, C, nkv, D]; `lengths[b]`: valid slots
    of row b."""

    def __init__(
        self, cfg: RefModelConfig, batch: int, capacity: int, dtype: torch.dtype, device: torch.device
    ):
        shape = (cfg.num_layers, batch, capacity, cfg.num_kv_heads, cfg.head_size)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L,B,C,nkv,D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L,B,C,nkv,D]
        self.lengths = [0] * batch

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    def reserve(self, needed: int) -> None:
        """Grow every row to at least `needed` slots (doubling, so growth is amortised)."""
        if needed <= self.capacity:
            return
        extra = max(needed, 2 * self.capacity) - self.capacity
        pad = self.k.new_zeros(self.k.shape[:2] + (extra,) + self.k.shape[3:])  # [L,B,extra,nkv,D]
        self.k = torch.cat([self.k, pad], 2)  # [L,B,C',nkv,D]
        self.v = torch.cat([self.v, pad.clone()], 2)  # [L,B,C',nkv,D]

    def copy_slots(self, row: int, src: KVCache, src_row: int, start: int, end: int) -> None:
        """Copy slots start..end-1 of `src`'s row src_row into this cache's `row` (a prefix-cache
        sequence's KV into a batch row, or back); the row then holds `end` slots."""
        self.reserve(end)
        self.k[:, row, start:end] = src.k[:, src_row, start:end]  # [L,n,nkv,D]
        self.v[:, row, start:end] = src.v[:, src_row, start:end]
        self.lengths[row] = end

    def truncate(self, row: int, length: int) -> None:
        """Roll row back to its first `length` tokens (later slots are dead and get overwritten)."""
        if not 0 <= length <= self.lengths[row]:
            raise EngineError(
                f"cannot roll KV row {row} back to {length}",
                expected=f"0..{self.lengths[row]}",
                found=str(length),
            )
        self.lengths[row] = length

    def keep_slots(self, row: int, start: int, slots: list[int]) -> None:
        """Move slots (ascending, >= start) to start, start+1, ... and set the row's length after them."""
        idx = torch.tensor(slots, dtype=torch.long, device=self.k.device)  # [n]
        n = len(slots)
        self.k[:, row, start : start + n] = self.k[:, row, idx]  # [L,n,nkv,D]
        self.v[:, row, start : start + n] = self.v[:, row, idx]  # [L,n,nkv,D]
        self.lengths[row] = start + n


@dataclass(frozen=True)
class Rope:
    """Inverse frequencies [D/2] (float32) after the checkpoint's RoPE scaling."""

    inv_freq: torch.Tensor

    @classmethod
    def from_config(cls, cfg: RefModelConfig, device: torch.device) -> Rope:
        d = cfg.head_size
        inv = 1.0 / (
            cfg.rotary_base ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d)
        )  # [D/2]
        s = cfg.rotary_scaling or {}
        kind = s.get("rope_type", s.get("type"))
        if kind == "linear":
            inv = inv / float(s["factor"])  # [D/2]
        elif kind == "llama3":
            inv = _llama3_inv_freq(inv, s)  # [D/2]
        return cls(inv)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[..., None] * self.inv_freq  # [B,T,D/2]
        emb = torch.cat([freqs, freqs], -1)  # [B,T,D]
        return emb.cos().to(dtype)[:, :, None], emb.sin().to(dtype)[:, :, None]  # [B,T,1,D] each


def _llama3_inv_freq(inv: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1 frequency scaling: long wavelengths slowed by `factor`, short ones kept, a smooth ramp
    between."""
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv  # [D/2]
    slowed = torch.where(wavelen > old_len / low, inv / factor, inv)  # [D/2]
    ramp = (old_len / wavelen - low) / (high - low)  # [D/2]
    smooth = (1 - ramp) * slowed / factor + ramp * slowed  # [D/2]
    medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)  # [D/2]
    return torch.where(medium, smooth, slowed)  # [D/2]


def attention_mask(lengths: torch.Tensor, t: int, new_mask: torch.Tensor | None) -> torch.Tensor:
    """[B,1,T,S] bool: row b's T new tokens (at slots lengths[b]..) see every earlier slot of the row and
    the new tokens `new_mask` [T,T] allows (default causal)."""
    device = lengths.device
    if new_mask is None:
        new_mask = torch.ones(t, t, dtype=torch.bool, device=device).tril()  # [T,T]
    s = int(lengths.max()) + t
    rel = torch.arange(s, device=device)[None, :] - lengths[:, None]  # [B,S] slot - row length
    past = rel < 0  # [B,S]
    window = (rel >= 0) & (rel < t)  # [B,S]
    among = new_mask.to(device)[:, rel.clamp(0, t - 1)]  # [T,B,S]
    return (past[:, None, :] | (window[:, None, :] & among.permute(1, 0, 2)))[:, None]  # [B,1,T,S]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as HF computes it: in float32, then scaled in the weight's dtype. [...,H] -> [...,H]"""
    x32 = x.float()  # [...,H]
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # [...,H]
    return weight * x32.to(weight.dtype)  # [...,H]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, -1)  # [...,D/2] each
    return torch.cat([-b, a], -1)  # [...,D]


class LlamaModel:
    """Forward pass over `Weights` (inference only, no autograd)."""

    def __init__(self, weights: Weights, *, device: str | torch.device = "cpu"):
        self.cfg = weights.config
        self.device = torch.device(device)
        self.dtype = getattr(torch, self.cfg.dtype)
        self.w = {k: t.to(self.device, self.dtype) for k, t in weights.tensors.items()}
        for layer in range(self.cfg.num_layers):  # fewer, larger matmuls: q|k|v and fc|gate each in one
            p = f"layers.{layer}."
            self.w[p + "qkv"] = torch.cat(
                [self.w[p + "q"], self.w[p + "k"], self.w[p + "v"]], 0
            )  # [(nh+2nkv)*D,H]
            if self.cfg.attn_bias:
                self.w[p + "qkv_bias"] = torch.cat(
                    [self.w[p + "q_bias"], self.w[p + "k_bias"], self.w[p + "v_bias"]]
                )  # [(nh+2nkv)*D]
            self.w[p + "fc_gate"] = torch.cat([self.w[p + "fc"], self.w[p + "gate"]], 0)  # [2I,H]
            for name in (
                "q",
                "k",
                "v",
                "q_bias",
                "k_bias",
                "v_bias",
                "fc",
                "gate",
            ):  # keep one copy of each weight
                self.w.pop(p + name, None)
        self.rope = Rope.from_config(self.cfg, self.device)

    def new_cache(self, batch: int = 1, capacity: int = 256) -> KVCache:
        return KVCache(self.cfg, batch, capacity, self.dtype, self.device)

    def forward(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        *,
        n_new: list[int] | None = None,
        new_mask: torch.Tensor | None = None,
        depths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run T new tokens per row; return the final-normed hidden states [B,T,H].

        tokens [B,T] (long); n_new[b] real tokens of row b (default all T); new_mask [T,T] bool
        (True = query may attend key; default causal); depths [T] position offsets (default 0..T-1).
        """
        return self.forward_capture(tokens, cache, n_new=n_new, new_mask=new_mask, depths=depths)[0]

    @torch.inference_mode()
    def forward_capture(
        self,
        tokens: torch.Tensor,
        cache: KVCache,
        *,
        capture: tuple[int, ...] = (),
        n_new: list[int] | None = None,
        new_mask: torch.Tensor | None = None,
        depths: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward`, plus the residual stream after each decoder layer in `capture` (0-based, in the
        given order; TensorRT-LLM's `eagle3_layers_to_capture` convention: i = the output of layer i,
        HF `output_hidden_states[i + 1]`), concatenated: (hidden [B,T,H], aux [B,T,len(capture)*H] or
        None without capture). Taken in the same pass: no extra work but the copies."""
        b, t = tokens.shape
        assert len(cache.lengths) == b, f"cache has {len(cache.lengths)} rows, tokens {b}"
        n_new = [t] * b if n_new is None else n_new
        lengths = torch.tensor(cache.lengths, device=self.device)  # [B]
        cache.reserve(max(cache.lengths) + t)
        offs = torch.arange(t, device=self.device) if depths is None else depths.to(self.device)  # [T]
        positions = lengths[:, None] + offs[None, :]  # [B,T]
        slots = (
            lengths[:, None] + torch.arange(t, device=self.device)[None, :]
        )  # [B,T] cache slot per new token
        mask = self._mask(lengths, t, new_mask)  # [B,1,T,S]
        cos, sin = self.rope.cos_sin(positions, self.dtype)  # [B,T,1,D] each
        rows = torch.arange(b, device=self.device)[:, None].expand(b, t)  # [B,T]
        x = self.w["embed"][tokens]  # [B,T,H]
        taken: dict[int, torch.Tensor] = {}
        for layer in range(self.cfg.num_layers):
            x = self._layer(layer, x, cache, rows, slots, mask, cos, sin)  # [B,T,H]
            if layer in capture:
                taken[layer] = x
        for row, n in enumerate(n_new):
            cache.lengths[row] += n
        aux = torch.cat([taken[i] for i in capture], -1) if capture else None  # [B,T,n*H]
        return self._rms(x, self.w["ln_f"]), aux  # [B,T,H]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [...,H] -> float32 logits [...,V] (TensorRT-LLM's logits_dtype float32)."""
        return (hidden @ self.w["lm_head"].T).float()  # [...,V]

    # ---- pieces ---------------------------------------------------------------------------------
    def _mask(self, lengths: torch.Tensor, t: int, new_mask: torch.Tensor | None) -> torch.Tensor:
        return attention_mask(lengths, t, new_mask)  # [B,1,T,S]

    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.cfg.norm_epsilon)  # [...,H]

    def _layer(self, layer, x, cache, rows, slots, mask, cos, sin) -> torch.Tensor:
        w, c = self.w, self.cfg
        p = f"layers.{layer}."
        b, t, _ = x.shape
        h = self._rms(x, w[p + "ln1"])  # [B,T,H]
        qkv = F.linear(h, w[p + "qkv"], w.get(p + "qkv_bias"))  # [B,T,(nh+2nkv)*D]
        q, k, v = qkv.split([c.q_size, c.kv_size, c.kv_size], -1)  # [B,T,nh*D], [B,T,nkv*D] x2
        q = q.view(b, t, c.num_heads, c.head_size)  # [B,T,nh,D]
        k = k.view(b, t, c.num_kv_heads, c.head_size)  # [B,T,nkv,D]
        v = v.view(b, t, c.num_kv_heads, c.head_size)  # [B,T,nkv,D]
        q = q * cos + rotate_half(q) * sin  # [B,T,nh,D]
        k = k * cos + rotate_half(k) * sin  # [B,T,nkv,D]
        cache.k[layer][rows, slots] = k  # row b, slots length_b..length_b+T-1
        cache.v[layer][rows, slots] = v
        s = mask.shape[-1]
        keys = cache.k[layer][:, :s].transpose(1, 2)  # [B,nkv,S,D]
        values = cache.v[layer][:, :s].transpose(1, 2)  # [B,nkv,S,D]
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True
        )  # [B,nh,T,D]
        x = x + F.linear(att.transpose(1, 2).reshape(b, t, c.q_size), w[p + "o"])  # [B,T,H]
        h = self._rms(x, w[p + "ln2"])  # [B,T,H]
        fc, gate = F.linear(h, w[p + "fc_gate"]).chunk(2, -1)  # [B,T,I] each: gate_proj, up_proj
        mlp = F.silu(fc) * gate  # [B,T,I]
        return x + F.linear(mlp, w[p + "proj"])  # [B,T,H]
