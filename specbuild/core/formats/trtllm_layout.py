"""The declarative HF -> TensorRT-LLM tensor table and the TP/PP arithmetic it needs.

Each `Rule` says: which TensorRT-LLM tensor, from which HF tensor(s), split how across tensor-parallel
ranks, on which pipeline stage. `convert.py` walks the table; nothing else knows tensor names.
Facts follow shared/docs/reference/trtllm.md §2.3-2.4 and §3.3 (TensorRT-LLM 1.2.x).

Shape legend (symbolic dims used in `Rule.shapes`):
  vocab  V       HF vocab size (unpadded)          hidden  H   model width
  q      nh*hd   query width                       kv      nkv*hd  key (= value) width
  inter  I       MLP width
Per rank: column splits (dim 0) give rows/tp, row splits (dim 1) give cols/tp, the vocab split pads V
to ceil(V/tp)*tp rows first, QKV gives [(nh/tp + 2*max(nkv/tp, 1))*hd, H].
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from specbuild.core.errors import ConversionError

MODEL_SOURCE, HEADS_SOURCE = "model", "heads"  # where a rule's tensors come from


class Split(Enum):
    NONE = "none"  # replicated on every TP rank
    COLUMN = "column"  # dim 0 (ColumnLinear: output features)
    ROW = "row"  # dim 1 (RowLinear: input features)
    VOCAB = "vocab"  # dim 0 after zero-padding rows to a multiple of tp (lm_head)
    QKV = "qkv"  # fused [Q_r; K_r; V_r] of this rank's heads, KV heads repeated when tp > nkv


class Stage(Enum):
    LAYER = "layer"  # once per decoder layer, on the PP stage that owns the layer
    FIRST = "first"  # first PP stage only
    LAST = "last"  # last PP stage only
    EVERY = "every"  # every rank file, whatever its PP stage


@dataclass(frozen=True)
class Rule:
    trt: str  # TensorRT-LLM name; {i} = stage-local layer, {h} = Medusa head, {j} = ResBlock
    hf: tuple[str, ...]  # source names; {l} = global layer; QKV rules list q, k, v
    shapes: tuple[tuple[str, ...], ...]  # symbolic HF shape of each source (see legend)
    split: Split
    stage: Stage = Stage.LAYER
    when: str | None = None  # name of a boolean on ConvertDims gating the rule (e.g. attention_bias)
    source: str = MODEL_SOURCE  # MODEL_SOURCE | HEADS_SOURCE (the Medusa heads file)


def _attn(p: str, kind: str) -> tuple[str, ...]:
    return tuple(f"model.layers.{{l}}.self_attn.{x}_proj.{kind}" for x in p)


# The Llama block (also Mistral and Qwen2, whose TRT-LLM classes use the same names).
# Note fc <- gate_proj (the SiLU branch) and gate <- up_proj: TRT-LLM's naming, not a typo.
MODEL_RULES: tuple[Rule, ...] = (
    Rule(
        "transformer.vocab_embedding.weight",
        ("model.embed_tokens.weight",),
        (("vocab", "hidden"),),
        Split.NONE,
        Stage.FIRST,
    ),
    Rule(
        "transformer.layers.{i}.input_layernorm.weight",
        ("model.layers.{l}.input_layernorm.weight",),
        (("hidden",),),
        Split.NONE,
    ),
    Rule(
        "transformer.layers.{i}.attention.qkv.weight",
        _attn("qkv", "weight"),
        (("q", "hidden"), ("kv", "hidden"), ("kv", "hidden")),
        Split.QKV,
    ),
    Rule(
        "transformer.layers.{i}.attention.qkv.bias",
        _attn("qkv", "bias"),
        (("q",), ("kv",), ("kv",)),
        Split.QKV,
        when="attention_bias",
    ),
    Rule(
        "transformer.layers.{i}.attention.dense.weight",
        ("model.layers.{l}.self_attn.o_proj.weight",),
        (("hidden", "q"),),
        Split.ROW,
    ),
    Rule(
        "transformer.layers.{i}.post_layernorm.weight",
        ("model.layers.{l}.post_attention_layernorm.weight",),
        (("hidden",),),
        Split.NONE,
    ),
    Rule(
        "transformer.layers.{i}.mlp.fc.weight",
        ("model.layers.{l}.mlp.gate_proj.weight",),
        (("inter", "hidden"),),
        Split.COLUMN,
    ),
    Rule(
        "transformer.layers.{i}.mlp.gate.weight",
        ("model.layers.{l}.mlp.up_proj.weight",),
        (("inter", "hidden"),),
        Split.COLUMN,
    ),
    Rule(
        "transformer.layers.{i}.mlp.proj.weight",
        ("model.layers.{l}.mlp.down_proj.weight",),
        (("hidden", "inter"),),
        Split.ROW,
    ),
    Rule("transformer.ln_f.weight", ("model.norm.weight",), (("hidden",),), Split.NONE, Stage.LAST),
    Rule("lm_head.weight", ("lm_head.weight",), (("vocab", "hidden"),), Split.VOCAB, Stage.LAST),
)
TIED_LM_HEAD_SOURCE = "model.embed_tokens.weight"  # lm_head's source when tie_word_embeddings

# HF Medusa heads (FasterDecoding format, trtllm.md §3.3): ResBlock j of head h, then the head's lm_head
# stored as ResBlock index L = num_layers. On EVERY rank: TensorRT-LLM's MedusaForCausalLm creates the
# heads on every PP stage (only the last one runs them) and its loader requires every parameter, as
# its own converter (load_medusa_hf, no PP condition) provides them.
MEDUSA_RULES: tuple[Rule, ...] = (
    Rule(
        "medusa_heads.{h}.medusa_layers.{j}.linear.weight",
        ("{h}.{j}.linear.weight",),
        (("hidden", "hidden"),),
        Split.COLUMN,
        Stage.EVERY,
        source=HEADS_SOURCE,
    ),
    Rule(
        "medusa_heads.{h}.medusa_layers.{j}.linear.bias",
        ("{h}.{j}.linear.bias",),
        (("hidden",),),
        Split.COLUMN,
        Stage.EVERY,
        source=HEADS_SOURCE,
    ),
    Rule(
        "medusa_heads.{h}.lm_head.weight",
        ("{h}.{L}.weight",),
        (("vocab", "hidden"),),
        Split.VOCAB,
        Stage.EVERY,
        source=HEADS_SOURCE,
    ),
)
MEDUSA_PER_LAYER = ("medusa_layers",)  # rules containing this repeat for every ResBlock j

# Buffers some HF checkpoints still carry; they are recomputed from the config, never converted.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass(frozen=True)
class ConvertDims:
    """The numbers the table needs, from an HFModelConfig (and the parallel layout)."""

    vocab: int
    hidden: int
    inter: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    attention_bias: bool
    tie_word_embeddings: bool

    @property
    def q(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv(self) -> int:
        return self.num_kv_heads * self.head_dim

    def resolve(self, symbolic: tuple[str, ...]) -> tuple[int, ...]:
        return tuple(getattr(self, d) for d in symbolic)

    @classmethod
    def from_hf(cls, cfg) -> ConvertDims:
        return cls(
            vocab=cfg.vocab_size,
            hidden=cfg.hidden_size,
            inter=cfg.intermediate_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=cfg.num_attention_heads,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            attention_bias=cfg.attention_bias,
            tie_word_embeddings=cfg.tie_word_embeddings,
        )


@dataclass(frozen=True)
class Parallel:
    """TP x PP layout. Rank r has tp_rank = r % tp and pp_rank = r // tp (TensorRT-LLM Mapping, cp=1)."""

    tp: int = 1
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def pp_rank(self, rank: int) -> int:
        return rank // self.tp

    def layers(self, pp_rank: int, num_layers: int) -> range:
        """Global layers of a PP stage: torch.tensor_split(arange(L), pp) (earlier stages get the extras)."""
        base, extra = divmod(num_layers, self.pp)
        start = pp_rank * base + min(pp_rank, extra)
        return range(start, start + base + (1 if pp_rank < extra else 0))

    def layer_ranges(self, num_layers: int) -> list[range]:
        """The global layers of every PP stage, in stage order."""
        return [self.layers(p, num_layers) for p in range(self.pp)]

    def kv_heads_per_rank(self, num_kv_heads: int) -> int:
        """KV heads in one TP rank's fused qkv: nkv/tp, or one repeated head when tp > nkv (trtllm.md §2.4).
        (Rounded up for layouts `check` refuses, so a memory plan of one stays an upper bound.)"""
        return max(1, -(-num_kv_heads // self.tp))

    def check(self, dims: ConvertDims, *, where: str) -> None:
        """Refuse layouts TensorRT-LLM cannot shard, naming the number that does not divide."""
        tp, pp = self.tp, self.pp
        if tp < 1 or pp < 1:
            raise ConversionError(
                f"{where}: tp_size and pp_size must be >= 1",
                expected=">= 1",
                found=f"tp={tp} pp={pp}",
                fix="use --tp-size 1 --pp-size 1",
            )
        if pp > dims.num_layers:
            raise ConversionError(
                f"{where}: more pipeline stages than layers",
                expected=f"pp_size <= {dims.num_layers}",
                found=f"pp_size={pp}",
                fix="lower --pp-size",
            )
        nh, nkv = dims.num_heads, dims.num_kv_heads
        bad = []
        if nh % tp:
            bad.append(f"num_attention_heads={nh} is not a multiple of tp_size={tp}")
        if nkv >= tp and nkv % tp:
            bad.append(f"num_key_value_heads={nkv} is not a multiple of tp_size={tp}")
        if nkv < tp and tp % nkv:
            bad.append(
                f"tp_size={tp} is not a multiple of num_key_value_heads={nkv} (KV heads are repeated tp/nkv "
                "times)"
            )
        if dims.inter % tp:
            bad.append(f"intermediate_size={dims.inter} is not a multiple of tp_size={tp}")
        if bad:
            raise ConversionError(
                f"{where}: tensor parallelism tp_size={tp} cannot split this model",
                expected="heads, KV heads (or tp / KV heads) and intermediate_size divisible by tp_size",
                found="; ".join(bad),
                fix="choose a tp_size that divides num_attention_heads and num_key_value_heads (or a "
                "multiple of it)",
            )

    def kv_heads(self, tp_rank: int, num_kv_heads: int) -> range:
        """KV heads held by a TP rank; one repeated head when tp > nkv (repeat-interleave, then chunk)."""
        if num_kv_heads >= self.tp:
            per = num_kv_heads // self.tp
            return range(tp_rank * per, (tp_rank + 1) * per)
        head = tp_rank // (self.tp // num_kv_heads)
        return range(head, head + 1)

    def vocab_rows(self, tp_rank: int, vocab: int) -> tuple[int, int, int]:
        """(start, stop, padded_rows_per_rank) of the vocab split; rows past `vocab` are zeros."""
        per = -(-vocab // self.tp)
        start = min(tp_rank * per, vocab)
        return start, min(start + per, vocab), per


# ---- which tensors a rank holds ------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """One tensor of a rank file: its TensorRT-LLM name and the HF tensor(s) it is made of."""

    rule: Rule
    trt: str  # name in rank{N}.safetensors (layers numbered from 0 on each PP stage)
    hf: tuple[str, ...]  # source names (the tied embedding for a tied lm_head)


def placements(
    pp_rank: int, dims: ConvertDims, par: Parallel, *, medusa: tuple[int, int] | None = None
) -> Iterator[Placement]:
    """Every tensor the ranks of PP stage `pp_rank` hold, in file order (a stage's TP ranks hold the same
    names). `medusa` = (heads, ResBlocks per head) when the checkpoint carries Medusa heads."""
    first, last = pp_rank == 0, pp_rank == par.pp - 1
    for rule in MODEL_RULES:
        if rule.when and not getattr(dims, rule.when):
            continue
        if rule.stage is Stage.LAYER:
            for i, layer in enumerate(par.layers(pp_rank, dims.num_layers)):
                yield _place(rule, {"i": i, "l": layer})
        elif _on_stage(rule.stage, first=first, last=last):
            tied = rule.trt == "lm_head.weight" and dims.tie_word_embeddings
            yield _place(rule, {}, hf=(TIED_LM_HEAD_SOURCE,) if tied else None)
    if medusa is not None:
        num_heads, num_layers = medusa
        for h in range(num_heads):
            for rule in MEDUSA_RULES:
                if not _on_stage(rule.stage, first=first, last=last):
                    continue
                js = range(num_layers) if any(k in rule.trt for k in MEDUSA_PER_LAYER) else (None,)
                for j in js:
                    yield _place(rule, {"h": h, "j": j, "L": num_layers})


def _on_stage(stage: Stage, *, first: bool, last: bool) -> bool:
    return stage is Stage.EVERY or (stage is Stage.FIRST and first) or (stage is Stage.LAST and last)


def _place(rule: Rule, fmt: dict, hf: tuple[str, ...] | None = None) -> Placement:
    return Placement(rule, rule.trt.format(**fmt), hf or tuple(s.format(**fmt) for s in rule.hf))
