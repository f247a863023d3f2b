"""Per-GPU memory plan of a deployment: weights, runtime reserve, KV cache of each engine.

The plan answers, before anything is downloaded or built: do the weights fit, how many tokens of KV
cache does each engine get, and which `kv_cache_free_gpu_mem_fraction` must each Triton model be
given so that both engines hold the same number of tokens.

The fraction is TensorRT-LLM's: an engine, once its weights and activation buffers are on the GPU,
takes that fraction of the memory *then free* for its paged KV cache. With two engines on one GPU the
one that loads second sees only what the first left free, and Triton may load the two models in
either order. So each engine gets two settings that together make the split order-independent:
* `max_tokens_in_paged_kv_cache = kv_tokens` (TensorRT-LLM uses the smaller of the two limits), and
* `kv_fraction` = what it needs when it loads *last*: its pool / (memory left after every engine's
  weights and activations minus the other engines' pools).
Loading first, its fraction asks for more than it needs and the token cap holds it to `kv_tokens`;
loading last, the fraction gives exactly its pool. Either way both engines hold `kv_tokens` tokens.

The planning GPU is GPU 0: it holds rank 0 of the target and rank 0 of the draft (the draft shares the
target's GPUs, `gpu_device_ids` 0..draft_world-1). Under TP every rank of an engine gets the same
number of KV blocks, so GPU 0 decides for all of them.

Assumptions (printed with the plan):
* `serving.gpu_memory_gb` is in GiB (2**30 bytes), the unit of the marketed HBM size (an H100 80GB has
  80 GiB, nvidia-smi shows 79.6 GiB usable; an H200 141 GiB); `RUNTIME_RESERVE_GIB` covers the gap.
* `RUNTIME_RESERVE_GIB` per GPU: CUDA context, cuBLAS/NCCL workspaces, Triton and the Python stubs.
* activation buffers per engine: max_num_tokens x (4*hidden + 3*intermediate/tp) elements at the
  model dtype (residual, norm output, fused gate/up output and activation of the widest layer)
  plus the float32 logits of max_batch_size x (max_draft_len+1) rows. An estimate, not a measurement.
* `serving.kv_cache_free_gpu_mem_fraction` is the share of memory left after all weights, activation
  buffers and the reserve that goes to KV cache in total (both engines together).
* TensorRT-LLM layout: embedding not split (first PP rank), lm_head split by vocab padded to a multiple
  of tp (last PP rank; stored even when embeddings are tied), KV heads duplicated when tp > n_kv,
  weight-only quantization applies to the layer linears (qkv, dense, fc, gate, proj) with a per-channel
  scale, never to embedding, lm_head or Medusa heads. The KV cache is kept at the model dtype.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from specbuild.builder.eagle3_checks import capture_layers, eagle3_weight_bytes, read_eagle3
from specbuild.builder.resolve import resolve_model
from specbuild.core.errors import SpecbuildError
from specbuild.core.facts.trtllm import engine_limits
from specbuild.core.formats.hf_config import DTYPE_BYTES, HFModelConfig
from specbuild.core.formats.trtllm_layout import Parallel
from specbuild.core.methods import method_of

if TYPE_CHECKING:
    from specbuild.core.spec import BuildSpec

GIB = 2**30
RUNTIME_RESERVE_GIB = 2.0  # per GPU; see the module docstring
WEIGHT_ONLY_BITS = {"none": None, "int8": 8, "int4": 4}
LOGITS_BYTES = 4  # logits_dtype float32 (the checkpoint default)


@dataclass(frozen=True)
class MedusaShape:
    """What the plan needs of Medusa heads (heads ride on the target's last hidden state)."""

    num_heads: int
    num_layers: int  # ResBlocks per head


@dataclass(frozen=True)
class Eagle3Shape:
    """What the plan needs of an EAGLE-3 draft (builder/eagle3_checks.py reads it)."""

    num_parameters: int
    weight_bytes_total: int
    weight_bytes: int  # largest rank
    kv_bytes_per_token_total: int  # its draft layers' K and V for one token, all ranks
    kv_bytes_per_token: int  # on the planning GPU
    kv_heads_per_gpu: int


@dataclass(frozen=True)
class EngineMemory:
    """One engine (target or draft) on the planning GPU. Byte counts are per GPU unless named `_total`."""

    role: str  # target | draft
    tp_size: int
    pp_size: int
    dtype: str
    weight_only: str  # none | int8 | int4
    num_parameters: int  # the HF model (Medusa heads excluded)
    weight_bytes_total: int  # whole model at the chosen dtype / quantization, as HF stores it
    weight_bytes: int  # largest rank, TensorRT-LLM layout
    medusa_bytes: int  # Medusa heads on the last PP rank (0 without Medusa)
    activation_bytes: int  # estimate, see the module docstring
    max_num_tokens: int  # the value the activation estimate used
    kv_heads_per_gpu: int
    kv_duplication: int  # each KV head stored this many times across ranks (tp > n_kv), else 1
    kv_bytes_per_token_total: int  # K and V of every layer, one copy of each KV head
    kv_bytes_per_token: int  # on the planning GPU (its layers, its KV heads incl. duplicates)
    kv_fraction: float = 0.0  # kv_cache_free_gpu_mem_fraction to configure for this engine
    kv_bytes: int = 0  # KV pool on the planning GPU
    kv_tokens: int = 0  # tokens that pool holds

    @property
    def resident_bytes(self) -> int:
        """What the engine occupies before its KV cache: weights, heads, activation buffers."""
        return self.weight_bytes + self.medusa_bytes + self.activation_bytes


@dataclass(frozen=True)
class MemoryPlan:
    gpu_memory_bytes: int
    runtime_reserve_bytes: int
    kv_fraction_total: float  # serving.kv_cache_free_gpu_mem_fraction
    engines: tuple[EngineMemory, ...]  # in load order: target first
    free_after_weights_bytes: int  # GPU 0 after reserve, all weights and activation buffers (may be < 0)
    kv_budget_bytes: int  # kv_fraction_total of that, shared by the engines
    kv_tokens: int  # tokens of KV every engine holds (equal by construction)
    max_seq_len: int
    max_batch_size: int
    assumptions: tuple[str, ...] = field(default=())
    llmapi: bool = False  # LLM-API flow: one KV pool, kv_fraction_total + kv_tokens are what is configured

    @property
    def fits(self) -> bool:
        return self.free_after_weights_bytes > 0 and self.kv_tokens >= self.max_seq_len

    @property
    def full_sequences(self) -> int:
        """Sequences of max_seq_len tokens the KV pools hold at once."""
        return self.kv_tokens // self.max_seq_len if self.max_seq_len else 0

    def engine(self, role: str) -> EngineMemory | None:
        return next((e for e in self.engines if e.role == role), None)

    @property
    def target_kv_fraction(self) -> float:
        return self.engines[0].kv_fraction

    @property
    def draft_kv_fraction(self) -> float | None:
        """None when there is no draft engine (Medusa)."""
        draft = self.engine("draft")
        return draft.kv_fraction if draft else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            fits=self.fits,
            full_sequences=self.full_sequences,
            target_kv_fraction=self.target_kv_fraction,
            draft_kv_fraction=self.draft_kv_fraction,
        )
        return d


# ---- per-rank sizes ------------------------------------------------------------------------------


def pp_layers(num_layers: int, pp: int) -> list[int]:
    """Layers per PP rank (core/formats/trtllm_layout.Parallel: torch.tensor_split, earlier ranks get one
    extra)."""
    return [len(r) for r in Parallel(pp=pp).layer_ranges(num_layers)]


def kv_heads_per_rank(cfg: HFModelConfig, tp: int) -> int:
    """KV heads each TP rank stores (core/formats/trtllm_layout.Parallel)."""
    return Parallel(tp=tp).kv_heads_per_rank(cfg.num_key_value_heads)


def _linear_bytes(out_features: int, in_features: int, dtype_bytes: int, bits: int | None) -> int:
    if bits is None:
        return out_features * in_features * dtype_bytes
    # quantized weight + one scale per output channel at the model dtype (W8A16 / W4A16)
    return math.ceil(out_features * in_features * bits / 8) + out_features * dtype_bytes


def layer_bytes(cfg: HFModelConfig, tp: int, dtype: str, weight_only: str = "none") -> int:
    """One decoder layer on one TP rank."""
    b, bits = DTYPE_BYTES[dtype], WEIGHT_ONLY_BITS[weight_only]
    h, hd = cfg.hidden_size, cfg.head_dim
    q_out = math.ceil(cfg.num_attention_heads / tp) * hd
    kv_out = kv_heads_per_rank(cfg, tp) * hd
    inter = math.ceil(cfg.intermediate_size / tp)
    total = _linear_bytes(q_out + 2 * kv_out, h, b, bits)  # fused qkv [q+2kv, hidden]
    total += _linear_bytes(h, q_out, b, bits)  # dense (row-split)
    total += 2 * _linear_bytes(inter, h, b, bits) + _linear_bytes(h, inter, b, bits)  # fc, gate, proj
    if cfg.attention_bias:
        total += (q_out + 2 * kv_out) * b
    return total + 2 * h * b  # input_layernorm + post_layernorm


def rank_weight_bytes(
    cfg: HFModelConfig, *, tp: int, pp: int, dtype: str, weight_only: str = "none"
) -> list[int]:
    """Weight bytes of each PP stage's ranks (all TP ranks of a stage are the same size)."""
    b = DTYPE_BYTES[dtype]
    h, v = cfg.hidden_size, cfg.vocab_size
    per_layer = layer_bytes(cfg, tp, dtype, weight_only)
    out = []
    for stage, n in enumerate(pp_layers(cfg.num_hidden_layers, pp)):
        total = n * per_layer
        if stage == 0:
            total += v * h * b  # vocab_embedding, not split by default
        if stage == pp - 1:
            total += math.ceil(v / tp) * h * b + h * b  # lm_head rows padded to a multiple of tp, ln_f
        out.append(total)
    return out


def medusa_bytes_per_rank(cfg: HFModelConfig, medusa: MedusaShape, *, tp: int, dtype: str) -> int:
    """Medusa heads on one rank of the last PP stage: ResBlocks [hidden/tp, hidden] + lm_head [V/tp,
    hidden]."""
    b, h = DTYPE_BYTES[dtype], cfg.hidden_size
    res = medusa.num_layers * (math.ceil(h / tp) * h + math.ceil(h / tp)) * b
    head = math.ceil(cfg.vocab_size / tp) * h * b
    return medusa.num_heads * (res + head)


def kv_bytes_per_token_per_rank(cfg: HFModelConfig, *, tp: int, pp: int, dtype: str) -> int:
    """K and V for one token on the rank with the most layers (incl. duplicated KV heads)."""
    layers = max(pp_layers(cfg.num_hidden_layers, pp))
    return 2 * layers * kv_heads_per_rank(cfg, tp) * cfg.head_dim * DTYPE_BYTES[dtype]


def activation_bytes(
    cfg: HFModelConfig, *, tp: int, dtype: str, max_num_tokens: int, logits_rows: int
) -> int:
    width = 4 * cfg.hidden_size + 3 * math.ceil(cfg.intermediate_size / tp)
    return max_num_tokens * width * DTYPE_BYTES[dtype] + logits_rows * cfg.vocab_size * LOGITS_BYTES


# ---- the plan ------------------------------------------------------------------------------------


def engine_memory(
    cfg: HFModelConfig,
    *,
    role: str,
    tp: int,
    pp: int,
    dtype: str,
    weight_only: str,
    max_num_tokens: int,
    logits_rows: int,
    medusa: MedusaShape | None = None,
) -> EngineMemory:
    # whole model as HF stores it; weight-only shrinks the layer linears only
    saved = cfg.num_hidden_layers * (layer_bytes(cfg, 1, dtype) - layer_bytes(cfg, 1, dtype, weight_only))
    total = cfg.weight_bytes(dtype) - saved
    return EngineMemory(
        role=role,
        tp_size=tp,
        pp_size=pp,
        dtype=dtype,
        weight_only=weight_only,
        num_parameters=cfg.num_parameters,
        weight_bytes_total=total,
        weight_bytes=max(rank_weight_bytes(cfg, tp=tp, pp=pp, dtype=dtype, weight_only=weight_only)),
        medusa_bytes=medusa_bytes_per_rank(cfg, medusa, tp=tp, dtype=dtype) if medusa else 0,
        activation_bytes=activation_bytes(
            cfg, tp=tp, dtype=dtype, max_num_tokens=max_num_tokens, logits_rows=logits_rows
        ),
        max_num_tokens=max_num_tokens,
        kv_heads_per_gpu=kv_heads_per_rank(cfg, tp),
        kv_duplication=tp // cfg.num_key_value_heads if tp > cfg.num_key_value_heads else 1,
        kv_bytes_per_token_total=cfg.kv_bytes_per_token(dtype),
        kv_bytes_per_token=kv_bytes_per_token_per_rank(cfg, tp=tp, pp=pp, dtype=dtype),
    )


def effective_max_num_tokens(spec: BuildSpec, *, speculative_target: bool) -> int:
    """The max_num_tokens the built engine records (core/facts/trtllm.py, trtllm-build's rules); on the
    LLM-API flow the spec's value or BaseLlmArgs' default (8192), with no speculative adjustment."""
    b = spec.build
    if not spec.flow.builds_engines:
        return b.max_num_tokens or spec.flow.default_max_num_tokens
    target = method_of(spec).roles(spec)[0]
    speculative = speculative_target and target.mode.speculative
    k = target.max_draft_len if speculative else 0
    return engine_limits(
        max_batch_size=b.max_batch_size,
        max_input_len=b.max_input_len,
        max_seq_len=b.max_seq_len,
        max_num_tokens=b.max_num_tokens,
        max_draft_len=k,
        speculative=speculative,
    )["max_num_tokens"]


def plan_memory(
    spec: BuildSpec,
    *,
    target: HFModelConfig | None = None,
    draft: HFModelConfig | None = None,
    medusa: MedusaShape | None = None,
    eagle3: Eagle3Shape | None = None,
    runtime_reserve_gib: float = RUNTIME_RESERVE_GIB,
) -> MemoryPlan:
    """Plan GPU 0 of `spec`. Model configs are read from the spec's folders unless given.

    LLM-API flow: one KV pool for every model (the PyTorch backend's KvCacheCreator sizes one token as the
    target's plus the draft model's K and V, `_torch/pyexecutor/_util.py` index id 843526953), so the
    plan's `kv_fraction_total` and `kv_tokens` become kv_cache_config.free_gpu_memory_fraction and
    max_tokens; an EAGLE-3 draft adds its weights and its layers' KV to the target's GPUs."""
    roles = {r.role: r for r in method_of(spec).roles(spec)}
    draft_section = method_of(spec).draft_engine(spec)
    if target is None:
        target = HFModelConfig.from_hf(
            resolve_model(spec.target.model, base=spec.base_dir, what="target model")
        )
    if "draft" in roles and draft is None and draft_section is not None:
        draft = HFModelConfig.from_hf(
            resolve_model(draft_section.model, base=spec.base_dir, what="draft model")
        )
    heads = roles["target"].heads
    if heads is not None and medusa is None:
        medusa = MedusaShape(heads.num_heads, heads.num_layers)
    k, b = spec.speculation.max_draft_len, spec.build
    shared_mapping = spec.flow.one_kv_pool  # draft models on the target's TP/PP
    engines = [
        engine_memory(
            target,
            role="target",
            tp=spec.target.tp_size,
            pp=spec.target.pp_size,
            dtype=spec.dtype,
            weight_only=b.weight_only,
            max_num_tokens=effective_max_num_tokens(spec, speculative_target=True),
            logits_rows=b.max_batch_size * (k + 1),
            medusa=medusa if heads is not None else None,
        )
    ]
    if "draft" in roles and draft is not None and draft_section is not None:
        engines.append(
            engine_memory(
                draft,
                role="draft",
                # LLM API: the draft runs with the target's mapping (one executor, its TP/PP)
                tp=spec.target.tp_size if shared_mapping else draft_section.tp_size,
                pp=spec.target.pp_size if shared_mapping else draft_section.pp_size,
                dtype=spec.dtype,
                weight_only=b.weight_only,
                max_num_tokens=effective_max_num_tokens(spec, speculative_target=False),
                logits_rows=b.max_batch_size,
            )
        )
    if method_of(spec).one_model_draft(spec) is not None and not spec.flow.builds_engines:
        shape = eagle3 or eagle3_shape(spec, target)
        if shape is not None:
            engines.append(_eagle3_memory(spec, shape))
    return _split_kv(spec, engines, runtime_reserve_gib)


def eagle3_shape(spec: BuildSpec, target: HFModelConfig) -> Eagle3Shape | None:
    """The EAGLE-3 draft's shape from its folder (None when it cannot be read: `check` says why)."""
    try:
        folder = method_of(spec).one_model_draft(spec)
        draft = read_eagle3(resolve_model(folder, base=spec.base_dir, what="eagle3 model"))
        return eagle3_shape_read(draft, spec, target.num_hidden_layers)
    except (SpecbuildError, ValueError):
        return None


def eagle3_shape_read(draft, spec: BuildSpec, target_layers: int) -> Eagle3Shape:
    """The shape of a read EAGLE-3 draft capturing the spec's layers of a `target_layers`-layer target
    (ValueError: the capture indices do not fit the target)."""
    n = len(capture_layers(method_of(spec).capture_layers(spec), target_layers))
    return eagle3_shape_of(draft, spec, num_capture_layers=n)


def eagle3_shape_of(draft, spec: BuildSpec, *, num_capture_layers: int) -> Eagle3Shape:
    tp = spec.target.tp_size
    total, rank = eagle3_weight_bytes(draft, num_capture_layers=num_capture_layers, dtype=spec.dtype, tp=tp)
    return Eagle3Shape(
        num_parameters=draft.param_count(num_capture_layers),
        weight_bytes_total=total,
        weight_bytes=rank,
        kv_bytes_per_token_total=draft.kv_bytes_per_token(spec.dtype),
        kv_bytes_per_token=draft.kv_bytes_per_token(spec.dtype, tp=tp),
        kv_heads_per_gpu=max(1, math.ceil(draft.num_key_value_heads / tp)),
    )


def _eagle3_memory(spec: BuildSpec, shape: Eagle3Shape) -> EngineMemory:
    """The EAGLE-3 layers on the target's GPUs: weights and their KV (one-model: the target's KV pool)."""
    return EngineMemory(
        role="eagle3",
        tp_size=spec.target.tp_size,
        pp_size=1,
        dtype=spec.dtype,
        weight_only="none",
        num_parameters=shape.num_parameters,
        weight_bytes_total=shape.weight_bytes_total,
        weight_bytes=shape.weight_bytes,
        medusa_bytes=0,
        activation_bytes=0,  # runs inside the target's forward, within its activation estimate
        max_num_tokens=effective_max_num_tokens(spec, speculative_target=True),
        kv_heads_per_gpu=shape.kv_heads_per_gpu,
        kv_duplication=1,
        kv_bytes_per_token_total=shape.kv_bytes_per_token_total,
        kv_bytes_per_token=shape.kv_bytes_per_token,
    )


def _split_kv(spec: BuildSpec, engines: list[EngineMemory], reserve_gib: float) -> MemoryPlan:
    """Give every engine the same number of KV tokens and derive each one's free-memory fraction.

    F = GPU - reserve - sum(resident); budget = fraction_total * F; N = budget // sum(bytes_per_token);
    kv_i = N * bytes_per_token_i; f_i = kv_i / (F - sum_{j != i} kv_j) (engine i loading last).
    """
    gpu = int(spec.serving.gpu_memory_gb * GIB)
    reserve = int(reserve_gib * GIB)
    frac = spec.serving.kv_cache_free_gpu_mem_fraction
    free_after = gpu - reserve - sum(e.resident_bytes for e in engines)
    budget = int(frac * free_after) if free_after > 0 else 0
    tokens = budget // sum(e.kv_bytes_per_token for e in engines)
    pools = [tokens * e.kv_bytes_per_token for e in engines]
    planned = []
    for e, kv in zip(engines, pools, strict=True):
        if free_after <= 0:
            fraction = 0.0
        elif len(engines) == 1:  # one engine: the configured share as is (tokens only quantize it)
            fraction = frac
        else:
            fraction = min(1.0, kv / (free_after - (sum(pools) - kv)))
        # ceil to 4 decimals: the token cap bounds the pool, a fraction rounded down would not reach it
        planned.append(
            _replace(e, kv_fraction=min(1.0, math.ceil(fraction * 1e4) / 1e4), kv_bytes=kv, kv_tokens=tokens)
        )
    assumptions = (
        "gpu_memory_gb in GiB (2^30 bytes); planning GPU = GPU 0 (target rank 0 + draft rank 0)",
        f"runtime reserve {reserve_gib:g} GiB per GPU (CUDA context, cuBLAS/NCCL workspaces, Triton)",
        "activations ~ max_num_tokens x (4*hidden + 3*intermediate/tp) at dtype + fp32 logits",
        "each fraction is of the memory free when that engine loads, sized for loading last; with "
        "max_tokens_in_paged_kv_cache = KV tokens the split holds in either load order",
        f"kv_cache_free_gpu_mem_fraction {frac:g} = share of memory left after weights, split so both "
        "engines hold the same tokens",
        "TensorRT-LLM layout: embedding replicated, lm_head split by vocab, KV heads duplicated when tp > "
        "n_kv",
    )
    return MemoryPlan(
        gpu_memory_bytes=gpu,
        runtime_reserve_bytes=reserve,
        kv_fraction_total=frac,
        engines=tuple(planned),
        free_after_weights_bytes=free_after,
        kv_budget_bytes=budget,
        kv_tokens=tokens,
        max_seq_len=spec.build.max_seq_len,
        max_batch_size=spec.build.max_batch_size,
        assumptions=assumptions
        + (
            (
                "LLM API: one KV pool holds every model's K and V per token (KvCacheCreator); the "
                "draft model "
                "and EAGLE-3 layers use the target's TP/PP mapping",
            )
            if spec.flow.one_kv_pool
            else ()
        ),
        llmapi=spec.flow.one_kv_pool,
    )


def _replace(e: EngineMemory, **changes: Any) -> EngineMemory:
    return replace(e, **changes)
