"""A streaming safetensors writer: header first (all shapes are known from the plan), then tensors one
at a time, so a rank file never has to sit in memory as a whole.

File format (safetensors): u64 little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}} padded with spaces to a
multiple of 8, then the tensors' bytes back to back in header order (offsets relative to the data
start, contiguous, no gaps). `safetensors.safe_open` / `load_file` read it like any other file.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from specbuild.errors import ConversionError

ST_DTYPE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str  # torch dtype name
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = ITEMSIZE[self.dtype]
        for d in self.shape:
            n *= d
        return n


class StreamingWriter:
    """`with StreamingWriter(path, entries) as w: w.write(name, tensor)` for every entry, in order."""

    def __init__(self, path: Path, entries: list[Entry], *, metadata: dict[str, str] | None = None) -> None:
        self.path = Path(path)
        self.entries = entries
        self.metadata = metadata or {"format": "pt"}
        self._next = 0
        self._file: BinaryIO | None = None

    def __enter__(self) -> StreamingWriter:
        header: dict[str, object] = {"__metadata__": self.metadata}
        offset = 0
        for e in self.entries:
            header[e.name] = {"dtype": ST_DTYPE[e.dtype], "shape": list(e.shape), "data_offsets": [offset, offset + e.nbytes]}
            offset += e.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # 8-byte alignment of the data section, as safetensors writes it
        self._file = open(self.path, "wb")
        self._file.write(struct.pack("<Q", len(raw)))
        self._file.write(raw)
        return self

    def write(self, name: str, tensor) -> None:
        """Append the next tensor; its name, dtype and shape must be the planned ones."""
        import torch

        assert self._file is not None, "use StreamingWriter as a context manager"
        e = self.entries[self._next]
        found = (name, str(tensor.dtype).replace("torch.", ""), tuple(tensor.shape))
        if found != (e.name, e.dtype, e.shape):
            raise ConversionError(
                f"internal: tensor {name} does not match the planned layout",
                expected=f"{e.name} {e.dtype} {list(e.shape)}",
                found=f"{found[0]} {found[1]} {list(found[2])}",
                fix="report this bug; the conversion table and the writer disagree",
            )
        flat = tensor.contiguous().reshape(-1).view(torch.uint8)  # [nbytes] raw little-endian bytes
        self._file.write(memoryview(flat.numpy()))
        self._next += 1

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self._file is not None
        self._file.close()
        if exc_type is None and self._next != len(self.entries):
            missing = [e.name for e in self.entries[self._next :]]
            raise ConversionError(f"internal: {self.path.name} is missing {len(missing)} tensor(s)", expected="every planned tensor written", found=", ".join(missing[:5]), fix="report this bug")
