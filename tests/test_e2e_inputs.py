"""End to end against a real tritonserver, the client side of issue 40: a port beyond 65535 never reaches
the server on port mod 2^16 (medium 6), a K above the engines' max_draft_len is refused quoting the K asked
for, and `generate --url` prints only the statistics the server reports (low items)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from specbuild.cli import app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(e2e_servers):
    return e2e_servers["draft_target"]


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_a_port_beyond_65535_never_reaches_the_server(server):
    """`generate --url 127.0.0.1:PORT+65536` was answered by the server on PORT (gRPC wraps the port)."""
    port = server.options.grpc_port
    ok = run("generate", "--url", f"127.0.0.1:{port}", "--prompt", "hi", "--max-tokens", "2")
    assert ok.exit_code == 0, ok.output
    wrapped = f"127.0.0.1:{port + 65536}"
    for command in (
        ["generate", "--url", wrapped, "--prompt", "hi", "--max-tokens", "2"],
        ["bench", "--url", wrapped, "--concurrency", "1", "--max-tokens", "2", "--out", "/nonexistent-bench"],
    ):
        result = run(*command)
        assert result.exit_code == 2 and "not a port number" in result.stderr, result.stderr


def test_a_k_above_max_draft_len_is_refused_with_the_k_asked_for(server):
    """The BLS drafted min(99, tokens left - 1) = 7 and the target refused "7", not the 99 asked for."""
    result = run("generate", "--url", server.grpc_url, "--prompt", "hi", "--num-draft-tokens", "99")
    assert result.exit_code == 2, result.output
    assert "Draft tokens length (99) exceeds maximum draft tokens length (4)" in result.stderr
    ok = run(
        "generate", "--url", server.grpc_url, "--prompt", "hi", "--num-draft-tokens", "4", "--max-tokens", "8"
    )
    assert ok.exit_code == 0, ok.stderr


def test_generate_url_prints_only_what_the_server_reports(server):
    """`target passes 0, draft passes 0` was printed beside `accepted 0/86 drafts`: the client does not know
    the passes; in-process it does."""
    result = run("generate", "--url", server.grpc_url, "--prompt", "hi", "--max-tokens", "8")
    assert result.exit_code == 0, result.stderr
    assert "drafts (rate" in result.stderr and "passes" not in result.stderr, result.stderr
