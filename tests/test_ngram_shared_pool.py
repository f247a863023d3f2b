"""The BLS's n-gram public pool is shared by processes (Triton runs each BLS instance in its own), stays
bounded, survives concurrent rounds, and falls back to a private in-memory pool when its file cannot be
used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BLS = Path(__file__).resolve().parents[1] / "specbuild" / "model_repo" / "python_models" / "tensorrt_llm_bls"
COMMON = BLS.parent / "common"
sys.path[:0] = [str(BLS), str(COMMON)]

import ngram_store  # noqa: E402
import private_dir  # noqa: E402

from specbuild.engines.reference.ngram import NGramConfig, NGramRequest  # noqa: E402

CONFIG = NGramConfig(max_matching_ngram_size=2)

CHILD = """
import sys
sys.path[:0] = [{bls!r}, {common!r}]
from ngram_store import SharedPatternStore
from specbuild.engines.reference.ngram import NGramConfig, NGramRequest
store = SharedPatternStore({path!r})
for r in range({rounds}):
    req = NGramRequest(NGramConfig(2), 4, store)
    req.propose({seq!r} + [1000 + r, 2000 + r], 4)
"""


def run_child(path: Path, seq: list[int], rounds: int = 1) -> subprocess.Popen:
    code = CHILD.format(bls=str(BLS), common=str(COMMON), path=str(path), seq=seq, rounds=rounds)
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_pattern_another_process_saw_is_drafted_here(tmp_path):
    path = tmp_path / "pool.sqlite3"
    assert run_child(path, [5, 6, 7, 8, 9]).wait(timeout=60) == 0
    store = ngram_store.SharedPatternStore(path)
    assert NGramRequest(CONFIG, 4, store).propose([1, 2, 5, 6], 4) == [7, 8, 9, 1000]


def test_concurrent_processes_keep_the_pool_consistent(tmp_path):
    path = tmp_path / "pool.sqlite3"
    children = [run_child(path, list(range(10 * i, 10 * i + 10)), rounds=40) for i in range(3)]
    assert all(c.wait(timeout=120) == 0 for c in children)
    store = ngram_store.SharedPatternStore(path)
    # every round of every process is in: each child's own sequence drafts its continuation
    for i in range(3):
        seq = list(range(10 * i, 10 * i + 10))
        assert NGramRequest(CONFIG, 4, store).propose([-1, *seq[:2]], 4) == seq[2:6]
    with store.session() as pool:  # every row decodes
        rows = pool._db.execute("SELECT pattern FROM pool").fetchall()
        assert rows and all(pool.get(tuple(memoryview(p).cast("i"))) for (p,) in rows)


def test_the_pool_is_trimmed_to_its_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(ngram_store, "TRIM_EVERY", 4)
    store = ngram_store.SharedPatternStore(tmp_path / "pool.sqlite3", max_patterns=10)
    for r in range(8):  # 8 sessions, each writing ~ 2 * 7 new patterns
        NGramRequest(CONFIG, 4, store).propose([100 * r + i for i in range(8)], 4)
    assert len(store) == 10  # trimmed at sessions 4 and 8 to the 10 most recently written
    # the most recently written patterns are the ones kept
    assert NGramRequest(CONFIG, 4, store).propose([0, 704, 705], 4) == [706, 707]


def test_pool_files_are_per_server_and_stale_ones_go(tmp_path):
    live = ngram_store.server_pool_path("/repo/tensorrt_llm_bls", folder=tmp_path / "pool")
    other = ngram_store.server_pool_path("/other/tensorrt_llm_bls", folder=tmp_path / "pool")
    assert live != other and live.parent == other.parent and str(os.getppid()) in live.name
    live.parent.mkdir()
    live.write_bytes(b"")
    dead = live.parent / f"{2**22 + 7}-123-abcd.sqlite3"  # a pid above Linux's pid_max
    dead.write_bytes(b"")
    (live.parent / f"{2**22 + 7}-123-abcd.sqlite3-wal").write_bytes(b"")
    ngram_store.remove_stale(live.parent)
    assert sorted(p.name for p in live.parent.iterdir()) == [live.name]


def test_an_unusable_pool_file_falls_back_to_an_own_pool(tmp_path, monkeypatch):
    import bls_core

    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(private_dir.tempfile, "gettempdir", lambda: str(blocked))
    logged: list[str] = []
    factory = bls_core.NGramDrafter.configure(
        lambda key, default: {"ngram_max_matching_ngram_size": "4"}.get(key, default),
        model_dir=str(tmp_path),
        log=logged.append,
    )
    assert type(factory.public).__name__ == "PatternPool" and "keeps its own pool" in logged[0]
    assert factory.config == NGramConfig(4, True, True, True)


@pytest.mark.parametrize("public", ["true", "false"])
def test_private_pools_are_not_shared(tmp_path, monkeypatch, public):
    import bls_core

    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(private_dir.tempfile, "gettempdir", lambda: str(tmp_path))
    factory = bls_core.NGramDrafter.configure(
        lambda key, default: {"ngram_is_public_pool": public}.get(key, default),
        model_dir=str(tmp_path / "model"),
    )
    assert (factory.public is None) == (public == "false")
