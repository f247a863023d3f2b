"""The n-gram public pool shared by every BLS instance of one server: a bounded SQLite file.

Triton runs each `tensorrt_llm_bls` instance in its own process (instance_group count =
serving.bls_instance_count), so an in-memory pool would be one pool per instance, not TensorRT-LLM's
one pool for all requests (`is_public_pool`). `SharedPatternStore` keeps the patterns in one SQLite
database (stdlib, file locking across processes) that every instance of the server opens:

* one round's update + lookup is one `BEGIN IMMEDIATE` transaction (reads cached, writes at commit),
  so instances never interleave inside a round; rounds of different requests interleave in arrival
  order (upstream: in batch order within a step);
* bounded: at most `max_patterns` rows, the least recently used trimmed every `TRIM_EVERY` sessions,
  and `max_matches` continuations per pattern (ngram.add_match), as the in-memory pool;
* it is a cache: `synchronous=OFF`, no durability. Its file is `<pool folder>/<key>.sqlite3`, `key` =
  the server process (the instances' parent: its pid and start time) and the model folder, so two
  servers never share one and a restarted server starts empty; files of servers that are gone are
  removed when an instance starts. The pool folder is this user's private one (private_dir.py:
  `$XDG_RUNTIME_DIR/specbuild-ngram`, else `<tmp>/specbuild-ngram-<uid>`, 0700, owner and mode
  checked); the file is created 0600 and opened without following a symlink;
* if the pool cannot be used (read-only tmp, a damaged database, a folder or file that is not
  private), the instance falls back to an in-memory pool of its own and logs why; a round that finds
  the file locked for longer than BUSY_TIMEOUT_S (another process holding it) makes the BLS continue
  that request with a private pool (bls_core.NGramDrafter). Either way drafts get worse, outputs stay
  exact (speculation is lossless whatever the drafts).

Plain Python (sqlite3, array): runs in the production container, where specbuild is not installed.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
import time
from array import array
from contextlib import contextmanager
from pathlib import Path

from private_dir import UnsafePathError, open_private_file, private_folder, refuse_symlink

from specbuild.engines.reference.ngram import DEFAULT_MAX_MATCHES, DEFAULT_MAX_PATTERNS, Matches, Pattern

TRIM_EVERY = 64  # sessions between two row counts (each count is a table scan)
# Waiting for another instance's round, which holds the file for well under a millisecond of work; a
# wait this long means a process holds it for good (a stopped instance, a sqlite3 shell): the request
# then continues with a private pool (bls_core.NGramDrafter) instead of failing.
BUSY_TIMEOUT_S = 1.0
POOL_DIR = "specbuild-ngram"
SQLITE_SIDE_FILES = ("-wal", "-shm", "-journal")  # opened by name by SQLite beside the database


def _pack(tokens: Pattern) -> bytes:
    return array("i", tokens).tobytes()


def _pack_matches(matches: Matches) -> bytes:
    flat = array("i")
    for m in matches:  # [len, tokens...] per continuation, oldest first
        flat.append(len(m))
        flat.extend(m)
    return flat.tobytes()


def _unpack_matches(blob: bytes) -> Matches:
    flat = array("i")
    flat.frombytes(blob)
    out: Matches = {}
    i = 0
    while i < len(flat):
        n = flat[i]
        out[tuple(flat[i + 1 : i + 1 + n])] = None
        i += 1 + n
    return out


class SharedPatternStore:
    """The PatternStore protocol (engines/reference/ngram.py) over one SQLite file."""

    def __init__(
        self, path: Path, *, max_patterns: int = DEFAULT_MAX_PATTERNS, max_matches: int = DEFAULT_MAX_MATCHES
    ):
        self.path, self.max_patterns, self.max_matches = Path(path), max_patterns, max_matches
        self._db = _connect_private(self.path)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=OFF")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS pool (pattern BLOB PRIMARY KEY, matches BLOB NOT NULL, "
            "used INTEGER NOT NULL)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS pool_used ON pool (used)")
        self._lock = threading.Lock()
        self._cache: dict[Pattern, Matches | None] = {}
        self._dirty: set[Pattern] = set()
        self._sessions = 0

    def get(self, pattern: Pattern) -> Matches | None:
        if pattern not in self._cache:
            row = self._db.execute("SELECT matches FROM pool WHERE pattern = ?", (_pack(pattern),)).fetchone()
            self._cache[pattern] = _unpack_matches(row[0]) if row else None
        return self._cache[pattern]

    def put(self, pattern: Pattern, matches: Matches) -> None:
        self._cache[pattern] = matches
        self._dirty.add(pattern)

    @contextmanager
    def session(self):
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self
                now = time.time_ns()
                self._db.executemany(
                    "INSERT OR REPLACE INTO pool (pattern, matches, used) VALUES (?, ?, ?)",
                    [(_pack(p), _pack_matches(self._cache[p]), now) for p in self._dirty],
                )
                self._sessions += 1
                if self._sessions % TRIM_EVERY == 0:
                    self._trim()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            finally:
                self._cache.clear()
                self._dirty.clear()

    def _trim(self) -> None:
        (count,) = self._db.execute("SELECT count(*) FROM pool").fetchone()
        if count > self.max_patterns:
            self._db.execute(
                "DELETE FROM pool WHERE pattern IN (SELECT pattern FROM pool ORDER BY used LIMIT ?)",
                (count - self.max_patterns,),
            )

    def __len__(self) -> int:
        return self._db.execute("SELECT count(*) FROM pool").fetchone()[0]

    def close(self) -> None:
        self._db.close()


def _connect_private(path: Path) -> sqlite3.Connection:
    """SQLite on `path` only when it is this user's private regular file (created 0600), never through a
    symlink: checked on an fd opened with O_NOFOLLOW, and the name still names that file once SQLite
    has opened it (SQLite opens by name)."""
    fd = open_private_file(path)
    try:
        for suffix in SQLITE_SIDE_FILES:
            refuse_symlink(Path(f"{path}{suffix}"))
        db = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        checked, named = os.fstat(fd), os.lstat(path)
        if (checked.st_dev, checked.st_ino) != (named.st_dev, named.st_ino):
            db.close()
            raise UnsafePathError(f"{path} was replaced while it was opened: refused")
        return db
    finally:
        os.close(fd)


def _start_time(pid: int) -> str:
    """A process's start time (clock ticks since boot, /proc/<pid>/stat field 22); "" when unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]  # fields after the command name start at field 3


def server_pool_path(model_dir: str, *, server_pid: int | None = None, folder: Path | None = None) -> Path:
    """The pool file of this server's instances of the model in `model_dir`, in `folder` (default: this
    user's private pool folder, created and checked now: UnsafePathError when it is not private)."""
    pid = os.getppid() if server_pid is None else server_pid  # the stub's parent: tritonserver
    digest = hashlib.sha256(os.path.realpath(model_dir).encode()).hexdigest()[:16]
    folder = private_folder(POOL_DIR) if folder is None else Path(folder)
    return folder / f"{pid}-{_start_time(pid) or 'x'}-{digest}.sqlite3"


def remove_stale(folder: Path) -> None:
    """Delete the pool files of servers that are gone (best effort: another instance may race us)."""
    for path in folder.glob("*.sqlite3*"):
        pid, _, rest = path.name.partition("-")
        start = rest.partition("-")[0]
        if not pid.isdecimal() or start == "x":
            continue
        if _start_time(int(pid)) != start:
            try:
                path.unlink()
            except OSError:
                pass
