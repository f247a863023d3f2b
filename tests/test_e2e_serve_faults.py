"""Faults through a real tritonserver (runs last among the e2e modules: it destroys the shared servers):
a cancellation stress test, a model process that dies, a server killed mid-request, and what the
stopped servers leave behind (no process, no /dev/shm region)."""

from __future__ import annotations

import os
import random
import signal
import threading
import time
import uuid
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from e2e_fixtures import K
from test_e2e_interface import PROMPT, stream_call, tensor, text_inputs, texts

pytestmark = pytest.mark.slow

STREAMS = 50
MAX_CANCEL_DELAY_S = 0.4  # uniform in [0, this]: before the first response, mid-stream, near the end


def regions(server) -> set[str]:
    return {p.name for p in Path("/dev/shm").glob(server.shm_prefix + "*")}


def group(pgid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pgid:
                    pids.append(int(entry))
            except ProcessLookupError:
                pass
    return pids


def _cancelled_stream(server, model: str, extra: dict, delay: float) -> None:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result=None, error=None: None)
    inputs = [*text_inputs(n=300, stream=True, **extra), tensor("end_id", np.array([[-1]], dtype=np.int32))]
    client.async_stream_infer(model, inputs, request_id=uuid.uuid4().hex)
    time.sleep(delay)
    client.stop_stream(cancel_requests=True)
    client.close()


# tritonserver 2.51 (pytriton's) itself can segfault in its gRPC handler when a cancellation races a
# response: triton-inference-server/server#8034, fixed by PR #8078 (merged 2025-03, r25.04 and later).
# The crash is in tritonserver's own frames, not in a model; the stress below is retried once on fresh
# servers when, and only when, a server's log shows it. Two crashes in a row, or any other failure, fail.
UPSTREAM_CRASH = "Signal (11) received"
STRESSED = ("draft_target", "medusa")


def test_streams_cancelled_at_random_points(e2e_servers, greedy):
    """50 streams over both repositories (BLS speculative and target alone, ensembles, Medusa through the
    BLS and the ensemble), 4 at a time, each cancelled at a random point; then every server answers a
    normal request exactly, with the same model processes as at start and no new shared memory."""
    for attempt in (1, 2):
        try:
            _cancel_stress(e2e_servers, greedy)
            return
        except Exception:
            crashed = [m for m in STRESSED if UPSTREAM_CRASH in e2e_servers[m].log_text()]
            for mode in crashed:
                e2e_servers.replace(mode)  # the next test gets a live server either way
            if not crashed or attempt == 2:
                raise
            warnings.warn(
                f"tritonserver 2.51 segfaulted under cancellation (server#8034): {crashed}", stacklevel=1
            )


def _cancel_stress(e2e_servers, greedy) -> None:
    servers = {mode: e2e_servers[mode] for mode in STRESSED}
    start = {mode: (set(s.stub_pids()), regions(s)) for mode, s in servers.items()}
    kinds = [
        ("draft_target", "tensorrt_llm_bls", {"num_draft_tokens": K}),
        ("draft_target", "tensorrt_llm_bls", {"num_draft_tokens": 0}),
        ("draft_target", "ensemble", {}),
        ("medusa", "tensorrt_llm_bls", {}),
        ("medusa", "ensemble", {}),
    ]
    rng = random.Random(12)
    plan = [(rng.choice(kinds), rng.uniform(0, MAX_CANCEL_DELAY_S)) for _ in range(STREAMS)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(
            pool.map(
                lambda item: _cancelled_stream(servers[item[0][0]], item[0][1], item[0][2], item[1]), plan
            )
        )
    text, _, _ = greedy(PROMPT, 12)
    for mode, server in servers.items():
        server.check_alive()  # the server and every model process
        assert "".join(texts(stream_call(server, "tensorrt_llm_bls", text_inputs(stream=True)))) == text, mode
        assert "".join(texts(stream_call(server, "ensemble", text_inputs(stream=mode == "medusa")))) == (
            text if mode == "medusa" else PROMPT + text
        ), mode
        pids, shm = start[mode]
        assert set(server.stub_pids()) == pids and all(Path(f"/proc/{p}").exists() for p in pids)
        assert regions(server) == shm  # nothing leaked while serving
        assert "Signal (11)" not in server.log_text()


def test_a_dead_model_process_is_named(e2e_servers):
    """tritonserver 2.51 keeps a model READY after its stub died: the client names the model, and the
    check `specbuild serve` runs every half second fails, naming it too."""
    from specbuild.client.remote import generate_remote
    from specbuild.core.errors import ClientError, ServerError
    from specbuild.core.sampling_params import SamplingParams

    server = e2e_servers["draft_target"]
    pid = next(p for p, model in server.stub_pids().items() if model == "tensorrt_llm_draft")
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    try:
        with pytest.raises(ClientError, match="model 'tensorrt_llm_draft' is down"):
            generate_remote(server.grpc_url, PROMPT, SamplingParams(max_tokens=4), num_draft_tokens=K)
        with pytest.raises(ServerError, match="tensorrt_llm_draft") as err:
            server.check_alive()
        assert "Python-backend process died" in err.value.what and str(pid) in err.value.what
    finally:
        prefix, pgid = server.shm_prefix, server.pid
        e2e_servers.replace("draft_target")
    assert group(pgid) == [] and not list(Path("/dev/shm").glob(prefix + "*"))  # the killed stub's region too


def test_killing_the_server_mid_request_is_a_clear_error(e2e_servers):
    from specbuild.client.remote import generate_remote
    from specbuild.core.errors import ClientError
    from specbuild.core.sampling_params import SamplingParams

    server = e2e_servers["medusa"]
    first = threading.Event()
    killer = threading.Thread(target=lambda: first.wait(60) and server.kill())
    killer.start()
    try:
        with pytest.raises(ClientError) as err:
            generate_remote(
                server.grpc_url,
                PROMPT,
                SamplingParams(max_tokens=400, end_id=-1),
                stream=True,
                timeout_s=60,
                on_text=lambda _: first.set(),
            )
    finally:
        killer.join()
        prefix, pgid = server.shm_prefix, server.pid
        assert list(Path("/dev/shm").glob(prefix + "*"))  # SIGKILL leaves the regions ...
        e2e_servers.replace("medusa")
    assert not list(Path("/dev/shm").glob(prefix + "*"))  # ... and stop() removed them
    assert group(pgid) == []
    assert first.is_set()
    assert "lost the connection to tritonserver" in err.value.what
    assert "specbuild serve" in err.value.fix
