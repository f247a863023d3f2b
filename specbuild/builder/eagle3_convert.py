"""`specbuild eagle3 convert`: an EAGLE-3 draft folder from one checkpoint format to the other.

HF layout (core/formats/eagle3.py) <-> speculators (core/formats/eagle3_speculators.py). Tensors keep
their bytes, dtype and shape (a round trip is byte-exact): only the decoder layer's names change
(`midlayer.*` <-> `layers.0.*`). The config is rewritten, and the aux-layer ids are converted explicitly:
the HF folder carries them as specbuild / SGLang / TensorRT-LLM ids (i = the output of target layer i)
in `eagle_config` plus vLLM's numbering at the top level; speculators carries vLLM's numbering (0 = the
embedding) at the top level only. What one format records and the other cannot (the speculators
verifier and speculative_tokens) goes into the output's specbuild.json. The output folder is written
whole or not at all, and never over the input (manifest.atomic_output_dir).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from safetensors.torch import save_file

from specbuild.builder.resolve import resolve_model
from specbuild.core.errors import CheckpointError, SpecbuildError
from specbuild.core.formats.eagle3 import FC, LAYER_TENSORS, NORM, to_vllm_ids
from specbuild.core.formats.eagle3_speculators import (
    DEFAULT_SPECULATIVE_TOKENS,
    FORMATS,
    DraftFolder,
    Verifier,
    read_draft_folder,
    tensor_name,
    to_speculators,
)
from specbuild.core.formats.manifest import atomic_output_dir, write_manifest
from specbuild.core.formats.safe_io import read_json
from specbuild.engines.reference.eagle3 import read_draft_tensors

MANIFEST_KIND = "eagle3_draft"  # the kind train-eagle3 writes too
WEIGHTS = "model.safetensors"
TOKENIZER_FILES = (  # copied as they are when the draft folder ships a tokenizer
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)


@dataclass(frozen=True)
class Conversion:
    out: Path
    source_format: str
    format: str
    renamed: int  # tensors whose name changed
    tensors: int
    aux_layers: tuple[int, ...] | None  # specbuild's convention (None: the engines' default)


def convert_eagle3(
    draft: str | Path,
    out: str | Path,
    *,
    to: str,
    verifier: str | None = None,
    speculative_tokens: int | None = None,
    force: bool = False,
) -> Conversion:
    """Write `draft` (either format) into `out` in format `to` ("hf" | "speculators")."""
    if to not in FORMATS:
        raise CheckpointError(
            f"unknown EAGLE-3 checkpoint format {to!r}",
            expected=" | ".join(FORMATS),
            found=to,
            fix="pass --to hf or --to speculators",
        )
    src = resolve_model(draft, what="EAGLE-3 draft")
    source = read_draft_folder(src)
    if source.format == to:
        raise CheckpointError(
            f"{src} is already in the {to} format",
            expected=f"a draft in the {'speculators' if to == 'hf' else 'hf'} format",
            found=f"{source.format} (config.json)",
            fix="copy the folder as it is, or pick the other --to",
        )
    config = _target_config(source, to, verifier, speculative_tokens)
    tensors, metadata = read_draft_tensors(src)
    n = source.config.num_hidden_layers
    renamed = {tensor_name(k, to=to, num_layers=n): v for k, v in tensors.items()}
    if len(renamed) != len(tensors):
        raise CheckpointError(
            f"{src}: the weights hold the decoder layer under both names",
            expected="`midlayer.*` or `layers.0.*`, not both",
            found=", ".join(sorted(k for k in tensors if k.startswith(("midlayer.", "layers.")))[:4]),
            fix="keep the tensors the draft was trained with and delete the other copy",
        )
    _require(renamed, to, n, where=str(src))
    with atomic_output_dir(out, force=force, inputs={"DRAFT": src}) as tmp:
        save_file(renamed, str(tmp / WEIGHTS), metadata=metadata)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name in TOKENIZER_FILES:
            if (src / name).is_file():
                shutil.copyfile(src / name, tmp / name)
        write_manifest(
            tmp,
            kind=MANIFEST_KIND,
            format=to,
            converted_from={"path": str(src), "format": source.format},
            aux_layers=list(source.config.aux_layers) if source.config.aux_layers is not None else None,
            verifier=source.verifier.name_or_path if source.verifier else verifier,
            speculative_tokens=source.speculative_tokens,
        )
    changed = sum(1 for k in tensors if tensor_name(k, to=to, num_layers=n) != k)
    return Conversion(Path(out), source.format, to, changed, len(tensors), source.config.aux_layers)


def _target_config(
    source: DraftFolder, to: str, verifier: str | None, speculative_tokens: int | None
) -> dict:
    if to == "hf":
        if verifier or speculative_tokens:
            raise CheckpointError(
                "--verifier and --speculative-tokens describe a speculators checkpoint",
                expected="them with --to speculators only (the HF layout has no place for them)",
                found=f"--to hf with --verifier {verifier}"
                if verifier
                else "--to hf with --speculative-tokens",
                fix="leave them out; the source's values are kept in the output's specbuild.json",
            )
        return source.config.to_hf()
    if not verifier:
        raise CheckpointError(
            "a speculators checkpoint names its verifier (the target the draft was trained for)",
            expected="--verifier TARGET: its hub id (what `vllm serve DRAFT` loads) or its folder",
            found="no --verifier",
            fix="pass --verifier with the target model's hub id or folder",
        )
    return to_speculators(
        source.config,
        verifier=Verifier(verifier, _architectures(verifier)),
        speculative_tokens=speculative_tokens or DEFAULT_SPECULATIVE_TOKENS,
    )


def _architectures(verifier: str) -> tuple[str, ...]:
    """The verifier's architectures from its config.json when it is a folder (or cached hub id) here;
    () when it cannot be read (speculators writes [] then too)."""
    try:
        raw = read_json(resolve_model(verifier, what="verifier") / "config.json", what="verifier config")
    except SpecbuildError:
        return ()
    return tuple(str(a) for a in raw.get("architectures") or ())


def _require(tensors: dict, to: str, num_layers: int, *, where: str) -> None:
    """The tensors every EAGLE-3 draft has (fc, norm, each decoder layer), under format `to`'s names."""
    layers = [
        tensor_name(f"layers.{i}.{t}", to=to, num_layers=num_layers) if to == "hf" else f"layers.{i}.{t}"
        for i in range(num_layers)
        for t in LAYER_TENSORS
    ]
    missing = [k for k in (FC, NORM, *layers) if k not in tensors and f"model.{k}" not in tensors]
    if missing:
        raise CheckpointError(
            f"{where}: the weights are not an EAGLE-3 draft of its config",
            expected=f"fc.weight, norm.weight, {num_layers} decoder layer(s) of {len(LAYER_TENSORS)} tensors",
            found="missing " + ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else ""),
            fix="check the folder holds the draft's complete weights",
        )


def describe(c: Conversion) -> str:
    ids = (
        f"aux layers {list(c.aux_layers)} (layer outputs; vLLM / speculators ids "
        f"{list(to_vllm_ids(c.aux_layers))})"
        if c.aux_layers is not None
        else "no aux-layer ids (every engine's default: the same three layers)"
    )
    return (
        f"{c.source_format} -> {c.format}: {c.tensors} tensors ({c.renamed} renamed, bytes unchanged), "
        f"{ids}; wrote {c.out}"
    )
