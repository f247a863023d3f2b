"""A streaming safetensors writer: header first (all shapes are known from the plan), then tensors one
at a time, so a rank file never has to sit in memory as a whole.

File format (safetensors): u64 little-endian header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}} padded with spaces to a
multiple of 8, then the tensors' bytes back to back in header order (offsets relative to the data
start, contiguous, no gaps). `safetensors.safe_open` / `load_file` read it like any other file.

A tensor is written from parts: tensors (their bytes) or `FileRange`s of a source file (read through a
map of just that range). Each part goes out in one pass, chunk by chunk, on the file's own thread: a
chunk (1 MiB, it stays in the CPU's L2 cache) is added to the file's sha256, checked, then written
from the same memory, so every byte is read from memory once and the manifest needs no second pass
over the output (hashlib and os.write release the GIL: one writer per TP rank file writes and hashes
the files in parallel). The caller never waits for a file range; a part in memory waits only for the
previous one's pass, which bounds memory. The check: every value is finite (`finite.py`): a NaN or Inf
weight stops the conversion, naming the tensor, instead of an engine that generates token 0 forever.
"""

from __future__ import annotations

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
# bytes hashed, checked and written at a time: small enough to stay in L2 between the three, large
# enough that the per-chunk Python work is noise (a multiple of every dtype's size)
_CHUNK = 1 << 20
_WINDOW = 32 << 20  # bytes of a source range mapped at a time (a multiple of _CHUNK)


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
        # the file's thread: hashes, checks and writes the parts, FIFO, so in file order
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="st-writer")
        self._pending: list[Future] = []  # parts submitted and not yet seen written
        self._last_bytes: Future | None = None  # the job of the last part from memory
        self._fds: dict[Path, int] = {}  # source files of FileRange parts (mapped on the file's thread)
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
        self._file = open(self.path, "wb", buffering=0)  # unbuffered: every chunk goes out as it is
        self._pass(memoryview(struct.pack("<Q", len(raw)) + raw), None)
        return self

    def _emit(self, part, *, check: tuple[str, str] | None = None) -> None:
        """Hand `part` to the file's thread (FIFO: in file order), which hashes, checks and writes it.

        A FileRange holds no memory, so the caller goes on at once. A part in memory (an assembled
        tensor: a Scratch buffer, reused two tensors later) waits for the previous such part's pass
        first, which bounds memory to the two buffers. `check` = (tensor label, dtype): the part's
        values are checked for NaN/Inf on the way."""
        assert self._file is not None
        self._reap()
        if isinstance(part, FileRange):
            self._pending.append(self._worker.submit(self._pass_range, part, check))
        else:
            if self._last_bytes is not None:
                self._last_bytes.result()  # (raises a failed check at once)
            self._last_bytes = self._worker.submit(self._pass_bytes, part, check)
            self._pending.append(self._last_bytes)

    def _reap(self) -> None:
        """Drop finished hash jobs, raising the first failure (a non-finite value stops the writing)."""
        while self._pending and self._pending[0].done():
            self._pending.pop(0).result()

    def _fd(self, path: Path) -> int:
        if path not in self._fds:
            self._fds[path] = os.open(path, os.O_RDONLY)
        return self._fds[path]

    def _pass_range(self, part: FileRange, check: tuple[str, str] | None) -> None:
        """A source range through maps of _WINDOW bytes at a time (each unmapped right after, so at most
        one window of source pages is in this process per file)."""
        fd = self._fd(part.file)
        size = os.fstat(fd).st_size
        if size < part.offset + part.nbytes:
            raise ConversionError(
                f"{part.file} ended early",
                expected=f"{part.nbytes} bytes at {part.offset}",
                found=f"{size} bytes in the file",
                fix="re-download the checkpoint",
            )
        pos, end, bad = part.offset, part.offset + part.nbytes, 0
        while pos < end:  # (a zero length would map the whole file: never asked)
            start = pos - pos % mmap.ALLOCATIONGRANULARITY
            stop = min(end, pos + _WINDOW)  # a window is a whole number of elements after the last
            with (
                mmap.mmap(fd, stop - start, access=mmap.ACCESS_READ, offset=start) as m,
                memoryview(m) as view,
                view[pos - start :] as body,
            ):
                bad += self._pass(body, check)
            pos = stop
        if bad:  # the whole range's count, in the error
            raise nonfinite_error(check[0], check[1], bad)

    def _pass_bytes(self, data, check: tuple[str, str] | None) -> None:
        if bad := self._pass(data, check):
            raise nonfinite_error(check[0], check[1], bad)

    def _pass(self, data, check: tuple[str, str] | None) -> int:
        """Hash, check and write `data` (bytes-like, [nbytes]) chunk by chunk, each from the cache;
        returns its count of non-finite values (0 without `check`)."""
        assert self._file is not None
        out, bad = self._file.fileno(), 0
        with memoryview(data) as whole, whole.cast("B") as view:
            for pos in range(0, len(view), _CHUNK):  # chunks start at element boundaries
                with view[pos : pos + _CHUNK] as chunk:
                    self._hash.update(chunk)
                    if check is not None:
                        bad += count_nonfinite(chunk, check[1])
                    done = 0
                    while done < len(chunk):  # os.write may write less than asked
                        with chunk[done:] as rest:
                            done += os.write(out, rest)
        return bad

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
        failed = exc_type is not None
        try:
            for job in self._pending if not failed else ():  # in order: the first failure is reported
                job.result()
        except BaseException:
            failed = True
            raise
        finally:  # after a failure the parts not started are dropped, the running one ends first
            self._worker.shutdown(cancel_futures=failed)
            self._file.close()
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
