"""Read a TensorRT-LLM checkpoint and merge its tp/pp shards back into whole tensors.

The inverse of trtllm.md §2.3-2.4 and §3.3, per tensor:
  * fused qkv per rank = cat(Q_r, K_r, V_r): split each rank's rows, concatenate Q, K, V over ranks;
    when tp > num_kv_heads every KV head was repeated tp/num_kv_heads times, so keep one copy
    (the copies are checked to be equal);
  * dense (o_proj) and mlp.proj (down_proj) were split on dim 1; mlp.fc (gate_proj), mlp.gate
    (up_proj), Medusa linears and lm_heads on dim 0;
  * lm_head rows beyond vocab_size are tp padding and are dropped;
  * each PP rank numbers its layers from 0: local layer L of pp rank p is global layer
    layer_ranges()[p][L]; the embedding lives on the first PP rank, ln_f / lm_head on the last.
Rank r is (tp_rank, pp_rank) = (r % tp, r // tp), as in TensorRT-LLM's Mapping.

Shape legend: V vocab, H hidden, D head size, nh / nkv query / KV heads, I intermediate size,
tp tensor-parallel size.

The merged weights use short names (see `Weights`); Medusa heads go into `medusa.{h}.{j}.w|b`
and `medusa.{h}.lm_head`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.engines.reference.config import RefModelConfig
from specbuild.errors import CheckpointError

LAYER_KEYS = ("ln1", "q", "k", "v", "o", "ln2", "fc", "gate", "proj")  # plus q_bias/k_bias/v_bias with attn_bias


@dataclass(frozen=True)
class Weights:
    """A whole model: `config` plus merged tensors by short name (torch tensors, config.dtype)."""

    config: RefModelConfig
    tensors: dict[str, Any]  # "embed" [V,H], "ln_f" [H], "lm_head" [V,H], "layers.{l}.{key}", "medusa.*"
    source: Path


def read_checkpoint_config(folder: Path) -> dict[str, Any]:
    """config.json of a checkpoint, or the `pretrained_config` of a reference engine folder."""
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(
            f"{folder} has no config.json",
            expected="a TensorRT-LLM checkpoint (config.json + rank{N}.safetensors) or a reference engine folder",
            found=", ".join(sorted(p.name for p in folder.iterdir())[:8]) if folder.is_dir() else "no such folder",
            fix="point at the folder `specbuild convert` or `specbuild compile` wrote",
        )
    from specbuild.safe_io import InputFileError, read_json

    try:
        raw = read_json(path, what="checkpoint config.json")
    except InputFileError as exc:
        raise CheckpointError(exc.what, expected=exc.expected, found=exc.found, fix="re-run `specbuild convert` / `compile`") from None
    return raw["pretrained_config"] if "pretrained_config" in raw else raw


def load_weights(folder: str | Path) -> Weights:
    """Load every rank file of `folder` and return the merged model."""
    import torch

    folder = Path(folder)
    config = RefModelConfig.from_checkpoint(read_checkpoint_config(folder), where=str(folder / "config.json"))
    ranks = [_load_rank(folder, r) for r in range(config.world_size)]
    tp, cfg = config.tp_size, config
    out: dict[str, Any] = {}
    by_pp = [ranks[p * tp:(p + 1) * tp] for p in range(config.pp_size)]  # [pp][tp] -> tensors
    first, last = by_pp[0], by_pp[-1]

    out["embed"] = _embedding(first, cfg, folder)
    out["ln_f"] = _one(last[0], "transformer.ln_f.weight", folder)
    if "lm_head.weight" in last[0]:
        out["lm_head"] = torch.cat([r["lm_head.weight"] for r in last], 0)[: cfg.vocab_size]  # [V,H]
    else:  # embedding sharing (trtllm.md §2.3): the head is the embedding
        out["lm_head"] = out["embed"]

    for p, layers in enumerate(config.layer_ranges()):
        shards = by_pp[p]
        for local, layer in enumerate(layers):
            pre = f"transformer.layers.{local}."
            dst = f"layers.{layer}."
            out[dst + "ln1"] = _one(shards[0], pre + "input_layernorm.weight", folder)
            out[dst + "ln2"] = _one(shards[0], pre + "post_layernorm.weight", folder)
            q, k, v = _unfuse_qkv([_one(s, pre + "attention.qkv.weight", folder) for s in shards], cfg, pre, folder)
            out[dst + "q"], out[dst + "k"], out[dst + "v"] = q, k, v  # [nh*D,H], [nkv*D,H], [nkv*D,H]
            if cfg.attn_bias:
                qb, kb, vb = _unfuse_qkv([_one(s, pre + "attention.qkv.bias", folder) for s in shards], cfg, pre, folder)
                out[dst + "q_bias"], out[dst + "k_bias"], out[dst + "v_bias"] = qb, kb, vb
            out[dst + "o"] = torch.cat([_one(s, pre + "attention.dense.weight", folder) for s in shards], 1)  # [H,nh*D]
            out[dst + "fc"] = torch.cat([_one(s, pre + "mlp.fc.weight", folder) for s in shards], 0)  # [I,H] gate_proj
            out[dst + "gate"] = torch.cat([_one(s, pre + "mlp.gate.weight", folder) for s in shards], 0)  # [I,H] up_proj
            out[dst + "proj"] = torch.cat([_one(s, pre + "mlp.proj.weight", folder) for s in shards], 1)  # [H,I]

    for h in range(cfg.num_medusa_heads):
        pre = f"medusa_heads.{h}."
        holder = _find_rank_group(by_pp, pre + "lm_head.weight", folder)
        for j in range(cfg.num_medusa_layers):
            lp = f"{pre}medusa_layers.{j}.linear."
            out[f"medusa.{h}.{j}.w"] = torch.cat([_one(s, lp + "weight", folder) for s in holder], 0)  # [H,H]
            out[f"medusa.{h}.{j}.b"] = torch.cat([_one(s, lp + "bias", folder) for s in holder], 0)  # [H]
        out[f"medusa.{h}.lm_head"] = torch.cat([_one(s, pre + "lm_head.weight", folder) for s in holder], 0)[: cfg.vocab_size]  # [V,H]

    _check_shapes(out, cfg, folder)
    return Weights(config=config, tensors=out, source=folder)


# ---- pieces --------------------------------------------------------------------------------------

def _load_rank(folder: Path, rank: int) -> dict[str, Any]:
    from safetensors.torch import load_file

    path = folder / f"rank{rank}.safetensors"
    if not path.is_file():
        raise CheckpointError(
            f"{folder} lacks rank{rank}.safetensors",
            expected="one rank{N}.safetensors per rank (world_size = tp_size * pp_size from config.json mapping)",
            found=", ".join(sorted(p.name for p in folder.glob("rank*.safetensors"))) or "no rank files",
            fix="re-run `specbuild convert`; an interrupted copy leaves ranks missing",
        )
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for truncated files
        raise CheckpointError(f"cannot read {path}", expected="a complete safetensors file", found=str(exc)[:200], fix="re-run `specbuild convert`") from None


def _one(tensors: dict[str, Any], name: str, folder: Path):
    if name not in tensors:
        raise CheckpointError(
            f"{folder}: tensor {name} is missing",
            expected=f"{name} (TensorRT-LLM Llama names, trtllm.md §2.3)",
            found=f"{len(tensors)} tensors, e.g. {', '.join(sorted(tensors)[:3])}",
            fix="re-run `specbuild convert`",
        )
    return tensors[name]


def _find_rank_group(by_pp: list[list[dict[str, Any]]], name: str, folder: Path) -> list[dict[str, Any]]:
    for group in reversed(by_pp):  # Medusa heads sit with lm_head on the last PP rank
        if name in group[0]:
            return group
    return [_one(by_pp[-1][0], name, folder)]  # raises the missing-tensor error


def _embedding(first: list[dict[str, Any]], cfg: RefModelConfig, folder: Path):
    import torch

    name = "transformer.vocab_embedding.weight"
    if not cfg.use_parallel_embedding:
        return _one(first[0], name, folder)
    parts = [_one(s, name, folder) for s in first]
    return torch.cat(parts, cfg.embedding_sharding_dim)[: cfg.vocab_size]  # [V,H]


def _unfuse_qkv(per_rank: list[Any], cfg: RefModelConfig, where: str, folder: Path):
    """Per-rank cat(Q_r, K_r, V_r) (weights [rows,H] or biases [rows]) -> whole Q, K, V."""
    import torch

    tp, d = cfg.tp_size, cfg.head_size
    q_rows, kv_rows = cfg.q_size // tp, cfg.kv_heads_per_rank * d
    qs, ks, vs = [], [], []
    for r, t in enumerate(per_rank):
        if t.shape[0] != q_rows + 2 * kv_rows:
            raise CheckpointError(
                f"{folder}: {where}attention.qkv of rank {r} has {t.shape[0]} rows",
                expected=f"{q_rows + 2 * kv_rows} = nh*D/tp + 2*max(nkv/tp,1)*D with nh={cfg.num_heads}, nkv={cfg.num_kv_heads}, D={d}, tp={tp}",
                found=str(tuple(t.shape)),
                fix="the checkpoint's config.json does not match its tensors; re-run `specbuild convert`",
            )
        q, k, v = torch.split(t, [q_rows, kv_rows, kv_rows], 0)  # [nh*D/tp,...], [kv_rows,...] x2
        qs.append(q)
        ks.append(k)
        vs.append(v)
    if cfg.num_kv_heads < tp:
        reps = tp // cfg.num_kv_heads  # rank r holds KV head r // reps (trtllm.md §2.4)
        for r in range(tp):
            if not (torch.equal(ks[r], ks[r - r % reps]) and torch.equal(vs[r], vs[r - r % reps])):
                raise CheckpointError(
                    f"{folder}: {where}attention.qkv duplicated KV heads differ between ranks {r - r % reps} and {r}",
                    expected=f"each KV head repeated {reps} times across consecutive tp ranks",
                    found="different values",
                    fix="re-run `specbuild convert`",
                )
        ks, vs = ks[::reps], vs[::reps]
    return torch.cat(qs, 0), torch.cat(ks, 0), torch.cat(vs, 0)  # [nh*D,...], [nkv*D,...], [nkv*D,...]


def _check_shapes(t: dict[str, Any], cfg: RefModelConfig, folder: Path) -> None:
    v, h, i = cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size
    want = {"embed": (v, h), "ln_f": (h,), "lm_head": (v, h)}
    for layer in range(cfg.num_layers):
        p = f"layers.{layer}."
        want.update({p + "ln1": (h,), p + "ln2": (h,), p + "q": (cfg.q_size, h), p + "k": (cfg.kv_size, h),
                     p + "v": (cfg.kv_size, h), p + "o": (h, cfg.q_size), p + "fc": (i, h), p + "gate": (i, h), p + "proj": (h, i)})
        if cfg.attn_bias:
            want.update({p + "q_bias": (cfg.q_size,), p + "k_bias": (cfg.kv_size,), p + "v_bias": (cfg.kv_size,)})
    for hd in range(cfg.num_medusa_heads):
        want[f"medusa.{hd}.lm_head"] = (v, h)
        for j in range(cfg.num_medusa_layers):
            want.update({f"medusa.{hd}.{j}.w": (h, h), f"medusa.{hd}.{j}.b": (h,)})
    bad = [f"{k}: {tuple(t[k].shape)} != {s}" for k, s in want.items() if tuple(t[k].shape) != s]
    if bad:
        raise CheckpointError(
            f"{folder}: merged tensors have unexpected shapes",
            expected="shapes from config.json (hidden, heads, vocab, intermediate)",
            found="; ".join(bad[:5]),
            fix="re-run `specbuild convert`",
        )
