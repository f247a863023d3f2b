"""Outputs checked before any work, and a failed file operation as one clear error.

`check_output` is what every command runs on each of its outputs before it starts (cli/paths.py), so
a bad output path fails in a second, not after minutes of converting, measuring or training: the
wrong kind of path (a file where a folder goes, a device or a folder where a file goes), an existing
output without `--force` (a dangling symlink counts as existing), and a place that cannot be written
(a read-only or full file system, no permission, a file on the way) — probed by creating and
removing a temporary file where the output will be created, as root ignores permission bits.

`file_system_error` turns any `OSError` that reaches the CLI edge into a `FileSystemError` naming
the file and the system's reason (cli/common.handle_errors): no traceback, whatever operation failed.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from specbuild.core.errors import OutputExistsError, SpecbuildError
from specbuild.core.formats.safe_io import OutputError


class FileSystemError(SpecbuildError):
    """A file operation failed (the OSError's file and reason, as a message)."""


def check_output(
    path: str | Path, *, folder: bool, replaces: bool = False, force: bool = False, option: str = "--out"
) -> None:
    """Refuse `path` as an output now: a folder (`folder`) or a file; `replaces`: the command replaces
    an existing one only with `force` (the folder commands with --force), else it writes into it."""
    path = Path(path)
    kind = "folder" if folder else "file"
    if os.path.lexists(path):
        try:
            st = os.stat(path)
        except OSError:  # a dangling symlink: it is there, and replacing it needs --force
            st = None
        if st is not None and folder and not stat.S_ISDIR(st.st_mode):
            raise OutputError(
                f"{option} {path} is a file",
                expected="a folder (created when missing)",
                found="an existing file",
                fix=f"choose another {option}; nothing was written",
            )
        if st is not None and not folder and not stat.S_ISREG(st.st_mode):
            raise OutputError(
                f"{option} {path} is not a regular file",
                expected="a file path (created or replaced)",
                found="a folder" if stat.S_ISDIR(st.st_mode) else "a device, FIFO or socket",
                fix=f"choose another {option}",
            )
        if replaces and not force:
            raise OutputExistsError(
                f"output {kind} {path} already exists",
                expected="a path that does not exist yet",
                found=f"{path} ({'a dangling symlink' if st is None else kind})",
                fix=f"choose another {option}, or pass --force to replace it",
            )
    into = folder and not replaces and os.path.isdir(path)  # files are written inside the folder
    probe_writable(path if into else path.parent, option=option, out=path)


def probe_writable(where: Path, *, option: str, out: Path) -> None:
    """Create and remove a temporary file in `where`, or in its nearest existing folder when it does not
    exist yet (the command creates the rest); OutputError when that fails."""
    where = Path(os.path.abspath(where))
    while not os.path.lexists(where) and where != where.parent:
        where = where.parent
    if not os.path.isdir(where):
        raise OutputError(
            f"cannot write {option} {out}: {where} is not a folder",
            expected="a path whose parents are folders",
            found=f"{where} is a file",
            fix=f"choose another {option}",
        )
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".probe", dir=where)
    except OSError as exc:
        raise OutputError(
            f"cannot write {option} {out}: {exc.strerror or exc}",
            expected="a writable folder with free space",
            found=f"{errno.errorcode.get(exc.errno or 0, exc.errno)} creating a file in {where}",
            fix=f"make {where} writable or choose another {option}; nothing was written",
        ) from None
    os.close(fd)
    os.unlink(probe)


def file_system_error(exc: OSError) -> FileSystemError:
    """The message for an OSError no stage turned into a typed error: the file(s), the reason."""
    files = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f)
    code = errno.errorcode.get(exc.errno or 0, "")
    return FileSystemError(
        f"{exc.strerror or exc}" + (f": {files}" if files else ""),
        expected="a readable input and a writable output",
        found=f"{code or type(exc).__name__}" + (f" on {files}" if files else ""),
        fix="check the path, its permissions and the free space; nothing was replaced",
    )
