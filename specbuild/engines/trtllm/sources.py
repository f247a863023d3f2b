"""Reading source tensors without loading whole checkpoints.

`SafetensorsSource` indexes one or many (sharded, with `model.safetensors.index.json`) safetensors
files from their headers only, then reads one tensor, or one row/column slice of it, at a time
through a memory map (`safe_open`). Each read opens and closes the map, so the pages it touched leave
the process: peak memory follows the largest tensor, not the checkpoint size.

`byte_range` gives the file offset and length of a tensor's row range (rows are contiguous in the
file), so the writer can take those bytes through a map of just that range, without a tensor.

`MemorySource` wraps an already-loaded state dict (a Medusa `medusa_lm_head.pt`) behind the same
interface. Both report dtype as a torch dtype name ("float32", "bfloat16", ...).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open

from specbuild.core.errors import CheckpointError
from specbuild.core.formats.hf_config import DTYPE_BYTES
from specbuild.core.formats.safe_io import InputFileError, read_json

FLOAT_DTYPES = tuple(DTYPE_BYTES)
_ST_DTYPES = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F64": "float64",
    "I64": "int64",
    "I32": "int32",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str  # torch dtype name
    shape: tuple[int, ...]
    offset: int | None = None  # absolute file offset of the tensor's first byte (safetensors only)


@dataclass(frozen=True)
class FileRange:
    """`nbytes` bytes at `offset` of `file`: a contiguous piece of a source tensor."""

    file: Path
    offset: int
    nbytes: int


ITEMSIZE = DTYPE_BYTES  # bytes per element of FLOAT_DTYPES


class SafetensorsSource:
    """All tensors of a model folder's *.safetensors files, by name."""

    def __init__(self, files: list[Path], *, where: str) -> None:
        self.where = where
        self.files = files
        self.index: dict[str, TensorInfo] = {}
        for f in files:
            for name, info in _read_header(f).items():
                if name in self.index:
                    raise CheckpointError(
                        f"{where}: tensor {name} appears in two files",
                        expected="each tensor in one file",
                        found=f"{self.index[name].file.name} and {f.name}",
                        fix="re-save the checkpoint",
                    )
                self.index[name] = info

    @classmethod
    def from_folder(cls, folder: Path, *, pattern: str = "*.safetensors") -> SafetensorsSource:
        folder = Path(folder)
        index_file = folder / "model.safetensors.index.json"
        if index_file.is_file():
            try:
                weight_map = read_json(index_file, what="safetensors index")["weight_map"]
                if not isinstance(weight_map, dict) or not all(
                    isinstance(v, str) for v in weight_map.values()
                ):
                    raise TypeError(f"weight_map is {type(weight_map).__name__}")
            except (InputFileError, KeyError, TypeError) as exc:
                raise CheckpointError(
                    f"{index_file} is not a safetensors index",
                    expected='{"weight_map": {tensor: file}}',
                    found=str(exc),
                    fix="re-save the checkpoint",
                ) from None
            names = sorted(set(weight_map.values()))
            for n in names:
                if Path(n).name != n:
                    raise CheckpointError(
                        f"{index_file} names a file outside the folder",
                        expected="plain file names",
                        found=n,
                        fix="re-save the checkpoint",
                    )
            files = [folder / n for n in names]
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise CheckpointError(
                    f"{folder}: shard(s) listed in the index are missing",
                    expected=", ".join(names),
                    found=f"missing: {', '.join(missing)}",
                    fix="download the missing shard files",
                )
            src = cls(files, where=str(folder))
            for name, fname in weight_map.items():
                if name in src.index and src.index[name].file.name != fname:
                    raise CheckpointError(
                        f"{index_file}: {name} is not in {fname}",
                        expected=fname,
                        found=src.index[name].file.name,
                        fix="re-save the checkpoint",
                    )
            return src
        files = sorted(folder.glob(pattern))
        if not files:
            other = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
            raise CheckpointError(
                f"{folder} has no safetensors weights",
                expected=f"{pattern} (optionally sharded with model.safetensors.index.json)",
                found=", ".join(other) if other else "no weight files",
                fix="re-save the model with save_pretrained(..., safe_serialization=True)",
            )
        return cls(files, where=str(folder))

    def names(self) -> set[str]:
        return set(self.index)

    def info(self, name: str) -> TensorInfo:
        return self.index[name]

    def byte_range(self, name: str, rows: tuple[int, int] | None = None) -> FileRange:
        """Where the tensor (or rows[0]:rows[1] of dim 0) lies in its file."""
        info = self.index[name]
        assert info.offset is not None
        row_bytes = ITEMSIZE[info.dtype]
        for d in info.shape[1:]:
            row_bytes *= d
        start, stop = rows if rows is not None else (0, info.shape[0] if info.shape else 1)
        return FileRange(info.file, info.offset + start * row_bytes, (stop - start) * row_bytes)

    def read(self, name: str, *, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None):
        """The tensor, or rows[0]:rows[1] of dim 0 / cols of dim 1, as a fresh torch tensor."""
        info = self.index[name]
        try:
            with safe_open(str(info.file), framework="pt") as f:  # mmap; closed (pages released) on exit
                sl = f.get_slice(name)
                if rows is None and cols is None:
                    return f.get_tensor(name)
                if cols is not None:
                    r = slice(*rows) if rows else slice(None)
                    return sl[r, cols[0] : cols[1]]
                return sl[rows[0] : rows[1]]
        except (SafetensorError, OSError) as exc:
            raise CheckpointError(
                f"cannot read tensor {name} from {info.file}",
                expected="a readable safetensors file",
                found=str(exc),
                fix="re-download or re-save the checkpoint",
            ) from None


class MemorySource:
    """A loaded state dict ({name: tensor}) with the SafetensorsSource interface."""

    def __init__(self, tensors: dict[str, Any], *, file: Path) -> None:
        self.where = str(file)
        self.tensors = tensors
        self.index = {
            n: TensorInfo(file, str(t.dtype).replace("torch.", ""), tuple(t.shape))
            for n, t in tensors.items()
        }

    def names(self) -> set[str]:
        return set(self.index)

    def info(self, name: str) -> TensorInfo:
        return self.index[name]

    def read(self, name: str, *, rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None):
        t = self.tensors[name]
        if cols is not None:
            t = t[:, cols[0] : cols[1]]
        if rows is not None:
            t = t[rows[0] : rows[1]]
        return t.clone()


def _read_header(path: Path) -> dict[str, TensorInfo]:
    """Names, dtypes and shapes of one safetensors file; truncated or corrupt files are errors here."""
    try:
        with safe_open(str(path), framework="pt") as f:  # validates header and data coverage
            shapes = {
                name: (f.get_slice(name).get_dtype(), tuple(f.get_slice(name).get_shape()))
                for name in f.keys()
            }
        with open(path, "rb") as fh:  # the data offsets, which safe_open does not expose
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        return {
            name: TensorInfo(path, _ST_DTYPES.get(dt, dt), shape, 8 + n + header[name]["data_offsets"][0])
            for name, (dt, shape) in shapes.items()
        }
    except (SafetensorError, OSError, ValueError, KeyError, struct.error) as exc:
        size = path.stat().st_size if path.exists() else 0
        raise CheckpointError(
            f"{path} is not a readable safetensors file (truncated or corrupt)",
            expected="an 8-byte header length, a JSON header and the full tensor data",
            found=f"{size} bytes; {exc}",
            fix="re-download or re-save this file",
        ) from None
