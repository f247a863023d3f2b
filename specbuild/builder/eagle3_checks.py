"""`specbuild check` rows for an EAGLE-3 draft checkpoint, and its shape for the memory plan.

What TensorRT-LLM's PyTorch backend builds from an EAGLE-3 folder (`tensorrt_llm/_torch/models/
modeling_speculative.py`, index id 57359121401, the 2026 registry-based version; the 1.2.0rc2 file
@b35ac1b6 has the same modules): with `eagle3_model_arch` "llama3" the draft's config.json is read as a
LlamaConfig whatever its `architectures` say, and `Eagle3ForCausalLM` holds
* `midlayer` (one `Eagle3DecoderLayer` per `num_hidden_layers`; checkpoints saying `layers.N.*` are
  renamed): attention whose qkv input is [embeddings | hidden] = 2 x hidden_size, a gated MLP of
  `intermediate_size`, and three RMSNorms;
* `fc` [hidden_size, hidden_size_in x num_capture_layers] when more than one target layer is captured,
  where hidden_size_in = `target_hidden_size` if the config has it, else `hidden_size`: the captured
  target hidden states must have that width;
* `norm`, and `lm_head` over `draft_vocab_size` tokens (a missing `draft_vocab_size` defaults to
  `vocab_size` with a warning); without `lm_head` in the checkpoint the target's is used
  (`load_lm_head_from_target`), which only fits a draft over the full vocabulary;
* `d2t` int [draft_vocab_size] when draft_vocab_size != vocab_size: target_id = draft_id + d2t[draft_id];
* `embed_tokens` only when hidden_size_in != hidden_size; otherwise the target's embedding is shared,
  so `vocab_size` must be the target's.
The captured layers default to (1, L//2 - 1, L - 4) of an L-layer target, its one layer for L = 1, and
need explicit ids for L = 2..5 (`Eagle3SpecMetadata`, `_torch/speculative/eagle3.py` @f933a608;
core/formats/eagle3.py default_aux_layers is the one home); their count sizes `fc`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from specbuild.builder.check_rows import FAIL, PASS, WARN, CheckResult, LoadedModel, short_path
from specbuild.builder.eagle3_import_rows import format_row, tokenizer_row, trained_layers_row
from specbuild.builder.resolve import resolve_model
from specbuild.core.errors import CheckpointError, SpecbuildError
from specbuild.core.formats.eagle3 import default_aux_layers
from specbuild.core.formats.eagle3_speculators import read_draft_folder
from specbuild.core.formats.hf_config import DTYPE_BYTES, HFModelConfig
from specbuild.core.formats.weights import SAFETENSORS_DTYPE_BYTES, find_weights, safetensors_header
from specbuild.core.spec import ModelSection

D2T = "d2t"


@dataclass(frozen=True)
class Eagle3Draft:
    """An EAGLE-3 draft checkpoint as TensorRT-LLM reads it (config.json + safetensors headers)."""

    folder: Path
    hidden_size: int
    hidden_size_in: int  # target_hidden_size, else hidden_size: the width of the captured hidden states
    vocab_size: int
    draft_vocab_size: int
    draft_vocab_size_given: bool  # False: TensorRT-LLM defaults it to vocab_size (with a warning)
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    dtype: str
    architecture: str
    tensors: dict[str, tuple[tuple[int, ...], str]]  # name -> (shape, safetensors dtype); {} without weights
    tensor_files: dict[str, Path]  # name -> the file holding it
    format: str = "hf"  # "hf" | "speculators"
    aux_layers: tuple[int, ...] | None = None  # the config's ids, specbuild's convention (None: not named)
    norm_flags: tuple[str, ...] = ()
    verifier: str | None = None  # speculators_config.verifier.name_or_path

    @property
    def has_weights(self) -> bool:
        return bool(self.tensors)

    def shape(self, name: str) -> tuple[int, ...] | None:
        found = self.tensors.get(name) or self.tensors.get(f"model.{name}")
        return found[0] if found else None

    @property
    def has_lm_head(self) -> bool:
        return any("lm_head" in name for name in self.tensors)

    def layer_params(self) -> int:
        """Parameters of the draft decoder layers (from the config)."""
        h, hd = self.hidden_size, self.head_dim
        q, kv = self.num_attention_heads * hd, self.num_key_value_heads * hd
        attn = (q + 2 * kv) * 2 * h + h * q  # qkv over [embeds | hidden] = 2h, o_proj
        mlp = 3 * h * self.intermediate_size
        return self.num_hidden_layers * (attn + mlp + 3 * h)

    def param_count(self, num_capture_layers: int) -> int:
        """All parameters TensorRT-LLM allocates for the draft (lm_head included, shared embedding not)."""
        fc = self.hidden_size * self.hidden_size_in * num_capture_layers if num_capture_layers > 1 else 0
        embed = self.vocab_size * self.hidden_size if self.hidden_size_in != self.hidden_size else 0
        return self.layer_params() + fc + self.hidden_size + self.draft_vocab_size * self.hidden_size + embed

    def kv_bytes_per_token(self, dtype: str, *, tp: int = 1) -> int:
        """K and V of the draft layers for one token on one TP rank (KV heads duplicated when tp > n_kv)."""
        heads = max(1, math.ceil(self.num_key_value_heads / tp))
        return 2 * self.num_hidden_layers * heads * self.head_dim * DTYPE_BYTES[dtype]


def read_eagle3(folder: Path) -> Eagle3Draft:
    """Read an EAGLE-3 folder's config.json (HF layout or speculators, core/formats/eagle3_speculators.py)
    and (when present) its safetensors headers."""
    found = read_draft_folder(folder)
    c = found.config
    given = found.raw.get("draft_vocab_size")  # top level in both formats
    tensors: dict[str, tuple[tuple[int, ...], str]] = {}
    files: dict[str, Path] = {}
    for path in find_weights(folder).safetensors:
        for name, meta in safetensors_header(path).items():
            tensors[name] = (tuple(meta["shape"]), str(meta["dtype"]))
            files[name] = path
    return Eagle3Draft(
        folder=folder,
        hidden_size=c.hidden_size,
        hidden_size_in=c.target_hidden_size,
        vocab_size=c.vocab_size,
        draft_vocab_size=c.draft_vocab_size,
        draft_vocab_size_given=isinstance(given, int) and not isinstance(given, bool) and given > 0,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        intermediate_size=c.intermediate_size,
        dtype=c.dtype,
        architecture=str((found.raw.get("architectures") or [c.architecture])[0]),
        tensors=tensors,
        tensor_files=files,
        format=found.format,
        aux_layers=c.aux_layers,
        norm_flags=c.norm_flags,
        verifier=found.verifier.name_or_path if found.verifier else None,
    )


def capture_layers(spec_layers: Any, target_layers: int) -> tuple[int, ...]:
    """The target layers whose hidden states feed the draft: the spec's, else TensorRT-LLM's default
    (core/formats/eagle3.py default_aux_layers: its one layer for a 1-layer target, (1, L//2 - 1, L - 4)
    above 5 layers; ValueError for 2..5 layers, as Eagle3SpecMetadata raises)."""
    if spec_layers is not None:
        return tuple(spec_layers)
    try:
        return default_aux_layers(target_layers)
    except CheckpointError:
        raise ValueError(
            f"Not enough hidden layers for default EAGLE3 capture ({target_layers} layers)"
        ) from None


def load_eagle3(spec, out: list[CheckResult]) -> Eagle3Draft | None:
    try:
        folder = resolve_model(spec.eagle3.model, base=spec.base_dir, what="eagle3 model")
    except SpecbuildError as exc:
        out.append(CheckResult("eagle3: draft", FAIL, f"{exc.what} ({exc.found})", exc.fix or ""))
        return None
    return load_eagle3_folder(folder, out)


def load_eagle3_folder(folder: Path, out: list[CheckResult]) -> Eagle3Draft | None:
    """The draft row (and the format row of a speculators folder); None when the draft is unreadable."""
    try:
        draft = read_eagle3(folder)
    except SpecbuildError as exc:
        out.append(CheckResult("eagle3: draft", FAIL, f"{exc.what} ({exc.found})", exc.fix or ""))
        return None
    weights = (
        f"{len(draft.tensors)} tensors in {len({str(p) for p in draft.tensor_files.values()})} file(s)"
        if draft.has_weights
        else "config.json only (the weight checks below need the safetensors)"
    )
    layout = "speculators format" if draft.format == "speculators" else "HF layout"
    verifier = f", verifier {draft.verifier}" if draft.verifier else ""
    out.append(
        CheckResult(
            "eagle3: draft",
            PASS if draft.has_weights else WARN,
            f"{short_path(folder)}: {draft.architecture} ({layout}{verifier}), {draft.num_hidden_layers} "
            f"draft layer(s), hidden {draft.hidden_size}, {weights}",
            "" if draft.has_weights else "download the EAGLE-3 weights before serving",
        )
    )
    if draft.format == "speculators":
        out.append(format_row(draft))
    return draft


def check_eagle3(spec, target: LoadedModel | None, draft: Eagle3Draft, out: list[CheckResult]) -> None:
    """Hidden size, vocabulary (draft_vocab_size, d2t, lm_head) and captured layers against the target."""
    check_against(spec.eagle3.layers_to_capture, target, draft, out)


def check_draft_folder(draft: str | Path, target: str | Path, *, layers_to_capture=None) -> list[CheckResult]:
    """`check`'s EAGLE-3 rows for a draft folder and a target without a spec (`inspect DRAFT --target`);
    `layers_to_capture` as eagle3.layers_to_capture (None: TensorRT-LLM's default)."""
    out: list[CheckResult] = []
    head = load_eagle3_folder(resolve_model(draft, what="EAGLE-3 draft"), out)
    folder = resolve_model(target, what="target model")
    loaded = LoadedModel(
        "target", ModelSection(str(target)), folder, HFModelConfig.from_hf(folder), find_weights(folder)
    )
    if head is not None:
        check_against(layers_to_capture, loaded, head, out)
    return out


def check_against(given, target: LoadedModel | None, draft: Eagle3Draft, out: list[CheckResult]) -> None:
    """check_eagle3 with the spec's eagle3.layers_to_capture (`given`) only."""
    if target is None:
        out.append(
            CheckResult(
                "eagle3: against the target", FAIL, "the target's config could not be read", "fix the target"
            )
        )
        return
    t = target.config
    out.append(_hidden_row(draft, t.hidden_size))
    out.append(_vocab_row(draft, t.vocab_size))
    out.append(tokenizer_row(draft, target))
    out.append(_capture_row(given, draft, t.num_hidden_layers, t.hidden_size))


def _hidden_row(draft: Eagle3Draft, target_hidden: int) -> CheckResult:
    name = "eagle3: hidden size"
    source = "target_hidden_size" if draft.hidden_size_in != draft.hidden_size else "hidden_size"
    if draft.hidden_size_in != target_hidden:
        return CheckResult(
            name,
            FAIL,
            f"the draft reads hidden states of width {draft.hidden_size_in} ({source}), the target's "
            f"hidden_size is {target_hidden}",
            "use the EAGLE-3 draft trained for this target (or set target_hidden_size in its config.json)",
        )
    extra = "" if source == "hidden_size" else f", draft layers {draft.hidden_size} wide (own embedding)"
    return CheckResult(name, PASS, f"captured hidden states {target_hidden} wide = the target's{extra}")


def _vocab_row(draft: Eagle3Draft, target_vocab: int) -> CheckResult:
    name = "eagle3: vocabulary"
    dv, v = draft.draft_vocab_size, draft.vocab_size
    if v != target_vocab:
        return CheckResult(
            name,
            FAIL,
            f"draft vocab_size {v}, target vocab_size {target_vocab} (the draft shares the target's "
            "embedding and maps its ids into the target's)",
            "use the EAGLE-3 draft trained for this target's tokenizer",
        )
    if dv > v:
        return CheckResult(
            name, FAIL, f"draft_vocab_size {dv} > vocab_size {v}", "fix draft_vocab_size in config.json"
        )
    note = (
        "" if draft.draft_vocab_size_given else " (draft_vocab_size missing: TensorRT-LLM takes vocab_size)"
    )
    if not draft.has_weights:
        return CheckResult(
            name,
            WARN,
            f"draft vocabulary {dv} of {v} tokens{note}; d2t and lm_head not checked (no weights)",
            "download the weights and re-run check",
        )
    lm_head = next((draft.tensors[k][0] for k in draft.tensors if "lm_head" in k), None)
    if lm_head is None and dv != target_vocab:
        return CheckResult(
            name,
            FAIL,
            f"no lm_head in the checkpoint: TensorRT-LLM would use the target's [{target_vocab}, "
            "hidden] head "
            f"for a draft vocabulary of {dv}",
            "use a checkpoint that ships its lm_head",
        )
    if lm_head is not None and tuple(lm_head) != (dv, draft.hidden_size):
        return CheckResult(
            name,
            FAIL,
            f"lm_head {list(lm_head)}, expected [{dv}, {draft.hidden_size}] (draft_vocab_size x hidden_size)",
            "fix draft_vocab_size / hidden_size in config.json to match the weights",
        )
    if dv == v and draft.shape(D2T) is not None:
        # vLLM 0.33.0 llama_eagle3.py creates draft_id_to_target_id only when draft_vocab_size differs
        # from the target's, yet loads a checkpoint's d2t into that name: its AutoWeightsLoader
        # (models/utils.py) then raises "There is no module or parameter named ..." (read, not run)
        return CheckResult(
            name,
            WARN,
            f"full vocabulary ({v} tokens) with a d2t tensor: vLLM 0.33.0 has no parameter for it and "
            "refuses the checkpoint",
            "for vLLM, save the weights without d2t and t2d (a full vocabulary needs no map)",
        )
    if dv == v:
        return CheckResult(name, PASS, f"full vocabulary ({v} tokens), no d2t map needed{note}")
    shape = draft.shape(D2T)
    if shape is None:
        return CheckResult(
            name,
            FAIL,
            f"draft_vocab_size {dv} < vocab_size {v} but the checkpoint has no d2t tensor",
            "use the checkpoint's d2t (draft-to-target offsets, int [draft_vocab_size]); t2d is not used",
        )
    if tuple(shape) != (dv,):
        return CheckResult(name, FAIL, f"d2t has shape {list(shape)}, expected [{dv}]", "fix the checkpoint")
    bad = _d2t_out_of_range(draft, v)
    if bad:
        return CheckResult(
            name,
            FAIL,
            f"d2t maps {bad} draft ids outside the target vocabulary [0, {v}) (target = draft + d2t[draft])",
            "the d2t tensor belongs to another tokenizer or stores absolute ids; re-export it",
        )
    return CheckResult(name, PASS, f"draft vocabulary {dv} of {v} tokens; d2t [{dv}] maps into [0, {v})")


def _d2t_out_of_range(draft: Eagle3Draft, vocab: int) -> int:
    """How many draft ids d2t sends outside [0, vocab) (reads only the d2t tensor)."""
    name = D2T if D2T in draft.tensors else f"model.{D2T}"
    with safe_open(str(draft.tensor_files[name]), framework="numpy") as f:
        offsets = np.asarray(f.get_tensor(name)).astype(np.int64).reshape(-1)  # [draft_vocab_size]
    target = np.arange(offsets.size, dtype=np.int64) + offsets
    return int(((target < 0) | (target >= vocab)).sum())


def _capture_row(given_layers, draft: Eagle3Draft, target_layers: int, target_hidden: int) -> CheckResult:
    name = "eagle3: layers captured"
    try:
        default = capture_layers(None, target_layers)
    except ValueError:
        default = None
    bad = trained_layers_row(given_layers, draft, target_layers, default)
    if bad is not None:
        return bad
    try:
        layers = capture_layers(given_layers, target_layers)
    except ValueError as exc:
        return CheckResult(name, FAIL, str(exc), "set eagle3.layers_to_capture explicitly")
    outside = [i for i in layers if not (-1 <= i < target_layers)]
    if outside:
        return CheckResult(
            name,
            FAIL,
            f"layers {outside} do not exist in the {target_layers}-layer target",
            f"use indices in 0..{target_layers - 1} (or -1 for the last layer)",
        )
    given = "eagle3.layers_to_capture" if given_layers is not None else "default"
    n = len(layers)
    fc = draft.shape("fc.weight")
    if draft.has_weights:
        if n > 1 and fc is None:
            return CheckResult(
                name,
                FAIL,
                f"{n} captured layers need an fc layer, the checkpoint has no fc.weight",
                "capture one layer, or use a checkpoint with fc",
            )
        want = (draft.hidden_size, draft.hidden_size_in * n)
        if n > 1 and tuple(fc) != want:
            trained = fc[1] // draft.hidden_size_in if fc[1] % draft.hidden_size_in == 0 else "?"
            return CheckResult(
                name,
                FAIL,
                f"fc.weight {list(fc)} fuses {trained} layers, the spec captures {n} ({given}: "
                f"{list(layers)})",
                f"set eagle3.layers_to_capture to the {trained} layers the draft was trained on",
            )
    return CheckResult(
        name,
        PASS if draft.has_weights else WARN,
        f"{n} target layers {list(layers)} ({given}) -> fc [{draft.hidden_size}, {target_hidden * n}]",
        "" if draft.has_weights else "fc not checked (no weights)",
    )


def eagle3_weight_bytes(
    draft: Eagle3Draft, *, num_capture_layers: int, dtype: str, tp: int
) -> tuple[int, int]:
    """(whole draft, largest rank) bytes: from the safetensors headers when present, else the config.
    Rank estimate: the decoder layers and lm_head split over TP, fc and the norms replicated."""
    if draft.has_weights:
        total = sum(
            math.prod(shape) * SAFETENSORS_DTYPE_BYTES.get(kind, DTYPE_BYTES[dtype])
            for shape, kind in draft.tensors.values()
        )
    else:
        total = draft.param_count(num_capture_layers) * DTYPE_BYTES[dtype]
    b = DTYPE_BYTES[dtype]
    fc = draft.hidden_size * draft.hidden_size_in * num_capture_layers * b if num_capture_layers > 1 else 0
    return total, fc + math.ceil((total - fc) / tp)
