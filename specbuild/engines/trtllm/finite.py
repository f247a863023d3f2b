"""NaN / Inf detection on raw float bytes (float32, float16, bfloat16), without converting them.

An IEEE value is NaN or Inf exactly when all its exponent bits are set: 0x7F800000 of a float32,
0x7C00 of a float16, 0x7F80 of a bfloat16 (the high half of a float32). Counting the elements whose
masked bits equal the mask reads each byte once, at the speed of a numpy pass.
"""

from __future__ import annotations

import numpy as np

from specbuild.errors import CheckpointError

# dtype -> (unsigned integer of its width, exponent mask)
_EXPONENT = {"float32": (np.uint32, 0x7F800000), "float16": (np.uint16, 0x7C00), "bfloat16": (np.uint16, 0x7F80)}


_CHUNK = 1 << 22  # elements per pass: temporaries stay at a few MiB whatever the tensor size


def count_nonfinite(buffer, dtype: str) -> int:
    """Elements of `buffer` (little-endian `dtype` values) that are NaN or +-Inf."""
    kind, mask = _EXPONENT[dtype]
    bits = np.frombuffer(buffer, dtype=kind)  # [n], a view of the bytes
    m = kind(mask)
    return sum(int(np.count_nonzero((bits[i : i + _CHUNK] & m) == m)) for i in range(0, bits.shape[0], _CHUNK))


def nonfinite_error(label: str, dtype: str, count: int) -> CheckpointError:
    return CheckpointError(
        f"tensor {label} holds {count} NaN/Inf value(s) ({dtype})",
        expected="finite weights (a NaN or Inf weight makes every output NaN: the engine emits token 0 forever)",
        found=f"{count} non-finite value(s)",
        fix="re-download or re-train the checkpoint; `specbuild inspect MODEL --check-values` lists every such tensor",
    )


_ST_FLOATS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def scan_safetensors(path) -> dict[str, int]:
    """{tensor: non-finite count} for every float tensor of one safetensors file that holds any.

    Reads the file once through a memory map, tensor by tensor (its pages leave the process after).
    """
    import json
    import mmap
    import struct
    from pathlib import Path

    path = Path(path)
    found: dict[str, int] = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))  # size-checked by the caller (builder/weights.py headers)
        if path.stat().st_size <= 8 + n:
            return found
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            view = memoryview(m)
            try:
                for name, meta in header.items():
                    dtype = _ST_FLOATS.get(meta.get("dtype")) if isinstance(meta, dict) else None
                    if dtype is None:
                        continue
                    begin, end = (8 + n + o for o in meta["data_offsets"])
                    chunk = view[begin:end]
                    if (bad := count_nonfinite(chunk, dtype)):
                        found[name] = bad
                    chunk.release()
            finally:
                view.release()
    return found
