"""HF (Llama / Mistral / Qwen2, optional Medusa heads) -> TensorRT-LLM checkpoint.

`convert_checkpoint` plans every rank file from the declarative table in `layout.py`, checks the plan
against the source (every source tensor consumed, every expected tensor present with its HF shape),
then writes one rank file at a time, one tensor at a time, each read as the rank's slice only:
peak memory follows the largest tensor. Output is built in a temporary folder renamed into place.

Shape legend: V vocab, H hidden, I intermediate, nh/nkv heads, hd head dim, tp/pp parallel sizes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specbuild.builder.hf_config import HFModelConfig
from specbuild.engines.trtllm.ckpt_config import WEIGHT_ONLY_ALGO, checkpoint_config, medusa_config
from specbuild.engines.trtllm.layout import (
    IGNORED_SUFFIXES,
    MEDUSA_PER_LAYER,
    MEDUSA_RULES,
    MODEL_RULES,
    TIED_LM_HEAD_SOURCE,
    ConvertDims,
    Parallel,
    Rule,
    Split,
    Stage,
)
from specbuild.engines.trtllm.medusa import MedusaHeads, MedusaHeadsSource, open_heads
from specbuild.engines.trtllm.sources import FLOAT_DTYPES, SafetensorsSource
from specbuild.engines.trtllm.st_writer import Entry, StreamingWriter
from specbuild.errors import CheckpointError, ConversionError

__all__ = ["convert_checkpoint", "MedusaHeadsSource", "plan_checkpoint"]

Progress = Callable[[int, int, str], None]  # (bytes done, bytes total, tensor name)


@dataclass(frozen=True)
class Item:
    """One tensor of one rank file."""

    rule: Rule
    sources: tuple[str, ...]  # concrete source names
    entry: Entry  # output name, dtype, expected shape


@dataclass(frozen=True)
class CheckpointPlan:
    cfg: HFModelConfig
    dims: ConvertDims
    par: Parallel
    dtype: str
    ranks: tuple[tuple[Item, ...], ...]  # [world_size][tensors]
    config: dict

    @property
    def total_bytes(self) -> int:
        return sum(it.entry.nbytes for rank in self.ranks for it in rank)


def convert_checkpoint(
    hf_dir: str | Path,
    out_dir: str | Path,
    *,
    dtype: str | None = None,
    tp_size: int = 1,
    pp_size: int = 1,
    medusa: MedusaHeadsSource | None = None,
    weight_only: str = "none",
    force: bool = False,
    on_progress: Progress | None = None,
) -> Path:
    """Write config.json + rank{N}.safetensors + specbuild.json (kind trtllm_checkpoint) to `out_dir`."""
    from specbuild.manifest import atomic_output_dir, write_manifest

    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    src = SafetensorsSource.from_folder(hf_dir)
    heads = open_heads(medusa) if medusa is not None else None
    plan = plan_checkpoint(hf_dir, src, dtype=dtype, tp_size=tp_size, pp_size=pp_size, heads=heads, medusa=medusa, weight_only=weight_only)
    sources = {"model": src, "medusa": heads.source if heads else None}
    done, total = 0, plan.total_bytes
    with atomic_output_dir(out_dir, force=force) as tmp:
        import json

        (tmp / "config.json").write_text(json.dumps(plan.config, indent=2) + "\n")
        for rank, items in enumerate(plan.ranks):
            with StreamingWriter(tmp / f"rank{rank}.safetensors", [it.entry for it in items]) as writer:
                for it in items:
                    writer.write(it.entry.name, _produce(it, sources, plan, rank))
                    done += it.entry.nbytes
                    if on_progress:
                        on_progress(done, total, f"rank{rank}/{it.entry.name}")
        write_manifest(
            tmp,
            kind="trtllm_checkpoint",
            inputs={
                "hf_dir": str(hf_dir.resolve()),
                "hf_files": {f.name: f.stat().st_size for f in src.files},
                "hf_config": plan.cfg.to_dict(),
                "medusa_file": str(heads.file.resolve()) if heads else None,
            },
            options={
                "dtype": plan.dtype,
                "tp_size": tp_size,
                "pp_size": pp_size,
                "weight_only": weight_only,
                "medusa": {"num_heads": heads.num_heads, "num_layers": heads.num_layers, "max_draft_len": medusa.max_draft_len} if heads else None,
            },
            config=plan.config,
        )
    return out_dir


def plan_checkpoint(
    hf_dir: Path,
    src: SafetensorsSource,
    *,
    dtype: str | None,
    tp_size: int,
    pp_size: int,
    heads: MedusaHeads | None,
    medusa: MedusaHeadsSource | None,
    weight_only: str,
) -> CheckpointPlan:
    """Every rank's tensors with expected shapes; raises before anything is written."""
    cfg = HFModelConfig.from_hf(hf_dir)
    where = str(hf_dir)
    if not cfg.supported:
        raise ConversionError(f"{where}: architecture {cfg.architecture} is not supported", expected="LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM", found=cfg.architecture, fix="convert a Llama-family model")
    dtype = dtype or cfg.dtype
    if dtype not in FLOAT_DTYPES:
        raise ConversionError(f"unsupported dtype {dtype}", expected=" | ".join(FLOAT_DTYPES), found=dtype, fix="pass --dtype bfloat16")
    if weight_only not in WEIGHT_ONLY_ALGO:
        raise ConversionError(f"unsupported weight-only precision {weight_only}", expected=" | ".join(WEIGHT_ONLY_ALGO), found=weight_only, fix="use --weight-only int8 or int4")
    if weight_only != "none" and dtype == "float32":
        raise ConversionError("weight-only quantization needs float16 or bfloat16 activations", expected="--dtype float16 | bfloat16", found="float32", fix="pass --dtype bfloat16 with --weight-only")
    dims = ConvertDims.from_hf(cfg)
    par = Parallel(tp_size, pp_size)
    par.check(dims, where=where)
    config = checkpoint_config(cfg, dtype=dtype, tp=tp_size, pp=pp_size, weight_only=weight_only)
    if heads is not None:
        assert medusa is not None
        config = medusa_config(config, num_heads=heads.num_heads, num_layers=heads.num_layers, max_draft_len=medusa.max_draft_len)
    ranks = tuple(tuple(_rank_items(rank, dims, par, dtype, heads)) for rank in range(par.world_size))
    _check_sources(ranks, {"model": src, "medusa": heads.source if heads else None}, dims, par)
    return CheckpointPlan(cfg=cfg, dims=dims, par=par, dtype=dtype, ranks=ranks, config=config)


# ---- planning ------------------------------------------------------------------------------------

def _rank_items(rank: int, dims: ConvertDims, par: Parallel, dtype: str, heads: MedusaHeads | None):
    pp_rank = par.pp_rank(rank)
    first, last = pp_rank == 0, pp_rank == par.pp - 1
    layers = par.layers(pp_rank, dims.num_layers)
    for rule in MODEL_RULES:
        if rule.when and not getattr(dims, rule.when):
            continue
        if rule.stage is Stage.LAYER:
            for i, layer in enumerate(layers):
                yield _item(rule, {"i": i, "l": layer}, dims, par, dtype)
        elif (rule.stage is Stage.FIRST and first) or (rule.stage is Stage.LAST and last):
            srcs = (TIED_LM_HEAD_SOURCE,) if rule.trt == "lm_head.weight" and dims.tie_word_embeddings else None
            yield _item(rule, {}, dims, par, dtype, sources=srcs)
    if heads is not None and last:
        for h in range(heads.num_heads):
            for rule in MEDUSA_RULES:
                js = range(heads.num_layers) if any(k in rule.trt for k in MEDUSA_PER_LAYER) else (None,)
                for j in js:
                    yield _item(rule, {"h": h, "j": j, "L": heads.num_layers}, dims, par, dtype)


def _item(rule: Rule, fmt: dict, dims: ConvertDims, par: Parallel, dtype: str, sources: tuple[str, ...] | None = None) -> Item:
    name = rule.trt.format(**fmt)
    hf_shape = dims.resolve(rule.shapes[0])
    return Item(rule=rule, sources=sources or tuple(s.format(**fmt) for s in rule.hf), entry=Entry(name, dtype, _rank_shape(rule, hf_shape, dims, par, name)))


def _rank_shape(rule: Rule, hf_shape: tuple[int, ...], dims: ConvertDims, par: Parallel, name: str) -> tuple[int, ...]:
    """The per-rank shape, from the split kind alone (independent of how _produce slices)."""
    tp = par.tp
    if rule.split is Split.NONE:
        return hf_shape
    if rule.split is Split.VOCAB:
        return (-(-hf_shape[0] // tp), *hf_shape[1:])
    if rule.split is Split.QKV:
        return (dims.q // tp + 2 * max(dims.kv // tp, dims.head_dim), *hf_shape[1:])
    dim = 0 if rule.split is Split.COLUMN else 1
    if hf_shape[dim] % tp:
        raise ConversionError(f"{name}: dim {dim} ({hf_shape[dim]}) is not a multiple of tp_size={tp}", expected=f"a multiple of {tp}", found=str(hf_shape[dim]), fix="choose a tp_size that divides it")
    return tuple(d // tp if k == dim else d for k, d in enumerate(hf_shape))


def _check_sources(ranks, sources: dict, dims: ConvertDims, par: Parallel) -> None:
    """Every planned source exists with its HF shape and a float dtype; every source tensor is used."""
    used: dict[str, set[str]] = {"model": set(), "medusa": set()}
    for items in ranks:
        for it in items:
            for k, name in enumerate(it.sources):
                src = sources[it.rule.source]
                used[it.rule.source].add(name)
                if name not in src.index:
                    raise CheckpointError(f"missing tensor {name} in {src.where}", expected=f"{name} (needed for {it.entry.name})", found="not in the checkpoint", fix="use a complete checkpoint (all shards)")
                info = src.info(name)
                want = dims.resolve(it.rule.shapes[k])
                if info.shape != want:
                    raise CheckpointError(f"tensor {name} has the wrong shape", expected=str(list(want)), found=str(list(info.shape)), fix="check that config.json matches the weights")
                if info.dtype not in FLOAT_DTYPES:
                    raise CheckpointError(f"tensor {name} has dtype {info.dtype}", expected=" | ".join(FLOAT_DTYPES), found=info.dtype, fix="convert from an unquantized float checkpoint")
    if dims.tie_word_embeddings:
        used["model"].add("lm_head.weight")  # some tied checkpoints still store the (identical) head
    for key, src in sources.items():
        if src is None:
            continue
        extra = sorted(n for n in src.names() - used[key] if not n.endswith(IGNORED_SUFFIXES))
        if extra:
            raise CheckpointError(
                f"{len(extra)} tensor(s) in {src.where} are not in the conversion table: {', '.join(extra[:5])}",
                expected="only Llama/Mistral/Qwen2 (and Medusa head) tensors",
                found=", ".join(extra[:10]),
                fix="check the architecture in config.json, or the Medusa head counts",
            )


# ---- producing one rank's tensor -----------------------------------------------------------------

def _produce(it: Item, sources: dict, plan: CheckpointPlan, rank: int):
    import torch

    src, par, dims = sources[it.rule.source], plan.par, plan.dims
    r, tp, split = par.tp_rank(rank), par.tp, it.rule.split
    name = it.sources[0]
    if split is Split.NONE:
        t = src.read(name)
    elif split is Split.COLUMN:
        n = src.info(name).shape[0] // tp
        t = src.read(name, rows=(r * n, (r + 1) * n))  # [n, ...]
    elif split is Split.ROW:
        n = src.info(name).shape[1] // tp
        t = src.read(name, cols=(r * n, (r + 1) * n))  # [rows, n]
    elif split is Split.VOCAB:
        start, stop, per = par.vocab_rows(r, src.info(name).shape[0])
        t = src.read(name, rows=(start, stop))  # [stop-start, H]
        if t.shape[0] < per:  # zero rows up to ceil(V/tp): the padded vocab of the last rank(s)
            t = torch.cat([t, t.new_zeros((per - t.shape[0], *t.shape[1:]))])  # [per, H]
    else:
        t = _qkv(src, it.sources, r, par, dims)
    t = t.to(getattr(torch, plan.dtype))
    if tuple(t.shape) != it.entry.shape:
        raise ConversionError(f"internal: {it.entry.name} came out {list(t.shape)}", expected=str(list(it.entry.shape)), found=str(list(t.shape)), fix="report this bug")
    return t


def _qkv(src, names: tuple[str, ...], r: int, par: Parallel, dims: ConvertDims):
    """[Q_r; K_r; V_r]: this rank's query heads, then its KV head(s) (repeated when tp > nkv)."""
    import torch

    hd = dims.head_dim
    q_per = dims.num_heads // par.tp
    kv = par.kv_heads(r, dims.num_kv_heads)
    q = src.read(names[0], rows=(r * q_per * hd, (r + 1) * q_per * hd))  # [nh/tp*hd, H] or [nh/tp*hd]
    k = src.read(names[1], rows=(kv.start * hd, kv.stop * hd))  # [nkv_r*hd, H]
    v = src.read(names[2], rows=(kv.start * hd, kv.stop * hd))  # [nkv_r*hd, H]
    return torch.cat([q, k, v])  # [(nh/tp + 2*nkv_r)*hd, H]
