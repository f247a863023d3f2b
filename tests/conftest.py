"""Shared fixtures: tiny checkpoints the tests make themselves with transformers (no downloads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["e2e_fixtures"]  # the shared tritonserver fixtures of the end-to-end tests


def pytest_addoption(parser):
    parser.addoption(
        "--faults",
        action="store_true",
        help="also run the tests marked `faults` (the whole process-tree fault matrix: make test-faults)",
    )


def pytest_collection_modifyitems(config, items):
    """`faults` tests run only with --faults (`make test` runs the matrix's core; the rest is deselected)."""
    if config.getoption("--faults"):
        return
    keep = [item for item in items if item.get_closest_marker("faults") is None]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


def _our_shm() -> set[str]:
    """The /dev/shm files this session can leave: its tritonservers' regions (server_watch.owner_prefix)
    and the in-flight counters of BLS models loaded in this process (named after the process's parent,
    which stands for the server there: inflight.counter_path)."""
    from specbuild.serve.server_watch import BLS_COUNTER_PREFIX, SHM_DIR, owner_prefix

    if not SHM_DIR.is_dir():
        return set()
    ours = (owner_prefix(), f"{BLS_COUNTER_PREFIX}{os.getppid()}-")
    return {p.name for p in SHM_DIR.glob("specbuild*") if p.name.startswith(ours)}


@pytest.fixture(scope="session", autouse=True)
def nothing_left_in_dev_shm():
    """After the whole session: no shared-memory file of its own is left (each is removed, then reported)."""
    from specbuild.serve.server_watch import SHM_DIR

    before = _our_shm()
    yield
    left = sorted(_our_shm() - before)
    for name in left:
        (SHM_DIR / name).unlink(missing_ok=True)
    assert not left, f"the test session left these in /dev/shm (removed now): {left}"


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from specbuild.demo.synthetic import train_tokenizer

    return train_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def make_tiny(tmp_path_factory, tokenizer_dir):
    """Factory: make_tiny(name, **make_model kwargs) -> folder (cached per name for the session)."""
    from specbuild.demo.synthetic import make_model

    cache: dict[str, Path] = {}

    def make(name: str, **kwargs) -> Path:
        if name not in cache:
            out = tmp_path_factory.mktemp(name)
            make_model(out, tokenizer_dir, **kwargs)
            cache[name] = out
        return cache[name]

    return make


@pytest.fixture(scope="session")
def tiny_target(make_tiny) -> Path:
    """Llama with GQA (4 heads, 2 KV heads), untied head: the usual target."""
    return make_tiny("target", num_layers=2, num_heads=4, num_kv_heads=2, seed=1)


@pytest.fixture(scope="session")
def tiny_target_model(tiny_target, tmp_path_factory):
    """The tiny target converted (float32) and loaded as the reference engine's LlamaModel (weights
    only: each engine or sequence built on it keeps its own KV cache, so tests may share it)."""
    from specbuild.engines.reference.loader import load_weights
    from specbuild.engines.reference.model import LlamaModel
    from specbuild.engines.trtllm.convert import convert_checkpoint

    ckpt = convert_checkpoint(tiny_target, tmp_path_factory.mktemp("tiny-ref") / "target", dtype="float32")
    return LlamaModel(load_weights(ckpt))


@pytest.fixture(scope="session")
def target4(make_tiny) -> Path:
    """A 4-layer Llama target (GQA) for the EAGLE-3 tests: enough layers to capture three."""
    return make_tiny("target4", num_layers=4, num_heads=4, num_kv_heads=2, seed=11)


@pytest.fixture(scope="session")
def target4_model(target4, tmp_path_factory):
    """target4 converted (float32) and loaded as the reference engine's LlamaModel."""
    from specbuild.engines.reference.loader import load_weights
    from specbuild.engines.reference.model import LlamaModel
    from specbuild.engines.trtllm.convert import convert_checkpoint

    return LlamaModel(
        load_weights(convert_checkpoint(target4, tmp_path_factory.mktemp("t4") / "ckpt", dtype="float32"))
    )


@pytest.fixture(scope="session")
def tiny_draft(make_tiny) -> Path:
    """A smaller Llama sharing the target's tokenizer."""
    return make_tiny(
        "draft", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64, seed=2
    )


@pytest.fixture(scope="session")
def tiny_qwen2(make_tiny) -> Path:
    return make_tiny("qwen2", family="qwen2", num_heads=4, num_kv_heads=2, seed=3)


@pytest.fixture(scope="session")
def tiny_tied(make_tiny) -> Path:
    return make_tiny("tied", tie_word_embeddings=True, num_heads=4, num_kv_heads=4, seed=4)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny matmuls: one thread is far faster than two fighting other test processes for 2 cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
