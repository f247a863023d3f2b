"""Every option checked before the work, and the right message for each bad input (issue 40, medium 6,
medium 7 and the low items): each test is a case a hostile or careless user hit, and failed (accepted,
misreported, or a traceback) on the code before the fix."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from repo_builds import cached_build
from typer.testing import CliRunner

from specbuild.cli import app
from specbuild.core.errors import ClientError, OutputExistsError, ServerError

ROOT = Path(__file__).resolve().parents[1]
LLAMA_EXAMPLE = ROOT / "examples" / "llama33-70b-1b.yaml"


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def refused(result, *needles: str) -> None:
    """Exit 2 with one message holding every needle, no traceback."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and isinstance(result.exception, SystemExit), result.output
    for needle in needles:
        assert needle in result.output, (needle, result.output)


@pytest.fixture(scope="module")
def dt_build(tmp_path_factory, tiny_target, tiny_draft):
    """A draft/target reference build with max_draft_len 4 (examples/tiny/draft-target.yaml)."""
    return cached_build(tmp_path_factory, "dt", "draft_target", target=tiny_target, draft=tiny_draft)


# ---- medium 6: one rule for every address the CLI takes ----------------------------------------------


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("127.0.0.1:73537", "not a port number"),  # 8001 + 65536: gRPC reached port 8001
        ("127.0.0.1:0", "not a port number"),
        ("127.0.0.1:８００１", "not a port number"),  # str.isdigit() accepted full-width digits
        ("127.0.0.1:²", "not a port number"),
        ("a b:8001", "is not a host"),
        ("http://127.0.0.1:8001", "not a gRPC address"),
        ("::1:8001", "without brackets"),
        ("localhost", "cannot read the server address"),
    ],
)
def test_bad_grpc_addresses_are_refused_before_connecting(url, why):
    from specbuild.core.addresses import grpc_address

    with pytest.raises(ClientError, match=why):
        grpc_address(url, option="--url")
    refused(run("generate", "--url", url, "--prompt", "hi"), "--url", why)
    refused(run("bench", "--url", url, "--out", "/nonexistent-never-written"), "--url", why)


def test_good_addresses_pass_unchanged():
    from specbuild.core.addresses import grpc_address, http_url

    assert grpc_address("grpc://127.0.0.1:8001/") == "127.0.0.1:8001"
    assert grpc_address("[::1]:65535") == "[::1]:65535"
    assert grpc_address("triton_server-0.local:8001") == "triton_server-0.local:8001"
    assert http_url("http://[::1]:8002/metrics", option="--metrics-url") == "http://[::1]:8002/metrics"


@pytest.mark.parametrize("url", ["foo", "http://h:99999/metrics", "ftp://h/metrics", "http://a b/"])
def test_bad_metrics_urls_are_refused(url):
    refused(run("bench", "--url", "127.0.0.1:1", "--metrics-url", url), "--metrics-url")


def test_tune_checks_its_url_before_profiling(tmp_path, monkeypatch):
    import specbuild.tuning.tune as tune

    monkeypatch.setattr(tune, "tune_spec", lambda *a, **k: pytest.fail("profiled before checking --url"))
    spec = shutil.copy(ROOT / "examples" / "tiny" / "draft-target.yaml", tmp_path / "s.yaml")
    refused(run("tune", str(spec), "--schedule", "--url", "127.0.0.1:99999"), "--url", "not a port number")


def test_serve_ports_use_the_same_rule():
    from specbuild.serve.tritonserver import ServerOptions, check_ports_free

    with pytest.raises(ServerError, match="--grpc-port: '70000' is not a port number"):
        check_ports_free(ServerOptions(grpc_port=70000))
    refused(run("serve", "/nonexistent", "--openai-port", "70000"), "--openai-port", "not a port number")


# ---- medium 7: every option checked before the work ---------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "why"),
    [
        ("--alpha", "1.5", "impossible acceptance --alpha"),  # predicted 25 M tok/s per GPU
        ("--alpha", "-0.1", "impossible acceptance --alpha"),
        ("--alpha", "nan", "impossible acceptance --alpha"),
        ("--temperature", "-1", "impossible --temperature"),
        ("--ttft-p99-ms", "-1", "impossible latency objective --ttft-p99-ms"),
        ("--latency-p99-ms", "nan", "impossible latency objective --latency-p99-ms"),
        ("--claim", "0,-1", "impossible --claim"),
        ("--claim", "16", "two whole GPU counts"),  # was read as 16 -> 0 GPUs
        ("--claim", "nan,1", "two whole GPU counts"),  # was a ValueError traceback
    ],
)
def test_plan_refuses_impossible_options(option, value, why):
    refused(run("plan", str(LLAMA_EXAMPLE), "--peak-rps", "1", "--gpu", "h100", option, value), why)


def test_check_reserve_must_be_a_memory_size():
    for value in ("nan", "-1"):  # nan was a ValueError traceback; -1 was planned
        refused(run("check", str(LLAMA_EXAMPLE), "--reserve-gib", value), "--reserve-gib")


def test_generate_checks_its_options_before_connecting():
    refused(run("generate", "--url", "127.0.0.1:1", "--prompt", "hi", "--timeout", "nan"), "--timeout")
    refused(run("generate", "--url", "127.0.0.1:1", "--prompt", "hi", "--num-draft-tokens", "-1"), ">= 0")


@pytest.mark.parametrize(
    "command", [["bench", "--url", "127.0.0.1:1"], ["tune", str(LLAMA_EXAMPLE), "--schedule"]]
)
def test_an_empty_item_in_a_list_is_refused(command):
    """`bench --concurrency 1,,2` ran concurrency 1 and 2."""
    refused(run(*command, "--concurrency", "1,,2"), "--concurrency", "'1,,2'")


# ---- low: repo, deploy, repo check ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "why"),
    [
        ("--schedule", "1:4,1:2", "threshold 1 appears twice"),  # the second silently won
        ("--schedule", "1:4,01:2", "threshold 1 appears twice"),
        ("--schedule", "", "--schedule is empty"),  # was read as off
        ("--schedule", "²:4", "must be an integer"),
        ("--guard", "", "not an acceptance guard"),
    ],
)
def test_repo_refuses_bad_schedules(dt_build, tmp_path, option, value, why):
    refused(run("repo", str(dt_build), "--out", str(tmp_path / "repo"), option, value), why)
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (["--storage", "lots"], "--storage: 'lots' is not a size Kubernetes reads"),
        (["--storage", "0Gi"], "not a size Kubernetes reads"),
        (["--storage", "-1Ti"], "not a size Kubernetes reads"),
        (["--replicas", "0"], "--replicas >= 1"),
        (["--replicas", "4", "--max-replicas", "2"], "--max-replicas >= --replicas"),
    ],
)
def test_deploy_refuses_impossible_layouts(tmp_path, args, why):
    refused(run("deploy", str(LLAMA_EXAMPLE), "--out", str(tmp_path / "d"), *args), why)
    assert not (tmp_path / "d").exists()


def test_deploy_accepts_kubernetes_quantities(tmp_path):
    for i, size in enumerate(("500Gi", "2e12", "1.5Ti")):
        result = run("deploy", str(LLAMA_EXAMPLE), "--out", str(tmp_path / str(i)), "--storage", size)
        assert result.exit_code == 0, result.output
        assert f"storage: {size}" in (tmp_path / str(i) / "00-storage.yaml").read_text()


@pytest.fixture
def llmapi_repo(tmp_path):
    from specbuild.builder.compile import compile_spec
    from specbuild.core.spec import load_spec
    from specbuild.model_repo.generate import generate_repo

    build = compile_spec(load_spec(LLAMA_EXAMPLE, overrides={"flow": "llmapi"}), tmp_path / "build")
    return generate_repo(build, tmp_path / "repo")


def test_llmapi_model_yaml_that_is_a_device_is_not_called_missing(llmapi_repo):
    from specbuild.model_repo.check import check_repo

    path = llmapi_repo / "tensorrt_llm" / "1" / "model.yaml"
    path.unlink()
    path.symlink_to("/dev/zero")
    found = "\n".join(str(f) for f in check_repo(llmapi_repo))
    assert "not a regular file" in found and "missing" not in found, found


@pytest.mark.parametrize(("k", "why"), [(999, "outside 1..256"), (3, "default_num_draft_tokens is 5")])
def test_repo_check_catches_a_changed_max_draft_len(llmapi_repo, k, why):
    from specbuild.model_repo.check import check_repo

    path = llmapi_repo / "tensorrt_llm" / "1" / "model.yaml"
    options = yaml.safe_load(path.read_text())
    assert options["speculative_config"]["max_draft_len"] == 5  # the example spec's K
    options["speculative_config"]["max_draft_len"] = k
    path.write_text(yaml.safe_dump(options))
    found = "\n".join(str(f) for f in check_repo(llmapi_repo))
    assert "speculative_config.max_draft_len" in found and why in found, found


# ---- low: generate -----------------------------------------------------------------------------------------


def test_generate_engine_refuses_more_drafts_than_the_build_has(dt_build):
    """--num-draft-tokens 99 on a K=4 build drafted up to the output length per round, with no word."""
    result = run("generate", "--engine", str(dt_build), "--prompt", "hi", "--num-draft-tokens", "99")
    refused(result, "num_draft_tokens 99 exceeds the build's max_draft_len 4")
    ok = run(
        "generate",
        "--engine",
        str(dt_build),
        "--prompt",
        "hi",
        "--num-draft-tokens",
        "4",
        "--max-tokens",
        "4",
    )
    assert ok.exit_code == 0, ok.output


def test_streamed_text_never_splits_a_character(tokenizer_dir):
    """Byte-level BPE gives a multi-byte character one token per byte: the running text ends in U+FFFD
    until its last byte arrives, and `generate --engine` printed that U+FFFD."""
    from transformers import AutoTokenizer

    from specbuild.engines.reference.api import TextStream

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    text = "héllo ✓ 日本 🙂"
    ids = tok.encode(text, add_special_tokens=False)
    decode = lambda t: tok.decode(t)  # noqa: E731
    assert any(decode(ids[:i]).endswith("\ufffd") for i in range(1, len(ids)))  # the case exists
    chunks: list[str] = []
    stream = TextStream(decode, chunks.append)
    for token in ids:  # one token per round, as a streamed request
        stream.push([token])
    stream.flush()
    assert "".join(chunks) == text and not any("\ufffd" in c for c in chunks)
    cut: list[str] = []
    stream = TextStream(decode, cut.append)
    stream.push(ids[:2])  # "h" + the first byte of "é": the generation ends inside the character
    stream.flush()
    assert "".join(cut) == decode(ids[:2])  # what --json's text holds: nothing is dropped


# ---- low: outputs ------------------------------------------------------------------------------------------


def test_a_full_disk_while_repo_writes_is_not_blamed_on_a_source(tmp_path):
    """shutil's ENOSPC names the source first: `repo` said `cannot read <python model>`."""
    from specbuild.core.formats.manifest import atomic_output_dir
    from specbuild.core.formats.safe_io import InputFileError, OutputError

    source = ROOT / "specbuild" / "model_repo" / "python_models" / "tensorrt_llm_bls" / "model.py"
    with pytest.raises(OutputError, match="No space left on device") as err:
        with atomic_output_dir(tmp_path / "repo") as tmp:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(source), str(tmp / "model.py"))
    assert "while writing" in err.value.found and str(tmp_path / "repo") in err.value.what
    with pytest.raises(InputFileError, match="cannot read"):  # a read error is still a read error
        with atomic_output_dir(tmp_path / "repo2"):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(source))


def test_a_full_disk_under_repo_on_a_real_file_system(dt_build, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip("cannot mount a tmpfs here: the errno mapping is tested above")
    try:
        result = run("repo", str(dt_build), "--out", str(small / "repo"))
        refused(result, "No space left on device", "cannot write")
        assert "cannot read" not in result.output
        assert list(small.iterdir()) == []
    finally:
        subprocess.run(["umount", "-l", str(small)], capture_output=True)


def test_symlinked_outputs(tmp_path):
    """A dangling symlink was replaced without --force; --force onto a symlink left `.NAME.old-PID`."""
    from specbuild.core.formats.manifest import atomic_output_dir

    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(OutputExistsError), atomic_output_dir(dangling):
        pass
    assert dangling.is_symlink()
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "data").write_text("mine")
    link = tmp_path / "out"
    link.symlink_to(kept)
    with atomic_output_dir(link, force=True) as tmp:
        (tmp / "new").write_text("new")
    assert not link.is_symlink() and (link / "new").read_text() == "new"
    assert (kept / "data").read_text() == "mine"  # what the symlink pointed to is left as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "kept", "out"]  # no .out.old-PID
    stale = tmp_path / f".out.old-{2**22 + 7}"  # a killed run's leftover: a pid above Linux's pid_max
    stale.symlink_to(kept)
    with atomic_output_dir(link, force=True):
        pass
    assert not stale.is_symlink() and (kept / "data").exists()
