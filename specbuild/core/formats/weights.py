"""Which weight files a Hugging Face folder holds, and what they contain, from headers only.

A safetensors file starts with an 8-byte little-endian header length and a JSON header that names
every tensor's dtype and shape, so parameter counts and bytes come without loading any tensor (and
without torch). A sharded checkpoint lists its shards in `model.safetensors.index.json`; a shard the
index names but the folder lacks means an interrupted download.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from specbuild.core.errors import CheckpointError
from specbuild.core.formats.safe_io import InputFileError, read_json

INDEX = "model.safetensors.index.json"
TORCH_PATTERNS = ("pytorch_model*.bin",)
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
_MAX_HEADER = 100 * 2**20  # a header larger than this is not a safetensors file


@dataclass(frozen=True)
class WeightFiles:
    """Weight files of a model folder. `missing` are shards the index names that are not there."""

    folder: Path
    safetensors: tuple[Path, ...]
    torch_bins: tuple[Path, ...]
    missing: tuple[str, ...]

    @property
    def present(self) -> bool:
        return bool(self.safetensors or self.torch_bins)

    @property
    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in (*self.safetensors, *self.torch_bins))


@dataclass(frozen=True)
class WeightStats:
    num_parameters: int
    num_bytes: int
    dtypes: tuple[str, ...]  # safetensors dtype names found, e.g. ("BF16",)
    num_tensors: int


def find_weights(folder: str | Path) -> WeightFiles:
    folder = Path(folder)
    safetensors = tuple(sorted(p for p in folder.glob("*.safetensors") if p.is_file()))
    torch_bins = tuple(sorted(p for pattern in TORCH_PATTERNS for p in folder.glob(pattern) if p.is_file()))
    missing: tuple[str, ...] = ()
    index = folder / INDEX
    if index.is_file():
        try:
            weight_map = read_json(index, what="safetensors index").get("weight_map", {})
            shards = (
                {s for s in weight_map.values() if isinstance(s, str)}
                if isinstance(weight_map, dict)
                else set()
            )
        except InputFileError:
            shards = set()
        missing = tuple(sorted(s for s in shards if not (folder / s).is_file()))
    return WeightFiles(folder, safetensors, torch_bins, missing)


def safetensors_header(path: str | Path) -> dict[str, dict]:
    """name -> {"dtype", "shape", "data_offsets"} (metadata dropped)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) != 8:
                raise ValueError("shorter than 8 bytes")
            (n,) = struct.unpack("<Q", raw)
            if n > _MAX_HEADER:
                raise ValueError(f"header length {n} is implausible")
            if n > os.fstat(f.fileno()).st_size - 8:  # before read(n), which allocates n bytes
                raise ValueError(f"header length {n} runs past the end of the file")
            header = json.loads(f.read(n))
            if not isinstance(header, dict):
                raise ValueError(f"the header is a JSON {type(header).__name__}, not an object")
            for name, entry in header.items():
                if name != "__metadata__" and not _is_entry(entry):
                    raise ValueError(f"tensor {name[:80]!r} has no dtype / integer shape / data_offsets")
    except (OSError, ValueError, RecursionError) as exc:
        raise CheckpointError(
            f"cannot read the safetensors header of {path}",
            expected="a safetensors file (8-byte length + JSON header)",
            found=str(exc),
            fix="re-download the file; a truncated download leaves a broken header",
        ) from None
    return {k: v for k, v in header.items() if k != "__metadata__"}


def _is_entry(entry: object) -> bool:
    """A tensor's header entry: {"dtype": str, "shape": [int, ...], "data_offsets": [int, int]}."""

    def ints(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)

    return (
        isinstance(entry, dict)
        and isinstance(entry.get("dtype"), str)
        and ints(entry.get("shape"))
        and ints(entry.get("data_offsets"))
        and len(entry["data_offsets"]) == 2
    )


def safetensors_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v["shape"]) for k, v in safetensors_header(path).items()}


def weight_stats(files: WeightFiles) -> WeightStats | None:
    """Parameters and bytes of the safetensors files (None when there are none)."""
    if not files.safetensors:
        return None
    params = nbytes = count = 0
    dtypes: set[str] = set()
    for path in files.safetensors:
        for meta in safetensors_header(path).values():
            n = math.prod(meta["shape"])
            params += n
            nbytes += n * SAFETENSORS_DTYPE_BYTES.get(meta["dtype"], 0)
            dtypes.add(meta["dtype"])
            count += 1
    return WeightStats(params, nbytes, tuple(sorted(dtypes)), count)
