"""NaN / Inf detection on raw float bytes (float32, float16, bfloat16), without converting them.

An IEEE value is NaN or Inf exactly when all its exponent bits are set: 0x7F800000 of a float32,
0x7C00 of a float16, 0x7F80 of a bfloat16 (the high half of a float32). Counting the elements whose
masked bits equal the mask reads each byte once, at the speed of a numpy pass.
"""

from __future__ import annotations

import json
import mmap
import struct
import threading
from pathlib import Path

import numpy as np

from specbuild.core.errors import CheckpointError

# dtype -> (unsigned integer of its width, exponent mask)
_EXPONENT = {
    "float32": (np.uint32, 0x7F800000),
    "float16": (np.uint16, 0x7C00),
    "bfloat16": (np.uint16, 0x7F80),
}


_CHUNK = 1 << 22  # elements per pass: the scratch stays at a few MiB whatever the tensor size
_scratch = threading.local()  # per thread: one reused buffer (a fresh one per pass page-faults each time)


def count_nonfinite(buffer, dtype: str) -> int:
    """Elements of `buffer` (little-endian `dtype` values) that are NaN or +-Inf.

    Each pass masks the exponent bits into a reused buffer and takes its maximum: `bits & mask` is at
    most `mask`, and equals it exactly for a non-finite value, so only a pass that holds one counts."""
    kind, mask = _EXPONENT[dtype]
    bits = np.frombuffer(buffer, dtype=kind)  # [n], a view of the bytes
    m = kind(mask)
    scratch = getattr(_scratch, kind.__name__, None)
    if scratch is None:
        scratch = np.empty(_CHUNK, dtype=kind)  # [CHUNK]
        setattr(_scratch, kind.__name__, scratch)
    bad = 0
    for i in range(0, bits.shape[0], _CHUNK):
        masked = np.bitwise_and(bits[i : i + _CHUNK], m, out=scratch[: min(_CHUNK, bits.shape[0] - i)])
        if masked.shape[0] and masked.max() == m:
            bad += int(np.count_nonzero(masked == m))
    return bad


def nonfinite_error(label: str, dtype: str, count: int) -> CheckpointError:
    return CheckpointError(
        f"tensor {label} holds {count} NaN/Inf value(s) ({dtype})",
        expected="finite weights (a NaN or Inf weight makes every output NaN: the engine emits token 0 "
        "forever)",
        found=f"{count} non-finite value(s)",
        fix="re-download or re-train the checkpoint; `specbuild inspect MODEL --check-values` lists every "
        "such tensor",
    )


_ST_FLOATS = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}


def scan_safetensors(path) -> dict[str, int]:
    """{tensor: non-finite count} for every float tensor of one safetensors file that holds any.

    Reads the file once through a memory map, tensor by tensor (its pages leave the process after).
    """
    path = Path(path)
    found: dict[str, int] = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))  # size-checked by the caller (core/formats/weights.py headers)
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
                    if bad := count_nonfinite(chunk, dtype):
                        found[name] = bad
                    chunk.release()
            finally:
                view.release()
    return found
