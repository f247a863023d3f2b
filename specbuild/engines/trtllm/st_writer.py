"""A streaming safetensors writer: header first (all shapes are known from the plan), then tensors one
at a time, so a rank file never has to sit in memory as a whole.

File format (safetensors): u64 little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}} padded with spaces to a
multiple of 8, then the tensors' bytes back to back in header order (offsets relative to the data
start, contiguous, no gaps). `safetensors.safe_open` / `load_file` read it like any other file.

A tensor is written from parts: tensors (bytes through Python) or `FileRange`s of a source file,
copied with `os.copy_file_range` inside the kernel (a plain read/write loop where the kernel or file
system refuses). The file's sha256 is computed while writing, on a helper thread (hashlib releases the
GIL) that reads the same bytes, so the manifest needs no second pass over the output; the writing
never waits for the hash of a file range (only a part in memory waits for the previous one's, which
bounds memory), so with one writer per TP rank file the files are hashed in parallel while they are
written. The same pass checks that every value is finite (`finite.py`): a NaN or Inf weight stops the
conversion, naming the tensor, instead of an engine that generates token 0 forever.
"""

from __future__ import annotations

import errno
import hashlib
import json
import mmap
import os
import struct
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

from specbuild.core.errors import ConversionError
from specbuild.engines.trtllm.finite import count_nonfinite, nonfinite_error
from specbuild.engines.trtllm.sources import ITEMSIZE, FileRange

ST_DTYPE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}
_CHUNK = 8 << 20  # bytes per read when hashing or copying a FileRange through Python
_NO_COPY_FILE_RANGE = {errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF}


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
        self._hash = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")  # FIFO: in file order
        self._pending: list[Future] = []  # hash jobs submitted and not yet seen to finish
        self._last_bytes: Future | None = None  # the hash job of the last part written from memory
        self._fds: dict[
            Path, int
        ] = {}  # source files of FileRange parts (shared by both threads: pread only)
        self._kernel_copy = hasattr(os, "copy_file_range")
        self.sha256: str | None = None  # set when the file is complete

    def __enter__(self) -> StreamingWriter:
        header: dict[str, object] = {"__metadata__": self.metadata}
        offset = 0
        for e in self.entries:
            header[e.name] = {
                "dtype": ST_DTYPE[e.dtype],
                "shape": list(e.shape),
                "data_offsets": [offset, offset + e.nbytes],
            }
            offset += e.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)  # 8-byte alignment of the data section, as safetensors writes it
        self._file = open(
            self.path, "wb", buffering=0
        )  # unbuffered: copy_file_range writes at the fd position
        self._emit(struct.pack("<Q", len(raw)))
        self._emit(raw)
        return self

    def _emit(self, part, *, check: tuple[str, str] | None = None) -> None:
        """Write `part` here while the helper thread hashes it (in file order: one FIFO thread).

        A FileRange holds no memory, so its hash job never holds up the writing: the writer runs ahead
        of the hash and the two overlap fully. A part in memory (an assembled tensor: a Scratch buffer,
        reused two tensors later) waits for the previous such part's hash first, which bounds memory
        to the two buffers. `check` = (tensor label, dtype): the part's values are checked for NaN/Inf
        on that thread."""
        assert self._file is not None
        self._reap()
        if isinstance(part, FileRange):
            self._pending.append(self._hasher.submit(self._hash_range, part, check))
            self._copy_range(part)
        else:
            if self._last_bytes is not None:
                self._last_bytes.result()  # (raises a failed check at once)
            self._last_bytes = self._hasher.submit(self._hash_bytes, part, check)
            self._pending.append(self._last_bytes)
            self._file.write(part)

    def _reap(self) -> None:
        """Drop finished hash jobs, raising the first failure (a non-finite value stops the writing)."""
        while self._pending and self._pending[0].done():
            self._pending.pop(0).result()

    def _fd(self, path: Path) -> int:
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        return self._fds[path]

    def _hash_range(self, part: FileRange, check: tuple[str, str] | None = None) -> None:
        """Hash a source range through a map of just that range (no copy; unmapped right after, so
        its pages leave this process); with `check`, count its non-finite values on the way."""
        if part.nbytes == 0:
            return  # (a zero length would map the whole file)
        start = part.offset - part.offset % mmap.ALLOCATIONGRANULARITY
        skip = part.offset - start
        bad = 0
        with mmap.mmap(self._fd(part.file), skip + part.nbytes, access=mmap.ACCESS_READ, offset=start) as m:
            view = memoryview(m)
            try:
                for pos in range(skip, skip + part.nbytes, _CHUNK):  # chunks start at element boundaries
                    chunk = view[pos : min(pos + _CHUNK, skip + part.nbytes)]
                    self._hash.update(chunk)
                    if check is not None:
                        bad += count_nonfinite(chunk, check[1])
                    chunk.release()
            finally:
                view.release()
        if bad:
            raise nonfinite_error(check[0], check[1], bad)

    def _hash_bytes(self, part, check: tuple[str, str] | None) -> None:
        self._hash.update(part)
        if check is not None and (bad := count_nonfinite(part, check[1])):
            raise nonfinite_error(check[0], check[1], bad)

    def _copy_range(self, part: FileRange) -> None:
        assert self._file is not None
        fd, out, pos, left = self._fd(part.file), self._file.fileno(), part.offset, part.nbytes
        while left and self._kernel_copy:
            try:
                n = os.copy_file_range(fd, out, left, pos)
            except OSError as exc:
                if exc.errno not in _NO_COPY_FILE_RANGE:
                    raise
                self._kernel_copy = False
                break
            if n == 0:
                raise ConversionError(
                    f"{part.file} ended early",
                    expected=f"{part.nbytes} bytes at {part.offset}",
                    found="end of file",
                    fix="re-download the checkpoint",
                )
            pos, left = pos + n, left - n
        while left:
            chunk = os.pread(fd, min(_CHUNK, left), pos)
            if not chunk:
                raise ConversionError(
                    f"{part.file} ended early",
                    expected=f"{part.nbytes} bytes at {part.offset}",
                    found="end of file",
                    fix="re-download the checkpoint",
                )
            self._file.write(chunk)
            pos, left = pos + len(chunk), left - len(chunk)

    def write(self, name: str, parts: list, *, label: str | None = None) -> None:
        """Append the next planned tensor from its parts (tensors and FileRanges, in order).

        Every value must be finite; `label` names the tensor in the error (default: `name`)."""
        assert self._file is not None, "use StreamingWriter as a context manager"
        e = self.entries[self._next]
        nbytes = sum(p.nbytes if isinstance(p, FileRange) else p.numel() * p.element_size() for p in parts)
        dtypes = {str(p.dtype).replace("torch.", "") for p in parts if not isinstance(p, FileRange)}
        if name != e.name or nbytes != e.nbytes or not dtypes <= {e.dtype}:
            raise ConversionError(
                f"internal: tensor {name} does not match the planned layout",
                expected=f"{e.name} {e.dtype} {e.nbytes} bytes",
                found=f"{name} {'/'.join(sorted(dtypes)) or e.dtype} {nbytes} bytes",
                fix="report this bug; the conversion table and the writer disagree",
            )
        check = (label or name, e.dtype)
        for p in parts:
            if isinstance(p, FileRange):
                self._emit(p, check=check)
            else:  # [nbytes] raw little-endian bytes; the view keeps the tensor alive until hashed
                self._emit(memoryview(p.contiguous().reshape(-1).view(torch.uint8).numpy()), check=check)
        self._next += 1

    def __exit__(self, exc_type, exc, tb) -> None:
        assert self._file is not None
        self._file.close()
        try:
            for job in self._pending:  # in order: the first failure is the one reported
                if exc_type is None:
                    job.result()
        finally:  # a failed write: the jobs not started are dropped, the running one ends first
            self._hasher.shutdown(cancel_futures=exc_type is not None)
            for fd in self._fds.values():
                os.close(fd)
        self.sha256 = self._hash.hexdigest()
        if exc_type is None and self._next != len(self.entries):
            missing = [e.name for e in self.entries[self._next :]]
            raise ConversionError(
                f"internal: {self.path.name} is missing {len(missing)} tensor(s)",
                expected="every planned tensor written",
                found=", ".join(missing[:5]),
                fix="report this bug",
            )
