"""`specbuild inspect MODEL`: what a checkpoint is, from config.json, weight headers and tokenizer files.

Nothing is loaded into memory: the parameter count comes from the config shapes and, when weights are
present, from the safetensors headers too (the two must agree for a Llama-family checkpoint).
A Medusa heads folder (config.json with medusa_num_heads) and an EAGLE-3 draft (HF layout or speculators
format, core/formats/eagle3_speculators.py) are recognised and described as such.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specbuild.builder.memory_plan import GIB
from specbuild.builder.resolve import resolve_model
from specbuild.builder.tokenizer_compare import TokenizerInfo, read_tokenizer
from specbuild.core.errors import CheckpointError
from specbuild.core.formats.eagle3 import ARCHITECTURE as EAGLE3_ARCHITECTURE
from specbuild.core.formats.eagle3 import to_vllm_ids
from specbuild.core.formats.eagle3_speculators import is_speculators, read_draft_folder
from specbuild.core.formats.hf_config import HFModelConfig
from specbuild.core.formats.medusa_heads import read_medusa_heads
from specbuild.core.formats.safe_io import InputFileError, read_json
from specbuild.core.formats.weights import WeightFiles, WeightStats, find_weights, weight_stats
from specbuild.engines.trtllm.finite import scan_safetensors


@dataclass(frozen=True)
class ModelInspection:
    folder: Path
    config: HFModelConfig | None  # None for a Medusa heads folder
    weights: WeightFiles
    stats: WeightStats | None  # from safetensors headers, when present
    tokenizer: TokenizerInfo | None
    medusa: dict[str, Any] | None = None  # heads summary when the folder holds Medusa heads
    eagle3: dict[str, Any] | None = None  # draft summary when the folder holds an EAGLE-3 draft
    nonfinite: dict[str, int] | None = None  # --check-values: {tensor: NaN/Inf count}; None when not scanned

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"folder": str(self.folder)}
        if self.config is not None:
            c = self.config
            out["config"] = c.to_dict()
            out.update(
                family=c.family,
                supported=c.supported,
                head_dim=c.head_dim,
                num_parameters=c.num_parameters,
                weight_bytes=c.weight_bytes(),
                kv_bytes_per_token=c.kv_bytes_per_token(),
            )
        out["weights"] = {
            "present": self.weights.present,
            "files": [p.name for p in (*self.weights.safetensors, *self.weights.torch_bins)],
            "missing_shards": list(self.weights.missing),
            "disk_bytes": self.weights.disk_bytes,
            "num_parameters": self.stats.num_parameters if self.stats else None,
            "num_bytes": self.stats.num_bytes if self.stats else None,
            "dtypes": list(self.stats.dtypes) if self.stats else None,
        }
        out["tokenizer"] = self.tokenizer.summary() if self.tokenizer else None
        if self.medusa is not None:
            out["medusa"] = self.medusa
        if self.eagle3 is not None:
            out["eagle3"] = self.eagle3
        if self.nonfinite is not None:
            out["nonfinite_tensors"] = self.nonfinite
        return out

    def rows(self) -> list[tuple[str, str]]:
        """(field, value) pairs for the table."""
        rows: list[tuple[str, str]] = [("folder", str(self.folder))]
        if self.config is not None:
            c = self.config
            rope = f"theta {c.rope_theta:g}"
            if c.rope_scaling:
                rope += ", " + ", ".join(f"{k} {v}" for k, v in c.rope_scaling.items())
            rows += [
                ("architecture", f"{c.architecture} ({c.family or 'unsupported'})"),
                ("layers", str(c.num_hidden_layers)),
                ("hidden size", str(c.hidden_size)),
                ("intermediate size", str(c.intermediate_size)),
                (
                    "heads / KV heads",
                    f"{c.num_attention_heads} / {c.num_key_value_heads}"
                    + (" (GQA)" if c.num_key_value_heads < c.num_attention_heads else ""),
                ),
                ("head dim", str(c.head_dim)),
                ("vocab", str(c.vocab_size)),
                ("max positions", str(c.max_position_embeddings)),
                ("rope", rope),
                ("tied embeddings", str(c.tie_word_embeddings).lower()),
                ("qkv bias", str(c.attention_bias).lower()),
                ("dtype", c.dtype),
                ("parameters", f"{c.num_parameters:,} ({c.num_parameters / 1e9:.2f} B)"),
                ("bytes", f"{c.weight_bytes():,} ({c.weight_bytes() / GIB:.2f} GiB at {c.dtype})"),
                ("KV bytes / token", f"{c.kv_bytes_per_token():,} at {c.dtype}"),
            ]
        if self.medusa is not None:
            rows += [(f"medusa {k}", str(v)) for k, v in self.medusa.items()]
        if self.eagle3 is not None:
            rows += [(f"eagle3 {k}", str(v)) for k, v in self.eagle3.items()]
        if self.weights.missing:
            rows.append(
                ("weights", f"{len(self.weights.missing)} shard(s) missing, e.g. {self.weights.missing[0]}")
            )
        elif not self.weights.present:
            rows.append(("weights", "absent (config only)"))
        else:
            n = len(self.weights.safetensors) + len(self.weights.torch_bins)
            text = f"{n} file(s), {self.weights.disk_bytes / GIB:.2f} GiB on disk"
            if self.stats:
                text += (
                    f"; headers: {self.stats.num_parameters:,} parameters in {self.stats.num_tensors} "
                    f"tensors, {'/'.join(self.stats.dtypes)}"
                )
            rows.append(("weights", text))
        if self.nonfinite is not None:
            bad = self.nonfinite
            rows.append(
                (
                    "values",
                    "all finite"
                    if not bad
                    else f"{len(bad)} tensor(s) hold NaN/Inf: "
                    + ", ".join(f"{k} ({v})" for k, v in list(bad.items())[:10])
                    + (" ..." if len(bad) > 10 else "")
                    + "; `specbuild convert` refuses them",
                )
            )
        t = self.tokenizer
        if t is None:
            rows.append(("tokenizer", "absent (no tokenizer.json / tokenizer.model)"))
        else:
            rows.append(
                (
                    "tokenizer",
                    f"{t.class_name or '?'} ({t.model_type or t.source}), {t.vocab_size} ids, "
                    f"{len(t.merges)} merges, {len(t.added)} added",
                )
            )
            specials = ", ".join(
                f"{k.removesuffix('_token')} {tok!r}={i}" for k, (tok, i) in t.special.items()
            )
            rows.append(("special tokens", specials or "none"))
        return rows


def inspect_model(
    ref: str | Path, *, base: Path | None = None, check_values: bool = False
) -> ModelInspection:
    folder = resolve_model(ref, base=base)
    raw = {}
    if (folder / "config.json").is_file():
        try:
            raw = read_json(folder / "config.json", what="config.json")
        except InputFileError as exc:
            raise CheckpointError(
                exc.what, expected=exc.expected, found=exc.found, fix="re-download or re-save the config"
            ) from None
    medusa = eagle3 = None
    if "architectures" not in raw and ("medusa_num_heads" in raw or "num_medusa_heads" in raw):
        medusa = _medusa_summary(folder)
        config = None
    elif is_eagle3_draft(raw):
        eagle3 = _eagle3_summary(folder)
        config = None
    else:
        config = HFModelConfig.from_hf(folder)
    weights = find_weights(folder)
    stats = weight_stats(weights)  # reads (and size-checks) every header first
    nonfinite = None
    if check_values:
        nonfinite = {}
        for path in weights.safetensors:
            nonfinite.update({f"{path.name}:{k}": v for k, v in scan_safetensors(path).items()})
    return ModelInspection(
        folder,
        config,
        weights,
        stats,
        read_tokenizer(folder),
        medusa=medusa,
        nonfinite=nonfinite,
        eagle3=eagle3,
    )


def is_eagle3_draft(raw: dict[str, Any]) -> bool:
    """An EAGLE-3 draft's config.json: speculators, the HF layout's architecture, or a published
    `LlamaForCausalLM` draft (one layer with a draft_vocab_size or eagle_config)."""
    arch = (raw.get("architectures") or [None])[0]
    one_layer_eagle = raw.get("num_hidden_layers") == 1 and (
        "draft_vocab_size" in raw or "eagle_config" in raw
    )
    return is_speculators(raw) or arch == EAGLE3_ARCHITECTURE or one_layer_eagle


def _eagle3_summary(folder: Path) -> dict[str, Any]:
    found = read_draft_folder(folder)
    c = found.config
    layers = (
        f"{list(c.aux_layers)} (layer outputs, eagle_config / TensorRT-LLM / SGLang); vLLM / speculators ids "
        f"{list(to_vllm_ids(c.aux_layers))}"
        if c.aux_layers is not None
        else "not named: every engine's default (TensorRT-LLM 1, L//2-1, L-4)"
    )
    out: dict[str, Any] = {
        "format": "speculators" if found.format == "speculators" else "HF layout",
        "architecture": c.architecture if found.format == "hf" else found.raw.get("architectures"),
        "draft layers": c.num_hidden_layers,
        "hidden / target hidden": f"{c.hidden_size} / {c.target_hidden_size}",
        "heads / KV heads / head dim": f"{c.num_attention_heads} / {c.num_key_value_heads} / {c.head_dim}",
        "vocab / draft vocab": f"{c.vocab_size} / {c.draft_vocab_size}",
        "aux layers": layers,
        "norm flags": ", ".join(c.norm_flags) or "none",
        "dtype": c.dtype,
    }
    if found.verifier is not None:
        archs = found.verifier.architectures
        out["verifier"] = f"{found.verifier.name_or_path}" + (f" {list(archs)}" if archs else "")
        out["speculative tokens"] = found.speculative_tokens
    return out


def _medusa_summary(folder: Path) -> dict[str, Any]:
    info = read_medusa_heads(folder)
    return {
        "config heads x layers": f"{info.config_num_heads} x {info.config_num_layers}",
        "weights": info.weights_file.name if info.weights_file else "absent (config only)",
        "heads x layers (weights)": f"{info.num_heads} x {info.num_layers}" if info.weights_file else "-",
        "hidden / vocab": f"{info.hidden_size or info.config_hidden_size} / "
        f"{info.vocab_size or info.config_vocab_size}",
        "problems": "; ".join(info.problems) or "none",
    }
