"""The BLS's n-gram public pool is private to the server's user and never fails a request (issue 40,
severe 3 and medium 4): another local user can neither read, poison nor redirect it, and a pool held
locked by another process makes the request continue with a pool of its own.

Real files and real SQLite: the hostile folder, the planted symlink and the lock are made as an
attacker (or a stuck process) would make them."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

BLS = Path(__file__).resolve().parents[1] / "specbuild" / "model_repo" / "python_models" / "tensorrt_llm_bls"
COMMON = BLS.parent / "common"
sys.path[:0] = [str(BLS), str(COMMON)]

import bls_core  # noqa: E402
import ngram_store  # noqa: E402

UID = os.getuid()
SEQ = [5, 6, 7, 8, 9, 5, 6]  # (5, 6) seen followed by 7 8 9 5: drafted at the end


@pytest.fixture
def tmp(tmp_path, monkeypatch):
    """TMPDIR = a fresh folder, XDG_RUNTIME_DIR unset: the pool goes to <tmp>/specbuild-ngram-<uid>."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    return tmp_path


def configure(model_dir: Path, counted: list[str] | None = None, logged: list[str] | None = None):
    return bls_core.NGramDrafter.configure(
        lambda key, default: default,
        model_dir=str(model_dir),
        log=(logged if logged is not None else []).append,
        count=(counted if counted is not None else []).append,
    )


def drafter(factory, k: int = 4):
    return factory(SimpleNamespace(opts=SimpleNamespace(num_draft_tokens=k)), None)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---- severe 3: a private folder, a private file, no symlink followed --------------------------------


def test_the_pool_lives_in_a_private_folder_and_file(tmp):
    factory = configure(tmp / "model")
    drafter(factory).propose(SEQ, 4, None)  # one round: the file holds a pattern now
    folder = tmp / f"specbuild-ngram-{UID}"
    (db,) = folder.glob("*.sqlite3")
    assert mode(folder) == 0o700 and os.lstat(folder).st_uid == UID
    assert mode(db) == 0o600 and os.lstat(db).st_uid == UID
    assert factory.public.path == db
    for side in folder.glob("*.sqlite3-*"):  # SQLite's -wal / -shm: as private as the database
        assert mode(side) & 0o077 == 0, side


def test_xdg_runtime_dir_is_preferred(tmp, monkeypatch):
    runtime = tmp / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    factory = configure(tmp / "model")
    assert factory.public.path.parent == runtime / "specbuild-ngram"
    assert mode(runtime / "specbuild-ngram") == 0o700


def test_a_folder_another_user_made_world_writable_is_refused(tmp):
    """Today's code kept <tmp>/specbuild-ngram whoever made it (0777) and created the database in it 0644:
    every local user could read the prompts' n-grams and poison the drafts."""
    hostile = [tmp / "specbuild-ngram", tmp / f"specbuild-ngram-{UID}"]
    for folder in hostile:
        folder.mkdir()
        os.chmod(folder, 0o777)
    logged: list[str] = []
    counted: list[str] = []
    factory = configure(tmp / "model", counted, logged)
    assert type(factory.public).__name__ == "PatternPool"  # the instance keeps its own pool
    assert len(logged) == 1 and "mode 0777" in logged[0] and "keeps its own pool" in logged[0]
    for folder in hostile:
        assert list(folder.iterdir()) == [], folder  # nothing written where others can read
    assert drafter(factory).propose(SEQ, 4, None)[0] == [7, 8, 9, 5]
    assert counted == ["unusable"]  # the request is counted as drafted from a private pool


@pytest.mark.skipif(UID != 0, reason="giving a folder to another user needs root")
def test_a_folder_owned_by_another_user_is_refused(tmp):
    folder = tmp / f"specbuild-ngram-{UID}"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)  # nobody: 0700, but not ours
    logged: list[str] = []
    factory = configure(tmp / "model", logged=logged)
    assert type(factory.public).__name__ == "PatternPool"
    assert "owned by uid 65534" in logged[0]


def test_a_symlinked_pool_folder_is_refused(tmp):
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (tmp / f"specbuild-ngram-{UID}").symlink_to(elsewhere)
    logged: list[str] = []
    factory = configure(tmp / "model", logged=logged)
    assert type(factory.public).__name__ == "PatternPool" and "a symlink" in logged[0]
    assert list(elsewhere.iterdir()) == []


def test_a_planted_symlink_is_never_followed(tmp):
    """sqlite3 followed a symlink at the pool's (predictable) name: writes went to its target."""
    folder = tmp / "pool"
    folder.mkdir(mode=0o700)
    path = ngram_store.server_pool_path("/repo/tensorrt_llm_bls", folder=folder)
    victim = tmp / "victim.txt"
    victim.write_bytes(b"precious")
    path.symlink_to(victim)
    with pytest.raises(PermissionError, match="symlink"):
        ngram_store.SharedPatternStore(path)
    assert victim.read_bytes() == b"precious"
    wal = Path(f"{path}-wal")
    path.unlink()
    wal.symlink_to(victim)  # SQLite opens -wal by name too
    with pytest.raises(PermissionError, match="symlink"):
        ngram_store.SharedPatternStore(path)
    assert victim.read_bytes() == b"precious"


def test_a_pool_file_others_can_read_or_a_hard_link_is_refused(tmp):
    folder = tmp / "pool"
    folder.mkdir(mode=0o700)
    loose = folder / "loose.sqlite3"
    loose.touch(mode=0o644)
    os.chmod(loose, 0o644)
    with pytest.raises(PermissionError, match="mode 0644"):
        ngram_store.SharedPatternStore(loose)
    linked = folder / "linked.sqlite3"
    target = tmp / "target"
    target.touch(mode=0o600)
    os.link(target, linked)
    with pytest.raises(PermissionError, match="2 hard links"):
        ngram_store.SharedPatternStore(linked)


def test_a_parent_others_can_write_without_the_sticky_bit_is_refused(tmp, monkeypatch):
    loose = tmp / "shared-tmp"
    loose.mkdir()
    os.chmod(loose, 0o777)  # /tmp without its sticky bit: anyone could rename our folder away
    monkeypatch.setenv("TMPDIR", str(loose))
    logged: list[str] = []
    configure(tmp / "model", logged=logged)
    assert "not sticky" in logged[0]


# ---- medium 4: a locked pool never fails a request ------------------------------------------------------

HOLD = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")  # what a stuck instance or a sqlite3 shell in a transaction holds
print("locked", flush=True)
time.sleep(120)
"""


def test_a_pool_locked_by_another_process_falls_back_for_that_request(tmp):
    """Today's code raised `database is locked` after 10 s and the request failed."""
    counted: list[str] = []
    factory = configure(tmp / "model", counted)
    drafter(factory).propose(SEQ, 4, None)  # the shared pool learns (5, 6) -> 7 8 9
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(factory.public.path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        d = drafter(factory)
        t0 = time.monotonic()
        draft, _ = d.propose([1, 2, 3, 1, 2], 4, None)  # its own tokens only: (1, 2) -> 3 1 2
        waited = time.monotonic() - t0
        assert draft == [3, 1, 2] and counted == ["locked"]
        # one wait of the busy timeout (+ slack for a loaded CPU), then the request is private
        assert waited < ngram_store.BUSY_TIMEOUT_S + 5.0
        t0 = time.monotonic()
        assert d.propose([1, 2, 3, 1, 2, 3, 1], 4, None)[0] == [2, 3, 1]
        assert time.monotonic() - t0 < ngram_store.BUSY_TIMEOUT_S  # no second wait
        assert counted == ["locked"]  # counted once per request
    finally:
        holder.kill()
        holder.wait()
    # the lock gone, new requests use the shared pool again (it still holds what it learnt)
    assert drafter(factory).propose([0, 5, 6], 4, None)[0] == [7, 8, 9, 5]
    assert counted == ["locked"]
