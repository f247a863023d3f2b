"""EAGLE-3 drafts for the tests, written by a minimal writer independent of specbuild's, and an oracle.

`write_draft` lays out an HF EAGLE-3 folder by hand (names from the research note §A.2: SpecForge 0.2.0
`llama3_eagle.py`, the layout vLLM / SGLang / TensorRT-LLM load), with random weights; `write_hf` and
`write_speculators` lay out given tensors in the HF layout and in the speculators format (speculators
0.9.0); `raw_tensor_bytes` reads a safetensors file's stored bytes by hand. `oracle_logits`
computes the draft's first-step logits from the HF transformers target's `output_hidden_states`, with
its own plain-torch layer (no specbuild code), so the engine's capture convention and layer math are
checked against an implementation that shares nothing with them.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_draft(
    folder: Path,
    *,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    draft_vocab: int,
    layers: list[int] | None,
    seed: int = 0,
    prefix: str = "midlayer.",
    ids_key: str = "nested",  # nested: eagle_config (0-based layer outputs); top: vLLM's top-level key
    std: float = 0.3,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    d = hidden // heads

    def r(*shape):
        return torch.randn(*shape, generator=g) * std

    used = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    n = len(layers) if layers is not None else 3
    w = {
        "fc.weight": r(hidden, n * hidden),
        "norm.weight": 1 + r(hidden),
        "lm_head.weight": r(draft_vocab, hidden),
        "d2t": used - torch.arange(draft_vocab),
        "t2d": torch.zeros(vocab, dtype=torch.bool).index_fill_(0, used, True),
        f"{prefix}self_attn.q_proj.weight": r(heads * d, 2 * hidden),
        f"{prefix}self_attn.k_proj.weight": r(kv_heads * d, 2 * hidden),
        f"{prefix}self_attn.v_proj.weight": r(kv_heads * d, 2 * hidden),
        f"{prefix}self_attn.o_proj.weight": r(hidden, heads * d),
        f"{prefix}mlp.gate_proj.weight": r(intermediate, hidden),
        f"{prefix}mlp.up_proj.weight": r(intermediate, hidden),
        f"{prefix}mlp.down_proj.weight": r(hidden, intermediate),
    }
    for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm"):
        w[f"{prefix}{norm}.weight"] = 1 + r(hidden)
    shape = dict(hidden=hidden, heads=heads, kv_heads=kv_heads, intermediate=intermediate, vocab=vocab)
    return write_hf(folder, w, **shape, draft_vocab=draft_vocab, layers=layers, ids_key=ids_key)


def _rms(x, w, eps=1e-6):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x, pos, d, theta=10000.0):  # x [T,h,D]
    inv = 1.0 / theta ** (torch.arange(0, d, 2).float() / d)
    f = pos.float()[:, None] * inv
    emb = torch.cat([f, f], -1)[:, None]  # [T,1,D]
    a, b = x.chunk(2, -1)
    return x * emb.cos() + torch.cat([-b, a], -1) * emb.sin()


def oracle_logits(hf_model, folder: Path, tokens: list[int], states: list[int]) -> torch.Tensor:
    """Draft logits [T-1, Vd] of the first draft step at every position of `tokens`: position t (t >= 1)
    pairs HF `output_hidden_states[s + 1]` of position t - 1 (s in `states`, ascending) with token t,
    attending positions 1..t, at position t - 1 as vLLM's first draft pass puts it."""
    from safetensors.torch import load_file

    w = load_file(str(folder / "model.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    p = "midlayer." if any(k.startswith("midlayer.") for k in w) else "layers.0."
    h, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = h // nh
    with torch.no_grad():
        out = hf_model.model(input_ids=torch.tensor([tokens]), output_hidden_states=True)
        aux = torch.cat([out.hidden_states[s + 1][0] for s in sorted(states)], -1)  # [T,n*H]
        x_in = aux[:-1] @ w["fc.weight"].T  # [T-1,H] state of position t - 1
        emb = hf_model.model.embed_tokens.weight[torch.tensor(tokens[1:])]  # [T-1,H]
        x = torch.cat(
            [_rms(emb, w[p + "input_layernorm.weight"]), _rms(x_in, w[p + "hidden_norm.weight"])], -1
        )
        t = x.shape[0]
        pos = torch.arange(t)  # vLLM's positions: the state's own position t - 1
        q = _rope((x @ w[p + "self_attn.q_proj.weight"].T).view(t, nh, d), pos, d)
        k = _rope((x @ w[p + "self_attn.k_proj.weight"].T).view(t, nkv, d), pos, d)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(t, nkv, d)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        s = s.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        att = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(t, nh * d)
        y = x_in + att @ w[p + "self_attn.o_proj.weight"].T
        m = _rms(y, w[p + "post_attention_layernorm.weight"])
        y = (
            y
            + (
                torch.nn.functional.silu(m @ w[p + "mlp.gate_proj.weight"].T)
                * (m @ w[p + "mlp.up_proj.weight"].T)
            )
            @ w[p + "mlp.down_proj.weight"].T
        )
        return _rms(y, w["norm.weight"]) @ w["lm_head.weight"].T  # [T-1,Vd]


def write_speculators(
    folder: Path,
    tensors: dict,
    *,
    hidden: int,
    heads: int,
    kv_heads: int,
    intermediate: int,
    vocab: int,
    draft_vocab: int,
    vllm_ids: list[int] | None,
    verifier: str = "org/target",
    dtype: str = "float32",
) -> Path:
    """A speculators-format EAGLE-3 folder, laid out by hand from HF-layout tensors (names and keys from
    the speculators 0.9.0 wheel: `models/eagle3/config.py`, `convert/eagle/eagle3_converter.py`), as
    speculators writes under transformers 5: decoder layer at `layers.0.*`, the layer's shapes in
    `transformer_layer_config`, aux-layer ids at the top level in vLLM's numbering (0 = the embedding)."""
    folder.mkdir(parents=True, exist_ok=True)
    renamed = {
        ("layers.0." + k[len("midlayer.") :] if k.startswith("midlayer.") else k): v
        for k, v in tensors.items()
    }
    save_file({k: v.contiguous() for k, v in renamed.items()}, str(folder / "model.safetensors"))
    config = {
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "architectures": ["Eagle3Speculator"],
        "transformer_layer_config": {
            "model_type": "llama",
            "dtype": dtype,
            "vocab_size": vocab,
            "hidden_size": hidden,
            "intermediate_size": intermediate,
            "num_hidden_layers": 1,
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
            "tie_word_embeddings": False,
        },
        "draft_vocab_size": draft_vocab,
        "norm_before_residual": False,
        "target_hidden_size": None,
        "norm_before_fc": False,
        "fc_norm": False,
        "norm_output": False,
        "embed_requires_grad": False,
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": 3,
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
    }
    if vllm_ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = list(vllm_ids)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def write_hf(
    folder: Path,
    tensors: dict,
    *,
    hidden,
    heads,
    kv_heads,
    intermediate,
    vocab,
    draft_vocab,
    layers: list[int] | None,
    ids_key: str = "nested",
) -> Path:
    """An HF-layout EAGLE-3 folder by hand from HF-named tensors (SpecForge's keys: one
    `LlamaForCausalLMEagle3` layer; ids nested in `eagle_config` as layer outputs, or with ids_key "top"
    at the top level in vLLM's numbering, 0 being the embedding)."""
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "intermediate_size": intermediate,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "torch_dtype": "float32",
    }
    if layers is not None and ids_key == "nested":
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(layers)}
    elif layers is not None:
        config["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in layers]
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def raw_tensor_bytes(path: Path) -> dict[str, tuple[str, list[int], bytes]]:
    """name -> (dtype, shape, the stored bytes), read from the safetensors header by hand."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n])
    header.pop("__metadata__", None)
    base = 8 + n
    return {
        k: (v["dtype"], v["shape"], data[base + v["data_offsets"][0] : base + v["data_offsets"][1]])
        for k, v in header.items()
    }
