"""HF (Llama / Mistral / Qwen2, optional Medusa heads) -> TensorRT-LLM checkpoint.

`convert_checkpoint` plans every rank file from the declarative table in `layout.py`, checks the plan
against the source (every source tensor consumed, every expected tensor present with its HF shape),
then writes the TP rank files of one PP stage side by side, one tensor at a time, each rank reading
only its slice: peak memory follows the largest tensor. Output is built in a temporary folder renamed
into place.

Shape legend: V vocab, H hidden, I intermediate, nh/nkv heads, hd head dim, tp/pp parallel sizes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specbuild.core.errors import CheckpointError, ConversionError
from specbuild.core.formats.hf_config import HFModelConfig
from specbuild.core.formats.manifest import atomic_output_dir, write_manifest
from specbuild.core.formats.trtllm_layout import (
    HEADS_SOURCE,
    IGNORED_SUFFIXES,
    MODEL_SOURCE,
    ConvertDims,
    Parallel,
    Rule,
    Split,
    placements,
)
from specbuild.engines.trtllm.ckpt_config import WEIGHT_ONLY_ALGO, checkpoint_config, medusa_config
from specbuild.engines.trtllm.medusa import MedusaHeads, MedusaHeadsSource, open_heads
from specbuild.engines.trtllm.sources import FLOAT_DTYPES, SafetensorsSource
from specbuild.engines.trtllm.st_writer import Entry, StreamingWriter

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
    gpus_per_node: int | None = None,
    medusa: MedusaHeadsSource | None = None,
    weight_only: str = "none",
    force: bool = False,
    on_progress: Progress | None = None,
) -> Path:
    """Write config.json + rank{N}.safetensors + specbuild.json (kind trtllm_checkpoint) to `out_dir`.
    gpus_per_node: the GPUs of one node of the deployment (mapping.gpus_per_node; None: tp x pp, one node)."""
    hf_dir, out_dir = Path(hf_dir), Path(out_dir)
    cfg = HFModelConfig.from_hf(hf_dir)  # first: a missing or foreign config.json is the clearest error
    src = SafetensorsSource.from_folder(hf_dir)
    heads = open_heads(medusa) if medusa is not None else None
    plan = plan_checkpoint(
        cfg,
        src,
        dtype=dtype,
        tp_size=tp_size,
        pp_size=pp_size,
        gpus_per_node=gpus_per_node,
        heads=heads,
        medusa=medusa,
        weight_only=weight_only,
    )
    sources = {MODEL_SOURCE: src, HEADS_SOURCE: heads.source if heads else None}
    inputs = {"HF model": hf_dir, "Medusa heads": medusa.heads_dir if medusa is not None else None}
    with atomic_output_dir(out_dir, force=force, inputs=inputs) as tmp, _one_torch_thread():
        config_text = json.dumps(plan.config, indent=2) + "\n"
        (tmp / "config.json").write_text(config_text)
        hashes = {"config.json": hashlib.sha256(config_text.encode()).hexdigest()}
        progress = _Counter(plan.total_bytes, on_progress)
        for stage in range(plan.par.pp):
            hashes.update(_write_stage(tmp, plan, sources, stage, progress))
        write_manifest(
            tmp,
            reuse_nested=True,
            kind="trtllm_checkpoint",
            known=hashes,  # taken while writing: no second pass over a multi-GB checkpoint
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
                "gpus_per_node": plan.config["mapping"]["gpus_per_node"],
                "weight_only": weight_only,
                "heads": {
                    "num_heads": heads.num_heads,
                    "num_layers": heads.num_layers,
                    "max_draft_len": medusa.max_draft_len,
                }
                if heads
                else None,
            },
            config=plan.config,
        )
    return out_dir


def plan_checkpoint(
    cfg: HFModelConfig,
    src: SafetensorsSource,
    *,
    dtype: str | None,
    tp_size: int,
    pp_size: int,
    heads: MedusaHeads | None,
    gpus_per_node: int | None = None,
    medusa: MedusaHeadsSource | None,
    weight_only: str,
) -> CheckpointPlan:
    """Every rank's tensors with expected shapes; raises before anything is written."""
    where = src.where
    if not cfg.supported:
        raise ConversionError(
            f"{where}: architecture {cfg.architecture} is not supported",
            expected="LlamaForCausalLM, MistralForCausalLM or Qwen2ForCausalLM",
            found=cfg.architecture,
            fix="convert a Llama-family model",
        )
    dtype = dtype or cfg.dtype
    if dtype not in FLOAT_DTYPES:
        raise ConversionError(
            f"unsupported dtype {dtype}",
            expected=" | ".join(FLOAT_DTYPES),
            found=dtype,
            fix="pass --dtype bfloat16",
        )
    if weight_only not in WEIGHT_ONLY_ALGO:
        raise ConversionError(
            f"unsupported weight-only precision {weight_only}",
            expected=" | ".join(WEIGHT_ONLY_ALGO),
            found=weight_only,
            fix="use --weight-only int8 or int4",
        )
    if weight_only != "none" and dtype == "float32":
        raise ConversionError(
            "weight-only quantization needs float16 or bfloat16 activations",
            expected="--dtype float16 | bfloat16",
            found="float32",
            fix="pass --dtype bfloat16 with --weight-only",
        )
    dims = ConvertDims.from_hf(cfg)
    par = Parallel(tp_size, pp_size)
    par.check(dims, where=where)
    config = checkpoint_config(
        cfg, dtype=dtype, tp=tp_size, pp=pp_size, weight_only=weight_only, gpus_per_node=gpus_per_node
    )
    if heads is not None:
        assert medusa is not None
        config = medusa_config(
            config, num_heads=heads.num_heads, num_layers=heads.num_layers, max_draft_len=medusa.max_draft_len
        )
    ranks = tuple(tuple(_rank_items(rank, dims, par, dtype, heads)) for rank in range(par.world_size))
    _check_sources(ranks, {MODEL_SOURCE: src, HEADS_SOURCE: heads.source if heads else None}, dims, par)
    return CheckpointPlan(cfg=cfg, dims=dims, par=par, dtype=dtype, ranks=ranks, config=config)


@dataclass
class _Counter:
    total: int
    callback: Progress | None
    done: int = 0

    def add(self, nbytes: int, name: str) -> None:
        self.done += nbytes
        if self.callback:
            self.callback(self.done, self.total, name)


@contextlib.contextmanager
def _one_torch_thread():
    """torch on one thread while converting (restored after). The only torch work is assembling tensors
    (memory-bound copies and casts); with its thread pool, each copy wakes OpenMP workers that then
    spin-wait and take the cores the sha256 threads need (`make bench-convert` reports the conversion's
    CPU time)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _write_stage(
    tmp: Path, plan: CheckpointPlan, sources: dict, stage: int, progress: _Counter
) -> dict[str, str]:
    """Write the TP rank files of one PP stage side by side, tensor by tensor: the TP slices of a
    tensor are produced back to back (its source pages are still in cache; the slices add up to one
    tensor of memory), a replicated tensor is produced once, and each file is hashed on its own
    thread. Returns {file name: sha256}."""
    ranks = [stage * plan.par.tp + r for r in range(plan.par.tp)]
    names = [f"rank{rank}.safetensors" for rank in ranks]
    scratch = [Scratch() for _ in ranks]  # per rank: its in-flight assembled tensor stays untouched
    with contextlib.ExitStack() as stack:
        writers = [
            stack.enter_context(StreamingWriter(tmp / n, [it.entry for it in plan.ranks[rank]]))
            for n, rank in zip(names, ranks, strict=True)
        ]
        for i, first in enumerate(plan.ranks[ranks[0]]):
            shared = None
            if first.rule.split is Split.NONE:  # replicated: produce once, write to every TP file
                shared = _produce(first, sources, plan, ranks[0], scratch[0])
            for k, rank in enumerate(ranks):
                it = plan.ranks[rank][i]
                assert it.entry.name == first.entry.name, "TP ranks of a stage share one tensor order"
                label = f"{', '.join(it.sources)} (rank{rank} {it.entry.name})"
                writers[k].write(
                    it.entry.name,
                    shared if shared is not None else _produce(it, sources, plan, rank, scratch[k]),
                    label=label,
                )
                progress.add(it.entry.nbytes, f"rank{rank}/{it.entry.name}")
    return {n: w.sha256 for n, w in zip(names, writers, strict=True)}


# ---- planning ------------------------------------------------------------------------------------


def _rank_items(rank: int, dims: ConvertDims, par: Parallel, dtype: str, heads: MedusaHeads | None):
    medusa = (heads.num_heads, heads.num_layers) if heads is not None else None
    for pl in placements(par.pp_rank(rank), dims, par, medusa=medusa):
        hf_shape = dims.resolve(pl.rule.shapes[0])
        yield Item(
            rule=pl.rule,
            sources=pl.hf,
            entry=Entry(pl.trt, dtype, _rank_shape(pl.rule, hf_shape, dims, par, pl.trt)),
        )


def _rank_shape(
    rule: Rule, hf_shape: tuple[int, ...], dims: ConvertDims, par: Parallel, name: str
) -> tuple[int, ...]:
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
        raise ConversionError(
            f"{name}: dim {dim} ({hf_shape[dim]}) is not a multiple of tp_size={tp}",
            expected=f"a multiple of {tp}",
            found=str(hf_shape[dim]),
            fix="choose a tp_size that divides it",
        )
    return tuple(d // tp if k == dim else d for k, d in enumerate(hf_shape))


def _check_sources(ranks, sources: dict, dims: ConvertDims, par: Parallel) -> None:
    """Every planned source exists with its HF shape and a float dtype; every source tensor is used."""
    used: dict[str, set[str]] = {MODEL_SOURCE: set(), HEADS_SOURCE: set()}
    for items in ranks:
        for it in items:
            for k, name in enumerate(it.sources):
                src = sources[it.rule.source]
                used[it.rule.source].add(name)
                if name not in src.index:
                    raise CheckpointError(
                        f"missing tensor {name} in {src.where}",
                        expected=f"{name} (needed for {it.entry.name})",
                        found="not in the checkpoint",
                        fix="use a complete checkpoint (all shards)",
                    )
                info = src.info(name)
                want = dims.resolve(it.rule.shapes[k])
                if info.shape != want:
                    raise CheckpointError(
                        f"tensor {name} has the wrong shape",
                        expected=str(list(want)),
                        found=str(list(info.shape)),
                        fix="check that config.json matches the weights",
                    )
                if info.dtype not in FLOAT_DTYPES:
                    raise CheckpointError(
                        f"tensor {name} has dtype {info.dtype}",
                        expected=" | ".join(FLOAT_DTYPES),
                        found=info.dtype,
                        fix="convert from an unquantized float checkpoint",
                    )
    if dims.tie_word_embeddings:
        used[MODEL_SOURCE].add("lm_head.weight")  # some tied checkpoints still store the (identical) head
    for key, src in sources.items():
        if src is None:
            continue
        extra = sorted(n for n in src.names() - used[key] if not n.endswith(IGNORED_SUFFIXES))
        if extra:
            raise CheckpointError(
                f"{len(extra)} tensor(s) in {src.where} are not in the conversion table: "
                f"{', '.join(extra[:5])}",
                expected="only Llama/Mistral/Qwen2 (and Medusa head) tensors",
                found=", ".join(extra[:10]),
                fix="check the architecture in config.json, or the Medusa head counts",
            )


# ---- producing one rank's tensor -----------------------------------------------------------------


class Scratch:
    """Two reusable byte buffers for tensors that must be assembled (fused, strided, padded, cast).

    Fresh multi-MB allocations are returned to the OS on free and page-faulted again on the next
    one, which costs more than the copy itself; reusing two buffers avoids that. Two, alternated,
    because the writer may still be hashing the previous assembled tensor (see StreamingWriter._emit).
    """

    def __init__(self) -> None:
        self._bufs: list = [None, None]
        self._turn = 0

    def take(self, dtype: str, shape: tuple[int, ...]):
        n = Entry("", dtype, shape).nbytes
        buf = self._bufs[self._turn]
        if buf is None or buf.numel() < n:
            buf = self._bufs[self._turn] = torch.empty(n, dtype=torch.uint8)  # [bytes]
        self._turn ^= 1
        return buf[:n].view(getattr(torch, dtype)).view(shape)


@dataclass(frozen=True)
class Piece:
    """A slice of one source tensor: rows of dim 0 (contiguous in the file) or cols of dim 1 (strided)."""

    name: str
    rows: tuple[int, int] | None = None
    cols: tuple[int, int] | None = None


def _produce(it: Item, sources: dict, plan: CheckpointPlan, rank: int, scratch: Scratch) -> list:
    """This rank's tensor as writer parts: file ranges copied as they are when the slices are row
    ranges at the output dtype, else one tensor assembled (stacked, cast, padded) in `scratch`."""
    src = sources[it.rule.source]
    pieces, pad_rows = _pieces(it, src, plan, rank)
    rows = sum((p.rows[1] - p.rows[0]) if p.rows else src.info(p.name).shape[0] for p in pieces) + pad_rows
    if rows != it.entry.shape[0]:
        raise ConversionError(
            f"internal: {it.entry.name} would get {rows} rows",
            expected=str(list(it.entry.shape)),
            found=f"{rows} rows",
            fix="report this bug",
        )
    direct = isinstance(src, SafetensorsSource) and all(
        p.cols is None and src.info(p.name).dtype == plan.dtype for p in pieces
    )
    if direct:
        parts: list = [src.byte_range(p.name, p.rows) for p in pieces]
        if pad_rows:  # zero rows up to ceil(V/tp): the padded vocab of the last rank(s)
            parts.append(
                torch.zeros((pad_rows, *it.entry.shape[1:]), dtype=getattr(torch, plan.dtype))
            )  # [pad, H]
        return parts
    t = scratch.take(plan.dtype, it.entry.shape)  # [rows, ...]
    row = 0
    for p in pieces:  # stack along dim 0, casting while copying
        part = src.read(p.name, rows=p.rows, cols=p.cols)  # [r, ...]
        t[row : row + part.shape[0]].copy_(part)
        row += part.shape[0]
    t[row:].zero_()  # vocab padding rows
    return [t]


def _pieces(it: Item, src, plan: CheckpointPlan, rank: int) -> tuple[list[Piece], int]:
    """(source slices to stack along dim 0, zero rows to append) for one rank's tensor."""
    par, dims = plan.par, plan.dims
    r, tp, split = par.tp_rank(rank), par.tp, it.rule.split
    name = it.sources[0]
    if split is Split.NONE:
        return [Piece(name)], 0
    if split is Split.COLUMN:
        n = src.info(name).shape[0] // tp
        return [Piece(name, rows=(r * n, (r + 1) * n))], 0  # [n, ...]
    if split is Split.ROW:
        n = src.info(name).shape[1] // tp
        return [Piece(name, cols=(r * n, (r + 1) * n))], 0  # [rows, n]
    if split is Split.VOCAB:
        start, stop, per = par.vocab_rows(r, src.info(name).shape[0])
        return [Piece(name, rows=(start, stop))], per - (
            stop - start
        )  # [stop-start, H] + zero rows to ceil(V/tp)
    # QKV: [Q_r; K_r; V_r], this rank's query heads, then its KV head(s) (repeated when tp > nkv)
    hd, q_per = dims.head_dim, dims.num_heads // tp
    kv = par.kv_heads(r, dims.num_kv_heads)
    return [
        Piece(it.sources[0], rows=(r * q_per * hd, (r + 1) * q_per * hd)),  # [nh/tp*hd, H] or [nh/tp*hd]
        Piece(it.sources[1], rows=(kv.start * hd, kv.stop * hd)),  # [nkv_r*hd, H]
        Piece(it.sources[2], rows=(kv.start * hd, kv.stop * hd)),  # [nkv_r*hd, H]
    ], 0
