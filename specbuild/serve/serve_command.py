"""`specbuild serve`: start the server with a progress bar, follow its log, stop on SIGTERM, SIGINT (Ctrl-C)
or SIGHUP."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from specbuild.serve.tritonserver import ServerOptions, TritonServer

POLL_S = 0.5
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # each: the clean stop (docs/limits.md)


def _follow(path: Path, out: TextIO, stop: threading.Event, start_at: int) -> None:
    """Copy lines appended to `path` after byte `start_at` to `out` until `stop` is set."""
    with open(path, errors="replace") as log:
        log.seek(start_at)
        while not stop.is_set():
            line = log.readline()
            if line:
                out.write(line)
                out.flush()
            else:
                time.sleep(0.2)


def run_server(
    repo: Path,
    options: ServerOptions,
    *,
    console,
    log_stream: TextIO | None,
    on_ready: Callable[[TritonServer], Callable[[], None]] | None = None,
) -> int:
    """Serve until interrupted (returns 0) or until the server dies (raises ServerError).

    on_ready(server) runs once every model is READY (the OpenAI frontend starts there) and returns the
    function that stops what it started; it is called before the server stops."""

    def on_term(signum, frame):  # SIGTERM, SIGHUP -> the same clean shutdown as Ctrl-C; SIGINT too, also
        raise KeyboardInterrupt  # when it was ignored at start (a background job of a script)

    previous = {sig: signal.signal(sig, on_term) for sig in STOP_SIGNALS}
    server = TritonServer(repo, options)
    stop_follow = threading.Event()
    stop_extra: Callable[[], None] | None = None
    try:
        with Progress(
            SpinnerColumn(),
            TextColumn("loading models"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("models", total=None)
            server.start(on_progress=lambda ready, total: progress.update(task, completed=ready, total=total))
        for why in server.load_restarts:  # tritonserver.StubLaunchHang: started again, then loaded
            console.print(f"[yellow]started tritonserver again[/]: {why}")
        models = ", ".join(sorted(server.model_states()))
        console.print(f"[green]ready[/]: {models}")
        console.print(
            f"  gRPC    {server.grpc_url}\n  HTTP    {server.http_url}\n"
            f"  metrics http://{options.host}:{options.metrics_port}/metrics"
        )
        console.print(f"  log     {server.log_path}")
        if on_ready is not None:
            stop_extra = on_ready(server)
        console.print("Ctrl-C stops the server.")
        if log_stream is not None:
            size = server.log_path.stat().st_size
            threading.Thread(
                target=_follow, args=(server.log_path, log_stream, stop_follow, size), daemon=True
            ).start()
        while True:
            server.check_alive()  # a crash is a ServerError with the log lines that matter
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        console.print("stopping tritonserver ...")
        return 0
    finally:
        # A second stop signal (a caller that stops us twice) must neither cut the models' unload short
        # (tritonserver would die with its stubs still running) nor replace the error that ended the
        # serving (a dead model's ServerError) with "interrupted": ignored until the server is down.
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        try:
            stop_follow.set()
            if stop_extra is not None:
                stop_extra()
            server.stop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
