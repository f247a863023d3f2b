"""CLI commands of the client stage: `serve` and `bench` (registered on the root app by specbuild.cli.app).

`generate --url` lives in cli/generate.py and calls specbuild.client.remote.generate_remote.
Only typer is imported at module level: `specbuild --help` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specbuild.cli.common import handle_errors, parse_csv_numbers
from specbuild.client import bench as B
from specbuild.core.sampling_params import DEFAULT_MAX_TOKENS
from specbuild.serve import server as S

_csv = lambda values: ",".join(f"{v:g}" for v in values)  # noqa: E731


def serve(
    repo: Annotated[Path, typer.Argument(help="Model repository (from `specbuild repo`).")],
    grpc_port: int = typer.Option(S.DEFAULT_GRPC_PORT, "--grpc-port", help="gRPC port (clients: --url HOST:PORT)."),
    http_port: int = typer.Option(S.DEFAULT_HTTP_PORT, "--http-port", help="HTTP/REST port (health, repository index)."),
    metrics_port: int = typer.Option(S.DEFAULT_METRICS_PORT, "--metrics-port", help="Prometheus metrics port."),
    host: str = typer.Option(S.DEFAULT_HOST, "--host", help="Address every endpoint binds to. Loopback by default; "
                             "another address exposes an unauthenticated server to that network."),
    log_file: Annotated[Path | None, typer.Option("--log-file", help="Write the server log here instead of "
                                                  "following it on stderr.")] = None,
    log_verbose: int = typer.Option(0, "--log-verbose", help="tritonserver --log-verbose level (0 = quiet)."),
    print_launch: bool = typer.Option(False, "--print-launch", help="GPU hosts: start nothing; print the "
                                      "TensorRT-LLM Triton container run line and MPI server launch for REPO "
                                      "(image matched to the spec's TensorRT-LLM version; world size from TP/PP; "
                                      "orchestrator mode --multi-model for draft/target)."),
    container_tag: str | None = typer.Option(None, "--container-tag", help="With --print-launch: use this "
                                             "yy.mm tag instead of the newest one matching the TensorRT-LLM version."),
) -> None:
    """Serve a model repository with the local tritonserver (bundled in nvidia-pytriton, Python backend, CPU).

    Waits until every model is READY, then serves until Ctrl-C / SIGTERM and stops the server and its
    Python-backend processes. A busy port, a model that fails to load or a missing libpython stop
    with the log lines that explain it. The production repository (backend tensorrtllm) needs the
    NVIDIA container on a GPU host: see --print-launch.
    """
    import sys

    from specbuild.cli.common import console, err_console

    if print_launch:
        from specbuild.serve.launch import format_commands, launch_commands

        commands = launch_commands(repo, tag=container_tag, host=host, grpc_port=grpc_port, http_port=http_port,
                                   metrics_port=metrics_port, log_file=str(log_file) if log_file else None)
        typer.echo(format_commands(commands))
        return
    from specbuild.serve.server import ServerOptions
    from specbuild.serve.serving import run_server

    options = ServerOptions(host=host, grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port,
                            log_file=log_file, log_verbose=log_verbose)
    if host not in ("127.0.0.1", "localhost", "::1"):
        err_console().print(f"[yellow]warning:[/] binding to {host}: anyone who can reach it can use the server")
    code = run_server(repo, options, console=console(), log_stream=None if log_file else sys.stderr)
    raise typer.Exit(code)


def bench(
    url: str = typer.Option(..., "--url", help="gRPC address of a running server, HOST:PORT."),
    prompts: Annotated[Path | None, typer.Option("--prompts", help="JSONL with a \"prompt\" field per line, or "
                                                 "plain text with one prompt per line (default: the bundled prompt set).")] = None,
    concurrency: str = typer.Option(_csv(B.DEFAULT_CONCURRENCY), "--concurrency", help="Concurrent requests, comma list."),
    max_tokens: int = typer.Option(DEFAULT_MAX_TOKENS, "--max-tokens", help="New tokens per request."),
    temperature: str = typer.Option(_csv(B.DEFAULT_TEMPERATURES), "--temperature", help="Temperatures, comma list (0 = greedy)."),
    num_draft_tokens: Annotated[int | None, typer.Option("--num-draft-tokens", help="K drafts per round (draft/target; default: the repository's K, what `tune --write` chose).")] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for bench.json, bench.csv and PNG plots.")] = B.DEFAULT_OUT,
    timeout: float = typer.Option(B.DEFAULT_TIMEOUT_S, "--timeout", help="Seconds one request may take."),
) -> None:
    """Benchmark speculation off (target alone) vs on, per temperature and concurrency, through Triton.

    Reports genai-perf's metrics (time_to_first_token, inter_token_latency, request_latency avg/p50/p90/p99,
    output_token_throughput, request_throughput) and, for speculative runs, acceptance rate, mean accepted
    tokens per target pass, measured speedup and the speedup predicted from acceptance and the measured
    draft/target cost ratio. Medusa repositories have no speculation-off run (the engine always speculates).
    """
    from specbuild.cli.common import console
    from specbuild.client.bench import BenchConfig, default_prompts_file, load_prompts, run_bench
    from specbuild.client.report import table, write_report

    config = BenchConfig(
        url=url, prompts=load_prompts(prompts or default_prompts_file()),
        concurrency=tuple(parse_csv_numbers(concurrency, int, "--concurrency")),
        temperatures=tuple(parse_csv_numbers(temperature, float, "--temperature")),
        max_tokens=max_tokens, num_draft_tokens=num_draft_tokens, timeout_s=timeout,
    )
    out_console = console()
    runs, context = run_bench(config, console=out_console)
    files = write_report(runs, context, out)
    out_console.print(table(runs))
    c = context["cost_ratio"]
    out_console.print(f"cost ratio c = {c:.3f} ({context['cost_ratio_method']})" if c is not None else "cost ratio: not measured")
    out_console.print("wrote " + ", ".join(str(f) for f in files))


def register(app: typer.Typer) -> None:
    """Add this stage's commands to `app`."""
    app.command("serve")(handle_errors(serve))
    app.command("bench")(handle_errors(bench))
