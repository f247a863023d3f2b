"""The EAGLE-3 draft layer (inference) over an HF-layout checkpoint (core/formats/eagle3.py).

Shape legend: B rows, T new slots in a pass, S slots attended, H draft hidden, Ht target hidden, n
captured target layers, V / Vd target / draft vocabulary, nh / nkv heads, D head size, I intermediate.

The draft has its own KV cache (one layer). **Slot i holds the pair (target state of position i - 1,
token x_i)** and its output predicts x_{i+1}, as the target's position i does; slot 0 has no target
state before it, holds zeros and is never attended. So the draft's slots line up with the target's
positions and its cache obeys the prefix cache's rule (slot i depends on tokens 0..i only). The
engines put the same pair at position i - 1 (vLLM `llm_base_proposer.py`: "rotate the input ids and
leave the positions unchanged"); RoPE scores depend on position differences only, so the outputs are
the same. A drafted step's slot holds (the draft's own pre-norm output of the slot before, the token
it drafted) and is rolled back after verification.

The layer (vLLM / SGLang / TensorRT-LLM / SpecForge agree, research note §A.4): residual = the fc output
(or the fed-back hidden), x = [input_layernorm(embed(token)) | hidden_norm(hidden)] (2H), attention over
x, residual add, post_attention_layernorm, SwiGLU MLP, residual add; the pre-norm result is fed back
and `lm_head(norm(.))` gives the draft logits [Vd]; draft id d is target id `draft_ids[d]` (= d + d2t[d]).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open

from specbuild.core.errors import CheckpointError
from specbuild.core.formats.eagle3 import (
    D2T,
    EMBED,
    FC,
    LAYER_PREFIXES,
    LAYER_TENSORS,
    LM_HEAD,
    NORM,
    Eagle3DraftConfig,
    check_aux_layers,
    default_aux_layers,
)
from specbuild.core.formats.eagle3_speculators import read_draft_folder
from specbuild.core.formats.weights import find_weights
from specbuild.engines.reference.config import RefModelConfig
from specbuild.engines.reference.model import KVCache, LlamaModel, Rope, attention_mask, rms_norm, rotate_half

MAX_DRAFT_FILE_BYTES = 1 << 34  # 16 GiB: a draft layer far larger is not an EAGLE-3 draft


class Eagle3Draft:
    """One EAGLE-3 draft layer with its fc, norm and lm_head (inference only, no autograd)."""

    def __init__(
        self,
        config: Eagle3DraftConfig,
        tensors: dict[str, torch.Tensor],
        *,
        aux_layers: tuple[int, ...],
        device: torch.device,
        dtype: torch.dtype,
    ):
        c = self.config = config
        self.aux_layers = aux_layers  # target layers captured (ascending, specbuild's convention)
        self.device, self.dtype = device, dtype
        self.attn_cfg = attention_config(c, str(dtype).removeprefix("torch."))
        w = {k: t.to(device, dtype) for k, t in tensors.items() if k != "draft_ids"}
        w["qkv"] = torch.cat([w.pop("q"), w.pop("k"), w.pop("v")], 0)  # [(nh+2nkv)*D,2H]
        w["fc_gate"] = torch.cat([w.pop("gate"), w.pop("up")], 0)  # [2I,H]
        self.w = w
        self.draft_ids = tensors["draft_ids"].to(device, torch.long)  # [Vd] target id of each draft id
        self.rope = Rope.from_config(self.attn_cfg, device)

    @property
    def vocab_size(self) -> int:
        return int(self.w["embed"].shape[0])

    @property
    def fc_input_size(self) -> int:
        return int(self.w["fc"].shape[1])  # n * Ht

    def new_cache(self, batch: int = 1, capacity: int = 256) -> KVCache:
        return KVCache(self.attn_cfg, batch, capacity, self.dtype, self.device)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """Captured target states [...,n*Ht] -> the draft's input hidden [...,H] (fc)."""
        return F.linear(aux.to(self.dtype), self.w["fc"])  # [...,H]

    @torch.inference_mode()
    def forward(
        self, tokens: torch.Tensor, hidden: torch.Tensor, cache: KVCache, *, n_new: list[int] | None = None
    ) -> torch.Tensor:
        """T new slots per row: tokens [B,T] with their input hidden [B,T,H] (fused target states or the
        draft's own outputs) -> pre-norm outputs [B,T,H]. Rows start at slot >= 1 (slot 0: `open_row`)."""
        b, t = tokens.shape
        c = self.attn_cfg
        assert min(cache.lengths) >= 1, "slot 0 of every row must be opened (open_row) before feeding"
        n_new = [t] * b if n_new is None else n_new
        lengths = torch.tensor(cache.lengths, device=self.device)  # [B]
        cache.reserve(max(cache.lengths) + t)
        positions = lengths[:, None] + torch.arange(t, device=self.device)[None, :]  # [B,T] = slots
        mask = attention_mask(lengths, t, None)  # [B,1,T,S]
        mask[..., 0] = False  # slot 0 holds no pair
        cos, sin = self.rope.cos_sin(positions, self.dtype)  # [B,T,1,D] each
        rows = torch.arange(b, device=self.device)[:, None].expand(b, t)  # [B,T]
        w = self.w
        x = torch.cat(
            [
                rms_norm(w["embed"][tokens], w["ln_input"], c.norm_epsilon),
                rms_norm(hidden, w["ln_hidden"], c.norm_epsilon),
            ],
            -1,
        )  # [B,T,2H]
        q, k, v = F.linear(x, w["qkv"]).split([c.q_size, c.kv_size, c.kv_size], -1)
        q = q.view(b, t, c.num_heads, c.head_size)  # [B,T,nh,D]
        k = k.view(b, t, c.num_kv_heads, c.head_size)  # [B,T,nkv,D]
        v = v.view(b, t, c.num_kv_heads, c.head_size)  # [B,T,nkv,D]
        q = q * cos + rotate_half(q) * sin  # [B,T,nh,D]
        k = k * cos + rotate_half(k) * sin  # [B,T,nkv,D]
        cache.k[0][rows, positions] = k
        cache.v[0][rows, positions] = v
        s = mask.shape[-1]
        att = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            cache.k[0][:, :s].transpose(1, 2),
            cache.v[0][:, :s].transpose(1, 2),
            attn_mask=mask,
            enable_gqa=True,
        )  # [B,nh,T,D]
        h = hidden + F.linear(att.transpose(1, 2).reshape(b, t, c.q_size), w["o"])  # [B,T,H]
        gate, up = F.linear(rms_norm(h, w["ln_post"], c.norm_epsilon), w["fc_gate"]).chunk(
            2, -1
        )  # [B,T,I] x2
        for row, n in enumerate(n_new):
            cache.lengths[row] += n
        return h + F.linear(F.silu(gate) * up, w["proj"])  # [B,T,H]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Pre-norm outputs [...,H] -> float32 draft-vocabulary logits [...,Vd]."""
        return F.linear(
            rms_norm(hidden, self.w["norm"], self.attn_cfg.norm_epsilon), self.w["lm_head"]
        ).float()

    def to_target(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary probabilities [...,Vd] -> target-vocabulary ones [...,V], zero outside the
        draft vocabulary (what the acceptance rule compares with the target's)."""
        out = draft_probs.new_zeros(draft_probs.shape[:-1] + (self.vocab_size,))  # [...,V]
        return out.index_copy_(-1, self.draft_ids, draft_probs)


def attention_config(c: Eagle3DraftConfig, dtype: str) -> RefModelConfig:
    """The draft layer's attention shapes and RoPE as a RefModelConfig (what KVCache and Rope read)."""
    return RefModelConfig(
        architecture="LlamaForCausalLM",
        dtype=dtype,
        vocab_size=c.draft_vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_layers=1,
        num_heads=c.num_attention_heads,
        num_kv_heads=c.num_key_value_heads,
        head_size=c.head_dim,
        norm_epsilon=c.rms_norm_eps,
        rotary_base=c.rope_theta,
        rotary_scaling=c.rope_scaling,
        max_position_embeddings=c.max_position_embeddings,
        attn_bias=False,
        tie_word_embeddings=False,
    )


def open_row(cache: KVCache, row: int) -> None:
    """Make slot 0 of `row` the empty pair: zero K/V (masked anyway), length 1."""
    cache.reserve(1)
    cache.k[:, row, 0] = 0
    cache.v[:, row, 0] = 0
    cache.lengths[row] = 1


# ---- loading ----------------------------------------------------------------------------------------

_SHORT = {  # HF layout name after the layer prefix -> short name
    "self_attn.q_proj.weight": "q",
    "self_attn.k_proj.weight": "k",
    "self_attn.v_proj.weight": "v",
    "self_attn.o_proj.weight": "o",
    "mlp.gate_proj.weight": "gate",
    "mlp.up_proj.weight": "up",
    "mlp.down_proj.weight": "proj",
    "hidden_norm.weight": "ln_hidden",
    "input_layernorm.weight": "ln_input",
    "post_attention_layernorm.weight": "ln_post",
}


def load_eagle3_draft(
    folder: str | Path, target: LlamaModel, *, aux_layers: tuple[int, ...] | list[int] | None = None
) -> Eagle3Draft:
    """The draft in `folder` (HF layout or speculators) for `target` (shapes checked against it).
    `aux_layers`: the capture to use (the spec's eagle3.layers_to_capture); None: the draft config's ids,
    else TensorRT-LLM's default."""
    folder = Path(folder)
    cfg = read_draft_folder(folder).config  # either format (core/formats/eagle3_speculators.py)
    where = str(folder)
    _refuse_unsupported(cfg, where)
    t = target.cfg
    layers = aux_layers if aux_layers is not None else cfg.aux_layers
    layers = check_aux_layers(
        tuple(layers) if layers is not None else default_aux_layers(t.num_layers), t.num_layers, where=where
    )
    if cfg.target_hidden_size != t.hidden_size or cfg.vocab_size != t.vocab_size:
        raise CheckpointError(
            f"{where}: the draft was made for another target",
            expected=f"target_hidden_size {t.hidden_size}, vocab_size {t.vocab_size} (the target's)",
            found=f"target_hidden_size {cfg.target_hidden_size}, vocab_size {cfg.vocab_size}",
            fix="use the EAGLE-3 draft trained for this target",
        )
    raw = {name.removeprefix("model."): t for name, t in read_draft_tensors(folder)[0].items()}
    tensors = _short_names(raw, cfg, n=len(layers), where=where)
    if (
        "embed" not in tensors
    ):  # shared with the target (TensorRT-LLM: when target_hidden_size == hidden_size)
        if cfg.hidden_size != t.hidden_size:
            raise CheckpointError(
                f"{where}: no embed_tokens.weight, and the draft is {cfg.hidden_size} wide, the target "
                f"{t.hidden_size}",
                expected="embed_tokens.weight [vocab_size, hidden_size] in the draft",
                found="no embedding",
                fix="export the draft with its embedding",
            )
        tensors["embed"] = target.w["embed"]
    if "lm_head" not in tensors:
        if cfg.draft_vocab_size != t.vocab_size:
            raise CheckpointError(
                f"{where}: no lm_head.weight for a draft vocabulary of {cfg.draft_vocab_size}",
                expected=f"lm_head.weight [{cfg.draft_vocab_size}, {cfg.hidden_size}]",
                found="no lm_head",
                fix="use a checkpoint that ships its lm_head",
            )
        tensors["lm_head"] = target.w["lm_head"]
    tensors["draft_ids"] = _draft_ids(raw, cfg, where)
    return Eagle3Draft(cfg, tensors, aux_layers=layers, device=target.device, dtype=target.dtype)


def _refuse_unsupported(cfg: Eagle3DraftConfig, where: str) -> None:
    if cfg.num_hidden_layers != 1 or cfg.norm_flags:
        raise CheckpointError(
            f"{where}: the reference engine runs one-layer EAGLE-3 drafts without extra norms",
            expected="num_hidden_layers 1; norm_before_residual, norm_before_fc, fc_norm, norm_output false",
            found=f"num_hidden_layers {cfg.num_hidden_layers}; set: {', '.join(cfg.norm_flags) or 'none'}",
            fix="serve this draft on a GPU host (TensorRT-LLM, vLLM or SGLang); specbuild cannot run it here",
        )


def read_draft_tensors(folder: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of the draft's safetensors files under its stored name, as stored (dtype and bytes
    kept), and the files' metadata. Refuses no / missing / oversized / damaged files and a tensor stored
    twice."""
    weights = find_weights(folder)
    if not weights.safetensors or weights.missing:
        raise CheckpointError(
            f"{folder} has no complete safetensors weights",
            expected="model.safetensors (or every shard its index names) of the EAGLE-3 draft",
            found=f"missing shards {list(weights.missing)[:3]}"
            if weights.missing
            else ", ".join(sorted(p.name for p in folder.iterdir())[:8]),
            fix="download the draft's weights (a pickle .bin is never loaded)",
        )
    out: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = {"format": "pt"}
    for path in weights.safetensors:
        if path.stat().st_size > MAX_DRAFT_FILE_BYTES:
            raise CheckpointError(
                f"{path} is {path.stat().st_size >> 30} GiB",
                expected="at most 16 GiB per draft file",
                found="larger",
                fix="check the folder holds an EAGLE-3 draft",
            )
        try:
            with safe_open(str(path), framework="pt") as f:
                metadata.update(f.metadata() or {})
                names = list(f.keys())
                twice = [n for n in names if n in out]
                out.update({name: f.get_tensor(name) for name in names if name not in out})
        except Exception as exc:  # safetensors raises its own error types for damaged files
            raise CheckpointError(
                f"cannot read {path}",
                expected="a complete safetensors file",
                found=str(exc)[:200],
                fix="download the draft again",
            ) from None
        if twice:
            raise CheckpointError(
                f"{folder}: tensor {twice[0]} is stored twice",
                expected="each tensor in one file",
                found=f"{twice[0]} again in {path.name}",
                fix="remove the stale shard",
            )
    return out, metadata


def _short_names(raw: dict[str, torch.Tensor], cfg: Eagle3DraftConfig, *, n: int, where: str) -> dict:
    """HF layout names -> short names, every shape checked against the config."""
    h, d = cfg.hidden_size, cfg.head_dim
    prefix = next((p for p in LAYER_PREFIXES if f"{p}{LAYER_TENSORS[0]}" in raw), LAYER_PREFIXES[0])
    want = {
        FC: ("fc", (h, n * cfg.target_hidden_size)),
        NORM: ("norm", (h,)),
        **{
            f"{prefix}{name}": (_SHORT[name], shape)
            for name, shape in (
                ("self_attn.q_proj.weight", (cfg.num_attention_heads * d, 2 * h)),
                ("self_attn.k_proj.weight", (cfg.num_key_value_heads * d, 2 * h)),
                ("self_attn.v_proj.weight", (cfg.num_key_value_heads * d, 2 * h)),
                ("self_attn.o_proj.weight", (h, cfg.num_attention_heads * d)),
                ("mlp.gate_proj.weight", (cfg.intermediate_size, h)),
                ("mlp.up_proj.weight", (cfg.intermediate_size, h)),
                ("mlp.down_proj.weight", (h, cfg.intermediate_size)),
                ("hidden_norm.weight", (h,)),
                ("input_layernorm.weight", (h,)),
                ("post_attention_layernorm.weight", (h,)),
            )
        },
    }
    optional = {LM_HEAD: ("lm_head", (cfg.draft_vocab_size, h)), EMBED: ("embed", (cfg.vocab_size, h))}
    missing = [k for k in want if k not in raw]
    bad = [
        f"{k}: {list(raw[k].shape)} != {list(shape)}"
        for k, (_, shape) in {**want, **optional}.items()
        if k in raw and tuple(raw[k].shape) != shape
    ]
    if missing or bad:
        raise CheckpointError(
            f"{where}: the weights do not match an EAGLE-3 draft of this config and capture",
            expected=f"the HF layout (`{prefix}*`, fc [{h}, {n} x {cfg.target_hidden_size}], ...)",
            found="; ".join([f"missing {k}" for k in missing[:4]] + bad[:4]),
            fix="check eagle3.layers_to_capture (fc's width counts the captured layers) and the config.json",
        )
    return {short: raw[k] for k, (short, _) in {**want, **optional}.items() if k in raw}


def _draft_ids(raw: dict[str, torch.Tensor], cfg: Eagle3DraftConfig, where: str) -> torch.Tensor:
    """[Vd] long: the target id of each draft id (identity for a full-vocabulary draft)."""
    base = torch.arange(cfg.draft_vocab_size, dtype=torch.long)  # [Vd]
    if D2T not in raw:
        if cfg.draft_vocab_size != cfg.vocab_size:  # vLLM would silently map draft id i to target id i
            raise CheckpointError(
                f"{where}: draft_vocab_size {cfg.draft_vocab_size} < vocab_size {cfg.vocab_size} but no d2t",
                expected="d2t (int [draft_vocab_size]: target id = draft id + d2t[draft id])",
                found="no d2t tensor",
                fix="export the draft with its d2t",
            )
        return base
    d2t = raw[D2T].to(torch.long).reshape(-1)  # [Vd]
    ids = base + d2t if d2t.numel() == cfg.draft_vocab_size else None
    if (
        ids is None
        or int(ids.min()) < 0
        or int(ids.max()) >= cfg.vocab_size
        or ids.unique().numel() != ids.numel()
    ):
        raise CheckpointError(
            f"{where}: d2t does not map the draft vocabulary into the target's",
            expected=f"{cfg.draft_vocab_size} offsets sending distinct draft ids into [0, {cfg.vocab_size})",
            found=f"{d2t.numel()} offsets"
            if ids is None
            else f"target ids {int(ids.min())}..{int(ids.max())}",
            fix="the d2t belongs to another tokenizer or stores absolute ids; re-export it",
        )
    return ids
