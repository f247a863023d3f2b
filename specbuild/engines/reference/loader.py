"""Read a TensorRT-LLM checkpoint and merge its tp/pp shards back into whole tensors.

Derived from the conversion table (core/formats/trtllm_layout.py): `placements` says which tensors each PP
stage's rank files hold and which HF tensors each is made of, and every `Split` kind has a mechanical
inverse here (`UNSPLIT`):
  * NONE: replicated, rank 0's copy;   COLUMN / ROW: concatenate the TP slices on dim 0 / 1;
  * VOCAB: concatenate on dim 0, drop the zero rows that padded the vocab to a multiple of tp;
  * QKV: split each rank's [Q_r; K_r; V_r], concatenate Q, K, V over ranks; when tp > num_kv_heads
    every KV head was repeated tp/num_kv_heads times, so one copy is kept (the copies must be equal).
The result holds the HF tensors the checkpoint was converted from, each checked against the table's
symbolic shape, and is renamed to the reference model's short names (`SHORT_NAMES`). Rank r is
(tp_rank, pp_rank) = (r % tp, r // tp), as in TensorRT-LLM's Mapping. The tests keep an independent
inverse of the converter as the oracle (tests/test_convert_roundtrip.py).

Two cases the table does not produce but TensorRT-LLM checkpoints may hold: a checkpoint without
lm_head.weight shares the embedding (trtllm.md §2.3); `use_parallel_embedding` splits the embedding
by vocab (embedding_sharding_dim 0) or by hidden (1).

Shape legend: V vocab, H hidden, D head size, nh / nkv query / KV heads, I intermediate size,
tp tensor-parallel size.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from specbuild.core.errors import CheckpointError
from specbuild.core.formats.safe_io import InputFileError, read_json
from specbuild.core.formats.trtllm_layout import ConvertDims, Parallel, Placement, Split, placements
from specbuild.engines.reference.config import RefModelConfig

# HF tensor name -> the reference model's short name ({l} layer, {h} head, {j} ResBlock, {L} = ResBlocks)
SHORT_NAMES: dict[str, str] = {
    "model.embed_tokens.weight": "embed",
    "model.norm.weight": "ln_f",
    "lm_head.weight": "lm_head",
    "model.layers.{l}.input_layernorm.weight": "layers.{l}.ln1",
    "model.layers.{l}.post_attention_layernorm.weight": "layers.{l}.ln2",
    "model.layers.{l}.self_attn.q_proj.weight": "layers.{l}.q",
    "model.layers.{l}.self_attn.k_proj.weight": "layers.{l}.k",
    "model.layers.{l}.self_attn.v_proj.weight": "layers.{l}.v",
    "model.layers.{l}.self_attn.q_proj.bias": "layers.{l}.q_bias",
    "model.layers.{l}.self_attn.k_proj.bias": "layers.{l}.k_bias",
    "model.layers.{l}.self_attn.v_proj.bias": "layers.{l}.v_bias",
    "model.layers.{l}.self_attn.o_proj.weight": "layers.{l}.o",
    "model.layers.{l}.mlp.gate_proj.weight": "layers.{l}.fc",  # TensorRT-LLM mlp.fc (the SiLU branch)
    "model.layers.{l}.mlp.up_proj.weight": "layers.{l}.gate",  # TensorRT-LLM mlp.gate
    "model.layers.{l}.mlp.down_proj.weight": "layers.{l}.proj",
    "{h}.{j}.linear.weight": "medusa.{h}.{j}.w",
    "{h}.{j}.linear.bias": "medusa.{h}.{j}.b",
    "{h}.{L}.weight": "medusa.{h}.lm_head",
}


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
            expected="a TensorRT-LLM checkpoint (config.json + rank{N}.safetensors) or a reference engine "
            "folder",
            found=", ".join(sorted(p.name for p in folder.iterdir())[:8])
            if folder.is_dir()
            else "no such folder",
            fix="point at the folder `specbuild convert` or `specbuild compile` wrote",
        )

    try:
        raw = read_json(path, what="checkpoint config.json")
    except InputFileError as exc:
        raise CheckpointError(
            exc.what, expected=exc.expected, found=exc.found, fix="re-run `specbuild convert` / `compile`"
        ) from None
    return raw["pretrained_config"] if "pretrained_config" in raw else raw


def dims_of(cfg: RefModelConfig) -> ConvertDims:
    return ConvertDims(
        vocab=cfg.vocab_size,
        hidden=cfg.hidden_size,
        inter=cfg.intermediate_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_size,
        attention_bias=cfg.attn_bias,
        tie_word_embeddings=cfg.tie_word_embeddings,
    )


def load_weights(folder: str | Path) -> Weights:
    """Load every rank file of `folder` and return the merged model."""
    folder = Path(folder)
    cfg = RefModelConfig.from_checkpoint(read_checkpoint_config(folder), where=str(folder / "config.json"))
    dims, par = dims_of(cfg), cfg.parallel
    ranks = [_load_rank(folder, r) for r in range(cfg.world_size)]
    stages = [ranks[p * par.tp : (p + 1) * par.tp] for p in range(par.pp)]  # [pp][tp] -> tensors
    medusa = (cfg.num_medusa_heads, cfg.num_medusa_layers) if cfg.num_medusa_heads else None
    hf: dict[str, Any] = {}
    for p in range(par.pp):
        for pl in placements(p, dims, par, medusa=medusa):
            if pl.hf[0] in hf:
                continue  # the Medusa heads sit on every PP stage; the first copy found is used
            shards = [s.get(pl.trt) for s in stages[p]]
            if (
                pl.trt == "lm_head.weight" and shards[0] is None
            ):  # embedding sharing: the head is the embedding
                continue
            split = _embedding_split(cfg) if pl.trt == "transformer.vocab_embedding.weight" else pl.rule.split
            for name, tensor in zip(
                pl.hf, UNSPLIT[split]([_need(t, pl, folder) for t in shards], cfg, pl, folder), strict=True
            ):
                hf[name] = tensor
    # tied embeddings (the table converts the head from the embedding) or a shared embedding table
    hf.setdefault("lm_head.weight", hf["model.embed_tokens.weight"])
    _check_shapes(hf, dims, par, medusa, folder)
    return Weights(config=cfg, tensors={_short(name): t for name, t in hf.items()}, source=folder)


# ---- the inverse of each split kind -------------------------------------------------------------


def _replicated(shards: list, cfg: RefModelConfig, pl: Placement, folder: Path) -> list:
    return [shards[0]]


def _column(shards: list, cfg: RefModelConfig, pl: Placement, folder: Path) -> list:
    return [torch.cat(shards, 0)]  # [rows*tp, ...]


def _row(shards: list, cfg: RefModelConfig, pl: Placement, folder: Path) -> list:
    return [torch.cat(shards, 1)]  # [rows, cols*tp]


def _vocab(shards: list, cfg: RefModelConfig, pl: Placement, folder: Path) -> list:
    return [torch.cat(shards, 0)[: cfg.vocab_size]]  # [V, H]: the padding rows dropped


def _qkv(shards: list, cfg: RefModelConfig, pl: Placement, folder: Path) -> list:
    """Per-rank cat(Q_r, K_r, V_r) (weights [rows,H] or biases [rows]) -> whole Q, K, V."""
    par, d = cfg.parallel, cfg.head_size
    q_rows, kv_rows = cfg.q_size // par.tp, par.kv_heads_per_rank(cfg.num_kv_heads) * d
    qs, ks, vs = [], [], []
    for r, t in enumerate(shards):
        if t.shape[0] != q_rows + 2 * kv_rows:
            raise CheckpointError(
                f"{folder}: {pl.trt} of rank {r} has {t.shape[0]} rows",
                expected=f"{q_rows + 2 * kv_rows} = nh*D/tp + 2*max(nkv/tp,1)*D with nh={cfg.num_heads}, "
                f"nkv={cfg.num_kv_heads}, D={d}, tp={par.tp}",
                found=str(tuple(t.shape)),
                fix="the checkpoint's config.json does not match its tensors; re-run `specbuild convert`",
            )
        q, k, v = torch.split(t, [q_rows, kv_rows, kv_rows], 0)  # [nh*D/tp,...], [kv_rows,...] x2
        qs.append(q)
        ks.append(k)
        vs.append(v)
    if cfg.num_kv_heads < par.tp:
        reps = par.tp // cfg.num_kv_heads  # rank r holds KV head r // reps (trtllm.md §2.4)
        for r in range(par.tp):
            if not (torch.equal(ks[r], ks[r - r % reps]) and torch.equal(vs[r], vs[r - r % reps])):
                raise CheckpointError(
                    f"{folder}: {pl.trt} duplicated KV heads differ between ranks {r - r % reps} and {r}",
                    expected=f"each KV head repeated {reps} times across consecutive tp ranks",
                    found="different values",
                    fix="re-run `specbuild convert`",
                )
        ks, vs = ks[::reps], vs[::reps]
    return [torch.cat(qs, 0), torch.cat(ks, 0), torch.cat(vs, 0)]  # [nh*D,...], [nkv*D,...], [nkv*D,...]


UNSPLIT: dict[Split, Callable[[list, RefModelConfig, Placement, Path], list]] = {
    Split.NONE: _replicated,
    Split.COLUMN: _column,
    Split.ROW: _row,
    Split.VOCAB: _vocab,
    Split.QKV: _qkv,
}


def _embedding_split(cfg: RefModelConfig) -> Split:
    if not cfg.use_parallel_embedding:
        return Split.NONE
    return Split.VOCAB if cfg.embedding_sharding_dim == 0 else Split.ROW


# ---- pieces --------------------------------------------------------------------------------------


def _load_rank(folder: Path, rank: int) -> dict[str, Any]:
    path = folder / f"rank{rank}.safetensors"
    if not path.is_file():
        raise CheckpointError(
            f"{folder} lacks rank{rank}.safetensors",
            expected="one rank{N}.safetensors per rank (world_size = tp_size * pp_size from config.json "
            "mapping)",
            found=", ".join(sorted(p.name for p in folder.glob("rank*.safetensors"))) or "no rank files",
            fix="re-run `specbuild convert`; an interrupted copy leaves ranks missing",
        )
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises its own error types for truncated files
        raise CheckpointError(
            f"cannot read {path}",
            expected="a complete safetensors file",
            found=str(exc)[:200],
            fix="re-run `specbuild convert`",
        ) from None


def _need(tensor: Any, pl: Placement, folder: Path) -> Any:
    if tensor is None:
        raise CheckpointError(
            f"{folder}: tensor {pl.trt} is missing",
            expected=f"{pl.trt} (TensorRT-LLM Llama names, trtllm.md §2.3)",
            found="not in the rank file",
            fix="re-run `specbuild convert`",
        )
    return tensor


def _check_shapes(
    hf: dict[str, Any], dims: ConvertDims, par: Parallel, medusa: tuple[int, int] | None, folder: Path
) -> None:
    """Every merged tensor has the table's HF shape for this config."""
    want: dict[str, tuple[int, ...]] = {}
    for p in range(par.pp):
        for pl in placements(p, dims, par, medusa=medusa):
            for name, shape in zip(pl.hf, pl.rule.shapes, strict=True):
                want[name] = dims.resolve(shape)
    bad = [
        f"{k}: {tuple(hf[k].shape)} != {s}" for k, s in want.items() if k in hf and tuple(hf[k].shape) != s
    ]
    if bad:
        raise CheckpointError(
            f"{folder}: merged tensors have unexpected shapes",
            expected="shapes from config.json (hidden, heads, vocab, intermediate)",
            found="; ".join(bad[:5]),
            fix="re-run `specbuild convert`",
        )


_TEMPLATES = [
    (
        re.compile(
            "^"
            + re.escape(hf)
            .replace(r"\{l\}", r"(?P<l>\d+)")
            .replace(r"\{h\}", r"(?P<h>\d+)")
            .replace(r"\{j\}", r"(?P<j>\d+)")
            .replace(r"\{L\}", r"(?P<L>\d+)")
            + "$"
        ),
        short,
    )
    for hf, short in SHORT_NAMES.items()
]


def _short(name: str) -> str:
    for pattern, short in _TEMPLATES:
        m = pattern.match(name)
        if m:
            return short.format(**m.groupdict())
    raise CheckpointError(
        f"no reference-engine name for {name}",
        expected="a tensor of the conversion table",
        found=name,
        fix="report this bug",
    )
