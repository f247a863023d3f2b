"""A per-user private folder for state the server's model processes share (the n-gram pool), and files
opened in it without following symlinks.

Where: `$XDG_RUNTIME_DIR/<name>` when XDG_RUNTIME_DIR is set (the user's runtime folder, 0700 by the
XDG Base Directory spec), else `<tmp>/<name>-<uid>` (tmp: TMPDIR or /tmp). The folder is created 0700;
whether just created or already there, it must then be a real folder (not a symlink) owned by this
process's user with no permission bit for group or others, inside a parent that others cannot rename
it out of (not writable by others, or sticky like /tmp). Anything else is refused (`UnsafePathError`):
never repaired, never used. So another local user can neither read what is kept there, nor plant a
file or a symlink the processes would follow.

Plain Python (os, stat): runs in the production container, where specbuild is not installed.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

PRIVATE_MODE = 0o700  # folder: this user only
FILE_MODE = 0o600  # file: this user only


class UnsafePathError(PermissionError):
    """A private folder or file is not private: another owner, a loose mode, a symlink, a hard link."""


def private_folder(name: str) -> Path:
    """This user's private folder `name` (created 0700), checked after creation; see the module doc."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and os.path.isdir(runtime):
        folder = Path(runtime) / name
    else:
        folder = Path(tempfile.gettempdir()) / f"{name}-{os.getuid()}"
    try:
        os.mkdir(folder, PRIVATE_MODE)  # the umask can only remove bits: never looser than 0700
    except FileExistsError:
        pass
    check_private(folder, os.lstat(folder), kind="folder")
    _check_parent(folder.parent, os.stat(folder.parent))
    return folder


def open_private_file(path: Path) -> int:
    """An fd of `path` (created 0600 when missing), opened without following a symlink and refused when
    it is not a regular file of this user's with mode 0600 or stricter and one link."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, FILE_MODE)
    except OSError:
        if os.path.islink(path):  # O_NOFOLLOW: ELOOP
            refuse_symlink(path)
        raise
    try:
        st = os.fstat(fd)
        check_private(path, st, kind="file")
        if st.st_nlink != 1:
            raise UnsafePathError(f"{path} has {st.st_nlink} hard links: refused, remove it")
    except BaseException:
        os.close(fd)
        raise
    return fd


def refuse_symlink(path: Path) -> None:
    """Refuse `path` when it is a symlink (a file a library opens by name, e.g. SQLite's -wal and -shm)."""
    if os.path.islink(path):
        raise UnsafePathError(f"{path} is a symlink (to {os.readlink(path)}): refused, remove it")


def check_private(path: Path, st: os.stat_result, *, kind: str) -> None:
    """Refuse `st` (an lstat or fstat of `path`) unless it is a `kind` ("folder" | "file") of this user
    with no group or other permission bits."""
    is_kind = stat.S_ISDIR(st.st_mode) if kind == "folder" else stat.S_ISREG(st.st_mode)
    if not is_kind:
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a " + kind
        raise UnsafePathError(f"{path} is {what}: refused (expected a private {kind}), remove it")
    uid = os.getuid()
    if st.st_uid != uid:
        raise UnsafePathError(
            f"{path} is owned by uid {st.st_uid}, not by this process's user (uid {uid}): refused; another "
            f"user created it, remove it (or set XDG_RUNTIME_DIR to a folder of your own)"
        )
    if st.st_mode & 0o077:
        wanted = PRIVATE_MODE if kind == "folder" else FILE_MODE
        raise UnsafePathError(
            f"{path} has mode {stat.S_IMODE(st.st_mode):04o}, expected {wanted:04o} (this user only): "
            "refused; others could read or change it, remove it"
        )


def _check_parent(parent: Path, st: os.stat_result) -> None:
    """Others may not rename a folder out of `parent`: not writable by group/others unless sticky (/tmp)."""
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
        raise UnsafePathError(
            f"{parent} is writable by others and not sticky (mode {stat.S_IMODE(st.st_mode):04o}): another "
            "user could replace the private folder in it; set TMPDIR or XDG_RUNTIME_DIR to a safe folder"
        )
