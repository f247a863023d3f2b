"""Bounded reads and the output-vs-input guard: how specbuild reads files and chooses where to write.

Reads: every file specbuild parses (build specs, config.json, config.pbtxt, manifests, tokenizer
JSON) goes through `read_bytes` / `read_text` / `read_json` with a size limit for its kind (`LIMITS`).
The file must be a regular file (a symlink to /dev/zero or a FIFO is refused before it is read) and
at most `limit + 1` bytes are ever read, so a file that grows while being read is refused too. JSON
objects with a repeated key are refused (json.loads would keep the last one silently).

Errors echo values through `shorten`, which bounds the text whatever the value's size.

Writes: `guard_output(out, inputs)` refuses an output path that equals, contains or lies inside one
of the command's inputs (symlinks resolved), naming the input. `manifest.atomic_output_dir` and
`atomic_write_text` call it, so every command that writes uses the same rule; `output_errors` turns
a full disk or a read-only folder into one clear message.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import reprlib
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from specbuild.core.errors import SpecbuildError

MIB = 2**20
# Size limits by kind of file (bytes). Each is far above what a real file of that kind holds and far
# below what would exhaust memory when parsed.
LIMITS = {
    "spec": 1 * MIB,  # a spec is < 2 KB; a 256-node Medusa tree written out is ~10 KB
    "config": 16 * MIB,  # HF / TensorRT-LLM config.json and config.pbtxt are a few KB
    "manifest": 64 * MIB,  # one line per file: ~100 bytes x 100k files
    "tokenizer": 128 * MIB,  # tokenizer.json: Llama 3 9 MB, Gemma 3 33 MB
    "text": 256 * MIB,  # prompt and training text files
}
ECHO_LIMIT = 200  # characters of a value quoted in an error message


class InputFileError(SpecbuildError):
    """A file specbuild reads is missing, not a regular file, too large, or not valid for its kind."""


class OutputError(SpecbuildError):
    """An output path would destroy an input, or cannot be written (read-only, disk full)."""


_REPR = reprlib.Repr()
_REPR.maxstring = ECHO_LIMIT
_REPR.maxother = ECHO_LIMIT
_REPR.maxlist = _REPR.maxdict = _REPR.maxtuple = _REPR.maxset = 8
_REPR.maxlevel = 3


def shorten(value: Any, limit: int = ECHO_LIMIT, *, quote: bool = False) -> str:
    """A bounded text for `value`: a str as is (quoted with `quote`), others as a depth- and
    length-limited repr."""
    if isinstance(value, str):
        if len(value) > limit:
            head = repr(value[:limit]) if quote else value[:limit]
            return f"{head}... ({len(value)} characters)"
        return repr(value) if quote else value
    text = _REPR.repr(value)
    return f"{text[:limit]}... ({len(text)} characters)" if len(text) > limit else text


# ---- reads ----------------------------------------------------------------------------------------


def read_bytes(path: str | Path, *, kind: str, what: str | None = None) -> bytes:
    """The bytes of `path`, refused when it is not a regular file or larger than LIMITS[kind]."""
    path = Path(path)
    limit = LIMITS[kind]
    label = what or f"{kind} file"
    try:
        st = path.stat()
    except FileNotFoundError:
        raise InputFileError(
            f"{label} {path} not found",
            expected="an existing file",
            found="no such file",
            fix="check the path",
        ) from None
    except OSError as exc:
        raise InputFileError(
            f"cannot read {label} {path}",
            expected="a readable file",
            found=exc.strerror or str(exc),
            fix="check the path and its permissions",
        ) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputFileError(
            f"{label} {path} is a directory",
            expected="a file",
            found="a directory",
            fix="point at the file inside it",
        )
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(
            f"{label} {path} is not a regular file",
            expected="a regular file",
            found=_file_kind(st.st_mode)
            + (f" (via symlink to {os.path.realpath(path)})" if path.is_symlink() else ""),
            fix="point at a real file; devices, FIFOs and sockets are never read",
        )
    if st.st_size > limit:
        raise _too_large(path, label, limit, st.st_size)
    try:
        with open(path, "rb") as f:
            # read(n) allocates n bytes first: ask for the size stat saw, then for what it grew by
            data = f.read(st.st_size + 1)
            if len(data) > st.st_size:
                data += f.read(limit + 1 - len(data))
    except OSError as exc:
        raise InputFileError(
            f"cannot read {label} {path}",
            expected="a readable file",
            found=exc.strerror or str(exc),
            fix="check the file and its permissions",
        ) from None
    if len(data) > limit:  # grew after stat
        raise _too_large(path, label, limit, len(data))
    return data


def read_text(path: str | Path, *, kind: str, what: str | None = None) -> str:
    """`read_bytes` decoded as UTF-8 (a binary file is a clear error, not a traceback)."""
    data = read_bytes(path, kind=kind, what=what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputFileError(
            f"{what or kind + ' file'} {path} is not UTF-8 text",
            expected="a text file",
            found=f"byte 0x{data[exc.start]:02x} at offset {exc.start} (binary data?)",
            fix="point at the text file specbuild wrote, or regenerate it",
        ) from None


def read_json(
    path: str | Path, *, kind: str = "config", what: str | None = None, expect: type | None = dict
) -> Any:
    """Parse a JSON file: bounded, UTF-8, no repeated keys, and (by default) an object at the top."""
    label = what or f"{kind} file"
    return parse_json(read_text(path, kind=kind, what=label), where=f"{label} {path}", expect=expect)


def parse_json(text: str, *, where: str, expect: type | None = dict) -> Any:
    try:
        value = json.loads(text, object_pairs_hook=_unique_pairs)
    except _DuplicateKey as exc:
        raise InputFileError(
            f"{where} repeats the key {shorten(exc.key)!s}",
            expected="each key once per object",
            found=f"{shorten(exc.key)} twice",
            fix="remove the duplicate (JSON readers keep only one of them)",
        ) from None
    except (ValueError, RecursionError) as exc:
        raise InputFileError(
            f"{where} is not valid JSON",
            expected="a JSON document",
            found=shorten(str(exc)),
            fix="re-save or regenerate the file",
        ) from None
    if expect is not None and not isinstance(value, expect):
        raise InputFileError(
            f"{where} holds a JSON {type(value).__name__}",
            expected=f"a JSON {_json_name(expect)}",
            found=shorten(value),
            fix="point at the right file, or re-save it",
        )
    return value


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _json_name(tp: type) -> str:
    return {dict: "object", list: "array", str: "string"}.get(tp, tp.__name__)


def _file_kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _too_large(path: Path, label: str, limit: int, size: int) -> InputFileError:
    return InputFileError(
        f"{label} {path} is too large",
        expected=f"at most {limit // MIB} MiB for a {label}",
        found=f"{size / MIB:.1f} MiB" if size >= MIB else f"{size} bytes",
        fix="point at the right file; specbuild bounds every file it reads",
    )


# ---- writes ---------------------------------------------------------------------------------------


def guard_output(out: str | Path, inputs: Mapping[str, str | Path | None], *, option: str = "--out") -> None:
    """Refuse `out` when it equals, contains or lies inside an input (symlinks resolved).

    `inputs` maps a label ("HF model", "build spec", ...) to a path (None entries are skipped).
    """
    target = _real(out)
    for label, path in inputs.items():
        if path is None:
            continue
        src = _real(path)
        if target == src:
            how = "is"
        elif target in src.parents:
            how = "contains"
        elif src in target.parents:
            how = "lies inside"
        else:
            continue
        raise OutputError(
            f"{option} {out} {how} the {label} {path}, which this command reads",
            expected=f"an output path outside every input (the {label} must not be replaced or deleted)",
            found=f"{target} {how} {src}",
            fix=f"choose a {option} outside {src}",
        )


def _real(path: str | Path) -> Path:
    return Path(os.path.realpath(os.path.abspath(os.path.expanduser(str(path)))))


_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG}
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}  # only ever a write's fault


@contextlib.contextmanager
def output_errors(out: str | Path, *, scratch: Path | None = None, option: str = "--out") -> Iterator[None]:
    """Turn a failed write (disk full, read-only folder, no permission) under `out` into OutputError.

    `scratch` is the temporary folder being written (its files are named in the OSError). A copy names
    its source first and its destination second (shutil's ENOSPC names both): the write is found by
    either name, and a full or read-only disk is always the output's. Other errors about other files
    (an input that cannot be read) are reported as such.
    """
    try:
        yield
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        names = [str(n) for n in (exc.filename, exc.filename2) if n]
        written = [n for n in names if _is_output_path(n, _real(out), scratch)]
        if names and not written and exc.errno not in _DISK_ERRNOS:
            raise InputFileError(
                f"cannot read {names[0]}",
                expected="a readable input",
                found=exc.strerror or str(exc),
                fix="check the file and its permissions",
            ) from None
        name = (written or names[-1:] or [""])[0]
        raise OutputError(
            f"cannot write {out}: {exc.strerror or exc}",
            expected="a writable folder with enough free space",
            found=f"{errno.errorcode.get(exc.errno or 0, exc.errno)} while writing {name or out}",
            fix=f"free disk space or make {option} writable (or choose another); nothing was replaced, an "
            f"existing {out.name if isinstance(out, Path) else out} is intact",
        ) from None


def _is_output_path(name: str, out: Path, scratch: Path | None) -> bool:
    """Is `name` the output, inside it or its scratch folder, one of its siblings' temporary names, or
    a folder on the way to it (mkdir of a missing parent)?"""
    p = Path(os.path.abspath(name))
    for root in (out, scratch):
        if root is not None and (p == root or root in p.parents):
            return True
    return p.name.startswith(f".{out.name}.") or p in out.parents


def check_writable(path: str | Path, *, option: str = "the file") -> None:
    """Fail now, not after minutes of work, when `path` (a file to be replaced) cannot be written:
    a temporary file is created beside its target and removed (root ignores permission bits, so
    asking is not enough; a read-only file system refuses the create)."""
    target = _real(path)
    with output_errors(target, option=option):
        fd, tmp = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=".probe", dir=target.parent
        )  # EROFS, ENOSPC
        os.close(fd)
        os.unlink(tmp)
        if target.exists() and not os.access(target, os.W_OK):
            raise PermissionError(errno.EACCES, "Permission denied", str(target))


def atomic_write_text(
    path: str | Path,
    text: str,
    *,
    inputs: Mapping[str, str | Path | None] | None = None,
    option: str = "the file",
) -> Path:
    """Replace the file `path` (through a symlink, its target) with `text` in one rename.

    A failed write leaves the old file as it was. `inputs` are guarded like `guard_output`'s.
    """
    target = _real(path)
    if inputs:
        guard_output(target, inputs, option=option)
    with output_errors(target, option=option):
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            with contextlib.suppress(OSError):
                os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return target
