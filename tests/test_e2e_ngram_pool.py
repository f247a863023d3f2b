"""End to end, the n-gram public pool against a real tritonserver (issue 40, severe 3 and medium 4): the
BLS instances keep their pool in the user's private folder (0700, the file 0600), refuse a pool folder
another user made world-writable (outputs stay exact, the refusal is logged and counted), and a pool
locked by another process never fails a request (counted as `locked`)."""

from __future__ import annotations

import os
import re
import sqlite3
import stat
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

MAX_TOKENS = 12
PROMPT = "def main():"
UID = os.getuid()
FALLBACKS = "specbuild_ngram_pool_fallbacks_total"


def _remote(server, prompt=PROMPT, **kw):
    from specbuild.client.remote import generate_remote
    from specbuild.core.sampling_params import SamplingParams

    return generate_remote(
        server.grpc_url, prompt, SamplingParams(max_tokens=MAX_TOKENS), timeout_s=120, **kw
    )


def fallbacks(server) -> dict[str, float]:
    """reason -> the BLS's fallback counter, from the server's Prometheus page."""
    url = f"http://{server.options.host}:{server.options.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    found = re.findall(rf'^{FALLBACKS}{{[^}}]*reason="(\w+)"[^}}]*}} (\S+)$', text, re.MULTILINE)
    return {reason: float(value) for reason, value in found}


def private_pool_folder() -> Path:
    """Where private_dir.py puts the pool of a server started with this environment."""
    import tempfile

    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if os.path.isabs(runtime) and os.path.isdir(runtime):
        return Path(runtime) / "specbuild-ngram"
    return Path(tempfile.gettempdir()) / f"specbuild-ngram-{UID}"


def pool_file(repo: Path) -> Path:
    import hashlib

    digests = {
        hashlib.sha256(os.path.realpath(p).encode()).hexdigest()[:16]
        for p in (repo / "tensorrt_llm_bls", repo)
    }
    files = [p for p in private_pool_folder().glob("*.sqlite3") if p.stem.rsplit("-", 1)[-1] in digests]
    assert len(files) == 1, files
    return files[0]


@pytest.fixture(scope="module")
def baseline(greedy):
    return greedy(PROMPT, MAX_TOKENS)[:2]


def test_the_shared_pool_is_private(e2e_servers, e2e_builds, baseline):
    server = e2e_servers["ngram"]
    result = _remote(server, num_draft_tokens=3)
    assert (result.text, result.token_ids) == baseline
    path = pool_file(e2e_builds["ngram"][1])
    assert stat.S_IMODE(os.lstat(path.parent).st_mode) == 0o700 and os.lstat(path.parent).st_uid == UID
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o600 and path.stat().st_size > 0


def test_a_locked_pool_never_fails_a_request(e2e_servers, e2e_builds, baseline):
    """Today's BLS answered `database is locked` (after 10 s) and the request failed."""
    server = e2e_servers["ngram"]
    before = fallbacks(server).get("locked", 0.0)
    holder = sqlite3.connect(pool_file(e2e_builds["ngram"][1]), isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # what a stuck process holding the file does
        for stream in (False, True):
            result = _remote(server, num_draft_tokens=3, stream=stream)
            assert (result.text, result.token_ids) == baseline, stream
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    # Triton's custom metrics are read when the page is served: the two requests are in
    assert fallbacks(server)["locked"] == before + 2


@pytest.fixture(scope="module")
def hostile_tmp(tmp_path_factory):
    """A TMPDIR where another user made both pool folder names world-writable before the server started."""
    tmp = tmp_path_factory.mktemp("hostile-tmp")
    os.chmod(tmp, 0o1777)  # like /tmp
    folders = [tmp / "specbuild-ngram", tmp / f"specbuild-ngram-{UID}"]
    for folder in folders:
        folder.mkdir()
        os.chmod(folder, 0o777)
    return tmp, folders


@pytest.fixture(scope="module")
def hostile_server(e2e_builds, hostile_tmp):
    from specbuild.demo.pipeline import local_server

    tmp, _ = hostile_tmp
    saved = {k: os.environ.get(k) for k in ("TMPDIR", "XDG_RUNTIME_DIR")}
    os.environ["TMPDIR"] = str(tmp)  # the server's processes inherit it (bundle.env copies os.environ)
    os.environ.pop("XDG_RUNTIME_DIR", None)
    try:
        server = local_server(e2e_builds["ngram"][1]).launch()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        yield server.wait_ready()
    finally:
        server.stop()


def test_a_pool_folder_others_can_write_is_refused(hostile_server, hostile_tmp, baseline):
    """Today's BLS kept <tmp>/specbuild-ngram (0777, made by someone else) and wrote its pool there 0644."""
    _, folders = hostile_tmp
    for stream in (False, True):
        result = _remote(hostile_server, num_draft_tokens=3, stream=stream)
        assert (result.text, result.token_ids) == baseline
    for folder in folders:
        assert list(folder.iterdir()) == [], folder
    log = hostile_server.log_text()
    assert "mode 0777" in log and "keeps its own pool" in log
    assert fallbacks(hostile_server)["unusable"] == 2  # every request of the instances without the pool
