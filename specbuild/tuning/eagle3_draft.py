"""The trainable EAGLE-3 draft layer and its training-time test (TTT) unroll.

Shape legend: B rows, T tokens of a row, A = T - 1 anchors, S TTT steps, H hidden (draft = target), n
captured layers, V / Vd target / draft vocabulary, nh / nkv heads, D head size, I intermediate.

The math is the reference engine's (engines/reference/eagle3.py, whose module docstring has the slot rule:
slot i pairs the target state of position i - 1 with token i and predicts token i + 1), written with
autograd. The TTT unroll (EAGLE-3 paper; SpecForge 0.2.0 `modeling/draft/llama3_eagle.py`, research note
§D.6) simulates drafting: anchor a (1 <= a <= T-1) is step 0 at slot a, fed the target state of position
a - 1; step j > 0 at the same anchor sits at slot a + j, fed the draft's own step j - 1 output and the true
token a + j (teacher forcing), and predicts token a + j + 1. Step j at anchor a attends the step-0 slots
1..a and its own anchor's steps 1..j (slots a+1..a+j) — what it would see while drafting token j + 1
after a verified prefix ending at slot a — with RoPE at the slots' positions (SpecForge moves positions
by the step too).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from specbuild.core.formats.eagle3 import Eagle3DraftConfig
from specbuild.engines.reference.eagle3 import attention_config
from specbuild.engines.reference.model import Rope

HF_NAMES = {  # module parameter -> HF layout tensor (core/formats/eagle3.py)
    "fc.weight": "fc.weight",
    "q_proj.weight": "midlayer.self_attn.q_proj.weight",
    "k_proj.weight": "midlayer.self_attn.k_proj.weight",
    "v_proj.weight": "midlayer.self_attn.v_proj.weight",
    "o_proj.weight": "midlayer.self_attn.o_proj.weight",
    "gate_proj.weight": "midlayer.mlp.gate_proj.weight",
    "up_proj.weight": "midlayer.mlp.up_proj.weight",
    "down_proj.weight": "midlayer.mlp.down_proj.weight",
    "hidden_norm.weight": "midlayer.hidden_norm.weight",
    "input_layernorm.weight": "midlayer.input_layernorm.weight",
    "post_attention_layernorm.weight": "midlayer.post_attention_layernorm.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # [...,H]
        return self.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Eagle3TrainDraft(nn.Module):
    """fc + one EAGLE-3 decoder layer + norm + lm_head over the draft vocabulary; the embedding is the
    target's (frozen, not a parameter: a buffer that is never saved)."""

    def __init__(self, config: Eagle3DraftConfig, embed: torch.Tensor):
        super().__init__()
        c = self.config = config
        h, d = c.hidden_size, c.head_dim
        self.fc = nn.Linear(c.num_aux * c.target_hidden_size, h, bias=False)
        self.q_proj = nn.Linear(2 * h, c.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, c.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, c.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * d, h, bias=False)
        self.gate_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, h, bias=False)
        self.hidden_norm = RMSNorm(h, c.rms_norm_eps)
        self.input_layernorm = RMSNorm(h, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, c.rms_norm_eps)
        self.norm = RMSNorm(h, c.rms_norm_eps)
        self.lm_head = nn.Linear(h, c.draft_vocab_size, bias=False)
        self.register_buffer("embed", embed.detach().clone(), persistent=False)  # [V,H] the target's
        inv = Rope.from_config(attention_config(c, "float32"), torch.device("cpu")).inv_freq  # [D/2]
        self.register_buffer("inv_freq", inv, persistent=False)  # the reference engine's RoPE (scaling too)

    # ---- pieces ---------------------------------------------------------------------------------
    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [B,heads,A,D] rotated at positions [A] (gpt-neox halves, as the reference engine)."""
        freqs = positions.float()[:, None] * self.inv_freq  # [A,D/2]
        emb = torch.cat([freqs, freqs], -1)  # [A,D]
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        a, b = x.chunk(2, -1)
        return x * cos + torch.cat([-b, a], -1) * sin  # [B,heads,A,D]

    def _qkv(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """tokens [B,A], hidden [B,A,H] at positions [A] -> q [B,nh,A,D], k, v [B,nkv,A,D] (rotated)."""
        c = self.config
        b, a = tokens.shape
        x = torch.cat([self.input_layernorm(self.embed[tokens]), self.hidden_norm(hidden)], -1)  # [B,A,2H]
        q = self.q_proj(x).view(b, a, c.num_attention_heads, c.head_dim).transpose(1, 2)  # [B,nh,A,D]
        k = self.k_proj(x).view(b, a, c.num_key_value_heads, c.head_dim).transpose(1, 2)  # [B,nkv,A,D]
        v = self.v_proj(x).view(b, a, c.num_key_value_heads, c.head_dim).transpose(1, 2)  # [B,nkv,A,D]
        return self._rope(q, positions), self._rope(k, positions), v

    def _finish(self, hidden: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
        """The residual adds and the MLP: hidden [B,A,H] + attention output [B,nh,A,D] -> [B,A,H]."""
        b, _, a, _ = att.shape
        h = hidden + self.o_proj(att.transpose(1, 2).reshape(b, a, -1))  # [B,A,H]
        x = self.post_attention_layernorm(h)
        return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # [B,A,H]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden)).float()  # [...,Vd]

    # ---- the unroll -------------------------------------------------------------------------------
    def unroll(self, aux: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """aux [B,T,n*Ht] target states, tokens [B,T] -> per step j, logits [B,A,Vd] of anchors 1..T-1
        (anchor a's step j predicts token a + j + 1; anchors with a + j > T - 1 are padding, fed token 0)."""
        c = self.config
        _, t = tokens.shape
        a = t - 1
        groups = c.num_attention_heads // c.num_key_value_heads
        slots = torch.arange(1, t, device=tokens.device)  # [A] slot of each anchor at step 0
        hidden = self.fc(aux[:, :-1])  # [B,A,H] target state of position a - 1 for anchor a
        q, k0, v0 = self._qkv(tokens[:, 1:], hidden, slots)
        causal = torch.ones(a, a, dtype=torch.bool, device=tokens.device).tril()  # [A,A] key anchor <= query
        scale = 1.0 / math.sqrt(c.head_dim)
        k0r, v0r = k0.repeat_interleave(groups, 1), v0.repeat_interleave(groups, 1)  # [B,nh,A,D]
        diag_k: list[torch.Tensor] = []
        diag_v: list[torch.Tensor] = []
        out: list[torch.Tensor] = []
        for j in range(steps):
            if j:
                shifted = F.pad(tokens[:, 1 + j :], (0, j))  # [B,A] token a + j (0 past the row's end)
                q, k, v = self._qkv(shifted, hidden, slots + j)
                diag_k.append(k.repeat_interleave(groups, 1))
                diag_v.append(v.repeat_interleave(groups, 1))
            scores = (q @ k0r.transpose(-1, -2)) * scale  # [B,nh,A,A]
            scores = scores.masked_fill(~causal, float("-inf"))
            diag = [(q * dk).sum(-1, keepdim=True) * scale for dk in diag_k]  # [B,nh,A,1] each
            weights = torch.cat([scores, *diag], -1).softmax(-1)  # [B,nh,A,A+j]
            att = weights[..., :a] @ v0r  # [B,nh,A,D]
            for i, dv in enumerate(diag_v):
                att = att + weights[..., a + i : a + i + 1] * dv  # [B,nh,A,D]
            hidden = self._finish(hidden, att)  # [B,A,H] pre-norm outputs: step j + 1's input
            out.append(self.logits(hidden))  # [B,A,Vd]
        return out

    # ---- initialisation and export -----------------------------------------------------------------
    @torch.no_grad()
    def init_from_target(
        self, layer: dict[str, torch.Tensor], norm: torch.Tensor, lm_rows: torch.Tensor
    ) -> None:
        """Start from target decoder layer `layer` (HF names after `model.layers.N.`): its attention reads
        the hidden half of [embed | hidden] (the embedding half starts at zero), its MLP and norms as they
        are; fc passes the last captured state through; norm and lm_head are the target's final norm and
        its lm_head rows of the draft vocabulary (lm_rows [Vd,H])."""
        h = self.config.hidden_size
        for name in ("q_proj", "k_proj", "v_proj"):
            w = getattr(self, name).weight  # [out,2H]
            w.zero_()
            w[:, h:] = layer[f"self_attn.{name}.weight"]
        for name in ("o_proj", "gate_proj", "up_proj", "down_proj"):
            part = "self_attn" if name == "o_proj" else "mlp"
            getattr(self, name).weight.copy_(layer[f"{part}.{name}.weight"])
        self.hidden_norm.weight.copy_(layer["input_layernorm.weight"])
        self.input_layernorm.weight.copy_(layer["input_layernorm.weight"])
        self.post_attention_layernorm.weight.copy_(layer["post_attention_layernorm.weight"])
        self.fc.weight.zero_()
        ht = self.config.target_hidden_size
        self.fc.weight[:, -ht:] = torch.eye(h, ht)
        self.norm.weight.copy_(norm)
        self.lm_head.weight.copy_(lm_rows)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The trained tensors under their HF layout names (d2t / t2d are added by the writer)."""
        own = dict(self.named_parameters())
        return {hf: own[name].detach() for name, hf in HF_NAMES.items()}

    def load_hf_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        own = dict(self.named_parameters())
        with torch.no_grad():
            for name, hf in HF_NAMES.items():
                own[name].copy_(tensors[hf])
